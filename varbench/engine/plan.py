"""Plans and signals: the seam between the runtime (mechanism) and acceleration methods (policy).

At every scale the runtime asks the active policy for a `ScalePlan`, runs the scale under it, and
hands the policy the `ScaleSignals` it measured. A plan that asks for nothing (`ScalePlan()`) runs
the scale exactly as the released model does; every method's neutral setting must reduce to it.

Batch layout inside a scale step: with classifier-free guidance the runtime carries 2B rows,
`[cond_0 .. cond_{B-1}, uncond_0 .. uncond_{B-1}]` (the released order); without it, B rows.
Token indices always refer to the scale's own h*w grid in row-major order.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Literal, Optional

import torch

Sublayer = Literal["sa", "ca", "ffn"]
SUBLAYERS: tuple[Sublayer, ...] = ("sa", "ca", "ffn")


@dataclasses.dataclass(frozen=True)
class SelectorContext:
    """What a token selector sees besides the live hidden state."""

    scale: int            # schedule index of the scale being run
    block: int            # flat block index (0 .. depth-1)
    sublayer: Sublayer    # which sublayer the selection is for
    h: int
    w: int
    batch: int            # B (prompts); rows = 2B under CFG
    cfg_rows: bool        # True if rows hold [cond; uncond] halves


#: A selector maps the live residual stream x (rows, h*w, C) to kept indices (rows, n_keep) (long).
Selector = Callable[[torch.Tensor, SelectorContext], torch.Tensor]


@dataclasses.dataclass(frozen=True)
class KVSelectContext:
    """What a KV selector sees of one block's self-attention at one scale (`KVBudget`).

    keys:        (rows, H, L, c) the block's cached keys after this scale's append (earlier scales'
                 kept positions, then this scale's), as self-attention just read them (post-RoPE,
                 in the cache's dtype);
    query_proj:  positions (m,) long of this scale's h*w grid -> (rows, H, m, c) the raw query
                 projection x_mod @ W_q^T of those tokens (no q bias, no cosine normalisation, no
                 RoPE), in the block weights' dtype; computed on demand, only for the asked positions;
    appended:    None when this scale appended all h*w tokens in grid order (the last h*w cache
                 positions are this scale's grid); else (rows, m) the grid positions of the m tokens
                 it appended (pruned K/V), or an empty (rows, 0) tensor (a skipped block).
    """

    scale: int
    block: int
    h: int
    w: int
    n_keep: int
    batch: int
    cfg_rows: bool
    keys: torch.Tensor
    query_proj: Callable[[torch.Tensor], torch.Tensor]
    appended: Optional[torch.Tensor]


#: A KV selector returns the cache positions a block keeps, (rows, H, n_keep) long, ascending per
#: (row, head). It runs inside the scale step: no host reads, shapes from (n_keep, L) only.
KVSelector = Callable[[KVSelectContext], torch.Tensor]


@dataclasses.dataclass
class KVBudget:
    """How many cached K/V positions one block keeps after its self-attention at one scale.

    The runtime applies it right after the block ran at this scale (its attention read the whole
    cache, this scale's K/V included): when the block holds more than `n_keep` positions, the
    cache is compacted to the `n_keep` chosen positions per (row, head) and the others are gone for
    good (later scales never see them); when it holds `n_keep` or fewer, nothing is evicted.
    `n_keep` is static, so every (scale, plan, KV lengths) has static shapes (CUDA graphs).

    keep:      fixed positions (rows, H, n_keep), ascending (tests: a forced selection); or
    selector:  a `KVSelector` called on the block's cache. Exactly one of the two.
    sel_queries: how many raw query projections the selector computes (for the FLOPs count).
    """

    n_keep: int
    keep: Optional[torch.Tensor] = None
    selector: Optional[KVSelector] = None
    sel_queries: int = 0

    def validate(self) -> None:
        if (self.keep is None) == (self.selector is None):
            raise ValueError("A KVBudget needs exactly one of `keep` (positions) or `selector`.")
        if self.n_keep < 1:
            raise ValueError(f"KVBudget.n_keep={self.n_keep} must be >= 1 (a block cannot attend to nothing).")
        if self.keep is not None and self.keep.shape[-1] != self.n_keep:
            raise ValueError(f"KVBudget.keep has {self.keep.shape[-1]} positions but n_keep={self.n_keep}.")


@dataclasses.dataclass
class BlockPlan:
    """How one transformer block runs at one scale.

    mode:
      "full"  - every token (the default; an absent entry means full).
      "skip"  - the block is the identity at this scale (its K/V are not appended either).
      "prune" - each sublayer in `sublayers` computes only `n_keep` tokens.
    keep:      fixed kept indices (rows, n_keep), shared by the pruned sublayers; or
    selector:  called before each pruned sublayer on the live hidden state (FastVAR re-ranks
               tokens before SA, CA and FFN separately). Exactly one of keep/selector for "prune".
    n_keep:    static number of kept tokens, so every (scale, plan) has static shapes.
    fill:      what pruned positions receive as that sublayer's residual update:
               "cache" - the branch output cached at scale `cache_from`, area-upsampled to this
                         grid (FastVAR's cached token restoration); needs that scale to have run
                         with `keep_residuals=True`;
               "pass"  - nothing (the token passes through the sublayer unchanged).
    cache_from: schedule index of the cached scale (None = the nearest earlier scale that kept
               residuals).
    prune_kv:  True - pruned tokens are dropped from this scale's self-attention K/V as well
               (cheaper, FastVAR behaviour); False - all tokens still provide K/V (queries pruned
               only; K/V of pruned tokens come from their un-updated hidden state).
    pad:       None, or how images whose own plans differ share this block in one batch
               (`BlockPadding`, made by `varbench.engine.padded_batch`, never by a policy).
    """

    mode: Literal["full", "skip", "prune"] = "full"
    keep: Optional[torch.Tensor] = None
    selector: Optional[Selector] = None
    n_keep: int = 0
    sublayers: tuple[Sublayer, ...] = SUBLAYERS
    fill: Literal["cache", "pass"] = "cache"
    cache_from: Optional[int] = None
    prune_kv: bool = True
    pad: Optional["BlockPadding"] = None

    def validate(self, n_tokens: int) -> None:
        if self.mode not in ("full", "skip", "prune"):
            raise ValueError(f"BlockPlan.mode must be full/skip/prune, got {self.mode!r}")
        if self.mode != "prune":
            return
        if (self.keep is None) == (self.selector is None):
            raise ValueError("A prune BlockPlan needs exactly one of `keep` (indices) or `selector`.")
        if not 0 < self.n_keep <= n_tokens:
            raise ValueError(f"BlockPlan.n_keep={self.n_keep} must be in 1..{n_tokens} (tokens at this scale).")
        if self.keep is not None and self.keep.shape[-1] != self.n_keep:
            raise ValueError(f"keep has {self.keep.shape[-1]} indices but n_keep={self.n_keep}.")
        bad = set(self.sublayers) - set(SUBLAYERS)
        if bad:
            raise ValueError(f"Unknown sublayers {sorted(bad)}; use a subset of {SUBLAYERS}.")
        if self.fill not in ("cache", "pass"):
            raise ValueError(f"BlockPlan.fill must be 'cache' or 'pass', got {self.fill!r}")


@dataclasses.dataclass(frozen=True)
class BlockPadding:
    """One block of a padded batch (`varbench.engine.padded_batch`): images whose own plans run it
    full, pruned to different counts, or skip it share one pruned step of `n_keep` = the largest
    count. Each image's kept slots come first in its row of `keep`; the rest are padding.

    valid:     (rows, n_keep) bool, rows as `keep`'s: the image's own kept slots. Padding slots take
               the fill the image's own plan gives its pruned tokens (cache or pass), and with
               `prune_kv` their K/V are masked out of every later attention (`KVCache.key_mask`).
    skip:      None, or (B,) bool: images whose own plan skips the block; their rows leave it as
               they entered and every K/V they appended is masked.
    ent_pick:  None, or (rows, q) long: per row the slots (into its kept slots) whose attention
               entropy the image's own plan measures (`entropy_query_pick` of its own count); rows
               with fewer repeat their last slot (the image reads only its own `ent_counts`).
    ent_counts: per image how many of `ent_pick`'s slots are its own (0: it asked for none here).
    """

    valid: Optional[torch.Tensor] = None
    skip: Optional[torch.Tensor] = None
    ent_pick: Optional[torch.Tensor] = None
    ent_counts: tuple[int, ...] = ()
    #: made with the plan so the step spends no launch on them: (rows, appended) additive key bias (0 /
    #: -inf) of the K/V the block appends, in `KVCache.key_mask`'s form; `skip` as (rows, 1, 1); the
    #: padding slots as (rows, n_keep, 1); the token positions of `ent_pick`'s slots
    kv_bias: Optional[torch.Tensor] = None
    skip_rows: Optional[torch.Tensor] = None
    padding_slots: Optional[torch.Tensor] = None
    ent_pos: Optional[torch.Tensor] = None


AttnKind = Literal["dense", "decide", "indexed", "block_mask"]


@dataclasses.dataclass
class AttnPlan:
    """Which cached keys one block's self-attention reads at one scale. Unlike a `KVBudget` it never
    evicts: every key stays in the cache, a query group just does not attend to all of them
    (SparVAR's sparse attention). Queries are taken in groups of `group` consecutive tokens of the
    scale's grid in row-major order (the last group may be short); key positions are cache
    positions (earlier scales first, then this scale's tokens).

    kind:
      "dense"      - every key (the default; an absent entry means dense).
      "decide"     - dense attention (the output is the dense one, bit for bit), and per (row, head,
                     query group) the `n_keys` keys with the largest softmax column sums over the
                     group (fp32) are remembered for this block with `O_cache = O - O_hat`, where
                     O_hat is the attention renormalised over those keys (`AttnMemory`).
      "indexed"    - the block's remembered keys, each query group taking the group of the
                     remembering scale whose centre is nearest its own, plus `local` (this scale's own
                     keys per group); output = the remembered O_cache bilinearly upsampled to this
                     grid + the attention renormalised over those keys. With `remember`, the union
                     becomes the block's remembered keys for the next indexed scale (the O_cache
                     stays the deciding scale's).
      "block_mask" - attention restricted to the blocks of `block_mask` ((q_blocks, k_blocks) bool,
                     `block` x `block` tokens each): a static pattern.
    Counts (`n_keys`, `local`'s width, the mask) are fixed per (scale, plan), so every step keeps
    static shapes (CUDA graphs). What it trades: attention FLOPs and time at the indexed scales
    against an approximation of the dense output, plus the memory of the remembered indices and
    O_cache per block (counted in the trace as `attn_memory_bytes`).
    """

    kind: AttnKind = "dense"
    group: int = 192
    n_keys: int = 0
    local: Optional[torch.Tensor] = None
    remember: bool = True
    use_o_cache: bool = True
    block_mask: Optional[torch.Tensor] = None
    block: int = 128
    pairs: Optional[int] = None   # block_mask: (query, key) pairs it allows, counted by its builder (FLOPs
                                  # without a host read of the mask; None: counted from the mask)

    def validate(self, n_tokens: int, n_keys_total: int) -> None:
        """Shapes against this scale (`n_tokens` queries, `n_keys_total` cached keys after the append)."""
        if self.kind not in ("dense", "decide", "indexed", "block_mask"):
            raise ValueError(f"AttnPlan.kind must be dense/decide/indexed/block_mask, got {self.kind!r}")
        if self.group < 1:
            raise ValueError(f"AttnPlan.group={self.group} must be >= 1")
        groups = -(-n_tokens // self.group)
        if self.kind == "decide" and not 0 < self.n_keys <= n_keys_total:
            raise ValueError(f"AttnPlan.n_keys={self.n_keys} must be in 1..{n_keys_total} (cached keys at this scale)")
        if self.kind == "indexed" and self.local is not None and self.local.shape[0] != groups:
            raise ValueError(f"AttnPlan.local has {self.local.shape[0]} groups; this scale has {groups} of {self.group}")
        if self.kind == "block_mask":
            if self.block_mask is None:
                raise ValueError("A block_mask AttnPlan needs `block_mask`.")
            want = (-(-n_tokens // self.block), -(-n_keys_total // self.block))
            if tuple(self.block_mask.shape) != want:
                raise ValueError(f"AttnPlan.block_mask has shape {tuple(self.block_mask.shape)}; this scale needs {want} "
                                 f"blocks of {self.block}")


@dataclasses.dataclass
class ScalePlan:
    """What to do at one scale.

    run:            False skips the scale: nothing runs, nothing is sampled, its codes are absent
                    from the sum (if it is the last scale(s), the image decodes the codes so far).
    blocks:         {block index: BlockPlan}; absent blocks run in full.
    keep_residuals: store this scale's per-block, per-sublayer branch outputs, for later "cache"
                    fills (memory: depth * 3 * rows * h*w * C floats).
    attention_entropy_for: blocks whose per-query self-attention entropy is wanted in the signals
                    (exact; costs one extra pass over the attention logits of those blocks).
    attention_entropy_queries: None = every query; k = a subsample of k queries, chosen by
    attention_entropy_sampling: "even" (evenly spaced over the executed queries, the default) or
                    "random" (a fixed pseudo-random k-subset per scale, seeded by the scale index:
                    :func:`entropy_query_pick`). Same subset for every row.
    release_residuals: scales whose kept residuals no later plan will read; freed after this
                    scale runs (a 2B at 1024² holds ~1.6 GB per cached 40x40 scale with CFG).
    cfg / tau:      override the configured guidance scale / temperature at this scale.
    drop_uncond:    run only the conditional rows at this scale (logits become cond-only); the
                    unconditional K/V are not extended at this scale (SkipVAR-style).
    kv:             {block index: KVBudget}: after this scale's self-attention the block keeps at most
                    that many cached positions (ScaleKV); absent blocks keep everything. Blocks
                    skipped at this scale evict nothing.
    attn:           {block index: AttnPlan}: which cached keys the block's self-attention reads
                    (SparVAR); absent blocks attend densely. Nothing is evicted.
    residual_change_for: block ranges (first, last), inclusive, whose per-token change of the residual
                    stream is wanted in the signals (`ScaleSignals.residual_change`): the mean over
                    channels of (x_out - x_in)^2, x_in entering block `first` and x_out leaving block
                    `last`, per row (both CFG halves), fp32. Tokens a pruned block passes through
                    (fill "pass") change by exactly 0 there. Observes only (costs one (rows, n, C)
                    copy per range while the range runs); no host read.
    post_fill:      None, or (B, h*w) long: after the last block (before the head) token t of image b
                    takes the hidden state of token post_fill[b, t], read before any fill (a gather; a
                    token mapped to itself keeps its own). The same map serves both CFG halves of an
                    image. With pruned blocks ("pass"), this fills pruned tokens' outputs from chosen
                    kept (or pruned) source tokens (SparseVAR's anchor copy). Static shape.
    code_mask:      None, or (B, h*w) bool: tokens whose sampled codes are zeroed before they are added
                    to the summed codes (their bits are still sampled and recorded); under 2x2 patchify
                    (8B) all four latent positions of a token. Static shape.
    input_resize:   how the summed codes are resized to this scale's grid to make its input (scales >= 1):
                    "trilinear" (released Infinity inference, the default) | "area" (the VAE's
                    `z_interplote_down`, what Infinity's training used for next-scale inputs; Lvar's
                    SparseVAR infers with it). Static.
    A policy whose kept count is data dependent (SparseVAR) reads the count to the host between steps
    (in `observe`, one read per scale) and plans a static `n_keep`; each distinct count is one more
    (scale, plan) shape (one more CUDA graph capture, or an eager step).
    """

    run: bool = True
    blocks: dict[int, BlockPlan] = dataclasses.field(default_factory=dict)
    keep_residuals: bool = False
    attention_entropy_for: frozenset[int] = frozenset()
    attention_entropy_queries: Optional[int] = None
    attention_entropy_sampling: Literal["even", "random"] = "even"
    release_residuals: frozenset[int] = frozenset()
    cfg: Optional[float] = None
    tau: Optional[float] = None
    drop_uncond: bool = False
    kv: dict[int, KVBudget] = dataclasses.field(default_factory=dict)
    attn: dict[int, AttnPlan] = dataclasses.field(default_factory=dict)
    residual_change_for: frozenset[tuple[int, int]] = frozenset()
    post_fill: Optional[torch.Tensor] = None
    code_mask: Optional[torch.Tensor] = None
    input_resize: Literal["trilinear", "area"] = "trilinear"

    def on_device(self, device) -> "ScalePlan":
        """This plan with its blocks' kept indices (and padding) on `device`: a policy may hand them
        over on the host; the runtime moves them once per scale, before the step (one copy each,
        never inside a captured step)."""
        def move(t):
            return t if t is None or t.device == torch.device(device) else t.to(device, non_blocking=True)

        blocks = {}
        for bi, bp in self.blocks.items():
            if bp.keep is not None and bp.keep.device != torch.device(device):
                bp = dataclasses.replace(bp, keep=move(bp.keep))
            if bp.pad is not None:
                bp = dataclasses.replace(bp, pad=dataclasses.replace(bp.pad, **{
                    f.name: move(getattr(bp.pad, f.name)) for f in dataclasses.fields(bp.pad)
                    if isinstance(getattr(bp.pad, f.name), torch.Tensor)}))
            blocks[bi] = bp
        return dataclasses.replace(self, blocks=blocks)

    def validate_token_maps(self, batch: int, n_tokens: int, depth: int) -> None:
        """Check `residual_change_for`, `post_fill` and `code_mask` against a scale of `n_tokens` tokens
        for `batch` images on a model of `depth` blocks, and `input_resize` (ValueError naming the field)."""
        if self.input_resize not in ("trilinear", "area"):
            raise ValueError(f"ScalePlan.input_resize must be 'trilinear' or 'area', got {self.input_resize!r}")
        for rng in self.residual_change_for:
            if len(rng) != 2 or not 0 <= rng[0] <= rng[1] < depth:
                raise ValueError(f"residual_change_for has {rng!r}; a range is (first, last) with "
                                 f"0 <= first <= last <= {depth - 1}")
        for name, dtypes in (("post_fill", (torch.int64, torch.int32)), ("code_mask", (torch.bool,))):
            t = getattr(self, name)
            if t is None:
                continue
            if tuple(t.shape) != (batch, n_tokens) or t.dtype not in dtypes:
                raise ValueError(f"ScalePlan.{name} must be ({batch}, {n_tokens}) {dtypes[0]}, got "
                                 f"{tuple(t.shape)} {t.dtype}")


def entropy_query_pick(n: int, k: int, scale: int, sampling: str, device) -> torch.Tensor:
    """Positions (k,) long, ascending, of the k of n executed queries whose attention entropy is
    measured. "even": evenly spaced (``linspace(0, n-1, k)`` rounded). "random": the k smallest of
    a 32-bit integer hash of (position, scale) (multiply-xorshift, as in murmur3's finaliser):
    a pseudo-random subset that is the same for a given (n, k, scale) on every device and run, drawn
    without a random generator or a host read, so it is safe inside a captured CUDA graph."""
    if sampling == "even":
        return torch.linspace(0, n - 1, k, device=device).round().long()
    if sampling != "random":
        raise ValueError(f"attention_entropy_sampling must be 'even' or 'random', got {sampling!r}")
    m = 0xFFFFFFFF
    h = (torch.arange(n, device=device, dtype=torch.int64) + (int(scale) + 1) * 0x9E3779B1) & m
    for mult in (0x85EBCA6B, 0xC2B2AE35):   # low 32 bits stay exact through int64 wrap-around
        h = h ^ (h >> 16)
        h = (h * mult) & m
    h = h ^ (h >> 16)
    return torch.argsort(h, stable=True)[:k].sort().values


@dataclasses.dataclass
class ScaleSignals:
    """What the runtime measured at one scale, handed to `Policy.observe`.

    token_entropy:      (B, h*w) predictive entropy per token, mean over bits of the binary entropy
                        of the distribution actually sampled from (guided, temperature-scaled
                        logits, before top-k/top-p), in nats.
    logits:             (B, h*w, d, 2) those guided, tempered logits (for other entropy variants).
    cond_logits:        (B, h*w, d, 2) the conditional rows' logits (tempered), or None without CFG.
    attention_entropy:  {block: (rows, n_queries) per-query self-attention entropy (nats, mean
                        over heads)} for the blocks the plan asked for, computed on the queries
                        that block executed (all, a pruned subset, or the requested subsample);
    attention_query_index: {block: (rows, n_queries) long} their positions in the h*w grid.
    executed_tokens:    {block: {sublayer: tokens executed per row}} at this scale.
    summed_codes:       (B, d_vae, 1, H, W) the codes accumulated so far (this scale included), on the
                        final latent grid: what the VAE would decode if the generation stopped here.
                        Read it in `observe` (it changes at the next scale); copy what you keep.
    decode:             codes -> uint8 RGB (B, H, W, 3), the runtime's VAE decode (None without a VAE),
                        for policies that look at the intermediate image (SkipVAR's frequency features).
    residual_change:    {(first, last): (rows, h*w) fp32} for the plan's `residual_change_for` ranges:
                        per token, the mean over channels of the squared change of the residual stream
                        from entering block `first` to leaving block `last` (rows as in the step:
                        [cond; uncond] under CFG).
    """

    scale: int
    h: int
    w: int
    token_entropy: torch.Tensor
    logits: torch.Tensor
    cond_logits: Optional[torch.Tensor]
    attention_entropy: dict[int, torch.Tensor]
    attention_query_index: dict[int, torch.Tensor]
    executed_tokens: dict[int, dict[str, int]]
    tau: float
    cfg: float
    summed_codes: Optional[torch.Tensor] = None
    decode: Optional[Callable[[torch.Tensor], torch.Tensor]] = None
    residual_change: dict[tuple[int, int], torch.Tensor] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class GenerationContext:
    """Static facts about the generation a policy is reset for."""

    schedule: tuple[tuple[int, int], ...]   # (h, w) token grid per scale
    depth: int
    embed_dim: int
    num_heads: int
    batch: int                              # B prompts
    cfg_rows: bool                          # rows = 2B ([cond; uncond])
    cfg: tuple[float, ...]                  # per-scale guidance
    tau: tuple[float, ...]                  # per-scale temperature
    device: str = "cpu"
    backbone: str = "infinity"              # the model family: "infinity" (bit tokens) | "hart" (categorical
                                            # tokens; stage 0 is the text context, run in full)

    @property
    def rows(self) -> int:
        return 2 * self.batch if self.cfg_rows else self.batch

    def tokens(self, si: int) -> int:
        h, w = self.schedule[si]
        return h * w


def is_neutral(plan: ScalePlan) -> bool:
    """True if the plan changes nothing the model computes: every scale runs, every block in full,
    no guidance/temperature override, both CFG halves. (Residual caching and entropy requests
    only observe, so they do not count; a post-block fill, a code mask or an area input resize does.) KV budgets do not count here either: whether one evicts
    depends on the cache length at run time, so the runtime marks a scale whose budget evicted
    something as not neutral itself (trace `neutral`). A "decide" attention plan returns the dense
    output (it only remembers), so it counts as neutral; "indexed" and "block_mask" do not."""
    return (
        plan.run
        and all(bp.mode == "full" for bp in plan.blocks.values())
        and all(ap.kind in ("dense", "decide") for ap in plan.attn.values())
        and plan.cfg is None
        and plan.tau is None
        and not plan.drop_uncond
        and plan.post_fill is None
        and plan.code_mask is None
        and plan.input_resize == "trilinear"
    )
