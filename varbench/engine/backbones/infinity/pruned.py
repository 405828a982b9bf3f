"""One block under a plan: pruned sublayers and their fill, kept residuals, attention entropy.

A block whose plan is anything but the plain full block (`BlockPlan(mode="prune")`, a scale that
keeps residuals for a later cache fill, a block asked for attention entropy) runs here instead of
the lean `GenState.full_block`. Its full sublayers compute with the lean block's ops, so a neutral
plan reproduces the baseline bit for bit; its pruned sublayers run on the kept tokens only:

- self-attention: kept tokens query; with `prune_kv` only they make q, k, v (at their true RoPE
  positions), else every token gives K/V;
- cross-attention and FFN: on the kept tokens;
- the pruned positions are then filled: `fill="pass"` leaves them as they came in, `fill="cache"`
  adds the branch output cached at an earlier scale (`cache_from`, default the nearest one that
  kept residuals), area-resized to this grid.

Attention entropy (when asked): from the fused kernel on CUDA (`runtime.fused_entropy`, falling
back once to SDPA on failure), else the exact chunked pass (`varbench.engine.attention`), for every
query or `attention_entropy_queries` of them.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from varbench.engine.attention import attention_entropy
from varbench.engine.backbones.infinity.block_step import modulated_norm
from varbench.engine.plan import AttnPlan, BlockPlan, SelectorContext, entropy_query_pick
from varbench.engine.residuals import cached_branch
from varbench.engine.sparse_attention import plan_attention


def _gather_rows(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """x (rows, L, C), idx (rows, K) -> (rows, K, C)."""
    return x.gather(1, idx.unsqueeze(-1).expand(-1, -1, x.shape[-1]))


def planned_block(state, si, bi, x, bp: BlockPlan, counts, residual_store,
                  want_entropy: bool, entropy_queries: Optional[int], attn_ent: dict, attn_idx: dict,
                  entropy_sampling: str = "even", ap: Optional[AttnPlan] = None):
    """Block `bi` of scale `si` on the residual stream `x` (rows, n, C) of `state` (a `GenState`)
    under `bp`. Fills `counts` (executed tokens per sublayer), `residual_store` ((bi, sublayer) ->
    gated branch output, when the scale keeps residuals), and, with `want_entropy`, `attn_ent[bi]`
    (rows, queries) and `attn_idx[bi]` (their token positions). With an attention plan `ap` (not
    dense) the self-attention reads the keys it names (`varbench.engine.sparse_attention`) and the
    block's new attention memory goes to `state.attn_written[bi]`. Returns the new residual stream."""
    bc, ops = state.consts[bi], state.rt.block_ops   # ops: eager, or compiled (runtime.compile)
    h, w = state.sched[si]
    rows, n, _ = x.shape
    pruned = bp.mode == "prune"
    x_in = x

    def indices(sub):
        if not pruned or sub not in bp.sublayers:
            return None
        if bp.keep is not None:
            idx = bp.keep
        else:
            idx = bp.selector(x, SelectorContext(scale=si, block=bi, sublayer=sub, h=h, w=w, batch=state.batch,
                                                 cfg_rows=rows == 2 * state.batch))
        idx = idx.to(x.device)
        return idx[:rows] if idx.shape[0] >= rows else idx.repeat(rows // idx.shape[0], 1)

    # --- self-attention
    idx = indices("sa")
    xin = modulated_norm(x, bc.scale1, bc.shift1, bc.eps)
    table = state.rope[si]
    if idx is not None and bp.prune_kv:  # only kept tokens make q, k, v
        rot = ops.qkv_rope(bc, _gather_rows(xin, idx), table[idx])
        counts["qkv"] = idx.shape[1]
    else:
        rot = ops.qkv_rope(bc, xin, table)
        counts["qkv"] = n
    pad = bp.pad
    kk, vv = state.kv.append(bi, rot[1:], state.kv_dtype, None if pad is None else pad.kv_bias[:rows])
    key_mask = state.kv.key_mask(bi)
    state.kv_appended = idx if (idx is not None and bp.prune_kv) else None   # for a KV budget's selector
    q = rot[0]
    if idx is not None and not bp.prune_kv:  # every token gives K/V, kept tokens query
        q = q.gather(2, idx[:, None, :, None].expand(-1, q.shape[1], -1, q.shape[3]))
    qpos = idx
    counts["kv"] = kk.shape[2]
    fused = want_entropy and state.rt.fused_entropy and x.device.type == "cuda" and ap is None
    if fused:  # entropy of every query from the attention pass itself (ToProVAR's Flash Attention Entropy)
        from varbench.engine.kernels import flash_attention_with_entropy

        try:
            attn, ent_all = flash_attention_with_entropy(q.to(kk.dtype), kk, vv, scale=1.0, key_bias=key_mask)
        except Exception as err:  # noqa: BLE001 - Triton/driver/SM mismatch: SDPA + a second pass instead
            state.rt.fall_back("runtime.fused_entropy", err)
            fused = False
    if ap is not None:
        if key_mask is not None:
            raise ValueError(f"block {bi}: an attention plan cannot run on a padded batch's masked KV cache")
        attn, attn_counts, memory = plan_attention(q, kk, vv, ap, state.attn_memory.get(bi), (h, w))
        counts.update(attn_counts)
        if memory is not None:
            state.attn_written[bi] = memory
    elif not fused:
        attn = F.scaled_dot_product_attention(q.to(kk.dtype), kk, vv, attn_mask=key_mask, scale=1.0)
    if want_entropy and pad is not None and pad.ent_pick is not None:   # each image's own queries
        pick = pad.ent_pick[:rows]   # made per row ([cond; uncond]) with the plan, as every padding field
        sub_pos = pad.ent_pos[:rows]
        if fused:   # the kernel gave every query's entropy: each row takes its own picks
            attn_ent[bi] = ent_all.gather(1, pick)
        else:
            qp = q.gather(2, pick[:, None, :, None].expand(-1, q.shape[1], -1, q.shape[3]))
            attn_ent[bi] = attention_entropy(qp, kk, key_mask=key_mask)
        attn_idx[bi] = sub_pos
        counts["ent_q"] = sub_pos.shape[1]
    elif want_entropy:
        sub_pos = qpos if qpos is not None else torch.arange(n, device=x.device).expand(rows, -1)
        pick = None
        if entropy_queries is not None and entropy_queries < q.shape[2]:
            pick = entropy_query_pick(q.shape[2], entropy_queries, si, entropy_sampling, x.device)
            sub_pos = sub_pos[:, pick]
        if fused:
            attn_ent[bi] = ent_all if pick is None else ent_all[:, pick]
        else:
            attn_ent[bi] = attention_entropy(q if pick is None else q[:, :, pick], kk, key_mask=key_mask)
        attn_idx[bi] = sub_pos
        counts["ent_q"] = sub_pos.shape[1]
    counts["sa"] = q.shape[2]
    x = _apply_branch(state, si, bi, "sa", x, ops.sa_out(bc, attn), bc.g1, idx, bp, residual_store)

    # --- cross-attention
    idx = indices("ca")
    xq = x if idx is None else _gather_rows(x, idx)
    counts["ca"] = xq.shape[1]
    x = _apply_branch(state, si, bi, "ca", x, ops.cross_attention(bc, xq), None, idx, bp, residual_store)

    # --- FFN
    idx = indices("ffn")
    xq = x if idx is None else _gather_rows(x, idx)
    counts["ffn"] = xq.shape[1]
    x = _apply_branch(state, si, bi, "ffn", x, ops.ffn(bc, xq), bc.g2, idx, bp, residual_store)
    if pad is not None and pad.skip_rows is not None:   # images whose own plan skips the block leave it as they came
        x = torch.where(pad.skip_rows[:rows], x_in, x)
    return x



def _apply_branch(state, si, bi, sub, x, branch, gate, idx, bp: BlockPlan, residual_store):
    """x + gate * branch. Full sublayers compute it as the lean block does (bit for bit); pruned
    ones fill the pruned positions first (cached residual or nothing)."""
    if idx is None:
        if residual_store is not None:
            residual_store[(bi, sub)] = branch.float() if gate is None else branch.float().mul(gate)
        return x + branch if gate is None else torch.addcmul(x, branch, gate)
    rows, n, c = x.shape
    branch = branch.float() if gate is None else branch.float().mul(gate)
    slots = idx.unsqueeze(-1).expand(-1, -1, c)
    padding = None if bp.pad is None else bp.pad.padding_slots[:rows]
    if bp.fill == "pass":
        if padding is not None:   # padding slots add nothing: their tokens pass, as the image's own plan says
            branch = branch.masked_fill(padding, 0.0)
        return x.scatter_add(1, slots, branch)
    base = cached_branch(state, si, bi, sub, rows, bp.cache_from)
    if padding is not None:       # padding slots write back their own fill
        branch = torch.where(padding, base.gather(1, slots), branch)
    full = base.scatter(1, slots, branch)
    if residual_store is not None:
        residual_store[(bi, sub)] = full
    return x + full


