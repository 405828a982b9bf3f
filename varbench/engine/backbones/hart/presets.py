"""HART's released presets, counted without building anything (through `varbench.engine.backbones`,
which finds a preset's family)."""
from __future__ import annotations

from typing import Optional

from varbench.engine.backbones.hart.stage_flops import (HART_MAX_LENGTH, HART_SYSTEM_PROMPT_TOKENS, QWEN2_1P5B,
                                                        hart_decoder_flops, qwen2_text_flops)
from varbench.engine.backbones.hart.tokenizer import HART_TOKENIZER_PRESETS


def preset_stage_flops(model_preset: str, text_tokens: Optional[int] = None) -> dict:
    """For a released HART preset (``hart_0p7b``) at its last stage's grid, without building anything:
    ``{"text_encoder": the released Qwen2 text model (:data:`QWEN2_1P5B`) over ``text_tokens`` (default
    :data:`HART_SYSTEM_PROMPT_TOKENS` + :data:`HART_MAX_LENGTH`, the lower bound of the release's count),
    "vae_decode": callable(token_grid) -> the tokenizer decoder's FLOPs on f_hat}`` (HART's latent is its
    last stage's grid). Through `varbench.engine.backbones.preset_stage_flops`."""
    tok = HART_TOKENIZER_PRESETS[model_preset]
    n = HART_SYSTEM_PROMPT_TOKENS + HART_MAX_LENGTH if text_tokens is None else text_tokens
    return {"text_encoder": qwen2_text_flops(QWEN2_1P5B, n), "vae_decode": lambda grid: hart_decoder_flops(tok, grid)}
