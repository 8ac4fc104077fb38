"""Training at one thread on ten architectures outside the public suite: eager vs kiln (vs inductor).

Issue 20 item 3: kiln's training speed on models the public suite does not hold. Each model is built
from a ``transformers`` config at the public suite's CPU size (MODELS.md: batch 2, seq 128, hidden
256, 2 layers, 4 heads, ffn 1024, vocab 1024; images 64x64, batch 2), dropout 0, random weights:
roberta (bert-ish), gpt_neox, deit (vit-ish), convnext_v2, swin, an ``nn.LSTM`` classifier, qwen2 (a
grouped-query-attention decoder), bart (encoder-decoder), resnet and mobilenet_v2 (CNNs). A
step is forward + cross-entropy + ``backward()`` (no optimizer step), as kiln_bench's training mode.
Timing: warm-up, then the backends interleaved (A B [C] A B [C] ...), the median of each (``--clock
cpu``: the process's CPU time, steadier on a shared machine); gradients of every parameter checked
against eager (allclose 1e-3, or kiln_bench's RMSE rule). ``--profile`` then profiles a few more
steps of each backend (``KILN_PROFILE=1``, so each kiln C++ kernel is a ``kiln:`` range) and prints
the slowest ops of each, eager's next to kiln's, which is how the kernels and externs where kiln
loses are found. ``--backends eager,kiln,kiln_ab`` adds a second kiln, on a copy of the model, whose
C++ generator runs with ``KILN_CPP_OPTIONS`` set to ``--ab-cpp`` (default: this issue's codegen
changes off) and ``kiln.compile`` options updated by ``--ab-options`` (``view_scatter=false``: loopir's
slice_scatter lowering off), timed in the same rounds. A benchmark, not a test.

    python packages/codegen_cpp/bench/train1.py --threads 1 --models roberta,gpt_neox --profile
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

_tmp = tempfile.mkdtemp(prefix="kiln-train1-")
for _var in ("KILN_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
    os.environ[_var] = os.path.join(_tmp, _var.lower())

import torch  # noqa: E402
from torch import nn  # noqa: E402

import kiln  # noqa: E402
from kiln_bench import accuracy  # noqa: E402
from kiln_bench.models import MODEL_NAMES, Workload, build, logits_of, loss_of  # noqa: E402

CPP_ENV = "KILN_CPP_OPTIONS"
B, SEQ, H, LAYERS, HEADS, FFN, VOCAB, IMAGE, CLASSES = 2, 128, 256, 2, 4, 1024, 1024, 64, 10


def _model(cls_name: str, cfg_name: str, cfg: dict[str, Any]) -> nn.Module:
    """A transformers model built from its config class, seeded."""
    import transformers

    torch.manual_seed(0)
    config = getattr(transformers, cfg_name)(**cfg)
    return getattr(transformers, cls_name)(config)


def _text(name: str, cls_name: str, cfg_name: str, **cfg: Any) -> Callable[[], Workload]:
    def make() -> Workload:
        model = _model(cls_name, cfg_name, cfg)
        g = torch.Generator().manual_seed(1)
        ids = torch.randint(0, VOCAB, (B, SEQ), generator=g)
        labels = torch.randint(0, VOCAB, (B, SEQ), generator=g)
        return Workload(name, model, {"input_ids": ids}, VOCAB, labels)

    return make


def _seq2seq(name: str, cls_name: str, cfg_name: str, **cfg: Any) -> Callable[[], Workload]:
    """An encoder-decoder LM: the decoder reads a shifted copy of the labels (seq SEQ // 2)."""

    def make() -> Workload:
        model = _model(cls_name, cfg_name, cfg)
        g = torch.Generator().manual_seed(1)
        ids = torch.randint(0, VOCAB, (B, SEQ), generator=g)
        dec = torch.randint(0, VOCAB, (B, SEQ // 2), generator=g)
        labels = torch.randint(0, VOCAB, (B, SEQ // 2), generator=g)
        return Workload(name, model, {"input_ids": ids, "decoder_input_ids": dec}, VOCAB, labels)

    return make


def _vision(name: str, cls_name: str, cfg_name: str, **cfg: Any) -> Callable[[], Workload]:
    def make() -> Workload:
        model = _model(cls_name, cfg_name, {**cfg, "num_labels": CLASSES})
        g = torch.Generator().manual_seed(1)
        pixels = torch.randn(B, 3, IMAGE, IMAGE, generator=g)
        labels = torch.randint(0, CLASSES, (B,), generator=g)
        return Workload(name, model, {"pixel_values": pixels}, CLASSES, labels)

    return make


class LSTMClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, H)
        self.rnn = nn.LSTM(H, H, num_layers=LAYERS, batch_first=True)
        self.head = nn.Linear(H, CLASSES)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.embed(input_ids))
        return self.head(out[:, -1])


def _lstm() -> Workload:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (B, SEQ), generator=g)
    return Workload(
        "lstm", LSTMClassifier(), {"input_ids": ids}, CLASSES, torch.randint(0, CLASSES, (B,), generator=g)
    )


_BERTISH = dict(
    hidden_size=H, num_hidden_layers=LAYERS, num_attention_heads=HEADS, intermediate_size=FFN, vocab_size=VOCAB,
    max_position_embeddings=SEQ + 2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
)  # fmt: skip
MODELS: dict[str, Callable[[], Workload]] = {
    "roberta": _text("roberta", "RobertaForMaskedLM", "RobertaConfig", pad_token_id=1, **_BERTISH),
    "gpt_neox": _text(
        "gpt_neox",
        "GPTNeoXForCausalLM",
        "GPTNeoXConfig",
        hidden_size=H,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=FFN,
        vocab_size=VOCAB,
        max_position_embeddings=SEQ,
        use_cache=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    ),
    "deit": _vision(
        "deit",
        "DeiTForImageClassification",
        "DeiTConfig",
        image_size=IMAGE,
        patch_size=8,
        hidden_size=192,
        num_hidden_layers=LAYERS,
        num_attention_heads=3,
        intermediate_size=768,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    ),
    "convnext_v2": _vision(
        "convnext_v2",
        "ConvNextV2ForImageClassification",
        "ConvNextV2Config",
        hidden_sizes=[32, 64, 128, 256],
        depths=[1, 1, 1, 1],
        image_size=IMAGE,
    ),
    "swin": _vision(
        "swin",
        "SwinForImageClassification",
        "SwinConfig",
        image_size=IMAGE,
        patch_size=4,
        embed_dim=32,
        depths=[1, 1, 2],
        num_heads=[2, 4, 8],
        window_size=4,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        drop_path_rate=0.0,
    ),
    "lstm": _lstm,
    # a decoder LM with grouped-query attention, rotary embeddings, RMSNorm and SwiGLU
    "qwen2": _text(
        "qwen2",
        "Qwen2ForCausalLM",
        "Qwen2Config",
        hidden_size=H,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=2,
        intermediate_size=FFN,
        vocab_size=VOCAB,
        max_position_embeddings=SEQ,
        use_cache=False,
    ),
    "bart": _seq2seq(
        "bart",
        "BartForConditionalGeneration",
        "BartConfig",
        d_model=H,
        encoder_layers=LAYERS,
        decoder_layers=LAYERS,
        encoder_attention_heads=HEADS,
        decoder_attention_heads=HEADS,
        encoder_ffn_dim=FFN,
        decoder_ffn_dim=FFN,
        vocab_size=VOCAB,
        max_position_embeddings=SEQ,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        # no KV cache in training: this benchmark measures the generated code of the step
        use_cache=False,
    ),
    "resnet": _vision(
        "resnet",
        "ResNetForImageClassification",
        "ResNetConfig",
        embedding_size=32,
        hidden_sizes=[32, 64, 128, 256],
        depths=[1, 1, 1, 1],
        layer_type="basic",
    ),
    "mobilenet_v2": _vision(
        "mobilenet_v2",
        "MobileNetV2ForImageClassification",
        "MobileNetV2Config",
        depth_multiplier=0.5,
        image_size=IMAGE,
        # dropout 0 as for every model here: with its default 0.2 the classifier's random mask made
        # every compiled step differ from eager's (kiln's and torch.compile's gradients "wrong")
        classifier_dropout_prob=0.0,
    ),
}
# the public suite's models too, as ``suite.<name>`` (kiln_bench's builders, CPU size), so that
# kernel_time.py and train_diff.py can take them apart
MODELS.update({f"suite.{n}": (lambda n=n: build(n, "cpu")) for n in MODEL_NAMES})


def _breadth(name: str) -> Workload:
    """A model of the breadth suite (``packages/dynamo/bench/breadth_models.py``, its own tiny
    size and inputs) in train mode; the loss is cross-entropy over its logits' last dim against
    seeded random labels."""
    bench = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "dynamo", "bench")
    sys.path.insert(0, os.path.normpath(bench))
    import breadth  # type: ignore[import-not-found]

    torch.manual_seed(0)
    model, inputs, _ = breadth.build(name, "train")
    with torch.no_grad():
        logits = logits_of(model(**inputs))
    classes = logits.shape[-1]
    labels = torch.randint(0, classes, logits.shape[:-1], generator=torch.Generator().manual_seed(1))
    return Workload(name, model, inputs, classes, labels)


class _Models(dict[str, Callable[[], Workload]]):
    """``breadth.<name>`` names any model of the breadth suite (breadth_speed.py --mode train's rows),
    built on demand and listed nowhere, so ``--models`` defaults stay the ten above."""

    def __missing__(self, key: str) -> Callable[[], Workload]:
        if key.startswith("breadth."):
            return lambda: _breadth(key.removeprefix("breadth."))
        raise KeyError(key)


MODELS = _Models(MODELS)


def _step(w: Workload, fn: Callable[..., Any], model: nn.Module | None = None) -> list[torch.Tensor]:
    params = [p for p in (model or w.model).parameters() if p.requires_grad]
    for p in params:
        p.grad = None
    loss = loss_of(w, fn(**w.inputs))
    loss.backward()
    return [loss.detach()] + [p.grad.clone() if p.grad is not None else torch.zeros(()) for p in params]


def _compile(backend: str, model: nn.Module, options: dict[str, Any]) -> Callable[..., Any]:
    if backend == "eager":
        return model
    if backend == "inductor":
        return torch.compile(model)
    return kiln.compile(model, options=options or None)


def _top(step: Callable[[], Any], calls: int, n: int) -> list[tuple[str, float]]:
    """The ``n`` ops (or kiln kernel ranges) with the most self CPU time per step."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            step()
    per: dict[str, float] = defaultdict(float)
    for e in prof.key_averages():
        if "::" in e.key or e.key.startswith("kiln:"):
            per[e.key] += e.self_cpu_time_total / calls / 1e3
    return sorted(per.items(), key=lambda kv: -kv[1])[:n]


def run(
    name: str,
    backends: list[str],
    repeats: int,
    warmup: int,
    profile: bool,
    options: dict[str, Any],
    ab_cpp: str = "",
    clock: Callable[[], float] = time.perf_counter,
    ab_options: dict[str, Any] | None = None,
) -> dict:
    w = MODELS[name]()
    w.model.train()
    ref = _step(w, w.model)
    w64 = MODELS[name]().to("cpu", torch.float64)
    w64.model.train()
    exact = _step(w64, w64.model)
    row: dict[str, Any] = {"model": name}
    fns: dict[str, Callable[..., Any]] = {}
    models: dict[str, nn.Module] = {}
    for b in backends:
        if b == "eager":
            fns[b], models[b] = w.model, w.model
            continue
        # kiln_ab: a second kiln on a copy of the model, its C++ generator under ab_cpp
        model = copy.deepcopy(w.model) if b == "kiln_ab" else w.model
        models[b] = model
        saved = os.environ.get(CPP_ENV)
        if b == "kiln_ab":
            os.environ[CPP_ENV] = ab_cpp
        t0 = time.perf_counter()
        try:
            if b == "kiln_ab":
                # an explicit default makes kiln's cache key differ, so the copy compiles anew
                ab = {"layout": True, "pad_mm": True, **options, "attention": True, **(ab_options or {})}
                fn = _compile("kiln", model, ab)
            else:
                fn = _compile(b, model, options if b == "kiln" else {})
            got = _step(w, fn, model)
        finally:
            if saved is None:
                os.environ.pop(CPP_ENV, None)
            else:
                os.environ[CPP_ENV] = saved
        row[f"{b}_compile_s"] = round(time.perf_counter() - t0, 2)
        names = ["loss"] + [f"grad {i}" for i in range(len(ref) - 1)]
        verdict = accuracy.check(names, ref, got, exact, 1e-2)
        row[f"{b}_ok"] = verdict.ok
        if not verdict.ok:
            row[f"{b}_reason"] = verdict.reason[:200]
        fns[b] = fn
    for _ in range(warmup):
        for b, fn in fns.items():
            _step(w, fn, models[b])
    times: dict[str, list[float]] = {b: [] for b in fns}
    for _ in range(repeats):
        for b, fn in fns.items():
            t0 = clock()
            _step(w, fn, models[b])
            times[b].append(clock() - t0)
    for b, ts in times.items():
        row[f"{b}_ms"] = round(statistics.median(ts) * 1e3, 3)
    for b in fns:
        if b != "eager":
            row[f"{b}_speedup"] = round(row["eager_ms"] / row[f"{b}_ms"], 3)
    if profile:
        row["top"] = {b: _top(lambda fn=fn, b=b: _step(w, fn, models[b]), 5, 12) for b, fn in fns.items()}
    return row


def _parse_options(text: str) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for item in filter(None, text.split(",")):
        k, _, v = item.partition("=")
        options[k] = {"true": True, "false": False}.get(v.lower(), v)
    return options


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(n for n in MODELS if not n.startswith("suite.")))
    parser.add_argument("--backends", default="eager,kiln")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--kiln-options", default="", help="k=v,... passed to kiln.compile(options=)")
    parser.add_argument(
        "--ab-cpp",
        default="fuse_mixed_reductions=1,split_reductions=0",
        help=f"{CPP_ENV} of the kiln_ab backend (--backends eager,kiln,kiln_ab)",
    )
    parser.add_argument(
        "--ab-options",
        default="",
        help="k=v,... kiln.compile options of the kiln_ab backend over --kiln-options (e.g. view_scatter=false)",
    )
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="cpu: the process's CPU time per step (time.process_time), which other processes on "
        "the cores hardly move; meaningful at one thread only",
    )
    parser.add_argument("--out", default="")
    args = parser.parse_args(argv)
    if "eager" not in args.backends.split(","):
        parser.error("--backends must include eager: steps are checked against it and speedups are over it")
    if args.profile:
        # kernel ranges for the tables; read when a wrapper is generated. Unprofiled steps pay
        # ~0.1 us a kernel for them (Note [Kernel ranges cost nothing unprofiled] in wrapper.py);
        # before that Note, this was set for every run and cost kiln ~10 us a kernel call
        os.environ.setdefault("KILN_PROFILE", "1")
    torch.set_num_threads(args.threads)
    options, ab_options = _parse_options(args.kiln_options), _parse_options(args.ab_options)
    rows = []
    for name in args.models.split(","):
        clock = time.process_time if args.clock == "cpu" else time.perf_counter
        row = run(
            name,
            args.backends.split(","),
            args.repeats,
            args.warmup,
            args.profile,
            options,
            args.ab_cpp,
            clock,
            ab_options,
        )
        rows.append(row)
        top = row.pop("top", None)
        print(json.dumps(row), flush=True)
        if top:
            for b, ops in top.items():
                print(f"  {b}: " + "; ".join(f"{k} {v:.3f}" for k, v in ops), flush=True)
            row["top"] = top
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"threads": args.threads, "clock": args.clock, "rows": rows}, f, indent=1)
    print()
    print("\n".join(summary(rows, args.threads, args.clock)))


def summary(rows: list[dict[str, Any]], threads: int, clock: str) -> list[str]:
    """Per-model medians (ms a step) and speedups over eager, then each compiler's geomean over
    the models it got right ("!" marks a speedup whose gradients did not match)."""
    timed = [b for b in ("kiln", "kiln_ab", "inductor") if any(f"{b}_ms" in r for r in rows)]
    lines = [f"training step, {threads} thread(s), {clock} clock: medians in ms, speedup over eager"]
    lines.append(f"{'model':12s} {'eager':>9s}" + "".join(f" {b:>10s} {'x':>6s}" for b in timed))
    for r in rows:
        cells = "".join(
            f" {r[b + '_ms']:10.3f} {r[b + '_speedup']:5.2f}{' ' if r.get(b + '_ok') else '!'}"
            if f"{b}_ms" in r
            else f" {'-':>10s} {'-':>6s}"
            for b in timed
        )
        lines.append(f"{r['model']:12s} {r['eager_ms']:9.3f}{cells}")
    geo = ""
    for b in timed:
        speed = [r[f"{b}_speedup"] for r in rows if r.get(f"{b}_ok") and f"{b}_speedup" in r]
        geo += (
            f" {f'({len(speed)} ok)':>10s} {statistics.geometric_mean(speed):5.2f} "
            if speed
            else f" {'':10s} {'-':>6s}"
        )
    lines.append(f"{'geomean':12s} {'':9s}{geo}")
    return lines


if __name__ == "__main__":
    main(sys.argv[1:])
