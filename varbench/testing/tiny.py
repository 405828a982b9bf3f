"""Tiny random models for CPU tests: the same classes and code paths as the released presets.

    rt = tiny_runtime(seed=0)            # Infinity 'tiny' + VAE 'toy' + word-level text encoder
    out = rt.generate(["a red circle"], seeds=[0], pn="0.25M")

Random weights are perturbed where the released init is constant (ada_gss, biases, cfg_uncond,
scale_mul, text_norm), so a test is sensitive to every parameter.
"""
from __future__ import annotations

import dataclasses
import os

import torch

from varbench.engine.backbones.infinity.bsq_vae import BSQVAE
from varbench.engine.backbones.infinity.model import PRESETS, Infinity, InfinityConfig
from varbench.engine.backbones.infinity.runtime import InfinityRuntime
from varbench.engine.text import WordTextEncoder

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


def tiny_hart_runtime(seed: int = 0, decoder: bool = True, **overrides):
    """A runtime with a tiny random HART ('hart_tiny'; `overrides` change HartConfig fields), its
    quantizer, a tiny random tokenizer decoder (`decoder=False`: none) and a word-level text encoder."""
    from varbench.engine.backbones.hart.model import HART_PRESETS, build_hart, build_hart_quantizer
    from varbench.engine.backbones.hart.runtime import HartRuntime

    cfg = dataclasses.replace(HART_PRESETS["hart_tiny"], **overrides)
    torch.manual_seed(seed)
    model, quant = build_hart(cfg), build_hart_quantizer(cfg)
    perturb_(model, seed + 1, std=0.1)   # q/v biases and scale_mul start constant
    dec = None
    if decoder:
        from varbench.engine.backbones.hart.tokenizer import build_hart_tokenizer

        dec = build_hart_tokenizer("hart_tiny", cfg.patch_nums)[1]
        perturb_(dec, seed + 2)
    text = WordTextEncoder(dim=cfg.context_dim, max_len=cfg.context_token)
    return HartRuntime(model, quant, dec, text)


def cpu_fingerprint() -> dict:
    """What decides the CPU's float kernels: model, ISA flags, torch's dispatch level, threads, and the
    environment variables that move MKL/oneDNN/ATen onto other code paths.

    Written into fixtures next to numbers they hold (the same fp32 computation differs by ulps across
    these, so an exact comparison only holds where they match), and printed by strict parity tests."""
    import platform

    model, flags = platform.processor() or "unknown", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, val = line.partition(":")
                if key.strip() == "model name":
                    model = val.strip()
                elif key.strip() == "flags":
                    flags = set(val.split())
                    break
    except OSError:   # not Linux: the model from platform, no flags
        pass
    isa = [f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16") if f in flags]
    env = {k: os.environ[k] for k in ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS",
                                      "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "OMP_NUM_THREADS") if k in os.environ}
    return {"cpu": model, "isa": isa, "torch": str(torch.__version__),
            "aten_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "torch_threads": torch.get_num_threads(), "env": env}


def strict_parity() -> bool:
    """VARBENCH_STRICT_PARITY=1: tests that compare against fixtures written on another machine compare
    exactly, as on the CPU that wrote them; unset or 0: within tolerances measured across CPU kernel
    paths (ISA levels, thread counts), so the suite passes on any CPU."""
    v = os.environ.get("VARBENCH_STRICT_PARITY", "0").strip()
    if v not in ("0", "1", ""):
        raise ValueError(f"VARBENCH_STRICT_PARITY={v!r}: set it to 1 (exact comparison, the fixture writer's CPU) "
                         "or 0 / unset (portable tolerances)")
    return v == "1"
