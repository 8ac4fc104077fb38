"""The layering rules of ../shared/DESIGN.md, checked by reading every product source file's imports.

A package may import only the sibling packages in its "depends on" column, and no product package
may import the parts of torch that kiln writes itself. `torch.compile` may be called only by
kiln_bench (it is the baseline kiln is measured against). The rules are data (the tables below);
`check_tree` walks `packages/*/src/**/*.py` with `ast` and returns every violation with its file
and line.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

# import name -> sibling import names it may use (DESIGN.md, "depends on" column).
ALLOWED_SIBLINGS: dict[str, frozenset[str]] = {
    "kiln_frame_hook": frozenset(),
    "kiln_symbolic": frozenset(),
    "kiln_dynamo": frozenset({"kiln_frame_hook", "kiln_symbolic"}),
    "kiln_aotgrad": frozenset({"kiln_dynamo", "kiln_symbolic"}),
    "kiln_loopir": frozenset({"kiln_symbolic"}),
    "kiln_codegen_cpp": frozenset({"kiln_loopir"}),
    "kiln_codegen_triton": frozenset({"kiln_loopir"}),
    "kiln": frozenset(
        {
            "kiln_frame_hook",
            "kiln_dynamo",
            "kiln_aotgrad",
            "kiln_loopir",
            "kiln_codegen_cpp",
            "kiln_codegen_triton",
        }
    ),
    "kiln_bench": frozenset({"kiln"}),
}

# Packages that may not import torch at all (the frame hook needs CPython only).
NO_TORCH = frozenset({"kiln_frame_hook"})

# Third-party top-level modules each package may import, besides the standard library: exactly
# its pyproject's non-sibling dependencies (a test keeps the two in step).
ALLOWED_THIRD_PARTY: dict[str, frozenset[str]] = {
    "kiln_frame_hook": frozenset(),
    "kiln_symbolic": frozenset({"torch", "sympy"}),
    "kiln_dynamo": frozenset({"torch", "sympy"}),
    "kiln_aotgrad": frozenset({"torch", "networkx"}),
    "kiln_loopir": frozenset({"torch", "sympy"}),
    "kiln_codegen_cpp": frozenset({"torch", "sympy"}),
    "kiln_codegen_triton": frozenset({"torch", "triton", "sympy"}),
    "kiln": frozenset({"torch"}),
    "kiln_bench": frozenset({"torch", "transformers", "matplotlib", "tqdm"}),
}

# torch modules that kiln writes itself and never imports in a product package.
FORBIDDEN_TORCH = (
    "torch._dynamo",
    "torch._inductor",
    "torch._functorch",
    "torch.fx.experimental.proxy_tensor",
    "torch.fx.experimental.symbolic_shapes",
    "torch.fx.experimental.sym_node",
    "torch._subclasses",
    "torch.export",
    "torch._C._dynamo",
    "torch._guards",
)

# Only this package may call torch.compile.
MAY_CALL_TORCH_COMPILE = frozenset({"kiln_bench"})


@dataclass(frozen=True, slots=True)
class Violation:
    path: Path
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}"


def _forbidden_torch(module: str) -> str | None:
    for bad in FORBIDDEN_TORCH:
        if module == bad or module.startswith(bad + "."):
            return bad
    return None


def _dotted(node: ast.expr) -> str | None:
    """`torch._dynamo.config` -> "torch._dynamo.config"; None for anything not a dotted name."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _imported_modules(tree: ast.AST) -> list[tuple[int, str]]:
    """Every module a file imports, as (line, dotted name); `from a import b` yields a and a.b."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
            found.extend((node.lineno, f"{node.module}.{alias.name}") for alias in node.names)
        elif (
            isinstance(node, ast.Call)
            and (_dotted(node.func) or "").split(".")[-1] in ("import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.append((node.lineno, node.args[0].value))
    return found


def check_file(path: Path, package: str) -> list[Violation]:
    tree = ast.parse(path.read_text(), filename=str(path))
    violations: list[Violation] = []
    allowed = ALLOWED_SIBLINGS[package] | {package}
    for line, module in _imported_modules(tree):
        top = module.split(".")[0]
        if top in ALLOWED_SIBLINGS and top not in allowed:
            violations.append(
                Violation(path, line, f"{package} imports {module}: {top} is not in its depends-on list")
            )
        if (
            top not in ALLOWED_SIBLINGS
            and top not in sys.stdlib_module_names
            and top not in ALLOWED_THIRD_PARTY[package]
            and not (top == "torch" and package in NO_TORCH)  # reported below, in its own words
        ):
            violations.append(
                Violation(
                    path, line, f"{package} imports {module}: {top} is not one of its declared dependencies"
                )
            )
        if top == "torch" and package in NO_TORCH:
            violations.append(Violation(path, line, f"{package} imports {module}: it must not use torch"))
        bad = _forbidden_torch(module)
        if bad is not None:
            violations.append(Violation(path, line, f"{package} imports {module}: kiln writes {bad} itself"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            name = _dotted(node)
            if name is None:
                continue
            if name == "torch.compile" and package not in MAY_CALL_TORCH_COMPILE:
                violations.append(
                    Violation(path, node.lineno, f"{package} uses torch.compile: only kiln_bench may")
                )
            bad = _forbidden_torch(name)
            if bad is not None and name.count(".") == bad.count("."):
                violations.append(
                    Violation(path, node.lineno, f"{package} uses {name}: kiln writes it itself")
                )
        elif (
            isinstance(node, ast.ImportFrom)
            and node.module == "torch"
            and any(alias.name == "compile" for alias in node.names)
            and package not in MAY_CALL_TORCH_COMPILE
        ):
            violations.append(
                Violation(path, node.lineno, f"{package} imports torch.compile: only kiln_bench may")
            )
    return violations


def check_tree(root: Path) -> list[Violation]:
    """Check every `packages/*/src/<import name>/**/*.py` under root."""
    violations: list[Violation] = []
    for src in sorted(root.glob("packages/*/src/*")):
        package = src.name
        if not src.is_dir() or package not in ALLOWED_SIBLINGS:
            continue
        for path in sorted(src.rglob("*.py")):
            violations.extend(check_file(path, package))
    return sorted(set(violations), key=lambda v: (str(v.path), v.line, v.message))
