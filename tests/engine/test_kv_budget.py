"""The runtime's KV seam (`ScalePlan.kv`, `KVBudget`, `KVCache` capacities and eviction) and ScaleKV's
policy-level rules (strict budget loading, neutral == baseline, capacities, composition)."""
from __future__ import annotations

import json

import pytest
import torch

from varbench.core.errors import ConfigError
from varbench.engine.backbones.infinity.schedules import scale_schedule
from varbench.engine.flops import plan_trace
from varbench.engine.kv_cache import kv_cache_bytes, kv_staging_capacity, KVCache
from varbench.engine.plan import KVBudget, ScalePlan
from varbench.engine.policy import Policy
from varbench.policies import build_policy
from varbench.policies.scalekv import ScaleKV, synthetic_budgets, window_offsets, window_positions

PN = "0.06M"     # 1,2,4,6,8,12,16: 521 positions


def gen(rt, policy=None, seeds=(0,)):
    return rt.generate(["a red circle"] * len(seeds), seeds=list(seeds), policy=policy, cfg=3.0, tau=1.0, pn=PN)


class Scripted(Policy):
    name = "scripted"
    NEUTRAL, ACTIVE = {}, None

    def __init__(self, fn, capacity=None):
        self.fn, self.capacity = fn, capacity

    def plan(self, si):
        return self.fn(si, self.ctx)

    def kv_capacity(self):
        return self.capacity


def same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a.bits, b.bits)) and torch.equal(a.images, b.images)


def test_kvcache_evict_keeps_positions_in_order_and_counts_bytes():
    c = KVCache(2, [6, 10])
    kv = torch.arange(2 * 1 * 2 * 5 * 3, dtype=torch.float32).view(2, 1, 2, 5, 3)
    c.append(0, kv, torch.float32)
    keep = torch.tensor([[[0, 2, 4], [1, 3, 4]]])                 # per head
    c.evict(0, keep)
    assert c.len[0] == 3
    k, v = c.kv[0][0, :, :, :3], c.kv[0][1, :, :, :3]
    assert torch.equal(k[0, 0], kv[0, 0, 0, [0, 2, 4]]) and torch.equal(v[0, 1], kv[1, 0, 1, [1, 3, 4]])
    k2, _ = c.append(0, kv[:, :, :, :3], torch.float32)          # evicted positions are gone: kept + new
    assert k2.shape[2] == 6 and torch.equal(k2[0, 0, 3:], kv[0, 0, 0, :3])
    assert c.nbytes() == {"allocated": 2 * 2 * 6 * 3 * 4, "used": 2 * 2 * 6 * 3 * 4}
    assert kv_cache_bytes([6], 1, 2, 3, 4) == c.nbytes()["allocated"]
    with pytest.raises(ValueError, match="kv_capacity"):
        c.append(0, kv, torch.float32)                            # 6 + 5 > capacity 6


@pytest.mark.runtime
def test_neutral_and_keep_everything_budgets_equal_the_baseline_bit_for_bit(tiny_rt):
    base = gen(tiny_rt)
    assert same(base, gen(tiny_rt, build_policy("scalekv", **ScaleKV.NEUTRAL)))
    # budgets at least the cache length everywhere: the release's `key_len <= max_capacity` keeps all
    full = {f"Scale {n}": {"Block 0": 1, "Block 1": 0, "Block 2": 0, "Block 3": 0, "Max": 600, "Min": 600} for n in range(2, 9)}
    p = build_policy("scalekv", budgets=full, base_capacity=1)
    out = gen(tiny_rt, p)
    assert same(base, out) and p.no_effect_reason().startswith("scalekv: every budget")
    assert all(t["neutral"] for t in out.trace)


def test_an_eviction_changes_the_image_shrinks_the_cache_and_is_for_good(tiny_rt):
    base = gen(tiny_rt)

    def plan(si, ctx):   # after scale 4 (121 positions), block 1 keeps the first 100 positions of each head
        if si == 4:
            return ScalePlan(kv={1: KVBudget(n_keep=100, keep=torch.arange(100).expand(ctx.rows, ctx.num_heads, -1))})
        return ScalePlan()

    out = gen(tiny_rt, Scripted(plan))
    assert not same(base, out)
    kv1 = [t["blocks"][1]["kv"] for t in out.trace]
    assert kv1[4] == 121 and out.trace[4]["blocks"][1]["kv_kept"] == 100 and out.trace[4]["blocks"][1]["kv_evicted"]
    assert kv1[5] == 100 + 144 and kv1[6] == 100 + 144 + 256          # never restored
    assert [t["blocks"][0]["kv"] for t in out.trace] == [t["blocks"][0]["kv"] for t in base.trace]
    assert not out.trace[4]["neutral"] and out.kv_bytes[4]["used"] < base.kv_bytes[4]["used"]
    # the plan-derived trace (CI's FLOPs without a run) agrees
    ctx_plans = [plan(si, type("C", (), {"rows": 2, "num_heads": 2})) for si in range(7)]
    tt = {2: out.trace[0]["text_tokens"], 1: out.trace[0]["text_tokens"] // 2}
    strip = lambda tr: [{k: v for k, v in t.items() if k not in ("ms", "kv_bytes_allocated", "kv_bytes_used", "attn_memory_bytes")} for t in tr]  # noqa: E731
    assert strip(out.trace) == plan_trace(out.schedule, ctx_plans, 4, 1, True, tt)


def test_staged_append_attends_in_the_staging_buffer_and_evicts_into_the_own_one():
    c = KVCache(2, [4, 10], staging=7)
    kv = torch.arange(2 * 1 * 2 * 3 * 3, dtype=torch.float32).view(2, 1, 2, 3, 3)
    k, _ = c.append(0, kv, torch.float32)                          # 3 <= 4: in its own buffer
    assert c.staged is None and k.data_ptr() == c.kv[0].data_ptr()
    k, v = c.append(0, kv + 100, torch.float32)                    # 6 > 4: staged (kept + this scale's)
    assert c.staged == 0 and k.data_ptr() == c.stage.data_ptr() and k.shape[2] == 6
    assert torch.equal(k[0, 0], torch.cat([kv[0, 0, 0], kv[0, 0, 0] + 100])) and torch.equal(v[0, 1, 3:], kv[1, 0, 1] + 100)
    keep = torch.tensor([[[0, 2, 4, 5], [1, 2, 3, 5]]])
    want = c.held(0).gather(3, keep.unsqueeze(0).unsqueeze(-1).expand(2, -1, -1, -1, 3)).clone()
    c.evict(0, keep)
    assert c.staged is None and c.len[0] == 4 and torch.equal(c.kv[0][:, :, :, :4], want)
    c.settle(0, last=False)                                          # evicted: nothing left to settle
    # allocated: both own buffers and the staging buffer (static from the first append on); used: own only
    assert c.nbytes() == {"allocated": kv_cache_bytes([4], 1, 2, 3, 4, staging=7), "used": kv_cache_bytes([4], 1, 2, 3, 4)}
    assert c.staging_nbytes() == (kv_cache_bytes([], 1, 2, 3, 4, staging=7), 0)
    c.append(0, kv, torch.float32)                                   # 7: staged again, no budget
    with pytest.raises(ValueError, match="kv_capacity"):
        c.settle(0, last=False)                                      # before the last scale: a policy bug
    c.settle(0, last=True)                                           # after it: nothing reads it, dropped
    assert c.len[0] == 4 and c.staged is None and torch.equal(c.kv[0][:, :, :, :4], want)
    with pytest.raises(ValueError, match="staging buffer: 7"):
        c.append(0, torch.cat([kv, kv], 3), torch.float32)           # 4 + 6 > 7: more than the staging holds
    with pytest.raises(ValueError, match="kv_capacity"):
        c.evict(1, torch.zeros(1, 2, 11, dtype=torch.long))         # more than block 1 keeps between scales


def test_staging_capacity_bounds_what_a_block_holds_during_a_scale():
    sched = [(1, 1), (2, 2), (4, 4)]                       # 1, 4, 16 -> 1, 5, 21 cumulative
    assert kv_staging_capacity(None, sched) == 0           # the baseline: no staging buffer
    assert kv_staging_capacity([21, 21], sched) == 0       # every block holds the whole schedule
    assert kv_staging_capacity([21, 3], sched) == 3 + 16   # kept 3, plus the last scale's 16
    assert kv_staging_capacity([21, 8], sched) == 21       # never more than the schedule's tokens so far


@pytest.mark.runtime
def test_capacities_are_allocated_and_a_too_small_one_is_named(tiny_rt):
    """Each block's own buffer holds what it keeps between scales, one staging buffer the busiest scale
    of a block: allocated bytes equal the analytic count exactly, and are less than sizing every block
    to its peak (kept + the scale's tokens, the layout without staging)."""
    p = build_policy("scalekv", **ScaleKV.ACTIVE)
    out = gen(tiny_rt, p)
    base = gen(tiny_rt)
    caps = p.kv_capacity()
    staging = kv_staging_capacity(caps, scale_schedule(1.0, PN))
    # ACTIVE keeps 160 (drafter) / 64 (refiners) between scales; the drafter's 160 + the 16x16 scale's 256
    assert caps == [160, 64, 64, 64] and staging == 160 + 256 and p.stats()["staging"] == staging
    assert out.kv_bytes[-1]["allocated"] == kv_cache_bytes(caps, 2, 2, 32, 4, staging)
    assert all(kb["allocated"] == out.kv_bytes[-1]["allocated"] for kb in out.kv_bytes)   # preallocated at scale 0
    peaks = [max(t["blocks"][b]["kv"] for t in out.trace) for b in range(4)]            # positions each attended to
    assert max(peaks) > max(caps) and out.kv_bytes[-1]["allocated"] < kv_cache_bytes(peaks, 2, 2, 32, 4)
    assert out.kv_bytes[-1]["allocated"] < base.kv_bytes[-1]["allocated"] == kv_cache_bytes([521] * 4, 2, 2, 32, 4)
    assert p.stats()["capacity_fraction"] == pytest.approx((sum(caps) + staging) / (4 * 521))
    with pytest.raises(ValueError, match="kv_capacity"):
        gen(tiny_rt, Scripted(lambda si, ctx: ScalePlan(), capacity=[100] * 4))


class PeakSized(ScaleKV):
    """ScaleKV with every block's own buffer sized to its peak (kept + the scale's tokens): no append
    ever stages (the layout before the staging buffer)."""

    def kv_capacity(self):
        held = [0] * self.ctx.depth
        peak = [0] * self.ctx.depth
        for si, (h, w) in enumerate(self.ctx.schedule):
            for b in range(self.ctx.depth):
                held[b] += h * w
                peak[b] = max(peak[b], held[b])
                held[b] = min(held[b], self.keeps.get(si, {}).get(b, held[b]))
        return peak


def test_staging_changes_no_bit(tiny_rt, monkeypatch):
    """Attending and selecting in the staging buffer, then compacting into the own buffer, computes
    what attending and evicting in place does: same bits, same kept positions, same trace."""
    import varbench.engine.backbones.infinity.state as st

    staged = []
    append = st.KVCache.append

    def spy(self, bi, kv, dtype):
        out = append(self, bi, kv, dtype)
        staged.append(self.staged is not None)
        return out

    monkeypatch.setattr(st.KVCache, "append", spy)
    a = gen(tiny_rt, build_policy("scalekv", **ScaleKV.ACTIVE), seeds=(0, 1))
    n_staged = sum(staged)
    staged.clear()
    b = gen(tiny_rt, PeakSized(**ScaleKV.ACTIVE), seeds=(0, 1))
    assert n_staged > 0 and not any(staged)
    assert same(a, b) and [t["blocks"] for t in a.trace] == [t["blocks"] for t in b.trace]
    assert a.kv_bytes[-1]["allocated"] < b.kv_bytes[-1]["allocated"]


def test_window_is_the_grid_of_patch_centres():
    # 20x20, 4x4 grid: patch 5, centres 2, 7, 12, 17 in each direction (scale_kv.py:67-78)
    pos, on_grid = window_positions(20, 20, 16, 921)
    assert on_grid and pos == [r * 20 + c for r in (2, 7, 12, 17) for c in (2, 7, 12, 17)]
    assert window_offsets(20, 20, 16, 921, "cpu").tolist() == pos
    assert window_positions(3, 3, 16, 14) == (list(range(9 - 14, 9)), False)   # too small: the last 14 cached
    assert window_offsets(3, 3, 16, 14, "cpu").tolist() == list(range(-5, 9))


def _budget(**over):
    b = synthetic_budgets([(1, 1), (2, 2), (4, 4), (6, 6), (8, 8), (12, 12), (16, 16)], 4, base_capacity=64)
    b["Scale 6"].update(over)
    return b


@pytest.mark.parametrize("bad,match", [
    ({"Block 1": 2}, "a block is 1"), ({"Max": 1, "Min": 5}, "Max=1 < Min=5"), ({"High": 3}, "High=3 but 1 blocks"),
    ({"Cap": 5}, "unknown key 'Cap'")])
def test_budget_loading_is_strict(bad, match):
    with pytest.raises(ConfigError, match=match):
        ScaleKV(budgets=_budget(**bad), base_capacity=64)


def test_budget_file_errors_name_the_file_and_the_fix(tmp_path, tiny_rt):
    absent = ScaleKV(budget_file=str(tmp_path / "2b_10%_budget.json"))   # validates: the preflight names the file
    with pytest.raises(ConfigError, match="no such file.*SpecuKV"):
        gen(tiny_rt, absent)                                              # ...and the first plan raises
    (tmp_path / "garbled.json").write_text("{not json")
    with pytest.raises(ConfigError, match="garbled.json.*not a JSON"):
        ScaleKV(budget_file=str(tmp_path / "garbled.json"))
    f = tmp_path / "b.json"
    f.write_text(json.dumps(synthetic_budgets([(1, 1), (2, 2), (4, 4), (6, 6), (8, 8), (12, 12), (16, 16)], 6, base_capacity=64)))
    with pytest.raises(ConfigError, match="names 6 blocks but the model has 4"):
        gen(tiny_rt, ScaleKV(budget_file=str(f), base_capacity=64))
    with pytest.raises(ConfigError, match="no \"Scale 6\" entry"):
        gen(tiny_rt, ScaleKV(budgets={}, base_capacity=64))
    with pytest.raises(ConfigError, match="exactly one budget source"):
        ScaleKV()


def test_composes_with_nova_and_fastvar_and_refuses_two_budgets(tiny_rt):
    sk = {"name": "scalekv", "knobs": ScaleKV.ACTIVE}
    nova = {"name": "nova", "knobs": {"t_min_tokens": 16, "min_tokens_to_prune": 16, "t_force": -3}}
    alone = gen(tiny_rt, build_policy("nova", **nova["knobs"]))
    both = gen(tiny_rt, build_policy("compose", policies=[nova, sk]))
    assert both.kv_bytes[-1]["allocated"] < alone.kv_bytes[-1]["allocated"]
    assert any(b.get("kv_evicted") for t in both.trace if t["ran"] for b in t["blocks"])
    fv = gen(tiny_rt, build_policy("compose", policies=[{"name": "fastvar"}, sk]))   # pruned K/V at evicting scales
    assert any(b.get("kv_evicted") for t in fv.trace if t["ran"] for b in t["blocks"])
    with pytest.raises(ConfigError, match="two ScaleKV members"):   # refused at construction (compose.INCOMPATIBLE)
        build_policy("compose", policies=[sk, sk])


def test_graph_key_carries_the_kv_budget(tiny_rt):
    from varbench.engine.graphs import StepGraphs
    from varbench.policies.scalekv import ScaleKVSelector

    g = StepGraphs(tiny_rt)

    class S:
        residuals, rows = {}, 2

        class kv:
            len = [10] * 4

    sel = ScaleKVSelector()
    k1 = g.key(S, 3, ScalePlan(kv={0: KVBudget(8, selector=sel, sel_queries=16)}), 3.0, 1.0, 900, 0.97)
    k2 = g.key(S, 3, ScalePlan(kv={0: KVBudget(9, selector=sel, sel_queries=16)}), 3.0, 1.0, 900, 0.97)
    assert k1 is not None and k1 != k2
    assert g.key(S, 3, ScalePlan(kv={0: KVBudget(8, selector=lambda c: None)}), 3.0, 1.0, 900, 0.97) is None


@pytest.mark.parametrize("method", ["baseline", "scalekv", "nova+scalekv"])
def test_analytic_kv_bytes_equal_the_allocated_bytes(tiny_rt, method):
    """The analytic count (no run) is what the runtime allocates, byte for byte, with and without the
    staging buffer (the baseline has none)."""
    from varbench.engine.kv_cache import analytic_kv_bytes
    from varbench.engine.plan import GenerationContext

    sk = {"name": "scalekv", "knobs": ScaleKV.ACTIVE}
    nova = {"name": "nova", "knobs": {"t_min_tokens": 16, "min_tokens_to_prune": 16, "t_force": -3}}
    make = {"baseline": lambda: None, "scalekv": lambda: build_policy("scalekv", **ScaleKV.ACTIVE),
            "nova+scalekv": lambda: build_policy("compose", policies=[nova, sk])}[method]
    out = gen(tiny_rt, make(), seeds=(0, 1))
    cfg = tiny_rt.cfg
    ctx = GenerationContext(schedule=tuple(out.schedule), depth=cfg.depth, embed_dim=cfg.embed_dim, num_heads=cfg.num_heads,
                            batch=2, cfg_rows=True, cfg=(3.0,) * len(out.schedule), tau=(1.0,) * len(out.schedule))
    assert out.kv_bytes[-1]["allocated"] == analytic_kv_bytes(make(), ctx, itemsize=4)   # the tiny runtime: fp32 K/V
    if method == "baseline":
        assert out.kv_bytes[-1]["allocated"] == kv_cache_bytes([521] * 4, 4, 2, 32, 4)     # no staging buffer
