"""GenEval: rule engine vs upstream outcomes, native backend end-to-end on tiny random models, official
backend plumbing with a fake scorer, and errors.

geneval_cases.jsonl (307 cases) was produced in a scratch folder by running upstream djghosh13/geneval at
commit af4902f, `evaluation/evaluate_images.py::evaluate_image` (thresholds, argsort ordering, max objects,
optional NMS, evaluate()) with mmdet/open_clip/clip_benchmark imports stubbed, `inference_detector` returning
each case's per-class float32 arrays [x1 y1 x2 y2 score colour_index] and `color_classification` returning
COLORS[colour_index]. Cases: 7 hand-written edges (failed position target, coincident boxes, diagonal,
scores exactly 0.3/0.9 in float32, wrong colour on one object, no detections) + 300 random ones drawn from
the 553 official prompts with scores incl. threshold-boundary values, ties, >16 objects, max_overlap=0.5.
Expected values store upstream's `correct` and its exact `reason` string.
"""
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from varbench.core.resources import TINY_SCORERS_DIR
from varbench.evaluators import build_evaluator
from varbench.evaluators.geneval import rules as R
from varbench.evaluators.base import Sample

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "evaluators"   # goldens and their images
TINY = TINY_SCORERS_DIR   # the tiny random scorers, bundled with the package
from conftest import SHARED_DATA  # noqa: E402

SHARED = SHARED_DATA / "geneval"
CASES = [json.loads(l) for l in (FIX / "geneval_cases.jsonl").read_text().splitlines()]


def test_rules_agree_with_upstream_on_every_case():
    tags = set()
    for c in CASES:
        per = [np.asarray(c["detections"].get(n, np.zeros((0, 6))), dtype=np.float32).reshape(-1, 6)
               for n in R.COCO80_GENEVAL]
        det = R.select_detections(per, None, R.COCO80_GENEVAL, c["metadata"]["tag"],
                                  max_overlap=float(c["options"].get("max_overlap", 1.0)))
        ok, reason = R.evaluate(det, c["metadata"], lambda objs, cls: [R.COLORS[int(b[5])] for b, _ in objs])
        assert (ok, reason) == (c["expected"]["correct"], c["expected"]["reason"]), c["id"]
        tags.add((c["metadata"]["tag"], ok))
    assert tags == {(t, v) for t in R.TAGS for v in (True, False)}  # every tag, both outcomes


def test_relative_position_edges():
    box = lambda *b: (np.array(b + (1.0,), dtype=np.float32), None)
    assert R.relative_position(box(0, 0, 10, 10), box(0, 0, 10, 10)) == set()
    assert R.relative_position(box(0, 0, 10, 10), box(100, 0, 110, 10)) == {"left of"}
    assert R.relative_position(box(0, 0, 10, 10), box(100, 100, 110, 110)) == {"left of", "above"}
    assert R.relative_position(box(0, 0, 10, 10), box(11, 0, 21, 10)) == {"left of"}
    assert R.relative_position(box(0, 0, 10, 10), box(1, 0, 11, 10)) == set()  # inside the 0.1 dead zone


def test_summary_is_mean_of_tag_means():
    rows = [{"prompt_index": 0, "tag": "counting", "correct": True}, {"prompt_index": 0, "tag": "counting", "correct": False},
            {"prompt_index": 1, "tag": "colors", "correct": True}]
    s = R.summarize(rows)
    assert s["overall"] == pytest.approx(0.75) and s["correct_images"] == pytest.approx(2 / 3)
    assert s["correct_prompts"] == 1.0


def test_class_names_match_official_file():
    f = SHARED / "object_names.txt"
    if not f.exists():
        pytest.skip("shared/data/geneval absent")
    assert tuple(l.strip() for l in f.read_text().splitlines()) == R.COCO80_GENEVAL


def test_postprocess_mask_boxes_and_scores():
    from varbench.evaluators.geneval.evaluator import Mask2FormerDetector

    det = Mask2FormerDetector.__new__(Mask2FormerDetector)
    det.max_per_image = 100
    logits = torch.full((2, 81), -20.0)
    logits[0, 16] = 10.0  # query 0: dog
    logits[1, 15] = 10.0  # query 1: cat
    masks = torch.full((2, 20, 30), -5.0)
    masks[0, 2:5, 3:9] = 5.0
    masks[1, 10:20, 0:1] = 5.0
    per_class, per_masks = det.postprocess(logits, masks)
    dog, cat = per_class[16], per_class[15]
    top = lambda a: a[np.argmax(a[:, 4])]
    assert top(dog)[:4].tolist() == [3, 2, 9, 5] and top(cat)[:4].tolist() == [0, 10, 1, 20]  # x2/y2 exclusive
    p = torch.softmax(logits[0], -1)[16].item() * torch.sigmoid(torch.tensor(5.0)).item()
    assert top(dog)[4] == pytest.approx(p, rel=1e-5)
    assert sum(len(a) for a in per_class) == 100 and per_masks[16][0].shape == (20, 30)


@pytest.fixture(scope="module")
def tiny_native():
    """The committed tiny random Mask2Former + QuickGELU CLIP (tests/fixtures/evaluators/make_geneval_tiny.py),
    the same files `evaluator=geneval_tiny` (smoke experiment) reads."""
    return TINY / "geneval_tiny"


def _native(d, **kw):
    args = dict(backend="native", weights_dir=str(d), detector_dir="m2f", detector_name="tiny-random",
                clip_weights="clip.bin", clip_model="clip_tiny_qg", clip_model_config=str(d / "clip_tiny_qg.json"),
                detector_scale=(64, 64), device="cpu")
    args.update(kw)
    return build_evaluator("geneval", **args)


def test_native_end_to_end_tiny(tiny_native):
    # thresholds 0 so random detections pass and colour/position checks actually run (same code path)
    ev = _native(tiny_native, threshold=0.0, counting_threshold=0.0)
    ev.setup("cpu")
    rng = np.random.default_rng(0)
    imgs = [Image.fromarray(rng.integers(0, 255, (48, 40, 3), dtype=np.uint8)) for _ in range(2)]
    # random weights: pick classes the tiny detector does report on these images, so colour/position run
    per_class, _ = ev._det(imgs[0])
    a, b = [R.COCO80_GENEVAL[i] for i in np.argsort([-len(x) for x in per_class])[:2]]
    metas = [{"tag": "color_attr", "include": [{"class": a, "count": 1, "color": "red"}, {"class": b, "count": 1, "color": "blue"}], "prompt": "p0"},
             {"tag": "position", "include": [{"class": a, "count": 1}, {"class": b, "count": 1, "position": ["left of", 0]}], "prompt": "p1"}]
    samples = [Sample(p, s, m["prompt"], imgs[s], metadata=m) for p, m in enumerate(metas) for s in range(2)]
    ev.update(samples)
    res = ev.compute()
    assert len(res.per_sample) == 4 and {"prompt_index", "sample_index", "correct", "tag"} <= set(res.per_sample[0])
    assert set(res.metrics) >= {"overall", "color_attr", "position", "correct_images", "correct_prompts"}
    assert any(r["reason"] for r in res.per_sample) or any(r["correct"] for r in res.per_sample)
    info = ev.version_info()
    assert info["detector"] == "tiny-random" and info["rules"]["threshold"] == 0.0 and info["prompt_rewrite"] is False
    assert ev._clf._weights  # the colour classifier was exercised


def test_native_missing_files(tmp_path, tiny_native):
    with pytest.raises(FileNotFoundError) as ei:
        build_evaluator("geneval", backend="native", weights_dir=str(tmp_path)).setup("cpu")
    assert "config.json" in str(ei.value) and str(tmp_path) in str(ei.value) and "mask2former" in str(ei.value)
    with pytest.raises(FileNotFoundError, match="open_clip_vit_l14_openai.bin"):
        _native(tiny_native, clip_weights="open_clip_vit_l14_openai.bin").setup("cpu")


FAKE_SCORER = '''
import json, os, re, sys
imagedir = sys.argv[1]; out = sys.argv[sys.argv.index("--outfile") + 1]
rows = []
for sub in sorted(os.listdir(imagedir)):
    d = os.path.join(imagedir, sub)
    if not (os.path.isdir(d) and sub.isdigit()): continue
    meta = json.load(open(os.path.join(d, "metadata.jsonl")))
    for name in sorted(os.listdir(os.path.join(d, "samples"))):
        if re.match(r"\\d+\\.png", name):
            rows.append({"filename": os.path.join(d, "samples", name), "tag": meta["tag"], "prompt": meta["prompt"],
                         "correct": name == "0000.png", "reason": "", "metadata": json.dumps(meta), "details": "{}"})
open(out, "w").write("".join(json.dumps(r) + "\\n" for r in rows))
'''


@pytest.mark.integration
def test_official_backend_layout_and_parsing(tmp_path):
    repo = tmp_path / "geneval"
    (repo / "evaluation").mkdir(parents=True)
    (repo / "evaluation" / "evaluate_images.py").write_text(FAKE_SCORER)
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "mask2former_swin-s-p4-w7-224_lsj_8x2_50e_coco.pth").write_bytes(b"x")
    ev = build_evaluator("geneval", backend="official", official_python=sys.executable, official_repo=str(repo),
                         official_model_path=str(tmp_path / "w"), image_dir=str(tmp_path / "imgs"))
    ev.setup()
    meta = {"tag": "single_object", "include": [{"class": "dog", "count": 1}], "prompt": "a photo of a dog"}
    ev.update([Sample(p, s, "x", Image.new("RGB", (8, 8)), metadata=dict(meta, tag=t))
               for p, t in ((3, "single_object"), (12, "counting")) for s in range(2)])
    assert (tmp_path / "imgs" / "00012" / "samples" / "0001.png").exists()
    assert json.loads((tmp_path / "imgs" / "00003" / "metadata.jsonl").read_text())["tag"] == "single_object"
    res = ev.compute()
    assert [(r["prompt_index"], r["sample_index"], r["correct"]) for r in res.per_sample] == \
        [(3, 0, True), (3, 1, False), (12, 0, True), (12, 1, False)]
    assert res.metrics["overall"] == 0.5 and res.metrics["correct_prompts"] == 1.0


def test_official_backend_missing_env(tmp_path):
    with pytest.raises(FileNotFoundError, match="official_python"):
        build_evaluator("geneval", backend="official", official_python=str(tmp_path / "nope")).setup()


# ------------------------------------------------------------------------------ colour-step precision
def test_precision_defaults_to_upstream_and_is_recorded(tiny_native):
    """Upstream's colour step runs under clip_benchmark's amp=True: fp16 autocast on CUDA, none on CPU.
    `precision=auto` (the default, in the class and both configs) follows it; the record says which
    precision was requested and which ran."""
    import yaml

    from varbench.evaluators.geneval.evaluator import GenEvalEvaluator

    conf = Path(__file__).resolve().parents[2] / "varbench" / "conf" / "evaluator"
    for f in ("geneval.yaml", "geneval_tiny.yaml"):
        assert next(iter(yaml.safe_load((conf / f).read_text()).values()))["precision"] == "auto"
    assert GenEvalEvaluator().precision == "auto"
    for requested, device, effective in (("auto", "cpu", "fp32"), ("auto", "cuda", "amp"), ("auto", "cuda:1", "amp"),
                                         ("amp", "cpu", "fp32"), ("amp", "cuda", "amp"), ("fp32", "cuda", "fp32")):
        ev = _native(tiny_native, precision=requested, device=device)
        info = ev.version_info()
        assert (info["precision"], info["precision_requested"]) == (effective, requested), (requested, device)
        assert info["clip_precision"] == ("fp16 autocast (CUDA)" if effective == "amp" else "fp32")
    ev = _native(tiny_native)
    ev.setup("cpu")
    assert ev._clf.amp is False and ev.version_info()["precision"] == "fp32"
    with pytest.raises(ValueError, match="precision"):
        _native(tiny_native, precision="bf16")
    off = build_evaluator("geneval", backend="official")
    assert off.version_info()["precision"] == "official"


def test_colour_step_autocast_only_on_cuda(tiny_native):
    from varbench.evaluators.geneval.evaluator import ColorClassifier

    clf = ColorClassifier(None, None, 224, "cpu", amp=True)
    with clf._autocast():
        assert not torch.is_autocast_enabled("cuda")
    if torch.cuda.is_available():
        clf = ColorClassifier(None, None, 224, "cuda", amp=True)
        with clf._autocast():
            assert torch.is_autocast_enabled("cuda") and torch.get_autocast_dtype("cuda") == torch.float16


@pytest.mark.gpu
def test_native_colour_step_runs_in_fp16_on_cuda(tiny_native):
    ev = _native(tiny_native, device="cuda")
    ev.setup("cuda")
    assert ev._clf.amp is True and ev.version_info()["precision"] == "amp"
    seen = []
    h = ev._clf.model.visual.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    ev._clf(Image.new("RGB", (32, 32), "red"), [(np.array([0, 0, 32, 32, 1.0]), None)], "dog")
    h.remove()
    assert seen == [torch.float16]
