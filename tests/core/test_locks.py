"""Issue #13 item 4: locks that die with their holder, waiting for a live one, umask-honouring writes,
stray temp files cleaned, and a graceful stop on SIGTERM (varbench.core.locks, varbench.core.interrupt)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from varbench.core.locks import DEFAULT_WAIT_S, WAIT_KNOB, FileLock, LockTimeoutError, clean_stray_tmp, current_umask
from varbench.harness.records import EntryLockedError, RunEntry
from varbench.harness.store import ImageStore
from varbench.core.jsonio import atomic_write_bytes

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable


def _child(code: str, *args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([PY, "-c", textwrap.dedent(code), *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def _wait_for(pred, timeout=30.0, what="condition"):
    t0 = time.monotonic()
    while not pred():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


HOLD = """
    import sys, time
    from pathlib import Path
    from varbench.harness.records import RunEntry
    e = RunEntry(sys.argv[1], "e")
    with e.lock(wait_s=0):
        Path(sys.argv[2]).write_text("held")
        time.sleep(float(sys.argv[3]))
        Path(sys.argv[2] + ".end").write_text("releasing")   # the last thing done while holding it
"""


@pytest.mark.integration
def test_lock_of_a_killed_process_is_taken_over(tmp_path, capsys):
    ready = tmp_path / "ready"
    child = _child(HOLD, str(tmp_path), str(ready), "60")
    try:
        _wait_for(ready.exists, what="child to take the lock")
        lock = RunEntry(tmp_path, "e").dir / "LOCK"
        assert f"pid={child.pid}" in lock.read_text()
        with pytest.raises(EntryLockedError, match=rf"pid={child.pid}.*{WAIT_KNOB}"):
            with RunEntry(tmp_path, "e").lock(wait_s=0.3):    # alive: not taken over
                pass
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert lock.exists() and f"pid={child.pid}" in lock.read_text()   # kill -9 left its LOCK behind...
    capsys.readouterr()
    t0 = time.monotonic()
    with RunEntry(tmp_path, "e").lock(wait_s=0):           # ...which is taken over at once
        assert f"pid={os.getpid()}" in lock.read_text()
    assert time.monotonic() - t0 < 2
    assert f"died without releasing it" in capsys.readouterr().out and not lock.exists()


@pytest.mark.integration
def test_live_holder_makes_the_second_acquirer_wait_then_succeed(tmp_path, capsys):
    ready = tmp_path / "ready"
    child = _child(HOLD, str(tmp_path), str(ready), "1.5")
    try:
        _wait_for(ready.exists, what="child to take the lock")
        t0 = time.monotonic()
        with RunEntry(tmp_path, "e").lock(wait_s=60):
            waited = time.monotonic() - t0
            assert (tmp_path / "ready.end").exists()   # we only got it once the holder was done with it
        out = capsys.readouterr().out
        child.wait(timeout=30)
    finally:
        child.kill()
        child.wait()
    assert child.returncode == 0, child.stderr.read()
    assert 0.5 < waited < 30
    assert f"waiting for entry {tmp_path / 'entries' / 'e'}" in out and f"pid={child.pid}" in out and WAIT_KNOB in out
    assert "took over" not in out                    # released cleanly, not taken over


def test_timeout_error_names_the_holder_and_the_knob(tmp_path):
    path = tmp_path / "LOCK"
    msgs = []
    with FileLock(path, what="thing X"):
        with pytest.raises(LockTimeoutError) as info:
            FileLock(path, what="thing X", say=msgs.append).acquire(wait_s=0.2)
    msg = str(info.value)
    assert f"pid={os.getpid()}" in msg and "host=" in msg and "thing X" in msg
    assert f"raise {WAIT_KNOB}" in msg and str(path) in msg
    assert len(msgs) == 1 and "waiting for thing X" in msgs[0]       # said once, not once per poll
    assert not path.exists()


def test_threads_exclude_each_other_and_never_overlap(tmp_path):
    """Acquire/release races (unlink while a waiter holds the old inode) never let two in."""
    path, inside, overlaps = tmp_path / "LOCK", [0], []

    def worker():
        for _ in range(30):
            with FileLock(path, wait_s=30, say=lambda m: None):
                inside[0] += 1
                if inside[0] != 1:
                    overlaps.append(inside[0])
                time.sleep(0.0005)
                inside[0] -= 1

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert overlaps == [] and not path.exists()


def test_knob_default_matches_the_shipped_config():
    import yaml

    conf = yaml.safe_load((ROOT / "varbench" / "conf" / "runtime" / "default.yaml").read_text())
    assert conf["lock_wait_s"] == DEFAULT_WAIT_S


def test_generation_lock_serialises_generation(tmp_path):
    store = ImageStore(tmp_path, "g")
    with store.generation_lock(wait_s=0) as lock:
        assert lock.held and (store.dir / "LOCK").exists()
        with pytest.raises(LockTimeoutError, match=r"image store .*being generated.*runtime\.lock_wait_s"):
            with ImageStore(tmp_path, "g").generation_lock(wait_s=0):
                pass
    assert not (store.dir / "LOCK").exists()


# ---- umask ----------------------------------------------------------------------------------

@pytest.mark.integration
def test_every_store_and_record_file_honours_the_umask(tmp_path):
    code = """
        import os, sys
        os.umask(0o022)
        from PIL import Image
        from varbench.harness.records import RunEntry
        from varbench.harness.store import ImageStore
        root = sys.argv[1]
        s = ImageStore(root, "g")
        s.write_manifest({"a": 1})
        s.save(0, 0, Image.new("RGB", (4, 4)), {"prompt": "x"})
        e = RunEntry(root, "e")
        with e.lock(wait_s=0):
            e.append_samples("m", [{"prompt_index": 0, "sample_index": 0}])
            e.write_record({"metrics": {}})
            e.mark_done()
        os.umask(0o077)                       # a later change is honoured too
        s.save(1, 0, Image.new("RGB", (4, 4)), {"prompt": "y"})
    """
    proc = subprocess.run([PY, "-c", textwrap.dedent(code), str(tmp_path)], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    e, g = tmp_path / "entries" / "e", tmp_path / "images" / "g"
    for f in [e / "record.json", e / "DONE", e / "samples_m.jsonl", g / "generation.json", g / "images.jsonl",
              g / "00000" / "samples" / "0000.png", g / "00000" / "metadata.jsonl"]:
        assert oct(f.stat().st_mode & 0o777) == oct(0o644), f
    assert oct((g / "00001" / "samples" / "0000.png").stat().st_mode & 0o777) == oct(0o600)


def test_current_umask_reads_without_changing_it():
    old = os.umask(0o027)
    try:
        assert current_umask() == 0o027 and current_umask() == 0o027
        assert os.umask(0o027) == 0o027      # the reads did not change it
    finally:
        os.umask(old)


def test_atomic_write_mode_group_readable(tmp_path):
    old = os.umask(0o002)
    try:
        atomic_write_bytes(tmp_path / "f", b"x")
    finally:
        os.umask(old)
    assert (tmp_path / "f").stat().st_mode & 0o777 == 0o664


# ---- stray temp files -----------------------------------------------------------------------

def _old(path: Path, data=b"partial") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    t = time.time() - 3600
    os.utime(path, (t, t))
    return path


def test_stray_tmp_files_of_killed_writes_are_cleaned_when_a_job_takes_the_folder(tmp_path):
    store = ImageStore(tmp_path, "g")
    stray = [_old(store.dir / "00003" / "samples" / ".0001.png.abc123.tmp"), _old(store.dir / ".images.jsonl.x.tmp")]
    keep = _old(store.dir / "00003" / "samples" / "0001.png")
    fresh = store.dir / ".generation.json.new.tmp"          # a write in flight by a job younger than us
    fresh.write_bytes(b"x")
    with store.generation_lock(wait_s=0):
        assert not any(p.exists() for p in stray)
        assert keep.exists() and fresh.exists()
    entry = RunEntry(tmp_path, "e")
    e_stray = [_old(entry.dir / ".record.json.q.tmp"), _old(entry.dir / "eval_fidelity.tmp")]
    with entry.lock(wait_s=0):
        assert not any(p.exists() for p in e_stray)
    # the cleaner itself: only older than the cut-off, only the pattern
    other = _old(tmp_path / "x" / "notes.txt")
    t = _old(tmp_path / "x" / ".a.1.tmp")
    assert clean_stray_tmp(tmp_path / "x", older_than=time.time() - 7200) == []
    assert clean_stray_tmp(tmp_path / "x") == [t] and other.exists()


# ---- graceful stop --------------------------------------------------------------------------

LOOP = """
    import sys, time
    from pathlib import Path
    from varbench.core.interrupt import GracefulStop, uninterruptible
    log = Path(sys.argv[1])
    with GracefulStop():
        for i in range(1000):
            with uninterruptible():            # one unit of work: start, 0.4 s of work, done
                with open(log, "a") as f:
                    f.write(f"start {i}\\n")
                time.sleep(0.4)
                with open(log, "a") as f:
                    f.write(f"done {i}\\n")
    print("not reached")
"""


@pytest.mark.integration
def test_sigterm_ends_a_loop_after_the_current_unit_with_exit_code_143(tmp_path):
    log = tmp_path / "log"
    child = _child(LOOP, str(log))
    try:
        _wait_for(lambda: log.exists() and log.read_text().count("start") >= 2, what="the loop to run")
        child.send_signal(signal.SIGTERM)              # mid-unit: the unit finishes, no new one starts
        out, err = child.communicate(timeout=30)
    finally:
        child.kill()
    lines = log.read_text().split()
    assert child.returncode == 128 + signal.SIGTERM == 143, err
    started = [int(x) for k, x in zip(lines[::2], lines[1::2]) if k == "start"]
    finished = [int(x) for k, x in zip(lines[::2], lines[1::2]) if k == "done"]
    assert started == finished and len(started) >= 2      # the unit in flight finished; none was cut short
    assert "not reached" not in out
    assert "SIGTERM: finishing the current unit of work" in err and "Traceback" not in err


@pytest.mark.integration
def test_second_signal_and_signal_outside_a_unit_stop_at_once(tmp_path):
    code = """
        import os, signal, sys, time
        from varbench.core.interrupt import GracefulStop, JobInterrupted, uninterruptible, stop_requested
        prev = signal.getsignal(signal.SIGTERM)
        try:
            with GracefulStop():
                with uninterruptible():
                    os.kill(os.getpid(), signal.SIGTERM)
                    time.sleep(0.05)
                    assert stop_requested()
                    os.kill(os.getpid(), signal.SIGTERM)   # again: raises here, inside the unit
                    time.sleep(1)
                    print("unit not cut short")
        except JobInterrupted as e:
            assert e.code == 143, e.code
        assert signal.getsignal(signal.SIGTERM) is prev       # handlers restored
        try:
            with GracefulStop():
                os.kill(os.getpid(), signal.SIGUSR2)        # outside a unit: at once
                time.sleep(1)
                print("not stopped")
        except JobInterrupted as e:
            assert e.code == 128 + signal.SIGUSR2, e.code
            print("ok", e)
        with GracefulStop(immediate=False):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            print("noted only", flush=True)
    """
    proc = subprocess.run([PY, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    # the last block noted SIGINT but nobody honoured it: it is raised at the block's end (exit 130)
    assert proc.returncode == 130, proc.stderr
    assert "unit not cut short" not in proc.stdout and "not stopped" not in proc.stdout
    assert "ok stopped by SIGUSR2 (exit code 140)" in proc.stdout and "relaunch" in proc.stdout
    assert "noted only" in proc.stdout


@pytest.mark.integration
def test_a_signal_between_jobs_is_noted_then_raised_when_the_next_job_starts(tmp_path):
    """The ``varbench`` command's outer block only notes a signal (it must not raise inside Hydra's
    config composition, where it surfaced as a config error with exit code 1); the next job's block
    raises it on entry, before any work, and the outer mode comes back after a job."""
    code = """
        import os, signal, time
        from varbench.core.interrupt import GracefulStop, JobInterrupted, stop_requested
        import varbench.core.interrupt as vi
        with GracefulStop(immediate=False):           # the process, as varbench.cli.app.cli
            with GracefulStop():                       # job 1: immediate while it runs
                assert vi._immediate
            assert not vi._immediate                   # back to the outer mode between jobs
            os.kill(os.getpid(), signal.SIGTERM)       # lands "inside Hydra": noted only
            time.sleep(0.05)
            print("between jobs, noted:", stop_requested(), flush=True)
            try:
                with GracefulStop():                   # job 2 starts
                    print("job 2 ran", flush=True)
            except JobInterrupted as e:
                print("job 2 stopped on entry:", e.code, flush=True)
                raise
    """
    proc = subprocess.run([PY, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert "between jobs, noted: True" in proc.stdout, proc.stdout + proc.stderr
    assert "job 2 ran" not in proc.stdout
    assert "job 2 stopped on entry: 143" in proc.stdout
    assert proc.returncode == 143, proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.integration
def test_a_first_checkpoint_hash_stops_between_chunks_on_a_noted_signal(tmp_path):
    """Hashing a multi-GB checkpoint runs before the job's own (immediate) block, under the
    command's deferring one; it checks for a noted stop between its 4 MiB chunks, so Ctrl-C during
    a first hash stops within one chunk instead of after the whole file."""
    code = f"""
        import os, signal, time
        from varbench.core import filehash
        from varbench.core.interrupt import GracefulStop, JobInterrupted
        path = {str(tmp_path / "ckpt.bin")!r}
        with open(path, "wb") as f:
            f.write(os.urandom(3 * filehash._CHUNK))
        reads = []
        real_open = open
        class Counting:
            def __init__(self, f): self.f = f
            def __enter__(self): return self
            def __exit__(self, *a): self.f.close()
            def read(self, n):
                reads.append(n)
                if len(reads) == 1:
                    os.kill(os.getpid(), signal.SIGINT)   # Ctrl-C during the first chunk
                    time.sleep(0.05)
                return self.f.read(n)
        filehash.open = lambda p, mode: Counting(real_open(p, mode))
        try:
            with GracefulStop(immediate=False):
                filehash.sha256_file(path)
        except JobInterrupted as e:
            print("stopped after", len(reads), "chunk(s), exit", e.code)
    """
    proc = subprocess.run([PY, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "HOME": str(tmp_path)})
    assert "stopped after 1 chunk(s), exit 130" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.integration
def test_a_handler_installed_before_is_called_at_the_safe_point(tmp_path):
    """Under Slurm, submitit installs its own SIGUSR2 handler (checkpoint, requeue, exit) before the
    job runs. The job's GracefulStop must not swallow it: the unit in flight finishes, then the
    earlier handler runs (here it "requeues" and exits 3); a handler that returns (submitit's
    SIGTERM bypass) is followed by the usual exit 128 + signal. Python's own SIGINT default is not chained."""
    code = """
        import os, signal, sys, time
        from varbench.core.interrupt import GracefulStop, JobInterrupted, uninterruptible
        def requeue(signum, frame):
            print("requeue handler ran, unit finished:", finished, flush=True)
            sys.exit(3)
        bypassed = []
        signal.signal(signal.SIGUSR2, requeue)
        signal.signal(signal.SIGTERM, lambda s, f: bypassed.append(s))
        finished = False
        try:
            with GracefulStop():
                with uninterruptible():
                    os.kill(os.getpid(), signal.SIGTERM)
                    time.sleep(0.05)
                    finished = True
        except JobInterrupted as e:
            print("bypass then", e.code, bypassed == [signal.SIGTERM], flush=True)
        assert signal.getsignal(signal.SIGUSR2) is requeue          # restored after the block
        try:
            with GracefulStop(immediate=False):
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.05)
        except JobInterrupted as e:
            print("sigint", e.code, flush=True)                     # not KeyboardInterrupt
        finished = False
        with GracefulStop():
            with uninterruptible():
                os.kill(os.getpid(), signal.SIGUSR2)
                time.sleep(0.05)
                finished = True
        print("not reached")
    """
    proc = subprocess.run([PY, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert "bypass then 143 True" in proc.stdout, proc.stdout + proc.stderr
    assert "sigint 130" in proc.stdout, proc.stdout + proc.stderr
    assert "requeue handler ran, unit finished: True" in proc.stdout, proc.stdout + proc.stderr
    assert proc.returncode == 3 and "not reached" not in proc.stdout
