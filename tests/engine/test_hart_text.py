"""HART's Qwen2 text encoder vs upstream's `encode_prompts`, on a tiny random Qwen2 folder.

* tests/fixtures/hart_tokenizer/qwen2_tiny/: a tiny random Qwen2 (2 layers, width 32) with a byte-level BPE
  tokenizer trained offline, pad token <|endoftext|> as Qwen2's.
* tests/fixtures/hart_tokenizer/tiny_text_golden.pt: upstream's `encode_prompts` on that folder (with and
  without the system prompt; the tokenizer padding right, and a copy padding left), transformers 5.24, fp32.
  How: tests/fixtures/hart_tokenizer/README.md. Measured on the writing CPU: max |ours - upstream| = 0.
"""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch

from varbench.core.errors import ConfigError
from varbench.engine.backbones.hart.text import HART_SYSTEM_PROMPT, HartTextEncoder
from varbench.engine.checkpoints import WeightsNotFound

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "hart_tokenizer"
FOLDER = FIX / "qwen2_tiny"
# another CPU may order the matmul sums differently (a few 1e-7 relative on O(1) features); measured here: 0
ATOL = 1e-4


@pytest.fixture(scope="module")
def golden():
    return torch.load(FIX / "tiny_text_golden.pt", weights_only=False)


def padding_copy(dst: Path, side: str) -> Path:
    """The fixture folder with its tokenizer padding on `side` (as the generator made it: only
    tokenizer_config.json changes)."""
    shutil.copytree(FOLDER, dst, dirs_exist_ok=True)
    conf = json.loads((dst / "tokenizer_config.json").read_text())
    conf["padding_side"] = side
    (dst / "tokenizer_config.json").write_text(json.dumps(conf, indent=2))
    return dst


@pytest.mark.parametrize("run_index", range(4))
def test_features_equal_upstream_encode_prompts(golden, run_index, tmp_path):
    torch.set_num_threads(2)
    run = golden["runs"][run_index]
    folder = FOLDER if run["padding_side"] == "right" else padding_copy(tmp_path / "left", "left")
    enc = HartTextEncoder(folder, max_length=golden["max_length"], use_system_prompt=run["use_system_prompt"])
    batch = enc(golden["prompts"])
    assert batch.features.shape == run["features"].shape == (4, 300, 32) and batch.features.dtype == torch.float32
    assert torch.equal(batch.mask, run["mask"])
    assert batch.lens == run["mask"].sum(1).tolist() and batch.lens[2] == 300     # the long prompt is truncated
    # the positions the runtime derives from the mask are upstream's context_position_ids
    assert torch.equal(torch.cumsum(batch.mask, dim=1) - 1, run["position_ids"])
    torch.testing.assert_close(batch.features, run["features"], atol=ATOL, rtol=0)


def test_fixture_runs_discriminate_the_options(golden):
    """Ignoring the system prompt, the padding side, or zeroing the pad positions would fail the parity test."""
    r_sys, r_plain, l_sys, _ = golden["runs"]
    assert (r_sys["features"] - r_plain["features"]).abs().max() > 0.5
    assert (r_sys["features"] - l_sys["features"]).abs().max() > 0.5
    pads = ~r_sys["mask"]
    assert pads.any() and r_sys["features"][pads].abs().mean() > 0.1    # pad positions carry states, not zeros
    assert not l_sys["mask"][1, 0] and l_sys["mask"][1, -1]              # left padding: real tokens at the end


def test_system_prompt_is_the_released_one(golden):
    assert hashlib.sha256(HART_SYSTEM_PROMPT.encode()).hexdigest() == golden["system_prompt_sha256"]
    enc = HartTextEncoder(FOLDER)
    assert len(enc.system_ids) == golden["system_prompt_tokens"]


def test_a_prompt_ignores_its_batch_neighbours():
    enc = HartTextEncoder(FOLDER)
    both = enc(["Crocodile in a sweater.", "Luffy from ONEPIECE, handsome face, fantasy."])
    alone = enc(["Luffy from ONEPIECE, handsome face, fantasy."])
    torch.testing.assert_close(alone.features[0], both.features[1], atol=1e-5, rtol=0)
    assert not torch.allclose(both.features[0], both.features[1])


def test_missing_folder_names_the_setting(tmp_path):
    with pytest.raises(WeightsNotFound, match="model.text_encoder_path"):
        HartTextEncoder(tmp_path / "Qwen2-VL-1.5B-Instruct")


def test_tokenizer_without_pad_token_is_refused(tmp_path):
    folder = padding_copy(tmp_path / "nopad", "right")
    conf = json.loads((folder / "tokenizer_config.json").read_text())
    conf["pad_token"] = None          # (a missing key would fall back to Qwen2Tokenizer's default <|endoftext|>)
    (folder / "tokenizer_config.json").write_text(json.dumps(conf))
    with pytest.raises(ConfigError, match="pad token"):
        HartTextEncoder(folder)


def test_qwen2_vl_folder_gives_the_same_width_and_features(tmp_path):
    """A `qwen2_vl` folder (what AutoModel makes a Qwen2VLModel in transformers 5) holding the same language
    weights: the width comes from its text_config, and the features equal the qwen2 folder's (right padding)."""
    from transformers import AutoModel, Qwen2VLConfig

    q = json.loads((FOLDER / "config.json").read_text())
    text = {k: q[k] for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                              "num_key_value_heads", "rms_norm_eps", "max_position_embeddings", "pad_token_id")}
    text["rope_parameters"] = dict(q["rope_parameters"], mrope_section=[1, 1, 2], type="mrope")
    vl = AutoModel.from_config(Qwen2VLConfig(text_config=text, vision_config=dict(
        depth=1, embed_dim=16, hidden_size=32, num_heads=2, patch_size=14, spatial_merge_size=2, temporal_patch_size=2)))
    assert type(vl).__name__ == "Qwen2VLModel" and not hasattr(vl.config, "hidden_size")
    vl.language_model.load_state_dict(AutoModel.from_pretrained(str(FOLDER)).state_dict(), strict=True)
    vl.save_pretrained(tmp_path / "vl")
    for f in FOLDER.glob("tokenizer*"):
        shutil.copy(f, tmp_path / "vl" / f.name)
    enc_vl, enc = HartTextEncoder(tmp_path / "vl"), HartTextEncoder(FOLDER)
    assert enc_vl.hidden_size == enc.hidden_size == 32
    prompts = ["Crocodile in a sweater.", "an astronaut sitting in a diner, eating fries, cinematic, analog film"]
    torch.testing.assert_close(enc_vl(prompts).features, enc(prompts).features, atol=1e-5, rtol=0)
