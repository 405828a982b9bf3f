"""The job's stages on the tiny model: sharding (scores bit-identical to the unsharded run, the
last shard assembles), scoring resumed per batch, per-image work in the record, a failed W&B
mirror retried on relaunch, no empty folders after a failure, and the per-image seed rule."""
import json
from pathlib import Path

import pytest

from varbench.cli.assemble import assemble_entry
from varbench.core.seeds import image_seed
from varbench.harness.job import run_job
from varbench.harness.schema import TraceRow, check_record
from varbench.testing.jobs import job_config


def _cfg(tmp_path, *extra):
    return job_config(tmp_path, "evaluator=[fidelity,hpsv2_tiny]", "benchmark.limit=5", "runtime.batch_size=2",
                      "runtime.progress=false", "timing=none", "method=skip_last_2", *extra)


def _rows(entry: Path, name: str) -> list[dict]:
    return [json.loads(line) for line in (entry / f"samples_{name}.jsonl").read_text().splitlines()]


@pytest.mark.integration
def test_shards_assemble_one_record_with_the_unsharded_scores_bit_for_bit(tmp_path, capsys, monkeypatch):
    import varbench.harness.job as job_mod

    # scoring batches of 2 -> blocks of 2 prompts: shard 0 takes prompts 0,1,4 and shard 1 prompts 2,3,
    # so the shards really split the work (with 16-image batches 5 prompts are one block)
    monkeypatch.setattr(job_mod, "SCORE_BATCH", 2)
    # shards first (they generate the images, each its own part), then the unsharded run
    e0 = run_job(_cfg(tmp_path, "experiment_name=sharded", "shard=0/2"))
    assert not (e0 / "DONE").exists() and (e0 / "shards" / "0-of-2" / "SHARD_DONE").exists()
    assert "waiting for shard(s) 1-of-2" in capsys.readouterr().out
    e1 = run_job(_cfg(tmp_path, "experiment_name=sharded", "shard=1/2"))
    assert e1 == e0 and (e0 / "DONE").exists()
    assert [r["prompt_index"] for r in _rows(e0 / "shards" / "0-of-2", "fidelity")] == [0, 1, 4]
    assert [r["prompt_index"] for r in _rows(e0 / "shards" / "1-of-2", "fidelity")] == [2, 3]
    assert "assembled from 2 shards" in capsys.readouterr().out
    whole = run_job(_cfg(tmp_path, "experiment_name=whole"))
    assert "images: 0 generated" in capsys.readouterr().out   # the shards made every image
    rec_s = json.loads((e0 / "record.json").read_text())
    rec_w = json.loads((whole / "record.json").read_text())
    assert check_record(rec_s) == [] and check_record(rec_w) == []   # the documented record type
    assert rec_s["metrics"] == rec_w["metrics"]                 # == on floats: bit for bit
    assert rec_s["uncertainty"] == rec_w["uncertainty"]
    assert rec_s["flops"] == rec_w["flops"] and rec_s["experiment"]["shards"] == 2
    # memory: the same images' KV bytes and peaks; weights analytic (no runtime at assembly) == as held
    assert rec_s["memory"] == rec_w["memory"] and rec_s["memory"]["peak_bytes"] is not None
    assert rec_s["config"]["shard"] is None                      # the job's record, not the assembling shard's
    for name in ("fidelity", "hpsv2_tiny"):
        assert _rows(e0, name) == _rows(whole, name)
    # the shard's own folders and markers are sealed with the entry; the LOCKs are gone
    assert not list(e0.rglob("LOCK")) and not list(e0.rglob("LOCK.*"))

    # the last shard was killed after finishing its part: `python -m varbench.job assemble` rebuilds the record
    (e0 / "DONE").unlink()
    (e0 / "record.json").unlink()
    assert assemble_entry(e0) == 0
    assert json.loads((e0 / "record.json").read_text())["metrics"] == rec_w["metrics"]
    # ... and so does `python -m varbench.aggregate` before it writes the tables
    (e0 / "DONE").unlink()
    (e0 / "record.json").unlink()
    from varbench.cli.aggregate import main as aggregate_main

    assert aggregate_main([str(tmp_path / "store" / "sharded"), "--out", str(tmp_path / "t"), "--no-figures",
                           "--baseline", "skip_last"]) == 0
    assert (e0 / "DONE").exists() and "assembled the record of sharded entry" in capsys.readouterr().out

    # a part of another job copied in (issue 40: config identity, not file count): refused before any write
    (e0 / "DONE").unlink()
    (e0 / "record.json").unlink()
    meta = e0 / "shards" / "1-of-2" / "job.json"
    other = json.loads(meta.read_text())
    other["config"]["generation"]["seed"] = 7                     # another seed: another entry
    meta.write_text(json.dumps(other))
    before = {p: p.read_bytes() for p in e0.rglob("*") if p.is_file() and "LOCK" not in p.name}
    from varbench.harness.job import ShardAssemblyError, job_from_shards, assemble_shards

    with pytest.raises(ShardAssemblyError, match=r"shard 1-of-2 .* belongs to another job.*nothing was written"):
        assemble_shards(job_from_shards(e0))
    capsys.readouterr()
    assert assemble_entry(e0) == 2                                # the command: one line, exit 2
    assert "belongs to another job" in capsys.readouterr().err
    assert not (e0 / "record.json").exists() and not (e0 / "DONE").exists()
    assert {p: p.read_bytes() for p in e0.rglob("*") if p.is_file() and "LOCK" not in p.name} == before


@pytest.mark.integration
def test_scoring_resumes_per_batch_after_a_crash(tmp_path, monkeypatch, capsys):
    from varbench.evaluators.fidelity import FidelityEvaluator

    import varbench.harness.job as job_mod

    monkeypatch.setattr(job_mod, "SCORE_BATCH", 2)
    calls, crash = [], [True]
    real_update = FidelityEvaluator.update

    def update(self, samples):
        calls.append([(s.prompt_index, s.sample_index) for s in samples])
        if len(calls) == 2 and crash[0]:
            raise RuntimeError("scorer crashed")
        return real_update(self, samples)

    monkeypatch.setattr(FidelityEvaluator, "update", update)
    with pytest.raises(RuntimeError, match="scorer crashed"):
        run_job(_cfg(tmp_path, "evaluator=[fidelity]"))
    entry = next((tmp_path / "store" / "smoke" / "entries").iterdir())
    assert [(r["prompt_index"], r["sample_index"]) for r in _rows(entry, "fidelity")] == calls[0]  # first batch kept
    calls.clear()
    crash[0] = False
    run_job(_cfg(tmp_path, "evaluator=[fidelity]"))
    scored_again = {k for c in calls for k in c}
    assert scored_again == {(p, 0) for p in range(2, 5)}          # only the three not scored before
    assert "resuming, 2 image(s) already scored" in capsys.readouterr().out
    rec = json.loads((entry / "record.json").read_text())
    # the same metric as a run never interrupted
    fresh = run_job(_cfg(tmp_path / "fresh", "evaluator=[fidelity]"))
    assert rec["metrics"] == json.loads((fresh / "record.json").read_text())["metrics"]


@pytest.mark.integration
def test_record_carries_per_image_flops_and_executed_tokens(tmp_path):
    entry = run_job(_cfg(tmp_path, "evaluator=[]"))
    rec = json.loads((entry / "record.json").read_text())
    traces = [json.loads(line) for line in (entry / "traces.jsonl").read_text().splitlines()]
    assert [check_record(t, TraceRow) for t in traces] == [[]] * len(traces)   # the documented trace row
    per_image = [t["work"]["flops"]["total"] for t in traces]
    assert rec["flops"]["per_image"]["n"] == 5 == len(per_image)
    assert rec["flops"]["total"] == pytest.approx(sum(per_image) / len(per_image))
    assert 0 < rec["work"]["keep_fraction"]["mean"] < 1            # skip_last_2 skips the last two scales' tokens
    assert rec["work"]["executed_tokens"]["max"] < rec["work"]["dense_tokens"]
    # end to end: + the text encoder and one VAE decode per image at the generated resolution
    f = rec["flops"]
    assert f["vae_decode"] > 0 and f["text_encoder"] is not None and f["end_to_end_per_image"]["n"] == 5
    assert f["end_to_end"] == pytest.approx(f["total"] + f["text_encoder"] + f["vae_decode"])
    assert all(t["work"]["flops"]["vae_decode"] == f["vae_decode"] for t in traces)   # skipping scales skips no decode


@pytest.mark.integration
def test_a_failed_wandb_mirror_is_published_by_the_next_launch(tmp_path, monkeypatch, capsys):
    pytest.importorskip("wandb")
    from varbench.cli.run import run   # the command's wiring: logger=wandb subscribes W&B to the job
    from varbench.loggers import publish
    monkeypatch.setenv("WANDB_MODE", "offline")
    real_fill = publish.fill_run

    def broken(*a, **kw):
        raise ConnectionError("W&B unreachable")

    monkeypatch.setattr(publish, "fill_run", broken)
    cfg = _cfg(tmp_path, "logger=wandb", f"logger.dir={tmp_path}/wb", "logger.log_sweep=false", "evaluator=[]")
    entry = run(cfg)
    assert (entry / "DONE").exists() and not (entry / publish.MARKER).exists()
    assert "W&B unreachable" in capsys.readouterr().out
    calls = []
    monkeypatch.setattr(publish, "fill_run", lambda *a, **kw: calls.append(1) or real_fill(*a, **kw))
    run(cfg)                                                       # finished: skipped, but published now
    assert calls == [1] and (entry / publish.MARKER).exists()
    run(cfg)
    assert calls == [1]                                            # once only
    from varbench.harness.records import RunEntry

    RunEntry.from_dir(entry).verify()                              # the marker is outside the seal


def test_a_job_failing_before_any_output_leaves_no_empty_folders(tmp_path, monkeypatch):
    import varbench.harness.job as job_mod

    def boom(job):
        raise RuntimeError("model failed to build")

    monkeypatch.setattr(job_mod, "_build", boom)
    # scoring batches of 2: the 5 prompts make 3 blocks, so shard 0/3 has prompts (an empty shard is refused
    # before any work, issue 40)
    monkeypatch.setattr(job_mod, "SCORE_BATCH", 2)
    with pytest.raises(RuntimeError, match="failed to build"):
        run_job(_cfg(tmp_path))
    entries = tmp_path / "store" / "smoke" / "entries"
    assert not entries.exists() or not any(entries.iterdir())
    with pytest.raises(RuntimeError, match="failed to build"):
        run_job(_cfg(tmp_path, "shard=0/3"))
    assert not entries.exists() or not any(entries.iterdir())


def test_different_base_seeds_share_no_image_seed():
    """The rule's promise (varbench/core/seeds.py): under ``base + 1000*p + s`` seed 1's image (p, 0)
    was seed 0's image (p, 1); hashed seeds of bases 0..4 over 200 prompts x 4 samples never collide."""
    seen = {}
    for base in range(5):
        for p in range(200):
            for s in range(4):
                seed = image_seed(base, p, s)
                assert 0 <= seed < 2**63
                assert seed not in seen, f"base {base} ({p},{s}) reuses {seen[seed]}"
                seen[seed] = (base, p, s)
    assert image_seed(7, 3, 2) == image_seed(7, 3, 2)              # a pure function of (base, p, s)
    with pytest.raises(ValueError):
        image_seed(-1, 0, 0)


def test_a_garbled_versions_file_is_named(tmp_path):
    from varbench.harness.scoring import read_json

    path = tmp_path / "versions.json"
    path.write_text('{"fidelity": {"version": ')
    with pytest.raises(ValueError, match=r"versions\.json is garbled .*delete it and relaunch"):
        read_json(path)


@pytest.mark.integration
def test_a_limited_run_stores_the_bits_the_full_run_makes(tmp_path, monkeypatch):
    """Images are generated in whole batches of fixed members (varbench/harness/sharding.py), so a run on
    a subset (benchmark.limit=3 cuts the batch [2, 3]) stores the bits the full run stores. At
    width 512 a batch of 2 flips sampled bits that the same image alone does not (measured on the
    CPU); here the runtime records each call's batch to prove the companions were computed."""
    import varbench.harness.job as job_mod

    calls = []
    real = job_mod._build

    def build(job):
        rt, policy = real(job)
        gen = rt.generate

        def generate(prompts, seeds, *a, **kw):
            calls.append(list(seeds))
            return gen(prompts, seeds, *a, **kw)

        rt.generate = generate
        return rt, policy

    monkeypatch.setattr(job_mod, "_build", build)
    limited = run_job(_cfg(tmp_path / "a", "benchmark.limit=3", "evaluator=[]"))
    assert [len(c) for c in calls] == [2, 2]                   # [0, 1] and [2, 3]: prompt 3 computed, not stored
    full = run_job(_cfg(tmp_path / "b", "benchmark.limit=4", "evaluator=[]"))
    from varbench.harness.store import ImageStore

    store_a = ImageStore(tmp_path / "a" / "store", json.loads((limited / "record.json").read_text())["generation_id"])
    store_b = ImageStore(tmp_path / "b" / "store", json.loads((full / "record.json").read_text())["generation_id"])
    assert store_a.generation_hash == store_b.generation_hash   # limits never regenerate images...
    for p in range(3):                                           # ...because the bits are the same
        assert store_a.path(p, 0).read_bytes() == store_b.path(p, 0).read_bytes()
    assert not store_a.has(3, 0)


@pytest.mark.integration
def test_check_record_names_missing_undocumented_and_nested_keys(tmp_path):
    rec = json.loads((run_job(_cfg(tmp_path, "evaluator=[]", "timing=quick", "timing.repeats=1",
                                   "timing.warmup=0")) / "record.json").read_text())
    assert check_record(rec) == []                                  # timed, with paired block
    bad = json.loads(json.dumps(rec))
    del bad["wall_s"]
    bad["speedup"] = 2.0
    bad["flops"]["per_image"]["median"] = 1.0
    bad["timing"]["by_batch"]["1"]["p50"] = 3.0
    assert check_record(bad) == ["wall_s: missing", "speedup: not in varbench.harness.schema.RunRecord",
                                 "timing.by_batch.1.p50: not in varbench.harness.schema.TimingBlock",
                                 "flops.per_image.median: not in varbench.harness.schema.Spread"]


@pytest.mark.integration
def test_systems_knobs_reach_the_record_and_the_image_key(tmp_path):
    """runtime.attn_backend=math (a CPU kernel that rounds differently) through a whole job: the record
    names the knobs (timing.runtime, provenance.runtime_knobs), the images get their own store key,
    and the default-knob job's keys are those of a config without the knobs."""
    common = ("evaluator=[]", "timing=quick", "timing.repeats=1", "timing.warmup=0", "benchmark.limit=2")
    auto = json.loads((run_job(_cfg(tmp_path / "a", *common)) / "record.json").read_text())
    math_ = json.loads((run_job(_cfg(tmp_path / "m", *common, "runtime.attn_backend=math")) / "record.json").read_text())
    assert check_record(math_) == []
    want = {"compile": "off", "compile_fullgraph": False, "compile_log": None, "quant": "none",
            "attn_backend": "math", "cuda_graphs": False}
    assert math_["timing"]["runtime"] == math_["provenance"]["runtime_knobs"] == want
    assert auto["timing"]["runtime"]["attn_backend"] == "auto"
    assert math_["generation_id"] != auto["generation_id"] and math_["entry_id"] != auto["entry_id"]
    assert auto["memory"]["peak_reserved_bytes"] is None and auto["memory"]["nvml_bytes"] is None   # CPU
