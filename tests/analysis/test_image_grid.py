"""The qualitative image grid: images read back from the store, baseline first, exact pixels.

Each method gets its own image store folder filled with distinct random images; the grid's cell
at (row r, column c) must be exactly the stored image of row r's prompt/sample under column c's
method (enlarged by the whole factor the layout reports, nearest neighbour).
"""
from __future__ import annotations

import json

import numpy as np
import pytest

pd = pytest.importorskip("pandas")
PIL = pytest.importorskip("PIL")
from PIL import Image  # noqa: E402

from varbench.analysis.image_grid import (GridError, column_header, common_items, diff_image, entry_store,  # noqa: E402
                                 grid_figure, image_grid, write_image_grids)
from varbench.harness.store import ImageStore  # noqa: E402

PROMPTS = ["a photo of a red triangle", "two blue squares", "a green circle left of a yellow star",
           "three purple hexagons", "an orange square"]


def populate(root, method, gen, n_prompts=5, size=16, seed=0, same_as=None, skip=()):
    """Store random images for ``method`` under images/<gen>; returns the arrays by (p, s)."""
    store = ImageStore(root, gen)
    rng = np.random.default_rng(seed)
    arrays = {}
    for p in range(n_prompts):
        if p in skip:
            continue
        arr = same_as[(p, 0)] if same_as is not None else rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
        store.save(p, 0, Image.fromarray(arr, "RGB"), metadata={"prompt": PROMPTS[p]})
        arrays[(p, 0)] = arr
    return arrays


def entry(root, exp, entry_id, gen, store_dir=None):
    d = root / exp / "entries" / entry_id
    d.mkdir(parents=True)
    (d / "record.json").write_text(json.dumps({"entry_id": entry_id, "generation_id": gen,
                                               "config": {"paths": {"store_dir": str(store_dir or root)}}}))
    return str(d)


@pytest.fixture
def sweep(tmp_path):
    root = tmp_path / "store"
    arrays = {"baseline": populate(root, "baseline", "g_base", seed=1),
              "fast": populate(root, "fast", "g_fast", seed=2),
              "slow": populate(root, "slow", "g_slow", seed=3)}
    rows = [  # deliberately not in column order
        {"method": "fast", "method_label": "fast(r=0.6)", "speedup": 2.4, "paired_speedup": 2.5,
         "paired_speedup_ci_low": 2.3, "paired_speedup_ci_high": 2.7, "speedup_reliable": False,
         "toy_geneval/overall": 0.80, "toy_geneval/overall_err": 0.05, "toy_geneval/overall_delta": -0.15,
         "fidelity/psnr": 18.0, "entry_id": "e_fast", "path": entry(root, "exp", "e_fast", "g_fast")},
        {"method": "baseline", "method_label": "baseline", "speedup": 1.0, "paired_speedup": np.nan,
         "paired_speedup_ci_low": np.nan, "paired_speedup_ci_high": np.nan, "speedup_reliable": np.nan,
         "toy_geneval/overall": 0.95, "toy_geneval/overall_err": 0.03, "toy_geneval/overall_delta": 0.0,
         "fidelity/psnr": 100.0, "entry_id": "e_base", "path": entry(root, "exp", "e_base", "g_base")},
        {"method": "slow", "method_label": "slow", "speedup": 1.3, "paired_speedup": 1.4,
         "paired_speedup_ci_low": 1.35, "paired_speedup_ci_high": 1.45, "speedup_reliable": True,
         "toy_geneval/overall": 0.93, "toy_geneval/overall_err": 0.03, "toy_geneval/overall_delta": -0.02,
         "fidelity/psnr": 30.0, "entry_id": "e_slow", "path": entry(root, "exp", "e_slow", "g_slow")},
    ]
    for r in rows:
        r.update({"model": "toy", "resolution": "16x16", "benchmark": "toy", "device": "cpu", "seeds": "{\"base\":0}"})
    return pd.DataFrame(rows), arrays


def crop(img, box):
    return np.asarray(img.crop(box).convert("RGB"))


def test_grid_cells_are_the_stored_images_baseline_first(sweep, tmp_path):
    frame, arrays = sweep
    img, layout, ordered = grid_figure(frame, n_rows=3, cell=48)
    assert ordered["method"].tolist() == ["baseline", "slow", "fast"]        # baseline, then by speed-up
    assert layout["columns"] == ["baseline", "slow", "fast(r=0.6)"]
    assert layout["items"] == [(0, 0), (2, 0), (4, 0)]                       # spread over the prompts
    assert layout["scale"] == 3.0
    out = image_grid(frame, tmp_path / "g.png", n_rows=3, cell=48)
    saved = Image.open(out)
    assert saved.size == img.size
    for r, (p, s) in enumerate(layout["items"]):
        for c, method in enumerate(["baseline", "slow", "fast"]):
            want = np.asarray(Image.fromarray(arrays[method][(p, s)]).resize((48, 48), Image.NEAREST))
            got = crop(saved, layout["cells"][(r, c)])
            assert got.shape == want.shape and np.array_equal(got, want), (r, c)
    # a swapped column would not match: the images differ between methods
    assert not np.array_equal(crop(saved, layout["cells"][(0, 1)]),
                              np.asarray(Image.fromarray(arrays["fast"][(0, 0)]).resize((48, 48), Image.NEAREST)))


def test_headers_carry_speedup_interval_and_quality(sweep):
    frame, _ = sweep
    _, layout, ordered = grid_figure(frame, n_rows=2, cell=48)
    assert layout["metric"] == "toy_geneval/overall"                          # overall beats fidelity
    from varbench.analysis.plots import speed_values

    x, lo, hi, rel, _ = speed_values(ordered)
    heads = [column_header(r, i == 0, "toy_geneval/overall", speed=(x[i], lo[i], hi[i], rel[i]))
             for i, (_, r) in enumerate(ordered.iterrows())]
    assert heads[0] == ["baseline", "1.00× (reference)", "Toy GenEval: 0.950 ± 0.030"]
    assert heads[1] == ["slow", "speed-up 1.40× [1.35, 1.45]", "Toy GenEval: 0.930 ± 0.030", "Δ −0.020 vs baseline"]
    assert heads[2][1] == "speed-up 2.50× [2.30, 2.70] †"   # flagged unreliable
    # without the interval columns: the separate-jobs ratio, no brackets
    plain = frame.drop(columns=["paired_speedup", "paired_speedup_ci_low", "paired_speedup_ci_high",
                                "speedup_reliable"])
    _, _, ordered = grid_figure(plain, n_rows=1, cell=16)
    x, lo, hi, rel, col = speed_values(ordered)
    assert col == "speedup" and column_header(ordered.iloc[2], False, None, speed=(x[2], lo[2], hi[2], rel[2]))[1] == "speed-up 2.40×"
    assert column_header(ordered.iloc[1], False, None, speed=(0.9, np.nan, np.nan, True))[1] == "speed-up 0.90× (slower)"


def test_difference_rows_match_the_pixels(sweep, tmp_path):
    frame, arrays = sweep
    # a method whose images equal the baseline's: its difference map is all zero
    root = tmp_path / "store"
    arrays["copy"] = populate(root, "copy", "g_copy", same_as=arrays["baseline"])
    extra = frame.iloc[[2]].assign(method="copy", method_label="copy", paired_speedup=1.1, entry_id="e_copy",
                                   path=entry(root, "exp", "e_copy", "g_copy"))
    frame = pd.concat([frame, extra], ignore_index=True)
    img, layout, ordered = grid_figure(frame, n_rows=2, cell=32, diff=True)
    assert ordered["method"].tolist() == ["baseline", "copy", "slow", "fast"]
    assert set(layout["diff_cells"]) == {(r, c) for r in range(2) for c in (1, 2, 3)}   # none under the baseline
    for (r, c), mad in layout["mean_abs_diff"].items():
        p, s = layout["items"][r]
        method = ordered["method"].iloc[c]
        want = np.abs(arrays[method][(p, s)].astype(float) - arrays["baseline"][(p, s)].astype(float)).mean()
        assert mad == pytest.approx(want)
        dmap, _ = diff_image(Image.fromarray(arrays[method][(p, s)]), Image.fromarray(arrays["baseline"][(p, s)]))
        want_px = np.asarray(dmap.resize((32, 32), Image.NEAREST))
        got = crop(img, layout["diff_cells"][(r, c)])
        # the mean-|Δ| caption is drawn over the top-left corner; the rest is the map itself
        assert np.array_equal(got[18:], want_px[18:])
    assert layout["mean_abs_diff"][(0, 1)] == 0.0
    # image rows below a difference row are still exact
    p, s = layout["items"][1]
    want = np.asarray(Image.fromarray(arrays["fast"][(p, s)]).resize((32, 32), Image.NEAREST))
    assert np.array_equal(crop(img, layout["cells"][(1, 3)]), want)


def test_rows_are_prompts_every_method_stored(tmp_path):
    root = tmp_path / "store"
    populate(root, "b", "g1", seed=1)
    populate(root, "m", "g2", seed=2, skip=(1, 3))
    stores = [ImageStore(root, "g1"), ImageStore(root, "g2")]
    assert common_items(stores, 10) == [(0, 0), (2, 0), (4, 0)]
    assert common_items(stores, 2) == [(0, 0), (4, 0)]


def test_store_found_after_the_tree_moved_and_missing_baseline(sweep, tmp_path):
    frame, _ = sweep
    moved = tmp_path / "moved"
    (tmp_path / "store").rename(moved)
    frame = frame.assign(path=[p.replace(str(tmp_path / "store"), str(moved)) for p in frame["path"]])
    # record.json still names the old store_dir; the entry's parents[2] is used first
    st = entry_store(frame.iloc[0])
    assert st.root == moved and st.generation_hash == "g_fast"
    with pytest.raises(GridError, match="baseline"):
        grid_figure(frame[frame["method"] != "baseline"], n_rows=1, cell=16)


def test_write_image_grids_one_per_group(sweep, tmp_path):
    frame, _ = sweep
    other = frame.assign(resolution="32x32")
    paths = write_image_grids(pd.concat([frame, other], ignore_index=True), tmp_path / "out", n_rows=2, cell=32)
    assert sorted(p.name for p in paths) == ["image_grid__toy_16x16_toy_cpu.png", "image_grid__toy_32x32_toy_cpu.png"]
    assert [p.name for p in write_image_grids(frame, tmp_path / "one", n_rows=2, cell=32)] == ["image_grid.png"]


def test_write_figures_adds_the_grid(sweep, tmp_path):
    from varbench.analysis.plots import wandb_figures

    frame, arrays = sweep
    figs = wandb_figures(frame, tmp_path / "figs", grid_rows=2)
    assert "figures/image_grid" in figs and "figures/speed_vs_toy_geneval_overall" in figs
    img, layout, _ = grid_figure(frame, n_rows=2, diff=True,
                                 title="Qualitative comparison · toy · 16x16 · toy · cpu")
    assert np.array_equal(np.asarray(Image.open(figs["figures/image_grid"]).convert("RGB")), np.asarray(img))


def test_column_without_images_is_left_out_with_a_warning(sweep, tmp_path):
    import shutil

    frame, arrays = sweep
    shutil.rmtree(tmp_path / "store" / "images" / "g_fast")
    with pytest.warns(UserWarning, match="fast.*left out"):
        img, layout, ordered = grid_figure(frame, n_rows=1, cell=32)
    assert layout["columns"] == ["baseline", "slow"]
    p, s = layout["items"][0]
    want = np.asarray(Image.fromarray(arrays["slow"][(p, s)]).resize((32, 32), Image.NEAREST))
    assert np.array_equal(crop(img, layout["cells"][(0, 1)]), want)


def test_figures_of_groups_no_longer_in_the_records_are_removed_and_nothing_else(sweep, tmp_path):
    """Two groups write group-suffixed figures; when only one group is left, the suffix goes and the
    two-group files would stay behind as stale figures next to the new table."""
    from varbench.analysis.plots import write_figures

    frame, _ = sweep
    out = tmp_path / "figs"
    out.mkdir()
    (out / "my_notes.png").write_bytes(b"the user's own file")
    two = pd.concat([frame, frame.assign(resolution="32x32")], ignore_index=True)
    first = {p.name for p in write_figures(two, out, grid_rows=1)}
    assert any("__toy_32x32" in n for n in first)
    second = {p.name for p in write_figures(frame, out, grid_rows=1)}
    assert not any("__toy_32x32" in n for n in second)
    on_disk = {p.name for p in out.iterdir() if not p.name.startswith(".")}
    assert on_disk == second | {"my_notes.png"}


def test_headers_name_the_columns_as_the_table_does_in_their_family_colour(sweep):
    """The bold first line is the table's name for the row and is drawn in the family's colour
    (the scatter's), the baseline in black."""
    from varbench.analysis.colours import family_colour

    frame, _ = sweep
    frame = frame.assign(method=["fastvar", "baseline", "nova"], method_preset=["fastvar_heavy", "baseline", "nova"],
                         method_label=["FastVAR heavy", "Baseline", "NOVA (reconstructed)"])
    img, layout, ordered = grid_figure(frame, n_rows=1, cell=48)
    assert layout["columns"] == ["baseline", "NOVA (reconstructed)", "fastvar_heavy"]   # the label only where it says more
    assert layout["colours"] == ["black", family_colour("nova"), family_colour("fastvar")]
    # the header's text pixels carry that colour
    arr = np.asarray(img.convert("RGB")).astype(int)
    x0, y0, x1, _ = layout["cells"][(0, 2)]
    head = arr[:y0, x0:x1].reshape(-1, 3)
    want = np.array([int(family_colour("fastvar")[k:k + 2], 16) for k in (1, 3, 5)])
    assert (np.abs(head - want).max(axis=1) < 10).sum() > 20
