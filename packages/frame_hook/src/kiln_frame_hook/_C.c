/*
 * kiln_frame_hook._C: the PEP 523 frame-evaluation hook.
 *
 * CPython lets one function per interpreter evaluate every Python frame
 * (_PyInterpreterState_SetEvalFrameFunc). kiln installs `hook` below while some thread has a
 * callback. For each frame about to run, `hook` decides in C, with no call into Python beyond the
 * guards themselves:
 *
 *   - run it as is (chain to the previous evaluator): generators and coroutines, code without
 *     fast locals (module and class bodies), frames started while a guard or the callback runs,
 *     code marked SKIP, and everything while no callback is set for this thread;
 *   - run a cached entry: the code's co_extra slot holds an ExtraState whose entries (most recently
 *     hit first) each pair a guard with a transformed code object; the first guard that returns
 *     true wins and its code runs instead of the original (only entries made under the frame's
 *     globals are tried: Note [An entry serves its frame's globals]). A guard that is a GuardTree is run in
 *     C (guard_tree.c: no Python call when it passes); any other guard is called;
 *   - ask Python: on a miss, the Python dispatcher (kiln_frame_hook._dispatch) classifies the code
 *     and calls the user's callback, which may return a new entry; it is added and run now.
 *
 * Guards see the frame's *entry values*: its argument slots, then the contents of its closure
 * cells. At entry nothing else in a frame is set yet (MAKE_CELL and COPY_FREE_VARS have not run),
 * so these are all its locals.
 *
 * Note [Running a transformed code object]
 * The transformed code has the original's argument layout; the dispatcher derives from it a
 * "flat" code object whose every argument slot is positional (same slots, same bytecode). If its
 * frame fits, it runs in the original's frame (Note [Running in place]). Otherwise the frame's
 * argument slots (localsplus[0:nargs], contiguous) are passed as a vectorcall argument array to a
 * function made from the flat code, the frame's globals and the original closure.
 * CPython then binds, runs and clears that frame itself. The flat code is marked SKIP so the hook
 * lets it run. The function object is made per call unless Note [Reusing the function] allows
 * otherwise: a cached one holds the globals, and globals -> function -> code -> co_extra -> entry
 * -> globals is a cycle the garbage collector cannot see (co_extra is not traversed).
 *
 * Note [Who clears the original frame]
 * 3.11: the caller (_PyEval_Vector) clears and pops the frame after the evaluator returns, so the
 * hook leaves it alone. 3.12: the evaluator clears and pops the frame it was given; when the hook
 * does not run the default evaluator on it (a cache hit, or an error from a guard or the
 * callback) it must clear and pop it itself: `clear_unstarted_frame`. The frame has never run and
 * was never linked into the thread's frame chain, so it has no frame object and only its argument
 * slots, function and code to release.
 *
 * Ownership: every function states whether a PyObject* it returns is a new or borrowed reference.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#if PY_VERSION_HEX < 0x030B0000 || PY_VERSION_HEX >= 0x030D0000
#error "kiln_frame_hook supports CPython 3.11 and 3.12 only: re-verify frame layout and clearing first"
#endif

#define Py_BUILD_CORE 1
#if PY_VERSION_HEX >= 0x030C0000
#undef _PyGC_FINALIZED /* cpython#105268: clash between the public and internal headers */
#endif
#include "internal/pycore_frame.h"
#undef Py_BUILD_CORE

#include "guard_tree.h"

#define IS_PY312 (PY_VERSION_HEX >= 0x030C0000)

#if IS_PY312
#define FRAME_FUNC(frame) ((PyFunctionObject *)(frame)->f_funcobj)
#define REQUEST_EXTRA_INDEX PyUnstable_Eval_RequestCodeExtraIndex
#define CODE_GET_EXTRA PyUnstable_Code_GetExtra
#define CODE_SET_EXTRA PyUnstable_Code_SetExtra
#else
#define FRAME_FUNC(frame) ((frame)->f_func)
#define REQUEST_EXTRA_INDEX _PyEval_RequestCodeExtraIndex
#define CODE_GET_EXTRA _PyCode_GetExtra
#define CODE_SET_EXTRA _PyCode_SetExtra
#endif

/* Code that is never intercepted: generators, coroutines, async generators. */
#define UNHOOKED_FLAGS (CO_GENERATOR | CO_COROUTINE | CO_ITERABLE_COROUTINE | CO_ASYNC_GENERATOR)

/* Per-code strategies (ExtraState.strategy) and dispatcher actions. Keep in step with _dispatch.py. */
enum { STRATEGY_DEFAULT = 0, STRATEGY_SKIP = 1, STRATEGY_RUN_ONLY = 2 };
enum { ACTION_RUN = 0, ACTION_SKIP = 1, ACTION_RUN_ONLY = 2, ACTION_ENTRY = 3 };
/* Thread modes. */
enum { MODE_NORMAL = 0, MODE_RUN_ONLY = 1 };

#define MAX_STACK_VALUES 64

/* ------------------------------------------------------------------------------------------ */
/* Module state. One interpreter; all of it is touched only with the GIL held. */

static Py_ssize_t extra_index = -1;
static PyObject *global_callback = NULL;  /* owned; NULL: none */
static PyObject *dispatcher = NULL;       /* owned; kiln_frame_hook._dispatch.dispatch */
static PyObject *unbound = NULL;          /* owned; the UNBOUND sentinel */
static Py_ssize_t cache_limit = 8;
static Py_ssize_t thread_callbacks = 0;   /* threads whose thread_callback is set */
static int installed = 0;
static _PyFrameEvalFunction previous_eval = NULL;
/* How entries ran (for tests and for seeing which path a program takes). */
static unsigned long long runs_in_place = 0, runs_reused_function = 0, runs_new_function = 0;

static _Thread_local PyObject *thread_callback = NULL; /* owned; NULL: use global_callback */
static _Thread_local int thread_mode = MODE_NORMAL;
static _Thread_local int in_hook = 0; /* >0 while a guard or the dispatcher runs */

/* ------------------------------------------------------------------------------------------ */
/* Cache entries: a small GC-tracked type, so Python can see them (read-only). */

typedef struct {
    PyObject_HEAD
    PyObject *guard;    /* owned */
    PyObject *code;     /* owned: the transformed code as the callback gave it */
    PyObject *run_code; /* owned: its flat form, see Note [Running a transformed code object] */
    PyObject *run_func; /* owned or NULL: a ready function for run_code, see Note [Reusing the function] */
    PyObject *globals;  /* not a reference, only compared: see Note [An entry serves its frame's globals] */
} CacheEntry;

static int entry_traverse(CacheEntry *self, visitproc visit, void *arg) {
    Py_VISIT(self->guard);
    Py_VISIT(self->code);
    Py_VISIT(self->run_code);
    Py_VISIT(self->run_func);
    return 0;
}

static int entry_clear(CacheEntry *self) {
    Py_CLEAR(self->guard);
    Py_CLEAR(self->code);
    Py_CLEAR(self->run_code);
    Py_CLEAR(self->run_func);
    return 0;
}

static void entry_dealloc(CacheEntry *self) {
    PyObject_GC_UnTrack(self);
    entry_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *entry_repr(CacheEntry *self) {
    return PyUnicode_FromFormat("CacheEntry(guard=%R, code=%R)", self->guard, self->code);
}

static PyMemberDef entry_members[] = {
    {"guard", T_OBJECT, offsetof(CacheEntry, guard), READONLY, "the guard over the frame's entry values"},
    {"code", T_OBJECT, offsetof(CacheEntry, code), READONLY, "the transformed code object"},
    {"run_code", T_OBJECT, offsetof(CacheEntry, run_code), READONLY, "the flat form that actually runs"},
    {NULL},
};

static PyTypeObject CacheEntryType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kiln_frame_hook.CacheEntry",
    .tp_basicsize = sizeof(CacheEntry),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "One guarded entry of a code object's cache.",
    .tp_traverse = (traverseproc)entry_traverse,
    .tp_clear = (inquiry)entry_clear,
    .tp_dealloc = (destructor)entry_dealloc,
    .tp_repr = (reprfunc)entry_repr,
    .tp_members = entry_members,
};

/* Returns a new reference, or NULL with an exception set. Steals nothing. run_func may be None;
 * globals is only compared (Note [An entry serves its frame's globals]). */
static PyObject *entry_new(PyObject *guard, PyObject *code, PyObject *run_code, PyObject *run_func,
                           PyObject *globals) {
    CacheEntry *self = PyObject_GC_New(CacheEntry, &CacheEntryType);
    if (self == NULL) {
        return NULL;
    }
    self->guard = Py_NewRef(guard);
    self->code = Py_NewRef(code);
    self->run_code = Py_NewRef(run_code);
    self->run_func = run_func == Py_None ? NULL : Py_NewRef(run_func);
    self->globals = globals;
    PyObject_GC_Track(self);
    return (PyObject *)self;
}

/* ------------------------------------------------------------------------------------------ */
/* Per-code state in co_extra. */

typedef struct {
    int strategy;
    PyObject *entries; /* owned list of CacheEntry, most recently hit first */
} ExtraState;

/* The freefunc CPython calls when the code object dies (or its slot is overwritten). */
static void extra_free(void *p) {
    ExtraState *state = (ExtraState *)p;
    if (state == NULL) {
        return;
    }
    Py_XDECREF(state->entries);
    PyMem_Free(state);
}

/* Borrowed pointer (owned by the code object), or NULL if the code has none. Never raises. */
static ExtraState *extra_get(PyObject *code) {
    void *p = NULL;
    if (CODE_GET_EXTRA(code, extra_index, &p) < 0) {
        PyErr_Clear();
        return NULL;
    }
    return (ExtraState *)p;
}

/* Borrowed pointer to the code's state, created if missing; NULL with an exception set. */
static ExtraState *extra_ensure(PyObject *code) {
    ExtraState *state = extra_get(code);
    if (state != NULL) {
        return state;
    }
    state = PyMem_Malloc(sizeof(ExtraState));
    if (state == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    state->strategy = STRATEGY_DEFAULT;
    state->entries = PyList_New(0);
    if (state->entries == NULL) {
        PyMem_Free(state);
        return NULL;
    }
    if (CODE_SET_EXTRA(code, extra_index, state) < 0) {
        extra_free(state);
        return NULL;
    }
    return state;
}

/* ------------------------------------------------------------------------------------------ */
/* Installing the evaluator. */

static PyObject *hook(PyThreadState *tstate, _PyInterpreterFrame *frame, int throw_flag);

static void update_install(void) {
    int want = global_callback != NULL || thread_callbacks > 0;
    PyInterpreterState *interp = PyInterpreterState_Get();
    if (want && !installed) {
        previous_eval = _PyInterpreterState_GetEvalFrameFunc(interp);
        _PyInterpreterState_SetEvalFrameFunc(interp, hook);
        installed = 1;
    } else if (!want && installed) {
        _PyInterpreterState_SetEvalFrameFunc(interp, previous_eval);
        previous_eval = NULL;
        installed = 0;
    }
}

static inline PyObject *run_default(PyThreadState *tstate, _PyInterpreterFrame *frame, int throw_flag) {
    if (previous_eval != NULL && previous_eval != _PyEval_EvalFrameDefault) {
        return previous_eval(tstate, frame, throw_flag);
    }
    return _PyEval_EvalFrameDefault(tstate, frame, throw_flag);
}

/* ------------------------------------------------------------------------------------------ */
/* Note [Who clears the original frame]: 3.12 only. */

#if IS_PY312
static void clear_unstarted_frame(PyThreadState *tstate, _PyInterpreterFrame *frame) {
    assert(frame->owner == FRAME_OWNED_BY_THREAD);
    assert(frame->frame_obj == NULL);
    for (int i = 0; i < frame->stacktop; i++) {
        Py_XDECREF(frame->localsplus[i]);
    }
    Py_XDECREF(frame->f_locals);
    Py_DECREF(frame->f_funcobj);
    Py_DECREF(frame->f_code);
    /* Pop it off the thread's data stack; free the chunk if the frame opened one. */
    PyObject **base = (PyObject **)frame;
    _PyStackChunk *chunk = tstate->datastack_chunk;
    if (base == &chunk->data[0]) {
        _PyStackChunk *previous = chunk->previous;
        tstate->datastack_top = &previous->data[previous->top];
        tstate->datastack_chunk = previous;
        tstate->datastack_limit = (PyObject **)(((char *)previous) + previous->size);
        PyObjectArenaAllocator arena;
        PyObject_GetArenaAllocator(&arena);
        arena.free(arena.ctx, chunk, chunk->size);
    } else {
        tstate->datastack_top = base;
    }
}
#define FINISH_UNSTARTED(tstate, frame) clear_unstarted_frame(tstate, frame)
#else
#define FINISH_UNSTARTED(tstate, frame) ((void)0)
#endif

/* ------------------------------------------------------------------------------------------ */
/* The hook. */

static inline Py_ssize_t entry_arg_count(PyCodeObject *code) {
    return code->co_argcount + code->co_kwonlyargcount + ((code->co_flags & CO_VARARGS) ? 1 : 0) +
           ((code->co_flags & CO_VARKEYWORDS) ? 1 : 0);
}

/* Fills `values` with the frame's entry values (borrowed references) and returns their count.
 * `values` must hold nargs + nfree pointers. */
static Py_ssize_t fill_entry_values(_PyInterpreterFrame *frame, Py_ssize_t nargs, PyObject **values) {
    for (Py_ssize_t i = 0; i < nargs; i++) {
        values[i] = frame->localsplus[i];
    }
    PyObject *closure = FRAME_FUNC(frame)->func_closure;
    Py_ssize_t nfree = closure == NULL ? 0 : PyTuple_GET_SIZE(closure);
    for (Py_ssize_t i = 0; i < nfree; i++) {
        PyObject *content = PyCell_GET(PyTuple_GET_ITEM(closure, i));
        values[nargs + i] = content != NULL ? content : unbound;
    }
    return nargs + nfree;
}

/* Note [Reusing the function]
 * Making a function object per call costs an allocation. The dispatcher makes one ahead of time
 * when that is safe: the original has no closure and its globals are a module's namespace in
 * sys.modules, which lives as long as the module is imported, so the reference the entry holds
 * cannot be what keeps a dead namespace alive. It is used only while the frame's globals are that
 * namespace. */

/* Runs `entry` through a function made for it, leaving the frame unstarted (the caller finishes it).
 * New reference, or NULL with an exception set. */
static PyObject *run_entry_as_call(_PyInterpreterFrame *frame, CacheEntry *entry, Py_ssize_t nargs) {
    PyFunctionObject *original = FRAME_FUNC(frame);
    if (entry->run_func != NULL && original->func_closure == NULL &&
        ((PyFunctionObject *)entry->run_func)->func_globals == frame->f_globals) {
        runs_reused_function++;
        return PyObject_Vectorcall(entry->run_func, frame->localsplus, (size_t)nargs, NULL);
    }
    runs_new_function++;
    PyObject *func = PyFunction_New(entry->run_code, frame->f_globals);
    if (func == NULL) {
        return NULL;
    }
    if (original->func_closure != NULL && PyFunction_SetClosure(func, original->func_closure) < 0) {
        Py_DECREF(func);
        return NULL;
    }
    PyObject *result = PyObject_Vectorcall(func, frame->localsplus, (size_t)nargs, NULL);
    Py_DECREF(func);
    return result;
}

/* Note [Running in place]
 * The fastest way to run an entry is in the frame CPython already pushed: at entry a frame holds
 * only its argument slots, laid out identically in the flat code, so swapping f_code (and the
 * instruction pointer and stack top that derive from it) makes it a fresh frame of the flat code.
 * This is allowed only when the flat code's frame fits in the memory pushed for the original's
 * (co_framesize on 3.12; locals plus stack on 3.11); its extra locals are set to NULL first. The
 * frame then belongs to the evaluator as usual, so Note [Who clears the original frame] does not
 * apply. When it does not fit, run_entry_as_call runs the entry through a function instead. */
static inline int fits_in_place(PyCodeObject *original, PyCodeObject *run) {
#if IS_PY312
    return run->co_framesize <= original->co_framesize;
#else
    return run->co_nlocalsplus + run->co_stacksize <= original->co_nlocalsplus + original->co_stacksize;
#endif
}

/* Turns the unstarted frame into a frame of `run` (borrowed). Steals nothing. */
static void swap_in_place(_PyInterpreterFrame *frame, PyCodeObject *run) {
    PyCodeObject *original = frame->f_code;
    for (int i = original->co_nlocalsplus; i < run->co_nlocalsplus; i++) {
        frame->localsplus[i] = NULL;
    }
    frame->f_code = (PyCodeObject *)Py_NewRef(run);
    frame->prev_instr = _PyCode_CODE(run) - 1;
    frame->stacktop = run->co_nlocalsplus;
    Py_DECREF(original); /* the function still holds it */
}

/* Note [An entry serves its frame's globals]
 * Functions can share a code object and differ in their globals (`types.FunctionType(code, ns)`,
 * functions copied by serializers): the cache is per code object, and a guard reads the globals
 * of the frame that compiled it (kiln_dynamo binds that dict as a constant, `G`), so a function
 * with the other globals passed it and ran a graph with the first one's global values baked in
 * (a wrong answer; found by the twenty-eighth session's guard programs). An entry is therefore
 * tried only for frames whose globals are the dict it was compiled under. The entry keeps that
 * dict's address, not a reference (a reference would close the cycle globals -> function -> code
 * -> co_extra -> entry -> globals that the collector cannot see, Note [Reusing the function]). An
 * address cannot match a new dict that took a dead one's place while the guard reads the
 * globals, since the guard then holds the dict; where the guard does not read them, the entry
 * does not depend on them and a match is harmless. */

/* Tries each guard of an entry made under `globals`, in order; moves a hit to the front. Returns a
 * new reference to the entry on a hit, NULL on a miss (no exception) or on a guard error
 * (exception set; *error = 1). Borrows everything. */
static CacheEntry *lookup(ExtraState *state, PyObject *globals, PyObject *const *values, Py_ssize_t nvalues,
                          int *error) {
    PyObject *entries = state->entries;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(entries); i++) {
        if (((CacheEntry *)PyList_GET_ITEM(entries, i))->globals != globals) {
            continue; /* Note [An entry serves its frame's globals] */
        }
        CacheEntry *entry = (CacheEntry *)Py_NewRef(PyList_GET_ITEM(entries, i)); /* a guard may clear the cache */
        int ok;
        in_hook++;
        if (Py_IS_TYPE(entry->guard, &GuardTreeType)) {
            ok = guard_tree_check(entry->guard, values, nvalues); /* no Python call on a pass */
        } else {
            PyObject *verdict = PyObject_Vectorcall(entry->guard, values, (size_t)nvalues, NULL);
            ok = verdict == NULL ? -1 : PyObject_IsTrue(verdict);
            Py_XDECREF(verdict);
        }
        in_hook--;
        if (ok < 0) {
            Py_DECREF(entry);
            *error = 1;
            return NULL;
        }
        if (ok) {
            /* Most recently hit first. A guard may have changed the list: find the entry again. */
            PyObject **items = ((PyListObject *)entries)->ob_item;
            for (Py_ssize_t at = PyList_GET_SIZE(entries) - 1; at > 0; at--) {
                if (items[at] == (PyObject *)entry) {
                    memmove(&items[1], &items[0], (size_t)at * sizeof(PyObject *));
                    items[0] = (PyObject *)entry;
                    break;
                }
            }
            return entry;
        }
        Py_DECREF(entry);
    }
    return NULL;
}

/* Calls the Python dispatcher on a miss. Returns a new reference to its result tuple
 * (action, guard, code, run_code, run_func), or NULL with an exception set. */
static PyObject *call_dispatcher(_PyInterpreterFrame *frame, PyObject *callback, PyObject *const *values,
                                 Py_ssize_t nvalues, ExtraState *state) {
    PyObject *value_tuple = PyTuple_New(nvalues);
    if (value_tuple == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < nvalues; i++) {
        PyTuple_SET_ITEM(value_tuple, i, Py_NewRef(values[i]));
    }
    PyObject *entries = state != NULL ? PyList_GetSlice(state->entries, 0, PY_SSIZE_T_MAX) : PyList_New(0);
    if (entries == NULL) {
        Py_DECREF(value_tuple);
        return NULL;
    }
    int limit_reached = state != NULL && PyList_GET_SIZE(state->entries) >= cache_limit;
    PyObject *args[] = {
        callback,
        (PyObject *)frame->f_code,
        (PyObject *)FRAME_FUNC(frame),
        value_tuple,
        frame->f_globals,
        frame->f_builtins,
        entries,
        limit_reached ? Py_True : Py_False,
    };
    in_hook++;
    PyObject *result = PyObject_Vectorcall(dispatcher, args, sizeof(args) / sizeof(args[0]), NULL);
    in_hook--;
    Py_DECREF(value_tuple);
    Py_DECREF(entries);
    return result;
}

/* Adds a new entry at the front of the code's cache, evicting the least recently used one at the
 * limit, and marks its flat code SKIP. Borrowed entry, or NULL with an exception set. */
static CacheEntry *add_entry(PyObject *code, PyObject *guard, PyObject *new_code, PyObject *run_code,
                             PyObject *run_func, PyObject *globals) {
    ExtraState *state = extra_ensure(code);
    if (state == NULL) {
        return NULL;
    }
    ExtraState *run_state = extra_ensure(run_code);
    if (run_state == NULL) {
        return NULL;
    }
    run_state->strategy = STRATEGY_SKIP;
    PyObject *entry = entry_new(guard, new_code, run_code, run_func, globals);
    if (entry == NULL) {
        return NULL;
    }
    while (PyList_GET_SIZE(state->entries) >= cache_limit && PyList_GET_SIZE(state->entries) > 0) {
        if (PySequence_DelItem(state->entries, PyList_GET_SIZE(state->entries) - 1) < 0) {
            Py_DECREF(entry);
            return NULL;
        }
    }
    int failed = PyList_Insert(state->entries, 0, entry);
    Py_DECREF(entry); /* the list owns it now */
    return failed ? NULL : (CacheEntry *)entry;
}

static PyObject *hook(PyThreadState *tstate, _PyInterpreterFrame *frame, int throw_flag) {
    PyCodeObject *code = frame->f_code;
    PyObject *callback = thread_callback != NULL ? thread_callback : global_callback;
    if (throw_flag || in_hook || callback == NULL || tstate->tracing ||
        (code->co_flags & UNHOOKED_FLAGS) || !(code->co_flags & CO_OPTIMIZED) ||
        frame->owner != FRAME_OWNED_BY_THREAD) {
        return run_default(tstate, frame, throw_flag);
    }
    ExtraState *state = extra_get((PyObject *)code);
    if (state != NULL && state->strategy == STRATEGY_SKIP) {
        return run_default(tstate, frame, throw_flag);
    }
    if (state != NULL && PyList_GET_SIZE(state->entries) == 0 &&
        (state->strategy == STRATEGY_RUN_ONLY || thread_mode == MODE_RUN_ONLY)) {
        return run_default(tstate, frame, throw_flag);
    }

    Py_ssize_t nargs = entry_arg_count(code);
    Py_ssize_t nfree = code->co_nfreevars;
    PyObject *stack_values[MAX_STACK_VALUES];
    PyObject **values = stack_values;
    if (nargs + nfree > MAX_STACK_VALUES) {
        values = PyMem_Malloc((size_t)(nargs + nfree) * sizeof(PyObject *));
        if (values == NULL) {
            PyErr_NoMemory();
            FINISH_UNSTARTED(tstate, frame);
            return NULL;
        }
    }
    Py_ssize_t nvalues = fill_entry_values(frame, nargs, values);

    PyObject *result = NULL;
    CacheEntry *entry = NULL;
    int error = 0;
    if (state != NULL) {
        entry = lookup(state, frame->f_globals, values, nvalues, &error);
        if (error) {
            goto fail;
        }
    }
    if (entry == NULL) {
        state = extra_get((PyObject *)code); /* a guard may have changed it */
        if ((state != NULL && state->strategy != STRATEGY_DEFAULT) || thread_mode == MODE_RUN_ONLY) {
            goto run_original;
        }
        PyObject *decision = call_dispatcher(frame, callback, values, nvalues, state);
        if (decision == NULL) {
            goto fail;
        }
        long action = PyLong_AsLong(PyTuple_GET_ITEM(decision, 0));
        if (action == ACTION_ENTRY) {
            entry = add_entry((PyObject *)code, PyTuple_GET_ITEM(decision, 1), PyTuple_GET_ITEM(decision, 2),
                              PyTuple_GET_ITEM(decision, 3), PyTuple_GET_ITEM(decision, 4), frame->f_globals);
            if (entry != NULL) {
                Py_INCREF(entry); /* keep it alive while it runs, whatever happens to the cache */
            }
        } else if (action == ACTION_SKIP || action == ACTION_RUN_ONLY) {
            ExtraState *s = extra_ensure((PyObject *)code);
            if (s != NULL) {
                s->strategy = action == ACTION_SKIP ? STRATEGY_SKIP : STRATEGY_RUN_ONLY;
            }
        }
        Py_DECREF(decision);
        if (PyErr_Occurred()) {
            Py_XDECREF(entry);
            goto fail;
        }
        if (entry == NULL) {
            goto run_original;
        }
    }
    /* We hold a reference to entry here. */
    if (values != stack_values) {
        PyMem_Free(values);
    }
    if (fits_in_place(code, (PyCodeObject *)entry->run_code)) {
        runs_in_place++;
        swap_in_place(frame, (PyCodeObject *)entry->run_code);
        Py_DECREF(entry);
        return run_default(tstate, frame, throw_flag);
    }
    result = run_entry_as_call(frame, entry, nargs);
    Py_DECREF(entry);
    FINISH_UNSTARTED(tstate, frame);
    return result;

run_original:
    if (values != stack_values) {
        PyMem_Free(values);
    }
    return run_default(tstate, frame, throw_flag);

fail:
    if (values != stack_values) {
        PyMem_Free(values);
    }
    FINISH_UNSTARTED(tstate, frame);
    return NULL;
}

/* ------------------------------------------------------------------------------------------ */
/* Python API (wrapped and documented by kiln_frame_hook/__init__.py). */

static PyObject *check_callback(PyObject *cb) {
    if (cb != Py_None && !PyCallable_Check(cb)) {
        PyErr_Format(PyExc_TypeError, "a frame callback must be callable or None, not %.100s",
                     Py_TYPE(cb)->tp_name);
        return NULL;
    }
    return cb;
}

/* set_callback(cb) -> previous. New reference. */
static PyObject *py_set_callback(PyObject *module, PyObject *cb) {
    if (check_callback(cb) == NULL) {
        return NULL;
    }
    PyObject *previous = global_callback != NULL ? global_callback : Py_NewRef(Py_None);
    global_callback = cb == Py_None ? NULL : Py_NewRef(cb);
    update_install();
    return previous;
}

static PyObject *py_set_thread_callback(PyObject *module, PyObject *cb) {
    if (check_callback(cb) == NULL) {
        return NULL;
    }
    PyObject *previous = thread_callback != NULL ? thread_callback : Py_NewRef(Py_None);
    if (previous != Py_None) {
        thread_callbacks--;
    }
    thread_callback = cb == Py_None ? NULL : Py_NewRef(cb);
    if (thread_callback != NULL) {
        thread_callbacks++;
    }
    update_install();
    return previous;
}

static PyObject *py_set_thread_mode(PyObject *module, PyObject *arg) {
    long mode = PyLong_AsLong(arg);
    if (mode == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (mode != MODE_NORMAL && mode != MODE_RUN_ONLY) {
        PyErr_Format(PyExc_ValueError, "unknown thread mode %ld", mode);
        return NULL;
    }
    int previous = thread_mode;
    thread_mode = (int)mode;
    return PyLong_FromLong(previous);
}

static PyObject *py_init(PyObject *module, PyObject *args) {
    PyObject *fn, *sentinel;
    if (!PyArg_ParseTuple(args, "OO", &fn, &sentinel)) {
        return NULL;
    }
    Py_XSETREF(dispatcher, Py_NewRef(fn));
    Py_XSETREF(unbound, Py_NewRef(sentinel));
    Py_RETURN_NONE;
}

static int require_code(PyObject *code) {
    if (!PyCode_Check(code)) {
        PyErr_Format(PyExc_TypeError, "expected a code object, not %.100s", Py_TYPE(code)->tp_name);
        return -1;
    }
    return 0;
}

static PyObject *py_entries(PyObject *module, PyObject *code) {
    if (require_code(code) < 0) {
        return NULL;
    }
    ExtraState *state = extra_get(code);
    return state == NULL ? PyList_New(0) : PyList_GetSlice(state->entries, 0, PY_SSIZE_T_MAX);
}

static PyObject *py_clear(PyObject *module, PyObject *code) {
    if (require_code(code) < 0) {
        return NULL;
    }
    ExtraState *state = extra_get(code);
    if (state != NULL) {
        state->strategy = STRATEGY_DEFAULT;
        if (PyList_SetSlice(state->entries, 0, PY_SSIZE_T_MAX, NULL) < 0) {
            return NULL;
        }
    }
    Py_RETURN_NONE;
}

static PyObject *py_get_strategy(PyObject *module, PyObject *code) {
    if (require_code(code) < 0) {
        return NULL;
    }
    ExtraState *state = extra_get(code);
    return PyLong_FromLong(state == NULL ? STRATEGY_DEFAULT : state->strategy);
}

static PyObject *py_set_strategy(PyObject *module, PyObject *args) {
    PyObject *code;
    int strategy;
    if (!PyArg_ParseTuple(args, "Oi", &code, &strategy) || require_code(code) < 0) {
        return NULL;
    }
    if (strategy < STRATEGY_DEFAULT || strategy > STRATEGY_RUN_ONLY) {
        PyErr_Format(PyExc_ValueError, "unknown strategy %d", strategy);
        return NULL;
    }
    ExtraState *state = extra_ensure(code);
    if (state == NULL) {
        return NULL;
    }
    state->strategy = strategy;
    Py_RETURN_NONE;
}

static PyObject *py_set_cache_limit(PyObject *module, PyObject *arg) {
    Py_ssize_t limit = PyLong_AsSsize_t(arg);
    if (limit == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (limit < 1) {
        PyErr_Format(PyExc_ValueError, "the cache limit must be at least 1, not %zd", limit);
        return NULL;
    }
    Py_ssize_t previous = cache_limit;
    cache_limit = limit;
    return PyLong_FromSsize_t(previous);
}

static PyObject *py_get_cache_limit(PyObject *module, PyObject *unused) {
    return PyLong_FromSsize_t(cache_limit);
}

static PyObject *py_run_counts(PyObject *module, PyObject *unused) {
    return Py_BuildValue("{sKsKsK}", "in_place", runs_in_place, "reused_function", runs_reused_function,
                         "new_function", runs_new_function);
}

static PyObject *py_is_installed(PyObject *module, PyObject *unused) {
    return PyBool_FromLong(installed);
}

static PyMethodDef methods[] = {
    {"init", py_init, METH_VARARGS, "init(dispatcher, unbound): connect the Python side."},
    {"set_callback", py_set_callback, METH_O, "Set the interpreter-wide callback; return the previous."},
    {"set_thread_callback", py_set_thread_callback, METH_O, "Set this thread's callback; return the previous."},
    {"set_thread_mode", py_set_thread_mode, METH_O, "Set this thread's mode; return the previous."},
    {"entries", py_entries, METH_O, "The code's cache entries, most recently hit first."},
    {"clear", py_clear, METH_O, "Drop the code's entries and strategy."},
    {"get_strategy", py_get_strategy, METH_O, "The code's strategy."},
    {"set_strategy", py_set_strategy, METH_VARARGS, "Set the code's strategy."},
    {"set_cache_limit", py_set_cache_limit, METH_O, "Set the per-code entry limit; return the previous."},
    {"get_cache_limit", py_get_cache_limit, METH_NOARGS, "The per-code entry limit."},
    {"is_installed", py_is_installed, METH_NOARGS, "Whether the evaluator is installed now."},
    {"set_tensor_checker", guard_tree_set_checker, METH_O,
     "Hand over a torch-linked tensor checker (a capsule, kiln_tensor_check.h) or None; return the previous."},
    {"run_counts", py_run_counts, METH_NOARGS, "How many entries ran in place, through a reused or a new function."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "kiln_frame_hook._C", "The PEP 523 frame hook (see kiln_frame_hook).", -1, methods,
};

PyMODINIT_FUNC PyInit__C(void) {
    if (PyType_Ready(&CacheEntryType) < 0 || guard_tree_init() < 0) {
        return NULL;
    }
    if (extra_index < 0) {
        extra_index = REQUEST_EXTRA_INDEX(extra_free);
        if (extra_index < 0) {
            PyErr_SetString(PyExc_RuntimeError, "kiln_frame_hook: no co_extra index left");
            return NULL;
        }
    }
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL) {
        return NULL;
    }
    if (PyModule_AddObjectRef(module, "CacheEntry", (PyObject *)&CacheEntryType) < 0 ||
        PyModule_AddObjectRef(module, "GuardTree", (PyObject *)&GuardTreeType) < 0 ||
        PyModule_AddIntConstant(module, "STRATEGY_DEFAULT", STRATEGY_DEFAULT) < 0 ||
        PyModule_AddIntConstant(module, "STRATEGY_SKIP", STRATEGY_SKIP) < 0 ||
        PyModule_AddIntConstant(module, "STRATEGY_RUN_ONLY", STRATEGY_RUN_ONLY) < 0 ||
        PyModule_AddIntConstant(module, "ACTION_RUN", ACTION_RUN) < 0 ||
        PyModule_AddIntConstant(module, "ACTION_SKIP", ACTION_SKIP) < 0 ||
        PyModule_AddIntConstant(module, "ACTION_RUN_ONLY", ACTION_RUN_ONLY) < 0 ||
        PyModule_AddIntConstant(module, "ACTION_ENTRY", ACTION_ENTRY) < 0 ||
        PyModule_AddIntConstant(module, "MODE_NORMAL", MODE_NORMAL) < 0 ||
        PyModule_AddIntConstant(module, "MODE_RUN_ONLY", MODE_RUN_ONLY) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
