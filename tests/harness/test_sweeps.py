"""A real `python -m varbench -m` sweep on the tiny model with one job made to fail (issue #12
item 11): the sweep exits non-zero and names the failed job and its error; the good job's record
and the table are still written. As lightning-hydra-template's tests/test_sweeps.py, in a subprocess."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from varbench.analysis.layout import group_dirs

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.integration
def test_a_sweep_with_a_failed_job_exits_nonzero_and_names_it(tmp_path):
    sweep = tmp_path / "sweep"
    (sweep).mkdir()
    (sweep / "failed_jobs.jsonl").write_text('{"overrides": ["stale"], "error": "from an earlier launch"}\n')
    cmd = [sys.executable, "-m", "varbench", "-m", "+experiment=smoke", "evaluator=[]", "timing=none",
           "benchmark.limit=1", "runtime.progress=false", "method.name=baseline,bogus",
           f"paths.output_root={tmp_path}", f"hydra.sweep.dir={sweep}"]
    env = {**os.environ, "VARBENCH_STORE": str(tmp_path / "store")}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "1 job(s) of this sweep failed:" in out, out     # a ConfigError names its fix: no traceback to look up
    assert "FAILED" in out and "method.name=bogus" in out and "Unknown method 'bogus'" in out, out
    assert "stale" not in out                                       # notes of an earlier launch are cleared
    failed = [json.loads(x) for x in (sweep / "failed_jobs.jsonl").read_text().splitlines()]
    assert len(failed) == 1 and "method.name=bogus" in failed[0]["overrides"]
    assert list((tmp_path / "store" / "smoke").glob("**/DONE"))      # the good job still finished
    assert "| baseline |" in out                                    # and the table was written
    [folder] = group_dirs(tmp_path / "results" / "smoke")           # one model and resolution: one folder
    table = (folder / "table.md").read_text()
    assert ("Not in this table: 1 job(s) of the sweep failed: +experiment=smoke evaluator=[] timing=none "
            "benchmark.limit=1 runtime.progress=False method.name=bogus (ConfigError)." in table), table  # says what it lacks
    assert str(tmp_path) not in table                               # no machine-local paths in a pasted table
    assert "[varbench] job 1/2 done · baseline · 1 images" in out, out  # one result line per job, placed in the sweep
    # each job's lines are in its own log file too (they were only on the console)
    assert "[varbench] job 1/2 done · baseline" in (sweep / "0" / "__main__.log").read_text()
    assert "ConfigError: method.name: Unknown method 'bogus'" in (sweep / "1" / "__main__.log").read_text()


def _run(tmp_path, *args):
    env = {**os.environ, "VARBENCH_STORE": str(tmp_path / "store"), "VARBENCH_WEIGHTS": str(tmp_path / "no_weights")}
    cmd = [sys.executable, "-m", "varbench", *args, "+experiment=smoke", "model=infinity_2b", "evaluator=[]",
           "timing=none", "benchmark.limit=1", "runtime.progress=false", f"paths.output_root={tmp_path}"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    return proc.returncode, proc.stdout + proc.stderr


@pytest.mark.integration
def test_missing_weights_fail_every_job_alike_and_are_said_once_without_a_traceback(tmp_path):
    """Forgetting VARBENCH_WEIGHTS fails every job of a sweep with the same error. The first job
    prints it in full; the others point at it; the end of the sweep names all jobs on one line. The
    message names the fix, so no traceback is printed (it once printed 309 lines for a 9-job sweep)."""
    rc, out = _run(tmp_path, "-m", "method=baseline,skip_last_1", "--no-preflight")   # the jobs' own reports
    assert rc == 1, out
    assert "Traceback" not in out, out
    assert "2 job(s) of this sweep failed" in out, out
    assert "FAILED 2 jobs (method=baseline, method=skip_last_1; all with +experiment=smoke" in out, out
    assert "WeightsNotFound: Infinity transformer weights not found: infinity_2b_reg.pth" in out, out
    assert "the same WeightsNotFound as (method=baseline" in out, out
    assert out.count("fix: put the file there") == 2, out      # the first job, and the end-of-sweep list
    assert "no job of this sweep finished: no table written" in out, out


@pytest.mark.integration
def test_a_sweep_whose_every_job_failed_does_not_reprint_an_earlier_table(tmp_path):
    env = {**os.environ, "VARBENCH_STORE": str(tmp_path / "store")}
    common = ["+experiment=smoke", "evaluator=[]", "timing=none", "benchmark.limit=1", "runtime.progress=false",
              f"paths.output_root={tmp_path}"]
    first = subprocess.run([sys.executable, "-m", "varbench", *common], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=600)
    assert first.returncode == 0, first.stdout + first.stderr
    [folder] = group_dirs(tmp_path / "results" / "smoke")
    table = folder / "table.md"
    assert table.is_file(), first.stdout + first.stderr
    before = table.stat().st_mtime_ns
    proc = subprocess.run([sys.executable, "-m", "varbench", "-m", *common, "method.name=bogus,bogus2"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "2 job(s) of this sweep failed" in out, out
    assert "| baseline |" not in out, out                    # the earlier run's table is not shown as this sweep's
    assert (f"no job of this sweep finished: no table written (the tables under {tmp_path / 'results' / 'smoke'} are "
            "from an earlier run)") in out, out
    assert table.stat().st_mtime_ns == before


@pytest.mark.integration
def test_missing_weights_in_a_single_run_exit_2_with_the_message_only(tmp_path):
    rc, out = _run(tmp_path, "hydra.mode=RUN", "method=baseline", "--no-preflight")
    assert rc == 2, out
    assert "Traceback" not in out and "[varbench] WeightsNotFound: Infinity transformer weights not found" in out, out
    assert "fix: put the file there" in out, out


@pytest.mark.integration
def test_the_preflight_names_every_missing_file_of_a_sweep_once_before_any_job_starts(tmp_path):
    """Without the weights and with an evaluator whose checkpoint is absent, the sweep stops before
    its first job with one list: the model's three files and the HPSv2 checkpoint, each once for
    both jobs (the jobs would have named one file per launch)."""
    env = {**os.environ, "VARBENCH_STORE": str(tmp_path / "store"), "VARBENCH_WEIGHTS": str(tmp_path / "no_weights")}
    cmd = [sys.executable, "-m", "varbench", "-m", "method=baseline,skip_last_1", "+experiment=smoke",
           "model=infinity_2b", "evaluator=[hpsv2]", "timing=none", "benchmark.limit=1", f"paths.output_root={tmp_path}"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    rc, out = proc.returncode, proc.stdout + proc.stderr
    assert rc == 2, out
    assert "Traceback" not in out, out
    assert "4 files the sweep needs are missing (no job was started; 2 jobs checked)" in out, out
    for name in ("infinity_2b_reg.pth", "infinity_vae_d32reg.pth", "flan-t5-xl", "HPS_v2.1_compressed.pt"):
        heads = [line for line in out.splitlines() if line.lstrip()[:2].rstrip(".").isdigit() and name in line]
        assert len(heads) == 1, (name, out)              # named once for both jobs
    assert out.count("(every job)") == 4, out
    assert "job 1" not in out and not (tmp_path / "store" / "smoke").exists(), out   # nothing started


@pytest.mark.integration
def test_third_party_info_logs_stay_out_of_the_console(tmp_path):
    """open_clip logs every model build at INFO to the root logger (8 lines per scorer); the job's
    logging keeps the root at WARNING, so the console shows varbench's lines and real warnings."""
    env = {**os.environ, "VARBENCH_STORE": str(tmp_path / "store")}
    cmd = [sys.executable, "-m", "varbench", "+experiment=smoke", "evaluator=[hpsv2_tiny]", "timing=none",
           "benchmark.limit=1", "runtime.progress=false", f"paths.output_root={tmp_path}"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "[varbench] record:" in out and "No pretrained weights loaded" in out, out   # a WARNING still shows
    assert "[root][INFO]" not in out, out


@pytest.mark.integration
@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_asked_for_on_a_machine_without_it_is_a_config_error(tmp_path):
    env = {**os.environ, "VARBENCH_STORE": str(tmp_path / "store")}
    cmd = [sys.executable, "-m", "varbench", "+experiment=smoke", "hydra.mode=RUN", "runtime.device=cuda",
           "evaluator=[]", "timing=none", "benchmark.limit=1", f"paths.output_root={tmp_path}"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "Traceback" not in out, out
    assert "[varbench] config error: runtime.device=cuda but CUDA is not available here; use runtime.device=cpu" in out, out


def test_the_failure_report_points_at_the_logs_only_when_a_traceback_is_there(tmp_path, capsys):
    from varbench.cli.callbacks import failures_path, report_failures

    path = failures_path(tmp_path)
    path.write_text(json.dumps({"overrides": ["method=a"], "error": "ConfigError: x", "traceback_logged": False}) + "\n")
    assert report_failures(tmp_path) == 1
    out = capsys.readouterr().out
    assert "1 job(s) of this sweep failed:" in out and "logs" not in out
    with open(path, "a") as f:
        f.write(json.dumps({"overrides": ["method=b"], "error": "RuntimeError: y", "traceback_logged": True}) + "\n")
    assert report_failures(tmp_path) == 2
    assert f"2 job(s) of this sweep failed (tracebacks in the job logs under {tmp_path}):" in capsys.readouterr().out
