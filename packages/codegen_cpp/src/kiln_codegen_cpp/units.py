"""A graph's kernels cut into translation units that ``g++`` compiles at the same time.

A graph's C++ is a prelude, its kernels and the extension module that exposes them (Note [Calling
kernels] in prelude.py). Compiled as one translation unit it takes one core however many the
machine has; cut into parts, each part is compiled by its own ``g++ -c`` and the objects are
linked into the same ``kernels.so`` (build.py). This module decides how many parts and which
kernels go in each; build.py compiles and links them.

Note [Parallel C++ builds]: every part opens with the same prelude (Note [The parts share one
prelude]), then its kernels in schedule order; part 0 also holds the extension module (the
method table and ``PyInit_``), with an ``extern "C"`` declaration of each kernel that lives in
another part. A kernel's text is the same whatever part it lands in and the parts are compiled
with the same flags (``-c`` in place of ``-shared``), and the helpers a kernel inlines come from
the prelude every part holds, so each kernel compiles to the same code, but for one thing: in one
unit GCC folds identical code of different kernels into one function (``-fipa-icf``: twin
kernels, Note [Twin kernels stay together], and identical pieces of others, such as the ``.part``
clone of a serial path), which parts holding them apart each compile. Checked: GCC's
vectorization reports name the same loops vectorized the same way in GPT-2's, BERT's and
ResNet-50's training graphs (``bench/parallel_build.py --vec``; ``--disasm`` shows the folds),
and a small graph's kernels disassemble identically (tests/test_parallel_build.py).

How many parts (``CppOptions.build_parts``; 0 is automatic): each ``g++`` pays ~0.13 s of CPU to
start and parse the prelude (``Python.h``, ``<cmath>``, ``<omp.h>``) and the link ~0.02 s,
measured on this project's CPU machine, against ~10 us of compiling per character of kernel
source (GPT-2's training backward, 27 kernels in 130 KB, took 1.5 s more than the prelude alone).
So a part is only made for at least ``MIN_PART_CHARS`` of distinct kernel source (~0.15 s of
compiling, about its own start-up), never more parts than the cores this process may run on
(``os.sched_getaffinity``) but one, than the distinct kernels, or than the kernels' source over its
largest kernel's (that kernel bounds the part it is in; more parts make the others shorter and
that one no faster). A graph of few or small kernels stays one unit, compiled exactly as before
(the same text, the same cache key). Kernels go to parts longest first, each to the part with
the least source so far (largest-first list scheduling; source length is the estimate of
compile time), then each part keeps the schedule's order: the split depends only on the
kernels' text and the part count, so one graph on one machine always makes the same parts and
the same cache key. ``KILN_LOG=cache`` says how many parts a build took and each part's compile
time.

Measured (``bench/parallel_build.py``, packages/bench/results/2026-12-06-cpu-s27-parallel-build.md):
compiled one part after another, split as on 16 idle cores, the C++ phase's critical path (each
graph's longest part) of GPT-2's training step is 2.46 s in one unit and 1.00 s in 4 + 5 parts,
BERT's 2.79 and 1.37 s (its forward waits on one 18 KB kernel); 8 KB parts gained 3-6% more for
20% more CPU, 32 KB parts ran 1.59 and 1.86 s. The parts cost CPU: GPT-2's 2.46 s becomes 3.81
s at 16 cores, 2.9 s in 2 parts a graph. So the split pays where cores are idle, and one core is
left to the rest of the machine: on the 2-core machine, whose cores other sessions keep busy
(load 3-8, no idle time), 2 parts a graph made kiln_bench's cold compile phase of GPT-2, BERT
and ResNet-50 training and GPT-2 inference slower in 9 of 9 interleaved pairs, by 0.3-1.5 s (in 4
of 8 with an earlier rule; faster in a lull: GPT-2's training builds 2.47 -> 1.61 s at load
1.5), so there the automatic choice is one unit. ``build_parts=N`` asks for N parts anywhere.

Note [Twin kernels stay together]: a model's repeated layers make kernels that differ only in
their names and their buffers' (GPT-2's training backward: 16 of 27 kernels in 7 groups). In one
unit GCC folds them into one function (``-fipa-icf``) before it vectorizes and generates code, so
the copies cost little; in different parts each is compiled in full (GPT-2's backward in 2 parts:
176 vectorized loops against one unit's 152). So kernels whose text is equal up to names
(``UnitKernel.code``) go to one part, weighed as one, and are folded there as before (175: the
rest are identical pieces of kernels that are not twins).

Note [The parts share one prelude]: the prelude's helpers are ``static inline`` functions and
``inline`` templates, so each part has its own copies and no symbol clashes at the link. Its one
definition with external linkage, ``kiln_err_value`` (the offending value of a kernel error, read
by the module's ``err_value``), is defined in part 0 and declared ``extern`` in the others: the
kernels read and write it the same way either way (through the GOT, as ``-fPIC`` code does).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .prelude import ERR_VALUE_DEFINITION, PRELUDE

# Note [Parallel C++ builds]: kernel source a part must carry to pay for its own g++
MIN_PART_CHARS = 16_000
ERR_VALUE_DECLARATION = 'extern "C" { extern int64_t kiln_err_value; }'


@dataclass(frozen=True, slots=True)
class UnitKernel:
    """What the split needs of a kernel: its name, C++ text and parameter types (without ``nt``)."""

    name: str
    source: str
    param_types: tuple[str, ...]

    def declaration(self) -> str:
        return f'extern "C" int64_t {self.name}({", ".join([*self.param_types, "int64_t"])});'

    def alias_of(self, body: str) -> str:
        """This kernel as another name of its twin ``body`` (Note [Twins share one body]), after
        its own comments (what it fuses, the user's lines)."""
        comments = [line for line in self.source.splitlines() if line.startswith("//")]
        alias = self.declaration()[:-1] + f' __attribute__((alias("{body}")));'
        return "\n".join(
            [*comments, f"// {self.name}: the code of {body} (Note [Twins share one body])", alias]
        )

    def code(self) -> str:
        """The kernel's text without its comments, its name and its buffers' names (renamed in
        order of first use): equal for kernels GCC folds into one (Note [Twin kernels stay
        together])."""
        lines = [line for line in self.source.splitlines() if not line.lstrip().startswith("//")]
        text = "\n".join(lines).replace(self.name, "kernel")
        order: dict[str, str] = {}
        return re.sub(r"\bp_\w+", lambda m: order.setdefault(m.group(0), f"p{len(order)}"), text)


def cores() -> int:
    """The cores this process may run on (``os.sched_getaffinity``)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def part_count(sizes: Sequence[int], requested: int = 0, available: int | None = None) -> int:
    """How many parts items of ``sizes`` characters (kernels, or groups of twin kernels weighed by
    one) are compiled in (Note [Parallel C++ builds]): ``requested`` when it is 1 or more (at most
    one per item), else from the source and the ``available`` cores (default: this process's but
    one, Note [Parallel C++ builds])."""
    if not sizes:
        return 1
    if requested >= 1:
        return min(requested, len(sizes))
    total = sum(sizes)
    by_source = total // MIN_PART_CHARS
    by_largest = total // max(sizes)
    return max(1, min(available or cores() - 1, len(sizes), by_source, by_largest))


def twins(kernels: Sequence[UnitKernel]) -> list[list[int]]:
    """The kernels grouped by their code up to names (Note [Twin kernels stay together]), in
    order of first appearance."""
    groups: dict[str, list[int]] = {}
    for i, k in enumerate(kernels):
        groups.setdefault(k.code(), []).append(i)
    return list(groups.values())


def assign(sizes: Sequence[int], parts: int) -> list[list[int]]:
    """The items (indices into ``sizes``) of each part: longest first, each to the part with the
    least so far; each part in the items' order. Part 0 gets no head start for the module: it is
    small."""
    load = [0] * parts
    members: list[list[int]] = [[] for _ in range(parts)]
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        j = min(range(parts), key=lambda j: (load[j], j))
        load[j] += sizes[i]
        members[j].append(i)
    return [sorted(m) for m in members]


def split(kernels: Sequence[UnitKernel], requested: int = 0, available: int | None = None) -> list[list[int]]:
    """The kernels (indices) of each part: twins together, as many parts as ``part_count`` says
    (``requested``: ``CppOptions.build_parts``)."""
    if requested == 1 or (requested == 0 and (available or cores() - 1) <= 1):
        return [list(range(len(kernels)))]  # one unit whatever the kernels: no need to group them
    groups = twins(kernels)
    sizes = [len(kernels[g[0]].source) for g in groups]
    parts = assign(sizes, part_count(sizes, requested, available))
    return [sorted(i for g in part for i in groups[g]) for part in parts]


def translation_units(
    kernels: Sequence[UnitKernel], module: str, parts: Sequence[Sequence[int]], share_twins: bool = True
) -> list[str]:
    """The C++ of each part of ``parts`` (the kernels' indices, from :func:`split`); part 0 holds
    the extension ``module``. One part is exactly the one-unit text (prelude, kernels, module)
    compiled before parts existed, but for twins (``share_twins``, Note [Twins share one body])."""
    if len(parts) <= 1:
        body = _bodies(kernels, range(len(kernels)), share_twins)
        return [PRELUDE + "\n\n" + "\n\n".join(body) + "\n\n" + module + "\n"]
    elsewhere = [kernels[i].declaration() for part in parts[1:] for i in part]
    units = []
    for j, part in enumerate(parts):
        prelude = PRELUDE if j == 0 else PRELUDE.replace(ERR_VALUE_DEFINITION, ERR_VALUE_DECLARATION)
        body = _bodies(kernels, part, share_twins)
        if j == 0:
            body += [
                "// kernels compiled in the other parts (Note [Parallel C++ builds])",
                *elsewhere,
                module,
            ]
        units.append(prelude + "\n\n" + "\n\n".join(body) + "\n")
    return units


# Note [Twins share one body]: GCC folds twin kernels (Note [Twin kernels stay together]) only
# after it has parsed each and run its early optimizations on each: the copies cost a fifth to a
# third of a transformer's build (BERT's training forward, 9 kernels of which 4 are twins of
# others: 25 KB of its 100 KB, compiled 2.2 -> 1.5 s without them; GPT-2's backward 3.8 -> 2.8 s).
# So a unit holds one body per group of twins, the first in schedule order, and each later twin
# is an alias of it (``__attribute__((alias))``, one symbol more in the same object): the same
# machine code ``-fipa-icf`` made of them, now compiled once. Twins are kept in one part
# (``split``), so a body and its aliases are always in one unit. ``CppOptions.share_twins=False``
# writes every kernel in full, as before.
def _bodies(kernels: Sequence[UnitKernel], indices: Iterable[int], share_twins: bool) -> list[str]:
    first: dict[str, str] = {}
    out = []
    for i in indices:
        k = kernels[i]
        body = first.setdefault(k.code(), k.name) if share_twins else k.name
        out.append(k.source if body == k.name else k.alias_of(body))
    return out
