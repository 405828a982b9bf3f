"""The timed pass's paired protocol (issue #14 item 1): interleaving order, per-repeat ratios, the
order-statistic interval of their median and the reliability verdict.

Most tests drive :func:`varbench.timing.timed_pass` with a deterministic fake machine: each call's
``timings_ms`` is ``work x speed(call number)``, so drift, a cost of running second, or load
changes are exact functions of the call order and nothing depends on the wall clock. A method
doing the baseline's work then gives ratios whose side of 1 is fixed by the order alone, so the
asserts hold on any machine and can fail only if the protocol (order, pairing, ratio direction,
interval) is wrong. One test uses the real clock with ``time.sleep`` (see its docstring).
"""
from __future__ import annotations

import math
import random
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

from varbench import timing as T
from varbench.timing import judge, median_ci, protocol_kwargs, timed_pass

CPU = torch.device("cpu")
CONF = Path(__file__).resolve().parents[1] / "varbench" / "conf" / "timing"


class FakeMachine:
    """Generations whose duration is ``work * speed(call index)``; ``second_penalty`` slows a call
    that directly follows another one of the same pair (cache eviction, clocks: a run-second cost)."""

    def __init__(self, speed=lambda i: 1.0, second_penalty: float = 0.0):
        self.speed, self.second_penalty = speed, second_penalty
        self.calls: list[str] = []

    def generator(self, name: str, work_ms: float):
        def generate(bs: int):
            i = len(self.calls)
            second = i % 2 == 1                # calls come in pairs (warm-up included)
            self.calls.append(name)
            ms = work_ms * bs * self.speed(i) * (1.0 + (self.second_penalty if second else 0.0))
            return SimpleNamespace(timings_ms={"text": 0.1 * ms, "ar": ms, "decode": 0.2 * ms, "per_scale": [ms]})
        return generate


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
    assert p["reference_repeats_ms"]["ar"] == pytest.approx([40.0, 120.0, 40.0])
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
    # enough repeats for the interval the config asks for
    assert median_ci(range(cfg["repeats"]), cfg["ci_level"])[2] >= cfg["ci_level"]
    assert protocol_kwargs({})["order"] == "abba"
