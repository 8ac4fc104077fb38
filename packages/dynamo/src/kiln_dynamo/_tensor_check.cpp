// kiln_dynamo's optional tensor checker: a guard tree's tensor rows checked by reading the
// TensorImpl (Note [Tensor metadata through the attribute protocol] in kiln_frame_hook's
// guard_tree.c, and Note [The torch-linked tensor checker] in tensor_check.py). Built on demand
// against the running torch (tensor_check.py); kiln_frame_hook itself never links libtorch.
//
// check() answers for a tensor whose type the guard tree has already compared with a plain one
// (torch.Tensor or nn.Parameter: their metadata getters are torch's own, which read exactly these
// fields), and says "cannot tell" (2) for anything it does not read the way those getters do:
// symbolic or custom sizes, a non-strided layout. It raises nothing and calls no Python.
#include <Python.h>

#include <torch/csrc/Device.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/autograd/python_variable.h>

#include "kiln_tensor_check.h"

namespace {

int check(PyObject* obj, const KilnTensorSpec* spec) {
  if (!THPVariable_Check(obj) || !THPDtype_Check(spec->dtype) ||
      (spec->device != nullptr && !THPDevice_Check(spec->device))) {
    return 2;
  }
  const at::Tensor& t = THPVariable_Unpack(obj);
  c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  if (impl->has_symbolic_sizes_strides() || impl->is_nested() || impl->layout() != c10::kStrided) {
    return 2;
  }
  if (impl->dtype() != c10::scalarTypeToTypeMeta(reinterpret_cast<THPDtype*>(spec->dtype)->scalar_type)) {
    return 0;
  }
  if (spec->device == nullptr ? !impl->is_cpu()
                              : impl->device() != reinterpret_cast<THPDevice*>(spec->device)->device) {
    return 0;
  }
  if (t.requires_grad() != static_cast<bool>(spec->requires_grad)) {
    return 0;
  }
  try {
    c10::IntArrayRef sizes = impl->sizes(), strides = impl->strides();
    if (static_cast<Py_ssize_t>(sizes.size()) != spec->ndim || static_cast<Py_ssize_t>(strides.size()) != spec->ndim) {
      return 0;
    }
    for (Py_ssize_t d = 0; d < spec->ndim; d++) {
      if (sizes[d] != spec->sizes[d] || strides[d] != spec->strides[d]) {
        return 0;
      }
    }
  } catch (...) {
    return 2;  // the attribute path raises the same error, which fails the guard
  }
  if (spec->has_keys && impl->key_set().raw_repr() != spec->keys) {
    return 0;
  }
  return 1;
}

const KilnTensorChecker checker = {1, check};

// data_ptrs_equal(tensors, pointers) -> bool: whether `tensors[i].data_ptr() == pointers[i]` for
// every i whose pointer is not None, two tuples of one length. For kiln_codegen_triton's
// CUDA-graph runner, which checks on every replay that each static input (ResNet-50: ~270
// parameters and buffers) is still where the graph was recorded on it (Note [The runner's
// per-call path] in its cudagraphs.py): one C loop over the call's own argument tuple (None at
// the inputs it does not check), where `map(Tensor.data_ptr, ...)` makes a Python call per
// tensor. The pointer is the one `Tensor.data_ptr()` returns (the same C++ call). Anything it
// cannot read that way (not a tensor, not an int, a tensor without storage) answers False: the
// runner then takes its full path, which decides as always. A tensor is an instance of a real
// subclass of torch.Tensor (its C layout), not whatever a metaclass's __instancecheck__ accepts.
// Raises only on the wrong arguments.
PyObject* data_ptrs_equal(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2 || !PyTuple_Check(args[0]) || !PyTuple_Check(args[1])) {
    PyErr_SetString(PyExc_TypeError, "data_ptrs_equal(tensors: tuple, pointers: tuple)");
    return nullptr;
  }
  Py_ssize_t n = PyTuple_GET_SIZE(args[0]);
  if (PyTuple_GET_SIZE(args[1]) != n || THPVariableClass == nullptr) {
    Py_RETURN_FALSE;
  }
  auto* tensor_type = reinterpret_cast<PyTypeObject*>(THPVariableClass);
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject* expected = PyTuple_GET_ITEM(args[1], i);
    if (expected == Py_None) {
      continue;
    }
    PyObject* obj = PyTuple_GET_ITEM(args[0], i);
    if (!PyObject_TypeCheck(obj, tensor_type) || !PyLong_Check(expected)) {
      Py_RETURN_FALSE;
    }
    void* want = PyLong_AsVoidPtr(expected);
    if (want == nullptr && PyErr_Occurred()) {
      PyErr_Clear();
      Py_RETURN_FALSE;
    }
    void* ptr = nullptr;
    try {
      ptr = THPVariable_Unpack(obj).data_ptr();
    } catch (...) {
      Py_RETURN_FALSE;
    }
    if (ptr != want) {
      Py_RETURN_FALSE;
    }
  }
  Py_RETURN_TRUE;
}

PyMethodDef methods[] = {
    {"data_ptrs_equal", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(data_ptrs_equal)),
     METH_FASTCALL, "data_ptrs_equal(tensors: tuple, pointers: tuple) -> bool"},
    {nullptr, nullptr, 0, nullptr}};

// the build names the module (a name of its own per build, the library's file name) through
// TORCH_EXTENSION_NAME
#ifndef TORCH_EXTENSION_NAME
#define TORCH_EXTENSION_NAME kiln_tensor_check
#endif
#define KILN_STR2(x) #x
#define KILN_STR(x) KILN_STR2(x)
#define KILN_CAT2(a, b) a##b
#define KILN_CAT(a, b) KILN_CAT2(a, b)

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, KILN_STR(TORCH_EXTENSION_NAME),
                          "kiln_dynamo's torch-linked tensor checker", -1, methods};

}  // namespace

PyMODINIT_FUNC KILN_CAT(PyInit_, TORCH_EXTENSION_NAME)(void) {
  PyObject* module = PyModule_Create(&module_def);
  if (module == nullptr) {
    return nullptr;
  }
  PyObject* capsule = PyCapsule_New(const_cast<KilnTensorChecker*>(&checker), KILN_TENSOR_CHECKER_CAPSULE, nullptr);
  if (capsule == nullptr || PyModule_AddObject(module, "checker", capsule) < 0) {
    Py_XDECREF(capsule);
    Py_DECREF(module);
    return nullptr;
  }
  return module;
}
