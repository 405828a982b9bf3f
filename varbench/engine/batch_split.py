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
those it gets alone up to the rounding of batched matmuls (measured in tests/engine/test_batch_split.py,
and for HART in tests/engine/test_hart_runtime.py).

Both runtimes (Infinity's `InfinityRuntime`, HART's `HartRuntime`) run this through the same pieces:
`image_policies` (the forks), `step_groups` (one scale over every sub-batch: plan, group, split,
run, observe), and for the output `image_traces`, `part_entries` / `batch_kv_bytes` (each
sub-batch's entry once) and `scatter_per_scale`. A state splits through its own `split` (what its
rows are is the model's), built from `group_rows_in_place` / `part_rows` (the KV cache's
`KVCache.split`) and `split_residuals`.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional, Sequence

import torch

from varbench.engine.flops import plan_block_counts
from varbench.engine.padded_batch import ResidualHolders, own_signals, padded_plan
from varbench.engine.plan import BlockPlan, GenerationContext, ScalePlan, ScaleSignals, is_neutral


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
            plan.attention_entropy_queries, tuple(sorted(plan.release_residuals)), plan.cfg, plan.tau, plan.drop_uncond, kv,
            tuple(sorted(plan.residual_change_for)), plan.post_fill is None, plan.code_mask is None, plan.input_resize)


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
    # per-image token maps ((1, n) each) stack by image, as the runtime's (B, n) maps are laid out
    maps = {name: torch.cat([getattr(p, name) for p in plans]) for name in ("post_fill", "code_mask")
            if getattr(first, name) is not None}
    return dataclasses.replace(first, blocks=blocks, kv=kv, **maps)


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
        summed_codes=rows(sig.summed_codes),
        residual_change={r: rows(c) for r, c in sig.residual_change.items()})


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


# ---------------------------------------------------------------------- splitting a state's caches
def group_rows_in_place(t: torch.Tensor, parts: Sequence[Sequence[int]], batch: int, dim: int) -> None:
    """Permute `t`'s rows along `dim` in place so that each part's rows (`image_rows`: [cond; uncond]
    of its images) lie together, parts in order. Through one temporary of `t`'s size, so a cache is
    split one buffer at a time, never held twice."""
    rows = [r for p in parts for r in image_rows(p, batch, t.shape[dim])]
    if rows != list(range(len(rows))):
        t.copy_(t.index_select(dim, torch.tensor(rows, device=t.device)))


def part_rows(t: torch.Tensor, first: int, size: int, batch: int, dim: int) -> torch.Tensor:
    """After `group_rows_in_place`: the rows of the part of `size` images that starts at image `first`
    (a view). Rows per image by count (2 with CFG rows, else 1)."""
    per = t.shape[dim] // batch
    return t.narrow(dim, first * per, size * per)


def part_starts(parts: Sequence[Sequence[int]]) -> list[int]:
    """The image position each part starts at after `group_rows_in_place`."""
    starts, first = [], 0
    for p in parts:
        starts.append(first)
        first += len(p)
    return starts


def split_residuals(residuals: dict, parts: Sequence[Sequence[int]], batch: int) -> list[dict]:
    """Residual caches {scale: {key: (rows, n, C)}} -> one per part, viewing the parent's permuted rows."""
    for cached in residuals.values():
        for t in cached.values():
            group_rows_in_place(t, parts, batch, 0)
    return [{s: {k: part_rows(t, first, len(p), batch, 0) for k, t in d.items()} for s, d in residuals.items()}
            for p, first in zip(parts, part_starts(parts))]


# ---------------------------------------------------------------------- the loop, shared by the runtimes
def image_policies(policy, ctx: GenerationContext) -> tuple[bool, list]:
    """(per_image, policies): at batch > 1 a policy with per-image decisions gives one fork per image,
    each reset for a batch of one; else the policy itself, reset for the batch. Duck-typed policies
    without the attribute are shared."""
    per_image = ctx.batch > 1 and getattr(policy, "per_image_decisions", False)
    policies = [policy.fork() for _ in range(ctx.batch)] if per_image else [policy]
    for p in policies:
        p.reset(dataclasses.replace(ctx, batch=1) if per_image else ctx)
    return per_image, policies


def step_groups(si: int, groups: list, policies: Sequence, per_image: bool,
                run: Callable[[int, object, ScalePlan], Optional[ScaleSignals]]) -> list:
    """Scale si for every sub-batch `groups` [(image positions, state)]; `run(si, state, plan)` runs
    one state's step and returns its signals (None: the scale was skipped). Returns the groups after.

    Without per-image decisions the one policy plans the whole batch and observes all of it. With
    them each image's policy plans; a state that can pad (`can_pad`) runs plans of different shapes
    as one padded step (`varbench.engine.padded_batch`); otherwise images with same-shaped plans run
    together (a sub-batch whose images disagree splits here, `state.split`). Each image observes
    its own rows."""
    if not per_image:
        (_, state), = groups
        plan = policies[0].plan(si)
        signals = run(si, state, plan)
        if signals is not None:
            policies[0].observe(si, host_signals(signals) if getattr(policies[0], "reads_signals_on_host", False) else signals)
        return groups
    out = []
    for images, state in groups:
        plans = [policies[i].plan(si) for i in images]
        holders = _holders(state)
        padded = None
        if len(images) > 1 and can_pad(state) and len(set(map(plan_signature, plans))) > 1:
            padded = padded_plan(plans, state.ctx.tokens(si), state.ctx.cfg_rows, si, state.rt.device, holders, images)
        if padded is not None:
            if getattr(state, "image_kv", None) is None:   # the first padded step: each image holds what the cache holds
                state.image_kv = {i: list(state.kv.len) for i in images}
            signals = run(si, state, padded)
            note_image_blocks(state, si, images, plans, padded=True)
            if signals is not None:
                signals = host_signals(signals)
                for k, i in enumerate(images):
                    policies[i].observe(si, own_signals(select_signals(signals, k, len(images)), k, plans[k], padded))
            out.append((images, state))
            continue
        holders.update(si, plans, images)
        parts = group_by_plan(plans)
        subs = [state] if len(parts) == 1 else state.split(parts)
        for part, sub in zip(parts, subs):
            members = [images[j] for j in part]
            if len(parts) > 1:
                sub.residual_holders = holders.part(members)
                if getattr(state, "image_kv", None) is not None:
                    sub.image_kv = {i: list(state.image_kv[i]) for i in members}
            signals = run(si, sub, merge_plans([plans[j] for j in part], state.ctx.cfg_rows))
            note_image_blocks(sub, si, members, [plans[j] for j in part], padded=False)
            if signals is not None:
                signals = host_signals(signals)
                for k, i in enumerate(members):
                    policies[i].observe(si, select_signals(signals, k, len(members)))
            out.append((members, sub))
    return out


def can_pad(state) -> bool:
    """Whether `state` runs per-image plans of different shapes as one padded step: its backbone
    can (`pads_per_image_plans`), the runtime's `adaptive_batch` is "pad" (not "split"), and the
    generation has no KV budgets (their evictions keep no key mask)."""
    return (getattr(state, "pads_per_image_plans", False) and getattr(state.rt, "adaptive_batch", "pad") == "pad"
            and getattr(state, "kv_capacity", None) is None)


def _holders(state) -> ResidualHolders:
    h = getattr(state, "residual_holders", None)
    if h is None:
        h = state.residual_holders = ResidualHolders()
    return h


def note_image_blocks(state, si: int, images: Sequence[int], plans: Sequence[ScalePlan], padded: bool) -> None:
    """After a padded step (and every step of a state that has run one): each image's own per-block
    counts in the trace entry (`image_blocks`, by image position in the batch), from its own plan
    and the keys it holds itself (`image_kv`), so its FLOPs and trace are its run alone."""
    if getattr(state, "image_kv", None) is None:
        return
    tr = state.trace[-1]
    if not tr["ran"]:
        return
    n, depth = tr["tokens"], len(tr["blocks"])
    tr["image_blocks"] = {i: plan_block_counts(p, n, state.image_kv[i], {}, depth) for i, p in zip(images, plans)}
    tr["image_neutral"] = {i: is_neutral(p) for i, p in zip(images, plans)}


def host_signals(sig: ScaleSignals) -> ScaleSignals:
    """The signals per-image policies read (token entropies, attention entropies and their query
    positions, residual changes) copied to the host in one transfer per dtype, before the batch's forks read them: a
    GPU then waits once per scale, not once per image and read (each fork's `.to("cpu")` or
    `float()` of a host tensor costs nothing)."""
    named = [("token_entropy", None, sig.token_entropy)]
    named += [("attention_entropy", b, e) for b, e in sig.attention_entropy.items()]
    q = sig.attention_query_index
    named += [("attention_query_index", b, p) for b, p in q.items()] if isinstance(q, dict) else [("attention_query_index", None, q)]
    named += [("residual_change", r, c) for r, c in sig.residual_change.items()]
    named = [(f, b, t) for f, b, t in named if isinstance(t, torch.Tensor) and t.device.type != "cpu"]
    if not named:
        return sig
    host: dict = {}
    for dtype in {t.dtype for _, _, t in named}:
        same = [(f, b, t) for f, b, t in named if t.dtype == dtype]
        flat = torch.cat([t.reshape(-1) for _, _, t in same]).cpu()
        for (f, b, t), part in zip(same, flat.split([t.numel() for _, _, t in same])):
            host[(f, b)] = part.view(t.shape)
    ent = {b: host.get(("attention_entropy", b), e) for b, e in sig.attention_entropy.items()}
    index = ({b: host.get(("attention_query_index", b), p) for b, p in q.items()} if isinstance(q, dict)
             else host.get(("attention_query_index", None), q))
    change = {r: host.get(("residual_change", r), c) for r, c in sig.residual_change.items()}
    return dataclasses.replace(sig, token_entropy=host.get(("token_entropy", None), sig.token_entropy),
                               attention_entropy=ent, attention_query_index=index, residual_change=change)


def image_traces(groups: list, batch: int, per_scale_ms: Sequence[float]) -> list[list[dict]]:
    """Per image the trace of its sub-batch, each entry stamped with the scale's wall time (every
    sub-batch's work at that scale: they run one after another)."""
    traces: list = [None] * batch
    for images, state in groups:
        for tr, ms in zip(state.trace, per_scale_ms):
            tr["ms"] = ms
        for i in images:
            traces[i] = state.trace
            if any("image_blocks" in tr for tr in state.trace):   # a padded batch: each image its own counts
                traces[i] = [tr if "image_blocks" not in tr else _own_entry(tr, i) for tr in state.trace]
    return traces


def _own_entry(tr: dict, i: int) -> dict:
    """Image i's view of a padded step's trace entry: its own counts, marked `padded` (what ran for
    the batch, padding included, stays in the batch's entry and FLOPs)."""
    own = {k: v for k, v in tr.items() if k not in ("image_blocks", "image_neutral")}
    own.update(blocks=tr["image_blocks"][i], neutral=tr["image_neutral"][i], padded=True)
    return own


def part_entries(groups: list, attr: str, si: int) -> list:
    """Scale si's entry of each sub-batch's per-scale list `attr` (`trace`, `kv_bytes`), each entry
    once: the entries from before a split are shared by its parts (they ran for all of them)."""
    return list({id(e): e for e in (getattr(state, attr)[si] for _, state in groups)}.values())


def batch_kv_bytes(groups: list, n_scales: int) -> list[dict]:
    """Per scale the batch's KV-cache {"allocated", "used"} bytes: summed over its sub-batches."""
    return [{k: sum(d[k] for d in part_entries(groups, "kv_bytes", si)) for k in ("allocated", "used")}
            for si in range(n_scales)]


def scatter_per_scale(groups: list, attr: str, batch: int, n_scales: int, fill: float) -> list[Optional[torch.Tensor]]:
    """Per scale the (batch, ...) tensor of the sub-batches' per-scale list `attr` (bits, entropies),
    `fill` in the rows of images whose sub-batch skipped the scale, None where none ran it."""
    return [scatter_images([(images, getattr(state, attr)[si]) for images, state in groups], batch, fill)
            for si in range(n_scales)]
