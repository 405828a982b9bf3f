"""What a job tells the world while it runs: the :class:`JobObserver` hooks.

The job (:mod:`varbench.harness.job`) calls the hooks of the observers it is handed at fixed
points and knows nothing about who listens. The command line wires them
(:func:`varbench.cli.run.job_observers`): the ones the ``logger`` config names (``logger=wandb``:
:class:`varbench.loggers.observer.WandbObserver`) and its own console report (the result line,
:class:`varbench.cli.report.ResultLine`), the way composer's callbacks and lm-eval's loggers
subscribe to a trainer or an evaluation.

Hooks, in the order a job calls them::

    job_skipped(job, record)          the entry was finished before (a relaunch, or another job finished it
                                      while this one waited for its lock); its seal is checked; nothing runs
    job_started(job)                  the job holds its entry's (or shard's) lock and has work to do;
                                      before any model is built
    progress(job, stage, done, total) after each batch of a stage ("generate nova", "score hpsv2", "timing")
    job_finished(job, record)         after DONE; record None: a shard that did not assemble the record
    job_failed(job, error)            anything raised after job_started (the error propagates afterwards)
    record_assembled(job, record)     outside any run: ``python -m varbench.job assemble`` sealed the record
                                      of a sharded entry

An error raised by a hook propagates: an observer that cannot work (a missing W&B login) fails the
job in ``job_started``, before any compute, naming the fix. Observers that only mirror (W&B)
catch their own errors after that, so a mirror never costs a finished record.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping


class JobObserver:
    """Base class: every hook does nothing; an observer overrides the ones it needs."""

    def job_skipped(self, job: Any, record: Mapping) -> None:
        """The entry was finished already; ``record`` is its verified record."""

    def job_started(self, job: Any) -> None:
        """The job holds its lock and will build its model."""

    def progress(self, job: Any, stage: str, done: int, total: int) -> None:
        """``done`` of ``total`` items of ``stage`` (the progress bar's description) are finished."""

    def job_finished(self, job: Any, record: Mapping | None) -> None:
        """The job ended well: ``record`` is sealed (None: a shard that did not assemble it)."""

    def job_failed(self, job: Any, error: BaseException) -> None:
        """The job raised ``error`` after :meth:`job_started`."""

    def record_assembled(self, job: Any, record: Mapping) -> None:
        """The assemble command sealed ``record`` from a sharded entry's finished shards."""


def notify(observers: Iterable[JobObserver], hook: str, job: Any, *args: Any) -> None:
    """Call ``hook`` of every observer, in order."""
    for observer in observers:
        getattr(observer, hook)(job, *args)


class ObservedBar:
    """A progress bar whose ``update(n)`` also reports the running count to ``report(stage, done,
    total)``; everything else is the wrapped bar's (a tqdm bar, as :meth:`varbench.harness.job.Job.bar`
    makes)."""

    def __init__(self, bar: Any, stage: str, total: int, report: Callable[[str, int, int], None]):
        self._bar, self._stage, self._total, self._report, self._done = bar, stage, int(total), report, 0

    def update(self, n: int = 1):
        self._done += n
        self._report(self._stage, self._done, self._total)
        return self._bar.update(n)

    def close(self):
        return self._bar.close()

    def __getattr__(self, name):
        return getattr(self._bar, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
