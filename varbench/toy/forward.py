"""Teacher-forced Infinity forward for training: every scale in one pass, block-causal attention.

Inference (`varbench.engine.backbones.infinity.runtime`) runs scale by scale with a KV cache, so scale s attends to the keys
of scales 0..s. Training runs all scales at once with the ground-truth bits as inputs, so the same
visibility is a block-causal mask: a token of scale s may attend to every token of scales <= s
(including all tokens of its own scale). Everything else is the runtime's computation, made from
the same module methods in the same order:

* condition: text -> (optionally) the learned `cfg_uncond` rows in place of the prompt's tokens
  (the runtime's unconditional CFG branch) -> `text_norm` -> pooled `cond` (SOS and AdaLN) and the
  cross-attention text; `shared_ada_lin(cond)` feeds every block's `modulation`;
* inputs: scale 0 is `cond + pos_start`; scale s > 0 is `word_embed` of the summed codes of scales
  < s (bits -> +-1/sqrt(d) -> L2-normalised, each upsampled trilinearly to the full latent grid and
  summed), resized trilinearly to scale s's grid; every scale adds `lvl_embed.weight[s]`;
* blocks: modulated LN -> `sa.qkv` -> RoPE (`rope_table` on `rope_reference_grid(h_div_w)`) ->
  softmax attention with scale 1 -> `sa.out` * gamma1; `ca.attend` over `ca.text_kv`;
  modulated LN -> `ffn` * gamma2; then `Infinity.logits`.

`tests/toy/test_toy_train.py` checks that these logits equal the runtime's, scale by scale, when the
runtime is made to sample the same bits.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F

from varbench.engine.backbones.infinity.bsq_vae import bits_to_codes
from varbench.engine.backbones.infinity.model import Infinity
from varbench.engine.backbones.infinity.schedules import apply_rope, rope_reference_grid, rope_table
from varbench.engine.text import TextBatch


def condition(model: Infinity, text: TextBatch, drop: Optional[torch.Tensor] = None, ca_bf16: bool = True):
    """(ca_text, ca_mask, cond, shared_gss) as the runtime's text conditioning (`varbench.engine.backbones.infinity.state`) computes them.

    drop: (B,) bool; rows where True use the learned unconditional placeholder instead of the
    prompt's tokens (same length and mask as the prompt), exactly the runtime's CFG uncond rows.
    """
    feats, mask = text.features, text.mask
    if drop is not None and bool(drop.any()):
        un = model.cfg_uncond[: feats.shape[1]].to(feats.dtype).unsqueeze(0) * mask.unsqueeze(-1)
        feats = torch.where(drop.view(-1, 1, 1), un, feats)
    feats = model.text_norm(feats)
    cond = model.text_proj_for_sos(feats, mask, ca_bf16)
    ca_text = model.text_proj_for_ca(feats)
    shared_gss = model.shared_ada_lin(cond.float()).float()
    return ca_text, mask, cond, shared_gss


def scale_inputs(model: Infinity, bits: Sequence[torch.Tensor], schedule: Sequence[tuple[int, int]],
                 latent_hw: Optional[tuple[int, int]] = None) -> list[torch.Tensor]:
    """Code inputs (B, h*w, d_tok) of scales 1..n-1 from the ground-truth bits of scales 0..n-2.

    latent_hw: the full schedule's last grid, where codes are summed (default: `schedule[-1]`);
    give it when `schedule` is a prefix of the generation schedule.
    """
    patch = 2 if model.cfg.patchify else 1
    hl, wl = latent_hw or schedule[-1]
    latent = (1, hl * patch, wl * patch)
    summed = None
    out = []
    for si in range(1, len(schedule)):
        b = bits[si - 1]
        if patch > 1:  # (B, h, w, 4d) token bits -> (B, 2h, 2w, d) VAE bits, as the runtime does
            b = F.pixel_shuffle(b.permute(0, 3, 1, 2), 2).permute(0, 2, 3, 1)
        up = F.interpolate(bits_to_codes(b).unsqueeze(1).permute(0, 4, 1, 2, 3), size=latent, mode="trilinear")
        summed = up if summed is None else summed + up
        h, w = schedule[si]
        nxt = F.interpolate(summed, size=(1, h * patch, w * patch), mode="trilinear").squeeze(-3)
        if patch > 1:
            nxt = F.pixel_unshuffle(nxt, 2)
        out.append(nxt.reshape(*nxt.shape[:2], -1).permute(0, 2, 1))
    return out


def block_causal_mask(schedule: Sequence[tuple[int, int]], device=None) -> torch.Tensor:
    """(L, L) bool, True = may attend: query of scale s sees keys of scales <= s."""
    level = torch.cat([torch.full((h * w,), i, dtype=torch.long) for i, (h, w) in enumerate(schedule)])
    return (level[None, :] <= level[:, None]).to(device)


def rope_all(head_dim: int, schedule: Sequence[tuple[int, int]], h_div_w: float) -> torch.Tensor:
    """(2, L, head_dim // 2): each scale's RoPE table, concatenated in token order."""
    ref = rope_reference_grid(h_div_w)
    return torch.cat([rope_table(head_dim, hw, ref) for hw in schedule], dim=1)


def level_ids(schedule: Sequence[tuple[int, int]], device=None) -> torch.Tensor:
    return torch.cat([torch.full((h * w,), i, dtype=torch.long) for i, (h, w) in enumerate(schedule)]).to(device)


def teacher_forced_logits(model: Infinity, text: TextBatch, bits: Sequence[torch.Tensor],
                          schedule: Sequence[tuple[int, int]], *, h_div_w: float = 1.0,
                          drop: Optional[torch.Tensor] = None, ca_bf16: bool = True,
                          latent_hw: Optional[tuple[int, int]] = None) -> torch.Tensor:
    """Logits (B, L, 2d) of all scales given ground-truth bits [(B, h, w, d_tok)] per scale.

    Only bits of scales 0..n-2 are read (the last scale's bits are labels, never inputs). `drop`
    marks rows trained unconditionally (caption dropout). `ca_bf16` as in `InfinityRuntime`.
    `schedule` may be a prefix of the generation schedule (cheaper steps that train only the coarse
    scales); then pass the full schedule's last grid as `latent_hw`, since logits of a prefix equal
    those of the full pass on the prefix's tokens (block-causal).
    """
    schedule = [tuple(s) for s in schedule]
    if len(schedule) > model.cfg.num_levels:
        raise ValueError(f"schedule has {len(schedule)} scales but the model has {model.cfg.num_levels} level embeddings")
    dev = model.pos_start.device
    ca_text, ca_mask, cond, gss = condition(model, text, drop, ca_bf16)
    b = cond.shape[0]
    sos = cond.unsqueeze(1) + model.pos_start.expand(b, 1, -1)
    rest = scale_inputs(model, bits, schedule, latent_hw)
    x = torch.cat([sos, model.word_embed(torch.cat(rest, dim=1))], dim=1) if rest else sos
    x = x + model.lvl_embed.weight[level_ids(schedule, dev)]
    rope = rope_all(model.cfg.head_dim, schedule, h_div_w).to(dev)
    mask = block_causal_mask(schedule, dev)
    for block in model.blocks:
        g1, g2, s1, s2, sh1, sh2 = block.modulation(gss)
        q, k, v = block.sa.qkv(block.modulated_norm(x, s1, sh1))
        q, k = apply_rope(q, rope), apply_rope(k, rope)
        attn = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0)
        x = x + block.sa.out(attn).float().mul(g1)
        tk, tv = block.ca.text_kv(ca_text, ca_mask)
        x = x + block.ca.attend(block.ca_norm(x), tk, tv, ca_mask, ca_bf16).float()
        x = x + block.ffn(block.modulated_norm(x, s2, sh2)).float().mul(g2)
    return model.logits(x, cond)


def bit_targets(bits: Sequence[torch.Tensor]) -> torch.Tensor:
    """Per-scale bits [(B, h, w, d)] -> labels (B, L, d) in token order."""
    return torch.cat([b.reshape(b.shape[0], -1, b.shape[-1]) for b in bits], dim=1)


def per_token_bit_ce(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross entropy per token (B, L): mean over its d bits of the 2-way CE (the runtime samples
    bit value i from logits[..., j, i] of the (d, 2) view)."""
    b, l, d2 = logits.shape
    ce = F.cross_entropy(logits.reshape(-1, 2).float(), targets.reshape(-1).long(), reduction="none")
    return ce.view(b, l, d2 // 2).mean(-1)
