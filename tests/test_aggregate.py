"""Aggregation: pairing with the baseline, ratios and deltas, refusals, figures.

Synthetic records are written with varbench.records into tmp_path; the expected ratios are
computed by hand from the numbers put in (e.g. baseline AR 100 ms vs 40 ms -> 2.5x).
"""
from __future__ import annotations

import pytest

pd = pytest.importorskip("pandas")

from varbench.aggregate import AggregationError, aggregate, main, pair_with_baseline  # noqa: E402
from varbench.records import RunEntry, find_entries, records_to_frame  # noqa: E402


def make_record(entry_id, method, ar_ms, total_ms, flops, metrics, *, label=None, device="H200",
                seeds=None, bench_sha="b" * 64, ev_version="1", created="2025-01-01T00:00:00+00:00"):
    return {
        "entry_id": entry_id, "generation_id": "g" + entry_id, "created": created,
        "experiment": {"name": "synthetic", "tags": [], "overrides": []},
        "config": {"method": method},
        "model": {"name": "infinity_2b", "preset": "2b", "resolution": [1024, 1024], "h_div_w": 1.0,
                  "weights": {"infinity_2b_reg.pth": "0" * 64}},
        "method": {"name": method, "label": label, "config": {}, "stats": {}},
        "benchmark": {"name": "geneval", "sha256": bench_sha, "items_sha256": "i" * 64, "n_prompts": 8,
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
        "provenance": {}, "wall_s": 1.0,
    }


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
    paired = aggregate(store, out).set_index("entry_id")
    f = paired.loc["fast01"]
    assert f["baseline_entry"] == "base01"
    assert f["speedup"] == pytest.approx(100.0 / 40.0)
    assert f["e2e_speedup"] == pytest.approx(120.0 / 60.0)
    assert f["flops_x"] == pytest.approx(2.5)
    assert f["geneval/overall_delta"] == pytest.approx(-0.02)
    assert f["hpsv2/score_delta"] == pytest.approx(0.005)
    b = paired.loc["base01"]
    assert b["speedup"] == pytest.approx(1.0) and b["geneval/overall_delta"] == pytest.approx(0.0)
    for name in ("table.md", "table.csv", "tidy.csv"):
        assert (out / name).is_file()
    md = (out / "table.md").read_text()
    assert "2.50×" in md and "0.6800 ± 0.0200" in md and "-0.0200" in md
    table = pd.read_csv(out / "table.csv")
    assert list(table["method_label"]) == ["baseline", "fastvar r=0.4"]  # baseline first
    # Figures: one scatter per metric, a keep heatmap only for the pruning entry, entropy curves.
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert "speed_vs_geneval_overall.png" in pngs and "speed_vs_hpsv2_score.png" in pngs
    assert any(p.startswith("keep_fastvar") for p in pngs)
    assert not any(p.startswith("keep_baseline") for p in pngs)
    assert any(p.startswith("entropy_vs_scale") for p in pngs)
    for p in out.glob("*.png"):
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


def test_latest_baseline_wins(store):
    write(store, make_record("base02", "baseline", 80.0, 100.0, 1e12, {"geneval/overall": (0.71, 0.02)},
                             created="2025-02-01T00:00:00+00:00"))
    paired = pair_with_baseline(records_to_frame(find_entries(store))).set_index("entry_id")
    assert paired.loc["fast01", "baseline_entry"] == "base02"
    assert paired.loc["fast01", "speedup"] == pytest.approx(2.0)


def test_cli(store, tmp_path, capsys):
    out = tmp_path / "cli"
    assert main([str(store), "--out", str(out), "--no-figures"]) == 0
    assert "fastvar r=0.4" in capsys.readouterr().out
    assert (out / "table.md").is_file() and not list(out.glob("*.png"))
    assert main([str(tmp_path / "nothing_here"), "--out", str(out)]) == 2
    assert "no finished records" in capsys.readouterr().err


def test_failed_records_are_skipped_and_unfinished_reported(store, tmp_path, capsys):
    rec = make_record("fail01", "nova", 1.0, 2.0, 1e9, {"geneval/overall": (0.0, 0.0)})
    rec["status"] = "failed"
    write(store, rec)
    with pytest.warns(UserWarning, match="fail01"):
        paired = aggregate(store, tmp_path / "o", figures=False)
    assert "fail01" not in set(paired["entry_id"])
    with pytest.warns(UserWarning, match="fail01"):
        assert main([str(store), "--out", str(tmp_path / "o2"), "--no-figures"]) == 0
    assert "unfinished entry (no DONE) not included: half01" in capsys.readouterr().out
