"""Stand-ins: plain Python versions of torch functions that kiln traces in their place.

Note [Stand-ins for torch's higher-order functions]: some torch functions are written for
torch.compile's own tracer, which captures them as higher-order operators; their Python bodies
(`torch.vmap` of the user's function, pytree specs, `torch.compile` of an inner function) are
not code kiln can trace. Where such a function has a simple meaning in ordinary tensor ops, kiln
inlines a stand-in from this module instead: a call of the torch function (however it was
reached, and guarded as that function) is traced as a call of the stand-in, like user code. A
call a stand-in does not cover is handed to the real function, which is traced (or breaks) as
before: calls made from this file are never replaced. `KILN_STAND_INS=0` turns them off; `KILN_LOG=decisions` prints each use.

- `torch._higher_order_ops.associative_scan.associative_scan(combine_fn, xs, dim, reverse,
  combine_mode)`: an inclusive scan. Mamba's selective scan calls it when
  `torch.compiler.is_compiling()` answers True (Note [Answering is_compiling]), where eager runs
  a Python loop over the sequence. The stand-in is that loop: `acc = combine_fn(acc, x[i])` over
  the scanned dimension, for a tensor or a tuple/list of tensors, the results stacked back along
  `dim`. Associativity makes it equal to torch's tree-shaped scan; it is eager's own order of
  operations, so the values match eager's loop. The graph grows with the length of the scanned
  dimension, as eager's loop does.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch

ENABLED = os.environ.get("KILN_STAND_INS", "1") != "0"


def associative_scan(
    combine_fn: Callable[[Any, Any], Any],
    xs: Any,
    dim: int,
    reverse: bool = False,
    combine_mode: str = "pointwise",
) -> Any:
    """Note [Stand-ins for torch's higher-order functions]: torch's associative_scan, sequentially."""
    from torch._higher_order_ops.associative_scan import associative_scan as real

    single = isinstance(xs, torch.Tensor)
    leaves = [xs] if single else list(xs) if type(xs) in (tuple, list) else []
    if (
        not leaves
        or not all(isinstance(leaf, torch.Tensor) for leaf in leaves)
        or combine_mode not in ("pointwise", "generic")
        or (combine_mode == "pointwise" and not all(leaf.device.type in ("cuda", "xpu") for leaf in leaves))
    ):
        return real(combine_fn, xs, dim, reverse=reverse, combine_mode=combine_mode)  # its checks, its errors
    n = leaves[0].shape[dim]
    steps = []
    acc: Any = None
    for i in range(n - 1, -1, -1) if reverse else range(n):
        if single:
            cur: Any = xs.select(dim, i)
        else:
            parts = [leaf.select(dim, i) for leaf in leaves]
            cur = tuple(parts) if type(xs) is tuple else parts
        acc = cur if acc is None else combine_fn(acc, cur)
        steps.append(acc)
    if reverse:
        steps.reverse()
    if single:
        return torch.stack(steps, dim)
    out = [torch.stack([step[j] for step in steps], dim) for j in range(len(leaves))]
    return tuple(out) if type(xs) is tuple else out


# (module, qualified name) of the torch function -> its stand-in
STAND_INS: dict[tuple[str, str], Callable[..., Any]] = {
    ("torch._higher_order_ops.associative_scan", "associative_scan"): associative_scan,
}


STAND_INS_FILE = __file__


def stand_in_for(value: Any) -> Callable[..., Any] | None:
    """The stand-in kiln traces in place of the torch function `value`, or None."""
    if not ENABLED or not callable(value):
        return None
    key = (getattr(value, "__module__", None), getattr(value, "__qualname__", None))
    return STAND_INS.get(key)  # type: ignore[arg-type]
