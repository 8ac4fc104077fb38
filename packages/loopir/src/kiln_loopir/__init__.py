"""kiln-loopir: not built yet.

It will own: the define-by-run loop-level IR: lowering of aten FX graphs, the virtualized ops
namespace, a reference interpreter, and the fusion scheduler.
"""

__version__ = "0.1.0"
