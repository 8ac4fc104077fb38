"""nox sessions for the kiln monorepo.

Every package is tested in a virtual environment that holds only that package and what its
pyproject.toml declares (siblings included, installed from this checkout): that is what proves
each layer stands alone. `nox -t tests` runs every test session; `nox -s typecheck lint` checks the
whole tree.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import tomllib
from pathlib import Path

import nox

ROOT = Path(__file__).parent
PACKAGES_DIR = ROOT / "packages"

# torch is pinned to the CPU build of 2.13.0 that lies on this kind of machine's disk (pip finds it
# through /opt/wheels). Any other pin, or no pin, makes pip pull a CUDA build of several GB. The
# packages themselves accept torch 2.11-2.13.
TORCH = "torch==2.13.0"
# triton is pinned to the wheel on this kind of machine's disk; CI runs Triton kernels through
# its interpreter (TRITON_INTERPRET=1), so any triton >= 3.6 would do, and the GPU machine has its
# own (3.6) preinstalled.
TRITON = "triton==3.8.0"
# The checkers are pinned too: a new release may add rules and turn a green tree red.
RUFF = "ruff==0.17.6"
MYPY = "mypy==2.4.1"
# Test sessions spread their tests over the machine's cores (pytest-xdist, one worker a core;
# `KILN_TEST_WORKERS=N` for N workers, 0 for one process as before). Serially the suites took 80 of
# CI's 90 minutes on a 2-core machine in the thirtieth session; every test keeps its own cache and
# temporary folders, so workers do not meet.
XDIST = "pytest-xdist==3.8.0"

nox.options.sessions = []  # nothing runs by default: say -t tests, or name sessions
nox.options.error_on_missing_interpreters = True


def _python312() -> str:
    """Python 3.12 for the frame hook's second session.

    pyenv's `python3.12` shim answers only when 3.12 is activated, so look for the interpreter
    itself first; nox accepts an absolute path.
    """
    found = sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.12.*/bin/python3.12")))
    return found[-1] if found else "3.12"


def _package_meta() -> dict[str, tuple[str, list[str]]]:
    """folder -> (distribution name, declared requirements), read from each pyproject.toml."""
    meta = {}
    for pyproject in sorted(PACKAGES_DIR.glob("*/pyproject.toml")):
        project = tomllib.loads(pyproject.read_text())["project"]
        meta[pyproject.parent.name] = (project["name"], list(project.get("dependencies", [])))
    return meta


PACKAGES = _package_meta()
FOLDER_OF_DIST = {dist: folder for folder, (dist, _) in PACKAGES.items()}


def _requirement_name(req: str) -> str:
    return re.split(r"[\s<>=!~;\[]", req, maxsplit=1)[0]


def _sibling_closure(folder: str) -> list[str]:
    """The folder itself and every sibling it depends on, dependencies first."""
    order: list[str] = []

    def visit(f: str) -> None:
        if f in order:
            return
        for req in PACKAGES[f][1]:
            dep = FOLDER_OF_DIST.get(_requirement_name(req))
            if dep is not None:
                visit(dep)
        order.append(f)

    visit(folder)
    return order


def _needs_torch(folders: list[str]) -> bool:
    return any(_requirement_name(r) == "torch" for f in folders for r in PACKAGES[f][1])


def _needs_triton(folders: list[str]) -> bool:
    return any(_requirement_name(r) == "triton" for f in folders for r in PACKAGES[f][1])


def _install_packages(session: nox.Session, folders: list[str]) -> None:
    if _needs_torch(folders):
        session.install(TORCH)
    if _needs_triton(folders):
        session.install(TRITON)
    # numpy and expecttest: what PyTorch's OpInfo database (torch.testing._internal) imports
    session.install(*[str(PACKAGES_DIR / f) for f in folders], "pytest", XDIST, "numpy", "expecttest")


def _pytest(session: nox.Session, *args: str, env: dict[str, str] | None = None) -> None:
    """pytest over the given paths, its tests spread over the workers `XDIST`'s note describes."""
    workers = os.environ.get("KILN_TEST_WORKERS", "auto")
    spread = [] if workers == "0" else ["-n", workers]
    session.run("pytest", "-q", *spread, *args, env=env or {})


def _free_virtualenv(session: nox.Session) -> None:
    """Delete a test session's virtual environment once its tests have run.

    Every session installs its own torch (about 1 GB, 2 GB with triton or transformers); eleven of
    them kept side by side filled CI's disk ("No space left on device" in the last session). So
    `nox -t tests` holds one environment at a time. `KILN_NOX_KEEP_VENVS=1` keeps them, for
    `nox -r` reuse while working on one package.
    """
    if os.environ.get("KILN_NOX_KEEP_VENVS") == "1":
        return
    location = getattr(session.virtualenv, "location", None)
    if location and os.path.isdir(location):
        shutil.rmtree(location, ignore_errors=True)


def _run_package_tests(session: nox.Session, folder: str) -> None:
    try:
        _install_packages(session, _sibling_closure(folder))
        env = {}
        if folder == "codegen_triton":
            # No GPU in CI: Triton kernels run on CPU tensors through Triton's interpreter.
            env["TRITON_INTERPRET"] = "1"
        _pytest(session, str(PACKAGES_DIR / folder / "tests"), *session.posargs, env=env)
    finally:
        _free_virtualenv(session)


for _folder in PACKAGES:

    def _make(folder: str) -> None:
        @nox.session(name=f"tests-{folder}", python="3.11", tags=["tests"])
        def _tests(session: nox.Session) -> None:
            _run_package_tests(session, folder)

    _make(_folder)


@nox.session(name="tests-capture-3.12", python=_python312(), tags=["tests"])
def tests_capture_312(session: nox.Session) -> None:
    """The frame hook and the capture layer under CPython 3.12 (bytecode and frame layout differ
    from 3.11: comprehensions inlined, new opcodes), one environment, one pytest per package."""
    try:
        _install_packages(session, _sibling_closure("dynamo"))
        for folder in ("frame_hook", "dynamo"):
            _pytest(session, str(PACKAGES_DIR / folder / "tests"), *session.posargs)
    finally:
        _free_virtualenv(session)


@nox.session(name="tests-e2e", python="3.11", tags=["tests"])
def tests_e2e(session: nox.Session) -> None:
    """The umbrella installed with everything under it; end-to-end tests and the layering rules."""
    try:
        _install_packages(session, _sibling_closure("bench"))
        _pytest(session, str(ROOT / "tests" / "e2e"), *session.posargs)
        # dynamo's transformers ModelOutput cases: its own session has no transformers, this one does.
        _pytest(session, str(PACKAGES_DIR / "dynamo" / "tests" / "test_model_output.py"))
    finally:
        _free_virtualenv(session)


@nox.session(python="3.11")
def demo(session: nox.Session) -> None:
    """The main job: compile a small GPT-2-style model on CPU with kiln, check it against eager,
    and compare its speed with eager and torch.compile (kiln_bench.demo)."""
    _install_packages(session, _sibling_closure("bench"))
    session.run("python", "-m", "kiln_bench.demo", *session.posargs)


@nox.session(python="3.11")
def bench(session: nox.Session) -> None:
    """The public model suite on CPU: eager vs torch.compile vs kiln, inference and training.

    Writes packages/bench/results/<date>-<host>.{json,png}. Pass arguments after `--` to
    `python -m kiln_bench` (e.g. `nox -s bench -- --models gpt2,mlp`).
    """
    _install_packages(session, _sibling_closure("bench"))
    import datetime
    import platform

    stamp = f"{datetime.date.today().isoformat()}-{platform.node() or 'host'}"
    out = ROOT / "packages" / "bench" / "results" / stamp
    session.run("python", "-m", "kiln_bench", "--suite", "models", "--out", str(out), *session.posargs)


@nox.session(python="3.11")
def typecheck(session: nox.Session) -> None:
    """mypy over every package's sources (configuration: pyproject.toml at the root)."""
    session.install(TORCH, TRITON)
    session.install(*[str(PACKAGES_DIR / f) for f in _sibling_closure("bench")], MYPY, "pytest", "nox")
    session.run("mypy", *session.posargs)


@nox.session(python="3.11")
def lint(session: nox.Session) -> None:
    """ruff: lint and formatting."""
    session.install(RUFF)
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
