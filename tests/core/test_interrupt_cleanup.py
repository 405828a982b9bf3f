"""A signal whose stop unwinds through a cleanup that fails (varbench/core/interrupt.py): the job still
says it stopped for the signal (exit 128 + signum), not that it failed with the cleanup's error.

CI once saw it: SIGTERM landed inside a torch context between its setup and its `try`, and the context's
exit raised "trying to pop from empty mode stack" as JobInterrupted unwound through it, so the sweep
reported a failed job (exit 1) instead of a stopped one (exit 143)."""
import contextlib
import os
import signal

import pytest

from varbench.core.interrupt import GracefulStop, JobInterrupted


@contextlib.contextmanager
def _cleanup_that_fails():
    try:
        yield
    finally:
        raise RuntimeError("trying to pop from empty mode stack")


def test_a_failing_cleanup_under_a_stop_is_still_the_stop():
    with pytest.raises(JobInterrupted) as info:
        with GracefulStop():
            with _cleanup_that_fails():
                os.kill(os.getpid(), signal.SIGTERM)
                signal.sigtimedwait([], 0) if hasattr(signal, "sigtimedwait") else None   # let the handler run
    assert info.value.code == 128 + signal.SIGTERM
    assert isinstance(info.value.__cause__, RuntimeError)


def test_an_error_without_a_signal_stays_the_error():
    with pytest.raises(RuntimeError):
        with GracefulStop():
            with _cleanup_that_fails():
                pass
