/* The guard tree (guard_tree.c): a cache entry's guard evaluated in C. See that file. */
#ifndef KILN_GUARD_TREE_H
#define KILN_GUARD_TREE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

extern PyTypeObject GuardTreeType;

/* Readies the type and its interned names; 0, or -1 with an exception set. */
int guard_tree_init(void);

/* Evaluates `tree` on the frame's entry values (borrowed): 1 pass, 0 fail, -1 error (exception
 * set; only exceptions that are not `Exception`s, or a wrong number of values, escape: the
 * Python guard it mirrors returns False on any Exception). Runs the residual Python guard, if
 * any, after the C checks pass. */
int guard_tree_check(PyObject *tree, PyObject *const *values, Py_ssize_t nvalues);

/* kiln_frame_hook.set_tensor_checker(capsule | None) -> the previous capsule or None: the
 * torch-linked tensor checker (kiln_tensor_check.h) that TENSORS rows marked fast use. */
PyObject *guard_tree_set_checker(PyObject *module, PyObject *capsule);

#endif
