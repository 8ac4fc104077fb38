"""Why a frame could not be captured whole: `Unsupported`, and the `BreakReason` users read.

Every construct the symbolic evaluator does not model raises `Unsupported` with one sentence of
cause in the user's words ("data-dependent branch on a tensor value"), optionally one line of
advice. The evaluator pins it to the innermost user line that raised it and to the stack of
inlined calls that led there (`frames`, outermost first). The frame is then split there (a graph
break, resume.py) or, when it cannot be split, runs as plain Python; either way a `BreakReason`
is recorded (`counters.break_reasons`). Under `fullgraph=True` the exception reaches the caller,
and its text is the same explanation. Nothing else may escape the callback: an internal error is
converted to a recorded fallback too (see convert_frame).
"""

from __future__ import annotations

import types
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class UserFrame:
    """One frame of the user's code as the evaluator saw it (inlined calls included)."""

    filename: str
    lineno: int | None
    name: str
    source: str

    def __str__(self) -> str:
        return f'File "{self.filename}", line {self.lineno}, in {self.name}\n    {self.source}'


def _explain(msg: str, where: str | None, frames: tuple[UserFrame, ...], advice: str | None) -> str:
    lines = [msg if where is None else f"{msg} (at {where})"]
    if frames:
        lines.append(f"    {frames[-1].source}")
        if len(frames) > 1:
            lines.append("  through the inlined calls:")
            lines += [f"    {f.name} ({f.filename}:{f.lineno}): {f.source}" for f in frames]
    if advice:
        lines.append(f"  advice: {advice}")
    return "\n".join(lines)


class Unsupported(Exception):
    """A construct kiln_dynamo does not capture; `where` is the user's `file:line` when known.

    `before` marks a break that must happen before the instruction runs (a try block starts
    there: nothing of it may be traced); `depth` is the inlining depth of the evaluator that
    raised it (0: the frame itself); `break_offset` is the instruction of the frame itself that
    was running (where the frame splits)."""

    break_offset: int | None = None
    not_split: str | None = None  # why the frame could not be split there, once that was tried
    inside_try: bool = False  # `before` moved the break before a try block around the instruction
    note: str | None = None  # how the frame was split, when not at the break itself
    # the frame's code with its loop's exit calling a continuation (Note [Compiling what follows
    # a loop] in resume.py) and its body calling pieces (Note [Loop body pieces] in
    # loop_pieces.py), when the break is inside a loop and one of those rewrites is sound
    loop_code: types.CodeType | None = None
    loop_after: bool = False  # the rewrite calls a continuation at the loop's exit
    loop_pieces: int = 0  # how many pieces the loop body calls
    # the program's own exception leaves the frame, which did nothing a graph or a replay would
    # hold before it (Note [A frame that only raises] in convert_frame.py)
    only_raises: bool = False

    def __init__(
        self,
        msg: str,
        where: str | None = None,
        *,
        advice: str | None = None,
        frames: tuple[UserFrame, ...] = (),
        before: bool = False,
        depth: int = 0,
    ) -> None:
        super().__init__(msg)
        self.msg = msg
        self.where = where
        self.advice = advice
        self.frames = frames
        self.before = before
        self.depth = depth
        # (inlining depth, offset of the instruction running there, whether that frame's call
        # returns what the frame returns), appended as the exception leaves each frame's
        # evaluator: innermost first (Note [Resuming a chain of frames] in breaks.py)
        self.chain: list[tuple[int, int, bool]] = []

    def __str__(self) -> str:
        text = _explain(self.msg, self.where, self.frames, self.advice)
        return f"{text}\n  not split: {self.not_split}" if self.not_split else text

    def located(self, where: str, frames: tuple[UserFrame, ...] = (), depth: int = 0) -> Unsupported:
        """The same reason, pinned to the innermost user line that raised it (first one wins)."""
        if self.where is not None:
            return self
        out = type(self)(self.msg, where, advice=self.advice, frames=frames, before=self.before, depth=depth)
        return out


class FakeUnsupported(Unsupported):
    """An operator that fake tensors cannot run (no meta kernel, or it needs data)."""


class DynamicShapesUnsupported(Exception):
    """Raised by a backend that cannot compile a graph with symbolic sizes: dynamo compiles the
    frame again with static shapes (and keeps it static from then on), logging the reason."""


def unimplemented(msg: str) -> Unsupported:
    return Unsupported(msg)


@dataclass(frozen=True, slots=True)
class BreakReason:
    """One graph break (or one frame left to plain Python), as reported to users.

    `split` is True when the frame was split with a continuation, False when it ran as plain
    Python; then `not_split` says why it could not be split."""

    reason: str
    frames: tuple[UserFrame, ...]
    advice: str | None
    split: bool
    code_name: str
    not_split: str | None = None
    note: str | None = None  # e.g. the frame was split before the loop around the break

    @property
    def filename(self) -> str | None:
        return self.frames[-1].filename if self.frames else None

    @property
    def lineno(self) -> int | None:
        return self.frames[-1].lineno if self.frames else None

    @property
    def source(self) -> str:
        return self.frames[-1].source if self.frames else ""

    @property
    def site(self) -> tuple[str, str | None, int | None, str]:
        """What `KILN_LOG=graph_breaks` logs once: the frame that split, and the line and reason."""
        return (self.code_name, self.filename, self.lineno, self.reason)

    @staticmethod
    def of(
        e: Unsupported, code_name: str, split: bool, not_split: str | None = None, note: str | None = None
    ) -> BreakReason:
        return BreakReason(e.msg, e.frames, e.advice, split, code_name, not_split, note)

    def __str__(self) -> str:
        where = f"{self.filename}:{self.lineno}" if self.frames else None
        head = "graph break" if self.split else "runs as plain Python"
        text = _explain(self.reason, where, self.frames, self.advice)
        tail = f"\n  not split: {self.not_split}" if self.not_split else ""
        tail += f"\n  note: {self.note}" if self.note else ""
        return f"{head} in {self.code_name}: {text}{tail}"
