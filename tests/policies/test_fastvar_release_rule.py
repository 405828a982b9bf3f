"""FastVAR's released scale/block rule, transcribed from csguoh/FastVAR, against the `fastvar` preset
on every aspect-ratio template and resolution preset; the generalised preset; the 8B block range.

The transcription (`released_rule`) simulates the release's scale loop step by step; it shares no
code with varbench/policies/fastvar.py. Sources (csguoh/FastVAR @ 34cdd651, Infinity/infinity/models/):

  infinity.py:585-588      for si, pn in enumerate(scale_schedule):      # pn = (1, h, w)
                               if 48 == pn[2] or 64 == pn[2]: continue     -> skip keyed on the WIDTH
  infinity.py:389-394      add_lvl_embeding: `assert t_mul_h_mul_w + need_to_pad == seq_len`: the
                           input built at the end of the previous *executed* scale must have this
                           scale's h*w tokens (after a mid-schedule `continue` it does not)
  infinity.py:658-665      the next input is resized to scale si+1 after scale si is sampled
  fastvar_basic.py:421     is_later_layer = layer_idx in list(range(3, 28))   -> absolute blocks 3..27
  fastvar_utils.py:41-49   _, original_h, original_w = x_shape
                           if original_w in [32, 40] and is_later_layer:
                               ratio = {32: 0.4, 40: 0.5}[original_w]; r = int(L * ratio); keep L - r
  fastvar_basic.py:416     cached_size = [24, 24]
  fastvar_basic.py:428-441 the three branch outputs are cached where x.shape[1] == 24 * 24 (any block)
  fastvar_utils.py:23-25   unmerge: cache.view(B, 24, 24, -1), area-resized to (h, w): a pruned scale
                           with no cache written yet fails on None (fresh process)
"""
from __future__ import annotations

import pytest

from experiments.flops_table import load_method
from varbench.engine.backbones.infinity.schedules import RESOLUTION_PRESETS, TEMPLATES, scale_schedule
from varbench.engine.plan import GenerationContext
from varbench.policies import build_policy

PRUNE_W = {32: 0.4, 40: 0.5}   # fastvar_utils.py:46
SKIP_W = (48, 64)              # infinity.py:587
CACHE_HW = (24, 24)            # fastvar_basic.py:416
LATER_LAYERS = range(3, 28)    # fastvar_basic.py:421


def released_rule(schedule, depth=32):
    """What csguoh/FastVAR does on `schedule` with a `depth`-block model (first image of a process):
    {"skipped": [...], "pruned": {si: n_keep}, "cache": si or None, "blocks": [...]} or
    {"crash": "assert" | "cache", "at": si}."""
    sched = [(1, h, w) for h, w in schedule]
    blocks = [b for b in range(depth) if b in LATER_LAYERS]
    input_len = 1                      # the SOS token feeds scale 0
    cache = None                       # (scale, tokens) of the last 576-token scale run
    out = {"skipped": [], "pruned": {}, "cache": None, "blocks": blocks}
    for si, pn in enumerate(sched):
        if 48 == pn[2] or 64 == pn[2]:
            out["skipped"].append(si)
            continue
        if pn[1] * pn[2] != input_len:  # add_lvl_embeding's assertion
            return {"crash": "assert", "at": si}
        L = pn[1] * pn[2]
        if pn[2] in [32, 40] and blocks:
            if cache is None:           # unmerge on previous_scale_cache_* = None
                return {"crash": "cache", "at": si}
            out["pruned"][si] = L - int(L * PRUNE_W[pn[2]])
            out["cache"] = cache
        if L == CACHE_HW[0] * CACHE_HW[1]:
            cache = si
        if si != len(sched) - 1:
            input_len = sched[si + 1][1] * sched[si + 1][2]
    return out


def ctx_for(schedule, depth=32, batch=1):
    n = len(schedule)
    return GenerationContext(schedule=tuple(schedule), depth=depth, embed_dim=64, num_heads=2, batch=batch,
                             cfg_rows=True, cfg=(4.0,) * n, tau=(1.0,) * n)


def preset(name):
    pname, _, knobs = load_method(name)
    return build_policy(pname, **knobs)


def what_policy_does(policy, ctx):
    policy.reset(ctx)
    plans = [policy.plan(si) for si in range(len(ctx.schedule))]
    pruned, blocks = {}, set()
    for si, p in enumerate(plans):
        for b, bp in p.blocks.items():
            assert bp.mode == "prune" and bp.fill == "cache" and bp.prune_kv and bp.sublayers == ("sa", "ca", "ffn")
            pruned.setdefault(si, set()).add(bp.n_keep)
            blocks.add(b)
            assert bp.cache_from == policy.cache_scale
    keep_res = [si for si, p in enumerate(plans) if p.keep_residuals]
    return {"skipped": [si for si, p in enumerate(plans) if not p.run],
            "pruned": {si: ks.pop() for si, ks in pruned.items() if len(ks) == 1},
            "cache": keep_res[0] if keep_res else None,
            "blocks": sorted(blocks) if pruned else None,
            "cfg": [p for p in plans if p.cfg is not None or p.tau is not None or p.drop_uncond]}


ALL_SCHEDULES = [(r, pn) for r in TEMPLATES for pn in RESOLUTION_PRESETS]


@pytest.mark.parametrize("ratio,pn", ALL_SCHEDULES, ids=[f"{r}-{pn}" for r, pn in ALL_SCHEDULES])
def test_release_rule_on_every_template(ratio, pn):
    """The `fastvar` preset does exactly what the release does on each of the 15 templates x 4 resolution
    presets, and refuses (naming the aspect ratio and the generalised preset) where the release crashes."""
    sched = scale_schedule(ratio, pn)
    want = released_rule(sched)
    pol = preset("fastvar")
    if "crash" in want:
        with pytest.raises(ValueError, match=rf"h/w {ratio} \({pn}\).*fastvar_generalised") as e:
            pol.reset(ctx_for(sched))
        assert ("infinity.py:393" if want["crash"] == "assert" else "fastvar_utils.py:24") in str(e.value)
        return
    got = what_policy_does(pol, ctx_for(sched))
    assert got["skipped"] == want["skipped"]
    assert got["pruned"] == want["pruned"]
    assert got["cache"] == want["cache"]
    if want["pruned"]:
        assert got["blocks"] == want["blocks"]
    assert got["cfg"] == []
    assert pol.stats()["active"] == bool(want["pruned"] or want["skipped"])


# The '1M' table the method card states (and the claim, corrected: 1.5 also fires, and 0.8,
# 0.571, 3.0, 0.333 are no-ops too).
CARD_1M = {
    1.0: "acts", 1.25: "nothing", 0.8: "nothing", 1.333: "nothing", 0.571: "nothing", 2.0: "nothing",
    0.5: "nothing", 3.0: "nothing", 0.333: "nothing",
    1.5: "crash:cache", 1.75: "crash:cache", 2.5: "crash:cache", 0.4: "crash:cache",
    0.75: "crash:assert", 0.666: "crash:assert",
}


def test_card_table_at_1m():
    assert set(CARD_1M) == set(TEMPLATES)
    for r, kind in CARD_1M.items():
        want = released_rule(scale_schedule(r, "1M"))
        got = (f"crash:{want['crash']}" if "crash" in want
               else "acts" if (want["pruned"] or want["skipped"]) else "nothing")
        assert got == kind, r
    sq = released_rule(scale_schedule(1.0, "1M"))
    assert sq == {"skipped": [11, 12], "pruned": {9: 615, 10: 800}, "cache": 8, "blocks": list(range(3, 28))}
    # where it fires off-square, it fires at other scales than the square recipe (and has no cache)
    assert [si for si, (h, w) in enumerate(scale_schedule(1.75, "1M")) if w in PRUNE_W] == [10, 11]
    assert [si for si, (h, w) in enumerate(scale_schedule(0.4, "1M")) if w in PRUNE_W] == [8]
    assert [si for si, (h, w) in enumerate(scale_schedule(0.75, "1M")) if w in SKIP_W] == [10]


def test_release_block_range_is_absolute():
    """range(3, 28) is absolute: 3..27 on the 8B's 40 blocks too; the depth-fraction extrapolation
    (fastvar_8b_paper) gives 4..34; fastvar_8b_paper_release_blocks restores 3..27."""
    sq = scale_schedule(1.0, "1M")
    assert what_policy_does(preset("fastvar"), ctx_for(sq, depth=40))["blocks"] == list(range(3, 28))
    assert released_rule(sq, depth=40)["blocks"] == list(range(3, 28))
    p8 = what_policy_does(preset("fastvar_8b_paper"), ctx_for(sq, depth=40))
    assert p8["blocks"] == list(range(4, 35)) and p8["skipped"] == [11, 12]
    p8r = what_policy_does(preset("fastvar_8b_paper_release_blocks"), ctx_for(sq, depth=40))
    assert p8r["blocks"] == list(range(3, 28)) and p8r["pruned"] == p8["pruned"] and p8r["skipped"] == p8["skipped"]
    # a model shallower than 4 blocks has no later layer: the release (and the preset) prune nothing
    shallow = what_policy_does(preset("fastvar"), ctx_for(sq, depth=2))
    assert shallow["pruned"] == {} and shallow["skipped"] == [11, 12] and shallow["cache"] is None


def test_generalised_rule_fires_everywhere():
    """fastvar_generalised: the square-1M recipe by position from the end on every template; it equals
    the release only on the square 1M schedule."""
    for r in TEMPLATES:
        sched = scale_schedule(r, "1M")
        L = [h * w for h, w in sched]
        got = what_policy_does(preset("fastvar_generalised"), ctx_for(sched))
        assert got["skipped"] == [11, 12] and got["cache"] == 8 and got["blocks"] == list(range(3, 28))
        assert got["pruned"] == {9: L[9] - int(L[9] * 0.4), 10: L[10] - int(L[10] * 0.5)}
    for r, pn in ALL_SCHEDULES:
        sched = scale_schedule(r, pn)
        want = released_rule(sched)
        got = what_policy_does(preset("fastvar_generalised"), ctx_for(sched))
        same = "crash" not in want and all(got[k] == want[k] for k in ("skipped", "pruned", "cache"))
        assert same == ((r, pn) == (1.0, "1M")), (r, pn)


def test_width_addressing_refuses_index_keys():
    with pytest.raises(ValueError, match="addressing: index"):
        build_policy("fastvar", addressing="width", prune={-4: 0.9, -3: 0.9})


@pytest.mark.runtime
def test_release_rule_on_the_runtime():
    """On the tiny runtime: where the release does nothing the preset reproduces the baseline bit for bit;
    at 512² (square '0.25M') it prunes 32² (scale 9) at 0.4 in blocks 3.. with the 24² cache, as released."""
    import torch

    from varbench.testing.tiny import tiny_runtime

    rt = tiny_runtime(seed=0, depth=6)
    kw = dict(seeds=[0], cfg=3.0, tau=1.0)
    for r, pn in ((2.0, "0.06M"), (1.0, "0.06M")):
        base = rt.generate(["a red circle"], h_div_w=r, pn=pn, **kw)
        out = rt.generate(["a red circle"], h_div_w=r, pn=pn, policy=preset("fastvar"), **kw)
        assert torch.equal(base.images, out.images)
    out = rt.generate(["a red circle"], h_div_w=1.0, pn="0.25M", policy=preset("fastvar"), decode=False, **kw)
    assert [tr["ran"] for tr in out.trace] == [True] * 10
    for si, tr in enumerate(out.trace):
        for bi, b in enumerate(tr["blocks"]):
            want = 1024 - int(1024 * 0.4) if (si == 9 and bi >= 3) else tr["tokens"]
            assert (b["sa"], b["ca"], b["ffn"]) == (want,) * 3, (si, bi)
