"""The cyclic garbage collector while kiln compiles.

Note [The collector scans only the compile's objects]: a compile allocates hundreds of thousands
of objects that live on (fx nodes, sympy expressions, fake tensors, IR closures), so CPython's
collector runs full collections during it, and each full collection walks every object of the
process: torch's, transformers' and sympy's modules, the model, the caches. ResNet's training
compile ran 4 of them, 1.1 s of its 7 s of CPU time on the development machine (T5's 1.0 of 6).
While a graph compiles the objects that existed before it are moved to the collector's permanent
generation (`gc.freeze`) and moved back after (`gc.unfreeze`): collections during the compile
walk only what the compile made, and still free its cycles; garbage made before it waits for
the next collection after. Nothing a compile decides depends on when the collector runs, so the
generated code is the same. The process's own use of `gc.freeze` (a server that freezes before
it forks) is left alone: a compile that finds frozen objects, or the collector off, does nothing.
Compiles on several threads share one window, the first in and last out owning it.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

_lock = threading.Lock()
_depth = 0
_owned = False  # this module froze the heap for the current window


@contextlib.contextmanager
def only_new_objects() -> Iterator[None]:
    """Collect only objects made inside the block (Note [The collector scans only the compile's
    objects])."""
    global _depth, _owned
    with _lock:
        if _depth == 0:
            _owned = gc.isenabled() and gc.get_freeze_count() == 0
            if _owned:
                gc.freeze()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _owned:
                _owned = False
                gc.unfreeze()
