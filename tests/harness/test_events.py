"""The job's hooks (varbench/harness/events.py): what a job tells its observers, in which order,
and that the job itself imports no observer (W&B and the result line are wired by the cli)."""
import ast
import types
from pathlib import Path

import pytest

from varbench.harness.events import JobObserver, ObservedBar, notify
from varbench.harness.job import run_job
from varbench.testing.jobs import job_config

ROOT = Path(__file__).resolve().parents[2]


class Recorder(JobObserver):
    def __init__(self):
        self.calls = []

    def job_skipped(self, job, record):
        self.calls.append(("skipped", record["entry_id"]))

    def job_started(self, job):
        self.calls.append(("started",))

    def progress(self, job, stage, done, total):
        self.calls.append(("progress", stage, done, total))

    def job_finished(self, job, record):
        self.calls.append(("finished", None if record is None else record["entry_id"]))

    def job_failed(self, job, error):
        self.calls.append(("failed", type(error).__name__))


def test_observed_bar_reports_the_running_count_and_stays_the_bar():
    seen, reports = [], []
    bar = ObservedBar(types.SimpleNamespace(update=seen.append, close=lambda: seen.append("closed"), n=7),
                      "generate nova", 3, lambda *a: reports.append(a))
    bar.update(2)
    bar.update(1)
    bar.close()
    assert seen == [2, 1, "closed"] and bar.n == 7
    assert reports == [("generate nova", 2, 3), ("generate nova", 3, 3)]


def test_notify_calls_every_observer_in_order():
    a, b = Recorder(), Recorder()
    notify([a, b], "job_started", object())
    assert a.calls == b.calls == [("started",)]
    JobObserver().job_finished(None, None)            # the base class's hooks do nothing


@pytest.mark.integration
def test_a_job_tells_its_observers_started_progress_finished_then_skipped(tmp_path):
    cfg = job_config(tmp_path, "evaluator=[]", "benchmark.limit=2", "runtime.batch_size=2", "runtime.progress=false",
                     "timing=none")
    rec = Recorder()
    entry = run_job(cfg, [rec])
    assert rec.calls[0] == ("started",) and rec.calls[-1] == ("finished", entry.name)
    assert ("progress", "generate baseline", 2, 2) in rec.calls
    again = Recorder()
    run_job(cfg, [again])                              # finished: skipped, nothing started
    assert again.calls == [("skipped", entry.name)]
    assert run_job(cfg) == entry                       # no observers: nothing to tell


@pytest.mark.integration
def test_a_failing_job_says_so_after_it_started(tmp_path, monkeypatch):
    import varbench.harness.job as job_mod

    def boom(*a, **k):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(job_mod, "generate_stage", boom)
    rec = Recorder()
    with pytest.raises(RuntimeError, match="out of memory"):
        run_job(job_config(tmp_path, "evaluator=[]", "benchmark.limit=1", "runtime.progress=false", "timing=none"), [rec])
    assert rec.calls == [("started",), ("failed", "RuntimeError")]


def test_the_job_imports_no_logger_and_no_cli():
    """The layering the hooks buy: harness/job.py names neither W&B nor the command line."""
    tree = ast.parse((ROOT / "varbench" / "harness" / "job.py").read_text())
    mods = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    mods |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not {m for m in mods if m.startswith(("varbench.loggers", "varbench.cli"))}
