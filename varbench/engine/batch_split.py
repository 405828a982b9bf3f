"""Per-image decisions at any batch size: sub-batches that share a plan.

An adaptive method (NOVA's activation scale, ToProVAR's depth, SkipVAR's action) decides per image,
as its release does at batch 1. With `batch_rule: per_image` (the default of every adaptive method)
the runtime gives each image its own copy of the policy, reset for a batch of one, and at every scale:

  1. asks each image's policy for its plan;
  2. groups the images whose plans have the same *shape* (`plan_signature`: which scales run,
     which blocks are skipped or pruned to how many tokens, fills, guidance, entropy requests) and
     merges each group's plans into one (`merge_plans`: the kept indices stack row by row);
  3. runs each group as one sub-batch: where a group splits, its generation state splits too
     (`GenState.split`: the KV-cache rows, text constants, residual caches, codes and generators
     follow their images; the caches are permuted in place and viewed, never copied), and the
     sub-batches continue apart for the rest of the generation;
  4. hands each image's policy the signals of its own rows (`select_signals`).

Images that agree keep sharing a batch, so a batch whose images all decide alike runs exactly as
before. Each (scale, plan, sub-batch size) still has static shapes. An image's bits then equal
those it gets alone up to the rounding of batched matmuls (measured in tests/engine/test_batch_split.py).
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import torch

from varbench.engine.plan import BlockPlan, ScalePlan, ScaleSignals


def _selector_key(selector) -> object:
    if selector is None:
        return None
    if dataclasses.is_dataclass(selector):
        return (type(selector).__qualname__, dataclasses.astuple(selector))
    return id(selector)  # an opaque callable only groups with itself


def plan_signature(plan: ScalePlan) -> tuple:
    """Everything about a plan except its kept indices: plans with equal signatures run as one batch."""
    blocks = tuple((bi, bp.mode, bp.n_keep if bp.mode == "prune" else 0, tuple(bp.sublayers), bp.fill, bp.cache_from,
                    bp.prune_kv, bp.keep is None, _selector_key(bp.selector))
                   for bi, bp in sorted(plan.blocks.items()) if bp.mode != "full")
    kv = tuple((bi, kb.n_keep, kb.keep is None, _selector_key(kb.selector)) for bi, kb in sorted(plan.kv.items()))
    return (plan.run, blocks, plan.keep_residuals, tuple(sorted(plan.attention_entropy_for)),
            plan.attention_entropy_queries, tuple(sorted(plan.release_residuals)), plan.cfg, plan.tau, plan.drop_uncond, kv)


def group_by_plan(plans: Sequence[ScalePlan]) -> list[list[int]]:
    """Positions of `plans` grouped by signature, groups in order of their first member."""
    groups: dict[tuple, list[int]] = {}
    for i, p in enumerate(plans):
        groups.setdefault(plan_signature(p), []).append(i)
    return list(groups.values())


def image_rows(images: Sequence[int], batch: int, rows: int) -> list[int]:
    """Row positions of `images` in a (rows, ...) tensor of a batch of `batch` images: with CFG
    rows are [cond_0 .. cond_{B-1}, uncond_0 .. uncond_{B-1}], else one row per image."""
    if rows == 2 * batch:
        return list(images) + [batch + i for i in images]
    if rows != batch:
        raise ValueError(f"a tensor of {rows} rows does not belong to a batch of {batch} images")
    return list(images)


def take_rows(t: torch.Tensor, images: Sequence[int], batch: int, dim: int = 0) -> torch.Tensor:
    """The rows of `images` (see `image_rows`) along `dim`; a view when they are contiguous."""
    rows = image_rows(images, batch, t.shape[dim])
    if rows == list(range(rows[0], rows[0] + len(rows))):
        return t.narrow(dim, rows[0], len(rows))
    return t.index_select(dim, torch.tensor(rows, device=t.device))


def _merge_keep(keeps: Sequence[torch.Tensor], cfg_rows: bool) -> torch.Tensor:
    """Per-image kept indices ((1, K), or (2, K) as [cond; uncond] under CFG) -> one (rows, K) tensor
    in the runtime's row order."""
    if not cfg_rows or all(k.shape[0] == 1 for k in keeps):
        return torch.cat(list(keeps))   # one row per image (the runtime repeats it for the uncond half)
    two = [k.expand(2, -1) if k.shape[0] == 1 else k for k in keeps]
    return torch.cat([k[:1] for k in two] + [k[1:] for k in two])


def merge_plans(plans: Sequence[ScalePlan], cfg_rows: bool) -> ScalePlan:
    """One plan for images whose plans share a signature (kept indices stacked by image)."""
    first = plans[0]
    if len(plans) == 1:
        return first
    blocks: dict[int, BlockPlan] = {}
    for bi, bp in first.blocks.items():
        if bp.keep is not None:
            bp = dataclasses.replace(bp, keep=_merge_keep([p.blocks[bi].keep for p in plans], cfg_rows))
        blocks[bi] = bp
    kv = {bi: (dataclasses.replace(kb, keep=_merge_keep([p.kv[bi].keep for p in plans], cfg_rows)) if kb.keep is not None else kb)
          for bi, kb in first.kv.items()}
    return dataclasses.replace(first, blocks=blocks, kv=kv)


def select_signals(sig: ScaleSignals, image: int, batch: int) -> ScaleSignals:
    """The signals of one image of a (sub-)batch of `batch` images, as that image would get them alone."""
    one = [image]

    def rows(t):
        return None if t is None else take_rows(t, one, batch)

    return dataclasses.replace(
        sig, token_entropy=rows(sig.token_entropy), logits=rows(sig.logits), cond_logits=rows(sig.cond_logits),
        attention_entropy={b: rows(e) for b, e in sig.attention_entropy.items()},
        attention_query_index=({b: rows(p) for b, p in sig.attention_query_index.items()}
                               if isinstance(sig.attention_query_index, dict) else rows(sig.attention_query_index)),
        summed_codes=rows(sig.summed_codes))


def scatter_images(parts: Sequence[tuple[Sequence[int], Optional[torch.Tensor]]], batch: int,
                   fill: float) -> Optional[torch.Tensor]:
    """Join per-group tensors (rows = the group's images) into one (batch, ...) tensor; images of a
    group without a tensor (it skipped that scale) get `fill`. None if no group has one."""
    have = [(imgs, t) for imgs, t in parts if t is not None]
    if not have:
        return None
    if len(parts) == 1:
        return have[0][1]
    t0 = have[0][1]
    out = t0.new_full((batch, *t0.shape[1:]), fill)
    for imgs, t in have:
        out.index_copy_(0, torch.tensor(list(imgs), device=t.device), t)
    return out
