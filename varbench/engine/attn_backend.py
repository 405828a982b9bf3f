"""`runtime.attn_backend`: which attention kernel every SDPA call of a generation runs.

    with attention_backend("math"):        # what InfinityRuntime.generate wraps itself in
        out = rt._generate(...)

- `auto` (default): torch picks per call, as before this knob existed (nothing is wrapped; bits
  unchanged). On the CPU that is the CPU flash kernel for most calls; on CUDA flash, memory-efficient
  or cuDNN by shape, dtype and GPU.
- `math`, `efficient`, `flash`, `cudnn`: `torch.nn.attention.sdpa_kernel([that backend])`: only it may
  run; a call it cannot serve raises torch's "No available kernel" error rather than silently
  running another (the point of pinning). On the CPU only `math` and `flash` exist (refused at the
  config boundary otherwise: `check_backend`).
- `flash_attn`: the flash-attn package's `flash_attn_func`, as the released Infinity and HART code
  call it, for the calls it serves (CUDA, fp16/bf16, no mask, head dim <= 256); other calls (masked
  cross-attention over padded prompts, fp32) fall through to SDPA. Refused when the package is not
  installed.

What it trades: the kernels differ in speed and memory (math materialises the whole attention
matrix: the reference; flash/efficient stream it) and round differently in the last bits, so a
backend other than auto is part of the image store key (varbench/core/hashing.py NEUTRAL_DEFAULTS).
"""
from __future__ import annotations

import contextlib
import importlib.util
from typing import Optional

import torch
import torch.nn.functional as F

#: the values of `runtime.attn_backend`
BACKENDS = ("auto", "math", "efficient", "flash", "cudnn", "flash_attn")
#: the backends with a kernel on the CPU (the others refuse there)
CPU_BACKENDS = ("auto", "math", "flash")


def _sdpa_backends() -> dict:
    from torch.nn.attention import SDPBackend

    return {"math": SDPBackend.MATH, "efficient": SDPBackend.EFFICIENT_ATTENTION,
            "flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}


def flash_attn_installed() -> bool:
    return importlib.util.find_spec("flash_attn") is not None


def check_backend(name: str, device_type: str) -> Optional[str]:
    """Why `name` cannot run on `device_type` ("cpu" / "cuda"), with the fix; None when it can."""
    if name not in BACKENDS:
        return f"runtime.attn_backend must be one of {', '.join(BACKENDS)}, got {name!r}"
    if device_type != "cuda" and name not in CPU_BACKENDS:
        return (f"runtime.attn_backend={name} has no CPU kernel; on the CPU use one of "
                f"{', '.join(CPU_BACKENDS)} (or runtime.device=cuda)")
    if name == "flash_attn" and not flash_attn_installed():
        return ("runtime.attn_backend=flash_attn needs the flash-attn package, which is not installed here; "
                "install it (pip install flash-attn --no-build-isolation) or use runtime.attn_backend=flash "
                "(SDPA's flash kernel)")
    return None


def attention_backend(name: str):
    """The context a generation runs in for backend `name` (see the module docstring)."""
    if name in (None, "auto"):
        return contextlib.nullcontext()
    if name == "flash_attn":
        return _flash_attn_package()
    from torch.nn.attention import sdpa_kernel

    return sdpa_kernel([_sdpa_backends()[name]])


@contextlib.contextmanager
def _flash_attn_package():
    """`F.scaled_dot_product_attention` served by flash-attn's `flash_attn_func` where it can be
    (the block code calls it through the module attribute, so this reaches every call)."""
    from flash_attn import flash_attn_func   # checked at the config boundary (check_backend)

    sdpa = F.scaled_dot_product_attention

    def routed(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kw):
        if (attn_mask is None and not kw and q.is_cuda and q.dtype in (torch.float16, torch.bfloat16)
                and q.dtype == k.dtype == v.dtype and q.dim() == 4 and q.shape[-1] <= 256):
            # flash-attn takes (batch, seq, heads, dim); its output comes back the same way
            out = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), dropout_p,
                                  softmax_scale=scale, causal=is_causal)
            return out.transpose(1, 2)
        return sdpa(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale, **kw)

    F.scaled_dot_product_attention = routed
    try:
        yield
    finally:
        F.scaled_dot_product_attention = sdpa
