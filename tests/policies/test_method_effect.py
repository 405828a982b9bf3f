"""No silent no-ops (issue 20 item 5): a method that changed no image says so in its record, once on
the console, and in its table row; the verdict per image comes from the plans (all neutral) or the
pixels (identical to the baseline's)."""
from __future__ import annotations

import json
import math

import pytest

from varbench.engine.backbones.infinity.schedules import scale_schedule
from varbench.engine.effect import IDENTICAL_REASON, image_unchanged, method_effect
from varbench.engine.effect import NEUTRAL_REASON
from varbench.engine.plan import GenerationContext
from varbench.harness.job import run_job
from varbench.harness.schema import check_record
from varbench.policies import build_policy
from varbench.testing.jobs import job_config


def _trace(p, flags, reason=None):
    return {"prompt_index": p, "sample_index": 0, "no_effect_reason": reason,
            "scales": [{"si": i, "plan_neutral": f} for i, f in enumerate(flags)]}


def test_image_verdict_from_plans_or_pixels():
    assert image_unchanged(_trace(0, [True, True])) is True
    assert image_unchanged(_trace(0, [True, False])) is False
    assert image_unchanged(_trace(0, [True, False]), psnr=math.inf) is True      # pixels equal: unchanged
    assert image_unchanged(_trace(0, [True, False]), psnr=41.0) is False
    assert image_unchanged(_trace(0, [None, None])) is None                       # a trace from before the flag
    assert image_unchanged(_trace(0, [None, None]), psnr=math.inf) is True


def test_job_verdict_none_partial_some_and_the_baseline_unmarked():
    r = "fastvar: no schedule width in 32/40/48/64 at h/w 1.25 (1M)"
    neutral = [_trace(p, [True] * 3, r) for p in range(3)]
    assert method_effect(neutral, {}, "fastvar") == {"effect": "none", "effect_reason": r, "unchanged_images": 3}
    mixed = neutral[:1] + [_trace(p, [True, False, True]) for p in (1, 2)]
    assert method_effect(mixed, {}, "nova") == {"effect": "partial", "effect_reason": r, "unchanged_images": 1}
    acted = [_trace(p, [False] * 3) for p in range(3)]
    assert method_effect(acted, {}, "nova")["effect"] == "some"
    # identical pixels count even when a plan was not neutral; their reason says so
    same = method_effect(acted, {(p, 0): math.inf for p in range(3)}, "skipvar")
    assert same == {"effect": "none", "effect_reason": IDENTICAL_REASON, "unchanged_images": 3}
    # one image of unknown verdict: no claim either way
    assert method_effect(acted + [_trace(9, [None] * 3)], {}, "nova")["effect"] is None
    assert method_effect(neutral, {}, "baseline")["effect"] is None            # the reference is never marked


def _ctx(h_div_w, pn, depth):
    s = tuple(scale_schedule(h_div_w, pn))
    return GenerationContext(schedule=s, depth=depth, embed_dim=64, num_heads=2, batch=1, cfg_rows=True,
                             cfg=(3.0,) * len(s), tau=(1.0,) * len(s))


def test_fastvar_says_why_it_did_nothing():
    p = build_policy("fastvar", addressing="width")
    p.reset(_ctx(1.25, "1M", 32))
    assert p.no_effect_reason() == "fastvar: no schedule width in 32/40/48/64 at h/w 1.25 (1M)"
    p.reset(_ctx(1.0, "1M", 32))
    assert p.no_effect_reason() is None                                       # prunes 32²/40², skips 48²/64²
    p = build_policy("fastvar", addressing="width", skip=[])
    p.reset(_ctx(1.0, "1M", 3))                                               # released blocks 3..27 of a 3-block model
    assert "holds none of the model's 3 blocks" in p.no_effect_reason()
    both = build_policy("compose", policies=[{"name": "fastvar", "knobs": {"addressing": "width"}},
                                             {"name": "skip_last", "knobs": {}}])
    both.reset(_ctx(1.25, "1M", 32))
    assert both.no_effect_reason() == "fastvar: no schedule width in 32/40/48/64 at h/w 1.25 (1M)"


def _cfg(tmp_path, *extra):
    return job_config(tmp_path, "evaluator=[fidelity]", "benchmark.limit=2", "runtime.batch_size=2",
                      "runtime.progress=false", "timing=none", *extra)


@pytest.mark.integration
def test_a_no_op_job_is_recorded_said_once_and_marked_in_the_table(tmp_path, capsys):
    from varbench.cli.callbacks import aggregate_experiment

    # the released width rule at h/w 1.25 on the tiny model: no scale has width 32/40/48/64
    args = ("experiment_name=noop", "generation.h_div_w=1.25")
    run_job(_cfg(tmp_path, *args))
    entry = run_job(_cfg(tmp_path, *args, "method=fastvar"))
    out = capsys.readouterr().out
    rec = json.loads((entry / "record.json").read_text())
    assert check_record(rec) == []
    reason = "fastvar: no schedule width in 32/40/48/64 at h/w 1.25 (0.25M)"
    assert (rec["method"]["effect"], rec["method"]["effect_reason"], rec["method"]["unchanged_images"]) == ("none", reason, 2)
    assert out.count("NO EFFECT") == 1 and reason in out
    traces = [json.loads(line) for line in (entry / "traces.jsonl").read_text().splitlines()]
    assert all(sc["plan_neutral"] is True for t in traces for sc in t["scales"])
    # a method that acts: every plan of its late scales is not neutral
    acted = run_job(_cfg(tmp_path, *args, "method=skip_last_2"))
    rec2 = json.loads((acted / "record.json").read_text())
    assert (rec2["method"]["effect"], rec2["method"]["unchanged_images"]) == ("some", 0)
    assert "NO EFFECT" not in capsys.readouterr().out

    [g] = aggregate_experiment(_cfg(tmp_path, *args)).groups
    res = g.folder
    md = (res / "table.md").read_text()
    row = next(line for line in md.splitlines() if line.startswith("| fastvar "))
    assert "(no effect)" in row
    assert not any("(no effect)" in line for line in md.splitlines() if line.startswith(("| baseline ", "| skip_last")))
    assert "(no effect): the method changed no image" in md and reason in md
    pd = pytest.importorskip("pandas")
    csv = pd.read_csv(res / "table.csv").set_index("method")
    assert csv.loc["fastvar", "method_effect"] == "none" and csv.loc["fastvar", "method_effect_reason"] == reason
    assert csv.loc["skip_last", "method_effect"] == "some" and pd.isna(csv.loc["baseline", "method_effect"])
    assert NEUTRAL_REASON == "every plan was neutral"


def test_nova_says_why_its_paper_thresholds_do_nothing_on_the_toy_schedule():
    """The paper-default NOVA never prunes the toy's 9-scale 16x16 schedule; its reason names the knobs."""
    from varbench.engine.plan import GenerationContext
    from varbench.policies import build_policy
    from varbench.toy.load import TOY_SCHEDULE

    ctx = GenerationContext(schedule=tuple(tuple(s) for s in TOY_SCHEDULE), depth=6, embed_dim=64, num_heads=4, batch=1,
                            cfg_rows=True, cfg=(2.0,) * len(TOY_SCHEDULE), tau=(1.0,) * len(TOY_SCHEDULE))
    pol = build_policy("nova")
    pol.reset(ctx)
    assert "no prunable scale" in pol.no_effect_reason() and "min_tokens_to_prune=256" in pol.no_effect_reason()
    small = build_policy("nova", t_min_tokens=16, min_tokens_to_prune=16)
    small.reset(ctx)
    assert small.no_effect_reason() == "nova: no activation scale was detected (no inflection, and t_force not reached)"
