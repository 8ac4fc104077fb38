"""Mutation and aliasing sweep: programs that write their inputs in place (through views, of
other layouts, their geometry too) or return inputs, views of them and repeated outputs; the
compiled function must give eager's results, eager's strides and Python types, leave the inputs
as eager leaves them, reproduce eager's aliasing between outputs and inputs (which outputs are
the same object, which share memory) and eager's gradients. Found here, ninth session:
`x.unsqueeze_(0); return x.shape[0]` returned 4 for 1 (Note [In-place changes of a tensor's
shape] in kiln_dynamo's fake.py); under `dynamic=True`, `return y, y.t()` returned a copy as the
second output, not a view of the first (Note [Symbolic views among the outputs]). Not
compared: `x[2:5] += x[1:4]`, which eager refuses (the two overlap) and kiln, as torch.compile,
computes."""

# mypy: ignore-errors
from __future__ import annotations

import pytest
import torch

import kiln

P = []


def prog(*argspec):
    def deco(f):
        P.append((f, argspec))
        return f

    return deco


# argspec: functions producing fresh args from a generator seed
def T(*shape, grad=False, nc=False, step=False, off=False):
    def mk(g):
        if off:  # rows of a larger tensor from its second on: a storage offset
            t = torch.randn(shape[0] + 1, *shape[1:], generator=g)[1:]
        elif step:  # every other element of a row: strided, its own leaf
            t = torch.randn(*shape[:-1], 2 * shape[-1], generator=g)[..., ::2].detach()
        else:
            t = torch.randn(*shape, generator=g)
        if nc:
            t = t.t()
        return t.requires_grad_(grad) if grad else t

    return mk


@prog(T(4, 4))
def ret_inplace(x):
    return x.add_(1)


@prog(T(4, 4))
def ret_view_after_mut(x):
    x.mul_(2)
    return x[1:]


@prog(T(4, 4, nc=True))
def mut_noncontig(x):
    x.add_(1)
    return x.sum(0)


@prog(T(4, 4))
def mut_through_view(x):
    x[0].fill_(3)
    x[:, 1] += 2
    return x * 1


@prog(T(4, 4))
def mut_transpose_view(x):
    x.t()[0].mul_(5)
    return x.clone()


@prog(T(4, 4))
def meta_mut(x):
    x.t_()
    return x + 1


@prog(T(4, 4))
def unsqueeze_mut(x):
    x.unsqueeze_(0)
    return x.shape[0] + x.sum()


@prog(T(4, 4), T(4, 4))
def out_is_other(x, y):
    y.copy_(x)
    return y


@prog(T(4, 4))
def ret_input_and_view(x):
    return x, x.view(16), x[1]


@prog(T(4, 4))
def ret_same_twice(x):
    y = x * 2
    return y, y


@prog(T(4, 4))
def ret_view_of_out(x):
    y = x * 2
    return y, y.t(), y[0]


@prog(T(3, 4))
def shapes_after_in_place_geometry(x):
    y = x * 2
    y.unsqueeze_(1)
    a = y.shape
    x.t_()
    b = x.shape, x.stride()
    z = y.squeeze_(1).transpose_(0, 1)
    return a, b, z.shape, z.stride(), z + 1


@prog(T(4, 4))
def shape_after_shrinking_resize(x):
    x.resize_(2, 3)
    return x.shape, x.stride(), x * 2


@prog(T(6))
def resize_(x):
    x.resize_(3)
    return x * 2


@prog(T(4, 4), T(4))
def index_put_inplace(x, v):
    x[torch.tensor([0, 2])] = v
    return x.sum()


@prog(T(4, 4))
def detach_mut(x):
    x.detach().add_(1)
    return x * 2


@prog(T(4, 4))
def set_data(x):
    y = x * 2
    x.data = y
    return x


@prog(T(3, 4))
def mut_after_read(x):
    a = x.sum()
    x.zero_()
    return a, x


@prog(T(8))
def overlap_self(x):
    x[1:].copy_(x[:-1].clone())
    return x


@prog(T(4, 4, grad=True))
def grad_clone_mut(x):
    y = x.clone()
    y.mul_(2)
    y[0] = 0
    return y.sum() + (y * x).sum()


@prog(T(4, 4, grad=True))
def grad_view_mut(x):
    y = x * 1
    v = y.view(16)
    v.add_(1)
    return y


# found by test_alias_fuzz.py (Note [Views taken under no_grad], Note [The root among the outputs
# first], the clone of a strided input that requires grad under dynamic=True)
@prog(T(6, grad=True, step=True))
def view_of_strided_grad_input(x):
    with torch.no_grad():
        x.clamp_(-0.5, 0.5)
    return x.view(1, 6).expand(3, 6), x, torch.relu(x) @ x


@prog(T(3, 6, grad=True))
def views_without_a_gradient_path(x):
    with torch.no_grad():
        v = x.view(1, 18)
        d = x.detach()
    return x, v, v.unsqueeze(0).expand(2, 1, 18), d


@prog(T(8, 5, 4), T(4, 4))
def intermediate_after_its_view(x, y):
    t = x * 1
    d = t.diagonal(-1, 1, 0)
    y.add_(d)
    return d, t


# test_alias_fuzz.py seed 563: the break at `x.data` hands the continuation `x` and `t` as two
# inputs sharing a storage though neither is a view (Note [Mutated inputs that share memory])
@prog(T(5, grad=True, step=True))
def data_read_after_fill(x):
    t = x.data
    with torch.no_grad():
        x.fill_(-2.0)
        u = t + 0
    return (u,)


# test_alias_fuzz.py seeds 686, 1051, 1198: a write through pieces of an input at a storage
# offset (Note [Pieces written back as slices] in kiln_aotgrad's functionalize.py)
@prog(T(2, 5, off=True))
def write_through_split_of_offset_input(x):
    with torch.no_grad():
        _, b = x.split(3, 1)
        c = b.add_(1.5)
        d = c.view(2, 2)
    return (d.shape,)


@prog(T(3, 6, off=True))
def write_through_pieces_of_offset_input(x):
    x.chunk(2, 1)[1].mul_(2)
    x.unbind(0)[2].add_(1)
    x.narrow(1, 1, 2).sub_(3)
    x.split_with_sizes([1, 2], 0)[1].mul_(-1)
    return x.sum()


# test_alias_fuzz.py seed 391: the gradient of as_strided after another view of an input (Note
# [as_strided after a view is replayed] in kiln_aotgrad's joint.py)
@prog(T(6, 5, grad=True))
def as_strided_of_a_narrow_view(x):
    return (x.narrow(1, 3, 1).as_strided((2, 2), (2, 1), 22),)


# test_alias_fuzz.py seed 681: a transposed intermediate written by index_put_, returned with a
# view of it (Note [A scatter's copy in eager's strides] in kiln_loopir's lowerings/memory.py)
@prog(T(6, 6, nc=True))
def index_put_into_a_transposed_intermediate(x):
    t = x * 0.5
    t.index_put_((torch.tensor([0, 1, 3, 4, 5]),), torch.full((5, 6), 4.0))
    return t.select(0, 4), t


def struct(outs, args):
    # aliasing relationships among outputs and args
    flat = outs if isinstance(outs, tuple) else (outs,)
    tens = [o for o in flat if isinstance(o, torch.Tensor)] + list(args)
    rel = []
    for i, a in enumerate(tens):
        for j, b in enumerate(tens):
            if i < j:
                rel.append((i, j, a is b, a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()))
    return rel


@pytest.mark.parametrize("dynamic", [None, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("f,spec", P, ids=[f.__name__ for f, _ in P])
def test_mutation_and_aliasing_match_eager(f, spec, dynamic) -> None:
    c = kiln.compile(f, dynamic=dynamic)
    for call in range(3):
        g1 = torch.Generator().manual_seed(call)
        g2 = torch.Generator().manual_seed(call)
        ae = [m(g1) for m in spec]
        ac = [m(g2) for m in spec]
        if any(a.requires_grad for a in ae):
            ae = [a.detach().requires_grad_(a.requires_grad) for a in ae]
            ac = [a.detach().requires_grad_(a.requires_grad) for a in ac]
        oe, oc = f(*ae), c(*ac)
        assert type(oe) is type(oc)
        fe = oe if isinstance(oe, tuple) else (oe,)
        fc = oc if isinstance(oc, tuple) else (oc,)
        for e, o in zip(fe, fc, strict=True):
            if isinstance(e, torch.Tensor):
                assert (o.shape, o.stride(), o.dtype, o.requires_grad) == (
                    e.shape,
                    e.stride(),
                    e.dtype,
                    e.requires_grad,
                )
                torch.testing.assert_close(o, e)
            else:
                assert type(o) is type(e) and o == e
        for e, o in zip(ae, ac, strict=True):
            assert (o.shape, o.stride()) == (e.shape, e.stride())
            torch.testing.assert_close(o.detach(), e.detach())
        assert struct(fc, ac) == struct(fe, ae)
        if any(isinstance(e, torch.Tensor) and e.requires_grad for e in fe):
            ge = torch.autograd.grad(
                sum(e.sum() for e in fe if isinstance(e, torch.Tensor) and e.requires_grad), ae
            )
            gc = torch.autograd.grad(
                sum(e.sum() for e in fc if isinstance(e, torch.Tensor) and e.requires_grad), ac
            )
            torch.testing.assert_close(gc, ge)


def _written_under_no_grad_then_untraceable(x0, b1):
    with torch.no_grad():
        x0.add_(2)
    t6 = b1.unfold(2, 2, 2)
    t6.masked_fill_(x0[2] > 0, 3.0)  # a write through unfold of a non-contiguous tensor (a split
    # was untraceable too until Note [Pieces written back as slices] in kiln_aotgrad)
    return t6


def test_a_graph_that_fails_to_compile_writes_its_inputs_once() -> None:
    """Found by test_alias_fuzz.py (seed 6): when aotgrad failed to compile the graph, the
    fallback ran the captured graph eagerly to see whether eager fails too, then ran it again for
    the result: `x0.add_(2)` was applied twice."""

    def mk():
        g = torch.Generator().manual_seed(0)
        return torch.randn(8, generator=g)[::2].requires_grad_(), torch.randn(5, 6, 3, generator=g).transpose(
            0, 2
        )

    ae, ac = mk(), mk()
    f = _written_under_no_grad_then_untraceable
    with pytest.warns(RuntimeWarning):
        oc = kiln.compile(f)(*ac)
    oe = f(*ae)
    torch.testing.assert_close(oc, oe)
    torch.testing.assert_close(ac, ae)


def _add_into_computed(h, x):
    h.add_(x)
    return h * 2


def _iadd_mul_into_computed(h, x):
    h += x.sin()
    h.mul_(3)
    return (h * h).sum(), h.is_leaf


def _clamp_into_computed_then_read(h, x):
    y = h + x  # saves nothing of h
    h.clamp_(min=0)
    return y, h.exp()


@pytest.mark.parametrize("dynamic", [None, True], ids=["static", "dynamic"])
@pytest.mark.parametrize(
    "f",
    [_add_into_computed, _iadd_mul_into_computed, _clamp_into_computed_then_read],
    ids=lambda f: f.__name__,
)
def test_in_place_writes_into_inputs_autograd_computed(f, dynamic) -> None:
    """Note [In-place writes into inputs autograd computed] (kiln_dynamo output.py): `h` is an
    autograd result (`w * 1.5`); the write compiles (no break), and the result, `h` after the
    call, `is_leaf` and the gradients of `w` and `x` are eager's."""
    c = kiln.compile(f, dynamic=dynamic)
    for call in range(3):
        g = torch.Generator().manual_seed(call)
        w, x = torch.randn(5, generator=g), torch.randn(5, generator=g)
        we, xe = w.clone().requires_grad_(), x.clone().requires_grad_()
        wc, xc = w.clone().requires_grad_(), x.clone().requires_grad_()
        he, hc = we * 1.5, wc * 1.5
        oe, oc = f(he, xe), c(hc, xc)
        assert type(oe) is type(oc)
        torch.testing.assert_close(
            oc[0] if isinstance(oc, tuple) else oc, oe[0] if isinstance(oe, tuple) else oe
        )
        if isinstance(oe, tuple):
            assert all(type(a) is type(b) for a, b in zip(oe, oc, strict=True))
            for a, b in zip(oe[1:], oc[1:], strict=True):
                if isinstance(a, torch.Tensor):
                    torch.testing.assert_close(b, a)
                else:
                    assert a == b
        torch.testing.assert_close(hc.detach(), he.detach())
        assert (hc.requires_grad, hc.is_leaf) == (he.requires_grad, he.is_leaf)
        out_e = oe[0] if isinstance(oe, tuple) else oe
        out_c = oc[0] if isinstance(oc, tuple) else oc
        torch.testing.assert_close(
            torch.autograd.grad(out_c.sum(), (wc, xc), allow_unused=True),
            torch.autograd.grad(out_e.sum(), (we, xe), allow_unused=True),
        )
    report = kiln.explain(f)((torch.randn(5, requires_grad=True) * 1.5), torch.randn(5, requires_grad=True))
    assert report.graph_count == 1 and not report.break_reasons, report
