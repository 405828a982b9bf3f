"""Analytic FLOPs of the BSQ-VAE decoder, Infinity's image decoder (`varbench.engine.stage_flops` states
the convention and what is counted; `presets` counts the released presets' stages)."""
from __future__ import annotations

from typing import Sequence

from varbench.engine.stage_flops import conv_flops, resblock_flops


def decoder_flops(cfg, latent_hw: Sequence[int]) -> float:
    """FLOPs of one image's decode: :class:`~varbench.engine.backbones.infinity.bsq_vae.Decoder` built from
    :class:`~varbench.engine.backbones.infinity.bsq_vae.VAEConfig` ``cfg`` on a (h, w) latent grid (the VAE's grid:
    for the 8B patchify VAE twice the transformer's last grid). Mirrors the decoder's layer walk."""
    h, w = (int(v) for v in latent_hw)
    if h < 1 or w < 1:
        raise ValueError(f"decoder_flops: latent grid {tuple(latent_hw)} must be positive (h, w)")
    ch, mult, n = cfg.base_ch, tuple(cfg.ch_mult), len(cfg.ch_mult)
    c = ch * mult[-1]
    total = conv_flops(cfg.codebook_dim, c, 3, h, w) + 2 * resblock_flops(c, c, h, w)   # conv_in, mid
    for level in reversed(range(n)):                   # coarsest level first, as Decoder.forward
        c_out = ch * mult[level]
        for _ in range(cfg.num_res_blocks + 1):
            total += resblock_flops(c, c_out, h, w)
            c = c_out
        if 1 <= level <= cfg.num_down:                 # nearest 2x, then a 3x3 conv at the new size
            h, w = 2 * h, 2 * w
            total += conv_flops(c, c, 3, h, w)
    return float(total + conv_flops(c, cfg.in_channels, 3, h, w))   # conv_out
