"""The toy world (varbench/toy/world.py) and its exact GenEval-style scorer (evaluators/toy_geneval.py).

What must hold for the toy benchmark to measure anything:
* scenes and renders are pure functions of the seed;
* the scorer accepts ground truth (>= 0.98) and rejects noise and wrong captions (<= 0.1), so a
  model's accuracy lies between "perfect" and "chance" for real reasons;
* GenEval's rules are applied as GenEval does (count off by one, flipped relation, wrong colour).
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import math
import re

import numpy as np
import pytest
from PIL import Image

from varbench.evaluators import build_evaluator
from varbench.evaluators.base import Sample
from varbench.toy.geneval import ToyGenEval, detect, geneval_rules, group_detections
from varbench.toy import world
from varbench.toy.world import ToyObject, ToyScene, prompt_set, render, sample_scene

N_SCENES = 300  # 50 per tag: enough that one misread in 50 shows up, still < 2 s to score


@pytest.fixture(scope="module")
def prompts():
    return prompt_set(N_SCENES, seed=7)


@pytest.fixture(scope="module")
def renders(prompts):
    return [render(sample_scene(p["scene_seed"], p["metadata"]["tag"])) for p in prompts]


def _score(images, metas, **kw):
    ev = ToyGenEval(n_boot=200, **kw)
    ev.update([Sample(i, 0, m["prompt"], img, metadata=m) for i, (img, m) in enumerate(zip(images, metas))])
    return ev.compute()


def _sha(img: Image.Image) -> str:
    return hashlib.sha256(img.tobytes()).hexdigest()


# ------------------------------------------------------------------------------------------ world


def test_same_seed_same_scene_and_pixels():
    for tag in (None, *world.TAGS):
        a, b = sample_scene(123, tag), sample_scene(123, tag)
        assert a == b
        assert _sha(render(a)) == _sha(render(b))
        assert _sha(render(a, 128)) == _sha(render(b, 128))
    # and the seed matters
    assert len({_sha(render(sample_scene(s, "counting"))) for s in range(10)}) == 10


def test_generator_stream_is_deterministic():
    r1, r2 = np.random.default_rng(5), np.random.default_rng(5)
    assert [sample_scene(r1) for _ in range(20)] == [sample_scene(r2) for _ in range(20)]


def test_prompt_set_balanced_deterministic_and_prefix_stable(prompts):
    tags = [p["metadata"]["tag"] for p in prompts]
    assert {t: tags.count(t) for t in world.TAGS} == {t: N_SCENES // 6 for t in world.TAGS}
    assert prompt_set(N_SCENES, seed=7) == prompts
    assert prompt_set(25, seed=7) == prompts[:25]
    assert prompt_set(25, seed=8) != prompts[:25]
    for p in prompts:
        assert p["prompt"] == p["metadata"]["prompt"]
        assert sample_scene(p["scene_seed"], p["metadata"]["tag"]).caption == p["prompt"]


def test_caption_forms_follow_geneval(prompts):
    """Every GenEval form appears, with GenEval's wording and metadata layout."""
    by_tag = {}
    for p in prompts:
        by_tag.setdefault(p["metadata"]["tag"], []).append(p)
    assert set(by_tag) == set(world.TAGS)
    shapes = "|".join(world.SHAPES)
    colors = "|".join(world.PALETTE)
    plurals = "|".join(world.PLURALS.values())
    pattern = {
        "single_object": rf"a photo of an? ({shapes})",
        "two_object": rf"a photo of an? ({shapes}) and an? ({shapes})",
        "counting": rf"a photo of (two|three|four) ({plurals})",
        "colors": rf"a photo of an? ({colors}) ({shapes})",
        "position": rf"a photo of an? ({shapes}) (left of|right of|above|below) an? ({shapes})",
        "color_attr": rf"a photo of an? ({colors}) ({shapes}) and an? ({colors}) ({shapes})",
    }
    for tag, ps in by_tag.items():
        for p in ps:
            assert re.fullmatch(pattern[tag], p["prompt"]), p["prompt"]
            md = p["metadata"]
            if tag == "counting":
                n = md["include"][0]["count"]
                assert md["exclude"] == [{"class": md["include"][0]["class"], "count": n + 1}]
            else:
                assert "exclude" not in md
            if tag == "position":
                target, subject = md["include"]
                assert subject["position"][1] == 0 and "position" not in target
                assert p["prompt"].endswith(f"{subject['position'][0]} a {target['class']}")
            if tag == "color_attr":
                assert md["include"][0]["color"] != md["include"][1]["color"]
            if tag in ("two_object", "position", "color_attr"):
                assert md["include"][0]["class"] != md["include"][1]["class"]


def test_world_scenes_are_well_formed(prompts):
    """Objects inside the canvas, >= 12 px at 64 px, separated; position scenes hold clearly."""
    for p in prompts:
        scene = sample_scene(p["scene_seed"], p["metadata"]["tag"])
        for i, a in enumerate(scene.objects):
            x0, y0, x1, y1 = a.box
            assert 0 <= x0 and 0 <= y0 and x1 <= 1 and y1 <= 1
            assert a.pixel_box(64)[2] >= 12
            for b in scene.objects[i + 1:]:
                assert world._separated(a, b)
        if scene.tag == "position":
            rel = scene.metadata["include"][1]["position"][0]
            assert world.relations(scene.objects[1].box, scene.objects[0].box) == {rel}


def test_layout_follows_the_caption(prompts):
    """toy-world-2: objects sit within JITTER of their layout's slots, in caption order (first
    named object left / on top), and a counting group shares one colour; colours the caption
    leaves open still vary across scenes (the model must choose, not memorise)."""
    def centre(o):
        return o.x0 + o.size / 2, o.y0 + o.size / 2

    open_colours = set()
    for p in prompts:
        scene = sample_scene(p["scene_seed"], p["metadata"]["tag"])
        objs, tag = scene.objects, scene.tag
        if tag == "position":
            rel = scene.metadata["include"][1]["position"][0]
            first_is_subject = rel in ("left of", "above")
            objs = objs[::-1] if first_is_subject else objs  # slot order: subject first iff left/above
            layout = "row" if rel in ("left of", "right of") else "column"
        else:
            layout = {1: "single", 2: "row", 3: "triangle", 4: "grid"}[len(objs)]
        for o, (sx, sy) in zip(objs, world.LAYOUTS[layout], strict=True):
            cx, cy = centre(o)
            assert abs(cx - sx) <= world.JITTER + 1e-9 and abs(cy - sy) <= world.JITTER + 1e-9, (p["prompt"], o)
        if tag in ("two_object", "color_attr"):
            named = [r["class"] for r in scene.metadata["include"]]
            assert [o.shape for o in scene.objects] == named  # first named is on the left
        if tag == "counting":
            assert len({o.color for o in scene.objects}) == 1
        if tag in ("single_object", "two_object", "counting"):
            open_colours.update(o.color for o in scene.objects)
    assert open_colours == set(world.PALETTE)


def test_render_rejects_tiny_canvas():
    with pytest.raises(ValueError, match="image_size"):
        render(sample_scene(0), 16)


# ------------------------------------------------------------------------------------- evaluator


def test_ground_truth_scores_perfectly(prompts, renders):
    res = _score(renders, [p["metadata"] for p in prompts])
    assert res.metrics["overall"] >= 0.98, [r for r in res.per_sample if not r["correct"]][:3]
    assert all(res.metrics[t] >= 0.95 for t in world.TAGS)
    assert set(res.metrics) == {"overall", *world.TAGS}
    assert set(res.metrics) <= set(ToyGenEval.higher_is_better)


def test_ground_truth_at_128px(prompts):
    sub = prompts[:60]
    res = _score([render(sample_scene(p["scene_seed"], p["metadata"]["tag"]), 128) for p in sub],
                 [p["metadata"] for p in sub])
    assert res.metrics["overall"] >= 0.98


def test_pure_noise_scores_near_zero(prompts):
    rng = np.random.default_rng(0)
    noise = [Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)) for _ in prompts]
    assert _score(noise, [p["metadata"] for p in prompts]).metrics["overall"] <= 0.1
    blank = [Image.new("RGB", (64, 64), world.BACKGROUND)] * len(prompts)
    assert _score(blank, [p["metadata"] for p in prompts]).metrics["overall"] == 0.0


def _wrong(md: dict, scene: ToyScene) -> dict:
    """A caption the scene plainly contradicts, one per tag (what a confused model would draw)."""
    md = copy.deepcopy(md)
    inc = md["include"]
    present = {o.shape for o in scene.objects}
    absent = [s for s in world.SHAPES if s not in present]
    if md["tag"] in ("single_object", "two_object"):
        inc[-1]["class"] = absent[0]  # ask for a shape that is not there
    elif md["tag"] == "counting":
        n = inc[0]["count"]
        inc[0]["count"], md["exclude"][0]["count"] = n + 1, n + 2  # one more than drawn
    elif md["tag"] == "colors":
        drawn = scene.objects[0].color
        inc[0]["color"] = next(c for c in world.PALETTE if c != drawn)
    elif md["tag"] == "position":
        inc[1]["position"][0] = world.OPPOSITE[inc[1]["position"][0]]
    else:  # color_attr: swap the colours between the two shapes
        inc[0]["color"], inc[1]["color"] = inc[1]["color"], inc[0]["color"]
    return md


def test_wrong_captions_score_near_zero(prompts, renders):
    metas = [_wrong(p["metadata"], sample_scene(p["scene_seed"], p["metadata"]["tag"])) for p in prompts]
    res = _score(renders, metas)
    assert res.metrics["overall"] <= 0.1
    assert all(res.metrics[t] <= 0.1 for t in world.TAGS)


def test_counting_off_by_one_fails_both_ways():
    scene = sample_scene(3, "counting")
    img, md = render(scene), scene.metadata
    n, cls = md["include"][0]["count"], md["include"][0]["class"]
    ev = ToyGenEval()
    assert ev.score_image(img, md)[0]
    fewer = {"tag": "counting", "include": [{"class": cls, "count": n - 1}], "exclude": [{"class": cls, "count": n}]}
    more = {"tag": "counting", "include": [{"class": cls, "count": n + 1}], "exclude": [{"class": cls, "count": n + 2}]}
    ok, reason, _ = ev.score_image(img, fewer)
    assert not ok and f"expected {cls}<{n}" in reason  # the exclude clause catches the extra one
    ok, reason, _ = ev.score_image(img, more)
    assert not ok and f"expected {cls}>={n + 1}, found {n}" in reason


def _two_squares(left_color="red", right_color="blue", size=64):
    scene = ToyScene("", {}, (ToyObject("square", left_color, 0.1, 0.4, 0.25),
                              ToyObject("circle", right_color, 0.6, 0.4, 0.25)), "position")
    return render(scene, size)


def test_left_right_swap_fails():
    img = _two_squares()
    ev = ToyGenEval()
    md = {"tag": "position", "include": [{"class": "circle", "count": 1},
                                         {"class": "square", "count": 1, "position": ["left of", 0]}]}
    assert ev.score_image(img, md)[0]
    md["include"][1]["position"][0] = "right of"
    ok, reason, _ = ev.score_image(img, md)
    assert not ok and "expected square right of target, found left of target" in reason
    md["include"][1]["position"][0] = "above"
    assert not ev.score_image(img, md)[0]
    # a missing target fails the position clause as GenEval does ("no target")
    md = {"tag": "position", "include": [{"class": "triangle", "count": 1},
                                         {"class": "square", "count": 1, "position": ["left of", 0]}]}
    ok, reason, _ = ev.score_image(img, md)
    assert not ok and "no target for square" in reason


def test_colour_rules():
    img = _two_squares("green", "yellow")
    ev = ToyGenEval()
    ok_md = {"tag": "color_attr", "include": [{"class": "square", "count": 1, "color": "green"},
                                              {"class": "circle", "count": 1, "color": "yellow"}]}
    assert ev.score_image(img, ok_md)[0]
    bad = copy.deepcopy(ok_md)
    bad["include"][1]["color"] = "red"
    ok, reason, _ = ev.score_image(img, bad)
    assert not ok and "expected red circle>=1, found 0 red; and 1 yellow" in reason


def test_relation_formula_matches_geneval():
    """World relations follow GenEval's relative_position (0.1 * size shrink, 0.5 cut-off).

    Boxes 10 wide, centres 12 apart: revised dx = 12 - 0.1 * 20 = 10, /12 = 0.83 -> "right of".
    Centres 2.5 apart: revised = max(2.5 - 2, 0) = 0.5, /2.5 = 0.2 -> no relation.
    Diagonal (12, 12): each revised 10/16.97 = 0.59 -> both "right of" and "below".
    """
    b = (0, 0, 10, 10)
    assert world.relations((12, 0, 22, 10), b) == {"right of"}
    assert world.relations((-12, 0, -2, 10), b) == {"left of"}
    assert world.relations((0, -12, 10, -2), b) == {"above"}
    assert world.relations((2.5, 0, 12.5, 10), b) == set()
    assert world.relations((12, 12, 22, 22), b) == {"right of", "below"}
    assert world.relations(b, b) == set()


def test_detector_reads_shapes_colours_and_boxes():
    scene = sample_scene(11, "color_attr")
    dets = detect(render(scene, 64))
    assert sorted((d.shape, d.color) for d in dets) == sorted((o.shape, o.color) for o in scene.objects)
    for o in scene.objects:
        x, y, s = o.pixel_box(64)
        d = next(d for d in dets if d.shape == o.shape)
        assert abs(d.box[0] - x) <= 1 and abs(d.box[1] - y) <= 1 and abs(d.box[2] - (x + s)) <= 1


def test_detector_handles_mild_blur():
    """Model output is soft: a 1 px Gaussian blur must not change any verdict."""
    from PIL import ImageFilter
    sub = prompt_set(60, seed=3)
    imgs = [render(sample_scene(p["scene_seed"], p["metadata"]["tag"])).filter(ImageFilter.GaussianBlur(1))
            for p in sub]
    assert _score(imgs, [p["metadata"] for p in sub]).metrics["overall"] >= 0.95


def test_rules_take_most_confident_objects_first():
    """GenEval checks colour only on the `count` most confident detections of the class."""
    d = lambda color, score: dataclasses.replace(
        detect(_two_squares())[0], shape="square", color=color, score=score)
    objects = group_detections([d("red", 0.8), d("blue", 0.99)])
    md = {"tag": "colors", "include": [{"class": "square", "count": 1, "color": "red"}]}
    assert not geneval_rules(objects, md)[0]  # the blue one is more confident
    assert geneval_rules(group_detections([d("red", 0.99), d("blue", 0.8)]), md)[0]


# --------------------------------------------------------------------------------- protocol


def test_overall_is_mean_of_tag_means_with_bootstrap(prompts, renders):
    """Mix ground truth (correct) and blanks (wrong) unevenly across tags; check the aggregation."""
    ev = build_evaluator("toy_geneval", n_boot=200)
    assert isinstance(ev, ToyGenEval)
    ev.setup("cpu")
    blank = Image.new("RGB", (64, 64), world.BACKGROUND)
    expect = {}
    samples = []
    for i, p in enumerate(prompts[:60]):
        tag = p["metadata"]["tag"]
        good = i % (world.TAGS.index(tag) + 2) == 0  # a different success rate per tag
        for j in range(2):
            samples.append(Sample(i, j, p["prompt"], renders[i] if good else blank, metadata=p["metadata"]))
            expect.setdefault(tag, []).append(float(good))
    ev.update(samples[:50])
    ev.update(samples[50:])
    res = ev.compute()
    tag_means = {t: sum(v) / len(v) for t, v in expect.items()}
    for t, m in tag_means.items():
        assert res.metrics[t] == pytest.approx(m)
    assert res.metrics["overall"] == pytest.approx(sum(tag_means.values()) / 6)
    assert 0 < res.uncertainty["overall"] < 0.2 and not math.isnan(res.uncertainty["overall"])
    assert len(res.per_sample) == 120
    row = res.per_sample[0]
    assert {"prompt_index", "sample_index", "tag", "correct", "reason"} <= set(row)
    assert isinstance(row["correct"], bool)

    with pytest.raises(ValueError, match="already scored"):
        ev.update(samples[:1])
    ev.reset()
    with pytest.raises(RuntimeError, match="update"):
        ev.compute()


def test_version_info_identifies_scorer():
    a, b = ToyGenEval().version_info(), ToyGenEval(min_iou=0.7).version_info()
    assert a["world"]["world_version"] == world.WORLD_VERSION
    assert a["version"] and a != b


def test_bad_metadata_gets_a_clear_error():
    ev = ToyGenEval()
    img = render(sample_scene(0))
    coco = {"tag": "single_object", "include": [{"class": "dog", "count": 1}], "prompt": "a photo of a dog"}
    with pytest.raises(ValueError, match="benchmark=toy"):
        ev.update([Sample(0, 0, "a photo of a dog", img, metadata=coco)])
    with pytest.raises(ValueError, match="GenEval tag"):
        ev.update([Sample(0, 0, "x", img, metadata={"include": []})])
    md = sample_scene(0, "colors").metadata
    ev.update([Sample(1, 0, "x", img, metadata=md)])
    with pytest.raises(ValueError, match="same prompt"):
        ev.update([Sample(1, 1, "x", img, metadata=sample_scene(0, "counting").metadata)])
    with pytest.raises(ValueError, match="min_iou"):
        ToyGenEval(min_iou=0)


def test_component_labeller_matches_flood_fill():
    """The numpy labeller is exact: same partition as a plain 8-connected flood fill."""
    from varbench.toy.geneval import _label_components
    rng = np.random.default_rng(0)
    for _ in range(20):
        classes = rng.integers(-1, 3, size=(17, 23))
        labels = _label_components(classes)
        ref = -np.ones_like(classes)
        for y0, x0 in zip(*np.nonzero(classes >= 0)):
            if ref[y0, x0] >= 0:
                continue
            stack, ref[y0, x0] = [(y0, x0)], y0 * 23 + x0
            while stack:
                y, x = stack.pop()
                for dy in (-1, 0, 1):
                    for dx in (-1, 0, 1):
                        v, u = y + dy, x + dx
                        if 0 <= v < 17 and 0 <= u < 23 and ref[v, u] < 0 and classes[v, u] == classes[y, x]:
                            ref[v, u] = ref[y0, x0]
                            stack.append((v, u))
        assert np.array_equal(labels, ref)  # flood fill from the first pixel in scan order = min index


def test_benchmark_config_loads_through_prompt_loader():
    omegaconf = pytest.importorskip("omegaconf")
    from pathlib import Path

    from varbench.harness import prompts as P
    cfg = omegaconf.OmegaConf.load(Path(__file__).resolve().parents[2] / "varbench" / "conf" / "benchmark" / "toy.yaml")
    added = "toy" not in P.LOADERS
    if added:  # until varbench.harness.prompts registers it itself
        P.register_loader("toy", "varbench.harness.prompts:load_toy_prompts")
    try:
        ps = P.load_prompt_set(cfg)
        assert ps.n_prompts == cfg.n_prompts and ps.samples_per_prompt == cfg.samples_per_prompt
        assert [it.prompt for it in ps] == [p["prompt"] for p in prompt_set(cfg.n_prompts, cfg.seed)]
        assert ps.sha256 == P.load_prompt_set(cfg).sha256
        quick = P.load_prompt_set(omegaconf.OmegaConf.merge(cfg, {"limit_per_tag": 2}))
        assert len(quick) == 12 and {it.metadata["tag"] for it in quick} == set(world.TAGS)
        with pytest.raises(P.PromptSetError, match="n_prompts"):
            P.load_prompt_set(omegaconf.OmegaConf.merge(cfg, {"n_prompts": 0}))
    finally:
        if added:
            P.LOADERS.pop("toy", None)
