"""HART's image decoder (tokenizer): released key names/shapes, strict loading of a released-layout folder,
and parity with upstream's `fhat_to_img` + the release's pixel maps.

* tests/fixtures/keys/hart_0p7b_tokenizer.txt: upstream HARTAutoEncoderWithDisc's state dict for the 0.7B
  tokenizer (its header and tests/fixtures/keys/README.md say how it was written).
* tests/fixtures/hart_tokenizer/tiny_tokenizer_parity.pt: what upstream decoded on CPU for a tiny random
  tokenizer (tests/fixtures/hart_tokenizer/README.md). Measured on the writing CPU: max |ours - upstream| = 0
  for the [-1, 1] image (batched and per image) and 0 uint8 pixels differ.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from tests.engine.test_hart import read_keys
from varbench.core.errors import ConfigError
from varbench.engine.backbones.hart.model import HART_PRESETS, QUANT_IGNORED_KEYS
from varbench.engine.backbones.hart.tokenizer import (HART_TOKENIZER_PRESETS, HartTokenizerConfig, build_hart_tokenizer,
                                                   dropped_prefixes, hart_tokenizer_config_from_json,
                                                   load_hart_tokenizer, load_tokenizer_state)
from varbench.engine.checkpoints import CheckpointMismatch, WeightsNotFound

FIX = Path(__file__).resolve().parents[1] / "fixtures"
PARITY = FIX / "hart_tokenizer" / "tiny_tokenizer_parity.pt"
# Another CPU may sum the convolutions in another order: upstream's own batched vs one-image decode differ by
# 4.6e-6 (recorded in the fixture), so 1e-4 leaves 20x room; on the writing CPU our difference is exactly 0.
ATOL = 1e-4


def our_keys(cfg) -> dict[str, tuple]:
    """Our (quantizer, decoder) state dicts under the released file's names."""
    quant, dec = build_hart_tokenizer(cfg, device="meta")
    got = {"vae.quantize." + k: tuple(v.shape) for k, v in quant.state_dict().items()}
    got.update({"vae." + k: tuple(v.shape) for k, v in dec.state_dict().items()})
    return got


def test_0p7b_keys_and_shapes_equal_the_released_module_tree():
    want = read_keys(FIX / "keys" / "hart_0p7b_tokenizer.txt")
    cfg = HART_TOKENIZER_PRESETS["hart_0p7b"]
    drop = dropped_prefixes(cfg)
    for p in drop:   # what is dropped on purpose exists in the released tree (else the loader would refuse it)
        assert any(k.startswith(p) for k in want), p
    kept = {k: s for k, s in want.items() if not k.startswith(drop)
            and k.removeprefix("vae.quantize.") not in QUANT_IGNORED_KEYS}
    assert our_keys(cfg) == kept
    # the decoder part is most of what is loaded: 64.7M of upstream's 111.7M (encoder 44.1M, discriminator 2.8M)
    n_dec = sum(torch.Size(s).numel() for k, s in want.items() if k.startswith(("vae.decoder.", "vae.post_quant_conv.")))
    assert n_dec == sum(p.numel() for p in build_hart_tokenizer(cfg, device="meta")[1].parameters())
    # the quantizer keys also equal the transformer-side fixture written earlier (same upstream class)
    q_old = read_keys(FIX / "keys" / "hart_0p7b_tokenizer_quantize.txt")
    assert {k: s for k, s in want.items() if k.startswith("vae.quantize.") and "ema_vocab" not in k} == \
        {"vae." + k: s for k, s in q_old.items() if "ema_vocab" not in k}


def test_0p7b_decoder_makes_1024px_from_the_64x64_latent():
    cfg = HART_TOKENIZER_PRESETS["hart_0p7b"]
    assert cfg.downsample * HART_PRESETS["hart_0p7b"].patch_nums[-1] == 1024
    assert (cfg.vocab_size, cfg.z_channels) == (HART_PRESETS["hart_0p7b"].vocab_size, HART_PRESETS["hart_0p7b"].cvae)


@pytest.fixture(scope="module")
def parity():
    return torch.load(PARITY, weights_only=False)


@pytest.fixture
def released_folder(parity, tmp_path):
    """A folder laid out as the released `tokenizer/`: upstream's config.json and one safetensors file with every
    key of upstream's module tree (fixture weights where image generation reads them, zeros elsewhere)."""
    from safetensors.torch import save_file

    (tmp_path / "config.json").write_text(parity["config_json"])
    sd = {k: parity["weights"][k].float() if k in parity["weights"] else torch.zeros(s) for k, s in parity["keys"].items()}
    sd = {k: (v.long() if k.endswith("num_batches_tracked") else v) for k, v in sd.items()}
    save_file(sd, str(tmp_path / "model.safetensors"))
    return tmp_path


def test_tiny_preset_is_the_fixture_config(parity, tmp_path):
    (tmp_path / "config.json").write_text(parity["config_json"])
    cfg = hart_tokenizer_config_from_json(tmp_path / "config.json")
    assert cfg == HART_TOKENIZER_PRESETS["hart_tiny"]
    tiny = HART_PRESETS["hart_tiny"]          # decodes the tiny transformer's latent
    assert (cfg.vocab_size, cfg.z_channels, cfg.v_patch_nums) == (tiny.vocab_size, tiny.cvae, tiny.patch_nums)


def test_released_layout_loads_strictly_and_decodes_as_upstream(parity, released_folder):
    torch.set_num_threads(2)
    quant, dec = load_hart_tokenizer(released_folder, patch_nums=HART_PRESETS["hart_tiny"].patch_nums)
    assert not dec.training and not any(p.requires_grad for p in dec.parameters())
    assert torch.equal(quant.embedding.weight, parity["weights"]["vae.quantize.embedding.weight"].float())
    assert torch.equal(dec.decoder.conv_out.weight, parity["weights"]["vae.decoder.conv_out.weight"].float())
    f_hat = parity["f_hat"]
    with torch.no_grad():
        batched = dec.fhat_to_img(f_hat.clone())
    torch.testing.assert_close(batched, parity["img_m11"], atol=ATOL, rtol=0)
    # a tenth of the pixels are clamped (so the clamp is exercised) and the rest vary
    assert 0.02 < parity["clamped_fraction"] < 0.5 and batched.std() > 0.2
    u8 = dec.decode(f_hat)
    assert u8.shape == (3, 20, 20, 3) and u8.dtype == torch.uint8
    want = parity["img_uint8_single"]          # upstream, one image per call, as `decode` runs
    # Equal on the writing CPU. Elsewhere a pixel may truncate to the neighbouring level only where upstream's
    # x * 255 lies within 255 * ATOL of an integer.
    diff = (u8.int() - want.int()).abs()
    assert diff.max() <= 1
    near = ((parity["img_m11_single"].add(1).mul(0.5).mul(255).permute(0, 2, 3, 1) + 255 * ATOL) % 1) < 2 * 255 * ATOL
    assert bool(near[diff > 0].all())
    assert (u8 != want).float().mean() < 0.01


def test_decode_is_per_image(parity, released_folder):
    _, dec = load_hart_tokenizer(released_folder)
    seen = []
    orig = dec.fhat_to_img
    dec.fhat_to_img = lambda f: (seen.append(f.shape[0]), orig(f))[1]
    u8 = dec.decode(parity["f_hat"])
    assert seen == [1, 1, 1]                   # one decoder call per image
    del dec.fhat_to_img
    assert torch.equal(u8[1:2], dec.decode(parity["f_hat"][1:2]))   # an image's pixels ignore its neighbours


def test_pixel_map_clamps_halves_and_truncates():
    _, dec = build_hart_tokenizer("hart_tiny")
    vals = torch.tensor([-2.0, -1.0, 0.0, 0.999, 1.0, 3.0])
    dec.decoder.forward = lambda z: vals.view(1, 1, 1, 6).expand(z.shape[0], 3, 1, 6).clone()
    px = dec.decode(torch.zeros(1, 8, 5, 5))[0, 0, :, 0]
    # clamp to [-1, 1] -> (x + 1) * 0.5 -> * 255 = 0, 0, 127.5, 254.87, 255, 255 -> truncated (not rounded)
    assert px.tolist() == [0, 0, 127, 254, 255, 255]


def test_missing_folder_config_or_weights_name_the_setting(tmp_path, parity):
    with pytest.raises(WeightsNotFound, match="model.vae"):
        load_hart_tokenizer(tmp_path / "tokenizer")
    (tmp_path / "tokenizer").mkdir()
    with pytest.raises(WeightsNotFound, match="config.json"):
        load_hart_tokenizer(tmp_path / "tokenizer")
    (tmp_path / "tokenizer" / "config.json").write_text(parity["config_json"])
    with pytest.raises(WeightsNotFound, match="model.safetensors"):
        load_hart_tokenizer(tmp_path / "tokenizer")


def test_config_refuses_what_it_does_not_implement(tmp_path, parity):
    conf = json.loads(parity["config_json"])
    p = tmp_path / "config.json"
    for change, match in (({"model_type": "hart_transformer_t2i"}, "not a HART tokenizer"),
                          ({"quantizer_type": "fsq"}, "quantizer_type"),
                          ({"share_quant_resi": 0}, "partially shared"),
                          ({"ch": 20}, "multiples of 32")):
        p.write_text(json.dumps({**conf, **change}))
        with pytest.raises(ConfigError, match=match):
            hart_tokenizer_config_from_json(p)
    p.write_text(json.dumps({**conf, "quantizer_type": "var"}))   # same keys and inference path as var_hybrid
    assert hart_tokenizer_config_from_json(p) == HART_TOKENIZER_PRESETS["hart_tiny"]


def full_state(parity) -> dict:
    return {k: parity["weights"][k].float() if k in parity["weights"] else torch.zeros(s) for k, s in parity["keys"].items()}


def test_strict_load_names_missing_unexpected_and_absent_parts(parity):
    cfg = HART_TOKENIZER_PRESETS["hart_tiny"]
    sd = full_state(parity)
    sd.pop("vae.decoder.up.2.attn.1.qkv.weight")
    sd["vae.decoder.up.2.attn.1.to_qkv.weight"] = torch.zeros(3)
    with pytest.raises(CheckpointMismatch) as e:
        load_tokenizer_state(*build_hart_tokenizer(cfg), sd, "tokenizer/model.safetensors")
    msg = str(e.value)
    assert "decoder.up.2.attn.1.qkv.weight" in msg and "decoder.up.2.attn.1.to_qkv.weight" in msg
    assert "tokenizer/model.safetensors" in msg
    # without the discriminator (or encoder) it is not a released HART tokenizer file: refused, by name
    for part in ("disc.", "vae.encoder."):
        with pytest.raises(CheckpointMismatch, match=part.replace(".", r"\.")):
            load_tokenizer_state(*build_hart_tokenizer(cfg), {k: v for k, v in full_state(parity).items()
                                                              if not k.startswith(part)}, "x")
    # a codebook of another size is named too (the quantizer's strict load)
    sd = full_state(parity)
    sd["vae.quantize.embedding.weight"] = torch.zeros(4096, 8)
    with pytest.raises(CheckpointMismatch, match="embedding.weight"):
        load_tokenizer_state(*build_hart_tokenizer(cfg), sd, "x")


def test_double_decoder_drops_the_second_decoder_by_name(parity):
    cfg = dataclasses.replace(HART_TOKENIZER_PRESETS["hart_tiny"], double_decoder=True)
    assert dropped_prefixes(cfg)[-2:] == ("vae.decoder2.", "vae.post_quant_conv2.")
    sd = full_state(parity)
    with pytest.raises(CheckpointMismatch, match="decoder2"):     # a double-decoder config needs its keys
        load_tokenizer_state(*build_hart_tokenizer(cfg), sd, "x")
    sd.update({"vae.decoder2." + k.removeprefix("vae.decoder."): v for k, v in list(sd.items()) if k.startswith("vae.decoder.")})
    sd.update({"vae.post_quant_conv2.weight": torch.zeros(8, 8, 3, 3), "vae.post_quant_conv2.bias": torch.zeros(8)})
    quant, dec = build_hart_tokenizer(cfg)
    load_tokenizer_state(quant, dec, sd, "x")
    assert torch.equal(dec.decoder.conv_out.weight, sd["vae.decoder.conv_out.weight"])   # the first decoder is used


def test_config_validation_errors():
    with pytest.raises(ConfigError, match="multiples of 32"):
        HartTokenizerConfig(ch=48, ch_mult=(1, 1))
    with pytest.raises(ConfigError, match="quant_resi"):
        HartTokenizerConfig(quant_resi=0.0)
