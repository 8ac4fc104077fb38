"""A seeded random fuzzer for the CPU convolution passes, through the C++ generator: each seed is a
small module over 1-2 four-dimensional inputs (channels-last, contiguous or permuted) built from
convolutions (plain, 1x1, grouped, strided, dilated, and depthwise ones whose kernel often covers
the whole map), BatchNorms, ReLUs, residual adds (with a ReLU after them or not), pooling that
shrinks the map, linear layers (on pooled features, or over the channels of an NHWC permute) and
views, run in inference (``no_grad``, most modules in eval mode, so that BatchNorms fold) or in
training, in float32 or bfloat16.

It is compiled with the CPU rules as they run on a CPU (``layout_policy`` ``"auto"``) and with the
oneDNN passes that are off by default switched on (``conv_prepack``, ``linear_pack``,
``linear_pack_bf16``): Notes [Convolutions through oneDNN], [Prepacked weights], [bfloat16
through oneDNN], [BatchNorm of a bfloat16 convolution folds in float32], [Packed linear layers]
(every product packed, however small: ``every_linear_packed``) in inference, [Channels-last in CPU training], [Depthwise convolution backwards on small maps]
and [A convolution backward's gradient in oneDNN's format] in training.

Each program is called three times: before the second call the module runs once in eager in
training mode (its BatchNorms move their statistics), before the third every parameter and
BatchNorm statistic is changed in place (``mul_`` / ``add_`` under ``no_grad``, as an optimizer
step or ``load_state_dict`` does), in the eager module and in the compiled one alike: a weight
prepacked at the first call must be packed again (Notes [Prepacked weights], [Running
statistics move without a version]), and every call's results are compared. Comparison is layout_fuzz.py's (Note [Tolerances of the layout fuzzer]):
outputs, input and parameter gradients, BatchNorm buffers; float64 decides where eager and kiln
are not close.

A failing program is run again with each CPU rule switched off (``SWITCHES``): the rules whose
switching off makes it pass are printed.

Long runs: python cpu_conv_fuzz.py --seeds 0:200 [-q] [--no-blame] [--show] [--coverage]
"""

# mypy: ignore-errors
from __future__ import annotations

import contextlib
import copy
import random
import sys

import torch
from layout_fuzz import (
    ACTS,
    Program,
    _compare_all,
    _divisors,
    _Gen,
    _grad_outputs,
    _input,
    _meta_strides,
    _run,
    _view,
    eager_band,
    eager_reads_garbage,
    fuzz_arguments,
    instantiate,
    run_seeds,
)
from torch import nn

import kiln
from kiln_loopir.passes import linear_pack

BASE_OPTIONS = {
    "cpu_backend": "cpp",
    "strict": True,
    "conv_prepack": True,
    "linear_pack": True,
    "linear_pack_bf16": True,
}

# each rule and the options that switch it off (blame)
SWITCHES: dict[str, dict] = {
    "conv_fusion": {"conv_fusion": False},
    "linear_pack": {"linear_pack": False},
    "onednn_bf16": {"onednn_bf16": False},
    "layout": {"layout": False},
    "cpu_layout_training": {"cpu_layout_training": False},
    "depthwise_backward_nchw": {"depthwise_backward_nchw": False},
    "conv_grad_format": {"conv_grad_format": False},
}


def _conv(g: _Gen, x: str) -> tuple[list[str], list[str]]:
    r, v = g.r, g.env[x]
    c, h, w = v.shape[1], v.shape[2], v.shape[3]
    kind = r.choice(("plain", "plain", "1x1", "depthwise", "depthwise", "depthwise", "grouped", "strided"))
    bias = r.random() < 0.5
    cout = r.choice((c, 2 * c, r.randint(1, 8)))
    k, stride, pad, groups, dil = 3, 1, 1, 1, 1
    if kind == "plain":
        k, pad = r.choice(((3, 1), (3, 0), (1, 0), (5, 2), (2, 0)))
        dil = r.choice((1, 1, 1, 2))
        pad *= dil
    elif kind == "1x1":
        k, pad = 1, 0
    elif kind == "depthwise":
        # Note [Depthwise convolution backwards on small maps]: kernels as large as the map, or
        # larger, padded or not, strided and dilated
        groups, cout = c, c * r.choice((1, 1, 1, 2))
        k = r.choice((3, 3, 5, 7, max(h, w) | 1))
        pad = r.choice((k // 2, k // 2, 0, 1))
        stride = r.choice((1, 1, 1, 2))
        dil = r.choice((1, 1, 1, 2))
    elif kind == "grouped":
        groups = r.choice(_divisors(c))
        cout = groups * r.randint(1, 3)
    elif kind == "strided":
        stride, k, pad = 2, r.choice((1, 3)), r.choice((0, 1))
    name = g.sub()
    init = [
        f"self.{name} = nn.Conv2d({c}, {cout}, {k}, stride={stride}, padding={pad}, dilation={dil},"
        f" groups={groups}, bias={bias})"
    ]
    return init, [f"{g.fresh()} = self.{name}({x})"]


# A BatchNorm over fewer values a channel than this, in a training program, is left out: with two
# values its gradients in bfloat16 are rounding amplified (eager's own error from float64 is of the
# gradients' size), and no rule of kiln's decides them.
MIN_BATCH_STATISTICS = 8


def _statistics_ok(g: _Gen, v: torch.Tensor) -> bool:
    return g.mode != "train" or v.shape[0] * v.shape[2] * v.shape[3] >= MIN_BATCH_STATISTICS


def _bn(g: _Gen, x: str) -> tuple[list[str], list[str]]:
    if not _statistics_ok(g, g.env[x]):
        return [], []  # nothing added
    c = g.env[x].shape[1]
    name = g.sub()
    affine = g.r.random() < 0.85
    return [f"self.{name} = nn.BatchNorm2d({c}, affine={affine})"], [f"{g.fresh()} = self.{name}({x})"]


def _conv_bn_relu(g: _Gen, x: str) -> tuple[list[str], list[str]]:
    """A convolution, its BatchNorm and a ReLU (or not): what conv_fusion folds."""
    init, lines = _conv(g, x)
    y = lines[-1].split(" = ", 1)[0]
    ns = {"nn": nn, "self": nn.Module()}
    exec(init[0], ns)
    try:
        with torch.no_grad():
            made = getattr(ns["self"], init[0].split(" = ", 1)[0].removeprefix("self."))(g.env[x])
    except RuntimeError:
        return init, lines  # eager rejects the convolution: try_add drops it
    if not _statistics_ok(g, made):
        return init, lines
    name, z = g.sub(), g.fresh()
    cout = int(init[0].split("nn.Conv2d(", 1)[1].split(",")[1])
    init = [*init, f"self.{name} = nn.BatchNorm2d({cout}, affine={g.r.random() < 0.85})"]
    lines = [*lines, f"{z} = self.{name}({y})"]
    if g.r.random() < 0.6:
        lines.append(f"{g.fresh()} = F.relu({z})")
    return init, lines


def _act(g: _Gen, x: str) -> tuple[list[str], list[str]]:
    act = "F.relu({})" if g.r.random() < 0.6 else g.r.choice(ACTS)
    return [], [f"{g.fresh()} = {act.format(x)}"]


def _residual(g: _Gen, x: str) -> tuple[list[str], list[str]]:
    """A residual add with another value of the same shape (and dtype), a ReLU after it or not;
    without one, ResNet's block: ``relu(bn(conv(x)) + x)`` (conv_fusion's affine and add
    post-ops)."""
    v = g.env[x]
    same = [k for k in g.four_d() if k != x and g.env[k].shape == v.shape]
    init: list[str] = []
    lines: list[str] = []
    if same:
        other = g.r.choice(same)
    else:
        c, conv, bn, z, other = v.shape[1], g.sub(), g.sub(), g.fresh(), g.fresh()
        init = [
            f"self.{conv} = nn.Conv2d({c}, {c}, 3, padding=1, bias=False)",
            f"self.{bn} = nn.BatchNorm2d({c})",
        ]
        lines = [f"{z} = self.{conv}({x})", f"{other} = self.{bn}({z})"]
        if not _statistics_ok(g, v):  # the map keeps its size: no BatchNorm over few values
            init, lines = init[:1], [f"{other} = self.{conv}({x})"]
    a, b = (x, other) if g.r.random() < 0.5 else (other, x)
    y = g.fresh()
    lines.append(f"{y} = {a} + {b}")
    if g.r.random() < 0.5:
        lines.append(f"{g.fresh()} = F.relu({y})")
    return init, lines


def _pool(g: _Gen, x: str) -> tuple[list[str], list[str]]:
    r, y = g.r, g.fresh()
    kind = r.choice(("max", "avg", "adaptive"))
    if kind == "max":
        return [], [f"{y} = F.max_pool2d({x}, 2, 2)"]
    if kind == "avg":
        return [], [f"{y} = F.avg_pool2d({x}, 2, 2, {r.choice((0, 1))})"]
    return [], [f"{y} = F.adaptive_avg_pool2d({x}, {r.choice((1, 2, 3))})"]


def _linear(g: _Gen, x: str) -> tuple[list[str], list[str]]:
    """A linear layer over pooled features (a classifier head, with a reshape back to 4-D), or
    over the channels of an NHWC permute and back (ConvNeXt's)."""
    r, v = g.r, g.env[x]
    n, c = v.shape[0], v.shape[1]
    name = g.sub()
    out = r.choice((c, 2 * c, r.randint(1, 16), 32))
    bias = r.random() < 0.8
    init = [f"self.{name} = nn.Linear({c}, {out}, bias={bias})"]
    a, b = g.fresh(), g.fresh()
    if r.random() < 0.5:
        return init, [f"{a} = self.{name}({x}.mean((2, 3)))", f"{b} = {a}.reshape({n}, {out}, 1, 1)"]
    cc = g.fresh()
    return init, [
        f"{a} = {x}.permute(0, 2, 3, 1)",
        f"{b} = self.{name}({a})",
        f"{cc} = {b}.permute(0, 3, 1, 2)",
    ]


OPS = (
    (_conv, 5),
    (_conv_bn_relu, 4),
    (_bn, 2),
    (_act, 2),
    (_residual, 3),
    (_pool, 1),
    (_linear, 2),
    (_view, 1),
)


def generate(seed: int) -> Program:
    r = random.Random(seed)
    torch.manual_seed(seed)
    g = _Gen(r)
    dtype = torch.bfloat16 if r.random() < 0.4 else torch.float32
    mode = g.mode = "train" if r.random() < 0.45 else "infer"
    n, c = r.choice((1, 2, 2, 3)), r.choice((1, 2, 3, 4, 6, 8, 16))
    h, w = r.choice((1, 2, 2, 3, 4, 4, 5, 7, 8, 9)), r.choice((1, 2, 2, 3, 4, 4, 5, 7, 8, 9))
    if r.random() < 0.6:
        w = h
    inputs = []
    for i in range(r.choice((1, 1, 2))):
        shape = (n, c, h, w) if i == 0 or r.random() < 0.7 else (n, r.randint(1, 6), h, w)
        fmt = r.choice(("cl", "cl", "contig", "contig", "perm"))
        grad = mode == "train" and r.random() < 0.5
        inputs.append((f"x{i}", shape, fmt, grad))
        g.env[f"x{i}"] = _input(shape, fmt, torch.float32, torch.Generator().manual_seed(seed + i))
    ops, weights = zip(*OPS, strict=True)
    steps = r.randint(3, 10)
    tries = 0
    if r.random() < 0.8:  # a stem convolution
        g.try_add(*(_conv_bn_relu if r.random() < 0.5 else _conv)(g, "x0"))
    while len(g.lines) < steps and tries < 60:
        tries += 1
        op = r.choices(ops, weights)[0]
        cands = g.four_d()
        last = [k for k in cands if k.startswith("t")]
        x = last[-1] if last and r.random() < 0.75 else r.choice(cands)
        init, lines = op(g, x)
        g.try_add(init, lines)
    if not any(k.startswith("t") for k in g.env):
        g.try_add(*_act(g, "x0"))
    made = [k for k in g.env if k.startswith("t") and isinstance(g.env[k], torch.Tensor)]
    ret = [made[-1]]
    for k in r.sample(made[:-1], min(len(made) - 1, r.choice((0, 0, 1, 2)))):
        ret.append(k)
    loss = r.choice(("scalar", "tensor")) if mode == "train" else "tensor"
    if loss == "scalar":
        g.lines.append(f"loss = {ret[0]}.float().square().mean()")
        ret = ["loss", *ret[1:]]
    p = Program(
        seed,
        dtype,
        mode,
        eval_mode=mode == "infer" and r.random() < 0.8,
        loss=loss,
        inputs=inputs,
        init=g.init,
        lines=g.lines,
        ret=ret,
    )
    p.grads_cl = [r.random() < 0.5 for _ in ret]
    return p


def mutate(m: torch.nn.Module) -> None:
    """Every parameter and BatchNorm statistic changed in place (their ``_version`` bumped), as an
    optimizer step or ``load_state_dict`` changes them."""
    with torch.no_grad():
        for i, q in enumerate(m.parameters()):
            q.mul_(0.75 + 0.1 * (i % 4)).add_(0.05)
        for name, b in m.named_buffers():
            if "running_mean" in name:
                b.add_(0.3)
            elif "running_var" in name:
                b.mul_(1.5)


def calibrate(m: torch.nn.Module, args) -> None:
    """One eager call of ``m`` in training mode: its BatchNorms move their statistics without
    moving their versions (loopir's Note [Running statistics move without a version])."""
    was = m.training
    m.train()
    with torch.no_grad(), contextlib.suppress(ValueError, RuntimeError):  # one value a channel
        m(*(a.detach() * 2 + 0.5 for a in args))
    m.train(was)


def _calls(p: Program, m: torch.nn.Module, plain: torch.nn.Module, args, grads) -> list:
    """The program's three calls of ``m`` (``plain`` or its compiled form): ``plain`` calibrated
    in eager before the second, changed in place before the third."""
    out = [_run(p, m, args, grads)]
    for change in (calibrate, mutate):
        change(plain, *([args] if change is calibrate else []))
        for q in plain.parameters():
            q.grad = None
        args = [a.detach().mul(-1.0).requires_grad_(a.requires_grad) for a in args]
        out.append(_run(p, m, args, grads))
    return out


@contextlib.contextmanager
def every_linear_packed():
    """linear_pack takes products of any size (its thresholds ``MIN_MACS``, ``MIN_MACS_BF16`` set
    to 0), so that the fuzzer's small linear layers go through it."""
    saved = linear_pack.MIN_MACS, linear_pack.MIN_MACS_BF16
    linear_pack.MIN_MACS = linear_pack.MIN_MACS_BF16 = 0
    try:
        yield
    finally:
        linear_pack.MIN_MACS, linear_pack.MIN_MACS_BF16 = saved


def check(p: Program, extra: dict | None = None) -> str | None:
    """None when the compiled calls match eager's; else what differs (or the error)."""
    m, args = instantiate(p)
    ce = copy.deepcopy(m)
    cargs = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
    grads = None
    if p.mode == "train" and p.loss == "tensor":
        with torch.no_grad():
            grads = _grad_outputs(p, copy.deepcopy(m)(*args), p.dtype)
    try:
        want = _calls(p, m, m, args, grads)
    except Exception as exc:  # as layout_fuzz.check: eager's own backward raised (seed 1222 there)
        return f"skip: eager raises {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    options = {**BASE_OPTIONS, **(extra or {})}
    kiln.reset()
    try:
        with every_linear_packed():
            compiled = kiln.compile(ce, options=options, dynamic=False)
            got = _calls(p, compiled, ce, cargs, grads)
    except Exception as exc:
        return f"error: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    finally:
        kiln.reset()
    bad = []
    ref = band = None
    for call in range(3):
        found = _meta_strides(p, _compare_all(p, got[call], want[call], None), got[call][0])
        if "?" in found:
            if ref is None:
                md, dargs = instantiate(p, torch.float64)
                dgrads = [t.double() for t in grads] if grads else None
                ref = _calls(p, md, md, dargs, dgrads)
                # Note [Eager's one-ulp band] (layout_fuzz.py): seed 1047's bias before a
                # BatchNorm, whose true gradient is 0, is rounding noise in bfloat16
                band = eager_band(p, grads, lambda m, a: _calls(p, m, m, a, grads))
            near = [b[call] for b in band or ()]
            found = _meta_strides(p, _compare_all(p, got[call], want[call], ref[call], near), got[call][0])
        bad += [f"call {call + 1}: {b}" for b in found]
    # Note [Eager reading uninitialized memory] (layout_fuzz.py): seeds 1195 and 1225
    if bad and (
        why := eager_reads_garbage(bad, lambda: _calls(p, *_twice(instantiate(p)), grads), calls=True)
    ):
        return f"skip: {why}"
    return "\n".join(bad) if bad else None


def _twice(made):
    """``instantiate``'s module and inputs as ``_calls`` takes them (the module twice)."""
    m, args = made
    return m, m, args


def blame(p: Program) -> list[str]:
    """The rules whose switching off makes ``p`` pass."""
    return [name for name, opts in SWITCHES.items() if check(p, opts) is None]


def main(argv: list[str] | None = None) -> int:
    a = fuzz_arguments(__doc__ or "").parse_args(argv)
    return run_seeds(a, generate, check, blame)


if __name__ == "__main__":
    sys.exit(main())
