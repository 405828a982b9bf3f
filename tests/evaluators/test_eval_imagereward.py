"""ImageReward evaluator: parity with upstream THUDM/ImageReward on a tiny random model, plus errors.

Goldens (tests/fixtures/evaluators/imagereward_golden.json) were produced in a scratch folder by running
upstream THUDM/ImageReward at commit c1392c6 (`ImageReward/ImageReward.py::ImageReward.score` and
`inference_rank`, its BLIP `vit.py` VisionTransformer and `med.py` BertModel) with /work/venv (torch 2.14.1,
torchvision 0.29.1, timm 1.0.31) plus transformers 4.55.4 / tokenizers 0.21.4 on PYTHONPATH (upstream
med.py needs transformers < 4.56):
  1. package __init__s stubbed (ReFL/diffusers and OpenAI-clip imports, unused), fairscale stubbed
     (only for gradient checkpointing);
  2. tiny sizes from imagereward_tiny.json injected by patching `blip_pretrain.create_vit` (upstream
     VisionTransformer with those dims) and `ImageReward.MLP` (upstream MLP, input = text width); the
     med_config.json is the published one with the tiny sizes;
  3. tokenizer = upstream `init_tokenizer()` resolving 'bert-base-uncased' to a CWD folder holding
     ir_tiny_tokenizer/vocab.txt (adds [DEC], [ENC]);
  4. torch.manual_seed(0) upstream init + 0.05 N(0,1) perturbation (seed 1), fp16 -> imagereward_tiny_random.pt
     (the full upstream state dict, incl. vision_proj/text_proj/position_ids like ImageReward.pt);
  5. score(prompt, PIL image) per fixture image, plus inference_rank(prompt0, all images).
"""
import json
from pathlib import Path

import pytest
import torch
from PIL import Image

from varbench.core.resources import TINY_SCORERS_DIR
from varbench.evaluators import build_evaluator
from varbench.evaluators.base import Sample

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "evaluators"   # goldens and their images
TINY = TINY_SCORERS_DIR   # the tiny random scorers, bundled with the package
GOLD = json.loads((FIX / "imagereward_golden.json").read_text())


def _ev(**kw):
    args = dict(weights=str(TINY / "imagereward_tiny_random.pt"), tokenizer_dir=str(TINY / "ir_tiny_tokenizer"),
                model_config=str(TINY / "imagereward_tiny.json"), batch_size=3, device="cpu")
    args.update(kw)
    return build_evaluator("imagereward", **args)


@pytest.fixture(scope="module")
def ev():
    e = _ev()
    e.setup("cpu")
    return e


def test_preprocessing_matches_upstream_pixel_for_pixel():
    from varbench.evaluators.imagereward import ir_preprocess

    for row in GOLD["rows"]:
        t = ir_preprocess(Image.open(FIX / "images" / row["image"]))
        assert t.shape == (3, 224, 224)
        assert t.flatten()[::997].tolist() == row["pre_strided"]
        assert float(t.double().sum()) == pytest.approx(row["pre_sum"], abs=1e-9)


def test_tokenizer_ids_match_upstream(ev):
    for row in GOLD["rows"]:  # includes a literal [ENC], an accent, punctuation, padding to 35
        assert ev.tokenize([row["prompt"]]).input_ids[0].tolist() == row["input_ids"]


def test_scores_match_upstream(ev):
    samples = [Sample(i, 0, r["prompt"], Image.open(FIX / "images" / r["image"])) for i, r in enumerate(GOLD["rows"])]
    ev.reset()
    ev.update(samples)  # batches of 3 with mixed prompts: batching must not change scores
    res = ev.compute()
    diffs = [abs(row["imagereward"] - g["score"]) for row, g in zip(res.per_sample, GOLD["rows"])]
    assert max(diffs) < 1e-5, diffs
    ranked = ev.rewards([Image.open(FIX / "images" / n) for n in GOLD["rank_images"]], [GOLD["rank_prompt"]] * 5)
    assert max(abs(a - b) for a, b in zip(ranked, GOLD["rank_rewards"])) < 1e-5
    assert res.metrics["score"] == pytest.approx(sum(g["score"] for g in GOLD["rows"]) / 5, abs=1e-5)
    assert {"prompt_index", "sample_index", "imagereward"} <= set(res.per_sample[0])
    assert ev.version_info()["max_length"] == 35


def test_key_map_is_strict():
    from varbench.evaluators.imagereward import map_imagereward_state_dict

    sd = torch.load(TINY / "imagereward_tiny_random.pt")
    mapped, dropped = map_imagereward_state_dict(sd)
    assert "vision.embeddings.class_embedding" in mapped and "vision.post_layernorm.weight" in mapped
    assert all(k.startswith(("blip.vision_proj", "blip.text_proj", "blip.text_encoder.embeddings.position_ids"))
               for k in dropped)
    with pytest.raises(ValueError, match="outside the known layout"):
        map_imagereward_state_dict({**sd, "blip.visual_encoder_m.cls_token": torch.zeros(1)})


def test_missing_files(tmp_path):
    with pytest.raises(FileNotFoundError) as ei:
        build_evaluator("imagereward", weights_dir=str(tmp_path)).setup("cpu")
    assert "ImageReward.pt" in str(ei.value) and str(tmp_path) in str(ei.value) and "THUDM/ImageReward" in str(ei.value)
    with pytest.raises(FileNotFoundError, match="vocab.txt"):
        _ev(tokenizer_dir=str(tmp_path)).setup("cpu")


def test_truncated_checkpoint(tmp_path):
    bad = tmp_path / "ImageReward.pt"
    bad.write_bytes((TINY / "imagereward_tiny_random.pt").read_bytes()[:1000])
    with pytest.raises(ValueError, match="could not load"):
        _ev(weights=str(bad)).setup("cpu")
