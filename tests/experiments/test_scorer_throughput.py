"""experiments/scorer_throughput.py: the CPU (`--size tiny`) path end to end, and the real-size weight
files' layouts checked on the meta device (shapes only: nothing real-size is allocated or written).

Independent references for the real-size checks (not derived from the code under test):
* open_clip's model profile table (docs/model_profile.csv) lists ViT-H-14 at 986.11 M parameters and
  ViT-L-14 at 427.62 M; the HPS v2.1 checkpoint is a full ViT-H-14 CLIP, the GenEval colour CLIP a ViT-L-14.
* Mask2Former paper (Cheng et al. 2022, Table 1, COCO instance): Swin-S model has 69 M parameters.
* ImageReward = BLIP ViT-L/16 @224 (14 x 14 patches + CLS = 197 tokens, width 1024, 24 blocks) and a
  BERT-base text encoder (width 768, 12 layers) cross-attending to the 1024-wide image tokens.
"""
from __future__ import annotations

import json
import math

import pytest
import torch

pytest.importorskip("open_clip")

from experiments import scorer_throughput as st  # noqa: E402


def _nparams(shapes) -> int:
    return sum(math.prod(s) for s, _ in shapes.values())


def _run(tmp_path, scorers: str, images: int = 4, batch: int = 2):
    out = tmp_path / "tp.json"
    rc = st.main(["--device", "cpu", "--size", "tiny", "--scorers", scorers, "--images", str(images), "--batch",
                  str(batch), "--image-size", "64", "--out", str(out), "--workdir", str(tmp_path / "w")])
    return rc, json.loads(out.read_text())


@pytest.mark.integration
def test_tiny_run_times_every_scorer(tmp_path):
    """All four scorers run through build_evaluator/setup/update on weights written by the real-size writers."""
    rc, rec = _run(tmp_path, "hpsv2,imagereward,geneval,fidelity", images=4, batch=2)
    assert rc == 0 and rec["status"] == "done"
    assert "RANDOM" in rec["note"]
    assert set(rec["scorers"]) == {"hpsv2", "imagereward", "geneval", "fidelity"}
    for key, r in rec["scorers"].items():
        assert r["status"] == "ok", (key, r.get("error"))
        assert r["images"] == 4 and not r["truncated"], key
        assert len(r["batch_seconds"]) == 2, key   # 4 images in batches of 2
        assert r["images_per_s"] > 0 and r["setup_s"] >= 0, key
    # the colour CLIP really ran (thresholds 0 + class bias make random detections reach rule 5)
    assert rec["scorers"]["geneval"]["extra"]["colour_crops"] > 0
    # LPIPS loaded the written AlexNet instead of being skipped for want of weights
    assert rec["scorers"]["fidelity"]["version_info"]["lpips"].startswith("on")


@pytest.mark.integration
def test_failed_scorer_is_recorded_and_fails_the_run(tmp_path, monkeypatch):
    real = st.prepare

    def broken(key, *a, **k):
        if key == "imagereward":
            raise RuntimeError("boom")
        return real(key, *a, **k)

    monkeypatch.setattr(st, "prepare", broken)
    rc, rec = _run(tmp_path, "imagereward,fidelity", images=2, batch=2)
    assert rc == 1 and rec["status"] == "failed"
    assert rec["scorers"]["imagereward"]["status"] == "failed" and "boom" in rec["scorers"]["imagereward"]["error"]
    assert rec["scorers"]["fidelity"]["status"] == "ok"   # later scorers still run and are written


def test_unknown_scorer_is_refused():
    with pytest.raises(SystemExit):
        st.parse_args(["--scorers", "hpsv3"])


def test_imagereward_real_file_roundtrips_through_map():
    """The real-size ImageReward.pt layout we write maps back, key for key and shape for shape, onto the model."""
    from varbench.evaluators.imagereward import REAL_CONFIG, ImageRewardModel, map_imagereward_state_dict

    upstream = st.imagereward_upstream_shapes(REAL_CONFIG)
    fake = {k: torch.empty(s, dtype=d, device="meta") for k, (s, d) in upstream.items()}
    mapped, dropped = map_imagereward_state_dict(fake)
    ours = st.module_shapes(lambda: ImageRewardModel(REAL_CONFIG))
    ours.pop("text.embeddings.position_ids", None)  # buffer; the evaluator tolerates its absence
    assert {k: tuple(v.shape) for k, v in mapped.items()} == {k: s for k, (s, _) in ours.items()}
    assert sorted(dropped) == sorted(["blip.vision_proj.weight", "blip.vision_proj.bias", "blip.text_proj.weight",
                                      "blip.text_proj.bias", "blip.text_encoder.embeddings.position_ids"])
    # upstream names and shapes fixed by the published architecture (see module docstring)
    assert upstream["blip.visual_encoder.cls_token"][0] == (1, 1, 1024)
    assert upstream["blip.visual_encoder.pos_embed"][0] == (1, 197, 1024)
    assert upstream["blip.visual_encoder.blocks.23.attn.qkv.weight"][0] == (3072, 1024)
    assert "blip.visual_encoder.blocks.24.attn.qkv.weight" not in upstream
    assert upstream["blip.text_encoder.encoder.layer.11.crossattention.self.key.weight"][0] == (768, 1024)
    assert upstream["mlp.layers.7.weight"][0] == (1, 16)


def test_real_size_open_clip_and_detector_shapes():
    """HPS file = full ViT-H-14; colour CLIP = ViT-L-14; detector = Swin-S Mask2Former with 80 classes."""
    from transformers import Mask2FormerForUniversalSegmentation

    from varbench.evaluators.geneval.convert_mmdet import build_hf_config

    hps = st.open_clip_shapes("ViT-H-14")
    assert round(_nparams(hps) / 1e6, 2) == 986.11
    assert hps["visual.conv1.weight"][0] == (1280, 3, 14, 14) and hps["token_embedding.weight"][0] == (49408, 1024)
    assert sum(k.endswith("attn.in_proj_weight") and k.startswith("visual.") for k in hps) == 32
    assert sum(k.endswith("attn.in_proj_weight") and k.startswith("transformer.") for k in hps) == 24
    clip = st.open_clip_shapes("ViT-L-14-quickgelu")
    assert round(_nparams(clip) / 1e6, 2) == 427.62
    det = st.module_shapes(lambda: Mask2FormerForUniversalSegmentation(build_hf_config()))
    assert round(_nparams(det) / 1e6) == 69
    assert det["class_predictor.weight"][0] == (81, 256)


def test_geneval_folder_loads_without_missing_keys(tmp_path):
    """The safetensors folder written from a config loads with every key present (no silent random init)."""
    from transformers import Mask2FormerConfig, Mask2FormerForUniversalSegmentation

    cfg = Mask2FormerConfig.from_pretrained(str(st.FIX / "geneval_tiny" / "m2f"))
    st.write_geneval(tmp_path, cfg, "clip_tiny_qg", str(st.FIX / "geneval_tiny" / "clip_tiny_qg.json"), "cpu")
    _, info = Mask2FormerForUniversalSegmentation.from_pretrained(str(tmp_path / "m2f"), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]


def test_bert_vocab_matches_the_real_layout(tmp_path):
    from varbench.evaluators.imagereward import REAL_CONFIG, load_tokenizer

    st.write_bert_vocab(tmp_path, ["A", "photo", "of", "a", "dog."])
    lines = (tmp_path / "vocab.txt").read_text().splitlines()
    assert len(lines) == len(set(lines)) == 30522
    assert [lines[i] for i in (0, 100, 101, 102, 103)] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok = load_tokenizer(tmp_path)
    assert len(tok) == REAL_CONFIG["text"]["vocab_size"]   # + [DEC], [ENC], as the evaluator checks
    ids = tok(["a photo of a dog"]).input_ids[0]
    assert ids[0] == 101 and ids[-1] == 102 and 100 not in ids   # known words are not [UNK]
