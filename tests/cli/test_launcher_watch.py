"""The console of submitit sweeps (varbench/cli/launcher_watch.py, issue 23 item 8): the jobs' lines
echoed from their log files while the launching process waits, one job per device by default for
`hydra/launcher=local`, and a warning exactly when timed jobs would share a device.
A real two-job local sweep is in tests/harness/test_launchers.py."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from varbench.cli import launcher_watch as lw

LOCAL = "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher"
SLURM = "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
BASIC = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"


# ------------------------------------------------------------------ the watcher

class _Collect:
    def __init__(self):
        self.lines: list[str] = []
        self.lock = threading.Lock()

    def __call__(self, line: str) -> None:
        with self.lock:
            self.lines.append(line)

    def wait_for(self, n: int, timeout: float = 10.0) -> list[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if len(self.lines) >= n:
                    return list(self.lines)
            time.sleep(0.01)
        return list(self.lines)


def _append(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(text)


def test_the_watcher_echoes_varbench_lines_written_while_it_waits_each_named_by_its_job(tmp_path):
    root = tmp_path / ".submitit"
    (root / "%j").mkdir(parents=True)                 # what submitit's local controller leaves
    got = _Collect()
    watcher = lw.LogWatcher(root, out=got, interval_s=0.02, literal="%j").start()
    try:
        a, b = root / "4594" / "4594_0_log.out", root / "5020" / "5020_0_log.out"
        _append(a, "submitit INFO (2026-01-01 10:00:00,000) - Starting with JobEnvironment(job_id=4594)\n"
                   "[varbench] job 1/2 started (submitit job 4594, CUDA_VISIBLE_DEVICES=0)\n")
        assert got.wait_for(1) == ["[varbench] job 1/2 started (submitit job 4594, CUDA_VISIBLE_DEVICES=0)"]
        # a line still being written is held back until its end arrives; a progress bar's "\r" pieces are lines
        _append(a, "[varbench] images: 8 gene")
        time.sleep(0.1)
        assert len(got.lines) == 1, got.lines
        _append(a, "rated\n 40%|####      | 2/5\r[varbench] record: /s/record.json\n")
        _append(root / "4594" / "4594_0_log.err", "[2026-01-01 10:00:01,000][varbench][INFO] - chatter\n"
                "Traceback (most recent call last):\n")
        assert got.wait_for(3)[1:] == ["[varbench] job 1/2 · images: 8 generated",
                                       "[varbench] job 1/2 · record: /s/record.json"]
        # a job whose first line has not arrived yet is named by its id; submitit's crash line is echoed
        _append(root / "5020" / "5020_0_log.err",
                "submitit ERROR (2026-01-01 10:00:02,000) - Submitted job triggered an exception\n")
        assert got.wait_for(4)[3] == ("[varbench] job id 5020 · submitit: Submitted job triggered an exception "
                                      f"(log: {root / '5020'})")
        # written just before the end: stop() reads once more, nothing is lost
        _append(b, "[varbench] job 2/2 done · skip_last_1 · 1 images · not timed\n")
    finally:
        watcher.stop()
    assert got.lines[4:] == ["[varbench] job 2/2 done · skip_last_1 · 1 images · not timed"]
    assert len(got.lines) == 5 and not any("chatter" in x or "Traceback" in x for x in got.lines)
    assert not (root / "%j").exists() and watcher._thread is None
    assert lw.job_folders_root(tmp_path / ".submitit" / "%j") == root


def test_the_literal_folder_is_kept_when_something_was_written_into_it(tmp_path):
    root = tmp_path / ".submitit"
    _append(root / "%j" / "keep.txt", "x")
    lw.LogWatcher(root, out=lambda line: None, literal="%j").poll()
    assert (root / "%j" / "keep.txt").exists()


# ------------------------------------------------------------------ one job per device, and the warning

def _cfg(*task: str, target: str = LOCAL, gpus: int = 0, batch=None, timing: bool = True,
         device: str = "auto"):
    return OmegaConf.create({
        "hydra": {"launcher": {"_target_": target, "gpus_per_node": gpus,
                               "submitit_folder": "/tmp/s/.submitit/%j"},
                  "sweeper": {"_target_": BASIC, "max_batch_size": batch, "params": None},
                  "overrides": {"task": list(task)}},
        "timing": {"enabled": timing},
        "runtime": {"device": device},
    })


def _warned(plan) -> bool:
    return any("WARNING" in line for line in plan.lines)


def test_the_local_launcher_runs_one_job_per_device_unless_told_otherwise():
    cfg = _cfg("method=a,b,c")
    plan = lw.plan_local_sweep(cfg, 3, {})
    assert cfg.hydra.sweeper.max_batch_size == 1 and plan.parallel == 1 and not _warned(plan)
    assert "3 jobs, 1 at a time" in plan.lines[0] and lw.PARALLEL_KNOB in plan.lines[0]
    cfg = _cfg("method=a,b,c", batch=3, timing=False)          # the user's choice is kept
    plan = lw.plan_local_sweep(cfg, 3, {})
    assert cfg.hydra.sweeper.max_batch_size == 3 and plan.parallel == 3
    # N GPUs count as N devices only when each job picks its own (docs/running.md's sharded recipe)
    cfg = _cfg("shard=0/4,1/4,2/4,3/4", gpus=4, device="cuda:${vb.shard_index:${shard}}")
    assert lw.plan_local_sweep(cfg, 4, {}).parallel == 4 and cfg.hydra.sweeper.max_batch_size == 4
    cfg = _cfg("shard=0/4,1/4,2/4,3/4", gpus=4)                 # device=auto: all four on cuda:0
    assert lw.plan_local_sweep(cfg, 4, {}).parallel == 1


@pytest.mark.parametrize("task, batch, n_jobs, gpus, device, timing, warned", [
    (["method=a,b"], 2, 2, 0, "auto", True, True),                # two timed jobs on the CPU
    (["method=a,b"], 2, 2, 0, "auto", False, False),              # timing=none: nothing to spoil
    (["method=a"], 4, 1, 0, "auto", True, False),                 # one job: nobody to share with
    (["method=a,b"], None, 2, 0, "auto", True, False),            # the default: one per device
    (["method=a,b", "timing=none,default"], 4, 4, 0, "auto", False, True),   # some jobs timed
    (["method=a,b", "timing=none"], 2, 2, 0, "auto", False, False),
    (["shard=0/2,1/2"], 2, 2, 2, "cuda:${vb.shard_index:${shard}}", True, False),   # one GPU each
    (["shard=0/2,1/2"], 2, 2, 2, "auto", True, True),             # both on cuda:0
    (["method=a,b,c"], 3, 3, 2, "cuda:${vb.shard_index:${shard}}", True, True),     # 3 jobs, 2 GPUs
])
def test_the_warning_appears_exactly_when_timed_jobs_would_share_a_device(task, batch, n_jobs, gpus, device,
                                                                          timing, warned):
    plan = lw.plan_local_sweep(_cfg(*task, batch=batch, gpus=gpus, device=device, timing=timing), n_jobs, {})
    assert _warned(plan) == warned, plan.lines
    if warned:
        text = next(x for x in plan.lines if "WARNING" in x)
        assert "not valid" in text and lw.PARALLEL_KNOB in text and "timing=none" in text


def test_other_launchers_are_left_alone():
    """Slurm gives every array task its own GPU (slurm.yaml: gpus_per_node 1): no queue of ours, no warning."""
    cfg = _cfg("method=a,b", target=SLURM, gpus=1, batch=None)
    assert lw.plan_local_sweep(cfg, 2, {}) is None and cfg.hydra.sweeper.max_batch_size is None


def test_a_cuda_visible_devices_that_submitit_overrides_is_named():
    plan = lw.plan_local_sweep(_cfg("method=a,b", gpus=1), 2, {"CUDA_VISIBLE_DEVICES": "3"})
    assert any("CUDA_VISIBLE_DEVICES=3 does not reach the jobs" in x and "CUDA_VISIBLE_DEVICES=0" in x
               for x in plan.lines), plan.lines
    assert not any("note" in x for x in lw.plan_local_sweep(_cfg("method=a,b", gpus=1), 2,
                                                            {"CUDA_VISIBLE_DEVICES": "0"}).lines)


def test_a_job_names_itself_only_under_submitit(capsys, monkeypatch):
    monkeypatch.setenv("VARBENCH_SWEEP_JOBS", "6")
    cfg = OmegaConf.create({"hydra": {"job": {"num": 2, "id": "4594"}}})
    assert lw.announce_job(cfg, {}) is None and capsys.readouterr().out == ""
    line = lw.announce_job(cfg, {"SUBMITIT_EXECUTOR": "local", "CUDA_VISIBLE_DEVICES": "0"})
    assert line == "[varbench] job 3/6 started (submitit job 4594, CUDA_VISIBLE_DEVICES=0)"
    assert capsys.readouterr().out.strip() == line


def test_the_warning_is_said_again_when_the_sweep_ends(tmp_path, capsys):
    """The sweep's first lines have scrolled away by the time the table prints."""
    cfg = _cfg("method=a,b", batch=2)
    cfg.hydra.launcher.submitit_folder = str(tmp_path / ".submitit" / "%j")
    lw.sweep_started(cfg, {"VARBENCH_SWEEP_JOBS": "2"})
    try:
        start = capsys.readouterr().out
    finally:
        lw.sweep_stopped()
    end = capsys.readouterr().out
    warning = [x for x in start.splitlines() if "WARNING" in x]
    assert len(warning) == 1 and end.splitlines() == warning, (start, end)
    lw.sweep_stopped()                                  # said once
    assert capsys.readouterr().out == ""
