"""Reading a paired frame's rows: its comparable groups, its baseline rows and its speed-ups.

The figures (:mod:`varbench.analysis.plots`), the image grids (:mod:`varbench.analysis.image_grid`)
and the tables all split a frame the same way and read the same speed column, so the rules live
here once:

* a *group* is the rows of one model, resolution, benchmark and device (:data:`GROUP_KEYS`): only
  rows of one group are compared in a figure;
* a row is the *baseline* when ``is_baseline`` says so or its ``method`` is the baseline's name;
* the *speed-up* shown is ``paired_speedup`` (timed interleaved with the baseline inside the job)
  when any non-baseline row has one, else ``speedup`` (the ratio of separate jobs).
"""
from __future__ import annotations

import math
import re
from typing import Sequence

import numpy as np

#: the columns that make rows comparable in one figure (and one table section)
GROUP_KEYS: tuple[str, ...] = ("model", "resolution", "benchmark", "device")


def is_missing(v) -> bool:
    """None, or a float/numpy NaN (strings and other objects are values)."""
    if v is None:
        return True
    try:
        return isinstance(v, (float, np.floating)) and math.isnan(v)
    except TypeError:
        return False


def groups(frame, keys: Sequence[str] = GROUP_KEYS) -> list[tuple[tuple, object]]:
    """``[(key values, sub-frame)]`` of ``frame`` by the ``keys`` it has (sorted; NaN keys kept);
    ``[((), frame)]`` when it has none of them."""
    keys = [k for k in keys if k in frame.columns and frame[k].notna().any()]
    if not keys:
        return [((), frame)]
    return [((k if isinstance(k, tuple) else (k,)), g) for k, g in frame.groupby(keys, dropna=False, sort=True)]


def slug(text: str) -> str:
    """File-name-safe version of a label."""
    return re.sub(r"[^A-Za-z0-9._=-]+", "_", str(text)).strip("_") or "x"


def baseline_mask(frame, baseline: str = "baseline"):
    """Boolean Series: rows that are the baseline (``is_baseline`` when present, or ``method``)."""
    import pandas as pd

    mask = frame["method"].astype(str).eq(baseline) if "method" in frame.columns else pd.Series(False, index=frame.index)
    if "is_baseline" in frame.columns:
        mask = mask | frame["is_baseline"].map(lambda v: bool(v) if not is_missing(v) else False).astype(bool)
    return mask


def speed_column(frame, baseline: str = "baseline") -> str:
    """``paired_speedup`` when any non-baseline row has it, else ``speedup``."""
    if "paired_speedup" in frame.columns:
        other = frame.loc[~baseline_mask(frame, baseline), "paired_speedup"]
        if other.notna().any():
            return "paired_speedup"
    return "speedup"


def speed_values(frame, baseline: str = "baseline", col: str | None = None):
    """``(x, lo, hi, reliable, col)`` arrays for the frame's rows: the speed-up (baseline rows 1.0),
    its 95% interval (NaN where absent) and the reliability flag (True where absent)."""
    col = col or speed_column(frame, baseline)
    base = baseline_mask(frame, baseline).to_numpy()
    n = len(frame)
    x = frame[col].astype(float).to_numpy() if col in frame.columns else np.full(n, np.nan)
    x = np.where(base, 1.0, x)
    lo = frame[f"{col}_ci_low"].astype(float).to_numpy() if f"{col}_ci_low" in frame.columns else np.full(n, np.nan)
    hi = frame[f"{col}_ci_high"].astype(float).to_numpy() if f"{col}_ci_high" in frame.columns else np.full(n, np.nan)
    lo, hi = np.where(base, np.nan, lo), np.where(base, np.nan, hi)
    if "speedup_reliable" in frame.columns:
        reliable = np.array([True if is_missing(v) else bool(v) for v in frame["speedup_reliable"]])
    else:
        reliable = np.ones(n, dtype=bool)
    reliable = reliable | base
    return x, lo, hi, reliable, col


def speed_words(col: str, has_ci: bool) -> str:
    """The axis title of speed column ``col`` (``has_ci``: the points carry 95% intervals)."""
    what = "AR loop, paired in-job, summed over the timed prompts" if col == "paired_speedup" else (
        "end to end, median" if col == "e2e_speedup" else "AR loop, median of separate jobs")
    return f"Speed-up over baseline (×, {what}{' with 95% CI' if has_ci else ''})"
