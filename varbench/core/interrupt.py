"""Graceful stop: SIGTERM (Slurm's time limit and preemption), SIGUSR2 and Ctrl-C end a job between
two units of work, so a relaunch resumes it and nothing half-made is kept.

Usage::

    from varbench.core.interrupt import GracefulStop, JobInterrupted, check_stop, uninterruptible
    with GracefulStop():                         # around one job (main thread)
        for batch in batches:
            with uninterruptible():              # a signal here lets the batch finish:
                generate(batch); write(batch); commit(batch)
            # ... and is raised here, as JobInterrupted, once the batch is committed
        score()                                  # a signal here stops at once (JobInterrupted)

Semantics:

* A signal outside an :func:`uninterruptible` block raises :class:`JobInterrupted` at once (from
  the handler, like Ctrl-C's KeyboardInterrupt): ``finally`` blocks run, so locks are released
  and temp files removed; everything varbench writes is resumable, so no finished work is lost.
* Inside an :func:`uninterruptible` block the signal is noted and raised when the block ends
  normally: the image batch in flight is written, fsynced and committed first. Keep such blocks
  short: Slurm sends SIGKILL ``KillWait`` seconds (default 30) after SIGTERM; ``sbatch
  --signal=B:USR2@120`` sends SIGUSR2 two minutes before the time limit instead.
* A second signal while the first is pending raises at once, even inside a block (an impatient
  Ctrl-C, or a scheduler that will not wait).
* :class:`JobInterrupted` is a ``SystemExit`` with the conventional code ``128 + signal number``
  (143 for SIGTERM, 130 for Ctrl-C, 140 for SIGUSR2): it passes through ``except Exception`` (so a
  Hydra sweep stops instead of going on with its next job) and the process exits with that code.
  ``with GracefulStop(immediate=False)`` only notes signals; the code then calls
  :func:`check_stop` (or reads :func:`stop_requested`) where it may stop. A stop noted but never
  honoured is raised when the ``GracefulStop`` block ends.
* Blocks nest: the ``varbench`` command wraps the whole process in ``GracefulStop(immediate=False)``
  and each job in ``GracefulStop()``. A signal that lands between two jobs (while Hydra composes the
  next job's config) is only noted, so it never raises inside Hydra or OmegaConf; the next job's
  block raises it on entry, before any work. With a launcher whose jobs run in other processes
  (submitit), the launching process only waits, and :func:`set_immediate` makes it stop at once.
* A handler the process had before (a Python function, not Python's defaults) is not lost: at
  the safe point where the job stops, it is called first. Under Slurm through submitit that is
  submitit's SIGUSR2 handler, which requeues the job (``max_num_timeout``) and exits; the requeued
  job resumes where this one stopped. A handler that returns (submitit's SIGTERM "bypass") is
  followed by :class:`JobInterrupted` as usual.
* The previous handlers come back when the block ends. Outside the main thread (where Python
  cannot install handlers) ``GracefulStop`` does nothing and signals keep their usual effect.
"""
from __future__ import annotations

import contextlib
import os
import signal
import threading
from typing import Iterator, Sequence

#: What a GracefulStop catches by default.
DEFAULT_SIGNALS: tuple[int, ...] = tuple(s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGINT", None),
                                                     getattr(signal, "SIGUSR2", None)) if s is not None)


class JobInterrupted(SystemExit):
    """The job stopped on a signal; exits the process with ``128 + signum``. A relaunch resumes."""

    def __init__(self, signum: int):
        self.signum = int(signum)
        super().__init__(128 + self.signum)

    def __str__(self) -> str:
        return (f"stopped by {_name(self.signum)} (exit code {128 + self.signum}); finished work is kept: "
                f"relaunch the same command to resume")


def _name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


_requested: int | None = None   # the pending signal, if any
_deferred = 0                   # depth of uninterruptible() blocks
_immediate = True               # the active GracefulStop's mode
_active = 0                     # nesting depth of active GracefulStop blocks
_chained: dict = {}             # Python handlers the outermost block replaced (e.g. submitit's requeue)
_farewell: str | None = None    # said once when the stop is raised (set_immediate)


def _say(msg: str) -> None:
    try:
        os.write(2, (msg + "\n").encode())   # async-signal safe: print() can fail re-entered
    except OSError:
        pass


def _stop(signum: int) -> None:
    """Stop for ``signum`` at a safe point: first the handler this process had before the
    outermost block (if it was a Python function, such as submitit's, which requeues the Slurm job
    and exits), then :class:`JobInterrupted` if that handler returned."""
    global _farewell
    previous = _chained.get(signum)
    if previous is not None:
        previous(signum, None)
    if _farewell:
        _say(_farewell)
        _farewell = None
    raise JobInterrupted(signum)


def _handler(signum: int, frame) -> None:
    global _requested
    if _requested is not None:
        _say(f"[varbench] {_name(signum)} again: stopping now")
        _stop(signum)
    _requested = signum
    if _immediate and _deferred == 0:
        _say(f"[varbench] {_name(signum)}: stopping now (finished work is kept; relaunch to resume)")
        _stop(signum)
    _say(f"[varbench] {_name(signum)}: finishing the current unit of work, then stopping "
         f"(finished work is kept; relaunch to resume; send it again to stop at once)")


def stop_requested() -> bool:
    """True once a handled signal arrived (and until the GracefulStop block ends)."""
    return _requested is not None


def check_stop() -> None:
    """Raise :class:`JobInterrupted` if a stop was requested (call it between units of work)."""
    if _requested is not None:
        _stop(_requested)


def set_immediate(immediate: bool, farewell: str | None = None) -> None:
    """Change the active block's mode (no-op outside one). The ``varbench`` command's outer block
    defers, which protects Hydra while it composes the next job in this process; a launcher whose
    jobs run in other processes (submitit) makes it immediate, so Ctrl-C while the launching process
    waits for them stops waiting at once. A stop already noted is raised now if ``immediate``.
    ``farewell``: a line said when the stop is raised (e.g. what became of the submitted jobs)."""
    global _immediate, _farewell
    if _active == 0 or threading.current_thread() is not threading.main_thread():
        return
    _immediate = bool(immediate)
    _farewell = farewell
    if _immediate and _deferred == 0:
        check_stop()


@contextlib.contextmanager
def uninterruptible() -> Iterator[None]:
    """Defer a stop until this block ends normally (then raise it); see the module docstring."""
    global _deferred
    _deferred += 1
    try:
        yield
    finally:
        _deferred -= 1
    if _deferred == 0 and _immediate:
        check_stop()


class GracefulStop:
    """Handle ``signals`` (default SIGTERM, SIGINT, SIGUSR2) for the block; see the module docstring.

    ``immediate``: True raises outside :func:`uninterruptible` blocks at once; False only notes the
    signal for :func:`check_stop`. A nested block shares the outer one's handlers and sets the mode
    for its own extent (the outer mode comes back when it ends); an immediate block entered while a
    stop is pending raises it at once."""

    def __init__(self, signals: Sequence[int] = DEFAULT_SIGNALS, immediate: bool = True):
        self.signals = tuple(signals)
        self.immediate = immediate
        self._previous: dict[int, object] = {}
        self._installed = False
        self._outer_mode = True

    def __enter__(self) -> "GracefulStop":
        global _requested, _immediate, _active
        if threading.current_thread() is not threading.main_thread():
            return self                     # Python allows handlers in the main thread only
        self._outer_mode = _immediate
        if _active == 0:
            _requested = None
            for s in self.signals:
                self._previous[s] = signal.signal(s, _handler)
            _chained.clear()
            _chained.update({s: h for s, h in self._previous.items()
                             if callable(h) and h is not signal.default_int_handler})
            self._installed = True
        elif self.immediate and _requested is not None and _deferred == 0:
            # a stop noted by the outer (deferring) block, e.g. between two jobs of a sweep, is
            # honoured here, where a job may stop, and not inside whatever library code was running
            _stop(_requested)
        _immediate = self.immediate
        _active += 1
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        global _requested, _active, _immediate, _farewell
        if threading.current_thread() is not threading.main_thread():
            return
        _active -= 1
        _immediate = self._outer_mode
        if not self._installed:
            if _requested is not None and exc_type is None and self.immediate:
                _stop(_requested)
            return
        pending = _requested
        for s, prev in self._previous.items():
            signal.signal(s, prev)
        self._previous.clear()
        self._installed = False
        _requested = None
        try:
            if pending is not None and exc_type is None:
                _stop(pending)              # noted but never honoured: do not carry on (e.g. to the next job)
            elif pending is not None and issubclass(exc_type, Exception):
                # the stop unwound through code whose own cleanup then failed (a library context that the
                # signal cut between its setup and its try, e.g. torch's "trying to pop from empty mode
                # stack"): the job stopped because of the signal, and says so (exit 128 + signum), with
                # the cleanup's error as the cause rather than as the job's failure
                raise JobInterrupted(pending) from exc
        finally:
            _chained.clear()
            _farewell = None

    @property
    def requested(self) -> int | None:
        """The pending signal number, or None."""
        return _requested
