"""Analytic FLOPs of HART's stages around its transformer: the tokenizer's image decoder and the Qwen2
text encoder (`varbench.engine.stage_flops` states the convention and what is counted; `presets` counts
the released preset's stages)."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from varbench.engine.stage_flops import conv_flops, resblock_flops


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
        return conv_flops(c, 3 * c, 1, h, w) + conv_flops(c, c, 1, h, w) + 2 * 2 * n * n * c

    chs = [cfg.ch * m for m in cfg.ch_mult]
    top = len(chs) - 1
    c = chs[top]
    total = conv_flops(cfg.z_channels, cfg.z_channels, cfg.quant_conv_ks, h, w)          # post_quant_conv
    total += conv_flops(cfg.z_channels, c, 3, h, w) + 2 * resblock_flops(c, c, h, w) + attn(c, h, w)   # conv_in, mid
    for level in reversed(range(len(chs))):            # lowest resolution first, as HartDecoder.forward
        for _ in range(cfg.num_res_blocks + 1):
            total += resblock_flops(c, chs[level], h, w) + (attn(chs[level], h, w) if level == top else 0)
            c = chs[level]
        if level != 0:                                 # nearest 2x, then a 3x3 conv at the new size
            h, w = 2 * h, 2 * w
            total += conv_flops(c, c, 3, h, w)
    return float(total + conv_flops(c, 3, 3, h, w))         # conv_out


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
