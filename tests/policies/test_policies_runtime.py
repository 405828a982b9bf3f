"""Acceleration policies on the tiny random Infinity (CPU): neutral settings reproduce the
baseline bit for bit, active settings act, repeat exactly, and run at batch 3, non-square aspect
ratios and without CFG.

Most runs use the '0.06M' schedule (7 scales, up to 16x16) for speed; knobs whose defaults assume
1024² (minimum token counts, the SVD scale) are scaled down to it in each method's declared ACTIVE
setting (its policy's class attribute), which ACTIVE below extends with a few variants.
"""
from __future__ import annotations

import json

import pytest
import torch

from varbench.engine.policy import Policy
from varbench.policies import REGISTRY, build_policy
from varbench.policies.selectors import binary_entropy_from_logits
from varbench.testing.tiny import tiny_runtime

#: generates with a tiny random runtime (seconds per test): the full run's tier, not plain `pytest`'s
pytestmark = pytest.mark.runtime

PN = "0.06M"


def declared(what: str) -> dict:
    """Each method's declared NEUTRAL or ACTIVE setting (the baseline is the reference; skipvar's
    injected decisions are run in tests/policies/test_skipvar.py)."""
    return {name: getattr(REGISTRY.load(name), what) for name in REGISTRY.packaged() if name not in ("baseline", "skipvar")}


NEUTRAL = declared("NEUTRAL")

ACTIVE = {
    **declared("ACTIVE"),      # fastvar's from-end defaults: cache 4², prune 6²/8², skip 12²/16²
    "fastvar_cond_mask": ("fastvar", {"cfg_selection": "cond", "skip": []}),
    "toprovar_sample": ("toprovar", {"d_min_tokens": 16, "min_tokens_to_prune": 16, "svd_scale": 2, "tau": 0.0,
                                     "layer_mode": "gate_only", "keep_mode": "weighted_sample"}),
}


def make(key):
    spec = ACTIVE[key]
    name, knobs = spec if isinstance(spec, tuple) else (key, spec)
    return build_policy(name, **knobs)


@pytest.fixture(scope="module")
def rt(tiny_rt):
    return tiny_rt                  # tiny_runtime(seed=0), shared by the session (tests/conftest.py)


@pytest.fixture(scope="module")
def baseline(tiny_baseline):
    """rt.generate(["a red circle"], seeds=[0], cfg=3.0, tau=1.0, pn=PN): the session's shared one."""
    return tiny_baseline


def acted(out) -> bool:
    """Whether the plan changed anything the model computed (fewer tokens, skipped scale/block,
    evicted cached K/V, dropped unconditional rows)."""
    for tr in out.trace:
        if not tr["ran"]:
            return True
        if any(b["mode"] != "full" or b["sa"] < tr["tokens"] or b.get("kv_evicted") or "attn_pairs" in b
               for b in tr["blocks"]):
            return True                   # (kv_evicted: a KV budget dropped cached positions, e.g. ScaleKV;
                                          # attn_pairs: an attention plan chose the keys, e.g. SparVAR)
    rows = [tr["rows"] for tr in out.trace if tr["ran"]]
    return len(set(rows)) > 1


@pytest.mark.parametrize("name", sorted(NEUTRAL))
def test_neutral_setting_reproduces_baseline_images(rt, baseline, name):
    out = rt.generate(["a red circle"], seeds=[0], policy=build_policy(name, **NEUTRAL[name]), cfg=3.0, tau=1.0, pn=PN)
    assert not acted(out)
    assert torch.equal(out.summed_codes, baseline.summed_codes)
    assert torch.equal(out.images, baseline.images)


@pytest.mark.parametrize("key", sorted(ACTIVE))
def test_active_setting_acts_and_repeats_exactly(rt, baseline, key):
    pol = make(key)
    a = rt.generate(["a red circle"], seeds=[0], policy=pol, cfg=3.0, tau=1.0, pn=PN, decode=False)
    b = rt.generate(["a red circle"], seeds=[0], policy=pol, cfg=3.0, tau=1.0, pn=PN, decode=False)
    assert acted(a), f"{key} changed nothing on the tiny schedule: its test knobs no longer make it act"
    assert a.flops["total"] < baseline.flops["total"]
    assert torch.equal(a.summed_codes, b.summed_codes)                # no stale state between generations
    assert a.policy_stats == b.policy_stats
    json.dumps(a.policy_stats)                                          # goes into the per-image trace


@pytest.mark.parametrize("key", sorted(ACTIVE))
def test_batch3_nonsquare_and_cfg_off(rt, key):
    out = rt.generate(["a red circle", "a cat", "two dogs"], seeds=[0, 1, 2], policy=make(key), cfg=3.0, tau=1.0,
                      pn=PN, h_div_w=0.5, decode=False)
    assert out.schedule[-1][0] < out.schedule[-1][1]                   # h < w: a non-square grid
    assert out.summed_codes.shape[0] == 3 and torch.isfinite(out.summed_codes).all()
    out1 = rt.generate(["a red circle"], seeds=[0], policy=make(key), cfg=1.0, tau=1.0, pn=PN, decode=False)
    assert all(tr["rows"] in (0, 1) for tr in out1.trace)               # no uncond rows without CFG
    assert torch.isfinite(out1.summed_codes).all()


def test_nova_entropy_knobs_match_the_runtime_signal(rt):
    """The default NOVA entropy (guided, tempered, mean over bits) is the runtime's token_entropy;
    recomputing it from the signal's logits gives the same numbers."""
    seen = []

    class Probe(Policy):
        name = "probe"

        def plan(self, si):
            from varbench.engine.plan import ScalePlan
            return ScalePlan()

        def observe(self, si, s):
            seen.append((s.token_entropy, binary_entropy_from_logits(s.logits, "mean")))

    rt.generate(["a red circle"], seeds=[0], policy=Probe(), cfg=3.0, tau=0.7, pn=PN, decode=False)
    for te, recomputed in seen:
        torch.testing.assert_close(te.float(), recomputed, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_fastvar_released_hand_count_from_runtime_trace():
    """Released FastVAR at the 1024² schedule on a 32-block tiny model: the executed tokens per
    (scale, block, sublayer) are 615/1024 (scale 9) and 800/1600 (scale 10) in blocks 3..27, full
    elsewhere, and scales 11, 12 do not run. (~1 min on 2 CPU cores.)"""
    rt32 = tiny_runtime(seed=0, depth=32)
    out = rt32.generate(["a red circle"], seeds=[0], policy=build_policy("fastvar"), cfg=3.0, pn="1M", decode=False)
    assert [tr["ran"] for tr in out.trace] == [True] * 11 + [False, False]
    for si, (n, keep) in {9: (1024, 615), 10: (1600, 800)}.items():
        for bi, b in enumerate(out.trace[si]["blocks"]):
            want = keep if 3 <= bi <= 27 else n
            assert (b["sa"], b["ca"], b["ffn"], b["qkv"]) == (want,) * 4, (si, bi, b)
    for si in range(9):
        assert all(b["sa"] == out.trace[si]["tokens"] for b in out.trace[si]["blocks"])
