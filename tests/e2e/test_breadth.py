"""Breadth of capture (issue 16): the 121 models of `packages/dynamo/bench/breadth_models.py`
(105 built from configs, 16 hand-written programs: bench/breadth_programs.py).

Each model, built from a tiny config, is one graph with no break and no frame left to Python,
and matches eager: in eval, in train (forward + loss + backward, gradients compared), and for a
decoder LM one decoding step with the KV cache. The whole suite, with torch.compile's counts
next to kiln's, is `python packages/dynamo/bench/breaks.py --models`. Also: an
`autograd.Function` through the whole kiln pipeline keeps its own backward.
"""

from __future__ import annotations

import copy
import os
import sys
from typing import Any

import pytest
import torch

import kiln
import kiln_dynamo

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "packages", "dynamo", "bench"))
from breadth import build, run_mode  # type: ignore[import-not-found]
from breadth_models import MODELS  # type: ignore[import-not-found]

# The breadth suite in CI: every model of `breadth_models.MODELS` (`breaks.py --models` runs the
# same 121, and adds torch.compile's counts), every mode that applies to it (eval; train: forward +
# loss + backward, every parameter's gradient compared; cache: a decoding step with the KV cache a
# prefill returned, decoder LMs and encoder-decoders), with the (graphs, breaks, frames left to
# Python) that `breadth.run_mode` reports. A count may go down (update the table) but not up, and
# every row matches eager. About four minutes here (2 shared cores; 1.5 with the 47
# models of the twelfth session).
ONE = (1, 0, 0)
LM = {"eval": ONE, "train": ONE, "cache": ONE}  # decoder LMs
ENC = {"eval": ONE, "train": ONE}
S2S = LM  # encoder-decoders: the cache mode is one decoder step with the encoder's output
EXPECTED: dict[str, dict[str, tuple[int, int, int]]] = {
    # decoder LMs (grouped-query attention: llama, mistral, qwen2, gemma)
    "gpt2": LM, "llama": LM, "mistral": LM, "qwen2": LM, "gemma": LM, "phi": LM, "falcon": LM,
    "gpt_neox": LM, "opt": LM, "bloom": LM, "gptj": LM, "stablelm": LM,
    # added in the thirteenth session: newer LMs, mixtures of experts, a state-space model (mamba:
    # `ACT2FN[name](x)` and torch's associative_scan in its forward, Notes [A dict subclass's own
    # subscript] and [Stand-ins for torch's higher-order functions])
    "qwen3": LM, "phi3": LM, "gemma2": LM, "gemma3": LM, "olmo": LM, "olmo2": LM, "starcoder2": LM,
    "cohere": LM, "granite": LM, "persimmon": LM, "mpt": LM, "codegen": LM, "gpt_bigcode": LM, "gpt_neo": LM,
    "mixtral": LM, "qwen2_moe": LM, "mamba": LM, "falcon_mamba": LM, "mamba2": LM, "jamba": LM, "lfm2": LM,
    "deepseek_v3": LM, "gpt_oss": LM, "qwen3_moe": LM,
    # encoder MLMs and text encoders
    "bert": ENC, "roberta": ENC, "xlm_roberta": ENC, "electra": ENC, "albert": ENC, "deberta_v2": ENC,
    "mobilebert": ENC, "squeezebert": ENC, "mpnet": ENC, "distilbert": ENC, "clip_text": ENC, "funnel": ENC,
    "modernbert": ENC, "deberta": ENC, "roformer": ENC, "convbert": ENC, "ernie": ENC, "xlnet": ENC,
    # each layer's self-attention asks `is_index_global_attn.flatten().any().item()` in Python
    # (does any token attend globally?): a data-dependent value; the chain splits once through the
    # encoder, whose frame has cells (Note [Cells of a chain's frames]): 2 graphs, 1 split
    # (torch.compile 4/3); every graph matches eager
    "longformer": {"eval": (2, 1, 0), "train": (2, 1, 0)},
    # encoder-decoders, audio
    "bart": S2S, "t5": S2S, "pegasus": S2S, "whisper_encoder": ENC,
    # train: the feature encoder sets `requires_grad = True` on a tensor (a new leaf mid-graph,
    # which aotgrad cannot trace: one break at the store, as torch.compile's 4/3), several
    # inlined calls deep; the chain splits at once through the output-capturing wrapper, whose
    # call sits in a try/finally (Note [A chain through try and with blocks]) and whose frame has
    # cells (Note [Cells of a chain's frames]): 1 split
    "wav2vec2": {"eval": ONE, "train": (2, 1, 0)},
    # the same feature encoder, the same break (torch.compile 4/3)
    "hubert": {"eval": ONE, "train": (2, 1, 0)}, "wavlm": {"eval": ONE, "train": (2, 1, 0)},
    "data2vec_audio": {"eval": ONE, "train": (2, 1, 0)},
    "mbart": S2S, "marian": S2S, "blenderbot": S2S, "blenderbot_small": S2S, "led": S2S, "whisper": S2S,
    # train: LayerDrop, `if torch.rand([]) < self.layerdrop` in each layer of both stacks, a random
    # branch (torch.compile 9/8); the layer loops' frames stay Python (their bodies compiled in
    # pieces, Note [Loop body pieces]); eval 1/0/0
    "m2m100": {"eval": ONE, "train": (9, 6, 2), "cache": ONE},
    # text and vision towers together
    "clip": ENC, "siglip": ENC, "blip": ENC,
    # a vision-language model: the vision tower's output-capturing hooks installed in the frame
    # (Note [Module hooks registered in the frame]), `torch._check_tensor_all` as a run-time
    # assertion and its message's f-string of a tensor built after the graph (Note [Strings
    # formatted from tensors]): one graph (torch.compile 7/6)
    "llava": ENC,
    # vision transformers, hierarchical/windowed, CNNs
    "vit": ENC, "deit": ENC, "beit": ENC, "dinov2": ENC, "swin": ENC, "convnext_v2": ENC, "mobilenet_v2": ENC,
    "efficientnet": ENC, "regnet": ENC, "resnet": ENC,
    # segmentation; its first call installs output-capturing hooks under a threading.Lock: the
    # registrations are traced and replayed after the graph (Note [Module hooks registered in the
    # frame]) under the real lock (Note [Effects under a lock replayed under it]): one graph from
    # the first call on (torch.compile 2/1)
    "segformer": ENC,
    # the same first-call hook installation as segformer (its ViT backbone's hidden states are
    # collected by hooks; torch.compile 2/1)
    "dpt": ENC,
    # detection: eval 1/0/0 (its backbone's `BackboneOutput(feature_maps=...)`, Note [A ModelOutput
    # built from its first field alone]); train: `if not torch.isfinite(h).all(): clamp` in each
    # encoder layer, a data-dependent branch (torch.compile 6/5)
    "detr": {"eval": ONE, "train": (5, 4, 1)}, "yolos": ENC,
    "vit_mae": ENC, "hiera": ENC, "swinv2": ENC, "focalnet": ENC, "cvt": ENC, "pvt_v2": ENC, "levit": ENC,
    "mobilevit": ENC, "convnext": ENC, "poolformer": ENC, "bit": ENC,
    # torch.nn built-ins, a recommender
    "nn_transformer_encoder": ENC, "nn_transformer": ENC, "nn_multihead_attention": ENC, "nn_lstm": ENC,
    "nn_gru": ENC, "embedding_bag_recommender": ENC,
    # hand-written programs (breadth14, bench/breadth_programs.py)
    "unet_blocks": ENC, "detection_head": ENC, "lstm_lm": ENC, "moe_topk": ENC, "checkpointed_mlp": ENC,
    "dataclass_output": ENC, "gru_attention_decoder": ENC, "gnn_message_passing": ENC, "vae": ENC,
    "config_driven": ENC, "vocoder_weight_norm": ENC, "spatial_transformer": ENC, "autocast_mlp": ENC,
    "greedy_decode": ENC, "namedtuple_pooler": ENC,
    # pack_padded_sequence: the packed batch sizes are data (`_pack_padded_sequence` needs its
    # lengths on the CPU as values, and the unpacking slices by them): three breaks
    "packed_lstm": {"eval": (4, 3, 0), "train": (4, 3, 0)},
}  # fmt: skip
ROWS = [(name, mode) for name, modes in EXPECTED.items() for mode in modes]


def test_the_table_is_the_whole_breadth_suite() -> None:
    """Every model of the bench is a CI row, in eval and train, with the KV-cache step for
    exactly the decoder LMs and encoder-decoders (building all 121 tiny models: a few seconds)."""
    assert set(EXPECTED) == set(MODELS) and len(EXPECTED) >= 30
    decoders = {name for name, builder in MODELS.items() if builder()[2] in ("decoder", "seq2seq")}
    assert len(decoders) == 46  # 36 decoder LMs, 10 encoder-decoders
    for name, modes in EXPECTED.items():
        assert {"eval", "train"} <= set(modes), name
        assert ("cache" in modes) == (name in decoders), name


def _one_graph(report: Any) -> None:
    assert (report.graph_count, report.graph_break_count) == (1, 0), str(report)
    assert kiln_dynamo.counters.fallbacks == []


@pytest.mark.parametrize(("name", "mode"), ROWS, ids=[f"{n}-{m}" for n, m in ROWS])
def test_breadth_counts_do_not_regress_and_match_eager(name: str, mode: str) -> None:
    row = run_mode(name, mode, with_torch=False)
    assert row["match"], row
    got = (row["graphs"], row["breaks"], row["plain"])
    want = EXPECTED[name][mode]
    assert got[0] >= 1 and all(g <= w for g, w in zip(got, want, strict=True)), (got, want, row["reasons"])
    if want == ONE:
        assert got == ONE, row["reasons"]


CACHE = ["llama", "falcon"]


@pytest.mark.parametrize("name", CACHE)
def test_decoding_step_with_kv_cache_is_one_graph(name: str) -> None:
    model, inputs, _ = build(name, "cache")
    ref_model = copy.deepcopy(model)

    def step_inputs(m: Any) -> dict[str, Any]:
        with torch.no_grad():
            pre = m(**inputs, use_cache=True)
        nxt = torch.tensor([[3], [7]])
        return {"input_ids": nxt, "past_key_values": pre.past_key_values, "use_cache": True}

    step, ref_step = step_inputs(model), step_inputs(ref_model)
    with torch.no_grad():
        report = kiln_dynamo.explain(model)(**step)
        ref = ref_model(**ref_step)
    _one_graph(report)
    torch.testing.assert_close(report.result.logits, ref.logits)
    # the cache the step appended to is the caller's object, updated as eager updates it
    got_k = report.result.past_key_values.layers[0].keys
    torch.testing.assert_close(got_k, ref.past_key_values.layers[0].keys)
    assert got_k.shape[-2] == inputs["input_ids"].shape[1] + 1


class _Clipped(torch.autograd.Function):
    """A straight-through clamp: the backward passes gradients where eager autograd would not."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.clamp(-0.5, 0.5)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * 0.5


class _WithFunction(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Clipped.apply(self.lin(x)).tanh().sum()


@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
def test_autograd_function_keeps_its_backward_through_kiln(backend: str) -> None:
    torch.manual_seed(0)
    model = _WithFunction()
    compiled_model = copy.deepcopy(model)
    x = torch.randn(4, 8)
    model(x).backward()
    kiln.reset()
    out = kiln.compile(compiled_model, backend=backend, options={"strict": True})(x)
    out.backward()
    torch.testing.assert_close(out, model(x))
    for p, q in zip(model.parameters(), compiled_model.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad)
    assert kiln_dynamo.counters.graph_breaks == 0 and kiln_dynamo.counters.fallbacks == []


def test_segformer_with_its_output_capturing_hooks_is_one_graph() -> None:
    """transformers installs forward hooks on segformer's layers at its first call (under a
    threading.Lock, which is a break on that call); from then on the hooks are traced."""
    model, inputs, _ = build("segformer", "eval")
    ref_model = copy.deepcopy(model)
    with torch.no_grad():
        model(**inputs)  # installs the hooks
        report = kiln_dynamo.explain(model)(**inputs)
        ref = ref_model(**inputs)
    assert any(m._forward_hooks for m in model.modules())
    _one_graph(report)
    torch.testing.assert_close(report.result.logits, ref.logits)


def test_one_op_whose_decomposition_fails_costs_only_that_op(monkeypatch: Any) -> None:
    """Note [One op kept when its decomposition fails] through kiln: mish's decomposition raises,
    the graph is still compiled (strict: a graph sent to eager would raise), mish runs as one
    aten call, forward and backward, and the answer and gradients are eager's."""
    import kiln_aotgrad.api

    aten = torch.ops.aten
    real = kiln_aotgrad.api.default_decompositions

    def broken_mish(x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("mish: no decomposition for this layout")

    monkeypatch.setattr(
        kiln_aotgrad.api, "default_decompositions", lambda: {**real(), aten.mish.default: broken_mish}
    )
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Mish(), torch.nn.Linear(8, 2))
    compiled_model = copy.deepcopy(model)
    x = torch.randn(4, 8)
    model(x).sum().backward()
    kiln.reset()
    out = kiln.compile(compiled_model, options={"strict": True})(x)
    out.sum().backward()
    torch.testing.assert_close(out, model(x))
    for p, q in zip(model.parameters(), compiled_model.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad)
    assert [g.fell_back for g in kiln.compile_log()] == [None]


class _Hooked(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh())
        self.out = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.inner(x) * 2).square().sum()


@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
def test_module_backward_hooks_through_kiln(backend: str) -> None:
    """A full backward hook and pre-hook on a submodule whose forward kiln compiles (its own
    graph, through aotgrad's autograd.Function): the hooks see eager's gradients, and what they
    change reaches the parameters as in eager."""
    seen: dict[str, list[torch.Tensor]] = {"eager": [], "kiln": []}

    def halve(mod: Any, gout: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        return (gout[0] * 0.5,)

    def build(key: str) -> _Hooked:
        def record(mod: Any, gin: tuple[torch.Tensor, ...], gout: tuple[torch.Tensor, ...]) -> None:
            seen[key].extend([gin[0].clone(), gout[0].clone()])

        torch.manual_seed(0)
        m = _Hooked()
        m.inner.register_full_backward_pre_hook(halve)
        m.inner.register_full_backward_hook(record)
        return m

    model, compiled_model = build("eager"), build("kiln")
    x = torch.randn(4, 8, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    model(x).backward()
    kiln.reset()
    out = kiln.compile(compiled_model, backend=backend)(x2)
    out.backward()
    torch.testing.assert_close(x2.grad, x.grad)
    for p, q in zip(model.parameters(), compiled_model.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad)
    assert len(seen["kiln"]) == len(seen["eager"]) == 2
    for a, b in zip(seen["kiln"], seen["eager"], strict=True):
        torch.testing.assert_close(a, b)
    assert kiln_dynamo.counters.graph_breaks == 1 and kiln_dynamo.counters.fallbacks == []
