"""SparseVAR's rules (varbench/policies/sparsevar.py) on hand-made signals: the release's anchor grid and its
candidate quirk, the keep count from the share above the threshold, and the plan's token maps."""
from __future__ import annotations

import pytest
import torch

from varbench.engine.plan import GenerationContext, ScaleSignals
from varbench.policies.sparsevar import SparseVAR, anchor_axis, anchor_candidates, decide, release_signal_blocks


def test_anchor_axis_appends_the_last_cell_as_the_release_does():
    """`generate_anchors_from_flat` tests `stride % n` (inverted): n-1 is appended for every n except the
    divisors of the stride, even when already on the grid (n=5: 4 twice)."""
    assert anchor_axis(40, 4).tolist() == list(range(0, 40, 4)) + [39]
    assert anchor_axis(5, 4).tolist() == [0, 4, 4]
    assert anchor_axis(4, 4).tolist() == [0]
    assert anchor_axis(3, 4).tolist() == [0, 2]


def test_release_candidates_are_the_first_four_anchors_for_every_token():
    anchors, cand = anchor_candidates(8, 8, 4, "release")
    assert anchors[:4].tolist() == [[0, 0], [0, 4], [0, 7], [4, 0]]
    assert torch.equal(cand, torch.arange(4).expand(64, -1))
    _, near = anchor_candidates(8, 8, 4, "nearest")
    far = 7 * 8 + 7                          # token (7, 7): its nearest anchor is itself, anchor (7, 7)
    assert anchors[near[far, 0]].tolist() == [7, 7]


def test_release_signal_blocks_are_chunk_3_of_8():
    assert release_signal_blocks(32) == (12, 15) and release_signal_blocks(40) == (15, 19)


def test_decide_keeps_the_largest_change_and_maps_the_rest():
    """A 2x2 change map upsampled to 4x4: the top-right cell's 4 tokens are the largest, kept; every pruned
    token either copies a candidate anchor (post_fill) or has its codes zeroed, never both."""
    change = torch.tensor([[0.1, 0.9, 0.2, 0.3]])
    logits = torch.randn(1, 4, 6, generator=torch.Generator().manual_seed(0))
    d = decide(change, logits, (2, 2), (4, 4), 4, 4, 0.8, "token")
    assert sorted(d.keep[0].tolist()) == [2, 3, 6, 7]
    assert d.pruned.shape == (1, 12) and not set(d.pruned[0].tolist()) & {2, 3, 6, 7}
    moved = d.post_fill[0] != torch.arange(16)
    assert not bool((moved & d.code_mask[0]).any())
    assert int(d.code_mask.sum()) + int(d.recover.sum()) == 12
    assert not bool(d.code_mask[0, [2, 3, 6, 7]].any())
    # the token layout: tokens upsampled from the same cell have identical features (similarity 1), so the
    # anchor (0, 0) recovers the 3 other tokens of its cell
    assert bool(d.recover[0, :2].all())


def _signals(si, h, w, change, rows=2):
    return ScaleSignals(scale=si, h=h, w=w, token_entropy=torch.zeros(1, h * w),
                        logits=torch.randn(1, h * w, 2, 2), cond_logits=None, attention_entropy={},
                        attention_query_index={}, executed_tokens={}, tau=1.0, cfg=3.0,
                        residual_change={(1, 2): change.expand(rows, -1).clone()})


def test_keep_count_is_the_share_above_the_threshold_times_the_next_grid():
    """3 of 16 tokens exceed 0.6 of the max at 4x4: the 8x8 scale keeps int(64 * 3/16) = 12 tokens in every
    block, pass-through, with the token maps set; the signal is asked from start-1 to the second-to-last scale."""
    ctx = GenerationContext(schedule=((1, 1), (2, 2), (4, 4), (8, 8)), depth=4, embed_dim=64, num_heads=2, batch=1,
                            cfg_rows=True, cfg=(3.0,) * 4, tau=(1.0,) * 4)
    pol = SparseVAR(start_prune_stage=3, signal_blocks=[1, 2])
    pol.reset(ctx)
    assert not pol.plan(1).residual_change_for
    p2 = pol.plan(2)
    assert p2.residual_change_for == frozenset({(1, 2)}) and not p2.blocks
    assert p2.input_resize == "area" and pol.plan(0).input_resize == "trilinear"   # the release, from scale 1
    change = torch.full((1, 16), 0.1)
    change[0, [3, 7, 9]] = torch.tensor([1.0, 0.7, 0.61])
    change[0, 0] = 0.6                                     # exactly 0.6 of the max: not above
    pol.observe(2, _signals(2, 4, 4, change))
    p3 = pol.plan(3)
    assert set(p3.blocks) == {0, 1, 2, 3}
    bp = p3.blocks[0]
    assert (bp.mode, bp.n_keep, bp.fill, bp.prune_kv) == ("prune", 12, "pass", True)
    assert p3.post_fill.shape == (1, 64) and p3.code_mask.shape == (1, 64)
    assert not p3.residual_change_for                      # the last scale: nothing left to plan from it
    assert pol.stats()["scales"][3]["kept"] == 12


def test_keep_multiple_rounds_the_count_up():
    """Bucketing: 12 kept tokens become 16 with keep_multiple 8 (the next-largest changes join)."""
    ctx = GenerationContext(schedule=((1, 1), (2, 2), (4, 4), (8, 8)), depth=4, embed_dim=64, num_heads=2, batch=1,
                            cfg_rows=True, cfg=(3.0,) * 4, tau=(1.0,) * 4)
    pol = SparseVAR(start_prune_stage=3, signal_blocks=[1, 2], keep_multiple=8)
    pol.reset(ctx)
    pol.plan(2)
    change = torch.full((1, 16), 0.1)
    change[0, [3, 7, 9]] = torch.tensor([1.0, 0.7, 0.61])
    pol.observe(2, _signals(2, 4, 4, change))
    assert pol.plan(3).blocks[0].n_keep == 16


def test_neutral_and_refusal():
    ctx = GenerationContext(schedule=((1, 1), (2, 2), (4, 4)), depth=4, embed_dim=64, num_heads=2, batch=1,
                            cfg_rows=True, cfg=(3.0,) * 3, tau=(1.0,) * 3)
    pol = SparseVAR(prune=False, start_prune_stage=2)
    pol.reset(ctx)
    assert all(not pol.plan(si).residual_change_for and not pol.plan(si).blocks for si in range(3))
    assert "HART" in SparseVAR().backbone_refusal("hart")
    with pytest.raises(ValueError, match="signal_blocks"):
        SparseVAR(signal_blocks=[3, 1])
