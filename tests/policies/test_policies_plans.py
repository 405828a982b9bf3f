"""Acceleration policies checked on their plans alone (no model): hand-made contexts and signals.

Expected numbers are derived in the comments from the method's rules, not copied from a run.
"""
from __future__ import annotations

import math

import pytest

from varbench.core.errors import ConfigError
import torch

from varbench.engine.backbones.infinity.schedules import scale_schedule
from varbench.engine.flops import plan_trace
from varbench.engine.plan import GenerationContext, ScalePlan, ScaleSignals, SelectorContext
from varbench.engine.plan import is_neutral
from varbench.policies import REGISTRY, build_policy
from varbench.policies.common import block_range
from varbench.policies.compose import Compose
from varbench.policies.selectors import PivotalSelector, complete_map, upsample_map

SQ_1M = tuple(scale_schedule(1.0, "1M"))  # 1,2,4,6,8,12,16,20,24,32,40,48,64


def ctx_for(schedule=SQ_1M, depth=32, batch=1, cfg_rows=True, embed_dim=2048, heads=16):
    n = len(schedule)
    return GenerationContext(schedule=tuple(schedule), depth=depth, embed_dim=embed_dim, num_heads=heads, batch=batch,
                             cfg_rows=cfg_rows, cfg=(4.0,) * n, tau=(1.0,) * n)


def signals_for(ctx, si, entropy, attn=None, tau=1.0):
    """ScaleSignals with a given (B, L) token entropy and {block: (rows, L)} attention entropies."""
    h, w = ctx.schedule[si]
    L = h * w
    B = ctx.batch
    return ScaleSignals(scale=si, h=h, w=w, token_entropy=entropy, logits=torch.zeros(B, L, 2, 2), cond_logits=None,
                        attention_entropy=attn or {}, attention_query_index={}, executed_tokens={}, tau=tau, cfg=4.0)


def run_plans(policy, ctx, entropy_fn=None, attn_fn=None):
    """Drive a policy over a whole schedule with synthetic signals; returns the plans."""
    policy.reset(ctx)
    plans = []
    for si in range(len(ctx.schedule)):
        p = policy.plan(si)
        plans.append(p)
        if p.run:
            L = ctx.tokens(si)
            ent = entropy_fn(si, L) if entropy_fn else torch.full((ctx.batch, L), 0.1 * si)
            attn = {b: attn_fn(si, b, L) for b in p.attention_entropy_for} if attn_fn else \
                {b: torch.rand(ctx.rows, L, generator=torch.Generator().manual_seed(si * 100 + b)) for b in p.attention_entropy_for}
            policy.observe(si, signals_for(ctx, si, ent, attn))
    return plans


# ----------------------------------------------------------------------------------------- fastvar
def test_fastvar_released_hand_count_on_2b_1024():
    """Released FastVAR on the 2B at 1024²: kept = L - int(L*ratio): 1024 - int(409.6) = 615 at 32²
    (index 9), 1600 - 800 = 800 at 40² (index 10), only in blocks 3..27; 48² and 64² not run; the
    cache is the 24² scale (index 8)."""
    ctx = ctx_for()
    plans = run_plans(build_policy("fastvar"), ctx)
    assert [p.run for p in plans] == [True] * 11 + [False, False]
    assert [si for si, p in enumerate(plans) if p.keep_residuals] == [8]
    for si, keep in ((9, 615), (10, 800)):
        assert sorted(plans[si].blocks) == list(range(3, 28))
        for bp in plans[si].blocks.values():
            assert (bp.mode, bp.n_keep, bp.fill, bp.cache_from, bp.prune_kv) == ("prune", keep, "cache", 8, True)
    assert all(is_neutral(p) for p in plans[:9])
    # the executed token counts the runtime records for these plans (flops.plan_trace, checked
    # against real runtime traces in tests/engine/test_runtime.py)
    trace = plan_trace(SQ_1M, plans, 32, 1, True, {2: 20, 1: 10})
    for si, (n, keep) in {9: (1024, 615), 10: (1600, 800)}.items():
        for bi, b in enumerate(trace[si]["blocks"]):
            want = keep if 3 <= bi <= 27 else n
            assert (b["sa"], b["ca"], b["ffn"], b["qkv"]) == (want,) * 4
    assert not trace[11]["ran"] and not trace[12]["ran"]


def test_fastvar_presets_8b_and_short_schedule():
    ctx8 = ctx_for(depth=40, embed_dim=3584, heads=28)
    plans = run_plans(build_policy("fastvar", prune={-4: 0.4, -3: 0.6, -2: 1.0, -1: 1.0}, skip=[]), ctx8)
    assert [p.run for p in plans[-2:]] == [False, False]              # ratio 1.0 = skip
    assert sorted(plans[9].blocks) == list(range(4, 35))             # 3/32..28/32 of 40 -> 4..34
    assert plans[10].blocks[4].n_keep == 1600 - int(1600 * 0.6)      # 640
    # a 10-scale schedule (512²): the from-end reading shifts the recipe down by three scales
    p512 = run_plans(build_policy("fastvar"), ctx_for(scale_schedule(1.0, "0.25M")))
    assert [p.run for p in p512] == [True] * 8 + [False, False]
    assert p512[5].keep_residuals and p512[6].blocks[3].n_keep == 256 - int(256 * 0.4)
    # absolute indices pin the released scales instead
    pabs = run_plans(build_policy("fastvar", prune={9: 0.4}, skip=[], cache_scale=8), ctx_for(scale_schedule(1.0, "0.25M")))
    assert pabs[9].blocks[3].n_keep == 615 and pabs[8].keep_residuals and all(p.run for p in pabs)


def test_fastvar_rejects_a_cache_scale_after_the_pruned_ones():
    with pytest.raises(ValueError, match="cache_scale"):
        build_policy("fastvar", cache_scale=-1, skip=[]).reset(ctx_for())


def test_block_range_rounds_half_up():
    assert block_range(32, 3 / 32, 28 / 32) == range(3, 28)
    assert block_range(40, 3 / 32, 28 / 32) == range(4, 35)
    assert block_range(4, 3 / 32, 28 / 32) == range(0, 4)   # 3.5 -> 4 (Python's round would give 4; 2.5 -> 3 here)
    assert block_range(20, 0.125, 0.125) == range(3, 3)      # 2.5 -> 3, not banker's 2


def test_pivotal_selector_keeps_far_tokens_and_can_share_the_cfg_mask():
    # 2 prompts under CFG: rows [c0, c1, u0, u1]; token j of row r sits at distance ~ perm_r[j] from the mean
    L, C = 6, 3
    x = torch.zeros(4, L, C)
    perms = [[0, 5, 1, 4, 2, 3], [5, 4, 3, 2, 1, 0], [1, 0, 2, 3, 4, 5], [0, 1, 2, 3, 4, 5]]
    for r, perm in enumerate(perms):
        for j, d in enumerate(perm):
            x[r, j, 0] = float(d) * (1 if j % 2 else -1)
    sctx = SelectorContext(scale=9, block=3, sublayer="sa", h=2, w=3, batch=2, cfg_rows=True)
    per_row = PivotalSelector(2, "per_row")(x, sctx)
    ref = [sorted(torch.topk(((x[r] - x[r].mean(0)) ** 2).sum(-1), 2).indices.tolist()) for r in range(4)]
    assert per_row.tolist() == ref
    shared = PivotalSelector(2, "cond")(x, sctx)
    assert shared[:2].tolist() == ref[:2] and shared[2:].tolist() == ref[:2]


# -------------------------------------------------------------------------------------- neutrality
#: each method's declared neutral setting (its policy's NEUTRAL); skipvar needs decoded images and
#: compose is checked below
NEUTRAL = {name: REGISTRY.load(name).NEUTRAL for name in REGISTRY.packaged() if name not in ("skipvar", "compose")}


@pytest.mark.parametrize("name", sorted(NEUTRAL))
@pytest.mark.parametrize("batch,cfg_rows", [(1, True), (3, False)])
def test_neutral_settings_plan_like_the_baseline(name, batch, cfg_rows):
    plans = run_plans(build_policy(name, **NEUTRAL[name]), ctx_for(batch=batch, cfg_rows=cfg_rows))
    assert all(is_neutral(p) for p in plans)
    if name != "toprovar":  # toprovar still measures attention entropy (observation only)
        assert all(p == ScalePlan() for p in plans)


def test_neutral_compose_is_neutral():
    comp = Compose(**Compose.NEUTRAL)
    assert all(p == ScalePlan() for p in run_plans(comp, ctx_for()))


# -------------------------------------------------------------------------------------------- nova
def nova_curve(si, L, B=1, bumps=None):
    """H_t = 0.1 t for t <= 6 growth... : growth 0.1 up to scale 5, 0.05 at 6, 0.01 after."""
    H = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.55, 0.56, 0.57, 0.58, 0.59, 0.60, 0.61][si]
    side = int(math.isqrt(L)) or 1
    # a left-to-right ramp around the mean: the right-most columns have the highest entropy
    ramp = torch.linspace(-0.01, 0.01, side).repeat(side)[:L] if L > 1 else torch.zeros(1)
    return (H + ramp).unsqueeze(0).expand(B, L).clone()


def test_nova_activation_ratio_and_token_choice():
    """Baseline growth b = mean(g_1..g_4) = 0.1; delta_6 = (g_5 + g_6)/2 = (0.1 + 0.05)/2 = 0.075 < b,
    and 6 is the first scale with >= 256 tokens (16²), so t* = 6 and pruning starts at 7."""
    ctx = ctx_for()
    pol = build_policy("nova", layer_entropy="none", c0=0.0)
    plans = run_plans(pol, ctx, entropy_fn=lambda si, L: nova_curve(si, L))
    st = pol.stats()
    assert st["activation_scale"] == 6 and st["activation_decided_after"] == 6
    assert all(is_neutral(p) for p in plans[:7]) and plans[7].blocks
    # scale ratio at t=7 (monotone): sigmoid(rho*7/7 - lam*tanh(g/|b|) + c0), g = H_6 - H_5 = 0.05, b = 0.1
    r7 = 1 / (1 + math.exp(-(1.0 - 0.5 * math.tanh(0.05 / 0.1))))
    assert st["ratios"][7]["scale_ratio"] == pytest.approx(r7, rel=1e-5)
    keep = 400 - int(400 * r7)
    bp = plans[7].blocks[0]
    assert bp.n_keep == keep and bp.cache_from == 6 and bp.fill == "cache"
    assert sorted(plans[7].blocks) == list(range(32))                 # NOVA protects no layer by default
    # the kept tokens are the highest-entropy ones of scale 6's map, upsampled to 20x20
    score = upsample_map(nova_curve(6, 256), (16, 16), (20, 20))[0]
    assert score[bp.keep[0]].min() >= score.max() - (score.max() - score.min()) * 1.0  # sanity
    assert score[bp.keep[0]].min() >= torch.topk(score, keep).values.min() - 1e-7
    assert bp.keep.shape == (2, keep) and torch.equal(bp.keep[0], bp.keep[1])  # uncond row reuses the mask
    # residuals are kept on every candidate scale from t_min on (prev_scale cache)
    assert [si for si, p in enumerate(plans) if p.keep_residuals] == list(range(6, 12))


def test_nova_layer_linkage_prunes_less_where_attention_entropy_is_higher():
    ctx = ctx_for(depth=4)
    pol = build_policy("nova", mu=1.0)
    E = {0: 1.0, 1: 1.0, 2: 2.0, 3: 0.5}  # block 2 above the mean of 0..1, block 3 below the mean of 0..2

    plans = run_plans(pol, ctx, entropy_fn=lambda si, L: nova_curve(si, L),
                      attn_fn=lambda si, b, L: torch.full((ctx.rows, min(L, 256)), E[b]))
    lr = pol.stats()["ratios"][7]["layer_ratios"]
    r = lr[0]
    assert lr[1] == pytest.approx(r)                                  # equal to the mean before it
    assert lr[2] == pytest.approx(r * math.exp(-1.0 * (2.0 - 1.0) / 1.0))
    assert lr[3] == pytest.approx(min(0.9, r * math.exp(-1.0 * (0.5 - 4 / 3) / (4 / 3))))
    assert plans[7].blocks[2].n_keep > plans[7].blocks[0].n_keep
    assert plans[6].attention_entropy_for == frozenset(range(4)) and plans[6].attention_entropy_queries == 256


def test_nova_batch_reduction_and_reset():
    ctx = ctx_for(batch=3)

    def H(i, t):  # image i: growth 0.1 up to scale 5+i, 0.05 at 6+i, 0.01 after -> t*_i = 6+i
        g = lambda s: 0.1 if s <= 5 + i else (0.05 if s == 6 + i else 0.01)  # noqa: E731
        return sum(g(s) for s in range(1, t + 1))

    def ent(si, L):
        return torch.tensor([[H(i, si)] * L for i in range(3)])

    for how, want in (("earliest", 6), ("median", 7), ("latest", 8)):
        # beta 0.9: delta = 0.1 (still growing) vs 0.075 (slowing) sit clearly on either side of 0.09
        pol = build_policy("nova", batch_activation=how, layer_entropy="none", t_force=None, beta_baseline=0.9)
        run_plans(pol, ctx, entropy_fn=ent)
        assert pol.stats()["activation_per_image"] == [6, 7, 8]
        assert pol.stats()["activation_scale"] == want
        pol.reset(ctx)
        assert pol.stats()["activation_scale"] is None and pol.stats()["ratios"] == {}


def test_nova_forced_activation_and_refused_knobs():
    pol = build_policy("nova", layer_entropy="none")
    # accelerating growth (H = 0.1 t^1.5): the moving average never falls below the baseline
    run_plans(pol, ctx_for(), entropy_fn=lambda si, L: torch.full((1, L), 0.1 * si ** 1.5))
    assert pol.stats()["activation_scale"] == 9                       # t_force = -4 = 32²
    with pytest.raises(ValueError, match="lag"):
        build_policy("nova", layer_entropy_lag=0)
    with pytest.raises(ValueError, match="logit_lens"):
        build_policy("nova", layer_entropy="logit_lens")


# ---------------------------------------------------------------------------------------- toprovar
def test_toprovar_depth_rule_both_readings():
    """rho_s is the fraction of queries below the scale's mean entropy. Maps with a fraction f of
    zeros and the rest ones have rho = f: we make rho fall 0.9, 0.6, 0.3, 0.2 over scales 6..9."""
    rho_by_scale = {6: 0.9, 7: 0.6, 8: 0.3, 9: 0.2}

    def attn(si, b, L):
        f = rho_by_scale.get(si, 0.5)
        m = torch.ones(2, L)
        m[:, : int(round(f * L))] = 0.0
        return m

    ge = build_policy("toprovar", depth_rule="rho_ge_tau")
    run_plans(ge, ctx_for(), attn_fn=attn)
    assert ge.stats()["depth_D"] == 6                                 # first rho >= 0.4
    le = build_policy("toprovar", depth_rule="rho_le_tau", layer_mode="uniform")
    plans = run_plans(le, ctx_for(), attn_fn=attn)
    assert le.stats()["depth_D"] == 8 and le.stats()["first_pruned"] == 9   # first rho <= 0.4, then offset 1
    assert all(is_neutral(p) for p in plans[:9]) and plans[9].blocks
    trunc = build_policy("toprovar", depth_rule="rho_le_tau", depth_mode="truncate_after_D")
    plans = run_plans(trunc, ctx_for(), attn_fn=attn)
    assert [p.run for p in plans] == [True] * 9 + [False] * 4
    with pytest.raises(ValueError, match="depth_offset"):
        build_policy("toprovar", depth_offset=0)


def test_toprovar_svd_split_and_token_gate():
    """Block 0: a zero-mean separable pattern (rank 1 after centring, plus faint noise) -> Global.
    Block 1: noise (sigma1/sigma2 near 1 after centring) -> Detail. The gate keeps low entropy."""
    ctx = ctx_for(depth=2)

    def attn(si, b, L):
        h, w = ctx.schedule[si]
        if b == 0:
            m = torch.outer(torch.linspace(-1, 1, h), torch.linspace(-1, 1, w)).reshape(1, L)  # zero-mean rank 1
            m = m + 1e-3 * torch.rand(1, L, generator=torch.Generator().manual_seed(si))
        else:
            m = torch.rand(1, L, generator=torch.Generator().manual_seed(si))
        if si >= 6:  # drive D: rho = 0.5 >= 0.4 at scale 6
            m = torch.arange(L, dtype=torch.float32).reshape(1, L) / L
        return m.expand(2, L).clone()

    pol = build_policy("toprovar", alpha_min=0.2, alpha_max=0.9)
    plans = run_plans(pol, ctx, attn_fn=attn)
    st = pol.stats()
    assert st["layer_varrho"][0] > 10 and st["layer_varrho"][1] < 2.0
    assert st["detail_layers"] == [1] and st["depth_D"] == 6
    bp = plans[7].blocks[1]
    assert 0 not in plans[7].blocks and bp.fill == "pass" and bp.n_keep % 8 == 0
    # scale 6's map increases with the token index; upsampled to 20x20 the kept tokens are the low rows
    score = upsample_map((torch.arange(256, dtype=torch.float32) / 256).reshape(1, 256), (16, 16), (20, 20))[0]
    assert score[bp.keep[0]].max() <= torch.topk(score, bp.n_keep, largest=False).values.max() + 1e-7
    # expected kept count: sum_i 1 - clip(a_min + (a_max - a_min) phi R Hhat_i) with minmax Hhat, rounded up to 8
    R = math.exp(-1.0 * (st["layer_varrho"][1] - 1.0))
    hhat = (score - score.min()) / (score.max() - score.min())
    p = 1 - (0.2 + 0.7 * (8 / 13) * R * hhat).clamp(0, 1)
    assert bp.n_keep == min(400, -(-math.ceil(float(p.sum()) - 1e-6) // 8) * 8)


def test_toprovar_layer_modes_and_refusals():
    ctx = ctx_for(depth=2)
    attn = lambda si, b, L: torch.linspace(0, 1, L).expand(2, L).clone()  # noqa: E731  rho = 0.5 everywhere
    sk = build_policy("toprovar", layer_mode="skip_detail_layers", global_threshold=1e9)  # every layer Detail
    plans = run_plans(sk, ctx, attn_fn=attn)
    D = sk.stats()["depth_D"]
    assert D == 6 and {bp.mode for bp in plans[7].blocks.values()} == {"skip"}
    fx = build_policy("toprovar", fixed_exit=-4)
    assert [p.run for p in run_plans(fx, ctx, attn_fn=attn)] == [True] * 10 + [False] * 3
    for bad in ({"svd_matrix": "hidden_states"}, {"head_reduce": "max"}, {"rho_source": "layer_subset"}):
        with pytest.raises(ValueError):
            build_policy("toprovar", **bad)


# ------------------------------------------------------------------------------------------- skips
def test_skip_baselines():
    ctx = ctx_for()
    assert [p.run for p in run_plans(build_policy("skip_last", run_scales=11), ctx)] == [True] * 11 + [False] * 2
    assert [p.run for p in run_plans(build_policy("skip_last", run_scales=-1), ctx)] == [True] * 12 + [False]
    plans = run_plans(build_policy("skipvar_fixed", skip_last=1, uncond_from=-3), ctx)
    assert [p.drop_uncond for p in plans] == [False] * 10 + [True, True, False] and not plans[12].run
    # without CFG there is nothing to drop
    plans = run_plans(build_policy("skipvar_fixed", uncond_from=-3), ctx_for(cfg_rows=False))
    assert all(p == ScalePlan() for p in plans)
    with pytest.raises(ValueError):
        build_policy("skip_last", run_scales=0)


# ----------------------------------------------------------------------------------------- compose
def test_compose_nova_over_fastvar_cache():
    comp = build_policy("compose", policies=[{"name": "fastvar"}, {"name": "nova", "knobs": {"layer_entropy": "none"}}],
                        conflict="last", cache="first")
    plans = run_plans(comp, ctx_for(), entropy_fn=lambda si, L: nova_curve(si, L))
    assert [p.run for p in plans[-2:]] == [False, False]              # FastVAR's skipped scales
    assert plans[8].keep_residuals                                    # FastVAR's cache scale is kept
    assert plans[7].blocks[0].cache_from == 6                         # before 24²: NOVA's own cache
    assert plans[9].blocks[0].cache_from == 8 and plans[9].blocks[5].cache_from == 8   # redirected
    assert plans[9].blocks[5].keep is not None                        # NOVA's plan won the conflict


def test_compose_conflicts_and_refusals():
    comp = build_policy("compose", policies=[{"name": "fastvar"}, {"name": "nova", "knobs": {"layer_entropy": "none"}}])
    with pytest.raises(ValueError, match="both prune|all prune"):
        run_plans(comp, ctx_for(), entropy_fn=lambda si, L: nova_curve(si, L))
    with pytest.raises(ValueError, match="refused"):
        build_policy("compose", policies=[{"name": "nova"}, {"name": "toprovar"}])
    with pytest.raises(ValueError, match="at least two"):
        build_policy("compose", policies=[{"name": "fastvar"}])
    with pytest.raises(ValueError, match="cache scale"):
        build_policy("compose", policies=[{"name": "skip_last"}, {"name": "nova"}], cache="first").reset(ctx_for())


def test_registry_suggests_on_typo():
    with pytest.raises(KeyError, match="fastvar"):
        build_policy("fastvr")


def test_complete_map_fills_unmeasured_queries():
    prev = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    out = complete_map(torch.tensor([[9.0]]), torch.tensor([[2]]), 4, prev)
    assert out.tolist() == [[1.0, 2.0, 9.0, 4.0]]
    assert complete_map(torch.tensor([[5.0, 7.0]]), torch.tensor([[0, 3]]), 4, None).tolist() == [[5.0, 6.0, 6.0, 7.0]]


# ------------------------------------------------------------------------------ configs and FLOPs
def _without_release_data(knobs):
    """ScaleKV's released budget files are not shipped (a user downloads them): a preset naming one
    gets a synthetic budget of the released files' shape for the 2B schedule instead, as does a preset
    with an inline budget for another depth (members of a composed method too)."""
    from varbench.policies.scalekv import synthetic_budgets

    if isinstance(knobs, dict) and (knobs.get("budget_file") or knobs.get("budgets")):   # scalekv_toy's: 6 toy blocks
        return {**{k: v for k, v in knobs.items() if k != "budget_file"}, "budgets": synthetic_budgets(SQ_1M, 32, **({"base_capacity": knobs["base_capacity"]} if knobs.get("base_capacity") else {}))}
    if isinstance(knobs, dict) and isinstance(knobs.get("policies"), list):
        return {**knobs, "policies": [{**m, "knobs": _without_release_data(m.get("knobs") or {})} for m in knobs["policies"]]}
    return knobs


def test_every_method_config_builds_its_policy():
    from pathlib import Path

    from experiments.flops_table import load_method

    confs = sorted((Path(__file__).resolve().parents[2] / "varbench" / "conf" / "method").glob("*.yaml"))
    assert len(confs) >= 20
    import dataclasses

    from omegaconf import OmegaConf

    from varbench.engine.backbones.hart.model import HART_PRESETS

    hart = ctx_for([(p, p) for p in HART_PRESETS["hart_0p7b"].patch_nums], depth=24, embed_dim=1536, heads=24)
    hart = dataclasses.replace(hart, backbone="hart")
    #: compositions kept so the composition matrix lists their refusal (compose.INCOMPATIBLE) with its reason
    refused = {"sparvar_scalekv"}
    for c in confs:
        name, label, knobs = load_method(c.stem)
        knobs = _without_release_data(knobs)
        if c.stem in refused:
            with pytest.raises(ConfigError, match="is refused"):
                build_policy(name, **knobs)
            continue
        pol = build_policy(name, **knobs)
        # a preset tuned to one family (its `refuse:` names the other) is built on the family it is for
        on_infinity = "infinity" not in (OmegaConf.load(c).get("refuse") or {})
        pol.reset(ctx_for() if on_infinity else hart)
        assert label and pol.describe()["name"] == name


def test_flops_table_orders_the_static_methods():
    """FastVAR = skipping the last two scales + pruning 32²/40², so it must cost less than skipping
    alone, and pruning alone must cost less than the baseline but more than skipping."""
    from experiments.flops_table import load_method, method_flops

    f = {m: method_flops(*load_method(m)[::2], "infinity_2b", 1.0, "1M", 1, 32, 6, 9)[0]
         for m in ("baseline", "fastvar", "skip_last_2", "fastvar_no_skip")}
    assert f["fastvar"] < f["skip_last_2"] < f["fastvar_no_skip"] < f["baseline"]


def test_block_protections_are_counts_or_fractions_of_depth():
    from varbench.policies.common import protected_blocks

    assert protected_blocks(32, 3, 4) == range(3, 28)
    assert protected_blocks(32, 0.09375, 0.125) == range(3, 28)        # the same as fractions
    assert protected_blocks(4, 0.09375, 0.125) == range(0, 3)          # and they scale to small models
    with pytest.raises(ValueError, match="no prunable block"):
        protected_blocks(4, 3, 4)
