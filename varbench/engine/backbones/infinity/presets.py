"""Infinity's released presets, counted without building anything (through `varbench.engine.backbones`,
which finds a preset's family)."""
from __future__ import annotations

from typing import Optional

from varbench.engine.backbones.infinity.bsq_vae import VAE_PRESETS
from varbench.engine.backbones.infinity.model import PRESETS
from varbench.engine.backbones.infinity.stage_flops import decoder_flops
from varbench.engine.stage_flops import FLAN_T5_XL, T5_MAX_LENGTH, t5_encoder_flops


def preset_stage_flops(model_preset: str, text_tokens: Optional[int] = None) -> dict:
    """For a released Infinity preset at its schedule's last grid, without building anything:
    ``{"text_encoder": flan-t5-xl over ``text_tokens`` (default its padded 512), "vae_decode":
    callable(token_grid) -> the BSQ-VAE decoder's FLOPs}`` (the 8B's patchify VAE decodes twice the
    token grid). Through `varbench.engine.backbones.preset_stage_flops`."""
    cfg = PRESETS[model_preset]
    vae = VAE_PRESETS[cfg.vae]
    p = 2 if cfg.patchify else 1
    return {"text_encoder": t5_encoder_flops(FLAN_T5_XL, T5_MAX_LENGTH if text_tokens is None else text_tokens),
            "vae_decode": lambda grid: decoder_flops(vae, (grid[0] * p, grid[1] * p))}
