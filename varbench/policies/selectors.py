"""Token choice: the live FastVAR selector and the score-map helpers the entropy methods use.

Indices always refer to the scale's own h*w grid in row-major order and are returned sorted
ascending per row (a set, not a ranking: the runtime scatters them back, and sorted indices make the
kept subset independent of tie order inside topk).
"""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from varbench.engine.plan import SelectorContext


def topk_indices(score: torch.Tensor, k: int, largest: bool = True) -> torch.Tensor:
    """(rows, L) score -> (rows, k) sorted indices of the k largest (or smallest) entries."""
    idx = torch.topk(score, k, dim=-1, largest=largest, sorted=False).indices
    return idx.sort(dim=-1).values


@dataclasses.dataclass(frozen=True)
class PivotalSelector:
    """FastVAR's pivotal-token selection, run before each pruned sublayer on the live stream x.

    score_i = ||x_i - mean_j x_j||^2 (distance from the scale's mean token, i.e. its DC component);
    the `n_keep` highest-scoring tokens are kept.

    cfg_selection:
      "per_row" - every row (cond and uncond halves alike) ranks its own tokens: as released.
      "cond"    - the cond row's choice is reused by its uncond row (one mask per prompt; the two
                  halves then prune the same positions, which keeps their residual maps aligned).
    """

    n_keep: int
    cfg_selection: str = "per_row"

    def __call__(self, x: torch.Tensor, sctx: SelectorContext) -> torch.Tensor:
        xf = x.float()
        score = (xf - xf.mean(dim=1, keepdim=True)).pow(2).sum(-1)
        if self.cfg_selection == "cond" and sctx.cfg_rows:
            b = sctx.batch
            idx = topk_indices(score[:b], self.n_keep)
            return torch.cat([idx, idx], 0)
        return topk_indices(score, self.n_keep)


def upsample_map(m: torch.Tensor, src_hw: tuple[int, int], dst_hw: tuple[int, int], mode: str = "area") -> torch.Tensor:
    """(rows, h*w) map on grid src_hw -> (rows, H*W) on grid dst_hw.

    "area" is torch's area mode (adaptive average pooling: what FastVAR uses to resize its cache;
    on an integer upsampling factor it repeats values); "nearest" copies; "bilinear" blends.
    """
    if tuple(src_hw) == tuple(dst_hw):
        return m
    rows = m.shape[0]
    img = m.float().reshape(rows, 1, *src_hw)
    if mode == "area":
        out = F.interpolate(img, size=dst_hw, mode="area")  # torch's area = FastVAR's cache resize
    elif mode == "nearest":
        out = F.interpolate(img, size=dst_hw, mode="nearest")
    elif mode == "bilinear":
        out = F.interpolate(img, size=dst_hw, mode="bilinear", align_corners=False)
    else:
        raise ValueError(f"upsample mode must be area, nearest or bilinear; got {mode!r}")
    return out.reshape(rows, dst_hw[0] * dst_hw[1])


def binary_entropy_from_logits(logits: torch.Tensor, reduce: str = "mean") -> torch.Tensor:
    """(B, L, d, 2) 2-way logits per bit -> (B, L) entropy in nats, mean or sum over the d bits."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    h = -(logp.exp() * logp).sum(-1)
    if reduce == "mean":
        return h.mean(-1)
    if reduce == "sum":
        return h.sum(-1)
    raise ValueError(f"entropy reduce must be mean or sum; got {reduce!r}")


def complete_map(values: torch.Tensor, positions: torch.Tensor | None, n_tokens: int,
                 previous: torch.Tensor | None) -> torch.Tensor:
    """A full (rows, L) map from per-query values measured at `positions` only.

    A pruned block (or a query subsample) reports entropies for some queries; the rest take the
    `previous` map (already resized to this grid), or the row mean of the measured values if there
    is none. values/positions: (rows, K); positions None means the K values are the whole grid.
    """
    values = values.float().cpu()
    if positions is None or values.shape[-1] == n_tokens and previous is None:
        if values.shape[-1] != n_tokens:
            raise ValueError(f"got {values.shape[-1]} values for {n_tokens} tokens and no positions")
        return values
    positions = positions.to(torch.long).cpu()
    rows = values.shape[0]
    if positions.shape[0] != rows:
        positions = positions[:rows] if positions.shape[0] > rows else positions.expand(rows, -1)
    if previous is not None and previous.shape == (rows, n_tokens):
        base = previous.float().clone()
    else:
        base = values.mean(-1, keepdim=True).expand(rows, n_tokens).clone()
    return base.scatter(1, positions, values)
