"""runtime.attn_backend (varbench/engine/attn_backend.py): the kernel each SDPA call runs.

Measured on the 2-core Xeon (torch 2.14.1; the same under ATEN_CPU_CAPABILITY=avx2
OMP_NUM_THREADS=1), tiny model, 5 scales, 2 images with CFG: `auto` runs the CPU flash kernel for
all 41 SDPA calls, so `flash` is auto bit for bit (max |diff| 0 in bits, codes and pixels); `math`
(softmax(QK^T)V written out) keeps 99.9% of the bits at the last scale, 100% before it, and the
pixels move by 1.2 uint8 levels on average. Bounds asserted: flash == auto exactly (the same kernel),
math >= 98% of the bits per scale and a mean pixel difference <= 10."""
from __future__ import annotations

import collections
import sys
import types

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from varbench.engine.attn_backend import BACKENDS, attention_backend, check_backend
from varbench.testing.tiny import tiny_runtime

KW = dict(schedule=[(1, 1), (2, 2), (4, 4), (6, 6), (8, 8)], cfg=4.0, tau=1.0, top_k=0, top_p=0.0)
PROMPTS, SEEDS = ["a red circle", "two blue squares"], [0, 1]
FLASH_CPU = "_scaled_dot_product_flash_attention_for_cpu"


class _Ops(TorchDispatchMode):
    """Counts the aten ops that reach dispatch (math SDPA decomposes into bmm/softmax before it)."""

    def __init__(self):
        super().__init__()
        self.count = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def test_backends_without_a_cpu_kernel_or_package_are_refused_naming_the_fix():
    assert check_backend("auto", "cpu") is None and check_backend("math", "cpu") is None
    assert check_backend("flash", "cpu") is None and check_backend("cudnn", "cuda") is None
    assert "on the CPU use one of auto, math, flash" in check_backend("efficient", "cpu")
    assert "runtime.attn_backend must be one of" in check_backend("xformers", "cuda")
    if "flash_attn" not in sys.modules:
        try:
            import flash_attn  # noqa: F401
        except ImportError:
            assert "install it (pip install flash-attn" in check_backend("flash_attn", "cuda")
    assert set(BACKENDS) == {"auto", "math", "efficient", "flash", "cudnn", "flash_attn"}


def test_flash_attn_routes_sdpa_for_the_call_and_restores_it(monkeypatch):
    calls = []
    fake = types.ModuleType("flash_attn")
    fake.flash_attn_func = lambda q, k, v, p, softmax_scale=None, causal=False: calls.append(q.shape) or q
    monkeypatch.setitem(sys.modules, "flash_attn", fake)
    sdpa = F.scaled_dot_product_attention
    q = torch.randn(1, 2, 3, 4)
    with attention_backend("flash_attn"):
        assert F.scaled_dot_product_attention is not sdpa
        out = F.scaled_dot_product_attention(q, q, q)   # fp32 on the CPU: flash-attn cannot, SDPA serves it
    assert F.scaled_dot_product_attention is sdpa and calls == []
    torch.testing.assert_close(out, sdpa(q, q, q))


@pytest.mark.runtime
def test_math_and_flash_run_their_kernels_within_the_measured_bound():
    rt = tiny_runtime(0)
    out, ops = {}, {}
    for backend in ("auto", "flash", "math"):
        rt.attn_backend = backend
        with _Ops() as m:
            out[backend] = rt.generate(PROMPTS, SEEDS, **KW)
        ops[backend] = m.count
    # auto picks the CPU flash kernel; flash pins it; math runs none of it, and a softmax per call instead
    assert ops["auto"][FLASH_CPU] == ops["flash"][FLASH_CPU] > 0
    softmaxes = {backend: sum(n for name, n in c.items() if "softmax" in name) for backend, c in ops.items()}
    assert ops["math"][FLASH_CPU] == 0
    assert softmaxes["math"] - softmaxes["auto"] == ops["auto"][FLASH_CPU]   # one (safe) softmax per SDPA call
    for a, b in zip(out["auto"].bits, out["flash"].bits):
        assert torch.equal(a, b)
    for si, (a, b) in enumerate(zip(out["auto"].bits, out["math"].bits)):
        assert (a == b).float().mean().item() >= 0.98, si
    assert (out["auto"].images.float() - out["math"].images.float()).abs().mean().item() <= 10
    assert rt.knobs_summary()["attn_backend"] == "math"
