"""The exact attention entropy: the reference every faster path is held to.

A plan may ask for the per-query entropy of a block's self-attention (ToProVAR's depth and token
scores, NOVA's activation scale). On CUDA the runtime takes it from the attention pass itself
(`varbench.engine.kernels.flash_entropy`, the fused kernel); elsewhere, and as that kernel's
fallback and test oracle, it is computed here in fp32, exactly up to summation order.
"""
from __future__ import annotations

from typing import Optional

import torch


def attention_entropy(q: torch.Tensor, k: torch.Tensor, chunk: int = 1024,
                      key_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Exact per-query entropy of softmax(q k^T) (scale 1: q carries the cosine scale), mean over heads.

    H = logsumexp(s) - sum softmax(s) * s, evaluated in query chunks so the full L x L attention
    matrix is never held; (rows, H, Lq, c) x (rows, H, Lk, c) -> (rows, Lq). `chunk` trades peak
    memory (chunk x Lk scores per row and head) against the number of matmuls. `key_mask`
    (rows, 1, 1, Lk) additive bias, 0 or -inf: only the keys at 0 are attended (a padded batch,
    `KVCache.key_mask`).
    """
    out = []
    for s0 in range(0, q.shape[2], chunk):
        s = q[:, :, s0:s0 + chunk].float() @ k.float().transpose(-1, -2)
        if key_mask is not None:   # masked keys weigh exactly 0; the weighted sum reads their finite raw score
            sb = s + key_mask
            lse = sb.logsumexp(-1)
            out.append(lse - (sb - lse.unsqueeze(-1)).exp().mul(s).sum(-1))
            continue
        lse = s.logsumexp(-1)
        out.append(lse - (s - lse.unsqueeze(-1)).exp().mul(s).sum(-1))
    return torch.cat(out, dim=2).mean(1)
