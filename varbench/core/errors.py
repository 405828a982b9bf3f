"""The one base class of errors that name their fix, and the helpers that raise them.

An error whose message already says what is wrong (the setting or the file) and what to do
derives from :class:`FixableError`: the command line (``python -m varbench``, the sweep callback,
``python -m varbench.aggregate``) prints its message alone and exits 2, like a missing weight file,
instead of a traceback with exit 1. Everything else keeps its traceback: an unnamed failure is a
bug to report. Subclasses keep their old built-in base too (``ConfigError`` is still a
``ValueError``, ``WeightsNotFound`` a ``FileNotFoundError``), so existing ``except`` clauses hold.

Subclasses: :class:`varbench.core.errors.ConfigError`, :class:`varbench.engine.checkpoints.CheckpointMismatch`
and ``WeightsNotFound``, :class:`varbench.core.locks.LockTimeoutError`, :class:`varbench.harness.records.SealError`,
``EntryFinishedError``, ``EntryLockedError``, :class:`varbench.toy.load.ToyWeightsError`,
:class:`varbench.harness.prompts.PromptSetError`, the evaluators' ``WeightsNotFoundError`` / ``WrongWeightsError``,
:class:`varbench.harness.store.ImageHashError`, :class:`varbench.policies.skipvar_features.DecisionModelError`,
:class:`varbench.analysis.aggregate.AggregationError`, and the two defined here: :class:`GarbledFileError` (a
state file that does not parse) and :class:`StoreWriteError` (a file varbench cannot write: a
read-only or full disk).
"""
from __future__ import annotations

import contextlib
import errno
import os
from typing import Iterator

#: errno values of a write that fails because of where it writes (permissions, a read-only or full
#: file system, a path through a file): the user fixes the place, not the code
_PLACE_ERRNOS = frozenset(getattr(errno, n) for n in ("EACCES", "EPERM", "EROFS", "ENOSPC", "EDQUOT", "ENOTDIR",
                                                     "EISDIR", "EEXIST", "ENAMETOOLONG", "EFBIG") if hasattr(errno, n))


class FixableError(Exception):
    """An error whose message names the file or setting at fault and the fix (printed alone, exit 2)."""


class GarbledFileError(FixableError, ValueError):
    """A state file varbench wrote (JSON, or a JSONL line other than a cut-off last one) does not parse."""


class StoreWriteError(FixableError, OSError):
    """A file under the store or results folder could not be written (read-only, full, not a folder).

    An ``OSError`` with the original ``errno`` and ``filename``, so code that checks for ENOSPC still
    sees it; its message names the file and the fix."""

    def __init__(self, err: OSError, path: str | os.PathLike | None = None):
        where = os.fspath(path) if path is not None else (err.filename or "?")
        super().__init__(err.errno, err.strerror or str(err), where)
        self.message = (f"cannot write {where}: {err.strerror or err}. Fix: "
                        + _WRITE_FIX.get(err.errno, "make that folder writable, or point paths.store_dir / "
                                                    "paths.results_dir at a writable folder"))

    def __str__(self) -> str:
        return self.message

    def __reduce__(self):          # picklable across launcher processes (submitit/joblib send errors back)
        return (_rebuild_write_error, (self.errno, self.strerror, self.filename))


def _rebuild_write_error(code, strerror, filename):
    return StoreWriteError(OSError(code, strerror, filename), filename)


_WRITE_FIX = {
    getattr(errno, "ENOSPC", -1): "free space on that disk (or point paths.store_dir at another one), then relaunch: "
                                  "finished batches are kept",
    getattr(errno, "EDQUOT", -1): "free space within your quota (or point paths.store_dir elsewhere), then relaunch",
    getattr(errno, "EROFS", -1): "that file system is mounted read-only: point paths.store_dir (and "
                                 "paths.results_dir) at a writable folder",
}


@contextlib.contextmanager
def writing(path: str | os.PathLike) -> Iterator[None]:
    """Turn an ``OSError`` caused by the place being written (see ``_PLACE_ERRNOS``) into a
    :class:`StoreWriteError` naming ``path``; other errors pass unchanged."""
    try:
        yield
    except StoreWriteError:
        raise
    except OSError as e:
        if e.errno in _PLACE_ERRNOS:
            raise StoreWriteError(e, path) from e      # the file meant, not the temp file or folder that failed
        raise


class ConfigError(FixableError, ValueError):
    """A config value that cannot work; the message names the setting."""


def names_its_fix(exc: BaseException) -> bool:
    """True for a :class:`FixableError` (its message says what to do)."""
    return isinstance(exc, FixableError)


def report_line(exc: BaseException) -> str:
    """The one line the command prints for a fixable error: ``config error: ...`` or ``<Type>: ...``."""
    what = "config error" if isinstance(exc, ConfigError) else type(exc).__name__
    return f"[varbench] {what}: {exc}"
