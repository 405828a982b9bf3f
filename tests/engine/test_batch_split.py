"""Per-image decisions at batch > 1 (varbench/engine/batch_split.py): every image of a batch gets the plan it
gets alone, the batch splits where images disagree (`adaptive_batch="split"`) or pads their plans into one
step (`"pad"`, the default on Infinity: varbench/engine/padded_batch.py, tests/engine/test_padded_batch.py),
and agreeing images keep sharing a batch.

The tiny random Infinity on the 7-scale '0.06M' schedule, CFG 3. Bits of an image at batch 4 are
compared with the same image at batch 1: batched matmuls round differently with other batch
companions, so a few bits may flip; the decisions (activation scale, kept counts, skipped scales,
dropped branch) must be identical.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from varbench.engine.batch_split import group_by_plan, image_rows, merge_plans, plan_signature, select_signals, take_rows
from varbench.engine.plan import BlockPlan, ScalePlan
from varbench.policies import build_policy
from varbench.policies.skipvar import SkipVAR
from varbench.testing.tiny import tiny_runtime

#: generates with a tiny random runtime (seconds per test): the full run's tier, not plain `pytest`'s
pytestmark = pytest.mark.runtime

PN, CFG = "0.06M", 3.0
PROMPTS = ["a red circle", "two blue squares", "a green triangle above a cat", "a photo of a dog"]
SEEDS = [0, 1, 2, 3]
# NOVA with these knobs activates at scales 5, 3, 4, 3 for PROMPTS alone (measured on the tiny model):
# three different plans from scale 4 on
NOVA = dict(t_min_tokens=4, min_tokens_to_prune=16, t_force=None, beta_baseline=0.5, baseline_scales=[1, 2],
            layer_entropy="none")


@pytest.fixture(scope="module")
def rt():
    return tiny_runtime(seed=0)


def _alone(rt, make_policy, i):
    return rt.generate([PROMPTS[i]], [SEEDS[i]], make_policy(), pn=PN, cfg=CFG)


def _bit_agreement(a, b) -> float:
    same = total = 0
    for x, y in zip(a, b):
        assert (x is None) == (y is None)
        if x is not None:
            same += int((x == y).sum())
            total += x.numel()
    return same / total


def _kept(trace) -> list:
    """What a trace says ran: per scale (ran, rows, per block (mode, tokens executed per sublayer))."""
    return [(tr["ran"], tr["rows"] // tr["batch"], [(b["mode"], b["sa"], b["ca"], b["ffn"], b["qkv"]) for b in tr["blocks"]])
            for tr in trace]


@pytest.fixture
def splitting(rt):
    """The runtime with `adaptive_batch="split"` (sub-batches of equal plans, no padding) for one test."""
    rt.adaptive_batch = "split"
    yield rt
    rt.adaptive_batch = "pad"


@pytest.mark.parametrize("adaptive_batch", ["split", "pad"])
def test_nova_rows_with_different_activations_get_their_own_plans(rt, adaptive_batch, monkeypatch):
    make = lambda: build_policy("nova", **NOVA)  # noqa: E731
    alone = [_alone(rt, make, i) for i in range(4)]
    acts = [o.policy_stats["activation_scale"] for o in alone]
    assert len(set(acts)) >= 2, f"the test needs images that disagree; got activations {acts}"

    monkeypatch.setattr(rt, "adaptive_batch", adaptive_batch)
    out = rt.generate(PROMPTS, SEEDS, make(), pn=PN, cfg=CFG)
    for i, one in enumerate(alone):
        st = out.image_stats[i]
        assert st["activation_scale"] == one.policy_stats["activation_scale"]
        # kept counts per scale and block exactly; the ratios behind them up to batch rounding of
        # the entropies they come from (measured ~1e-8)
        mine, ref = st["ratios"], one.policy_stats["ratios"]
        assert {s: r["n_keep"] for s, r in mine.items()} == {s: r["n_keep"] for s, r in ref.items()}
        assert [r["scale_ratio"] for r in mine.values()] == pytest.approx([r["scale_ratio"] for r in ref.values()], abs=1e-6)
        assert _kept(out.image_traces[i]) == _kept(one.trace)       # what actually ran for this image
        assert out.image_flops[i]["total"] == pytest.approx(one.flops["total"], rel=1e-12)
        # batch rounding only: measured 1.0 (no flipped bit) on this model; a flip would diverge the
        # rest of that image, so allow a little
        assert _bit_agreement([b if b is None else b[i:i + 1] for b in out.bits], one.bits) > 0.97
    if adaptive_batch == "pad":
        # one batch throughout (the launches of a shared plan); what ran beyond the images' own work is
        # the padding, stated in the FLOPs: images that have not activated yet run a block in full while
        # the others prune it, so the others' rows run full width too
        assert all(tr["batch"] == 4 for tr in out.trace) and all(t[-1].get("padded") for t in out.image_traces)
        assert out.flops["padding"] > 0
        assert out.flops["total"] == pytest.approx(sum(o.flops["total"] for o in alone) + out.flops["padding"], rel=1e-9)
        return
    # the batch's FLOPs are the sum of its images'
    assert out.flops["total"] == pytest.approx(sum(o.flops["total"] for o in alone), rel=1e-9)
    assert "padding" not in out.flops
    # images share a sub-batch exactly when they ran the same plans (NOVA's kept counts come from each
    # image's own entropies, so images of one activation scale may still differ)
    def partition(keys):
        groups = {}
        for i, k in enumerate(keys):
            groups.setdefault(k, []).append(i)
        return sorted(groups.values())
    assert partition([id(t) for t in out.image_traces]) == partition([repr(_kept(o.trace)) for o in alone])


def test_shared_rule_is_one_plan_for_the_batch(rt):
    out = rt.generate(PROMPTS, SEEDS, build_policy("nova", **NOVA, batch_rule="shared"), pn=PN, cfg=CFG)
    assert {id(t) for t in out.image_traces} == {id(out.trace)}     # never split
    assert out.trace[-1]["batch"] == 4
    assert out.policy_stats["activation_scale"] is not None and "per_image" not in out.policy_stats


def _skipvar_actions(features: list[float]):
    """A decision rule on the first feature that gives each of four images another action:
    thresholds halfway between the images' own (batch-1) features."""
    order = np.argsort(features)
    cuts = [(features[order[k]] + features[order[k + 1]]) / 2 for k in range(3)]
    margin = min(abs(features[order[k + 1]] - features[order[k]]) for k in range(3)) / 2
    actions = [(1, 0), (2, 0), (0, 2), (0, 0)]   # skip1, skip2, uncond2, nothing

    def decide(X):
        rank = [int(sum(x > c for c in cuts)) for x in X[:, 0]]
        return np.array([actions[r][0] for r in rank]), np.array([actions[r][1] for r in rank])
    return decide, margin


def test_skipvar_rows_with_different_actions_get_their_own_plans(rt):
    seen = []

    def record(X):
        seen.extend(float(x) for x in X[:, 0])
        return np.zeros(len(X), int), np.zeros(len(X), int)

    for i in range(4):
        _alone(rt, lambda: SkipVAR(decide=record), i)
    decide, margin = _skipvar_actions(seen)
    assert margin > 1e-4, f"features too close to separate robustly: {seen}"

    alone = [_alone(rt, lambda: SkipVAR(decide=decide), i) for i in range(4)]
    got = sorted((o.policy_stats["skip"], o.policy_stats["uncond"]) for o in alone)
    assert got == sorted([(1, 0), (2, 0), (0, 2), (0, 0)])

    out = rt.generate(PROMPTS, SEEDS, SkipVAR(decide=decide), pn=PN, cfg=CFG)
    for i, one in enumerate(alone):
        st = out.image_stats[i]
        assert (st["skip"], st["uncond"]) == (one.policy_stats["skip"], one.policy_stats["uncond"])
        assert _kept(out.image_traces[i]) == _kept(one.trace)
        mine = [b if b is None else b[i:i + 1] for b in out.bits]
        # a scale this image skipped is -1 in its row (others ran it) or None (nobody did)
        for si, b in enumerate(mine):
            if one.bits[si] is None:
                assert b is None or bool((b == -1).all())
                mine[si] = None
        assert _bit_agreement(mine, one.bits) > 0.97
        assert torch.equal(out.images[i], one.images[0]) or (out.images[i].int() - one.images[0].int()).abs().float().mean() < 1.0

    # the released batch rule takes the most conservative action for everyone: nobody skips
    cons = rt.generate(PROMPTS, SEEDS, SkipVAR(decide=decide, batch_rule="conservative"), pn=PN, cfg=CFG)
    assert cons.policy_stats["skip"] == 0 and all(tr["ran"] for tr in cons.trace)


def test_images_that_agree_keep_one_batch_bit_for_bit(rt):
    """Per-image decisions that all agree run the batch exactly as one shared plan does."""
    none = lambda X: (np.zeros(len(X), int), np.full(len(X), 2))  # noqa: E731  every sample: uncond2
    per = rt.generate(PROMPTS, SEEDS, SkipVAR(decide=none), pn=PN, cfg=CFG)
    shared = rt.generate(PROMPTS, SEEDS, SkipVAR(decide=none, batch_rule="conservative"), pn=PN, cfg=CFG)
    assert len({id(t) for t in per.image_traces}) == 1 and per.trace[-1]["rows"] == 4   # one batch, cond rows only
    assert all(torch.equal(a, b) for a, b in zip(per.bits, shared.bits))
    assert torch.equal(per.images, shared.images)


def test_signatures_group_by_shape_not_by_kept_indices():
    keep_a, keep_b = torch.tensor([[0, 2]]), torch.tensor([[1, 3]])
    pa = ScalePlan(blocks={1: BlockPlan(mode="prune", keep=keep_a, n_keep=2)})
    pb = ScalePlan(blocks={1: BlockPlan(mode="prune", keep=keep_b, n_keep=2)})
    pc = ScalePlan(blocks={1: BlockPlan(mode="prune", keep=torch.tensor([[1, 2, 3]]), n_keep=3)})
    assert plan_signature(pa) == plan_signature(pb) != plan_signature(pc)
    assert plan_signature(ScalePlan()) == plan_signature(ScalePlan(blocks={0: BlockPlan()}))  # explicit full = absent
    assert group_by_plan([pa, pc, pb, ScalePlan(run=False)]) == [[0, 2], [1], [3]]
    # CFG rows: [cond_a, cond_b, uncond_a, uncond_b]; one-row keeps stay one row per image
    m = merge_plans([pa, pb], cfg_rows=True).blocks[1].keep
    assert m.tolist() == [[0, 2], [1, 3]]
    two = merge_plans([ScalePlan(blocks={1: BlockPlan(mode="prune", keep=torch.tensor([[0, 2], [5, 6]]), n_keep=2)}), pb],
                      cfg_rows=True).blocks[1].keep
    assert two.tolist() == [[0, 2], [1, 3], [5, 6], [1, 3]]


def test_row_selection_follows_the_cfg_layout():
    assert image_rows([1, 3], 4, 8) == [1, 3, 5, 7]
    assert image_rows([1, 3], 4, 4) == [1, 3]
    with pytest.raises(ValueError, match="does not belong"):
        image_rows([0], 4, 6)
    t = torch.arange(8)
    assert take_rows(t, [2], 4).tolist() == [2, 6]
    assert take_rows(t, [0, 1], 4).tolist() == [0, 1, 4, 5]


def test_each_image_observes_its_own_rows(rt):
    """select_signals gives an image what it would see alone: its entropy map and its attention rows."""
    out = rt.generate(PROMPTS[:2], SEEDS[:2], build_policy("nova", **NOVA, batch_rule="shared"), pn=PN, cfg=CFG)
    from varbench.engine.plan import ScaleSignals
    B, n = 2, 4
    sig = ScaleSignals(scale=0, h=2, w=2, token_entropy=torch.arange(B * n).view(B, n).float(),
                       logits=torch.zeros(B, n, 1, 2), cond_logits=None,
                       attention_entropy={3: torch.arange(2 * B * n).view(2 * B, n).float()},
                       attention_query_index={3: torch.arange(2 * B * n).view(2 * B, n)},
                       executed_tokens={}, tau=1.0, cfg=3.0, summed_codes=torch.arange(B).view(B, 1, 1, 1, 1).float())
    one = select_signals(sig, 1, B)
    assert one.token_entropy.tolist() == [[4, 5, 6, 7]]
    assert one.attention_entropy[3][:, 0].tolist() == [4, 12]     # its cond row and its uncond row
    assert one.summed_codes.flatten().tolist() == [1.0]
    assert out.images.shape[0] == 2


def test_a_split_views_the_parents_cache_instead_of_copying_it(splitting, monkeypatch):
    """After a split the parts' KV caches and residual caches live in the parent's memory (rows
    permuted in place): a split must not hold a second copy of the cache (8B at batch 8: ~90 GiB)."""
    from varbench.engine.backbones.infinity.state import GenState

    seen = []
    real = GenState.split

    def spy(self, parts):
        parent = {t.untyped_storage().data_ptr() for t in self.kv.kv if t is not None}
        parent |= {t.untyped_storage().data_ptr() for d in self.residuals.values() for t in d.values()}
        subs = real(self, parts)
        for sub in subs:
            mine = {t.untyped_storage().data_ptr() for t in sub.kv.kv if t is not None}
            mine |= {t.untyped_storage().data_ptr() for d in sub.residuals.values() for t in d.values()}
            seen.append(mine <= parent and bool(mine))
        return subs

    monkeypatch.setattr(GenState, "split", spy)
    splitting.generate(PROMPTS, SEEDS, build_policy("nova", **NOVA), pn=PN, cfg=CFG)
    assert seen and all(seen)


def test_split_batches_share_the_staging_buffer_of_a_kv_budget(rt):
    """NOVA (per-image plans: the batch splits) + ScaleKV (KV budgets, appends through the staging
    buffer): each image runs what it runs alone, evicts where it does alone, and the parts' KV bytes add
    up to one set of buffers (the parts view the parent's own buffers and its staging buffer)."""
    from varbench.policies.scalekv import ScaleKV

    make = lambda: build_policy("compose", policies=[{"name": "nova", "knobs": NOVA},   # noqa: E731
                                                     {"name": "scalekv", "knobs": ScaleKV.ACTIVE}])
    alone = [_alone(rt, make, i) for i in range(4)]
    out = rt.generate(PROMPTS, SEEDS, make(), pn=PN, cfg=CFG)
    assert len({str(_kept(t)) for t in out.image_traces}) > 1   # images ran different plans: the batch split
    evicted = lambda tr: [[bool(b.get("kv_evicted")) for b in t["blocks"]] for t in tr]   # noqa: E731
    for i, one in enumerate(alone):
        assert _kept(out.image_traces[i]) == _kept(one.trace) and evicted(out.image_traces[i]) == evicted(one.trace)
        assert evicted(one.trace) != evicted(_alone(rt, lambda: None, i).trace)           # ScaleKV acted
        assert _bit_agreement([b if b is None else b[i:i + 1] for b in out.bits], one.bits) > 0.97
    # allocated once for the batch (4 images' rows), not once per part: 4x one image's
    assert out.kv_bytes[-1]["allocated"] == 4 * alone[0].kv_bytes[-1]["allocated"]
