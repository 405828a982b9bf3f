"""The KV cache every backbone's generation holds, and the KV budgets that evict from it.

`KVCache` keeps per-block K/V buffers (and the staging buffer of KV budgets); `apply_kv_budget` is
the one eviction rule (fixed or selected positions), shared by every backbone; `policy_kv_capacity`
and `kv_staging_capacity` size the buffers from what the policies ask; `kv_cache_bytes` and
`analytic_kv_bytes` count them without running; `note_kv_bytes` writes what a state holds into its
trace. A backbone's state owns one `KVCache` (`state.kv`) and calls these; nothing here knows a model.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from varbench.engine.batch_split import group_rows_in_place, part_rows, part_starts
from varbench.engine.plan import GenerationContext, KVBudget, KVSelectContext
from varbench.engine.policy import Policy


class KVCache:
    """Per-block K/V buffers (2, rows, H, capacity_b, c), preallocated at block b's first append;
    blocks may hold different lengths (pruned K/V, skipped blocks, KV budgets). Static capacities
    keep each step's shapes static.

    capacity: one int (every block holds the whole schedule, the baseline) or one per block (a plan
    with KV budgets: the most positions block b holds BETWEEN scales, after its evictions,
    `Policy.kv_capacity`), so a budget's saving is memory actually not allocated.

    staging: 0 (the baseline: no staging buffer) or the positions of one buffer (2, rows, H, staging,
    c) shared by every block (`kv_staging_capacity`). A block whose append would overflow its own
    buffer (its kept positions plus this scale's tokens) copies what it holds into the staging
    buffer, appends there, attends there, and its KV budget then gathers the kept positions back
    into its own buffer (`evict`; `settle` checks nothing is left there). Blocks run one after
    another, so one staging buffer serves them all: only one block at a time holds a whole scale.
    That is what makes a budget's memory the budget's size (ScaleKV: ~10% of the full cache) and
    not kept + the last scale's tokens in every block. The cost: one copy of the kept positions
    per staged (scale, block).

    Measuring (`nbytes`, `block_nbytes`, `staging_nbytes`): allocated = the buffers as allocated
    (every row, the whole capacity; the staging buffer's included in `nbytes`); used = the
    positions held now, over the rows in use, in the blocks' own buffers (between steps the staging
    buffer holds nothing that is read again). Heads hold the same count of positions (a budget keeps
    n_keep per row and head), so used = 2 * rows * H * len * c * itemsize.
    """

    def __init__(self, depth: int, capacity, staging: int = 0):
        self.full: list[Optional[torch.Tensor]] = [None] * depth   # all rows, as allocated
        self.kv: list[Optional[torch.Tensor]] = [None] * depth     # the rows in use
        self.len = [0] * depth
        caps = [int(capacity)] * depth if isinstance(capacity, int) else [int(c) for c in capacity]
        if len(caps) != depth:
            raise ValueError(f"KVCache: {len(caps)} capacities for {depth} blocks")
        self.capacities = caps
        self.staging_capacity = int(staging)
        self.stage_full: Optional[torch.Tensor] = None   # the staging buffer, all rows, as allocated
        self.stage: Optional[torch.Tensor] = None        # its rows in use
        self.staged: Optional[int] = None                # the block whose K/V lie in the staging buffer now
        self.staged_from = 0                             # that block's own length before its append
        # per block, which positions each row may attend to: None (all of them, the usual case) until a
        # padded batch appends positions some rows must not see (`varbench.engine.padded_batch`)
        self.mask_full: list[Optional[torch.Tensor]] = [None] * depth   # (rows, capacity) bool, as allocated
        self.mask: list[Optional[torch.Tensor]] = [None] * depth        # the rows in use

    @property
    def capacity(self) -> int:
        """The largest block capacity (all of them, without KV budgets)."""
        return max(self.capacities)

    def restart(self) -> None:
        """Empty, keeping the buffers (graph mode: captured steps write to these addresses)."""
        self.kv, self.len = list(self.full), [0] * len(self.len)
        self.mask_full, self.mask = [None] * len(self.len), [None] * len(self.len)
        self.stage, self.staged = self.stage_full, None

    def append(self, bi: int, kv: torch.Tensor, dtype: torch.dtype,
               bias: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
        """kv (2, rows, H, n, c) -> this block's K, V so far, each (rows, H, len, c): views of its own
        buffer, or of the staging buffer when its own cannot hold them (then `evict` or `settle`
        must follow before the next block appends). `bias` (rows, n): 0 where a row may attend to an
        appended position from now on, -inf where not (a padded batch, `key_mask`); None: all."""
        if bias is not None or self.mask[bi] is not None:
            self._note_bias(bi, kv, bias)
        if self.kv[bi] is None:
            two, rows, heads, _, c = kv.shape
            self.kv[bi] = self.full[bi] = kv.new_empty((2, rows, heads, self.capacities[bi], c), dtype=dtype)
        if self.stage is None and self.staging_capacity:   # with the first buffer: allocated is static from then on
            two, rows, heads, _, c = self.kv[bi].shape
            self.stage = self.stage_full = kv.new_empty((2, rows, heads, self.staging_capacity, c), dtype=dtype)
        if self.staged is not None:
            raise RuntimeError(f"KV cache: block {self.staged} still holds the staging buffer (no evict/settle after its step)")
        buf, start = self.kv[bi], self.len[bi]
        end = start + kv.shape[3]
        if end <= self.capacities[bi]:
            self.len[bi] = end
            buf.narrow(3, start, kv.shape[3]).copy_(kv)
            return buf.narrow(3, 0, end).unbind(0)
        if end > self.staging_capacity:
            raise ValueError(f"KV cache of block {bi} holds {self.capacities[bi]} positions (staging buffer: "
                             f"{self.staging_capacity}) but this scale needs {end}: the policy's kv_capacity() is "
                             "smaller than what its plans keep (a policy bug)")
        st = self.stage
        st.narrow(3, 0, start).copy_(buf.narrow(3, 0, start))
        st.narrow(3, start, kv.shape[3]).copy_(kv)
        self.staged, self.staged_from, self.len[bi] = bi, start, end
        return st.narrow(3, 0, end).unbind(0)

    def _note_bias(self, bi: int, kv: torch.Tensor, bias: Optional[torch.Tensor]) -> None:
        """Record which appended positions each row may attend to, as an additive bias in the K/V's
        dtype (what SDPA takes as `attn_mask` without converting it). Made at the first padded
        append: every position before it was visible to every row."""
        if self.staging_capacity:
            raise ValueError("KV cache: a padded batch cannot use KV budgets (their staging buffer keeps no "
                             "key mask); per-image plans with KV budgets split the batch instead")
        start, n = self.len[bi], kv.shape[3]
        if self.mask[bi] is None:
            self.mask[bi] = self.mask_full[bi] = kv.new_zeros((kv.shape[1], self.capacities[bi]), dtype=self.kv[bi].dtype)
        if start + n <= self.capacities[bi]:
            seg = self.mask[bi].narrow(1, start, n)
            seg.zero_() if bias is None else seg.copy_(bias)

    def key_mask(self, bi: int) -> Optional[torch.Tensor]:
        """(rows, 1, 1, len) additive bias, 0 where a row may attend to block bi's position and -inf
        where not (SDPA's `attn_mask`), or None when every row sees every position (no padded append)."""
        m = self.mask[bi]
        return None if m is None else m.narrow(1, 0, self.len[bi])[:, None, None, :]

    def held(self, bi: int) -> torch.Tensor:
        """Block bi's K/V held now, (2, rows, H, len, c): in the staging buffer after a staged append."""
        return (self.stage if self.staged == bi else self.kv[bi]).narrow(3, 0, self.len[bi])

    def evict(self, bi: int, keep: torch.Tensor) -> None:
        """Keep only positions `keep` (rows, H, k), ascending, of block bi's cache: they move to the
        front of its own buffer in that order, the rest is overwritten later (gone for good). Static
        shapes: k is the tensor's, the length becomes k. From the staging buffer the kept positions
        are gathered straight into the own buffer; in place, through one temporary of the kept size."""
        buf, n = self.kv[bi], self.len[bi]
        k = keep.shape[-1]
        if self.mask[bi] is not None:
            raise ValueError(f"KV cache of block {bi}: a KV budget cannot evict from a padded batch's masked cache")
        if k > self.capacities[bi]:
            raise ValueError(f"KV budget keeps {k} positions of block {bi} but its cache holds {self.capacities[bi]} "
                             "between scales: the policy's kv_capacity() is smaller than what its plans keep (a policy bug)")
        idx = keep.unsqueeze(0).unsqueeze(-1).expand(2, -1, -1, -1, buf.shape[-1])
        if self.staged == bi:
            torch.gather(self.stage.narrow(3, 0, n), 3, idx, out=buf.narrow(3, 0, k))
            self.staged = None
        else:
            kept = buf.narrow(3, 0, n).gather(3, idx)
            buf.narrow(3, 0, k).copy_(kept)
        self.len[bi] = k

    def settle(self, bi: int, last: bool) -> None:
        """After block bi's step (and its budget's `evict`, if any): a block still in the staging buffer
        holds more than its own buffer can. After the last scale nothing reads the cache again, so it
        keeps what its own buffer held (this scale's K/V were read and are dropped); before, that is
        a policy whose kv_capacity() is smaller than what its plans keep."""
        if self.staged != bi:
            return
        if not last:
            raise ValueError(f"KV cache of block {bi} holds {self.capacities[bi]} positions between scales but keeps "
                             f"{self.len[bi]} after this scale: the policy's kv_capacity() is smaller than what its "
                             "plans keep (a policy bug)")
        self.len[bi], self.staged = self.staged_from, None

    def block_nbytes(self, bi: int) -> tuple[int, int]:
        """(allocated, used) bytes of block bi's own K/V buffer (0, 0 before its first append)."""
        full, cur = self.full[bi], self.kv[bi]
        if full is None:
            return 0, 0
        _, rows, heads, _, c = cur.shape
        return full.numel() * full.element_size(), 2 * rows * heads * self.len[bi] * c * full.element_size()

    def staging_nbytes(self) -> tuple[int, int]:
        """(allocated, used) bytes of the staging buffer (0, 0 without one, or before the first append);
        used is 0: between steps it holds nothing that is read again."""
        return (0, 0) if self.stage_full is None else (self.stage_full.numel() * self.stage_full.element_size(), 0)

    def nbytes(self) -> dict[str, int]:
        """{"allocated", "used"}: bytes of every block's K/V buffer and of the staging buffer as
        allocated, and of the positions held now over the rows in use (see the class docstring)."""
        pairs = [self.block_nbytes(bi) for bi in range(len(self.len))] + [self.staging_nbytes()]
        return {"allocated": sum(a for a, _ in pairs), "used": sum(u for _, u in pairs)}

    def view(self, rows) -> "KVCache":
        """A cache over `rows(buffer)` of every block's rows in use (views: appends write into this
        cache's memory), with the same capacities and lengths. Its `full` is `rows` of the buffers as
        allocated: the same views until `drop_uncond`, after it this part's share of the rows still
        held (the dropped rows are not permuted by a split, so the share is by count), which
        `bytes_allocated` counts. The staging buffer is viewed too (the parts of a split batch run
        one after another and share it)."""
        new = KVCache(len(self.len), self.capacities, self.staging_capacity)
        new.kv = [None if t is None else rows(t) for t in self.kv]
        new.full = [None if t is None else rows(t) for t in self.full]
        new.len = list(self.len)
        new.mask = [None if t is None else rows(t.unsqueeze(0)).squeeze(0) for t in self.mask]
        new.mask_full = list(new.mask)
        if self.stage is not None:
            new.stage = new.stage_full = rows(self.stage)
        return new

    def split(self, parts: Sequence[Sequence[int]], batch: int) -> list["KVCache"]:
        """Caches for `parts` (image positions that together make this cache's batch of `batch`): the
        rows in use are permuted in place so each part's rows lie together, and each part's cache
        views its slice (`view`). This cache is spent after."""
        for t in self.kv:
            if t is not None:
                group_rows_in_place(t, parts, batch, 1)
        for m in self.mask:
            if m is not None:
                group_rows_in_place(m, parts, batch, 0)
        return [self.view(lambda t, f=first, n=len(p): part_rows(t, f, n, batch, 1))
                for p, first in zip(parts, part_starts(parts))]

    def drop_uncond(self, batch: int) -> None:
        self.kv = [None if t is None else t[:, :batch] for t in self.kv]
        self.mask = [None if m is None else m[:batch] for m in self.mask]
        if self.stage is not None:
            self.stage = self.stage[:, :batch]


def kv_staging_capacity(capacities: Optional[Sequence[int]], schedule: Sequence[tuple[int, int]]) -> int:
    """The positions of `KVCache`'s staging buffer for blocks of these (between-scale) capacities on
    this schedule: the most any block can hold during a scale beyond its own buffer. Block b enters
    scale si holding at most min(cap_b, tokens before si) and appends at most h*w, so it holds at most
    min(cap_b + h*w, tokens through si); it stages where that exceeds cap_b. 0 when no block ever
    does (None: the baseline, every block holds the whole schedule)."""
    if capacities is None:
        return 0
    need, cum = 0, 0
    for h, w in schedule:
        cum += h * w
        for cap in capacities:
            if cum > cap:
                need = max(need, min(int(cap) + h * w, cum))
    return need


def kv_cache_bytes(capacities: Sequence[int], rows: int, heads: int, head_dim: int, itemsize: int,
                   staging: int = 0) -> int:
    """The bytes `KVCache` allocates for blocks of these capacities and a staging buffer of `staging`
    positions (`kv_staging_capacity`; 0: none). Analytic: 2 * rows * H * positions * c * itemsize per
    buffer; bf16 runs hold bf16 K/V, itemsize 2."""
    return sum(2 * rows * heads * int(cap) * head_dim * itemsize for cap in [*capacities, staging])


def apply_kv_budget(kv: KVCache, si: int, bi: int, h: int, w: int, rows: int, batch: int, budget: KVBudget,
                    appended: Optional[torch.Tensor], counts: dict, query_proj) -> None:
    """After block bi ran at scale si (grid h x w, `rows` rows of `batch` images): when it holds more
    than `budget.n_keep` positions, keep the budget's (fixed or selected) positions and evict the
    rest (a host decision on host lengths, so the step's shapes stay static). `query_proj(pos)` gives
    the block's raw query projection of grid positions `pos` for a selector (the model's own, so
    this rule is shared by every backbone). Records `kv_kept` (positions held after), `kv_evicted`
    and `kv_sel_q` (raw queries the selector computed) in `counts`."""
    n_held = kv.len[bi]
    counts["kv_kept"] = n_held
    if n_held <= budget.n_keep:
        return
    if budget.keep is not None:
        keep = budget.keep.to(kv.held(bi).device)
    else:
        k = kv.held(bi)[0]   # its own buffer, or the staging buffer its append overflowed into
        keep = budget.selector(KVSelectContext(scale=si, block=bi, h=h, w=w, n_keep=budget.n_keep, batch=batch,
                                               cfg_rows=rows == 2 * batch, keys=k, query_proj=query_proj,
                                               appended=appended))
        counts["kv_sel_q"] = budget.sel_queries
    if keep.shape[0] != rows:
        keep = keep[:rows] if keep.shape[0] > rows else keep.repeat(rows // keep.shape[0], 1, 1)
    kv.evict(bi, keep)
    counts["kv_kept"] = budget.n_keep
    counts["kv_evicted"] = True


def policy_kv_capacity(policies: Sequence[Policy], ctx: GenerationContext) -> Optional[list[int]]:
    """Per-block KV capacities between scales for this generation: the largest any (reset) policy
    asks for (`Policy.kv_capacity`), never more than the whole schedule; None when none asks (the
    baseline: every block holds the whole schedule and no staging buffer is allocated). The state
    sizes its staging buffer from these (`varbench.engine.kv_cache.kv_staging_capacity`)."""
    full = sum(h * w for h, w in ctx.schedule)
    asked = [c for p in policies if (c := getattr(p, "kv_capacity", lambda: None)()) is not None]
    if not asked:
        return None
    for c in asked:
        if len(c) != ctx.depth:
            raise ValueError(f"a policy's kv_capacity() gave {len(c)} capacities for a {ctx.depth}-block model")
    return [min(full, max(int(c[bi]) for c in asked)) for bi in range(ctx.depth)]


def analytic_kv_bytes(policy: Optional[Policy], ctx: GenerationContext, itemsize: int = 2) -> int:
    """The KV-cache bytes a generation of `ctx` under `policy` (reset here for ctx; None: the
    baseline) allocates, without running it: the per-block capacities the runtime would take
    (`policy_kv_capacity`), the staging buffer they need (`kv_staging_capacity`), `kv_cache_bytes`.
    A run's `GenerationOutput.kv_bytes[-1]["allocated"]` equals it (one policy for the batch, rows
    as at scale 0; tested on the tiny model). itemsize 2: bf16 K/V (a bf16 run), 4: an fp32 run."""
    policies = []
    if policy is not None:
        policy.reset(ctx)
        policies.append(policy)
    caps = policy_kv_capacity(policies, ctx)
    full = sum(h * w for h, w in ctx.schedule)
    return kv_cache_bytes([full] * ctx.depth if caps is None else caps, ctx.rows, ctx.num_heads,
                          ctx.embed_dim // ctx.num_heads, itemsize, kv_staging_capacity(caps, ctx.schedule))


def note_kv_bytes(state) -> None:
    """The KV cache's bytes after this scale, in its trace entry (`varbench.engine.memory`): the
    (sub-)batch's buffers as held and the positions in use. From tensor shapes: no device read.
    Any state with `kv` (a `KVCache`) and `trace` (Infinity's `GenState`, HART's `HartState`)."""
    held = state.kv.nbytes()
    state.trace[-1].update(kv_bytes_allocated=held["allocated"], kv_bytes_used=held["used"])
