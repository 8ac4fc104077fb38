"""The public model suite (the team's MODELS.md), built from configs with seeded random weights.

Each entry builds a model and example inputs at one of two sizes: "cpu" (eager inference takes
2-20 ms on 2 cores) or "gpu" (realistic, for an H200). Nothing is downloaded: HuggingFace
`transformers` supplies the architectures, and two plain-torch models (mlp, cnn) need nothing.

`Workload` knows how to run the model for inference (eval mode, no grad) and for training
(forward, cross-entropy on the logits, backward), and what to compare: the logits for
inference, the loss and every parameter's gradient for training.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

SIZES = ("cpu", "gpu")


@dataclass(frozen=True, slots=True)
class Workload:
    """A built model with its inputs. `inputs` are keyword arguments of the model's forward."""

    name: str
    model: nn.Module
    inputs: dict[str, Any]
    num_classes: int
    labels: torch.Tensor = field(repr=False)

    def to(self, device: str | torch.device, dtype: torch.dtype | None = None) -> Workload:
        def move(x: Any) -> Any:
            if isinstance(x, torch.Tensor):
                return (
                    x.to(device=device, dtype=dtype)
                    if dtype is not None and x.is_floating_point()
                    else x.to(device)
                )
            return x

        model = self.model.to(device=device, dtype=dtype) if dtype is not None else self.model.to(device)
        return Workload(
            self.name,
            model,
            {k: move(v) for k, v in self.inputs.items()},
            self.num_classes,
            self.labels.to(device),
        )


def logits_of(output: Any) -> torch.Tensor:
    """The logits tensor of a model's output (a tensor, a tuple, or a HuggingFace ModelOutput)."""
    if isinstance(output, torch.Tensor):
        return output
    if hasattr(output, "logits"):
        return output.logits
    if isinstance(output, (tuple, list)):
        return output[0]
    raise TypeError(f"cannot find logits in a {type(output).__name__}")


def loss_of(workload: Workload, output: Any) -> torch.Tensor:
    logits = logits_of(output).float()
    return nn.functional.cross_entropy(logits.reshape(-1, workload.num_classes), workload.labels.reshape(-1))


# --- plain torch models -------------------------------------------------------------------------


class MLP(nn.Module):
    def __init__(self, width: int, blocks: int, classes: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.LayerNorm(width)) for _ in range(blocks)
        )
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)


class CNN(nn.Module):
    def __init__(self, channels: list[int], classes: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        c_in = 3
        for c in channels:
            layers += [
                nn.Conv2d(c_in, c, 3, padding=1, bias=False),
                nn.BatchNorm2d(c),
                nn.ReLU(),
                nn.MaxPool2d(2),
            ]
            c_in = c
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(c_in, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).mean(dim=(2, 3)))


# --- builders -----------------------------------------------------------------------------------

_TEXT = {
    "cpu": {"batch": 2, "seq": 128, "hidden": 256, "layers": 2, "heads": 4, "ffn": 1024, "vocab": 1024},
    "gpu": {"batch": 8, "seq": 512, "hidden": 768, "layers": 6, "heads": 12, "ffn": 3072, "vocab": 50257},
}


def _text_inputs(size: str, vocab: int, gen: torch.Generator) -> tuple[dict[str, Any], torch.Tensor]:
    t = _TEXT[size]
    ids = torch.randint(0, vocab, (t["batch"], t["seq"]), generator=gen)
    labels = torch.randint(0, vocab, (t["batch"], t["seq"]), generator=gen)
    return {"input_ids": ids}, labels


def _gpt2(size: str, gen: torch.Generator) -> Workload:
    from transformers import GPT2Config, GPT2LMHeadModel

    t = _TEXT[size]
    cfg = GPT2Config(
        n_embd=t["hidden"], n_layer=t["layers"], n_head=t["heads"], n_inner=t["ffn"], vocab_size=t["vocab"],
        n_positions=t["seq"], bos_token_id=0, eos_token_id=0, use_cache=False,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )  # fmt: skip
    inputs, labels = _text_inputs(size, t["vocab"], gen)
    return Workload("gpt2", GPT2LMHeadModel(cfg), inputs, t["vocab"], labels)


def _bert(size: str, gen: torch.Generator) -> Workload:
    from transformers import BertConfig, BertForMaskedLM

    t = _TEXT[size]
    vocab = 30522 if size == "gpu" else t["vocab"]
    cfg = BertConfig(
        hidden_size=t["hidden"], num_hidden_layers=t["layers"], num_attention_heads=t["heads"],
        intermediate_size=t["ffn"], vocab_size=vocab, max_position_embeddings=t["seq"],
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    inputs, labels = _text_inputs(size, vocab, gen)
    return Workload("bert", BertForMaskedLM(cfg), inputs, vocab, labels)


def _distilbert(size: str, gen: torch.Generator) -> Workload:
    from transformers import DistilBertConfig, DistilBertForMaskedLM

    t = _TEXT[size]
    vocab = 30522 if size == "gpu" else t["vocab"]
    cfg = DistilBertConfig(
        dim=t["hidden"], n_layers=t["layers"], n_heads=t["heads"], hidden_dim=t["ffn"], vocab_size=vocab,
        max_position_embeddings=t["seq"], dropout=0.0, attention_dropout=0.0,
    )  # fmt: skip
    inputs, labels = _text_inputs(size, vocab, gen)
    return Workload("distilbert", DistilBertForMaskedLM(cfg), inputs, vocab, labels)


def _llama(size: str, gen: torch.Generator) -> Workload:
    from transformers import LlamaConfig, LlamaForCausalLM

    t = _TEXT[size]
    vocab = 32000 if size == "gpu" else t["vocab"]
    cfg = LlamaConfig(
        hidden_size=t["hidden"], num_hidden_layers=t["layers"], num_attention_heads=t["heads"],
        num_key_value_heads=t["heads"], intermediate_size=2048 if size == "gpu" else 682, vocab_size=vocab,
        max_position_embeddings=t["seq"], use_cache=False, bos_token_id=0, eos_token_id=0, pad_token_id=0,
    )  # fmt: skip
    inputs, labels = _text_inputs(size, vocab, gen)
    return Workload("llama", LlamaForCausalLM(cfg), inputs, vocab, labels)


def _t5(size: str, gen: torch.Generator) -> Workload:
    from transformers import T5Config, T5ForConditionalGeneration

    t = _TEXT[size]
    vocab = 32128 if size == "gpu" else t["vocab"]
    cfg = T5Config(
        d_model=t["hidden"], num_layers=t["layers"], num_decoder_layers=t["layers"], num_heads=t["heads"],
        d_ff=t["ffn"], d_kv=t["hidden"] // t["heads"], vocab_size=vocab, dropout_rate=0.0, use_cache=False,
        pad_token_id=0, eos_token_id=1,
    )  # fmt: skip
    cfg.decoder_start_token_id = 0
    inputs, labels = _text_inputs(size, vocab, gen)
    inputs["decoder_input_ids"] = torch.randint(0, vocab, inputs["input_ids"].shape, generator=gen)
    return Workload("t5", T5ForConditionalGeneration(cfg), inputs, vocab, labels)


def _images(
    batch: int, image: int, classes: int, gen: torch.Generator
) -> tuple[dict[str, Any], torch.Tensor]:
    pixels = torch.randn(batch, 3, image, image, generator=gen)
    return {"pixel_values": pixels}, torch.randint(0, classes, (batch,), generator=gen)


def _vit(size: str, gen: torch.Generator) -> Workload:
    from transformers import ViTConfig, ViTForImageClassification

    if size == "cpu":
        image, patch, hidden, layers, heads, classes, batch = 64, 8, 192, 2, 3, 10, 2
    else:
        image, patch, hidden, layers, heads, classes, batch = 224, 16, 768, 6, 12, 1000, 32
    cfg = ViTConfig(
        image_size=image, patch_size=patch, hidden_size=hidden, num_hidden_layers=layers,
        num_attention_heads=heads, intermediate_size=4 * hidden,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    cfg.num_labels = classes  # a PretrainedConfig property, not a constructor argument of this class
    inputs, labels = _images(batch, image, classes, gen)
    return Workload("vit", ViTForImageClassification(cfg), inputs, classes, labels)


def _resnet(size: str, gen: torch.Generator) -> Workload:
    from transformers import ResNetConfig, ResNetForImageClassification

    if size == "cpu":
        cfg = ResNetConfig(
            embedding_size=32,
            hidden_sizes=[32, 64, 128, 256],
            depths=[1, 1, 1, 1],
            layer_type="basic",
        )
        image, batch, classes = 64, 2, 10
    else:
        cfg = ResNetConfig(
            embedding_size=64, hidden_sizes=[256, 512, 1024, 2048], depths=[3, 4, 6, 3], layer_type="bottleneck",
        )  # fmt: skip
        image, batch, classes = 224, 32, 1000
    cfg.num_labels = classes
    inputs, labels = _images(batch, image, classes, gen)
    return Workload("resnet", ResNetForImageClassification(cfg), inputs, classes, labels)


def _convnext(size: str, gen: torch.Generator) -> Workload:
    from transformers import ConvNextConfig, ConvNextForImageClassification

    if size == "cpu":
        cfg = ConvNextConfig(hidden_sizes=[32, 64, 128, 256], depths=[1, 1, 1, 1])
        image, batch, classes = 64, 2, 10
    else:
        cfg = ConvNextConfig(hidden_sizes=[96, 192, 384, 768], depths=[3, 3, 9, 3])
        image, batch, classes = 224, 32, 1000
    cfg.num_labels = classes
    inputs, labels = _images(batch, image, classes, gen)
    return Workload("convnext", ConvNextForImageClassification(cfg), inputs, classes, labels)


def _mlp(size: str, gen: torch.Generator) -> Workload:
    batch, width, blocks = (64, 256, 4) if size == "cpu" else (4096, 1024, 6)
    classes = 10
    x = torch.randn(batch, width, generator=gen)
    return Workload(
        "mlp",
        MLP(width, blocks, classes),
        {"x": x},
        classes,
        torch.randint(0, classes, (batch,), generator=gen),
    )


def _cnn(size: str, gen: torch.Generator) -> Workload:
    batch, image, channels = (8, 64, [16, 32, 64, 128]) if size == "cpu" else (32, 224, [64, 128, 256, 512])
    classes = 10
    inputs, labels = _images(batch, image, classes, gen)
    return Workload("cnn", CNN(channels, classes), {"x": inputs["pixel_values"]}, classes, labels)


BUILDERS: dict[str, Callable[[str, torch.Generator], Workload]] = {
    "gpt2": _gpt2,
    "bert": _bert,
    "distilbert": _distilbert,
    "llama": _llama,
    "t5": _t5,
    "vit": _vit,
    "resnet": _resnet,
    "convnext": _convnext,
    "mlp": _mlp,
    "cnn": _cnn,
}
MODEL_NAMES = tuple(BUILDERS)


def calibrate_batchnorm(model: nn.Module, inputs: dict[str, Any]) -> None:
    """Set BatchNorm running statistics from the example input (see MODELS.md: with default
    statistics a random convnet's activations shrink to ~1e-24 and every comparison passes)."""
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return
    was_training = model.training
    saved = [(m.momentum, m.track_running_stats) for m in norms]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # cumulative average: one pass sets the statistics of this input
    model.train()
    with torch.no_grad():
        model(**inputs)
    for m, (momentum, _) in zip(norms, saved, strict=True):
        m.momentum = momentum
    model.train(was_training)


def build(name: str, size: str = "cpu", seed: int = 0) -> Workload:
    """Build model `name` at `size` with weights and inputs seeded by `seed`."""
    if name not in BUILDERS:
        raise KeyError(f"unknown model {name!r}; the suite has {', '.join(MODEL_NAMES)}")
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; expected one of {SIZES}")
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    workload = BUILDERS[name](size, gen)
    calibrate_batchnorm(workload.model, workload.inputs)
    return workload
