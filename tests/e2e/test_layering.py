"""The layering rules hold for the real tree, and the checker catches planted violations."""

from __future__ import annotations

import re
import shutil
import textwrap
import tomllib
from pathlib import Path

import layering

ROOT = Path(__file__).resolve().parents[2]


def test_real_tree_has_no_violations() -> None:
    violations = layering.check_tree(ROOT)
    assert violations == [], "\n".join(map(str, violations))


def test_every_package_is_covered() -> None:
    # A new package must be added to the table, or the checker would ignore it.
    import_names = {
        p.name for p in ROOT.glob("packages/*/src/*") if p.is_dir() and not p.name.endswith("info")
    }
    assert import_names == set(layering.ALLOWED_SIBLINGS)


def test_declared_dependencies_match_the_layering_table() -> None:
    dist_to_import = {}
    declared = {}
    for pyproject in ROOT.glob("packages/*/pyproject.toml"):
        project = tomllib.loads(pyproject.read_text())["project"]
        (import_name,) = [
            p.name for p in (pyproject.parent / "src").iterdir() if p.is_dir() and "." not in p.name
        ]
        dist_to_import[project["name"]] = import_name
        declared[import_name] = [re.split(r"[<>=!~ ]", r, maxsplit=1)[0] for r in project["dependencies"]]
    for import_name, reqs in declared.items():
        siblings = {dist_to_import[r] for r in reqs if r in dist_to_import}
        assert siblings == layering.ALLOWED_SIBLINGS[import_name], import_name
        third_party = {r for r in reqs if r not in dist_to_import}
        assert third_party == layering.ALLOWED_THIRD_PARTY[import_name], import_name


def _plant(tmp_path: Path, package_folder: str, import_name: str, source: str) -> Path:
    tree = tmp_path / "tree"
    shutil.copytree(
        ROOT / "packages", tree / "packages", ignore=shutil.ignore_patterns("build", "*.egg-info")
    )
    planted = tree / "packages" / package_folder / "src" / import_name / "planted.py"
    planted.write_text(textwrap.dedent(source))
    return tree


def test_planted_violations_are_caught(tmp_path: Path) -> None:
    tree = _plant(
        tmp_path,
        "loopir",
        "kiln_loopir",
        """\
        import torch
        import kiln_dynamo
        from kiln_codegen_cpp import something
        from torch._inductor import ir
        import torch._functorch.partitioners as p
        from torch.fx.experimental import proxy_tensor
        import importlib
        guards = importlib.import_module("torch._guards")
        import networkx

        def f(x):
            return torch.compile(x), torch._dynamo.reset()
        """,
    )
    found = [(v.path.name, v.line, v.message) for v in layering.check_tree(tree)]
    assert found == [
        ("planted.py", 2, "kiln_loopir imports kiln_dynamo: kiln_dynamo is not in its depends-on list"),
        (
            "planted.py",
            3,
            "kiln_loopir imports kiln_codegen_cpp.something: kiln_codegen_cpp is not in its depends-on list",
        ),
        (
            "planted.py",
            3,
            "kiln_loopir imports kiln_codegen_cpp: kiln_codegen_cpp is not in its depends-on list",
        ),
        ("planted.py", 4, "kiln_loopir imports torch._inductor.ir: kiln writes torch._inductor itself"),
        ("planted.py", 4, "kiln_loopir imports torch._inductor: kiln writes torch._inductor itself"),
        (
            "planted.py",
            5,
            "kiln_loopir imports torch._functorch.partitioners: kiln writes torch._functorch itself",
        ),
        (
            "planted.py",
            6,
            "kiln_loopir imports torch.fx.experimental.proxy_tensor: "
            "kiln writes torch.fx.experimental.proxy_tensor itself",
        ),
        ("planted.py", 8, "kiln_loopir imports torch._guards: kiln writes torch._guards itself"),
        ("planted.py", 9, "kiln_loopir imports networkx: networkx is not one of its declared dependencies"),
        ("planted.py", 12, "kiln_loopir uses torch._dynamo: kiln writes it itself"),
        ("planted.py", 12, "kiln_loopir uses torch.compile: only kiln_bench may"),
    ]


def test_torch_in_frame_hook_is_caught(tmp_path: Path) -> None:
    tree = _plant(tmp_path, "frame_hook", "kiln_frame_hook", "import torch\n")
    found = [v.message for v in layering.check_tree(tree)]
    assert found == ["kiln_frame_hook imports torch: it must not use torch"]


def test_bench_may_call_torch_compile_but_not_reach_into_inductor(tmp_path: Path) -> None:
    tree = _plant(
        tmp_path,
        "bench",
        "kiln_bench",
        """\
        import torch
        from torch import compile
        import kiln
        import kiln_loopir
        y = torch.compile(kiln)
        z = torch._inductor.config
        """,
    )
    found = [(v.line, v.message) for v in layering.check_tree(tree)]
    assert found == [
        (4, "kiln_bench imports kiln_loopir: kiln_loopir is not in its depends-on list"),
        (6, "kiln_bench uses torch._inductor: kiln writes it itself"),
    ]
