/*
 * The seam for a tensor checker linked against libtorch (Note [Tensor metadata through the
 * attribute protocol], guard_tree.c). kiln_frame_hook does not link libtorch; a package that may
 * (kiln_dynamo's optional _tensor_check extension) fills a KilnTensorChecker and hands it over
 * in a capsule named KILN_TENSOR_CHECKER_CAPSULE through kiln_frame_hook.set_tensor_checker().
 * A TENSORS row whose client allowed it (`fast`: a type whose metadata getters are torch's own)
 * is then checked by one call that reads the TensorImpl, instead of one getter per property.
 * Plain C, no torch and no Python beyond Python.h: both sides include this header.
 */
#ifndef KILN_TENSOR_CHECK_H
#define KILN_TENSOR_CHECK_H

#include <Python.h>
#include <stdint.h>

#define KILN_TENSOR_CHECKER_CAPSULE "kiln_frame_hook.tensor_checker.v1"

typedef struct {
    PyObject *dtype;        /* a torch.dtype (borrowed) */
    PyObject *device;       /* a torch.device, or NULL: the tensor's is_cpu */
    int requires_grad;
    Py_ssize_t ndim;
    const int64_t *sizes;   /* ndim of each */
    const int64_t *strides;
    int has_keys;           /* whether `keys` is checked */
    uint64_t keys;          /* the tensor's dispatch key set, as DispatchKeySet.raw_repr() */
} KilnTensorSpec;

typedef struct {
    int abi;                /* 1 */
    /* 1: the tensor matches, 0: it does not, 2: cannot tell (the caller reads the attributes),
     * -1: an error (exception set). `tensor` is borrowed and its type is already checked. */
    int (*check)(PyObject *tensor, const KilnTensorSpec *spec);
} KilnTensorChecker;

#endif
