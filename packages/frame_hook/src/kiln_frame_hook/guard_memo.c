/*
 * kiln_frame_hook guard memos: skipping the part of a guard tree whose inputs did not change.
 *
 * Note [Skipping what did not change]
 * Most of a module's guard re-reads objects that have not changed since the last call: the
 * module tree (`L['self']._modules['layer1']._modules['0'].__dict__...`), its hook dicts,
 * constant attributes (`.stride == (2, 2)`), methods read through classes. CPython tags every
 * dict with a version that changes on every mutation and is never shared by two dicts or two
 * states of one dict (PEP 509's `ma_version_tag`: on 3.11 an API; on 3.12 deprecated but still
 * maintained for dict watchers, the watcher bits in its low byte), and every type with a
 * version tag that changes whenever the type or a base is modified. So after a run that
 * passed, the tree records a *memo*: for each slot whose value it may take as known, a
 * *witness* of what that value depended on — the entry value's identity, an instance dict's
 * identity and version, a dict's version, a type's identity and version tag — and which ops
 * can be skipped while those witnesses hold. The next call checks the witnesses (a few pointer
 * and integer compares each) instead of running those loads and checks, then runs the rest:
 * the tensor tables (a tensor's metadata changes in place without any version: `.data =`,
 * `resize_`, `requires_grad_()`), calls (grad mode), loads through getters or user
 * `__getattr__`, and everything below a value that is not witnessed.
 *
 * Why a witness keeps the answer. Witnesses are checked in the order the slots were loaded, so
 * each skipped slot's value is known to be alive and the same object when its witness is read:
 * an entry value is compared with the frame's; any other skipped value was loaded from a
 * container whose witness (checked before) says it has not changed since, so the container
 * still holds it (an exact dict by version, an instance dict by the owner's dict pointer and
 * version, a type by its version tag, a tuple because it is immutable). A skipped load gives
 * what it gave then: `obj.name` found in the instance dict of a type whose lookup is object's
 * (the type and its version pin how the name resolves, the dict's version what it finds),
 * `obj.__dict__`, an exact dict's item by str or int key, a tuple's item, `type(obj)`, a plain
 * class attribute of a class whose metatype is `type` (also one `type` itself has as a non-data
 * descriptor, such as every module class's `__call__`: the class's own wins). A skipped check gives what it gave
 * then because it reads only such values: identity and type checks; `len`, truth, membership
 * and keys of an exact dict (an OrderedDict's order can change without a version, so not its
 * keys); equality and truth of immutable builtin values (ints, floats, strings, tuples of them).
 * Checks directly on entry values always run (they are cheap, and an entry value at the same
 * address may be a new object).
 *
 * A witness that fails makes the call run every op (the plain tree) and record again; a slot
 * whose witness failed twice is not witnessed again, so a module that rewrites its own
 * `__dict__` on every call costs its own subtree, not the memo of the whole tree. A memo run
 * that re-enters the same tree (a load running user Python) runs the plain program there.
 * `GuardTree(..., memo=False)` (kiln_dynamo: KILN_GUARD_MEMO=0) turns memos off.
 *
 * Ownership: the memo holds no references; every pointer in it is borrowed and is read only
 * after the witnesses before it say that it is still alive.
 */
#include "guard_tree_internal.h"

#include <string.h>

enum {
    W_ANCHOR = 1,        /* obj is the frame's entry value */
    W_TYPE = 2,          /* type(obj) is type */
    W_TYPE_VERSION = 4,  /* and its version tag is type_version */
    W_IDICT = 8,         /* obj's instance dict is idict */
    W_IDICT_VERSION = 16, /* and its version is idict_version */
    W_DICT_VERSION = 32, /* obj is a dict at version dict_version */
    W_SELF_VERSION = 64, /* obj is a type at version tag self_version */
    W_FIELD = 128,       /* *field is obj (a function's __code__, a cell's contents) */
    W_ENTRY_ITEM = 256,  /* obj is entry value `entry`[key] (an exact tuple or dict) */
};

/* A slot whose witness failed this often is not witnessed again. */
#define UNSTABLE 2

static inline uint64_t dict_version(PyObject *d) {
#if PY_VERSION_HEX >= 0x030C0000
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif
    return ((PyDictObject *)d)->ma_version_tag;
#if PY_VERSION_HEX >= 0x030C0000
#pragma GCC diagnostic pop
#endif
}

static inline int type_version(PyTypeObject *tp, unsigned int *version) {
    if (!PyType_HasFeature(tp, Py_TPFLAGS_VALID_VERSION_TAG) || tp->tp_version_tag == 0) {
        return 0;
    }
    *version = tp->tp_version_tag;
    return 1;
}

static inline int same_type_version(PyTypeObject *tp, unsigned int version) {
    return PyType_HasFeature(tp, Py_TPFLAGS_VALID_VERSION_TAG) && tp->tp_version_tag == version;
}

/* The instance dict of obj if it has one that is an exact dict, else NULL (borrowed). */
static inline PyObject *instance_dict(PyObject *obj) {
    PyObject **dictptr = _PyObject_GetDictPtr(obj);
    return dictptr != NULL && *dictptr != NULL && PyDict_CheckExact(*dictptr) ? *dictptr : NULL;
}

/* Ints, floats, complex numbers, strings, bytes, bools, None, and tuples of them: their
 * equality and truth are fixed once the object is. */
static int immutable(PyObject *x, int depth) {
    if (x == Py_None || x == Py_Ellipsis || PyBool_Check(x) || PyLong_CheckExact(x) || PyFloat_CheckExact(x) ||
        PyComplex_CheckExact(x) || PyUnicode_CheckExact(x) || PyBytes_CheckExact(x)) {
        return 1;
    }
    if (PyTuple_CheckExact(x) && depth < 4) {
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(x); i++) {
            if (!immutable(PyTuple_GET_ITEM(x, i), depth + 1)) {
                return 0;
            }
        }
        return 1;
    }
    return 0;
}

static inline int is_dict_exact(PyObject *x) {
    return PyDict_CheckExact(x) || PyODict_CheckExact(x);
}

static inline int is_name(PyObject *name, const char *want) {
    return PyUnicode_CheckExact(name) && PyUnicode_CompareWithASCIIString(name, want) == 0;
}

/* The getter of a class's standard `__dict__` descriptor (CPython's subtype_dict), found once
 * from a class made for the purpose: only that getter is known to give the instance dict. */
static getter subtype_dict_get;

static int find_subtype_dict(void) {
    PyObject *ns = PyDict_New();
    PyObject *cls = ns == NULL ? NULL : PyObject_CallFunction((PyObject *)&PyType_Type, "s()O", "probe", ns);
    Py_XDECREF(ns);
    if (cls == NULL) {
        return -1;
    }
    PyObject *descr = _PyType_Lookup((PyTypeObject *)cls, PyUnicode_InternFromString("__dict__"));
    if (descr != NULL && Py_IS_TYPE(descr, &PyGetSetDescr_Type)) {
        subtype_dict_get = ((PyGetSetDescrObject *)descr)->d_getset->get;
    }
    Py_DECREF(cls);
    return 0;
}

int guard_memo_init(void) {
    return find_subtype_dict();
}

/* Whether `tp.__dict__` is the standard descriptor (so `obj.__dict__` is obj's instance dict). */
static int standard_dict_descr(PyTypeObject *tp) {
    PyObject *name = PyUnicode_InternFromString("__dict__"); /* interned: the same object each time */
    if (name == NULL) {
        PyErr_Clear();
        return 0;
    }
    PyObject *descr = _PyType_Lookup(tp, name);
    Py_DECREF(name);
    return subtype_dict_get != NULL && descr != NULL && Py_IS_TYPE(descr, &PyGetSetDescr_Type) &&
           ((PyGetSetDescrObject *)descr)->d_getset->get == subtype_dict_get;
}

void guard_memo_clear(GuardMemo *memo) {
    PyMem_Free(memo->witnesses);
    PyMem_Free(memo->impure);
    PyMem_Free(memo->exports);
    PyMem_Free(memo->values);
    PyMem_Free(memo->unstable);
    memset(memo, 0, sizeof(*memo));
}

/* ------------------------------------------------------------------------------------------ */
/* Recording. */

typedef struct {
    GuardTree *tree;
    PyObject *const *values;
    PyObject **regs;
    Py_ssize_t *wit;        /* per slot: its witness, or -1 */
    unsigned char *known;   /* per slot: skipped ops may take its value as known */
    unsigned char *held;    /* per slot: known, and held by something a witness pins */
    unsigned char *exported;
} Recorder;

/* The witness of a slot, created (after every witness it depends on) on first use. */
static Witness *witness(Recorder *r, Py_ssize_t slot) {
    GuardMemo *m = &r->tree->memo;
    if (r->wit[slot] < 0) {
        Witness *w = &m->witnesses[m->nwitnesses];
        memset(w, 0, sizeof(*w));
        w->slot = slot;
        w->obj = r->regs[slot];
        if (slot < r->tree->nvalues) {
            /* an entry value: compared by identity, and its type before anything is read of it */
            w->flags = W_ANCHOR | W_TYPE;
            w->type = Py_TYPE(w->obj);
        }
        r->wit[slot] = m->nwitnesses++;
    }
    return &m->witnesses[r->wit[slot]];
}

static inline int usable(Recorder *r, Py_ssize_t slot) {
    return r->known[slot] && r->tree->memo.unstable[slot] < UNSTABLE;
}

static int want_type(Recorder *r, Py_ssize_t slot, int with_version) {
    Witness *w = witness(r, slot);
    PyTypeObject *tp = Py_TYPE(r->regs[slot]);
    unsigned int version = 0;
    if (with_version && !type_version(tp, &version)) {
        return 0;
    }
    w->flags |= W_TYPE;
    w->type = tp;
    if (with_version) {
        w->flags |= W_TYPE_VERSION;
        w->type_version = version;
    }
    return 1;
}

static void want_dict_version(Recorder *r, Py_ssize_t slot) {
    Witness *w = witness(r, slot);
    w->flags |= W_DICT_VERSION;
    w->dict_version = dict_version(r->regs[slot]);
}

/* An item of an entry value that is built anew for every call (`*args`, `**kwargs`), read again
 * on each call and compared by identity: the item is known (not held) while it is the same. */
static int record_entry_item(Recorder *r, GuardOp *op) {
    PyObject *x = r->regs[op->src], *got = r->regs[op->dst];
    if (r->tree->memo.unstable[op->dst] >= UNSTABLE) {
        return 0;
    }
    if (PyTuple_CheckExact(x) && PyLong_CheckExact(op->obj)) {
        Py_ssize_t i = PyLong_AsSsize_t(op->obj);
        if (i < 0 || i >= PyTuple_GET_SIZE(x) || PyTuple_GET_ITEM(x, i) != got) {
            PyErr_Clear();
            return 0;
        }
    } else if (!(PyDict_CheckExact(x) && PyUnicode_CheckExact(op->obj) && PyDict_GetItemWithError(x, op->obj) == got)) {
        PyErr_Clear();
        return 0;
    }
    Witness *w = witness(r, op->dst);
    w->flags |= W_ENTRY_ITEM | W_TYPE;
    w->type = Py_TYPE(got);
    w->entry = op->src;
    w->key = op->obj;
    return 2;
}

/* A field of a held function or cell: `__closure__` is read-only, the others are compared. */
static int record_field(Recorder *r, GuardOp *op) {
    PyObject *x = r->regs[op->src], *got = r->regs[op->dst];
    PyObject **field = NULL;
    int readonly = 0;
    if (PyFunction_Check(x)) {
        PyFunctionObject *f = (PyFunctionObject *)x;
        if (is_name(op->obj, "__code__")) {
            field = &f->func_code;
        } else if (is_name(op->obj, "__defaults__")) {
            field = &f->func_defaults;
        } else if (is_name(op->obj, "__kwdefaults__")) {
            field = &f->func_kwdefaults;
        } else if (is_name(op->obj, "__closure__")) {
            field = &f->func_closure;
            readonly = 1;
        }
    } else if (PyCell_Check(x) && is_name(op->obj, "cell_contents")) {
        field = &((PyCellObject *)x)->ob_ref;
    }
    if (field == NULL || *field != got) {
        return 0;
    }
    if (!readonly) {
        Witness *w = witness(r, op->dst);
        w->flags |= W_FIELD;
        w->field = field;
    }
    return 1;
}

/* Whether a load's value may be taken as known on the next calls (1: and held, 2: not held);
 * adds the witnesses. */
static int record_load(Recorder *r, GuardOp *op) {
    if (op->op == OP_LOAD_CONST) {
        return 1;
    }
    if (op->op == OP_LOAD_CALL) {
        return 0;
    }
    if (op->op == OP_LOAD_ITEM && op->src < r->tree->nvalues) {
        int item = record_entry_item(r, op);
        if (item) {
            return item;
        }
    }
    if (!usable(r, op->src)) {
        return 0;
    }
    PyObject *x = r->regs[op->src], *got = r->regs[op->dst];
    PyTypeObject *tp = Py_TYPE(x);
    if (op->op == OP_LOAD_ATTR && r->held[op->src] && record_field(r, op)) {
        return 1;
    }
    switch (op->op) {
    case OP_LOAD_ATTR:
    case OP_LOAD_OBJATTR: {
        int cached = op->op == OP_LOAD_ATTR && op->cache.type == tp && op->cache.version != 0 &&
                     same_type_version(tp, op->cache.version);
        PyObject *d = instance_dict(x);
        if (d != NULL && is_name(op->obj, "__dict__") && got == d && standard_dict_descr(tp) &&
            (op->op == OP_LOAD_OBJATTR || (cached && op->cache.how == HOW_GETSET))) {
            if (!want_type(r, op->src, 1)) {
                return 0;
            }
            Witness *w = witness(r, op->src);
            w->flags |= W_IDICT;
            w->idict = d;
            return 1;
        }
        if (cached && op->cache.how == HOW_DICT && d != NULL) {
            PyObject *found = PyDict_GetItemWithError(d, op->obj); /* borrowed */
            if (found != got) {
                PyErr_Clear();
                return 0; /* not from the instance dict */
            }
            if (!want_type(r, op->src, 1)) {
                return 0;
            }
            Witness *w = witness(r, op->src);
            w->flags |= W_IDICT | W_IDICT_VERSION;
            w->idict = d;
            w->idict_version = dict_version(d);
            return 1;
        }
        if (op->op == OP_LOAD_ATTR && Py_IS_TYPE(x, &PyType_Type)) {
            /* a class attribute: type_getattro finds it in the class's MRO unless `type` itself
             * has the name as a data descriptor (`__name__`, `__dict__`); a non-data one of
             * `type` (`__call__`'s slot wrapper: every nn.Module class's `__call__`) loses to
             * the class's own, and `type`, a static type, never changes. A function's __get__
             * without an instance gives the function. */
            unsigned int version;
            PyObject *meta = _PyType_Lookup(&PyType_Type, op->obj); /* borrowed */
            if (!type_version((PyTypeObject *)x, &version) ||
                (meta != NULL && (Py_TYPE(meta)->tp_descr_get == NULL || Py_TYPE(meta)->tp_descr_set != NULL))) {
                return 0;
            }
            PyObject *found = _PyType_Lookup((PyTypeObject *)x, op->obj);
            if (found == NULL || found != got ||
                !(Py_TYPE(found)->tp_descr_get == NULL || PyFunction_Check(found))) {
                return 0;
            }
            Witness *w = witness(r, op->src);
            w->flags |= W_SELF_VERSION;
            w->self_version = version;
            return 1;
        }
        return 0;
    }
    case OP_LOAD_ITEM:
        if (PyDict_CheckExact(x) && (PyUnicode_CheckExact(op->obj) || PyLong_CheckExact(op->obj))) {
            PyObject *found = PyDict_GetItemWithError(x, op->obj); /* borrowed */
            if (found != got) {
                PyErr_Clear();
                return 0;
            }
            want_dict_version(r, op->src);
            return 1;
        }
        return PyTuple_CheckExact(x) && r->held[op->src];
    case OP_LOAD_TYPE:
        return want_type(r, op->src, 0);
    }
    return 0;
}

/* Whether a check gives the same answer while the witnesses hold; adds the witnesses. */
static int record_check(Recorder *r, GuardOp *op) {
    if (op->op == OP_TENSORS || op->src < r->tree->nvalues || !usable(r, op->src)) {
        return 0;
    }
    PyObject *x = r->regs[op->src];
    int held = r->held[op->src];
    switch (op->op) {
    case OP_TYPE_IS:
        return want_type(r, op->src, 0);
    case OP_IS:
    case OP_ID_EQ:
        return 1;
    case OP_SAME:
        return op->src2 >= r->tree->nvalues && usable(r, op->src2);
    case OP_IS_REF:
        return held;
    case OP_EQ:
        return held && immutable(x, 0) && immutable(op->obj, 0);
    case OP_SAME_FLOAT:
        return held && immutable(x, 0);
    case OP_ITEM_TYPES:
        if (!held || !PyTuple_CheckExact(x)) {
            return 0;
        }
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(x); i++) {
            if (PyType_HasFeature(Py_TYPE(PyTuple_GET_ITEM(x, i)), Py_TPFLAGS_HEAPTYPE)) {
                return 0; /* its __class__ may be assigned */
            }
        }
        return 1;
    case OP_LEN_EQ:
    case OP_FALSY:
        if (is_dict_exact(x)) {
            want_dict_version(r, op->src);
            return 1;
        }
        return held && immutable(x, 0);
    case OP_NOT_IN:
        if (is_dict_exact(x) && PyUnicode_CheckExact(op->obj)) {
            want_dict_version(r, op->src);
            return 1;
        }
        return 0;
    case OP_KEYS_EQ:
        if (PyDict_CheckExact(x)) {
            want_dict_version(r, op->src);
            return 1;
        }
        return 0;
    }
    return 0;
}

static void export_slot(Recorder *r, Py_ssize_t slot) {
    if (slot >= r->tree->nvalues && r->known[slot] && !r->exported[slot]) {
        r->exported[slot] = 1;
        r->tree->memo.exports[r->tree->memo.nexports++] = slot;
    }
}

void guard_memo_record(GuardTree *tree, PyObject *const *values, PyObject **regs) {
    GuardMemo *m = &tree->memo;
    if (m->busy) {
        return;
    }
    Py_ssize_t nslots = tree->nslots, nops = tree->nops;
    if (m->witnesses == NULL) {
        m->witnesses = PyMem_Malloc((size_t)(nslots ? nslots : 1) * sizeof(Witness));
        m->impure = PyMem_Malloc((size_t)(nops ? nops : 1) * sizeof(Py_ssize_t));
        m->exports = PyMem_Malloc((size_t)(nslots ? nslots : 1) * sizeof(Py_ssize_t));
        m->values = PyMem_Malloc((size_t)(nslots ? nslots : 1) * sizeof(PyObject *));
        m->unstable = PyMem_Calloc((size_t)(nslots ? nslots : 1), 1);
        if (!m->witnesses || !m->impure || !m->exports || !m->values || !m->unstable) {
            guard_memo_clear(m);
            tree->memo_on = 0; /* no memory for it: run plainly */
            return;
        }
    }
    Py_ssize_t *wit = PyMem_Malloc((size_t)(nslots ? nslots : 1) * (sizeof(Py_ssize_t) + 3));
    if (wit == NULL) {
        return;
    }
    Recorder r = {tree, values, regs, wit, (unsigned char *)(wit + nslots), NULL, NULL};
    r.held = r.known + nslots;
    r.exported = r.held + nslots;
    for (Py_ssize_t i = 0; i < nslots; i++) {
        wit[i] = -1;
        r.known[i] = i < tree->nvalues; /* an entry value is known once anchored */
        r.held[i] = r.exported[i] = 0;
    }
    m->busy = 1;
    m->valid = 0;
    m->nwitnesses = m->nimpure = m->nexports = 0;
    for (Py_ssize_t i = 0; i < nops; i++) {
        GuardOp *op = &tree->ops[i];
        int skip;
        if (op->op < OP_TYPE_IS) {
            skip = record_load(&r, op);
            if (skip) {
                if (op->op != OP_LOAD_CONST && op->src < tree->nvalues && skip == 1) {
                    witness(&r, op->src); /* anchor it */
                }
                r.known[op->dst] = 1;
                r.held[op->dst] = skip == 1;
            }
        } else {
            skip = record_check(&r, op);
        }
        if (!skip) {
            m->impure[m->nimpure++] = i;
        }
    }
    /* what the ops that still run read of the skipped slots */
    for (Py_ssize_t k = 0; k < m->nimpure; k++) {
        GuardOp *op = &tree->ops[m->impure[k]];
        if (op->op == OP_TENSORS) {
            for (Py_ssize_t j = 0; j < op->nrows; j++) {
                export_slot(&r, op->rows[j].slot);
            }
        } else if (op->op != OP_LOAD_CONST && op->op != OP_LOAD_CALL) {
            export_slot(&r, op->src);
            if (op->op == OP_SAME) {
                export_slot(&r, op->src2);
            }
        }
    }
    for (Py_ssize_t k = 0; k < m->nexports; k++) {
        m->values[m->exports[k]] = regs[m->exports[k]];
    }
    PyMem_Free(wit);
    m->records++;
    m->valid = 1;
    m->busy = 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Running. */

/* -1 when every witness holds, else the slot of the first that does not. */
static Py_ssize_t failed_witness(GuardMemo *m, PyObject *const *values) {
    for (Py_ssize_t i = 0; i < m->nwitnesses; i++) {
        Witness *w = &m->witnesses[i];
        PyObject *x = w->obj;
        int f = w->flags;
        if ((f & W_ANCHOR) && values[w->slot] != x) {
            return w->slot;
        }
        if ((f & W_FIELD) && *w->field != x) {
            return w->slot;
        }
        if (f & W_ENTRY_ITEM) {
            PyObject *from = values[w->entry];
            if (PyTuple_CheckExact(from)) {
                Py_ssize_t i = PyLong_AsSsize_t(w->key);
                if (i >= PyTuple_GET_SIZE(from) || PyTuple_GET_ITEM(from, i) != x) {
                    return w->slot;
                }
            } else if (!PyDict_CheckExact(from) || PyDict_GetItemWithError(from, w->key) != x) {
                PyErr_Clear();
                return w->slot;
            }
        }
        if ((f & W_TYPE) && (Py_TYPE(x) != w->type ||
                             ((f & W_TYPE_VERSION) && !same_type_version(w->type, w->type_version)))) {
            return w->slot;
        }
        if (f & W_IDICT) {
            PyObject **dictptr = _PyObject_GetDictPtr(x);
            if (dictptr == NULL || *dictptr != w->idict ||
                ((f & W_IDICT_VERSION) && dict_version(w->idict) != w->idict_version)) {
                return w->slot;
            }
        }
        if ((f & W_DICT_VERSION) && dict_version(x) != w->dict_version) {
            return w->slot;
        }
        if ((f & W_SELF_VERSION) && !same_type_version((PyTypeObject *)x, w->self_version)) {
            return w->slot;
        }
    }
    return -1;
}

int guard_memo_run(GuardTree *tree, PyObject *const *values, PyObject **regs) {
    GuardMemo *m = &tree->memo;
    if (!m->valid || m->busy) {
        return 2;
    }
    Py_ssize_t bad = failed_witness(m, values);
    if (bad >= 0) {
        if (m->unstable[bad] < 255) {
            m->unstable[bad]++;
        }
        m->valid = 0;
        m->misses++;
        return 2;
    }
    m->hits++;
    for (Py_ssize_t k = 0; k < m->nexports; k++) {
        Py_ssize_t slot = m->exports[k];
        regs[slot] = Py_NewRef(m->values[slot]);
    }
    m->busy = 1;
    int verdict = guard_tree_run(tree, regs, m->impure, m->nimpure);
    m->busy = 0;
    return verdict;
}

/* {"valid", "hits", "misses", "records", "witnesses", "skipped_ops", "run_ops", "run"} ("run": the
 * indices of the ops a warm call still runs), or None when memos are off. New reference. */
PyObject *guard_memo_stats(GuardTree *tree) {
    if (!tree->memo_on) {
        Py_RETURN_NONE;
    }
    GuardMemo *m = &tree->memo;
    Py_ssize_t run = m->valid ? m->nimpure : tree->nops;
    PyObject *which = PyTuple_New(run);
    if (which == NULL) {
        return NULL;
    }
    for (Py_ssize_t k = 0; k < run; k++) {
        PyObject *i = PyLong_FromSsize_t(m->valid ? m->impure[k] : k);
        if (i == NULL) {
            Py_DECREF(which);
            return NULL;
        }
        PyTuple_SET_ITEM(which, k, i);
    }
    return Py_BuildValue("{s:O,s:K,s:K,s:K,s:n,s:n,s:n,s:N}", "valid", m->valid ? Py_True : Py_False, "hits",
                         m->hits, "misses", m->misses, "records", m->records, "witnesses",
                         m->valid ? m->nwitnesses : 0, "skipped_ops", tree->nops - run, "run_ops", run, "run",
                         which);
}
