"""runtime.compile (varbench/engine/backbones/infinity/compiled.py): the block functions through
torch.compile, on the tiny model on the CPU, against the eager run.

Measured on the 2-core Xeon (torch 2.14.1, inductor's C++ backend), both at the default dispatch
and under ATEN_CPU_CAPABILITY=avx2 OMP_NUM_THREADS=1: a 3-scale generation of 2 images with CFG
compiled as 6 graphs (block_in/block_out x 3 token counts), no graph break, and every sampled bit,
the summed codes and the decoded pixels equal the eager run's (max |diff| 0). The bound asserted
leaves room for another CPU's fused kernels (a reordered reduction can flip a bit whose logit sits
at the sampling threshold): 99% of the bits per scale, and decoded pixels within a mean of 1 uint8
level (a wrong path, e.g. a compiled function fed the wrong constants, moves them by tens).
Compiling takes ~30 s on that machine (6 graphs, a fresh inductor cache), so it is a `slow` test."""
from __future__ import annotations

import pytest
import torch

from varbench.engine.backbones.infinity.compiled import EAGER_OPS, block_ops, compile_counters
from varbench.testing.tiny import tiny_runtime

SCHEDULE = [(1, 1), (2, 2), (4, 4)]   # the fewest shapes that still cover a 1-token, a small and a larger scale
KW = dict(schedule=SCHEDULE, cfg=4.0, tau=1.0, top_k=0, top_p=0.0)
PROMPTS, SEEDS = ["a red circle", "two blue squares"], [0, 1]


def test_off_is_the_eager_functions_themselves():
    # the default path calls today's block functions: no wrapper, so no bit can move
    assert block_ops("off") is EAGER_OPS
    assert tiny_runtime(0).block_ops is EAGER_OPS
    with pytest.raises(ValueError, match="runtime.compile must be one of"):
        block_ops("fast")


@pytest.mark.slow
@pytest.mark.runtime
def test_compiled_blocks_match_eager_within_the_measured_bound(tmp_path, monkeypatch):
    # a fresh inductor cache: kernels cached by a run at another ATEN_CPU_CAPABILITY gave NaN logits
    # under ATEN_CPU_CAPABILITY=avx2 here (measured; docs/gpu.md "Systems knobs")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    rt = tiny_runtime(0)
    ref = rt.generate(PROMPTS, SEEDS, **KW)
    before = compile_counters()
    rt.block_ops = block_ops("default", fullgraph=True)
    out = rt.generate(PROMPTS, SEEDS, **KW)
    after = compile_counters()
    # the compiled functions really ran: one graph per (function, token count), none broken
    assert after["unique_graphs"] - before["unique_graphs"] == 2 * len(SCHEDULE)
    assert after["graph_breaks"] == before["graph_breaks"]
    for si, (a, b) in enumerate(zip(ref.bits, out.bits)):
        assert (a == b).float().mean().item() >= 0.99, si
    assert (ref.images.float() - out.images.float()).abs().mean().item() <= 1.0
    # steady state: the second generation compiles nothing more and repeats the first's bits
    again = rt.generate(PROMPTS, SEEDS, **KW)
    assert compile_counters()["unique_graphs"] == after["unique_graphs"]
    assert torch.equal(again.summed_codes, out.summed_codes)
    # compile time apart from the steady state: the first compiled call compiled, the second did not
    log = rt.knobs_summary()["compile_log"]
    assert (log["calls"], log["compiling_calls"], log["graphs"]) == (2, 1, 2 * len(SCHEDULE))
    assert log["compiling_s"] == log["first_call_s"] > 0


@pytest.mark.parametrize("mode, graphs", [("default", True), ("reduce-overhead", False), ("max-autotune", False)])
def test_modes_with_their_own_cuda_graphs_turn_ours_off_at_auto(mode, graphs):
    import types

    from omegaconf import OmegaConf

    from varbench.harness.build import configure_runtime

    rt = types.SimpleNamespace(device=torch.device("cuda"))   # configure_runtime only reads the device
    configure_runtime(rt, OmegaConf.create({"cuda_graphs": "auto", "compile": mode}))
    assert rt.cuda_graphs is graphs and rt.block_ops.mode == mode
    configure_runtime(rt, OmegaConf.create({"cuda_graphs": "auto"}))
    assert rt.cuda_graphs is True and rt.block_ops is EAGER_OPS   # the default: today's behaviour
