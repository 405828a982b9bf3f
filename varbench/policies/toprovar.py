"""`toprovar`: attention-entropy sparsity on three levels: scale depth, Global/Detail layers, tokens.

Method card
-----------
Paper:   ToProVAR (Chen et al., ICLR 2026, arXiv 2602.22948). No public code. Sources: the full text
         (Sec. 4, Eqs. 2-6, Table 6, appendix A.1.5 / Table 10, A.2, A.5); notes in
         reference/nova_toprovar.md. Provenance per step: "as published" (the paper states it),
         "reconstructed" (the paper is silent or self-contradictory; a knob says which reading).
         Nothing here is "as released": there is no release.
Steps (layer_mode=full, the default, is the paper's full method, A.1.5 "Scale + Layer + Token"):
  1. entropy    per-query self-attention entropy (Eq. 2) on the cosine-attention logits, mean over
                heads (A.3.2) - as published. Exact (LSE - E[logit]); on CUDA from the attention pass
                (FAE, Alg. 2, with its missing rescale term fixed) - as published in intent.
  2. rho_s      fraction of queries below the scale's mean entropy (Eq. 3) - as published; pooled
                over all layers (`rho_source`) - reconstructed.
  3. depth D    first scale with rho_s >= tau, tau = 0.4 (Sec. 4, A.2) - as published; the appendix's
                rho_s <= tau (Eq. 13) is `depth_rule=rho_le_tau`. No crossing, no pruning (A.5.4) -
                as published. Scales smaller than d_min_tokens cannot be D - reconstructed.
  4. onset      D is known once scale D has run, so the first changed scale is D + depth_offset (1):
                scale D runs in full, as A.5.1 Eq. 9 ("prune all subsequent scales s > D") - as
                published; the online offset itself is forced by causality - reconstructed.
  5. layers     once, at svd_scale (0-based 5 = the paper's s = 6, Table 6), each layer's h x w entropy
                map is factored; rho_l = sigma1/sigma2 (Eq. 4) - as published; the map is centred
                first (uncentred sigma1 is the mean level and every layer reads Global) -
                reconstructed. R_l = exp(-beta (rho_l - 1)) - as published; beta = 1.0 -
                reconstructed (not given). Detail iff R_l >= detail_min_R (0.5) - reconstructed.
  6. layer skip from the onset, Global layers run in full ("pruning only the latter", Sec. 4) - as
                published. A Detail layer is skipped when Eq. 6 would prune at least layer_skip_prune
                (0.5) of its tokens on average, else it is token-pruned (step 7): A.1.5's "layer
                skipping ... and token pruning restricted to selected Detail layers" - the
                selection rule is reconstructed (Detail layers at later scales, higher R and more
                diffuse entropy get skipped; alpha = 0 skips nothing).
  7. tokens     P_keep = 1 - clip(a_min + (a_max - a_min) phi(s) R_l Hhat_i) with phi = s/S_max
                (Eqs. 5-6) - as published; Hhat min-max normalised (the printed sum-normalisation
                makes Hhat ~ 1/N and the gate constant; `entropy_norm=sum` keeps it) -
                reconstructed; a_min = 0.3, a_max = 0.9 - reconstructed (not given; a_max from
                Fig. 3 "up to 90%"); the k = E[kept] lowest-entropy tokens kept (deterministic
                top-k, not Bernoulli) - reconstructed; the gate at scale s reads the layer's map
                from the previous scale it ran at, upsampled (causality) - reconstructed.
  8. pruned     tokens pass through the layer unchanged (no cache fill; A.5.3's error is the dropped
                token energy) - reconstructed; they are dropped from that scale's K/V as well
                (prune_kv=true) - reconstructed (the paper does not say).
  9. exit       with post_scales = k, only k scales from the onset run; later ones are dropped
                (a reading of "adaptive scale skipping" in the combined variants) - reconstructed;
                default null: every scale runs.
Table 10 rows (varbench/conf/method/toprovar_*.yaml): fixed exit (fixed_exit=-4: 32² on '1M'; the paper's
exit scale is not given - reconstructed), scale only (depth_mode=truncate_after_D: every scale
after D dropped - as published), scale + token (layer_mode=uniform: every layer gated, R = 1 - as
published), scale + layer (layer_mode=skip_detail_layers: Detail layers skipped, Global layers in
full - as published, "largely preserved" read as fully), full (layer_mode=full). Also
gate_detail_only (every Detail layer token-gated, none skipped; the previous default) and
gate_only (every layer gated, weighted by R).
FLOPs ordering (experiments/flops_table.py scenario, 2B 1024², cfg 4, D = 32²; see docs/methods.md):
the paper's order scale+layer > full > scale+token holds iff the uniform gate keeps more tokens
than the Global layers' share (7/32 in the scenario) plus the token-pruned Detail layers' work.
How far that rests on the reconstructed layer_skip_prune, alpha, beta and detail_min_R: the
sensitivity table in docs/methods.md (experiments/toprovar_sensitivity.py).

Knobs: `ToProVARKnobs` below (each knob's default, type, range, and which way it trades speed
against quality; FACT/RECON per knob).

On HART (translated): the attention entropy per query is computed as on Infinity; HART's stage 0 is
its text context (one signal: the last text token's query), never pruned or skipped. Scale knobs are
positions on HART's 14 stages (`svd_scale` 5 = 7², vs 12² on Infinity at 1M; RECON).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch

from varbench.engine.plan import BlockPlan, GenerationContext, ScalePlan, ScaleSignals
from varbench.engine.policy import DocRow, MethodCard, Policy
from varbench.policies.common import cond_rows, expand_to_rows, protected_blocks, resolve_scale
from varbench.policies.knobs import MethodKnobs, knob
from varbench.policies.selectors import complete_map, topk_indices, upsample_map


def rho_blocks_for(rho_source: str, depth: int, rho_layers: Optional[Sequence[int]] = None) -> list[int]:
    """The blocks whose attention entropies are pooled into rho_s."""
    if rho_source == "mean_over_layers_heads":
        return list(range(depth))
    if rho_source == "last_layer":
        return [depth - 1]
    return sorted({int(b) % depth for b in (rho_layers or ())})


def low_entropy_ratio(att: dict, blocks: Sequence[int], ctx: GenerationContext) -> Optional[torch.Tensor]:
    """rho_s per prompt (Eq. 3): the share of queries whose entropy (mean over `blocks`, heads already
    averaged) lies below the scale's mean. att: {block: (rows, n_queries)}; None if no block reported."""
    per_block = [cond_rows(att[b], ctx).float() for b in blocks if b in att]
    if not per_block:
        return None
    H = torch.stack(per_block).mean(0)                      # (B, n_queries), mean over layers
    return (H < H.mean(-1, keepdim=True)).float().mean(-1)  # (B,)


#: full: Global layers in full, Detail layers skipped or token-gated (A.1.5 full method);
#: gate_detail_only: every Detail layer token-gated; gate_only: every layer gated, weighted by R;
#: skip_detail_layers: Table 10 "Scale + Layer"; uniform: Table 10 "Scale + Token" (R = 1).
LAYER_MODES = ("full", "gate_detail_only", "gate_only", "skip_detail_layers", "uniform")


@dataclass(frozen=True)
class ToProVARKnobs(MethodKnobs, method="toprovar"):
    """ToProVAR's knobs, for the full method (A.1.5 "Scale + Layer + Token"; the card above has the
    provenance of every step). FACT = the paper states it, RECON = reconstructed.

    tau               FACT 0.4. rho_ge_tau: lower -> earlier depth D -> faster.
    depth_rule        rho_ge_tau (main text) | rho_le_tau (appendix Eq. 13).
    depth_offset      first pruned scale = D + offset (>= 1: D is known only once scale D has run, and
                      a scale's plan is fixed before it runs; larger -> slower, safer).
    d_min_tokens      RECON: scales smaller than this cannot be D.
    rho_source        mean_over_layers_heads | last_layer | layer_subset (with rho_layers).
    rho_layers        blocks pooled for layer_subset.
    rho_queries       subsample for the rho estimate (null: every query).
    depth_mode        prune_from_D (full) | truncate_after_D (scale-only: fastest).
    fixed_exit        last scale run for the fixed-exit ablation (null: adaptive).
    post_scales       RECON: run only this many scales from D + offset, drop the rest (null: all).
    svd_scale         FACT: 0-based = the paper's 1-based s=6 (12² on '1M').
    svd_matrix        entropy_map_hxw: the only matrix the runtime's signals support.
    svd_center        RECON: centre the map before the SVD.
    beta              RECON (not given): R = exp(-beta (sigma1/sigma2 - 1)); higher -> more Global -> slower.
    global_threshold  optional hard split: sigma1/sigma2 > threshold -> Global.
    detail_min_R      RECON: Detail when R >= this.
    layer_mode        full (A.1.5) | gate_detail_only | gate_only | skip_detail_layers (scale+layer) |
                      uniform (scale+token).
    layer_skip_prune  RECON (full): a Detail layer is skipped when Eq. 6 would prune >= this share of its
                      tokens; lower -> faster.
    entropy_norm      minmax | mean | rank | sum (paper-literal: nearly no effect).
    alpha_min         RECON (not given); higher -> more pruning -> faster.
    alpha_max         RECON (Fig. 3: "up to 90%" of Detail tokens); higher -> faster.
    alpha_min_semantics  min_prune (Eq. 6) | min_keep (A.5.3).
    head_reduce       mean: the runtime averages heads.
    keep_mode         topk_deterministic | weighted_sample (seeded).
    keep_multiple     kept counts rounded up to a multiple.
    batch_rule        per_image (each image its own D, layers and kept counts, as at batch 1; the
                      runtime splits a batch where images disagree) | shared (one plan per batch).
    batch_keep        batch_rule=shared: max (safer) | mean: one kept count for the batch.
    batch_depth       batch_rule=shared: earliest | median | latest per-image D.
    share_mask_cfg    uncond rows reuse the cond choice.
    prune_kv          RECON (paper silent): drop pruned tokens from the scale's K/V (faster).
    protect_first, protect_last  blocks never pruned at either end (count or fraction of depth);
                      more -> slower, safer.
    min_tokens_to_prune  scales with fewer tokens never prune.
    seed              seed of weighted_sample.
    """
    tau: float = knob(0.4, ge=0.0, le=1.0)
    depth_rule: str = knob("rho_ge_tau", choices=("rho_ge_tau", "rho_le_tau"))
    depth_offset: int = knob(1, ge=1)
    d_min_tokens: int = knob(256, ge=0)
    rho_source: str = knob("mean_over_layers_heads", choices=("mean_over_layers_heads", "last_layer", "layer_subset"))
    rho_layers: Optional[Sequence[int]] = knob(None)
    rho_queries: Optional[int] = knob(None, ge=1)
    depth_mode: str = knob("prune_from_D", choices=("prune_from_D", "truncate_after_D"))
    fixed_exit: Optional[int] = knob(None, scale="index")
    post_scales: Optional[int] = knob(None, ge=1)
    svd_scale: int = knob(5, scale="index")
    svd_matrix: str = knob("entropy_map_hxw", choices=("entropy_map_hxw",))
    svd_center: bool = knob(True)
    beta: float = knob(1.0)
    global_threshold: Optional[float] = knob(None)
    detail_min_R: float = knob(0.5)
    layer_mode: str = knob("full", choices=LAYER_MODES)
    layer_skip_prune: float = knob(0.5, gt=0.0, le=1.0)
    entropy_norm: str = knob("minmax", choices=("minmax", "mean", "rank", "sum"))
    alpha_min: float = knob(0.3, ge=0.0, le=1.0)
    alpha_max: float = knob(0.9, ge=0.0, le=1.0)
    alpha_min_semantics: str = knob("min_prune", choices=("min_prune", "min_keep"))
    head_reduce: str = knob("mean", choices=("mean",))
    keep_mode: str = knob("topk_deterministic", choices=("topk_deterministic", "weighted_sample"))
    keep_multiple: int = knob(8, ge=1)
    batch_keep: str = knob("max", choices=("max", "mean"))
    batch_depth: str = knob("median", choices=("earliest", "median", "latest"))
    batch_rule: str = knob("per_image", choices=("per_image", "shared"))
    share_mask_cfg: bool = knob(True)
    prune_kv: bool = knob(True)
    protect_first: float = knob(0, ge=0)
    protect_last: float = knob(0, ge=0)
    min_tokens_to_prune: int = knob(256, ge=0)
    seed: int = knob(0, ge=0)


class ToProVAR(Policy):
    name = "toprovar"
    #: the method's card (varbench.engine.policy.MethodCard): figures, tables, `varbench.list`, docs/methods.md
    card = MethodCard(
        display_name='ToProVAR', colour='#009E73', marker='v',
        paper='ToProVAR (Chen et al., ICLR 2026, arXiv 2602.22948)',
        code='none public',
        reconstructed=('online causality, normalisation, alpha, beta, the skip-or-gate rule, K/V of pruned '
                       'tokens',),
        doc_rows=(DocRow('`toprovar`',
                         source='ToProVAR (paper text)',
                         changes='full method (A.1.5): depth D from the attention low-entropy fraction (tau '
                                 '0.4); Global/Detail layers by SVD at scale 6; from D+1 Global layers full, '
                                 'Detail layers skipped when the Eq. 6 gate would prune >= half their tokens, '
                                 'else token-gated; pruned tokens pass through',
                         reconstructed='online causality, normalisation, alpha, beta, the skip-or-gate rule, '
                                       'K/V of pruned tokens (see below)',
                         flops=('{flops:toprovar}*',
                                '{flops:e2e:toprovar}*')),
                  DocRow('`toprovar` Table 10 variants',
                         source='ToProVAR ablation',
                         changes='fixed exit / scale only / scale+layer / scale+token',
                         reconstructed='as above',
                         flops=('{flops:toprovar_fixed_exit} / {flops:toprovar_scale_only} / '
                                '{flops:toprovar_scale_layer} / {flops:toprovar_scale_token}*',
                                '{flops:e2e:toprovar_fixed_exit} / {flops:e2e:toprovar_scale_only} / '
                                '{flops:e2e:toprovar_scale_layer} / {flops:e2e:toprovar_scale_token}*'))))
    backbones = frozenset({"infinity", "hart"})   # attention and token entropies exist on both
    adaptive = True   # decisions read entropy / features of the prompt's own earlier scales
    Knobs = ToProVARKnobs
    #: the token gate prunes nothing (alpha 0); on the tiny runtime ('0.06M', up to 16x16) the depth
    #: and SVD scales are moved onto its schedule so the observation path runs too
    NEUTRAL = {"alpha_min": 0.0, "alpha_max": 0.0, "d_min_tokens": 16, "svd_scale": 2}
    #: every layer gated from the first candidate scale (tau 0) on the tiny runtime's schedule
    ACTIVE = {"d_min_tokens": 16, "min_tokens_to_prune": 16, "svd_scale": 2, "layer_mode": "uniform", "tau": 0.0}

    def __init__(self, **knobs: Any):
        # readings the runtime's signals cannot support, explained before the generic choice check
        if knobs.get("svd_matrix", "entropy_map_hxw") != "entropy_map_hxw":
            raise ValueError(f"toprovar.svd_matrix={knobs['svd_matrix']!r} needs per-head entropies or hidden states, "
                             "which the runtime's ScaleSignals do not carry (attention entropy comes averaged over "
                             "heads). Use entropy_map_hxw.")
        if knobs.get("head_reduce", "mean") != "mean":
            raise ValueError("toprovar.head_reduce must be 'mean': the runtime returns attention entropy averaged over heads.")
        kn = ToProVARKnobs(**knobs)   # types, ranges and choices (ConfigError naming the knob)
        if kn.rho_source == "layer_subset" and not kn.rho_layers:
            raise ValueError("toprovar.rho_source=layer_subset needs rho_layers (block indices).")
        self.k = kn.as_dict()
        for key, v in self.k.items():
            setattr(self, key, v)

    #: observe reads token / attention entropies on the host (one copy per scale, not one per block)
    reads_signals_on_host = True

    @property
    def per_image_decisions(self) -> bool:
        return self.batch_rule == "per_image"

    # -- per generation ---------------------------------------------------------------------
    def reset(self, ctx: GenerationContext) -> None:
        super().reset(ctx)
        n = self.n = len(ctx.schedule)
        self.exit_si = None if self.fixed_exit is None else resolve_scale(int(self.fixed_exit), n, what="toprovar.fixed_exit")
        self.svd_si = resolve_scale(int(self.svd_scale), n, what="toprovar.svd_scale")
        self.prunable = list(protected_blocks(ctx.depth, self.protect_first, self.protect_last))
        self.rho_blocks = rho_blocks_for(self.rho_source, ctx.depth, self.rho_layers)
        self.gen = torch.Generator().manual_seed(int(self.seed))
        # per-generation state
        self.rho: dict[int, list[float]] = {}
        self.D_img: list[Optional[int]] = [None] * ctx.batch
        self.D: Optional[int] = None
        self.varrho: dict[int, float] = {}
        self.R: dict[int, float] = {}
        self.detail: Optional[list[int]] = None
        # block -> (scale, (rows, L) entropy map): the latest *complete* map of each block (a pruned
        # block reports only its executed queries, so its map is kept from the last full run)
        self.maps: dict[int, tuple[int, torch.Tensor]] = {}
        self.record: dict[int, Any] = {}

    # -- helpers ------------------------------------------------------------------------------
    def _first_pruned(self) -> Optional[int]:
        return None if self.D is None else self.D + self.depth_offset

    def _layer_is_detail(self, l: int) -> bool:
        if self.detail is None:
            return True  # no SVD yet (svd_scale outside the schedule or not reached): treat as Detail
        return l in self.detail

    def _gated_blocks(self) -> list[int]:
        if self.layer_mode in ("gate_only", "uniform"):
            return self.prunable
        return [l for l in self.prunable if self._layer_is_detail(l)]

    def _could_be_pruned(self, si: int) -> bool:
        if self.exit_si is not None or si >= self.n:
            return False
        fp = self._first_pruned()
        if fp is not None:
            return si >= fp
        return True  # D not known yet: any later scale might be pruned

    def _normalise(self, H: torch.Tensor) -> torch.Tensor:
        if self.entropy_norm == "sum":
            return H / H.sum(-1, keepdim=True).clamp_min(1e-12)
        if self.entropy_norm == "mean":
            return H / H.mean(-1, keepdim=True).clamp_min(1e-12)
        if self.entropy_norm == "minmax":
            lo, hi = H.min(-1, keepdim=True).values, H.max(-1, keepdim=True).values
            return (H - lo) / (hi - lo).clamp_min(1e-12)
        ranks = H.argsort(-1).argsort(-1).float()
        return ranks / max(H.shape[-1] - 1, 1)

    def _p_keep(self, Hhat: torch.Tensor, si: int, R: float) -> torch.Tensor:
        q = ((si + 1) / self.n) * R * Hhat  # phi(s) = s / S_max with 1-based s
        if self.alpha_min_semantics == "min_prune":
            return 1.0 - (self.alpha_min + (self.alpha_max - self.alpha_min) * q).clamp(0.0, 1.0)
        return (1.0 - self.alpha_max * q).clamp(self.alpha_min, 1.0)

    def _entropy_map(self, l: int, dst: int) -> tuple[Optional[int], Optional[torch.Tensor]]:
        if l not in self.maps:
            return None, None
        src, m = self.maps[l]
        return src, upsample_map(m, self.ctx.schedule[src], self.ctx.schedule[dst], "area")

    # -- the policy ---------------------------------------------------------------------------
    def plan(self, si: int) -> ScalePlan:
        if self.exit_si is not None:
            return ScalePlan(run=si <= self.exit_si)
        fp = self._first_pruned()
        if fp is not None and si >= fp and self.depth_mode == "truncate_after_D":
            return ScalePlan(run=False)
        if fp is not None and self.post_scales is not None and si >= fp + int(self.post_scales):
            return ScalePlan(run=False)
        # which attention entropies this scale must report
        want: set[int] = set()
        full_queries = False
        if si == self.svd_si:
            want.update(range(self.ctx.depth))
            full_queries = True
        candidate = self.D is None and self.ctx.tokens(si) >= self.d_min_tokens
        if candidate:
            want.update(self.rho_blocks)
        if self.depth_mode == "prune_from_D" and self.layer_mode != "skip_detail_layers" and self._could_be_pruned(si + 1) \
                and (candidate or (fp is not None and si + 1 >= fp)) and si + 1 < self.n \
                and self.ctx.tokens(si + 1) >= self.min_tokens_to_prune:
            gated = self._gated_blocks()
            if gated:
                want.update(gated)
                full_queries = True
        queries = None if full_queries else self.rho_queries

        blocks: dict[int, BlockPlan] = {}
        if fp is not None and si >= fp and self.ctx.tokens(si) >= self.min_tokens_to_prune:
            blocks = self._prune_blocks(si)
        return ScalePlan(blocks=blocks, attention_entropy_for=frozenset(want),
                         attention_entropy_queries=queries if want else None)

    def _prune_blocks(self, si: int) -> dict[int, BlockPlan]:
        L = self.ctx.tokens(si)
        blocks: dict[int, BlockPlan] = {}
        rec: dict[str, Any] = {}
        if self.layer_mode == "skip_detail_layers":
            for l in self.prunable:
                if self._layer_is_detail(l):
                    blocks[l] = BlockPlan(mode="skip")
            self.record[si] = {"skipped_blocks": sorted(blocks)}
            return blocks
        srcs = set()
        skipped: list[int] = []
        for l in self._gated_blocks():
            src, H = self._entropy_map(l, si)
            if H is None:
                continue
            srcs.add(src)
            if self.share_mask_cfg:
                H = cond_rows(H, self.ctx)
            R = 1.0 if self.layer_mode == "uniform" else self.R.get(l, 1.0)
            p = self._p_keep(self._normalise(H), si, R)
            per_row = p.sum(-1)
            expected = float(per_row.max() if self.batch_keep == "max" else per_row.mean())
            if self.layer_mode == "full" and 1.0 - expected / L >= self.layer_skip_prune - 1e-9:
                blocks[l] = BlockPlan(mode="skip")  # layer skipping: the gate would drop most of it anyway
                skipped.append(int(l))
                continue
            k = min(L, max(1, math.ceil(expected - 1e-6)))
            if self.keep_multiple > 1:
                k = min(L, -(-k // self.keep_multiple) * self.keep_multiple)
            if k >= L:
                continue
            if self.keep_mode == "topk_deterministic":
                idx = topk_indices(-H, k)  # P_keep falls with entropy: keep the k lowest
            else:
                idx = torch.multinomial(p.clamp_min(1e-6), k, replacement=False, generator=self.gen).sort(-1).values
            if self.share_mask_cfg:
                idx = expand_to_rows(idx, self.ctx)
            blocks[l] = BlockPlan(mode="prune", keep=idx, n_keep=k, fill="pass",
                                  prune_kv=self.prune_kv)
            rec[int(l)] = k
        self.record[si] = {"n_keep": rec, "tokens": L, "entropy_from_scales": sorted(srcs)}
        if self.layer_mode == "full":
            self.record[si]["skipped_blocks"] = skipped
        return blocks

    def observe(self, si: int, signals: ScaleSignals) -> None:
        att = signals.attention_entropy or {}
        L = self.ctx.tokens(si)
        pos = signals.attention_query_index or {}
        full = {}
        for b, e in att.items():
            b = int(b)
            prev = None
            if b in self.maps:  # pruned / subsampled blocks: unmeasured queries keep the older map
                s0, m0 = self.maps[b]
                prev = upsample_map(m0, self.ctx.schedule[s0], self.ctx.schedule[si], "area")
            p = pos.get(b) if isinstance(pos, dict) else pos
            full[b] = complete_map(e, p, L, prev if prev is not None and prev.shape[0] == e.shape[0] else None)
            self.maps[b] = (si, full[b])
        if si == self.svd_si and self.detail is None and full:
            self._layer_scores(si, full)
        if self.D is None and att and self.ctx.tokens(si) >= self.d_min_tokens:
            self._depth_step(si, att)

    def _layer_scores(self, si: int, maps: dict[int, torch.Tensor]) -> None:
        h, w = self.ctx.schedule[si]
        for l, m in sorted(maps.items()):
            ratios = []
            for row in cond_rows(m, self.ctx):
                M = row.reshape(h, w)
                if self.svd_center:
                    M = M - M.mean()
                s = torch.linalg.svdvals(M.double())
                ratios.append(float(s[0] / s[1]) if s.numel() > 1 and s[1] > 1e-12 else float("inf"))
            vr = sum(ratios) / len(ratios)
            self.varrho[l] = vr
            self.R[l] = math.exp(-self.beta * (vr - 1.0)) if math.isfinite(vr) else 0.0
        if self.global_threshold is not None:
            self.detail = [l for l in self.varrho if self.varrho[l] <= self.global_threshold]
        else:
            self.detail = [l for l in self.R if self.R[l] >= self.detail_min_R]

    def _depth_step(self, si: int, att: dict) -> None:
        rho = low_entropy_ratio(att, self.rho_blocks, self.ctx)
        if rho is None:
            return
        self.rho[si] = [float(r) for r in rho]
        for i, r in enumerate(self.rho[si]):
            hit = r >= self.tau if self.depth_rule == "rho_ge_tau" else r <= self.tau
            if self.D_img[i] is None and hit:
                self.D_img[i] = si
        done = sorted(d for d in self.D_img if d is not None)
        need = {"earliest": 1, "median": (self.ctx.batch - 1) // 2 + 1, "latest": self.ctx.batch}[self.batch_depth]
        if len(done) >= need:
            self.D = done[need - 1]

    def stats(self) -> dict[str, Any]:
        return {
            "depth_D": self.D,
            "first_pruned": self._first_pruned() if self.exit_si is None else None,
            "fixed_exit": self.exit_si,
            "D_per_image": list(self.D_img),
            "rho": {int(s): v for s, v in sorted(self.rho.items())},
            "layer_varrho": {int(l): v for l, v in sorted(self.varrho.items())},
            "detail_layers": self.detail,
            "pruned": {int(s): r for s, r in sorted(self.record.items())},
        }

    def describe(self) -> dict[str, Any]:
        d = {"name": self.name}
        d.update({k: (list(v) if isinstance(v, tuple) else v) for k, v in self.k.items()})
        return d
