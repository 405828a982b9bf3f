"""The timed pass: warm-up discarded, synchronised repeats over a fixed sample of the benchmark's
prompts, per-prompt latency (median and p10/p90 over prompts), and the paired speed-up against an
interleaved reference with a confidence interval.

Runs separately from the image-writing pass, for each batch size. Stage times come from the
runtime (CUDA events on GPU, read once after the loop): text encoding, the AR loop, VAE decode;
total = their sum. Peak memory is CUDA's max_memory_allocated, beside max_memory_reserved and the
driver's NVML reading after the pass (None on the CPU).

Prompts (:func:`timing_sample`). Adaptive methods (NOVA, ToProVAR, SkipVAR) do different work per
prompt, so one prompt's decision is not the method's speed. The pass times ``n_prompts`` prompts
(position ``k`` of the sample; ``generate(bs, k)``), chosen by the job deterministically and
round-robin over the benchmark's tags, the same prompts and seeds for the method and its reference.
Per prompt ``k``: ``warmup_per_prompt`` untimed pairs (graph capture of plans the first prompt did
not use), then ``repeats`` timed pairs; the prompt's latency is the median of its repeats. Prompts
run one after another (prompt-major): a prompt's repeats share one warm state, and a graph cache
holding one state per shape is not thrashed by switching prompts every call.

Paired protocol (``reference`` given: the baseline's generate, timed inside the method's job):

* Interleaving. Each pair times the method once and the reference once, back to back, on the same
  prompt and seeds. With ``order="abba"`` (default) every other pair, counted over the whole pass,
  runs the reference first (A B, B A, A B, ...), so a linear drift of the machine's speed, or a
  fixed cost of running second (cache, allocator, clocks), falls on both sides equally; ``"ab"``
  always runs the method first (the older protocol, kept to show the bias it has).
* Speed-up. Several prompts: ``sum_k reference_ms_k / sum_k method_ms_k`` over the per-prompt
  medians (AR loop and end to end): the time the benchmark's prompts take, so a prompt the method
  barely accelerates weighs as much as its time says. One prompt: the median of the per-pair
  ratios ``reference_ms_i / method_ms_i`` (the older protocol; a pair shares the machine's state).
* Interval. Several prompts: a percentile bootstrap over the timed prompts (``bootstrap_resamples``
  resamples of the prompts with replacement, fixed ``bootstrap_seed``, the ratio of sums each time;
  :func:`bootstrap_ratio_ci`). It covers which prompts were drawn and, through each prompt's
  median, the repeat noise of this run on this machine; not another machine or another day. With
  few prompts the percentile interval under-covers (4 prompts: 35 distinct resamples). One
  prompt: the distribution-free interval of the median ratio from binomial order statistics
  (:func:`median_ci`): with ``n`` repeats the best coverage is ``1 - 2**(1 - n)`` ([min, max]), so
  95% needs ``n >= 6``; with fewer it is [min, max] at the coverage it has, recorded and flagged.
* Reliability (:func:`judge`). The cell is unreliable when the interval is wider than
  ``max_ci_rel_width`` times the estimate (for an adaptive method this can be genuine
  prompt-to-prompt variation: read the interval), when the reference's repeat times spread by
  more than ``max_reference_spread`` within prompts (p90 - p10 of each repeat over its prompt's
  median, pooled: the machine's speed moved during the pass), when the 1-minute load average moved
  by more than ``max_load_change`` across the pass (CPU only; on CUDA the device is not shared
  with the host's load, so nothing), or when one prompt's repeats are too few for the requested
  coverage. Reasons are recorded in words.
"""
from __future__ import annotations

import math
import os
import random
import statistics
import time
from typing import Any, Callable, Mapping, Sequence

import torch

#: defaults shared with ``varbench/conf/timing/default.yaml`` (a test checks they agree)
DEFAULTS = {"order": "abba", "ci_level": 0.95, "max_ci_rel_width": 0.2, "max_reference_spread": 0.2,
            "max_load_change": 1.0, "bootstrap_resamples": 2000, "bootstrap_seed": 0}
ORDERS = ("abba", "ab")
#: the two interval methods (``paired["ci_kind"]``); records without one used the order statistic
CI_ORDER_STATISTIC, CI_BOOTSTRAP = "order_statistic", "bootstrap"
#: the knobs :func:`judge` compares a paired block with (each a ``timing.*`` setting)
THRESHOLDS = ("max_ci_rel_width", "max_reference_spread", "max_load_change")


def quantile_summary(xs: list[float]) -> dict:
    """``{"median", "p10", "p90"}`` of ``xs`` (quantiles linearly interpolated; Nones when empty):
    the latency blocks of the timing record."""
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


def bootstrap_ratio_ci(num: Sequence[float], den: Sequence[float], level: float = 0.95,
                       resamples: int = DEFAULTS["bootstrap_resamples"],
                       seed: int = DEFAULTS["bootstrap_seed"]) -> tuple[float | None, float | None]:
    """Percentile bootstrap interval of ``sum(num) / sum(den)``, resampling the paired items
    (prompts) with replacement: ``(low, high)``; ``(None, None)`` for fewer than two items.

    ``resamples`` trades run time for how much the interval's ends move with ``seed`` (2000:
    about ±1% of the width at 95%); the seed is fixed so one record always gives one interval.
    """
    import numpy as np

    if not 0.0 < level < 1.0:
        raise ValueError(f"bootstrap_ratio_ci: level must be in (0, 1), got {level!r}")
    if len(num) != len(den):
        raise ValueError(f"bootstrap_ratio_ci: {len(num)} numerators but {len(den)} denominators")
    if int(resamples) < 1:
        raise ValueError(f"bootstrap_ratio_ci: resamples must be >= 1, got {resamples!r}")
    n = len(num)
    if n < 2:
        return None, None
    a, b = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    idx = np.random.default_rng(int(seed)).integers(0, n, size=(int(resamples), n))
    ratios = a[idx].sum(axis=1) / b[idx].sum(axis=1)
    lo, hi = np.quantile(ratios, [(1.0 - level) / 2.0, (1.0 + level) / 2.0])
    return float(lo), float(hi)


def timing_sample(items: Sequence[Any], n: int, seed: int = 0) -> list[Any]:
    """``n`` of ``items`` (prompt items with ``.metadata``), deterministic in ``seed``: each tag's
    items shuffled with the seed, then taken round-robin over the tags in order of first
    appearance (untagged items form one group), so 16 GenEval prompts cover its six tags 3, 3, 3,
    3, 2, 2. The sample of ``n`` is a prefix of the sample of ``m > n`` (a static method timed on
    fewer prompts times the first of the adaptive method's), and the whole set when ``n`` exceeds it."""
    if int(n) < 1:
        raise ValueError(f"timing_sample: n must be >= 1, got {n!r}")
    groups: dict[Any, list] = {}
    for it in items:
        groups.setdefault((getattr(it, "metadata", None) or {}).get("tag"), []).append(it)
    rng = random.Random(f"varbench-timing-{seed}")   # a string seed: stable across Python versions
    for g in groups.values():
        rng.shuffle(g)
    out: list = []
    depth = 0
    while len(out) < min(int(n), len(items)):
        for g in groups.values():
            if depth < len(g) and len(out) < n:
                out.append(g[depth])
        depth += 1
    return out


def judge(paired: dict, ci_level: float = DEFAULTS["ci_level"], max_ci_rel_width: float = DEFAULTS["max_ci_rel_width"],
          max_reference_spread: float = DEFAULTS["max_reference_spread"],
          max_load_change: float = DEFAULTS["max_load_change"]) -> tuple[bool, list[str]]:
    """``(reliable, reasons)`` for a ``paired`` block written by :func:`timed_pass`.

    Thresholds trade false alarms for missed noise: a smaller ``max_ci_rel_width`` (relative width
    ``(high - low) / estimate`` of the AR speed-up's interval) or ``max_reference_spread`` flags more
    cells on a noisy machine; larger ones let more drift through unmarked. ``max_load_change`` is
    in load-average units (runnable processes), compared only where the block has load averages.
    The coverage check applies to the one-prompt order-statistic interval only (a bootstrap
    interval has the nominal level by construction).
    """
    reasons = []
    n = int(paired.get("n_repeats") or 0)
    med, lo, hi = paired.get("ar_speedup"), paired.get("ar_ci_low"), paired.get("ar_ci_high")
    level = float(paired.get("ci_level") or 0.0)
    if n < 1 or med is None or lo is None or hi is None:
        return False, ["no timed repeats"]
    if paired.get("ci_kind", CI_ORDER_STATISTIC) == CI_ORDER_STATISTIC and level + 1e-12 < ci_level:
        reasons.append(f"{n} repeat{'s' if n != 1 else ''} give at most {level:.0%} coverage "
                       f"(< {ci_level:.0%}; needs more repeats)")
    width = (hi - lo) / med if med else float("inf")
    if width > max_ci_rel_width:
        reasons.append(f"interval width {width:.1%} of the estimate > {max_ci_rel_width:.0%}")
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
    conv = {"order": str, "bootstrap_resamples": int, "bootstrap_seed": int}
    return {k: conv.get(k, float)(get(k, v)) for k, v in DEFAULTS.items()}


def _loadavg(device: torch.device) -> float | None:
    if device.type == "cuda" or not hasattr(os, "getloadavg"):
        return None
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def wait_for_steady_load(max_wait_s: float, poll_s: float = 15.0, max_change: float = 0.25,
                         loadavg: Callable[[], float | None] | None = None,
                         sleep: Callable[[float], None] = time.sleep) -> dict:
    """Wait until the 1-minute load average moves by at most ``max_change`` over ``poll_s`` seconds,
    or ``max_wait_s`` have passed: ``{"waited_s", "settled", "load"}`` (``settled`` None where the
    host has no load average). A longer ``poll_s`` or smaller ``max_change`` waits for a calmer
    machine; ``max_wait_s`` bounds what a re-time may cost."""
    def read():
        if loadavg is not None:
            return loadavg()
        try:
            return os.getloadavg()[0]
        except (OSError, AttributeError):
            return None

    waited, last = 0.0, read()
    if last is None:
        return {"waited_s": 0.0, "settled": None, "load": None}
    while waited + poll_s <= max_wait_s + 1e-9:
        sleep(poll_s)
        waited += poll_s
        now = read()
        if now is None:
            return {"waited_s": waited, "settled": None, "load": None}
        if abs(now - last) <= max_change:
            return {"waited_s": waited, "settled": True, "load": now}
        last = now
    return {"waited_s": waited, "settled": False, "load": last}


def _nvml(device: torch.device) -> int | None:
    """The driver's reading of GPU memory now (varbench.engine.nvml); None on the CPU or without one."""
    if device.type != "cuda":
        return None
    from varbench.engine.nvml import nvml_used_bytes

    return nvml_used_bytes(device)[0]


def _total(t: dict) -> float:
    return t["text"] + t["ar"] + t["decode"]


def _pooled_spread(per_prompt: Sequence[Sequence[float]]) -> float | None:
    """p90 - p10 of every repeat over its own prompt's median, pooled over prompts: how much the
    machine's speed moved within prompts (prompt-to-prompt differences in work do not enter)."""
    rel = [x / statistics.median(xs) for xs in per_prompt if xs and statistics.median(xs) for x in xs]
    if not rel:
        return None
    st = quantile_summary(rel)
    return st["p90"] - st["p10"]


def summarise_paired(method: Mapping[str, Sequence[Sequence[float]]], reference: Mapping[str, Sequence[Sequence[float]]],
                     ci_level: float = DEFAULTS["ci_level"], bootstrap_resamples: int = DEFAULTS["bootstrap_resamples"],
                     bootstrap_seed: int = DEFAULTS["bootstrap_seed"]) -> dict:
    """Speed-ups and intervals from the repeats: ``method``/``reference`` map ``"ar"`` and
    ``"total"`` to per-prompt lists of repeat ms (repeat ``i`` of prompt ``k`` paired by position).
    One prompt: median per-pair ratio and :func:`median_ci`; several: ratio of the summed
    per-prompt medians and :func:`bootstrap_ratio_ci` (module docstring). Shared by the timed pass
    and :mod:`varbench.harness.records` (which re-derives it with the record's own knobs)."""
    out: dict[str, Any] = {}
    n_prompts = len(method["ar"])
    for key, name in (("ar", "ar"), ("total", "e2e")):
        m, r = method[key], reference[key]
        if n_prompts == 1:
            ratios = [b / a for a, b in zip(m[0], r[0])]
            lo, hi, level = median_ci(ratios, ci_level)
            est = statistics.median(ratios) if ratios else None
            kind = CI_ORDER_STATISTIC
        else:
            mm, rm = [statistics.median(x) for x in m], [statistics.median(x) for x in r]
            est = sum(rm) / sum(mm)
            lo, hi = bootstrap_ratio_ci(rm, mm, ci_level, bootstrap_resamples, bootstrap_seed)
            level, kind = ci_level, CI_BOOTSTRAP
            if key == "ar":
                out["per_prompt_ar_speedup"] = [b / a for a, b in zip(mm, rm)]
        out.update({f"{name}_speedup": est, f"{name}_ci_low": lo, f"{name}_ci_high": hi})
        if key == "ar":
            out["ci_level"], out["ci_kind"] = level, kind
    out["ci_method"] = ("binomial order statistics of the median per-repeat ratio (distribution-free)"
                        if out["ci_kind"] == CI_ORDER_STATISTIC else
                        f"percentile bootstrap over {n_prompts} prompts of the ratio of summed per-prompt "
                        f"medians ({bootstrap_resamples} resamples, seed {bootstrap_seed})")
    out["bootstrap"] = ({"resamples": int(bootstrap_resamples), "seed": int(bootstrap_seed)}
                        if out["ci_kind"] == CI_BOOTSTRAP else None)
    out["n_prompts"] = n_prompts
    out["n_repeats"] = sum(len(x) for x in method["ar"])
    out["reference_spread"] = _pooled_spread(reference["ar"])
    return out


def rederive(paired: Mapping, ci_level: float = DEFAULTS["ci_level"], bootstrap_resamples: int = DEFAULTS["bootstrap_resamples"],
             bootstrap_seed: int = DEFAULTS["bootstrap_seed"]) -> dict | None:
    """A stored ``paired`` block's estimates recomputed from its raw repeats at these knobs:
    the per-prompt protocol's ``method_repeats_ms``/``reference_repeats_ms`` (nested per prompt),
    else an older record's flat per-repeat ``ar_ratios``/``e2e_ratios`` (one prompt; median and
    :func:`median_ci`); None when it holds neither (timed before per-repeat ratios were kept)."""
    m, r = paired.get("method_repeats_ms"), paired.get("reference_repeats_ms")
    if isinstance(m, Mapping) and isinstance(r, Mapping) and m.get("ar") and isinstance(m["ar"][0], list):
        return {**paired, **summarise_paired(m, r, ci_level, bootstrap_resamples, bootstrap_seed)}
    ar, e2e = paired.get("ar_ratios"), paired.get("e2e_ratios")
    if not ar:
        return None
    block = dict(paired)
    block["ar_speedup"], block["e2e_speedup"] = statistics.median(ar), statistics.median(e2e or ar)
    block["ar_ci_low"], block["ar_ci_high"], block["ci_level"] = median_ci(ar, ci_level)
    block["e2e_ci_low"], block["e2e_ci_high"], _ = median_ci(e2e, ci_level) if e2e else (None, None, 0.0)
    block["n_repeats"], block["ci_kind"], block["n_prompts"] = len(ar), CI_ORDER_STATISTIC, 1
    return block


def _paired_block(runs: list[list[dict]], ref_runs: list[list[dict]], pair_prompt: list[int], order: str,
                  ci_level: float, load: tuple[float | None, float | None], thresholds: dict,
                  bootstrap: dict) -> dict:
    """Per-prompt repeats -> speed-ups, intervals, drift signals and the reliability verdict."""
    flat_m = [t for rs in runs for t in rs]
    flat_r = [t for rs in ref_runs for t in rs]
    ms = {"ar": [[t["ar"] for t in rs] for rs in runs], "total": [[_total(t) for t in rs] for rs in runs]}
    ref = {"ar": [[t["ar"] for t in rs] for rs in ref_runs], "total": [[_total(t) for t in rs] for rs in ref_runs]}
    block = {
        "reference_ar_ms": statistics.median(statistics.median(x) for x in ref["ar"]),
        "reference_total_ms": statistics.median(statistics.median(x) for x in ref["total"]),
        **summarise_paired(ms, ref, ci_level, **bootstrap),
        "order": order,
        # per pair, in the order they ran (pair_prompt: which timed prompt each pair used)
        "ar_ratios": [r["ar"] / m["ar"] for m, r in zip(flat_m, flat_r)],
        "e2e_ratios": [_total(r) / _total(m) for m, r in zip(flat_m, flat_r)],
        "pair_prompt": pair_prompt,
        "method_repeats_ms": ms, "reference_repeats_ms": ref,
        "loadavg": {"before": load[0], "after": load[1]} if load[0] is not None else None,
        "thresholds": {"ci_level": ci_level, **thresholds},
    }
    block["reliable"], block["unreliable_reasons"] = judge(block, ci_level=ci_level, **thresholds)
    return block


def timed_pass(generate: Callable[..., object], batch_sizes, warmup: int, repeats: int,
               device: torch.device, progress=None, reference: Callable[..., object] | None = None, *,
               n_prompts: int = 1, warmup_per_prompt: int = 0,
               order: str = DEFAULTS["order"], ci_level: float = DEFAULTS["ci_level"],
               max_ci_rel_width: float = DEFAULTS["max_ci_rel_width"],
               max_reference_spread: float = DEFAULTS["max_reference_spread"],
               max_load_change: float = DEFAULTS["max_load_change"],
               bootstrap_resamples: int = DEFAULTS["bootstrap_resamples"],
               bootstrap_seed: int = DEFAULTS["bootstrap_seed"]) -> dict:
    """Time ``generate`` (one generation of ``bs`` images returning an object with
    ``timings_ms = {"text", "ar", "decode", "per_scale"}``) for each batch size, on ``n_prompts``
    prompts: ``generate(bs, k)`` runs timed prompt ``k`` (``generate(bs)`` when ``n_prompts`` is 1,
    so one-prompt callers need no prompt argument); ``reference`` likewise.

    Per batch size: ``warmup`` untimed calls on prompt 0 (method and reference), then per prompt
    ``warmup_per_prompt`` untimed pairs (prompt 0 excepted: it had the warm-up) and ``repeats``
    timed pairs (module docstring). ``repeats`` is per prompt.

    Returns ``{str(bs): block}``; ``block`` holds ``text_ms``/``ar_ms``/``decode_ms``/``total_ms``
    (median, p10, p90 over the prompts' latencies, each the median of its repeats), ``per_prompt``
    (``{"ar_ms": [...], "total_ms": [...]}``, one latency per prompt), ``ar_repeat_spread`` (the
    method's own repeats, pooled within prompts), ``images_per_s``, ``peak_mem_bytes``,
    ``per_scale_ms``, ``n_prompts``, ``n_repeats`` (all timed calls) and ``repeats_ms`` (every
    repeat's AR and total ms, per prompt). With ``reference`` ``block["paired"]`` holds
    :func:`summarise_paired`'s speed-ups and intervals, the raw per-prompt repeats of both sides,
    per-pair ratios (``pair_prompt``: the prompt of each pair), ``reference_ar_ms`` /
    ``reference_total_ms`` (medians over prompts), ``reference_spread``, ``loadavg`` (CPU),
    ``thresholds``, ``reliable`` and ``unreliable_reasons`` (:func:`judge`). The other keyword
    arguments are the protocol's knobs (``varbench/conf/timing/default.yaml``; :func:`protocol_kwargs`).
    """
    if order not in ORDERS:
        raise ValueError(f"timed_pass: order must be one of {ORDERS}, got {order!r}")
    if int(n_prompts) < 1:
        raise ValueError(f"timed_pass: n_prompts must be >= 1, got {n_prompts!r}")
    thresholds = {"max_ci_rel_width": max_ci_rel_width, "max_reference_spread": max_reference_spread,
                  "max_load_change": max_load_change}
    bootstrap = {"bootstrap_resamples": int(bootstrap_resamples), "bootstrap_seed": int(bootstrap_seed)}

    def call(fn, bs, k):
        return fn(bs) if n_prompts == 1 else fn(bs, k)

    by_batch = {}
    for bs in batch_sizes:
        for _ in range(warmup):
            call(generate, bs, 0)
            if reference is not None:
                call(reference, bs, 0)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
        load_before = _loadavg(device)
        runs: list[list[dict]] = [[] for _ in range(n_prompts)]
        ref_runs: list[list[dict]] = [[] for _ in range(n_prompts)]
        pair_prompt, pair = [], 0
        for k in range(n_prompts):
            for _ in range(warmup_per_prompt if k > 0 else 0):
                call(generate, bs, k)
                if reference is not None:
                    call(reference, bs, k)
            for _ in range(repeats):
                if reference is not None and order == "abba" and pair % 2 == 1:
                    ref_runs[k].append(call(reference, bs, k).timings_ms)
                    runs[k].append(call(generate, bs, k).timings_ms)
                else:
                    runs[k].append(call(generate, bs, k).timings_ms)
                    if reference is not None:
                        ref_runs[k].append(call(reference, bs, k).timings_ms)
                pair_prompt.append(k)
                pair += 1
                if progress is not None:
                    progress.update(1)
        load_after = _loadavg(device)
        per = {key: [[t[key] for t in rs] for rs in runs] for key in ("text", "ar", "decode")}
        per["total"] = [[_total(t) for t in rs] for rs in runs]
        lat = {key: [statistics.median(x) for x in v if x] for key, v in per.items()}
        flat = [t for rs in runs for t in rs]
        per_scale = [statistics.median(col) for col in zip(*[t["per_scale"] for t in flat])] if flat else []
        med_total = statistics.median(lat["total"]) if lat["total"] else None
        by_batch[str(bs)] = {
            "text_ms": quantile_summary(lat["text"]), "ar_ms": quantile_summary(lat["ar"]),
            "decode_ms": quantile_summary(lat["decode"]), "total_ms": quantile_summary(lat["total"]),
            "per_prompt": {"ar_ms": lat["ar"], "total_ms": lat["total"]},
            "ar_repeat_spread": _pooled_spread(per["ar"]),
            "images_per_s": (bs * 1e3 / med_total) if med_total else None,
            "peak_mem_bytes": torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
            "peak_reserved_bytes": torch.cuda.max_memory_reserved(device) if device.type == "cuda" else None,
            "nvml_bytes": _nvml(device),
            "per_scale_ms": per_scale, "n_prompts": n_prompts, "n_repeats": len(flat),
            "repeats_ms": {"ar": per["ar"], "total": per["total"]},
        }
        if reference is not None and flat:
            by_batch[str(bs)]["paired"] = _paired_block(runs, ref_runs, pair_prompt, order, ci_level,
                                                        (load_before, load_after), thresholds, bootstrap)
    return by_batch
