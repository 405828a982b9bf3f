"""Tiny random models for CPU tests: the same classes and code paths as the released presets.

    rt = tiny_runtime(seed=0)            # Infinity 'tiny' + VAE 'toy' + word-level text encoder
    out = rt.generate(["a red circle"], seeds=[0], pn="0.25M")

Random weights are perturbed where the released init is constant (ada_gss, biases, cfg_uncond,
scale_mul, text_norm), so a test is sensitive to every parameter.
"""
from __future__ import annotations

import dataclasses

import torch

from .models.bsq_vae import BSQVAE
from .models.infinity import PRESETS, Infinity, InfinityConfig
from .models.text import WordTextEncoder
from .runtime import InfinityRuntime

def perturb_(module: torch.nn.Module, seed: int, std: float = 0.02) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=g) * std)


def tiny_runtime(seed: int = 0, **overrides) -> InfinityRuntime:
    """A runtime with a tiny random Infinity (`overrides` change InfinityConfig fields)."""
    cfg: InfinityConfig = dataclasses.replace(PRESETS["tiny"], **overrides)
    torch.manual_seed(seed)
    model = Infinity(cfg)
    perturb_(model, seed + 1)
    vae = BSQVAE(cfg.vae)
    text = WordTextEncoder(dim=cfg.text_channels, max_len=cfg.text_maxlen)
    return InfinityRuntime(model, vae, text)


def job_config(root, *overrides: str):
    """The job config ``python -m varbench +experiment=smoke <overrides>`` composes, with the store and
    results under ``root`` (what the job tests run; later overrides win)."""
    from hydra import compose, initialize_config_dir

    from .resources import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=[
            "+experiment=smoke", f"paths.store_dir={root}/store", f"paths.results_dir={root}/results", *overrides])
