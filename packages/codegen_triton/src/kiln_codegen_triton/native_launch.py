"""A launch object in C for a compiled Triton kernel: Note [Native launches].

Note [Native launches]: the fast launcher (Note [The launch path] in runtime.py) was a generated
Python function calling Triton's C launch function: one Python frame, then Triton's
``PyArg_ParseTuple`` over a format of thirteen fixed arguments plus the kernel's, a second parse
of the packed metadata, a context check, the GIL released and taken back, and
``cuLaunchKernelEx``. Of the 5.7 µs a kernel cost the default-mode wrapper on an H100 (the
200-kernel micro-benchmark, s34), 3.3 µs were that launch. A :class:`Launch` object here is
what the wrapper calls instead, with the same arguments (``stream, *pointers, *sizes``): a C
type whose ``vectorcall`` converts each argument by a plan fixed when the kernel was compiled
(pointer, int64, int32, float32, or a constant), fills the kernel's parameter array and calls
``cuLaunchKernel`` with the grid, block and shared memory bound at construction. No tuple, no
format string, no Python frame.

It is generated code in the sense Triton's own launchers are: this module holds the C source,
compiles it once per cache folder with the system C compiler against the running Python's
headers (the compiler and headers Triton itself needs for its launchers), and loads it; no CUDA
header is needed (the few driver entry points are declared here and looked up in libcuda with
``dlsym``). The binary is cached under ``$KILN_CACHE_DIR/triton/native/`` by the hash of the
source, Python's ABI and the platform, written atomically; a file that does not load is built
again once (the first graph compiled for a GPU starts the build in a background thread,
:func:`prepare`, so that it runs while the kernels compile), and if that fails too, or no compiler or libcuda is found, every kernel keeps the
Python fast launcher (``counters["native_unavailable"]``, logged once on
``kiln.codegen_triton.compile``). ``KILN_TRITON_NATIVE_LAUNCH=0`` turns it off.

A kernel of symbolic sizes (Note [Symbolic sizes in Triton kernels]) takes its sizes after its
pointers (int64, or float32 for a float of sizes) and computes its grid from them at each call:
its launcher is a generated two-line Python function that computes the grid and calls a
:class:`Launch` built with ``grid_args=True``, which takes the grid's x and y after the stream
(a grid of 0 launches nothing).

What a kernel's parameters are is Triton's ABI: the non-constexpr arguments in declaration
order, then two scratch pointers (global and profile) that Triton 3.6 and 3.8 append. The plan
is written from the compiled kernel's signature (runtime.py's ``native_plan``), and at
construction checked against the binary itself: ``cuFuncGetParamInfo`` (CUDA 12.4) must report
exactly as many parameters as the plan, each of the plan's size. A kernel that fails the check,
uses scratch memory, a cooperative grid, programmatic dependent launch, more than one CTA per
cluster or more than 228 KiB of shared memory, or a driver without ``cuFuncGetParamInfo``, keeps
the Python launcher; the check makes
a future Triton that changes its ABI fall back instead of launching with wrong arguments.

The GIL is released around ``cuLaunchKernel`` as Triton and torch do (a launch blocks when the
device's queue is full); keeping it measured no cheaper (s35, H200: 4.40 against 4.35 us a
launch). ``dry=True`` builds an object that launches nothing and
returns the parameter bytes it would pass, one int per parameter: how the tests check the
conversions on a machine without a GPU.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
from pathlib import Path
from types import ModuleType

from kiln_loopir.diskcache import cache_root

log = logging.getLogger("kiln.codegen_triton.compile")

counters: dict[str, int] = {
    "native_built": 0,
    "native_reused": 0,
    "native_unavailable": 0,
    "native_launchers": 0,  # kernels launched through a Launch
    "native_declined": 0,  # kernels that kept the Python launcher (their parameters or flags)
}

MODULE = "kiln_triton_launch"

SOURCE = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* the driver API entry points, declared here: no CUDA header needed */
typedef int CUresult;
typedef void *CUfunction, *CUstream, *CUcontext;
typedef int CUdevice;
typedef CUresult (*kl_launch_t)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, CUstream, void **, void **);
typedef CUresult (*kl_ctx_get_t)(CUcontext *);
typedef CUresult (*kl_ctx_set_t)(CUcontext);
typedef CUresult (*kl_dev_get_t)(CUdevice *, int);
typedef CUresult (*kl_retain_t)(CUcontext *, CUdevice);
typedef CUresult (*kl_error_t)(CUresult, const char **);
typedef CUresult (*kl_param_info_t)(CUfunction, size_t, size_t *, size_t *);

static kl_launch_t cu_launch;
static kl_ctx_get_t cu_ctx_get;
static kl_ctx_set_t cu_ctx_set;
static kl_dev_get_t cu_dev_get;
static kl_retain_t cu_retain;
static kl_error_t cu_error;
static kl_param_info_t cu_param_info;
static int driver_state; /* 0 not tried, 1 loaded, -1 failed */

static int load_driver(void) {
  if (driver_state) return driver_state;
  void *lib = dlopen("libcuda.so.1", RTLD_LAZY);
  if (!lib) { driver_state = -1; return -1; }
  cu_launch = (kl_launch_t)dlsym(lib, "cuLaunchKernel");
  cu_ctx_get = (kl_ctx_get_t)dlsym(lib, "cuCtxGetCurrent");
  cu_ctx_set = (kl_ctx_set_t)dlsym(lib, "cuCtxSetCurrent");
  cu_dev_get = (kl_dev_get_t)dlsym(lib, "cuDeviceGet");
  cu_retain = (kl_retain_t)dlsym(lib, "cuDevicePrimaryCtxRetain");
  cu_error = (kl_error_t)dlsym(lib, "cuGetErrorString");
  cu_param_info = (kl_param_info_t)dlsym(lib, "cuFuncGetParamInfo");
  driver_state = (cu_launch && cu_ctx_get && cu_ctx_set && cu_dev_get && cu_retain && cu_error) ? 1 : -1;
  return driver_state;
}

static void set_cuda_error(const char *what, PyObject *name, CUresult code) {
  const char *text = NULL;
  if (cu_error) cu_error(code, &text);
  PyErr_Format(PyExc_RuntimeError, "kiln: %s %U failed: CUDA error %d (%s)", what, name, (int)code,
               text ? text : "unknown");
}

#define MAX_PARAMS 128

typedef struct {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  PyObject *name;
  CUfunction function;
  unsigned grid[3];
  unsigned block;
  unsigned shared;
  int device;
  int nargs;     /* Python arguments after the stream */
  int nparams;   /* kernel parameters */
  int dry;
  int grid_args; /* the grid's x and y are the two arguments after the stream (symbolic sizes) */
  char kind[MAX_PARAMS];      /* p u64, q i64, i i32, f fp32, d fp64, c constant 8 bytes, k constant 4 */
  int64_t source[MAX_PARAMS]; /* the argument's position, or the constant */
} Launch;

static int param_size(char kind) { return (kind == 'i' || kind == 'f' || kind == 'k') ? 4 : 8; }

/* one parameter into its 8-byte slot; 0 on success */
static int convert(Launch *self, int j, PyObject *const *args, uint64_t *slot) {
  /* args: the kernel's arguments, past the stream (and the grid) */
  char kind = self->kind[j];
  int64_t src = self->source[j];
  *slot = 0;
  if (kind == 'c') { memcpy(slot, &src, 8); return 0; }
  if (kind == 'k') { int32_t v = (int32_t)src; memcpy(slot, &v, 4); return 0; }
  PyObject *arg = args[src];
  if (kind == 'p') {
    unsigned long long v = PyLong_AsUnsignedLongLong(arg);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) goto bad;
    memcpy(slot, &v, 8);
    return 0;
  }
  if (kind == 'q') {
    long long v = PyLong_AsLongLong(arg);
    if (v == -1 && PyErr_Occurred()) goto bad;
    memcpy(slot, &v, 8);
    return 0;
  }
  if (kind == 'i') {
    long long v = PyLong_AsLongLong(arg);
    if (v == -1 && PyErr_Occurred()) goto bad;
    if (v < INT32_MIN || v > INT32_MAX) {
      PyErr_Format(PyExc_OverflowError, "kiln: %U: argument %d (%lld) does not fit int32", self->name,
                   (int)src, v);
      return -1;
    }
    int32_t w = (int32_t)v;
    memcpy(slot, &w, 4);
    return 0;
  }
  if (kind == 'f' || kind == 'd') {
    double v = PyFloat_AsDouble(arg);
    if (v == -1.0 && PyErr_Occurred()) goto bad;
    if (kind == 'f') { float w = (float)v; memcpy(slot, &w, 4); }
    else memcpy(slot, &v, 8);
    return 0;
  }
  PyErr_Format(PyExc_SystemError, "kiln: %U: unknown parameter kind %c", self->name, kind);
  return -1;
bad:
  PyErr_Format(PyExc_TypeError, "kiln: %U: argument %d of kind '%c' is not a number of that kind",
               self->name, (int)src, kind);
  return -1;
}

static PyObject *launch_call(PyObject *op, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
  Launch *self = (Launch *)op;
  Py_ssize_t n = PyVectorcall_NARGS(nargsf);
  if (kwnames && PyTuple_GET_SIZE(kwnames)) {
    PyErr_Format(PyExc_TypeError, "kiln: %U takes no keyword arguments", self->name);
    return NULL;
  }
  int lead = self->grid_args ? 3 : 1;
  if (n != lead + self->nargs) {
    PyErr_Format(PyExc_TypeError, "kiln: %U takes %d arguments (a stream%s and %d), not %zd", self->name,
                 lead + self->nargs, self->grid_args ? ", the grid's x and y" : "", self->nargs, n);
    return NULL;
  }
  unsigned long long stream = PyLong_AsUnsignedLongLong(args[0]);
  if (stream == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
  unsigned grid[3] = {self->grid[0], self->grid[1], self->grid[2]};
  if (self->grid_args) {
    for (int d = 0; d < 2; d++) {
      long long g = PyLong_AsLongLong(args[1 + d]);
      if (g == -1 && PyErr_Occurred()) return NULL;
      if (g < 0 || g > (d == 0 ? 2147483647LL : 65535LL)) {
        PyErr_Format(PyExc_ValueError, "kiln: %U: grid %c of %lld is outside CUDA's limits", self->name,
                     d == 0 ? 'x' : 'y', g);
        return NULL;
      }
      grid[d] = (unsigned)g;
    }
  }
  uint64_t slots[MAX_PARAMS];
  void *params[MAX_PARAMS];
  for (int j = 0; j < self->nparams; j++) {
    if (convert(self, j, args + lead, &slots[j])) return NULL;
    params[j] = &slots[j];
  }
  if (self->dry) {
    PyObject *out = PyTuple_New(self->nparams + 3);
    if (!out) return NULL;
    PyTuple_SET_ITEM(out, 0, PyLong_FromUnsignedLongLong(stream));
    PyTuple_SET_ITEM(out, 1, PyLong_FromUnsignedLong(grid[0]));
    PyTuple_SET_ITEM(out, 2, PyLong_FromUnsignedLong(grid[1]));
    for (int j = 0; j < self->nparams; j++) {
      uint64_t v = slots[j];
      if (param_size(self->kind[j]) == 4) v &= 0xffffffffull;
      PyTuple_SET_ITEM(out, j + 3, PyLong_FromUnsignedLongLong(v));
    }
    return out;
  }
  if (grid[0] == 0 || grid[1] == 0) Py_RETURN_NONE; /* no elements: nothing launched */
  CUresult rc;
  CUcontext ctx = NULL;
  rc = cu_ctx_get(&ctx);
  if (rc == 0 && ctx == NULL) { /* a thread where nothing made a context current yet */
    CUdevice dev;
    rc = cu_dev_get(&dev, self->device);
    if (rc == 0) rc = cu_retain(&ctx, dev);
    if (rc == 0) rc = cu_ctx_set(ctx);
  }
  if (rc != 0) { set_cuda_error("making a context current for", self->name, rc); return NULL; }
  Py_BEGIN_ALLOW_THREADS
  rc = cu_launch(self->function, grid[0], grid[1], grid[2], self->block, 1, 1, self->shared,
                 (CUstream)(uintptr_t)stream, params, NULL);
  Py_END_ALLOW_THREADS
  if (rc != 0) { set_cuda_error("launching", self->name, rc); return NULL; }
  Py_RETURN_NONE;
}

static PyObject *launch_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
  static char *names[] = {"name", "function", "grid", "block", "shared", "plan", "nargs", "device",
                          "dry", "grid_args", NULL};
  PyObject *name, *plan;
  unsigned long long function;
  unsigned gx, gy, gz, block, shared;
  int nargs, device, dry = 0, grid_args = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "UK(III)IIOii|pp", names, &name, &function, &gx, &gy, &gz,
                                   &block, &shared, &plan, &nargs, &device, &dry, &grid_args))
    return NULL;
  PyObject *seq = PySequence_Fast(plan, "kiln: a launch plan is a sequence of (kind, value) pairs");
  if (!seq) return NULL;
  Py_ssize_t np = PySequence_Fast_GET_SIZE(seq);
  if (np > MAX_PARAMS) {
    Py_DECREF(seq);
    PyErr_Format(PyExc_ValueError, "kiln: %U has %zd parameters, more than %d", name, np, MAX_PARAMS);
    return NULL;
  }
  Launch *self = (Launch *)type->tp_alloc(type, 0);
  if (!self) { Py_DECREF(seq); return NULL; }
  self->vectorcall = launch_call;
  Py_INCREF(name);
  self->name = name;
  self->function = (CUfunction)(uintptr_t)function;
  self->grid[0] = gx; self->grid[1] = gy; self->grid[2] = gz;
  self->block = block;
  self->shared = shared;
  self->device = device;
  self->nargs = nargs;
  self->nparams = (int)np;
  self->dry = dry;
  self->grid_args = grid_args;
  for (Py_ssize_t j = 0; j < np; j++) {
    const char *k;
    long long v;
    if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, j), "sL", &k, &v)) goto fail;
    if (strlen(k) != 1 || !strchr("pqifdck", k[0])) {
      PyErr_Format(PyExc_ValueError, "kiln: %U: parameter %zd has unknown kind %s", name, j, k);
      goto fail;
    }
    if (!strchr("ck", k[0]) && (v < 0 || v >= nargs)) {
      PyErr_Format(PyExc_ValueError, "kiln: %U: parameter %zd reads argument %lld of %d", name, j, v, nargs);
      goto fail;
    }
    self->kind[j] = k[0];
    self->source[j] = v;
  }
  Py_DECREF(seq);
  if (!dry) {
    if (load_driver() != 1) {
      PyErr_SetString(PyExc_RuntimeError, "kiln: libcuda.so.1 or one of its launch entry points not found");
      goto fail_nodecref;
    }
    if (!cu_param_info) {
      PyErr_SetString(PyExc_RuntimeError, "kiln: the driver has no cuFuncGetParamInfo to check a launch plan");
      goto fail_nodecref;
    }
    for (int j = 0; j <= self->nparams; j++) {
      size_t offset = 0, size = 0;
      CUresult rc = cu_param_info(self->function, (size_t)j, &offset, &size);
      if (j == self->nparams) {
        if (rc == 0) {
          PyErr_Format(PyExc_ValueError, "kiln: %U has more than the plan's %d parameters", name, self->nparams);
          goto fail_nodecref;
        }
        break;
      }
      if (rc != 0) {
        PyErr_Format(PyExc_ValueError, "kiln: %U has %d parameters, the plan %d (CUDA error %d)", name, j,
                     self->nparams, (int)rc);
        goto fail_nodecref;
      }
      if ((int)size != param_size(self->kind[j])) {
        PyErr_Format(PyExc_ValueError, "kiln: %U: parameter %d is %d bytes, the plan's kind '%c' %d", name, j,
                     (int)size, self->kind[j], param_size(self->kind[j]));
        goto fail_nodecref;
      }
    }
  }
  return (PyObject *)self;
fail:
  Py_DECREF(seq);
fail_nodecref:
  Py_DECREF(self);
  return NULL;
}

static void launch_dealloc(PyObject *op) {
  Launch *self = (Launch *)op;
  Py_XDECREF(self->name);
  Py_TYPE(op)->tp_free(op);
}

static PyObject *launch_repr(PyObject *op) {
  Launch *self = (Launch *)op;
  return PyUnicode_FromFormat("<kiln native launch %U grid=(%u, %u, %u) block=%u shared=%u>", self->name,
                              self->grid[0], self->grid[1], self->grid[2], self->block, self->shared);
}

static PyObject *get_name(PyObject *op, void *closure) {
  Launch *self = (Launch *)op;
  Py_INCREF(self->name);
  return self->name;
}

static PyGetSetDef launch_getset[] = {{"name", get_name, NULL, NULL, NULL}, {NULL}};

/* immutable: a copy (of a wrapper's namespace, a module holding it) is the object itself */
static PyObject *launch_copy(PyObject *op, PyObject *unused) { Py_INCREF(op); return op; }

static PyMethodDef launch_methods[] = {
    {"__copy__", launch_copy, METH_NOARGS, NULL}, {"__deepcopy__", launch_copy, METH_O, NULL}, {NULL}};

static PyTypeObject LaunchType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kiln_triton_launch.Launch",
    .tp_basicsize = sizeof(Launch),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = launch_new,
    .tp_dealloc = launch_dealloc,
    .tp_repr = launch_repr,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Launch, vectorcall),
    .tp_getset = launch_getset,
    .tp_methods = launch_methods,
    .tp_doc = "One compiled Triton kernel's launch: call with (stream, *arguments).",
};

static PyObject *driver_loaded(PyObject *self, PyObject *unused) {
  return PyBool_FromLong(load_driver() == 1 && cu_param_info != NULL);
}

static PyMethodDef methods[] = {
    {"driver_loaded", driver_loaded, METH_NOARGS, "Whether libcuda and every entry point a launch needs were found."},
    {NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "kiln_triton_launch", NULL, -1, methods};

PyMODINIT_FUNC PyInit_kiln_triton_launch(void) {
  if (PyType_Ready(&LaunchType) < 0) return NULL;
  PyObject *m = PyModule_Create(&module);
  if (!m) return NULL;
  Py_INCREF(&LaunchType);
  if (PyModule_AddObject(m, "Launch", (PyObject *)&LaunchType) < 0) {
    Py_DECREF(&LaunchType);
    Py_DECREF(m);
    return NULL;
  }
  return m;
}
"""

_lock = threading.Lock()
_module: ModuleType | None = None
_failed = False


def _compiler() -> str | None:
    for cc in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if cc and shutil.which(cc):
            return cc
    return None


def _key() -> str:
    abi = sysconfig.get_config_var("EXT_SUFFIX") or ""
    text = "\0".join([SOURCE, sys.version, sys.platform, abi])
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _path() -> Path:
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    return cache_root() / "triton" / "native" / f"{MODULE}-{_key()}{suffix}"


def _build(path: Path) -> None:
    """Compile :data:`SOURCE` into ``path`` atomically (a temporary file in the same folder, then
    a rename); raises on any failure."""
    cc = _compiler()
    if cc is None:
        raise RuntimeError("no C compiler (CC, cc, gcc or clang) found")
    path.parent.mkdir(parents=True, exist_ok=True)
    include = sysconfig.get_paths()["include"]
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=".build-") as tmp:
        src = Path(tmp) / f"{MODULE}.c"
        src.write_text(SOURCE)
        out = Path(tmp) / path.name
        cmd = [cc, "-O2", "-shared", "-fPIC", f"-I{include}", str(src), "-o", str(out), "-ldl"]
        done = subprocess.run(cmd, check=False, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
        os.replace(out, path)


def _import(path: Path) -> ModuleType:
    loader = importlib.machinery.ExtensionFileLoader(MODULE, str(path))
    spec = importlib.util.spec_from_file_location(MODULE, path, loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def module() -> ModuleType | None:
    """The compiled launch module, built on first use; None where it cannot be built or loaded
    (logged once; the Python fast launcher is used then)."""
    global _module, _failed
    if _module is not None or _failed:
        return _module
    with _lock:
        if _module is not None or _failed:
            return _module
        path = _path()
        try:
            if path.exists():
                try:
                    _module = _import(path)
                    counters["native_reused"] += 1
                    return _module
                except ImportError as exc:  # damaged or foreign: build it again
                    log.warning(
                        "kiln: native launch module %s does not load (%s); building it again", path, exc
                    )
            _build(path)
            _module = _import(path)
            counters["native_built"] += 1
        except Exception as exc:
            _failed = True
            counters["native_unavailable"] += 1
            log.warning("kiln: native kernel launches unavailable, using Triton's launcher: %s", exc)
        return _module


_no_driver_logged = False
_preparing: threading.Thread | None = None


def prepare() -> None:
    """Build (or load) the module in a background thread, once per process: the first graph's
    kernels compile meanwhile, so the C compiler's run (0.3-0.5 s on an idle machine) is off the
    compile's critical path; :func:`module` waits for it where it is still running."""
    global _preparing
    if _module is not None or _failed or _preparing is not None:
        return
    _preparing = threading.Thread(target=module, name="kiln-native-launch-build", daemon=True)
    _preparing.start()


def for_launches() -> ModuleType | None:
    """:func:`module` where libcuda and every entry point a launch needs were found; else None
    (logged once)."""
    global _no_driver_logged
    found = module()
    if found is None:
        return None
    if not found.driver_loaded():
        if not _no_driver_logged:
            _no_driver_logged = True
            counters["native_unavailable"] += 1
            log.warning(
                "kiln: native kernel launches need libcuda.so.1 with cuFuncGetParamInfo; using Triton's launcher"
            )
        return None
    return found


def enabled() -> bool:
    return os.environ.get("KILN_TRITON_NATIVE_LAUNCH", "1") != "0"
