"""runtime.quant (varbench/engine/backbones/infinity/quant.py): torchao INT8 weight-only on the tiny
model on the CPU; FP8's refusal off a GPU.

Measured on the 2-core Xeon (torch 2.14.1, torchao 0.18.0; the same at ATEN_CPU_CAPABILITY=avx2
OMP_NUM_THREADS=1): a 5-scale generation of 2 images with CFG (top_k=0 sampling) keeps 99.5% or more
of the sampled bits per scale (1.0, 1.0, 0.998, 0.9965, 0.9951) and the decoded uint8 pixels differ
by 5.3 levels on average. The bounds asserted: >= 98% of the bits per scale and a mean pixel
difference in (0, 15]: above 0 because the quantised weights must change something (a path that
silently ignored them would give 0), at most 15 (about 3x the measured cost: a broken scale or
transposed weight gives noise, tens of levels)."""
from __future__ import annotations

import pytest
import torch

from varbench.engine.plan import ScalePlan
from varbench.engine.policy import Policy
from varbench.engine.backbones.infinity.quant import BLOCK_LINEARS, fp8_refusal, quantise_blocks, quantised_weight_dtypes
from varbench.testing.tiny import tiny_runtime

KW = dict(schedule=[(1, 1), (2, 2), (4, 4), (6, 6), (8, 8)], cfg=4.0, tau=1.0, top_k=0, top_p=0.0)
PROMPTS, SEEDS = ["a red circle", "two blue squares"], [0, 1]


def test_none_leaves_the_blocks_alone():
    rt = tiny_runtime(0)
    before = {p: rt.model.blocks[0].get_submodule(p).weight for p in BLOCK_LINEARS}
    quantise_blocks(rt, "none")
    assert rt.quant == "none"
    assert all(rt.model.blocks[0].get_submodule(p).weight is w for p, w in before.items())   # the same tensors
    with pytest.raises(ValueError, match="runtime.quant must be one of"):
        quantise_blocks(rt, "int4")


def test_fp8_is_refused_off_a_gpu_naming_the_fix():
    assert "use runtime.quant=int8_weight_only" in fp8_refusal("cpu")


@pytest.mark.runtime
def test_int8_weight_only_stores_int8_and_stays_within_the_measured_bound():
    pytest.importorskip("torchao")
    rt = tiny_runtime(0)
    ref = rt.generate(PROMPTS, SEEDS, **KW)
    quantise_blocks(rt, "int8_weight_only")
    assert quantised_weight_dtypes(rt) == {p: "int8" for p in BLOCK_LINEARS}
    assert type(rt.model.blocks[0].ffn.fc1.weight).__name__ == "Int8Tensor"
    # the embeddings and the once-per-generation linears stay as they were
    assert rt.model.blocks[0].ca.mat_kv.weight.dtype == torch.float32
    # the record's weight bytes count the int8 payload: each quantised linear holds 1 byte per weight
    # (+ an fp32 scale and an int8 zero point per output channel) instead of 4
    from varbench.engine.memory import module_bytes

    lin = rt.model.blocks[0].ffn.fc1
    assert module_bytes(lin) == lin.weight.qdata.numel() + (4 + 1) * lin.out_features + 4 * lin.bias.numel()
    out = rt.generate(PROMPTS, SEEDS, **KW)
    for si, (a, b) in enumerate(zip(ref.bits, out.bits)):
        assert (a == b).float().mean().item() >= 0.98, si
    diff = (ref.images.float() - out.images.float()).abs().mean().item()
    assert 0 < diff <= 15
    # a CFG-dropping plan cuts the constants' rows: the (out, in) quantised weights must survive it
    dropped = rt.generate(PROMPTS, SEEDS, _DropUncondFrom(3), **KW)
    assert dropped.images.shape == out.images.shape
    assert [tr["rows"] for tr in dropped.trace][2:4] == [4, 2]   # the plan did drop the CFG rows


class _DropUncondFrom(Policy):
    """Drops the unconditional rows from scale `first` on."""

    name = "drop_uncond_from"

    def __init__(self, first):
        self.first = first

    def plan(self, si):
        return ScalePlan(drop_uncond=si >= self.first)


class _ScaleKVOnBlock0(Policy):
    """Keeps 8 cache positions of block 0 from scale 3 on, chosen by ScaleKV's selector (its window
    queries come from the block's q projection: the quantised weight's path in `apply_kv_budget`)."""

    name = "scalekv_block0"

    def plan(self, si):
        from varbench.engine.plan import KVBudget
        from varbench.policies.scalekv import ScaleKVSelector

        return ScalePlan(kv={0: KVBudget(8, selector=ScaleKVSelector(), sel_queries=16)} if si >= 3 else {})


@pytest.mark.runtime
def test_int8_weights_serve_a_kv_budgets_query_projection():
    pytest.importorskip("torchao")
    rt = tiny_runtime(0)
    ref = rt.generate(PROMPTS, SEEDS, _ScaleKVOnBlock0(), **KW)
    quantise_blocks(rt, "int8_weight_only")
    out = rt.generate(PROMPTS, SEEDS, _ScaleKVOnBlock0(), **KW)
    assert [tr["blocks"][0].get("kv_kept") for tr in out.trace[3:]] == [8, 8]    # the budget held under int8
    # the selection read int8 queries: the images stay within the unbudgeted run's measured bound
    assert (ref.images.float() - out.images.float()).abs().mean().item() <= 15
