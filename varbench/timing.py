"""The timed pass: warm-up discarded, synchronised repeats, median and p10/p90 per stage, and
paired speed-ups against an interleaved reference with a confidence interval.

Runs separately from the image-writing pass, on one benchmark prompt, for each batch size.
Stage times come from the runtime (CUDA events on GPU, read once after the loop):
text encoding, the AR loop, VAE decode; total = their sum. Peak memory is CUDA's
max_memory_allocated (None on the CPU).

Paired protocol (``reference`` given: the baseline's generate, timed inside the method's job):

* Interleaving. Each repeat times the method once and the reference once, back to back. With
  ``order="abba"`` (default) odd repeats run the reference first (A B, B A, A B, ...), so a
  linear drift of the machine's speed, or a fixed cost of running second (cache, allocator,
  clocks), falls on both sides equally and cancels in the median; ``"ab"`` always runs the method
  first (the older protocol, kept to show the bias it has).
* Per-repeat ratios. ``ratio_i = reference_ms_i / method_ms_i`` for the AR loop and end to end;
  the speed-up is their median. A pair shares the machine's state, so load that changes between
  pairs does not enter the ratio.
* Interval. A distribution-free confidence interval for the median ratio from binomial order
  statistics (:func:`median_ci`): no normality, no resampling, no seed. With ``n`` repeats the
  best attainable coverage is ``1 - 2**(1 - n)`` ([min, max]), so 95% needs ``n >= 6``; with
  fewer the interval is [min, max] at the coverage it has, recorded as ``ci_level`` and flagged.
* Reliability (:func:`judge`). The cell is unreliable when the interval is wider than
  ``max_ci_rel_width`` times the median, when the reference's own repeat times spread by more
  than ``max_reference_spread`` (p90 - p10 over median: the machine's speed moved during the pass),
  when the 1-minute load average moved by more than ``max_load_change`` across the pass (CPU only;
  on CUDA the device is not shared with the host's load, so nothing), or when there are too few
  repeats for the requested coverage. Reasons are recorded in words.
"""
from __future__ import annotations

import math
import os
import statistics
from typing import Callable, Sequence

import torch

#: defaults shared with ``varbench/conf/timing/default.yaml`` (a test checks they agree)
DEFAULTS = {"order": "abba", "ci_level": 0.95, "max_ci_rel_width": 0.2, "max_reference_spread": 0.2,
            "max_load_change": 1.0}
ORDERS = ("abba", "ab")


def _stats(xs: list[float]) -> dict:
    xs = sorted(xs)
    if not xs:
        return {"median": None, "p10": None, "p90": None}

    def q(p):
        if len(xs) == 1:
            return xs[0]
        k = (len(xs) - 1) * p
        lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
        return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)

    return {"median": statistics.median(xs), "p10": q(0.1), "p90": q(0.9)}


def median_ci(xs: Sequence[float], level: float = 0.95) -> tuple[float | None, float | None, float]:
    """Distribution-free confidence interval for the median of ``xs``: ``(low, high, coverage)``.

    The interval is ``[x_(k), x_(n+1-k)]`` (order statistics, 1-based) with the largest ``k``
    whose coverage ``1 - 2 * P(Binomial(n, 1/2) <= k - 1)`` is at least ``level``: the number
    of observations below the true median is Binomial(n, 1/2) whatever the distribution
    (continuous, independent repeats), which is all this assumes. When even [min, max] does not
    reach ``level`` (``n`` too small: 95% needs ``n >= 6``), [min, max] is returned with the
    coverage it has (``1 - 2**(1 - n)``; 0 for one value). Empty input: ``(None, None, 0.0)``.

    ``level`` trades width for confidence: a higher level widens the interval (moves ``k`` toward
    the extremes) and needs more repeats to be attainable at all.
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"median_ci: level must be in (0, 1), got {level!r}")
    s = sorted(float(x) for x in xs)
    n = len(s)
    if n == 0:
        return None, None, 0.0

    def coverage(k: int) -> float:  # P(x_(k) <= median <= x_(n+1-k))
        return 1.0 - 2.0 * sum(math.comb(n, i) for i in range(k)) / 2.0 ** n

    k = 1
    while k + 1 <= (n + 1) // 2 and coverage(k + 1) >= level:
        k += 1
    return s[k - 1], s[n - k], max(coverage(k), 0.0)


def judge(paired: dict, ci_level: float = DEFAULTS["ci_level"], max_ci_rel_width: float = DEFAULTS["max_ci_rel_width"],
          max_reference_spread: float = DEFAULTS["max_reference_spread"],
          max_load_change: float = DEFAULTS["max_load_change"]) -> tuple[bool, list[str]]:
    """``(reliable, reasons)`` for a ``paired`` block written by :func:`timed_pass`.

    Thresholds trade false alarms for missed noise: a smaller ``max_ci_rel_width`` (relative width
    ``(high - low) / median`` of the AR speed-up's interval) or ``max_reference_spread`` flags more
    cells on a noisy machine; larger ones let more drift through unmarked. ``max_load_change`` is
    in load-average units (runnable processes), compared only where the block has load averages.
    """
    reasons = []
    n = int(paired.get("n_repeats") or 0)
    med, lo, hi = paired.get("ar_speedup"), paired.get("ar_ci_low"), paired.get("ar_ci_high")
    level = float(paired.get("ci_level") or 0.0)
    if n < 1 or med is None or lo is None or hi is None:
        return False, ["no timed repeats"]
    if level + 1e-12 < ci_level:
        reasons.append(f"{n} repeat{'s' if n != 1 else ''} give at most {level:.0%} coverage "
                       f"(< {ci_level:.0%}; needs more repeats)")
    width = (hi - lo) / med if med else float("inf")
    if width > max_ci_rel_width:
        reasons.append(f"interval width {width:.1%} of the median > {max_ci_rel_width:.0%}")
    spread = paired.get("reference_spread")
    if spread is not None and spread > max_reference_spread:
        reasons.append(f"baseline repeat times spread {spread:.1%} > {max_reference_spread:.0%} (machine speed moved)")
    la = paired.get("loadavg")
    if la and la.get("before") is not None and la.get("after") is not None:
        change = abs(la["after"] - la["before"])
        if change > max_load_change:
            reasons.append(f"load average moved {la['before']:.2f} -> {la['after']:.2f} during the pass")
    return not reasons, reasons


def protocol_kwargs(timing_cfg) -> dict:
    """The paired-protocol keyword arguments of :func:`timed_pass` from a ``timing`` config
    section (a mapping; missing keys take :data:`DEFAULTS`)."""
    get = timing_cfg.get if hasattr(timing_cfg, "get") else (lambda k, d=None: d)
    return {k: (str(get(k, v)) if k == "order" else float(get(k, v))) for k, v in DEFAULTS.items()}


def _loadavg(device: torch.device) -> float | None:
    if device.type == "cuda" or not hasattr(os, "getloadavg"):
        return None
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def _total(t: dict) -> float:
    return t["text"] + t["ar"] + t["decode"]


def _paired_block(runs: list[dict], ref_runs: list[dict], order: str, ci_level: float,
                  load: tuple[float | None, float | None], thresholds: dict) -> dict:
    """Per-repeat ratios, their medians and intervals, drift signals and the reliability verdict."""
    ar_r = [r["ar"] / m["ar"] for m, r in zip(runs, ref_runs)]
    e2e_r = [_total(r) / _total(m) for m, r in zip(runs, ref_runs)]
    ref_ar = [r["ar"] for r in ref_runs]
    ar_lo, ar_hi, level = median_ci(ar_r, ci_level)
    e2e_lo, e2e_hi, _ = median_ci(e2e_r, ci_level)
    st = _stats(ref_ar)
    block = {
        "reference_ar_ms": st["median"], "reference_total_ms": statistics.median(_total(r) for r in ref_runs),
        "ar_speedup": statistics.median(ar_r), "ar_ci_low": ar_lo, "ar_ci_high": ar_hi,
        "e2e_speedup": statistics.median(e2e_r), "e2e_ci_low": e2e_lo, "e2e_ci_high": e2e_hi,
        "ci_level": level, "ci_method": "binomial order statistics of the median (distribution-free)",
        "n_repeats": len(ar_r), "order": order,
        "ar_ratios": ar_r, "e2e_ratios": e2e_r,
        "reference_repeats_ms": {"ar": ref_ar, "total": [_total(r) for r in ref_runs]},
        # the baseline's own repeat-to-repeat spread: large when the machine's speed moved mid-pass
        "reference_spread": (st["p90"] - st["p10"]) / st["median"] if st["median"] else None,
        "loadavg": {"before": load[0], "after": load[1]} if load[0] is not None else None,
        "thresholds": {"ci_level": ci_level, **thresholds},
    }
    block["reliable"], block["unreliable_reasons"] = judge(block, ci_level=ci_level, **thresholds)
    return block


def timed_pass(generate: Callable[[int], object], batch_sizes, warmup: int, repeats: int,
               device: torch.device, progress=None, reference: Callable[[int], object] | None = None, *,
               order: str = DEFAULTS["order"], ci_level: float = DEFAULTS["ci_level"],
               max_ci_rel_width: float = DEFAULTS["max_ci_rel_width"],
               max_reference_spread: float = DEFAULTS["max_reference_spread"],
               max_load_change: float = DEFAULTS["max_load_change"]) -> dict:
    """Time ``generate(bs)`` (one generation of ``bs`` images returning an object with
    ``timings_ms = {"text", "ar", "decode", "per_scale"}``) for each batch size.

    Returns ``{str(bs): block}``; ``block`` holds ``text_ms``/``ar_ms``/``decode_ms``/``total_ms``
    (median, p10, p90), ``images_per_s``, ``peak_mem_bytes``, ``per_scale_ms``, ``n_repeats`` and
    ``repeats_ms`` (every repeat's AR and total ms). With ``reference`` (the baseline's generate)
    the repeats are interleaved (module docstring) and ``block["paired"]`` holds: ``ar_speedup`` /
    ``e2e_speedup`` (medians of per-repeat reference/method ratios), ``ar_ci_low/high``,
    ``e2e_ci_low/high`` and ``ci_level`` (:func:`median_ci`), ``n_repeats``, ``order``, the
    ratios themselves, ``reference_ar_ms``/``reference_total_ms`` (medians),
    ``reference_repeats_ms``, ``reference_spread``, ``loadavg`` (CPU), ``thresholds``,
    ``reliable`` and ``unreliable_reasons`` (:func:`judge`). The other keyword arguments are the
    protocol's knobs (``varbench/conf/timing/default.yaml``; :func:`protocol_kwargs`).
    """
    if order not in ORDERS:
        raise ValueError(f"timed_pass: order must be one of {ORDERS}, got {order!r}")
    thresholds = {"max_ci_rel_width": max_ci_rel_width, "max_reference_spread": max_reference_spread,
                  "max_load_change": max_load_change}
    by_batch = {}
    for bs in batch_sizes:
        for i in range(warmup):
            generate(bs)
            if reference is not None:
                reference(bs)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
        load_before = _loadavg(device)
        runs, ref_runs = [], []
        for i in range(repeats):
            if reference is not None and order == "abba" and i % 2 == 1:
                ref_runs.append(reference(bs).timings_ms)
                runs.append(generate(bs).timings_ms)
            else:
                runs.append(generate(bs).timings_ms)
                if reference is not None:
                    ref_runs.append(reference(bs).timings_ms)
            if progress is not None:
                progress.update(1)
        load_after = _loadavg(device)
        text = [r["text"] for r in runs]
        ar = [r["ar"] for r in runs]
        dec = [r["decode"] for r in runs]
        tot = [a + b + c for a, b, c in zip(text, ar, dec)]
        per_scale = [statistics.median(col) for col in zip(*[r["per_scale"] for r in runs])] if runs else []
        med_total = statistics.median(tot) if tot else None
        by_batch[str(bs)] = {
            "text_ms": _stats(text), "ar_ms": _stats(ar), "decode_ms": _stats(dec), "total_ms": _stats(tot),
            "images_per_s": (bs * 1e3 / med_total) if med_total else None,
            "peak_mem_bytes": torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
            "per_scale_ms": per_scale, "n_repeats": len(runs), "repeats_ms": {"ar": ar, "total": tot},
        }
        if ref_runs:
            by_batch[str(bs)]["paired"] = _paired_block(runs, ref_runs, order, ci_level,
                                                        (load_before, load_after), thresholds)
    return by_batch
