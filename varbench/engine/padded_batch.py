"""Per-image decisions without splitting the batch: plans of different shapes padded into one.

An adaptive method decides per image (NOVA's activation scale and per-layer kept counts,
ToProVAR's onset, layer skips and kept counts). `varbench.engine.batch_split` runs images whose
plans share a shape as one sub-batch; where they differ it splits, and at batch 8 NOVA ends up in
eight singletons: eight times the kernel launches of a shared plan for the same work. Here images
whose plans differ only in *how much* of a block runs share one step instead:

- per block, the images' modes (full / prune to k_i / skip) become one pruned step of
  n_keep = max k_i (a full image keeps all n, a skipped one none): each image's own kept tokens
  come first in its row, the rest of the row is padding (other tokens of its grid);
- padding slots compute but their results are dropped: the image's pruned tokens get the fill its
  own plan gives them (the cached residual, or nothing), and their K/V are masked out of this and
  every later attention (`KVCache.key_mask`), so every real query sees exactly its own keys;
- an image that skips the block leaves it as it entered, with every K/V it appended masked;
- attention entropy is measured per image on its own executed queries (`BlockPadding.ent_pick`),
  and each image observes only the signals its own plan asked for (`own_signals`).

So an image's kept tokens, keys and fills are those it has alone; its bits equal its run alone up
to the rounding of batched kernels (masked attention, the row count of a matmul), measured in
tests/engine/test_padded_batch.py. The price is the padding's compute: every image runs the
block's largest count. It is recorded per scale (trace `image_blocks`: each image's own counts,
from which its FLOPs come; the batch's `blocks` count what ran, padding included), so
`flops.total - sum(image totals)` is the padding's FLOPs.

What can share a padded step (`padded_plan` returns None otherwise and the batch splits as before):
plans that agree on everything but block modes, kept counts, `keep_residuals`, entropy requests
and released residuals; pruned blocks with fixed indices (`keep`) and the same sublayers, fill,
cache scale (given, not None) and `prune_kv`; no KV budgets, attention plans, post-block fills,
code masks or residual-change requests. Residuals are kept for the batch when any image keeps
them, and released once no image that kept them still holds them (`ResidualHolders`).
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import torch

from varbench.engine.plan import BlockPadding, BlockPlan, ScalePlan, ScaleSignals, entropy_query_pick

_FULL = BlockPlan()


def _shared_key(plan: ScalePlan) -> Optional[tuple]:
    """What every image of a padded step must agree on; None when the plan cannot be padded."""
    if plan.kv or any(ap.kind != "dense" for ap in plan.attn.values()) or plan.residual_change_for \
            or plan.post_fill is not None or plan.code_mask is not None:
        return None
    for bp in plan.blocks.values():
        if bp.mode == "prune" and (bp.keep is None or (bp.fill == "cache" and bp.cache_from is None)):
            return None   # a selector ranks the live stream (no fixed count per image); an implicit cache scale
                          # would read the batch's residuals, not the image's own
    return (plan.run, plan.cfg, plan.tau, plan.drop_uncond, plan.attention_entropy_queries,
            plan.attention_entropy_sampling, plan.input_resize)


def _prune_settings(bp: BlockPlan) -> tuple:
    return tuple(bp.sublayers), bp.fill, bp.cache_from, bp.prune_kv


def _executed_queries(bp: BlockPlan, n: int) -> int:
    if bp.mode == "skip":
        return 0
    return bp.n_keep if (bp.mode == "prune" and "sa" in bp.sublayers) else n


def _image_keep(bp: BlockPlan, n: int, width: int, rows: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """One image's (rows, width) kept slots and their validity: its own kept indices first, then its
    pruned tokens in grid order (padding, never read back)."""
    if bp.mode == "full":
        idx = torch.arange(n, device=device).expand(rows, n)
        return idx, torch.ones(rows, n, dtype=torch.bool, device=device)
    if bp.mode == "skip":
        idx = torch.arange(width, device=device).expand(rows, width)
        return idx, torch.zeros(rows, width, dtype=torch.bool, device=device)
    keep = bp.keep.to(device)
    keep = keep.expand(rows, -1) if keep.shape[0] == 1 else keep
    k = keep.shape[1]
    if k == width:
        return keep, torch.ones(rows, width, dtype=torch.bool, device=device)
    kept = torch.zeros(rows, n, dtype=torch.bool, device=device).scatter_(1, keep, True)
    rest = torch.argsort(kept.to(torch.int8), dim=1, stable=True)[:, : width - k]   # pruned tokens, ascending
    valid = torch.arange(width, device=device) < k
    return torch.cat([keep, rest], dim=1), valid.expand(rows, width)


def _stack_rows(per_image: Sequence[torch.Tensor], cfg_rows: bool) -> torch.Tensor:
    """Per-image (r, ...) tensors (r = 2 as [cond; uncond] under CFG, or 1) -> the runtime's row
    order [cond of every image; uncond of every image] (one row per image without CFG)."""
    if not cfg_rows:
        return torch.cat([t[:1] for t in per_image])
    return torch.cat([t[:1] for t in per_image] + [t[-1:] for t in per_image])


def _padded_block(bps: Sequence[BlockPlan], n: int, cfg_rows: bool, device, entropy: Sequence[bool],
                  queries: Optional[int], si: int, sampling: str) -> Optional[BlockPlan]:
    """One block's plans across the images -> the block of the padded step (None: they disagree on
    how pruned tokens are treated, so the step cannot be shared)."""
    pruned = [bp for bp in bps if bp.mode == "prune"]
    settings = {_prune_settings(bp) for bp in pruned}
    if len(settings) > 1:
        return None
    if not pruned:   # full and skip only: the full block for every row, the skipping rows restored after it
        return _full_with_skips(bps, n, cfg_rows, device)
    sublayers, fill, cache_from, prune_kv = settings.pop() if settings else (("sa", "ca", "ffn"), "pass", None, False)
    width = max(n if bp.mode == "full" else bp.n_keep if bp.mode == "prune" else 0 for bp in bps)
    width = max(width, 1)
    r = 2 if cfg_rows else 1
    made = [_image_keep(bp, n, width, r, device) for bp in bps]
    keep = _stack_rows([m[0] for m in made], cfg_rows)
    valid = _stack_rows([m[1] for m in made], cfg_rows)
    skips = [bp.mode == "skip" for bp in bps]
    skip = torch.tensor(skips, device=device) if any(skips) else None
    ent_pick, ent_counts = None, ()
    if any(entropy):
        picks, counts = [], []
        for bp, want in zip(bps, entropy):
            q = _executed_queries(bp, n) if want else 0
            pick = (entropy_query_pick(q, queries, si, sampling, "cpu") if queries is not None and queries < q
                    else torch.arange(q))   # on the host: its last slot pads the row without a device read
            picks.append(pick)
            counts.append(int(pick.shape[0]))
        width_q = max(max(counts), 1)
        rows = [torch.cat([p, p.new_full((width_q - p.shape[0],), int(p[-1]) if p.numel() else 0)]).expand(r, -1)
                for p in picks]
        ent_pick, ent_counts = _stack_rows(rows, cfg_rows).to(device), tuple(counts)
    rows = valid.shape[0]
    skip_rows = None if skip is None else skip.repeat(rows // skip.shape[0]).view(rows, 1, 1)
    appended = valid if prune_kv else torch.ones(rows, n, dtype=torch.bool, device=device)
    return BlockPlan(mode="prune", keep=keep, n_keep=width, sublayers=sublayers, fill=fill, cache_from=cache_from,
                     prune_kv=prune_kv, pad=BlockPadding(
                         valid=valid, skip=skip, ent_pick=ent_pick, ent_counts=ent_counts,
                         kv_bias=_key_bias(appended, skip_rows), skip_rows=skip_rows,
                         padding_slots=(~valid).unsqueeze(-1), ent_pos=None if ent_pick is None else keep.gather(1, ent_pick)))


def _key_bias(appended: torch.Tensor, skip_rows: Optional[torch.Tensor]) -> torch.Tensor:
    """(rows, appended) additive bias of the K/V a block appends: 0 where the row may attend, -inf
    for padding slots and for every key of a row whose image skips the block."""
    visible = appended if skip_rows is None else appended & ~skip_rows[:, :, 0]
    return torch.zeros(visible.shape, device=visible.device).masked_fill_(~visible, float("-inf"))


def _full_with_skips(bps: Sequence[BlockPlan], n: int, cfg_rows: bool, device) -> BlockPlan:
    """Images that run the block in full or skip it: every row runs it in full (the lean block's ops,
    entropy over every query as a shared plan measures it), the skipping images' rows leave it as
    they entered and the K/V they appended are masked."""
    skip = torch.tensor([bp.mode == "skip" for bp in bps], device=device)
    rows = len(bps) * (2 if cfg_rows else 1)
    skip_rows = skip.repeat(rows // len(bps)).view(rows, 1, 1)
    bias = _key_bias(torch.ones(rows, n, dtype=torch.bool, device=device), skip_rows)
    return BlockPlan(mode="full", pad=BlockPadding(skip=skip, kv_bias=bias, skip_rows=skip_rows))


def padded_plan(plans: Sequence[ScalePlan], n: int, cfg_rows: bool, si: int, device,
                holders: "ResidualHolders", images: Sequence[int]) -> Optional[ScalePlan]:
    """One plan for `images` whose own `plans` differ in shape (see the module docstring), or None
    when they cannot share a step. `holders` tracks which images still hold kept residuals (updated
    here: call it once per scale with every image's plan)."""
    key = _shared_key(plans[0])
    if key is None or not plans[0].run or any(_shared_key(p) != key for p in plans[1:]):
        return None
    blocks: dict[int, BlockPlan] = {}
    for bi in sorted({bi for p in plans for bi, bp in p.blocks.items() if bp.mode != "full"}
                     | {bi for p in plans for bi in p.attention_entropy_for}):
        bps = [p.blocks.get(bi, _FULL) for p in plans]
        entropy = [bi in p.attention_entropy_for for p in plans]
        same = all(bp.mode == bps[0].mode and bp.n_keep == bps[0].n_keep for bp in bps) and \
            len({_prune_settings(bp) for bp in bps}) == 1
        if same:   # one shape for every image: as a shared plan runs it (kept indices stacked by image;
                   # equal executed queries, so equal entropy picks: `own_signals` drops unasked blocks)
            if bps[0].mode == "prune":
                blocks[bi] = dataclasses.replace(bps[0], keep=_stack_rows(
                    [bp.keep.to(device).expand(2 if cfg_rows else 1, -1) if bp.keep.shape[0] == 1 else bp.keep.to(device)
                     for bp in bps], cfg_rows))
            elif bps[0].mode == "skip":
                blocks[bi] = bps[0]
            continue
        made = _padded_block(bps, n, cfg_rows, device, entropy, plans[0].attention_entropy_queries, si,
                             plans[0].attention_entropy_sampling)
        if made is None:
            return None
        blocks[bi] = made
    return dataclasses.replace(
        plans[0], blocks=blocks, keep_residuals=any(p.keep_residuals for p in plans),
        attention_entropy_for=frozenset().union(*(p.attention_entropy_for for p in plans)),
        release_residuals=holders.update(si, plans, images))


class ResidualHolders:
    """Which images still hold the residuals kept at each scale. A padded step keeps a scale's
    residuals for the whole batch when any image asks; they are freed once every image that asked
    has released them (an image that never asked never releases them)."""

    def __init__(self):
        self.by_scale: dict[int, set[int]] = {}

    def update(self, si: int, plans: Sequence[ScalePlan], images: Sequence[int]) -> frozenset:
        """Note scale si's plans; the scales no image holds any more (to release after this scale)."""
        for i, p in zip(images, plans):
            for s in p.release_residuals:
                self.by_scale.get(s, set()).discard(i)
        released = {s for p in plans for s in p.release_residuals}
        for i, p in zip(images, plans):
            if p.keep_residuals:
                self.by_scale.setdefault(si, set()).add(i)
        done = frozenset(s for s in released if not self.by_scale.get(s))
        for s in done:
            self.by_scale.pop(s, None)
        return done

    def part(self, images: Sequence[int]) -> "ResidualHolders":
        """The holders among `images` (a sub-batch after a split)."""
        new = ResidualHolders()
        new.by_scale = {s: h & set(images) for s, h in self.by_scale.items()}
        return new


def own_signals(sig: ScaleSignals, k: int, plan: ScalePlan, padded: ScalePlan) -> ScaleSignals:
    """Image k's signals from a padded step (already cut to its rows by `select_signals`): only the
    attention entropies its own plan asked for, each over its own measured queries."""
    ent, pos = {}, {}
    for bi, e in sig.attention_entropy.items():
        own = plan.blocks.get(bi)
        if bi not in plan.attention_entropy_for or (own is not None and own.mode == "skip"):
            continue   # it did not ask, or (alone) its block did not run
        bp = padded.blocks.get(bi)
        q = bp.pad.ent_counts[k] if bp is not None and bp.pad is not None and bp.pad.ent_counts else e.shape[-1]
        ent[bi] = e[:, :q]
        p = sig.attention_query_index.get(bi) if isinstance(sig.attention_query_index, dict) else None
        if p is not None:
            pos[bi] = p[:, :q]
    index = pos if isinstance(sig.attention_query_index, dict) else sig.attention_query_index
    return dataclasses.replace(sig, attention_entropy=ent, attention_query_index=index)
