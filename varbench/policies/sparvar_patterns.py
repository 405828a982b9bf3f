"""SparVAR's static sparsity patterns, built once per schedule (no model, no weights).

Everything here is a function of the schedule and the knobs, as in the release
(Weepingchestnut/Lvar @ f94b7ecc, models/sparvar/sparse_attn.py and basic_sparvar.py), where the
same patterns are built at model construction for the square 1M schedule:

- `kept_key_count`: the keys each query group keeps at the decision scale (`top_keys` of the
  cache, rounded to the kernel's multiple with Python's `round`, half to even, as the release does);
- `local_band`: CS4A's local prior at an indexed scale: each query's ws x ws window of the scale's
  own tokens (clamped at the edges), united over a query group, counted up to the kernel's multiple,
  every group widened to the largest count, then taken as one contiguous band of cache positions
  starting at the group's first window key (shifted left where it would pass the cache's end);
- `csla_block_mask`: CSLA's mask for one query scale: a sink (every key of the first `sink` scales)
  plus, per key scale k, the keys within Chebyshev distance win[k] // 2 of the query's centre
  round(y / H_q * H_k) (fp32, half to even, as `torch.round` in the release's mask function; a
  window of -1 keeps none of that scale), then dilated to `block` x `block` blocks.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch


def cumulative_tokens(schedule: Sequence[tuple[int, int]]) -> list[int]:
    """[0, n_0, n_0 + n_1, ...]: where each scale's keys start in the cache."""
    out = [0]
    for h, w in schedule:
        out.append(out[-1] + h * w)
    return out


def kept_key_count(top_keys: float, cache_len: int, multiple_of: int) -> int:
    """Keys kept per query group at the decision scale (release: `int(m * round(top_keys * L / m))`)."""
    return int(multiple_of * round((top_keys * cache_len) / multiple_of))


def _ceil_to(x: int, m: int) -> int:
    return x if m <= 1 else -(-x // m) * m


def window_keys(h: int, w: int, ws: int, base: int) -> torch.Tensor:
    """(h*w, ws*ws) cache positions: each token's ws x ws window of its own grid, clamped at the edges."""
    r = (ws - 1) // 2
    offs = torch.arange(-r, ws - r)
    ys = (torch.arange(h)[:, None, None, None] + offs[None, None, :, None]).clamp(0, h - 1)
    xs = (torch.arange(w)[None, :, None, None] + offs[None, None, None, :]).clamp(0, w - 1)
    return (ys * w + xs).reshape(h * w, ws * ws) + base


def local_band(schedule: Sequence[tuple[int, int]], si: int, ws: int, group: int, multiple_of: int) -> torch.Tensor:
    """(groups, count) long: CS4A's local keys of scale `si` per query group (module docstring)."""
    cum = cumulative_tokens(schedule)
    h, w = schedule[si]
    win = window_keys(h, w, ws, cum[si])
    n, kv_len = h * w, cum[si + 1]
    starts, counts = [], []
    for lo in range(0, n, group):
        u = torch.unique(win[lo:lo + group])
        starts.append(int(u[0]))
        counts.append(_ceil_to(int(u.numel()), multiple_of))
    count = max(counts)
    tails = torch.clamp(torch.tensor(starts) + count - 1, max=kv_len - 1)
    return (tails[:, None] - (count - 1)) + torch.arange(count)[None, :]


def csla_block_mask(schedule: Sequence[tuple[int, int]], si: int, sink_scales: int, win: Sequence[int],
                    block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """CSLA for query scale `si`: ((q_blocks, k_blocks) bool block mask, (n, L) bool token mask before
    the dilation). Keys are scales 0..si of the cache."""
    cum = cumulative_tokens(schedule[: si + 1])
    hq, wq = schedule[si]
    qy = torch.arange(hq * wq) // wq
    qx = torch.arange(hq * wq) % wq
    parts = []
    for k in range(si + 1):
        hk, wk = schedule[k]
        ky = torch.arange(hk * wk) // wk
        kx = torch.arange(hk * wk) % wk
        if k < sink_scales:
            parts.append(torch.ones(hq * wq, hk * wk, dtype=torch.bool))
            continue
        half = int(win[k]) // 2                    # Python floor: a window of -1 gives -1, so nothing
        cy = torch.round(qy.float() / hq * hk)
        cx = torch.round(qx.float() / wq * wk)
        near = ((cy[:, None] - ky[None, :]).abs() <= half) & ((cx[:, None] - kx[None, :]).abs() <= half)
        parts.append(near)
    token = torch.cat(parts, dim=1)
    n, length = token.shape
    qb, kb = math.ceil(n / block), math.ceil(length / block)
    padded = torch.zeros(qb * block, kb * block, dtype=torch.bool)
    padded[:n, :length] = token
    blocks = padded.view(qb, block, kb, block).permute(0, 2, 1, 3).any(-1).any(-1)
    return blocks, token
