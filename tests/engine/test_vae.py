"""Tests for varbench.engine.backbones.infinity.bsq_vae (Infinity's BSQ-VAE) and the checkpoint key fixtures.

Fixtures and how they were produced (generator scripts live outside the repo because they import
upstream code; upstream = FoundationVision/Infinity at commit 4c27bbb54a99):

* tests/fixtures/keys/vae_d32reg.txt, vae_d56_f8_14_patchify.txt: `state_dict()` keys and shapes of
  upstream `bsq_vae/vae.py::vae_model(...)` built on the meta device with the exact constructor
  arguments of `tools/run_infinity.py::load_visual_tokenizer` (header lines say which).
* tests/fixtures/keys/infinity_2b.txt, infinity_8b.txt: the same for upstream
  `infinity/models/infinity.py::Infinity` with the kwargs of `load_transformer`/`load_infinity`
  (flash_attn stubbed, meta device). Used by the transformer's own tests; checked here against the
  published checkpoint sizes.
* tests/fixtures/vae_parity_small.pt: upstream numerics on a small VAE. Script
  /work/scratch/vae/make_parity_fixture.py builds upstream `vae_model` with base_ch=24,
  num_res_blocks=1, ch_mult=[2,1,1], patch 4, codebook_dim 8 (schedule "dynamic"), random weights
  (default init + 0.1*N(0,1), seed 0, rounded to fp16-representable values and stored as fp16, so
  upcasting restores them exactly), and two 32x48 images in [-1, 1]. It stores: the encoder latent;
  the per-scale bits for the schedule (1,1),(2,3),(3,4),(5,7),(8,12) from BOTH upstream
  `AutoEncoder.encode` (MultiScaleBSQ.forward) and `BitwiseSelfCorrection.flip_requant` without
  flips (they agree); the flip_requant next-scale transformer inputs; the summed codes built the
  way `Infinity.autoregressive_infer_cfg` builds them (all scales, and stopped after 3 scales);
  the decoded images (clamped) and the raw decoder output.
"""
from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from varbench.engine.backbones.infinity.bsq_vae import (
    BSQVAE,
    VAE_PRESETS,
    CheckpointMismatchError,
    VAEConfig,
    VAEWeightsNotFoundError,
    expected_bit_mask,
    load_vae,
    load_vae_state_dict,
    normalize_scale_schedule,
    patchify_bits,
    patchify_codes,
    unpatchify_bits,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
KEYS = FIXTURES / "keys"


def read_key_fixture(path: Path) -> list[tuple[str, tuple[int, ...]]]:
    """Parse a "<key>\\t<shape>" fixture, skipping '#' header lines."""
    rows = []
    for line in path.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        key, shape = line.split("\t")
        rows.append((key, tuple(ast.literal_eval(shape))))
    return rows


def meta_model(preset: str) -> BSQVAE:
    with torch.device("meta"):
        return BSQVAE(preset)


# ---------------------------------------------------------------------------------------------------
# (a) key/shape compatibility with the released checkpoints
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("preset", ["d32reg", "d56_f8_14_patchify"])
def test_state_dict_matches_released_layout(preset):
    expected = read_key_fixture(KEYS / f"vae_{preset}.txt")
    ours = [(k, tuple(v.shape)) for k, v in meta_model(preset).state_dict().items()]
    assert set(ours) == set(expected), (
        f"missing: {sorted(set(expected) - set(ours))[:10]} unexpected: {sorted(set(ours) - set(expected))[:10]}"
    )
    assert ours == expected  # same order too, so a diff of the two lists is readable


def test_fixture_headers_say_where_they_come_from():
    for name in ["vae_d32reg", "vae_d56_f8_14_patchify", "infinity_2b", "infinity_8b"]:
        text = (KEYS / f"{name}.txt").read_text()
        assert "4c27bbb54a99" in text and text.startswith("#"), name


@pytest.mark.parametrize("name,published_gb", [("infinity_2b", 8.82), ("infinity_8b", 33.5)])
def test_transformer_fixture_sizes_match_published_fp32_files(name, published_gb):
    """The released transformer files are fp32 state dicts of exactly these tensors.

    Published sizes (Hugging Face file pages, noted in shared/reference/infinity_fastvar.md §1.7):
    infinity_2b_reg.pth 8.82 GB; infinity_8b_weights/ four shards 8.22+8.22+8.22+8.83 = 33.5 GB.
    4 bytes x elements must land within 0.5% (pickle/safetensors headers are tiny); a missing block or
    a wrong width would be off by >1%.
    """
    rows = read_key_fixture(KEYS / f"{name}.txt")
    n = sum(math.prod(s) for _, s in rows)
    assert abs(4 * n / 1e9 - published_gb) / published_gb < 0.005
    # The layout facts the sampler relies on (2 logits per bit; 8B sees 4*14 = 56 bits per token).
    shapes = dict(rows)
    bits = 32 if name == "infinity_2b" else 56
    assert shapes["head.weight"][0] == 2 * bits and shapes["word_embed.weight"][1] == bits


# ---------------------------------------------------------------------------------------------------
# (b) strict loading
# ---------------------------------------------------------------------------------------------------


def toy_state_dict() -> dict:
    torch.manual_seed(0)
    return {k: v.clone() for k, v in BSQVAE("toy").state_dict().items()}


def test_loader_reports_missing_and_unexpected_keys_in_one_error():
    sd = toy_state_dict()
    sd.pop("decoder.conv_out.conv.bias")
    sd["encoder.extra_layer.weight"] = torch.zeros(3)
    with pytest.raises(CheckpointMismatchError) as err:
        load_vae_state_dict(BSQVAE("toy"), sd, source="my.pth")
    msg = str(err.value)
    assert "decoder.conv_out.conv.bias" in msg and "encoder.extra_layer.weight" in msg
    assert "1 missing" in msg and "1 unexpected" in msg and "my.pth" in msg


def test_loader_reports_shape_mismatch():
    sd = toy_state_dict()
    sd["encoder.conv_in.conv.weight"] = torch.zeros(1, 3, 3, 3)
    with pytest.raises(CheckpointMismatchError, match="encoder.conv_in.conv.weight"):
        load_vae_state_dict(BSQVAE("toy"), sd)


def test_loader_lists_at_most_20_names_per_kind_with_counts():
    sd = {"junk.%d" % i: torch.zeros(1) for i in range(30)}
    with pytest.raises(CheckpointMismatchError) as err:
        load_vae_state_dict(BSQVAE("toy"), sd)
    msg = str(err.value)
    assert "unexpected keys (30)" in msg and "... and 10 more" in msg and "junk.29" not in msg


def test_wrapped_under_vae_loads_from_file(tmp_path):
    sd = toy_state_dict()
    path = tmp_path / "toy_vae.pth"
    torch.save({"vae": sd, "optimizer": {"step": 3}}, path)
    model = load_vae(path, "toy")
    for k, v in model.state_dict().items():
        assert torch.equal(v, sd[k]), k
    assert not model.training and not any(p.requires_grad for p in model.parameters())


def test_unwrapped_spelling_and_missing_mask_are_accepted():
    """Upstream's load_cnn also accepts keys without the `.conv`/`.norm` level, and the bit mask is
    a function of d; both are normalised, everything else must match."""
    sd = toy_state_dict()
    legacy = {}
    for k, v in sd.items():
        if "mask" in k:
            continue
        legacy[k.replace(".conv.weight", ".weight").replace(".conv.bias", ".bias").replace(".norm.weight", ".weight").replace(".norm.bias", ".bias")] = v
    model = load_vae_state_dict(BSQVAE("toy"), legacy)
    assert torch.equal(model.state_dict()["decoder.conv_out.conv.weight"], sd["decoder.conv_out.conv.weight"])
    assert torch.equal(model.quantizer.lfq.mask, expected_bit_mask(16))


def test_wrong_bit_mask_is_rejected():
    sd = toy_state_dict()
    sd["quantizer.lfq.mask"] = sd["quantizer.lfq.mask"].flip(0)
    with pytest.raises(CheckpointMismatchError, match="mask"):
        load_vae_state_dict(BSQVAE("toy"), sd)


def test_missing_file_error_names_file_path_and_source(tmp_path):
    with pytest.raises(VAEWeightsNotFoundError) as err:
        load_vae(tmp_path / "nowhere" / "infinity_vae_d32reg.pth", "d32reg")
    msg = str(err.value)
    assert "infinity_vae_d32reg.pth" in msg and str(tmp_path) in msg and "huggingface.co/FoundationVision/Infinity" in msg


def test_unknown_preset_and_bad_config_fail_with_the_fix():
    with pytest.raises(ValueError, match="toy"):
        BSQVAE("d33")
    with pytest.raises(ValueError, match="power of two"):
        VAEConfig(patch_size=12)
    with pytest.raises(ValueError, match="stride-2 stages"):
        VAEConfig(patch_size=16, ch_mult=(1, 2, 4))
    with pytest.raises(ValueError, match="32 nor 24"):
        VAEConfig(base_ch=40)


@pytest.mark.requires_weights
@pytest.mark.parametrize("preset", ["d32reg", "d56_f8_14_patchify"])
def test_released_checkpoint_loads_strictly(preset):
    import os

    from varbench.engine.backbones.infinity.bsq_vae import PRESET_FILES

    root = os.environ.get("VARBENCH_WEIGHTS")
    path = Path(root or ".") / PRESET_FILES[preset]
    if not path.is_file():
        pytest.skip(f"{path} not present (set VARBENCH_WEIGHTS)")
    model = load_vae(path, preset)
    assert model.codebook_dim == VAE_PRESETS[preset].codebook_dim


# ---------------------------------------------------------------------------------------------------
# (c) shape contracts
# ---------------------------------------------------------------------------------------------------


def test_toy_bits_codes_decode_contract():
    torch.manual_seed(0)
    vae = BSQVAE("toy").eval()
    images = torch.rand(2, 3, 32, 48) * 2 - 1
    schedule = [(1, 1, 1), (1, 2, 3), (1, 4, 6), (1, 8, 12)]  # Infinity's (t, h, w) form
    with torch.no_grad():
        bits = vae.encode_to_bits(images, schedule)
        assert [tuple(b.shape) for b in bits] == [(2, h, w, 16) for _, h, w in schedule]
        assert all(b.dtype == torch.int64 and set(b.unique().tolist()) <= {0, 1} for b in bits)
        codes = vae.bits_to_codes(bits[1])
        assert codes.shape == (2, 16, 2, 3)
        torch.testing.assert_close(codes.norm(dim=1), torch.ones(2, 2, 3))
        assert torch.allclose(codes.abs(), torch.full_like(codes, 1 / 4))  # +-1/sqrt(16)
        summed = vae.bits_to_summed_codes(bits)
        assert summed.shape == (2, 16, 8, 12)
        image = vae.decode(summed)
        assert image.shape == images.shape and image.min() >= -1 and image.max() <= 1


def test_quantising_codes_returns_their_bits():
    """bits -> codes -> BSQ gives the same bits (codes lie exactly on the quantiser's grid)."""
    vae = BSQVAE("toy")
    bits = torch.randint(0, 2, (2, 3, 5, 16))
    q, again = vae.lfq(vae.bits_to_codes(bits).unsqueeze(2))
    assert torch.equal(again[:, 0], bits)


def test_bitwise_self_correction_flips_inputs_and_relabels_later_scales():
    """Infinity's BSC (upstream BitwiseSelfCorrection.flip_requant): strength 0 is plain residual
    quantisation; otherwise inputs differ from labels only on the flipped scales, and each later
    label is the quantised residual left by the *flipped* earlier codes (so it corrects them)."""
    torch.manual_seed(0)
    vae = BSQVAE("toy").eval()
    sched = [(1, 1), (2, 2), (4, 4), (8, 8)]
    latent = torch.randn(3, 16, 8, 8)
    plain, _ = vae.quantize_latent(latent, sched)
    labels, inputs = vae.self_correction_bits(latent, sched, 0.0, 4)
    assert all(torch.equal(a, b) and torch.equal(a, c) for a, b, c in zip(plain, labels, inputs))

    gen = torch.Generator().manual_seed(1)
    labels, inputs = vae.self_correction_bits(latent, sched, 0.5, 2, gen)  # flip scales 0 and 1 only
    assert torch.equal(labels[0], plain[0])                       # nothing before scale 0 to correct
    flipped = [(l != i).float().mean().item() for l, i in zip(labels, inputs)]
    assert all(f <= 0.5 + 0.1 for f in flipped[:2]) and flipped[2:] == [0.0, 0.0]
    # relabelling: scale 2's label is the residual left by the flipped codes of scales 0-1
    summed = vae.bits_to_summed_codes(inputs[:2], size=(8, 8))
    expect = vae.lfq(F.interpolate((latent - summed).unsqueeze(2), size=(1, 4, 4), mode="area"))[1][:, 0]
    assert torch.equal(labels[2], expect)
    if not torch.equal(inputs[1], plain[1]) or not torch.equal(inputs[0], plain[0]):
        assert not torch.equal(labels[2], plain[2])               # a flip upstream changes what follows


@pytest.mark.parametrize("preset,grid", [("d32reg", (4, 6)), ("d56_f8_14_patchify", (6, 4))])
def test_released_presets_contract_on_meta(preset, grid):
    vae = meta_model(preset)
    d, p = VAE_PRESETS[preset].codebook_dim, VAE_PRESETS[preset].patch_size
    bits = torch.zeros(1, *grid, d, dtype=torch.long, device="meta")
    codes = vae.bits_to_codes(bits)
    assert codes.shape == (1, d, *grid)
    image = vae.decode(vae.upsample_codes(codes, (2 * grid[0], 2 * grid[1])))
    assert image.shape == (1, 3, 2 * grid[0] * p, 2 * grid[1] * p)
    latent = vae.encode(torch.zeros(1, 3, grid[0] * p, grid[1] * p, device="meta"))
    assert latent.shape == (1, d, *grid)


def test_bits_to_codes_rejects_token_bits_of_the_8b_with_a_hint():
    vae = meta_model("d56_f8_14_patchify")
    with pytest.raises(ValueError, match="unpatchify_bits"):
        vae.bits_to_codes(torch.zeros(1, 2, 2, 56, device="meta"))


def test_schedule_and_image_validation():
    assert normalize_scale_schedule([(1, 2, 3), (4, 6)]) == [(2, 3), (4, 6)]
    with pytest.raises(ValueError, match="t=1"):
        normalize_scale_schedule([(2, 4, 4)])
    vae = BSQVAE("toy")
    with pytest.raises(ValueError, match="multiple of the VAE patch size 4"):
        vae.encode(torch.zeros(1, 3, 30, 32))
    with pytest.raises(ValueError, match="must end at the latent size"):
        vae.quantize_latent(torch.zeros(1, 16, 8, 8), [(1, 1), (4, 4)])


# ---------------------------------------------------------------------------------------------------
# 8B spatial patchify
# ---------------------------------------------------------------------------------------------------


def test_unpatchify_bits_channel_order():
    """Token (y, x) channel c*4 + i*2 + j  <->  VAE cell (2y+i, 2x+j) bit c (pixel_shuffle order)."""
    B, h, w, d = 2, 3, 4, 14
    tok = torch.randint(0, 2, (B, h, w, 4 * d))
    vae_bits = unpatchify_bits(tok)
    assert vae_bits.shape == (B, 2 * h, 2 * w, d)
    for y in range(h):
        for x in range(w):
            for i in range(2):
                for j in range(2):
                    for c in (0, 5, d - 1):
                        assert vae_bits[1, 2 * y + i, 2 * x + j, c] == tok[1, y, x, c * 4 + i * 2 + j]
    assert torch.equal(patchify_bits(vae_bits), tok)
    codes = torch.randn(B, d, 2 * h, 2 * w)
    assert torch.equal(patchify_codes(codes), patchify_bits(codes.permute(0, 2, 3, 1)).permute(0, 3, 1, 2))


# ---------------------------------------------------------------------------------------------------
# (d) numeric parity with upstream
# ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def parity():
    ref = torch.load(FIXTURES / "vae_parity_small.pt", map_location="cpu", weights_only=True)
    cfg = ref["config"]
    vae = BSQVAE(VAEConfig(**cfg)).eval()
    sd = {k: (v.float() if v.is_floating_point() else v) for k, v in ref["state_dict"].items()}
    load_vae_state_dict(vae, sd, source="vae_parity_small.pt")
    return vae, ref


def test_parity_latent_and_bits(parity):
    vae, ref = parity
    with torch.no_grad():
        latent = vae.encode(ref["images"])
        torch.testing.assert_close(latent, ref["latent"], rtol=1e-5, atol=1e-5)
        bits = vae.encode_to_bits(ref["images"], ref["scale_schedule"])
    for k, (b, up_fwd, up_fr) in enumerate(zip(bits, ref["bits_quantizer_forward"], ref["bits_flip_requant"])):
        assert torch.equal(b, up_fr.long()), f"scale {k}: bits differ from upstream flip_requant"
        assert torch.equal(b, up_fwd.long()), f"scale {k}: bits differ from upstream MultiScaleBSQ.forward"


def test_parity_codes_and_decode(parity):
    vae, ref = parity
    bits = [b.long() for b in ref["bits_flip_requant"]]
    final = tuple(ref["scale_schedule"][-1][1:])
    with torch.no_grad():
        summed = vae.bits_to_summed_codes(bits)
        torch.testing.assert_close(summed, ref["summed_codes"], rtol=0, atol=1e-6)
        torch.testing.assert_close(vae.decode(summed), ref["decoded"], rtol=0, atol=1e-5)
        torch.testing.assert_close(vae.decoder(summed), ref["decoder_raw"], rtol=1e-5, atol=1e-5)
        early = vae.bits_to_summed_codes(bits[:3], size=final)  # Infinity stopped after 3 scales
        torch.testing.assert_close(early, ref["summed_codes_trunk3"], rtol=0, atol=1e-6)
        torch.testing.assert_close(vae.decode(early), ref["decoded_trunk3"], rtol=0, atol=1e-5)
        torch.testing.assert_close(vae.decode(ref["latent"]), ref["decoded_from_latent"], rtol=0, atol=1e-5)


def test_parity_next_scale_inputs(parity):
    """The transformer's input for scale k+1 is the running code sum resized (trilinear) to that
    scale's grid, flattened to (B, h*w, d); `upsample_codes` must reproduce upstream for both
    growing and shrinking."""
    vae, ref = parity
    sched = normalize_scale_schedule(ref["scale_schedule"])
    bits = [b.long() for b in ref["bits_flip_requant"]]
    inputs, running = [], 0
    for k, b in enumerate(bits[:-1]):
        running = running + vae.upsample_codes(vae.bits_to_codes(b), sched[-1])
        nxt = vae.upsample_codes(running, sched[k + 1])
        inputs.append(nxt.flatten(2).transpose(1, 2))
    torch.testing.assert_close(torch.cat(inputs, 1), ref["next_scale_inputs"], rtol=0, atol=1e-6)
