"""The compile cache under stress: damaged entries, processes killed mid-write, racing processes.

Every scenario runs the compiling process as a child (a fresh process is the only one that reads
the cache from disk: the parent's loaded modules are cached in memory by key) and asserts what
the next process sees (Note [Verified cache entries] in build.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

# a child compiles three small graphs and prints its counters and whether every result matched eager
CHILD = textwrap.dedent(
    """
    import json, sys, torch, kiln_loopir
    from kiln_codegen_cpp import CppBackend, counters
    kiln_loopir.register_backend("cpp", CppBackend)
    aten = torch.ops.aten
    def f0(x):
        return aten.add.Tensor(aten.mul.Tensor(aten.tanh.default(x), 3.0), 0.75)
    def f1(x):
        return aten.sum.dim_IntList(aten.exp.default(aten.neg.default(x)), [1], False)
    def f2(x):
        return aten.sub.Tensor(aten.sigmoid.default(x), aten.amax.default(x, [0], True))
    x = torch.arange(1200, dtype=torch.float32).reshape(40, 30) / 100
    ok = True
    for fn in (f0, f1, f2)[: int(sys.argv[1])]:
        gm = torch.fx.symbolic_trace(fn)
        compiled = kiln_loopir.compile_graph(gm, [x], backend="cpp")
        ok = ok and torch.allclose(compiled(x), fn(x))
    print(json.dumps({**counters, "ok": bool(ok)}))
    """
)


def _spawn(cache: Path, graphs: int = 1) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "KILN_CACHE_DIR": str(cache),
        "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
    }
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(graphs)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, so a kill reaches g++ too
    )


def _run(cache: Path, graphs: int = 1) -> tuple[dict[str, Any], str]:
    proc = _spawn(cache, graphs)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, f"child died with {proc.returncode}:\n{err}"
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result, err


def _entry(cache: Path) -> Path:
    (lib,) = cache.rglob("kernels.so")
    return lib.parent


def _truncate(entry: Path) -> None:
    lib = entry / "kernels.so"
    lib.write_bytes(lib.read_bytes()[:1000])  # an ELF header whose segments run past the end


def _garbage(entry: Path) -> None:
    (entry / "kernels.so").write_bytes(b"\x7fELF" + os.urandom(5000))


def _bad_manifest(entry: Path) -> None:
    (entry / "kernels.json").write_text('{"size": 12, "sha')


def _wrong_digest(entry: Path) -> None:
    record = json.loads((entry / "kernels.json").read_text())
    (entry / "kernels.json").write_text(json.dumps({**record, "sha256": "0" * 64}))


def _foreign_object(entry: Path) -> None:
    # a complete, loadable shared object that is not this entry's: size and digest differ
    (entry / "kernels.so").write_bytes((entry / "kernels.so").read_bytes() + b"\0" * 64)


@pytest.mark.parametrize(
    "damage",
    [_truncate, _garbage, _bad_manifest, _wrong_digest, _foreign_object],
    ids=lambda f: f.__name__[1:],
)
def test_a_corrupt_entry_is_reported_and_rebuilt_never_loaded(
    tmp_path: Path, damage: Callable[[Path], None]
) -> None:
    first, _ = _run(tmp_path)
    assert first["ok"] and first["compiles"] == 1
    entry = _entry(tmp_path)
    damage(entry)
    second, err = _run(tmp_path)  # before the manifest check, a truncated object killed this with SIGBUS
    assert second["ok"]
    assert (second["compiles"], second["disk_hits"], second["corrupt"]) == (1, 0, 1)
    assert "corrupt C++ cache entry" in err and str(entry) in err
    # the entry was replaced by a sound one: the next process loads it from disk, silently
    third, err = _run(tmp_path)
    assert (third["compiles"], third["disk_hits"], third["corrupt"], third["ok"]) == (0, 1, 0, True)
    assert "corrupt" not in err


def test_an_object_without_manifest_is_an_unfinished_entry(tmp_path: Path) -> None:
    """A process killed between renaming the object and writing its manifest leaves an object
    nobody vouches for: the next process compiles it again, without calling it corrupt."""
    _run(tmp_path)
    (_entry(tmp_path) / "kernels.json").unlink()
    second, err = _run(tmp_path)
    assert (second["compiles"], second["disk_hits"], second["corrupt"], second["ok"]) == (1, 0, 0, True)
    assert "corrupt" not in err
    assert (_entry(tmp_path) / "kernels.json").exists()


def test_a_process_killed_mid_compile_breaks_no_later_one(tmp_path: Path) -> None:
    """SIGKILL a process (and its g++) while its object is being written. Wherever the kill lands
    (the outcome does not depend on when), the next process gets right results and leaves a sound
    entry that a third one loads from disk."""
    victim = _spawn(tmp_path, graphs=3)
    # wait (on the file system, not a clock) for the first temporary object: g++ is writing it
    while victim.poll() is None and not list(tmp_path.rglob(".kernels.so.*.tmp")):
        time.sleep(0.005)
    os.killpg(victim.pid, signal.SIGKILL)
    victim.communicate(timeout=60)
    survivor, err = _run(tmp_path, graphs=3)
    assert survivor["ok"] and survivor["corrupt"] == 0, err
    third, _ = _run(tmp_path, graphs=3)
    assert (third["compiles"], third["disk_hits"], third["ok"]) == (0, 3, True)


def test_two_processes_racing_on_three_graphs(tmp_path: Path) -> None:
    procs = [_spawn(tmp_path, graphs=3), _spawn(tmp_path, graphs=3)]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert all(r["ok"] for r in results)
    # every graph was compiled or loaded by each; a racing reader may pair one process's object
    # with the other's manifest and compile its own copy, but never loads a wrong one
    assert all(r["compiles"] + r["disk_hits"] == 3 for r in results)
    assert len(list(tmp_path.rglob("kernels.so"))) == 3 and not [
        p for p in tmp_path.rglob("*.tmp") if "cpp-pch" not in p.parts
    ]
    third, err = _run(tmp_path, graphs=3)
    assert (third["compiles"], third["disk_hits"], third["corrupt"], third["ok"]) == (0, 3, 0, True), err


def test_a_process_killed_mid_write_while_another_compiles_the_same_graphs(tmp_path: Path) -> None:
    """Two processes compile the same three graphs at once; one is SIGKILLed (with its g++) while
    an object is being written, by either of them. The other still finishes with right results
    and no corrupt entry, and what it leaves is sound: a third process loads all three from disk."""
    victim, survivor = _spawn(tmp_path, graphs=3), _spawn(tmp_path, graphs=3)
    # wait (on the file system, not a clock) until some object is being written
    while victim.poll() is None and not list(tmp_path.rglob(".kernels.so.*.tmp")):
        time.sleep(0.005)
    os.killpg(victim.pid, signal.SIGKILL)
    victim.communicate(timeout=60)
    out, err = survivor.communicate(timeout=300)
    assert survivor.returncode == 0, err
    result = json.loads(out.strip().splitlines()[-1])
    assert result["ok"] and result["corrupt"] == 0, err
    assert result["compiles"] + result["disk_hits"] == 3
    third, err = _run(tmp_path, graphs=3)
    assert (third["compiles"], third["disk_hits"], third["corrupt"], third["ok"]) == (0, 3, 0, True), err
