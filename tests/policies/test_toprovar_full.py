"""ToProVAR's full method (A.1.5), its Table 10 presets, the FLOPs ordering they give under
experiments/flops_table.py's scenario, the method card's provenance labels, and the tau calibration
command (A.2) on the toy model."""
from __future__ import annotations

import math
import re

import pytest
import torch

from experiments import flops_table as ft
from experiments import toprovar_calibrate as cal
from varbench.engine.plan import GenerationContext
from varbench.policies import build_policy, toprovar
from varbench.engine.plan import is_neutral
from varbench.policies.selectors import upsample_map

SQ_1M = ((1, 1), (2, 2), (4, 4), (6, 6), (8, 8), (12, 12), (16, 16), (20, 20), (24, 24), (32, 32), (40, 40),
         (48, 48), (64, 64))


def ctx_for(depth=4, batch=1):
    n = len(SQ_1M)
    return GenerationContext(schedule=SQ_1M, depth=depth, embed_dim=64, num_heads=4, batch=batch, cfg_rows=True,
                             cfg=(4.0,) * n, tau=(1.0,) * n)


def drive(pol, ctx, attn):
    from tests.policies.test_policies_plans import signals_for
    pol.reset(ctx)
    plans = []
    for si in range(len(ctx.schedule)):
        p = pol.plan(si)
        plans.append(p)
        if p.run:
            L = ctx.tokens(si)
            pol.observe(si, signals_for(ctx, si, torch.zeros(ctx.batch, L), {b: attn(si, b, L) for b in p.attention_entropy_for}))
    return plans


def layered_attn(ctx, noise):
    """Block 0: rank-1 after centring (Global). Blocks 1..: that pattern plus `noise[b]` * random, so sigma1/sigma2 (hence R) differs per block.
    rho = 0.5 from scale 6 on (the ramp), so D = 6 and the onset is scale 7."""
    def attn(si, b, L):
        h, w = ctx.schedule[si]
        if si == 5:  # the SVD scale
            if b == 0:
                m = torch.outer(torch.linspace(-1, 1, h), torch.linspace(-1, 1, w)).reshape(1, L)
            else:
                g = torch.Generator().manual_seed(b)
                m = torch.linspace(0, 1, L)[torch.randperm(L, generator=g)].reshape(1, L) * noise[b]
                m = m + torch.outer(torch.linspace(-1, 1, h), torch.linspace(-1, 1, w)).reshape(1, L)
        else:
            m = torch.arange(L, dtype=torch.float32).reshape(1, L) / L
        return m.expand(2, L).clone()
    return attn


def test_full_method_keeps_global_skips_or_gates_detail_by_the_gate():
    """From D + 1: Global layers run in full; a Detail layer is skipped iff Eq. 6 would prune at least
    layer_skip_prune of its tokens on average, else it runs on the E[kept] lowest-entropy tokens."""
    ctx = ctx_for(depth=4)
    pol = build_policy("toprovar", layer_skip_prune=0.5)
    plans = drive(pol, ctx, layered_attn(ctx, {1: 1.0, 2: 3.0, 3: 30.0}))
    st = pol.stats()
    assert st["depth_D"] == 6 and st["first_pruned"] == 7 and st["detail_layers"] == [2, 3]
    assert all(is_neutral(p) for p in plans[:7])
    saw_skip = saw_prune = False
    for si in range(7, 13):
        L = ctx.tokens(si)
        assert 0 not in plans[si].blocks and 1 not in plans[si].blocks      # Global (rho_l 1e7, 3.0): full
        score = upsample_map((torch.arange(ctx.tokens(si - 1), dtype=torch.float32) / ctx.tokens(si - 1)).reshape(1, -1),
                             SQ_1M[si - 1], SQ_1M[si])[0]
        hhat = (score - score.min()) / (score.max() - score.min())
        for l in (2, 3):
            R = math.exp(-(st["layer_varrho"][l] - 1.0))
            keep = float((1 - (0.3 + 0.6 * ((si + 1) / 13) * R * hhat).clamp(0, 1)).sum())
            bp = plans[si].blocks[l]
            if 1 - keep / L >= 0.5 - 1e-9:
                assert bp.mode == "skip", (si, l)
                saw_skip = True
            else:
                assert bp.mode == "prune" and bp.fill == "pass" and bp.prune_kv
                assert bp.n_keep == min(L, -(-math.ceil(keep - 1e-6) // 8) * 8)
                assert score[bp.keep[0]].max() <= torch.topk(score, bp.n_keep, largest=False).values.max() + 1e-7
                saw_prune = True
        assert sorted(st["pruned"][si]["skipped_blocks"]) == sorted(l for l, b in plans[si].blocks.items() if b.mode == "skip")
    assert saw_skip and saw_prune                     # the scenario exercises both branches


def test_full_method_layer_skip_knob_and_alpha_zero_is_neutral():
    ctx = ctx_for(depth=4)
    attn = layered_attn(ctx, {1: 1.0, 2: 3.0, 3: 30.0})
    never = drive(build_policy("toprovar", layer_skip_prune=1.0), ctx, attn)
    always = drive(build_policy("toprovar", layer_skip_prune=0.01), ctx, attn)
    assert all(b.mode == "prune" for p in never[7:] for b in p.blocks.values())
    assert all(b.mode == "skip" for p in always[7:] for b in p.blocks.values()) and always[7].blocks
    assert all(is_neutral(p) for p in drive(build_policy("toprovar", alpha_min=0.0, alpha_max=0.0), ctx, attn))
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match="layer_skip_prune"):
            build_policy("toprovar", layer_skip_prune=bad)


def test_post_scales_drops_the_scales_after_k_pruned_ones():
    ctx = ctx_for(depth=4)
    plans = drive(build_policy("toprovar", post_scales=2), ctx, layered_attn(ctx, {1: 1.0, 2: 3.0, 3: 30.0}))
    assert [p.run for p in plans] == [True] * 9 + [False] * 4     # onset 7: scales 7, 8 run, 9.. dropped
    with pytest.raises(ValueError, match="post_scales"):
        build_policy("toprovar", post_scales=0)


def test_preset_defaults_carry_the_papers_values():
    _, _, k = ft.load_method("toprovar")
    assert k["tau"] == 0.4 and k["svd_scale"] == 5 and k["depth_rule"] == "rho_ge_tau"  # Sec. 4, Table 6 (1-based s=6)
    assert k["layer_mode"] == "full" and k["beta"] == 1.0 and k["prune_kv"] is True
    rows = {"toprovar_fixed_exit": {"fixed_exit": -4}, "toprovar_scale_only": {"depth_mode": "truncate_after_D"},
            "toprovar_scale_token": {"layer_mode": "uniform"}, "toprovar_scale_layer": {"layer_mode": "skip_detail_layers"},
            "toprovar_gate_detail": {"layer_mode": "gate_detail_only"}}
    for name, want in rows.items():
        _, _, kk = ft.load_method(name)
        assert {key: kk[key] for key in want} == want
        assert {key: v for key, v in kk.items() if key not in want} == {key: v for key, v in k.items() if key not in want}


def test_table10_flops_follow_the_papers_order():
    """Paper (2B, latency): fixed exit 5.1x > scale 4.5x > scale+layer 3.7x > full 3.4x > scale+token 2.7x.
    Analytic FLOPs on the 2B 1024² schedule, cfg 4, flops_table's scenario (D at 32²), same order."""
    x = {}
    base, _ = ft.method_flops("baseline", {}, "infinity_2b", 1.0, "1M", 1, 32, 6, 9)
    for m in ["toprovar_fixed_exit", "toprovar_scale_only", "toprovar_scale_layer", "toprovar", "toprovar_scale_token"]:
        name, _, knobs = ft.load_method(m)
        f, st = ft.method_flops(name, knobs, "infinity_2b", 1.0, "1M", 1, 32, 6, 9)
        x[m] = base / f
    order = list(x)
    assert all(x[a] > x[b] for a, b in zip(order, order[1:])), x


def test_method_card_labels_every_step():
    doc = toprovar.__doc__
    steps = re.findall(r"^  (\d)\. (.*?)(?=^  \d\. |^Table 10)", doc, flags=re.S | re.M)
    assert [int(n) for n, _ in steps] == list(range(1, 10))
    for n, text in steps:
        assert "as published" in text or "reconstructed" in text, f"step {n} has no provenance label"
    assert "as released" in doc  # says why nothing is


def test_calibrate_picks_the_centre_of_the_good_points():
    pts = [{"image": 0, "scale": s, "rho": r, "ssim": q, "last": s == 4}
           for s, r, q in [(1, 0.2, 0.5), (2, 0.35, 0.85), (3, 0.45, 0.9), (4, 0.9, 1.0)]]
    pts += [{"image": 1, "scale": s, "rho": r, "ssim": q, "last": s == 4}
            for s, r, q in [(1, 0.3, 0.7), (2, 0.5, 0.79), (3, 0.42, 0.95), (4, 0.9, 1.0)]]
    assert cal.calibrate(pts, 0.8, "all", "median") == pytest.approx(0.42)     # 0.35, 0.45, 0.42
    assert cal.calibrate(pts, 0.8, "first", "median") == pytest.approx((0.35 + 0.42) / 2)
    assert cal.calibrate(pts, 0.99, "all", "median") is None                    # the last scale never counts
    assert cal.depth_for({4: 0.3, 5: 0.45, 6: 0.5}, 0.4, "rho_ge_tau") == 5
    assert cal.depth_for({4: 0.3, 5: 0.45}, 0.4, "rho_le_tau") == 4


@pytest.mark.integration
def test_calibration_command_runs_on_the_toy_model(tmp_path, capsys):
    """The A.2 procedure end to end on the shipped toy model (a few prompts; CPU)."""
    out = tmp_path / "cal.json"
    assert cal.main(["model=toy", "--method", "toprovar_toy", "--limit", "6", "--out", str(out)]) == 0
    import json
    rep = json.loads(out.read_text())
    assert rep["n_images"] == 6 and rep["n_scales"] == 9
    scales = [r["scale"] for r in rep["per_scale"]]
    assert scales == [si for si in range(9) if [1, 2, 3, 4, 6, 8, 10, 13, 16][si] ** 2 >= 36]  # d_min_tokens 36
    assert all(0.0 <= r["rho_mean"] <= 1.0 and -1.0 <= r["ssim_mean"] <= 1.0 for r in rep["per_scale"])
    assert rep["per_scale"][-1]["ssim_mean"] == pytest.approx(1.0)       # the last scale's image is the final one
    assert rep["tau_calibrated"] is None or 0.0 <= rep["tau_calibrated"] <= 1.0
    assert len(rep["depth_D"]["calibrated"]) == 6
    assert "tau (calibrated)" in capsys.readouterr().out


@pytest.mark.runtime
def test_calibration_probe_is_neutral():
    """Entropy requests and intermediate decodes only observe: the images are the baseline's."""
    from varbench.toy.load import TOY_SCHEDULE, load_toy_runtime
    rt = load_toy_runtime("cpu")
    kw = dict(cfg=2.0, tau=1.0, schedule=TOY_SCHEDULE)
    probe = cal.EntropyProbe("mean_over_layers_heads", None, 36, None, decode=True)
    a = rt.generate(["a red circle"], [0], probe, **kw)
    b = rt.generate(["a red circle"], [0], None, **kw)
    assert torch.equal(a.images, b.images) and probe.rho and set(probe.images) == set(probe.rho)
