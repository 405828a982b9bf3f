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
:class:`varbench.analysis.aggregate.AggregationError`, and the ones defined here: :class:`GarbledFileError` (a
state file that does not parse), :class:`StoreWriteError` (a file varbench cannot write: a
read-only or full disk), and the input kinds of :mod:`varbench.core.inputs`' boundary, each with its own
first words (:func:`report_line`): :class:`BadSettingError` ("bad setting"), :class:`IncompatibleSettingsError`
("incompatible combination"), :class:`MalformedFileError` ("unreadable or malformed file"); what is
missing is :class:`varbench.core.missing.MissingFilesError` alone.
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
    """An error whose message names the file or setting at fault and the fix (printed alone, exit 2).

    ``first_words``: what the command prints before the message (``[varbench] <first words>: ...``),
    so each kind of input fault reads as itself (see :func:`report_line`); None: the class name."""

    first_words: str | None = None


class GarbledFileError(FixableError, ValueError):
    """A state file varbench wrote (JSON, or a JSONL line other than a cut-off last one) does not parse."""


class StoreWriteError(FixableError, OSError):
    """A file under the store or results folder could not be written (read-only, full, not a folder).

    An ``OSError`` with the original ``errno`` and ``filename``, so code that checks for ENOSPC still
    sees it; its message names the file and the fix."""

    def __init__(self, err: OSError, path: str | os.PathLike | None = None):
        where = os.fspath(path) if path is not None else (err.filename or "?")
        super().__init__(err.errno, err.strerror or str(err), where)
        link = dangling_link(where) or (dangling_link(err.filename) if err.filename else None)
        if link is not None:          # "File exists" says nothing about a link to a folder that is gone
            self.message = (f"cannot write {where}: {link} is a symbolic link to {os.readlink(link)}, which does not "
                            "exist. Fix: create that folder (e.g. mount the disk it is on), remove the link, or point "
                            "paths.store_dir / paths.results_dir elsewhere")
            return
        self.message = (f"cannot write {where}: {err.strerror or err}. Fix: "
                        + _WRITE_FIX.get(err.errno, "make that folder writable, or point paths.store_dir / "
                                                    "paths.results_dir at a writable folder"))

    def __str__(self) -> str:
        return self.message

    def __reduce__(self):          # picklable across launcher processes (submitit/joblib send errors back)
        return (_rebuild_write_error, (self.errno, self.strerror, self.filename))


def dangling_link(path: str | os.PathLike) -> str | None:
    """``path`` or the nearest of its parents that is a symbolic link whose target does not exist
    (a store folder linked to an unmounted disk); None when there is none."""
    p = os.path.abspath(os.fspath(path))
    while True:
        if os.path.islink(p) and not os.path.exists(p):
            return p
        parent = os.path.dirname(p)
        if parent == p:
            return None
        p = parent


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

    first_words = "config error"


class BadSettingError(ConfigError):
    """One setting's value is out of its range or of the wrong type (``benchmark.limit=-1``); the
    message names the setting, the value and what it takes."""

    first_words = "bad setting"


class IncompatibleSettingsError(ConfigError):
    """Settings that are each valid but cannot work together (a shard count that leaves a shard
    without prompts, an evaluator on prompts it cannot score); the message names both."""

    first_words = "incompatible combination"


class MalformedFileError(FixableError, ValueError):
    """A file the user gave (a config, a prompt or question file, a W&B run file) is there but cannot
    be read as what it should be: not UTF-8, not parseable, the wrong shape, a folder where a file
    belongs. The message names the file and where it went wrong (line and column, or byte offset).

    ``path``, ``line``, ``column`` (1-based) and ``byte`` (0-based offset) are kept as attributes."""

    first_words = "unreadable or malformed file"

    def __init__(self, path: str | os.PathLike, problem: str, *, line: int | None = None,
                 column: int | None = None, byte: int | None = None, fix: str = ""):
        self.path, self.problem, self.fix = os.fspath(path), problem, fix
        self.line, self.column, self.byte = line, column, byte
        where = self.path
        if line is not None:
            where += f":{line}" + (f":{column}" if column is not None else "")
        if byte is not None:
            where += f" (byte {byte})" if line is not None else f" at byte {byte}"
        super().__init__(f"{where}: {problem}" + (f". Fix: {fix}" if fix else ""))

    def __reduce__(self):          # picklable across launcher processes
        return (_rebuild_malformed, (type(self), self.path, self.problem, self.line, self.column, self.byte, self.fix))


def _rebuild_malformed(cls, path, problem, line, column, byte, fix):
    return cls(path, problem, line=line, column=column, byte=byte, fix=fix)


def names_its_fix(exc: BaseException) -> bool:
    """True for a :class:`FixableError` (its message says what to do)."""
    return isinstance(exc, FixableError)


def report_line(exc: BaseException) -> str:
    """The one line the command prints for a fixable error: its class's ``first_words`` (``bad
    setting: ...``, ``unreadable or malformed file: ...``, ``config error: ...``) or ``<Type>: ...``."""
    what = getattr(exc, "first_words", None) or type(exc).__name__
    return f"[varbench] {what}: {exc}"
