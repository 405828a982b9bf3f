"""Conformance over the policy REGISTRY (issue #12 item 18): every registered method must have a
neutral knob setting that reproduces the baseline bit for bit, and an active one that changes
FLOPs or bits, on the tiny runtime. Each method declares both beside its knobs, as class attributes
of its policy (`NEUTRAL`, `ACTIVE`; `varbench/engine/policy.py`); this test finds them through the
registry, so a method added to the registry without them fails here with its name and what to add.

SkipVAR needs decision-model files: its settings inject the decision (`decide=`, the constructor's
test hook) so the conformance runs need no files; the shipped toy decision models
(`varbench/toy/weights/skipvar_toy_93`) are loaded and run end to end in a separate test.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import varbench
from varbench.policies import REGISTRY, build_policy

PN = "0.06M"
_MISSING = object()

#: what each attribute means, for the message that asks a method to declare it
_HOW = {
    "NEUTRAL": "NEUTRAL = {knob: value, ...} (constructor knobs under which its plans change nothing)",
    "ACTIVE": ("ACTIVE = {knob: value, ...} (constructor knobs under which it changes FLOPs or bits on the tiny "
               "runtime at pn '0.06M'), or ACTIVE = None if it has none (the baseline)"),
}


def declared(name: str, what: str):
    """The `what` setting ("NEUTRAL" or "ACTIVE") that registered method `name` declares; fails naming
    the class and the attribute to add when it declares none."""
    cls = REGISTRY.load(name)
    value = getattr(cls, what, _MISSING)
    if value is _MISSING:
        pytest.fail(f"registered method {name!r} ({cls.__module__}.{cls.__qualname__}) declares no {what.lower()} "
                    f"setting: add the class attribute {_HOW[what]} beside its Knobs")
    return value


def gen(rt, policy=None):
    return rt.generate(["a red circle"], seeds=[0], policy=policy, cfg=3.0, tau=1.0, pn=PN)


@pytest.fixture(scope="module")
def baseline(tiny_baseline):
    """gen(tiny_rt) with no policy: the session's shared baseline (tests/conftest.py, the same settings)."""
    return tiny_baseline


@pytest.mark.parametrize("name", sorted(REGISTRY.packaged()))
def test_every_registered_method_declares_its_settings(name):
    assert isinstance(declared(name, "NEUTRAL"), dict), f"{name}.NEUTRAL must be a dict of knobs"
    active = declared(name, "ACTIVE")
    assert active is None or isinstance(active, dict), f"{name}.ACTIVE must be a dict of knobs or None"


def test_a_method_without_settings_is_named():
    """A new method that declares nothing fails with its class and the attribute to add."""
    from varbench.engine.plan import ScalePlan
    from varbench.engine.policy import Policy

    class Bare(Policy):
        name = "bare"

        def plan(self, si):
            return ScalePlan()

    REGISTRY.register("bare", Bare)
    try:
        with pytest.raises(pytest.fail.Exception, match=r"'bare' .*Bare\) declares no neutral setting: add the class "
                                                        r"attribute NEUTRAL = \{knob: value"):
            declared("bare", "NEUTRAL")
    finally:
        del REGISTRY["bare"]


def same_bits(a, b) -> bool:
    if len(a.bits) != len(b.bits):
        return False
    for x, y in zip(a.bits, b.bits):
        if (x is None) != (y is None) or (x is not None and not torch.equal(x, y)):
            return False
    return torch.equal(a.summed_codes, b.summed_codes)


@pytest.mark.parametrize("name", sorted(REGISTRY.packaged()))
def test_neutral_setting_reproduces_the_baseline(tiny_rt, baseline, name):
    out = gen(tiny_rt, build_policy(name, **declared(name, "NEUTRAL")))
    assert same_bits(out, baseline), f"{name}'s neutral setting changed the bits"
    assert torch.equal(out.images, baseline.images)   # (FLOPs may differ: toprovar still measures entropy)


@pytest.mark.parametrize("name", sorted(REGISTRY.packaged()))
def test_active_setting_changes_flops_or_bits(tiny_rt, baseline, name):
    active = declared(name, "ACTIVE")
    if active is None:
        pytest.skip(f"{name}: no active setting (the reference)")
    out = gen(tiny_rt, build_policy(name, **active))
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
