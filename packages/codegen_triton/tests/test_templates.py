"""Matmul templates with fused epilogues (Note [Matmul templates] in templates.py).

Under Triton's interpreter (CI) the template is forced (``matmul_templates="force"``: the first
config, no timing) on CPU tensors; the small shapes are odd so that every tile has masked rows,
columns and a ragged last K step. On a GPU machine the same tests run on CUDA tensors, and the
CUDA-only tests run the real choice: every candidate timed at the first call, the fastest kept
and its record read back by a second compile. Select them all with ``-k template``.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import sympy
import torch
from triton_check import DEVICES, check

from kiln_codegen_triton import TritonBackend, check_triton_options, counters
from kiln_codegen_triton.templates import (
    GPU_CONFIGS,
    TEMPLATE_MARGIN,
    GemmConfig,
    MatmulChoice,
    TemplateUnsupported,
    gemm_configs,
    problem_of,
)
from kiln_loopir import compile_graph
from kiln_loopir.ir import ExternKernel, ExternOutput, InputBuffer
from kiln_loopir.layout import FixedLayout
from kiln_loopir.scheduler import TemplateSchedulerNode
from kiln_loopir.testing import trace

aten = torch.ops.aten

M, K, N = 37, 29, 45  # none a multiple of the interpreter's 16-wide tiles


def gelu_bias(x: Any, w: Any, b: Any, r: Any) -> Any:
    # addmm whose readers are pointwise: loopir lowers it to mm + a lazy bias add (Note [Bias
    # after the GEMM]), so bias, GELU and the residual add are the epilogue
    return aten.add.Tensor(aten.gelu.default(aten.addmm.default(b, x, w)), r)


def relu_bias(x: Any, w: Any, b: Any, r: Any) -> Any:
    return aten.relu.default(aten.add.Tensor(aten.mm.default(x, w), b))


def residual(x: Any, w: Any, b: Any, r: Any) -> Any:
    return aten.add.Tensor(aten.mm.default(x, w), r)


def to_float(x: Any, w: Any, b: Any, r: Any) -> Any:
    # the epilogue converts (a half product read in float32 by what follows)
    return aten.mul.Tensor(aten._to_copy.default(aten.mm.default(x, w), dtype=torch.float32), 2.0)


EPILOGUES = {"gelu_bias": gelu_bias, "relu_bias": relu_bias, "residual": residual, "to_float": to_float}
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _inputs(dtype: torch.dtype, batch: int | None = None) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    lead = () if batch is None else (batch,)
    return [
        torch.randn(*lead, M, K, generator=g).to(dtype),
        torch.randn(*lead, K, N, generator=g).to(dtype),
        torch.randn(N, generator=g).to(dtype),
        torch.randn(*lead, M, N, generator=g).to(dtype),
    ]


def _forced(**kwargs: Any) -> TritonBackend:
    return TritonBackend(mode="max-autotune-no-cudagraphs", matmul_templates="force", **kwargs)


def check_gemm(
    fn: Any, *inputs: torch.Tensor, device: str, backend: TritonBackend, calls: int = 1
) -> TritonBackend:
    """``check`` for a graph with a GEMM. In bfloat16/float16 the template sums K in another
    order than eager's kernel, so its product may round to the neighbouring value, and an
    epilogue that cancels (a residual add) or widens (to float32) shows that ulp far beyond the
    output dtype's tolerance; so with half inputs the output (dtype, shape, device as eager's)
    must be no further from the float64 answer than twice eager's own distance from it, plus one
    ulp of the largest output. On a GPU float32 is compared that way too (cuBLAS and the template
    sum K in different orders; TF32 as torch's setting says)."""
    if inputs[0].dtype not in (torch.bfloat16, torch.float16) and device == "cpu":
        return check(fn, *inputs, device=device, backend=backend, calls=calls)
    gm = trace(fn)
    moved = [t.to(device) for t in inputs]
    compiled = compile_graph(gm, moved, backend=backend)
    eager = gm(*moved)
    exact = gm(*[t.double() for t in moved])
    ulp = torch.finfo(inputs[0].dtype).eps * float(exact.abs().max())
    eager_error = float((eager.double() - exact).abs().max())
    for _ in range(calls):
        got = compiled(*moved)
        assert (got.dtype, got.shape, got.device) == (eager.dtype, eager.shape, eager.device)
        assert float((got.double() - exact).abs().max()) <= 2 * eager_error + ulp
    assert backend.last_declined == [], backend.last_declined
    return backend


def _template_ran(backend: TritonBackend, count: int = 1) -> None:
    assert len(backend.last_templates) == count, backend.last_wrapper
    for choice in backend.last_templates:
        assert isinstance(choice.chosen, GemmConfig), choice.chosen


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("epilogue", sorted(EPILOGUES))
def test_template_mm_epilogues(epilogue: str, dtype: torch.dtype, device: str) -> None:
    backend = check_gemm(EPILOGUES[epilogue], *_inputs(dtype), device=device, backend=_forced())
    _template_ran(backend)
    # the product never reaches memory: the wrapper calls the choice, not the extern op
    assert "_t0(" in backend.last_wrapper or "_t1(" in backend.last_wrapper, backend.last_wrapper
    assert "_op_" not in backend.last_wrapper


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_template_bmm_epilogue(dtype: torch.dtype, device: str) -> None:
    def fn(x: Any, w: Any, b: Any, r: Any) -> Any:
        return aten.mul.Tensor(aten.add.Tensor(aten.bmm.default(x, w), r), 0.5)

    _template_ran(check_gemm(fn, *_inputs(dtype, batch=3), device=device, backend=_forced()))


@pytest.mark.parametrize("device", DEVICES)
def test_template_transposed_operands(device: str) -> None:
    # x @ w.t() (a linear layer's weight) and a bmm of a transposed key: strided operands
    def linear(x: Any, w: Any) -> Any:
        return aten.relu.default(aten.mm.default(x, aten.t.default(w)))

    def scores(q: Any, k: Any) -> Any:
        return aten.mul.Tensor(aten.bmm.default(q, aten.transpose.int(k, 1, 2)), 0.125)

    g = torch.Generator().manual_seed(1)
    _template_ran(
        check(
            linear,
            torch.randn(M, K, generator=g),
            torch.randn(N, K, generator=g),
            device=device,
            backend=_forced(),
        )
    )
    q, k = torch.randn(2, M, K, generator=g), torch.randn(2, N, K, generator=g)
    _template_ran(check(scores, q, k, device=device, backend=_forced()))


@pytest.mark.parametrize("device", DEVICES)
def test_template_addmm_bias_in_the_template(device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # an addmm that stays whole (here: by telling the lowering its readers are not pointwise)
    # adds its bias in the template, before the product is rounded
    from kiln_loopir.lowerings import linalg

    monkeypatch.setattr(linalg, "_readers_are_pointwise", lambda node, depth=0: False)
    for dtype in (torch.float32, torch.bfloat16):
        x, w, b, r = _inputs(dtype)
        backend = check_gemm(gelu_bias, x, w, b, r, device=device, backend=_forced())
        _template_ran(backend)
        assert backend.last_templates[0].template.problem.op == "addmm"  # type: ignore[union-attr]
        b2 = b.reshape(1, N)  # a [1, N] bias broadcasts over rows the same way
        _template_ran(check_gemm(gelu_bias, x, w, b2, r, device=device, backend=_forced()))


@pytest.mark.parametrize("device", DEVICES)
def test_template_extern_path_matches(device: str) -> None:
    # the other candidate of the same node: the extern call, then the epilogue kernel
    backend = TritonBackend(mode="max-autotune-no-cudagraphs", matmul_templates="extern")
    check_gemm(gelu_bias, *_inputs(torch.bfloat16), device=device, backend=backend, calls=2)
    assert [c.chosen for c in backend.last_templates] == ["extern"]


@pytest.mark.parametrize("device", DEVICES)
def test_template_not_formed(device: str) -> None:
    def two_readers(x: Any, w: Any, b: Any, r: Any) -> Any:
        y = aten.mm.default(x, w)
        return aten.relu.default(y), aten.sum.dim_IntList(y, [0])

    def transposed_read(x: Any, w: Any, b: Any, r: Any) -> Any:
        y = aten.mm.default(x, w)  # square: the epilogue reads y and y.t() together
        return aten.add.Tensor(y, aten.t.default(y))

    inputs = _inputs(torch.float32)
    # the default mode never forms template nodes, and the option turns them off
    for backend in (TritonBackend(), TritonBackend(mode="max-autotune", matmul_templates=False)):
        check(gelu_bias, *inputs, device=device, backend=backend)
        assert backend.last_templates == [] and "_op_" in backend.last_wrapper
    # the product read by two kernels (one a reduction): no epilogue joins the GEMM, which is
    # a lone template (below)
    backend = check(two_readers, *inputs, device=device, backend=_forced())
    assert [c.template.lone for c in backend.last_templates if c.template is not None] == [True]
    # a read of the product away from where a program computes it: the node runs as extern +
    # kernel, with the same result
    g = torch.Generator().manual_seed(2)
    x, w = torch.randn(N, K, generator=g), torch.randn(K, N, generator=g)
    backend = check(transposed_read, x, w, inputs[2], inputs[3], device=device, backend=_forced())
    assert backend.last_templates == [] and "_op_" in backend.last_wrapper


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_template_lone_gemms(dtype: torch.dtype, device: str) -> None:
    # a GEMM no epilogue joins (its result is an output, or read by another extern) is a
    # template of its own that stores the product where the extern's result would be
    def outputs(x: Any, w: Any, b: Any, r: Any) -> Any:
        y = aten.mm.default(x, w)
        return y, aten.addmm.default(b, x, w), aten.mm.default(aten.t.default(y), r)

    def batched(x: Any, w: Any, b: Any, r: Any) -> Any:
        return aten.bmm.default(x, w)

    # the template and the extern sum K in different orders (on the CPU too: the third GEMM reads
    # the first one's product, 1 element in 2025 was 1.2e-5 off with atol 1e-5): compared with
    # float64, no further off than eager's own result is
    backend = _forced()
    gm = trace(outputs)
    inputs = [t.to(device) for t in _inputs(dtype)]
    got, want = compile_graph(gm, inputs, backend=backend)(*inputs), gm(*inputs)
    exact = gm(*[t.double() for t in inputs])
    for g, w, e in zip(got, want, exact, strict=True):
        assert (g.dtype, g.shape) == (w.dtype, w.shape)
        ulp = torch.finfo(dtype).eps * float(e.abs().max())
        assert float((g.double() - e).abs().max()) <= 2 * float((w.double() - e).abs().max()) + ulp
    _template_ran(backend, 3)
    assert all(c.template is not None and c.template.lone for c in backend.last_templates)
    assert "_op_" not in backend.last_wrapper
    _template_ran(check_gemm(batched, *_inputs(dtype, batch=2), device=device, backend=_forced()))


def test_template_option() -> None:
    # kiln.compile's triton_options take the switch as a bool; the test-only values are
    # constructor arguments
    assert check_triton_options({"matmul_templates": False}) == {"matmul_templates": False}
    with pytest.raises(ValueError):
        check_triton_options({"matmul_templates": "force"})
    with pytest.raises(ValueError):
        TritonBackend(matmul_templates="sometimes")
    assert not TritonBackend(mode="max-autotune", matmul_templates=False).wants_templates()
    assert not TritonBackend().wants_templates()  # the default mode: never


def test_template_decisions_logged(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # KILN_LOG=autotune says which GEMMs became template nodes, and why others stay extern
    def two(x: Any, w: Any, b: Any, r: Any) -> Any:
        return aten.relu.default(aten.mm.default(x, w)), aten.mm.default(
            aten._to_copy.default(x, dtype=torch.float64), aten._to_copy.default(w, dtype=torch.float64)
        )

    monkeypatch.setenv("KILN_LOG", "autotune")
    with caplog.at_level(logging.DEBUG, logger="kiln.codegen_triton.autotune"):
        compile_graph(trace(two), _inputs(torch.float32), backend=_forced())
    text = caplog.text
    assert "become one template node" in text
    assert "stays extern: dtype torch.float64" in text


def test_template_scheduler_node() -> None:
    # loopir's side: one node for the extern and its epilogue, the product never allocated
    inputs = _inputs(torch.float32)
    backend = _forced()
    compiled = compile_graph(trace(gelu_bias), inputs, backend=backend)
    nodes = [n for n in compiled.schedule.nodes if isinstance(n, TemplateSchedulerNode)]
    assert len(nodes) == 1
    product = nodes[0].extern.node.outputs[0].name
    assert product not in compiled.schedule.plan.allocate
    assert compiled.stats.extern_calls == 0
    # the interpreter backend (no templates) schedules the same graph with the extern node
    plain = compile_graph(trace(gelu_bias), inputs)
    assert not any(isinstance(n, TemplateSchedulerNode) for n in plain.schedule.nodes)
    assert plain.stats.extern_calls == 1


def test_template_refuses_symbolic_sizes() -> None:
    s0 = sympy.Symbol("s0", integer=True, positive=True)
    cpu = torch.device("cpu")
    a = InputBuffer(
        "a", FixedLayout(cpu, torch.float32, (s0, sympy.Integer(8)), (sympy.Integer(8), sympy.Integer(1)))
    )
    b = InputBuffer(
        "b",
        FixedLayout(
            cpu, torch.float32, (sympy.Integer(8), sympy.Integer(4)), (sympy.Integer(4), sympy.Integer(1))
        ),
    )
    out = ExternOutput(
        "buf0",
        FixedLayout(cpu, torch.float32, (s0, sympy.Integer(4)), (sympy.Integer(4), sympy.Integer(1))),
        kernel="buf0",
    )
    kernel = ExternKernel("buf0", aten.mm.default, (a, b), {}, (out,))
    with pytest.raises(TemplateUnsupported, match="symbolic"):
        problem_of(kernel)


def test_template_configs_fit_the_problem() -> None:
    gpu = gemm_configs(4096, 768, 3072, torch.bfloat16, interpreter=False)
    assert gpu == list(GPU_CONFIGS)  # a large problem takes every candidate as it is
    # float32 halves BLOCK_K; a small problem shrinks every tile and drops duplicates
    fp32 = gemm_configs(4096, 768, 3072, torch.float32, interpreter=False)
    assert [c.BLOCK_K for c in fp32] == [c.BLOCK_K // 2 for c in GPU_CONFIGS]
    small = gemm_configs(20, 8, 8, torch.bfloat16, interpreter=False)
    assert all(c.BLOCK_M <= 32 and c.BLOCK_N == 16 and c.BLOCK_K == 16 for c in small)
    assert len(set(small)) == len(small)


def test_template_compiles_for_sm90(cache_root: str) -> None:
    # the GPU path without a GPU: the templates compile to a cubin for an H100/H200, with their
    # half-precision dots on the tensor cores (gpu_compile_templates.py, as test_gpu_compile.py)
    env = {**os.environ, "TRITON_INTERPRET": "0", "KILN_CACHE_DIR": os.path.join(cache_root, "gpu-templates")}
    script = Path(__file__).with_name("gpu_compile_templates.py")
    done = subprocess.run(
        [sys.executable, str(script)],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=script.parent,
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    compiled = [line for line in done.stdout.splitlines() if line.startswith("ok ")]
    assert len(compiled) == 9 and all("wgmma" in line for line in compiled if "fp32" not in line), done.stdout


def test_template_choice_timed_and_cached(monkeypatch: pytest.MonkeyPatch) -> None:
    # the decision on a GPU, without one: do_bench and the two ways are stand-ins, the choice,
    # its record on disk, the record read back and a corrupt record are the real code
    import triton.testing

    backend = _forced()
    device = "cuda" if torch.cuda.is_available() else "cpu"  # CPU tensors need the interpreter
    compile_graph(trace(gelu_bias), [t.to(device) for t in _inputs(torch.float32)], backend=backend)
    made = backend.last_templates[0]
    assert made.template is not None
    first, *_ = made.template.configs
    fake = {"extern": 2.0, first.label(): 1.0}
    ran: list[str] = []

    def choice_with() -> MatmulChoice:
        choice = MatmulChoice(
            made.kernel, made.epilogue, made.template, made.fn, force=None, pointers=True, conform=lambda r: r
        )
        monkeypatch.setattr(choice, "run_extern", lambda *a: ran.append("extern"))
        monkeypatch.setattr(choice, "template_runner", lambda c: lambda *a: ran.append(c.label()))
        return choice

    def bench(fn: Any, **kwargs: Any) -> float:
        fn()
        return fake.get(ran[-1], 3.0)  # on a GPU more configs are candidates: all slower

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "a stand-in GPU")
    monkeypatch.setattr(triton.testing, "do_bench", bench)
    timed = counters["autotuned"]
    choice = choice_with()
    choice(0, (), (), ())
    timings = {k: choice.timings_ms[k] for k in fake}
    assert choice.chosen == first and timings == fake and counters["autotuned"] == timed + 1
    assert ran[-1] == first.label()  # and the call itself ran the template
    # a second node of the same source reads the record: no timing
    monkeypatch.setattr(triton.testing, "do_bench", lambda *a, **k: pytest.fail("timed again"))
    hits = counters["autotune_hits"]
    again = choice_with()
    again(0, (), (), ())
    assert again.chosen == first and counters["autotune_hits"] == hits + 1
    # a damaged record is reported and timed again; a template barely faster loses to extern
    records = list((Path(os.environ["KILN_CACHE_DIR"]) / "triton" / "autotune").glob("*.json"))
    record = next(r for r in records if made.template.name in r.read_text())
    record.write_text("{not json")
    fake = {"extern": 1.0, first.label(): 0.98}  # faster, but within TEMPLATE_MARGIN
    monkeypatch.setattr(triton.testing, "do_bench", bench)
    corrupt = counters["corrupt"]
    third = choice_with()
    third(0, (), (), ())
    assert third.chosen == "extern" and counters["corrupt"] == corrupt + 1 and ran[-1] == "extern"


# ----------------------------------------------------------------------------- CUDA only

cuda_only = pytest.mark.skipif(not torch.cuda.is_available(), reason="times candidates on a GPU")


def best_config(choice: MatmulChoice, label: str) -> GemmConfig:
    assert choice.template is not None
    return next(c for c in choice.template.configs if c.label() == label)


@cuda_only
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_template_autotune_cuda(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(3)
    m, k, n = 512, 768, 3072
    x = torch.randn(m, k, generator=g).to(dtype)
    w = torch.randn(k, n, generator=g).to(dtype) * 0.05
    b = torch.randn(n, generator=g).to(dtype)
    r = torch.randn(m, n, generator=g).to(dtype)
    backend = TritonBackend(mode="max-autotune-no-cudagraphs")
    check_gemm(gelu_bias, x, w, b, r, device="cuda", backend=backend)
    assert len(backend.last_templates) == 1
    choice: MatmulChoice = backend.last_templates[0]
    timings = choice.timings_ms
    assert "extern" in timings and len(timings) >= 2, timings
    best = min((label for label in timings if label != "extern"), key=lambda label: timings[label])
    template_wins = timings[best] < TEMPLATE_MARGIN * timings["extern"]
    assert choice.chosen == (best_config(choice, best) if template_wins else "extern")
    # a second compile of the same graph reads the choice back instead of timing
    hits = counters["autotune_hits"]
    again = TritonBackend(mode="max-autotune-no-cudagraphs")
    check_gemm(gelu_bias, x, w, b, r, device="cuda", backend=again)
    assert counters["autotune_hits"] > hits
    assert again.last_templates[0].chosen == choice.chosen


@cuda_only
def test_template_cuda_graphs() -> None:
    # mode="max-autotune": the choice is made at the warm-up call, then recorded and replayed
    backend = TritonBackend(mode="max-autotune")
    check_gemm(gelu_bias, *_inputs(torch.bfloat16), device="cuda", backend=backend, calls=3)
    assert len(backend.last_templates) == 1 and backend.last_templates[0].chosen is not None
