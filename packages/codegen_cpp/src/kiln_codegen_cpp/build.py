"""Compiling a translation unit, the on-disk cache, and loading the shared object.

The kernels of one graph are compiled by ``g++`` into one shared object that is a small CPython
extension module (Note [Calling kernels] in prelude.py): from one translation unit
(``kernels.cpp``), or from several compiled at the same time and linked (``kernels_p<j>.cpp``,
Note [Parallel C++ builds] in units.py). The cache key is a hash of the source (of every part),
the flags, the compiler's identity (``--version``) and the CPU (``/proc/cpuinfo`` model and
flags, since ``-march=native`` code is only valid on a CPU like the one that built it). The
object lives at ``$KILN_CACHE_DIR/cpp/<key[:2]>/<key>/kernels.so`` (default cache dir
``~/.cache/kiln``).

Every file is written atomically (Note [Atomic cache writes] in kiln_loopir's diskcache.py; the
object too, by the same rename). Two processes that miss at the same time both compile and both
rename: the last rename wins and both objects are complete and identical in behaviour. Nothing is
locked, nothing is ever partially visible.

Note [Verified cache entries]: rename makes *our* writes atomic, but a cache directory also
outlives crashes, full disks, copies and hands: a truncated ``kernels.so`` makes ``dlopen`` map
past the end of the file and the process dies of SIGBUS, a garbage one fails or worse. So an
entry is only loaded when its manifest ``kernels.json`` (written, atomically, after the object
is renamed into place) names the object's size and sha256 and the object on disk matches them.
An object without a manifest is an unfinished entry (a process killed between the two
renames, or a cache from before manifests) and is compiled again; a manifest that does not
parse or does not match is a corrupt entry: it is reported (a warning on
``kiln.codegen_cpp.cache``, ``counters["corrupt"]``), compiled again and replaced, never loaded.
Two racing processes may briefly pair one's object with the other's manifest; the check then
fails, the reader compiles its own copy, and no wrong object is ever loaded. An object that
matches its manifest but still fails to load (``ImportError``) is treated the same way, once. A
build in parts writes its objects to temporary files and only the linked object is renamed into
place and named in the manifest, so no part's object is ever loaded or kept.

Configuration (read at each build, so tests may set them): ``KILN_CXX`` names the compiler
(default ``g++``), ``KILN_CPP_FLAGS`` replaces the optimisation flags.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.machinery
import importlib.util
import json
import logging
import os
import platform
import shlex
import subprocess
import sysconfig
import threading
import time
import types
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from kiln_loopir.diskcache import cache_root, temp_file, write_atomic

from . import pch
from .prelude import MODULE_TOKEN
from .units import cores

# Note [Vector width]: the kernels are scalar C++ that GCC vectorizes (Note [Why scalar C++ and
# omp simd] in kernel.py), so the vector width is the build target's: -march=native on an AVX2
# machine gives 256-bit vectors, and on an AVX-512 one whatever GCC's tuning for that core
# prefers: 512 on AMD's Zen 4 (this project's CI machine is an AVX-512 EPYC: zmm registers; GCC
# 12 still calls libmvec's 8-lane AVX2 variants for exp/tanh there), but 256 on Intel's AVX-512
# server cores (skylake-avx512 to sapphirerapids tune for prefer-vector-width=256, against
# frequency drops: no zmm at all). Nothing in the
# generated code assumes a width: the 8 accumulator lanes (Note [Lane accumulators]) are a fixed
# summation order, one ymm of floats or one zmm of doubles. CppOptions.vector_width overrides
# the preference (-mprefer-vector-width); tests compile kernels for skylake-avx512 both ways.
# Since cpu20b an AVX-512 target gets 512 by default (Note [512-bit vectors on AVX-512 targets]
# in options.py).
# -O3 -march=native: -O2 compiled a typical graph ~0.3 s faster (0.9 s against 1.2 s) but does not
# vectorize as much of the lane loops; -fno-math-errno lets GCC vectorize calls into libmvec and
# inline sqrt; trapping math off lets it if-convert the NaN-propagating max/min. No -ffast-math:
# NaN and inf must behave as in eager.
DEFAULT_FLAGS = ("-O3", "-march=native", "-fno-math-errno", "-fno-trapping-math")
BASE_FLAGS = (
    "-std=c++17",
    "-shared",
    "-fPIC",
    "-fopenmp",
    "-DKILN_LIBMVEC",
    "-w",
    f"-I{sysconfig.get_paths()['include']}",
)
LIBS = ("-lmvec", "-lm")

counters: dict[str, int] = {"compiles": 0, "disk_hits": 0, "memory_hits": 0, "corrupt": 0}
"""How translation units were obtained in this process (tests assert on them)."""

log = logging.getLogger("kiln.codegen_cpp.cache")

MANIFEST = "kernels.json"

_lock = threading.Lock()
_loaded: dict[str, types.ModuleType] = {}


class CppCompileError(RuntimeError):
    """The compiler is missing or rejected the generated source (the message says which file)."""


def cache_dir() -> Path:
    return cache_root() / "cpp"


def compiler() -> str:
    return os.environ.get("KILN_CXX", "g++")


def flags() -> tuple[str, ...]:
    custom = os.environ.get("KILN_CPP_FLAGS")
    return (*(shlex.split(custom) if custom else DEFAULT_FLAGS), *BASE_FLAGS)


@functools.cache
def compiler_identity(cxx: str) -> str:
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=False, timeout=60)
    except (FileNotFoundError, PermissionError, NotADirectoryError) as exc:
        return f"missing:{exc}"
    return out.stdout.splitlines()[0] if out.stdout else f"unknown:{out.returncode}"


def target_has_avx512() -> bool:
    """Does the build target (the compiler and its optimisation flags, ``-march=native`` by
    default) have AVX-512F? Note [512-bit vectors on AVX-512 targets] in options.py."""
    custom = os.environ.get("KILN_CPP_FLAGS")
    return "__AVX512F__" in target_macros(compiler(), tuple(shlex.split(custom) if custom else DEFAULT_FLAGS))


# Note [Tunings that are slow to compile]: on the device's 16-core host (an Intel Sapphire Rapids
# Xeon, GCC 13.3) kiln's CPU training graphs compiled 3-8x slower than on this project's 2-core
# AVX2 machine: BERT's backward translation unit (200 KB of C++) took 29.8 s, and `-ftime-report`
# put 26.7 s of it (91%) in one pass, "scheduling 2", the instruction scheduler after register
# allocation, which runs on the scheduling model of the `-mtune` that `-march=native` implies,
# sapphirerapids there. The same file on the same host: -mtune=skylake-avx512 3.6 s,
# -mtune=generic 3.7 s, -mtune=icelake-server 7.3 s, -fno-schedule-insns2 3.0 s; GCC 12 here
# compiles it in 3.9 s for -march=sapphirerapids with either tuning. The instruction set stays
# the native one (the tuning only orders instructions and sets defaults the options pin anyway,
# such as the preferred vector width, Note [512-bit vectors on AVX-512 targets] in options.py),
# and the run time did not move: BERT and GPT-2 training at 16 threads there 1.22-1.27x and
# 1.24-1.30x over eager with skylake-avx512's tuning, against 1.06-1.37x and 1.11-1.24x in earlier
# runs with the native one (compile 30 -> 3.8-5.0 s and 18 -> 3.6-5.0 s). So where the native
# tuning is one of SLOW_SCHEDULING_TUNES, the kernels are compiled with -mtune=
# FAST_SCHEDULING_TUNE (a flag of CppOptions.compiler_flags, so part of the cache key; the switch
# is CppOptions.compile_time_tune). Only the defaults' -march=native is asked: flags set through
# KILN_CPP_FLAGS are left as given.
SLOW_SCHEDULING_TUNES = frozenset(
    {"sapphirerapids", "emeraldrapids", "graniterapids", "graniterapids-d", "diamondrapids"}
)
FAST_SCHEDULING_TUNE = "skylake-avx512"


def compile_time_tune_flags() -> tuple[str, ...]:
    """``-mtune`` in place of a native tuning slow to compile (Note [Tunings that are slow to
    compile]), or nothing."""
    if os.environ.get("KILN_CPP_FLAGS") or "-march=native" not in DEFAULT_FLAGS:
        return ()
    tune = native_tune(compiler())
    return (f"-mtune={FAST_SCHEDULING_TUNE}",) if tune in SLOW_SCHEDULING_TUNES else ()


@functools.cache
def native_tune(cxx: str) -> str:
    """The ``-mtune`` that ``-march=native`` gives ``cxx`` (``-Q --help=target``), "" when it
    cannot be asked."""
    for line in _ask_compiler([cxx, "-march=native", "-Q", "--help=target"]).splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "-mtune=":
            return parts[1]
    return ""


@functools.cache
def target_macros(cxx: str, opt_flags: tuple[str, ...]) -> frozenset[str]:
    """The macros ``cxx`` predefines for ``opt_flags`` (``-dM -E``): the target's features, as
    the compiler sees them. Asked once per process for each compiler and flags; empty when the
    compiler cannot be run (the kernels' compile then reports why)."""
    out = _ask_compiler([cxx, *opt_flags, "-dM", "-E", "-x", "c++", os.devnull])
    return frozenset(parts[1] for parts in (line.split() for line in out.splitlines()) if len(parts) >= 2)


def _ask_compiler(cmd: list[str]) -> str:
    """The standard output of a query of the compiler, "" when it cannot be run."""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=60)
    except (FileNotFoundError, PermissionError, NotADirectoryError, subprocess.TimeoutExpired):
        return ""
    return out.stdout


@functools.cache
def cpu_identity() -> str:
    model, cpu_flags = "", ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name") and not model:
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and not cpu_flags:
                    cpu_flags = line.split(":", 1)[1].strip()
                if model and cpu_flags:
                    break
    except OSError:
        pass
    return f"{platform.machine()}|{model}|{cpu_flags}"


def cache_key(source: str, extra: tuple[str, ...] = ()) -> str:
    cxx = compiler()
    parts = [
        source,
        " ".join((*flags(), *extra)),
        " ".join(LIBS),
        cxx,
        compiler_identity(cxx),
        cpu_identity(),
    ]
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Built:
    """A loaded translation unit, or the parts of one (Note [Parallel C++ builds] in units.py)."""

    key: str
    directory: Path
    source_path: Path  # the part that holds the extension module
    library: types.ModuleType
    cache: str = "compiled"  # or "disk" / "memory": where the library came from
    sources: tuple[Path, ...] = ()  # every part's source, the module's first
    part_seconds: tuple[float, ...] = ()  # each part's compile time, when compiled here


# joins the parts' texts in the cache key; C++ text holds no NUL, so no one-unit text hashes alike
PART_SEPARATOR = "\x00kiln part\x00"


def build(units: str | Sequence[str], extra_flags: tuple[str, ...] = ()) -> Built:
    """The compiled and loaded ``units``, from memory, the disk cache, or the compiler.

    ``units`` is one translation unit or the parts of one (Note [Parallel C++ builds] in
    units.py), the first holding the extension module, which is named ``KILN_MODULE_NAME``; the
    module is named after the cache key (``kiln_<key[:24]>``), so every build is a distinct
    module. One unit keys the cache as it always has; parts key it by all their texts, so a split
    build is its own entry: the same ``kernels.so`` and manifest, a source file per part.
    ``extra_flags`` (``CppOptions.compiler_flags``) follow the optimisation flags.
    """
    return start_build(units, extra_flags).result()


# Note [Builds that overlap]: a training graph's forward and backward are compiled one after the
# other on the first call (kiln_aotgrad), and each used to wait for its own ``g++`` before the
# next was even lowered: a cold training compile on the CPU was the sum of the two builds (the
# public suite at one thread: 2.3 of a median 2.8 s were C++ builds, forward then backward). So
# a build runs in a background thread (it only waits on the compiler's process, without the GIL)
# and the graph's wrapper is made at once, its kernels bound to stand-ins: the first kernel the
# wrapper calls waits for the library, binds every kernel and its error reporter in the wrapper's
# namespace (the generated ``call`` reads them as globals, so later calls pay nothing) and goes
# on. The forward's build then runs while the backward is lowered, generated and compiled, and
# while the forward's first call runs: the two builds take the longer of them, not the sum, where
# a second core is free, and no more CPU than before (the same two compiles). A build that fails
# fails the first call that needs it, which the umbrella's first-call and backward fallbacks
# turn into an eager run with a warning naming the compiler's error (before, the graph fell back
# at compile time). ``CppOptions.overlap_builds=False`` waits at once, as before;
# ``KILN_LOG=cache`` prints when a graph waited for its build and how long.
# Builds of one key share one compile (a second graph with the same kernels waits on the first).
_inflight: dict[str, PendingBuild] = {}
_pool: ThreadPoolExecutor | None = None
_waited = [0.0]


def forget_loaded() -> None:
    """Drop the in-process record of loaded libraries (they stay loaded for the graphs that use
    them): the next build of the same kernels goes to the disk cache or the compiler, as in a new
    process. Benchmarks measuring a cold compile call it (``kiln.reset(kernels=True)``)."""
    with _lock:
        _loaded.clear()


def build_wait_seconds() -> float:
    """Seconds this process's calls have waited for builds that overlapped (Note [Builds that
    overlap]): the part of a compile's C++ builds that the first calls still saw. The umbrella
    counts it as compile time, not as the first run's."""
    return _waited[0]


def _build_pool() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        # the builds' threads only wait on g++: as many as the cores, and two on one core (the
        # second build starts while the first is linked and loaded)
        _pool = ThreadPoolExecutor(max_workers=max(2, cores()), thread_name_prefix="kiln-cpp-build")
    return _pool


class PendingBuild:
    """A build that may still be compiling (Note [Builds that overlap]): ``result()`` waits for
    it and loads the library, once; ``cache`` says where it comes from (``"compiled"`` on a miss)."""

    def __init__(
        self,
        key: str,
        directory: Path,
        paths: Sequence[Path],
        module: str,
        cache: str,
        built: Built | None = None,
        future: Future[tuple[float, ...]] | None = None,
    ) -> None:
        self.key, self.directory, self.paths, self.module = key, directory, tuple(paths), module
        self.cache = cache
        self.waited = 0.0  # seconds the first result() waited for the compiler
        self._built = built
        self._future = future
        self._lock = threading.Lock()

    @property
    def source_path(self) -> Path:
        return self.paths[0]

    def done(self) -> bool:
        return self._built is not None

    def result(self) -> Built:
        built = self._built
        if built is not None:
            return built
        with self._lock:
            if self._built is None:
                assert self._future is not None
                start = time.perf_counter()
                try:
                    seconds = self._future.result()
                    with _lock:
                        library = _loaded.get(self.key)
                        if library is None:
                            library = _load(self.module, self.directory / "kernels.so")
                            _loaded[self.key] = library
                finally:
                    with _lock:
                        if _inflight.get(self.key) is self:
                            del _inflight[self.key]
                self.waited = time.perf_counter() - start
                with _lock:
                    _waited[0] += self.waited
                self._built = Built(
                    self.key, self.directory, self.paths[0], library, "compiled", self.paths, seconds
                )
            return self._built


def start_build(
    units: str | Sequence[str], extra_flags: tuple[str, ...] = (), *, headers: bool = True
) -> PendingBuild:
    """``build``'s work started (Note [Builds that overlap]): a hit in memory or on disk is loaded
    now; a miss compiles in a background thread, and ``result()`` waits for it. ``headers``: use
    the precompiled system headers when they are ready (Note [Precompiled headers] in pch.py)."""
    templates = [units] if isinstance(units, str) else list(units)
    key = cache_key(PART_SEPARATOR.join(templates), extra_flags)
    module = f"kiln_{key[:24]}"
    sources = [t.replace(MODULE_TOKEN, module) for t in templates]
    directory = cache_dir() / key[:2] / key
    if len(sources) == 1:
        paths = [directory / "kernels.cpp"]
    else:
        paths = [directory / f"kernels_p{j}.cpp" for j in range(len(sources))]
    lib = directory / "kernels.so"
    with _lock:
        loaded = _loaded.get(key)
        if loaded is not None:
            counters["memory_hits"] += 1
            built = Built(key, directory, paths[0], loaded, "memory", tuple(paths))
            return PendingBuild(key, directory, paths, module, "memory", built=built)
        running = _inflight.get(key)
        if running is not None:
            return running
        directory.mkdir(parents=True, exist_ok=True)
        problem = _check_entry(lib, directory / MANIFEST)
        if problem is None:
            try:
                library = _load(module, lib)
            except ImportError as exc:
                problem = f"it does not load ({exc})"
            else:
                counters["disk_hits"] += 1
                log.debug("disk hit: %s", lib)
                for path, source in zip(paths, sources, strict=True):
                    if not path.exists():
                        write_atomic(path, source)
                _loaded[key] = library
                built = Built(key, directory, paths[0], library, "disk", tuple(paths))
                return PendingBuild(key, directory, paths, module, "disk", built=built)
        if problem != "":
            counters["corrupt"] += 1
            log.warning("kiln: corrupt C++ cache entry %s: %s; compiling it again", directory, problem)
        counters["compiles"] += 1
        future = _build_pool().submit(_compile_entry, sources, paths, lib, extra_flags, headers)
        pending = PendingBuild(key, directory, paths, module, "compiled", future=future)
        _inflight[key] = pending
        return pending


def _compile_entry(
    sources: Sequence[str], paths: Sequence[Path], lib: Path, extra_flags: tuple[str, ...], headers: bool
) -> tuple[float, ...]:
    if len(sources) == 1:
        seconds = (_compile(sources[0], paths[0], lib, extra_flags, headers),)
        log.debug("compiled: %s (one unit, %.2f s)", lib, seconds[0])
        return seconds
    return _compile_parts(sources, paths, lib, extra_flags, headers)


def _header_flags(extra_flags: tuple[str, ...], headers: bool) -> list[str]:
    """Note [Precompiled headers] (pch.py): ``-include`` of the ready header, or nothing."""
    if not headers:
        return []
    cxx = compiler()
    return pch.include_flags(cxx, _object_flags(extra_flags), compiler_identity(cxx) + cpu_identity())


def _object_flags(extra_flags: tuple[str, ...]) -> list[str]:
    """The flags of a one-unit build, less -shared (a link flag): a part's, and the header's."""
    return [f for f in (*flags(), *extra_flags) if f != "-shared"]


def prepare_headers(extra_flags: tuple[str, ...] = ()) -> bool:
    """Build the precompiled system headers for these flags now (Note [Precompiled headers] in
    pch.py), for ``kiln.prepare()``; whether they are ready."""
    cxx = compiler()
    return pch.prepare(cxx, _object_flags(extra_flags), compiler_identity(cxx) + cpu_identity())


def _digest(path: Path) -> tuple[int, str]:
    data = path.read_bytes()
    return len(data), hashlib.sha256(data).hexdigest()


def _check_entry(lib: Path, manifest: Path) -> str | None:
    """Why the entry at ``lib`` must not be loaded: ``None`` when it is sound, ``""`` when it is
    absent or unfinished (an ordinary miss), else what is wrong with it (Note [Verified cache
    entries])."""
    try:
        size, digest = _digest(lib)
    except FileNotFoundError:
        return ""
    except OSError as exc:
        return f"the object cannot be read ({exc})"
    try:
        text = manifest.read_text(encoding="utf-8")
    except FileNotFoundError:
        return ""  # killed between the object's rename and the manifest's, or an older cache
    except (OSError, UnicodeDecodeError) as exc:
        return f"its manifest cannot be read ({exc})"
    try:
        record = json.loads(text)
        expected = (int(record["size"]), str(record["sha256"]))
    except (ValueError, KeyError, TypeError) as exc:
        return f"its manifest {manifest.name} is malformed ({exc!r})"
    if (size, digest) != expected:
        return f"the object ({size} bytes, sha256 {digest[:12]}) does not match its manifest ({expected[0]} bytes, sha256 {expected[1][:12]})"
    return None


def _load(name: str, path: Path) -> types.ModuleType:
    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(name, str(path), loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def _compile(
    source: str, src: Path, lib: Path, extra_flags: tuple[str, ...] = (), headers: bool = False
) -> float:
    """Compile one translation unit into ``lib``; returns the compiler's time."""
    write_atomic(src, source)
    fd, tmp_lib = temp_file(lib, 0o777)  # Note [Cache file modes]: a shared object, as ld makes it
    os.close(fd)
    include = _header_flags(extra_flags, headers)
    cmd = [compiler(), *flags(), *extra_flags, *include, str(src), "-o", tmp_lib, *LIBS]
    try:
        [cmd], [(proc, seconds)] = _run_with_header([cmd], [src], include)
        if proc.returncode != 0:
            raise _failure(cmd, proc, src)
        _install(Path(tmp_lib), lib, 1)
    finally:
        if os.path.exists(tmp_lib):
            os.unlink(tmp_lib)
    return seconds


def _install(tmp_lib: Path, lib: Path, parts: int) -> None:
    """Rename the finished object into place, then write the manifest that vouches for it (Note
    [Verified cache entries]: until the manifest exists, the entry is unfinished)."""
    size, digest = _digest(tmp_lib)
    os.replace(tmp_lib, lib)
    write_atomic(lib.parent / MANIFEST, json.dumps({"size": size, "sha256": digest, "parts": parts}))


def _run_compiler(cmd: list[str], src: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    except (FileNotFoundError, PermissionError, NotADirectoryError) as exc:
        raise CppCompileError(
            f"C++ compiler {cmd[0]!r} could not be run ({exc}) to compile {src}; set KILN_CXX to a working g++"
        ) from exc
    return proc, time.perf_counter() - start


def _run_all(
    commands: Sequence[list[str]], paths: Sequence[Path]
) -> list[tuple[subprocess.CompletedProcess[str], float]]:
    """Each command at the same time (one: in this thread)."""
    if len(commands) == 1:
        return [_run_compiler(commands[0], paths[0])]
    with ThreadPoolExecutor(max_workers=len(commands)) as pool:
        return list(pool.map(_run_compiler, commands, paths))


def _run_with_header(
    commands: Sequence[list[str]], paths: Sequence[Path], include: list[str]
) -> tuple[list[list[str]], list[tuple[subprocess.CompletedProcess[str], float]]]:
    """The commands run, and run again without ``include`` if one failed with it; the header is
    dropped for the process when that succeeds (Note [Precompiled headers]: never the cause of a
    failure). Returns the commands that ran last and their results."""
    results = _run_all(commands, paths)
    failed = next((proc for proc, _ in results if proc.returncode != 0), None)
    if failed is None or not include:
        return list(commands), results
    commands = [[c for c in cmd if c not in include] for cmd in commands]
    results = _run_all(commands, paths)
    if all(proc.returncode == 0 for proc, _ in results):
        pch.drop(f"{paths[0]}: {(failed.stderr or failed.stdout).strip()[-300:]}")
    return commands, results


def _failure(cmd: list[str], proc: subprocess.CompletedProcess[str], what: Path | str) -> CppCompileError:
    message = (proc.stderr or proc.stdout).strip()
    return CppCompileError(
        f"{cmd[0]} failed (exit {proc.returncode}) compiling {what}:\n{message[-4000:]}\n"
        f"command: {shlex.join(cmd)}"
    )


def _compile_parts(
    sources: Sequence[str],
    paths: Sequence[Path],
    lib: Path,
    extra_flags: tuple[str, ...] = (),
    headers: bool = False,
) -> tuple[float, ...]:
    """Compile each part by its own ``g++ -c`` at the same time, link the objects into ``lib``
    (Note [Parallel C++ builds] in units.py); returns each part's compile time. The objects are
    temporary files beside the entry's, removed whatever happens: only the linked object, renamed
    into place and vouched for by its manifest, is ever loaded (Note [Verified cache entries]),
    so a part's object that is damaged or unfinished fails the link, not a later load."""
    for path, source in zip(paths, sources, strict=True):
        write_atomic(path, source)
    cxx = compiler()
    # the flags of a one-unit build, less -shared (a link flag), so each kernel compiles the same
    compile_flags = _object_flags(extra_flags)
    include = _header_flags(extra_flags, headers)
    objects: list[str] = []
    tmp_lib = ""
    try:
        for path in paths:
            fd, obj = temp_file(path.with_suffix(".o"))
            os.close(fd)
            objects.append(obj)
        commands = [
            [cxx, *compile_flags, *include, "-c", str(p), "-o", o]
            for p, o in zip(paths, objects, strict=True)
        ]
        commands, results = _run_with_header(commands, paths, include)
        for cmd, path, (proc, _) in zip(commands, paths, results, strict=True):
            if proc.returncode != 0:
                raise _failure(cmd, proc, path)
        fd, tmp_lib = temp_file(lib, 0o777)  # Note [Cache file modes]: a shared object, as ld makes it
        os.close(fd)
        link = [cxx, *flags(), *extra_flags, *objects, "-o", tmp_lib, *LIBS]
        proc, link_seconds = _run_compiler(link, paths[0])
        if proc.returncode != 0:
            parts = ", ".join(p.name for p in paths)
            raise _failure(link, proc, f"the link of {len(paths)} parts ({parts}) into {lib}")
        _install(Path(tmp_lib), lib, len(paths))
    finally:
        for leftover in (*objects, tmp_lib):
            if leftover and os.path.exists(leftover):
                os.unlink(leftover)
    seconds = tuple(s for _, s in results)
    log.debug(
        "compiled: %s in %d parts (%s; link %.2f s)",
        lib,
        len(paths),
        ", ".join(f"{p.name} {s:.2f} s" for p, s in zip(paths, seconds, strict=True)),
        link_seconds,
    )
    return seconds


def write_beside(built: Built | PendingBuild, name: str, text: str) -> Path:
    """Write ``text`` next to the kernels (e.g. the wrapper), atomically; returns its path."""
    path = built.directory / name
    if not path.exists():
        write_atomic(path, text)
    return path
