"""Image store, config hashes and run records: layout, atomicity, resume, DONE semantics."""
from __future__ import annotations

import json
import os
import re

import pytest
from PIL import Image

from varbench.harness.records import EntryFinishedError, EntryLockedError, RunEntry, find_entries
from varbench.core.jsonio import append_jsonl, read_jsonl
from varbench.core.hashing import ENTRY_EXCLUDE, GENERATION_KEYS, canonical_json, config_hash, entry_hash, generation_hash
from varbench.harness.store import ImageStore

CFG = {
    "model": {"name": "infinity_2b", "cfg": 3.0},
    "method": {"name": "fastvar", "ratio": 0.4},
    "benchmark": {"name": "geneval", "limit": None, "path": "x"},
    "evaluator": {"hpsv2": {"v": 1}},
    "timing": {"repeats": 5},
    "logger": {"mode": "offline"},
    "paths": {"results_dir": "/a"},
    "runtime": {"force": False, "batch_size": 4},
}


def _with(cfg, dotted, value):
    out = json.loads(json.dumps(cfg))
    node = out
    *parts, last = dotted.split(".")
    for p in parts:
        node = node[p]
    node[last] = value
    return out


# ---- hashes ---------------------------------------------------------------------------------

def test_hash_is_stable_and_order_independent():
    reordered = dict(reversed(list(CFG.items())))
    assert config_hash(CFG) == config_hash(reordered)
    # exactly 16 lowercase hex digits (int(h, 16) would also take "0x..", "_", upper case, spaces)
    assert re.fullmatch(r"[0-9a-f]{16}", config_hash(CFG)), config_hash(CFG)
    assert config_hash(_with(CFG, "model.cfg", 4.0)) != config_hash(CFG)   # and it depends on the values


@pytest.mark.parametrize("key,value,gen_changes,entry_changes", [
    ("paths.results_dir", "/b", False, False),      # where files go changes no number
    ("logger.mode", "disabled", False, False),
    ("runtime.force", True, False, False),
    ("timing.repeats", 9, False, True),             # timing changes the record, not the images
    ("evaluator.hpsv2.v", 2, False, True),          # a new scorer re-scores, never regenerates
    ("benchmark.limit", 10, False, True),           # indices are stable across subsets
    ("method.ratio", 0.5, False, True),             # not a GENERATION_KEYS path (knobs live under method.knobs)
    ("method.name", "nova", True, True),
    ("runtime.batch_size", 8, True, True),          # batch companions change bits (varbench/harness/sharding.py)
])
def test_default_exclusions(key, value, gen_changes, entry_changes):
    other = _with(CFG, key, value)
    assert (generation_hash(other) != generation_hash(CFG)) is gen_changes
    assert (entry_hash(other) != entry_hash(CFG)) is entry_changes


def test_explicit_exclude_and_omegaconf():
    omegaconf = pytest.importorskip("omegaconf")
    node = omegaconf.OmegaConf.create({"a": 1, "b": {"c": 2, "d": "${a}"}})
    assert config_hash(node) == config_hash({"a": 1, "b": {"c": 2, "d": 1}})  # resolved
    assert config_hash({"a": 1, "b": {"c": 2}}, exclude=["b.c"]) == config_hash({"a": 1, "b": {}})
    assert config_hash({"a": 1}, exclude=["no.such.key"]) == config_hash({"a": 1})
    assert "paths" in ENTRY_EXCLUDE and "evaluator" not in GENERATION_KEYS
    assert canonical_json({"b": 1, "a": [1.5, None]}) == '{"a":[1.5,null],"b":1}'


def test_weight_and_prompt_sha256_enter_every_key_paths_do_not():
    """Issue #12 item 6: changed weights change the generation, entry and pairing keys; moving
    the same files elsewhere (another weights_dir) changes none of them."""
    from varbench.core.hashing import pair_key

    cfg = _with(_with(CFG, "model.weights", "/machine_a/w.pth"), "benchmark.path", "/machine_a/p.jsonl")
    moved = _with(_with(cfg, "model.weights", "/machine_b/w.pth"), "benchmark.path", "/machine_b/p.jsonl")
    w1, w2 = {"w.pth": "a" * 64}, {"w.pth": "b" * 64}
    assert generation_hash(cfg, w1, "p1") == generation_hash(moved, w1, "p1")
    assert entry_hash(cfg, w1, "p1") == entry_hash(moved, w1, "p1")
    assert generation_hash(cfg, w1, "p1") != generation_hash(cfg, w2, "p1")
    assert entry_hash(cfg, w1, "p1") != entry_hash(cfg, w2, "p1")
    assert generation_hash(cfg, w1, "p1") != generation_hash(cfg, w1, "p2")
    rec = {"config": cfg, "model": {"weights": w1}, "benchmark": {"sha256": "p1"}}
    assert pair_key(rec) != pair_key({**rec, "model": {"weights": w2}})
    assert pair_key(rec) == pair_key({**rec, "config": _with(cfg, "method.name", "nova")})  # method left out
    assert pair_key({"model": {}}) is None


def test_device_and_dtype_hash_as_resolved_type():
    base = _with(_with(CFG, "runtime.device", "cuda"), "runtime.dtype", "bfloat16")
    assert generation_hash(base) == generation_hash(_with(base, "runtime.device", "cuda:1"))
    assert generation_hash(base) == generation_hash(_with(base, "runtime.dtype", "bf16"))
    assert generation_hash(base) != generation_hash(_with(base, "runtime.device", "cpu"))


def test_sha256_of_a_big_file_streams_its_chunks_with_a_byte_progress_bar(tmp_path, monkeypatch):
    """A file past the disk-cache size is hashed chunk by chunk (the bar counts its bytes); the
    digest is the file's sha256, not a per-chunk one."""
    import hashlib

    import tqdm.auto

    from varbench.core import filehash
    monkeypatch.setenv("VARBENCH_SHA_CACHE", str(tmp_path / "cache.json"))
    monkeypatch.setattr(filehash, "DISK_CACHE_MIN_BYTES", 1)
    monkeypatch.setattr(filehash, "_CHUNK", 1000)
    data = os.urandom(2500)
    (tmp_path / "ckpt.pth").write_bytes(data)
    bars = []

    class Recording:                   # a tqdm stand-in that counts what the hash reports
        def __init__(self, **kw):
            self.kw, self.n = kw, 0
            bars.append(self)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def update(self, n):
            self.n += n

    monkeypatch.setattr(tqdm.auto, "tqdm", Recording)
    assert filehash.sha256_file(tmp_path / "ckpt.pth") == hashlib.sha256(data).hexdigest()
    (bar,) = bars
    kw = bar.kw
    assert kw["total"] == 2500 and kw["unit"] == "B" and bar.n == 2500 and "ckpt.pth" in kw["desc"]
    assert kw["disable"] is None                  # shown on a terminal (tqdm's auto), hidden in logs


def test_sha256_file_caches_by_path_size_mtime(tmp_path, monkeypatch):
    from varbench.core import filehash
    monkeypatch.setenv("VARBENCH_SHA_CACHE", str(tmp_path / "cache.json"))
    monkeypatch.setattr(filehash, "DISK_CACHE_MIN_BYTES", 1)
    f = tmp_path / "w.pt"
    f.write_bytes(b"old weights")
    first = filehash.sha256_file(f)
    assert json.loads((tmp_path / "cache.json").read_text()) == {
        f"{os.path.realpath(f)}|{f.stat().st_size}|{f.stat().st_mtime_ns}": first}
    filehash._SHA_CACHE.clear()
    assert filehash.sha256_file(f) == first                       # served from the disk cache
    f.write_bytes(b"new weights")                                   # retrained: size/mtime change
    os.utime(f, ns=(f.stat().st_atime_ns, f.stat().st_mtime_ns + 10**9))
    assert filehash.sha256_file(f) != first
    # folders contribute every (non-hidden) file under a path-free name
    d = tmp_path / "shards"
    (d / ".cache").mkdir(parents=True)
    (d / "a.safetensors").write_bytes(b"a")
    (d / ".cache" / "x").write_bytes(b"x")
    assert list(filehash.weight_hashes({"shards": d, "w.pt": f, "none": None})) == ["shards/a.safetensors", "w.pt"]


def test_hash_refuses_non_json_values():
    with pytest.raises(TypeError, match="model.obj"):
        config_hash({"model": {"obj": object()}})
    with pytest.raises(ValueError, match="nan"):
        config_hash({"x": float("nan")})


# ---- image store ----------------------------------------------------------------------------

def test_store_layout_roundtrip_and_missing(tmp_path):
    store = ImageStore(tmp_path, "abcd1234abcd1234")
    items = [0, 3, 7]
    assert store.missing(items, 2) == [(0, 0), (0, 1), (3, 0), (3, 1), (7, 0), (7, 1)]
    img = Image.new("RGB", (8, 6), (10, 200, 30))
    meta = {"tag": "colors", "include": [{"class": "car", "count": 1, "color": "red"}], "prompt": "a red car"}
    p = store.save(3, 1, img, meta)
    assert p == tmp_path / "images" / "abcd1234abcd1234" / "00003" / "samples" / "0001.png"
    # GenEval's reader: first line of <prompt>/metadata.jsonl is the metadata incl. the prompt.
    assert json.loads((p.parent.parent / "metadata.jsonl").read_text().splitlines()[0]) == meta
    assert store.has(3, 1) and not store.has(3, 0)
    assert store.missing(items, 2) == [(0, 0), (0, 1), (3, 0), (7, 0), (7, 1)]
    back = store.load(3, 1)
    assert back.size == (8, 6) and back.getpixel((0, 0)) == (10, 200, 30)  # PNG is lossless
    assert not list(p.parent.glob(".*"))  # no temp files left behind
    with pytest.raises(FileNotFoundError, match="prompt 0 sample 0"):
        store.load(0, 0)
    m = store.write_manifest(CFG)
    assert json.loads(m.read_text())["generation_hash"] == "abcd1234abcd1234"


def test_interrupted_write_leaves_no_file(tmp_path, monkeypatch):
    store = ImageStore(tmp_path, "g")

    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(KeyboardInterrupt):
        store.save(0, 0, Image.new("RGB", (4, 4)), {"prompt": "x"})
    monkeypatch.undo()
    assert not store.has(0, 0)
    assert not [p for p in store.dir.rglob("*") if p.is_file()]  # temp files cleaned up


# ---- records --------------------------------------------------------------------------------

def test_record_lifecycle(tmp_path):
    e = RunEntry(tmp_path, "e1")
    assert not e.is_done()
    e.append_samples("hpsv2", [{"prompt_index": 0, "sample_index": 0, "score": 0.3}])
    e.append_samples("hpsv2", [{"prompt_index": 0, "sample_index": 1, "score": 0.2},
                               {"prompt_index": 0, "sample_index": 0, "score": 0.31}])  # re-score wins
    assert e.scored_keys("hpsv2") == {(0, 0), (0, 1)}
    assert {r["sample_index"]: r["score"] for r in e.read_samples("hpsv2")} == {0: 0.31, 1: 0.2}
    e.write_record({"metrics": {"hpsv2/score": 0.25}})
    assert find_entries(tmp_path) == []  # no DONE yet: not finished
    e.mark_done()
    rec = e.read()
    assert rec["schema_version"] == 1 and rec["entry_id"] == "e1" and rec["created"].endswith("+00:00")
    assert find_entries(tmp_path) == [e.dir]
    with pytest.raises(EntryFinishedError, match="force"):
        e.write_record({"metrics": {}})
    with pytest.raises(EntryFinishedError):
        e.append_samples("hpsv2", [{"prompt_index": 1, "sample_index": 0}])
    e.write_record({"metrics": {"hpsv2/score": 0.5}}, force=True)
    assert not e.is_done()  # forced rewrite reopens the entry until mark_done
    e.mark_done()
    assert e.read()["metrics"]["hpsv2/score"] == 0.5


def test_done_detects_edited_record(tmp_path):
    e = RunEntry(tmp_path, "e2")
    e.write_record({"metrics": {"a/b": 1.0}})
    e.mark_done()
    e.record_path.write_text(e.record_path.read_text().replace("1.0", "2.0"))
    with pytest.raises(ValueError, match="changed after it was marked DONE"):
        e.read()


def test_truncated_jsonl_is_tolerated_and_repaired(tmp_path):
    pd = pytest.importorskip("pandas")
    path = tmp_path / "samples_x.jsonl"
    append_jsonl(path, [{"prompt_index": 0, "sample_index": 0, "v": 1}])
    with open(path, "a") as f:  # a kill in the middle of a write
        f.write('{"prompt_index": 0, "sample_in')
    assert read_jsonl(path) == [{"prompt_index": 0, "sample_index": 0, "v": 1}]
    append_jsonl(path, [{"prompt_index": 0, "sample_index": 1, "v": 2}])
    assert [r["v"] for r in read_jsonl(path)] == [1, 2]
    assert pd.read_json(path, lines=True)["v"].tolist() == [1, 2]  # the pandas one-liner works
    with open(path, "a") as f:
        f.write("garbage\n{}\n")
    with pytest.raises(ValueError, match="line 3"):
        read_jsonl(path)  # corruption that is not a cut-off tail is an error


def test_traces_and_lock(tmp_path):
    e = RunEntry(tmp_path, "e3")
    row = {"prompt_index": 0, "sample_index": 0, "method": "baseline",
           "scales": [{"si": 0, "h": 1, "w": 1, "ran": True, "keep_frac": None, "entropy_mean": 0.5, "ms": 1.0}],
           "stats": {}}
    e.append_traces([row])
    assert e.read_traces() == [row]
    with e.lock():
        with pytest.raises(EntryLockedError, match="runtime.lock_wait_s"):
            with RunEntry(tmp_path, "e3").lock(wait_s=0):
                pass
    with e.lock():  # released
        pass


def test_samples_name_must_be_plain(tmp_path):
    with pytest.raises(ValueError, match="plain name"):
        RunEntry(tmp_path, "e4").samples_path("a/b")


# ---- provenance -----------------------------------------------------------------------------

def test_provenance_degrades_gracefully(tmp_path):
    from varbench.core.filehash import sha256_file
    from varbench.harness.provenance import git_info, package_versions

    assert git_info(tmp_path) == {"sha": None, "dirty": None, "diff_sha256": None, "root": None}
    vers = package_versions(("pytest", "surely-not-an-installed-package"))
    assert vers["pytest"] == pytest.__version__ and vers["surely-not-an-installed-package"] is None
    f = tmp_path / "w.bin"
    f.write_bytes(b"abc")
    # sha256("abc") is the FIPS 180-2 test vector.
    assert sha256_file(f) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


def test_provenance_of_this_checkout():
    from varbench.harness.provenance import git_info

    info = git_info()
    if info["root"] is None:
        pytest.skip("not running from a git checkout")
    assert len(info["sha"]) == 40 and isinstance(info["dirty"], bool)
