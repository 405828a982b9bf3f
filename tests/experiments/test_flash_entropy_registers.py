"""experiments/flash_entropy_registers.py: the fused entropy kernel compiled ahead of time for sm_90a (no GPU:
Triton's compiler and ptxas run on the CPU), and the launch overrides its `--time` mode uses."""
from __future__ import annotations

from unittest import mock

import pytest
import torch

pytest.importorskip("triton.backends.nvidia")
from experiments import flash_entropy_registers as fer  # noqa: E402


def test_the_runtime_default_fits_sm90a_registers_without_spilling():
    """The audit's reading, kept as a regression check: the default launch for head dim 128 (Infinity 2B/8B:
    BLOCK_M 128, BLOCK_N 64, 8 warps, 3 stages) compiles for sm_90a at <= 255 registers with no spill (a
    bigger tile would spill: e.g. BLOCK_N 128 with 4 warps spills 1,592 bytes), i.e. one 8-warp CTA per SM."""
    bm, bn, warps, stages = fer.default_config(128)
    assert (bm, bn, warps, stages) == (128, 64, 8, 3)
    r = fer.compile_config(90, bm, bn, 128, warps, stages)
    assert r["regs"] <= 255 and r["spill_bytes"] == 0 and r["stack"] == 0, r
    assert r["ctas_per_sm"] == 1 and r["warps_per_sm"] == 8, r


def test_the_capped_candidate_doubles_the_warps_per_sm():
    """The sweep's candidate for the device to time: 64x32 tiles, 8 warps, registers capped at 128 leave room
    for two CTAs per SM (16 warps) with at most a few bytes of spill (4 on triton 3.6 / 3.8's ptxas)."""
    r = fer.compile_config(90, 64, 32, 128, 8, 3, maxnreg=128)
    assert r["regs"] <= 128 and r["stack"] <= 16, r
    assert r["ctas_per_sm"] == 2 and r["warps_per_sm"] == 16, r


def test_launch_overrides_reach_the_kernel_launch():
    """`num_warps` / `maxnreg` given to flash_attention_with_entropy are the GPU launch's (fake CUDA: the
    wrapper takes its CUDA path; the launch is recorded instead of run); without them, `_launch_config`'s."""
    from varbench.engine.kernels import flash_entropy as fe
    from varbench.testing.fake_cuda import FakeCuda

    launches = []

    class Recorder:
        def __call__(self, interpret):
            assert not interpret
            return self

        def __getitem__(self, grid):
            return lambda *a, **kw: launches.append((grid, {k: v for k, v in kw.items() if k.isupper() or k in
                                                            ("num_warps", "num_stages", "maxnreg")}))

    # patched inside FakeCuda's own patch of `kernel` (and undone before it), so both restore the real one
    with FakeCuda(), mock.patch.object(fe, "kernel", Recorder()):
        q, k, v = (torch.empty(2, 16, n, 128, dtype=torch.bfloat16, device="cuda") for n in (1024, 2521, 2521))
        fe.flash_attention_with_entropy(q, k, v)
        fe.flash_attention_with_entropy(q, k, v, block_m=64, block_n=32, num_warps=8, maxnreg=128)
    (g0, kw0), (g1, kw1) = launches
    assert g0 == (8, 32) and kw0 == dict(BLOCK_M=128, BLOCK_N=64, BLOCK_D=128, EMULATE_BF16=False, HAS_BIAS=False, num_warps=8,
                                          num_stages=3)
    assert g1 == (16, 32) and kw1 == dict(BLOCK_M=64, BLOCK_N=32, BLOCK_D=128, EMULATE_BF16=False, HAS_BIAS=False, num_warps=8,
                                          num_stages=3, maxnreg=128)
