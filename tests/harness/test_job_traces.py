"""The entry's traces.jsonl is sealed only when it holds every image's row (issue 21 item 1).

A kill -9 half-way through the copy from the store, or ENOSPC in the middle of it, used to leave
1 of 3 (or 0 of 3) rows in the entry, and the relaunch wrote DONE over it: keep-ratio heatmaps,
entropy figures and the W&B per-scale table then read fewer images without a word."""
from __future__ import annotations

import json

import pytest

from varbench.core.jsonio import read_jsonl
from varbench.harness.job import run_job
from varbench.harness.traces import TraceCountError
from varbench.testing.jobs import job_config


def _cfg(tmp_path, *extra):
    return job_config(tmp_path, "evaluator=[]", "benchmark.limit=3", "runtime.batch_size=2", "runtime.progress=false",
                      "timing=none", *extra)


def _unfinish(entry):
    (entry / "DONE").unlink()
    (entry / "record.json").unlink()


@pytest.mark.integration
def test_a_partial_trace_copy_is_replaced_before_done_and_a_short_store_stops_the_job(tmp_path, monkeypatch):
    cfg = _cfg(tmp_path)
    entry = run_job(cfg)
    full = read_jsonl(entry / "traces.jsonl")
    assert len(full) == 3

    # a copy cut short (kill -9 mid-copy, or a full disk): 1 of 3 rows, no DONE
    _unfinish(entry)
    lines = (entry / "traces.jsonl").read_text().splitlines(keepends=True)
    (entry / "traces.jsonl").write_text(lines[0])
    run_job(cfg)
    assert (entry / "DONE").exists()
    assert read_jsonl(entry / "traces.jsonl") == full                   # every image's row, as in the store
    assert "traces.jsonl" in json.loads((entry / "DONE").read_text())["files"]

    # an empty copy (0 of 3) is replaced too
    _unfinish(entry)
    (entry / "traces.jsonl").write_text("")
    run_job(cfg)
    assert len(read_jsonl(entry / "traces.jsonl")) == 3

    # the store itself lacks a row (a hand-edited or damaged traces.jsonl): no DONE, one named error
    _unfinish(entry)
    rec_store = next((tmp_path / "store" / "images").iterdir())
    store_lines = (rec_store / "traces.jsonl").read_text().splitlines(keepends=True)
    (rec_store / "traces.jsonl").write_text("".join(store_lines[:2]))
    with pytest.raises(TraceCountError, match=r"trace rows for 2 of the 3 images.*images.jsonl"):
        run_job(cfg)
    assert not (entry / "DONE").exists()


def test_the_copy_is_one_atomic_write(tmp_path, monkeypatch):
    """A write that fails part-way (here: the rename never happens) leaves the old file whole."""
    import os

    from varbench.harness.records import RunEntry

    entry = RunEntry(tmp_path, "e")
    entry.write_traces([{"prompt_index": 0, "sample_index": 0}])
    before = entry.traces_path.read_bytes()

    def killed(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(OSError):
        entry.write_traces([{"prompt_index": p, "sample_index": 0} for p in range(4)])
    assert entry.traces_path.read_bytes() == before
    assert not [p for p in entry.dir.iterdir() if p.name.endswith(".tmp")]   # the temp file is removed
