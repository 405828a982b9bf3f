"""Hydra launchers for clusters (issue #13 item 1): `hydra/launcher=slurm` and `hydra/launcher=local`
(varbench/conf/hydra/launcher/), both Hydra's submitit launcher.

The local tests are real sweeps with the real `submitit_local` launcher: two tiny-model jobs run as
separate processes, one at a time by default (one job per device) or at the same time
(`hydra.sweeper.max_batch_size=2`), their varbench lines reach the launching console while it waits
(varbench/cli/launcher_watch.py), and the end-of-sweep callback aggregates one table with both rows.
The Slurm config is checked as Hydra composes it (no cluster here): one GPU per job and the documented
time-limit, partition and requeue knobs reach the launcher."""
import json
import os
import re
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
import yaml

from varbench.analysis.layout import group_dirs

ROOT = Path(__file__).resolve().parents[2]
LAUNCHER_DIR = ROOT / "varbench" / "conf" / "hydra" / "launcher"

# Without the `slurm` extra there is no `hydra_plugins` package at all, so `find_spec` of the dotted
# name raised ModuleNotFoundError (it imports the parent) instead of returning None. Import the
# launcher module and `submitit` (which it imports only when it launches): either missing -> this
# module skips, naming the fix; installed but broken (an ImportError that is not
# ModuleNotFoundError) -> an error, not a skip.
SLURM_EXTRA = "hydra-submitit-launcher is not installed: pip install -e .[slurm]"
pytest.importorskip("hydra_plugins.hydra_submitit_launcher.submitit_launcher", reason=SLURM_EXTRA)
pytest.importorskip("submitit", reason=SLURM_EXTRA)


def _launcher_cfg(name: str, *overrides: str) -> dict:
    """The `hydra.launcher` node exactly as `python -m varbench` composes it."""
    cmd = [sys.executable, "-m", "varbench", "+experiment=smoke", f"hydra/launcher={name}", *overrides,
           "--cfg", "hydra", "--package", "hydra.launcher"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return yaml.safe_load(proc.stdout)   # printed as the node itself (`# @package hydra.launcher`)


@pytest.mark.integration
def test_slurm_launcher_composes_one_gpu_per_job_with_its_knobs():
    c = _launcher_cfg("slurm")
    assert c["_target_"].endswith("SlurmLauncher")
    assert c["gpus_per_node"] == 1 and c["tasks_per_node"] == 1 and c["nodes"] == 1
    assert c["timeout_min"] == 240 and c["partition"] is None
    assert c["max_num_timeout"] == 3 and c["additional_parameters"] == {"requeue": True}
    # the knobs are overridable from the command line, as docs/clusters.md shows
    c = _launcher_cfg("slurm", "hydra.launcher.partition=gpu", "hydra.launcher.timeout_min=30",
                      "hydra.launcher.max_num_timeout=0")
    assert (c["partition"], c["timeout_min"], c["max_num_timeout"]) == ("gpu", 30, 0)


def test_every_slurm_knob_is_documented_in_the_config_file():
    """Each key of slurm.yaml carries a comment saying what it trades (docs/clusters.md points at this file)."""
    for name in ("slurm", "local"):
        lines = (LAUNCHER_DIR / f"{name}.yaml").read_text().splitlines()
        keys = [ln for ln in lines if re.match(r"^[a-z_]+:\s*\S", ln)]
        assert keys, name
        undocumented = [ln for ln in keys if "#" not in ln]
        assert not undocumented, f"{name}.yaml keys without a comment: {undocumented}"


def _submitit_logs(sweep: Path) -> dict[str, str]:
    """{job id: the job's stdout} from the submitit folder (`%j` = the local process id)."""
    out = {}
    for f in sweep.glob(".submitit/*/*_0_log.out"):
        out[f.name.split("_")[0]] = f.read_text()
    return out


def _span(log: str) -> tuple[datetime, datetime]:
    stamps = re.findall(r"submitit INFO \((\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+)\) - (Starting|Job completed)", log)
    when = {kind: datetime.strptime(t, "%Y-%m-%d %H:%M:%S,%f") for t, kind in stamps}
    assert set(when) == {"Starting", "Job completed"}, log
    return when["Starting"], when["Job completed"]


def _local_sweep(tmp_path: Path, *overrides: str) -> tuple[str, Path]:
    """A two-job tiny-model sweep (baseline, skip_last_1; one image each, untimed) under the real
    submitit_local launcher: (console output, sweep folder); checks it exits 0 and aggregates one table."""
    sweep = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "varbench", "-m", "+experiment=smoke", "evaluator=[]", "timing=none",
           "benchmark.limit=1", "runtime.progress=false", "method=baseline,skip_last_1", "hydra/launcher=local",
           f"paths.output_root={tmp_path}", f"hydra.sweep.dir={sweep}", *overrides]
    env = {**os.environ, "VARBENCH_STORE": str(tmp_path / "store")}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=230)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "Submitit 'local' sweep output dir" in out, out          # the submitit launcher ran it, not the basic one
    assert len(list((tmp_path / "store" / "smoke").glob("entries/*/DONE"))) == 2, out

    # the launching process aggregated one table with both methods
    folders = group_dirs(tmp_path / "results" / "smoke")
    assert len(folders) == 1, "no aggregated table:\n" + out     # one model and resolution: one folder
    table = folders[0] / "table.md"
    assert table.exists(), "no aggregated table:\n" + out
    rows = [ln for ln in table.read_text().splitlines() if ln.startswith("| ") and "---" not in ln]
    assert sum("| baseline |" in r for r in rows) == 1, table.read_text()          # by name: the column layout may change
    assert sum("| skip_last_1 |" in r for r in rows) == 1, table.read_text()
    return proc.stdout, sweep


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_local_submitit_sweep_runs_one_job_at_a_time_and_echoes_their_lines(tmp_path):
    """The default: one job per device (here the CPU), each job's varbench lines on the launching
    console with its place in the sweep, every job's files in a folder named by its id."""
    out, sweep = _local_sweep(tmp_path)
    assert "[varbench] local launcher: 2 jobs, 1 at a time (one per device, the default" in out, out
    assert "WARNING" not in out, out                                  # timing=none: nothing to spoil

    # the jobs print into their log files only: these lines reached the console through the watcher
    for k, method in ((1, "baseline"), (2, "skip_last_1")):
        assert re.search(rf"^\[varbench\] job {k}/2 started \(submitit job \d+, ", out, re.M), out
        assert re.search(rf"^\[varbench\] job {k}/2 · images: 1 generated", out, re.M), out
        assert re.search(rf"^\[varbench\] job {k}/2 · record: ", out, re.M), out
        assert re.search(rf"^\[varbench\] job {k}/2 done · {method} ", out, re.M), out
    # all of them before the table (the watcher is stopped, and drained, before the aggregation)
    assert out.index("[varbench] job 2/2 done") < out.index("[varbench] wrote "), out

    folders = sorted(p.name for p in (sweep / ".submitit").iterdir() if p.is_dir())
    assert len(folders) == 2 and all(f.isdigit() for f in folders), folders         # no literal "%j"
    logs = _submitit_logs(sweep)
    assert sorted(logs) == folders and os.getpid() not in {int(p) for p in logs}, logs
    (s0, e0), (s1, e1) = sorted(_span(x) for x in logs.values())
    assert e0 <= s1, f"the two jobs overlapped in time: {(s0, e0)} {(s1, e1)}"


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_local_submitit_sweep_runs_jobs_in_parallel_processes_when_asked(tmp_path):
    """`hydra.sweeper.max_batch_size=2`: both jobs at once, each in its own process (submitit_local's
    job id is the child's pid). Untimed, so no warning."""
    out, sweep = _local_sweep(tmp_path, "hydra.sweeper.max_batch_size=2")
    assert "2 jobs, 2 at a time (hydra.sweeper.max_batch_size=2)" in out and "WARNING" not in out, out
    logs = _submitit_logs(sweep)
    assert len(logs) == 2 and os.getpid() not in {int(p) for p in logs}, logs
    for log in logs.values():
        assert "[varbench] record:" in log, log
    (s0, e0), (s1, e1) = (_span(x) for x in logs.values())
    assert s0 < e1 and s1 < e0, f"the two jobs did not overlap in time: {(s0, e0)} {(s1, e1)}"


def _task_pids(sweep: Path, module: bytes = b"submitit.core._submit") -> list[int]:
    """Pids of the submitit task processes (``python -m submitit.core._submit <folder>``) of ``sweep``
    (``module=b"submitit"``: its local controllers too)."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(module in c for c in cmd) and any(str(sweep).encode() in c for c in cmd):
            pids.append(int(d.name))
    return pids


def _committed_images(store: Path) -> list[tuple[int, int]]:
    rows = []
    for index in store.glob("images/*/images.jsonl"):
        for line in index.read_text().splitlines():
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue
            rows.append((int(r["prompt_index"]), int(r["sample_index"])))
    return rows


def _start_one_job_local_sweep(tmp_path: Path) -> tuple[subprocess.Popen, Path, Path]:
    """A one-job sweep (baseline, 8 tiny-model images, one per batch) under the real submitit_local
    launcher, started in the background: (launching process, sweep folder, store). Its console goes
    to a file (:func:`_console`), not a pipe: the job's controller inherits the launching process's
    stdout, so a pipe would only reach its end when the job does, not when the launching process exits."""
    sweep, store = tmp_path / "sweep", tmp_path / "store"
    cmd = [sys.executable, "-m", "varbench", "-m", "+experiment=smoke", "evaluator=[]", "timing=none",
           "benchmark.limit=8", "runtime.batch_size=1", "runtime.progress=false", "method=baseline",
           "hydra/launcher=local", f"paths.output_root={tmp_path}", f"hydra.sweep.dir={sweep}"]
    env = {**os.environ, "VARBENCH_STORE": str(store), "PYTHONUNBUFFERED": "1"}
    with open(tmp_path / "console.txt", "w") as console:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=console, stderr=subprocess.STDOUT, text=True)
    return proc, sweep, store


def _console(tmp_path: Path) -> str:
    return (tmp_path / "console.txt").read_text()


@pytest.mark.integration
@pytest.mark.timeout(300)
@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="finds the job's process through /proc")
def test_submitit_preemption_signal_requeues_the_job_which_resumes(tmp_path):
    """Slurm's pre-timeout/preemption signal (SIGUSR2) reaches a running job through submitit: the
    job's GracefulStop finishes the image in flight, then hands the signal to submitit's own handler,
    which requeues the job (the local executor restarts it); the restarted job resumes from the store
    and the sweep ends with the record and table, every image generated once. (Before, varbench's
    handler replaced submitit's: the job exited 140 and was never requeued.)"""
    proc, sweep, store = _start_one_job_local_sweep(tmp_path)
    try:
        deadline = time.monotonic() + 180
        while not _committed_images(store) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        pids = _task_pids(sweep)
        assert len(pids) == 1 and len(_committed_images(store)) < 8, (pids, _committed_images(store))
        os.kill(pids[0], signal.SIGUSR2)
        proc.wait(timeout=240)
        out = _console(tmp_path)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    log = "\n".join(f.read_text() for f in sorted(sweep.glob(".submitit/*/*_0_log.*")))   # stdout and stderr
    # almost always mid-batch ("finishing the current unit of work"); between two batches it stops at once
    assert "[varbench] SIGUSR2: " in log, log
    assert "this job is preempted" in log and "Requeued job" in log, log
    assert log.count("[varbench] record:") == 1, log
    assert "[varbench] job 1/1 · submitit: Requeued job" in out, out       # and the console said so
    images = _committed_images(store)
    assert sorted(images) == sorted(set(images)) and len(images) == 8, images   # each image committed once
    assert len(list((store / "smoke").glob("entries/*/DONE"))) == 1
    assert [(d / "table.md").exists() for d in group_dirs(tmp_path / "results" / "smoke")] == [True], out


@pytest.mark.integration
@pytest.mark.timeout(300)
@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="finds the job's process through /proc")
def test_ctrl_c_in_the_launching_process_stops_waiting_for_submitit_jobs_at_once(tmp_path):
    """The launching process of a submitit sweep only waits for its jobs: Ctrl-C there stops at once
    (exit 130). The command's outer block defers signals (to protect Hydra composing the next job of
    a local sweep); the end-of-sweep callback makes it immediate when the jobs run elsewhere."""
    proc, sweep, store = _start_one_job_local_sweep(tmp_path)
    try:
        deadline = time.monotonic() + 180
        while not _task_pids(sweep) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert _task_pids(sweep), "the job did not start"
        proc.send_signal(signal.SIGINT)
        t0 = time.monotonic()
        proc.wait(timeout=60)
        waited = time.monotonic() - t0
        out = _console(tmp_path)
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in _task_pids(sweep, b"submitit"):     # the job and its local controller keep running: stop them
            os.kill(pid, signal.SIGKILL)
    assert proc.returncode == 130, out
    assert "SIGINT: stopping now" in out and "finishing the current unit" not in out, out
    assert "the jobs already started keep running" in out and "the ones not started yet will not start" in out and f"python -m varbench.aggregate {store / 'smoke'}" in out, out
    assert waited < 15, f"took {waited:.1f} s to stop waiting"
