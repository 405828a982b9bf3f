"""The device bench through the ordinary job (issue 34, "Experiments are the product's"):
``python -m varbench +experiment=device_bench`` is a sweep over the model's device-bench method set with random
weights, the device timing protocol and no evaluators; ``+experiment=device_bench_smoke`` is the same on the CPU
with the tiny model. Checked here: the configs each real model composes (random weights, no T5 / Qwen2 file, the
set's methods) and, end to end on the CPU, that the records carry timing with paired speed-ups and their
intervals, FLOPs and memory, and that the aggregated table pairs them like any other sweep's."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from varbench.analysis.layout import group_dirs
from varbench.harness.presets import compose_job_config, method_set

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("model", ["infinity_2b", "infinity_8b", "hart_0p7b"])
def test_the_experiment_runs_each_real_model_with_random_weights_and_no_text_model(model):
    from varbench.harness.build import model_weight_files
    from varbench.harness.config import validate_config
    from varbench.harness.preflight import job_files_missing

    cfg = compose_job_config(["+experiment=device_bench", f"model={model}"])
    assert cfg.model.random_weights is True and cfg.model.text_encoder == "word"
    assert model_weight_files(cfg.model) == {}                 # nothing read, nothing hashed
    assert not cfg.get("evaluator") and cfg.timing.enabled and cfg.timing.paired_baseline
    assert cfg.timing.warmup >= 10                             # CUDA-graph captures before the timed rounds
    validate_config(cfg)
    assert job_files_missing(cfg) == []                        # no checkpoint, VAE, T5 or Qwen2 folder needed
    for preset in method_set("device_bench", model):           # every method of the set runs on the model
        validate_config(compose_job_config(["+experiment=device_bench", f"model={model}", f"method={preset}"]))


@pytest.mark.integration
def test_the_smoke_sweep_writes_paired_records_and_a_table_with_intervals(tmp_path, capfd):
    """`python -m experiments.device_bench --job --smoke`: the `+experiment=device_bench_smoke` sweep as a user
    launches it (a subprocess), then the curated markdown from the sweep's aggregated table."""
    from experiments import device_bench as db

    rc = db.main(["--job", "--smoke", "--models", "2b", "--out", str(tmp_path / "curated"),
                  "--override", f"paths.output_root={tmp_path}", "--override", f"paths.store_dir={tmp_path / 'store'}",
                  "--override", f"hydra.sweep.dir={tmp_path / 'sweep'}"])
    out = "".join(capfd.readouterr())
    assert rc == 0, out

    methods = method_set("device_bench", "tiny")
    records = [json.loads(p.read_text()) for p in (tmp_path / "store" / "device_bench_smoke").glob("entries/*/record.json")]
    by = {r["method"]["preset"]: r for r in records}
    assert sorted(by) == sorted(methods) and methods[0] == "baseline", out
    base = by["baseline"]
    for preset, r in by.items():
        assert r["metrics"] == {} and r["config"]["model"]["random_weights"] is True          # no evaluators: timing only
        assert r["memory"]["kv_bytes_allocated"] > 0 and r["flops"]["total"] > 0
        t = r["timing"]["by_batch"]["1"]
        assert t["ar_ms"]["median"] > 0 and r["timing"]["repeats"] == 3
        if preset == "baseline":
            assert "paired" not in t                                                # its own reference
            continue
        p = t["paired"]                     # the baseline timed in this job, interleaved ABBA on the same prompts
        assert p["order"] == "abba" and p["n_prompts"] == 2 and p["ci_kind"] == "bootstrap"
        assert p["ar_ci_low"] <= p["ar_speedup"] <= p["ar_ci_high"] and p["ar_ci_low"] > 0
        # both methods cut the tiny model's transformer work: FLOPs are exact, whatever the CPU's load
        assert r["flops"]["total"] < base["flops"]["total"], preset
    [folder] = group_dirs(tmp_path / "results" / "device_bench_smoke")
    table = (folder / "table.md").read_text()
    assert "[random weights]" in table
    assert re.search(r"\| baseline \|[^\n]*\| 1 \(reference\) \| 1 \(reference\) \|", table), table
    for preset in methods[1:]:           # every method row: a paired speed-up with its interval, AR and end to end
        names = {preset, str(by[preset]["method"].get("label") or preset)}   # a row reads its preset or its label
        row = next(line for line in table.splitlines() if any(line.startswith(f"| {n} |") for n in names))
        assert len(re.findall(r"\d+\.\d\d× \[\d+\.\d\d, \d+\.\d\d\]", row)) == 2, row
    md = (tmp_path / "curated" / "device_bench_job.md").read_text()
    assert f"## {folder.name}" in md and table.strip() in md and "RANDOM" in md


@pytest.mark.integration
def test_a_job_whose_runtime_fell_back_during_the_timed_pass_fails(tmp_path, monkeypatch):
    """`timing=device` (what +experiment=device_bench uses) forbids fallbacks: the paired baseline's first timed
    call finds the fused entropy kernel broken (as a Triton failure would) and the runtime turns it off
    (`fall_back`); the job then fails with FellBackError naming the knob, and no record is finished (a
    "fused" timing that ran on SDPA is never a record), as experiments.device_bench fails such a row. With
    `timing.fail_on_fallback=false` the same job finishes and its record lists the fallback."""
    from varbench.engine.backbones.infinity.runtime import InfinityRuntime
    from varbench.harness.job import FellBackError, run_job

    real = InfinityRuntime.generate

    def generate(self, prompts, seeds, policy=None, **kw):
        if getattr(policy, "name", "") == "baseline" and not self.fallbacks:   # only the timed pass runs the baseline
            self.fall_back("runtime.fused_entropy", RuntimeError("triton: no kernel for this device"))
        return real(self, prompts, seeds, policy, **kw)

    monkeypatch.setattr(InfinityRuntime, "generate", generate)

    def cfg(*extra):
        return compose_job_config(["+experiment=device_bench_smoke", "method=skip_last_2", f"paths.output_root={tmp_path}",
                                   f"paths.store_dir={tmp_path / 'store'}", "timing.repeats=1", "timing.prompts_static=1",
                                   *extra])

    with pytest.raises(FellBackError, match=r"during the timed pass: runtime\.fused_entropy=false \(RuntimeError: triton"):
        run_job(cfg())
    assert not list((tmp_path / "store").rglob("record.json"))
    entry = run_job(cfg("timing.fail_on_fallback=false"))
    rec = json.loads((Path(entry) / "record.json").read_text())
    assert rec["provenance"]["runtime_fallbacks"] == [
        {"knob": "runtime.fused_entropy=false", "error": "RuntimeError: triton: no kernel for this device"}]
