"""NOVA's choices that no source states (K/V of pruned tokens, which blocks and sublayers, skipping the
last scales) are knobs; their defaults are reconstructions and say so in the preset and the card."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from experiments.flops_table import load_method, method_flops
from varbench.engine.backbones.infinity.schedules import scale_schedule
from varbench.engine.plan import GenerationContext, ScaleSignals
from varbench.engine.policy import Policy
from varbench.policies import build_policy

SQ_1M = tuple(scale_schedule(1.0, "1M"))
UNSTATED = {"prune_kv": True, "protect_first": 0, "protect_last": 0, "sublayers": ["sa", "ca", "ffn"],
            "skip_last_scales": 0}


def ctx_for(depth=32, batch=1):
    n = len(SQ_1M)
    return GenerationContext(schedule=SQ_1M, depth=depth, embed_dim=2048, num_heads=16, batch=batch, cfg_rows=True,
                             cfg=(4.0,) * n, tau=(1.0,) * n)


def run(**knobs):
    """NOVA forced to activate at the 16² scale (index 6) with flat entropies; returns (policy, plans)."""
    pol = build_policy("nova", layer_entropy="none", t_force=6, **knobs)
    ctx = ctx_for()
    pol.reset(ctx)
    plans = []
    for si in range(len(SQ_1M)):
        p = pol.plan(si)
        plans.append(p)
        if p.run:
            h, w = SQ_1M[si]
            ent = torch.linspace(0, 1, h * w).expand(1, h * w) + 0.1 * si
            pol.observe(si, ScaleSignals(scale=si, h=h, w=w, token_entropy=ent, logits=torch.zeros(1, h * w, 2, 2),
                                         cond_logits=None, attention_entropy={}, attention_query_index={},
                                         executed_tokens={}, tau=1.0, cfg=4.0))
    return pol, plans


def pruned_blocks(plans):
    return {si: sorted(p.blocks) for si, p in enumerate(plans) if p.blocks}


def test_defaults_are_the_documented_reconstructions():
    pol = build_policy("nova")
    d = pol.describe()
    assert {k: d[k] for k in UNSTATED} == UNSTATED
    _, _, knobs = load_method("nova")
    assert {k: knobs.get(k, d[k]) for k in UNSTATED} == UNSTATED   # preset = constructor defaults
    text = (Path(__file__).resolve().parents[2] / "varbench" / "conf" / "method" / "nova.yaml").read_text()
    for k in UNSTATED:
        line = next(l for l in text.splitlines() if l.strip().lstrip("# ").startswith(f"{k}:"))
        assert "RECON" in line, line
    import varbench.policies.nova as nova_mod

    card = nova_mod.__doc__
    assert "Unstated by every source" in card and "(NOVA: none)" not in card and "(NOVA: 0)" not in card
    for k in ("prune_kv=True", "protect_first=0", "skip_last_scales=0", "sublayers=(sa, ca, ffn)"):
        assert k in card


def test_prune_kv_knob():
    _, on = run()
    _, off = run(prune_kv=False)
    assert pruned_blocks(on) and pruned_blocks(on) == pruned_blocks(off)
    assert all(bp.prune_kv for p in on for bp in p.blocks.values())
    assert all(not bp.prune_kv for p in off for bp in p.blocks.values())
    # keeping the pruned tokens' K/V costs attention FLOPs
    f = {m: method_flops("nova", dict(load_method(m)[2]), "infinity_2b", 1.0, "1M", 1, 32, 6, 9)[0]
         for m in ("nova", "nova_keep_kv")}
    assert f["nova"] < f["nova_keep_kv"]


def test_block_and_sublayer_knobs():
    _, dflt = run()
    blocks = pruned_blocks(dflt)
    assert blocks and all(b == list(range(32)) for b in blocks.values())           # every block (RECON)
    assert all(bp.sublayers == ("sa", "ca", "ffn") for p in dflt for bp in p.blocks.values())
    _, prot = run(protect_first=3, protect_last=4)
    assert all(b == list(range(3, 28)) for b in pruned_blocks(prot).values())     # FastVAR's 3..27
    _, frac = run(protect_first=0.09375, protect_last=0.125)
    assert pruned_blocks(frac) == pruned_blocks(prot)
    _, ffn = run(sublayers=["ffn"])
    assert pruned_blocks(ffn) == blocks
    assert all(bp.sublayers == ("ffn",) for p in ffn for bp in p.blocks.values())
    with pytest.raises(ValueError, match="sublayers"):
        build_policy("nova", sublayers=["attn"])


def test_skip_last_scales_knob():
    _, dflt = run()
    assert all(p.run for p in dflt)
    pol, two = run(skip_last_scales=2)
    assert [p.run for p in two] == [True] * 11 + [False, False] and pol.stats()["skipped"] == [11, 12]
    assert load_method("nova_skip2")[2]["skip_last_scales"] == 2


def test_fill_follows_the_previous_scale():
    """Pruned slots are filled from the previous scale's residuals (cache_source=prev_scale), per
    block and sublayer; fill=pass fills nothing."""
    _, plans = run()
    first = min(pruned_blocks(plans))
    for si, p in enumerate(plans):
        for bp in p.blocks.values():
            assert bp.fill == "cache" and bp.cache_from == si - 1
    assert plans[first - 1].keep_residuals
    _, passed = run(fill="pass")
    assert all(bp.fill == "pass" and bp.cache_from is None for p in passed for bp in p.blocks.values())


def test_neutral_knob_values_keep_plans_identical():
    """The new `sublayers` knob at its default changes no plan (old configs keep their meaning)."""
    _, a = run()
    _, b = run(sublayers=("sa", "ca", "ffn"))
    assert [(sorted(p.blocks), p.run, p.keep_residuals) for p in a] == [(sorted(p.blocks), p.run, p.keep_residuals) for p in b]
    for pa, pb in zip(a, b):
        for k in pa.blocks:
            assert pa.blocks[k].n_keep == pb.blocks[k].n_keep and torch.equal(pa.blocks[k].keep, pb.blocks[k].keep)


def test_q_sub_sampling_knob():
    """q_sub queries: evenly spaced by default (unchanged behaviour), or a fixed pseudo-random subset
    per scale (test_q_sub_sampling_on_the_runtime: the runtime measures exactly the queries the rule names,
    and each value is that query's entropy over all queries, so the subset changes which queries are read,
    not their values)."""
    from varbench.engine.plan import ScalePlan, entropy_query_pick
    from varbench.policies.nova import NOVAKnobs

    assert NOVAKnobs().q_sub_sampling == "even" and build_policy("nova").describe()["q_sub_sampling"] == "even"
    even = entropy_query_pick(100, 7, 3, "even", "cpu")
    assert even.tolist() == torch.linspace(0, 99, 7).round().long().tolist()
    r3, r3b, r4 = (entropy_query_pick(100, 7, s, "random", "cpu") for s in (3, 3, 4))
    assert torch.equal(r3, r3b)                                           # seeded by the scale: reproducible
    assert not torch.equal(r3, r4) and not torch.equal(r3, even)          # another scale, another subset
    assert r3.unique().numel() == 7 and r3.tolist() == sorted(r3.tolist()) and 0 <= int(r3.min()) and int(r3.max()) < 100
    # the whole range is reachable: over many scales the picks cover both halves evenly enough
    picks = torch.cat([entropy_query_pick(100, 7, s, "random", "cpu") for s in range(200)])
    assert 0.4 < float((picks < 50).float().mean()) < 0.6
    with pytest.raises(ValueError, match="'even' or 'random'"):
        entropy_query_pick(10, 3, 0, "first", "cpu")

    # NOVA emits the knob on the plans that ask for layer entropy
    def plans_of(**kw):
        pol = build_policy("nova", t_force=6, **kw)
        pol.reset(ctx_for())
        return [pol.plan(si) for si in range(8)]
    asked = [p for p in plans_of(q_sub_sampling="random") if p.attention_entropy_for]
    assert asked and all(p.attention_entropy_sampling == "random" and p.attention_entropy_queries == 256 for p in asked)
    assert all(p.attention_entropy_sampling == "even" for p in plans_of())
    with pytest.raises(ValueError, match="q_sub_sampling"):
        build_policy("nova", q_sub_sampling="first")


@pytest.mark.runtime
def test_q_sub_sampling_on_the_runtime(tiny_rt):
    """The runtime measures the queries the rule names: values equal the all-query entropy at those
    positions (the entropies are signals of the AR loop, so no image is decoded)."""
    from varbench.engine.plan import ScalePlan, entropy_query_pick

    class Script(Policy):
        name = "script"

        def __init__(self, k, how):
            self.k, self.how, self.seen = k, how, {}

        def plan(self, si):
            return ScalePlan(attention_entropy_for=frozenset({1}), attention_entropy_queries=self.k,
                             attention_entropy_sampling=self.how)

        def observe(self, si, signals):
            self.seen[si] = (signals.attention_entropy[1], signals.attention_query_index[1])

    full, rnd = Script(None, "even"), Script(5, "random")
    for pol in (full, rnd):
        tiny_rt.generate(["a red circle"], [0], pol, pn="0.25M", cfg=3.0, decode=False)
    assert sum(full.seen[si][0].shape[1] > 5 for si in rnd.seen) >= 5   # scales with more queries than picks
    for si, (ent, idx) in rnd.seen.items():
        n = full.seen[si][0].shape[1]
        if n <= 5:
            continue
        want = entropy_query_pick(n, 5, si, "random", "cpu")
        assert idx.tolist() == [want.tolist()] * idx.shape[0]
        torch.testing.assert_close(ent, full.seen[si][0][:, want], rtol=1e-4, atol=1e-5)
