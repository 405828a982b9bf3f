"""End-to-end FLOPs (issue 20 item 4): the analytic counts of the VAE decoder and the text encoders
equal torch's FlopCounterMode on the modules this project builds (same convention: a multiply-add =
2, convolutions and matrix products only), and the decoder is counted once per image at the final
latent grid whatever scales a method skipped."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from varbench.engine.backbones import preset_stage_flops
from varbench.engine.backbones.hart.stage_flops import (hart_decoder_flops, HART_MAX_LENGTH, HART_SYSTEM_PROMPT_TOKENS,
                                                        hart_text_tokens, QWEN2_1P5B, qwen2_text_flops)
from varbench.engine.backbones.hart.text import HartTextEncoder
from varbench.engine.backbones.hart.tokenizer import HART_TOKENIZER_PRESETS, HartTokenizerConfig, build_hart_tokenizer
from varbench.engine.backbones.infinity.bsq_vae import BSQVAE, VAE_PRESETS, VAEConfig
from varbench.engine.backbones.infinity.stage_flops import decoder_flops
from varbench.engine.policy import NeutralPolicy
from varbench.engine.stage_flops import (FLAN_T5_XL, t5_encoder_flops, text_encoder_flops, vae_decode_flops,
                                         word_encoder_flops)
from varbench.engine.text import WordTextEncoder


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


def counted_by_op(fn) -> dict[str, int]:
    with FlopCounterMode(display=False) as fc:
        fn()
    return {str(op): n for op, n in fc.get_flop_counts()["Global"].items()}


@pytest.mark.parametrize("preset, grid", [("hart_tiny", (4, 4)), ("hart_tiny", (3, 5)),
                                          ("hart_0p7b", (64, 64)), ("hart_0p7b", (48, 80))])
def test_hart_decoder_count_equals_flop_counter(preset, grid):
    """HART's tokenizer decoder as built (hart_0p7b on the meta device: shapes only), through
    fhat_to_img (post_quant_conv + decoder + clamp). FlopCounterMode counts only the convolutions and
    the attention's two bmm products here; the GroupNorms, SiLUs, the attention's scale and softmax,
    residual adds, the upsample copy, the clamp and conv biases it does not count, and neither does the
    analytic count, so the two are equal exactly (integers, no tolerance)."""
    dev = "cpu" if preset == "hart_tiny" else "meta"
    _, dec = build_hart_tokenizer(preset, device=dev)
    z = torch.zeros(1, dec.cfg.z_channels, *grid, device=dev)
    with torch.no_grad():
        by_op = counted_by_op(lambda: dec.fhat_to_img(z))
    assert set(by_op) == {"aten.convolution", "aten.bmm"}          # nothing else it counts is left out
    assert hart_decoder_flops(HART_TOKENIZER_PRESETS[preset], grid) == sum(by_op.values())
    assert vae_decode_flops(dec, grid) == sum(by_op.values())        # dispatched on the decoder's cfg


def test_hart_decoder_count_follows_every_config_knob():
    """A decoder unlike either preset (3 levels of unequal widths, 1 res block, a 1x1 post_quant_conv,
    an odd latent) is still counted exactly: the walk follows the config, not the presets' shape."""
    cfg = HartTokenizerConfig(vocab_size=16, z_channels=4, ch=32, ch_mult=(1, 2, 3), num_res_blocks=1,
                              quant_conv_ks=1, v_patch_nums=(1, 2))
    _, dec = build_hart_tokenizer(cfg)
    z = torch.zeros(1, 4, 3, 5)
    with torch.no_grad():
        assert hart_decoder_flops(cfg, (3, 5)) == counted(lambda: dec.fhat_to_img(z))


def test_hart_0p7b_decode_at_1024():
    """The 0.7B decoder on its 64x64 latent (1024²) by hand, independent of the layer walk: at 64² the
    640-wide conv_in, 5 ResNets (mid 2 + top level 3) and 4 attention blocks; then per level the 3x3
    convs of its 3 ResNets (+ a 1x1 shortcut on a width change) and the upsample conv at the new size;
    conv_out at 1024². ~6.46 TFLOPs, 1.5x fewer than the Infinity-2B decoder's 9.85."""
    conv = lambda ci, co, k, s: 2 * ci * co * k * k * s * s                                    # noqa: E731
    res = lambda ci, co, s: conv(ci, co, 3, s) + conv(co, co, 3, s) + (conv(ci, co, 1, s) if ci != co else 0)  # noqa: E731
    n = 64 * 64
    attn = conv(640, 4 * 640, 1, 64) + 4 * n * n * 640        # qkv (3C) + proj_out (C) 1x1, scores + sum
    want = conv(32, 32, 3, 64) + conv(32, 640, 3, 64) + 5 * res(640, 640, 64) + 4 * attn
    want += conv(640, 640, 3, 128)                                                     # top level's upsample
    want += res(640, 320, 128) + 2 * res(320, 320, 128) + conv(320, 320, 3, 256)      # level 3 (ch 320)
    want += 3 * res(320, 320, 256) + conv(320, 320, 3, 512)                           # level 2 (ch 320)
    want += res(320, 160, 512) + 2 * res(160, 160, 512) + conv(160, 160, 3, 1024)     # level 1 (ch 160)
    want += 3 * res(160, 160, 1024) + conv(160, 3, 3, 1024)                           # level 0, conv_out
    got = hart_decoder_flops(HART_TOKENIZER_PRESETS["hart_0p7b"], (64, 64))
    assert got == want
    assert got / 1e12 == pytest.approx(6.460, abs=1e-3)


def test_hart_decoder_refuses_an_empty_grid():
    with pytest.raises(ValueError, match="must be positive"):
        hart_decoder_flops(HART_TOKENIZER_PRESETS["hart_tiny"], (4, 0))


@pytest.mark.runtime
def test_hart_runtime_stages_count_its_decode():
    """stage_flops on the HART runtime: its decode is the tokenizer decoder's count at f_hat's grid,
    equal to what FlopCounterMode counts for one image's rt.decode (which adds only uncounted
    elementwise work: the clamp and the uint8 map)."""
    from varbench.engine.stage_flops import stage_flops
    from varbench.testing.tiny import tiny_hart_runtime

    rt = tiny_hart_runtime(seed=0)
    prompts = ["a red circle", "a blue square"]
    out = rt.generate(prompts, [0, 1], cfg=4.5)
    grid = tuple(out.summed_codes.shape[-2:])
    stages = stage_flops(rt, prompts, grid)
    measured = counted(lambda: rt.decode(out.summed_codes[:1]))
    assert [s["vae_decode"] for s in stages] == [hart_decoder_flops(rt.vae.cfg, grid)] * 2 == [measured] * 2
    assert measured > 0 and all(s["text_encoder"] is not None for s in stages)   # the tiny runtime's word encoder


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
    assert preset_stage_flops("infinity_2b", 77)["text_encoder"] == t5_encoder_flops(FLAN_T5_XL, 77)


def test_hart_preset_stages_use_the_released_parts():
    """hart_0p7b: the released Qwen2 text model over the system prompt's lower-bound length + the 300 padded
    prompt tokens (test_released_qwen2_text_encoder_count checks that count against FlopCounterMode), and the
    tokenizer decoder on f_hat, whose grid is the last stage's (64x64 at 1024²: no patchify on HART)."""
    s = preset_stage_flops("hart_0p7b")
    assert s["text_encoder"] == qwen2_text_flops(QWEN2_1P5B, HART_SYSTEM_PROMPT_TOKENS + HART_MAX_LENGTH)
    assert preset_stage_flops("hart_0p7b", HART_MAX_LENGTH)["text_encoder"] == qwen2_text_flops(QWEN2_1P5B, HART_MAX_LENGTH)
    assert s["vae_decode"]((64, 64)) == hart_decoder_flops(HART_TOKENIZER_PRESETS["hart_0p7b"], (64, 64))
    assert s["vae_decode"]((64, 64)) != s["vae_decode"]((32, 32))


@pytest.mark.runtime
def test_the_decode_is_once_per_image_at_the_full_grid_even_when_scales_are_skipped():
    """The runtime's summed codes (what it decodes) keep the final grid under skip_last, and the job's
    trace rows carry the same decode count for the baseline and the skipping method."""
    from varbench.engine.stage_flops import stage_flops
    from varbench.harness.traces import trace_row
    from varbench.policies import build_policy
    from varbench.testing.tiny import tiny_runtime

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


# -- HART's Qwen2 text encoder ----------------------------------------------------------------
QWEN2_TINY = Path(__file__).resolve().parents[1] / "fixtures" / "hart_tokenizer" / "qwen2_tiny"


def rows_through(enc: HartTextEncoder, fn) -> list[tuple[int, int]]:
    """(batch, positions) of every call into the encoder's Qwen2 model while ``fn`` runs: what actually went
    through it, independent of how the count works it out."""
    seen = []
    hook = enc.model.register_forward_pre_hook(lambda m, a, kw: seen.append(tuple(kw["input_ids"].shape)),
                                               with_kwargs=True)
    try:
        fn()
    finally:
        hook.remove()
    return seen


@pytest.mark.parametrize("use_system_prompt", [True, False])
def test_qwen2_count_equals_flop_counter_through_the_hart_encoder(use_system_prompt):
    """The tiny Qwen2 folder through HartTextEncoder.forward, two prompts of different lengths: each row is the
    system prompt + the prompt padded to 300, and FlopCounterMode counts exactly the analytic number (integers,
    no tolerance). Under the MATH SDPA backend: CPU's fused SDPA kernel has no FlopCounterMode formula (it would
    count the attention as 0, checked below); the math path runs the two products as bmm, the same n x n
    products that the formula for the CUDA kernels counts. What it counts is addmm (q/k/v: the bias is free),
    mm (o, gate, up, down) and bmm (scores, weighted sum): nothing else, so the norms, SiLU, RoPE, softmax and
    the final norm are uncounted on both sides."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    enc = HartTextEncoder(QWEN2_TINY, use_system_prompt=use_system_prompt)
    prompts = ["a cat", "an astronaut sitting in a diner, eating fries, cinematic, analog film"]
    n = hart_text_tokens(enc)
    assert n == (len(enc.system_ids) if use_system_prompt else 0) + 300
    assert rows_through(enc, lambda: enc(prompts)) == [(2, n)]            # one pass, every row the same length
    with sdpa_kernel(SDPBackend.MATH):
        by_op = counted_by_op(lambda: enc(prompts))
    assert set(by_op) == {"aten.addmm", "aten.mm", "aten.bmm"}
    cfg = enc.model.config.get_text_config()
    one = qwen2_text_flops(cfg, n)
    assert 2 * one == sum(by_op.values())
    hd = cfg.hidden_size // cfg.num_attention_heads                        # the fixture sets no head_dim
    assert by_op["aten.bmm"] == 2 * cfg.num_hidden_layers * 2 * 2 * n * n * cfg.num_attention_heads * hd
    assert text_encoder_flops(enc, prompts) == [one, one]
    # CPU's fused kernel: FlopCounterMode sees only the projections and the MLP
    assert counted(lambda: enc(prompts)) == 2 * one - by_op["aten.bmm"]


def test_qwen2_vl_folder_counts_the_language_model_only(tmp_path):
    """A qwen2_vl folder (AutoModel -> Qwen2VLModel, width in text_config, multimodal RoPE): with no image its
    vision tower does not run, and the pass costs the text config's count exactly."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from transformers import AutoModel, Qwen2VLConfig

    q = json.loads((QWEN2_TINY / "config.json").read_text())
    text = {k: q[k] for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                              "num_attention_heads", "num_key_value_heads", "pad_token_id")}
    text["rope_parameters"] = dict(q["rope_parameters"], mrope_section=[1, 1, 2], type="mrope")
    torch.manual_seed(0)
    AutoModel.from_config(Qwen2VLConfig(text_config=text, vision_config=dict(
        depth=1, embed_dim=16, hidden_size=32, num_heads=2, patch_size=14, spatial_merge_size=2,
        temporal_patch_size=2))).save_pretrained(tmp_path)
    for f in QWEN2_TINY.glob("tokenizer*"):
        shutil.copy(f, tmp_path / f.name)
    enc = HartTextEncoder(tmp_path)
    assert type(enc.model).__name__ == "Qwen2VLModel"
    ran = []
    hook = enc.model.visual.register_forward_hook(lambda *a: ran.append(1))
    with sdpa_kernel(SDPBackend.MATH):
        got = counted(lambda: enc(["a cat"]))
    hook.remove()
    assert not ran
    assert got == qwen2_text_flops(enc.model.config.get_text_config(), hart_text_tokens(enc)) == \
        text_encoder_flops(enc, ["a cat"])[0]


def test_qwen2_count_follows_head_dim_and_gqa():
    """A shape unlike the fixture (head_dim set apart from hidden / heads, 3 query heads per KV head, 3 layers),
    a random model with a padded row: FlopCounterMode on the model's forward equals the count."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from transformers import Qwen2Config, Qwen2Model

    cfg = Qwen2Config(vocab_size=64, hidden_size=48, intermediate_size=80, num_hidden_layers=3,
                      num_attention_heads=6, num_key_value_heads=2, head_dim=12)
    torch.manual_seed(0)
    model = Qwen2Model(cfg).eval()
    ids = torch.randint(1, 64, (1, 37))
    mask = torch.ones_like(ids)
    mask[:, 30:] = 0                                   # pads are masked, not skipped: the same products run
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH):
        got = counted(lambda: model(input_ids=ids, attention_mask=mask, use_cache=False))
    assert qwen2_text_flops(cfg, 37) == got
    assert qwen2_text_flops(cfg, 37) != qwen2_text_flops(dict(cfg.to_dict(), head_dim=None), 37)   # head_dim is read


def test_released_qwen2_text_encoder_count():
    """HART's released text model (QWEN2_1P5B: Qwen2-1.5B's published config.json; hidden 1536 = hart_0p7b's
    context_dim) built on the meta device (shapes only), one pass over S + 300 positions: equal to FlopCounterMode.
    S, the system prompt's length under Qwen2's tokenizer, is not knowable here (the tokenizer is not in the repo);
    its pre-tokenizer splits the system prompt into 131 pieces, each one token or more, so S = 131 is the lower
    bound used here. A record counts the loaded tokenizer's S (hart_text_tokens)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from transformers import Qwen2Config, Qwen2Model

    from varbench.engine.backbones.hart.model import HART_PRESETS

    assert QWEN2_1P5B["hidden_size"] == HART_PRESETS["hart_0p7b"].context_dim
    assert HART_MAX_LENGTH == HART_PRESETS["hart_0p7b"].context_token
    assert HART_SYSTEM_PROMPT_TOKENS == 131   # the lower bound this docstring derives
    n = HART_SYSTEM_PROMPT_TOKENS + HART_MAX_LENGTH
    cfg = Qwen2Config(vocab_size=151936, **QWEN2_1P5B)
    with torch.device("meta"):
        model = Qwen2Model(cfg).eval()
        ids = torch.zeros(1, n, dtype=torch.long)
        # a ready 4-D mask: transformers' 2-D mask handling reads values (.item()), which meta tensors have not
        mask = torch.ones(1, 1, n, n, dtype=torch.bool)
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH):
        got = counted(lambda: model(input_ids=ids, attention_mask=mask, use_cache=False))
    one = qwen2_text_flops(QWEN2_1P5B, n)
    assert one == qwen2_text_flops(cfg, n) == got
    print(f"HART Qwen2 text encoder (released config) at {n} tokens: {one / 1e12:.4f} TFLOPs per prompt; "
          f"+{(qwen2_text_flops(QWEN2_1P5B, n + 1) - one) / 1e9:.2f} GFLOPs per further system-prompt token; "
          f"{qwen2_text_flops(QWEN2_1P5B, HART_MAX_LENGTH) / 1e12:.4f} without the system prompt")
    assert one / 1e12 == pytest.approx(1.1613, abs=1e-4)      # the number in stage_flops' docstring


class PerImagePolicy(NeutralPolicy):
    """A neutral policy that asks for image-by-image runs (as SkipVAR does), to reach that path."""
    per_image_decisions = True


@pytest.mark.runtime
@pytest.mark.parametrize("policy", [None, PerImagePolicy()], ids=["batched", "image_by_image"])
@pytest.mark.parametrize("negative", [None, "blurry"])
def test_hart_runtime_stage_counts_what_its_qwen2_encoder_ran(policy, negative):
    """stage_flops on a HartRuntime with the Qwen2 encoder: the per-image text counts add up to the passes the
    runtime actually sent through the model (its prompts, plus the negative prompt once per generation on either
    path; the unconditional rows encode nothing), and the end-to-end count is filled in."""
    from varbench.engine.stage_flops import stage_flops
    from varbench.harness.traces import trace_row
    from varbench.testing.tiny import tiny_hart_runtime

    enc = HartTextEncoder(QWEN2_TINY)
    rt = tiny_hart_runtime(seed=0, context_dim=enc.hidden_size, context_token=enc.max_length)
    rt.text_encoder = enc
    prompts = ["a red circle", "a blue square on a green mat"]
    outs = []
    rows = rows_through(enc, lambda: outs.append(rt.generate(prompts, [0, 1], policy, cfg=4.5,
                                                             negative_prompt=negative)))
    n = hart_text_tokens(enc)
    assert {r[1] for r in rows} == {n}
    assert sum(r[0] for r in rows) == len(prompts) + (1 if negative else 0)
    out = outs[0]
    stages = stage_flops(rt, prompts, out.summed_codes.shape[-2:], negative)
    one = qwen2_text_flops(enc.model.config.get_text_config(), n)
    # the negative's share is one / 2 per image: the sum is exact up to float rounding of that split
    assert sum(s["text_encoder"] for s in stages) == pytest.approx(sum(r[0] for r in rows) * one, rel=1e-12)
    for b in range(len(prompts)):
        f = trace_row(out, b, b, 0, "baseline", stages[b])["work"]["flops"]
        assert f["end_to_end"] == f["total"] + f["text_encoder"] + f["vae_decode"] > one


def test_hart_runtime_stage_counts_with_the_word_encoder():
    """The random-weights HART runtime's word encoder (no layers: a lookup) counts 0, with or without a negative
    prompt, and the end-to-end count is still filled in (the decode only)."""
    from varbench.engine.stage_flops import stage_flops
    from varbench.testing.tiny import tiny_hart_runtime

    rt = tiny_hart_runtime(seed=0)
    assert isinstance(rt.text_encoder, WordTextEncoder) and not rt.text_encoder.context
    out = rt.generate(["a red circle"], [0], cfg=4.5, negative_prompt="blurry")
    stages = stage_flops(rt, ["a red circle"], out.summed_codes.shape[-2:], "blurry")
    assert stages == [{"text_encoder": 0.0, "vae_decode": hart_decoder_flops(rt.vae.cfg, out.summed_codes.shape[-2:])}]
