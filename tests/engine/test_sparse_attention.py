"""The attention-plan seam (`ScalePlan.attn`, varbench/engine/sparse_attention.py) on its own terms.

Each test states why its expected value is right. The release equivalence (kept keys and tokens
against Lvar's SparVAR) is tests/engine/test_sparvar_release.py.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from varbench.engine.flops import plan_trace
from varbench.engine.plan import AttnPlan, ScalePlan, is_neutral
from varbench.engine.sparse_attention import (AttnMemory, decide, gathered_attention, group_column_sums, indexed,
                                              map_groups, mask_pairs, token_mask, upsample_o_cache)
from varbench.policies.sparvar import SparVAR
from varbench.testing.tiny import tiny_runtime

#: fp32 attention over the same keys computed per group vs at once: summation order only (measured
#: max 2.4e-7 on AVX-512 and AVX2 paths for unit-scale inputs of these sizes)
ATOL = 2e-6


def _qkv(seed=0, rows=2, heads=2, n=50, length=80, c=8):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(rows, heads, m, c, generator=g) for m in (n, length, length))


def test_gathered_attention_over_every_key_is_dense_attention():
    # each group attends to all keys in cache order: the same softmax as dense attention
    q, k, v = _qkv()
    n, length = q.shape[2], k.shape[2]
    groups = -(-n // 16)
    every = torch.arange(length).expand(2, 2, groups, -1)
    got = gathered_attention(q, k, v, every, 16)
    want = F.scaled_dot_product_attention(q, k, v, scale=1.0)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


def test_gathered_attention_renormalises_over_the_kept_keys():
    # one group keeping keys {3, 7}: softmax over those two scores only
    q, k, v = _qkv(n=4, length=10)
    idx = torch.tensor([3, 7]).expand(2, 2, 1, 2)
    got = gathered_attention(q, k, v, idx, 4)
    s = q @ k[:, :, [3, 7]].transpose(-1, -2)
    want = s.softmax(-1) @ v[:, :, [3, 7]]
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


def test_group_column_sums_sum_softmax_rows_of_each_group():
    q, k, _ = _qkv(n=21, length=30)
    cs = group_column_sums(q, k, 8)                       # groups of 8, 8, 5 queries
    p = (q @ k.transpose(-1, -2)).softmax(-1)
    want = torch.stack([p[:, :, 0:8].sum(2), p[:, :, 8:16].sum(2), p[:, :, 16:21].sum(2)], dim=2)
    torch.testing.assert_close(cs, want, atol=ATOL, rtol=0)
    # each softmax row sums to 1, so a group's column sums add up to its query count
    torch.testing.assert_close(cs.sum(-1), torch.tensor([8.0, 8.0, 5.0]).expand(2, 2, 3), atol=1e-5, rtol=0)


def test_decide_returns_the_dense_output_bit_for_bit_and_keeps_the_top_column_sums():
    q, k, v = _qkv()
    ap = AttnPlan("decide", group=16, n_keys=12)
    o, mem, counts = decide(q, k, v, ap)
    assert torch.equal(o, F.scaled_dot_product_attention(q, k, v, scale=1.0))
    cs = group_column_sums(q, k, 16)
    kept = torch.zeros_like(cs, dtype=torch.bool).scatter_(-1, mem.indices, True)
    # every kept key's column sum is >= every dropped key's, per (row, head, group)
    lo = cs.masked_fill(~kept, float("inf")).amin(-1)
    hi = cs.masked_fill(kept, float("-inf")).amax(-1)
    assert bool((lo >= hi).all())
    # O_cache = O - O_hat
    torch.testing.assert_close(mem.o_cache, o - gathered_attention(q, k, v, mem.indices, 16), atol=0, rtol=0)
    assert counts == {"attn_pairs": 50 * 80, "attn_extra_pairs": 50 * 80 + 2 * 50 * 12}


def test_indexed_with_all_keys_remembered_reproduces_dense_attention():
    # remembering every key: O_hat = O, so O_cache = 0 and the indexed output is dense attention again
    q, k, v = _qkv(n=36, length=60)
    _, mem, _ = decide(q, k, v, AttnPlan("decide", group=12, n_keys=60))
    mem = dataclasses.replace(mem, grid=(6, 6))
    o, _, kept = indexed(q, k, v, AttnPlan("indexed", group=12), mem, (6, 6))
    torch.testing.assert_close(o, F.scaled_dot_product_attention(q, k, v, scale=1.0), atol=ATOL, rtol=0)
    assert kept.indices.shape == (2, 2, 3, 60)


def test_map_groups_takes_the_nearest_centre():
    # 3 remembered groups (centres 1/6, 1/2, 5/6) -> 5 groups (centres 0.1 .. 0.9): nearest 0, 0, 1, 2, 2
    idx = torch.arange(3).view(1, 1, 3, 1).float()
    assert map_groups(idx, 5).flatten().tolist() == [0, 0, 1, 2, 2]
    # 9 (40² in groups of 192) -> 12 (48²): round((g + .5) * 9/12 - .5) = round(.75 g - .125)
    idx = torch.arange(9).view(1, 1, 9, 1).float()
    assert map_groups(idx, 12).flatten().tolist() == [0, 1, 1, 2, 3, 4, 4, 5, 6, 7, 7, 8]
    # 4 -> 2: round(2g + .5) = round(.5), round(2.5): exact ties go to even, as torch.round does
    idx = torch.arange(4).view(1, 1, 4, 1).float()
    assert map_groups(idx, 2).flatten().tolist() == [0, 2]


def test_upsample_o_cache_keeps_a_constant_field_and_matches_interpolate():
    o = torch.full((1, 2, 16, 3), 0.25)
    assert torch.equal(upsample_o_cache(o, (4, 4), (6, 6)), torch.full((1, 2, 36, 3), 0.25))
    x = torch.randn(2, 3, 20, 5)
    got = upsample_o_cache(x, (4, 5), (8, 10))
    want = F.interpolate(x.permute(0, 1, 3, 2).reshape(6, 5, 4, 5), size=(8, 10), mode="bilinear", align_corners=False)
    assert torch.equal(got, want.reshape(2, 3, 5, 80).permute(0, 1, 3, 2))


def test_mask_pairs_counts_the_token_mask():
    pat = torch.tensor([[True, False, True], [False, True, True]])
    assert mask_pairs(pat, 4, 7, 10) == int(token_mask(pat, 4, 7, 10).sum())
    # by hand: rows 4 + 3 tokens, columns 4, 4, 2: row block 0 -> 4*(4+2), row block 1 -> 3*(4+2)
    assert mask_pairs(pat, 4, 7, 10) == 4 * 6 + 3 * 6


def test_decide_alone_is_neutral_indexed_and_block_mask_are_not():
    assert is_neutral(ScalePlan(attn={0: AttnPlan("decide", n_keys=4)}))
    assert not is_neutral(ScalePlan(attn={0: AttnPlan("indexed")}))
    assert not is_neutral(ScalePlan(attn={0: AttnPlan("block_mask", block_mask=torch.ones(1, 1, dtype=torch.bool))}))


def test_indexed_before_any_decision_is_refused():
    rt = tiny_runtime(0)

    class Early(SparVAR):
        def plan(self, si):
            return ScalePlan(attn={0: AttnPlan("indexed", group=4)}) if si == 2 else ScalePlan()

    with pytest.raises(ValueError, match="needs an earlier 'decide'"):
        rt.generate(["a"], seeds=[0], pn="0.06M", policy=Early(**SparVAR.ACTIVE))


def test_analytic_trace_counts_the_pairs_the_runtime_scored():
    # plan_trace (what CI's FLOPs table uses, no model run) must record the same attention pairs as the run
    rt = tiny_runtime(0)
    pol = SparVAR(**SparVAR.ACTIVE)
    out = rt.generate(["a red circle"], seeds=[0], pn="0.06M", policy=pol)
    plans = []
    pol.reset(pol.ctx)
    plans = [pol.plan(si) for si in range(len(pol.ctx.schedule))]
    tt = {r: out.trace[0]["text_tokens"] for r in (1, 2)}
    analytic = plan_trace(pol.ctx.schedule, plans, pol.ctx.depth, 1, True, tt)
    for got, want in zip(analytic, out.trace):
        for a, b in zip(got["blocks"], want["blocks"]):
            assert a.get("attn_pairs") == b.get("attn_pairs") and a.get("attn_extra_pairs") == b.get("attn_extra_pairs")
    assert any(b.get("attn_pairs") for tr in out.trace for b in tr["blocks"])


def test_attention_memory_is_in_the_trace():
    rt = tiny_runtime(0)
    out = rt.generate(["a red circle"], seeds=[0], pn="0.06M", policy=SparVAR(**SparVAR.ACTIVE))
    by_scale = [tr.get("attn_memory_bytes", 0) for tr in out.trace]
    assert by_scale[2] == 0 and by_scale[3] > 0     # nothing before the decision at scale 3
    # at the decision: block 0's indices (2 rows, H heads, 5 groups of 8 over 36 queries, 16 keys, int64)
    # and its O_cache (2 rows, H, 36 queries, head dim, fp32)
    cfg = rt.cfg
    heads, c = cfg.num_heads, cfg.embed_dim // cfg.num_heads
    assert by_scale[3] == 2 * heads * 5 * 16 * 8 + 2 * heads * 36 * c * 4
