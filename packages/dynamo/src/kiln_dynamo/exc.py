"""Why a frame could not be captured.

Every construct the symbolic evaluator does not model raises `Unsupported` with one sentence of
cause and the user's file:line. The frame then runs as plain Python (the reason is recorded in
`counters`), or, under `fullgraph=True`, the exception reaches the caller. Nothing else may escape
the callback: an internal error is converted to a recorded fallback too (see convert_frame).
"""

from __future__ import annotations


class Unsupported(Exception):
    """A construct kiln_dynamo does not capture; `where` is the user's `file:line` when known."""

    def __init__(self, msg: str, where: str | None = None) -> None:
        super().__init__(msg if where is None else f"{msg} (at {where})")
        self.msg = msg
        self.where = where

    def located(self, where: str) -> Unsupported:
        """The same reason, pinned to the innermost user line that raised it (first one wins)."""
        if self.where is not None:
            return self
        return Unsupported(self.msg, where)


class FakeUnsupported(Unsupported):
    """An operator that fake tensors cannot run (no meta kernel, or it needs data)."""


def unimplemented(msg: str) -> Unsupported:
    return Unsupported(msg)
