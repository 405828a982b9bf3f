"""varbench.loggers.offline and the sink's staging: real offline W&B runs opened through
:class:`WandbSink` (no job: a table of images and a record artifact), moved to another folder,
relocated and checked. The whole job/sweep version is in tests/loggers/test_publish.py
(``test_offline_runs_travel_...``)."""
from __future__ import annotations

import hashlib
import os
import shutil
import struct
import time
from pathlib import Path

import pytest

pytest.importorskip("wandb")

from varbench.core.errors import GarbledFileError  # noqa: E402
from varbench.loggers.offline import (BLOCK, check, read_log, records, references, relocate,  # noqa: E402
                                      run_file, write_log)
from varbench.loggers.publish import main  # noqa: E402
from varbench.loggers.wandb import DATA_DIR, WandbSink, log_record_artifact  # noqa: E402


@pytest.fixture
def wb(offline_wandb):
    """Offline W&B (tests/loggers/conftest.py); W&B's own data folder is ``wbdata``."""
    return offline_wandb


def _finished(run_dir: Path, wait_s: float = 15.0) -> Path:
    """``run_dir`` once W&B's service has written the run's exit record."""
    deadline = time.monotonic() + wait_s
    while not any(r.WhichOneof("record_type") == "exit" for r in records(run_dir)):
        assert time.monotonic() < deadline, f"{run_dir}: no exit record after {wait_s} s"
        time.sleep(0.2)
    return run_dir


def _log_run(tmp: Path, config=None) -> Path:
    """One offline run through the sink: a per-image table of two images and a record artifact."""
    import numpy as np
    import wandb

    run = WandbSink(mode="offline", dir=tmp / "wb").init_run(name="n", job_type="j", config=config)
    images = [wandb.Image(np.full((8, 8, 3), 60 * i, np.uint8)) for i in range(2)]
    run.log({"per_image": wandb.Table(columns=["image", "i"], data=[[im, i] for i, im in enumerate(images)])})
    log_record_artifact(run, {"entry_id": "e1", "metrics": {"m": 0.5}})
    run.finish()
    return _finished(Path(run.dir).parent)


def _sha(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def test_the_sink_stages_inside_the_run_folder_and_gives_the_data_dir_back(wb):
    import wandb

    outside = str(wb / "wbdata")
    run = WandbSink(mode="offline", dir=wb / "wb").init_run(name="n", job_type="j")
    folder = Path(run.dir).parent
    assert os.environ["WANDB_DATA_DIR"] == str(folder / DATA_DIR)          # for the run's lifetime
    art = wandb.Artifact("a", type="t")
    (wb / "x.txt").write_text("x")
    art.add_file(str(wb / "x.txt"))
    run.log_artifact(art)
    run.finish()
    assert os.environ["WANDB_DATA_DIR"] == outside                         # the user's setting is back
    assert not (wb / "wbdata").exists()                                   # nothing staged there
    [ref] = references(_finished(folder))
    assert Path(ref.local_path).is_relative_to(folder / DATA_DIR) and Path(ref.local_path).read_text() == "x"


def test_a_moved_run_relocates_and_its_file_keeps_wandb_cores_framing(wb):
    # a config record larger than a 32 KiB block: split over several chunks (first/middle/last)
    folder = _log_run(wb, config={"blob": "v" * (3 * BLOCK)})
    f = run_file(folder)
    log = read_log(f)
    assert max(map(len, log.payloads)) > 2 * BLOCK and log.tail == b""
    assert write_log(log) == f.read_bytes()                               # byte for byte as wandb-core wrote it
    before = {(r.artifact, r.name): _sha(r.local_path) for r in references(folder)}
    assert {n for _, n in before} >= {"per_image.table.json", "record.json"} and len(before) == 4  # + 2 images

    moved = wb / "carried" / folder.name
    moved.parent.mkdir()
    shutil.move(str(folder), str(moved))
    assert len(check(moved)) == 4                                          # every path names the old place
    rep = relocate(moved)
    assert rep.rewritten == 4 and rep.files == 4 and rep.problems == []
    assert {(r.artifact, r.name): _sha(r.local_path) for r in references(moved)} == before
    assert all(Path(r.local_path).is_relative_to(moved) for r in references(moved))
    new = read_log(run_file(moved))
    assert len(new.payloads) == len(log.payloads) and write_log(new) == run_file(moved).read_bytes()
    assert relocate(moved).rewritten == 0                                  # idempotent


def test_a_run_that_may_still_be_writing_its_file_is_left_alone(wb):
    """No exit record and a file changed moments ago: the run may still append to it, and an
    atomic rewrite would cut those appends off, so relocate refuses; an older one (a crashed run
    copied off the node) is relocated."""
    from varbench.core.errors import ConfigError
    from varbench.loggers.offline import Log, LIVE_S

    folder = _log_run(wb)
    f = run_file(folder)
    log = read_log(f)
    payloads = [p for p, r in zip(log.payloads, records(folder)) if r.WhichOneof("record_type") != "exit"]
    f.write_bytes(write_log(Log(log.header, payloads)))                    # as if the run were still going
    moved = wb / "moved"
    shutil.move(str(folder), str(moved))
    frozen = run_file(moved).read_bytes()
    with pytest.raises(ConfigError, match=r"no exit record and changed \d+ s ago.*after it ends"):
        relocate(moved)
    assert run_file(moved).read_bytes() == frozen
    old = time.time() - 2 * LIVE_S
    os.utime(run_file(moved), (old, old))
    assert relocate(moved).problems == []


def test_a_large_artifact_manifest_file_moves_too(wb, monkeypatch):
    """W&B writes the manifest of an artifact of > 100,000 files to a gzip file (staged too) whose
    lines hold the local paths: both are relocated (the threshold is lowered to see it)."""
    import wandb.sdk.interface.interface as interface

    monkeypatch.setattr(interface, "MANIFEST_FILE_SIZE_THRESHOLD", 0)
    folder = _log_run(wb)
    [mf] = {r.local_path for r in references(folder) if r.name is None and r.artifact.startswith("record-")}
    assert Path(mf).is_relative_to(folder / DATA_DIR)
    moved = wb / "elsewhere"
    shutil.move(str(folder), str(moved))
    rep = relocate(moved)
    assert rep.problems == [] and rep.rewritten > 4                        # .wandb paths + manifest lines
    refs = [r for r in references(moved) if r.artifact.startswith("record-")]
    assert {r.name for r in refs} == {None, "record.json"}
    assert all(Path(r.local_path).is_relative_to(moved) for r in refs)


def test_relocate_names_what_will_not_sync(wb, capsys):
    """A run staged outside its folder (plain wandb, or varbench before it kept them inside) whose
    staging area stayed behind, and a damaged copy: exit 1, each named; no run folder: exit 2."""
    import wandb

    run = wandb.init(mode="offline", dir=str(wb / "plain"), settings=wandb.Settings(silent=True, disable_git=True))
    art = wandb.Artifact("a", type="t")
    (wb / "x.txt").write_text("x")
    art.add_file(str(wb / "x.txt"))
    run.log_artifact(art)
    run.finish()
    folder = _finished(Path(run.dir).parent)
    assert Path(references(folder)[0].local_path).is_relative_to(wb / "wbdata")
    shutil.move(str(folder), str(wb / "copied"))
    shutil.rmtree(wb / "wbdata")

    damaged = wb / "damaged"
    shutil.copytree(_log_run(wb), damaged)
    f = run_file(damaged)
    data = bytearray(f.read_bytes())
    data[7 + 7 + 1] ^= 0xFF                    # a byte inside the first record (after the file and chunk headers)
    f.write_bytes(bytes(data))
    with pytest.raises(GarbledFileError, match=r"damaged at byte \d+.*copy the run folder again"):
        read_log(f)

    cut = wb / "cut"                               # a chunk header whose data never arrived (a cut copy)
    shutil.copytree(_log_run(wb), cut)
    with run_file(cut).open("ab") as fh:
        fh.write(struct.pack("<IHB", 0, 5000, 1) + b"x" * 10)
    whole = run_file(cut).read_bytes()

    capsys.readouterr()
    assert main(["--relocate", str(wb / "copied"), str(damaged), str(cut)]) == 1
    out = capsys.readouterr().out
    assert "1 of 1 file(s) it names will not sync" in out and "staged outside the run folder" in out
    assert "damaged at byte" in out and "unreadable bytes after its last whole record" in out
    assert "0 of 3 run(s) ready" in out and "wandb sync" not in out
    assert run_file(cut).read_bytes() == whole                                  # left as it was

    assert main(["--relocate", str(wb / "nothing")]) == 2
    assert "no W&B run folder" in capsys.readouterr().err


def test_a_cut_copy_is_named_and_left_as_it_was(wb, capsys):
    """Issue 40, finding 1: a ``.wandb`` file cut short (a partial copy with an old mtime, as ``rsync -a``
    leaves it), cut before its exit record, once as logged and once after an earlier relocation: the
    cut is found (a chunk whose bytes never arrived), the file is left byte for byte, the command exits 1
    naming it; before the fix it said "1 of 1 run(s) ready" and wrote the file without its last bytes."""
    from varbench.loggers.offline import LIVE_S

    folder = _log_run(wb)
    relocated = wb / "relocated"
    shutil.copytree(folder, relocated)
    assert relocate(relocated).problems == []
    for k, src in enumerate((folder, relocated)):
        cut = wb / f"cut{k}"
        shutil.copytree(src, cut)
        f = run_file(cut)
        data = f.read_bytes()
        log = read_log(f)
        exit_at = next(i for i, r in enumerate(records(cut)) if r.WhichOneof("record_type") == "exit")
        start = len(write_log(type(log)(log.header, log.payloads[:exit_at])))   # where the exit record's chunk begins
        f.write_bytes(data[:start + 7 + 3])                  # its header and 3 of its bytes arrived
        old = time.time() - 2 * LIVE_S
        os.utime(f, (old, old))
        before = f.read_bytes()
        with pytest.raises(GarbledFileError, match=rf"{f} is cut: .*from byte {start} on.*left as it was"):
            relocate(cut)
        assert f.read_bytes() == before
        capsys.readouterr()
        assert main(["--relocate", str(cut)]) == 1
        out = capsys.readouterr().out
        assert str(f) in out and "is cut" in out and "0 of 1 run(s) ready" in out
        assert f.read_bytes() == before


def test_paths_escaping_the_folder_are_refused_before_anything_is_written(wb, monkeypatch):
    """Issue 40, finding 2: a run whose records name ``wandb-data/../../..`` paths (its large-artifact
    manifest file staged that way): relocation resolves every new path first and refuses, naming it;
    the manifest outside the folder and the ``.wandb`` file are left byte for byte (before the fix, the
    manifest outside was rewritten, then the run reported as lying outside)."""
    import wandb.sdk.interface.interface as interface
    from wandb.proto import wandb_internal_pb2 as pb

    from varbench.core.errors import ConfigError
    from varbench.loggers.offline import Log

    monkeypatch.setattr(interface, "MANIFEST_FILE_SIZE_THRESHOLD", 0)
    folder = _log_run(wb)
    f = run_file(folder)
    log = read_log(f)
    outside = wb / "outside"
    outside.mkdir()
    payloads = []
    for p in log.payloads:
        rec = pb.Record()
        rec.ParseFromString(p)
        m = rec.artifact.manifest if rec.WhichOneof("record_type") == "artifact" else None
        if m is not None and m.manifest_file_path:
            escaped = outside / "manifest.json.gz"
            shutil.copy(m.manifest_file_path, escaped)      # the manifest lies outside; the record says so by ..
            m.manifest_file_path = str(folder / DATA_DIR / ".." / ".." / "outside" / "manifest.json.gz")
            p = rec.SerializeToString()
        payloads.append(p)
    f.write_bytes(write_log(Log(log.header, payloads)))
    moved = wb / "carried"
    shutil.move(str(folder), str(moved))
    (wb / "outside").rename(wb / "keep")                    # the copy's ../.. now leads to wb/outside ...
    shutil.copytree(wb / "keep", wb / "outside")            # ... which holds a manifest that must stay as it is
    frozen = {p: p.read_bytes() for p in [run_file(moved), wb / "outside" / "manifest.json.gz"]}
    with pytest.raises(ConfigError, match=r"would point outside .*nothing was rewritten"):
        relocate(moved)
    assert {p: p.read_bytes() for p in frozen} == frozen
