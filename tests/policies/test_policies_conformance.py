"""Conformance over the policy REGISTRY (issue #12 item 18): every registered method must have a
neutral knob setting that reproduces the baseline bit for bit, and an active one that changes
FLOPs or bits (and counts its FLOPs and KV memory), on the tiny runtime. The checks are
`varbench.policies.conformance`'s, the same that `python -m varbench.check_method` runs on a method
from outside the package. Each method declares both beside its knobs, as class attributes
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
from varbench.policies import conformance as C
from varbench.policies.conformance import same_bits


def declared(name: str, what: str):
    """The `what` setting ("NEUTRAL" or "ACTIVE") that registered method `name` declares; fails naming
    the class and the attribute to add when it declares none."""
    try:
        return C.declared(REGISTRY.load(name), what, name)
    except C.MissingSetting as e:
        pytest.fail(str(e))


def gen(rt, policy=None):
    return C.generate(rt, policy)


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


@pytest.mark.parametrize("name", sorted(REGISTRY.packaged()))
def test_neutral_setting_reproduces_the_baseline(tiny_rt, baseline, name):
    check = C.check_neutral(tiny_rt, build_policy(name, **declared(name, "NEUTRAL")), baseline)
    assert check.ok, f"{name}: {check.line()}"   # (FLOPs may differ: toprovar still measures entropy)


@pytest.mark.parametrize("name", sorted(REGISTRY.packaged()))
def test_active_setting_changes_flops_or_bits(tiny_rt, baseline, name):
    active = declared(name, "ACTIVE")
    if active is None:
        pytest.skip(f"{name}: no active setting (the reference)")
    check, out = C.check_active(tiny_rt, build_policy(name, **active), baseline)
    assert check.ok, f"{name}: {check.line()}"
    counted = C.check_counted(out, baseline)
    assert counted.ok, f"{name}: {counted.line()}"


@pytest.mark.integration   # ~2 min on 2 cores: 5 generations per method
@pytest.mark.parametrize("name", sorted(REGISTRY.packaged()))
def test_active_setting_decides_per_image_at_batch_4_as_at_batch_1(tiny_rt, name):
    """Each image of a batch of 4 runs what it runs alone (a method with per-image decisions splits
    the batch; a fixed plan is the same for every image); adaptive shared plans are skipped."""
    active = declared(name, "ACTIVE")
    if active is None:
        pytest.skip(f"{name}: no active setting (the reference)")
    check = C.check_batch(tiny_rt, lambda: build_policy(name, **active))
    if check.ok is None:
        pytest.skip(check.line())
    assert check.ok, f"{name}: {check.line()}"


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
