"""Self-attention under an `AttnPlan`: the pure-PyTorch reference of sparse attention (any device).

The runtime calls `plan_attention` in place of the dense attention for blocks whose plan is not
"dense". Shapes are fixed by the plan (keys per query group, mask blocks), so a step stays
capturable as a CUDA graph. On CUDA a block mask runs through FlexAttention when it is available
(`varbench.engine.kernels.flex_block_mask`), so its sparsity is real speed; everything else is a
gather + SDPA per query group, whose cost scales with the keys kept, not the cache.

Numerics follow SparVAR's release (Weepingchestnut/Lvar, models/sparvar/sparse_attn.py):
- column sums of the softmax over a query group in fp32 (the release's Triton colsum kernel keeps
  them fp32; its naive reference casts them to bf16, which can reorder near-ties: we follow the
  kernel the release runs);
- the sparse attention is renormalised over the kept keys (its `csp_attn` divides by its own sum);
- O_cache = O - O_hat and the upsampled O_cache + O_sparse are added in the attention's dtype;
- O_cache is upsampled bilinearly, `align_corners=False`, on the (h, w) grid.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import torch
import torch.nn.functional as F

from varbench.engine.plan import AttnPlan


@dataclasses.dataclass
class AttnMemory:
    """What a "decide" (or remembering "indexed") step leaves for the block's later scales.

    indices: (rows, H, G, K) long cache positions per query group; o_cache: (rows, H, n, c) the
    deciding scale's O - O_hat in the attention's dtype; grid: the deciding scale's (h, w) (for
    the upsampling); group: queries per group when the indices were made.
    """

    indices: torch.Tensor
    o_cache: Optional[torch.Tensor]
    grid: tuple[int, int]
    group: int

    def first_rows(self, rows: int) -> "AttnMemory":
        """The memory of the first `rows` rows (the conditional half once the unconditional is dropped)."""
        if self.indices.shape[0] == rows:
            return self
        return dataclasses.replace(self, indices=self.indices[:rows],
                                   o_cache=None if self.o_cache is None else self.o_cache[:rows])

    def take_rows(self, rows: list[int]) -> "AttnMemory":
        """The memory of these rows (a batch split into per-image parts)."""
        idx = torch.tensor(rows, device=self.indices.device)
        return dataclasses.replace(self, indices=self.indices.index_select(0, idx),
                                   o_cache=None if self.o_cache is None else self.o_cache.index_select(0, idx))

    def nbytes(self) -> int:
        return self.indices.nelement() * self.indices.element_size() + (
            0 if self.o_cache is None else self.o_cache.nelement() * self.o_cache.element_size())

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.indices,) if self.o_cache is None else (self.indices, self.o_cache)


def _grouped(q: torch.Tensor, group: int) -> torch.Tensor:
    """(rows, H, n, c) -> (rows, H, G, group, c), the last group zero-padded."""
    rows, heads, n, c = q.shape
    g = -(-n // group)
    if g * group != n:
        q = F.pad(q, (0, 0, 0, g * group - n))
    return q.view(rows, heads, g, group, c)


def group_column_sums(q: torch.Tensor, k: torch.Tensor, group: int) -> torch.Tensor:
    """(rows, H, n, c) x (rows, H, L, c) -> (rows, H, G, L) fp32: per query group, the sum over its
    queries of softmax(q k^T) (scale 1: q carries the cosine scale). One group at a time, so only
    group x L scores per (row, head) are held."""
    qg = _grouped(q, group)
    n = q.shape[2]
    out = []
    kf = k.float().transpose(-1, -2)
    for gi in range(qg.shape[2]):
        real = min(group, n - gi * group)
        s = qg[:, :, gi, :real].float() @ kf
        out.append(s.softmax(-1).sum(2))
    return torch.stack(out, dim=2)


def gathered_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, indices: torch.Tensor,
                       group: int) -> torch.Tensor:
    """Attention of each query group over its own keys, renormalised over them.

    q (rows, H, n, c); k, v (rows, H, L, c); indices (rows, H, G, K) cache positions.
    Returns (rows, H, n, c) in v's dtype. Duplicate positions count twice, as in the release's kernel.
    Each (row, head, group) is one 4-D SDPA batch entry (so CUDA takes its flash kernel), and rows go
    in chunks whose gathered keys take no more memory than the cache itself (a group's keys are
    copied out; K x G can be several times L)."""
    rows, heads, n, c = q.shape
    qg = _grouped(q.to(v.dtype), group)                                  # (rows, H, G, group, c)
    G, K = indices.shape[2], indices.shape[3]
    chunk = max(1, (rows * k.shape[2]) // (G * K))
    out = []
    for r0 in range(0, rows, chunk):
        r1 = min(rows, r0 + chunk)
        flat = indices[r0:r1].reshape(r1 - r0, heads, G * K, 1).expand(-1, -1, -1, c)
        kg = k[r0:r1].gather(2, flat).view((r1 - r0) * heads * G, K, c)
        vg = v[r0:r1].gather(2, flat).view((r1 - r0) * heads * G, K, c)
        qc = qg[r0:r1].reshape(1, (r1 - r0) * heads * G, group, c)
        o = F.scaled_dot_product_attention(qc, kg.unsqueeze(0), vg.unsqueeze(0), scale=1.0)
        out.append(o.view(r1 - r0, heads, G * group, c)[:, :, :n])
    return out[0] if len(out) == 1 else torch.cat(out, dim=0)


def map_groups(indices: torch.Tensor, groups: int) -> torch.Tensor:
    """Each of `groups` query groups takes the remembered group whose centre is nearest its own
    (centres at (g + 0.5) / G on both grids, rounded half to even, as the release's torch.round)."""
    src = indices.shape[2]
    centres = torch.arange(groups, dtype=torch.float32, device=indices.device) + 0.5
    pick = torch.round(centres / groups * src - 0.5).to(torch.int64).clamp_(0, src - 1)
    return indices.index_select(2, pick)


def upsample_o_cache(o_cache: torch.Tensor, src: tuple[int, int], dst: tuple[int, int]) -> torch.Tensor:
    """(rows, H, hs*ws, c) on the grid `src` -> (rows, H, h*w, c) on `dst`, bilinear, align_corners=False."""
    rows, heads, _, c = o_cache.shape
    x = o_cache.contiguous().view(rows * heads, src[0], src[1], c).permute(0, 3, 1, 2)
    x = F.interpolate(x, size=dst, mode="bilinear", align_corners=False)
    return x.permute(0, 2, 3, 1).reshape(rows, heads, dst[0] * dst[1], c).to(o_cache.dtype)


def token_mask(block_mask: torch.Tensor, block: int, n: int, length: int) -> torch.Tensor:
    """(q_blocks, k_blocks) bool -> (n, length) bool: every token pair inside an allowed block."""
    return block_mask.repeat_interleave(block, 0).repeat_interleave(block, 1)[:n, :length]


def decide(q, k, v, ap: AttnPlan) -> tuple[torch.Tensor, AttnMemory, dict]:
    """Dense output (the baseline's own SDPA call) and what later scales reuse."""
    o = F.scaled_dot_product_attention(q.to(k.dtype), k, v, scale=1.0)
    cs = group_column_sums(q, k, ap.group)
    indices = torch.topk(cs, ap.n_keys, dim=-1).indices
    o_cache = None
    if ap.use_o_cache:
        o_cache = o - gathered_attention(q, k, v, indices, ap.group)
    n, length = q.shape[2], k.shape[2]
    counts = {"attn_pairs": n * length, "attn_extra_pairs": n * length + n * ap.n_keys * 2}
    return o, AttnMemory(indices, o_cache, None, ap.group), counts


def indexed(q, k, v, ap: AttnPlan, memory: AttnMemory, grid: tuple[int, int]) -> tuple[torch.Tensor, dict, Optional[AttnMemory]]:
    """Sparse output from a block's memory and this scale's local keys."""
    rows, heads, n, _ = q.shape
    memory = memory.first_rows(rows)
    groups = -(-n // ap.group)
    idx = map_groups(memory.indices, groups)
    if ap.local is not None:
        local = ap.local.to(idx.device, idx.dtype)
        idx = torch.cat([idx, local.expand(rows, heads, -1, -1)], dim=-1)
    o = gathered_attention(q, k, v, idx, ap.group)
    if ap.use_o_cache and memory.o_cache is not None:
        o = upsample_o_cache(memory.o_cache, memory.grid, grid) + o
    kept = dataclasses.replace(memory, indices=idx, group=ap.group) if ap.remember else None
    return o, {"attn_pairs": n * idx.shape[-1]}, kept


def masked(q, k, v, ap: AttnPlan) -> tuple[torch.Tensor, dict]:
    """Attention restricted to the plan's blocks (every query keeps at least one block: the release's
    sink). FlexAttention on CUDA when available (the sparsity is skipped work there); else SDPA with
    the token mask (the reference: same math, dense cost)."""
    n, length = q.shape[2], k.shape[2]
    if q.device.type == "cuda":
        from varbench.engine.kernels.flex_block_mask import flex_block_attention

        o = flex_block_attention(q.to(k.dtype), k, v, ap.block_mask, ap.block)
    else:
        mask = token_mask(ap.block_mask.to(q.device), ap.block, n, length)
        o = F.scaled_dot_product_attention(q.to(k.dtype), k, v, attn_mask=mask, scale=1.0)
    return o, {"attn_pairs": ap.pairs if ap.pairs is not None else mask_pairs(ap.block_mask.cpu(), ap.block, n, length)}


def mask_pairs(block_mask: torch.Tensor, block: int, n: int, length: int) -> int:
    """(query, key) pairs a block mask allows over n queries and `length` keys (edge blocks are cut)."""
    rows = torch.full((block_mask.shape[0],), block)
    rows[-1] = n - block * (block_mask.shape[0] - 1)
    cols = torch.full((block_mask.shape[1],), block)
    cols[-1] = length - block * (block_mask.shape[1] - 1)
    return int((block_mask.long() * rows[:, None] * cols[None, :]).sum())


def plan_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ap: AttnPlan, memory: Optional[AttnMemory],
                   grid: tuple[int, int]) -> tuple[torch.Tensor, dict, Optional[AttnMemory]]:
    """Self-attention of one block under `ap`, given the block's `memory` (None before its first
    decision). Returns the output (rows, H, n, c), counts for the trace (`attn_pairs`: (query, key)
    pairs scored per row; `attn_extra_pairs`: the decision's extra passes) and the block's new
    memory (None: unchanged)."""
    if ap.kind == "decide":
        o, mem, counts = decide(q, k, v, ap)
        return o, counts, dataclasses.replace(mem, grid=grid)
    if ap.kind == "indexed":
        if memory is None:
            raise ValueError("an 'indexed' attention plan needs an earlier 'decide' for the same block")
        return indexed(q, k, v, ap, memory, grid)
    if ap.kind == "block_mask":
        o, counts = masked(q, k, v, ap)
        return o, counts, None
    return F.scaled_dot_product_attention(q.to(k.dtype), k, v, scale=1.0), {}, None


def check_attention_plans(plan, si: int, n: int, depth: int, kv_len: list[int]) -> None:
    """One scale's attention plans against the model and the cache (before the step runs)."""
    for bi, ap in plan.attn.items():
        if not 0 <= bi < depth:
            raise ValueError(f"attention plan for scale {si} names block {bi}; the model has blocks 0..{depth - 1}")
        bp = plan.blocks.get(bi)
        if ap.kind != "dense" and bp is not None and bp.mode == "prune" and "sa" in bp.sublayers:
            raise ValueError(f"scale {si} block {bi}: a {ap.kind!r} attention plan needs every query of the scale; "
                             "the block's plan prunes self-attention tokens")
        if ap.kind != "dense" and bi in plan.kv:
            raise ValueError(f"scale {si} block {bi}: an attention plan and a KV budget on one block are not supported "
                             "(the budget moves the cache positions the plan's keys name)")
        ap.validate(n, kv_len[bi] + n)
