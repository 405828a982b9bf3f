"""Conformance over the policy REGISTRY (issue #12 item 18): every registered method must have a
neutral knob setting that reproduces the baseline bit for bit, and an active one that changes
FLOPs or bits, on the tiny runtime. A method added to the registry without entries here fails
`test_every_registered_method_is_covered` with its name.

SkipVAR needs decision-model files: its table entries inject the decision (`decide=`, the
constructor's test hook) so the conformance runs need no files; the shipped toy decision models
(`varbench/toy/weights/skipvar_toy_93`) are loaded and run end to end in a separate test.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import varbench
from varbench.policies import REGISTRY, build_policy

PN = "0.06M"
SMALL = {"t_min_tokens": 16, "min_tokens_to_prune": 16}


def _decide(skip, uncond):
    return lambda X: (np.full(len(X), skip), np.full(len(X), uncond))


NEUTRAL = {
    "baseline": {},
    "fastvar": {"prune": {}, "skip": []},
    "nova": {"r_max": 0.0},
    "toprovar": {"alpha_min": 0.0, "alpha_max": 0.0, "d_min_tokens": 16, "svd_scale": 2},
    "skip_last": {"run_scales": None},
    "skipvar_fixed": {"skip_last": 0, "uncond_from": None},
    "skipvar": {"decide": _decide(0, 0)},
    "compose": {"policies": [{"name": "fastvar", "knobs": {"prune": {}, "skip": []}},
                             {"name": "nova", "knobs": {"r_max": 0.0}}]},
}

#: None = no active setting, with the reason
ACTIVE = {
    "baseline": None,   # the reference itself: it has no knobs
    "fastvar": {},
    "nova": {**SMALL, "t_force": -3},
    "toprovar": {"d_min_tokens": 16, "min_tokens_to_prune": 16, "svd_scale": 2, "layer_mode": "uniform", "tau": 0.0},
    "skip_last": {"run_scales": -2},
    "skipvar_fixed": {"skip_last": 1, "uncond_from": -3},
    "skipvar": {"decide": _decide(1, 0)},
    "compose": {"policies": [{"name": "fastvar"}, {"name": "nova", "knobs": {**SMALL, "t_force": -3}}],
                "conflict": "last", "cache": "first"},
}


def gen(rt, policy=None):
    return rt.generate(["a red circle"], seeds=[0], policy=policy, cfg=3.0, tau=1.0, pn=PN)


@pytest.fixture(scope="module")
def baseline(tiny_rt):
    return gen(tiny_rt)


def test_every_registered_method_is_covered():
    for table, what in ((NEUTRAL, "neutral"), (ACTIVE, "active")):
        missing = sorted(set(REGISTRY) - set(table))
        assert not missing, f"registered method(s) {missing} have no {what} setting in {__file__}"
        stale = sorted(set(table) - set(REGISTRY))
        assert not stale, f"{what} settings for unregistered method(s) {stale}"


def same_bits(a, b) -> bool:
    if len(a.bits) != len(b.bits):
        return False
    for x, y in zip(a.bits, b.bits):
        if (x is None) != (y is None) or (x is not None and not torch.equal(x, y)):
            return False
    return torch.equal(a.summed_codes, b.summed_codes)


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_neutral_setting_reproduces_the_baseline(tiny_rt, baseline, name):
    if name not in NEUTRAL:
        pytest.fail(f"registered method {name!r} has no neutral setting in NEUTRAL")
    out = gen(tiny_rt, build_policy(name, **NEUTRAL[name]))
    assert same_bits(out, baseline), f"{name}'s neutral setting changed the bits"
    assert torch.equal(out.images, baseline.images)   # (FLOPs may differ: toprovar still measures entropy)


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_active_setting_changes_flops_or_bits(tiny_rt, baseline, name):
    if name not in ACTIVE:
        pytest.fail(f"registered method {name!r} has no active setting in ACTIVE")
    if ACTIVE[name] is None:
        pytest.skip(f"{name}: no active setting (the reference)")
    out = gen(tiny_rt, build_policy(name, **ACTIVE[name]))
    assert out.flops["total"] != baseline.flops["total"] or not same_bits(out, baseline), \
        f"{name}'s active setting changed neither FLOPs nor bits"


def test_skipvar_with_the_shipped_toy_decision_models(tiny_rt, baseline):
    """The file-backed path: the toy decision models load and decide on the tiny runtime; the run
    repeats exactly, and equals the baseline exactly when the decision is (skip 0, uncond 0)."""
    folder = Path(varbench.__file__).parent / "toy" / "weights" / "skipvar_toy_93"
    assert folder.is_dir(), folder
    runs = [gen(tiny_rt, build_policy("skipvar", decision_models=str(folder))) for _ in range(2)]
    assert same_bits(runs[0], runs[1])
    st = runs[0].policy_stats
    assert "features" in st and st["per_sample"]
    acted = st["skip"] or st["uncond"]
    assert same_bits(runs[0], baseline) == (not acted)
    if not acted:
        assert torch.equal(runs[0].images, baseline.images)
