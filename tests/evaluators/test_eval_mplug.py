"""The native mPLUG (varbench/evaluators/dpg/mplug.py) against ModelScope's own implementation on a tiny random
config: the answers its VQA pipeline gave, the decoder's first-step logits, the fused states and the beam
score (tests/fixtures/evaluators/mplug_parity: written with modelscope 1.31.0 / transformers 4.27.4)."""
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from varbench.evaluators.dpg.mplug import MPlugVQA, QUESTION_TOKENS, map_checkpoint, preprocess, required_files
from varbench.evaluators.weights import WeightsNotFoundError

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "varbench" / "toy" / "scorers" / "mplug_tiny"
REF = json.loads((ROOT / "tests" / "fixtures" / "evaluators" / "mplug_parity" / "mplug_reference.json").read_text())


def _image(seed):                        # as the generator made them
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, (3, 3, 3), dtype=np.uint8)
    return Image.fromarray(np.kron(base, np.ones((24, 24, 1), dtype=np.uint8)))


@pytest.fixture(scope="module")
def vqa():
    return MPlugVQA(TINY, device="cpu", batch_size=3)


def test_answers_equal_modelscopes_pipeline(vqa):
    cases = REF["cases"]
    got = vqa.answer([_image(c["image_seed"]) for c in cases], [c["question"] for c in cases])
    assert got == [c["answer"] for c in cases]
    assert {"yes", "[unused85]"} <= set(got)          # the cases reach different answers


def test_logits_states_and_beam_scores_match(vqa):
    m = vqa.model
    for c in REF["cases"]:
        tok = vqa.tokenizer([c["question"].lower()], padding="max_length", truncation=True,
                            max_length=QUESTION_TOKENS, return_tensors="pt")
        with torch.no_grad():
            image = m.image_states(preprocess(_image(c["image_seed"]), 56)[None])
            states, atts = m.question_states(image, tok.input_ids, tok.attention_mask)
            mask = (1.0 - atts[:, None, None, :].float()) * torch.finfo(torch.float32).min
            logits = m.text_decoder(torch.tensor([[101]]), states, mask)[0, -1]
            [(ids, score)] = m.beam_search(states, atts)
        # measured: bit-identical on the default kernels (max |Δ| 0, logits up to 9); under
        # ATEN_CPU_CAPABILITY=avx2 max |Δ| 4.8e-6 on logits, 1.7e-7 relative on the states' sum, 2.2e-6 on
        # the beam score: the bounds below leave 20x that
        assert torch.allclose(logits, torch.tensor(c["first_logits"]), atol=1e-4, rtol=0)
        assert float(states.double().sum()) == pytest.approx(c["states_sum"], rel=1e-5)
        assert ids == c["ids"] and score == pytest.approx(c["score"], abs=1e-4)


def test_loading_is_strict_by_released_names(tmp_path):
    state = torch.load(TINY / "pytorch_model.bin", map_location="cpu", weights_only=True)
    kept, unused = map_checkpoint(state)
    # what the VQA path never reads is named, not silently dropped: CLIP's text tower, the tied bias
    assert any(k.startswith("visual_encoder.transformer.") for k in unused)
    assert "text_decoder.cls.predictions.decoder.bias" in unused
    assert not any(k.startswith("visual_encoder.visual.") for k in unused)
    # a key of the VQA path missing from the file is an error naming it
    broken = dict(state["model"])
    broken.pop("fusion_encoder.encoder.layer.2.attention.self.query.weight")
    folder = tmp_path / "m"
    folder.mkdir()
    for f in ("config.yaml", "config_bert.json", "vocab.txt"):
        (folder / f).write_bytes((TINY / f).read_bytes())
    torch.save({"model": broken}, folder / "pytorch_model.bin")
    with pytest.raises(Exception, match="fusion_encoder.encoder.layer.2.attention.self.query.weight"):
        MPlugVQA(folder)


def test_missing_files_name_the_release(tmp_path):
    with pytest.raises(WeightsNotFoundError, match="(?s)pytorch_model.bin.*mplug_visual-question-answering_coco_large_en"):
        required_files(tmp_path)


@pytest.mark.requires_weights
def test_released_mplug_large_loads_strictly_and_answers_yes_or_no():
    import os

    folder = Path(os.environ.get("VARBENCH_WEIGHTS", "/nonexistent")) / "mplug_vqa_coco_large_en"
    if not all((folder / f).is_file() for f in ("pytorch_model.bin", "config.yaml", "config_bert.json", "vocab.txt")):
        pytest.skip(f"mPLUG-large not under {folder} (ModelScope hub damo/mplug_visual-question-answering_coco_large_en)")
    vqa = MPlugVQA(folder)
    assert vqa.cfg["image_res"] == 504 and vqa.cfg["beam_size"] == 5 and vqa.cfg["max_length"] == 10
    white = Image.new("RGB", (512, 512), (255, 255, 255))
    assert vqa.answer([white, white], ["is this image white?", "is there a dog?"]) == ["yes", "no"]
