"""A seeded random fuzzer for views, in-place writes and aliasing: each seed is a straight-line
program (printed as readable source when it fails) over 1-3 inputs, some non-contiguous, some
requiring grad, some buffers of a module, built from views (slices with steps, select, narrow,
transpose/permute, view/reshape/flatten/unflatten, unsqueeze/squeeze, expand, diagonal,
unbind/split/chunk, as_strided, detach, .data), in-place writes (on inputs, on intermediates, on
views of either; in-place geometry rarely), pure ops between them and `torch.no_grad()` blocks,
returning a random mix of intermediates, views, inputs and repeats. The compiled program must
match eager as alias_compare.py compares (values, types, view strides, inputs after the call,
aliasing, requires_grad, gradients) over two calls on the same inputs, under dynamic=None and
True; an error eager raises must be raised by the compiled program too, with the same type.

Note [Generating programs by running them]: the generator keeps a live eager environment and
executes each candidate statement as it writes it; a statement eager rejects (a write into an
expanded view, a shape that does not fit, an in-place op on a leaf that requires grad) is
dropped and another drawn, so nearly every program is valid without the generator modelling
shapes or autograd's rules. Now and then a rejected statement is kept as the program's last one,
to check that kiln raises eager's error.

Long runs: python test_alias_fuzz.py --seeds 0:2000 [--dynamic none|true] [--backend cpp|triton] [--pad-mm]
(`--pad-mm`: programs with matrix products, compiled with `pad_mm="force"`).
"""

# mypy: ignore-errors
from __future__ import annotations

import argparse
import os
import random
import sys
import traceback
from dataclasses import dataclass, field

import pytest
import torch
from alias_compare import aliasing, compare_inputs, compare_outputs, flat_tensors, grad_outputs_sum, grads

if __name__ == "__main__" and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # Note [Triton's interpreter is process-wide]

import kiln


@dataclass
class Program:
    seed: int
    module: bool
    inputs: list[tuple[str, str]]  # (name, maker expression over generator `g`)
    buffers: list[tuple[str, str]]
    lines: list[tuple[str, bool]]  # (statement, inside torch.no_grad())
    ret: str
    expect_error: bool = False
    source: str = field(default="")

    def render(self) -> str:
        body: list[str] = []
        in_ng = False
        ind = "        " if self.module else "    "
        for b, _ in self.buffers:
            body.append(f"{ind}{b} = self.{b}")
        for stmt, ng in self.lines:
            if ng and not in_ng:
                body.append(f"{ind}with torch.no_grad():")
            in_ng = ng
            body.append(f"{ind}{'    ' if ng else ''}{stmt}")
        body.append(f"{ind}return {self.ret}")
        names = ", ".join(n for n, _ in self.inputs)
        if self.module:
            head = ["class M(torch.nn.Module):", "    def __init__(self, g):", "        super().__init__()"]
            head += [f"        self.register_buffer({b!r}, {mk})" for b, mk in self.buffers]
            head += [f"    def forward(self, {names}):"]
        else:
            head = [f"def f({names}):"]
        mk = [f"# {n} = {e}" for n, e in self.inputs]
        return "\n".join(mk + head + body) + "\n"


SIZES = (1, 2, 3, 4, 5, 6)


def _maker(r: random.Random, grad: bool) -> str:
    nd = r.choice((1, 2, 2, 2, 3))
    shape = [r.choice(SIZES[1:]) for _ in range(nd)]
    kind = (
        r.choice(("plain", "plain", "t", "step", "offset", "expand"))
        if nd >= 2
        else r.choice(("plain", "step"))
    )
    if kind == "t":
        expr = f"torch.randn({', '.join(map(str, shape[::-1]))}, generator=g).transpose(0, {nd - 1})"
    elif kind == "step":
        s = list(shape)
        s[-1] *= 2
        expr = f"torch.randn({', '.join(map(str, s))}, generator=g)[..., ::2]"
    elif kind == "offset":
        s = list(shape)
        s[0] += 1
        expr = f"torch.randn({', '.join(map(str, s))}, generator=g)[1:]"
    elif kind == "expand" and not grad:
        s = [1, *shape[1:]]
        expr = f"torch.randn({', '.join(map(str, s))}, generator=g).expand({', '.join(map(str, shape))})"
    else:
        expr = f"torch.randn({', '.join(map(str, shape))}, generator=g)"
    if grad:
        # a leaf that requires grad and is a view (`x[1:].requires_grad_()`) loses its gradient
        # in eager when written under no_grad (its views regenerate from the base that does not
        # require grad): an eager quirk no user relies on, so leaves are detached from the base
        expr += ".requires_grad_()" if kind == "plain" else ".detach().requires_grad_()"
    return expr


class _Gen:
    def __init__(self, seed: int) -> None:
        self.r = random.Random(seed)
        self.seed = seed
        self.env: dict = {"torch": torch}
        self.tensors: list[str] = []
        self.inputs: list[str] = []
        self.n = 0

    def fresh(self) -> str:
        self.n += 1
        return f"t{self.n}"

    def pick(self, pool=None) -> str:
        pool = pool or self.tensors
        # recent tensors more often, so chains of views form
        k = len(pool)
        i = min(int(self.r.expovariate(1.0 / max(2.0, k / 3))), k - 1)
        return pool[k - 1 - i]

    def other(self, v: str) -> str:
        """A tensor or scalar broadcastable to v (for binary in-place ops)."""
        t = self.env[v]
        # not one that shares memory with v: eager reads such an operand while writing v, in
        # its loop order, and refuses only the overlaps it can prove (`x.add_(x.diagonal())` on a
        # strided x runs), where kiln, as torch.compile, reads the values from before the write
        ptr = t.untyped_storage().data_ptr()
        cands = [
            w
            for w in self.tensors
            if self.env[w].untyped_storage().data_ptr() != ptr and _broadcasts_to(self.env[w].shape, t.shape)
        ]
        if cands and self.r.random() < 0.6:
            return self.r.choice(cands)
        return repr(self.r.choice((0.5, 2.0, -1.0, 1.5)))

    # -- statement kinds: each returns (statement, new tensor names) or None --
    def view(self):
        r, v = self.r, self.pick()
        t = self.env[v]
        nd, o = t.dim(), self.fresh()
        c = r.randrange(22)
        if nd == 0:
            return f"{o} = {v}.unsqueeze(0)", [o]
        d = r.randrange(nd)
        n = t.shape[d]
        pre = ":, " * d
        if c == 0:
            a, b = r.randrange(n + 1), r.randrange(n + 1)
            s = r.choice((1, 1, 2, 3))
            return f"{o} = {v}[{pre}{a}:{max(a, b)}:{s}]", [o]
        if c == 1 and n:
            return f"{o} = {v}[{pre}{r.randrange(-n, n)}]", [o]
        if c == 2 and n:
            return f"{o} = {v}.select({d}, {r.randrange(n)})", [o]
        if c == 3:
            s = r.randrange(n + 1)
            return f"{o} = {v}.narrow({d}, {s}, {r.randrange(n - s + 1)})", [o]
        if c == 4 and nd <= 2:
            return f"{o} = {v}.t()", [o]
        if c == 5:
            return f"{o} = {v}.transpose({d}, {r.randrange(-nd, nd)})", [o]
        if c == 6:
            p = list(range(nd))
            r.shuffle(p)
            return f"{o} = {v}.permute({', '.join(map(str, p))})", [o]
        if c == 7:
            return f"{o} = {v}.{r.choice(('view', 'reshape'))}(-1)", [o]
        if c == 8:
            return f"{o} = {v}.{r.choice(('view', 'reshape'))}({_refactor(r, tuple(t.shape))})", [o]
        if c == 9:
            return f"{o} = {v}.flatten({r.choice(('', f'{d}'))})", [o]
        if c == 10 and n >= 2:
            f = [k for k in range(1, n + 1) if n % k == 0]
            k = r.choice(f)
            return f"{o} = {v}.unflatten({d}, ({k}, {n // k}))", [o]
        if c == 11:
            return f"{o} = {v}.unsqueeze({r.randrange(-nd - 1, nd + 1)})", [o]
        if c == 12:
            return f"{o} = {v}.squeeze({r.choice(('', str(d)))})", [o]
        if c == 13:
            ones = [i for i in range(nd) if t.shape[i] == 1]
            if ones:
                shape = list(t.shape)
                shape[ones[0]] = r.choice((2, 3))
                return f"{o} = {v}.expand({', '.join(map(str, shape))})", [o]
            return f"{o} = {v}.unsqueeze(0).expand({r.choice((2, 3))}, *{v}.shape)", [o]
        if c == 14 and nd >= 2:
            return f"{o} = {v}.diagonal({r.choice(('', 'offset=1', '0, 0, 1', '-1, 1, 0'))})", [o]
        if c == 15 and 1 <= n <= 4:
            outs = [self.fresh() for _ in range(n)]
            return f"{', '.join(outs)}, = {v}.unbind({d})", outs
        if c == 16 and n >= 2:
            k = r.randrange(1, n)
            outs = [self.fresh() for _ in range(-(-n // k))]
            return f"{', '.join(outs)}, = {v}.split({k}, {d})", outs
        if c == 17 and n >= 2:
            k = r.randrange(2, n + 1)
            m = len(torch.empty(n).chunk(k))
            outs = [self.fresh() for _ in range(m)]
            return f"{', '.join(outs)}, = {v}.chunk({k}, {d})", outs
        if c == 18 and r.random() < 0.3:
            # mostly within the tensor's own elements; now and then anywhere in its storage
            # (another view's elements, a gap of a strided input): kiln refuses those and runs
            # the graph eagerly (Note [as_strided within a tensor's own elements] in kiln_aotgrad)
            whole = t.untyped_storage().nbytes() // t.element_size()
            own = t.is_contiguous() and r.random() < 0.8
            st, base = (t.numel(), t.storage_offset()) if own else (whole, 0)
            if st >= 4:
                a = r.randrange(1, 3)
                b = r.randrange(1, 3)
                sa, sb = r.randrange(0, 3), 1
                hi = (a - 1) * sa + (b - 1) * sb
                off = base + r.randrange(0, st - hi)
                return f"{o} = {v}.as_strided(({a}, {b}), ({sa}, {sb}), {off})", [o]
        if c == 19:
            return f"{o} = {v}.{r.choice(('detach()', 'data', 'real'))}", [o]
        if c == 20:
            same = [w for w in self.tensors if self.env[w].shape == t.shape]
            return f"{o} = {v}.view_as({r.choice(same)})", [o]
        if c == 21:
            return f"{o} = {v}[..., None]", [o]
        return None

    def write(self):
        r = self.r
        v = self.pick(self.inputs if self.inputs and r.random() < 0.3 else None)
        t = self.env[v]
        nd = t.dim()
        c = r.randrange(17)
        w = self.other(v)
        if c == 0:
            return f"{v}.add_({w})", []
        if c == 1:
            return f"{v}.mul_({w})", []
        if c == 2:
            return f"{v}.copy_({w})", []
        if c == 3:
            return f"{v}.zero_()", []
        if c == 4:
            return f"{v}.fill_({r.choice((1.0, -2.0))})", []
        if c == 5:
            return f"{v}.clamp_({r.choice(('-0.5, 0.5', 'min=0.0', 'max=0.25'))})", []
        if c == 6:
            return f"{v}.masked_fill_({w} > 0, {r.choice((0.0, 3.0))})", []
        if nd and t.shape[0]:
            n = t.shape[0]
            idx = sorted(r.sample(range(n), r.randrange(1, n + 1)))
            it = f"torch.tensor({idx})"
            if c == 7:
                return f"{v}.index_put_(({it},), {_row_of(self, v, len(idx))})", []
            if c == 8:
                src = f"torch.ones(({len(idx)},) + tuple({v}.shape[1:]))"
                return f"{v}.index_add_(0, {it}, {src}, alpha={r.choice((1, 2))})", []
            if c == 9:
                return f"{v}[{it}] = {_row_of(self, v, len(idx))}", []
            if c == 10:
                a = r.randrange(n)
                return f"{v}[{a}:{r.randrange(a, n + 1)}] = {r.choice((0.0, 7.0))}", []
            if c == 11:
                return f"{v}[{r.randrange(n)}] *= 2", []
        if c == 12:
            return f"{v}[...] += {w}", []
        if c == 13:
            o = self.fresh()
            return f"{o} = {v}.{r.choice(('add_', 'mul_', 'sub_'))}({w})", [o]
        if c == 14 and r.random() < 0.4:
            return f"{v}.unsqueeze_({r.randrange(-nd - 1, nd + 1)})", []
        if c == 15 and r.random() < 0.4 and nd <= 2:
            return f"{v}.t_()", []
        if c == 16 and r.random() < 0.4 and nd >= 2:
            return f"{v}.transpose_({r.randrange(nd)}, {r.randrange(nd)})", []
        return None

    def mm(self):
        """A matrix product of recent tensors (option ``--pad-mm``): with ``pad_mm="force"`` loopir
        pads every misaligned GEMM and returns its result as a slice of the padded buffer, a
        graph output in another layout than eager's (Note [Bases returned in another layout] in
        kiln_aotgrad's joint.py), which the views drawn after it then read."""
        r, v = self.r, self.pick()
        t = self.env[v]
        o = self.fresh()
        if t.dim() == 0:
            return None
        c = r.randrange(6)
        k = t.shape[-1]
        rows = [w for w in self.tensors if self.env[w].dim() == 2 and self.env[w].shape[0] == k]
        if c == 0 and rows:
            return f"{o} = {v} @ {r.choice(rows)}", [o]
        if c == 1 and t.dim() >= 2:
            return f"{o} = {v} @ {v}.transpose(-1, -2)", [o]
        if c == 2 and t.dim() == 2:
            m = t.shape[0]
            bias = [
                w
                for w in self.tensors
                if self.env[w].dim() <= 2 and _broadcasts_to(self.env[w].shape, (m, m))
            ]
            b = r.choice(bias) if bias and r.random() < 0.7 else f"torch.ones({m})"
            return f"{o} = torch.addmm({b}, {v}, {v}.t(){r.choice(('', ', alpha=0.5', ', beta=2'))})", [o]
        cols = [w for w in self.tensors if self.env[w].dim() == 2 and self.env[w].shape[-1] == k]
        if c == 3 and cols:
            w = r.choice(cols)
            n = self.env[w].shape[0]
            bias = [b for b in self.tensors if self.env[b].dim() == 1 and self.env[b].shape[0] == n]
            b = f", {r.choice(bias)}" if bias and r.random() < 0.5 else ""
            return f"{o} = torch.nn.functional.linear({v}, {w}{b})", [o]
        if c == 4 and t.dim() == 3:
            mats = [
                w for w in self.tensors if self.env[w].dim() == 3 and self.env[w].shape[:2] == (t.shape[0], k)
            ]
            if mats:
                return f"{o} = torch.bmm({v}, {r.choice(mats)})", [o]
            return f"{o} = torch.bmm({v}, {v}.transpose(1, 2))", [o]
        if c == 5:
            return f"{o} = {v} @ torch.linspace(-1.0, 1.0, {k * r.choice((3, 5, 6))}).view({k}, -1)", [o]
        return None

    def pure(self):
        r, v = self.r, self.pick()
        t = self.env[v]
        o = self.fresh()
        c = r.randrange(12)
        if c == 0:
            return f"{o} = {v} * {r.choice((2, 0.5, -1))}", [o]
        if c == 1:
            w = self.pick()
            return f"{o} = {v} {r.choice('+-*')} {w}", [o]
        if c == 2:
            return f"{o} = {r.choice(('torch.sin', 'torch.sigmoid', 'torch.tanh', 'torch.relu'))}({v})", [o]
        if c == 3:
            return f"{o} = {v}.sum()", [o]
        if c == 4 and t.dim():
            kd = r.choice(("", ", keepdim=True"))
            return f"{o} = {v}.{r.choice(('sum', 'mean', 'amax'))}({r.randrange(t.dim())}{kd})", [o]
        if c == 5:
            return f"{o} = {v}.clone()", [o]
        if c == 6:
            return f"{o} = {v}.contiguous()", [o]
        if c == 7 and t.dim() >= 1:
            ws = [w for w in self.tensors if self.env[w].dim() >= 1 and self.env[w].shape[0] == t.shape[-1]]
            if ws:
                return f"{o} = {v} @ {r.choice(ws)}", [o]
        if c == 8:
            w = self.pick()
            return f"{o} = torch.where({v} > 0, {v}, {w})", [o]
        if c == 9:
            return f"{o} = {v} + 0", [o]
        if c == 10:
            return f"{o} = torch.cat([{v}, {v}], 0)" if t.dim() else f"{o} = {v} * 3", [o]
        if c == 11:
            return f"{o} = {v}.float()", [o]
        return None

    def run(self, stmt: str, ng: bool) -> BaseException | None:
        try:
            with torch.no_grad() if ng else _nullctx():
                exec(stmt, self.env)
        except Exception as e:
            return e
        return None


class _nullctx:
    def __enter__(self):
        return None

    def __exit__(self, *a):
        return False


def _broadcasts_to(a, b) -> bool:
    try:
        return tuple(torch.broadcast_shapes(a, b)) == tuple(b)
    except RuntimeError:
        return False


def _refactor(r: random.Random, shape: tuple) -> str:
    n = 1
    for s in shape:
        n *= s
    if n == 0:
        return "0, -1"
    f = [k for k in range(1, n + 1) if n % k == 0]
    k = r.choice(f)
    return f"{k}, {n // k}" if r.random() < 0.7 else f"{k}, -1"


def _row_of(g: _Gen, v: str, k: int) -> str:
    return f"torch.full(({k},) + tuple({v}.shape[1:]), 4.0)" if g.r.random() < 0.5 else "5.0"


def generate(seed: int, mm: bool = False) -> Program:
    """Seed ``seed``'s program; ``mm`` adds matrix products (``--pad-mm``; other seeds' programs
    are unchanged without it)."""
    r = random.Random(seed * 7919 + 1)
    gen = _Gen(seed)
    n_in = r.choice((1, 1, 2, 2, 3))
    module = r.random() < 0.25
    inputs, buffers = [], []
    g = torch.Generator().manual_seed(seed)
    gen.env["g"] = g
    for i in range(n_in):
        is_buf = module and i == n_in - 1 and n_in > 1
        grad = not is_buf and r.random() < 0.3
        mk = _maker(r, grad)
        name = f"b{i}" if is_buf else f"x{i}"
        (buffers if is_buf else inputs).append((name, mk))
        gen.env[name] = eval(mk, {"torch": torch, "g": g})
        gen.tensors.append(name)
        gen.inputs.append(name)
    lines: list[tuple[str, bool]] = []
    expect_error = False
    n_stmts = r.randrange(3, 12)
    ng_left = 0
    tries = 0
    while len(lines) < n_stmts and tries < 200:
        tries += 1
        if ng_left == 0 and r.random() < 0.1:
            ng_left = r.randrange(1, 4)
        kind = r.choices(("view", "write", "pure", "mm"), (4, 4, 2, 3 if mm else 0))[0]
        got = getattr(gen, kind)()
        if got is None:
            continue
        stmt, outs = got
        ng = ng_left > 0
        err = gen.run(stmt, ng)
        if err is not None:
            if r.random() < 0.02:  # keep one rejected statement: kiln must raise eager's error
                lines.append((stmt, ng))
                expect_error = True
                break
            continue
        ng_left = max(0, ng_left - 1)
        lines.append((stmt, ng))
        gen.tensors.extend(o for o in outs if isinstance(gen.env.get(o), torch.Tensor))
    # returns: a random subset of tensors, sometimes repeated, sometimes shapes
    k = r.randrange(1, 4)
    picks = [gen.pick() for _ in range(k)]
    if r.random() < 0.15:
        picks.append(picks[0])
    if r.random() < 0.1:
        picks.append(f"{picks[0]}.shape")
    form = r.choice(("tuple", "tuple", "list", "single"))
    if form == "single" and len(picks) == 1:
        ret = picks[0]
    elif form == "list":
        ret = "[" + ", ".join(picks) + "]"
    else:
        ret = ", ".join(picks) + ("," if len(picks) == 1 else "")
    p = Program(seed, module, inputs, buffers, lines, ret, expect_error)
    p.source = p.render()
    return p


def _instantiate(p: Program):
    """(callable, args, buffer getter) built fresh from the program's seed."""
    ns: dict = {"torch": torch}
    exec(compile(p.source, f"<alias_fuzz seed {p.seed}>", "exec"), ns)
    g = torch.Generator().manual_seed(p.seed)
    args = [eval(mk, {"torch": torch, "g": g}) for _, mk in p.inputs]
    if p.module:
        m = ns["M"](g)
        return m, args, lambda: [getattr(m, b) for b, _ in p.buffers]
    return ns["f"], args, lambda: []


def check(p: Program, dynamic: bool | None, backend: str = "cpp", options: dict | None = None) -> str | None:
    """None when the compiled program matches eager; else a description of the mismatch."""
    fe, ae, be = _instantiate(p)
    fc, ac, bc = _instantiate(p)
    opts = dict(options or {})
    if backend != "cpp":
        opts["cpu_backend"] = backend
    opts = opts or None
    comp = kiln.compile(fc, dynamic=dynamic, options=opts)
    names = [n for n, _ in p.inputs] + [n for n, _ in p.buffers]
    for call in range(2):
        try:
            oe = fe(*ae)
        except Exception as e:
            try:
                comp(*ac)
            except Exception as e2:
                if type(e2) is not type(e):
                    return f"call {call}: eager raised {type(e).__name__}: {e}\nkiln raised {type(e2).__name__}: {e2}"
                return None
            return f"call {call}: eager raised {type(e).__name__}: {e}\nkiln did not raise"
        try:
            oc = comp(*ac)
        except Exception:
            return f"call {call}: kiln raised, eager did not:\n{traceback.format_exc()}"
        free = bool(opts and opts.get("pad_mm"))  # padded results keep their own layout
        try:
            compare_outputs(oe, oc, ae + be(), inputs_only=free)
            compare_inputs(ae + be(), ac + bc(), names)
            ale, alc = aliasing(oe, ae + be()), aliasing(oc, ac + bc())
            assert alc == ale, (
                f"aliasing {[x for x in alc if x not in ale]} != eager {[x for x in ale if x not in alc]}"
            )
            if free:  # their strides aside, outputs that share memory must share the same elements
                _write_probe(oe, oc, ae + be(), ac + bc(), names)
        except AssertionError as e:
            return f"call {call}: {e}"
        wrt_e = [a for a in ae if a.requires_grad and a.is_leaf]
        wrt_c = [a for a in ac if a.requires_grad and a.is_leaf]
        try:
            ge = grads(oe, wrt_e)
        except RuntimeError:
            continue  # eager cannot backpropagate this program: nothing to compare
        try:
            gc = grads(oc, wrt_c)
        except RuntimeError:
            return f"call {call}: kiln's backward raised, eager's did not:\n{traceback.format_exc()}"
        try:
            torch.testing.assert_close(gc, ge, equal_nan=True)
        except AssertionError as e:
            return f"call {call}: gradients differ: {e}"
    return None


def _write_probe(oe, oc, eager_args, compiled_args, names) -> None:
    """Write through the first returned tensor (of a call whose outputs need no gradient) and
    compare every output and input again: views over a base the compiler returned in another
    layout must still see the write where eager's do (Note [Bases returned in another layout] in
    kiln_aotgrad's joint.py)."""
    te, tc = flat_tensors(oe), flat_tensors(oc)
    if not te or any(t.requires_grad for t in te) or not te[0].is_floating_point():
        return
    try:
        with torch.no_grad():
            te[0].add_(1.0)
    except RuntimeError:
        return  # eager refuses the write (an expanded output): nothing to compare
    with torch.no_grad():
        tc[0].add_(1.0)
    compare_outputs(oe, oc, eager_args, "after a write into out[0]: out", inputs_only=True)
    compare_inputs(eager_args, compiled_args, names)


# CI's share (a cold compile cache: about a second a seed with C++ on a shared 2-core machine);
# long runs use __main__
CI_SEEDS = {None: range(0, 25), True: range(1000, 1020)}
CI_TRITON_SEEDS = range(2000, 2015)  # 2010: Note [Index checks in the interpreter]

# the programs write expanded tensors (eager's deprecation warnings) and make kiln fall back
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::RuntimeWarning")


@pytest.mark.parametrize("dynamic", [None, True], ids=["static", "dynamic"])
def test_alias_fuzz_cpp(dynamic) -> None:
    failures = []
    for seed in CI_SEEDS[dynamic]:
        p = generate(seed)
        msg = check(p, dynamic)
        kiln.reset()
        if msg:
            failures.append(f"seed {seed}:\n{p.source}{msg}")
    assert not failures, "\n\n".join(failures[:3]) + f"\n({len(failures)} failing seeds)"


def _grad_mode_leak(x0, x1, x2):  # seed 221, as the fuzzer wrote it
    with torch.no_grad():
        x2[1] *= 2
    x0.zero_()
    t2 = x2.sum()
    t2.mul_(2.0)
    t5 = t2.sum()
    t6 = t5.unsqueeze(0)
    t6.clamp_(min=0.0)
    x2.t_()
    with torch.no_grad():
        x0.masked_fill_(t5 > 0, 3.0)
        t8 = t6[0]
    return t2, t5, t8


def test_an_exception_under_no_grad_restores_grad_mode() -> None:
    """Note [Grad mode after an exception] (kiln's backends.py): the second call raises (eager
    refuses `x2[1] *= 2` once `t_` made row 1 a column of the expanded input) inside the
    captured `no_grad` block, run eagerly; grad mode stayed off and the next seed's program
    (the fuzzer runs them in one process) returned outputs that required grad wrongly."""
    g = torch.Generator().manual_seed(221)
    args = (
        torch.randn(1, 3, 6, generator=g).expand(6, 3, 6),
        torch.randn(5, 3, generator=g).requires_grad_(),
        torch.randn(1, 2, generator=g).expand(3, 2),
    )
    c = kiln.compile(_grad_mode_leak)
    with pytest.warns(UserWarning):
        c(*args)
        with pytest.raises(RuntimeError, match="single memory location"):
            c(*args)
    assert torch.is_grad_enabled()


class _Unsqueezed(torch.nn.Module):  # seed 1026, minimized
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("b", torch.randn(7, 2))

    def forward(self, x):
        self.b.unsqueeze_(2)
        return x * 2


@pytest.mark.parametrize("dynamic", [None, True], ids=["static", "dynamic"])
def test_an_in_place_geometry_change_of_a_buffer_applies_once(dynamic) -> None:
    # Note [Placeholders keep their entry geometry] (kiln_dynamo): [7, 2, 1, 1] under dynamic=True
    m = _Unsqueezed()
    kiln.compile(m, dynamic=dynamic)(torch.randn(3))
    assert m.b.shape == (7, 2, 1) and m.b.stride() == (2, 1, 1)
    kiln.reset()


def _data_view(x0):  # seed 165, minimized
    t2 = torch.relu(x0)
    t4 = x0.data.t()
    t2.unflatten(0, (2, 1))
    return (t4,)


def test_a_static_view_of_an_input_at_an_offset_under_dynamic() -> None:
    # Note [Static views of inputs in a symbolic trace] (kiln_aotgrad's joint.py)
    x = torch.randn(3, 2)[1:]
    got, want = kiln.compile(_data_view, dynamic=True)(x), _data_view(x)
    kiln.reset()
    torch.testing.assert_close(got, want)
    assert got[0].storage_offset() == want[0].storage_offset() == 2


def _written_then_viewed(x):
    x.mul_(-1.0)
    return x.t()


def test_a_call_failing_after_its_write_back_is_not_run_again(monkeypatch) -> None:
    # Note [Run-time fallback]: a failure after the inputs were written back raises (eager's
    # re-run would apply `mul_` a second time); later calls run eagerly
    c = kiln.compile(_written_then_viewed)
    x = torch.randn(2, 3)
    c(x.clone())  # compiles
    real = torch.Tensor.as_strided

    def failing(self, *args, **kwargs):
        if self is x:  # aotgrad rebuilds the returned view of the input with as_strided
            raise RuntimeError("forced failure after the write-back")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "as_strided", failing)
    before = x.clone()
    with pytest.warns(RuntimeWarning, match="forced failure"), pytest.raises(RuntimeError) as info:
        c(x)
    assert "not run again" in str(info.value)
    torch.testing.assert_close(x, -before)  # written once
    monkeypatch.undo()
    y = x.clone()
    torch.testing.assert_close(c(x), _written_then_viewed(y))  # eagerly from then on
    torch.testing.assert_close(x, y)
    kiln.reset()


def _flat_view_written(x0, x1):  # seed 3212, minimized
    t3 = x0.t().flatten()[8]
    x1.t_()  # a graph break: the resume function writes into t3
    t3.copy_(2.0)
    t3[...] += 0.5
    return t3


def test_a_write_into_a_view_of_a_reshape_copy_under_dynamic() -> None:
    # Note [Outputs the code generator returns as views] (kiln_aotgrad's runtime.py): the C++
    # wrapper returned the flattened copy as `buf0.as_strided(...)`, a view made inside the
    # autograd Function, and the resume function's write into its view raised
    args = [torch.randn(4, 6).requires_grad_(), torch.randn(4, 5)]
    want_args = [args[0].detach().clone().requires_grad_(), args[1].clone()]
    got = kiln.compile(_flat_view_written, dynamic=True)(*args)
    want = _flat_view_written(*want_args)
    kiln.reset()
    torch.testing.assert_close(got, want)
    got.backward()
    want.backward()
    torch.testing.assert_close(args[0].grad, want_args[0].grad)
    torch.testing.assert_close(args[1], want_args[1])


def test_alias_fuzz_triton() -> None:
    failures = []
    for seed in CI_TRITON_SEEDS:
        p = generate(seed)
        msg = check(p, None, "triton")
        kiln.reset()
        if msg:
            failures.append(f"seed {seed}:\n{p.source}{msg}")
    assert not failures, "\n\n".join(failures[:3]) + f"\n({len(failures)} failing seeds)"


def minimize(p: Program, dynamic: bool | None, backend: str = "cpp", options: dict | None = None) -> Program:
    """Drop statements (and returned values) one at a time while the program still fails."""

    def fails(q: Program) -> bool:
        q.source = q.render()
        try:
            _instantiate(q)[0](*_instantiate(q)[1])
        except Exception:
            if not p.expect_error:
                return False  # dropping a statement broke the program itself
        try:
            return check(q, dynamic, backend, options) is not None
        except Exception:
            return False

    changed = True
    while changed:
        changed = False
        for i in range(len(p.lines)):
            q = Program(
                p.seed, p.module, p.inputs, p.buffers, p.lines[:i] + p.lines[i + 1 :], p.ret, p.expect_error
            )
            if fails(q):
                p, changed = q, True
                break
        rets = p.ret.strip("[]").rstrip(",").split(", ")
        for i in range(len(rets)) if not changed and len(rets) > 1 else ():
            q = Program(
                p.seed, p.module, p.inputs, p.buffers, p.lines, ", ".join(rets[:i] + rets[i + 1 :]) + ","
            )
            if fails(q):
                p, changed = q, True
                break
    p.source = p.render()
    return p


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="0:200", help="a:b, a half-open range")
    ap.add_argument("--dynamic", choices=("none", "true"), default="none")
    ap.add_argument("--backend", choices=("cpp", "triton"), default="cpp")
    ap.add_argument("--show", action="store_true", help="print each program")
    ap.add_argument("-q", action="store_true", help="only the seeds that fail")
    ap.add_argument("--minimize", action="store_true", help="print a minimized program for each failure")
    ap.add_argument(
        "--pad-mm",
        action="store_true",
        help="programs with matrix products, compiled with pad_mm='force' (padded GEMMs return non-contiguous results)",
    )
    a = ap.parse_args(argv)
    lo, hi = map(int, a.seeds.split(":"))
    dyn = None if a.dynamic == "none" else True
    opts = {"pad_mm": "force"} if a.pad_mm else None
    bad = 0
    for seed in range(lo, hi):
        p = generate(seed, mm=a.pad_mm)
        if a.show:
            print(p.source)
        try:
            msg = check(p, dyn, a.backend, opts)
        except Exception:
            msg = "harness: " + traceback.format_exc()
        if not torch.is_grad_enabled():  # a leak would change the programs of later seeds
            msg = (msg or "") + "grad mode left off after the calls\n"
            torch.set_grad_enabled(True)
        if msg:
            bad += 1
            print(f"=== seed {seed} FAIL\n{p.source}{msg}\n", flush=True)
            if a.minimize:
                m = minimize(p, dyn, a.backend, opts)
                print(f"--- seed {seed} minimized\n{m.source}{check(m, dyn, a.backend, opts)}\n", flush=True)
        elif not a.q:
            print(f"seed {seed} ok", flush=True)
        kiln.reset()
    print(f"{bad} failing of {hi - lo}")
    return 1 if bad else 0


def _dead_index_write(x0, idx):  # seed 30289's program: the write's result is overwritten
    with torch.no_grad():
        x0.index_put_((idx,), torch.full((1, 5), 4.0))
    x0.zero_()
    return x0 + 1


def _dead_gather(x0, idx):
    t = x0[idx]  # nothing reads it  # noqa: F841
    return x0 + 1


@pytest.mark.parametrize("fn", [_dead_index_write, _dead_gather], ids=["write", "gather"])
@pytest.mark.parametrize("backend", ["cpp", "triton"])
def test_dead_index_ops(fn, backend) -> None:
    # Notes [Dead index writes keep their bounds check] (kiln_loopir's scheduler.py), [Dead
    # gathers keep their bounds check] (kiln_aotgrad's tracer.py): eager raises IndexError for
    # an index out of range where the op's result is dead; kiln returned a value
    compiled = kiln.compile(fn, options={"cpu_backend": backend})
    x = torch.randn(5, 5)
    torch.testing.assert_close(compiled(x.clone(), torch.tensor([4])), fn(x.clone(), torch.tensor([4])))
    with pytest.raises(IndexError):
        fn(x.clone(), torch.tensor([7]))
    try:
        compiled(x.clone(), torch.tensor([7]))
    except IndexError:
        return
    raise AssertionError("the compiled program did not raise IndexError")


if __name__ == "__main__":
    sys.exit(main())


def _sum_into_another_input(x0, x1):  # seed 22171, minimized
    x1.add_(0.5)
    with torch.no_grad():
        x0[0:1] = 0.0
    t7 = x1.add_(x0.sum())
    return t7, x0.unsqueeze(1)


@pytest.mark.parametrize("dynamic", [None, True], ids=["static", "dynamic"])
def test_a_sum_written_into_another_input_over_two_calls(dynamic) -> None:
    # Notes [Placeholders keep their entry autograd state] (kiln_dynamo's fake.py): under
    # dynamic=True x0's gradient counted the sum twice; [A backward that saved no tensors runs
    # again] (kiln_aotgrad's runtime.py): the second call's backward runs through the first
    # call's node, which saved nothing, and raised where eager's runs
    def run(fn):
        x0, x1 = torch.ones(5).requires_grad_(), torch.ones(2, 6)
        return [torch.autograd.grad(grad_outputs_sum(fn(x0, x1)), [x0]) for _ in range(2)]

    got = run(kiln.compile(_sum_into_another_input, dynamic=dynamic))
    kiln.reset()
    torch.testing.assert_close(got, run(_sum_into_another_input))


def _no_grad_view_then_slice(x0, after):  # seed 22364's program, its empty slice made [1:3]
    t2 = x0[:, :1]
    t6 = torch.addmm(torch.ones(6), t2, t2.t())
    with torch.no_grad():
        t9 = t6.permute(1, 0)
        t19 = t9[1:3]
    if after:
        t19 = t9[1:3]
    return t19, t9


@pytest.mark.parametrize("after", [False, True], ids=["under-no-grad", "after"])
@pytest.mark.parametrize("dynamic", [None, True], ids=["static", "dynamic"])
def test_views_of_a_no_grad_view_share_memory_under_pad_mm(dynamic, after) -> None:
    # Notes [Views of intermediates taken under no_grad], [Views of a view taken under no_grad]
    # (kiln_aotgrad's joint.py): the backward trace refused the first (the graph ran eagerly,
    # an error under strict); the second's `t19` came back a copy that writes into `t9` missed
    x0 = torch.randn(7, 4)[1:].requires_grad_()
    c = kiln.compile(_no_grad_view_then_slice, dynamic=dynamic, options={"strict": True, "pad_mm": "force"})
    got, want = c(x0, after), _no_grad_view_then_slice(x0, after)
    kiln.reset()
    torch.testing.assert_close(got, want)
    assert [(o.requires_grad, o.grad_fn is None) for o in got] == [
        (o.requires_grad, o.grad_fn is None) for o in want
    ]
    with torch.no_grad():
        got[1][2, 1:] = 7.0
        assert (got[0][1, 1:] == 7.0).all()


def _split_of_a_no_grad_diagonal(x0):  # seed 1306, minimized
    with torch.no_grad():
        x0.t_()  # a graph break under dynamic shapes: the rest is a continuation in the block
        t2 = x0.diagonal(0, 0, 1)
    _t6, t7 = t2.split(3, 0)
    return (t7,)


@pytest.mark.parametrize("dynamic", [None, True], ids=["static", "dynamic"])
def test_a_view_in_grad_mode_of_a_no_grad_view_gives_the_input_no_gradient(dynamic) -> None:
    """Note [A view in grad mode of a view taken under no_grad] (kiln_aotgrad's joint.py): the
    continuation's inference trace rebuilt `t7` on `x0` in grad mode, and `x0` got a gradient
    where eager's is None (on the second call under dynamic=None, the first under True)."""
    xe = torch.randn(5, 4).requires_grad_()
    xc = xe.detach().clone().requires_grad_()
    compiled = kiln.compile(_split_of_a_no_grad_diagonal, dynamic=dynamic)
    for call in range(2):
        (want,), (got,) = _split_of_a_no_grad_diagonal(xe), compiled(xc)
        assert (got.requires_grad, xc.shape) == (want.requires_grad, xe.shape), call
        torch.testing.assert_close(got, want)
        ge = torch.autograd.grad(want.sum(), xe, allow_unused=True)[0]
        gc = torch.autograd.grad(got.sum(), xc, allow_unused=True)[0]
        assert ge is None and gc is None, f"call {call}: kiln's gradient {gc}"
    kiln.reset()
