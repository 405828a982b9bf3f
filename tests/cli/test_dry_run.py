"""``--dry-run`` (varbench.cli.dry_run): the jobs, what is finished, and estimates from the store."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from varbench.cli.dry_run import PastRun, dry_run_lines, estimate
from varbench.cli.report import eta_text, note_done
from varbench.cli.sweep_plan import plan_command

ROOT = Path(__file__).resolve().parents[2]
CPU = "cpu (X, x86_64, 2 threads)"


def test_the_estimate_prefers_the_same_method_then_scales_other_runs_and_never_crosses_devices():
    runs = [PastRun("baseline", "toy", "0.06M@1", 120, CPU, 300.0),
            PastRun("nova", "toy", "0.06M@1", 120, CPU, 200.0),
            PastRun("nova", "toy", "0.06M@1", 120, "NVIDIA H200 (...)", 20.0)]
    assert estimate(runs, "nova", "toy", "0.06M@1", 120, CPU) == (200.0, "past run")
    assert estimate(runs, "fastvar", "toy", "0.06M@1", 120, CPU) == (250.0, "other methods' 2 runs of toy with 120 images")
    runs.append(PastRun("nova", "toy", "0.06M@1", 8, CPU, 40.0))          # small: fixed costs dominate
    s, source = estimate(runs, "fastvar", "toy", "0.06M@1", 60, CPU)
    assert s == pytest.approx(125.0) and source == "scaled from 2 runs of toy with 120 images"   # median 2.5 s/image x 60
    s, source = estimate(runs, "fastvar", "toy", "0.06M@1", 10, CPU)
    assert s == pytest.approx(50.0) and source == "scaled from 1 run of toy with 8 images"     # the closest size: 5 s/image
    assert estimate(runs, "nova", "toy", "1M@1", 120, CPU)[0] is None                 # another resolution
    assert estimate(runs, "nova", "toy", "0.06M@1", 120, "cpu (Y)")[0] is None         # another machine's times say nothing


def test_the_eta_averages_the_jobs_that_ran_not_the_skipped_ones(tmp_path):
    note_done(tmp_path, 0.0, skipped=True)                  # a relaunch found it finished
    rows = note_done(tmp_path, 120.0, skipped=False)
    assert len(rows) == 2
    assert eta_text(rows, 5) == "sweep ≈ 6 min left (3 jobs)"   # 120 s x 3 jobs left
    assert eta_text(rows, 2) is None and eta_text(rows, None) is None
    assert eta_text(rows[:1], 5) is None                    # nothing ran yet: no rate to go on


@pytest.mark.integration
def test_the_dry_run_lists_finished_and_new_jobs_with_estimates_and_writes_nothing(tmp_path):
    from varbench.harness.job import run_job
    from varbench.testing.jobs import job_config

    common = [f"paths.store_dir={tmp_path}/store", f"paths.results_dir={tmp_path}/results", "model=toy",
              "benchmark.limit=2", "timing=none", "evaluator=[]"]
    run_job(job_config(tmp_path, *common, "runtime.progress=false"))     # baseline finished once
    before = sorted(str(p) for p in (tmp_path / "store").rglob("*"))
    plan = plan_command(["+experiment=smoke", "-m", "method=baseline,nova", *common])
    lines = dry_run_lines(plan)
    text = "\n".join(lines)
    assert lines[0] == "[varbench] dry run: 2 jobs of smoke (nothing is run)"
    base, nova = [line for line in lines if "method=" in line]
    assert "finished (skipped)" in base and "—" in base
    assert "new: 2 images" in nova and "(other methods' run of toy with 2 images)" in nova   # the baseline's
    assert "knobs of per_model.toy" in nova and "per_model" not in base   # nova's toy block (varbench/harness/per_model.py)
    assert "1 to run, 1 finished; ≈" in text and "every file the jobs need is in place" in text
    assert sorted(str(p) for p in (tmp_path / "store").rglob("*")) == before      # nothing written


def test_the_dry_run_shows_a_refusal_as_the_jobs_status(tmp_path):
    common = [f"paths.store_dir={tmp_path}/store", f"paths.results_dir={tmp_path}/results", "model=toy"]
    lines = dry_run_lines(plan_command(["+experiment=smoke", "method=fastvar", *common]))
    job = next(line for line in lines if "incompatible combination:" in line)   # its own first words
    assert "method=fastvar on model=toy: FastVAR's released rules key on token-map widths" in job
    assert "use method=fastvar_generalised" in job


@pytest.mark.integration
def test_the_command_takes_dry_run_and_help_flags(tmp_path):
    env = {**os.environ, "VARBENCH_HOME": str(tmp_path), "VARBENCH_WEIGHTS": str(tmp_path / "none")}
    dry = subprocess.run([sys.executable, "-m", "varbench", "+experiment=nova_sweep", "model=infinity_2b", "--dry-run"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    out = dry.stdout + dry.stderr
    assert dry.returncode == 0, out
    assert "dry run: 9 jobs of nova_sweep" in out and "method=nova_on_fastvar" in out
    assert out.count("cannot start") == 9 and "infinity_2b_reg.pth" in out    # the missing files, listed once
    assert not (tmp_path / "store").exists() and not (tmp_path / "outputs").exists()
    helped = subprocess.run([sys.executable, "-m", "varbench", "--help"], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=120)
    assert helped.returncode == 0 and "nova_fast" in helped.stdout and "--dry-run" in helped.stdout
    assert "_schema" not in helped.stdout
