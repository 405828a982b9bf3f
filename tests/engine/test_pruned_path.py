"""The pruned block path itself (issue #12 item 17), on the tiny runtime.

A block pruned to fixed kept indices must equal a DENSE forward of that block in which only the
kept tokens are updated: RoPE'd q/k/v are computed for every token of the grid at its true
position (the dense table, no gather of positions), then the kept tokens are selected as queries
(and, with prune_kv, as this scale's keys/values after the earlier scales' cached K/V); CA and FFN
run on the kept tokens; pruned positions keep their input (fill="pass") or receive the cached
scale's branch outputs area-resized to this grid (fill="cache"). The neutral-prune tests keep every
token, so they cannot see a kept token rotated at a wrong position; this test does (checked by
mutating `table[idx]` in `pruned.planned_block`: it fails).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from varbench.engine.backbones.infinity import pruned as pruned_mod
from varbench.engine.backbones.infinity.block_step import cross_attention, ffn, modulated_norm, qkv_rope, sa_out
from varbench.engine.plan import BlockPlan, ScalePlan
from varbench.engine.policy import Policy

#: generates with a tiny random runtime (seconds per test): the full run's tier, not plain `pytest`'s
pytestmark = pytest.mark.runtime

PN = "0.25M"
SCALE, BLOCK, CACHE = 6, 1, 5      # 16x16 grid, block 1; scale 5 (12x12) keeps residuals


class Scripted(Policy):
    name = "scripted"

    def __init__(self, fill, prune_kv):
        self.fill, self.prune_kv = fill, prune_kv

    def plan(self, si):
        if si == CACHE:
            return ScalePlan(keep_residuals=True)
        if si != SCALE:
            return ScalePlan()
        n = self.ctx.tokens(si)
        g = torch.Generator().manual_seed(5)
        k = n // 3
        # a different scattered subset per row (cond and uncond rows too)
        self.keep = torch.stack([torch.randperm(n, generator=g)[:k].sort().values for _ in range(self.ctx.rows)])
        bp = BlockPlan(mode="prune", keep=self.keep, n_keep=k, fill=self.fill,
                       cache_from=CACHE if self.fill == "cache" else None, prune_kv=self.prune_kv)
        return ScalePlan(blocks={BLOCK: bp})


def gather(x, idx):
    return x.gather(1, idx.unsqueeze(-1).expand(-1, -1, x.shape[-1]))


def reference(state, x, idx, fill, prune_kv, prev_k, prev_v):
    """Dense RoPE at true positions, then select the kept tokens; pruned positions filled."""
    bc = state.consts[BLOCK]
    h, w = state.sched[SCALE]
    rows, n, c = x.shape
    table = state.rt.rope_qkv((h, w), state.h_div_w)               # the dense (h*w) table
    rot = qkv_rope(bc, modulated_norm(x, bc.scale1, bc.shift1, bc.eps), table)   # (3, rows, H, n, hd)
    sel = rot.gather(3, idx[None, :, None, :, None].expand(3, -1, rot.shape[2], -1, rot.shape[4]))
    cur = sel if prune_kv else rot
    k = torch.cat([prev_k, cur[1]], dim=2)
    v = torch.cat([prev_v, cur[2]], dim=2)
    attn = F.scaled_dot_product_attention(sel[0], k, v, scale=1.0)

    def fill_of(sub):
        if fill == "pass":
            return torch.zeros_like(x)
        cached = state.residuals[CACHE][(BLOCK, sub)][:rows]
        hs, ws = state.sched[CACHE]
        grid = cached.transpose(1, 2).reshape(rows, c, hs, ws)
        return F.interpolate(grid, size=(h, w), mode="area").reshape(rows, c, n).transpose(1, 2)

    def update(x, sub, branch):
        full = fill_of(sub).scatter(1, idx.unsqueeze(-1).expand(-1, -1, c), branch)
        return x + full

    x = update(x, "sa", sa_out(bc, attn).float() * bc.g1)
    x = update(x, "ca", cross_attention(bc, gather(x, idx)).float())
    return update(x, "ffn", ffn(bc, gather(x, idx)).float() * bc.g2)


@pytest.mark.parametrize("prune_kv", [True, False])
@pytest.mark.parametrize("fill", ["pass", "cache"])
def test_pruned_block_equals_dense_forward_on_kept_tokens(tiny_rt, monkeypatch, fill, prune_kv):
    orig = pruned_mod.planned_block
    seen = {}

    def block(state, si, bi, x, bp, *a, **k):
        if (si, bi) == (SCALE, BLOCK):
            kv = state.kv.kv[bi]
            prev_k, prev_v = (t.narrow(2, 0, state.kv.len[bi]).clone() for t in kv.unbind(0))
            ref = reference(state, x.clone(), bp.keep, fill, prune_kv, prev_k, prev_v)
            out = orig(state, si, bi, x, bp, *a, **k)
            seen["out"], seen["ref"], seen["x"] = out, ref, x
            return out
        return orig(state, si, bi, x, bp, *a, **k)

    monkeypatch.setattr(pruned_mod, "planned_block", block)
    pol = Scripted(fill, prune_kv)
    out = tiny_rt.generate(["a red circle"], [0], pol, cfg=3.0, pn=PN, decode=False)
    assert out.trace[SCALE]["blocks"][BLOCK]["sa"] == pol.keep.shape[1]
    got, ref, x = seen["out"], seen["ref"], seen["x"]
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    pruned = torch.ones(x.shape[:2], dtype=torch.bool).scatter(1, pol.keep, False)
    if fill == "pass":                                   # pruned tokens pass through untouched
        assert torch.equal(got[pruned], x[pruned])
    else:                                                # and a cache fill really changes them
        assert not torch.allclose(got[pruned], x[pruned])
    assert not torch.allclose(got[~pruned], x[~pruned])   # kept tokens were computed
