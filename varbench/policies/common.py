"""Small helpers shared by the acceleration policies: scale and block addressing, batch reductions,
plan inspection.

Scale addressing. Methods published for the square 1024² schedule name scales by token-map width
(FastVAR) or by 1-based scale number (ToProVAR Table 8). Policies here take *schedule indices*:
a non-negative int is an absolute 0-based index, a negative int counts from the end of the schedule
(-1 = last scale). Every '1M' schedule has 13 scales whatever the aspect ratio, so on 1M presets
the two readings coincide (-4 == 9 == the 32² scale of the square schedule).
"""
from __future__ import annotations

import math
from typing import Iterable, Mapping, Optional

import torch

from varbench.engine.plan import GenerationContext


def resolve_scale(index: int, n_scales: int, *, what: str = "scale") -> Optional[int]:
    """Absolute 0-based index for `index` (negative = from the end). None when it falls outside
    the schedule (a short schedule simply lacks that scale; callers ignore it)."""
    if not isinstance(index, int) or isinstance(index, bool):
        raise TypeError(f"{what} index must be an int (negative counts from the end), got {index!r}")
    si = index + n_scales if index < 0 else index
    return si if 0 <= si < n_scales else None


def resolve_scale_map(mapping: Optional[Mapping], n_scales: int, *, what: str) -> dict[int, float]:
    """{index: value} with indices resolved; keys may arrive as strings from YAML/CLI overrides."""
    out: dict[int, float] = {}
    for key, value in (mapping or {}).items():
        try:
            k = int(key)
        except (TypeError, ValueError):
            raise ValueError(f"{what}: scale keys must be integers (0-based, negative from the end), got {key!r}") from None
        si = resolve_scale(k, n_scales, what=what)
        if si is None:
            continue
        if si in out:
            raise ValueError(f"{what}: keys {key!r} and another key both name scale {si}.")
        out[si] = float(value)
    return out


def block_range(depth: int, first_frac: float, last_frac: float) -> range:
    """Blocks [round(depth*first_frac), round(depth*last_frac)). FastVAR's released 3..27 of 32 is
    first_frac=3/32, last_frac=28/32; on the 8B's 40 blocks that gives 4..34."""
    if not 0.0 <= first_frac <= last_frac <= 1.0:
        raise ValueError(f"block fractions must satisfy 0 <= first <= last <= 1, got {first_frac}, {last_frac}")
    half_up = lambda v: int(math.floor(v + 0.5))  # noqa: E731  (not Python's banker's rounding)
    return range(half_up(depth * first_frac), half_up(depth * last_frac))


def protected_blocks(depth: int, protect_first: float, protect_last: float) -> range:
    """Blocks left unpruned at both ends of the stack.

    Each protection is a block count (int >= 1, or 0) or a fraction of depth (0 < float < 1, rounded
    half-up), so one config works on 32-, 40- and 4-block models: FastVAR's 3 of 32 is 0.09375.
    """
    def count(v):
        if 0 < v < 1:
            return int(math.floor(depth * v + 0.5))
        if v < 0 or v != int(v):
            raise ValueError(f"block protection must be a count (0, 1, 2, ...) or a fraction in (0, 1), got {v}")
        return int(v)

    first, last = count(protect_first), count(protect_last)
    if first + last >= depth:
        raise ValueError(f"protect_first={protect_first}, protect_last={protect_last} leave no prunable block on a "
                         f"{depth}-block model; use fractions of depth (e.g. 0.09375 = 3/32) or smaller counts")
    return range(first, depth - last)


def n_keep_from_ratio(n_tokens: int, ratio: float) -> int:
    """FastVAR's count: kept = L - int(L * ratio) (floor of the pruned count)."""
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"prune ratio must be in [0, 1], got {ratio}")
    return n_tokens - int(n_tokens * ratio)


def round_keep(n_tokens: int, expected_keep: float, multiple: int) -> int:
    """Static kept count: the expected count rounded up to `multiple` (shape-friendly), within 1..L."""
    k = int(torch.ceil(torch.tensor(float(expected_keep))).item())
    if multiple > 1:
        k = -(-k // multiple) * multiple
    return max(1, min(n_tokens, k))


def cond_rows(t: torch.Tensor, ctx: GenerationContext) -> torch.Tensor:
    """The conditional rows (first B) of a (rows, ...) tensor; all rows without CFG."""
    return t[: ctx.batch] if ctx.cfg_rows and t.shape[0] == ctx.rows else t


def expand_to_rows(idx: torch.Tensor, ctx: GenerationContext) -> torch.Tensor:
    """(B, K) per-prompt indices -> (rows, K): the uncond half reuses its prompt's choice."""
    return torch.cat([idx, idx], 0) if ctx.cfg_rows else idx


def reduce_batch(values: Iterable[float], how: str) -> float:
    """One number for a batch that shares a plan: earliest/min, median, latest/max, mean."""
    v = sorted(float(x) for x in values)
    if not v:
        raise ValueError("reduce_batch got no values")
    if how in ("earliest", "min"):
        return v[0]
    if how in ("latest", "max"):
        return v[-1]
    if how == "median":
        return v[(len(v) - 1) // 2]  # lower median: an actual member, no half-scales
    if how == "mean":
        return sum(v) / len(v)
    raise ValueError(f"batch reduction must be earliest, median, latest or mean; got {how!r}")
