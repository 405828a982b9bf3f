"""Sweeps started together on one store (issue #13 items 3-4): a job waits for what another holds
instead of failing or redoing it. Identical sweeps share entries (entry LOCK); sweeps under two
experiment names have their own entries but the same images (image-store LOCK). All exit 0, every
entry is finished, and no image is generated twice (each image store commits one row per image),
although every method job also needs the baseline's images for fidelity."""
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration   # every test here starts `python -m varbench -m` sweeps in subprocesses

ROOT = Path(__file__).resolve().parents[2]


def _launch(tmp_path: Path, name: str, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "varbench", "-m", "+experiment=smoke", "method=baseline,skip_last_2",
           "evaluator=[fidelity]", "timing=none", "benchmark.limit=4", "runtime.batch_size=1",
           "runtime.progress=false", f"paths.output_root={tmp_path}", f"hydra.sweep.dir={tmp_path}/{name}", *extra]
    env = {**os.environ, "VARBENCH_STORE": str(tmp_path / "store")}
    log = open(tmp_path / f"{name}.log", "w")
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)


def _check_images_once(tmp_path: Path) -> None:
    stores = list((tmp_path / "store" / "images").iterdir())
    assert len(stores) == 2                                   # the baseline's and skip_last_2's images
    for store in stores:
        rows = [json.loads(x) for x in (store / "images.jsonl").read_text().splitlines()]
        counts = Counter((r["prompt_index"], r["sample_index"]) for r in rows)
        assert sorted(counts) == [(p, 0) for p in range(4)]
        assert set(counts.values()) == {1}, f"an image was committed twice in {store.name}: {counts}"
    assert not list((tmp_path / "store").rglob("LOCK*"))      # every lock released


def _run(tmp_path: Path, extra_b: tuple = ()) -> str:
    procs = [_launch(tmp_path, "a"), _launch(tmp_path, "b", *extra_b)]
    codes = [p.wait(timeout=600) for p in procs]
    logs = [(tmp_path / f"{n}.log").read_text() for n in ("a", "b")]
    assert codes == [0, 0], "\n\n".join(x[-3000:] for x in logs)
    both = "\n".join(logs)
    assert "EntryLockedError" not in both and "LockTimeoutError" not in both
    return both


def test_two_identical_sweeps_started_together_share_the_work(tmp_path):
    both = _run(tmp_path)
    entries = list((tmp_path / "store" / "smoke" / "entries").iterdir())
    assert len(entries) == 2 and all((e / "DONE").exists() for e in entries)
    # the second sweep waited for the first or found its work finished; it never redid it
    assert "waiting for" in both or "skip (finished)" in both, both[-3000:]
    _check_images_once(tmp_path)


def test_two_experiments_started_together_generate_each_image_once(tmp_path):
    _run(tmp_path, ("experiment_name=other",))
    for exp in ("smoke", "other"):
        entries = list((tmp_path / "store" / exp / "entries").iterdir())
        assert len(entries) == 2 and all((e / "DONE").exists() for e in entries)
    _check_images_once(tmp_path)


def test_two_sweeps_started_together_keep_their_own_sweep_folders_and_failure_notes(tmp_path):
    """Hydra's default sweep folder is a timestamp; to the second, two sweeps started together share
    it, and one's start deletes the other's failure notes (a failed sweep could then exit 0). The
    folder name carries microseconds, so each sweep keeps its own folder and reports its own failure."""
    cmd = [sys.executable, "-m", "varbench", "-m", "+experiment=smoke", "method.name=bogus,baseline", "evaluator=[]",
           "timing=none", "benchmark.limit=1", "runtime.progress=false", f"paths.output_root={tmp_path}"]
    env = {**os.environ, "VARBENCH_STORE": str(tmp_path / "store")}
    procs = [subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [1, 1], "\n\n".join(o[-3000:] for o in outs)
    for out in outs:
        assert "1 job(s) of this sweep failed" in out, out[-3000:]
    folders = sorted((tmp_path / "outputs" / "smoke").iterdir())
    assert len(folders) == 2, folders
    for folder in folders:
        assert len((folder / "failed_jobs.jsonl").read_text().splitlines()) == 1
