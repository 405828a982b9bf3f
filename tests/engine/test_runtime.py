"""The Infinity runtime: determinism, batch invariance, plan execution, signals, accounting."""
import math

import pytest
import torch

from varbench.engine.attention import attention_entropy
from varbench.engine.backbones.infinity.flops import scale_flops, text_flops
from varbench.engine.backbones.infinity.model import PRESETS
from varbench.engine.backbones.infinity.schedules import scale_schedule
from varbench.engine.flops import plan_trace
from varbench.engine.plan import BlockPlan, ScalePlan
from varbench.engine.policy import Policy

#: generates with a tiny random runtime (seconds per test): the full run's tier, not plain `pytest`'s
pytestmark = pytest.mark.runtime

PN = "0.25M"


class ScriptedPolicy(Policy):
    """Emits plans from a function of (scale index, context)."""

    name = "scripted"

    def __init__(self, fn):
        self.fn = fn
        self.seen = []

    def plan(self, si):
        return self.fn(si, self.ctx)

    def observe(self, si, signals):
        self.seen.append(signals)


def gen(rt, policy=None, prompts=("a red circle",), seeds=(0,), **kw):
    kw.setdefault("pn", PN)
    kw.setdefault("cfg", 3.0)
    return rt.generate(list(prompts), list(seeds), policy, **kw)


def test_same_seed_same_image_at_batch_1_and_inside_batch_of_4(tiny_rt):
    alone = gen(tiny_rt, prompts=["two blue squares"], seeds=[7])
    batch = gen(tiny_rt, prompts=["a cat", "a dog", "two blue squares", "a red circle"], seeds=[1, 2, 7, 3])
    for a, b in zip(alone.bits, batch.bits):
        assert torch.equal(a[0], b[2])
    assert torch.equal(alone.images[0], batch.images[2])
    # and the neighbours really are different images
    assert not torch.equal(batch.images[0], batch.images[2])


def test_two_generations_in_a_row_are_identical_and_seeds_matter(tiny_rt):
    a, b = gen(tiny_rt, seeds=[3]), gen(tiny_rt, seeds=[3])
    c = gen(tiny_rt, seeds=[4])
    assert torch.equal(a.images, b.images)
    assert not torch.equal(a.images, c.images)


def _all_blocks(ctx, bp_fn):
    return {bi: bp_fn(bi) for bi in range(ctx.depth)}


@pytest.mark.parametrize("fill", ["pass", "cache"])
@pytest.mark.parametrize("how", ["keep", "selector"])
def test_neutral_prune_plan_reproduces_baseline_bit_for_bit(tiny_rt, fill, how):
    base = gen(tiny_rt, seeds=[11])

    def plan(si, ctx):
        n = ctx.tokens(si)
        if si == 0:
            return ScalePlan(keep_residuals=True)   # something to fill from
        idx = torch.arange(n).expand(ctx.rows, n)
        if how == "keep":
            mk = lambda bi: BlockPlan(mode="prune", keep=idx, n_keep=n, fill=fill)
        else:
            mk = lambda bi: BlockPlan(mode="prune", selector=lambda x, sc: idx, n_keep=n, fill=fill)
        return ScalePlan(blocks=_all_blocks(ctx, mk), keep_residuals=True)

    out = gen(tiny_rt, ScriptedPolicy(plan), seeds=[11])
    for a, b in zip(base.bits, out.bits):
        assert torch.equal(a, b)
    assert torch.equal(base.summed_codes, out.summed_codes)
    assert torch.equal(base.images, out.images)


def test_pruning_changes_the_image_and_the_counts(tiny_rt):
    base = gen(tiny_rt, seeds=[5])

    def plan(si, ctx):
        n = ctx.tokens(si)
        if si < 6:
            return ScalePlan(keep_residuals=(si == 5))
        k = n // 2
        sel = lambda x, sc: (x - x.mean(1, keepdim=True)).pow(2).sum(-1).topk(k, dim=1).indices
        return ScalePlan(blocks=_all_blocks(ctx, lambda bi: BlockPlan(mode="prune", selector=sel, n_keep=k)))

    out = gen(tiny_rt, ScriptedPolicy(plan), seeds=[5])
    assert not torch.equal(base.images, out.images)
    for a, b in zip(base.bits[:6], out.bits[:6]):   # scales before pruning are untouched
        assert torch.equal(a, b)
    assert out.trace[7]["blocks"][0]["sa"] == out.trace[7]["tokens"] // 2
    assert out.flops["total"] < base.flops["total"]


def test_skipped_last_scales_decode_the_codes_so_far(tiny_rt):
    base = gen(tiny_rt, seeds=[2])
    out = gen(tiny_rt, ScriptedPolicy(lambda si, ctx: ScalePlan(run=si < 8)), seeds=[2])
    assert out.bits[8] is None and out.bits[9] is None
    for a, b in zip(base.bits[:8], out.bits[:8]):
        assert torch.equal(a, b)
    # summed codes = baseline's minus the codes of the two skipped scales
    assert not torch.equal(out.summed_codes, base.summed_codes)
    assert out.images.shape == base.images.shape
    assert out.trace[9]["ran"] is False and scale_flops(tiny_rt.cfg, out.trace[9]) == 0


def test_cfg_off_non_square_negative_prompt_and_per_scale_lists(tiny_rt):
    n = len(scale_schedule(1.0, PN))
    out = gen(tiny_rt, cfg=1.0)
    assert out.trace[0]["rows"] == 1
    wide = gen(tiny_rt, h_div_w=0.5)
    assert wide.images.shape[2] > wide.images.shape[1]
    neg = gen(tiny_rt, negative_prompt="blurry", seeds=[0])
    plain = gen(tiny_rt, seeds=[0])
    assert not torch.equal(neg.summed_codes, plain.summed_codes)
    lists = gen(tiny_rt, cfg=[3.0] * n, tau=[1.0] * n, seeds=[0])
    assert torch.equal(lists.images, plain.images)
    with pytest.raises(ValueError, match="one per scale"):
        gen(tiny_rt, cfg=[3.0, 2.0])


def test_drop_uncond_runs_cond_rows_only(tiny_rt):
    out = gen(tiny_rt, ScriptedPolicy(lambda si, ctx: ScalePlan(drop_uncond=si >= 7)), seeds=[1])
    assert [t["rows"] for t in out.trace] == [2] * 7 + [1] * 3
    with pytest.raises(ValueError, match="cannot return"):
        gen(tiny_rt, ScriptedPolicy(lambda si, ctx: ScalePlan(drop_uncond=si == 7)), seeds=[1])


def test_bad_plans_get_one_clear_error(tiny_rt):
    idx = torch.arange(4).expand(2, 4)
    cases = [
        (BlockPlan(mode="prune", n_keep=4), "exactly one of"),
        (BlockPlan(mode="prune", keep=idx, n_keep=5000), "n_keep"),
        (BlockPlan(mode="bogus"), "full/skip/prune"),
    ]
    for bp, msg in cases:
        with pytest.raises(ValueError, match=msg):
            gen(tiny_rt, ScriptedPolicy(lambda si, ctx, bp=bp: ScalePlan(blocks={0: bp}) if si == 2 else ScalePlan()))
    nocache = lambda si, ctx: ScalePlan(blocks={0: BlockPlan(mode="prune", keep=idx, n_keep=4)}) if si == 2 else ScalePlan()
    with pytest.raises(ValueError, match="keep_residuals"):
        gen(tiny_rt, ScriptedPolicy(nocache))
    with pytest.raises(ValueError, match="block 99"):
        gen(tiny_rt, ScriptedPolicy(lambda si, ctx: ScalePlan(blocks={99: BlockPlan()})))


def test_released_residuals_cannot_be_filled_from(tiny_rt):
    idx = lambda ctx, si: torch.arange(4).expand(ctx.rows, 4)

    def plan(si, ctx, release):
        if si in (3, 4):
            return ScalePlan(keep_residuals=True, release_residuals=frozenset({3}) if (si == 4 and release) else frozenset())
        if si == 5:
            return ScalePlan(blocks={0: BlockPlan(mode="prune", keep=idx(ctx, si), n_keep=4, cache_from=3)})
        return ScalePlan()

    gen(tiny_rt, ScriptedPolicy(lambda si, ctx: plan(si, ctx, False)))
    with pytest.raises(ValueError, match="keep_residuals"):
        gen(tiny_rt, ScriptedPolicy(lambda si, ctx: plan(si, ctx, True)))


def test_predictive_entropy_signal_is_binary_entropy_of_sampled_distribution(tiny_rt):
    pol = ScriptedPolicy(lambda si, ctx: ScalePlan())
    gen(tiny_rt, pol, seeds=[0])
    s = pol.seen[4]
    p = s.logits.softmax(-1)
    naive = -(p * p.log()).sum(-1).mean(-1)
    torch.testing.assert_close(s.token_entropy, naive, rtol=1e-5, atol=1e-6)
    assert s.token_entropy.shape == (1, s.h * s.w)
    assert float(s.token_entropy.max()) <= math.log(2) + 1e-6


def test_attention_entropy_equals_naive_softmax():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, 70, 16, generator=g) * 4
    k = torch.randn(2, 3, 90, 16, generator=g)
    a = (q @ k.transpose(-1, -2)).double().softmax(-1)
    naive = -(a * a.clamp_min(1e-300).log()).sum(-1).mean(1).float()
    torch.testing.assert_close(attention_entropy(q, k, chunk=16), naive, rtol=1e-4, atol=1e-4)


def test_runtime_attention_entropy_signal_matches_naive_recomputation(tiny_rt, monkeypatch):
    """The signal equals a naive softmax over the same block's actual q and cached k (block 2's
    rotated q, k as the step computed them; their own correctness is the upstream golden test's)."""
    import dataclasses

    want = {2}
    captured = []
    orig = tiny_rt.block_ops.qkv_rope   # blocks asked for entropy take the planned path, which calls it

    def spy(bc, xin, table):
        rot = orig(bc, xin, table)
        if bc.w_qkv.data_ptr() == tiny_rt.model.blocks[2].sa.mat_qkv.weight.data_ptr():
            captured.append(rot.clone())
        return rot

    monkeypatch.setattr(tiny_rt, "block_ops", dataclasses.replace(tiny_rt.block_ops, qkv_rope=spy))
    pol = ScriptedPolicy(lambda si, ctx: ScalePlan(attention_entropy_for=frozenset(want)) if si <= 3 else ScalePlan())
    gen(tiny_rt, pol, seeds=[0])
    ks = []
    for si in range(4):
        q, k = captured[si][0], captured[si][1]
        ks.append(k)
        kk = torch.cat(ks, dim=2)
        a = (q.double() @ kk.double().transpose(-1, -2)).softmax(-1)
        naive = -(a * a.clamp_min(1e-300).log()).sum(-1).mean(1).float()
        torch.testing.assert_close(pol.seen[si].attention_entropy[2], naive, rtol=1e-4, atol=1e-5)


def test_plan_trace_matches_runtime_trace(tiny_rt):
    def plan(si, ctx):
        n = ctx.tokens(si)
        if si in (8, 9):
            return ScalePlan(run=si == 8, attention_entropy_for=frozenset({0, 2}), attention_entropy_queries=7,
                             blocks={1: BlockPlan(mode="skip"),
                                                  2: BlockPlan(mode="prune", keep=torch.arange(n // 3).expand(ctx.rows, -1), n_keep=n // 3, fill="pass"),
                                                  3: BlockPlan(mode="prune", keep=torch.arange(n // 2).expand(ctx.rows, -1), n_keep=n // 2, fill="pass", prune_kv=False, sublayers=("sa", "ffn"))})
        return ScalePlan()

    pol = ScriptedPolicy(plan)
    out = gen(tiny_rt, pol, seeds=[0])
    ctx = pol.ctx
    plans = [plan(si, ctx) for si in range(len(ctx.schedule))]
    text_tokens = {2: out.trace[0]["text_tokens"], 1: out.trace[0]["text_tokens"] // 2}
    expected = plan_trace(ctx.schedule, plans, ctx.depth, 1, True, text_tokens)
    # timing, and the KV bytes (the memory model's, checked against plan_trace in tests/engine/test_memory.py)
    strip = lambda tr: [{k: v for k, v in t.items() if k not in ("ms", "kv_bytes_allocated", "kv_bytes_used", "attn_memory_bytes")} for t in tr]
    assert strip(out.trace) == expected


def test_flops_of_2b_at_1024_match_a_hand_count():
    """Baseline Infinity-2B, 1024x1024, one prompt with CFG (2 rows), 10 text tokens per row.

    Hand count per scale s with n_s tokens and N_s tokens so far, per block, per row:
      linear layers  2*n_s*(3C^2 + C^2 [SA out] + 2C^2 [CA q, out] + 2*C*F [FFN])
      SA attention   2*2*n_s*N_s*C        CA attention 2*2*n_s*T*C
    plus the head 2*n_s*C*64 per row and the next-scale embedding 2*n_s*32*C once (s > 0).
    """
    cfg = PRESETS["infinity_2b"]
    C, F, depth, T = 2048, 8192, 32, 10
    assert cfg.ffn_hidden == F
    sched = scale_schedule(1.0, "1M")
    assert [h for h, _ in sched] == [1, 2, 4, 6, 8, 12, 16, 20, 24, 32, 40, 48, 64]
    n = [h * w for h, w in sched]
    assert sum(n) == 10521
    rows, hand, seen = 2, 0, 0
    for s, ns in enumerate(n):
        seen += ns
        per_row_block = 2 * ns * (6 * C * C + 2 * C * F) + 4 * ns * seen * C + 4 * ns * T * C
        hand += rows * depth * per_row_block + rows * 2 * ns * C * 64 + (2 * ns * 32 * C if s else 0)
    plans = [ScalePlan() for _ in sched]
    trace = plan_trace(sched, plans, depth, 1, True, {2: 2 * T, 1: T})
    ours = sum(scale_flops(cfg, t) for t in trace)
    assert ours == hand
    assert 1.0e14 < ours < 1.3e14   # ~112 TFLOPs per 1024² image with CFG
    assert text_flops(cfg, 2 * T, 2) > 0


def test_spatial_patchify_path_like_8b():
    """8B layout: the transformer predicts 4d bits per token, unpatchified 2x2 onto the VAE grid."""
    from varbench.engine.backbones.infinity.bsq_vae import unpatchify_bits
    from varbench.testing.tiny import tiny_runtime

    rt = tiny_runtime(seed=3, codebook_dim=64, patchify=True)       # toy VAE has 16 bits -> 4 x 16
    out = rt.generate(["a red circle"], [0], pn="0.06M", cfg=3.0)
    h, w = out.schedule[-1]
    assert out.bits[-1].shape == (1, h, w, 64)
    assert out.summed_codes.shape == (1, 16, 1, 2 * h, 2 * w)
    assert out.images.shape[1:3] == (2 * h * 4, 2 * w * 4)
    # the summed codes are the VAE-grid codes of the unpatchified bits, accumulated as released
    vae_bits = [unpatchify_bits(b) for b in out.bits]
    ref = rt.vae.bits_to_summed_codes(vae_bits, size=(2 * h, 2 * w))
    torch.testing.assert_close(out.summed_codes.squeeze(2), ref, rtol=0, atol=1e-6)
