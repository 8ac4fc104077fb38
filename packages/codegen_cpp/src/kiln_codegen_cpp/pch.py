"""The prelude's system headers, precompiled once per machine and compiler target.

Note [Precompiled headers]: every translation unit opens with the same system headers
(``Python.h``, ``<cmath>``, ``<algorithm>``, ``<omp.h>``, Note [The parts share one prelude] in
units.py), and ``g++`` parses them anew for each build: ~0.1 s of a small graph's 0.55 s build on
this project's CPU machine (``-ftime-report``: parsing was 43% of the MLP forward's compile), and
a training step builds two graphs, a model with graph breaks more. So those headers are compiled
once into a GCC precompiled header (``kiln_headers.h.gch``, ~25 MB) under
``$KILN_CACHE_DIR/cpp-pch/<key>/``, keyed as a kernel library is (the header text, the flags, the
compiler's identity, the CPU: Note [Verified cache entries] in build.py), and a build passes
``-include kiln_headers.h`` before its source. The source is unchanged: its own ``#include``
lines find the headers' include guards already set, so the object code is the same byte for byte
(checked on the MLP's forward by disassembly; ``tests/test_pch.py`` compares two builds), and
the cache key of a library does not depend on the header. GCC uses the ``.gch`` only if it was
made with compatible flags and otherwise reads the ``.h`` beside it, which is the same text: a
stale header is slower, never wrong. A damaged ``.gch`` is different (GCC stops with "cannot read
PCH file"), so the header is only used when its manifest names the ``.gch``'s size and sha256 and
they match (checked once per process), and a build that fails with the header is retried without
it: if that succeeds, the header was the cause and stays off for the process; if not, the error
is the source's, reported as before (such a build costs two compiles).

The header is built the first time a build needs it, in the background at the lowest CPU priority
(the builds that start before it is ready go without it; Note [The background build yields the
cores] in kiln_dynamo's tensor_check.py says why nice 19), or in the foreground by
``prepare_headers()`` (``kiln.prepare()``), which benchmarks call before measuring so that each
model's compile from a fresh cache measures the model, not this one-time build: a user's second
program finds it on disk, as it finds the torch-linked guard checker. Once ready in a process it
is used by every later build with the same flags there, wherever ``KILN_CACHE_DIR`` points by
then. ``CppOptions.precompiled_headers=False`` (``KILN_CPP_OPTIONS=precompiled_headers=0``) turns
it off; ``KILN_LOG=cache`` says when a header was built, found or dropped.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from kiln_loopir.diskcache import cache_root, write_atomic

from .prelude import PRELUDE

log = logging.getLogger("kiln.codegen_cpp.cache")

HEADER = "kiln_headers.h"
MANIFEST = "kiln_headers.json"


def header_text() -> str:
    """The prelude's leading ``#define``/``#include`` lines: what every unit parses first."""
    lines = []
    for line in PRELUDE.splitlines():
        if line.startswith("#if"):
            break
        if line.startswith(("#define", "#include")):
            lines.append(line)
    return "\n".join(lines) + "\n"


_lock = threading.Lock()
_ready: dict[str, Path] = {}  # key -> the header to -include (its .gch beside it, verified)
_waiting: dict[str, Path] = {}  # key -> the folder a builder process is filling
_tried: set[str] = set()  # keys found broken, or whose build failed, in this process
_off = [False]  # a build failed with a header: none from now on
BUILDING = "building"  # a builder's claim on a folder (its creation time says how old)
CLAIM_SECONDS = 300.0  # an older claim is a builder that died: the next process builds again


def _key(cxx: str, compile_flags: Sequence[str], identity: str) -> str:
    text = "\x00".join([header_text(), " ".join(compile_flags), cxx, identity])
    return hashlib.sha256(text.encode()).hexdigest()


def _directory(key: str) -> Path:
    return cache_root() / "cpp-pch" / key[:2] / key


def _verified(directory: Path) -> bool:
    try:
        record = json.loads((directory / MANIFEST).read_text(encoding="utf-8"))
        data = (directory / (HEADER + ".gch")).read_bytes()
        return (
            (directory / HEADER).read_text(encoding="utf-8") == header_text()
            and int(record["size"]) == len(data)
            and str(record["sha256"]) == hashlib.sha256(data).hexdigest()
        )
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError):
        return False


def include_flags(cxx: str, compile_flags: Sequence[str], identity: str, *, start: bool = True) -> list[str]:
    """``["-include", header]`` when a verified precompiled header for these flags is ready, else
    ``[]``; then (``start``) a builder process makes one in the background, once per machine."""
    if _off[0]:
        return []
    key = _key(cxx, compile_flags, identity)
    with _lock:
        header = _ready.get(key)
        if header is not None:
            if header.exists():
                return ["-include", str(header)]
            del _ready[key]  # its folder was removed (a temporary cache): GCC would stop on it
        if key in _tried:
            return []
        directory = _waiting.get(key, _directory(key))
        if (directory / MANIFEST).exists():  # a stat while a builder works: cheap to ask each build
            _waiting.pop(key, None)
            if not _verified(directory):
                _tried.add(key)
                log.debug("precompiled header at %s does not match its manifest: not used", directory)
                return []
            _ready[key] = directory / HEADER
            log.debug("precompiled header found: %s", directory)
            return ["-include", str(directory / HEADER)]
        if key in _waiting or not start:
            return []
        _waiting[key] = directory
    if not _claim(directory):
        return []  # another process builds it
    # a process of its own, at the lowest priority: it finishes even if this program ends first
    try:
        write_atomic(directory / HEADER, header_text())
        subprocess.Popen(
            ["nice", "-n", "19", *_builder(directory, cxx, compile_flags)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.debug("precompiled header building in the background: %s", directory)
    except OSError as exc:
        (directory / BUILDING).unlink(missing_ok=True)
        log.debug("precompiled header builder not started: %s", exc)
    return []


def _claim(directory: Path) -> bool:
    """Whether this process may build the header in ``directory`` (no fresh claim by another)."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        claim = directory / BUILDING
        try:
            fd = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            if time.time() - claim.stat().st_mtime < CLAIM_SECONDS:
                return False
            claim.unlink(missing_ok=True)  # a builder that died
            fd = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        os.close(fd)
        return True
    except OSError:
        return False


def prepare(cxx: str, compile_flags: Sequence[str], identity: str) -> bool:
    """Build (or find) the header for these flags now, in the foreground; whether it is ready."""
    if include_flags(cxx, compile_flags, identity, start=False):
        return True
    key = _key(cxx, compile_flags, identity)
    directory = _directory(key)
    if not build(directory, cxx, list(compile_flags)):
        return False
    return bool(include_flags(cxx, compile_flags, identity, start=False))


# The builder, a Python of its own without kiln (no torch to import): the ``.gch`` compiled into a
# temporary file and renamed into place, then the manifest that vouches for it, renamed too (a
# reader never sees half of either); the claim removed whatever happens. Arguments: the folder
# (holding the header's text already), the compiler, its flags.
_BUILDER = r"""
import hashlib, json, os, subprocess, sys, tempfile
folder, cxx, flags = sys.argv[1], sys.argv[2], sys.argv[3:]
try:
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".kiln_headers.", suffix=".tmp")
    os.close(fd)
    try:
        cmd = [cxx, *flags, "-x", "c++-header", os.path.join(folder, "kiln_headers.h"), "-o", tmp]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            sys.stderr.write((proc.stderr or proc.stdout)[-2000:])
            sys.exit(1)
        with open(tmp, "rb") as f:
            data = f.read()
        os.chmod(tmp, 0o644)
        os.replace(tmp, os.path.join(folder, "kiln_headers.h.gch"))
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".kiln_headers.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump({"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}, f)
    os.chmod(tmp, 0o644)
    os.replace(tmp, os.path.join(folder, "kiln_headers.json"))
finally:
    try:
        os.unlink(os.path.join(folder, "building"))
    except OSError:
        pass
"""


def _builder(directory: Path, cxx: str, compile_flags: Sequence[str]) -> list[str]:
    return [sys.executable, "-c", _BUILDER, str(directory), cxx, *compile_flags]


def build(directory: Path, cxx: str, compile_flags: list[str]) -> bool:
    """Compile the header into ``directory`` now (``prepare``); whether it was built."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        write_atomic(directory / HEADER, header_text())
        proc = subprocess.run(
            _builder(directory, cxx, compile_flags), capture_output=True, text=True, check=False
        )
    except OSError as exc:  # a read-only or full cache: builds go on without it
        log.debug("precompiled header not built: %s", exc)
        return False
    if proc.returncode != 0:
        log.debug("precompiled header not built (%s): %s", cxx, proc.stderr[-2000:])
        return False
    log.debug("precompiled header built: %s", directory)
    return True


def drop(reason: str) -> None:
    """No precompiled header for the rest of the process (a build failed with one)."""
    if not _off[0]:
        _off[0] = True
        log.warning(
            "kiln: a C++ build failed with the precompiled header; building without it from now on (%s)",
            reason,
        )
