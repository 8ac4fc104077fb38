/*
 * kiln_frame_hook guard trees: a cache entry's guard evaluated in C.
 *
 * The model. A guard is a conjunction of checks over values reached from the frame's entry
 * values (`L['self']._modules['fc']._parameters['weight']`). The client (kiln_dynamo) compiles
 * its checks into a GuardTree: a straight-line program over *slots*. Slots 0..nvalues-1 are the
 * entry values; every other slot is written once by a load (an attribute, an item, a constant,
 * a type, the result of calling a constant) from an earlier slot, so a shared prefix
 * (`L['self']`, its `_modules`, a submodule's `_parameters`) is loaded once however many checks
 * read below it: the program is the guard's tree of sources walked depth-first. Checks read
 * slots and stop the program at the first that fails. A TENSORS op checks a packed table of
 * tensors (type, dtype, device, requires_grad, sizes, strides) in one loop.
 *
 * Soundness. Each op computes exactly what the Python expression it stands for computes: a load
 * that cannot be done without running user Python is done through the ordinary C-API
 * (PyObject_GetAttr, PyObject_GetItem), which runs what the Python guard would run; the fast
 * paths (an attribute found in the instance dict of a class whose attribute lookup is
 * object's, an item of an exact dict, list or tuple) give the same object the slow path would.
 * So the tree and the Python guard it was compiled from agree on every input, and the client
 * keeps the Python guard to explain a failure. An exception raised by a check is a failing
 * check (the Python guard catches `Exception` and returns False); anything else propagates.
 * A tree may carry a *residual*: a Python guard for the checks the client could not express,
 * called with the entry values after every C check passed.
 *
 * Note [Tensor metadata through the attribute protocol]
 * This extension does not link against libtorch, so it cannot read a TensorImpl. A tensor's
 * metadata is read the way Python reads it: `t.dtype`, `t.requires_grad`, `t.shape` are
 * getset descriptors of torch's C tensor type and `t.stride()` a C method, so no user Python
 * runs (for torch.Tensor and nn.Parameter), and every in-place metadata change (`.data =`,
 * `resize_`, `requires_grad_()`, `transpose_`) is seen because nothing is cached between calls.
 * What is cheap is done by identity: the type is compared by pointer, dtype objects and bools
 * are singletons (PyObject_RichCompareBool tests identity first), and a CPU device is checked
 * through `t.is_cpu` (a bool) instead of allocating a torch.device, when the client says the
 * type's `device` and `is_cpu` cannot disagree. Getters are called directly when object's
 * __getattribute__ would call them (Note [The attribute cache]).
 * The cost, measured (thread CPU time, this 2-core machine): about 0.3 us per tensor row, of
 * which dtype, is_cpu and requires_grad take ~30 ns each, `shape` ~85 ns (a torch.Size) and
 * `stride()` the rest (torch's argument parser and a tuple), plus ~0.4 us when the row checks
 * the dispatch keys through the client's `keys_fn`; nearly all of it is inside torch's getters.
 * So once the memo skips the module walk (Note [Skipping what did not change], guard_memo.c),
 * tensor rows are nearly all of a warm guard. Reading the TensorImpl instead needs libtorch: a
 * package that may link it hands over a checker through the C ABI of kiln_tensor_check.h
 * (`set_tensor_checker`), and rows the client marks `fast` (types whose getters are torch's
 * own) are decided by one call of it (~10-20 ns); what it cannot read the way the getters do it
 * leaves to this path, which is also the whole story when no checker was handed over
 * (kiln_dynamo's Note [The torch-linked tensor checker] weighs the options).
 * A memo run (guard_memo.c) skips the loads and checks whose inputs did not change; it never
 * skips a tensor row: metadata changes in place without any version.
 *
 * Ownership: the tree keeps the op tuples it was built from; the C ops borrow from them.
 * Slots past the entry values hold new references, released when the program ends.
 */
#include "guard_tree_internal.h"

#include <structmember.h>


static PyObject *s_dtype, *s_device, *s_is_cpu, *s_requires_grad, *s_shape, *s_stride, *s_keys,
    *s_getattribute;
static PyObject *object_getattribute; /* borrowed from object's dict */

/* ------------------------------------------------------------------------------------------ */
/* Loads. Each returns a new reference, or NULL with an exception set. */

/* Whether `tp` looks attributes up with object.__getattribute__ (possibly followed by a
 * __getattr__ when that fails, as nn.Module does). */
static inline int generic_lookup(PyTypeObject *tp) {
    return tp->tp_getattro == PyObject_GenericGetAttr || _PyType_Lookup(tp, s_getattribute) == object_getattribute;
}

/* Note [The attribute cache]
 * How `obj.name` is found depends only on obj's type and its MRO: through the ordinary C-API
 * (HOW_SLOW: a custom __getattribute__, a property, ...), in the instance dict (HOW_DICT: the
 * type looks attributes up with object's __getattribute__ and has no data descriptor `name`),
 * or through a C getset descriptor (HOW_GETSET: `__dict__`, a tensor's `dtype`; calling its
 * getter is what object.__getattribute__ does). Each attribute load remembers the answer for
 * the last type it saw with that type's version tag: CPython gives a type a new tag (never
 * reused) whenever it or a base is modified, so a matching (type, tag) pair means the same
 * answer, as in CPython's own specializing interpreter. The lookup itself is done every time.
 * A fast path that raises AttributeError falls back to the C-API, which then also runs a
 * class's __getattr__ (nn.Module's), as Python would. */
static int attr_how(PyTypeObject *tp, PyObject *name, PyGetSetDef **getset) {
    if (!generic_lookup(tp)) {
        return HOW_SLOW;
    }
    PyObject *descr = _PyType_Lookup(tp, name); /* borrowed */
    if (descr == NULL) {
        return HOW_DICT;
    }
    if (Py_IS_TYPE(descr, &PyGetSetDescr_Type)) {
        PyGetSetDef *def = ((PyGetSetDescrObject *)descr)->d_getset;
        if (def->get == NULL) {
            return HOW_SLOW;
        }
        *getset = def;
        return HOW_GETSET;
    }
    return Py_TYPE(descr)->tp_descr_set == NULL ? HOW_DICT : HOW_SLOW;
}

/* New reference, or NULL with an exception set. */
static PyObject *cached_getattr(AttrCache *cache, PyObject *obj, PyObject *name) {
    PyTypeObject *tp = Py_TYPE(obj);
    int valid = PyType_HasFeature(tp, Py_TPFLAGS_VALID_VERSION_TAG);
    if (!(valid && tp == cache->type && cache->version != 0 && tp->tp_version_tag == cache->version)) {
        cache->how = attr_how(tp, name, &cache->getset);
        valid = PyType_HasFeature(tp, Py_TPFLAGS_VALID_VERSION_TAG); /* the lookup may assign a tag */
        cache->type = valid ? tp : NULL;
        cache->version = valid ? tp->tp_version_tag : 0;
    }
    if (cache->how == HOW_GETSET) {
        PyObject *value = cache->getset->get(obj, cache->getset->closure);
        if (value != NULL || !PyErr_ExceptionMatches(PyExc_AttributeError) ||
            tp->tp_getattro == PyObject_GenericGetAttr) {
            return value;
        }
        PyErr_Clear(); /* a __getattr__ may answer: ask the C-API */
    } else if (cache->how == HOW_DICT) {
        /* No data descriptor: the instance dict comes first, as in object.__getattribute__. */
        PyObject **dictptr = _PyObject_GetDictPtr(obj);
        if (dictptr != NULL && *dictptr != NULL) {
            PyObject *value = PyDict_GetItemWithError(*dictptr, name); /* borrowed */
            if (value != NULL) {
                return Py_NewRef(value);
            }
            if (PyErr_Occurred()) {
                return NULL;
            }
        }
    }
    return PyObject_GetAttr(obj, name);
}

static PyObject *load_item(PyObject *obj, PyObject *key) {
    if (PyDict_CheckExact(obj)) {
        PyObject *value = PyDict_GetItemWithError(obj, key);
        if (value != NULL) {
            return Py_NewRef(value);
        }
        if (!PyErr_Occurred()) {
            PyErr_SetObject(PyExc_KeyError, key);
        }
        return NULL;
    }
    if ((PyList_CheckExact(obj) || PyTuple_CheckExact(obj)) && PyLong_CheckExact(key)) {
        Py_ssize_t i = PyLong_AsSsize_t(key);
        if (i == -1 && PyErr_Occurred()) {
            return NULL;
        }
        Py_ssize_t n = Py_SIZE(obj);
        if (i < 0) {
            i += n;
        }
        if (i < 0 || i >= n) {
            PyErr_SetString(PyExc_IndexError, "index out of range");
            return NULL;
        }
        return Py_NewRef(PyList_CheckExact(obj) ? PyList_GET_ITEM(obj, i) : PyTuple_GET_ITEM(obj, i));
    }
    return PyObject_GetItem(obj, key);
}

/* ------------------------------------------------------------------------------------------ */
/* Checks: 1 pass, 0 fail, -1 error. */

static inline int truth_of_eq(PyObject *a, PyObject *b) {
    PyObject *r = PyObject_RichCompare(a, b, Py_EQ);
    if (r == NULL) {
        return -1;
    }
    int ok = r == Py_True ? 1 : (r == Py_False ? 0 : PyObject_IsTrue(r));
    Py_DECREF(r);
    return ok;
}

/* Note [Same floats in C]: the check of Note [Guards on NaN and signed zeros] (kiln_dynamo's
 * guards.py) on a float or complex constant that is a NaN or a zero: the same type, and each
 * part the same double up to the NaN payload. A Python `SameFloat.__eq__` before, called by
 * the tree's rich compare on every call (T5: 46 dropout rates of 0.0 per call), and an `EQ`
 * against that object was never skipped by the memo (Note [Skipping what did not change]). */
static inline int same_double(double a, double b) {
    if (isnan(a) || isnan(b)) {
        return isnan(a) && isnan(b);
    }
    return a == b && signbit(a) == signbit(b);
}

static int check_same_float(PyObject *x, PyObject *value) {
    if (Py_TYPE(x) != Py_TYPE(value)) {
        return 0;
    }
    if (PyFloat_CheckExact(value)) {
        return same_double(PyFloat_AS_DOUBLE(x), PyFloat_AS_DOUBLE(value));
    }
    Py_complex a = ((PyComplexObject *)x)->cval, b = ((PyComplexObject *)value)->cval;
    return same_double(a.real, b.real) && same_double(a.imag, b.imag);
}

static int check_item_types(PyObject *obj, PyObject *types) {
    PyObject *seq = PySequence_Tuple(obj); /* what tuple(map(type, obj)) iterates */
    if (seq == NULL) {
        return -1;
    }
    int ok = PyTuple_GET_SIZE(seq) == PyTuple_GET_SIZE(types);
    for (Py_ssize_t i = 0; ok && i < PyTuple_GET_SIZE(seq); i++) {
        ok = (PyObject *)Py_TYPE(PyTuple_GET_ITEM(seq, i)) == PyTuple_GET_ITEM(types, i);
    }
    Py_DECREF(seq);
    return ok;
}

static int check_keys(PyObject *obj, PyObject *keys) {
    if (PyDict_CheckExact(obj)) {
        if (PyDict_GET_SIZE(obj) != PyList_GET_SIZE(keys)) {
            return 0;
        }
        Py_ssize_t pos = 0, i = 0;
        PyObject *key, *value;
        while (PyDict_Next(obj, &pos, &key, &value)) {
            /* list == list compares items with identity first, as RichCompareBool does */
            PyObject *want = PyList_GET_ITEM(keys, i++);
            int ok = key == want ? 1 : PyObject_RichCompareBool(key, want, Py_EQ);
            if (ok <= 0) {
                return ok;
            }
        }
        return 1;
    }
    PyObject *view = PyObject_CallMethodNoArgs(obj, s_keys);
    if (view == NULL) {
        return -1;
    }
    PyObject *list = PySequence_List(view);
    Py_DECREF(view);
    if (list == NULL) {
        return -1;
    }
    int ok = PyObject_RichCompareBool(list, keys, Py_EQ);
    Py_DECREF(list);
    return ok;
}

static int check_not_in(PyObject *container, PyObject *key) {
    int found = PyDict_CheckExact(container) ? PyDict_Contains(container, key) : PySequence_Contains(container, key);
    return found < 0 ? -1 : !found;
}

/* Compares one attribute of a tensor; steals `got`. */
static inline int same(PyObject *got, PyObject *want) {
    if (got == NULL) {
        return -1;
    }
    int ok = got == want ? 1 : PyObject_RichCompareBool(got, want, Py_EQ);
    Py_DECREF(got);
    return ok;
}

/* The torch-linked checker, if one was handed over (kiln_tensor_check.h); the capsule is owned. */
static PyObject *checker_capsule;
static const KilnTensorChecker *checker;

/* Note [Tensor metadata through the attribute protocol]. */
static int check_tensor(TensorRow *row, PyObject *t) {
    if ((PyObject *)Py_TYPE(t) != row->type) {
        return 0;
    }
    if (checker != NULL && row->fast) {
        int ok = checker->check(t, &row->spec);
        if (ok != 2) {
            return ok;
        }
    }
    int ok = same(cached_getattr(&row->caches[0], t, s_dtype), row->dtype);
    if (ok <= 0) {
        return ok;
    }
    ok = row->device == NULL ? same(cached_getattr(&row->caches[1], t, s_is_cpu), Py_True)
                             : same(cached_getattr(&row->caches[1], t, s_device), row->device);
    if (ok <= 0) {
        return ok;
    }
    ok = same(cached_getattr(&row->caches[2], t, s_requires_grad), row->requires_grad);
    if (ok <= 0) {
        return ok;
    }
    ok = same(cached_getattr(&row->caches[3], t, s_shape), row->sizes);
    if (ok <= 0) {
        return ok;
    }
    ok = same(PyObject_CallMethodNoArgs(t, s_stride), row->strides);
    if (ok <= 0 || row->keys == NULL) {
        return ok;
    }
    return same(PyObject_CallOneArg(row->keys_fn, t), row->keys_want);
}

PyObject *guard_tree_set_checker(PyObject *module, PyObject *capsule) {
    const KilnTensorChecker *next = NULL;
    if (capsule != Py_None) {
        next = PyCapsule_GetPointer(capsule, KILN_TENSOR_CHECKER_CAPSULE);
        if (next == NULL) {
            return NULL;
        }
        if (next->abi != 1 || next->check == NULL) {
            PyErr_SetString(PyExc_ValueError, "kiln guard tree: a tensor checker of another ABI");
            return NULL;
        }
    }
    PyObject *previous = checker_capsule != NULL ? checker_capsule : Py_NewRef(Py_None);
    checker_capsule = capsule == Py_None ? NULL : Py_NewRef(capsule);
    checker = next;
    return previous; /* new reference */
}

/* ------------------------------------------------------------------------------------------ */
/* The program. */

static PyObject *load(GuardOp *op, PyObject **regs) {
    switch (op->op) {
    case OP_LOAD_ATTR:
        return cached_getattr(&op->cache, regs[op->src], op->obj);
    case OP_LOAD_OBJATTR:
        return PyObject_GenericGetAttr(regs[op->src], op->obj);
    case OP_LOAD_ITEM:
        return load_item(regs[op->src], op->obj);
    case OP_LOAD_CONST:
        return Py_NewRef(op->obj);
    case OP_LOAD_TYPE:
        return Py_NewRef((PyObject *)Py_TYPE(regs[op->src]));
    case OP_LOAD_CALL:
        return op->n == 0 ? PyObject_CallNoArgs(op->obj) : PyObject_CallOneArg(op->obj, op->obj2);
    }
    PyErr_SetString(PyExc_SystemError, "kiln guard tree: bad load");
    return NULL;
}

static int check(GuardOp *op, PyObject **regs) {
    if (op->op == OP_TENSORS) {
        for (Py_ssize_t i = 0; i < op->nrows; i++) {
            int ok = check_tensor(&op->rows[i], regs[op->rows[i].slot]);
            if (ok <= 0) {
                return ok;
            }
        }
        return 1;
    }
    PyObject *x = regs[op->src];
    switch (op->op) {
    case OP_TYPE_IS:
        return (PyObject *)Py_TYPE(x) == op->obj;
    case OP_IS:
        return x == op->obj;
    case OP_IS_REF:
        return x == PyWeakref_GET_OBJECT(op->obj);
    case OP_ID_EQ:
        return (Py_ssize_t)(uintptr_t)x == op->n;
    case OP_EQ:
        return truth_of_eq(x, op->obj);
    case OP_ITEM_TYPES:
        return check_item_types(x, op->obj);
    case OP_LEN_EQ: {
        Py_ssize_t n = PyObject_Size(x);
        return n < 0 ? -1 : n == op->n;
    }
    case OP_KEYS_EQ:
        return check_keys(x, op->obj);
    case OP_NOT_IN:
        return check_not_in(x, op->obj);
    case OP_FALSY: {
        int t = PyObject_IsTrue(x);
        return t < 0 ? -1 : !t;
    }
    case OP_SAME:
        return x == regs[op->src2];
    case OP_SAME_FLOAT:
        return check_same_float(x, op->obj);
    }
    PyErr_SetString(PyExc_SystemError, "kiln guard tree: bad check");
    return -1;
}

int guard_tree_run(GuardTree *tree, PyObject **regs, const Py_ssize_t *order, Py_ssize_t n) {
    for (Py_ssize_t k = 0; k < n; k++) {
        GuardOp *op = &tree->ops[order != NULL ? order[k] : k];
        if (op->op < OP_TYPE_IS) {
            PyObject *value = load(op, regs);
            if (value == NULL) {
                return -1;
            }
            regs[op->dst] = value;
        } else {
            int ok = check(op, regs);
            if (ok <= 0) {
                return ok;
            }
        }
    }
    return 1;
}

#define STACK_SLOTS 512

int guard_tree_check(PyObject *self, PyObject *const *values, Py_ssize_t nvalues) {
    GuardTree *tree = (GuardTree *)self;
    if (nvalues != tree->nvalues) {
        PyErr_Format(PyExc_TypeError, "kiln guard tree: expected %zd entry values, got %zd", tree->nvalues, nvalues);
        return -1;
    }
    if (tree->ops == NULL) {
        return 0; /* cleared by the garbage collector */
    }
    PyObject *stack_regs[STACK_SLOTS];
    PyObject **regs = stack_regs;
    if (tree->nslots > STACK_SLOTS) {
        regs = PyMem_Malloc((size_t)tree->nslots * sizeof(PyObject *));
        if (regs == NULL) {
            PyErr_NoMemory();
            return -1;
        }
    }
    for (Py_ssize_t i = 0; i < nvalues; i++) {
        regs[i] = values[i]; /* borrowed */
    }
    for (Py_ssize_t i = nvalues; i < tree->nslots; i++) {
        regs[i] = NULL;
    }
    Py_INCREF(tree); /* a load may run Python that drops the last other reference */
    int verdict = tree->memo_on ? guard_memo_run(tree, values, regs) : 2;
    if (verdict == 2) {
        verdict = guard_tree_run(tree, regs, NULL, tree->nops);
        if (verdict == 1 && tree->memo_on && tree->ops != NULL) {
            guard_memo_record(tree, values, regs);
        }
    }
    for (Py_ssize_t i = nvalues; i < tree->nslots; i++) {
        Py_XDECREF(regs[i]);
    }
    if (regs != stack_regs) {
        PyMem_Free(regs);
    }
    if (verdict < 0 && PyErr_ExceptionMatches(PyExc_Exception)) {
        PyErr_Clear(); /* the Python guard returns False on any Exception */
        verdict = 0;
    }
    if (verdict == 1 && tree->residual != NULL) {
        PyObject *r = PyObject_Vectorcall(tree->residual, values, (size_t)nvalues, NULL);
        verdict = r == NULL ? -1 : PyObject_IsTrue(r);
        Py_XDECREF(r);
    }
    Py_DECREF(tree);
    return verdict;
}

/* ------------------------------------------------------------------------------------------ */
/* Building: GuardTree(nvalues, nslots, ops, residual, reference, text). Every op is a tuple
 * (op, dst, src, src2, n, obj, obj2); everything is checked here, so running trusts it. */

static void free_ops(GuardTree *tree) {
    if (tree->ops != NULL) {
        for (Py_ssize_t i = 0; i < tree->nops; i++) {
            for (Py_ssize_t r = 0; tree->ops[i].rows != NULL && r < tree->ops[i].nrows; r++) {
                PyMem_Free(tree->ops[i].rows[r].ints);
            }
            PyMem_Free(tree->ops[i].rows);
        }
        PyMem_Free(tree->ops);
        tree->ops = NULL;
    }
    tree->nops = 0;
}

static int bad(const char *what, Py_ssize_t i) {
    PyErr_Format(PyExc_ValueError, "kiln guard tree: op %zd: %s", i, what);
    return -1;
}

static int parse_rows(GuardOp *op, Py_ssize_t i, Py_ssize_t nslots, int *written) {
    PyObject *rows = op->obj;
    if (!PyTuple_CheckExact(rows)) {
        return bad("TENSORS wants a tuple of rows", i);
    }
    op->nrows = PyTuple_GET_SIZE(rows);
    op->rows = PyMem_Calloc((size_t)(op->nrows ? op->nrows : 1), sizeof(TensorRow));
    if (op->rows == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t r = 0; r < op->nrows; r++) {
        PyObject *row = PyTuple_GET_ITEM(rows, r);
        if (!PyTuple_CheckExact(row) || (PyTuple_GET_SIZE(row) != 7 && PyTuple_GET_SIZE(row) != 10 && PyTuple_GET_SIZE(row) != 11)) {
            return bad("a tensor row is (slot, type, dtype, device|None, requires_grad, sizes, strides"
                       "[, keys|None, keys_fn, fast[, keys_want]])", i);
        }
        Py_ssize_t slot = PyLong_AsSsize_t(PyTuple_GET_ITEM(row, 0));
        if (slot < 0 || slot >= nslots || !written[slot]) {
            if (PyErr_Occurred()) {
                return -1;
            }
            return bad("a tensor row reads a slot not written before", i);
        }
        PyObject *rg = PyTuple_GET_ITEM(row, 4), *sizes = PyTuple_GET_ITEM(row, 5),
                 *strides = PyTuple_GET_ITEM(row, 6), *device = PyTuple_GET_ITEM(row, 3);
        if (!PyType_Check(PyTuple_GET_ITEM(row, 1)) || !PyBool_Check(rg) || !PyTuple_CheckExact(sizes) ||
            !PyTuple_CheckExact(strides)) {
            return bad("a tensor row has a bad type, requires_grad, sizes or strides", i);
        }
        TensorRow *tr = &op->rows[r];
        *tr = (TensorRow){.slot = slot, .type = PyTuple_GET_ITEM(row, 1), .dtype = PyTuple_GET_ITEM(row, 2),
                          .device = device == Py_None ? NULL : device, .requires_grad = rg, .sizes = sizes,
                          .strides = strides};
        if (PyTuple_GET_SIZE(row) >= 10) {
            PyObject *keys = PyTuple_GET_ITEM(row, 7), *keys_fn = PyTuple_GET_ITEM(row, 8);
            int fast = PyObject_IsTrue(PyTuple_GET_ITEM(row, 9));
            if (fast < 0) {
                return -1;
            }
            if (keys != Py_None && (!PyLong_CheckExact(keys) || !PyCallable_Check(keys_fn))) {
                return bad("a tensor row's keys are an int with a callable that gives them", i);
            }
            tr->keys = keys == Py_None ? NULL : keys;
            tr->keys_fn = keys_fn;
            tr->keys_want = PyTuple_GET_SIZE(row) == 11 ? PyTuple_GET_ITEM(row, 10) : keys;
            tr->fast = fast;
        }
        Py_ssize_t ndim = PyTuple_GET_SIZE(sizes);
        if (tr->fast && PyTuple_GET_SIZE(strides) == ndim) {
            tr->ints = PyMem_Malloc((size_t)(2 * ndim + 1) * sizeof(int64_t));
            if (tr->ints == NULL) {
                PyErr_NoMemory();
                return -1;
            }
            int ints = 1;
            for (Py_ssize_t d = 0; ints && d < 2 * ndim; d++) {
                PyObject *v = PyTuple_GET_ITEM(d < ndim ? sizes : strides, d < ndim ? d : d - ndim);
                ints = PyLong_CheckExact(v);
                tr->ints[d] = ints ? PyLong_AsLongLong(v) : 0;
                if (ints && tr->ints[d] == -1 && PyErr_Occurred()) {
                    PyErr_Clear();
                    ints = 0;
                }
            }
            uint64_t bits = 0;
            if (tr->keys != NULL) {
                bits = PyLong_AsUnsignedLongLong(tr->keys);
                if (bits == (uint64_t)-1 && PyErr_Occurred()) {
                    PyErr_Clear();
                    ints = 0;
                }
            }
            tr->fast = ints;
            tr->spec = (KilnTensorSpec){.dtype = tr->dtype, .device = tr->device, .requires_grad = rg == Py_True,
                                        .ndim = ndim, .sizes = tr->ints, .strides = tr->ints + ndim,
                                        .has_keys = tr->keys != NULL, .keys = bits};
        } else {
            tr->fast = 0;
        }
    }
    return 0;
}

static int parse_op(GuardOp *op, PyObject *t, Py_ssize_t i, Py_ssize_t nslots, int *written) {
    if (!PyTuple_CheckExact(t) || PyTuple_GET_SIZE(t) != 7) {
        return bad("an op is a tuple (op, dst, src, src2, n, obj, obj2)", i);
    }
    long code = PyLong_AsLong(PyTuple_GET_ITEM(t, 0));
    op->dst = PyLong_AsSsize_t(PyTuple_GET_ITEM(t, 1));
    op->src = PyLong_AsSsize_t(PyTuple_GET_ITEM(t, 2));
    op->src2 = PyLong_AsSsize_t(PyTuple_GET_ITEM(t, 3));
    op->n = PyLong_AsSsize_t(PyTuple_GET_ITEM(t, 4));
    if (PyErr_Occurred()) {
        return -1;
    }
    op->op = (int)code;
    op->obj = PyTuple_GET_ITEM(t, 5);
    op->obj2 = PyTuple_GET_ITEM(t, 6);
    int reads = code != OP_LOAD_CONST && code != OP_LOAD_CALL && code != OP_TENSORS;
    if (reads && (op->src < 0 || op->src >= nslots || !written[op->src])) {
        return bad("reads a slot not written before", i);
    }
    switch (code) {
    case OP_LOAD_ATTR:
    case OP_LOAD_OBJATTR:
        if (!PyUnicode_CheckExact(op->obj)) {
            return bad("an attribute name must be a str", i);
        }
        /* fall through */
    case OP_LOAD_ITEM:
    case OP_LOAD_CONST:
    case OP_LOAD_TYPE:
    case OP_LOAD_CALL:
        if (op->dst < 0 || op->dst >= nslots || written[op->dst]) {
            return bad("a load must write a new slot", i);
        }
        if (code == OP_LOAD_CALL && (!PyCallable_Check(op->obj) || op->n < 0 || op->n > 1)) {
            return bad("LOAD_CALL wants a callable and 0 or 1 argument", i);
        }
        written[op->dst] = 1;
        return 0;
    case OP_IS_REF:
        if (!PyWeakref_CheckRef(op->obj)) {
            return bad("IS_REF wants a weak reference", i);
        }
        return 0;
    case OP_ITEM_TYPES:
        return PyTuple_CheckExact(op->obj) ? 0 : bad("ITEM_TYPES wants a tuple", i);
    case OP_KEYS_EQ:
        return PyList_CheckExact(op->obj) ? 0 : bad("KEYS_EQ wants a list", i);
    case OP_SAME_FLOAT:
        return PyFloat_CheckExact(op->obj) || PyComplex_CheckExact(op->obj) ? 0
                                                                            : bad("SAME_FLOAT wants a float or complex", i);
    case OP_SAME:
        if (op->src2 < 0 || op->src2 >= nslots || !written[op->src2]) {
            return bad("reads a slot not written before", i);
        }
        return 0;
    case OP_TENSORS:
        return parse_rows(op, i, nslots, written);
    case OP_TYPE_IS:
    case OP_IS:
    case OP_ID_EQ:
    case OP_EQ:
    case OP_LEN_EQ:
    case OP_NOT_IN:
    case OP_FALSY:
        return 0;
    }
    return bad("unknown op", i);
}

static PyObject *tree_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames);

static PyObject *tree_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    Py_ssize_t nvalues, nslots;
    PyObject *ops, *residual, *reference, *text;
    int memo = 1;
    static char *kwlist[] = {"nvalues", "nslots", "ops", "residual", "reference", "text", "memo", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "nnOOOU|p", kwlist, &nvalues, &nslots, &ops, &residual,
                                     &reference, &text, &memo)) {
        return NULL;
    }
    if (nvalues < 0 || nslots < nvalues) {
        PyErr_SetString(PyExc_ValueError, "kiln guard tree: need 0 <= nvalues <= nslots");
        return NULL;
    }
    if (residual != Py_None && !PyCallable_Check(residual)) {
        PyErr_SetString(PyExc_TypeError, "kiln guard tree: the residual guard must be callable or None");
        return NULL;
    }
    PyObject *op_tuples = PySequence_Tuple(ops);
    if (op_tuples == NULL) {
        return NULL;
    }
    GuardTree *tree = PyObject_GC_New(GuardTree, type);
    if (tree == NULL) {
        Py_DECREF(op_tuples);
        return NULL;
    }
    tree->vectorcall = tree_vectorcall;
    tree->nvalues = nvalues;
    tree->nslots = nslots;
    tree->nops = PyTuple_GET_SIZE(op_tuples);
    tree->ntensors = 0;
    tree->op_tuples = op_tuples;
    tree->residual = residual == Py_None ? NULL : Py_NewRef(residual);
    tree->reference = Py_NewRef(reference);
    tree->text = Py_NewRef(text);
    tree->weakrefs = NULL;
    tree->memo_on = memo;
    memset(&tree->memo, 0, sizeof(tree->memo));
    tree->ops = PyMem_Calloc((size_t)(tree->nops ? tree->nops : 1), sizeof(GuardOp));
    int *written = PyMem_Calloc((size_t)(nslots ? nslots : 1), sizeof(int));
    if (tree->ops == NULL || written == NULL) {
        PyMem_Free(written);
        Py_DECREF(tree); /* not tracked yet: dealloc copes */
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < nvalues; i++) {
        written[i] = 1;
    }
    for (Py_ssize_t i = 0; i < tree->nops; i++) {
        if (parse_op(&tree->ops[i], PyTuple_GET_ITEM(op_tuples, i), i, nslots, written) < 0) {
            PyMem_Free(written);
            Py_DECREF(tree);
            return NULL;
        }
        tree->ntensors += tree->ops[i].nrows;
    }
    PyMem_Free(written);
    PyObject_GC_Track(tree);
    return (PyObject *)tree;
}

static int tree_traverse(GuardTree *self, visitproc visit, void *arg) {
    Py_VISIT(self->op_tuples);
    Py_VISIT(self->residual);
    Py_VISIT(self->reference);
    return 0;
}

static int tree_clear(GuardTree *self) {
    guard_memo_clear(&self->memo); /* its values are borrowed through the ops */
    free_ops(self); /* the ops borrow from op_tuples */
    Py_CLEAR(self->op_tuples);
    Py_CLEAR(self->residual);
    Py_CLEAR(self->reference);
    return 0;
}

static void tree_dealloc(GuardTree *self) {
    PyObject_GC_UnTrack(self);
    if (self->weakrefs != NULL) {
        PyObject_ClearWeakRefs((PyObject *)self);
    }
    tree_clear(self);
    Py_CLEAR(self->text);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* tree(*values) -> bool. New reference. */
static PyObject *tree_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    if (kwnames != NULL && PyTuple_GET_SIZE(kwnames) > 0) {
        PyErr_SetString(PyExc_TypeError, "a kiln guard tree takes positional entry values only");
        return NULL;
    }
    int ok = guard_tree_check(self, args, PyVectorcall_NARGS(nargsf));
    return ok < 0 ? NULL : PyBool_FromLong(ok);
}

static PyObject *tree_repr(GuardTree *self) {
    return PyUnicode_FromFormat("<kiln guard tree: %zd ops, %zd tensors%s>", self->nops, self->ntensors,
                                self->residual != NULL ? ", with a residual Python guard" : "");
}

static PyObject *tree_get_residual(GuardTree *self, void *closure) {
    return Py_NewRef(self->residual != NULL ? self->residual : Py_None);
}

static PyObject *tree_get_reference(GuardTree *self, void *closure) {
    return Py_NewRef(self->reference != NULL ? self->reference : Py_None);
}

static PyObject *tree_get_ops(GuardTree *self, void *closure) {
    return Py_NewRef(self->op_tuples != NULL ? self->op_tuples : Py_None);
}

static PyObject *tree_get_memo(GuardTree *self, void *closure) {
    return guard_memo_stats(self);
}

static PyGetSetDef tree_getset[] = {
    {"memo", (getter)tree_get_memo, NULL, "what the memo skips (Note [Skipping what did not change]), or None", NULL},
    {"ops", (getter)tree_get_ops, NULL, "the op tuples the tree was built from", NULL},
    {"residual", (getter)tree_get_residual, NULL, "the Python guard run after the C checks, or None", NULL},
    {"reference", (getter)tree_get_reference, NULL, "the readable Python guard the tree was compiled from", NULL},
    {NULL},
};

static PyMemberDef tree_members[] = {
    {"nvalues", T_PYSSIZET, offsetof(GuardTree, nvalues), READONLY, "entry values it takes"},
    {"nslots", T_PYSSIZET, offsetof(GuardTree, nslots), READONLY, "slots (entry values and loads)"},
    {"nops", T_PYSSIZET, offsetof(GuardTree, nops), READONLY, "ops of the program"},
    {"ntensors", T_PYSSIZET, offsetof(GuardTree, ntensors), READONLY, "rows of its tensor tables"},
    {"text", T_OBJECT, offsetof(GuardTree, text), READONLY, "the tree as text"},
    {NULL},
};

PyTypeObject GuardTreeType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kiln_frame_hook.GuardTree",
    .tp_basicsize = sizeof(GuardTree),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "A cache entry's guard as a program of loads and checks evaluated in C (see guard_tree.c).",
    .tp_new = tree_new,
    .tp_traverse = (traverseproc)tree_traverse,
    .tp_clear = (inquiry)tree_clear,
    .tp_dealloc = (destructor)tree_dealloc,
    .tp_repr = (reprfunc)tree_repr,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(GuardTree, vectorcall),
    .tp_weaklistoffset = offsetof(GuardTree, weakrefs),
    .tp_getset = tree_getset,
    .tp_members = tree_members,
};

int guard_tree_init(void) {
    if (PyType_Ready(&GuardTreeType) < 0 || guard_memo_init() < 0) {
        return -1;
    }
    s_dtype = PyUnicode_InternFromString("dtype");
    s_device = PyUnicode_InternFromString("device");
    s_is_cpu = PyUnicode_InternFromString("is_cpu");
    s_requires_grad = PyUnicode_InternFromString("requires_grad");
    s_shape = PyUnicode_InternFromString("shape");
    s_stride = PyUnicode_InternFromString("stride");
    s_keys = PyUnicode_InternFromString("keys");
    s_getattribute = PyUnicode_InternFromString("__getattribute__");
    if (!s_dtype || !s_device || !s_is_cpu || !s_requires_grad || !s_shape || !s_stride || !s_keys ||
        !s_getattribute) {
        return -1;
    }
    object_getattribute = _PyType_Lookup(&PyBaseObject_Type, s_getattribute);
    if (object_getattribute == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "kiln guard tree: object has no __getattribute__");
        return -1;
    }
    return 0;
}
