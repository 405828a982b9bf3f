"""The general seams SparseVAR needs (varbench/engine/plan.py), on the tiny runtime:

- `ScalePlan.residual_change_for` -> `ScaleSignals.residual_change`: per token, the mean over channels of
  the squared change of the residual stream across a block range;
- `ScalePlan.post_fill`: after the last block, each token takes a chosen source token's hidden state;
- `ScalePlan.code_mask`: tokens whose sampled codes are not added to the summed codes.

Each is checked against an independent computation (the stream captured around the blocks, the
baseline's own logits, the codes of the bits), and a request that only observes leaves the bits of the
baseline unchanged.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from varbench.engine.backbones.infinity.bsq_vae import bits_to_codes
from varbench.engine.backbones.infinity.state import GenState
from varbench.engine.batch_split import merge_plans, plan_signature
from varbench.engine.plan import BlockPlan, ScalePlan, is_neutral
from varbench.engine.policy import Policy

pytestmark = pytest.mark.runtime

PN = "0.06M"          # 7 scales, up to 16x16 (tests/conftest.py TINY_BASELINE)
SCALE = 5             # 12x12


class Scripted(Policy):
    """Plans `plans[si]` (a callable of the context) at the scales it names, neutral elsewhere; keeps
    the signals it observes."""
    name = "scripted"

    def __init__(self, plans):
        self.plans = plans
        self.seen = {}

    def plan(self, si):
        make = self.plans.get(si)
        return make(self.ctx) if make else ScalePlan()

    def observe(self, si, signals):
        self.seen[si] = dataclasses.replace(signals, summed_codes=signals.summed_codes.clone())


def _gen(rt, policy, prompts=("a red circle",), seeds=(0,)):
    return rt.generate(list(prompts), list(seeds), policy, cfg=3.0, tau=1.0, pn=PN, decode=False)


def test_residual_change_is_the_streams_change_across_the_range(tiny_rt, tiny_baseline, monkeypatch):
    """Entering block 1 and leaving block 2 at SCALE, captured around the lean block itself: the signal
    is mean_C((out - in)^2) per row, both CFG halves; asking for it changes no bit."""
    seen = {}
    orig = GenState.full_block

    def spy(self, si, bi, x):
        out = orig(self, si, bi, x)
        if si == SCALE:
            seen[("in", bi)], seen[("out", bi)] = x.clone(), out.clone()
        return out

    monkeypatch.setattr(GenState, "full_block", spy)
    pol = Scripted({SCALE: lambda ctx: ScalePlan(residual_change_for=frozenset({(1, 2), (0, 0)}))})
    out = _gen(tiny_rt, pol)
    sig = pol.seen[SCALE].residual_change
    assert set(sig) == {(1, 2), (0, 0)}
    want = ((seen[("out", 2)] - seen[("in", 1)]) ** 2).mean(-1)
    assert sig[(1, 2)].shape == (2, 144)                    # [cond; uncond] rows, 12x12 tokens
    assert torch.equal(sig[(1, 2)], want)
    assert torch.equal(sig[(0, 0)], ((seen[("out", 0)] - seen[("in", 0)]) ** 2).mean(-1))
    assert not torch.equal(sig[(1, 2)][0], sig[(1, 2)][1])   # the halves are not averaged by the runtime
    for a, b in zip(out.bits, tiny_baseline.bits):
        assert torch.equal(a, b)
    assert all(not s.residual_change for k, s in pol.seen.items() if k != SCALE)


def test_residual_change_is_zero_exactly_on_tokens_pruned_with_pass(tiny_rt):
    keep = torch.arange(0, 144, 3).view(1, -1)
    bp = BlockPlan(mode="prune", keep=keep, n_keep=keep.shape[1], fill="pass")
    pol = Scripted({SCALE: lambda ctx: ScalePlan(blocks={b: bp for b in range(4)}, residual_change_for=frozenset({(1, 2)}))})
    _gen(tiny_rt, pol)
    sig = pol.seen[SCALE].residual_change[(1, 2)]
    pruned = torch.ones(144, dtype=torch.bool)
    pruned[keep[0]] = False
    assert torch.equal(sig[:, pruned], torch.zeros_like(sig[:, pruned]))
    assert bool((sig[:, ~pruned] > 0).all())


def test_post_fill_copies_source_tokens_per_image_in_both_cfg_halves(tiny_rt):
    """Image 0's tokens all take token 0's state, image 1's token 7's: each image's guided logits (which
    mix its cond and uncond rows) at SCALE then equal the baseline's at that source token, for every token;
    an identity map changes nothing."""
    prompts, seeds = ("a red circle", "a blue square"), (0, 1)
    base = Scripted({})
    base_out = _gen(tiny_rt, base, prompts, seeds)
    src = torch.stack([torch.zeros(144, dtype=torch.long), torch.full((144,), 7)])
    pol = Scripted({SCALE: lambda ctx: ScalePlan(post_fill=src)})
    out = _gen(tiny_rt, pol, prompts, seeds)
    got, ref = pol.seen[SCALE].logits, base.seen[SCALE].logits
    for i, s in enumerate((0, 7)):
        torch.testing.assert_close(got[i], ref[i, s].expand_as(got[i]), rtol=0, atol=1e-6)
    assert not out.image_traces[0][SCALE]["neutral"]

    ident = Scripted({SCALE: lambda ctx: ScalePlan(post_fill=torch.arange(144).expand(2, -1))})
    out_id = _gen(tiny_rt, ident, prompts, seeds)
    assert torch.equal(ident.seen[SCALE].logits, ref)
    for a, b in zip(out_id.bits, base_out.bits):
        assert torch.equal(a, b)


def test_code_mask_zeroes_exactly_the_masked_tokens_codes(tiny_rt, tiny_baseline):
    """At the last scale (16x16, codes added without interpolation) the summed codes differ from the
    baseline by exactly the masked tokens' codes, and nowhere else; the bits are unchanged."""
    last = 6
    mask = torch.zeros(1, 256, dtype=torch.bool)
    mask[0, [0, 17, 255]] = True
    pol = Scripted({last: lambda ctx: ScalePlan(code_mask=mask)})
    out = _gen(tiny_rt, pol)
    for a, b in zip(out.bits, tiny_baseline.bits):
        assert torch.equal(a, b)
    codes = bits_to_codes(tiny_baseline.bits[last].view(1, 16, 16, -1)).permute(0, 3, 1, 2)   # (1, d, 16, 16)
    diff = (tiny_baseline.summed_codes - out.summed_codes).squeeze(2)                         # (1, d, 16, 16)
    flat = diff.flatten(2)
    assert torch.equal(flat[..., ~mask[0]], torch.zeros_like(flat[..., ~mask[0]]))
    torch.testing.assert_close(flat[..., mask[0]], codes.flatten(2)[..., mask[0]], rtol=0, atol=1e-6)


def test_code_mask_under_patchify_covers_the_tokens_2x2_latent_block():
    """The 8B's 2x2 patchify: token (0, 1) of a 2x2 grid owns latent rows 0-1, columns 2-3."""
    st = object.__new__(GenState)
    st.patch, st.sched, st.latent_size = 2, [(2, 2)], (1, 4, 4)
    st.summed_codes = torch.zeros(1, 4, 1, 4, 4)
    bits = torch.ones(1, 2, 2, 16, dtype=torch.long)
    mask = torch.tensor([[False, True, False, False]])
    st._accumulate(0, bits, mask)
    zero = st.summed_codes[0, :, 0] == 0
    assert bool(zero[:, 0:2, 2:4].all())
    assert not bool(zero[:, 2:, :].any()) and not bool(zero[:, 0:2, 0:2].any())


def test_token_maps_are_checked_and_not_neutral():
    plan = ScalePlan(post_fill=torch.zeros(1, 10, dtype=torch.long))
    with pytest.raises(ValueError, match="post_fill must be"):
        plan.validate_token_maps(1, 12, 4)
    with pytest.raises(ValueError, match="code_mask must be"):
        ScalePlan(code_mask=torch.zeros(1, 12, dtype=torch.long)).validate_token_maps(1, 12, 4)
    with pytest.raises(ValueError, match="residual_change_for"):
        ScalePlan(residual_change_for=frozenset({(2, 4)})).validate_token_maps(1, 12, 4)
    assert not is_neutral(plan) and not is_neutral(ScalePlan(code_mask=torch.zeros(1, 12, dtype=torch.bool)))
    assert is_neutral(ScalePlan(residual_change_for=frozenset({(0, 3)})))


def test_per_image_plans_stack_their_token_maps_and_group_by_presence():
    a = ScalePlan(post_fill=torch.zeros(1, 4, dtype=torch.long), code_mask=torch.tensor([[True, False, False, False]]))
    b = ScalePlan(post_fill=torch.ones(1, 4, dtype=torch.long), code_mask=torch.tensor([[False, False, False, True]]))
    assert plan_signature(a) == plan_signature(b)
    assert plan_signature(a) != plan_signature(ScalePlan())
    assert plan_signature(ScalePlan(residual_change_for=frozenset({(0, 1)}))) != plan_signature(ScalePlan())
    m = merge_plans([a, b], cfg_rows=True)
    assert torch.equal(m.post_fill, torch.tensor([[0, 0, 0, 0], [1, 1, 1, 1]]))
    assert torch.equal(m.code_mask, torch.tensor([[True, False, False, False], [False, False, False, True]]))


def test_area_input_resize_makes_the_scale_input_from_area_averaged_codes(tiny_rt, tiny_baseline, monkeypatch):
    """`input_resize="area"` at SCALE: the stream entering block 0 is the word embedding of the summed codes
    so far, area-resized to 12x12, plus the level embedding (checked against that computation); the
    default (trilinear) input differs from it, and the earlier scales' bits are the baseline's."""
    import torch.nn.functional as F

    seen = {}
    orig = GenState.full_block

    def spy(self, si, bi, x):
        if si == SCALE and bi == 0:
            seen["x"] = x.clone()
        return orig(self, si, bi, x)

    monkeypatch.setattr(GenState, "full_block", spy)
    pol = Scripted({SCALE: lambda ctx: ScalePlan(input_resize="area")})
    out = _gen(tiny_rt, pol)
    codes = pol.seen[SCALE - 1].summed_codes
    m = tiny_rt.model
    for mode, equal in (("area", True), ("trilinear", False)):
        nxt = F.interpolate(codes, size=(1, 12, 12), mode=mode).squeeze(-3).reshape(1, codes.shape[1], -1).permute(0, 2, 1)
        want = tiny_rt.embed_codes(nxt).repeat(2, 1, 1) + m.lvl_embed.weight[SCALE]
        assert torch.equal(seen["x"], want) == equal, mode
    for si in range(SCALE):
        assert torch.equal(out.bits[si], tiny_baseline.bits[si])
    assert not is_neutral(ScalePlan(input_resize="area"))
