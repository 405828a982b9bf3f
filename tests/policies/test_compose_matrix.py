"""The composition matrix (issue 24): its presets, its refusals, SkipVAR + ScaleKV, the experiment's jobs.

The toy compositions repeat their standalone presets' knobs (a compose member is {name, knobs}, not
a preset name): the tests hold them equal, so editing `scalekv_toy` without its compositions fails
here. SkipVAR + ScaleKV is run on the tiny runtime to show the budget still applies where SkipVAR
drops the unconditional rows and skips a scale.
"""
from __future__ import annotations

import dataclasses

import pytest

from varbench.core.errors import ConfigError
from varbench.policies import REGISTRY, build_policy
from varbench.policies.scalekv import ScaleKV

PN = "0.06M"   # the tiny runtime's 7 scales: 1, 2, 4, 6, 8, 12, 16 (521 positions)


def plain(knobs):
    """A knob dataclass as comparable data (YAML lists and the defaults' tuples alike)."""
    def norm(v):
        if isinstance(v, (list, tuple)):
            return [norm(x) for x in v]
        if isinstance(v, dict):
            return {k: norm(x) for k, x in v.items()}
        return v
    return norm(dataclasses.asdict(knobs))


def preset(name):
    """(policy, label, knobs) of a preset; ``name@model``: on that model (its per-model block merged)."""
    from experiments.flops_table import load_method

    name, _, model = name.partition("@")
    return load_method(name, model or None)


@pytest.mark.parametrize("composed, members", [
    ("fastvar_scalekv_toy", ["fastvar_generalised", "scalekv_toy"]),
    ("nova_scalekv_toy", ["nova_toy", "scalekv_toy"]),
    ("skipvar_scalekv_toy", ["skipvar_toy", "scalekv_toy"]),
    ("fastvar_scalekv_8b", ["fastvar_generalised", "scalekv_8b"]),   # {} = the constructor defaults = generalised
    ("fastvar_scalekv", ["fastvar_generalised", "scalekv"]),
    ("nova_scalekv_8b", ["nova", "scalekv_8b"]),
    ("skipvar_scalekv_8b", ["skipvar", "scalekv_8b"]),
    ("skipvar_scalekv", ["skipvar", "scalekv"]),
    ("nova_on_fastvar@toy", ["fastvar_generalised", "nova_toy"]),   # its per-model toy block
    ("sparvar_scalekv@toy", ["sparvar@toy", "scalekv_toy"]),         # the refused cell repeats both toy blocks
    ("sparvar_scalekv", ["sparvar", "scalekv"]),
    ("sparsevar_scalekv@toy", ["sparsevar@toy", "scalekv_toy"]),
    ("sparsevar_scalekv@infinity_2b", ["sparsevar@infinity_2b", "scalekv"]),
    ("sparsevar_scalekv@infinity_8b", ["sparsevar@infinity_8b", "scalekv_8b"]),
])
def test_a_composition_runs_its_members_presets(composed, members):
    name, _, knobs = preset(composed)
    assert name == "compose"
    got = [(m["name"], m.get("knobs") or {}) for m in knobs["policies"]]
    want = []
    for m in members:
        n, _, k = preset(m)
        want.append((n, k))
    # each member's knobs, defaults filled in, equal its standalone preset's (the knob dataclasses)
    for (gn, gk), (wn, wk) in zip(got, want):
        assert gn == wn
        if gn in ("fastvar", "nova"):   # knobs left None resolve in the constructor: compare the built policies
            assert build_policy(gn, **gk).describe() == build_policy(wn, **wk).describe(), composed
        else:                           # ScaleKV's budget file and SkipVAR's models are downloads: the knobs
            knobs_of = REGISTRY.load(gn).Knobs
            assert plain(knobs_of(**gk)) == plain(knobs_of(**wk)), f"{composed}: member {gn} differs from its preset"


def test_two_memory_methods_are_refused_at_construction_with_the_reason():
    sk = {"name": "scalekv", "knobs": ScaleKV.ACTIVE}
    with pytest.raises(ConfigError, match="two ScaleKV members.*One memory method per composition"):
        build_policy("compose", policies=[sk, {"name": "fastvar"}, sk])
    # the pre-existing refusals are ConfigErrors too (a sweep lists them without a traceback)
    with pytest.raises(ConfigError, match="refused"):
        build_policy("compose", policies=[{"name": "nova"}, {"name": "toprovar"}])


@pytest.mark.runtime
def test_skipvar_and_scalekv_combine_the_budget_applies_to_the_cond_rows(tiny_rt):
    """SkipVAR's two actions at once (fixed, on the tiny runtime): the last scale skipped, the
    unconditional rows dropped from scale 4 on. ScaleKV.ACTIVE evicts at scales 4 and 5 (and would at
    6, which never runs). The evicting blocks keep exactly their budget on the rows still in use, and
    the cache allocated is what the analytic count says for ScaleKV alone (skipping and dropping rows
    never shrink preallocated buffers)."""
    from varbench.engine.kv_cache import analytic_kv_bytes
    from varbench.engine.plan import GenerationContext

    sk = {"name": "scalekv", "knobs": ScaleKV.ACTIVE}
    sv = {"name": "skipvar_fixed", "knobs": {"skip_last": 1, "uncond_from": -3}}
    both = build_policy("compose", policies=[sv, sk])
    out = tiny_rt.generate(["a red circle", "a blue square"], seeds=[0, 1], policy=both, cfg=3.0, tau=1.0, pn=PN)
    alone = build_policy("scalekv", **ScaleKV.ACTIVE)
    cfg = tiny_rt.cfg
    ctx = GenerationContext(schedule=tuple(out.schedule), depth=cfg.depth, embed_dim=cfg.embed_dim, num_heads=cfg.num_heads,
                            batch=2, cfg_rows=True, cfg=(3.0,) * len(out.schedule), tau=(1.0,) * len(out.schedule))
    alone.reset(ctx)
    assert [t["ran"] for t in out.trace] == [True] * 6 + [False]
    assert [t["rows"] for t in out.trace if t["ran"]] == [4, 4, 4, 4, 2, 2]       # cond-only from scale 4
    for si in (4, 5):
        for b, n_keep in alone.keeps[si].items():
            blk = out.trace[si]["blocks"][b]
            assert blk["kv_evicted"] and blk["kv_kept"] == n_keep, (si, b)
    assert out.kv_bytes[-1]["allocated"] == analytic_kv_bytes(build_policy("scalekv", **ScaleKV.ACTIVE), ctx, itemsize=4)


def _methods(model):
    from varbench.cli.sweep_plan import plan_command

    plan = plan_command(["+experiment=compose_matrix", f"model={model}"])
    return plan, [next(o.split("=", 1)[1] for o in j.overrides if o.startswith("method=")) for j in plan.jobs]


@pytest.mark.parametrize("model, methods", [
    ("toy", ["baseline", "scalekv_toy", "fastvar_generalised", "fastvar_scalekv_toy", "nova_toy", "nova_scalekv_toy",
             "skipvar_toy", "skipvar_scalekv_toy", "sparvar", "sparvar_scalekv", "sparsevar", "sparsevar_scalekv"]),
    ("infinity_2b", ["baseline", "scalekv", "fastvar", "fastvar_scalekv", "nova", "nova_scalekv", "skipvar",
                     "skipvar_scalekv", "sparvar", "sparvar_scalekv", "sparsevar", "sparsevar_scalekv"]),
    ("infinity_8b", ["baseline", "scalekv_8b", "fastvar", "fastvar_scalekv_8b", "nova", "nova_scalekv_8b", "skipvar",
                     "skipvar_scalekv_8b", "sparvar", "sparvar_scalekv", "sparsevar", "sparsevar_scalekv"]),
])
def test_the_experiment_runs_the_models_matrix_on_one_prompt_set_and_seed(model, methods):
    plan, got = _methods(model)
    assert plan.multirun and got == methods
    cfgs = [j.cfg for j in plan.jobs]
    assert {c.model.name for c in cfgs} == {model.replace("infinity_", "infinity-").replace("-", "_")} or \
        len({c.model.name for c in cfgs}) == 1
    assert len({str(c.benchmark) for c in cfgs}) == 1 and len({c.generation.seed for c in cfgs}) == 1
    assert {c.experiment_name for c in cfgs} == {"compose_matrix"}
    # every cell but the baseline and the compute-only ones carries a KV budget (ScaleKV alone or composed)
    memory = [m for m, c in zip(got, cfgs) if c.method.name == "scalekv"
              or any(p["name"] == "scalekv" for p in (c.method.get("knobs") or {}).get("policies", []))]
    assert memory == [m for m in methods if "scalekv" in m]
