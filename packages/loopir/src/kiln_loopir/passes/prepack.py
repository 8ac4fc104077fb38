"""Weights prepacked for oneDNN, cached per parameter version (Note [Prepacked weights]).

Note [Prepacked weights]: oneDNN computes a convolution or a linear layer fastest from a weight
in its own blocked layout; reordering a plain weight on every call costs a pass over it. The CPU
passes (conv_fusion, linear_pack) therefore replace the op by a run-time op that packs the
weight once and keeps it, in a :class:`PackCache`. Parameters are graph inputs, so a pack is made
from the tensors the call receives, and is valid while those are the same memory in the same
state: the cache keys on each source tensor's address, shape, strides and ``_version`` and holds
the tensors themselves (so their memory cannot be freed and reused by another tensor while the
pack is kept). A parameter replaced by another tensor, or changed in place (``p.mul_(2)`` under
``no_grad``, an optimizer step, ``load_state_dict``: each bumps ``_version``), makes the next call
pack again. Some writes leave the version as it was: those through ``p.data`` (that is what
``.data`` is for) and a fused optimizer's step (Note [Writes that do not move a version]); the
cache also reads a sample of each source's elements, which sees them where they change the
sample, but not a write elsewhere: ``options={"conv_prepack": False}`` / ``{"linear_pack": False}`` keep
dense weights for code that mutates parameters that way. An inference tensor (made under
``torch.inference_mode``) has no version counter: a pack made from one is never reused. The
small per-channel tensors a folded BatchNorm is made from are keyed by their values instead (Note
[Running statistics move without a version]).

Note [Writes that do not move a version]: PyTorch's fused optimizers (``torch.optim.SGD``,
``Adam``, ``AdamW`` with ``fused=True``; ``_fused_sgd_``, ``_fused_adam_``, ``_fused_adamw_``)
write every parameter in place without moving its ``_version`` (torch 2.13: ``p._version`` is
the same before and after ``opt.step()``; the foreach and for-loop forms move it), as a write
through ``p.data`` does. A module evaluated through a compiled graph with prepacked weights
between such training steps kept the weights it had packed first (fix30: a convolution's output
off by 77 after one SGD step; the reproducer: kiln's test_conv_fusion_e2e.py,
``test_a_fused_optimizer_step_reaches_the_prepacked_weights``). A step changes every element it
has a gradient for, so the cache also reads :data:`SAMPLES` elements of each source, spread
from its first to its last (output channels apart), on every call, and packs again where one
changed (:func:`reader`: a memoryview over the source's memory made at packing (ctypes), read
as integers, no tensor op; about a third of reading the identity's fields, measured on this
project's machine). A write that changes none of the sampled elements (a few rows of a large
weight, through ``p.data``; an optimizer step whose gradient is zero at all of them) is still not
seen.

Note [Running statistics move without a version]: eager's BatchNorm in training mode updates its
running statistics in place inside ``native_batch_norm``, whose schema does not mark them as
written, so their ``_version`` stays (``nn.BatchNorm2d`` bumps only ``num_batches_tracked``, which
an eval-mode graph does not read). A model trained or calibrated in eager (or in a graph run
eagerly after a fallback) and then evaluated through the compiled module kept the statistics it
first folded: a silent wrong answer (fix30, cpu_conv_fuzz.py). conv_fusion's folded values come
from graph inputs of at most C elements each (statistics, affine parameters), so
:meth:`PackCache.get` also compares their whole contents with those it packed from (:func:`reader`:
their bytes through a memoryview, no tensor op; about what reading a version costs); the weight
and the bias, too large to read on every call, get a sample of their elements read (Note [Writes
that do not move a version]).

Note [bfloat16 through oneDNN]: oneDNN has bfloat16 convolutions and inner products where the CPU
has bfloat16 instructions (``torch.ops.mkldnn._is_mkldnn_bf16_supported``: AVX-512 BF16 or AMX),
and its blocked bfloat16 weight layouts are not float32's (pairs of input channels interleaved
for the dot-product instructions), so an aten call on a plain bfloat16 weight reorders it on every
call, as it does a float32 one. The passes take bfloat16 graphs as float32 ones (:func:`dtypes`),
packing the weight in its own dtype: ``_reorder_convolution_weight`` and ``_reorder_linear_weight``
choose the layout from the weight's dtype. A folded BatchNorm is computed in float32 and rounded
to bfloat16 once (conv_fusion's ``_fold``), where eager rounds the convolution's result and then
the normalized value. ``onednn_bf16=False`` keeps bfloat16 convolutions and products aten's.
Measured at one thread on this project's 2-core machine (AMX; infer1.py, CPU time, interleaved,
twenty-ninth session), prepacked / ``onednn_bf16=False``: ResNet 2.56 / 3.35 ms, the CNN 2.18 /
2.44 (kiln_bench cpu size), ConvNeXt even. Products are another matter: one packed bfloat16 inner
product alone took 0.52-0.89x ``addmm``'s time, but in the graph the MLP took 0.68 against 0.58-0.60
ms and ViT 3.50 against 3.04-3.07 with the products packed (two runs each, the same direction; not
understood: each op's time measured in place was ~1.4x its time alone). So linear_pack takes
bfloat16 only with ``linear_pack_bf16=True`` (off by default).
"""

from __future__ import annotations

import ctypes
import itertools
import operator
from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch

_never = itertools.count()


def dtypes(options: Any, linear: bool = False) -> tuple[torch.dtype, ...]:
    """The dtypes conv_fusion (or, ``linear``, linear_pack) takes under ``options`` (a
    ``PassOptions``; Note [bfloat16 through oneDNN])."""
    wanted = options.onednn_bf16 and (options.linear_pack_bf16 or not linear)
    if wanted and torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return (torch.float32, torch.bfloat16)
    return (torch.float32,)


def identity(t: torch.Tensor | None) -> tuple[int, ...]:
    """What a pack is made from: memory, view and version of one tensor. A wrapper may hand the
    same parameter as a fresh view each call, so not the Python object."""
    if t is None:
        return (-1,)
    if t.is_inference():  # no version counter: a key that no later call repeats
        return (-2, next(_never))
    return (t.data_ptr(), t._version, *t.shape, *t.stride())


# elements of a source read on every call, spread over it (Note [Writes that do not move a version])
SAMPLES = 8
# an unsigned integer of each element width
_FORMATS: dict[int, Literal["B", "H", "I", "Q"]] = {1: "B", 2: "H", 4: "I", 8: "Q"}


def reader(t: torch.Tensor | None, whole: bool = False) -> Callable[[], Any] | None:
    """A function that reads ``t``'s memory through a memoryview made now (ctypes, no tensor op):
    all of it as bytes (``whole``: Note [Running statistics move without a version]), or
    :data:`SAMPLES` elements spread from its first to its last, as integers (Note [Writes that do
    not move a version]). None where ``t`` is not one dense span. The function holds ``t``, so
    the memory it reads stays ``t``'s."""
    if t is None or t.is_inference() or not t.is_contiguous() or t.numel() == 0:
        return None
    fmt = _FORMATS.get(t.element_size())
    if fmt is None:
        return None
    raw = memoryview((ctypes.c_ubyte * t.nbytes).from_address(t.data_ptr())).cast("B")
    flat = raw.cast(fmt)
    n = len(flat)
    sample = operator.itemgetter(*sorted({i * (n - 1) // (SAMPLES - 1) for i in range(SAMPLES)}))
    held = t

    def read() -> Any:
        assert held is not None  # the memory read stays held's
        return raw.tobytes() if whole else sample(flat)

    return read


class PackCache:
    """One op's packed weights and what they were made from."""

    def __init__(self) -> None:
        self._made_from: tuple[Any, ...] = ()
        self._key: tuple[tuple[int, ...], ...] = ()
        self._packed: Any = None
        self._seen: list[tuple[Callable[[], Any], Any]] = []
        self.packs = 0  # how many times the weights were packed (tests)

    def get(
        self,
        sources: Sequence[torch.Tensor | None],
        pack: Callable[[], Any],
        small: Sequence[torch.Tensor] = (),
    ) -> Any:
        """The pack of ``sources`` and ``small``, made by ``pack()`` when they changed since the
        last one: each by its :func:`identity`, and ``sources`` by a sample of their elements,
        ``small`` by their whole contents (Notes [Writes that do not move a version], [Running
        statistics move without a version])."""
        key = tuple(identity(t) for t in (*sources, *small))
        if self._packed is None or key != self._key or any(read() != seen for read, seen in self._seen):
            # what the sources hold now (Notes [Writes that do not move a version], [Running
            # statistics move without a version]), then the pack
            readers = [reader(t) for t in sources] + [reader(t, whole=True) for t in small]
            self._seen = [(read, read()) for read in readers if read is not None]
            with torch.no_grad():
                self._packed = pack()
            self._made_from, self._key = (*sources, *small), key
            self.packs += 1
        return self._packed


__all__ = ["SAMPLES", "PackCache", "dtypes", "identity", "reader"]
