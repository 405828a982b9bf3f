"""Aggregation: pairing with the baseline, ratios and deltas, refusals, figures.

Synthetic records are written with varbench.harness.records into tmp_path; the expected ratios are
computed by hand from the numbers put in (e.g. baseline AR 100 ms vs 40 ms -> 2.5x).
"""
from __future__ import annotations

import math

import pytest

pd = pytest.importorskip("pandas")

from varbench.analysis.aggregate import AggregationError, aggregate, pair_with_baseline  # noqa: E402
from varbench.analysis.frame import records_to_frame  # noqa: E402
from varbench.cli.aggregate import main  # noqa: E402
from varbench.harness.records import RunEntry, find_entries  # noqa: E402


def make_record(entry_id, method, ar_ms, total_ms, flops, metrics, *, label=None, device="H200",
                seeds=None, bench_sha="b" * 64, ev_version="1", created="2025-01-01T00:00:00+00:00",
                generation=None, timed=True, provenance=None, evaluators=None, batch="1", paired=None,
                preset=None, overrides=(), items_sha="i" * 64, n_prompts=8):
    rec = {
        "entry_id": entry_id, "generation_id": "g" + entry_id, "created": created,
        "experiment": {"name": "synthetic", "tags": [], "overrides": list(overrides)},
        "config": {"method": method},
        "model": {"name": "infinity_2b", "preset": "2b", "resolution": [1024, 1024], "h_div_w": 1.0, "dtype": "bf16",
                  "weights": {"infinity_2b_reg.pth": "0" * 64}},
        "method": {"name": method, "label": label, "config": {}, "stats": {}, **({"preset": preset} if preset else {})},
        "benchmark": {"name": "geneval", "sha256": bench_sha, "items_sha256": items_sha, "n_prompts": n_prompts,
                      "samples_per_prompt": 2, "seeds": seeds or {"base": 0}},
        "evaluators": {"geneval": {"version": ev_version}, "hpsv2": {"version": "2.1"}},
        "metrics": {f"{k}": v[0] for k, v in metrics.items()},
        "uncertainty": {f"{k}": v[1] for k, v in metrics.items()},
        "timing": {"device": device, "dtype": "bf16", "warmup": 1, "repeats": 3, "by_batch": {
            "4": {"ar_ms": {"median": ar_ms / 2}, "total_ms": {"median": total_ms / 2}, "images_per_s": 9.0},
            "1": {"text_ms": {"median": 5.0, "p10": 4.0, "p90": 6.0}, "ar_ms": {"median": ar_ms},
                  "decode_ms": {"median": 10.0}, "total_ms": {"median": total_ms}, "images_per_s": 1000.0 / total_ms,
                  "peak_mem_bytes": 2 * 2**30, "per_scale_ms": [1.0, 2.0]}}},
        "flops": {"total": flops, "ar": flops * 0.9, "per_scale": [flops / 2, flops / 2]},
        "provenance": provenance or {"cpu_model": "Test CPU"}, "wall_s": 1.0,
    }
    if generation is not None:   # the resolved config as job.py stores it (sampling settings included)
        rec["config"] = {"method": {"name": method}, "generation": generation, "model": {"name": "infinity_2b"}}
    if evaluators is not None:
        rec["evaluators"] = evaluators
    if paired is not None:       # the block timed_pass writes when the baseline is timed in the same job
        rec["timing"]["by_batch"]["1"]["paired"] = paired
    if not timed:                # timing=none: quality-only record, no timing block
        rec["timing"] = None
    elif batch != "1":
        rec["timing"]["by_batch"] = {batch: rec["timing"]["by_batch"]["1"]}
    return rec


#: the results folder of make_record's (model, resolution): varbench.analysis.layout.group_dir_name
G = "infinity_2b-1024px"

GEN = {"cfg": 3.0, "tau": 1.0, "top_k": 900, "top_p": 0.97, "negative_prompt": None, "seed": 0}


def write(root, rec, traces=None, done=True):
    e = RunEntry(root, rec["entry_id"])
    e.write_record(rec)
    if traces:
        e.append_traces(traces)
    if done:
        e.mark_done()
    return e


def trace(method, keep, entropy, skip_last=False):
    scales = []
    for si in range(3):
        ran = not (skip_last and si == 2)
        scales.append({"si": si, "h": 2 ** si, "w": 2 ** si, "ran": ran,
                       "keep_frac": (keep if si > 0 else None) if ran else None,
                       "entropy_mean": entropy[si] if ran else None, "ms": 1.0})
    return {"prompt_index": 0, "sample_index": 0, "method": method, "scales": scales,
            "stats": {"layer_labels": ["b0", "b1"]}}


@pytest.fixture
def store(tmp_path):
    root = tmp_path / "results"
    write(root, make_record("base01", "baseline", 100.0, 120.0, 1e12,
                            {"geneval/overall": (0.70, 0.02), "hpsv2/score": (0.300, 0.001)}),
          traces=[trace("baseline", None, [1.0, 0.8, 0.5])])
    write(root, make_record("fast01", "fastvar", 40.0, 60.0, 4e11,
                            {"geneval/overall": (0.68, 0.02), "hpsv2/score": (0.305, 0.001)},
                            label="fastvar r=0.4"),
          traces=[trace("fastvar", [0.5, 0.25], [1.0, 0.7, 0.4], skip_last=True)])
    # An unfinished entry must be ignored.
    write(root, make_record("half01", "nova", 10.0, 20.0, 1e11, {"geneval/overall": (0.1, 0.1)}), done=False)
    return root


def test_frame_has_one_row_per_finished_record(store):
    frame = records_to_frame(find_entries(store))
    assert sorted(frame["entry_id"]) == ["base01", "fast01"]
    row = frame.set_index("entry_id").loc["fast01"]
    assert row["resolution"] == "1024x1024"
    assert row["n_images"] == 16                     # 8 prompts x 2 samples
    assert row["timing_bs"] == 1 and row["ar_ms"] == 40.0   # batch-1 medians, not batch 4
    assert row["peak_mem_gb"] == pytest.approx(2.0)
    assert row["flops_ar"] == pytest.approx(3.6e11)
    assert row["geneval/overall_err"] == pytest.approx(0.02)
    assert row["method_label"] == "fastvar r=0.4"


def test_speedup_and_deltas(store, tmp_path):
    out = tmp_path / "out"
    paired = aggregate(store, out).paired.set_index("entry_id")
    f = paired.loc["fast01"]
    assert f["baseline_entry"] == "base01"
    assert f["speedup"] == pytest.approx(100.0 / 40.0)
    assert f["e2e_speedup"] == pytest.approx(120.0 / 60.0)
    assert f["flops_x"] == pytest.approx(2.5)
    assert f["geneval/overall_delta"] == pytest.approx(-0.02)
    assert f["hpsv2/score_delta"] == pytest.approx(0.005)
    b = paired.loc["base01"]
    assert b["speedup"] == pytest.approx(1.0) and b["geneval/overall_delta"] == pytest.approx(0.0)
    for name in ("table.md", "table.tex", "table.csv", "tidy.csv"):
        assert (out / G / name).is_file()
    assert (out / "tidy.csv").is_file() and not (out / "table.md").exists()   # every record; tables per group
    md = (out / G / "table.md").read_text()
    assert "2.50×" in md and "0.6800 ± 0.0200" in md and "-0.0200" in md
    table = pd.read_csv(out / G / "table.csv")
    assert list(table["method_label"]) == ["baseline", "fastvar r=0.4"]  # baseline first
    # Figures: one scatter per metric, a keep heatmap only for the pruning entry, entropy curves.
    pngs = sorted(p.name for p in (out / G).glob("*.png"))
    assert "speed_vs_geneval_overall.png" in pngs and "speed_vs_hpsv2_score.png" in pngs
    assert any(p.startswith("keep_fastvar") for p in pngs)
    assert not any(p.startswith("keep_baseline") for p in pngs)
    assert any(p.startswith("entropy_vs_scale") for p in pngs)
    assert not list(out.glob("*.png"))                   # figures live in the group folder
    for p in (out / G).glob("*.png"):
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_mismatched_device_is_refused_naming_the_key(store):
    write(store, make_record("a100x1", "nova", 50.0, 70.0, 5e11, {"geneval/overall": (0.69, 0.02)}, device="A100"))
    frame = records_to_frame(find_entries(store))
    with pytest.raises(AggregationError, match=r"device \('A100' vs baseline 'H200'\)"):
        pair_with_baseline(frame)
    with pytest.warns(UserWarning, match="device"):
        paired = pair_with_baseline(frame, allow_unpaired=True)
    assert paired.set_index("entry_id").loc["a100x1", "speedup"] != paired.set_index("entry_id").loc["a100x1", "speedup"]  # NaN


def test_mismatched_prompt_set_is_refused(store):
    write(store, make_record("othr01", "nova", 50.0, 70.0, 5e11, {"geneval/overall": (0.69, 0.02)}, bench_sha="c" * 64))
    with pytest.raises(AggregationError, match="benchmark_sha256"):
        pair_with_baseline(records_to_frame(find_entries(store)))


def test_evaluator_version_mismatch_names_the_evaluator(store):
    write(store, make_record("newev1", "nova", 50.0, 70.0, 5e11, {"geneval/overall": (0.69, 0.02)}, ev_version="2"))
    with pytest.raises(AggregationError, match="evaluator 'geneval' differs"):
        pair_with_baseline(records_to_frame(find_entries(store)))


def test_missing_baseline_is_reported(tmp_path):
    write(tmp_path, make_record("fast01", "fastvar", 40.0, 60.0, 4e11, {"geneval/overall": (0.68, 0.02)}))
    with pytest.raises(AggregationError, match="no record with method == 'baseline'"):
        pair_with_baseline(records_to_frame(find_entries(tmp_path)))


def test_two_baselines_with_the_same_settings_are_refused_naming_both(store):
    # (was: the newest baseline won silently) nothing is chosen among several matching baselines
    write(store, make_record("base02", "baseline", 80.0, 100.0, 1e12, {"geneval/overall": (0.71, 0.02)},
                             created="2025-02-01T00:00:00+00:00"))
    frame = records_to_frame(find_entries(store))
    with pytest.raises(AggregationError, match=r"same generation settings.*base01.*base02") as e:
        pair_with_baseline(frame)
    assert "fast01" in str(e.value) and "ambiguous" in str(e.value)
    with pytest.raises(AggregationError, match="base02"):   # --allow-unpaired does not pick one either
        pair_with_baseline(frame, allow_unpaired=True)
    assert "move or delete the stale one" in str(e.value) and "--allow-unpaired" not in str(e.value)
    assert "or choose one with --baseline base01 (an entry id)" in str(e.value)    # the spelling that chooses


def test_baselines_of_two_experiments_are_told_apart_by_experiment_not_called_stale(store):
    # aggregating a whole store: each sweep's baseline is valid in its own experiment
    rec = make_record("base02", "baseline", 80.0, 100.0, 1e12, {"geneval/overall": (0.71, 0.02)})
    rec["experiment"]["name"] = "other_sweep"
    write(store, rec)
    with pytest.raises(AggregationError, match=r"different experiments \(other_sweep, synthetic\): choose the "
                                               r"reference with --baseline synthetic:baseline .* or --baseline base01 "
                                               r"\(an entry id\), or aggregate one experiment at a time") as e:
        pair_with_baseline(records_to_frame(find_entries(store)))
    assert "stale" not in str(e.value)


def test_cfg3_rows_pair_with_the_cfg3_baseline_not_a_newer_cfg4_one(tmp_path):
    # issue #12 reproduction: baseline at cfg 3, skip_last_2 at cfg 3, then a baseline at cfg 4
    write(tmp_path, make_record("b_cfg3", "baseline", 100.0, 120.0, 1e12, {"geneval/overall": (0.70, 0.02)},
                                generation=GEN))
    write(tmp_path, make_record("s_cfg3", "skip_last_2", 50.0, 70.0, 5e11, {"geneval/overall": (0.66, 0.02)},
                                generation=GEN, created="2025-01-02T00:00:00+00:00"))
    write(tmp_path, make_record("b_cfg4", "baseline", 80.0, 100.0, 1e12, {"geneval/overall": (0.75, 0.02)},
                                generation={**GEN, "cfg": 4.0}, created="2025-02-01T00:00:00+00:00"))
    paired = pair_with_baseline(records_to_frame(find_entries(tmp_path))).set_index("entry_id")
    assert paired.loc["s_cfg3", "baseline_entry"] == "b_cfg3"
    assert paired.loc["s_cfg3", "speedup"] == pytest.approx(2.0)
    assert paired.loc["s_cfg3", "geneval/overall_delta"] == pytest.approx(-0.04)
    assert paired.loc["b_cfg3", "baseline_entry"] == "b_cfg3"
    assert paired.loc["b_cfg4", "baseline_entry"] == "b_cfg4"
    assert paired.loc["b_cfg3", "pair_key"] != paired.loc["b_cfg4", "pair_key"]


@pytest.mark.parametrize("key,value", [("cfg", 5.0), ("tau", 0.5), ("top_k", 2), ("top_p", 0.9),
                                       ("negative_prompt", "blurry")])
def test_no_baseline_with_the_same_sampling_settings_names_the_differing_key(tmp_path, key, value):
    write(tmp_path, make_record("b_cfg3", "baseline", 100.0, 120.0, 1e12, {"geneval/overall": (0.70, 0.02)},
                                generation=GEN))
    write(tmp_path, make_record("m_other", "fastvar", 50.0, 70.0, 5e11, {"geneval/overall": (0.66, 0.02)},
                                generation={**GEN, key: value}))
    frame = records_to_frame(find_entries(tmp_path))
    want = rf"no matching 'baseline' record for 'fastvar' \(entry m_other\).*config generation\.{key} " \
           rf"\({value!r} vs baseline {GEN[key]!r}\)"
    with pytest.raises(AggregationError, match=want):
        pair_with_baseline(frame)
    with pytest.warns(UserWarning, match=rf"generation\.{key}"):
        paired = pair_with_baseline(frame, allow_unpaired=True).set_index("entry_id")
    assert pd.isna(paired.loc["m_other", "baseline_entry"]) and pd.isna(paired.loc["m_other", "speedup"])


def test_differing_timing_batch_size_is_refused(tmp_path):
    write(tmp_path, make_record("b1", "baseline", 100.0, 120.0, 1e12, {"geneval/overall": (0.70, 0.02)},
                                generation=GEN))
    write(tmp_path, make_record("m4", "fastvar", 50.0, 70.0, 5e11, {"geneval/overall": (0.66, 0.02)},
                                generation=GEN, batch="4"))
    with pytest.raises(AggregationError, match=r"timing_bs \(4 vs baseline 1\)"):
        pair_with_baseline(records_to_frame(find_entries(tmp_path)))


def test_records_without_config_pair_on_coarse_keys_with_a_warning(tmp_path):
    rec = make_record("old_b", "baseline", 100.0, 120.0, 1e12, {"geneval/overall": (0.70, 0.02)})
    del rec["config"]
    write(tmp_path, rec)
    write(tmp_path, make_record("new_m", "fastvar", 50.0, 70.0, 5e11, {"geneval/overall": (0.66, 0.02)},
                                generation=GEN))
    with pytest.warns(UserWarning, match=r"entry old_b hold no config, so sampling settings .* were not checked"):
        paired = pair_with_baseline(records_to_frame(find_entries(tmp_path))).set_index("entry_id")
    assert paired.loc["new_m", "baseline_entry"] == "old_b"


FID_EVALS = {"geneval": {"version": "1"}, "fidelity": {"version": "f1"}}


def test_fidelity_metrics_have_no_delta(tmp_path):
    from varbench.analysis.frame import relative_to_baseline

    assert relative_to_baseline("fidelity") and not relative_to_baseline("geneval")
    write(tmp_path, make_record("base01", "baseline", 100.0, 120.0, 1e12,
                                {"geneval/overall": (0.70, 0.02), "fidelity/psnr": (100.0, 0.0),
                                 "fidelity/ssim": (1.0, 0.0)}, evaluators=FID_EVALS))
    write(tmp_path, make_record("fast01", "fastvar", 40.0, 60.0, 4e11,
                                {"geneval/overall": (0.68, 0.02), "fidelity/psnr": (25.4, 0.3),
                                 "fidelity/ssim": (0.81, 0.01)}, evaluators=FID_EVALS))
    out = tmp_path / "out"
    paired = aggregate(tmp_path, out, figures=False).paired
    assert "fidelity/psnr_delta" not in paired.columns and "fidelity/ssim_delta" not in paired.columns
    assert paired.set_index("entry_id").loc["fast01", "geneval/overall_delta"] == pytest.approx(-0.02)
    table = pd.read_csv(out / G / "table.csv")
    assert "fidelity/psnr" in table.columns and "fidelity/psnr_delta" not in table.columns
    md = (out / G / "table.md").read_text()
    assert "| PSNR (dB) ↑ |" in md and "Δ PSNR" not in md and "Δ GenEval overall" in md
    assert "25.40 ± 0.30" in md and "-74.6" not in md


def test_quality_only_record_aggregates(tmp_path):
    # timing=none on a CPU: no timing block, so the device label comes from provenance ("x86_64"),
    # while the timed baseline's label is job._device_name's "cpu (x86_64, 2 threads)"
    prov = {"torch": {"device_name": "x86_64"}}
    write(tmp_path, make_record("base01", "baseline", 100.0, 120.0, 1e12, {"geneval/overall": (0.70, 0.02)},
                                generation=GEN, device="cpu (x86_64, 2 threads)", provenance=prov))
    write(tmp_path, make_record("qual01", "fastvar", 1.0, 1.0, 4e11, {"geneval/overall": (0.67, 0.02)},
                                generation=GEN, timed=False, provenance=prov))
    paired = aggregate(tmp_path, tmp_path / "out", figures=False).paired.set_index("entry_id")
    q = paired.loc["qual01"]
    assert q["baseline_entry"] == "base01"
    assert q["geneval/overall_delta"] == pytest.approx(-0.03)
    assert q["speedup"] != q["speedup"] and q["flops_x"] == pytest.approx(2.5)   # no timing: NaN speed-up
    # other hardware is still refused, named by the provenance field
    write(tmp_path, make_record("qual02", "nova", 1.0, 1.0, 4e11, {"geneval/overall": (0.6, 0.02)},
                                generation=GEN, timed=False, provenance={"torch": {"device_name": "H200"}}))
    with pytest.raises(AggregationError, match=r"device_name \('H200' vs baseline 'x86_64'\)"):
        pair_with_baseline(records_to_frame(find_entries(tmp_path)))


def test_cli(store, tmp_path, capsys):
    out = tmp_path / "cli"
    assert main([str(store), "--out", str(out), "--no-figures"]) == 0
    assert "fastvar r=0.4" in capsys.readouterr().out
    assert (out / G / "table.md").is_file() and not list(out.rglob("*.png"))
    assert main([str(tmp_path / "nothing_here"), "--out", str(out)]) == 2
    assert "is not a folder; records live in the store" in capsys.readouterr().err
    assert main([str(out), "--out", str(tmp_path / "again")]) == 2   # the results folder, not the store
    assert "no finished records" in (err := capsys.readouterr().err) and "that is a results folder" in err


def test_failed_records_are_skipped_and_unfinished_reported(store, tmp_path, capsys):
    rec = make_record("fail01", "nova", 1.0, 2.0, 1e9, {"geneval/overall": (0.0, 0.0)})
    rec["status"] = "failed"
    write(store, rec)
    with pytest.warns(UserWarning, match="fail01"):
        paired = aggregate(store, tmp_path / "o", figures=False).paired
    assert "fail01" not in set(paired["entry_id"])
    with pytest.warns(UserWarning, match="fail01"):
        assert main([str(store), "--out", str(tmp_path / "o2"), "--no-figures"]) == 0
    note = "Not in this table: 1 unfinished store entry (no DONE: still running, killed or failed): half01."
    assert note in capsys.readouterr().out
    assert note in (tmp_path / "o2" / G / "table.md").read_text()     # in the pasted table itself, not only on the console
    assert "half01" in (tmp_path / "o2" / G / "table.tex").read_text()


def test_a_sweeps_failed_jobs_are_named_in_the_table_notes(store, tmp_path):
    failed = [{"overrides": ["method=nova_fast", "+experiment=x", "paths.output_root=/tmp/a", "benchmark.path=/data/g.jsonl"],
               "error": "WeightsNotFound: no file\n  fix: ..."}]
    aggregate(store, tmp_path / "o", figures=False, failed=failed)
    md = (tmp_path / "o" / G / "table.md").read_text()
    assert "Not in this table: 1 job(s) of the sweep failed: method=nova_fast +experiment=x (WeightsNotFound)." in md


# -- paired speed-ups with intervals, presets, sections (issue #14) ----------------------------------
def paired_block(method_ms, ref_ms, speed=lambda i: 1.0, repeats=9, order="abba"):
    """What timed_pass records for a method and the baseline interleaved on a fake machine whose
    call ``i`` takes ``work * speed(i)`` ms (deterministic: no wall clock)."""
    import torch
    from types import SimpleNamespace

    from varbench.harness.timing import timed_pass

    calls = []

    def gen(ms):
        def g(bs):
            calls.append(ms)
            t = ms * speed(len(calls) - 1)
            return SimpleNamespace(timings_ms={"text": 1.0, "ar": t, "decode": 2.0, "per_scale": [t]})
        return g

    block = timed_pass(gen(method_ms), [1], 0, repeats, torch.device("cpu"), reference=gen(ref_ms),
                       order=order)["1"]["paired"]
    block["loadavg"] = None     # this machine's real load average is no part of the fake pass
    return block


def test_tidy_csv_carries_the_paired_interval_columns(tmp_path):
    write(tmp_path, make_record("base01", "baseline", 100.0, 120.0, 1e12, {"geneval/overall": (0.70, 0.02)}))
    # separately timed job says 100/40 = 2.5x (unpaired), the interleaved pass measures 2.0x
    write(tmp_path, make_record("fast01", "fastvar", 40.0, 60.0, 4e11, {"geneval/overall": (0.68, 0.02)},
                                paired=paired_block(50.0, 100.0, speed=lambda i: 1.0 + 0.01 * i),
                                preset="fastvar_light"))
    aggregate(tmp_path, tmp_path / "out", figures=False)
    tidy = pd.read_csv(tmp_path / "out" / "tidy.csv").set_index("entry_id")     # one line for pandas users
    f = tidy.loc["fast01"]
    assert f["method_preset"] == "fastvar_light" and f["n_repeats"] == 9
    assert f["paired_speedup_ci_low"] <= 2.0 <= f["paired_speedup_ci_high"]
    assert f["paired_speedup_ci_low"] <= f["paired_speedup"] <= f["paired_speedup_ci_high"]
    assert f["paired_speedup_ci_level"] >= 0.95 and bool(f["speedup_reliable"])
    assert f["speedup"] == pytest.approx(2.5)          # the unpaired ratio stays in the CSVs ...
    table = pd.read_csv(tmp_path / "out" / G / "table.csv")
    assert {"speedup", "paired_speedup_ci_low", "speedup_reliable", "n_repeats"} <= set(table.columns)
    md = (tmp_path / "out" / G / "table.md").read_text()
    assert "2.50×" in md                                # (that is FLOPs ×, 1e12 / 4e11) ...
    assert md.count("2.50×") == 1 and "paired speed-up AR" in md   # ... but leaves the main table
    row = next(line for line in md.splitlines() if line.startswith("| fastvar_light "))
    lo, hi = f["paired_speedup_ci_low"], f["paired_speedup_ci_high"]
    assert f"{f['paired_speedup']:.2f}× [{lo:.2f}, {hi:.2f}]" in row and "†" not in row
    assert "| 16 / 1×9 |" in row                        # n: 8 prompts x 2 images; 1 timed prompt x 9 repeats


def test_noisy_pass_is_marked_unreliable_with_its_reason(tmp_path):
    write(tmp_path, make_record("base01", "baseline", 100.0, 120.0, 1e12, {"geneval/overall": (0.70, 0.02)}))
    burst = [1.0, 1.0, 1.0, 2.5, 1.0, 1.0, 2.5, 1.0, 1.0, 1.0, 1.0, 2.5, 1.0, 1.0, 2.5, 1.0, 1.0, 1.0]
    write(tmp_path, make_record("nova01", "nova", 90.0, 110.0, 1e12, {"geneval/overall": (0.70, 0.02)},
                                paired=paired_block(50.0, 50.0, speed=lambda i: burst[i]), preset="nova_fast"))
    paired = aggregate(tmp_path, tmp_path / "out", figures=False).paired.set_index("entry_id")
    n = paired.loc["nova01"]
    assert not n["speedup_reliable"] and "interval width" in n["unreliable_reason"]
    md = (tmp_path / "out" / G / "table.md").read_text()
    row = next(line for line in md.splitlines() if line.startswith("| nova_fast "))
    assert "†" in row and "† unreliable speed-up" in md and "nova_fast: interval width" in md


def test_same_work_as_the_baseline_is_one_within_its_interval_and_marked(tmp_path):
    fid = {"geneval": {"version": "1"}, "fidelity": {"version": "f1", "psnr_cap_db_in_mean": 100.0}}
    metrics = {"geneval/overall": (0.70, 0.02), "fidelity/psnr": (100.0, 0.0), "fidelity/ssim": (1.0, 0.0)}
    write(tmp_path, make_record("base01", "baseline", 100.0, 120.0, 1e12, metrics, evaluators=fid))
    # thresholds that never fire: same FLOPs, same bits; a drifting machine; separate jobs said 3.92x
    write(tmp_path, make_record("nova01", "nova", 100.0 / 3.92, 30.0, 1e12, metrics, evaluators=fid,
                                paired=paired_block(50.0, 50.0, speed=lambda i: 1.0 + 0.01 * i), preset="nova_safe"))
    paired = aggregate(tmp_path, tmp_path / "out", figures=False).paired.set_index("entry_id")
    n = paired.loc["nova01"]
    assert bool(n["identical_images"]) and n["flops_x"] == 1.0
    assert n["paired_speedup_ci_low"] <= 1.0 <= n["paired_speedup_ci_high"]
    md = (tmp_path / "out" / G / "table.md").read_text()
    row = next(line for line in md.splitlines() if line.startswith("| nova_safe ‡ "))
    assert "3.92" not in md and "| ∞ |" in row and "PSNR ∞" in md and "‡ executed work equals" in md
    base_row = next(line for line in md.splitlines() if line.startswith("| baseline "))
    assert base_row.rstrip(" |").endswith("—")          # no Δ of the baseline against itself


def test_rows_on_other_prompts_get_their_own_section(tmp_path):
    # the same methods on all 8 prompts and on a limit of 2: never one section under one label
    for tag, items, n in (("all", "i" * 64, 8), ("lim", "j" * 64, 2)):
        write(tmp_path, make_record(f"base_{tag}", "baseline", 100.0, 120.0, 1e12, {"geneval/overall": (0.7, 0.02)},
                                    items_sha=items, n_prompts=n))
        write(tmp_path, make_record(f"nova_{tag}", "nova", 50.0, 70.0, 5e11, {"geneval/overall": (0.6, 0.02)},
                                    items_sha=items, n_prompts=n, overrides=["method=nova_fast"]))
    aggregate(tmp_path, tmp_path / "out", figures=False)
    md = (tmp_path / "out" / G / "table.md").read_text()
    sections = md.split("### ")[1:]
    assert len(sections) == 2
    assert "(8 prompts × 2 images)" in sections[0] and "baseline entry base_all" in sections[0]
    assert "(2 prompts × 2 images)" in sections[1] and "baseline entry base_lim" in sections[1]
    for sec in sections:    # each with its own baseline and the preset from the command line
        assert sum(line.startswith("| baseline ") for line in sec.splitlines()) == 1
        assert sum(line.startswith("| nova_fast ") for line in sec.splitlines()) == 1


def test_record_timed_before_the_interval_protocol_is_unreliable(tmp_path):
    write(tmp_path, make_record("base01", "baseline", 100.0, 120.0, 1e12, {"geneval/overall": (0.70, 0.02)}))
    old = {"ar_speedup": 1.71, "e2e_speedup": 1.5, "reference_ar_ms": 100.0, "reference_total_ms": 120.0}
    write(tmp_path, make_record("nova01", "nova", 58.0, 80.0, 1e12, {"geneval/overall": (0.70, 0.02)}, paired=old))
    n = aggregate(tmp_path, tmp_path / "out", figures=False).paired.set_index("entry_id").loc["nova01"]
    assert n["paired_speedup"] == pytest.approx(1.71) and pd.isna(n["paired_speedup_ci_low"])
    assert not n["speedup_reliable"] and "no per-repeat ratios" in n["unreliable_reason"]
    assert "1.71× †" in (tmp_path / "out" / G / "table.md").read_text()


def test_config_thresholds_of_the_record_decide_reliability(tmp_path):
    write(tmp_path, make_record("base01", "baseline", 100.0, 120.0, 1e12, {"geneval/overall": (0.70, 0.02)}))
    rec = make_record("nova01", "nova", 58.0, 80.0, 1e12, {"geneval/overall": (0.70, 0.02)},
                      paired=paired_block(50.0, 50.0, speed=lambda i: 1.0 + 0.05 * i))   # drift: wide interval
    frame_default = records_to_frame([write(tmp_path, rec).dir]).iloc[0]
    assert not frame_default["speedup_reliable"]
    rec["config"]["timing"] = {"max_ci_rel_width": 5.0, "max_reference_spread": 5.0}   # lenient knobs
    rec["entry_id"] = "nova02"
    assert bool(records_to_frame([write(tmp_path, rec).dir]).iloc[0]["speedup_reliable"])


# -- which machine (issue #20 item 7) ----------------------------------------------------------------
EPYC = "cpu (AMD EPYC 9654 96-Core Processor, x86_64, 2 threads)"
XEON = "cpu (Intel(R) Xeon(R) Platinum 8480+, x86_64, 2 threads)"


def test_rows_from_machines_with_different_cpu_models_are_refused_naming_both(tmp_path):
    prov = {"cpu_model": "AMD EPYC 9654 96-Core Processor", "device": EPYC}
    write(tmp_path, make_record("base01", "baseline", 100.0, 120.0, 1e12, {"geneval/overall": (0.70, 0.02)},
                                device=EPYC, provenance=prov))
    write(tmp_path, make_record("nova01", "nova", 50.0, 70.0, 5e11, {"geneval/overall": (0.69, 0.02)},
                                device=XEON, provenance={"cpu_model": "Intel(R) Xeon(R) Platinum 8480+", "device": XEON}))
    with pytest.raises(AggregationError, match=r"device \('cpu \(Intel.*vs baseline 'cpu \(AMD EPYC 9654"):
        pair_with_baseline(records_to_frame(find_entries(tmp_path)))


def test_a_quality_only_record_pairs_on_the_full_device_label(tmp_path):
    prov = {"cpu_model": "AMD EPYC 9654 96-Core Processor", "device": EPYC, "torch": {"device_name": "x86_64"}}
    write(tmp_path, make_record("base01", "baseline", 100.0, 120.0, 1e12, {"geneval/overall": (0.70, 0.02)},
                                generation=GEN, device=EPYC, provenance=prov))
    write(tmp_path, make_record("qual01", "fastvar", 1.0, 1.0, 4e11, {"geneval/overall": (0.67, 0.02)},
                                generation=GEN, timed=False, provenance=prov))
    assert pair_with_baseline(records_to_frame(find_entries(tmp_path))).set_index("entry_id").loc["qual01", "baseline_entry"] == "base01"
    # same architecture (torch's device_name "x86_64" alike), another CPU: refused
    other = {"cpu_model": "Intel(R) Xeon(R) Platinum 8480+", "device": XEON, "torch": {"device_name": "x86_64"}}
    write(tmp_path, make_record("qual02", "nova", 1.0, 1.0, 4e11, {"geneval/overall": (0.6, 0.02)},
                                generation=GEN, timed=False, provenance=other))
    with pytest.raises(AggregationError, match=r"device \('cpu \(Intel"):
        pair_with_baseline(records_to_frame(find_entries(tmp_path)))


def test_records_without_a_cpu_model_pair_but_are_flagged(tmp_path):
    old = {"torch": {"device_name": "x86_64"}}      # written before provenance named the CPU model
    write(tmp_path, make_record("base01", "baseline", 100.0, 120.0, 1e12, {"geneval/overall": (0.70, 0.02)},
                                device="cpu (x86_64, 2 threads)", provenance=old))
    write(tmp_path, make_record("nova01", "nova", 50.0, 70.0, 5e11, {"geneval/overall": (0.69, 0.02)},
                                device="cpu (x86_64, 2 threads)", provenance=old))
    with pytest.warns(UserWarning, match=r"base01, nova01 were paired on the device label 'cpu \(x86_64, 2 threads\)', which names no CPU model"):
        paired = aggregate(tmp_path, tmp_path / "out", figures=False).paired
    assert paired.set_index("entry_id").loc["nova01", "baseline_entry"] == "base01"
    md = (tmp_path / "out" / G / "table.md").read_text()
    assert "device=cpu (x86_64, 2 threads) [CPU model not recorded]" in md
    assert "recorded no CPU model" in md


# -- one folder per (model, resolution); comparing experiments (issue #23 items 4 and 5) ---------------
def as_model(rec, name, res):
    """``rec`` as a record of model ``name`` at ``res`` x ``res`` pixels."""
    rec["model"] = {**rec["model"], "name": name, "resolution": [res, res]}
    return rec


def two_model_store(root):
    """The same two methods on infinity_2b at 1024 px and on toy at 64 px, in one experiment."""
    for model, res, ms in (("infinity_2b", 1024, 100.0), ("toy", 64, 10.0)):
        write(root, as_model(make_record(f"b_{model}", "baseline", ms, ms + 20, 1e12,
                                         {"geneval/overall": (0.70, 0.02), "hpsv2/score": (0.300, 0.001)}), model, res),
              traces=[trace("baseline", None, [1.0, 0.8, 0.5])])
        write(root, as_model(make_record(f"f_{model}", "fastvar", ms / 2, ms / 2 + 20, 4e11,
                                         {"geneval/overall": (0.60, 0.02), "hpsv2/score": (0.310, 0.001)},
                                         label="fastvar r=0.4"), model, res),
              traces=[trace("fastvar", [0.5, 0.25], [1.0, 0.7, 0.4], skip_last=True)])


def test_group_dir_names_are_stable_and_file_name_safe():
    from varbench.analysis.layout import group_dir_name

    assert group_dir_name("toy", "64x64") == group_dir_name("toy", 64) == group_dir_name("toy", [64, 64]) == "toy-64px"
    assert group_dir_name("infinity_2b", "1024x1024") == "infinity_2b-1024px"
    assert group_dir_name("tiny", "512x640") == "tiny-512x640px"                  # not square: both sides
    assert group_dir_name("my model/v2", None) == "my_model_v2-res_unknown"       # never a path
    assert group_dir_name(float("nan"), "64x64") == "model_unknown-64px"


def test_two_models_of_one_experiment_never_overwrite_each_others_files(tmp_path):
    two_model_store(tmp_path / "store")
    out = tmp_path / "results"
    result = aggregate(tmp_path / "store", out)
    assert [g.name for g in result.groups] == ["infinity_2b-1024px", "toy-64px"]
    for g in result.groups:        # each folder: its own rows, paired with its own model's baseline
        model = g.name.split("-")[0]
        assert g.folder == out / g.name and set(g.paired["entry_id"]) == {f"b_{model}", f"f_{model}"}
        table = pd.read_csv(g.folder / "table.csv").set_index("entry_id")
        assert list(table.index) == [f"b_{model}", f"f_{model}"] and table.loc[f"f_{model}", "baseline_entry"] == f"b_{model}"
        assert table.loc[f"f_{model}", "speedup"] == pytest.approx(2.0)          # ms / (ms / 2), each model its own
        md = (g.folder / "table.md").read_text()
        assert md.count("### ") == 1 and f"model={model}" in md                 # one section: nothing of the other model
        assert len(pd.read_csv(g.folder / "tidy.csv")) == 2
    # the same stable names in both folders, no group suffix, different pictures (the keep heatmaps are
    # named by entry, the entropy curves by their group's keys: plots.py's naming)
    names = [sorted(p.name for p in g.folder.glob("speed_vs_*.png")) for g in result.groups]
    assert names[0] == names[1] == ["speed_vs_geneval_overall.png", "speed_vs_hpsv2_score.png"], names
    assert all(list(g.folder.glob("entropy_vs_scale_*.png")) for g in result.groups)
    a, b = (g.folder / "speed_vs_geneval_overall.png" for g in result.groups)
    assert a.read_bytes() != b.read_bytes()
    assert sorted(pd.read_csv(out / "tidy.csv")["entry_id"]) == ["b_infinity_2b", "b_toy", "f_infinity_2b", "f_toy"]
    assert not list(out.glob("*.png")) and not (out / "table.md").exists()
    # the toy records go: their folder goes too (a user's file in it stays, and so does the folder then)
    import shutil

    for e in ("b_toy", "f_toy"):
        shutil.rmtree(tmp_path / "store" / "entries" / e)
    (out / "toy-64px" / "my_notes.txt").write_text("mine")
    assert [g.name for g in aggregate(tmp_path / "store", out).groups] == ["infinity_2b-1024px"]
    assert [p.name for p in (out / "toy-64px").iterdir()] == ["my_notes.txt"]
    assert (out / "infinity_2b-1024px" / "speed_vs_geneval_overall.png").is_file()


def test_figure_names_get_a_suffix_only_when_a_folder_holds_several_benchmarks(tmp_path):
    for bench, sha in (("geneval", "b" * 64), ("hpsv2", "c" * 64)):
        for method, ms in (("baseline", 100.0), ("fastvar", 50.0)):
            rec = make_record(f"{method}_{bench}", method, ms, ms + 20, 1e12 if ms == 100.0 else 5e11,
                              {"geneval/overall": (0.7 if ms == 100.0 else 0.6, 0.02)}, bench_sha=sha)
            rec["benchmark"]["name"] = bench
            write(tmp_path / "store", rec)
    [g] = aggregate(tmp_path / "store", tmp_path / "out").groups           # one model and resolution: one folder
    names = sorted(p.name for p in g.folder.glob("speed_vs_*.png"))
    assert len(names) == 2 and all("__" in n for n in names), names       # two benchmarks in it: told apart


def test_a_results_folder_of_the_flat_layout_does_not_linger_as_current(store, tmp_path):
    import json

    out = tmp_path / "out"
    out.mkdir()
    for name in ("table.md", "table.tex", "table.csv", "speed_vs_old_metric.png", "image_grid.png"):
        (out / name).write_text("old")
    (out / ".figures.json").write_text(json.dumps(["speed_vs_old_metric.png", "keep_gone.png"]))
    (out / "keep_gone.png").write_text("old")
    (out / "README_mine.md").write_text("a file varbench did not write")
    result = aggregate(store, out, figures=False)
    assert sorted(p.name for p in result.removed) == [".figures.json", "image_grid.png", "keep_gone.png",
                                                       "speed_vs_old_metric.png", "table.csv", "table.md", "table.tex"]
    assert sorted(p.name for p in out.iterdir()) == [".groups.json", "README_mine.md", G, "report.html", "tidy.csv"]
    assert (out / G / "table.md").read_text() != "old"


def two_experiments(root, device_b="H200"):
    """Experiments exp_a and exp_b, each with a baseline and fastvar at the same settings."""
    for exp, ms, dev in (("exp_a", 100.0, "H200"), ("exp_b", 80.0, device_b)):
        for method, f, q in (("baseline", 1.0, 0.70), ("fastvar", 0.5, 0.66 if exp == "exp_a" else 0.62)):
            rec = make_record(f"{exp}_{method}", method, ms * f, ms * f + 20, 1e12 * f, {"geneval/overall": (q, 0.02)},
                              device=dev)
            rec["experiment"]["name"] = exp
            write(root / exp, rec)


def test_two_experiments_with_the_same_baseline_settings_need_a_chosen_baseline(tmp_path, capsys, monkeypatch):
    two_experiments(tmp_path / "store")
    monkeypatch.chdir(tmp_path)
    a, b = str(tmp_path / "store" / "exp_a"), str(tmp_path / "store" / "exp_b")
    assert main([a, b, "--no-figures"]) == 2                          # today's refusal, naming the new spelling
    err = capsys.readouterr().err
    assert "ambiguous" in err and "--baseline exp_a:baseline" in err and "--baseline exp_a_baseline" in err
    assert main([a, b, "--no-figures", "--baseline", "exp_a:baseline"]) == 0
    out = tmp_path / "results" / "compare-exp_a-exp_b" / G           # the documented default for several paths
    table = pd.read_csv(out / "table.csv").set_index("entry_id")
    assert set(table["baseline_entry"]) == {"exp_a_baseline"}                 # every row against exp_a's baseline
    assert table.loc["exp_b_fastvar", "speedup"] == pytest.approx(100.0 / 40.0)
    assert table.loc["exp_b_fastvar", "geneval/overall_delta"] == pytest.approx(0.62 - 0.70)
    assert bool(table.loc["exp_a_baseline", "is_baseline"]) and not bool(table.loc["exp_b_baseline", "is_baseline"])
    assert table.loc["exp_b_baseline", "speedup"] == pytest.approx(100.0 / 80.0)   # exp_b's baseline is a row now
    md = (out / "table.md").read_text()
    rows = [line.split("|")[1].strip() for line in md.splitlines() if line.startswith("| ") and "[exp_" in line]
    assert rows[0] == "baseline [exp_a]" and sorted(rows[1:4]) == ["baseline [exp_b]", "fastvar [exp_a]", "fastvar [exp_b]"]
    assert "Baseline: the 'baseline' records of experiment 'exp_a' (--baseline exp_a:baseline): the Δ" in md
    # an entry id prefix chooses exp_b's baseline instead
    assert main([a, b, "--no-figures", "--baseline", "exp_b_base", "--out", str(tmp_path / "by_entry")]) == 0
    table = pd.read_csv(tmp_path / "by_entry" / G / "table.csv").set_index("entry_id")
    assert set(table["baseline_entry"]) == {"exp_b_baseline"}
    assert table.loc["exp_a_fastvar", "speedup"] == pytest.approx(80.0 / 50.0)
    # a prefix of several entries, an unknown experiment: one error naming what there is
    assert main([a, b, "--baseline", "exp_", "--out", str(tmp_path / "x")]) == 2
    assert "matches 4 entries" in capsys.readouterr().err
    assert main([a, b, "--baseline", "exp_c:baseline", "--out", str(tmp_path / "x")]) == 2
    assert "experiments present: ['exp_a', 'exp_b']" in capsys.readouterr().err


def test_a_chosen_baseline_still_refuses_what_does_not_pair(tmp_path):
    two_experiments(tmp_path / "store", device_b="A100")
    with pytest.raises(AggregationError, match=r"exp_b_fastvar.*device \('A100' vs baseline 'H200'\)"):
        aggregate([tmp_path / "store" / "exp_a", tmp_path / "store" / "exp_b"], tmp_path / "out",
                  baseline="exp_a:baseline", figures=False)
    # a whole store is a PATH too; each experiment's own baseline still pairs within it without a choice
    result = aggregate(tmp_path / "store", tmp_path / "out", figures=False)
    assert dict(zip(result.paired["entry_id"], result.paired["baseline_entry"]))["exp_b_fastvar"] == "exp_b_baseline"


# --------------------------------------------------------------------------- memory columns (issue 24)
def with_memory(rec, kv_gib, used_gib, peak_gib=None, batch=1, kind="cuda_max_memory_allocated"):
    """The record's `memory` block as varbench.engine.memory.memory_summary writes it (bytes)."""
    rec["memory"] = {"kv_bytes_allocated": kv_gib * 2**30, "kv_bytes_used_peak": used_gib * 2**30,
                     "kv_bytes_per_scale": [used_gib * 2**30], "kv_dtype": "bf16", "batch": batch,
                     "peak_bytes": None if peak_gib is None else peak_gib * 2**30, "peak_kind": kind,
                     "peak_measured": "generation", "weights_bytes": None, "analytic_peak_bytes": None}
    return rec


@pytest.fixture()
def memory_store(tmp_path):
    """Baseline KV 4 GiB (all in use), ScaleKV 0.5 GiB allocated / 0.25 in use, FastVAR without a
    memory block (a record from before memory was recorded)."""
    root = tmp_path / "store"
    write(root, with_memory(make_record("base01", "baseline", 100.0, 120.0, 1e12, {"geneval/overall": (0.70, 0.02)}),
                            4.0, 4.0, peak_gib=9.0))
    write(root, with_memory(make_record("skv01", "scalekv", 80.0, 100.0, 1e12, {"geneval/overall": (0.66, 0.02)},
                                        label="ScaleKV", paired=paired_block(80.0, 100.0)), 0.5, 0.25, peak_gib=5.5))
    write(root, make_record("fast01", "fastvar", 40.0, 60.0, 4e11, {"geneval/overall": (0.68, 0.02)}, label="FastVAR"))
    return root


def test_memory_x_is_the_baselines_kv_over_the_methods_and_used_stays_in_the_csvs(memory_store, tmp_path):
    out = tmp_path / "out"
    paired = aggregate(memory_store, out).paired.set_index("entry_id")
    s = paired.loc["skv01"]
    assert s["memory_x"] == pytest.approx(4.0 / 0.5)          # allocated: the memory that runs out
    assert s["memory_used_x"] == pytest.approx(4.0 / 0.25)    # positions in use
    assert s["kv_gb"] == pytest.approx(0.5) and s["peak_gb"] == pytest.approx(5.5)
    assert paired.loc["base01", "memory_x"] == pytest.approx(1.0)
    assert math.isnan(paired.loc["fast01", "memory_x"])       # no memory block: no ratio
    table = pd.read_csv(out / G / "table.csv").set_index("entry_id")
    for col in ("kv_gb", "kv_used_gb", "peak_gb", "peak_kind", "memory_batch", "memory_x", "memory_used_x"):
        assert col in table.columns, col
    assert table.loc["skv01", "memory_used_x"] == pytest.approx(16.0)
    md = (out / G / "table.md").read_text()
    header = next(line for line in md.splitlines() if line.startswith("| method"))
    cols = [c.strip() for c in header.strip("|").split("|")]
    assert cols[7:10] == ["KV (GB) @1024²", "peak (GB)", "memory ×"]   # labelled with the records' resolution
    cells = {r.split("|")[1].strip(): [c.strip() for c in r.strip("|").split("|")]
             for r in md.splitlines() if r.startswith("| ") and not r.startswith("| method")}
    assert cells["scalekv"][7:10] == ["0.5", "5.5", "8.00×"]
    assert cells["baseline"][7:10] == ["4", "9", "1.00×"]
    assert cells["fastvar"][7:10] == ["–", "–", "–"]           # a record without memory shows –
    assert "per image" in md and "batch 1" in md and "max_memory_allocated" in md
    assert "speedup_vs_memory.png" in {p.name for p in (out / G).glob("*.png")}


def test_memory_x_is_not_formed_across_batch_sizes(tmp_path):
    """A shared buffer's per-image share depends on the batch: KV at batch 8 vs batch 1 is no ratio."""
    root = tmp_path / "store"
    write(root, with_memory(make_record("base01", "baseline", 100.0, 120.0, 1e12, {"geneval/overall": (0.7, 0.02)}), 4.0, 4.0))
    write(root, with_memory(make_record("skv01", "scalekv", 80.0, 100.0, 1e12, {"geneval/overall": (0.7, 0.02)}),
                            0.5, 0.25, batch=8))
    paired = pair_with_baseline(records_to_frame(find_entries(root))).set_index("entry_id")
    assert math.isnan(paired.loc["skv01", "memory_x"]) and paired.loc["skv01", "kv_gb"] == pytest.approx(0.5)


def test_the_memory_figures_points_are_the_tables_ratios(memory_store):
    """speedup_vs_memory: x = memory_x, y = the paired speed-up with its interval, colour = the
    quality Δ; the row without memory is not drawn; the baseline sits at (1, 1) with Δ 0."""
    from varbench.analysis.cost_figures import quality_delta_column, speedup_vs_memory_figure, speedup_vs_memory_points

    paired = pair_with_baseline(records_to_frame(find_entries(memory_store)))
    pts = {p["name"]: p for p in speedup_vs_memory_points(paired)}
    assert set(pts) == {"baseline", "scalekv"}
    s = paired.set_index("entry_id").loc["skv01"]
    assert pts["scalekv"]["memory_x"] == pytest.approx(8.0)
    assert pts["scalekv"]["speedup"] == pytest.approx(s["paired_speedup"])
    assert (pts["scalekv"]["ci_low"], pts["scalekv"]["ci_high"]) == (pytest.approx(s["paired_speedup_ci_low"]),
                                                                    pytest.approx(s["paired_speedup_ci_high"]))
    assert quality_delta_column(paired) == "geneval/overall"
    assert pts["scalekv"]["delta"] == pytest.approx(-0.04) and pts["baseline"]["delta"] == 0.0
    assert (pts["baseline"]["memory_x"], pts["baseline"]["speedup"]) == (1.0, 1.0)
    fig = speedup_vs_memory_figure(paired)
    assert [p["name"] for p in fig.varbench_points] == [p["name"] for p in speedup_vs_memory_points(paired)]
    without = paired.assign(kv_gb=float("nan"), memory_x=float("nan"))
    assert speedup_vs_memory_figure(without) is None           # nothing to draw without memory blocks


# --------------------------------------------------------------------------- several backbones in one store
#: per model: (weight file, baseline AR ms, method AR ms). Each model's speed-up differs (2x, 3x, 4x), so a
#: row paired with another model's baseline would show another number.
MODELS = {"infinity_2b": ("infinity_2b_reg.pth", 100.0, 50.0),
          "infinity_8b": ("infinity_8b_weights.pth", 300.0, 100.0),
          "hart_0p7b": ("hart-0.7b-1024px/llm/ema_model.bin", 40.0, 10.0)}


def model_record(model, method, ms, flops):
    """A record of ``model`` at 1024 px as job.py writes it: ``model.name``/``model.preset`` and the resolved
    config's ``model`` block name it, and its weights are its own files (so its pair_key is its own)."""
    quality = 0.70 if method == "baseline" else 0.65
    rec = make_record(f"{method}_{model}", method, ms, ms + 20, flops, {"geneval/overall": (quality, 0.02)}, generation=GEN)
    rec["model"] = {**rec["model"], "name": model, "preset": model, "weights": {MODELS[model][0]: model[0] * 64}}
    rec["config"]["model"] = {"name": model, "preset": model}
    return rec


def three_model_store(root, without_baseline=()):
    for model, (_, base_ms, method_ms) in MODELS.items():
        if model not in without_baseline:
            write(root, model_record(model, "baseline", base_ms, 1e12 * base_ms))
        write(root, model_record(model, "fastvar", method_ms, 1e12 * method_ms))


def test_three_models_pair_each_method_with_its_own_models_baseline(tmp_path):
    three_model_store(tmp_path / "store")
    out = tmp_path / "out"
    result = aggregate(tmp_path / "store", out, figures=False)
    assert [g.name for g in result.groups] == ["hart_0p7b-1024px", "infinity_2b-1024px", "infinity_8b-1024px"]
    paired = result.paired.set_index("entry_id")
    for model, (_, base_ms, method_ms) in MODELS.items():
        row = paired.loc[f"fastvar_{model}"]
        assert row["model"] == model and row["baseline_entry"] == f"baseline_{model}"
        assert row["speedup"] == pytest.approx(base_ms / method_ms)      # 2x, 3x, 4x: its own baseline's
        assert row["flops_x"] == pytest.approx(base_ms / method_ms)      # flops were put in proportional to ms
        assert row["geneval/overall_delta"] == pytest.approx(-0.05)
        g = next(g for g in result.groups if g.name == f"{model}-1024px")
        table = pd.read_csv(g.folder / "table.csv").set_index("entry_id")
        assert list(table.index) == [f"baseline_{model}", f"fastvar_{model}"]   # its rows only, baseline first
        assert set(table["model"]) == {model}
        md = (g.folder / "table.md").read_text()
        assert md.count("### ") == 1 and f"model={model}" in md
        assert not any(f"model={other}" in md for other in MODELS if other != model)


def test_a_method_without_a_baseline_on_its_model_gets_no_other_models_ratio(tmp_path):
    three_model_store(tmp_path / "store", without_baseline=("infinity_8b",))
    frame = records_to_frame(find_entries(tmp_path / "store"))
    # refused by default, naming the model as what differs from the nearest baseline (another model's)
    with pytest.raises(AggregationError, match=r"fastvar_infinity_8b.*model \('infinity_8b' vs baseline '(infinity_2b|hart_0p7b)'\)"):
        pair_with_baseline(frame)
    with pytest.warns(UserWarning, match="infinity_8b"):
        paired = pair_with_baseline(frame, allow_unpaired=True).set_index("entry_id")
    row = paired.loc["fastvar_infinity_8b"]
    assert pd.isna(row["baseline_entry"])                         # None in the frame (NaN once concatenated)
    for col in ("speedup", "e2e_speedup", "flops_x", "geneval/overall_delta"):
        assert math.isnan(row[col]), col
    for model in ("infinity_2b", "hart_0p7b"):                    # the others still pair with their own
        assert paired.loc[f"fastvar_{model}", "baseline_entry"] == f"baseline_{model}"
        assert paired.loc[f"fastvar_{model}", "speedup"] == pytest.approx(MODELS[model][1] / MODELS[model][2])
    # the written tables agree: the 8B folder holds its method row alone, with empty ratios
    with pytest.warns(UserWarning, match="infinity_8b"):
        result = aggregate(tmp_path / "store", tmp_path / "out", allow_unpaired=True, figures=False)
    table = pd.read_csv(tmp_path / "out" / "infinity_8b-1024px" / "table.csv")
    assert list(table["entry_id"]) == ["fastvar_infinity_8b"] and table["speedup"].isna().all()
    assert table["baseline_entry"].isna().all() and table["flops_x"].isna().all()
    assert [g.name for g in result.groups] == ["hart_0p7b-1024px", "infinity_2b-1024px", "infinity_8b-1024px"]
