"""Inter-process locks that die with their holder, and small helpers for files shared by a group.

Usage::

    from varbench.core.locks import FileLock, LockTimeoutError
    with FileLock(entry_dir / "LOCK", what=f"entry {entry_dir}", wait_s=600):
        ...                        # one holder at a time, across processes (and hosts on NFS)

The lock is an OS advisory lock (``fcntl.flock``) on the lock file. The kernel drops it when the
holding process ends in any way (exit, exception, SIGTERM, ``kill -9``, OOM kill), so a lock left by
a dead job is taken over at once by the next acquirer: there is no stale lock to delete by hand,
and no guessing from pids. The holder writes ``host=... pid=... since=...`` into the file, only to
name it in messages; a file that holds a name but no OS lock is a leftover of a killed job (the
takeover says so on stdout).

A second acquirer waits (polling, with one message on stdout saying whom it waits for, repeated
every few minutes) up to ``wait_s`` seconds, then raises :class:`LockTimeoutError` naming the
holder, the lock file and the knob (``runtime.lock_wait_s``) that sets the wait. ``wait_s``: ``0``
fails at once, ``None`` or a negative number waits forever.

Release unlinks the file while still holding the lock; an acquirer that got the lock on a file
that was unlinked meanwhile (it opened the old inode) notices (inode check) and retries, so two
processes never both believe they hold it.

Filesystems: local filesystems and NFS (Linux NFS clients map ``flock`` onto NFS byte-range locks,
which the server tracks across hosts) are supported. A filesystem without locking (``flock``
fails with ENOLCK/ENOSYS/EOPNOTSUPP, e.g. Lustre mounted without ``-o flock``, NFS without
lockd) falls back to an exclusive-create lock file (``O_EXCL``): a leftover whose recorded holder
ran on this host and is no longer alive is taken over; one from another host cannot be checked,
so after ``wait_s`` the error says to delete the file if that job is dead.
"""
from __future__ import annotations

import errno
import os
import socket
import time
from pathlib import Path
from typing import Callable

from varbench.core.errors import FixableError, writing

#: The config knob that sets how long a job waits for a lock held by a live job (named in messages).
WAIT_KNOB = "runtime.lock_wait_s"
#: Default wait when neither the caller nor the config gives one (the shipped runtime default).
DEFAULT_WAIT_S = 3600.0
#: Seconds between two tries while waiting (cheap: one non-blocking ``flock`` call).
POLL_S = 0.5
#: Seconds between two "still waiting" messages.
REPORT_EVERY_S = 300.0

_NO_LOCKING = {errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL}


class LockTimeoutError(FixableError, RuntimeError):
    """A live process held the lock for longer than the wait allowed."""


def _utc_now() -> str:
    import datetime as _dt

    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


def holder_text() -> str:
    """What a holder writes into its lock file: ``host=... pid=... since=...``."""
    return f"host={socket.gethostname()} pid={os.getpid()} since={_utc_now()}"


def _parse_holder(text: str) -> dict[str, str]:
    out = {}
    for part in text.split():
        k, sep, v = part.partition("=")
        if sep:
            out[k] = v
    return out


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True            # exists, owned by someone else
    return True


def _read_text(path: Path) -> str:
    try:
        return path.read_text(errors="replace").strip()
    except (FileNotFoundError, IsADirectoryError):
        return ""


def _wait_budget(wait_s: float | None) -> float:
    if wait_s is None or float(wait_s) < 0:
        return float("inf")
    return float(wait_s)


class FileLock:
    """Exclusive lock on ``path`` for one process at a time; see the module docstring.

    ``what`` names the protected thing in messages (``"entry results/entries/ab12"``).
    ``wait_s``: how long to wait for a live holder (``None``/negative: forever; ``0``: not at all).
    ``error``: the exception class raised on timeout (a subclass of Exception taking a message;
    default :class:`LockTimeoutError`). ``say``: where progress messages go (default: print).
    Reentrant use on one ``FileLock`` object is an error; two objects on one path in one process
    exclude each other like two processes do (``flock`` locks belong to the open file).
    """

    def __init__(self, path: str | os.PathLike, what: str | None = None, wait_s: float | None = DEFAULT_WAIT_S,
                 error: type[Exception] = LockTimeoutError, say: Callable[[str], None] | None = None):
        self.path = Path(path)
        self.what = what or str(self.path)
        self.wait_s = wait_s
        self.error = error
        self.say = say or (lambda msg: print(msg, flush=True))
        self._fd: int | None = None
        self._excl = False          # holding via the O_EXCL fallback
        #: ``host=... pid=... since=...`` of the dead job whose leftover lock this acquire took over.
        self.took_over: str | None = None

    # public --------------------------------------------------------------------------------
    @property
    def held(self) -> bool:
        return self._fd is not None or self._excl

    def acquire(self, wait_s: float | None | object = ...) -> "FileLock":
        """Take the lock, waiting up to ``wait_s`` (default: the constructor's) for a live holder."""
        if self.held:
            raise RuntimeError(f"{self.path}: this FileLock is already held (not reentrant)")
        budget = _wait_budget(self.wait_s if wait_s is ... else wait_s)
        with writing(self.path):     # a read-only store: one error naming the file and the fix
            self.path.parent.mkdir(parents=True, exist_ok=True)
        start = time.monotonic()
        next_report = 0.0
        while True:
            holder = self._try_once()
            if holder == "no OS locks":
                holder = self._try_once()
            if holder is None:
                return self
            if holder == "being released":   # we opened a file its holder was removing: try the new one
                continue
            waited = time.monotonic() - start
            if waited >= budget:
                raise self.error(self._timeout_message(holder, budget))
            if waited >= next_report:
                limit = "no limit" if budget == float("inf") else f"up to {budget:g} s"
                self.say(f"[varbench] waiting for {self.what}: held by another live job ({holder or 'holder unknown'}); "
                         f"waiting {limit} ({WAIT_KNOB}); lock file {self.path}")
                next_report = waited + REPORT_EVERY_S
            time.sleep(min(POLL_S, max(budget - waited, 0.0)))

    def release(self) -> None:
        """Drop the lock and remove the file (no-op if not held)."""
        if self._excl:
            self._excl = False
            self.path.unlink(missing_ok=True)
            return
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            # unlink while still locked: a waiter that opened this inode sees it is gone and retries
            self.path.unlink(missing_ok=True)
        finally:
            os.close(fd)        # closing the last descriptor drops the flock

    def __enter__(self) -> "FileLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()

    # internals -----------------------------------------------------------------------------
    def _timeout_message(self, holder: str, budget: float) -> str:
        dead_hint = ("" if not self._fallback_mode() else
                     f" This filesystem has no OS locks, so a dead holder on another host cannot be detected: if that "
                     f"job is dead, delete {self.path} and relaunch.")
        return (f"{self.what} is still held by another live job ({holder or 'holder unknown'}) after waiting "
                f"{budget:g} s (lock file {self.path}). Wait for that job to finish, or raise {WAIT_KNOB} "
                f"(e.g. {WAIT_KNOB}=7200; -1 waits forever) and relaunch.{dead_hint}")

    _fallback: bool | None = None  # per instance once decided

    def _fallback_mode(self) -> bool:
        return bool(self._fallback)

    def _try_once(self) -> str | None:
        """One non-blocking try. Returns None when acquired, else the holder's text ('' unknown)."""
        if self._fallback:
            return self._try_excl()
        import fcntl

        with writing(self.path):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o666)  # umask applies
        keep = False
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return _read_text(self.path)
            except OSError as e:
                if e.errno not in _NO_LOCKING:
                    raise
                self._fallback = True
                self.say(f"[varbench] {self.path.parent}: the filesystem refuses OS locks ({e.strerror}); falling "
                         f"back to exclusive-create lock files (a dead job on another host cannot be detected there)")
                return "no OS locks"   # the next try (at once, below) uses the fallback
            # got the lock: is it still the file at self.path (not one a releaser just unlinked)?
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if not same:
                return "being released"
            left = os.pread(fd, 4096, 0).decode(errors="replace").strip()
            if left:     # a name but no OS lock: its writer died holding it
                self.took_over = left
                self.say(f"[varbench] took over {self.what}: its last holder ({left}) died without releasing it "
                         f"(killed or crashed); resuming")
            os.ftruncate(fd, 0)
            os.pwrite(fd, holder_text().encode() + b"\n", 0)
            self._fd, keep = fd, True
            return None
        finally:
            if not keep:
                os.close(fd)

    def _try_excl(self) -> str | None:
        """Fallback without OS locks: O_EXCL create; a same-host leftover of a dead pid is taken over."""
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
        except FileExistsError:
            text = _read_text(self.path)
            info = _parse_holder(text)
            host, pid = info.get("host"), info.get("pid", "")
            if host == socket.gethostname() and pid.isdigit() and not _pid_alive(int(pid)):
                # a leftover of a dead process on this host: replace it (rename is atomic; the loser of a
                # race between two takers finds the other's fresh file and waits)
                tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.takeover")
                try:
                    os.rename(self.path, tmp)
                    tmp.unlink(missing_ok=True)
                except FileNotFoundError:
                    pass
                self.took_over = text
                self.say(f"[varbench] took over {self.what}: its last holder ({text}) is no longer running")
                return self._try_excl()
            return text
        with os.fdopen(fd, "w") as f:
            f.write(holder_text() + "\n")
        self._excl = True
        return None


def current_umask() -> int:
    """The process umask, read without changing it (``/proc/self/status``, Linux >= 4.7); elsewhere
    the value read once at import (set-and-restore, before any thread of ours runs)."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return _IMPORT_UMASK


def _read_umask_once() -> int:
    old = os.umask(0o022)
    os.umask(old)
    return old


_IMPORT_UMASK = _read_umask_once()


def file_mode() -> int:
    """Mode a new regular file gets from ``open()`` under the current umask (``0o666 & ~umask``)."""
    return 0o666 & ~current_umask()


def process_start_time() -> float:
    """Unix time this process started (``/proc``), else when this module was imported."""
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        ticks = int(fields[19])          # field 22 (starttime), counted after "pid (comm)"
        with open("/proc/stat", "rb") as f:
            btime = next(int(line.split()[1]) for line in f if line.startswith(b"btime"))
        return btime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return _IMPORTED_AT


_IMPORTED_AT = time.time()


def clean_stray_tmp(folder: str | os.PathLike, older_than: float | None = None, recursive: bool = False,
                    patterns: tuple[str, ...] = (".*.tmp",)) -> list[Path]:
    """Delete temp files (``patterns``, default the ``.<name>.<random>.tmp`` files of
    :func:`varbench.core.jsonio.atomic_write_bytes`) that a killed write left in ``folder``; returns them.

    Only files last modified before ``older_than`` (default: this process's start) go: a temp file
    of a write in flight in another live job is younger than that job, and writers of a folder
    are serialised by its lock, so call this while holding the folder's lock."""
    folder = Path(folder)
    cutoff = process_start_time() if older_than is None else float(older_than)
    removed = []
    if not folder.is_dir():
        return removed
    for pat in patterns:
        for p in (folder.rglob(pat) if recursive else folder.glob(pat)):
            try:
                if p.is_file() and p.stat().st_mtime < cutoff:
                    p.unlink()
                    removed.append(p)
            except FileNotFoundError:
                continue
    return removed
