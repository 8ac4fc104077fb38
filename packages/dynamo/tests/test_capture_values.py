"""Python values read from tensors and objects made inside the compiled frame (issue 16): `int(t)`,
`float(t)` of a tensor built from Python numbers (folded, Note [Tensors computed from constants]),
each compared with eager and counted (graphs, breaks)."""

from __future__ import annotations

import pytest
import torch
from conftest import CountingBackend, check

import kiln_dynamo


def t(*shape: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(7 * sum(shape) + 3)
    return torch.randn(*shape, generator=g)


def _int_of_constant(x: torch.Tensor) -> torch.Tensor:
    n = torch.tensor(3)
    return x * int(n) + int(torch.tensor(2.7))


def _float_of_computed_constant(x: torch.Tensor) -> torch.Tensor:
    scale = torch.tensor([0.5, 1.5]).sum() / 4
    return x * float(scale)


def _int_of_size_tensor(x: torch.Tensor) -> torch.Tensor:
    # a tensor of a static size (DeBERTa's `torch.tensor(min(q.size(-2), k.size(-2)))`)
    span = torch.tensor(min(x.size(0), x.size(1)))
    return x[: int(span) - 1]


def _complex_and_index(x: torch.Tensor) -> torch.Tensor:
    k = torch.tensor(2)
    return x * complex(torch.tensor(1.5)).real + x[int(k)]


def _bool_int_of_bool(x: torch.Tensor) -> torch.Tensor:
    flag = torch.tensor(True)
    return x + int(flag) if bool(flag) else x


@pytest.mark.parametrize(
    "fn",
    [
        _int_of_constant,
        _float_of_computed_constant,
        _int_of_size_tensor,
        _complex_and_index,
        _bool_int_of_bool,
    ],
)
def test_python_numbers_of_constant_tensors_fold(fn) -> None:
    check(fn, t(4, 3))


def test_python_number_types_are_eagers() -> None:
    def f(x: torch.Tensor) -> tuple[torch.Tensor, int, float]:
        n = torch.tensor(4)
        return x + 1, int(n), float(n)

    check(f, t(3))


def test_int_of_data_stays_a_break_with_its_reason() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return x * int(x.sum() > 0)

    report = kiln_dynamo.explain(f)(t(3))
    assert report.graph_break_count == 1
    assert "int() of a tensor" in str(report.break_reasons[0])
    torch.testing.assert_close(report.result, f(t(3)))


def test_int_of_a_many_element_constant_breaks_as_eager_raises() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return x * int(torch.tensor([1, 2]))

    report = kiln_dynamo.explain(f)
    with pytest.raises((RuntimeError, ValueError)):
        report(t(3))


class _LazyScale(torch.nn.Module):
    """A weight made on the first call, from the input's width (a lazily built layer)."""

    def __init__(self) -> None:
        super().__init__()
        self.scale: torch.nn.Parameter | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.tanh()
        if self.scale is None:
            self.scale = torch.nn.Parameter(torch.full((x.shape[-1],), 0.5))
        return (h * self.scale).sum()


def test_parameter_made_in_the_frame_is_one_clean_break_with_eagers_leaf() -> None:
    """Note [Parameters made in the frame]: the parameter is eager's own object (type, leaf,
    `.grad` after backward), made by one break with its reason; the rest of the frame compiles."""
    x = t(2, 3)
    eager, compiled_model = _LazyScale(), _LazyScale()
    report = kiln_dynamo.explain(compiled_model)(x)
    assert (report.graph_count, report.graph_break_count) == (2, 1)
    assert "nn.Parameter(...) made inside the compiled frame" in str(report.break_reasons[0])
    ref = eager(x)
    torch.testing.assert_close(report.result, ref)
    assert type(compiled_model.scale) is torch.nn.Parameter and compiled_model.scale.is_leaf
    report.result.backward()
    ref.backward()
    assert eager.scale is not None and compiled_model.scale.grad is not None
    torch.testing.assert_close(compiled_model.scale.grad, eager.scale.grad)


def test_parameter_made_in_the_frame_returned() -> None:
    def f(x: torch.Tensor) -> tuple[torch.Tensor, torch.nn.Parameter]:
        return x + 1, torch.nn.Parameter(x * 2)

    x = t(3)
    report = kiln_dynamo.explain(f)(x)
    ref = f(x)
    assert report.graph_break_count == 1
    assert type(report.result[1]) is torch.nn.Parameter and report.result[1].requires_grad
    torch.testing.assert_close(report.result[1], ref[1])


class _HooksOnFirstCall(torch.nn.Module):
    """transformers' output capturing in miniature: the first call registers a forward hook on a
    child that records its output, then runs the child, whose output the hook must see."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = torch.nn.Linear(3, 3)
        self.installed = False
        self.seen: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.tanh()
        if not self.installed:
            self.inner.register_forward_hook(lambda m, args, out: self.seen.append(out * 2))
            self.installed = True
        return self.inner(h) + 1


def test_module_hook_registered_in_the_frame_is_traced_and_runs() -> None:
    """Note [Module hooks registered in the frame]: the registration is traced, the child's call
    after it runs the new hook (its output recorded as eager records it) in the same graph, and
    the second call, with the hook in place, is one graph again."""
    x = t(2, 3)
    eager = _HooksOnFirstCall()
    compiled_model = _HooksOnFirstCall()
    compiled_model.load_state_dict(eager.state_dict())
    report = kiln_dynamo.explain(compiled_model)(x)
    assert (report.graph_count, report.graph_break_count) == (1, 0), report.break_reasons
    ref = eager(x)
    torch.testing.assert_close(report.result, ref)
    assert len(compiled_model.seen) == len(eager.seen) == 1
    torch.testing.assert_close(compiled_model.seen[0], eager.seen[0])
    assert len(compiled_model.inner._forward_hooks) == len(eager.inner._forward_hooks) == 1
    again = kiln_dynamo.explain(compiled_model)(x)
    assert (again.graph_count, again.graph_break_count) == (1, 0)
    torch.testing.assert_close(again.result, eager(x))
    assert len(compiled_model.seen) == len(eager.seen) == 2
    torch.testing.assert_close(compiled_model.seen[1], eager.seen[1])


class _LstmLm(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(20, 8)
        self.rnn = torch.nn.LSTM(8, 16, batch_first=True)
        self.head = torch.nn.Linear(16, 20)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.embed(ids) * 2)
        return self.head(out).log_softmax(-1)


def test_recurrent_modules_on_cuda_are_one_clean_break(monkeypatch: pytest.MonkeyPatch) -> None:
    """Note [Recurrent modules on CUDA]: the module call breaks (its cuDNN kernel runs eagerly);
    the layers before and after it compile, and the answer is eager's. The CUDA condition is
    stood in for on the CPU (the predicate is what decides)."""
    from kiln_dynamo.variables import nn_module

    model = _LstmLm().eval()
    ids = torch.randint(0, 20, (2, 5), generator=torch.Generator().manual_seed(1))
    assert not nn_module.runs_cudnn_rnn(model.rnn)  # CPU weights: traced as before
    assert not nn_module.runs_cudnn_rnn(model.head)
    monkeypatch.setattr(nn_module, "runs_cudnn_rnn", lambda m: isinstance(m, torch.nn.RNNBase))
    kiln_dynamo.reset()
    backend = CountingBackend()
    compiled = kiln_dynamo.compile(model, backend=backend)
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(compiled(ids), model(ids))
    assert backend.graphs == 2, backend.graphs  # the embedding, then the head
    reasons = [str(r) for r in kiln_dynamo.counters.break_reasons]
    assert any("cuDNN" in r and "LSTM" in r for r in reasons), reasons
