"""The backbones, one folder each: `infinity` (Infinity-2B/8B, tiny, toy) and `hart` (HART-0.7B).

A backbone imports only the backbone-agnostic seam in `varbench.engine` (plan, policy, KV cache and
budgets, batch splitting, graphs, memory, FLOPs helpers, text encoders, generation output) and never
another backbone; the seam never imports a backbone (`tests/core/test_layers.py` checks both). A third
backbone is a new folder here (with `model.PRESETS`, `presets.preset_stage_flops`, a runtime returning
`varbench.engine.generation.GenerationOutput`), one line in `FAMILIES` and its builder in
`varbench.harness.build.BUILDERS`.
"""
from __future__ import annotations

import importlib
from types import ModuleType
from typing import Optional

#: model family (``model.family`` in a model config) -> its folder. Each folder has `model` (with
#: `PRESETS`, its released presets by name) and `presets` (with `preset_stage_flops`).
FAMILIES = {"infinity": "varbench.engine.backbones.infinity", "hart": "varbench.engine.backbones.hart"}


def backbone_module(family: str, name: str) -> ModuleType:
    """The module `name` of backbone `family` (e.g. ``backbone_module("hart", "model")``), imported on
    first use, so naming a family does not import every backbone."""
    if family not in FAMILIES:
        raise KeyError(f"no backbone family {family!r}; known: {', '.join(FAMILIES)}")
    return importlib.import_module(f"{FAMILIES[family]}.{name}")


def preset_family(model_preset: str) -> str:
    """The family whose `model.PRESETS` holds `model_preset` (KeyError naming the known presets if none)."""
    known = []
    for family in FAMILIES:
        presets = backbone_module(family, "model").PRESETS
        if model_preset in presets:
            return family
        known += list(presets)
    raise KeyError(f"no backbone has the model preset {model_preset!r}; known: {', '.join(known)}")


def preset_stage_flops(model_preset: str, text_tokens: Optional[int] = None) -> dict:
    """For a released model preset at its schedule's last grid, without building anything:
    ``{"text_encoder": FLOPs of one prompt's encode over ``text_tokens`` (default the release's count),
    "vae_decode": callable(token_grid) -> FLOPs}``, from its family's `stage_flops.preset_stage_flops`
    (Infinity: flan-t5-xl and the BSQ-VAE decoder; HART: Qwen2 and the tokenizer decoder).
    Used by experiments/flops_table.py."""
    return backbone_module(preset_family(model_preset), "presets").preset_stage_flops(model_preset, text_tokens)
