"""Bit sampling as released: temperature, CFG on logits, top-k / top-p per bit, seeded draws.

Per image, one `torch.Generator` seeded with that image's seed is consumed exactly as the released
`autoregressive_infer_cfg` consumes its generator at batch 1: one `torch.multinomial` call over the
(L*d, 2) bit distributions of the scale. Drawing per image keeps an image independent of its batch
size and neighbours.
"""
from __future__ import annotations

import torch


def guided_logits(logits: torch.Tensor, batch: int, cfg: float, tau: float, cfg_rows: bool) -> torch.Tensor:
    """logits (rows, L, 2d) -> tempered, guided (B, L, 2d): tau before the CFG mix, as released."""
    if cfg_rows and cfg != 1:
        logits = logits.mul(1 / tau)
        return cfg * logits[:batch] + (1 - cfg) * logits[batch:]
    return logits[:batch].mul(1 / tau)


def filter_top_k_top_p_(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """In-place top-k/top-p masking of logits (..., V) as the released sampler does it.

    With V = 2 per bit, top_k >= 2 is a no-op, and top_p = 0.97 removes the minority bit whenever its
    probability is <= 0.03 (sorted ascending, cumulative softmax <= 1 - top_p is removed, the largest
    always kept).
    """
    v = logits.shape[-1]
    if top_k > 0:
        k = min(top_k, v)
        kth = logits.topk(k, largest=True, sorted=False, dim=-1)[0].amin(dim=-1, keepdim=True)
        logits.masked_fill_(logits < kth, -torch.inf)
    if top_p > 0:
        sorted_logits, sorted_idx = logits.sort(dim=-1, descending=False)
        remove = sorted_logits.softmax(dim=-1).cumsum_(dim=-1) <= (1 - top_p)
        remove[..., -1:].fill_(False)   # not `= False`: that lifts a host scalar into a tensor first
        logits.masked_fill_(remove.scatter(sorted_idx.ndim - 1, sorted_idx, remove), -torch.inf)
    return logits


def sample_bits(guided: torch.Tensor, generators: list[torch.Generator | None], top_k: int, top_p: float) -> torch.Tensor:
    """guided (B, L, 2d) -> sampled bits (B, L, d) int64, one multinomial call per image."""
    b, l, v2 = guided.shape
    per_bit = guided.reshape(b, -1, 2).clone()
    filter_top_k_top_p_(per_bit, top_k, top_p)
    probs = per_bit.softmax(dim=-1)
    draws = [torch.multinomial(probs[i].view(-1, 2), num_samples=1, replacement=True, generator=generators[i])
             for i in range(b)]
    return torch.stack(draws).view(b, l, v2 // 2)


def bit_entropy(guided: torch.Tensor) -> torch.Tensor:
    """Per-token predictive entropy (B, L): mean over bits of the binary entropy, in nats."""
    lp = guided.reshape(*guided.shape[:2], -1, 2).float().log_softmax(dim=-1)
    return -(lp.exp() * lp).sum(-1).mean(-1)


