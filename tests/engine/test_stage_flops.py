"""End-to-end FLOPs (issue 20 item 4): the analytic counts of the VAE decoder and the text encoders
equal torch's FlopCounterMode on the modules this project builds (same convention: a multiply-add =
2, convolutions and matrix products only), and the decoder is counted once per image at the final
latent grid whatever scales a method skipped."""
from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from varbench.engine.models.bsq_vae import BSQVAE, VAE_PRESETS, VAEConfig
from varbench.engine.models.text import WordTextEncoder
from varbench.engine.stage_flops import (FLAN_T5_XL, decoder_flops, preset_stage_flops, t5_encoder_flops,
                                  text_encoder_flops, word_encoder_flops)


def counted(fn) -> int:
    with FlopCounterMode(display=False) as fc:
        fn()
    return fc.get_total_flops()


@pytest.mark.parametrize("preset, grid", [("toy", (8, 8)), ("toy", (5, 7)), ("d32reg", (64, 64)), ("d32reg", (48, 80)),
                                          ("d56_f8_14_patchify", (128, 128))])
def test_decoder_count_equals_flop_counter(preset, grid):
    """Every conv of the decoder actually built, at the grid: the released presets on the meta
    device (no memory, no weights), the toy one for real."""
    dev = "cpu" if preset == "toy" else "meta"
    with torch.device(dev):
        vae = BSQVAE(preset)
        z = torch.zeros(1, vae.codebook_dim, *grid)
    assert decoder_flops(VAE_PRESETS[preset], grid) == counted(lambda: vae.decoder(z))


def test_decoder_count_follows_every_config_knob():
    """A decoder unlike any preset (extra stage with no upsample, 3 res blocks, 24-group widths,
    shortcuts on width changes) is still counted exactly."""
    cfg = VAEConfig(codebook_dim=8, patch_size=4, base_ch=24, ch_mult=(1, 2, 3, 3), num_res_blocks=2)
    vae = BSQVAE(cfg)
    z = torch.zeros(1, 8, 3, 5)
    assert decoder_flops(cfg, (3, 5)) == counted(lambda: vae.decoder(z))


def test_decoder_count_is_the_issue_number_on_2b_1024():
    """Issue 20 counted 9.85 TFLOPs for the d32reg decoder at 1024² (a 64x64 latent)."""
    assert decoder_flops(VAE_PRESETS["d32reg"], (64, 64)) / 1e12 == pytest.approx(9.848, abs=1e-3)


def test_decoder_refuses_an_empty_grid():
    with pytest.raises(ValueError, match="must be positive"):
        decoder_flops(VAE_PRESETS["toy"], (0, 4))


@pytest.mark.parametrize("gated", [True, False])
def test_t5_count_equals_flop_counter_on_a_tiny_random_encoder(gated):
    from transformers import T5Config, T5EncoderModel

    cfg = T5Config(vocab_size=64, d_model=32, d_ff=48, d_kv=8, num_heads=3, num_layers=2,
                   feed_forward_proj="gated-gelu" if gated else "relu")
    # eager attention: FlopCounterMode has no formula for CPU's fused SDPA kernel (it would count
    # the attention products as 0); the products are the same under either implementation
    cfg._attn_implementation = "eager"
    model = T5EncoderModel(cfg).eval()
    ids = torch.randint(0, 64, (1, 11))
    with torch.no_grad():
        got = counted(lambda: model(input_ids=ids, attention_mask=torch.ones_like(ids)))
    assert t5_encoder_flops(cfg, 11) == got


def test_flan_t5_xl_constant_equals_flop_counter_at_512_tokens():
    """The released encoder's shape (meta device: no weights needed) over its 512 padded positions."""
    from transformers import T5Config, T5EncoderModel

    cfg = T5Config(vocab_size=32128, d_model=FLAN_T5_XL["d_model"], d_ff=FLAN_T5_XL["d_ff"], d_kv=FLAN_T5_XL["d_kv"],
                   num_heads=FLAN_T5_XL["num_heads"], num_layers=FLAN_T5_XL["num_layers"], feed_forward_proj="gated-gelu")
    with torch.device("meta"):
        model = T5EncoderModel(cfg).eval()
        ids = torch.zeros(1, 512, dtype=torch.long)
    with torch.no_grad():   # no mask on meta (the mask only hides pads; the same products run)
        got = counted(lambda: model(input_ids=ids))
    assert t5_encoder_flops(FLAN_T5_XL, 512) == t5_encoder_flops(cfg, 512) == got


def test_word_encoder_count_equals_flop_counter():
    enc = WordTextEncoder(dim=32, vocab=["a", "red", "circle"], layers=2, heads=4).train()   # slow path: counted ops
    prompt = "a red circle left of a blue square"
    n = len(enc.ids(prompt))
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):   # matmuls FlopCounterMode counts (it has no formula for CPU's fused kernel)
        got = counted(lambda: enc([prompt]))
    assert word_encoder_flops(32, 2, 128, n) == got == text_encoder_flops(enc, [prompt])[0]
    assert text_encoder_flops(WordTextEncoder(dim=32), [prompt]) == [0.0]       # no layers: a lookup


def test_word_encoder_batch_pads_and_negative_is_shared():
    enc = WordTextEncoder(dim=16, layers=1, heads=2)
    prompts = ["a", "a red circle and a blue square"]
    lmax = len(enc.ids(prompts[1]))
    per = word_encoder_flops(16, 1, 64, lmax)
    assert text_encoder_flops(enc, prompts) == [per, per]             # both rows run the padded length
    neg = word_encoder_flops(16, 1, 64, len(enc.ids("blurry")))
    assert text_encoder_flops(enc, prompts, "blurry") == [per + neg / 2, per + neg / 2]


def test_unknown_stages_are_not_guessed():
    assert text_encoder_flops(object(), ["x"]) is None
    assert text_encoder_flops(None, ["x", "y"]) == [0.0, 0.0]          # pre-encoded text: nothing ran


def test_preset_stages_use_the_released_parts():
    s2, s8 = preset_stage_flops("infinity_2b"), preset_stage_flops("infinity_8b")
    assert s2["text_encoder"] == s8["text_encoder"] == t5_encoder_flops(FLAN_T5_XL, 512)
    assert s2["vae_decode"]((64, 64)) == decoder_flops(VAE_PRESETS["d32reg"], (64, 64))
    # 8B: the VAE grid is twice the transformer's last grid (spatial patchify)
    assert s8["vae_decode"]((64, 64)) == decoder_flops(VAE_PRESETS["d56_f8_14_patchify"], (128, 128))


def test_the_decode_is_once_per_image_at_the_full_grid_even_when_scales_are_skipped():
    """The runtime's summed codes (what it decodes) keep the final grid under skip_last, and the job's
    trace rows carry the same decode count for the baseline and the skipping method."""
    from varbench.harness.traces import trace_row
    from varbench.policies import build_policy
    from varbench.engine.stage_flops import stage_flops
    from varbench.engine.testing import tiny_runtime

    rt = tiny_runtime()
    rows = {}
    for name, knobs in (("baseline", {}), ("skip_last", {"run_scales": 5})):
        out = rt.generate(["a red circle", "a blue square"], [0, 1], build_policy(name, **knobs), pn="0.06M")
        stages = stage_flops(rt, ["a red circle", "a blue square"], out.summed_codes.shape[-2:])
        rows[name] = trace_row(out, 0, 0, 0, name, stages[0])["work"]["flops"]
        assert tuple(out.summed_codes.shape[-2:]) == tuple(out.schedule[-1])
        assert tuple(out.images.shape[1:3]) == tuple(v * rt.vae.cfg.patch_size for v in out.schedule[-1])
    b, s = rows["baseline"], rows["skip_last"]
    assert b["vae_decode"] == s["vae_decode"] == decoder_flops(rt.vae.cfg, out.schedule[-1]) > 0
    assert b["text_encoder"] == s["text_encoder"]
    assert s["total"] < b["total"]                                     # the transformer did skip work
    for r in (b, s):
        assert r["end_to_end"] == r["total"] + r["text_encoder"] + r["vae_decode"]
    assert b["end_to_end"] / s["end_to_end"] < b["total"] / s["total"]   # the shared stages dilute the ratio
