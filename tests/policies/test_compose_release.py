"""Residual caches are freed as soon as no later plan can read them (issue #12 item 5).

On the tiny runtime ('0.25M': 10 scales; FastVAR caches scale 5, prunes 6 and 7, skips 8 and 9;
NOVA prunes 7 from its previous scale, redirected to FastVAR's cache under cache=first) a spy on
the runtime's scale step records, after every scale, which scales' residuals are alive and which
cached scales the later plans actually read. The alive set must be exactly the scales read later
(before the fix `nova_on_fastvar` kept [5, 6, 7] to the end, FastVAR alone kept [5]), and freeing
must not change a bit of the images (reference: the same run with every release ignored).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
import yaml

from varbench.engine.backbones.infinity.state import GenState
from varbench.policies import build_policy

#: generates with a tiny random runtime (seconds per test): the full run's tier, not plain `pytest`'s
pytestmark = pytest.mark.runtime

PN = "0.25M"
ROOT = Path(__file__).resolve().parents[2]


def nova_on_fastvar(**over):
    knobs = yaml.safe_load((ROOT / "varbench/conf/method/nova_on_fastvar.yaml").read_text())["knobs"]
    return build_policy("compose", **{**knobs, **over})


POLICIES = {
    "nova_on_fastvar": nova_on_fastvar,
    "fastvar": lambda: build_policy("fastvar"),
    "nova_on_fastvar_cache_own": lambda: nova_on_fastvar(cache="own"),
}
#: the exact alive sets the release rule reaches (= the minimum, checked against the reads below)
EXPECTED_ALIVE = {
    "nova_on_fastvar": [[], [], [], [], [], [5], [5], [], [], []],
    "fastvar": [[], [], [], [], [], [5], [5], [], [], []],
}


def run(rt, monkeypatch, policy, release=True, **kw):
    """Generate; return (output, per-scale (plan, alive residual scales after the step))."""
    orig = GenState.step
    log = []

    def step(self, si, plan, *a, **k):
        if not release:
            plan = dataclasses.replace(plan, release_residuals=frozenset())
        out = orig(self, si, plan, *a, **k)
        log.append((plan, sorted(self.residuals)))
        return out

    with monkeypatch.context() as mp:
        mp.setattr(GenState, "step", step)
        kw = {"cfg": 3.0, "pn": PN, **kw}
        out = rt.generate(kw.pop("prompts", ["a red circle"]), kw.pop("seeds", [0]), policy, **kw)
    return out, log


def needed_after(log):
    """Per scale: the kept scales some later plan that runs reads with a cache fill."""
    reads = []
    for plan, _ in log:
        r = set()
        if plan.run:
            for bp in plan.blocks.values():
                if bp.mode == "prune" and bp.fill == "cache":
                    assert bp.cache_from is not None  # the release rule relies on explicit cache scales
                    r.add(bp.cache_from)
        reads.append(r)
    kept = set()
    out = []
    for si, (plan, _) in enumerate(log):
        if plan.run and plan.keep_residuals:
            kept.add(si)
        later = set().union(*reads[si + 1:])
        out.append(sorted(kept & later))
    return out


@pytest.fixture(scope="module")
def square_run(tiny_rt):
    """run(tiny_rt, ..., POLICIES[name](), release) for "a red circle", generated once per (name, release)
    in this module: two tests read the same `nova_on_fastvar` runs. Results are only read."""
    done = {}

    def get(name, release=True):
        if (name, release) not in done:
            with pytest.MonkeyPatch.context() as mp:
                done[name, release] = run(tiny_rt, mp, POLICIES[name](), release=release)
        return done[name, release]
    return get


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_alive_residuals_are_the_minimum_and_images_do_not_change(square_run, name):
    out, log = square_run(name)
    ref, ref_log = square_run(name, release=False)
    alive = [a for _, a in log]
    need = needed_after(log)
    for si, (a, n) in enumerate(zip(alive, need)):
        assert set(n) <= set(a), f"scale {si}: residuals {n} are read later but alive are only {a}"
    if name in EXPECTED_ALIVE:
        assert alive == need == EXPECTED_ALIVE[name]
    # the reference never frees: it holds at least as much, and the images are the same bit for bit
    assert any(set(r) > set(a) for (_, r), a in zip(ref_log, alive))
    assert [p.blocks.keys() for p, _ in log] == [p.blocks.keys() for p, _ in ref_log]
    for a, b in zip(out.bits, ref.bits):
        assert (a is None and b is None) or torch.equal(a, b)
    assert torch.equal(out.summed_codes, ref.summed_codes)
    assert torch.equal(out.images, ref.images)


def test_before_the_fix_nova_on_fastvar_held_three_scales(square_run):
    """The measurement behind item 5: with releases ignored the composed run keeps 5, 6 and 7
    (NOVA's own caches are never read under cache=first); with them at most one scale is alive."""
    _, ref_log = square_run("nova_on_fastvar", release=False)
    _, log = square_run("nova_on_fastvar")
    assert ref_log[-1][1] == [5, 6, 7]
    assert max(len(a) for _, a in log) == 1 and log[-1][1] == []


def test_batch2_nonsquare_still_frees_and_matches(tiny_rt, monkeypatch):
    kw = dict(prompts=["a cat", "two dogs"], seeds=[1, 2], h_div_w=0.5)
    out, log = run(tiny_rt, monkeypatch, nova_on_fastvar(), **kw)
    ref, _ = run(tiny_rt, monkeypatch, nova_on_fastvar(), release=False, **kw)
    assert [a for _, a in log] == needed_after(log)
    assert torch.equal(out.images, ref.images)
