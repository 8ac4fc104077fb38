/* Internal to guard_tree.c and guard_memo.c: the layout of a GuardTree. See guard_tree.c. */
#ifndef KILN_GUARD_TREE_INTERNAL_H
#define KILN_GUARD_TREE_INTERNAL_H

#include "guard_tree.h"
#include "kiln_tensor_check.h"

#include <stdint.h>

/* Keep in step with kiln_dynamo/guard_tree.py (the compiler) and _C.pyi. */
enum {
    OP_LOAD_ATTR = 0,      /* dst = src.<obj> */
    OP_LOAD_OBJATTR = 1,   /* dst = object.__getattribute__(src, <obj>) */
    OP_LOAD_ITEM = 2,      /* dst = src[<obj>] */
    OP_LOAD_CONST = 3,     /* dst = <obj> */
    OP_LOAD_TYPE = 4,      /* dst = type(src) */
    OP_LOAD_CALL = 5,      /* dst = <obj>() if n == 0 else <obj>(<obj2>) */
    OP_TYPE_IS = 10,       /* type(src) is <obj> */
    OP_IS = 11,            /* src is <obj> */
    OP_IS_REF = 12,        /* src is <obj>() (a weak reference) */
    OP_ID_EQ = 13,         /* id(src) == n */
    OP_EQ = 14,            /* src == <obj> (truth of the result) */
    OP_ITEM_TYPES = 15,    /* tuple(map(type, src)) == <obj> */
    OP_LEN_EQ = 16,        /* len(src) == n */
    OP_KEYS_EQ = 17,       /* list(src.keys()) == <obj> */
    OP_NOT_IN = 18,        /* <obj> not in src */
    OP_FALSY = 19,         /* not src */
    OP_SAME = 20,          /* src is src2 */
    OP_SAME_FLOAT = 21,    /* src is the same float (complex) as <obj>: NaN is NaN, -0.0 is not 0.0 */
    OP_TENSORS = 30,       /* each row of <obj> matches */
};

/* Note [The attribute cache]; the type is not owned. */
typedef struct {
    PyTypeObject *type;
    unsigned int version;
    int how;
    PyGetSetDef *getset;
} AttrCache;

typedef struct {
    Py_ssize_t slot;
    AttrCache caches[4]; /* dtype, device (or is_cpu), requires_grad, shape */
    PyObject *type;       /* borrowed from the op tuple */
    PyObject *dtype;      /* borrowed */
    PyObject *device;     /* borrowed; NULL: the CPU, checked through is_cpu */
    PyObject *requires_grad; /* borrowed: Py_True or Py_False */
    PyObject *sizes;      /* borrowed tuple */
    PyObject *strides;    /* borrowed tuple */
    PyObject *keys;       /* borrowed int (the dispatch key set's raw bits), or NULL: unchecked */
    PyObject *keys_fn;    /* borrowed: keys_fn(t) == keys_want, for the attribute path */
    PyObject *keys_want;  /* borrowed: what keys_fn gives for these keys (`keys` unless the row says) */
    int fast;             /* a KilnTensorChecker may decide this row */
    int64_t *ints;        /* owned (PyMem): sizes then strides, for the checker; NULL: not ints */
    KilnTensorSpec spec;  /* what the checker is given */
} TensorRow;

typedef struct {
    int op;
    Py_ssize_t dst, src, src2, n;
    PyObject *obj, *obj2; /* borrowed from the op tuple */
    TensorRow *rows;      /* owned (PyMem) for OP_TENSORS */
    Py_ssize_t nrows;
    AttrCache cache; /* LOAD_ATTR's (Note [The attribute cache]) */
} GuardOp;

/* Note [Skipping what did not change] (guard_memo.c). A witness: what must still hold of the
 * value a slot had when the memo was recorded for the ops that read it to be skipped. */
typedef struct {
    Py_ssize_t slot;
    PyObject *obj;          /* the slot's value then: borrowed, alive while the witnesses before hold */
    int flags;              /* W_* (guard_memo.c) */
    PyTypeObject *type;     /* W_TYPE: type(obj) */
    unsigned int type_version; /* W_TYPE_VERSION: type(obj)'s version tag */
    PyObject *idict;        /* W_IDICT: obj's instance dict */
    uint64_t idict_version; /* W_IDICT_VERSION: its version tag */
    uint64_t dict_version;  /* W_DICT_VERSION: obj (a dict)'s version tag */
    unsigned int self_version; /* W_SELF_VERSION: obj (a type)'s version tag */
    PyObject **field;       /* W_FIELD: a field of a held function or cell that holds obj */
    Py_ssize_t entry;       /* W_ENTRY_ITEM: obj is the entry value `entry`'s item `key` */
    PyObject *key;          /* borrowed from the op tuple */
} Witness;

typedef struct {
    int valid;                /* the arrays below describe the last passing run */
    int busy;                 /* a memo run or record is in progress (re-entry runs without it) */
    Py_ssize_t nwitnesses, nimpure, nexports;
    Witness *witnesses;       /* owned (PyMem), nslots */
    Py_ssize_t *impure;       /* owned, nops: the ops a memo run still runs, in order */
    Py_ssize_t *exports;      /* owned, nslots: skipped slots that those ops read */
    PyObject **values;        /* owned array of borrowed values, nslots: each slot's value then */
    unsigned char *unstable;  /* owned, nslots: how often a witness on the slot failed */
    unsigned long long hits, misses, records;
} GuardMemo;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    Py_ssize_t nvalues, nslots, nops, ntensors;
    GuardOp *ops;        /* owned (PyMem); NULL once cleared */
    PyObject *op_tuples; /* owned tuple of the op tuples */
    PyObject *residual;  /* owned or NULL */
    PyObject *reference; /* owned: what the client explains failures with (may be None) */
    PyObject *text;      /* owned: the client's rendering of the tree (str) */
    PyObject *weakrefs;  /* weak references to the tree */
    int memo_on;         /* Note [Skipping what did not change]; 0: every call runs every op */
    GuardMemo memo;
} GuardTree;

/* Running a program: `order` lists the ops to run (NULL: all of them, in order). 1, 0 or -1. */
int guard_tree_run(GuardTree *tree, PyObject **regs, const Py_ssize_t *order, Py_ssize_t n);
/* How a LOAD_ATTR found its attribute (Note [The attribute cache]). */
enum { HOW_SLOW = 0, HOW_DICT = 1, HOW_GETSET = 2 };

/* guard_memo.c (Note [Skipping what did not change]). */
/* Runs `tree` through its memo if it has a valid one: 1 pass, 0 fail, -1 error; 2: no memo,
 * or a witness no longer holds (the caller runs the whole program). */
int guard_memo_run(GuardTree *tree, PyObject *const *values, PyObject **regs);
/* After a whole run that passed, with every slot in `regs`: records what the next call may skip. */
void guard_memo_record(GuardTree *tree, PyObject *const *values, PyObject **regs);
void guard_memo_clear(GuardMemo *memo);
int guard_memo_init(void);
PyObject *guard_memo_stats(GuardTree *tree);

#endif
