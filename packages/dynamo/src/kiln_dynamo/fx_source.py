"""Forgetting the generated source of a freed FX graph module.

Note [Generated FX source outlives its module]: ``torch.fx.GraphModule.recompile`` execs the
module's ``forward`` from generated source under a fresh file name (``<eval_with_key>.N``) and
keeps that source forever, in torch.fx's private loader cache and as a lazy ``linecache`` entry
(so tracebacks can show it). Nothing removes them when the module is freed: every graph kiln
builds and drops (each recompile builds one in dynamo and one or more in aotgrad) left about
0.6 KB behind, 10,000 recompiles about 9 MB of RSS. :func:`forget_source_when_freed` ties the
two entries to the life of the module's current ``forward``: when that function is freed (the
module is, or a later ``recompile`` replaced it), they are dropped. While the module lives its
source stays readable, so tracebacks and ``KILN_LOG=output_code`` are unchanged.
"""

from __future__ import annotations

import linecache
import weakref
from typing import Any

import torch
from torch.fx._lazy_graph_module import _LazyGraphModule

_PREFIX = "<eval_with_key>"


def forget_source_when_freed(gm: torch.fx.GraphModule) -> None:
    """Drop ``gm``'s generated source from torch.fx's caches once its ``forward`` is freed."""
    forward = type(gm).__dict__.get("forward")
    code = getattr(forward, "__code__", None)
    if code is None or not code.co_filename.startswith(_PREFIX):
        return
    weakref.finalize(forward, _forget, code.co_filename)


# Note [Graph modules generated on demand]: building a GraphModule generates its Python source
# and compiles it (``recompile``), and each graph pass that rewrites it does so again; kiln's
# compilers read the graph, not the module's code, and call ``forward`` only where a graph falls
# back to running as it is. ResNet's training compile built eight modules, 0.45 s of CPU time
# here. aotgrad's graphs are therefore torch.fx's lazy graph modules (``_LazyGraphModule``: its
# ``recompile`` only marks the module stale, ``forward`` or ``code`` generates it first), and the
# source forgotten with the module once it is generated (Note [Generated FX source outlives its
# module]). Accessing ``code`` generates it: a log line that prints it asks its logger first.
class LazyGraphModule(_LazyGraphModule):
    """A graph module whose source is generated on first use (Note [Graph modules generated on
    demand])."""

    def _real_recompile(self) -> Any:
        code = super()._real_recompile()
        forget_source_when_freed(self)
        return code


def graph_module(root: torch.nn.Module | dict[str, Any], graph: torch.fx.Graph) -> torch.fx.GraphModule:
    """A graph module over ``graph``, its source generated on first use (Note [Graph modules
    generated on demand])."""
    return LazyGraphModule(root, graph)


def _forget(key: str) -> None:
    loader = getattr(torch.fx.graph_module, "_loader", None)
    cache = getattr(loader, "eval_cache", None)
    if isinstance(cache, dict):
        cache.pop(key, None)
    linecache.cache.pop(key, None)
