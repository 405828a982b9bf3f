"""experiments/device_bench.py: the `--smoke` CPU run end to end (the code path the H200 run takes, on tiny
models), the entropy-off measurement's same-plan guarantee, preset loading, the paired ratio, the random
fill; and, on a CUDA machine (`-m gpu`), the eager-vs-graphed bit check."""
from __future__ import annotations

import json
import math
import time

import pytest
import torch

from experiments import device_bench as db

BATCHES = (1, 2)
#: role -> the smoke run's method presets (conf/method_set/device_bench/<model>.yaml)
METHODS = db.role_methods(smoke=True)
N_SCALES = 7  # pn 0.06M


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("device_bench")
    threads = torch.get_num_threads()
    t = time.perf_counter()
    # a generous budget: the smoke run takes ~10 s on 2 idle cores; a loaded CI box must not skip rows
    rc = db.main(["--smoke", "--out", str(out), "--budget-s", "600"])
    secs = time.perf_counter() - t
    assert torch.get_num_threads() == threads  # the smoke run's one thread is restored
    rec = json.loads((out / "device_bench.json").read_text())
    return rc, rec, (out / "device_bench.md").read_text(), secs


def _rows(rec, **kw):
    return [r for r in rec["rows"] if all(r.get(k) == v for k, v in kw.items())]


@pytest.mark.integration
def test_smoke_run_finishes(smoke):
    rc, rec, _, secs = smoke
    assert rc == 0 and rec["status"] == "done" and rec["smoke"] is True
    assert "RANDOM" in rec["note"]
    assert not [r for r in rec["rows"] if r["status"].startswith("failed")]
    assert all(s["status"] != "running" for s in rec["sections"])
    assert rec["env"]["torch_threads"] == 1
    assert rec["config"]["cfg"] == 4.0 and rec["config"]["repeats"] == 2 and rec["config"]["warmup"] == 1
    print(f"smoke run: {secs:.1f}s")


@pytest.mark.integration
def test_a_timed_row_per_method_and_batch(smoke):
    _, rec, _, _ = smoke
    for role in ("2b", "8b"):
        for method in METHODS[role] + [f"{db.TOPROVAR}~{db.ENTROPY_OFF}"]:
            for b in (BATCHES[:1] if method.endswith(db.ENTROPY_OFF) else BATCHES):
                rows = _rows(rec, model=role, method=method, batch=b, mode="eager")
                assert rows, (role, method, b)
                for r in rows:
                    assert r["status"] == "ok" and r["repeats"] == 2, r["status"]
                    for key in ("ar_ms", "e2e_ms", "decode_ms"):
                        s = r[key]
                        assert s["median"] > 0 and s["p10"] <= s["median"] <= s["p90"], (key, s)
                    assert r["e2e_ms"]["median"] >= r["ar_ms"]["median"]
                    assert r["images_per_s"] == pytest.approx(b * 1e3 / r["e2e_ms"]["median"])
                    assert len(r["per_scale_ms"]) == N_SCALES and all(v > 0 for v in r["per_scale_ms"])
                    assert r["bits_repeatable"] is True  # same seeds every repeat -> same bits
                    assert r["peak_gib"] is None         # CPU: no CUDA allocator
    graphed = _rows(rec, mode="graphed")
    assert graphed and all(r["status"] == "skipped: no CUDA" and r["repeats"] == 0 for r in graphed)
    assert rec["bitchecks"] and all(b["result"] == "skipped: no CUDA" for b in rec["bitchecks"])


@pytest.mark.integration
def test_hart_rows(smoke):
    """The tiny HART in the HART role: one eager section at batch 1, every method timed and paired with the
    baseline of the same rounds; SkipLast(-2) and FastVAR's rule (moved onto the tiny grids) cut FLOPs."""
    _, rec, md, _ = smoke
    assert [s["status"] for s in rec["sections"] if s["role"] == "hart"] == ["done"]
    rows = {r["method"]: r for r in _rows(rec, model="hart")}
    assert list(rows) == METHODS["hart"] == ["baseline", "fastvar_hart_tiny", "skip_last_2"]
    for m, r in rows.items():
        assert r["status"] == "ok" and r["repeats"] == 2 and r["batch"] == 1 and r["mode"] == "eager", (m, r["status"])
        assert len(r["per_scale_ms"]) == 4 and r["bits_repeatable"] is True   # hart_tiny's grids 1, 2, 3, 5
        lo, hi = r["paired"]["ar_ci95"]
        assert r["paired"]["vs"].startswith("baseline (eager") and lo <= r["paired"]["ar_speedup"] <= hi
        assert f"| {r['model_label']} | {m} | 1 | eager |" in md
    assert rows["baseline"]["flops_ratio_vs_baseline"] == 1.0
    assert rows["skip_last_2"]["flops_ratio_vs_baseline"] > 1 and rows["fastvar_hart_tiny"]["flops_ratio_vs_baseline"] > 1
    assert rec["config"]["hart"]["dtype"].startswith("float32")   # CPU: no fp16 autocast


@pytest.mark.integration
def test_paired_speedups(smoke):
    _, rec, _, _ = smoke
    for r in _rows(rec, mode="eager"):
        if not r.get("repeats"):
            continue
        p = r["paired"]
        lo, hi = p["ar_ci95"]
        assert p["n"] == 2 and lo <= p["ar_speedup"] <= hi
        if r["method"] == "baseline":  # paired with itself: exactly 1, interval contains 1
            assert p["ar_speedup"] == 1.0 and lo <= 1.0 <= hi
        elif r["method"].endswith(db.ENTROPY_OFF):
            assert p["vs"].startswith("toprovar (")
        else:
            assert p["vs"].startswith("baseline (")


@pytest.mark.integration
def test_flops_ratios(smoke):
    _, rec, _, _ = smoke
    for role in ("2b", "8b"):
        for b in BATCHES:
            skip = _rows(rec, model=role, method="skip_last_2", batch=b, mode="eager")[0]
            assert skip["flops_ratio_vs_baseline"] > 1
            fv = _rows(rec, model=role, method=db.fastvar_preset(METHODS[role]), batch=b, mode="eager")[0]
            if db.fastvar_preset(METHODS[role]) == "fastvar":  # the release's rule keys on widths 32/40: none on the 0.06M smoke schedule
                assert fv["flops_ratio_vs_baseline"] == 1.0
            else:                              # the 8B paper preset counts scales from the end: it prunes
                assert fv["flops_ratio_vs_baseline"] > 1
            base = _rows(rec, model=role, method="baseline", batch=b, mode="eager")[0]
            assert base["flops_ratio_vs_baseline"] == 1.0


@pytest.mark.integration
def test_entropy_share_is_measured_on_the_same_plan(smoke):
    _, rec, _, _ = smoke
    ok = [e for e in rec["entropy"] if e["status"] == "ok"]
    assert {(e["model"], e["batch"]) for e in ok} == {(r, 1) for r in ("2b", "8b")}  # batch 1 only
    for e in ok:
        assert e["mode"] == "eager" and e["same_plan"] is True and e["flops_on"] == e["flops_off"]
        assert e["calls_recorded"] > 0 and all(c == e["calls_recorded"] for c in e["calls_replayed_per_run"])
        assert e["share_ci95"][0] <= e["share"] <= e["share_ci95"][1]
        assert e["share"] == pytest.approx(1 - e["off_ar_ms"] / e["on_ar_ms"], rel=1e-6)


@pytest.mark.integration
def test_markdown_and_targets(smoke):
    _, rec, md, _ = smoke
    for role in ("2b", "8b"):
        for method in METHODS[role]:
            assert f"| {method} |" in md
    assert "toprovar~entropy_off" in md and "SMOKE" in md and "## Bit checks" in md
    targets = rec["targets"]
    kinds = ["baseline AR loop <= 0.30 s", "baseline AR loop <= 0.80 s", "images/s >= 3x batch", "FastVAR default",
             "attention-entropy share"]
    for k in kinds:
        assert any(k in t["target"] for t in targets), k
    assert len(targets) == 8  # AR x2, batch scaling x2, FastVAR x2, entropy x2
    for t in targets:
        assert t["verdict"] in ("PASS", "FAIL"), t
        assert t["measured"] != "not measured" and any(ch.isdigit() for ch in t["measured"])
        assert "SMOKE" in t["target"]
        assert t["target"] in md and t["measured"] in md
    md_targets = md.split("## Targets")[1].split("## Results")[0]
    assert md_targets.count("| **PASS** |") + md_targets.count("| **FAIL** |") == 8


def test_entropy_replay_keeps_the_plan_zeros_would_not():
    """Replaying recorded entropies reproduces ToProVAR's plan and bits exactly; answering with zeros would
    change the plan (why the bench replays rather than zeroes)."""
    from varbench.policies import build_policy
    import varbench.engine.backbones.infinity.pruned as R   # the runtime's unfused entropy call

    spec = db.model_specs(True, None)["2b"]
    cpu = torch.device("cpu")
    model, vae = db.build_model(spec, cpu, torch.float32, 0)
    rt = db.make_runtime(model, vae, cpu, torch.float32, db.runtime_accepts_cuda_graphs())
    text = db.random_text(spec.cfg, 2, 30, cpu, 0)
    # thresholds low enough that ToProVAR's depth D and token keeps depend on the entropies here
    pol = build_policy("toprovar", d_min_tokens=16, min_tokens_to_prune=16, svd_scale=3)

    def run():
        return rt.generate(["x", "y"], [0, 1], pol, pn="0.06M", cfg=4.0, text=text, decode=False)

    orig = R.attention_entropy
    patch = db.EntropyPatch()
    assert "varbench.engine.backbones.infinity.pruned:attention_entropy" in patch.names
    store: dict = {}
    with patch.recording(store):
        on = run()
    assert any(st["first_pruned"] is not None for st in on.image_stats)  # the plan really prunes
    with patch.replaying(store):
        off = run()
    assert R.attention_entropy is orig  # restored
    assert patch.last_calls == len(store) > 0 and all(len(k) == 2 and k[0] != "call" for k in store)
    assert off.flops["total"] == on.flops["total"]
    assert all((a is None and b is None) or torch.equal(a, b) for a, b in zip(on.bits, off.bits))
    try:
        R.attention_entropy = lambda q, k, chunk=1024, key_mask=None: q.new_zeros(q.shape[0], q.shape[2], dtype=torch.float32)
        zeros = run()
    finally:
        R.attention_entropy = orig
    assert zeros.flops["total"] != on.flops["total"]


def test_entropy_patch_answers_the_fused_kernel_with_plain_attention():
    """`flash_attention_with_entropy` (out, entropy): replay = SDPA output + the recorded entropy, keyed by
    the caller's (si, bi); the fallback's nested `attention_entropy` call is not recorded twice."""
    from varbench.engine import kernels
    patch = db.EntropyPatch()
    assert "varbench.engine.kernels:flash_attention_with_entropy" in patch.names
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 5, 8, generator=g) for _ in range(3))

    def block(si, bi):
        return kernels.flash_attention_with_entropy(q, k, v, 1.0)

    store: dict = {}
    with patch.recording(store):
        out_on, ent_on = block(3, 1)
    assert list(store) == [(3, 1)] and torch.equal(store[(3, 1)], ent_on)
    with patch.replaying(store):
        out_off, ent_off = block(3, 1)
    assert patch.last_calls == 1 and ent_off is store[(3, 1)]
    assert torch.allclose(out_off, torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=1.0))
    assert torch.allclose(out_on, out_off, atol=1e-6)
    with pytest.raises(RuntimeError, match="plan diverged"), patch.replaying(store):
        block(4, 1)
    assert kernels.flash_attention_with_entropy is patch.found[[n for n in patch.names].index(
        "varbench.engine.kernels:flash_attention_with_entropy")][2]


def test_the_bench_times_the_method_sets_as_jobs_resolve_them():
    """The roles' methods are the device_bench method sets, in priority order (the baseline first), and each
    policy is the one a job of the preset on the role's model builds (`resolve_method`), e.g. the 8B role's
    FastVAR is the 8B paper preset, with its own `prune` and fastvar.yaml's inherited `skip`."""
    from varbench.harness.presets import resolve_method

    assert METHODS["2b"] == ["baseline", "fastvar", "nova", "toprovar", "skip_last_2", "sparvar", "sparsevar"]
    assert METHODS["8b"] == ["baseline", "fastvar_8b_paper", "nova", "toprovar", "skip_last_2", "sparvar", "sparsevar"]
    assert db.role_methods()["hart"] == ["baseline", "fastvar_hart", "skip_last_2"]
    assert db.fastvar_preset(METHODS["8b"]) == "fastvar_8b_paper"
    c = resolve_method("fastvar_8b_paper", model="infinity_8b")
    assert c.name == "fastvar" and c.knobs["prune"] == {-4: 0.4, -3: 0.6, -2: 1.0, -1: 1.0}
    assert c.knobs["skip"] == [] and c.knobs["cache_scale"] == -5
    bench = db.Bench.__new__(db.Bench)              # only the policy cache and the arguments it reads
    bench.a, bench.policies = type("A", (), {"smoke": True})(), {}
    for role, presets in METHODS.items():
        for preset in presets:
            built = bench.policy(preset, role)
            # the smoke run's Infinity roles are tiny models: presets resolve with their `tiny` blocks
            model = "tiny" if role in db.INFINITY_ROLES else db.SMOKE_ROLE_MODELS[role]
            want = resolve_method(preset, model=model).build()
            assert type(built) is type(want) and built.describe() == want.describe(), (role, preset)
    assert bench.policy("fastvar_hart_tiny", "hart").describe() != resolve_method("fastvar_hart").build().describe()


def test_paired_ratio():
    same = db.paired_ratio([10.0, 11.0, 12.0], [10.0, 11.0, 12.0])
    assert same["ratio"] == 1.0 and same["ci95"] == [1.0, 1.0] and same["per_round"] == [1.0, 1.0, 1.0]
    two = db.paired_ratio([20.0, 22.0, 24.0, 26.0, 28.0], [10.0, 11.0, 12.0, 13.0, 14.0])
    assert two["ratio"] == pytest.approx(2.0) and two["ci95"][0] == pytest.approx(2.0) and two["n"] == 5
    noisy = db.paired_ratio([10.0, 30.0, 20.0, 25.0, 15.0], [10.0, 10.0, 10.0, 10.0, 10.0])
    assert noisy["ci95"][0] < noisy["ratio"] < noisy["ci95"][1]


def test_random_fill_is_finite_and_sized():
    spec = db.model_specs(True, None)["8b"]
    model, vae = db.build_model(spec, torch.device("cpu"), torch.float32, 0)
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        assert torch.isfinite(t).all(), name
    assert all((b == 0).all() for n, b in model.named_buffers() if n.endswith("zero_k_bias"))
    w = model.blocks[0].ffn.fc1.weight
    assert w.std().item() == pytest.approx(1 / math.sqrt(3 * w.shape[1]), rel=0.1)


@pytest.mark.integration
@pytest.mark.gpu
def test_gpu_smoke_bit_check(tmp_path):
    """On CUDA: tiny models, eager and graphed, every method's bits equal in both modes."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    if not db.runtime_accepts_cuda_graphs():
        pytest.skip("the runtime has no cuda_graphs option yet")
    rc = db.main(["--smoke", "--device", "cuda", "--out", str(tmp_path), "--budget-s", "600"])
    rec = json.loads((tmp_path / "device_bench.json").read_text())
    assert rc == 0 and rec["status"] == "done"
    checks = rec["bitchecks"]
    for role in ("2b", "8b"):
        for method in METHODS[role]:
            got = [b for b in checks if b["model"] == role and b["method"] == method and b["batch"] == 1]
            assert got and all(b["result"] == "equal" for b in got), got
    graphed = _rows(rec, mode="graphed", batch=1)
    assert graphed and all(r["status"] == "ok" and r["ar_ms"]["median"] > 0 for r in graphed)
    assert all(r["peak_gib"] > 0 for r in graphed)
