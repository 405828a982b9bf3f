"""Residual caches of earlier scales, read back at a later one (`fill="cache"`).

A scale run with `keep_residuals` stores each block's gated branch outputs (`state.residuals[scale]`,
keyed by (block, sublayer)); a later scale's pruned sublayer fills its pruned positions from the
nearest (or the chosen) one, area-resized to its grid. Any state with `residuals` and `sched` (every
backbone's) reads them here.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def cached_branch(state, si, bi, sub, rows, cache_from) -> torch.Tensor:
    """The branch output cached at `cache_from` (default: the nearest earlier scale that kept
    residuals), area-resized to this scale's grid."""
    src = cache_from
    if src is None:
        src = next((c for c in sorted(state.residuals, reverse=True) if c < si and (bi, sub) in state.residuals[c]), None)
    return _resize_cached(state, si, bi, sub, rows, src)


def _resize_cached(state, si, bi, sub, rows, src) -> torch.Tensor:
    if src is None or (bi, sub) not in state.residuals.get(src, {}):
        raise ValueError(f"scale {si} block {bi}: fill='cache' needs an earlier scale run with keep_residuals=True "
                         f"(none found for sublayer {sub}); set keep_residuals on the cache scale or use fill='pass'")
    cached = state.residuals[src][(bi, sub)][:rows]
    hs, ws = state.sched[src]
    h, w = state.sched[si]
    c = cached.shape[-1]
    grid = cached.transpose(1, 2).reshape(rows, c, hs, ws)
    return F.interpolate(grid, size=(h, w), mode="area").reshape(rows, c, h * w).transpose(1, 2)
