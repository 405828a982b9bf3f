"""CLIP score (torchmetrics' definition) and FID (clean-fid's protocol, checked against clean-fid 0.1.35
itself: tests/fixtures/evaluators/fid_cleanfid/) on tiny random models; the released weights only
under `requires_weights`."""
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from varbench.evaluators import build_evaluator
from varbench.evaluators.base import Sample
from varbench.evaluators.fid import clean_resize, decode, frechet_distance, stats
from varbench.evaluators.weights import WeightsNotFoundError

ROOT = Path(__file__).resolve().parents[2]
SCORERS = ROOT / "varbench" / "toy" / "scorers"
FIX = json.loads((ROOT / "tests" / "fixtures" / "evaluators" / "fid_cleanfid" / "cleanfid_reference.json").read_text())
TINY_CLIP = dict(weights=str(SCORERS / "geneval_tiny" / "clip.bin"), model_name="clip_tiny_qg",
                 model_config=str(SCORERS / "geneval_tiny" / "clip_tiny_qg.json"))
TINY_FID = str(SCORERS / "fid_tiny_inception.pt")


def _image(seed, h, w):
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def _features(seed, n, d):    # as make_fixture.py.txt builds them
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(n, d)) @ rng.normal(size=(d, d)) * 0.3 + rng.normal(size=d)).astype(np.float32)


# -- FID: clean-fid's protocol ------------------------------------------------------------------------
@pytest.mark.parametrize("case", FIX["resize"], ids=lambda c: f"{c['h']}x{c['w']}")
def test_resize_is_clean_fids_to_the_bit(case):
    img = Image.fromarray(_image(case["seed"], case["h"], case["w"]))
    big = clean_resize(img)
    assert big.dtype == np.float32 and list(big.shape) == case["shape_299"]
    # the same float32 operations in the same order as clean-fid: equal bits, so equal sums
    assert float(big.astype(np.float64).sum()) == case["sum_299"]
    assert big[0, :8, :].tolist() == case["first_row_299"]
    assert clean_resize(img, (19, 23)).tolist() == case["small_19x23"]


@pytest.mark.parametrize("case", FIX["frechet"], ids=lambda c: f"n{c['n']}")
def test_frechet_distance_is_clean_fids(case):
    a, b = _features(case["seed"], case["n"], case["d"]), _features(case["seed"] + 100, case["n"], case["d"])
    # same scipy sqrtm on the same float64 statistics: agreement to rounding (n=6 < d: singular covariances)
    assert frechet_distance(*stats(a), *stats(b)) == pytest.approx(case["fid"], rel=1e-9, abs=1e-9)


def test_frechet_distance_of_gaussians_with_known_answer():
    # N(0, I) vs N(m, 4I) in d dims: ||m||^2 + d (1 + 4 - 2*2) = ||m||^2 + d
    d, m = 5, np.arange(5.0)
    assert frechet_distance(np.zeros(d), np.eye(d), m, 4 * np.eye(d)) == pytest.approx(m @ m + d)


def _samples(n_prompts=6, spp=2, shift=0):
    out = []
    for p in range(n_prompts):
        for s in range(spp):
            ref = Image.fromarray(_image(100 * p + s, 40, 40))
            img = ref if shift == 0 else Image.fromarray(np.clip(_image(100 * p + s, 40, 40).astype(int) + shift, 0, 255).astype(np.uint8))
            out.append(Sample(p, s, f"prompt {p}", img, reference=ref))
    return out


def test_fid_vs_baseline_is_zero_for_the_baseline_and_grows_with_a_shift():
    ev = build_evaluator("fid", weights=TINY_FID)
    assert ev.needs_reference and ev.relative_to_baseline and ev.higher_is_better == {"fid": False}
    ev.setup("cpu")
    ev.update(_samples())
    same = ev.compute()
    assert same.metrics["fid"] == pytest.approx(0.0, abs=1e-6) and same.metrics["n_images"] == 12.0
    row = same.per_sample[0]
    assert decode(row["feat"]).shape == (8,) and row["feat"] == row["ref_feat"]
    # the rows hold the features: FID from the rows is FID of the features as computed directly
    ev.reset()
    ev.update(_samples(shift=60))
    res = ev.compute()
    f = ev.features([s.image for s in _samples(shift=60)])
    g = ev.features([s.reference for s in _samples(shift=60)])
    assert res.metrics["fid"] == pytest.approx(frechet_distance(*stats(f), *stats(g)), rel=1e-6)
    assert res.metrics["fid"] > 1e-3 and "fid" not in res.uncertainty
    again = build_evaluator("fid", weights=TINY_FID)
    again.restore(res.per_sample)                                  # no weights needed to aggregate rows
    assert again.compute().metrics == res.metrics


def test_fid_bootstrap_resamples_prompts():
    ev = build_evaluator("fid", weights=TINY_FID, n_boot=20)
    ev.setup("cpu")
    ev.update(_samples(shift=60))
    res = ev.compute()
    assert res.uncertainty["fid"] > 0
    ev2 = build_evaluator("fid", weights=TINY_FID, n_boot=20)     # seeded: the same ± twice
    ev2.restore(res.per_sample)
    assert ev2.compute().uncertainty == res.uncertainty


def test_fid_refuses_a_sample_without_reference_and_names_missing_weights(tmp_path):
    ev = build_evaluator("fid", weights=TINY_FID)
    ev.setup("cpu")
    with pytest.raises(ValueError, match="no reference"):
        ev.update([Sample(0, 0, "p", Image.new("RGB", (8, 8)))])
    with pytest.raises(WeightsNotFoundError, match="(?s)inception-2015-12-05.pt.*nvlabs"):
        build_evaluator("fid", weights_dir=str(tmp_path)).preflight([])


def test_dataset_fid_against_a_folder_caches_its_statistics(tmp_path):
    ref = tmp_path / "refs" / "people"
    ref.mkdir(parents=True)
    for i in range(6):
        Image.fromarray(_image(500 + i, 30, 30)).save(ref / f"{i}.jpg", quality=95)
    with pytest.raises(WeightsNotFoundError, match="(?s)reference image folder.*MJHQ"):
        build_evaluator("fid_dataset", weights=TINY_FID, reference_dir=str(tmp_path / "absent")).preflight([])
    ev = build_evaluator("fid_dataset", weights=TINY_FID, reference_dir=str(tmp_path / "refs"),
                         stats_cache=str(tmp_path / "cache"))
    ev.setup("cpu")
    assert len(list((tmp_path / "cache").glob("fid_stats_*.npz"))) == 1
    ev.update([Sample(i, 0, "p", Image.open(ref / f"{i}.jpg")) for i in range(6)])
    assert ev.compute().metrics["fid"] == pytest.approx(0.0, abs=1e-6)   # the reference set itself
    # a second scorer (aggregating stored rows) reads the cached statistics instead of recomputing them
    mtime = next((tmp_path / "cache").glob("*.npz")).stat().st_mtime_ns
    ev2 = build_evaluator("fid_dataset", weights=TINY_FID, reference_dir=str(tmp_path / "refs"),
                          stats_cache=str(tmp_path / "cache"))
    ev2.restore(ev.compute().per_sample)
    assert ev2.compute().metrics["fid"] == pytest.approx(0.0, abs=1e-6)
    assert next((tmp_path / "cache").glob("*.npz")).stat().st_mtime_ns == mtime


# -- CLIP score -----------------------------------------------------------------------------------------
def test_clipscore_is_100_times_the_floored_cosine():
    import open_clip

    ev = build_evaluator("clipscore", **TINY_CLIP)
    ev.setup("cpu")
    imgs = [Image.fromarray(_image(i, 48, 64)) for i in range(6)]
    prompts = [f"a photo of {w}" for w in ("a cat", "a dog", "two birds", "a red car", "a bench", "a bus")]
    ev.update([Sample(i, 0, p, im) for i, (im, p) in enumerate(zip(imgs, prompts))])
    res = ev.compute()
    # the cosine from the model directly, through open_clip's own OpenAI preprocessing
    model, _, pre = open_clip.create_model_and_transforms("clip_tiny_qg", pretrained=str(SCORERS / "geneval_tiny" / "clip.bin"))
    with torch.no_grad():
        a = model.encode_image(torch.stack([pre(im) for im in imgs])).float()
        b = model.encode_text(open_clip.get_tokenizer("clip_tiny_qg")(prompts)).float()
    cos = torch.nn.functional.cosine_similarity(a, b).tolist()
    for row, c in zip(res.per_sample, cos):
        assert row["clip_cosine"] == pytest.approx(c, abs=1e-5)
        assert row["clip_score"] == pytest.approx(100 * max(c, 0.0), abs=1e-3)
    assert res.metrics["score"] == pytest.approx(sum(100 * max(c, 0) for c in cos) / 6, abs=1e-3)
    assert res.uncertainty["score"] > 0 and ev.version_info()["weights"] == "clip.bin"


def test_clipscore_floors_negative_cosines_at_zero(monkeypatch):
    ev = build_evaluator("clipscore", **TINY_CLIP)
    monkeypatch.setattr(ev, "cosines", lambda images, prompts: [-0.25, 0.3])
    ev.update([Sample(0, 0, "a", None), Sample(1, 0, "b", None)])
    rows = ev.compute().per_sample
    assert [r["clip_score"] for r in rows] == [0.0, pytest.approx(30.0)]
    assert rows[0]["clip_cosine"] == -0.25


def test_clipscore_names_its_missing_weights(tmp_path):
    with pytest.raises(WeightsNotFoundError, match="open_clip_vit_l14_openai.bin"):
        build_evaluator("clipscore", weights_dir=str(tmp_path)).preflight([])


@pytest.mark.requires_weights
def test_released_inception_and_clip_load(tmp_path):
    wd = os.environ.get("VARBENCH_WEIGHTS")
    if not wd or not (Path(wd) / "inception-2015-12-05.pt").is_file() or not (Path(wd) / "open_clip_vit_l14_openai.bin").is_file():
        pytest.skip("inception-2015-12-05.pt / open_clip_vit_l14_openai.bin not under VARBENCH_WEIGHTS")
    ev = build_evaluator("fid", weights_dir=wd)
    ev.setup("cpu")
    assert ev.features([Image.new("RGB", (64, 64))]).shape == (1, 2048)
    clip = build_evaluator("clipscore", weights_dir=wd)
    clip.setup("cpu")
    clip.update([Sample(0, 0, "a black square", Image.new("RGB", (64, 64)))])
    assert 0 <= clip.compute().metrics["score"] <= 100


# -- MJHQ-30K's prompts -----------------------------------------------------------------------------------
def test_mjhq_prompts_come_from_meta_data_json_in_its_order(tmp_path):
    from varbench.harness.prompts import PromptSetError, load_prompt_set

    meta = {"b7": {"category": "animals", "prompt": "a fox"}, "a1": {"category": "people", "prompt": "a chef"}}
    (tmp_path / "meta_data.json").write_text(json.dumps(meta))
    ps = load_prompt_set({"loader": "mjhq", "path": str(tmp_path)})        # the folder or the file
    assert [(it.index, it.prompt, it.metadata) for it in ps.items] == [
        (0, "a fox", {"id": "b7", "category": "animals"}), (1, "a chef", {"id": "a1", "category": "people"})]
    assert ps.expected_sha256 is None and len(ps.sha256) == 64
    with pytest.raises(PromptSetError, match="(?s)meta_data.json.*playgroundai/MJHQ-30K"):
        load_prompt_set({"loader": "mjhq", "path": str(tmp_path / "absent")})
    (tmp_path / "meta_data.json").write_text(json.dumps({"x": {"category": "c"}}))
    with pytest.raises(PromptSetError, match="'x' needs a \"prompt\""):
        load_prompt_set({"loader": "mjhq", "path": str(tmp_path)})
