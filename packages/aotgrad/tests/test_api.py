"""API behaviour: caching, inference path, errors with origins, double backward, dynamo, layering."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.fx
from aot_helpers import Recorder, assert_functional, check

import kiln_aotgrad
from kiln_aotgrad import AotgradError, aot_function


def _f(x: torch.Tensor) -> torch.Tensor:
    return (x.sin() * 2).sum(-1)


def test_recompiles_only_for_a_new_signature() -> None:
    rec = Recorder()
    cf = aot_function(_f, rec)
    for _ in range(3):
        cf(torch.randn(3, 4, requires_grad=True))
    assert len(cf.compiled) == 1 and len(rec.graphs) == 2  # forward + backward
    cf(torch.randn(5, 4, requires_grad=True))
    assert len(cf.compiled) == 2
    with torch.no_grad():
        cf(torch.randn(5, 4, requires_grad=True))
    assert len(cf.compiled) == 3 and len(rec.graphs) == 5  # + one inference graph


def test_separate_backward_and_inference_compilers() -> None:
    fw, bw, inf = Recorder(), Recorder(), Recorder()
    cf = aot_function(_f, fw, bw, inference_compiler=inf)
    cf(torch.randn(2, 2, requires_grad=True)).sum().backward()
    cf(torch.randn(2, 2))
    assert (len(fw.graphs), len(bw.graphs), len(inf.graphs)) == (1, 1, 1)
    assert any(n.name.startswith("tangents") for n in bw.graphs[0].graph.nodes)


def test_no_input_requires_grad_gives_one_graph() -> None:
    res = check(_f, torch.randn(3, 3))
    assert len(res.recorder.graphs) == 1


def test_unknown_partition_is_rejected() -> None:
    with pytest.raises(ValueError, match="partition"):
        aot_function(_f, Recorder(), partition="greedy")


def test_unsupported_op_names_op_and_user_line() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return x.nonzero()  # the line the error must name

    with pytest.raises(AotgradError) as info:
        aot_function(f, Recorder())(torch.randn(3))
    msg = str(info.value)
    assert "aten::nonzero" in msg and "test_api.py" in msg and "x.nonzero()" in msg


def test_error_uses_dynamo_source_line_metadata() -> None:
    class M(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.nonzero(x)

    gm = torch.fx.symbolic_trace(M())
    for n in gm.graph.nodes:
        if n.op == "call_function":
            n.meta["source_line"] = "model.py:42"
    with pytest.raises(AotgradError, match=r"aten::nonzero.*model\.py:42"):
        kiln_aotgrad.aot_eager(gm, [torch.randn(3)])(torch.randn(3))


def test_double_backward_is_a_clear_error() -> None:
    x = torch.randn(4, requires_grad=True)
    y = aot_function(_f, Recorder())(x.view(2, 2)).sum()
    with pytest.raises(AotgradError, match="double backward"):
        torch.autograd.grad(y, x, create_graph=True)


def test_first_order_backward_twice_with_retain_graph() -> None:
    x = torch.randn(3, requires_grad=True)
    y = aot_function(_f, Recorder())(x.view(1, 3)).sum()
    y.backward(retain_graph=True)
    first = x.grad.clone()  # type: ignore[union-attr]
    y.backward()
    torch.testing.assert_close(x.grad, 2 * first)


def test_dynamo_backend_end_to_end() -> None:
    import kiln_dynamo

    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        y = x @ w
        y.add_(1)
        return torch.relu(y).sum(-1) * 2

    x = torch.randn(3, 4, requires_grad=True)
    w = torch.randn(4, 5, requires_grad=True)
    out = kiln_dynamo.compile(f, backend=kiln_aotgrad.aot_eager)(x, w)
    ref = f(x, w)
    torch.testing.assert_close(out, ref)
    gx, gw = torch.autograd.grad(out.sum(), (x, w))
    rx, rw = torch.autograd.grad(ref.sum(), (x, w))
    torch.testing.assert_close(gx, rx)
    torch.testing.assert_close(gw, rw)


def test_dynamo_graph_nodes_keep_their_source_line() -> None:
    import kiln_dynamo

    fw = Recorder()

    def f(x: torch.Tensor) -> torch.Tensor:
        return x.cos() + 1

    kiln_dynamo.compile(f, backend=kiln_aotgrad.aot_backend(fw))(torch.randn(3))
    lines = {n.meta.get("source_line") for n in fw.graphs[0].graph.nodes if n.op == "call_function"}
    assert any(line and "test_api.py" in line for line in lines), lines


def test_custom_decompositions_extend_the_table() -> None:
    aten = torch.ops.aten

    def my_sin(x: torch.Tensor) -> torch.Tensor:
        return aten.cos.default(x - torch.pi / 2)

    rec = Recorder()
    out = aot_function(lambda x: x.sin(), rec, decompositions={aten.sin.default: my_sin})(torch.randn(4))
    assert out.shape == (4,)
    targets = {n.target for n in rec.graphs[0].graph.nodes if n.op == "call_function"}
    assert aten.cos.default in targets and aten.sin.default not in targets


def test_failing_decomposition_keeps_the_op_as_one_aten_call(caplog: pytest.LogCaptureFixture) -> None:
    """Note [One op kept when its decomposition fails]: the graph is still traced, with the
    operator itself in it (forward and backward), and the fallback log names it."""
    aten = torch.ops.aten

    def broken(x: torch.Tensor) -> torch.Tensor:
        y = aten.exp.default(x)  # recorded, then dead once the decomposition gives up
        raise RuntimeError(f"cannot decompose a tensor of rank {y.dim()}")

    def f(x: torch.Tensor) -> torch.Tensor:
        return (x.sin() * 2).sum()

    rec = Recorder()
    x = torch.randn(4, requires_grad=True)
    with caplog.at_level("INFO", logger="kiln.aotgrad.fallbacks"):
        out = aot_function(f, rec, decompositions={aten.sin.default: broken})(x)
    out.backward()
    torch.testing.assert_close(out, f(x))
    torch.testing.assert_close(x.grad, 2 * x.detach().cos())
    targets = {n.target for g in rec.graphs for n in g.graph.nodes if n.op == "call_function"}
    assert aten.sin.default in targets and aten.exp.default not in targets
    assert any("sin" in r.getMessage() and "rank 1" in r.getMessage() for r in caplog.records)


def test_a_failing_decomposition_that_wrote_an_input_is_not_kept() -> None:
    """Note [One op kept when its decomposition fails]: an operator whose schema says it writes
    nothing may still write its inputs (`native_batch_norm` writes its running statistics). When
    its decomposition fails after writing one, keeping the operator would run it on the written
    value: the trace fails instead, naming the operator. A write to a tensor the attempt itself
    made does not count."""
    aten = torch.ops.aten

    def writes_then_fails(x: torch.Tensor) -> torch.Tensor:
        x.add_(1)
        raise RuntimeError("gave up")

    def writes_own_then_fails(x: torch.Tensor) -> torch.Tensor:
        y = aten.mul.Tensor(x, 2)
        y.add_(1)
        raise RuntimeError("gave up")

    def f(x: torch.Tensor) -> torch.Tensor:
        return x.sin() * 2

    with pytest.raises(AotgradError, match=r"sin.*after writing to one of its inputs"):
        aot_function(f, Recorder(), decompositions={aten.sin.default: writes_then_fails})(torch.randn(4))
    x = torch.randn(4)
    out = aot_function(f, Recorder(), decompositions={aten.sin.default: writes_own_then_fails})(x)
    torch.testing.assert_close(out, f(x))


def test_log_artifacts(caplog: pytest.LogCaptureFixture) -> None:
    from kiln_aotgrad import logs

    assert logs.configure("aot_graphs,partition") == ["aot_graphs", "partition"]
    try:
        with caplog.at_level("INFO", logger="kiln.aotgrad"):
            aot_function(_f, Recorder())(torch.randn(2, 2, requires_grad=True))
    finally:
        logs.configure("")
    text = caplog.text
    assert "forward graph" in text and "backward graph" in text and "min_cut: saved" in text


@pytest.mark.parametrize("partition", ["min_cut", "default"])
def test_mutating_a_non_leaf_input_that_requires_grad(partition: str) -> None:
    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        y = (x * 3).exp() * w
        x.add_(1)
        return y * 2 + x

    leaf = torch.randn(5, requires_grad=True)
    w = torch.randn(5, requires_grad=True)
    x = leaf * 1
    out = aot_function(f, Recorder(), partition=partition)(x, w)
    gl, gw = torch.autograd.grad(out.sum(), (leaf, w))
    x_ref = leaf * 1
    ref = f(x_ref, w)
    rl, rw = torch.autograd.grad(ref.sum(), (leaf, w))
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(x, x_ref)
    torch.testing.assert_close(gl, rl)
    torch.testing.assert_close(gw, rw)


def test_module_train_eval_switch_recompiles() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    cm = kiln_aotgrad.aot_module(model, Recorder())
    x = torch.randn(8, 4)
    train_out = cm(x)
    model.eval()
    eval_out = cm(x)
    torch.testing.assert_close(eval_out, model(x))
    assert len(cm.compiled) == 2
    assert not torch.allclose(train_out, eval_out)


def test_dynamo_module_with_batchnorm_and_dropout() -> None:
    import copy

    import kiln_dynamo

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(), torch.nn.Dropout(0.2)
    )
    mine = copy.deepcopy(model)
    compiled = kiln_dynamo.compile(mine, backend=kiln_aotgrad.aot_eager)
    x = torch.randn(2, 3, 6, 6, requires_grad=True)
    torch.manual_seed(1)
    ref = model(x)
    torch.manual_seed(1)
    out = compiled(x)
    torch.testing.assert_close(out, ref)
    g_ref = torch.autograd.grad(ref.sum(), [x, *model.parameters()])
    g_out = torch.autograd.grad(out.sum(), [x, *mine.parameters()])
    for a, b in zip(g_ref, g_out, strict=True):
        torch.testing.assert_close(b, a)
    for (name, a), b in zip(model.named_buffers(), mine.buffers(), strict=True):
        torch.testing.assert_close(b, a, msg=name)


def split_heads(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Three outputs that are views of one intermediate, none a view of another (graph breaks
    produce such graphs: attention's q, k, v cross the break)."""
    q, k, v = (x @ w).split(4, dim=-1)
    return q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)


def test_outputs_sharing_an_intermediate_get_their_own_gradients() -> None:
    check(split_heads, torch.randn(3, 5, requires_grad=True), torch.randn(5, 12, requires_grad=True))


def test_guarded_callers_skip_the_signature_but_not_grad_mode_or_viewed_offsets() -> None:
    """Note [Guarded callers]: after the first compile a guarded function reuses it without a
    signature lookup, yet a change of grad mode, or of the storage offset of an input that an
    output is a view of, still finds (or compiles) the right artifacts."""

    def fn(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return (x * w).sin(), x[1:]

    gm = torch.fx.symbolic_trace(fn)
    compiler = Recorder()
    f = kiln_aotgrad.aot_backend(compiler)(gm, [])
    assert f.guarded
    x, w = torch.randn(4, 3), torch.randn(4, 3, requires_grad=True)
    for _ in range(3):
        got = f(x, w)
        torch.testing.assert_close(got, fn(x, w))
        assert got[1]._base is x or got[1].data_ptr() == x[1:].data_ptr()
    assert len(f.compiled) == 1 and f._only is not None
    with torch.no_grad():  # grad mode is not assumed: an inference graph is compiled
        torch.testing.assert_close(f(x, w), fn(x, w))
    assert len(f.compiled) == 2
    big = torch.randn(5, 3)
    shifted = big[1:]  # same shape and strides, another storage offset
    got = f(shifted, w)
    torch.testing.assert_close(got, fn(shifted, w))
    assert got[1].data_ptr() == shifted[1:].data_ptr()


@pytest.mark.parametrize("index", [torch.tensor(4), torch.tensor([[0, 8], [3, -1]])], ids=["0-dim", "2-d"])
def test_take_traces_without_reading_its_index(index: torch.Tensor) -> None:
    """kiln's `take` entry: torch._decomp's read a 0-dim index as a Python int (data)."""
    # (inference only: take's backward formula calls aten.put, outside the core operator set)
    check(lambda x, i: torch.take(x, i) * 2, torch.randn(3, 3), index)


class _ChannelsLastForward:
    """A forward compiler that leaves its free outputs channels-last and says so, as
    kiln_loopir's CompiledGraph does (Note [Saved activations in the forward's layout])."""

    def __init__(self) -> None:
        self.free: tuple[int, ...] = ()
        self.bw_inputs: list[torch.Tensor] = []
        self.output_strides: list[tuple[int, ...] | None] = []

    def fw(self, gm: torch.fx.GraphModule, inputs: list[object]) -> object:
        self.free = tuple(gm.meta.get("free_layout_outputs", ()))

        def run(*args: torch.Tensor) -> object:
            outs = list(gm(*args))
            for i in self.free:
                if isinstance(outs[i], torch.Tensor) and outs[i].dim() == 4:
                    outs[i] = outs[i].contiguous(memory_format=torch.channels_last)
            return outs

        fake_outs = [n.meta["val"] for n in gm.graph.find_nodes(op="output")[0].args[0]]
        self.output_strides = [
            tuple(o.contiguous(memory_format=torch.channels_last).stride())
            if i in self.free and isinstance(o, torch.Tensor) and o.dim() == 4
            else (tuple(o.stride()) if isinstance(o, torch.Tensor) else None)
            for i, o in enumerate(fake_outs)
        ]
        run.output_strides = self.output_strides  # type: ignore[attr-defined]
        return run

    def bw(self, gm: torch.fx.GraphModule, inputs: list[object]) -> object:
        self.bw_inputs = [x for x in inputs if isinstance(x, torch.Tensor)]
        return gm


def test_saved_activations_reach_the_backward_compiler_in_the_forwards_layout() -> None:
    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.conv2d(x, w).relu().sum()

    x = torch.randn(2, 3, 6, 6, requires_grad=True)
    w = torch.randn(4, 3, 3, 3, requires_grad=True)
    comp = _ChannelsLastForward()
    out = aot_function(f, comp.fw, comp.bw)(x, w)
    out.backward()
    assert comp.free and min(comp.free) == 1  # after the one user output: the saved values
    four_d = [t for t in comp.bw_inputs if t.dim() == 4 and t.shape[1] > 1]
    assert any(t.stride()[1] == 1 for t in four_d), [t.stride() for t in four_d]  # restrided NHWC
    gx, gw = torch.autograd.grad(f(x, w), (x, w))
    torch.testing.assert_close(x.grad, gx)
    torch.testing.assert_close(w.grad, gw)


def test_a_forward_compiler_that_says_nothing_keeps_eagers_strides_for_the_backward() -> None:
    x = torch.randn(2, 3, 6, 6, requires_grad=True)
    w = torch.randn(4, 3, 3, 3, requires_grad=True)
    seen: list[torch.Tensor] = []

    def bw(gm: torch.fx.GraphModule, inputs: list[object]) -> object:
        seen.extend(t for t in inputs if isinstance(t, torch.Tensor))
        return gm

    aot_function(lambda x, w: torch.nn.functional.conv2d(x, w).relu().sum(), lambda gm, _: gm, bw)(
        x, w
    ).backward()
    assert seen and all(t.is_contiguous() for t in seen)


def _user_output_saved(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    y = torch.nn.functional.conv2d(x, w).relu()
    return y, (y * y).sum()  # saves y, a user output


def _activation_saved(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    y = torch.nn.functional.conv2d(x, w).relu()
    return y.sum(1), (y * y).sum()


@pytest.mark.parametrize("f", [_user_output_saved, _activation_saved])
def test_the_backward_is_told_which_inputs_the_compiled_forward_laid_out(f: Any) -> None:
    """Note [Backward inputs the forward laid out]: the saved values the compiled forward computed
    are listed under the backward graph's meta key; the forward's inputs among the saved values,
    a saved user output and the tangents are not; a forward that says nothing lists none."""
    x = torch.randn(2, 3, 6, 6, requires_grad=True)
    w = torch.randn(4, 3, 3, 3, requires_grad=True)
    comp = _ChannelsLastForward()
    seen: list[torch.fx.GraphModule] = []

    def bw(gm: torch.fx.GraphModule, inputs: list[object]) -> object:
        seen.append(gm)
        return comp.bw(gm, inputs)

    fn = aot_function(f, comp.fw, bw)
    fn(x, w)[1].backward()
    (gm,) = seen
    laid_out = gm.meta.get("laid_out_inputs", ())
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    art = next(iter(fn.compiled.values()))
    assert art.partition is not None
    saved = art.partition.saved
    fw_out = next(n for n in art.partition.fw.graph.nodes if n.op == "output").args[0]
    n_out = len(fw_out) - len(saved)
    for i in range(len(placeholders)):
        node = fw_out[n_out + i] if i < len(saved) else None
        computed = node is not None and node.op != "placeholder" and node not in fw_out[:n_out]
        assert (i in laid_out) == computed, (i, node, laid_out)
    if f is _activation_saved:
        assert laid_out, saved
    else:  # y is saved, and returned to the user
        assert not laid_out and "relu_default" in saved, saved
    gx, gw = torch.autograd.grad(f(x, w)[1], (x, w))
    torch.testing.assert_close(x.grad, gx)
    torch.testing.assert_close(w.grad, gw)

    seen.clear()
    x.grad = w.grad = None
    aot_function(f, lambda gm, _: gm, bw)(x, w)[1].backward()  # no output_strides: nothing listed
    assert "laid_out_inputs" not in seen[0].meta


class _PaddedForward:
    """A forward compiler that leaves its free 2-D outputs as slices of padded rows and says so,
    as a padded GEMM's result leaves kiln_loopir's CompiledGraph."""

    def __init__(self) -> None:
        self.bw_inputs: list[torch.Tensor] = []

    @staticmethod
    def padded(t: torch.Tensor) -> torch.Tensor:
        return torch.zeros(t.shape[0], t.shape[1] + 1, dtype=t.dtype)[:, : t.shape[1]].copy_(t)

    def fw(self, gm: torch.fx.GraphModule, inputs: list[object]) -> object:
        free = tuple(gm.meta.get("free_layout_outputs", ()))

        def run(*args: torch.Tensor) -> object:
            outs = list(gm(*args))
            return [self.padded(o) if i in free and o.dim() == 2 else o for i, o in enumerate(outs)]

        fake_outs = [n.meta["val"] for n in gm.graph.find_nodes(op="output")[0].args[0]]
        run.output_strides = [  # type: ignore[attr-defined]
            (o.shape[1] + 1, 1) if i in free and o.dim() == 2 else tuple(o.stride())
            for i, o in enumerate(fake_outs)
        ]
        return run


def test_a_saved_value_left_in_strides_the_backward_was_not_compiled_for_is_not_laid_out() -> None:
    """Note [Only the strides the backward was compiled for are laid out]: a saved (2, 3) value the
    forward leaves with rows of 4 keeps eager's strides in the backward, so it is not listed as
    laid out (the GPU wrapper would check its offset alone and read the padded rows as dense)."""
    x, w = torch.randn(2, 5, requires_grad=True), torch.randn(5, 3, requires_grad=True)
    comp = _PaddedForward()
    seen: list[tuple[torch.fx.GraphModule, list[torch.Tensor]]] = []

    def bw(gm: torch.fx.GraphModule, inputs: list[object]) -> object:
        seen.append((gm, [t for t in inputs if isinstance(t, torch.Tensor)]))
        return gm

    aot_function(lambda x, w: (x @ w).sigmoid().sum(), comp.fw, bw)(x, w).backward()
    ((gm, inputs),) = seen
    laid_out = gm.meta.get("laid_out_inputs", ())
    saved_2d = [i for i, t in enumerate(inputs) if t.dim() == 2 and tuple(t.shape) == (2, 3)]
    assert saved_2d and all(inputs[i].stride() == (3, 1) for i in saved_2d), [t.stride() for t in inputs]
    assert not set(saved_2d) & set(laid_out), (saved_2d, laid_out)
    gx, gw = torch.autograd.grad((x @ w).sigmoid().sum(), (x, w))
    torch.testing.assert_close(x.grad, gx)
    torch.testing.assert_close(w.grad, gw)


@pytest.mark.parametrize("make", ["dense", "channels_last", "gapped", "expanded", "offset"])
def test_a_saved_value_copied_before_a_write_back_keeps_its_strides(make: str) -> None:
    """The one copy the training runner makes of a saved value (it shares memory with an input the
    forward writes) keeps the value's strides, dense or not (Note [Backward inputs the forward laid
    out]); its storage offset becomes 0."""
    from kiln_aotgrad.runtime import _copy_strided

    base = torch.randn(2, 3, 4, 5)
    t = {
        "dense": base,
        "channels_last": base.contiguous(memory_format=torch.channels_last),
        "gapped": base[:, ::2, :, 1:4],
        "expanded": torch.randn(3, 1).expand(3, 4),
        "offset": base.view(-1)[7:31].view(4, 6).t(),
    }[make]
    got = _copy_strided(t)
    assert got.shape == t.shape and got.stride() == t.stride() and got.storage_offset() == 0
    assert got.untyped_storage().data_ptr() != t.untyped_storage().data_ptr()
    torch.testing.assert_close(got, t)


def _checked(x: torch.Tensor) -> torch.Tensor:
    torch._assert_async((x > -100).all(), "values out of range")
    return x * 2


def test_a_run_time_assertion_is_not_dead_code() -> None:
    """`torch._assert_async` has no output, but raising is its effect: dead-code elimination keeps
    it, so the compiled function raises where eager raises (before, it was dropped)."""
    rec = Recorder()
    cf = aot_function(_checked, rec)
    torch.testing.assert_close(cf(torch.ones(3)), torch.ones(3) * 2)
    assert any("_assert_async" in str(n.target) for n in rec.graphs[0].graph.nodes)
    with pytest.raises(RuntimeError, match="values out of range"):
        cf(torch.full((3,), -200.0))


def test_a_run_time_assertion_stays_in_the_training_forward() -> None:
    """The partitioner keeps an assertion nothing reads in the forward graph (it took only what
    the forward's outputs and the saved values need, and dropped it)."""
    rec = Recorder()
    cf = aot_function(lambda x: _checked(x).sum(), rec)
    x = torch.ones(3, requires_grad=True)
    cf(x).backward()
    forward = rec.graphs[0]
    assert any("_assert_async" in str(n.target) for n in forward.graph.nodes), forward.code
    with pytest.raises(RuntimeError, match="values out of range"):
        cf(torch.full((3,), -200.0, requires_grad=True))


def _reads_a_gather_never(x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
    t = x[i]  # nothing reads it  # noqa: F841
    u = torch.embedding(x, i)  # noqa: F841
    return x * 2


@pytest.mark.parametrize("grad", [False, True], ids=["inference", "training"])
def test_a_gather_never_read_keeps_its_bounds_check(grad: bool) -> None:
    # Note [Dead gathers keep their bounds check] (tracer.py): eager raises IndexError for an
    # index out of range; the dead gather was dropped and the compiled function returned
    rec = Recorder()
    cf = aot_function(_reads_a_gather_never, rec)
    x = torch.randn(5, 3, requires_grad=grad)
    out = cf(x, torch.tensor([4, 0]))
    torch.testing.assert_close(out, x * 2)
    graph = rec.graphs[0]
    assert_functional(graph)
    assert sum("_assert_async" in str(n.target) for n in graph.graph.nodes) == 2, graph.code
    with pytest.raises(IndexError):
        _reads_a_gather_never(x, torch.tensor([5]))
    with pytest.raises(IndexError):
        cf(x, torch.tensor([5]))


def _gathers_in_its_backward(x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
    return x[i].sum()


def test_a_backward_formulas_gathers_are_not_checked() -> None:
    # the backward's indices are the forward's, checked there: no check of its own
    rec = Recorder()
    x = torch.randn(5, 3, requires_grad=True)
    aot_function(_gathers_in_its_backward, rec)(x, torch.tensor([4, 0])).backward()
    assert not any("_assert_async" in str(n.target) for g in rec.graphs for n in g.graph.nodes)


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.randn(8, 4)[::2].detach().requires_grad_(),  # a strided slice
        lambda: torch.randn(4, 1).requires_grad_().expand(4, 4),  # stride 0 (a non-leaf)
        lambda: torch.randn(4, 4).t().detach().requires_grad_(),  # dense, transposed
    ],
    ids=["strided", "expanded", "transposed"],
)
def test_an_input_that_requires_grad_keeps_its_strides_in_the_forward(make: Callable[[], Any]) -> None:
    # Note [A clone with its input's strides]: a code generator compiles the forward's loads for
    # the placeholder's layout; the frame's guard checks the real input's, so they must agree
    # (a strided slice's placeholder was contiguous: a kernel then read the wrong elements)
    w, x = make(), torch.randn(4, 4)
    rec = Recorder()
    out = aot_function(lambda x, w: x * w + 1, rec)(x, w)  # check() would clone w contiguous
    torch.testing.assert_close(out, x * w + 1)
    placeholder = [n for n in rec.graphs[0].graph.nodes if n.op == "placeholder"][1]
    assert placeholder.meta["val"].stride() == w.stride()
    (grad,) = torch.autograd.grad(out.sum(), w)
    torch.testing.assert_close(grad, torch.autograd.grad((x * w + 1).sum(), w)[0])


def test_a_gradient_only_an_unread_output_reaches_is_none_as_in_eager() -> None:
    # Note [Gradients that no read output reaches]: eager leaves w2.grad None when the loss reads
    # only the first output; a zero gradient would let weight decay and momentum move w2
    def f(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, w3: torch.Tensor) -> Any:
        h = x @ w1
        return h.relu(), torch.layer_norm(h @ w2, [4]) * 2, (h @ w3).sum()

    x = torch.randn(3, 4)
    ws = [torch.randn(4, 4, requires_grad=True) for _ in range(3)]
    ref = [w.detach().clone().requires_grad_() for w in ws]
    cf = aot_function(f, Recorder())
    a, _, c = cf(x, *ws)
    (a.sum() + c).backward()
    ea, _, ec = f(x, *ref)
    (ea.sum() + ec).backward()
    assert ws[1].grad is None and ref[1].grad is None
    for w, r in zip([ws[0], ws[2]], [ref[0], ref[2]], strict=True):
        torch.testing.assert_close(w.grad, r.grad)
    # all outputs read: every gradient, as before
    for w in ws:
        w.grad = None
    a, b, c = cf(x, *ws)
    (a.sum() + b.sum() + c).backward()
    assert all(w.grad is not None for w in ws)


def _no_grad_matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        y = x @ w
    return y.relu() * 2


def _no_grad_matmul_and_a_detached_one(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
    with torch.no_grad():
        y = x @ w
    return y @ w.t(), x.detach() @ w, x[0]


@pytest.mark.parametrize("f", [_no_grad_matmul, _no_grad_matmul_and_a_detached_one])
def test_an_inference_graph_of_inputs_that_require_grad_runs_without_grad(f: Any) -> None:
    """Note [Inference graphs of inputs that require grad]: no output requires grad, so the graph
    has no backward; its compiled code runs in no_grad (the Recorder's graph, run in grad mode,
    recorded history: its output required grad where eager's did not)."""
    modes: list[bool] = []

    def compiler(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        def run(*args: Any) -> Any:
            modes.append(torch.is_grad_enabled())
            return gm(*args)

        return run

    x, w = torch.randn(4, 4, requires_grad=True), torch.randn(4, 4)
    res = check(f, x, w)
    assert len(res.recorder.graphs) == 1  # an inference graph
    out = aot_function(f, compiler)(x, w)
    assert modes == [False]
    expected = f(x, w)
    flat = out if isinstance(out, tuple) else (out,)
    flat_e = expected if isinstance(expected, tuple) else (expected,)
    assert [t.requires_grad for t in flat] == [t.requires_grad for t in flat_e]


@pytest.mark.parametrize(
    ("fn", "x", "op"),
    [
        (lambda x: torch.frac(x) + 1, torch.arange(4), "aten::frac"),
        (lambda x: x.masked_fill(x > 0, 1e6) * 2, torch.ones(2, dtype=torch.float16), "aten::masked_fill"),
        (
            lambda x: torch.nn.functional.threshold(x, 1, 300.5),
            torch.arange(3, dtype=torch.int8),
            "aten::threshold",
        ),
    ],
    ids=["frac of ints", "masked_fill beyond float16", "threshold beyond int8"],
)
def test_an_op_eager_refuses_is_kept_whole(fn: Callable[..., Any], x: torch.Tensor, op: str) -> None:
    """Note [Decompositions keep eager's errors]: torch's entries computed these from ops eager
    takes (`x - trunc(x)`, a `where` of an inf `scalar_tensor`), so kiln returned values where
    eager raises; the op is recorded whole for the next layer to leave to eager's kernel."""
    with pytest.raises((RuntimeError, NotImplementedError)):
        fn(x)
    rec = Recorder()
    with pytest.raises((RuntimeError, NotImplementedError)):  # the recorded graph runs eager's kernel
        aot_function(fn, rec)(x)
    (gm,) = rec.graphs
    assert_functional(gm)
    assert op in [str(n.target._schema.name) for n in gm.graph.nodes if n.op == "call_function"]


def test_an_op_eager_takes_is_still_decomposed() -> None:
    rec = Recorder()
    x = torch.ones(2, dtype=torch.float16)
    aot_function(lambda x: x.masked_fill(x > 0, 100.0), rec)(x)
    (gm,) = rec.graphs
    names = [str(n.target._schema.name) for n in gm.graph.nodes if n.op == "call_function"]
    assert "aten::masked_fill" not in names and "aten::where" in names, names


@pytest.mark.parametrize("op", [torch.var_mean, torch.std_mean])
@pytest.mark.parametrize("keepdim", [True, False])
def test_var_mean_over_every_dim_keeps_its_dims(op: Callable[..., Any], keepdim: bool) -> None:
    """aotgrad's var_mean split: over every dim (dim None) with keepdim, the mean keeps each dim
    as size 1, as eager's does (std_mean's mean came back 0-d, its variance (1, 1, 1))."""
    x = torch.randn(2, 3, 4, requires_grad=True)
    check(lambda x: op(x, dim=None, correction=0, keepdim=keepdim), x)
    check(lambda x: op(x, dim=None, correction=0, keepdim=keepdim), x, no_grad=True)


def _nested_autocast(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = x @ w
    with torch.autocast("cpu", enabled=False):
        z = x.float() @ w.float()
    return y, z, z.softmax(-1)


def test_a_compiled_graph_runs_outside_the_callers_autocast_region() -> None:
    """Note [Compiled graphs run outside autocast]: the casts are in the trace; run inside a
    float16 region, the compiled matmuls were cast again to the region's dtype (float16 for the
    program's bfloat16 block, float16 for its float32 block: softmax off by 0.9)."""
    torch.manual_seed(0)
    x, w = torch.randn(8, 8), torch.randn(8, 8, requires_grad=True)
    cf = aot_function(_nested_autocast, Recorder())
    for _ in range(2):
        with torch.autocast("cpu", dtype=torch.float16):
            expected, got = _nested_autocast(x, w), cf(x, w)
        assert (
            [t.dtype for t in got]
            == [t.dtype for t in expected]
            == [torch.bfloat16, torch.float32, torch.float32]
        )
        for e, g in zip(expected, got, strict=True):
            torch.testing.assert_close(g, e)
        # the backward runs outside the region, as the trace assumed
        ge = torch.autograd.grad(expected[0].float().sum(), w)
        gg = torch.autograd.grad(got[0].float().sum(), w)
        torch.testing.assert_close(gg, ge)


def test_default_dtype_and_autocast_are_part_of_the_signature() -> None:
    """Note [Global state in the signature]: an unguarded caller changing either got the first
    trace's dtypes."""

    def f(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return x @ w, torch.ones(2), torch.arange(3) / 2

    cf = aot_function(f, Recorder())
    x, w = torch.randn(3, 3), torch.randn(3, 3)
    dtype = torch.get_default_dtype()
    try:
        for state in ["plain", "autocast", "float64", "plain"]:
            torch.set_default_dtype(torch.float64 if state == "float64" else torch.float32)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=state == "autocast"):
                expected, got = f(x, w), cf(x, w)
            assert [t.dtype for t in got] == [t.dtype for t in expected], state
    finally:
        torch.set_default_dtype(dtype)
    assert len(cf.compiled) == 3
