"""Errors that name their fix (issue 21 items 7-8): one base class, printed as one message, exit 2.

Each error here is raised by the real code path that meets the fault (a truncated manifest, a garbled
state file, a read-only disk, a held lock, a broken seal, a checkpoint that does not fit), then handed
to the command line's handler, which must print only the message and exit 2."""
from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from varbench.core.errors import FixableError, GarbledFileError, StoreWriteError

ROOT = Path(__file__).resolve().parents[2]


def _exit_of(exc: BaseException, capsys) -> tuple[int, str]:
    from varbench.cli.app import fixable_exits

    def boom():
        raise exc

    with pytest.raises(SystemExit) as info:
        fixable_exits(boom)
    return info.value.code, capsys.readouterr().err


def test_truncated_toy_manifest_is_a_toy_weights_error_naming_the_file_and_the_fix(tmp_path, capsys):
    from varbench.toy.load import WEIGHTS_DIR, ToyWeightsError, read_manifest

    d = tmp_path / "weights"
    d.mkdir()
    text = (WEIGHTS_DIR / "manifest.json").read_text()
    (d / "manifest.json").write_text(text[: len(text) // 2])          # cut mid-file, as a full disk leaves it
    with pytest.raises(ToyWeightsError) as info:
        read_manifest(d)
    msg = str(info.value)
    assert str(d / "manifest.json") in msg and "git checkout" in msg and "varbench.toy.train" in msg
    code, err = _exit_of(info.value, capsys)
    assert code == 2 and "ToyWeightsError" in err and str(d / "manifest.json") in err


def test_garbled_state_files_are_fixable_and_name_the_file(tmp_path, capsys):
    from varbench.core.jsonio import read_json
    from varbench.harness.store import ImageStore

    (tmp_path / "versions.json").write_text('{"fidelity": {"scorer": ')
    with pytest.raises(GarbledFileError, match="versions.json is garbled.*delete it"):
        read_json(tmp_path / "versions.json")

    store = ImageStore(tmp_path, "g0")
    store.dir.mkdir(parents=True)
    store.index_path.write_text('{"prompt_index": 0, "sample_index": 0, "file": "x", "sha256": "0"}\n'
                                'not json at all\n{"prompt_index": 1, "sample_index": 0, "file": "y", "sha256": "1"}\n')
    with pytest.raises(GarbledFileError) as info:
        store.index()
    assert "images.jsonl: line 2 is not JSON" in str(info.value) and "Fix: delete that line" in str(info.value)
    assert isinstance(info.value, ValueError)                           # old `except ValueError` still holds
    code, err = _exit_of(info.value, capsys)
    assert code == 2 and "Traceback" not in err and "images.jsonl" in err


def test_a_read_only_store_is_one_store_write_error_that_is_still_an_oserror(tmp_path, monkeypatch, capsys):
    import tempfile

    from varbench.core.jsonio import append_jsonl
    from varbench.core.jsonio import atomic_write_bytes
    from varbench.harness.records import RunEntry

    def read_only(*a, **k):
        raise OSError(errno.EROFS, "Read-only file system", str(k.get("dir")))

    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    with pytest.raises(StoreWriteError) as info:
        atomic_write_bytes(tmp_path / "store" / "generation.json", b"{}")
    e = info.value
    assert isinstance(e, OSError) and e.errno == errno.EROFS             # ENOSPC/EROFS checks keep working
    assert "generation.json" in str(e) and "paths.store_dir" in str(e)
    code, err = _exit_of(e, capsys)
    assert code == 2 and "StoreWriteError" in err and "read-only" in err

    (tmp_path / "notadir").write_text("a file where the store's folder should be")
    with pytest.raises(StoreWriteError, match="notadir"):
        append_jsonl(tmp_path / "notadir" / "traces.jsonl", [{"a": 1}])
    with pytest.raises(StoreWriteError):
        with RunEntry(tmp_path / "notadir", "e0").lock(wait_s=0):
            pass


def test_held_lock_broken_seal_and_checkpoint_mismatch_are_fixable(tmp_path, capsys):
    import torch

    from varbench.core.locks import FileLock, LockTimeoutError
    from varbench.engine.checkpoints import CheckpointMismatch, load_state_dict_strict
    from varbench.harness.records import RunEntry, SealError

    errors = []
    with FileLock(tmp_path / "LOCK", what="store", wait_s=None):
        with pytest.raises(LockTimeoutError) as info:   # a second holder in this process, no waiting
            FileLock(tmp_path / "LOCK", what="store", wait_s=0).acquire()
        errors.append(info.value)
    entry = RunEntry(tmp_path, "e1")
    entry.write_record({"x": 1})
    entry.mark_done()
    entry.record_path.write_text('{"x": 2}')
    with pytest.raises(SealError) as info:
        entry.read()
    errors.append(info.value)
    with pytest.raises(CheckpointMismatch) as info:
        load_state_dict_strict(torch.nn.Linear(2, 2), {"weight": torch.zeros(3, 2)}, source="w.pth")
    errors.append(info.value)
    for e in errors:
        assert isinstance(e, FixableError), type(e)
        code, err = _exit_of(e, capsys)
        assert code == 2 and err.startswith(f"[varbench] {type(e).__name__}: ") and "Traceback" not in err


def test_every_error_that_names_its_fix_derives_from_the_one_base():
    from varbench.analysis.aggregate import AggregationError
    from varbench.core.errors import names_its_fix
    from varbench.core.errors import ConfigError
    from varbench.engine.backbones.infinity.bsq_vae import CheckpointMismatchError, VAEWeightsNotFoundError
    from varbench.engine.checkpoints import WeightsNotFound
    from varbench.evaluators.weights import WeightsNotFoundError, WrongWeightsError
    from varbench.harness.prompts import PromptSetError
    from varbench.harness.records import EntryFinishedError, EntryLockedError, LegacySealError
    from varbench.harness.store import ImageHashError
    from varbench.policies.skipvar_features import DecisionModelError

    for cls in (AggregationError, WeightsNotFoundError, WrongWeightsError, CheckpointMismatchError,
                VAEWeightsNotFoundError, WeightsNotFound, DecisionModelError, PromptSetError, EntryFinishedError,
                EntryLockedError, LegacySealError, ImageHashError, ConfigError):
        assert issubclass(cls, FixableError), cls
    assert names_its_fix(ConfigError("x")) and not names_its_fix(RuntimeError("a bug keeps its traceback"))


def test_other_errors_keep_their_traceback():
    from varbench.cli.app import fixable_exits

    def bug():
        raise KeyError("not a named fix")

    with pytest.raises(KeyError):
        fixable_exits(bug)


@pytest.mark.integration
def test_the_command_prints_a_read_only_store_without_traceback_and_exits_2(tmp_path):
    """End to end through Hydra: `python -m varbench` on a store whose disk refuses writes (EROFS
    injected at the temp-file step every store write takes; root ignores chmod, so no real read-only
    folder can be made here)."""
    driver = f"""
import errno, sys, tempfile
def read_only(*a, **k):
    raise OSError(errno.EROFS, "Read-only file system", str(k.get("dir")))
tempfile.mkstemp = read_only
sys.argv = ["varbench", "+experiment=smoke", "paths.output_root={tmp_path}", "benchmark.limit=1",
            "evaluator=[]", "timing=none", "runtime.progress=false"]
from varbench.cli.app import cli
cli()
"""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run([sys.executable, "-c", driver], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    assert "[varbench] StoreWriteError: cannot write" in proc.stderr and "read-only" in proc.stderr, out[-3000:]
