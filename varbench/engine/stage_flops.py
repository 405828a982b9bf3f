"""Analytic FLOPs of the two stages around the transformer: the text encoder and the VAE decoder.

`varbench/engine/flops.py` counts the transformer (the AR loop and its text-side projections): the part
acceleration methods change. A user waits for the whole pipeline, so records and tables also
carry an end-to-end count (transformer + text encoder + VAE decode). Same convention as flops.py
and as ``torch.utils.flop_counter.FlopCounterMode``: a multiply-add counts 2; convolutions and
matrix products only (norms, activations, residual adds, upsampling copies, softmax and biases
are O(elements), not counted). The tests check each count against FlopCounterMode exactly.

What runs, and so what is counted:
  VAE decoder   once per image, on the final latent grid, whatever the method did: a skipped scale
                only adds no codes, the summed codes (and the decode) stay at the full grid
                (``state.GenState.latent_size`` is the schedule's last grid). Every convolution
                of :class:`varbench.engine.backbones.infinity.bsq_vae.Decoder` (conv_in, mid and up ResNet blocks,
                1x1 shortcuts, upsampling convs, conv_out); the decoder has no attention (the
                released checkpoints hold no attention weights).
  HART decoder  :class:`varbench.engine.backbones.hart.tokenizer.HartImageDecoder` on the AR loop's f_hat
                (64x64 at 1024²): post_quant_conv and a VQGAN-style decoder, the same convolutions plus
                single-head attention blocks at the lowest resolution (mid, and after each ResNet of the
                lowest level: 4 with num_res_blocks=2; their 1x1 convs and two bmm products counted,
                scale and softmax not). hart_0p7b at 1024²: 6.46 TFLOPs.
  Qwen2 encoder HART's :class:`varbench.engine.backbones.hart.text.HartTextEncoder`: one pass per prompt over the
                system prompt (unpadded, S tokens) + the prompt padded to ``max_length`` (300), so every
                prompt costs the same; the language model only (a qwen2_vl folder's vision tower gets no
                image and does not run; AutoModel has no LM head). Per layer q/k/v/o (GQA: k and v
                ``num_key_value_heads`` wide), scores and weighted sum over the whole S + 300 square (the
                causal mask and the pads are hidden by the mask, not skipped: kernels given an explicit
                mask compute the square, and FlopCounterMode's SDPA formula counts the square even for a
                causal call), gate/up/down.
                Not counted: RMSNorms, SiLU, RoPE, the q/k/v biases, the final norm. The released folder
                (:data:`QWEN2_1P5B`) at S + 300 tokens: 1.16-1.19 TFLOPs per prompt for S = 131-140 (Qwen2's
                tokenizer is not in this repo: its pre-tokenizer splits the system prompt into 131 pieces,
                each one token or more; +2.77 GFLOPs per further token), 0.80 without the system prompt;
                a record uses the loaded tokenizer's S. HART's unconditional rows encode nothing (zero
                context); a negative prompt is one more pass per generation, shared by the batch's images.
  T5 encoder    flan-t5-xl over the *padded* sequence: the released pipeline and this runtime
                tokenise with ``padding="max_length"`` (512) and the encoder computes every
                position; the attention mask only hides pads. So a prompt costs the same whatever
                its length (~1.24 TFLOPs on flan-t5-xl). A negative prompt is one more encode per
                generation (encoded even with CFG off), shared by the batch's images.
  word encoder  the tiny/toy encoder's transformer layers over the batch's padded length (the
                embedding lookup is free); 0 with no layers.
Not counted: SkipVAR's two small feature decodes at its decision scale (policy-side work), the
image -> uint8 conversion.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

#: google/flan-t5-xl's encoder as published (config.json): what the released models condition on.
FLAN_T5_XL = {"d_model": 2048, "d_ff": 5120, "d_kv": 64, "num_heads": 32, "num_layers": 24, "gated": True}
#: the tokenizer's padded length in the released pipeline (and :class:`varbench.engine.text.T5TextEncoder`)
T5_MAX_LENGTH = 512
#: the text model of HART's released encoder folder (mit-han-lab/Qwen2-VL-1.5B-Instruct): Qwen2-1.5B's published
#: config.json (hidden 1536 = HART's context_dim). Not transformers' defaults: Qwen2VLTextConfig() defaults to the
#: 72B (hidden 8192, 80 layers), Qwen2Config() to a 7B-like shape, so the numbers are written out here.
QWEN2_1P5B = {"hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12,
              "num_key_value_heads": 2}
#: HART's padded prompt length (released --max_token_length; the transformer's context_token)
HART_MAX_LENGTH = 300
#: the released system prompt's length under Qwen2's tokenizer, a lower bound: its pre-tokenizer splits it into
#: 131 pieces, each one token or more (the tokenizer is not in this repo; some 131-140, +2.77 GFLOPs per
#: further token). What an analytic count without the tokenizer uses (`preset_stage_flops`); a record counts
#: the loaded tokenizer's own (`hart_text_tokens`).
HART_SYSTEM_PROMPT_TOKENS = 131


# -- VAE decoder ------------------------------------------------------------------------------
def _conv(c_in: int, c_out: int, k: int, h: int, w: int) -> int:
    return 2 * c_in * c_out * k * k * h * w


def _resblock(c_in: int, c_out: int, h: int, w: int) -> int:
    f = _conv(c_in, c_out, 3, h, w) + _conv(c_out, c_out, 3, h, w)
    return f + (_conv(c_in, c_out, 1, h, w) if c_in != c_out else 0)


def decoder_flops(cfg, latent_hw: Sequence[int]) -> float:
    """FLOPs of one image's decode: :class:`~varbench.engine.backbones.infinity.bsq_vae.Decoder` built from
    :class:`~varbench.engine.backbones.infinity.bsq_vae.VAEConfig` ``cfg`` on a (h, w) latent grid (the VAE's grid:
    for the 8B patchify VAE twice the transformer's last grid). Mirrors the decoder's layer walk."""
    h, w = (int(v) for v in latent_hw)
    if h < 1 or w < 1:
        raise ValueError(f"decoder_flops: latent grid {tuple(latent_hw)} must be positive (h, w)")
    ch, mult, n = cfg.base_ch, tuple(cfg.ch_mult), len(cfg.ch_mult)
    c = ch * mult[-1]
    total = _conv(cfg.codebook_dim, c, 3, h, w) + 2 * _resblock(c, c, h, w)   # conv_in, mid
    for level in reversed(range(n)):                   # coarsest level first, as Decoder.forward
        c_out = ch * mult[level]
        for _ in range(cfg.num_res_blocks + 1):
            total += _resblock(c, c_out, h, w)
            c = c_out
        if 1 <= level <= cfg.num_down:                 # nearest 2x, then a 3x3 conv at the new size
            h, w = 2 * h, 2 * w
            total += _conv(c, c, 3, h, w)
    return float(total + _conv(c, cfg.in_channels, 3, h, w))   # conv_out


def hart_decoder_flops(cfg, latent_hw: Sequence[int]) -> float:
    """FLOPs of one image's decode by HART's tokenizer decoder
    (:class:`~varbench.engine.backbones.hart.tokenizer.HartImageDecoder` built from
    :class:`~varbench.engine.backbones.hart.tokenizer.HartTokenizerConfig` ``cfg``) on a (h, w) latent grid
    (the AR loop's f_hat: 64x64 for hart_0p7b at 1024²). Mirrors ``fhat_to_img``'s layer walk:
    post_quant_conv, conv_in, mid (ResNet, attention, ResNet), then per level from the lowest resolution
    up ``num_res_blocks + 1`` ResNets (each followed by an attention block at the lowest level), a 2x
    upsample + 3x3 conv on every level but the full-resolution one, conv_out.

    Attention (single head over the h*w positions, width C): the 1x1 qkv and proj_out convs
    (2*hw*C*3C + 2*hw*C*C) and the two bmm products, scores q^T k and the weighted sum v attn^T
    (2 * 2*(hw)^2*C). Its scale multiply and softmax are O((hw)^2) elementwise work and are not
    counted, as FlopCounterMode does not count them (nor the GroupNorms, SiLUs, residual adds, the
    nearest upsample copy, the final clamp, or conv biases)."""
    h, w = (int(v) for v in latent_hw)
    if h < 1 or w < 1:
        raise ValueError(f"hart_decoder_flops: latent grid {tuple(latent_hw)} must be positive (h, w)")

    def attn(c: int, h: int, w: int) -> int:
        n = h * w
        return _conv(c, 3 * c, 1, h, w) + _conv(c, c, 1, h, w) + 2 * 2 * n * n * c

    chs = [cfg.ch * m for m in cfg.ch_mult]
    top = len(chs) - 1
    c = chs[top]
    total = _conv(cfg.z_channels, cfg.z_channels, cfg.quant_conv_ks, h, w)          # post_quant_conv
    total += _conv(cfg.z_channels, c, 3, h, w) + 2 * _resblock(c, c, h, w) + attn(c, h, w)   # conv_in, mid
    for level in reversed(range(len(chs))):            # lowest resolution first, as HartDecoder.forward
        for _ in range(cfg.num_res_blocks + 1):
            total += _resblock(c, chs[level], h, w) + (attn(chs[level], h, w) if level == top else 0)
            c = chs[level]
        if level != 0:                                 # nearest 2x, then a 3x3 conv at the new size
            h, w = 2 * h, 2 * w
            total += _conv(c, c, 3, h, w)
    return float(total + _conv(c, 3, 3, h, w))         # conv_out


# -- text encoders ----------------------------------------------------------------------------
def t5_encoder_flops(config: Mapping[str, Any] | Any, tokens: int) -> float:
    """FLOPs of one T5 encoder pass over ``tokens`` positions. ``config``: a mapping like
    :data:`FLAN_T5_XL` or a Hugging Face ``T5Config`` (``d_model``, ``d_ff``, ``d_kv``,
    ``num_heads``, ``num_layers``, gated from ``is_gated_act``). Per layer: q, k, v, o projections,
    scores and weighted sum, FFN (two input projections when gated: gated-gelu). No biases in T5;
    the relative position bias is a lookup."""
    get = config.get if isinstance(config, Mapping) else (lambda k, d=None: getattr(config, k, d))
    d, ff, inner, layers = get("d_model"), get("d_ff"), get("d_kv") * get("num_heads"), get("num_layers")
    gated = get("gated") if get("gated") is not None else bool(get("is_gated_act", False))
    n = int(tokens)
    per_layer = 4 * 2 * n * d * inner + 2 * 2 * n * n * inner + (3 if gated else 2) * 2 * n * d * ff
    return float(layers * per_layer)


def qwen2_text_flops(text_config: Mapping[str, Any] | Any, n_tokens: int) -> float:
    """FLOPs of one Qwen2 language-model pass over one sequence of ``n_tokens`` positions. ``text_config``:
    a mapping like :data:`QWEN2_1P5B` or a Hugging Face ``Qwen2Config`` / ``Qwen2VLTextConfig``
    (``config.get_text_config()``; ``hidden_size``, ``intermediate_size``, ``num_hidden_layers``,
    ``num_attention_heads``, ``num_key_value_heads``, ``head_dim`` when set, else hidden / heads).

    Per layer: q (heads * head_dim wide), k and v (``num_key_value_heads * head_dim`` wide: GQA), o back to
    hidden; scores q k^T and the weighted sum over all n x n pairs for every query head (the KV heads are
    shared, not computed again, but every query head does its own products); the MLP's gate, up and
    down. The causal mask is not discounted: the model passes an explicit mask (pads) and the kernel
    computes the whole square, which is also what FlopCounterMode's SDPA formula counts. Not counted
    (O(elements), as FlopCounterMode): RMSNorms, SiLU and the gate product, RoPE (its angle table is a
    broadcast multiply), softmax and its scale, the q/k/v biases, residual adds, the final norm. The
    embedding is a lookup; AutoModel has no LM head."""
    get = text_config.get if isinstance(text_config, Mapping) else (lambda k, d=None: getattr(text_config, k, d))
    d, ff, layers = get("hidden_size"), get("intermediate_size"), get("num_hidden_layers")
    heads, kv = get("num_attention_heads"), get("num_key_value_heads") or get("num_attention_heads")
    hd = get("head_dim") or d // heads
    n = int(n_tokens)
    proj = 2 * n * d * (heads * hd + 2 * kv * hd) + 2 * n * heads * hd * d     # q, k, v; o
    attn = 2 * 2 * n * n * heads * hd                                          # scores, weighted sum
    mlp = 3 * 2 * n * d * ff                                                   # gate, up, down
    return float(layers * (proj + attn + mlp))


def hart_text_tokens(encoder) -> int:
    """Positions one prompt sends through :class:`~varbench.engine.backbones.hart.text.HartTextEncoder`'s model:
    the system prompt's tokens (unpadded, as tokenized at construction) when ``use_system_prompt``, plus
    the prompt padded to ``max_length`` (every prompt, whatever its length)."""
    return (len(encoder.system_ids) if encoder.use_system_prompt else 0) + encoder.max_length


def word_encoder_flops(dim: int, layers: int, ffn: int, tokens: int) -> float:
    """FLOPs of :class:`~varbench.engine.text.WordTextEncoder`'s ``layers`` transformer layers over
    ``tokens`` positions (fused q/k/v and output projections, scores and weighted sum, FFN)."""
    n = int(tokens)
    per_layer = 2 * n * dim * 3 * dim + 2 * n * dim * dim + 2 * 2 * n * n * dim + 2 * 2 * n * dim * ffn
    return float(layers * per_layer)


def text_encoder_flops(encoder, prompts: Sequence[str], negative_prompt: Optional[str] = None) -> Optional[list[float]]:
    """Each image's share of the text encoder's FLOPs for one generation of ``prompts`` (its own
    prompt, plus an equal share of the negative prompt's encode when one is given: the runtime
    encodes it once per generation, even with CFG off). None for an encoder this module does not
    know (the end-to-end count is then None rather than wrong)."""
    from varbench.engine.backbones.hart.text import HartTextEncoder
    from varbench.engine.text import T5TextEncoder, WordTextEncoder

    if encoder is None:                 # pre-encoded text: no encoder ran
        return [0.0] * len(prompts)
    if isinstance(encoder, T5TextEncoder):
        one = t5_encoder_flops(encoder.encoder.config, encoder.max_length)
        own = [one] * len(prompts)
        neg = one if negative_prompt else 0.0
    elif isinstance(encoder, HartTextEncoder):    # a fixed-length pass per prompt, batch-independent
        one = qwen2_text_flops(encoder.model.config.get_text_config(), hart_text_tokens(encoder))
        own = [one] * len(prompts)
        neg = one if negative_prompt else 0.0      # HART's unconditional rows (no negative) encode nothing
    elif isinstance(encoder, WordTextEncoder):
        if not encoder.context:
            return [0.0] * len(prompts)
        lay = encoder.context[0]
        cost = lambda n: word_encoder_flops(encoder.embed.embedding_dim, len(encoder.context),  # noqa: E731
                                            lay.linear1.out_features, n)
        lmax = max(len(encoder.ids(p)) for p in prompts)      # the batch is padded to its longest prompt
        own = [cost(lmax)] * len(prompts)
        neg = cost(len(encoder.ids(negative_prompt))) if negative_prompt else 0.0
    else:
        return None
    return [f + neg / len(prompts) for f in own]


def vae_decode_flops(vae, latent_hw: Sequence[int]) -> Optional[float]:
    """One image's decode on ``latent_hw`` with the runtime's VAE, dispatched on its ``cfg``: the
    BSQ-VAE decoder (Infinity) or HART's tokenizer decoder; None for any other (not guessed)."""
    from varbench.engine.backbones.infinity.bsq_vae import VAEConfig
    from varbench.engine.backbones.hart.tokenizer import HartTokenizerConfig

    cfg = getattr(vae, "cfg", None)
    if isinstance(cfg, VAEConfig):
        return decoder_flops(cfg, latent_hw)
    if isinstance(cfg, HartTokenizerConfig):
        return hart_decoder_flops(cfg, latent_hw)
    return None


def stage_flops(rt, prompts: Sequence[str], latent_hw: Sequence[int],
                negative_prompt: Optional[str] = None) -> list[dict]:
    """Per image of one generation: ``{"text_encoder", "vae_decode"}`` FLOPs (None where not
    countable) for the runtime ``rt``'s encoder and VAE; ``latent_hw`` is the decoded grid
    (``out.summed_codes.shape[-2:]``)."""
    text = text_encoder_flops(rt.text_encoder, prompts, negative_prompt)
    dec = vae_decode_flops(rt.vae, latent_hw) if rt.vae is not None else None
    return [{"text_encoder": None if text is None else text[i], "vae_decode": dec} for i in range(len(prompts))]


def preset_stage_flops(model_preset: str, text_tokens: Optional[int] = None) -> dict:
    """For a released model preset at its schedule's last grid, without building anything:
    ``{"text_encoder": FLOPs of one prompt's encode, "vae_decode": callable(token_grid) -> FLOPs}``.
    Infinity: flan-t5-xl over ``text_tokens`` (default its padded 512), the BSQ-VAE decoder. HART
    (``hart_0p7b``): the released Qwen2 text model (:data:`QWEN2_1P5B`) over ``text_tokens`` (default
    :data:`HART_SYSTEM_PROMPT_TOKENS` + :data:`HART_MAX_LENGTH`, the lower bound of the release's count),
    the tokenizer decoder on f_hat (the token grid: HART's latent is its last stage's grid).
    Used by experiments/flops_table.py."""
    from varbench.engine.backbones.infinity.bsq_vae import VAE_PRESETS
    from varbench.engine.backbones.hart.model import HART_PRESETS
    from varbench.engine.backbones.hart.tokenizer import HART_TOKENIZER_PRESETS
    from varbench.engine.backbones.infinity.model import PRESETS

    if model_preset in HART_PRESETS:
        tok = HART_TOKENIZER_PRESETS[model_preset]
        n = HART_SYSTEM_PROMPT_TOKENS + HART_MAX_LENGTH if text_tokens is None else text_tokens
        return {"text_encoder": qwen2_text_flops(QWEN2_1P5B, n), "vae_decode": lambda grid: hart_decoder_flops(tok, grid)}
    cfg = PRESETS[model_preset]
    vae = VAE_PRESETS[cfg.vae]
    p = 2 if cfg.patchify else 1
    return {"text_encoder": t5_encoder_flops(FLAN_T5_XL, T5_MAX_LENGTH if text_tokens is None else text_tokens),
            "vae_decode": lambda grid: decoder_flops(vae, (grid[0] * p, grid[1] * p))}
