"""Issue #12 items 7-8: DONE seals every file of an entry; stored images carry their sha256 and are
checked when loaded; a batch's images count as stored only once its trace rows are written."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from PIL import Image

from varbench.analysis.frame import records_to_frame
from varbench.cli.records import main as records_main
from varbench.core.jsonio import append_jsonl, read_jsonl
from varbench.harness.records import LegacySealError, RunEntry, SealError
from varbench.harness.store import ImageHashError, ImageStore


def _entry(root, name="e1", metric=0.5):
    e = RunEntry(root, name)
    e.append_samples("hpsv2", [{"prompt_index": 0, "sample_index": s, "score": 0.1 * s} for s in range(3)])
    e.append_traces([{"prompt_index": 0, "sample_index": 0, "method": "m", "scales": [], "stats": {}}])
    e.write_record({"metrics": {"hpsv2/score": metric}, "method": {"name": "m"}})
    e.mark_done()
    return e


# ---- DONE seals every file ------------------------------------------------------------------

def test_done_format_seals_every_file(tmp_path):
    e = _entry(tmp_path)
    seal = json.loads(e.done_path.read_text())
    assert seal["format"] == "varbench-done/2"
    assert sorted(seal["files"]) == ["record.json", "samples_hpsv2.jsonl", "traces.jsonl"]
    for name, digest in seal["files"].items():
        assert hashlib.sha256((e.dir / name).read_bytes()).hexdigest() == digest
    e.verify()
    assert e.read()["metrics"]["hpsv2/score"] == 0.5 and len(e.read_samples("hpsv2")) == 3


def test_edited_metric_is_detected_naming_record_json(tmp_path):
    e = _entry(tmp_path)
    e.record_path.write_text(e.record_path.read_text().replace("0.5", "0.333"))
    with pytest.raises(SealError, match=r"record\.json changed after it was marked DONE"):
        e.read()
    with pytest.raises(SealError, match=r"record\.json"):
        records_to_frame([e.dir])      # the edited metric never reaches a table


@pytest.mark.parametrize("content,match", [(b"", "DONE is empty"), (b"\n  \n", "DONE is empty"),
                                           (b"not a seal\n", "DONE is garbled"),
                                           (b'{"format": "varbench-done/2", "files": {}}', "DONE is garbled")])
def test_empty_or_garbled_done_is_corruption(tmp_path, content, match):
    e = _entry(tmp_path)
    e.done_path.write_bytes(content)
    with pytest.raises(SealError, match=match):
        e.read()
    with pytest.raises(SealError, match=match):
        e.read_samples("hpsv2")


def test_truncated_samples_of_a_finished_entry_is_detected(tmp_path):
    e = _entry(tmp_path)
    path = e.samples_path("hpsv2")
    data = path.read_bytes()
    path.write_bytes(data[: data.rstrip(b"\n").rfind(b"\n") + 1])   # last row cut off cleanly
    assert len(read_jsonl(path)) == 2                                # it would pass silently as JSONL
    with pytest.raises(SealError, match=r"samples_hpsv2\.jsonl changed after it was marked DONE"):
        e.read_samples("hpsv2")
    with pytest.raises(SealError, match=r"samples_hpsv2\.jsonl"):
        e.read()


def test_missing_and_unsealed_files_are_detected(tmp_path):
    e = _entry(tmp_path)
    e.traces_path.unlink()
    with pytest.raises(SealError, match=r"traces\.jsonl is missing"):
        e.read_traces()
    e = _entry(tmp_path, "e2")
    append_jsonl(e.dir / "samples_new.jsonl", [{"prompt_index": 0, "sample_index": 0}])
    with pytest.raises(SealError, match=r"samples_new\.jsonl appeared after"):
        e.read()


def test_legacy_done_gets_one_clear_message_and_reseals(tmp_path, capsys):
    a, b = _entry(tmp_path, "old1"), _entry(tmp_path, "old2")
    for e in (a, b):  # what older code wrote: the sha256 of record.json alone
        e.done_path.write_text(hashlib.sha256(e.record_path.read_bytes()).hexdigest() + "\n")
    with pytest.raises(LegacySealError, match="reseal") as info:
        a.read()
    assert "runtime.force=true" in str(info.value)
    with pytest.raises(LegacySealError) as info:
        records_to_frame([a.dir, b.dir])       # one message naming both, with the command
    msg = str(info.value)
    assert msg.count("python -m varbench.cli.records reseal") == 1 and "old1" in msg and "old2" in msg
    # an edited record.json under an old DONE is refused by reseal
    b.record_path.write_text(b.record_path.read_text().replace("0.5", "0.9"))
    assert records_main(["reseal", str(tmp_path)]) == 1
    assert "changed after it was marked DONE" in capsys.readouterr().err
    assert json.loads(a.done_path.read_text())["format"] == "varbench-done/2"   # a was resealed
    assert a.read()["metrics"]["hpsv2/score"] == 0.5
    assert records_main(["verify", str(a.dir)]) == 0


# ---- image store sha256 ---------------------------------------------------------------------

def _png_bytes(color):
    import io

    buf = io.BytesIO()
    Image.new("RGB", (8, 8), color).save(buf, format="PNG")
    return buf.getvalue()


def test_image_sha256_is_stored_and_checked_on_load(tmp_path):
    store = ImageStore(tmp_path, "g")
    path = store.save(0, 0, Image.new("RGB", (8, 8), (1, 2, 3)), {"prompt": "x"})
    row = store.index()[(0, 0)]
    assert row["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest() and row["file"] == "00000/samples/0000.png"
    assert store.load(0, 0).getpixel((0, 0)) == (1, 2, 3) and store.corrupt([0], 1) == []
    path.write_bytes(_png_bytes((9, 9, 9)))            # another valid PNG in its place
    assert store.corrupt([0], 1) == [(0, 0)]
    with pytest.raises(ImageHashError, match=r"00000/samples/0000\.png does not match the sha256"):
        store.load(0, 0)
    # an image file written but never committed is not stored: it is generated again
    store.write_image(1, 0, Image.new("RGB", (8, 8)), {"prompt": "y"})
    assert not store.has(1, 0) and store.missing([0, 1], 1) == [(1, 0)]
    with pytest.raises(FileNotFoundError, match="never committed"):
        store.load(1, 0)


# ---- the job: swapped image regenerated, traces land with their images --------------------

def _cfg(tmp_path, *extra):
    from varbench.testing.jobs import job_config

    return job_config(tmp_path, "evaluator=[fidelity]", "benchmark.limit=3", "runtime.batch_size=2",
                      "runtime.progress=false", "timing=none", *extra)


def _store_of(entry_dir):
    rec = json.loads((Path(entry_dir) / "record.json").read_text())
    return ImageStore(Path(entry_dir).parents[2], rec["generation_id"])


def _traced(store):
    return {(r["prompt_index"], r["sample_index"]) for r in read_jsonl(store.dir / "traces.jsonl")}


@pytest.mark.integration
def test_swapped_image_is_regenerated_and_reported(tmp_path, capsys):
    from varbench.harness.job import run_job

    entry = run_job(_cfg(tmp_path))
    store = _store_of(entry)
    good = store.path(1, 0).read_bytes()
    store.path(1, 0).write_bytes(_png_bytes((255, 0, 255)))   # valid PNG, wrong image
    capsys.readouterr()
    run_job(_cfg(tmp_path, "runtime.force=true"))
    out = capsys.readouterr().out
    assert "regenerating 1 stored image(s)" in out and "00001/samples/0000.png" in out
    assert "images: 1 generated" in out
    assert store.path(1, 0).read_bytes() == good             # the prompt's own image again
    rec = json.loads((entry / "record.json").read_text())
    assert rec["metrics"]["fidelity/ssim"] == pytest.approx(1.0)
    RunEntry.from_dir(entry).verify()


@pytest.mark.integration
def test_finished_entry_with_broken_or_legacy_seal_is_not_skipped_silently(tmp_path):
    from varbench.harness.job import run_job

    cfg = _cfg(tmp_path, "evaluator=[]")
    entry = run_job(cfg)
    done = entry / "DONE"
    done.write_text(hashlib.sha256((entry / "record.json").read_bytes()).hexdigest() + "\n")
    with pytest.raises(LegacySealError, match="reseal"):
        run_job(cfg)
    done.write_text("")
    with pytest.raises(SealError, match="DONE is empty"):
        run_job(cfg)
    assert run_job(_cfg(tmp_path, "evaluator=[]", "runtime.force=true")) == entry   # force redoes it
    RunEntry.from_dir(entry).verify()


@pytest.mark.integration
@pytest.mark.parametrize("where", ["traces", "commit"])
def test_kill_between_images_and_traces_leaves_no_image_without_its_trace(tmp_path, monkeypatch, capsys, where):
    import varbench.harness.job as job

    calls = {"n": 0}
    real_append, real_commit = job.append_jsonl, ImageStore.commit

    def killed_second_time(real):
        def f(*a, **k):
            calls["n"] += 1
            if calls["n"] == 2:      # batch 2: its PNGs are on disk, then the job dies
                raise KeyboardInterrupt
            return real(*a, **k)
        return f

    if where == "traces":
        monkeypatch.setattr(job, "append_jsonl", killed_second_time(real_append))
    else:
        monkeypatch.setattr(ImageStore, "commit", killed_second_time(real_commit))
    cfg = _cfg(tmp_path, "evaluator=[]")
    with pytest.raises(KeyboardInterrupt):
        job.run_job(cfg)
    monkeypatch.undo()
    (gen,) = [d.name for d in (tmp_path / "store" / "images").iterdir()]
    store = ImageStore(tmp_path / "store", gen)
    from varbench.harness.prompts import load_prompt_set

    keys = [(it.index, 0) for it in load_prompt_set(cfg.benchmark).items]
    assert len(keys) == 3 and store.path(*keys[2]).is_file()   # batch 2's image file was written...
    assert set(store.index()) <= _traced(store)         # ...but nothing is stored without its trace
    assert store.missing([p for p, _ in keys], 1) == [keys[2]]
    capsys.readouterr()
    entry = job.run_job(cfg)
    assert "images: 1 generated" in capsys.readouterr().out
    assert set(store.index()) == set(keys) and set(keys) <= _traced(store)
    traces = RunEntry.from_dir(entry).read_traces()
    assert sorted((r["prompt_index"], r["sample_index"]) for r in traces) == sorted(keys)
