"""Analytic FLOPs of the two stages around the transformer: the text encoder and the VAE decoder.

`varbench/engine/flops.py` counts the transformer (the AR loop and its text-side projections): the part
acceleration methods change. A user waits for the whole pipeline, so records and tables also
carry an end-to-end count (transformer + text encoder + VAE decode). Same convention as flops.py
and as ``torch.utils.flop_counter.FlopCounterMode``: a multiply-add counts 2; convolutions and
matrix products only (norms, activations, residual adds, upsampling copies, softmax and biases
are O(elements), not counted). The tests check each count against FlopCounterMode exactly.

Where each count lives: this module has the convention's pieces (`conv_flops`, `resblock_flops`),
the text encoders of the seam (T5, the word encoder) and the per-generation dispatch (`stage_flops`:
an encoder's ``encode_flops``, a VAE config's ``decode_flops``); a backbone's own stages are in its
folder (`backbones/infinity/stage_flops.py`: the BSQ-VAE decoder; `backbones/hart/stage_flops.py`:
HART's decoder and Qwen2), and a released preset's counts without building anything are
`varbench.engine.backbones.preset_stage_flops`.

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

from varbench.core.aliases import moved_names

#: google/flan-t5-xl's encoder as published (config.json): what the released models condition on.
FLAN_T5_XL = {"d_model": 2048, "d_ff": 5120, "d_kv": 64, "num_heads": 32, "num_layers": 24, "gated": True}
#: the tokenizer's padded length in the released pipeline (and :class:`varbench.engine.text.T5TextEncoder`)
T5_MAX_LENGTH = 512


# -- convolution counts (every decoder's walk is built from these) ----------------------------
def conv_flops(c_in: int, c_out: int, k: int, h: int, w: int) -> int:
    """A k x k convolution from c_in to c_out channels over an h x w grid (no bias)."""
    return 2 * c_in * c_out * k * k * h * w


def resblock_flops(c_in: int, c_out: int, h: int, w: int) -> int:
    """A ResNet block's two 3x3 convolutions, plus its 1x1 shortcut when the width changes."""
    f = conv_flops(c_in, c_out, 3, h, w) + conv_flops(c_out, c_out, 3, h, w)
    return f + (conv_flops(c_in, c_out, 1, h, w) if c_in != c_out else 0)


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


def word_encoder_flops(dim: int, layers: int, ffn: int, tokens: int) -> float:
    """FLOPs of :class:`~varbench.engine.text.WordTextEncoder`'s ``layers`` transformer layers over
    ``tokens`` positions (fused q/k/v and output projections, scores and weighted sum, FFN)."""
    n = int(tokens)
    per_layer = 2 * n * dim * 3 * dim + 2 * n * dim * dim + 2 * 2 * n * n * dim + 2 * 2 * n * dim * ffn
    return float(layers * per_layer)


def per_image_shares(own: Sequence[float], negative: float) -> list[float]:
    """Each image's text-encoder FLOPs: its own prompt's encode (`own`) plus an equal share of the
    negative prompt's (`negative`; 0 without one), which the runtime encodes once per generation."""
    return [f + negative / len(own) for f in own]


def text_encoder_flops(encoder, prompts: Sequence[str], negative_prompt: Optional[str] = None) -> Optional[list[float]]:
    """Each image's share of the text encoder's FLOPs for one generation of ``prompts`` (its own
    prompt, plus an equal share of the negative prompt's encode when one is given: the runtime
    encodes it once per generation, even with CFG off), as the encoder counts it
    (``encoder.encode_flops(prompts, negative_prompt)``: T5 and the word encoder here, HART's Qwen2 in
    its folder). None for an encoder that counts nothing (the end-to-end count is then None rather
    than wrong)."""
    if encoder is None:                 # pre-encoded text: no encoder ran
        return [0.0] * len(prompts)
    count = getattr(encoder, "encode_flops", None)
    return count(prompts, negative_prompt) if callable(count) else None


def vae_decode_flops(vae, latent_hw: Sequence[int]) -> Optional[float]:
    """One image's decode on ``latent_hw`` with the runtime's VAE, as its config counts it
    (``vae.cfg.decode_flops``: the BSQ-VAE decoder for Infinity, the tokenizer decoder for HART);
    None for a VAE whose config states nothing (not guessed)."""
    count = getattr(getattr(vae, "cfg", None), "decode_flops", None)
    return count(latent_hw) if callable(count) else None


def stage_flops(rt, prompts: Sequence[str], latent_hw: Sequence[int],
                negative_prompt: Optional[str] = None) -> list[dict]:
    """Per image of one generation: ``{"text_encoder", "vae_decode"}`` FLOPs (None where not
    countable) for the runtime ``rt``'s encoder and VAE; ``latent_hw`` is the decoded grid
    (``out.summed_codes.shape[-2:]``)."""
    text = text_encoder_flops(rt.text_encoder, prompts, negative_prompt)
    dec = vae_decode_flops(rt.vae, latent_hw) if rt.vae is not None else None
    return [{"text_encoder": None if text is None else text[i], "vae_decode": dec} for i in range(len(prompts))]


#: names that moved into a backbone's folder, still read from here (with a DeprecationWarning)
__getattr__ = moved_names(__name__)
