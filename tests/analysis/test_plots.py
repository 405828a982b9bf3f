"""Figures: Pareto frontier, speed-vs-quality scatter (baseline, error bars, labels), keep heatmaps.

Frames are built by hand with the columns varbench.analysis.aggregate produces (plus the optional
speed-up interval columns); the assertions read the drawn artists back from the Figure.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest

pd = pytest.importorskip("pandas")
pytest.importorskip("matplotlib")

from varbench.analysis.plots import (keep_ratio_figure, keep_summary, metric_words, pareto_front,  # noqa: E402
                            speed_column, speed_quality_figure, speed_quality_scatter, speed_words)


def frame(rows, ci=True):
    """rows: (method, label, paired_speedup, lo, hi, reliable, score, err)."""
    recs = []
    for method, label, x, lo, hi, rel, y, err in rows:
        r = {"method": method, "method_label": label, "speedup": x, "paired_speedup": np.nan if method == "baseline" else x,
             "hpsv2/score": y, "hpsv2/score_err": err, "model": "toy", "resolution": "64x64", "benchmark": "toy",
             "device": "cpu", "n_images": 120, "entry_id": label}
        if ci:
            r.update({"paired_speedup_ci_low": lo, "paired_speedup_ci_high": hi, "speedup_reliable": rel})
        recs.append(r)
    return pd.DataFrame(recs)


ROWS = [("baseline", "baseline", 1.0, np.nan, np.nan, np.nan, 0.300, 0.002),
        ("fastvar", "fastvar(r=0.4)", 1.8, 1.7, 1.9, True, 0.295, 0.002),
        ("fastvar", "fastvar(r=0.6)", 2.4, 2.2, 2.6, True, 0.280, 0.003),
        ("skip", "skip_last_1", 1.6, 1.5, 1.7, False, 0.250, 0.004),     # dominated by fastvar(r=0.4)
        ("skip", "skip_last_2", 3.0, 2.7, 3.3, True, 0.200, 0.004),
        ("nova", "nova", 1.2, 1.1, 1.3, True, 0.301, 0.002)]


# --------------------------------------------------------------------------------------------
# Pareto frontier

def brute_front(x, y, up=True):
    s = 1 if up else -1
    out = []
    for i in range(len(x)):
        if not (np.isfinite(x[i]) and np.isfinite(y[i])):
            continue
        if not any(j != i and np.isfinite(x[j]) and np.isfinite(y[j]) and x[j] >= x[i] and s * y[j] >= s * y[i]
                   and (x[j] > x[i] or s * y[j] > s * y[i]) for j in range(len(x))):
            out.append(i)
    return sorted(out, key=lambda i: x[i])


def test_pareto_front_is_exactly_the_non_dominated_points():
    x = [1.0, 1.8, 2.4, 1.6, 3.0, 1.2]
    y = [0.300, 0.295, 0.280, 0.250, 0.200, 0.301]
    assert pareto_front(x, y) == [5, 1, 2, 4]              # sorted by speed-up
    assert 3 not in pareto_front(x, y)                      # 1.6x/0.25 loses to 1.8x/0.295
    assert 0 not in pareto_front(x, y)                      # nova is faster and better than 1.0x/0.300
    # lower is better (LPIPS): the slow-but-close points win, the far ones lose
    assert pareto_front([1.0, 2.0, 3.0, 2.5], [0.1, 0.3, 0.2, 0.4], higher_is_better=False) == [0, 2]
    # NaN never on the front; a duplicate point dominates neither copy
    assert pareto_front([1.0, np.nan, 2.0, 2.0], [0.5, 0.9, 0.4, 0.4]) == [0, 2, 3]
    rng = np.random.default_rng(0)
    for _ in range(50):
        xs, ys = rng.integers(0, 5, 9).astype(float), rng.integers(0, 5, 9).astype(float)
        for up in (True, False):
            assert sorted(pareto_front(xs, ys, up)) == sorted(brute_front(xs, ys, up))


# --------------------------------------------------------------------------------------------
# speed vs quality

def _artist(fig, gid):
    ax = fig.axes[0]
    return [a for a in ax.get_children() if a.get_gid() == gid]


def test_scatter_baseline_frontier_errorbars_and_axis_words():
    f = frame(ROWS)
    assert speed_column(f) == "paired_speedup"
    fig = speed_quality_figure(f, "hpsv2/score")
    ax = fig.axes[0]
    star = _artist(fig, "baseline")
    assert len(star) == 1 and star[0].get_marker() == "*"
    assert star[0].get_xdata()[0] == 1.0 and star[0].get_ydata()[0] == pytest.approx(0.300)
    front = _artist(fig, "pareto")[0]
    xs, ys = list(front.get_xdata()), list(front.get_ydata())
    assert xs == [1.2, 1.8, 2.4, 3.0] and ys == [0.301, 0.295, 0.280, 0.200]   # baseline and skip_last_1 dominated
    assert fig.varbench_front == ["nova", "fastvar(r=0.4)", "fastvar(r=0.6)", "skip_last_2"]
    # the 95% interval as horizontal bars: one segment spanning [lo, hi] for skip_last_2
    segs = [s for c in ax.collections for s in c.get_segments()]
    assert any(np.allclose(sorted(s[:, 0]), [2.7, 3.3]) and np.allclose(s[:, 1], 0.2) for s in segs)
    assert any(np.allclose(s[:, 0], 3.0) and np.allclose(sorted(s[:, 1]), [0.196, 0.204]) for s in segs)  # ± s.e.
    # the unreliable interval is hollow, the others filled
    hollow = _artist(fig, "point:skip_last_1")[0]
    filled = _artist(fig, "point:skip_last_2")[0]
    assert hollow.get_markerfacecolor() == "white" and filled.get_markerfacecolor() != "white"
    assert ax.get_xlabel() == "Speed-up over baseline (×, AR loop, paired in-job, summed over the timed prompts with 95% CI)"
    assert "HPSv2.1" in ax.get_ylabel() and "higher is better" in ax.get_ylabel()


def test_scatter_without_interval_columns_degrades():
    f = frame(ROWS, ci=False).drop(columns=["paired_speedup"])
    assert speed_column(f) == "speedup"
    fig = speed_quality_figure(f, "hpsv2/score")
    ax = fig.axes[0]
    assert "CI" not in ax.get_xlabel() and "separate jobs" in ax.get_xlabel()
    assert not any(np.ptp(s[:, 0]) > 0 for c in ax.collections for s in c.get_segments())  # no x bars
    assert len(_artist(fig, "label")) == len(ROWS)


def _assert_labels_clear(fig, rows, gid):
    """One label box (artists with ``gid``) per row; no two overlap and none covers a marker's centre
    (x, y of a row: its speed-up and metric, columns 2 and 6 of the rows these tests build)."""
    boxes = _boxes(fig, gid)
    assert len(boxes) == len(rows)
    for a, b in itertools.combinations(boxes, 2):
        assert not a.overlaps(b), "two labels overprint"
    pts = fig.axes[0].transData.transform([[r[2], r[6]] for r in rows])
    for box in boxes:
        assert not any(box.x0 <= px <= box.x1 and box.y0 <= py <= box.y1 for px, py in pts)


def _boxes(fig, gid):
    r = fig.canvas.get_renderer()
    from matplotlib.text import Text

    arts = _artist(fig, gid)
    for a in arts:
        a.update_positions(r)
    return [Text.get_window_extent(a, r) for a in arts]   # the text, not its leader line


def test_labels_do_not_overprint_each_other_or_points():
    # eight methods packed into a small patch of the plane: naive offsets would collide
    rows = [ROWS[0]] + [("m%d" % (i % 3), f"method_{i}_long_label", 1.50 + 0.02 * i, np.nan, np.nan, True,
                         0.290 - 0.001 * (i % 4), 0.0005) for i in range(8)]
    fig = speed_quality_figure(frame(rows), "hpsv2/score")
    _assert_labels_clear(fig, rows, "label")
    ax = fig.axes[0]
    for box in _boxes(fig, "label"):
        line = _artist(fig, "pareto")[0]   # nor does a label sit on the frontier line
        d = ax.transData.transform(np.column_stack([line.get_xdata(), line.get_ydata()]))
        for a, b in zip(d[:-1], d[1:]):
            for qx, qy in np.linspace(a, b, int(np.hypot(*(b - a))) + 2):
                assert not (box.x0 + 1 < qx < box.x1 - 1 and box.y0 + 1 < qy < box.y1 - 1)
        axb = ax.get_window_extent(fig.canvas.get_renderer())
        assert axb.x0 <= box.x0 and box.x1 <= axb.x1 and axb.y0 <= box.y0 and box.y1 <= axb.y1


def test_crowded_labels_become_a_numbered_key():
    rows = [ROWS[0]] + [("m", f"method_{i}", 1.1 + 0.05 * i, np.nan, np.nan, True, 0.29 + 0.0003 * i, 0.001)
                        for i in range(30)]
    fig = speed_quality_figure(frame(rows), "hpsv2/score")
    assert not _artist(fig, "label")
    key = [t for t in fig.texts if t.get_gid() == "label-key"]
    assert len(key) == 1 and "31  method_29" in key[0].get_text() and "1  baseline" in key[0].get_text()
    assert len(_artist(fig, "label-number")) == len(rows)


def test_relative_metric_draws_no_baseline_point():
    f = frame(ROWS).rename(columns={"hpsv2/score": "fidelity/psnr", "hpsv2/score_err": "fidelity/psnr_err"})
    f.loc[0, "fidelity/psnr"] = 100.0                      # the self-comparison cap
    fig = speed_quality_figure(f, "fidelity/psnr")
    assert not _artist(fig, "baseline")
    assert fig.axes[0].get_ylim()[1] < 50                  # the 100 dB cap does not stretch the axis
    assert "dB" in metric_words("fidelity/psnr")
    assert "lower is better" in metric_words("fidelity/lpips")


def test_scatter_files_one_per_metric_and_group(tmp_path):
    f = frame(ROWS)
    g = f.copy()
    g["resolution"] = "128x128"
    paths = speed_quality_scatter(pd.concat([f, g], ignore_index=True), tmp_path)
    assert sorted(p.name for p in paths) == ["speed_vs_hpsv2_score__toy_128x128_toy_cpu.png",
                                             "speed_vs_hpsv2_score__toy_64x64_toy_cpu.png"]
    assert sorted(p.name for p in speed_quality_scatter(f, tmp_path / "one")) == ["speed_vs_hpsv2_score.png"]
    assert speed_words("speedup", False) == "Speed-up over baseline (×, AR loop, median of separate jobs)"


# --------------------------------------------------------------------------------------------
# keep-ratio heatmaps

SIZES = [(1, 1), (2, 2), (4, 4), (6, 6), (8, 8)]


def trace(keep_by_scale, ran_by_scale, labels=("b0", "b1", "b2")):
    return {"prompt_index": 0, "sample_index": 0, "method": "m", "stats": {"layer_labels": list(labels)},
            "scales": [{"si": si, "h": h, "w": w, "ran": ran, "keep_frac": kf, "entropy_mean": 0.1, "ms": 1.0}
                       for si, ((h, w), kf, ran) in enumerate(zip(SIZES, keep_by_scale, ran_by_scale))]}


def _row_colours(fig, n_rows):
    """Colour at the centre of each heatmap row (rendered)."""
    fig.canvas.draw()
    ax = fig.axes[0]
    img = np.asarray(fig.canvas.buffer_rgba())[..., :3]
    h = img.shape[0]
    out = []
    for si in range(n_rows):
        px, py = ax.transData.transform((0.0, si))
        out.append(img[int(round(h - py)), int(round(px))])
    return out


def test_heatmap_marks_skipped_scales_and_labels_scales_by_size():
    # a scale-skip method: nothing pruned inside a scale, the last two scales never run
    traces = [trace([None] * 5, [True, True, True, False, False]) for _ in range(3)]
    fig = keep_ratio_figure(traces, title="skip_last_2")
    assert fig.varbench_skipped == [3, 4]
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["0: 1×1", "1: 2×2", "2: 4×4", "3: 6×6", "4: 8×8"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["b0", "b1", "b2"]
    patches = [p for p in ax.patches if p.get_gid() == "skipped"]
    assert sorted(p.get_y() + 0.5 for p in patches) == [3, 4] and all(p.get_hatch() for p in patches)
    assert any("skipped" in t.get_text() for leg in fig.legends for t in leg.get_texts())
    cols = _row_colours(fig, 5)
    viridis_top = np.array([253, 231, 37])                   # keep 1.0
    assert all(np.abs(c.astype(int) - viridis_top).max() < 40 for c in cols[:3])
    for c in cols[3:]:                                       # grey, not viridis' 0.0 purple
        assert abs(int(c[0]) - int(c[1])) < 12 and abs(int(c[1]) - int(c[2])) < 12 and c.min() > 120


def test_heatmap_keep_everything_and_partial_skips():
    full = keep_ratio_figure([trace([None] * 5, [True] * 5, labels=())])
    assert full.varbench_skipped == []
    assert [t.get_text() for t in full.axes[0].get_xticklabels()] == ["all layers"]
    assert np.all(full.varbench_keep == 1.0)
    # scale 4 skipped in one image of two; where it ran it kept 0.5 on layer 1
    a = trace([None, None, [1, 1, 1], [1, .6, 1], [1, .5, 1]], [True] * 5)
    b = trace([None, None, [1, 1, 1], [1, .4, 1], None], [True, True, True, True, False])
    s = keep_summary([a, b])
    assert s["skipped"].tolist() == [0, 0, 0, 0, 0.5]
    assert s["keep"][4].tolist() == [1.0, 0.5, 1.0]          # mean over the image where it ran, not 0.25
    assert s["keep"][3].tolist() == pytest.approx([1.0, 0.5, 1.0])
    fig = keep_ratio_figure([a, b])
    assert fig.axes[0].get_yticklabels()[4].get_text() == "4: 8×8 (skipped in 50%)"
    assert fig.varbench_skipped == []
    assert [p.get_y() + 0.5 for p in fig.axes[0].patches if p.get_gid() == "partly-skipped"] == [4]


# --------------------------------------------------------------------------------------------
# issue 23 item 9: colours, reliable fronts, identical rows, crowded labels, cost figures

def _points(fig):
    return {a.get_gid()[len("point:"):]: a for a in fig.axes[0].get_lines() if str(a.get_gid()).startswith("point:")}


def test_a_family_has_one_colour_in_every_figure_and_an_outside_family_a_stable_one(tmp_path, monkeypatch):
    from varbench.analysis.colours import family_colour
    from varbench.analysis.cost_figures import speedup_vs_flops_figure
    from varbench.analysis.plots import entropy_curves
    from varbench.policies import REGISTRY
    from varbench.policies.cards import EXTRA_COLOURS

    packaged_colours = {REGISTRY.load(n).method_card(n).colour for n in REGISTRY.packaged()}

    f = frame(ROWS).assign(flops_x=[1.0, 2.0, 3.0, 1.8, 3.5, 1.3])
    scatter = _points(speed_quality_figure(f, "hpsv2/score"))
    flops = _points(speedup_vs_flops_figure(f))
    for name in ("fastvar(r=0.4)", "skip_last_2", "nova"):
        assert scatter[name].get_color() == flops[name].get_color()
    assert scatter["fastvar(r=0.4)"].get_color() == scatter["fastvar(r=0.6)"].get_color() == "#0072B2"   # FastVAR's card
    assert scatter["nova"].get_color() != scatter["skip_last_2"].get_color()
    # presets of one family: same colour, other marker
    assert scatter["fastvar(r=0.4)"].get_marker() != scatter["fastvar(r=0.6)"].get_marker()
    # the colour does not depend on which other families a figure shows
    alone = _points(speed_quality_figure(f[f["method"].isin(["baseline", "nova"])], "hpsv2/score"))
    assert alone["nova"].get_color() == scatter["nova"].get_color()
    # the entropy curves take the same colours
    tr = [{"scales": [{"si": 0, "h": 1, "w": 1, "entropy_mean": 0.5}, {"si": 1, "h": 2, "w": 2, "entropy_mean": 0.4}]}]
    from varbench.analysis import plots as P
    seen, save = {}, P.save_figure

    def grab(fig, path):   # read the drawn lines' colours from the Figure before it is written
        seen.update({ln.get_gid(): ln.get_color() for ln in fig.axes[0].get_lines()})
        return save(fig, path)
    monkeypatch.setattr(P, "save_figure", grab)
    entropy_curves({"nova": tr}, tmp_path / "e.png", styles={"nova": (family_colour("nova"), "o")})
    assert seen["entropy:nova"] == scatter["nova"].get_color()
    # an outside family: a colour from the hash list, the same in a fresh interpreter
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", "from varbench.analysis.colours import family_colour; "
                          "print(family_colour('my_plugin'))"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == family_colour("my_plugin") and family_colour("my_plugin") not in packaged_colours
    assert family_colour("my_plugin") in EXTRA_COLOURS


def test_a_hollow_point_is_never_on_the_front():
    # skip_last_2 (3.0x) is the fastest: with a reliable speed-up it ends the front; flagged
    # unreliable it is hollow and the front stops at fastvar(r=0.6), although nothing dominates it
    f = frame(ROWS)
    assert "skip_last_2" in speed_quality_figure(f, "hpsv2/score").varbench_front
    f.loc[f["method_label"] == "skip_last_2", "speedup_reliable"] = False
    fig = speed_quality_figure(f, "hpsv2/score")
    assert fig.varbench_front == ["nova", "fastvar(r=0.4)", "fastvar(r=0.6)"]
    line = _artist(fig, "pareto")[0]
    assert 3.0 not in list(line.get_xdata())
    hollow = [n for n, a in _points(fig).items() if a.get_markerfacecolor() == "white"]
    assert sorted(hollow) == ["skip_last_1", "skip_last_2"] and not set(hollow) & set(fig.varbench_front)
    legend = [t.get_text() for leg in fig.legends for t in leg.get_texts()]
    assert "Pareto frontier (reliable points only)" in legend
    assert any("unreliable" in t and "not on the frontier" in t for t in legend)


def test_a_bit_identical_row_sits_in_an_infinity_band_not_at_100_db():
    f = frame(ROWS).rename(columns={"hpsv2/score": "fidelity/psnr", "hpsv2/score_err": "fidelity/psnr_err"})
    f["fidelity/psnr"] = [100.0, 28.0, 25.0, 24.0, 22.0, 100.0]      # nova (and the baseline) bit-identical
    f["fidelity/psnr_err"] = [0.0, 0.3, 0.3, 0.3, 0.3, 0.0]
    f["identical_images"] = [True, False, False, False, False, True]
    fig = speed_quality_figure(f, "fidelity/psnr")
    ax = fig.axes[0]
    lo, hi = ax.get_ylim()
    assert hi < 40 and lo > 15                     # the axis spans the measured 22-28 dB, not 100
    nova = _points(fig)["nova"]
    y_inf = fig.varbench_infinity_y
    assert nova.get_ydata()[0] == y_inf and 28.3 < y_inf < hi     # drawn in the band above the measured values
    assert fig.varbench_identical == ["nova"]
    ticks = dict(zip(ax.get_yticks(), [t.get_text() for t in ax.get_yticklabels()]))
    assert ticks[y_inf] == "∞" and not any(t > 30 for t in ax.get_yticks() if t != y_inf)
    assert any("identical to the baseline" in t.get_text() for t in ax.texts)
    band = _artist(fig, "identical-band")[0]
    assert 28.3 < band.get_ydata()[0] < y_inf
    # identical rows are the best PSNR there is: nova (1.2x) is on the front, from the band
    assert fig.varbench_front[0] == "nova"


def test_twelve_close_methods_get_labels_that_do_not_collide():
    # a crowded sweep: 12 methods within 0.4x and 0.03 of score of each other, long names
    names = ["FastVAR", "FastVAR light", "FastVAR heavy", "NOVA (reconstructed)", "NOVA (small-schedule thresholds)",
             "ToProVAR full (reconstructed)", "ToProVAR light", "Skip last scale", "SkipVAR (adaptive, DM ssim 0.84)",
             "NOVA over FastVAR (reconstructed)", "Drop last (outside)", "SkipVAR skip2 (fixed)"]
    fams = ["fastvar"] * 3 + ["nova"] * 2 + ["toprovar"] * 2 + ["skip_last", "skipvar", "compose", "my_plugin",
                                                                 "skipvar_fixed"]
    rng = np.random.default_rng(1)
    rows = [ROWS[0]] + [(fam, name, 1.3 + 0.4 * rng.random(), np.nan, np.nan, True, 0.27 + 0.03 * rng.random(), 0.001)
                        for fam, name in zip(fams, names)]
    fig = speed_quality_figure(frame(rows), "hpsv2/score")
    gid = "label" if _artist(fig, "label") else "label-number"
    _assert_labels_clear(fig, rows, gid)
    if gid == "label-number":   # the names are then in the key, each once
        key = [t for t in fig.texts if t.get_gid() == "label-key"][0].get_text()
        assert all(key.count(n.split(" (")[0]) >= 1 for n in names)


def _entry(root, eid, method, preset, by_batch):
    import json as _json
    d = root / "exp" / "entries" / eid
    d.mkdir(parents=True)
    (d / "record.json").write_text(_json.dumps({"entry_id": eid, "method": {"name": method, "preset": preset},
                                                "timing": {"by_batch": by_batch}}))
    return str(d)


def _blk(ms, speed=None):
    b = {"ar_ms": {"median": ms, "p10": ms * 0.9, "p90": ms * 1.1}}
    if speed is not None:
        b["paired"] = {"ar_speedup": speed, "ar_ci_low": speed - 0.05, "ar_ci_high": speed + 0.05}
    return b


def test_speedup_vs_flops_shows_the_gap_to_what_the_flops_predict():
    from varbench.analysis.cost_figures import speedup_vs_flops_figure

    f = frame([ROWS[0], ("nova", "nova_toy", 0.95, 0.92, 0.98, True, 0.29, 0.002),
               ("skip_last", "skip_last_2", 3.0, 2.7, 3.3, True, 0.20, 0.004)]).assign(flops_x=[1.0, 2.21, 3.54])
    fig = speedup_vs_flops_figure(f)
    assert fig.varbench_rows == [("nova_toy", 2.21, 0.95), ("skip_last_2", 3.54, 3.0)]
    ax = fig.axes[0]
    line = _artist(fig, "flops-predict")[0]                    # y = x: the speed-up the FLOPs predict
    assert np.allclose(line.get_xdata(), line.get_ydata())
    assert ax.get_xlim() == ax.get_ylim()                       # one range: the diagonal is y = x on screen
    gap = _artist(fig, "gap:nova_toy")[0]                       # the drop from 2.21 (predicted) to 0.95 (measured)
    assert list(gap.get_xdata()) == [2.21, 2.21] and sorted(gap.get_ydata()) == [0.95, 2.21]
    point = _points(fig)["nova_toy"]
    assert (point.get_xdata()[0], point.get_ydata()[0]) == (2.21, 0.95)
    segs = [s for c in ax.collections for s in c.get_segments()]
    assert any(np.allclose(s[:, 0], 2.21) and np.allclose(sorted(s[:, 1]), [0.92, 0.98]) for s in segs)   # its CI
    assert "FLOPs reduction" in ax.get_xlabel() and "Speed-up" in ax.get_ylabel()
    assert speedup_vs_flops_figure(f.drop(columns=["flops_x"])) is None


def test_latency_vs_batch_reads_the_records_and_skips_one_batch_size(tmp_path):
    from varbench.analysis.cost_figures import latency_vs_batch_figure, write_cost_figures

    f = frame([ROWS[0], ROWS[1]]).assign(method_preset=["baseline", "fastvar"], flops_x=[1.0, 2.0])
    f["path"] = [_entry(tmp_path, "b", "baseline", "baseline", {"1": _blk(100.0), "4": _blk(320.0)}),
                 _entry(tmp_path, "f", "fastvar", "fastvar", {"1": _blk(60.0, 1.6), "4": _blk(160.0, 2.0)})]
    fig = latency_vs_batch_figure(f)
    # ms per image: the batch's median over timed prompts / batch size
    assert fig.varbench_series == {"baseline": {1: 100.0, 4: 80.0}, "fastvar(r=0.4)": {1: 60.0, 4: 40.0}}
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["1", "4"]
    assert len(fig.axes) == 2                                    # the paired speed-up per batch size
    assert sorted(p.name for p in write_cost_figures(f, tmp_path / "out")) == ["latency_vs_batch.png",
                                                                               "speedup_vs_flops.png"]
    # every record timed at batch 1 only: no line to draw, no file
    g = f.copy()
    g["path"] = [_entry(tmp_path, "b1", "baseline", "baseline", {"1": _blk(100.0)}),
                 _entry(tmp_path, "f1", "fastvar", "fastvar", {"1": _blk(60.0, 1.6)})]
    assert latency_vs_batch_figure(g) is None
    assert [p.name for p in write_cost_figures(g, tmp_path / "one")] == ["speedup_vs_flops.png"]
