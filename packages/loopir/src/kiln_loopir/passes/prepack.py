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
pack again. A change through ``p.data`` does not bump the version (that is what ``.data`` is
for) and is not seen: ``options={"conv_prepack": False}`` / ``{"linear_pack": False}`` keep dense
weights for code that mutates parameters that way. An inference tensor (made under
``torch.inference_mode``) has no version counter: a pack made from one is never reused. The
small per-channel tensors a folded BatchNorm is made from are keyed by their values instead (Note
[Running statistics move without a version]).

Note [Running statistics move without a version]: eager's BatchNorm in training mode updates its
running statistics in place inside ``native_batch_norm``, whose schema does not mark them as
written, so their ``_version`` stays (``nn.BatchNorm2d`` bumps only ``num_batches_tracked``, which
an eval-mode graph does not read). A model trained or calibrated in eager (or in a graph run
eagerly after a fallback) and then evaluated through the compiled module kept the statistics it
first folded: a silent wrong answer (fix30, cpu_conv_fuzz.py). conv_fusion's folded values come
from graph inputs of at most C elements each (statistics, affine parameters), so
:meth:`PackCache.get` keys those by their contents (:func:`contents`: their bytes, read without a
tensor op), which costs about what reading their versions did; the weight and the bias, too large
to read on every call, keep their identity.

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
from collections.abc import Callable, Sequence
from typing import Any

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


def contents(t: torch.Tensor) -> tuple[Any, ...]:
    """What a pack made from a small CPU tensor is made from: its dtype, shape and values (Note
    [Running statistics move without a version])."""
    if not t.is_contiguous():
        t = t.contiguous()
    return (t.dtype, *t.shape, ctypes.string_at(t.data_ptr(), t.nbytes))


class PackCache:
    """One op's packed weights and what they were made from."""

    def __init__(self) -> None:
        self._made_from: tuple[Any, ...] = ()
        self._key: tuple[Any, ...] = ()
        self._packed: Any = None
        self.packs = 0  # how many times the weights were packed (tests)

    def get(
        self,
        sources: Sequence[torch.Tensor | None],
        pack: Callable[[], Any],
        small: Sequence[torch.Tensor] = (),
    ) -> Any:
        """The pack of ``sources`` and ``small``, made by ``pack()`` when they changed since the
        last one: ``sources`` by identity and version, ``small`` by value (Note [Running
        statistics move without a version])."""
        key = (*(identity(t) for t in sources), *(contents(t) for t in small))
        if self._packed is None or key != self._key:
            with torch.no_grad():
                self._packed = pack()
            self._made_from, self._key = (*sources, *small), key
            self.packs += 1
        return self._packed


__all__ = ["PackCache", "contents", "dtypes", "identity"]
