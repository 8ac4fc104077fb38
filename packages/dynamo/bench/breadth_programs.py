"""Hand-written programs for the breadth suite (breadth14): model code as users write it, not
built from a transformers config. Each is small and seeded; `breadth_models.MODELS` lists them
with the kind "program" (eval and train; `breadth.run_mode` compares every tensor of the output
for these, not only the first).

- `unet_blocks`: diffusers-style UNet blocks written by hand (sinusoidal timestep embedding,
  ResNet blocks with GroupNorm/SiLU and a time projection, a spatial transformer with
  cross-attention over a text context, down/upsampling, skip connections kept in a list).
- `detection_head`: a torchvision-style detector head: a small backbone, an FPN over an
  OrderedDict of levels (lateral 1x1 convs, nearest upsampling to each level's size), a shared
  RetinaNet-style classification/regression head, anchors from `meshgrid`, box decoding.
- `lstm_lm`: an LSTM language model with tied embeddings, a carried `(h, c)` state (detached,
  truncated backprop through time) and dropout.
- `moe_topk`: a mixture-of-experts layer with a top-k router (softmax, `topk`, renormalised
  weights scattered into a dense gate), experts in a ModuleList, a load-balancing loss.
- `checkpointed_mlp`: residual blocks run through `torch.utils.checkpoint.checkpoint(...,
  use_reentrant=False)` when training, plain calls in eval.
- `dataclass_output`: a model configured by a frozen dataclass, returning a dataclass of outputs
  (optional fields, `dataclasses.replace`, `asdict`-style iteration).
- `gru_attention_decoder`: a seq2seq GRU decoder with additive (Bahdanau) attention, unrolled
  over the target steps with teacher forcing, outputs stacked.
- `gnn_message_passing`: a graph network: messages gathered along an edge index, summed with
  `index_add`, degree-normalised with `scatter_add`, mean-pooled per graph.
- `vae`: a convolutional VAE: mean/log-variance by `chunk`, the reparameterisation with
  `randn_like`, a KL term, a transposed-conv decoder.
- `config_driven`: a block built from a config dict: activations looked up by name with
  `getattr(F, ...)`, `functools.partial`, a ModuleDict routed by string keys, `**kwargs`
  forwarding, a `@property` and a `@staticmethod` helper.

The suite moves each model and its inputs to a device and a dtype (`breadth_speed.py --device cuda
--dtype bfloat16`), so the programs are written to be portable as a model author would: a tensor
created inside a forward takes the input's device (and dtype where it meets activations), lengths
for `pack_padded_sequence` go to the CPU with `.cpu()`, autocast is entered on the input's device
type. `packages/dynamo/tests/test_breadth_programs.py` checks it on the CPU (float32 and bfloat16;
a factory without `device=`; a CPU-only argument that comes from the device).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import logging
import math
import typing
import warnings
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

Built = tuple[nn.Module, dict[str, Any], str]


def _g(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# -- diffusers-style UNet blocks -------------------------------------------------------------


def timestep_embedding(t: torch.Tensor, dim: int, max_period: float = 10000.0) -> torch.Tensor:
    half = dim // 2
    exponent = -math.log(max_period) * torch.arange(half, dtype=torch.float32, device=t.device) / half
    args = t[:, None].float() * torch.exp(exponent)[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


class ResnetBlock(nn.Module):
    def __init__(self, cin: int, cout: int, temb: int, groups: int = 4) -> None:
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, cin)
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.time_proj = nn.Linear(temb, cout)
        self.norm2 = nn.GroupNorm(groups, cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = h + self.time_proj(F.silu(temb))[:, :, None, None]
        h = self.conv2(F.silu(self.norm2(h)))
        return self.skip(x) + h


class CrossAttention(nn.Module):
    def __init__(self, dim: int, context_dim: int | None = None, heads: int = 2) -> None:
        super().__init__()
        context_dim = context_dim or dim
        self.heads = heads
        self.scale = (dim // heads) ** -0.5
        self.to_q = nn.Linear(dim, dim, bias=False)
        self.to_k = nn.Linear(context_dim, dim, bias=False)
        self.to_v = nn.Linear(context_dim, dim, bias=False)
        self.to_out = nn.Sequential(nn.Linear(dim, dim), nn.Dropout(0.0))

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None) -> torch.Tensor:
        context = x if context is None else context
        b, n, d = x.shape
        q, k, v = self.to_q(x), self.to_k(context), self.to_v(context)
        q, k, v = (t.reshape(b, -1, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        attn = (q @ k.transpose(-1, -2) * self.scale).softmax(dim=-1)
        out = (attn @ v).transpose(1, 2).reshape(b, n, d)
        return self.to_out(out)


class SpatialTransformer(nn.Module):
    def __init__(self, channels: int, context_dim: int) -> None:
        super().__init__()
        self.norm = nn.GroupNorm(4, channels)
        self.proj_in = nn.Conv2d(channels, channels, 1)
        self.ln1, self.ln2, self.ln3 = (nn.LayerNorm(channels) for _ in range(3))
        self.attn1 = CrossAttention(channels)
        self.attn2 = CrossAttention(channels, context_dim)
        self.ff = nn.Sequential(
            nn.Linear(channels, channels * 2), nn.GELU(), nn.Linear(channels * 2, channels)
        )
        self.proj_out = nn.Conv2d(channels, channels, 1)

    def forward(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        residual = x
        x = self.proj_in(self.norm(x))
        x = x.permute(0, 2, 3, 1).reshape(b, h * w, c)
        x = self.attn1(self.ln1(x)) + x
        x = self.attn2(self.ln2(x), context=context) + x
        x = self.ff(self.ln3(x)) + x
        x = x.reshape(b, h, w, c).permute(0, 3, 1, 2).contiguous()
        return self.proj_out(x) + residual


class UNet(nn.Module):
    def __init__(self, cin: int = 4, chans: tuple[int, ...] = (8, 16), context_dim: int = 12) -> None:
        super().__init__()
        temb = chans[0] * 4
        self.chans = chans
        self.time_mlp = nn.Sequential(nn.Linear(chans[0], temb), nn.SiLU(), nn.Linear(temb, temb))
        self.conv_in = nn.Conv2d(cin, chans[0], 3, padding=1)
        self.down = nn.ModuleList()
        prev = chans[0]
        for i, c in enumerate(chans):
            stage = nn.ModuleDict(
                {"res": ResnetBlock(prev, c, temb), "attn": SpatialTransformer(c, context_dim)}
            )
            if i < len(chans) - 1:
                stage["downsample"] = nn.Conv2d(c, c, 3, stride=2, padding=1)
            self.down.append(stage)
            prev = c
        self.mid = ResnetBlock(prev, prev, temb)
        self.up = nn.ModuleList()
        for c in reversed(chans):
            self.up.append(
                nn.ModuleDict(
                    {"res": ResnetBlock(prev + c, c, temb), "attn": SpatialTransformer(c, context_dim)}
                )
            )
            prev = c
        self.conv_out = nn.Sequential(nn.GroupNorm(4, prev), nn.SiLU(), nn.Conv2d(prev, cin, 3, padding=1))

    def forward(
        self, sample: torch.Tensor, timestep: torch.Tensor, encoder_hidden_states: torch.Tensor
    ) -> Any:
        # the embedding is computed in float32 and cast to the model's dtype, as diffusers does
        temb = self.time_mlp(timestep_embedding(timestep, self.chans[0]).to(sample.dtype))
        h = self.conv_in(sample)
        skips = []
        for stage in self.down:
            h = stage["res"](h, temb)
            h = stage["attn"](h, encoder_hidden_states)
            skips.append(h)
            if "downsample" in stage:
                h = stage["downsample"](h)
        h = self.mid(h, temb)
        for stage in self.up:
            skip = skips.pop()
            if h.shape[-2:] != skip.shape[-2:]:
                h = F.interpolate(h, size=skip.shape[-2:], mode="nearest")
            h = stage["res"](torch.cat([h, skip], dim=1), temb)
            h = stage["attn"](h, encoder_hidden_states)
        return {"sample": self.conv_out(h)}


def _unet() -> Built:
    torch.manual_seed(0)
    g = _g(1)
    inputs = {
        "sample": torch.randn(2, 4, 8, 8, generator=g),
        "timestep": torch.tensor([3, 500]),
        "encoder_hidden_states": torch.randn(2, 5, 12, generator=g),
    }
    return UNet().eval(), inputs, "program"


# -- torchvision-style detection head ------------------------------------------------------------


class FPN(nn.Module):
    def __init__(self, in_channels: list[int], out: int) -> None:
        super().__init__()
        self.inner = nn.ModuleList(nn.Conv2d(c, out, 1) for c in in_channels)
        self.layer = nn.ModuleList(nn.Conv2d(out, out, 3, padding=1) for _ in in_channels)

    def forward(self, feats: OrderedDict[str, torch.Tensor]) -> OrderedDict[str, torch.Tensor]:
        names = list(feats.keys())
        xs = list(feats.values())
        last = self.inner[-1](xs[-1])
        results = [self.layer[-1](last)]
        for idx in range(len(xs) - 2, -1, -1):
            lateral = self.inner[idx](xs[idx])
            top_down = F.interpolate(last, size=lateral.shape[-2:], mode="nearest")
            last = lateral + top_down
            results.insert(0, self.layer[idx](last))
        return OrderedDict(zip(names, results, strict=True))


class RetinaHead(nn.Module):
    def __init__(self, channels: int, anchors: int, classes: int) -> None:
        super().__init__()
        self.num_classes = classes
        tower: list[nn.Module] = []
        for _ in range(2):
            tower += [nn.Conv2d(channels, channels, 3, padding=1), nn.GroupNorm(4, channels), nn.ReLU()]
        self.cls_tower = nn.Sequential(*tower)
        self.cls_logits = nn.Conv2d(channels, anchors * classes, 3, padding=1)
        self.bbox_reg = nn.Conv2d(channels, anchors * 4, 3, padding=1)
        nn.init.constant_(self.cls_logits.bias, -math.log((1 - 0.01) / 0.01))

    @staticmethod
    def _flatten(t: torch.Tensor, k: int) -> torch.Tensor:
        n, _, h, w = t.shape
        return t.view(n, -1, k, h, w).permute(0, 3, 4, 1, 2).reshape(n, -1, k)

    def forward(self, feats: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        logits, boxes = [], []
        for f in feats:
            t = self.cls_tower(f)
            logits.append(self._flatten(self.cls_logits(t), self.num_classes))
            boxes.append(self._flatten(self.bbox_reg(t), 4))
        return torch.cat(logits, dim=1), torch.cat(boxes, dim=1)


def make_anchors(
    sizes: list[tuple[int, int]],
    strides: list[int],
    scales: tuple[float, ...],
    dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor:
    # the feature maps' dtype and device, as torchvision's AnchorGenerator takes them
    out = []
    for (h, w), stride in zip(sizes, strides, strict=True):
        ys, xs = torch.meshgrid(
            torch.arange(h, device=device) * stride, torch.arange(w, device=device) * stride, indexing="ij"
        )
        centers = torch.stack([xs, ys, xs, ys], dim=-1).reshape(-1, 1, 4).to(dtype)
        half = torch.tensor([[-s, -s, s, s] for s in scales], dtype=dtype, device=device) * stride / 2
        out.append((centers + half).reshape(-1, 4))
    return torch.cat(out)


def decode_boxes(
    deltas: torch.Tensor, anchors: torch.Tensor, clip: float = math.log(1000.0 / 16)
) -> torch.Tensor:
    widths = anchors[:, 2] - anchors[:, 0]
    heights = anchors[:, 3] - anchors[:, 1]
    cx = anchors[:, 0] + 0.5 * widths
    cy = anchors[:, 1] + 0.5 * heights
    dx, dy, dw, dh = deltas.unbind(-1)
    dw, dh = dw.clamp(max=clip), dh.clamp(max=clip)
    pcx, pcy = dx * widths + cx, dy * heights + cy
    pw, ph = torch.exp(dw) * widths, torch.exp(dh) * heights
    return torch.stack([pcx - pw / 2, pcy - ph / 2, pcx + pw / 2, pcy + ph / 2], dim=-1)


class Detector(nn.Module):
    def __init__(self, classes: int = 5) -> None:
        super().__init__()
        self.stages = nn.ModuleList([
            nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.BatchNorm2d(8), nn.ReLU()),
            nn.Sequential(nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16), nn.ReLU()),
            nn.Sequential(nn.Conv2d(16, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16), nn.ReLU()),
        ])  # fmt: skip
        self.fpn = FPN([8, 16, 16], 16)
        self.scales = (1.0, 2.0)
        self.head = RetinaHead(16, len(self.scales), classes)

    def forward(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        feats: OrderedDict[str, torch.Tensor] = OrderedDict()
        x = images
        for i, stage in enumerate(self.stages):
            x = stage(x)
            feats[f"p{i + 3}"] = x
        pyramid = self.fpn(feats)
        levels = list(pyramid.values())
        logits, deltas = self.head(levels)
        sizes = [tuple(f.shape[-2:]) for f in levels]
        strides = [images.shape[-1] // s[1] for s in sizes]
        anchors = make_anchors(sizes, strides, self.scales, levels[0].dtype, levels[0].device)  # type: ignore[arg-type]
        boxes = decode_boxes(deltas, anchors)
        scores = logits.sigmoid()
        top, idx = scores.flatten(1).topk(10, dim=1)
        return {"scores": top, "labels": idx % logits.shape[-1], "boxes": boxes, "logits": logits}


def _detector() -> Built:
    torch.manual_seed(0)
    return Detector().eval(), {"images": torch.randn(2, 3, 32, 32, generator=_g(2))}, "program"


# -- an LSTM language model --------------------------------------------------------------------


class LstmLM(nn.Module):
    def __init__(self, vocab: int = 50, dim: int = 16, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.drop = nn.Dropout(0.0)
        self.rnn = nn.LSTM(dim, dim, layers, batch_first=True, dropout=0.0)
        self.head = nn.Linear(dim, vocab)
        self.head.weight = self.embed.weight  # tied

    def init_state(self, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        w = self.head.weight
        shape = (self.rnn.num_layers, batch, self.rnn.hidden_size)
        return w.new_zeros(shape), w.new_zeros(shape)

    def forward(self, ids: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor] | None = None) -> Any:
        # truncated backprop through time: the carried state is detached
        state = self.init_state(ids.size(0)) if state is None else (state[0].detach(), state[1].detach())
        out, (h, c) = self.rnn(self.drop(self.embed(ids)), state)
        logits = self.head(self.drop(out))
        return logits, (h, c)


def _lstm_lm() -> Built:
    torch.manual_seed(0)
    g = _g(3)
    state = (torch.randn(2, 2, 16, generator=g), torch.randn(2, 2, 16, generator=g))
    return LstmLM().eval(), {"ids": torch.randint(0, 50, (2, 7), generator=g), "state": state}, "program"


# -- a mixture of experts with a top-k router ------------------------------------------------------


class Expert(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class MoE(nn.Module):
    def __init__(self, dim: int = 16, experts: int = 4, k: int = 2) -> None:
        super().__init__()
        self.k = k
        self.num_experts = experts
        self.router = nn.Linear(dim, experts, bias=False)
        self.experts = nn.ModuleList(Expert(dim, dim * 2) for _ in range(experts))
        self.norm = nn.RMSNorm(dim)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        b, s, d = x.shape
        flat = self.norm(x).reshape(-1, d)
        probs = self.router(flat).softmax(dim=-1, dtype=torch.float32)
        weights, chosen = probs.topk(self.k, dim=-1)
        weights = (weights / weights.sum(dim=-1, keepdim=True)).to(flat.dtype)
        # the router runs in float32; the gates are in the activations' dtype, like `weights`
        gates = torch.zeros_like(probs, dtype=flat.dtype).scatter(1, chosen, weights)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            out = out + gates[:, e : e + 1] * expert(flat)
        # Switch-style load balancing: fraction of tokens per expert times mean router probability
        counts = F.one_hot(chosen, self.num_experts).sum(dim=(0, 1)).float()
        aux = self.num_experts * (counts / counts.sum() * probs.mean(dim=0)).sum()
        return {"hidden": x + out.reshape(b, s, d), "aux_loss": aux, "expert_counts": counts}


def _moe() -> Built:
    torch.manual_seed(0)
    return MoE().eval(), {"x": torch.randn(2, 6, 16, generator=_g(4))}, "program"


# -- activation checkpointing ------------------------------------------------------------------


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, dim * 2)
        self.fc2 = nn.Linear(dim * 2, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(self.ln(x))))


class CheckpointedMLP(nn.Module):
    def __init__(self, dim: int = 16, depth: int = 3) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(dim) for _ in range(depth))
        self.head = nn.Linear(dim, 4)
        self.gradient_checkpointing = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            if self.gradient_checkpointing and self.training:
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return self.head(x)


def _checkpointed() -> Built:
    torch.manual_seed(0)
    return CheckpointedMLP().eval(), {"x": torch.randn(3, 5, 16, generator=_g(5))}, "program"


# -- dataclass configs and outputs -----------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TinyConfig:
    dim: int = 16
    classes: int = 3
    use_pooler: bool = True
    act: str = "gelu"


@dataclasses.dataclass
class ClassifierOutput:
    logits: torch.Tensor
    hidden: torch.Tensor | None = None
    pooled: torch.Tensor | None = None
    extras: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)


class DataclassModel(nn.Module):
    def __init__(self, config: TinyConfig = TinyConfig()) -> None:
        super().__init__()
        self.config = config
        self.proj = nn.Linear(config.dim, config.dim)
        self.cls = nn.Linear(config.dim, config.classes)

    def forward(self, x: torch.Tensor, return_hidden: bool = True) -> ClassifierOutput:
        act = getattr(F, self.config.act)
        hidden = act(self.proj(x))
        pooled = hidden.mean(dim=1) if self.config.use_pooler else hidden[:, 0]
        out = ClassifierOutput(logits=self.cls(pooled))
        if return_hidden:
            out = dataclasses.replace(out, hidden=hidden, pooled=pooled)
        out.extras["norm"] = out.logits.norm(dim=-1)
        for f in dataclasses.fields(out):
            if getattr(out, f.name) is None:
                out.extras[f"missing_{f.name}"] = torch.zeros((), dtype=x.dtype, device=x.device)
        return out


def _dataclass_model() -> Built:
    torch.manual_seed(0)
    return DataclassModel().eval(), {"x": torch.randn(2, 5, 16, generator=_g(6))}, "program"


# -- a GRU decoder with additive attention ------------------------------------------------------


class AttnDecoder(nn.Module):
    def __init__(self, vocab: int = 30, dim: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.encoder = nn.GRU(dim, dim, batch_first=True, bidirectional=True)
        self.bridge = nn.Linear(2 * dim, dim)
        self.w_enc = nn.Linear(2 * dim, dim, bias=False)
        self.w_dec = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, 1, bias=False)
        self.cell = nn.GRUCell(dim + 2 * dim, dim)
        self.out = nn.Linear(dim, vocab)

    def forward(
        self, src: torch.Tensor, tgt: torch.Tensor, src_mask: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        enc, h_n = self.encoder(self.embed(src))
        h = torch.tanh(self.bridge(torch.cat([h_n[0], h_n[1]], dim=-1)))
        keys = self.w_enc(enc)
        logits, attns = [], []
        for t in range(tgt.size(1)):
            scores = self.v(torch.tanh(keys + self.w_dec(h).unsqueeze(1))).squeeze(-1)
            scores = scores.masked_fill(~src_mask, float("-inf"))
            alpha = scores.softmax(dim=-1)
            context = torch.bmm(alpha.unsqueeze(1), enc).squeeze(1)
            h = self.cell(torch.cat([self.embed(tgt[:, t]), context], dim=-1), h)
            logits.append(self.out(h))
            attns.append(alpha)
        return {"logits": torch.stack(logits, dim=1), "attention": torch.stack(attns, dim=1)}


def _attn_decoder() -> Built:
    torch.manual_seed(0)
    g = _g(7)
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[1, 4:] = False
    inputs = {"src": torch.randint(0, 30, (2, 6), generator=g), "tgt": torch.randint(0, 30, (2, 4), generator=g),
              "src_mask": mask}  # fmt: skip
    return AttnDecoder().eval(), inputs, "program"


# -- message passing on a graph ----------------------------------------------------------------


class GraphConv(nn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.lin = nn.Linear(cin, cout)
        self.root = nn.Linear(cin, cout, bias=False)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        src, dst = edge_index
        n = x.size(0)
        deg = torch.zeros(n, dtype=x.dtype, device=x.device).scatter_add_(
            0, dst, torch.ones_like(dst, dtype=x.dtype)
        )
        norm = deg.clamp(min=1).rsqrt()
        msg = self.lin(x)[src] * norm[src].unsqueeze(-1)
        agg = torch.zeros(n, msg.size(-1), dtype=x.dtype, device=x.device).index_add_(0, dst, msg)
        return F.relu(agg * norm.unsqueeze(-1) + self.root(x))


class GNN(nn.Module):
    def __init__(self, cin: int = 6, dim: int = 16, classes: int = 3) -> None:
        super().__init__()
        self.convs = nn.ModuleList([GraphConv(cin, dim), GraphConv(dim, dim)])
        self.head = nn.Linear(dim, classes)

    def forward(
        self, x: torch.Tensor, edge_index: torch.Tensor, batch: torch.Tensor, num_graphs: int
    ) -> torch.Tensor:
        for conv in self.convs:
            x = conv(x, edge_index)
        summed = torch.zeros(num_graphs, x.size(-1), dtype=x.dtype, device=x.device).index_add_(0, batch, x)
        ones = torch.ones(x.size(0), dtype=x.dtype, device=x.device)
        counts = torch.zeros(num_graphs, dtype=x.dtype, device=x.device).index_add_(0, batch, ones)
        return self.head(summed / counts.unsqueeze(-1))


def _gnn() -> Built:
    torch.manual_seed(0)
    g = _g(8)
    edges = torch.randint(0, 10, (2, 30), generator=g)
    batch = torch.tensor([0] * 5 + [1] * 5)
    inputs = {"x": torch.randn(10, 6, generator=g), "edge_index": edges, "batch": batch, "num_graphs": 2}
    return GNN().eval(), inputs, "program"


# -- a convolutional VAE -------------------------------------------------------------------------


class VAE(nn.Module):
    def __init__(self, latent: int = 4) -> None:
        super().__init__()
        self.enc = nn.Sequential(nn.Conv2d(1, 8, 3, 2, 1), nn.SiLU(), nn.Conv2d(8, 16, 3, 2, 1), nn.SiLU())
        self.to_stats = nn.Conv2d(16, 2 * latent, 1)
        self.dec = nn.Sequential(
            nn.ConvTranspose2d(latent, 16, 4, 2, 1), nn.SiLU(), nn.ConvTranspose2d(16, 1, 4, 2, 1)
        )

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        mean, logvar = self.to_stats(self.enc(x)).chunk(2, dim=1)
        logvar = logvar.clamp(-30.0, 20.0)
        std = torch.exp(0.5 * logvar)
        z = mean + std * torch.randn_like(std)
        recon = self.dec(z)
        kl = -0.5 * torch.sum(1 + logvar - mean.pow(2) - logvar.exp(), dim=[1, 2, 3])
        return {
            "recon": torch.sigmoid(recon),
            "kl": kl,
            "mse": F.mse_loss(recon, x, reduction="none").mean((1, 2, 3)),
        }


def _vae() -> Built:
    torch.manual_seed(0)
    return VAE().eval(), {"x": torch.rand(2, 1, 16, 16, generator=_g(9))}, "program"


# -- a block built from a config dict ------------------------------------------------------------


class ConfigBlock(nn.Module):
    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        self.cfg = dict(cfg)
        dim = cfg["dim"]
        norm: Callable[..., nn.Module] = functools.partial(nn.LayerNorm, eps=cfg.get("eps", 1e-5))
        self.norms = nn.ModuleDict({name: norm(dim) for name in ("attn", "mlp")})
        self.branches = nn.ModuleDict({
            "attn": nn.MultiheadAttention(dim, cfg["heads"], batch_first=True),
            "mlp": nn.Sequential(nn.Linear(dim, dim * cfg["mlp_ratio"]), nn.Linear(dim * cfg["mlp_ratio"], dim)),
        })  # fmt: skip

    @property
    def act(self) -> Callable[[torch.Tensor], torch.Tensor]:
        return getattr(F, self.cfg["act"])

    @staticmethod
    def _residual(x: torch.Tensor, y: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return x + scale * y

    def _branch(self, name: str, x: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        h = self.norms[name](x)
        if name == "attn":
            out, _ = self.branches[name](h, h, h, need_weights=False, **kwargs)
            return out
        first, second = self.branches[name]
        return second(self.act(first(h)))

    def forward(self, x: torch.Tensor, pad_mask: torch.Tensor | None = None) -> torch.Tensor:
        for name in self.cfg["order"]:
            kwargs = {"key_padding_mask": pad_mask} if name == "attn" and pad_mask is not None else {}
            x = self._residual(x, self._branch(name, x, **kwargs), scale=self.cfg.get("residual_scale", 1.0))
        return x


def _config_driven() -> Built:
    torch.manual_seed(0)
    cfg = {
        "dim": 16,
        "heads": 2,
        "mlp_ratio": 2,
        "act": "silu",
        "order": ["attn", "mlp"],
        "residual_scale": 0.5,
    }
    mask = torch.zeros(2, 5, dtype=torch.bool)
    mask[1, 3:] = True
    return (
        ConfigBlock(cfg).eval(),
        {"x": torch.randn(2, 5, 16, generator=_g(10)), "pad_mask": mask},
        "program",
    )


# -- a HiFi-GAN-style vocoder with weight-normed convolutions --------------------------------------


class ResBlock1d(nn.Module):
    def __init__(self, channels: int, dilations: tuple[int, ...] = (1, 3)) -> None:
        super().__init__()
        wn = nn.utils.parametrizations.weight_norm
        self.convs = nn.ModuleList(
            wn(nn.Conv1d(channels, channels, 3, dilation=d, padding=d)) for d in dilations
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for conv in self.convs:
            x = x + conv(F.leaky_relu(x, 0.1))
        return x


class Vocoder(nn.Module):
    def __init__(self, mels: int = 8, channels: int = 16) -> None:
        super().__init__()
        wn = nn.utils.parametrizations.weight_norm
        self.pre = wn(nn.Conv1d(mels, channels, 7, padding=3))
        self.ups = nn.ModuleList([
            wn(nn.ConvTranspose1d(channels, channels // 2, 4, stride=2, padding=1)),
            wn(nn.ConvTranspose1d(channels // 2, channels // 4, 4, stride=2, padding=1)),
        ])  # fmt: skip
        self.blocks = nn.ModuleList([ResBlock1d(channels // 2), ResBlock1d(channels // 4)])
        self.post = nn.utils.parametrizations.spectral_norm(nn.Conv1d(channels // 4, 1, 7, padding=3))

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        x = self.pre(mel)
        for up, block in zip(self.ups, self.blocks, strict=True):
            x = block(up(F.leaky_relu(x, 0.1)))
        return torch.tanh(self.post(F.leaky_relu(x)))


def _vocoder() -> Built:
    torch.manual_seed(0)
    return Vocoder().eval(), {"mel": torch.randn(2, 8, 10, generator=_g(11))}, "program"


# -- a spatial transformer network -------------------------------------------------------------


class STN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.loc = nn.Sequential(
            nn.Conv2d(1, 4, 5), nn.MaxPool2d(2), nn.ReLU(), nn.Flatten(), nn.LazyLinear(6)
        )
        self.classify = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.AdaptiveAvgPool2d(4), nn.Flatten(),
                                      nn.Linear(64, 10))  # fmt: skip

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        theta = self.loc(x).view(-1, 2, 3) * 0.1 + torch.tensor(
            [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]], dtype=x.dtype, device=x.device
        )
        grid = F.affine_grid(theta, list(x.size()), align_corners=False)
        warped = F.grid_sample(x, grid, align_corners=False)
        return self.classify(warped), theta


def _stn() -> Built:
    torch.manual_seed(0)
    model = STN()
    x = torch.randn(2, 1, 16, 16, generator=_g(12))
    model(x)  # materialise the lazy layer, as a first training step would
    return model.eval(), {"x": x}, "program"


# -- mixed precision inside the forward -----------------------------------------------------------


class AutocastMLP(nn.Module):
    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, dim * 2)
        self.fc2 = nn.Linear(dim * 2, dim)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        # autocast on the input's device (autocast for "cpu" leaves CUDA ops alone); the residual
        # in the input's dtype (float32 in float32, a no-op cast in bfloat16)
        with torch.autocast(x.device.type, dtype=torch.bfloat16):
            h = self.fc2(F.gelu(self.fc1(x)))
            low = h.dtype
        out = self.norm(h.to(x.dtype) + x)
        return {"out": out, "half": h, "was_low": torch.tensor(low == torch.bfloat16, device=x.device)}


def _autocast() -> Built:
    torch.manual_seed(0)
    return AutocastMLP().eval(), {"x": torch.randn(2, 5, 16, generator=_g(13))}, "program"


# -- greedy decoding in a Python loop --------------------------------------------------------------


class TinyGPT(nn.Module):
    def __init__(self, vocab: int = 40, dim: int = 16, ctx: int = 16) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(ctx, dim) * 0.02)
        layer = nn.TransformerEncoderLayer(dim, 2, dim * 2, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def logits(self, ids: torch.Tensor) -> torch.Tensor:
        n = ids.size(1)
        x = self.tok(ids) + self.pos[:n]
        mask = torch.triu(torch.full((n, n), float("-inf"), dtype=x.dtype, device=x.device), diagonal=1)
        h = self.blocks(x, mask=mask, is_causal=True)
        return self.head(self.ln(h))

    def forward(self, ids: torch.Tensor, steps: int = 3, temperature: float = 1.0) -> dict[str, torch.Tensor]:
        scores = []
        for _ in range(steps):
            last = self.logits(ids)[:, -1] / temperature
            scores.append(last)
            ids = torch.cat([ids, last.argmax(dim=-1, keepdim=True)], dim=1)
        return {"scores": torch.stack(scores, dim=1), "ids": ids}


def _greedy() -> Built:
    torch.manual_seed(0)
    return TinyGPT().eval(), {"ids": torch.randint(0, 40, (2, 4), generator=_g(14))}, "program"


# -- NamedTuple outputs, enums, warnings and logging in the forward ----------------------------------


class Pool(enum.Enum):
    MEAN = "mean"
    MAX = "max"


class EncoderOut(typing.NamedTuple):
    hidden: torch.Tensor
    pooled: torch.Tensor
    shape: torch.Size


_log = logging.getLogger("kiln.breadth.programs")


class Pooler(nn.Module):
    def __init__(self, dim: int = 16, pool: Pool = Pool.MAX) -> None:
        super().__init__()
        self.pool = pool
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> EncoderOut:
        _log.debug("pooling %s with %s", tuple(x.shape), self.pool)
        if mask is None:
            warnings.warn("no mask given: every position is pooled", stacklevel=2)
            mask = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device)
        h = torch.tanh(self.proj(x))
        if not torch.jit.is_scripting() and self.pool is Pool.MEAN:
            pooled = (h * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
        else:
            pooled = h.masked_fill(~mask[..., None], float("-inf")).amax(dim=1)
        return EncoderOut(h, pooled, h.shape)


def _pooler() -> Built:
    torch.manual_seed(0)
    return Pooler().eval(), {"x": torch.randn(2, 5, 16, generator=_g(15))}, "program"


# -- padded sequences packed for an LSTM -----------------------------------------------------------


class PackedLSTM(nn.Module):
    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.rnn = nn.LSTM(dim, dim, batch_first=True)
        self.head = nn.Linear(dim, 3)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        # torch wants the lengths on the CPU whatever the device of `x`
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, (h, _) = self.rnn(packed)
        padded, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=x.size(1))
        return self.head(h[-1]) + padded.sum(1).mean()


def _packed() -> Built:
    torch.manual_seed(0)
    return (
        PackedLSTM().eval(),
        {"x": torch.randn(3, 6, 16, generator=_g(16)), "lengths": torch.tensor([6, 2, 4])},
        "program",
    )


PROGRAMS: dict[str, Callable[[], Built]] = {
    "unet_blocks": _unet,
    "detection_head": _detector,
    "lstm_lm": _lstm_lm,
    "moe_topk": _moe,
    "checkpointed_mlp": _checkpointed,
    "dataclass_output": _dataclass_model,
    "gru_attention_decoder": _attn_decoder,
    "gnn_message_passing": _gnn,
    "vae": _vae,
    "config_driven": _config_driven,
    "vocoder_weight_norm": _vocoder,
    "spatial_transformer": _stn,
    "autocast_mlp": _autocast,
    "greedy_decode": _greedy,
    "namedtuple_pooler": _pooler,
    "packed_lstm": _packed,
}
