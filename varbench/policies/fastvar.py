"""`fastvar`: cached token pruning on the late scales, plus skipping the last scales.

Method card
-----------
Paper:   FastVAR: Linear Visual Autoregressive Modeling via Cached Token Pruning (Guo et al.,
         ICCV 2025); code csguoh/FastVAR `Infinity/` (a fork of Infinity).
Changes: (1) at the pruned scales, in blocks 3..27 of 32, each sublayer (SA, CA, FFN) runs only on
         the tokens farthest from the scale's mean token ("pivotal tokens"), re-ranked before every
         sublayer on the live stream; the pruned tokens' K/V are dropped from that scale;
         (2) pruned positions receive the same block/sublayer's residual update cached at an
         earlier unpruned scale, area-upsampled ("cached token restoration");
         (3) the last scales are not run at all (the image decodes the codes summed so far).
As released (2B, 1024², batch 1): scales 32² and 40² (indices 9, 10) pruned at ratios 0.4 and
0.5 (kept = L - int(L*ratio): 615 of 1024, 800 of 1600), the cache taken at 24² (index 8),
48² and 64² (indices 11, 12) skipped.

Generalised here (the release hard-codes token-map widths 24/32/40/48/64, one prompt, 32 blocks):
- scales are schedule indices; the released widths map to indices counted from the end of the
  schedule (cache -5, prune -4 and -3, skip -2 and -1), which equals the release on every '1M'
  schedule (13 scales, any aspect ratio). On shorter presets (e.g. '0.25M', 10 scales) the
  from-end reading shifts the whole recipe down; give absolute indices to pin it instead;
- the block range is a fraction of depth (3/32 .. 28/32; 8B's 40 blocks -> 4..34);
- any batch size; CFG halves choose independently (as released) or share the cond choice.
Nothing here is reconstructed: every mechanism is the release's; only the addressing is general.

Knobs (which way they trade speed against quality):
  prune          {scale: ratio}. Higher ratio -> fewer tokens -> faster, lower quality. A ratio of
                 1.0 skips the scale (FastVAR's "100% pruning"); 0 leaves it alone.
  skip           scales not run at all (fastest lever; the image loses that scale's detail).
  cache_scale    the unpruned scale whose residuals fill pruned slots (None: the scale just before
                 the first pruned one). Closer to the pruned scales -> better fill, same cost.
  first_block_frac / last_block_frac  pruned blocks [round(depth*first), round(depth*last)).
                 A wider range -> faster, riskier (FastVAR protects the first 3 and last 4).
  cfg_selection  "per_row" (released) or "cond" (one mask per prompt). Speed-neutral.
  prune_kv       drop pruned tokens from the scale's K/V (released; cheaper attention) or keep
                 them as keys (queries-only pruning; slower, closer to the baseline).
  fill           "cache" (released) or "pass" (no restoration: an ablation; same speed, worse).
  sublayers      which sublayers are pruned (released: all three).
"""
from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from ..plan import BlockPlan, GenerationContext, ScalePlan
from .base import Policy
from .common import block_range, check_choice, n_keep_from_ratio, resolve_scale, resolve_scale_map
from .selectors import PivotalSelector

RELEASED_PRUNE = {-4: 0.4, -3: 0.5}
RELEASED_SKIP = (-2, -1)
RELEASED_CACHE = -5


class FastVAR(Policy):
    name = "fastvar"

    def __init__(
        self,
        prune: Optional[Mapping[int, float]] = None,
        skip: Sequence[int] = RELEASED_SKIP,
        cache_scale: Optional[int] = RELEASED_CACHE,
        first_block_frac: float = 3 / 32,
        last_block_frac: float = 28 / 32,
        cfg_selection: str = "per_row",
        prune_kv: bool = True,
        fill: str = "cache",
        sublayers: Sequence[str] = ("sa", "ca", "ffn"),
    ):
        self.prune_spec = dict(RELEASED_PRUNE if prune is None else prune)
        self.skip_spec = [int(s) for s in skip]
        self.cache_spec = cache_scale
        self.first_block_frac, self.last_block_frac = float(first_block_frac), float(last_block_frac)
        check_choice("cfg_selection", cfg_selection, ("per_row", "cond"))
        check_choice("fill", fill, ("cache", "pass"))
        self.cfg_selection, self.prune_kv, self.fill = cfg_selection, bool(prune_kv), fill
        self.sublayers = tuple(sublayers)
        for r in self.prune_spec.values():
            if not 0.0 <= float(r) <= 1.0:
                raise ValueError(f"fastvar: prune ratios must be in [0, 1] (1.0 = skip the scale), got {r}")
        block_range(32, self.first_block_frac, self.last_block_frac)  # validate early

    # -- per generation ---------------------------------------------------------------------
    def reset(self, ctx: GenerationContext) -> None:
        super().reset(ctx)
        n = len(ctx.schedule)
        ratios = resolve_scale_map(self.prune_spec, n, what="fastvar.prune")
        self.skipped = {si for si, r in ratios.items() if r >= 1.0}
        for s in self.skip_spec:
            si = resolve_scale(s, n, what="fastvar.skip")
            if si is not None:
                self.skipped.add(si)
        self.n_keep: dict[int, int] = {}
        for si, r in ratios.items():
            if si in self.skipped or r <= 0.0:
                continue
            k = n_keep_from_ratio(ctx.tokens(si), r)
            if k < ctx.tokens(si):
                self.n_keep[si] = k
        self.blocks = block_range(ctx.depth, self.first_block_frac, self.last_block_frac)
        self.cache_scale: Optional[int] = None
        if self.n_keep and self.fill == "cache" and len(self.blocks):
            first = min(self.n_keep)
            if self.cache_spec is None:
                cs = first - 1
            else:
                cs = resolve_scale(int(self.cache_spec), n, what="fastvar.cache_scale")
            if cs is None or cs < 0 or cs >= first or cs in self.n_keep or cs in self.skipped:
                raise ValueError(
                    f"fastvar: cache_scale={self.cache_spec!r} resolves to {cs} on a {n}-scale schedule, but it must be "
                    f"an unpruned, executed scale before the first pruned scale {first}. Set cache_scale to an earlier "
                    "index (or None for the scale just before the first pruned one).")
            self.cache_scale = cs

    def plan(self, si: int) -> ScalePlan:
        if si in self.skipped:
            return ScalePlan(run=False)
        if si == self.cache_scale:
            return ScalePlan(keep_residuals=True)
        if si in self.n_keep:
            sel = PivotalSelector(self.n_keep[si], self.cfg_selection)
            bp = BlockPlan(mode="prune", selector=sel, n_keep=self.n_keep[si], sublayers=self.sublayers,
                           fill=self.fill, cache_from=self.cache_scale, prune_kv=self.prune_kv)
            return ScalePlan(blocks={b: bp for b in self.blocks})
        return ScalePlan()

    def stats(self) -> dict[str, Any]:
        ctx = self.ctx
        return {
            "pruned": {int(si): {"n_keep": k, "tokens": ctx.tokens(si)} for si, k in sorted(self.n_keep.items())},
            "skipped": sorted(self.skipped),
            "cache_scale": self.cache_scale,
            "blocks": [self.blocks.start, self.blocks.stop - 1] if len(self.blocks) else [],
        }

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "prune": {str(k): v for k, v in self.prune_spec.items()}, "skip": self.skip_spec,
                "cache_scale": self.cache_spec, "first_block_frac": self.first_block_frac,
                "last_block_frac": self.last_block_frac, "cfg_selection": self.cfg_selection,
                "prune_kv": self.prune_kv, "fill": self.fill, "sublayers": list(self.sublayers)}
