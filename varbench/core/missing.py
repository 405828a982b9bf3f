"""Missing files, named all at once: the preflight's collector and its one error.

A file check (:func:`varbench.evaluators.weights.resolve_file`, the model's and the prompts' checks)
raises its own error naming the file, where it was searched and where it is published. Inside
:func:`collecting` a check that supports it notes a :class:`MissingFile` instead and goes on, so the
preflight of a sweep (:mod:`varbench.harness.preflight`) lists every missing file of every job in
one :class:`MissingFilesError`, instead of one per launch.
"""
from __future__ import annotations

import contextlib
import dataclasses
from contextvars import ContextVar
from typing import Iterator, Optional, Sequence

from varbench.core.errors import FixableError

_NOTES: ContextVar[Optional[list]] = ContextVar("varbench_missing_files", default=None)


@dataclasses.dataclass(frozen=True)
class MissingFile:
    """One file (or folder) a job needs and does not find."""

    what: str                   # e.g. "GenEval Mask2Former folder", "model weights infinity_2b_reg.pth"
    path: str                   # where it was searched ("" when the error names no single path)
    published: str = ""         # where to get it
    fix: str = ""               # the setting that points at it

    def lines(self) -> list[str]:
        out = [self.what]
        out += [f"searched: {self.path}"] if self.path else []
        out += [f"published at: {self.published}"] if self.published else []
        out += [f"fix: {self.fix}"] if self.fix else []
        return out


class MissingFilesError(FixableError, FileNotFoundError):
    """Files a command needs are missing; the message lists each once, with the jobs needing it."""

    def __init__(self, message: str, missing: Sequence[MissingFile] = ()):
        super().__init__(message)
        self.missing = list(missing)

    def __str__(self) -> str:
        return str(self.args[0])

    def __reduce__(self):     # picklable across launcher processes
        return (type(self), (str(self.args[0]), self.missing))


@contextlib.contextmanager
def collecting() -> Iterator[list[MissingFile]]:
    """Within the block, :func:`note` records missing files in the yielded list instead of letting
    the check raise."""
    notes: list[MissingFile] = []
    token = _NOTES.set(notes)
    try:
        yield notes
    finally:
        _NOTES.reset(token)


def note(missing: MissingFile) -> bool:
    """Record ``missing`` when a :func:`collecting` block is open (True: the caller goes on with the
    path as searched); False: the caller raises its own error, as outside a preflight."""
    notes = _NOTES.get()
    if notes is None:
        return False
    notes.append(missing)
    return True
