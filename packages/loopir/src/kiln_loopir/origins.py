"""Where a buffer's loops came from, and the kernel names and source comments made from that.

Note [Origins]: every lazy loop nest (``Pointwise``, ``Reduction``) and every ``View`` carries the
fx nodes whose computation it holds, as :class:`Origin` records. While ``GraphLowering`` lowers
node ``n``, the current origins (:func:`attributed`) are ``n`` and whatever ``n``'s tensor
arguments *carry*, and every loop nest built meanwhile takes them. An argument carries origins
only while it is lazy: unrealized loops are inlined into their reader, so ``gelu(x.view(...)) *
w`` is one loop nest whose origins are the view, the gelu and the mul; a realized buffer carries
nothing, its readers only load it. A loop nest captures its inputs' loaders when it is built, so
its origins are fixed then; a ``View`` asks its base for a loader whenever it is read, so it
holds only its own node and carries that plus what its base carries at that moment
(``ir.carried``). A ``ComputedBuffer``'s origins are its loops', a fused kernel's the union of
its members'.

From them both code generators name kernels the way torch.compile does (``cpp_fused_add_mul_3``,
``triton_poi_fused_gelu_view_3``: prefix, ``fused_``, the sorted, deduplicated aten op names, at
most six, views dropped first, and the schedule step: :func:`kernel_name`) and open each kernel's source with the user's lines it came
from (:func:`source_comment`, from ``node.meta["source_line"]`` as aotgrad stamps it, or dynamo's
``stack_trace``). Both depend only on the graph, so names and sources, and with them the on-disk
caches keyed by source, are the same from one run to the next.
"""

from __future__ import annotations

import contextlib
import linecache
import re
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch.fx

# the most op names a kernel name lists (torch.compile's kernel_name_max_ops is 10)
MAX_NAME_OPS = 6
# the most user lines a kernel's opening comment lists
MAX_COMMENT_LINES = 8
# the most fx node names it lists
MAX_COMMENT_NODES = 12
# ops that only reinterpret memory: named last when a kernel name has no room for every op
VIEW_NAMES = frozenset(
    [
        "_unsafe_view",
        "alias",
        "as_strided",
        "expand",
        "flatten",
        "narrow",
        "permute",
        "reshape",
        "select",
        "slice",
        "split",
        "squeeze",
        "t",
        "transpose",
        "unbind",
        "unflatten",
        "unsqueeze",
        "view",
        "view_as",
    ]
)
# the kind field a code generator fills in once it knows the kernel's kind (Triton: poi/red/per)
KIND = "{kind}"

_NOT_IDENT = re.compile(r"\W")
_TORCH_FRAME = re.compile(r'File "(.+)", line (\d+)')
_FILE_LINE = re.compile(r"(.+):(\d+)")  # dynamo's "file:line"
_FILE_LINE_TEXT = re.compile(r"(.+?):(\d+): .*")  # aotgrad's own "file:line: source"


@dataclass(frozen=True, slots=True, order=True)
class Origin:
    """One fx node that a buffer's loops compute (part of); see Note [Origins]."""

    order: int  # the node's position in its graph
    node: str  # the fx node's name
    op: str  # the aten op's name without namespace and overload: "add", "_to_copy"
    where: str  # the user's "file:line", or ""


NO_ORIGINS: frozenset[Origin] = frozenset()

_state = threading.local()


def current() -> frozenset[Origin]:
    """The origins of loops built right now (empty outside :func:`attributed`)."""
    origins: frozenset[Origin] = getattr(_state, "origins", NO_ORIGINS)
    return origins


def current_own() -> frozenset[Origin]:
    """The node being lowered right now, alone (what a ``View`` built now holds)."""
    own: frozenset[Origin] = getattr(_state, "own", NO_ORIGINS)
    return own


@contextlib.contextmanager
def attributed(own: frozenset[Origin], origins: frozenset[Origin]) -> Iterator[None]:
    """In the block, views built take ``own`` and loops built take ``origins``."""
    previous = current_own(), current()
    _state.own, _state.origins = own, origins
    try:
        yield
    finally:
        _state.own, _state.origins = previous


def op_name(target: Any) -> str:
    """An fx call target's short name: ``aten.add.Tensor`` -> ``add``, a function -> its name."""
    if isinstance(target, torch._ops.OpOverload | torch._ops.OpOverloadPacket):
        name = target.__name__.split(".")[0]
    else:
        name = getattr(target, "__name__", type(target).__name__)
    return _NOT_IDENT.sub("_", name)


def where(node: torch.fx.Node) -> str:
    """The user's ``file:line`` a node came from: aotgrad's ``source_line`` meta, else the last
    frame of dynamo's (or torch.fx's) ``stack_trace``; ``""`` when the graph does not say."""
    line = node.meta.get("source_line")
    if isinstance(line, str):
        match = _FILE_LINE.fullmatch(line.strip()) or _FILE_LINE_TEXT.fullmatch(line.strip())
        if match is not None:
            return f"{match.group(1)}:{match.group(2)}"
    trace = node.meta.get("stack_trace")
    if isinstance(trace, str):
        frames = _TORCH_FRAME.findall(trace)
        if frames:
            return f"{frames[-1][0]}:{frames[-1][1]}"
    return ""


def origin_of(node: torch.fx.Node, order: int) -> Origin:
    return Origin(order, node.name, op_name(node.target), where(node))


def of_members(members: Iterable[Any]) -> frozenset[Origin]:
    """The origins of a kernel: the union of its members' (ComputedBuffers') loops' origins."""
    out: set[Origin] = set()
    for member in members:
        out |= getattr(getattr(member, "data", None), "origins", NO_ORIGINS)
    return frozenset(out)


def fused_ops(origins: Iterable[Origin], limit: int = MAX_NAME_OPS) -> list[str]:
    """The sorted, deduplicated op names of ``origins``, at most ``limit`` of them: when some
    must go, views go first (they move no data: a layer norm is ``mean_mul_rsqrt_sub_var``
    sooner than ``mean_permute_view``)."""
    names = {o.op for o in origins}
    kept = sorted(names, key=lambda n: (n in VIEW_NAMES, n))[:limit]
    return sorted(kept)


def kernel_name(prefix: str, members: Iterable[Any], step: int) -> str:
    """``{prefix}_fused_{op}_{op}..._{step}`` for the kernel of one schedule step.

    The step makes the name unique within the graph's module; the ops say what it fuses. A
    kernel with no known origins is ``{prefix}_{step}``. ``prefix`` may hold :data:`KIND` for a
    generator that picks the kernel's kind later.
    """
    ops = fused_ops(of_members(members))
    middle = "fused_" + "_".join(ops) + "_" if ops else ""
    return f"{prefix}_{middle}{step}"


def source_comment(name: str, members: Iterable[Any], leader: str) -> list[str]:
    """The comment lines that open a kernel's source: its name and aten ops, then each user
    line it came from (``file:line  source``), in the generator's comment ``leader``."""
    origins = of_members(members)
    if not origins:
        return [f"{leader} {name}: no fx node recorded"]
    nodes = [o.node for o in sorted(origins)]
    shown = ", ".join(nodes[:MAX_COMMENT_NODES]) + (", ..." if len(nodes) > MAX_COMMENT_NODES else "")
    lines = [f"{leader} {name} fuses {', '.join(fused_ops(origins, len(origins)))} (fx nodes {shown})"]
    places = sorted({o.where for o in origins if o.where}, key=_place_key)
    for place in places[:MAX_COMMENT_LINES]:
        filename, _, lineno = place.rpartition(":")
        text = linecache.getline(filename, int(lineno)).strip() if lineno.isdigit() else ""
        lines.append(f"{leader}   {_printable(place)}  {_printable(text)}".rstrip())
    if len(places) > MAX_COMMENT_LINES:
        lines.append(f"{leader}   ... and {len(places) - MAX_COMMENT_LINES} more lines")
    return lines


def _place_key(place: str) -> tuple[str, int]:
    filename, _, lineno = place.rpartition(":")
    return filename, int(lineno) if lineno.isdigit() else 0


def _printable(text: str) -> str:
    """Safe inside a one-line comment of any generator: no control characters, and no trailing
    backslash (which would continue a C++ ``//`` comment onto the next line)."""
    return "".join(c if c.isprintable() else " " for c in text).rstrip("\\ ")
