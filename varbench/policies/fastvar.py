"""`fastvar`: cached token pruning on the late scales, plus skipping the last scales.

Method card
-----------
Paper:   FastVAR: Linear Visual Autoregressive Modeling via Cached Token Pruning (Guo et al.,
         ICCV 2025); code csguoh/FastVAR @ 34cdd651 `Infinity/` (a fork of Infinity, 2B only:
         every script passes `model_type=infinity_2b`, h/w 1.0).

Each step, and where it comes from (file:line in csguoh/FastVAR; each claim has a test):
 (1) AS RELEASED. Pivotal tokens: before each of SA, CA and FFN the block re-scores the live
     stream, score_i = ||x_i - mean_j x_j||^2 per batch row (cond and uncond rows choose apart),
     and runs the sublayer on the L - int(L*ratio) highest-scoring tokens (`fastvar_utils.py:12-18,
     41-49`; `fastvar_basic.py:421-439`); the pruned tokens are dropped from that scale's K/V
     (`fastvar_basic.py:238-255`: q, k and v come from the kept tokens only).
     Tests: tests/policies/test_policies_plans.py::test_pivotal_selector_keeps_far_tokens_and_can_share_the_cfg_mask,
     ::test_fastvar_released_hand_count_on_2b_1024.
 (2) AS RELEASED. Cached token restoration: every block stores its three branch outputs (SA*gamma1,
     CA, FFN*gamma2) at the scale with 24*24 = 576 tokens (`fastvar_basic.py:416, 428-441`: the
     test is on the token count `x.shape[1] == 576`) and, at a pruned scale, area-resizes the
     cache *read as a 24x24 grid* to (h, w) and scatters the kept tokens' outputs into it
     (`fastvar_utils.py:23-27`). Test: tests/policies/test_fastvar_release_rule.py::test_release_rule_on_every_template.
 (3) AS RELEASED. Scale skipping: scales whose token-map *width* is 48 or 64 are not run
     (`infinity.py:587-588`, `if 48 == pn[2] or 64 == pn[2]: continue`; pn = (1, h, w)); the image
     decodes the codes summed so far. Test: as (2).
 (4) AS RELEASED. Which scales: pruning is keyed on the token-map *width* too:
     `ratio_hard_code = {32: 0.4, 40: 0.5}` applied where `original_w in [32, 40]`
     (`fastvar_utils.py:41-47`, `_, original_h, original_w = x_shape`). Test: as (2).
 (5) AS RELEASED. Which blocks: `layer_idx in range(3, 28)` (`fastvar_basic.py:421`), absolute
     block indices: 3..27 whatever the depth. Test: tests/policies/test_fastvar_release_rule.py::test_release_block_range_is_absolute.

Two rules, two presets
----------------------
`addressing: width` (the `fastvar` preset) is the released rule above, transcribed: prune keys are
token-map widths, skip entries are widths, the cache is the 24x24 scale, blocks 3..27. On the 15
aspect-ratio templates at '1M' it does what the release does:
  h/w 1.0                     prunes 32² and 40² (scales 9, 10), caches 24² (8), skips 48², 64²;
  h/w 1.25, 0.8, 1.333, 0.571, 2.0, 0.5, 3.0, 0.333
                              nothing: no scale has width 32/40/48/64 (the run equals the baseline,
                              as it does in the release; `stats()["active"]` is False);
  h/w 1.5, 1.75, 2.5, 0.4     width 32 or 40 occurs (e.g. 1.75: scales 10 = 56x32, 11 = 70x40) but
                              no 24x24 scale exists: the release's restoration reads a cache that was
                              never written (`None.view` in `fastvar_utils.py:24`, AttributeError, in a
                              fresh process; in a process that rendered a square image before, it
                              silently restores from that *earlier image's* 24x24 cache);
  h/w 0.75, 0.666             width 48 occurs mid-schedule (scale 10) and is skipped, then scale 11
                              runs on scale 10's input: the release fails
                              `assert t_mul_h_mul_w + need_to_pad == seq_len` (`infinity.py:393`).
Where the release would crash, this policy raises a ValueError at reset (before anything runs) naming
the aspect ratio, the scales and the generalised preset: the release defines no output there, so any
fallback would be a new method presented under FastVAR's name. Shorter presets follow the same rule
(square '0.25M' prunes 32² at scale 9 with the 24² cache; '0.06M' does nothing).

`addressing: index` (the `fastvar_generalised` preset, and the constructor defaults) is OURS, a
generalisation: scales are schedule indices (negative = from the end: cache -5, prune -4/-3, skip
-2/-1), so the recipe fires on every schedule and aspect ratio; it equals the release only on the
square '1M' schedule (elsewhere the release prunes other scales, nothing, or crashes). The block range is a fraction of depth (3/32 .. 28/32),
which equals 3..27 on the 2B; on the 8B's 40 blocks it gives 4..34, an EXTRAPOLATION (the release
never ran 8B; its literal rule would prune 3..27 of 40: `block_range: [3, 28]`, preset
`fastvar_8b_paper_release_blocks`). Test: tests/policies/test_fastvar_release_rule.py::test_generalised_rule_fires_everywhere.

Both: any batch size (the release is batch 1); CFG halves choose independently (as released) or
share the cond choice; the residual cache is per generation (the release never resets it).

Knobs: `FastVARKnobs` below (each knob's default, type, range, and which way it trades speed
against quality).

On HART: the same rule runs on HART's stages (`Policy.backbones`). `fastvar_hart` is FastVAR's own HART
port (csguoh/FastVAR `HART/`: widths 48 at 0.5 and 64 at 0.75, every block, sa and ffn, 36² cache,
no skip), equal to the port's outputs (tests/engine/test_fastvar_hart.py); the `fastvar` preset (the
Infinity widths) is refused there, and `fastvar_hart` on Infinity. HART's stage 0 is its text context:
never pruned (the runtime refuses it).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from varbench.core.errors import ConfigError
from varbench.engine.plan import BlockPlan, GenerationContext, ScalePlan
from varbench.engine.policy import DocRow, MethodCard, Policy
from varbench.policies.common import block_range as depth_block_range, n_keep_from_ratio, resolve_scale, resolve_scale_map
from varbench.policies.knobs import MethodKnobs, knob
from varbench.policies.selectors import PivotalSelector

log = logging.getLogger("varbench")

# The released rule (csguoh/FastVAR @ 34cdd651, Infinity/infinity/models/...)
RELEASED_PRUNE_WIDTHS = {32: 0.4, 40: 0.5}   # fastvar_utils.py:41-47 (keyed on the token-map width)
RELEASED_SKIP_WIDTHS = (48, 64)              # infinity.py:587-588 (pn[2] = width)
RELEASED_CACHE_EDGE = 24                     # fastvar_basic.py:416 (cached_size [24, 24]), 428 (576 tokens)
RELEASED_BLOCKS = (3, 28)                    # fastvar_basic.py:421 (range(3, 28), absolute)
# The generalised rule (ours): the same recipe counted from the end of the schedule
GENERALISED_PRUNE = {-4: 0.4, -3: 0.5}
GENERALISED_SKIP = (-2, -1)
GENERALISED_CACHE = -5
# old names, kept for importers
RELEASED_PRUNE, RELEASED_SKIP, RELEASED_CACHE = GENERALISED_PRUNE, GENERALISED_SKIP, GENERALISED_CACHE


def describe_schedule(schedule: Sequence[tuple[int, int]]) -> str:
    """'h/w 1.75 (1M)' for a template schedule, else the last grid."""
    from varbench.engine.backbones.infinity.schedules import RESOLUTION_PRESETS, TEMPLATES

    sched = [tuple(g) for g in schedule]
    for ratio, grids in TEMPLATES.items():
        for pn, n in RESOLUTION_PRESETS.items():
            if n == len(sched) and [tuple(g) for g in grids[:n]] == sched:
                return f"h/w {ratio} ({pn})"
    h, w = sched[-1]
    return f"a {len(sched)}-scale schedule ending at {h}x{w} (h/w {h / w:.3f})"


@dataclass(frozen=True)
class FastVARKnobs(MethodKnobs, method="fastvar"):
    """FastVAR's knobs (where each rule comes from: the card above), and which way each trades speed
    against quality:

    addressing     index (ours, generalised: keys are schedule indices, negative from the end; the
                   default) | width (the released rule: keys are token-map widths; preset `fastvar`).
                   Decides how prune, skip and cache_scale are read.
    prune          {scale: ratio}: widths (width) or schedule indices (index); kept = L - int(L*ratio).
                   Higher ratio -> fewer tokens -> faster, lower quality; 1.0 skips the scale (FastVAR's
                   "100% pruning"; ours in width mode, where the release has no such entry); 0 leaves it
                   alone. null = the addressing's default (index {-4: 0.4, -3: 0.5}, width {32: 0.4,
                   40: 0.5}); every preset states it (a map merges key by key in Hydra).
    skip           scales not run at all, widths or indices: the dominant saving (loses that scale's
                   detail); fewer -> slower, sharper. null = the addressing's default (index [-2, -1],
                   width [48, 64]).
    cache_scale    index: the unpruned scale whose residuals fill pruned slots (null: the scale just
                   before the first pruned one); width: the edge C of the C x C cache scale (released 24,
                   the default when a width-addressed policy is built without it). Closer to the pruned
                   scales -> better fill, same cost.
    block_range    [first, stop): absolute pruned blocks (released [3, 28], the width rule's default);
                   overrides the fractions. null: the fractions below. Wider -> faster, riskier.
    first_block_frac / last_block_frac  pruned blocks [round(depth*first), round(depth*last)) when
                   block_range is null (3/32, 28/32: 3..27 on the 2B, 4..34 on the 8B, an
                   extrapolation). Not composed by default: only the index-addressed presets state them.
    cfg_selection  per_row (released: cond/uncond rows rank separately) | cond (one mask per prompt);
                   speed-neutral.
    prune_kv       drop pruned tokens from the scale's K/V (released; cheaper attention) | false: keep
                   them as keys (queries-only pruning; slower, closer to the baseline).
    fill           cache (released restoration) | pass (no restoration: an ablation; same speed, worse).
    sublayers      pruned sublayers (released: all three); fewer -> slower.
    """
    addressing: str = knob("index", choices=("index", "width"))
    prune: Optional[Mapping[int, float]] = knob(None, ge=0.0, le=1.0)
    skip: Optional[Sequence[int]] = knob(None)
    cache_scale: Optional[int] = knob(GENERALISED_CACHE)
    block_range: Optional[Sequence[int]] = knob(None, ge=0)
    first_block_frac: float = knob(3 / 32, ge=0.0, le=1.0, composed=False)
    last_block_frac: float = knob(28 / 32, ge=0.0, le=1.0, composed=False)
    cfg_selection: str = knob("per_row", choices=("per_row", "cond"))
    prune_kv: bool = knob(True)
    fill: str = knob("cache", choices=("cache", "pass"))
    sublayers: Sequence[str] = knob(("sa", "ca", "ffn"), choices=("sa", "ca", "ffn"))


class FastVAR(Policy):
    name = "fastvar"
    #: the method's card (varbench.engine.policy.MethodCard): figures, tables, `varbench.list`, docs/methods.md
    card = MethodCard(
        display_name='FastVAR', colour='#0072B2', marker='s',
        paper='FastVAR: Linear Visual Autoregressive Modeling via Cached Token Pruning (Guo et al., ICCV 2025)',
        code='csguoh/FastVAR @ 34cdd651',
        reconstructed=('the generalised rule of `fastvar_generalised` (ours)',
                       'the 8B block range (extrapolated)'),
        doc_rows=(DocRow('`fastvar`',
                         source='csguoh/FastVAR @ 34cdd651 (code)',
                         changes='the released rule, keyed on token-map **width** as in the release: prunes '
                                 'widths 32/40 (0.4/0.5) in blocks 3..27 (absolute) with pivotal-token '
                                 're-ranking per sublayer, fills from the 24×24 residual cache, skips widths '
                                 '48/64',
                         reconstructed='as released (every step; `tests/policies/test_fastvar_release_rule.py` '
                                       'checks all 15 templates × 4 presets against a transcription). Acts '
                                       'only on square schedules; a no-op at h/w 1.25, 0.8, 1.333, 0.571, 2.0, '
                                       '0.5, 3.0, 0.333; refuses at 1.5, 1.75, 2.5, 0.4 (no 24² cache) and '
                                       '0.75, 0.666 (mid-schedule skip), where the release crashes',
                         flops=('{flops:fastvar} (8B: {flops:8b:fastvar}, blocks 3..27 of 40)',
                                '{flops:e2e:fastvar} (8B: {flops:8b:e2e:fastvar})')),
                  DocRow('`fastvar_generalised`',
                         source='– (ours)',
                         changes='the same recipe by schedule position from the end (cache -5, prune -4/-3, '
                                 'skip -2/-1), block range 3/32..28/32 of depth',
                         reconstructed='generalised: equals `fastvar` on the square 1M schedule only; fires on '
                                       'every aspect ratio and model (8B: blocks 4..34, an extrapolation)',
                         flops=('{flops:fastvar_generalised} (8B: {flops:8b:fastvar_generalised})',
                                '{flops:e2e:fastvar_generalised} (8B: {flops:8b:e2e:fastvar_generalised})')),
                  DocRow('`fastvar_2b_paper`',
                         source='ToProVAR Table 8',
                         changes='ratios 0.4/0.6, on the generalised rule',
                         reconstructed='–',
                         flops=('{flops:fastvar_2b_paper}',
                                '{flops:e2e:fastvar_2b_paper}')),
                  DocRow('`fastvar_8b_paper` (`_release_blocks`)',
                         source='ToProVAR Table 8',
                         changes='{10: 0.4, 11: 0.6, 12/13 skipped} on the generalised rule; blocks 4..34 of '
                                 "40 (extrapolated; the alternative keeps the release's literal 3..27)",
                         reconstructed='block range extrapolated',
                         flops=('8B: {flops:8b:fastvar_8b_paper} ({flops:8b:fastvar_8b_paper_release_blocks})',
                                '8B: {flops:8b:e2e:fastvar_8b_paper} '
                                '({flops:8b:e2e:fastvar_8b_paper_release_blocks})'))))
    backbones = frozenset({"infinity", "hart"})   # FastVAR released a HART port (its HART/ folder): the same rule
    Knobs = FastVARKnobs
    #: nothing pruned, nothing skipped: the baseline's plans
    NEUTRAL = {"prune": {}, "skip": []}
    #: the generalised defaults (on the tiny runtime's '0.06M': cache 4², prune 6²/8², skip 12²/16²)
    ACTIVE = {}

    def __init__(self, **knobs: Any):
        if knobs.get("addressing") == "width" and "cache_scale" not in knobs:
            knobs["cache_scale"] = RELEASED_CACHE_EDGE   # the width rule's cache: the 24x24 scale
        kn = FastVARKnobs(**knobs)   # types, ranges and choices (ConfigError naming the knob)
        self.addressing = kn.addressing
        released = kn.addressing == "width"
        self.prune_spec = dict((RELEASED_PRUNE_WIDTHS if released else GENERALISED_PRUNE) if kn.prune is None else kn.prune)
        self.skip_spec = [int(s) for s in ((RELEASED_SKIP_WIDTHS if released else GENERALISED_SKIP) if kn.skip is None else kn.skip)]
        self.cache_spec = kn.cache_scale
        block_range = RELEASED_BLOCKS if kn.block_range is None and released else kn.block_range
        self.block_range_spec = None if block_range is None else tuple(int(b) for b in block_range)
        if self.block_range_spec is not None and (len(self.block_range_spec) != 2
                                                  or not 0 <= self.block_range_spec[0] <= self.block_range_spec[1]):
            raise ValueError(f"fastvar: block_range must be [first, stop) with 0 <= first <= stop, got {block_range!r}")
        self.first_block_frac, self.last_block_frac = float(kn.first_block_frac), float(kn.last_block_frac)
        self.cfg_selection, self.prune_kv, self.fill = kn.cfg_selection, bool(kn.prune_kv), kn.fill
        self.sublayers = tuple(kn.sublayers)
        if released:
            keys = [*self.prune_spec, *self.skip_spec] + ([] if self.cache_spec is None else [self.cache_spec])
            bad = [k for k in keys if not (isinstance(k, int) or str(k).isdigit()) or int(k) <= 0]
            if bad:
                raise ValueError(f"fastvar: addressing=width reads prune/skip/cache_scale as token-map widths (positive "
                                 f"ints, e.g. prune {{32: 0.4, 40: 0.5}}); got {bad}. For schedule indices (negative = "
                                 "from the end) set addressing: index (preset fastvar_generalised).")
            self.prune_spec = {int(k): float(v) for k, v in self.prune_spec.items()}
        depth_block_range(32, self.first_block_frac, self.last_block_frac)  # validate early

    def check_schedule(self, schedule: Sequence[tuple[int, int]], where: str) -> None:
        """Index addressing: every prune/skip/cache_scale index must lie on the schedule (else it would
        be silently ignored): ConfigError. Width addressing: widths absent from the schedule are
        what the released rule ignores; a warning names them when only some are absent."""
        n = len(schedule)
        if self.addressing == "index":
            keys = [("prune", k) for k in self.prune_spec] + [("skip", s) for s in self.skip_spec]
            if self.cache_spec is not None:
                keys.append(("cache_scale", self.cache_spec))
            for name, k in keys:
                try:
                    k = int(k)
                except (TypeError, ValueError):
                    raise ConfigError(f"{where}.{name}: scale index {k!r} is not an integer") from None
                if not -n <= k < n:
                    raise ConfigError(f"{where}.{name}: scale index {k} is outside the {n}-scale schedule "
                                      f"(valid: {-n}..{n - 1}, negative from the end); it would be silently ignored")
        else:
            widths = {w for _, w in schedule}
            absent = sorted({int(k) for k in [*self.prune_spec, *self.skip_spec] if int(k) not in widths})
            if absent and len(absent) < len(self.prune_spec) + len(self.skip_spec):
                log.warning("%s: widths %s are not on this %d-scale schedule (widths %s); the released rule ignores them",
                            where, absent, n, sorted(widths))

    # -- per generation ---------------------------------------------------------------------
    def _blocks(self, depth: int) -> range:
        if self.block_range_spec is not None:
            a, b = self.block_range_spec
            return range(min(a, depth), min(b, depth))  # the release tests `layer_idx in range(3, 28)`
        return depth_block_range(depth, self.first_block_frac, self.last_block_frac)

    def reset(self, ctx: GenerationContext) -> None:
        super().reset(ctx)
        self.blocks = self._blocks(ctx.depth)
        if self.addressing == "width":
            ratios, self.skipped = self._resolve_width(ctx)
        else:
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
        self.cache_scale: Optional[int] = None
        if self.n_keep and self.fill == "cache" and len(self.blocks):
            self.cache_scale = self._cache_width(ctx) if self.addressing == "width" else self._cache_index(ctx)

    def _resolve_width(self, ctx: GenerationContext) -> tuple[dict[int, float], set[int]]:
        """The released rule: a scale is pruned/skipped by its token-map width (`pn[2]`)."""
        sched = ctx.schedule
        ratios = {si: self.prune_spec[w] for si, (h, w) in enumerate(sched) if w in self.prune_spec}
        skipped = {si for si, (h, w) in enumerate(sched) if w in self.skip_spec} | {si for si, r in ratios.items() if r >= 1.0}
        runs_after = [si for si in sorted(skipped) if any(s not in skipped for s in range(si + 1, len(sched)))]
        if runs_after:
            si = runs_after[0]
            raise ValueError(
                f"fastvar (released rule, addressing=width): on {describe_schedule(sched)} the released code skips scale "
                f"{si} ({sched[si][0]}x{sched[si][1]}, width {sched[si][1]}) in the middle of the schedule and then runs "
                f"scale {si + 1} on scale {si}'s input, which fails `assert t_mul_h_mul_w + need_to_pad == seq_len` "
                "(csguoh/FastVAR Infinity/infinity/models/infinity.py:393). The release defines no image here. Use "
                "method=fastvar_generalised (schedule-index addressing: skips the last two scales on any schedule).")
        return ratios, skipped

    def _cache_width(self, ctx: GenerationContext) -> int:
        """The released cache: the scale with C*C tokens (fastvar_basic.py:428), read as a C x C grid (:24)."""
        sched, c = ctx.schedule, int(self.cache_spec) if self.cache_spec is not None else RELEASED_CACHE_EDGE
        first = min(self.n_keep)
        pruned = ", ".join(f"{si} ({sched[si][0]}x{sched[si][1]})" for si in sorted(self.n_keep))
        hits = [si for si in range(len(sched)) if ctx.tokens(si) == c * c]
        before = [si for si in hits if si < first]
        if not before:
            raise ValueError(
                f"fastvar (released rule, addressing=width): on {describe_schedule(sched)} the released code prunes scales "
                f"{pruned} (widths {sorted({sched[si][1] for si in self.n_keep})}) but no earlier scale has {c}x{c} = "
                f"{c * c} tokens, so its cached token restoration reads a cache that was never written (csguoh/FastVAR "
                "Infinity/infinity/models/fastvar_utils.py:24: AttributeError on None in a fresh process, or a stale cache "
                "from an earlier image). The release defines no image here. Use method=fastvar_generalised "
                "(schedule-index addressing: caches the 5th scale from the end on any schedule), or fill: pass.")
        cs = before[-1]
        if tuple(sched[cs]) != (c, c) or any(first < si for si in hits):
            raise ValueError(
                f"fastvar (released rule): on {describe_schedule(sched)} the {c * c}-token scale(s) {hits} are not a "
                f"single {c}x{c} scale before the pruned ones; the release would read them as a {c}x{c} grid. Use "
                "method=fastvar_generalised.")
        return cs

    def _cache_index(self, ctx: GenerationContext) -> int:
        n = len(ctx.schedule)
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
        return cs

    def plan(self, si: int) -> ScalePlan:
        if si in self.skipped:
            return ScalePlan(run=False)
        if si == self.cache_scale:
            return ScalePlan(keep_residuals=True)
        if si in self.n_keep and len(self.blocks):
            sel = PivotalSelector(self.n_keep[si], self.cfg_selection)
            bp = BlockPlan(mode="prune", selector=sel, n_keep=self.n_keep[si], sublayers=self.sublayers,
                           fill=self.fill, cache_from=self.cache_scale, prune_kv=self.prune_kv)
            # the cache is read by pruned scales only: free it once the last of them has run
            release = (frozenset({self.cache_scale}) if self.cache_scale is not None and not self.residual_reads_after(si)
                       else frozenset())
            return ScalePlan(blocks={b: bp for b in self.blocks}, release_residuals=release)
        return ScalePlan()

    def residual_reads_after(self, si: int) -> frozenset:
        """The scales whose kept residuals this policy's plans after scale `si` may read (the cache
        scale while a pruned scale is still to come). `compose` uses it to free caches early."""
        if self.cache_scale is None or not any(s > si for s in self.n_keep):
            return frozenset()
        return frozenset({self.cache_scale})

    def scheduled_skips(self) -> frozenset:
        """The scales this generation never runs (`skip`, and ratio-1.0 scales), fixed at reset."""
        return frozenset(self.skipped)

    def stats(self) -> dict[str, Any]:
        ctx = self.ctx
        return {
            "addressing": self.addressing,
            "active": bool(self.skipped or (self.n_keep and len(self.blocks))),
            "pruned": {int(si): {"n_keep": k, "tokens": ctx.tokens(si)} for si, k in sorted(self.n_keep.items())},
            "skipped": sorted(self.skipped),
            "cache_scale": self.cache_scale,
            "blocks": [self.blocks.start, self.blocks.stop - 1] if len(self.blocks) else [],
        }

    def no_effect_reason(self) -> Optional[str]:
        """Why the last generation ran as the baseline: the rule's keys matched no scale, or the
        block range holds none of the model's blocks (e.g. the released 3..27 on a shallower model)."""
        ctx = self.ctx
        where = describe_schedule(ctx.schedule)
        if self.skipped or (self.n_keep and len(self.blocks)):
            return None
        if self.n_keep:   # scales to prune exist, but no block does
            first, stop = self.block_range_spec or (self.first_block_frac, self.last_block_frac)
            return (f"fastvar: block range [{first}, {stop}) holds none of the model's {ctx.depth} blocks, so the "
                    f"scales to prune at {where} run in full")
        if self.addressing == "width":
            widths = "/".join(str(w) for w in sorted({*self.prune_spec, *self.skip_spec}))
            return f"fastvar: no schedule width in {widths} at {where}"
        return f"fastvar: no prune ratio or skip entry resolves to a scale of {where}"

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "addressing": self.addressing, "prune": {str(k): v for k, v in self.prune_spec.items()},
                "skip": self.skip_spec, "cache_scale": self.cache_spec,
                "block_range": None if self.block_range_spec is None else list(self.block_range_spec),
                "first_block_frac": self.first_block_frac, "last_block_frac": self.last_block_frac,
                "cfg_selection": self.cfg_selection, "prune_kv": self.prune_kv, "fill": self.fill,
                "sublayers": list(self.sublayers)}
