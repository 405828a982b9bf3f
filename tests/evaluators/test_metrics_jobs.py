"""The new metrics in real jobs on the tiny model: CLIP score and FID columns where configured."""
import json

import pandas as pd
import pytest

from varbench.harness.job import run_job
from varbench.testing.jobs import job_config


def _cfg(tmp_path, *extra):
    return job_config(tmp_path, "benchmark.limit=3", "runtime.batch_size=2", "runtime.progress=false",
                      "timing=none", *extra)


@pytest.mark.integration
def test_fid_vs_baseline_and_clip_score_land_in_the_record_and_the_table(tmp_path):
    from varbench.cli.callbacks import aggregate_experiment

    evs = "evaluator=[fid_tiny,clipscore_tiny]"
    base = json.loads((run_job(_cfg(tmp_path, evs, "experiment_name=m")) / "record.json").read_text())
    assert base["metrics"]["fid_tiny/fid"] == pytest.approx(0.0, abs=1e-6)       # the baseline against itself
    assert 0 <= base["metrics"]["clipscore_tiny/score"] <= 100
    meth = json.loads((run_job(_cfg(tmp_path, evs, "experiment_name=m", "method=skip_last_2")) / "record.json").read_text())
    assert meth["metrics"]["fid_tiny/fid"] > 0                                   # fewer scales: other images
    assert meth["evaluators"]["fid_tiny"]["protocol"].startswith("clean-fid")
    result = aggregate_experiment(_cfg(tmp_path, evs, "experiment_name=m"))
    tidy = pd.read_csv(result.out / "tidy.csv")
    assert {"fid_tiny/fid", "clipscore_tiny/score"} <= set(tidy.columns)
    [g] = result.groups
    table = (g.folder / "table.md").read_text()
    assert "fid" in table.lower() and "clip" in table.lower()
    # fid_tiny names the class fid, which compares with the baseline already: no Δ column for it
    assert "Δ fid" not in table and "Δ clipscore" in table
