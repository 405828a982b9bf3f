"""Block-sparse attention on CUDA through `torch.nn.attention.flex_attention`.

SparVAR's CSLA layers attend to a static set of 128 x 128 blocks (a sink plus a local window per
earlier scale). FlexAttention skips the blocks a `BlockMask` leaves out, so the sparsity is time
saved, not a masked dense product. The block mask is built once per (mask tensor, lengths) from
the block-level boolean pattern; every token pair of a listed block is allowed (as in the release's
block-dilated mask), and the sequence lengths cut the edge blocks. The release builds the same mask
with `create_block_mask` over a per-token lookup, which lists every block as partial; listing them
as full skips the per-pair mask call in the kernel (same pairs).

`flex_attention` is compiled once per process (`torch.compile`, dynamic=False, as the release
does); the first call per shape pays the compile.
"""
from __future__ import annotations

import torch

_COMPILED = None
_MASKS: dict = {}


def block_mask_from_pattern(pattern: torch.Tensor, block: int, q_len: int, kv_len: int, device):
    """(q_blocks, k_blocks) bool (any device) -> a FlexAttention `BlockMask` on `device`, built once per
    pattern tensor. The cache holds the pattern itself, so its address cannot be reused by another
    tensor while the entry lives (plans keep their patterns for the whole run anyway)."""
    from torch.nn.attention.flex_attention import BlockMask

    key = (pattern.data_ptr(), pattern.device, tuple(pattern.shape), block, q_len, kv_len, str(device))
    hit = _MASKS.get(key)
    if hit is not None:
        return hit[1]
    pat = pattern.to(device=device, dtype=torch.bool)
    num = pat.sum(-1, dtype=torch.int32)[None, None]                                  # (1, 1, QB)
    idx = torch.argsort((~pat).to(torch.int8), dim=-1, stable=True).to(torch.int32)[None, None]

    # every listed block is "full" (the compiled kernel reads all its pairs without calling
    # mask_mod); mask_mod is the same pattern looked up per token pair, which FlexAttention's
    # eager path (and any partial edge handling) evaluates
    def lookup(b, h, q_idx, kv_idx):
        return pat[q_idx // block, kv_idx // block]

    empty = torch.zeros_like(num)
    mask = BlockMask.from_kv_blocks(empty, idx, num, idx, BLOCK_SIZE=block, mask_mod=lookup,
                                    seq_lengths=(q_len, kv_len))
    _MASKS[key] = (pattern, mask)
    return mask


def flex_block_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pattern: torch.Tensor,
                         block: int) -> torch.Tensor:
    """Attention (scale 1: q carries the cosine scale) over the blocks `pattern` allows."""
    global _COMPILED
    from torch.nn.attention.flex_attention import flex_attention

    if _COMPILED is None:
        _COMPILED = torch.compile(flex_attention, dynamic=False)
    mask = block_mask_from_pattern(pattern, block, q.shape[2], k.shape[2], q.device)
    return _COMPILED(q, k, v, block_mask=mask, scale=1.0)
