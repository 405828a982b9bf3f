"""The timed pass's paired protocol (issue #14 item 1): interleaving order, per-repeat ratios, the
order-statistic interval of their median and the reliability verdict.

Most tests drive :func:`varbench.harness.timing.timed_pass` with a deterministic fake machine: each call's
``timings_ms`` is ``work x speed(call number)``, so drift, a cost of running second, or load
changes are exact functions of the call order and nothing depends on the wall clock. A method
doing the baseline's work then gives ratios whose side of 1 is fixed by the order alone, so the
asserts hold on any machine and can fail only if the protocol (order, pairing, ratio direction,
interval) is wrong. One test uses the real clock with ``time.sleep`` (see its docstring).
"""
from __future__ import annotations

import math
from collections import Counter
import random
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

from varbench.harness import timing as T
from varbench.harness.timing import judge, median_ci, protocol_kwargs, timed_pass

CPU = torch.device("cpu")
CONF = Path(__file__).resolve().parents[2] / "varbench" / "conf" / "timing"


class FakeMachine:
    """Generations whose duration is ``work * speed(call index)``; ``second_penalty`` slows a call
    that directly follows another one of the same pair (cache eviction, clocks: a run-second cost)."""

    def __init__(self, speed=lambda i: 1.0, second_penalty: float = 0.0):
        self.speed, self.second_penalty = speed, second_penalty
        self.calls: list[str] = []

    def generator(self, name: str, work_ms):
        """``work_ms``: a number, or a list of per-prompt works (an adaptive method: prompt ``k``'s work)."""
        def generate(bs: int, k: int = 0):
            i = len(self.calls)
            second = i % 2 == 1                # calls come in pairs (warm-up included)
            self.calls.append(name)
            self.prompts.append(k)
            work = work_ms[k] if isinstance(work_ms, (list, tuple)) else work_ms
            ms = work * bs * self.speed(i) * (1.0 + (self.second_penalty if second else 0.0))
            return SimpleNamespace(timings_ms={"text": 0.1 * ms, "ar": ms, "decode": 0.2 * ms, "per_scale": [ms]})
        return generate

    @property
    def prompts(self) -> list[int]:
        return self.__dict__.setdefault("_prompts", [])


def _paired(machine: FakeMachine, method_ms: float, ref_ms: float, repeats: int = 9, warmup: int = 0, **kw) -> dict:
    out = timed_pass(machine.generator("A", method_ms), [1], warmup, repeats, CPU,
                     reference=machine.generator("B", ref_ms), **kw)
    return out["1"]["paired"]


def _contains(p: dict, x: float, key: str = "ar") -> bool:
    return p[f"{key}_ci_low"] <= x <= p[f"{key}_ci_high"]


# -- the interleaving -------------------------------------------------------------------------
def test_abba_order_alternates_who_runs_first():
    m = FakeMachine()
    _paired(m, 10.0, 10.0, repeats=4, warmup=1)
    assert m.calls == ["A", "B", "A", "B", "B", "A", "A", "B", "B", "A"]   # warm-up A B, then AB BA AB BA
    m = FakeMachine()
    _paired(m, 10.0, 10.0, repeats=3, order="ab")
    assert m.calls == ["A", "B"] * 3


def test_unknown_order_is_refused():
    with pytest.raises(ValueError, match="order must be one of"):
        timed_pass(lambda bs: None, [1], 0, 1, CPU, order="ba")


# -- equal work is 1.00x within the interval, double work is not --------------------------------
DRIFT = 0.01        # the machine slows by 1% per call: 18% over a 9-repeat pass, far beyond real noise


@pytest.mark.parametrize("scenario", ["linear drift", "run-second penalty", "both"])
def test_equal_work_comes_out_at_one_within_its_interval(scenario):
    """Same work as the baseline: under ABBA every source of bias here hits method and baseline
    alike over two consecutive pairs, so the ratios straddle 1 (5 on one side, 4 on the other) and
    the interval contains 1.00; the always-method-first order puts every ratio on one side."""
    speed = (lambda i: 1.0 + DRIFT * i) if scenario != "run-second penalty" else (lambda i: 1.0)
    penalty = 0.05 if scenario != "linear drift" else 0.0
    p = _paired(FakeMachine(speed, penalty), 50.0, 50.0)
    assert _contains(p, 1.0) and _contains(p, 1.0, "e2e")
    assert abs(p["ar_speedup"] - 1.0) <= (1 + DRIFT) * (1 + penalty) - 1 + 1e-9   # the median: one pair's ratio
    assert sum(r > 1 for r in p["ar_ratios"]) in (4, 5)
    biased = _paired(FakeMachine(speed, penalty), 50.0, 50.0, order="ab")
    assert not _contains(biased, 1.0)          # the old order reads a speed-up into identical work


def test_twice_the_work_gives_an_interval_excluding_one():
    p = _paired(FakeMachine(lambda i: 1.0 + DRIFT * i, 0.05), 100.0, 50.0)    # method: 2x the baseline's work
    assert p["ar_ci_high"] < 1.0 and _contains(p, 0.5)
    p = _paired(FakeMachine(lambda i: 1.0 + DRIFT * i, 0.05), 25.0, 50.0)     # half the work: 2x faster
    assert p["ar_ci_low"] > 1.0 and _contains(p, 2.0)


def test_ratios_are_per_repeat_reference_over_method():
    speeds = [1.0, 1.0, 3.0, 3.0, 1.0, 1.0]      # a load burst during the second pair only
    p = _paired(FakeMachine(lambda i: speeds[i]), 20.0, 40.0, repeats=3)
    assert p["ar_ratios"] == pytest.approx([2.0, 2.0, 2.0])   # the burst hits both sides of its pair
    assert p["reference_repeats_ms"]["ar"] == [pytest.approx([40.0, 120.0, 40.0])]   # one prompt: one list
    assert p["n_repeats"] == 3 and p["order"] == "abba"


@pytest.mark.parametrize("method_ms,ref_ms,level", [(20.0, 20.0, 0.999), (40.0, 20.0, 0.95)])
def test_real_clock_sleep(method_ms, ref_ms, level):
    """The real clock, with ``time.sleep`` as the work: a sleep's length is set by the timer, not by
    CPU load (a loaded machine adds wake-up delays of a few ms, on both sides alike), and method and
    baseline alternate, so their per-pair ratios are exchangeable (equal work) or sit near 0.5
    (double work). Equal work at ``ci_level=0.999`` with 15 repeats: the interval is the 2nd..14th
    ratio and misses 1.00 with probability < 0.1% by construction unless the protocol is wrong.
    Double work at 95% (4th..12th ratio): 4 of 15 baseline sleeps would have to overrun by 20 ms."""
    def sleeper(ms):
        def generate(bs):
            t = time.perf_counter()
            time.sleep(ms / 1e3)
            dt = (time.perf_counter() - t) * 1e3
            return SimpleNamespace(timings_ms={"text": 0.0, "ar": dt, "decode": 0.0, "per_scale": [dt]})
        return generate

    p = timed_pass(sleeper(method_ms), [1], 1, 15, CPU, reference=sleeper(ref_ms), ci_level=level)["1"]["paired"]
    assert p["ci_level"] >= level
    if method_ms == ref_ms:
        assert _contains(p, 1.0), p["ar_ratios"]
    else:
        assert p["ar_ci_high"] < 1.0, p["ar_ratios"]


# -- the interval -----------------------------------------------------------------------------
def _coverage(n: int, k: int) -> float:
    return 1.0 - 2.0 * sum(math.comb(n, i) for i in range(k)) / 2 ** n


@pytest.mark.parametrize("n", range(1, 31))
def test_median_ci_is_the_tightest_order_statistic_interval_with_the_coverage(n):
    xs = list(range(n, 0, -1))                 # unsorted on purpose: the order statistics are 1..n
    lo, hi, level = median_ci(xs, 0.95)
    k = int(lo)                                 # x_(k) == k here
    assert hi == n + 1 - k and level == pytest.approx(_coverage(n, k))
    if n >= 6:
        assert level >= 0.95
        assert k + 1 > (n + 1) // 2 or _coverage(n, k + 1) < 0.95   # one step tighter would miss 95%
    else:
        assert (lo, hi) == (1, n) and level < 0.95   # too few repeats: [min, max] at what it has


def test_median_ci_empirical_coverage():
    """Seeded (so deterministic) draws from a skewed distribution: the 9-repeat interval covers the
    true median about as often as the binomial says (96.1%); 4000 draws put 3 sigma at 0.9%."""
    rng = random.Random(0)
    true_median = math.log(2)                  # Exponential(1)
    hits = sum(lo <= true_median <= hi for lo, hi, _ in
               (median_ci([rng.expovariate(1.0) for _ in range(9)]) for _ in range(4000)))
    assert abs(hits / 4000 - _coverage(9, 2)) < 0.01


def test_median_ci_rejects_a_bad_level_and_handles_empty():
    with pytest.raises(ValueError, match="level"):
        median_ci([1.0], 1.0)
    assert median_ci([], 0.95) == (None, None, 0.0)


# -- the verdict ------------------------------------------------------------------------------
def _block(**kw):
    base = {"n_repeats": 9, "ar_speedup": 1.5, "ar_ci_low": 1.45, "ar_ci_high": 1.55, "ci_level": 0.96,
            "reference_spread": 0.03, "loadavg": {"before": 1.0, "after": 1.2}}
    return {**base, **kw}


def test_a_tight_interval_on_a_quiet_machine_is_reliable():
    assert judge(_block()) == (True, [])


@pytest.mark.parametrize("change,reason", [
    ({"ar_ci_low": 1.0, "ar_ci_high": 2.0}, "interval width 66.7%"),
    ({"reference_spread": 0.5}, "baseline repeat times spread 50.0%"),
    ({"loadavg": {"before": 0.5, "after": 2.5}}, "load average moved 0.50 -> 2.50"),
    ({"n_repeats": 3, "ci_level": 0.75}, "3 repeats give at most 75% coverage"),
])
def test_unreliable_cells_say_why(change, reason):
    ok, reasons = judge(_block(**change))
    assert not ok and any(reason in r for r in reasons), reasons


def test_thresholds_trade_sensitivity():
    wide = _block(ar_ci_low=1.3, ar_ci_high=1.7)          # 27% of the median
    assert not judge(wide)[0] and judge(wide, max_ci_rel_width=0.3)[0]


def test_timed_pass_flags_a_pass_whose_baseline_speed_moved():
    speeds = [1.0] * 8 + [2.0] * 10                   # the machine halves its speed mid-pass
    p = _paired(FakeMachine(lambda i: speeds[i]), 30.0, 60.0)
    assert _contains(p, 2.0)                           # the pairs still agree on the ratio
    assert not p["reliable"] and any("spread" in r for r in p["unreliable_reasons"])
    assert p["thresholds"]["max_reference_spread"] == T.DEFAULTS["max_reference_spread"]


# -- the knobs --------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["default.yaml", "quick.yaml"])
def test_config_knobs_match_the_defaults_and_reach_the_protocol(name):
    cfg = yaml.safe_load((CONF / name).read_text())
    assert protocol_kwargs(cfg) == T.DEFAULTS
    # every method is timed on several prompts, so every interval is the bootstrap at the nominal
    # level (a one-prompt order-statistic interval would need >= 6 repeats for 95%)
    assert cfg["prompts"] >= cfg["prompts_static"] >= 2
    assert protocol_kwargs({})["order"] == "abba"
    none = yaml.safe_load((CONF / "none.yaml").read_text())
    assert set(none) == set(cfg)                      # every knob documented in every timing preset


# -- several prompts (issue #20 item 3) ---------------------------------------------------------
def _multi(machine: FakeMachine, method_ms, ref_ms, n_prompts: int, repeats: int = 3, **kw) -> dict:
    return timed_pass(machine.generator("A", method_ms), [1], kw.pop("warmup", 0), repeats, CPU,
                      reference=machine.generator("B", ref_ms), n_prompts=n_prompts, **kw)["1"]


def test_each_pair_runs_one_prompt_and_abba_continues_across_prompts():
    m = FakeMachine()
    _multi(m, 10.0, 10.0, n_prompts=3, repeats=3, warmup=1, warmup_per_prompt=1)
    # warm-up on prompt 0; prompts 1 and 2 each get one untimed pair first; ABBA over the 9 timed pairs
    assert m.calls == ["A", "B"] + ["A", "B", "B", "A", "A", "B"] + ["A", "B"] + ["B", "A", "A", "B", "B", "A"] \
        + ["A", "B"] + ["A", "B", "B", "A", "A", "B"]
    assert m.prompts == [0] * 8 + [1] * 8 + [2] * 8   # prompt-major; method and baseline on the same prompt


def test_the_speedup_is_the_ratio_of_summed_prompt_times():
    """An adaptive method: 2x faster on one prompt, no faster on three. The benchmark's time ratio
    is (4 x 100) / (50 + 3 x 100) = 1.143, not the median per-prompt ratio (1.0) nor their mean (1.25)."""
    work = [50.0, 100.0, 100.0, 100.0]
    b = _multi(FakeMachine(), work, 100.0, n_prompts=4)
    p = b["paired"]
    assert p["ar_speedup"] == pytest.approx(400.0 / 350.0)
    assert p["per_prompt_ar_speedup"] == pytest.approx([2.0, 1.0, 1.0, 1.0])
    assert p["ci_kind"] == T.CI_BOOTSTRAP and p["n_prompts"] == 4 and p["n_repeats"] == 12
    assert p["ar_ci_low"] == pytest.approx(1.0) and p["ar_ci_high"] <= 2.0 and _contains(p, p["ar_speedup"])
    assert b["per_prompt"]["ar_ms"] == pytest.approx(work)      # each prompt's own latency
    assert b["ar_ms"]["median"] == pytest.approx(100.0) and b["ar_ms"]["p10"] == pytest.approx(65.0)


@pytest.mark.parametrize("scenario", ["linear drift", "run-second penalty"])
def test_equal_work_over_prompts_is_one_within_the_bootstrap_interval(scenario):
    speed = (lambda i: 1.0 + DRIFT * i) if scenario == "linear drift" else (lambda i: 1.0)
    penalty = 0.05 if scenario != "linear drift" else 0.0
    work = [30.0, 60.0, 45.0, 80.0, 50.0, 70.0]        # prompts differ; method and baseline do the same work
    p = _multi(FakeMachine(speed, penalty), work, work, n_prompts=6, repeats=2)["paired"]
    assert _contains(p, 1.0) and _contains(p, 1.0, "e2e")
    assert abs(p["ar_speedup"] - 1.0) < 0.03
    biased = _multi(FakeMachine(speed, penalty), work, work, n_prompts=6, repeats=2, order="ab")["paired"]
    assert not _contains(biased, 1.0)                   # the old order still reads a speed-up into equal work


def test_prompt_dependent_baseline_work_is_not_machine_drift():
    """The baseline's time differs by prompt (text length): that is no reason to distrust the pass;
    a machine whose speed jumps between repeats (every third pair 60% slower: a load burst) is."""
    steady = _multi(FakeMachine(), [20.0, 40.0, 30.0, 60.0], [40.0, 80.0, 60.0, 120.0], n_prompts=4)["paired"]
    assert steady["reference_spread"] == pytest.approx(0.0) and steady["reliable"], steady["unreliable_reasons"]
    moved = _multi(FakeMachine(lambda i: 1.6 if (i // 2) % 3 == 0 else 1.0), [20.0, 40.0, 30.0, 60.0], [40.0, 80.0, 60.0, 120.0], n_prompts=4)["paired"]
    assert moved["ar_speedup"] == pytest.approx(2.0, rel=0.05)   # the pairs still agree on the ratio
    assert not moved["reliable"] and any("spread" in r for r in moved["unreliable_reasons"])


def test_one_prompt_keeps_the_order_statistic_protocol_and_callers_without_a_prompt_argument():
    calls = []

    def gen(bs):                                        # a one-prompt caller's generate takes bs only
        calls.append(bs)
        return SimpleNamespace(timings_ms={"text": 0.0, "ar": 10.0, "decode": 0.0, "per_scale": [10.0]})

    p = timed_pass(gen, [1], 0, 7, CPU, reference=gen)["1"]["paired"]
    assert p["ci_kind"] == T.CI_ORDER_STATISTIC and p["n_prompts"] == 1 and len(calls) == 14
    ok, reasons = judge({**p, "ci_kind": T.CI_BOOTSTRAP, "ci_level": 0.0})
    assert ok, reasons                                  # the coverage check is the order statistic's only


def test_bootstrap_interval_is_seeded_and_covers_a_known_ratio():
    """Prompts drawn (seeded) from a population whose ratio of totals is known: the 95% percentile
    bootstrap over 16 prompts covers it in about 95% of samples (percentile intervals under-cover a
    little at n = 16; 400 samples put 3 sigma at 3%)."""
    assert T.bootstrap_ratio_ci([2, 4, 6], [1, 2, 3]) == (pytest.approx(2.0), pytest.approx(2.0))
    assert T.bootstrap_ratio_ci([1.0], [1.0]) == (None, None)
    a = T.bootstrap_ratio_ci([3.1, 1.4, 4.15, 1.59, 5.26], [2.0, 2.7, 1.8, 2.8, 1.8], seed=7)
    assert a == T.bootstrap_ratio_ci([3.1, 1.4, 4.15, 1.59, 5.26], [2.0, 2.7, 1.8, 2.8, 1.8], seed=7)
    assert a != T.bootstrap_ratio_ci([3.1, 1.4, 4.15, 1.59, 5.26], [2.0, 2.7, 1.8, 2.8, 1.8], seed=8)
    rng = random.Random(0)
    # method ms ~ U(20, 100) (adaptive work), baseline ms = 100: population ratio E[100] / E[m] = 100 / 60
    truth, hits = 100.0 / 60.0, 0
    for s in range(400):
        m = [rng.uniform(20.0, 100.0) for _ in range(16)]
        lo, hi = T.bootstrap_ratio_ci([100.0] * 16, m, 0.95, 1000, seed=s)
        hits += lo <= truth <= hi
    assert 0.89 <= hits / 400 <= 0.99, hits
    with pytest.raises(ValueError, match="denominators"):
        T.bootstrap_ratio_ci([1, 2], [1])


def test_rederive_reproduces_the_pass_and_reads_older_records():
    b = _multi(FakeMachine(lambda i: 1.0 + 0.003 * i), [50.0, 100.0, 75.0, 90.0], 100.0, n_prompts=4)
    p = b["paired"]
    again = T.rederive(p)
    for key in ("ar_speedup", "ar_ci_low", "ar_ci_high", "e2e_speedup", "e2e_ci_low", "e2e_ci_high", "reference_spread"):
        assert again[key] == pytest.approx(p[key]), key
    wider = T.rederive(p, ci_level=0.99)
    assert wider["ar_ci_low"] <= p["ar_ci_low"] and wider["ar_ci_high"] >= p["ar_ci_high"]
    old = {"ar_ratios": [2.0, 2.1, 1.9, 2.05, 1.95, 2.0, 2.02], "e2e_ratios": [1.5] * 7}
    r = T.rederive(old)
    assert r["ci_kind"] == T.CI_ORDER_STATISTIC and r["ar_speedup"] == 2.0 and r["n_prompts"] == 1
    assert T.rederive({"ar_speedup": 1.7}) is None


# -- the prompt sample ----------------------------------------------------------------------------
def _items(tags):
    return [SimpleNamespace(index=i, metadata={"tag": t} if t else {}) for i, t in enumerate(tags)]


def test_timing_sample_is_stratified_deterministic_and_prefix_stable():
    tags = ["single_object"] * 10 + ["two_object"] * 10 + ["counting"] * 10 + ["colors"] * 10 \
        + ["position"] * 10 + ["color_attr"] * 10
    items = _items(tags)
    s16 = T.timing_sample(items, 16, seed=0)
    counts = sorted(Counter(it.metadata["tag"] for it in s16).values())
    assert counts == [2, 2, 3, 3, 3, 3]                   # round-robin over the six tags
    assert len({it.index for it in s16}) == 16
    assert [it.index for it in T.timing_sample(items, 16, seed=0)] == [it.index for it in s16]
    assert [it.index for it in T.timing_sample(items, 4, seed=0)] == [it.index for it in s16[:4]]
    assert [it.index for it in T.timing_sample(items, 16, seed=1)] != [it.index for it in s16]
    assert [it.index for it in s16[:6]] != [0, 10, 20, 30, 40, 50]   # shuffled within tags, not the first of each
    assert sorted(it.index for it in T.timing_sample(items[:5], 16)) == [0, 1, 2, 3, 4]   # fewer prompts: all
    untagged = T.timing_sample(_items([None] * 30), 5, seed=0)
    assert len({it.index for it in untagged}) == 5
    with pytest.raises(ValueError, match="n must be >= 1"):
        T.timing_sample(items, 0)


# -- re-timing once the load settles ---------------------------------------------------------------
def test_wait_for_steady_load_is_bounded():
    slept = []
    readings = iter([5.0, 3.0, 2.0, 1.9])              # falling, then steady within 0.25
    out = T.wait_for_steady_load(120, poll_s=15, max_change=0.25, loadavg=lambda: next(readings), sleep=slept.append)
    assert out == {"waited_s": 45.0, "settled": True, "load": 1.9} and slept == [15, 15, 15]
    rising = iter(float(i) for i in range(100))
    out = T.wait_for_steady_load(60, poll_s=15, max_change=0.25, loadavg=lambda: next(rising), sleep=lambda s: None)
    assert out["waited_s"] == 60.0 and out["settled"] is False
    assert T.wait_for_steady_load(60, loadavg=lambda: None, sleep=lambda s: None)["settled"] is None
