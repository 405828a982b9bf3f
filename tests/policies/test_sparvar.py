"""SparVAR's policy (varbench/policies/sparvar.py): the plans it emits and where it refuses.

The release equivalence is tests/engine/test_sparvar_release.py; the seam is tests/engine/test_sparse_attention.py.
"""
from __future__ import annotations

import pytest
import torch

from varbench.core.errors import ConfigError
from varbench.engine.backbones.infinity.schedules import scale_schedule
from varbench.engine.plan import GenerationContext
from varbench.policies import build_policy
from varbench.policies.scalekv import synthetic_budgets
from varbench.policies.sparvar import SparVAR
from varbench.policies.sparvar_patterns import csla_block_mask, local_band


def _ctx(pn="1M", depth=32, batch=1):
    sched = tuple(scale_schedule(1.0, pn))
    n = len(sched)
    return GenerationContext(schedule=sched, depth=depth, embed_dim=2048, num_heads=16, batch=batch, cfg_rows=True,
                             cfg=(4.0,) * n, tau=(1.0,) * n)


def test_release_defaults_plan_cs4a_below_the_bound_and_csla_above_from_40():
    pol = SparVAR()
    pol.reset(_ctx())
    kinds = {si: {bi: pol.plan(si).attn.get(bi) for bi in (0, 10, 11, 31)} for si in (9, 10, 11, 12)}
    assert all(ap is None for ap in kinds[9].values())                    # 32²: dense everywhere
    assert [kinds[10][b].kind for b in (0, 10, 11, 31)] == ["decide", "decide", "block_mask", "block_mask"]
    assert [kinds[12][b].kind for b in (0, 10, 11, 31)] == ["indexed", "indexed", "block_mask", "block_mask"]
    assert kinds[10][0].n_keys == 784 and kinds[12][0].local.shape == (22, 784)


def test_skip_and_cond_only_variants():
    pol = SparVAR(skip_last_scales=2, drop_uncond_last_scales=3)
    pol.reset(_ctx())
    assert [pol.plan(si).run for si in (10, 11, 12)] == [True, False, False]
    assert [pol.plan(si).drop_uncond for si in (9, 10)] == [False, True]


def test_a_short_schedule_says_why_nothing_happens():
    pol = SparVAR()
    pol.reset(_ctx("0.06M"))                                             # 7 scales: no scale 10
    assert all(not pol.plan(si).attn for si in range(7))
    assert "40²-64²" in pol.no_effect_reason()


def test_window_lists_must_cover_the_schedule():
    pol = SparVAR(cs4a_ws=[1, 1, 1])
    with pytest.raises(ValueError, match="cs4a_ws has 3 entries; the schedule has 13"):
        pol.reset(_ctx())


def test_too_few_keys_after_rounding_is_refused():
    pol = SparVAR(top_keys=0.01)                                          # 0.01 * 4121 = 41 -> round(41/112) = 0
    with pytest.raises(ValueError, match="keeps no key"):
        pol.reset(_ctx())


def test_refused_on_hart_and_beside_a_kv_budget():
    assert "Infinity" in SparVAR().backbone_refusal("hart")
    assert SparVAR().backbone_refusal("infinity") is None
    with pytest.raises(ConfigError, match="ScaleKV evicts cache positions"):
        build_policy("compose", policies=[{"name": "sparvar"}, {"name": "scalekv", "knobs": {
            "budgets": synthetic_budgets(scale_schedule(1.0, "1M"), 32)}}])


def test_mlp_sparsity_has_no_on_setting():
    with pytest.raises(ConfigError, match="mlp_sparsity"):
        SparVAR(mlp_sparsity="on")


def test_local_band_is_contiguous_and_covers_each_groups_windows():
    sched = scale_schedule(1.0, "1M")
    band = local_band(sched, 11, 7, 192, 112)
    assert bool((band.diff(dim=1) == 1).all())                          # one contiguous run per group
    # group 0 (rows 0-3 of 48): its 7x7 windows reach rows 0-6, all 48 columns: 336 keys from 4,121 on
    assert band[0, 0] == 4121 and band[0, -1] >= 4121 + 7 * 48 - 1


def test_csla_sink_and_windows():
    sched = scale_schedule(1.0, "1M")
    blocks, token = csla_block_mask(sched, 10, 5, [-1] * 8 + [1, 1, 3, 5, 7], 128)
    assert bool(token[:, :121].all())                                    # scales 0-4 (121 keys): the sink
    assert not token[:, 121:921].any()                                   # scales 5-7: window -1, nothing
    # own-scale window at 40² is 3x3 (win 3, half 1): query 41 (row 1, col 1) sees rows 0-2, cols 0-2 of 40²
    own = token[41, 2521:4121].view(40, 40)
    assert int(own.sum()) == 9 and bool(own[:3, :3].all())
    # every token pair the mask allows lies in an allowed 128x128 block
    n, length = token.shape
    dil = blocks.repeat_interleave(128, 0).repeat_interleave(128, 1)[:n, :length]
    assert bool((dil | ~token).all())
