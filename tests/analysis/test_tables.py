"""Table rendering (issue #14 item 2): readable headers with units, cells, GenEval's per-tag
breakdown, LaTeX export, footnotes for skipped evaluators, PSNR of identical images."""
from __future__ import annotations

import math

import pytest

pd = pytest.importorskip("pandas")

from varbench.analysis import tables as T  # noqa: E402
from varbench.analysis.aggregate import aggregate, latex_table, markdown_table, pair_with_baseline  # noqa: E402
from varbench.analysis.frame import record_to_row, records_to_frame  # noqa: E402
from varbench.harness.records import RunEntry, find_entries  # noqa: E402

TAGS = [t for t, _ in T.GENEVAL_TAGS if t != "overall"]


def record(entry_id, method, *, geneval=None, psnr=None, lpips_status=None, flops=1e12, n_prompts=6, spp=2,
           preset=None, label=None):
    """A minimal finished record: toy GenEval per tag (+ overall = mean of tags), optional fidelity.
    ``label`` defaults to the preset's words (``Skip Last 1``), which say no more than the id."""
    geneval = geneval or {t: 1.0 for t in TAGS}
    metrics = {f"toy_geneval/{t}": v for t, v in geneval.items()}
    metrics["toy_geneval/overall"] = sum(geneval.values()) / len(geneval)
    evals = {"toy_geneval": {"version": "toy_geneval-1"}}
    if psnr is not None:
        metrics.update({"fidelity/psnr": psnr, "fidelity/ssim": 1.0 if psnr >= 100 else 0.9, "fidelity/n_images": 12.0})
        evals["fidelity"] = {"scorer": "fidelity", "psnr_cap_db_in_mean": 100.0,
                             "lpips": lpips_status or "on (alex, alexnet-owt-7be5be79.pth)"}
    return {"entry_id": entry_id, "generation_id": "g" + entry_id, "created": "2025-01-01T00:00:00+00:00",
            "config": {"method": {"name": method}},
            "experiment": {"name": "t", "tags": [], "overrides": [f"method={preset or method}"]},
            "model": {"name": "toy", "preset": "toy", "resolution": [64, 64], "h_div_w": 1.0, "dtype": "float32"},
            "method": {"name": method, "label": label or (preset or method).replace("_", " ").title(), "config": {},
                       "stats": {}},
            "benchmark": {"name": "toy", "sha256": "b" * 64, "items_sha256": "i" * 64, "n_prompts": n_prompts,
                          "samples_per_prompt": spp, "seeds": {"base": 0}},
            "evaluators": evals, "metrics": metrics,
            "uncertainty": {k: 0.01 for k in metrics if not k.endswith("n_images")},
            "timing": {"device": "cpu", "dtype": "float32", "repeats": 9, "by_batch": {"1": {
                "text_ms": {"median": 1.0}, "ar_ms": {"median": 80.0}, "decode_ms": {"median": 10.0},
                "total_ms": {"median": 91.0}}}},
            "flops": {"total": flops, "ar": flops}, "provenance": {"cpu_model": "Test CPU"}}


def write(root, rec, fidelity_rows=None):
    e = RunEntry(root, rec["entry_id"])
    e.write_record(rec)
    if fidelity_rows:
        e.append_samples("fidelity", fidelity_rows)
    e.mark_done()
    return e


def test_readable_headers_with_units():
    assert T.metric_header("toy_geneval/overall") == "toy GenEval overall"
    assert T.metric_header("fidelity/psnr") == "PSNR (dB) ↑" and T.metric_header("fidelity/lpips") == "LPIPS ↓"
    assert T.metric_header("hpsv2/score") == "HPSv2 score"
    assert T.metric_header("newscorer/some_metric") == "newscorer some metric"   # unknown: still no slash


def test_cells():
    assert T.speed_cell(1.523, 1.481, 1.571, True, 9) == "1.52× [1.48, 1.57]"
    assert T.speed_cell(1.09, 0.7, 1.6, False, 9) == "1.09× [0.70, 1.60] †"
    assert T.speed_cell(1.2, 1.2, 1.2, False, 1) == "1.20× [n/a] †"          # one repeat: no interval
    assert T.speed_cell(float("nan"), None, None, None, None) == "–"
    assert T.value_cell(0.99166, 0.00833, 120) == "0.9917 ± 0.0083"
    assert T.value_cell(0.5, float("nan"), 1) == "0.5000 ± n/a"                # n = 1: no standard error
    assert T.value_cell(100.0, 0.0, 120, 2, identical=True) == "∞"


def test_tex_escapes_and_symbols():
    assert T.tex("toy_geneval 50% & #1 {x}") == r"toy\_geneval 50\% \& \#1 \{x\}"
    assert T.tex("1.52× ± 0.1 Δ ∞ †") == r"1.52$\times$ $\pm$ 0.1 $\Delta$ $\infty$ $^\dagger$"


@pytest.fixture
def store(tmp_path):
    inf_rows = [{"prompt_index": p, "sample_index": s, "psnr": math.inf, "ssim": 1.0} for p in range(6) for s in range(2)]
    skipped = "skipped: /root/.cache/torch/hub/checkpoints/alexnet-owt-7be5be79.pth not present"
    write(tmp_path, record("b", "baseline", psnr=100.0, lpips_status=skipped), inf_rows)
    worse = {t: (0.5 if t == "counting" else 1.0) for t in TAGS}
    write(tmp_path, record("s", "skip_last", geneval=worse, psnr=29.8, lpips_status=skipped, flops=5e11,
                           preset="skip_last_1"),
          [{**r, "psnr": 29.8, "ssim": 0.9} for r in inf_rows])
    # close to identical, but one pair differs: the capped mean is not shown as infinite
    near = [{**r, "psnr": 95.0 if i == 0 else math.inf} for i, r in enumerate(inf_rows)]
    write(tmp_path, record("n", "nova", psnr=100.0, lpips_status=skipped, preset="nova_toy"), near)
    return tmp_path


def test_identical_images_come_from_the_per_sample_psnr(store):
    frame = records_to_frame(find_entries(store)).set_index("entry_id")
    assert frame.loc["b", "identical_images"] == True          # noqa: E712 - every pair inf
    assert frame.loc["n", "identical_images"] == False         # noqa: E712 - one pair finite
    assert "fidelity/lpips: skipped" in frame.loc["b", "skipped_metrics"]
    assert frame.loc["s", "method_preset"] == "skip_last_1"    # from the command-line override
    # without the per-sample file: the mean at the cap with SSIM exactly 1
    assert record_to_row(record("x", "nova", psnr=100.0))["identical_images"] is True
    assert record_to_row(record("y", "nova"))["identical_images"] is None


def test_markdown_table_reads_well(store, tmp_path):
    [g] = aggregate(store, tmp_path / "out", figures=False).groups        # one model and resolution: one folder
    paired, md = g.paired, (g.folder / "table.md").read_text()
    lines = md.splitlines()
    header = next(line for line in lines if line.startswith("| method "))
    for h in ("n (images / timed prompts×repeats)", "AR ms per prompt [p10, p90]", "paired speed-up AR [CI]",
              "FLOPs × (transformer)", "FLOPs × (end to end)", "PSNR (dB) ↑",
              "toy GenEval overall", "Δ toy GenEval overall"):
        assert f"| {h} |" in header, h
    assert "/" not in header.replace("n (images / timed prompts×repeats)", "")          # no raw evaluator/metric names
    base = next(line for line in lines if line.startswith("| baseline "))
    assert "| ∞ |" in base and "1 (reference)" in base and base.rstrip(" |").endswith("—")
    nova = next(line for line in lines if line.startswith("| nova_toy "))
    assert "∞" not in nova and "100.00 ± 0.01" in nova                    # capped mean, not infinite
    assert "| 12 / 1×9 |" in nova              # 6 prompts x 2 images; a record without n_prompts timed one prompt, 9 repeats
    assert "± = the evaluator's standard error" in md
    assert "LPIPS not reported: fidelity/lpips skipped: alexnet-owt-7be5be79.pth not present." in md
    assert "/root/.cache" not in md                                       # no machine-local path in a pasted table
    assert "-70" not in md and "Δ PSNR" not in md
    # GenEval breakdown: the six tags and overall, in the paper's order, 2 decimals
    bd = md[md.index("#### toy GenEval by tag"):]
    assert "| method | Single obj. | Two obj. | Counting | Colors | Position | Color attr. | Overall |" in bd
    row = next(line for line in bd.splitlines() if line.startswith("| skip_last_1 "))
    overall = paired.set_index("entry_id").loc["s", "toy_geneval/overall"]
    assert row == f"| skip_last_1 | 1.00 | 1.00 | 0.50 | 1.00 | 1.00 | 1.00 | {overall:.2f} |"


def test_latex_export_matches_the_markdown(store, tmp_path):
    [g] = aggregate(store, tmp_path / "out", figures=False).groups
    paired, tex = g.paired, (g.folder / "table.tex").read_text()
    assert tex == latex_table(paired)
    assert r"\begin{tabular}" in tex and r"\toprule" in tex and r"\bottomrule" in tex
    assert r"skip\_last\_1" in tex and r"$\infty$" in tex and r"$\Delta$ toy GenEval overall" in tex
    assert "Color attr." in tex and "_" not in tex.replace(r"\_", "")       # every underscore escaped
    md = markdown_table(paired)
    n_md_tables = md.count("\n| method |")
    assert tex.count(r"\begin{tabular}") == n_md_tables == 2               # main + GenEval breakdown
    # same rows in both: each markdown row's method cell appears as a LaTeX row
    for line in md.splitlines():
        if line.startswith("| ") and not line.startswith("| method"):
            assert T.tex(line.split(" | ")[0][2:]) + " & " in tex


def test_one_image_gives_na(tmp_path):
    write(tmp_path, record("b", "baseline", n_prompts=1, spp=1))
    write(tmp_path, record("m", "nova", n_prompts=1, spp=1))
    md = markdown_table(pair_with_baseline(records_to_frame(find_entries(tmp_path))))
    assert "± n/a" in md and "± 0.0100" not in md


def test_the_same_preset_twice_in_a_section_is_told_apart(tmp_path):
    write(tmp_path, record("b", "baseline"))
    write(tmp_path, record("m1aaaaaaaa", "nova", preset="nova_fast"))
    write(tmp_path, record("m2bbbbbbbb", "nova", preset="nova_fast", flops=5e11))   # e.g. a knob overridden
    md = markdown_table(pair_with_baseline(records_to_frame(find_entries(tmp_path))))
    assert "| nova_fast [m1aaaaaa] |" in md and "| nova_fast [m2bbbbbb] |" in md


def test_a_job_whose_own_timing_spread_is_marked(tmp_path):
    rec = record("b", "baseline")
    rec["timing"]["by_batch"]["1"]["ar_ms"] = {"median": 100.0, "p10": 50.0, "p90": 180.0}   # 130% spread
    write(tmp_path, rec)
    steady = record("m", "nova")
    steady["timing"]["by_batch"]["1"]["ar_ms"] = {"median": 80.0, "p10": 79.0, "p90": 81.0}
    write(tmp_path, steady)
    frame = records_to_frame(find_entries(tmp_path)).set_index("entry_id")
    assert frame.loc["b", "ar_spread"] == pytest.approx(1.3) and frame.loc["b", "ar_ms_reliable"] == False  # noqa: E712
    assert frame.loc["m", "ar_ms_reliable"] == True                                                       # noqa: E712
    md = markdown_table(pair_with_baseline(records_to_frame(find_entries(tmp_path))))
    assert "| 100.0 † |" in md and "| 80.0 |" in md and "† on AR (ms)" in md and "baseline 130%" in md


def test_both_flops_columns(tmp_path):
    """FLOPs × (transformer) from flops.total, FLOPs × (end to end) from flops.end_to_end; a record
    without the end-to-end count (traces older than it) shows – there, never a made-up ratio."""
    def rec(entry_id, method, total, e2e):
        r = record(entry_id, method, flops=total)
        r["flops"]["end_to_end"] = e2e
        return r

    write(tmp_path, rec("b", "baseline", 1e12, 1.2e12))
    write(tmp_path, rec("f", "fastvar", 2.5e11, 4.5e11))         # 4.00× transformer, 2.67× end to end
    write(tmp_path, rec("o", "nova", 5e11, None))
    [g] = aggregate(tmp_path, tmp_path / "out", figures=False).groups
    md = (g.folder / "table.md").read_text()
    lines = md[:md.index("####")].splitlines()     # the main table, not the GenEval breakdown
    header = next(line for line in lines if line.startswith("| method ")).split(" | ")
    t, e = header.index("FLOPs × (transformer)"), header.index("FLOPs × (end to end)")
    cells = {line.split(" | ")[0]: line.split(" | ") for line in lines if line.startswith("| ") and "---" not in line}
    assert (cells["| fastvar"][t], cells["| fastvar"][e]) == ("4.00×", "2.67×")
    assert (cells["| nova"][t], cells["| nova"][e]) == ("2.00×", "–")
    assert (cells["| baseline"][t], cells["| baseline"][e]) == ("1.00×", "1.00×")
    table = pd.read_csv(g.folder / "table.csv").set_index("method")
    assert table.loc["fastvar", "flops_x_e2e"] == pytest.approx(1.2 / 0.45)


# -- prompts timed, header marks (issue #20 items 3 and 7) -------------------------------------------
def test_header_marks_random_weights_and_a_modified_prompt_file(tmp_path):
    base = record("b", "baseline")
    base["config"]["model"] = {"random_weights": True}
    base["benchmark"]["sha256_matches"] = False
    write(tmp_path, base)
    md = markdown_table(pair_with_baseline(records_to_frame(find_entries(tmp_path))))
    title = next(line for line in md.splitlines() if line.startswith("### "))
    assert "model=toy [random weights]" in title
    assert "benchmark=toy [prompt file modified: sha256 ≠ official] (6 prompts × 2 images)" in title
    assert "model [random weights]" in md and "not the published one" in md
    clean = record("b", "baseline")
    clean["benchmark"]["sha256_matches"] = True
    write(tmp_path / "c", clean)
    md = markdown_table(pair_with_baseline(records_to_frame(find_entries(tmp_path / "c"))))
    assert "[random weights]" not in md and "modified" not in md


def test_prompts_timed_and_the_per_prompt_latency_interval_are_shown(tmp_path):
    from types import SimpleNamespace

    import torch

    from varbench.harness.timing import timed_pass

    work = [40.0, 80.0, 60.0, 100.0]          # an adaptive method: its work differs by prompt

    def gen(scale):
        def g(bs, k):
            t = work[k] * scale
            return SimpleNamespace(timings_ms={"text": 1.0, "ar": t, "decode": 2.0, "per_scale": [t]})
        return g

    by_batch = timed_pass(gen(1.0), [1], 0, 3, torch.device("cpu"), reference=gen(2.0), n_prompts=4)
    by_batch["1"]["paired"]["loadavg"] = None
    write(tmp_path, record("b", "baseline"))
    rec = record("n", "nova", preset="nova_toy")
    rec["timing"].update({"n_prompts": 4, "repeats": 3, "by_batch": by_batch})
    write(tmp_path, rec)
    md = markdown_table(pair_with_baseline(records_to_frame(find_entries(tmp_path))))
    nova = next(line for line in md.splitlines() if line.startswith("| nova_toy "))
    assert "| 12 / 4×3 |" in nova                               # 12 images; 4 prompts x 3 repeats timed
    assert "| 70.0 [46.0, 94.0] |" in nova                      # median over prompts [p10, p90] of prompt latencies
    assert "2.00× [2.00, 2.00]" in nova                         # baseline 2x the work on every prompt
    assert "percentile bootstrap over the timed prompts" in md
    assert "within one run on one machine, not another run or another machine" in md


# -- one name per row (issue 23 item 9) ----------------------------------------------------------------
def test_one_method_column_the_label_only_where_it_says_more(tmp_path):
    """The preset id and its label are one column: the label where it has words the id lacks
    (a caveat such as "reconstructed", knob values), else the id; the CSVs keep both."""
    from varbench.analysis.names import display_name, says_more

    write(tmp_path, record("b", "baseline", label="Baseline"))                       # the id's own word
    write(tmp_path, record("s", "skip_last", preset="skip_last_2", label="Skip last 2 scales", flops=5e11))
    write(tmp_path, record("n", "nova", preset="nova_toy", label="NOVA (small-schedule thresholds)", flops=4e11))
    write(tmp_path, record("v", "skipvar", label="SkipVAR (adaptive, DM ssim 0.84)", flops=6e11))
    [g] = aggregate(tmp_path, tmp_path / "out", figures=False).groups
    md = (g.folder / "table.md").read_text()
    main = md[:md.index("####")].splitlines()
    header = next(line for line in main if line.startswith("| method "))
    assert "label" not in header.split(" | ")[1]                                     # no second name column
    names = [line.split(" | ")[0][2:] for line in main if line.startswith("| ") and "---" not in line][1:]
    assert names == ["baseline", "NOVA (small-schedule thresholds)", "skip_last_2", "SkipVAR (adaptive, DM ssim 0.84)"]
    assert not any("Baseline" in line or "Skip last 2 scales" in line for line in main)   # never both
    tidy = pd.read_csv(g.folder / "tidy.csv").set_index("entry_id")
    assert (tidy.loc["n", "method_preset"], tidy.loc["n", "method_label"]) == ("nova_toy", "NOVA (small-schedule thresholds)")
    # the rule on its own: knob values are news, case and filler words are not
    assert says_more("fastvar(r=0.4)", "fastvar") and says_more("FastVAR r=0.6", "fastvar")
    assert not says_more("FastVAR light", "fastvar_light") and not says_more("Skip last scale", "skip_last_1")
    assert display_name({"method": "x", "method_label": None}) == "x"
