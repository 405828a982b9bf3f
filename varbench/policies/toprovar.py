"""`toprovar`: attention-entropy pruning on three levels: scale depth, Global/Detail layers, tokens.

Method card
-----------
Paper:   ToProVAR: Efficient Visual Autoregressive Modeling via Tri-Dimensional Entropy-Aware
         Semantic Analysis and Sparsity Optimization (Chen et al., ICLR 2026, arXiv 2602.22948).
         No public code; equations from the full text (reference notes nova_toprovar.md §3, knobs
         §6.3). FACT: tau = 0.4, the SVD scale (s = 6), Eqs. 3-6. RECON: every default marked so.
Changes: (scale) from the per-query self-attention entropy of each scale (exact, from the runtime:
         log-sum-exp minus expected logit of the cosine-attention logits, averaged over heads), the
         low-entropy fraction rho_s = |{i: H_i < mean H}| / N; the first scale D where rho crosses
         tau starts the pruning (or, in the scale-only ablation, ends the generation);
         (layer) once, at one early scale, each block's entropy map is factored by SVD; the ratio
         sigma1/sigma2 marks Global (dominant component, rho >> 1) vs Detail (rho ~ 1) layers,
         scored R = exp(-beta (rho - 1));
         (token) at pruned scales, token i of layer l is kept with probability
         1 - clip(alpha_min + (alpha_max - alpha_min) * phi(s) R_l Hhat_i, 0, 1): low-entropy
         (focused, salient) tokens are kept; pruned tokens pass through the layer unchanged.
Online causality (RECON, forced by static plans): D is known only after scale D is sampled, so
         pruning starts at D + depth_offset (>= 1); the token gate at scale s uses layer l's
         entropy map from the previous sampled scale, upsampled.
Ambiguities kept as knobs: the depth rule's direction (main text >= tau, appendix <= tau); the
         entropy normalisation (the printed sum-normalisation makes the gate nearly constant);
         alpha_min's meaning; which matrix the SVD factors; how layers and tokens combine
         (Table 10's variants are `layer_mode` values).

Knobs (speed <-> quality):
  tau             0.4 (FACT). With rho_ge_tau a lower tau -> earlier D -> faster.
  depth_rule      rho_ge_tau (main text) | rho_le_tau (appendix Eq. 13).
  depth_offset    first pruned (or dropped) scale = D + offset; >= 1 (larger -> slower, safer).
  d_min_tokens    (RECON) scales smaller than this cannot be D (rho is noisy on tiny grids).
  rho_source      mean_over_layers_heads | last_layer | layer_subset (rho_layers).
  rho_queries     None (every query) or a subsample size for the rho estimate (cheaper).
  depth_mode      prune_from_D (full method) | truncate_after_D (scale-only ablation: fastest).
  fixed_exit      index of the last scale run, for the "fixed scale exit" ablation (None: off).
  svd_scale       scale index of the SVD (default 5 = the paper's 1-based "s = 6", RECON reading:
                  the paper's Table 8 numbers scales 1..13).
  svd_matrix      entropy_map_hxw (only one the runtime's signals support).
  svd_center      (RECON, default on) subtract the map's mean before the SVD: uncentred, sigma1 is
                  the mean level and every layer reads as Global (measured on the tiny model:
                  rho 20..800); centred, rho compares spatial structure, as the paper describes.
  beta            R's sharpness (RECON 1.0); higher -> more layers count as Global -> slower.
  global_threshold  optional hard split: rho > threshold is Global.
  detail_min_R    a layer is Detail when R >= this (RECON 0.5) and no threshold is given.
  layer_mode      gate_detail_only (full: Detail layers gated, Global full) | gate_only (every
                  layer gated, weighted by R) | skip_detail_layers (scale+layer ablation: Detail
                  layers skipped whole) | uniform (scale+token ablation: every layer, R = 1).
  entropy_norm    minmax (default) | mean | rank | sum (paper-literal, nearly no effect).
  alpha_min, alpha_max  (RECON 0.6, 0.95) higher -> more pruning -> faster. Chosen from Fig. 3b
                  ("Detail layers tolerate up to 90% compression"): with minmax entropies a Detail
                  layer at 64² prunes ~75% on average.
  alpha_min_semantics   min_prune (Eq. 6) | min_keep (A.5.3: every region keeps >= alpha_min).
  head_reduce     mean (the runtime averages heads; max is not available).
  keep_mode       topk_deterministic (k = expected kept, lowest entropies) | weighted_sample
                  (k tokens sampled without replacement with weights P_keep; seeded).
  keep_multiple   kept counts rounded up to a multiple (kernel-friendly; 1 = exact).
  batch_keep      max | mean: one kept count per (scale, layer) for the batch (max is safer).
  batch_depth     earliest | median | latest: reduce the per-image D.
  share_mask_cfg  the uncond row reuses its prompt's cond choice (else ranks its own entropies).
  prune_kv        drop pruned tokens from the scale's K/V (faster) or keep them as keys.
  protect_first, protect_last, min_tokens_to_prune  blocks / small scales never pruned.
  seed            for weighted_sample.
"""
from __future__ import annotations

import math
from typing import Any, Optional, Sequence

import torch

from ..plan import BlockPlan, GenerationContext, ScalePlan, ScaleSignals
from .base import Policy
from .common import check_choice, cond_rows, expand_to_rows, protected_blocks, resolve_scale
from .selectors import complete_map, topk_indices, upsample_map


class ToProVAR(Policy):
    name = "toprovar"

    def __init__(
        self,
        tau: float = 0.4,
        depth_rule: str = "rho_ge_tau",
        depth_offset: int = 1,
        d_min_tokens: int = 256,
        rho_source: str = "mean_over_layers_heads",
        rho_layers: Optional[Sequence[int]] = None,
        rho_queries: Optional[int] = None,
        depth_mode: str = "prune_from_D",
        fixed_exit: Optional[int] = None,
        svd_scale: int = 5,
        svd_matrix: str = "entropy_map_hxw",
        svd_center: bool = True,
        beta: float = 1.0,
        global_threshold: Optional[float] = None,
        detail_min_R: float = 0.5,
        layer_mode: str = "gate_detail_only",
        entropy_norm: str = "minmax",
        alpha_min: float = 0.6,
        alpha_max: float = 0.95,
        alpha_min_semantics: str = "min_prune",
        head_reduce: str = "mean",
        keep_mode: str = "topk_deterministic",
        keep_multiple: int = 8,
        batch_keep: str = "max",
        batch_depth: str = "median",
        share_mask_cfg: bool = True,
        prune_kv: bool = True,
        protect_first: float = 0,
        protect_last: float = 0,
        min_tokens_to_prune: int = 256,
        seed: int = 0,
    ):
        check_choice("depth_rule", depth_rule, ("rho_ge_tau", "rho_le_tau"))
        check_choice("rho_source", rho_source, ("mean_over_layers_heads", "last_layer", "layer_subset"))
        check_choice("depth_mode", depth_mode, ("prune_from_D", "truncate_after_D"))
        if svd_matrix != "entropy_map_hxw":
            raise ValueError(f"toprovar.svd_matrix={svd_matrix!r} needs per-head entropies or hidden states, which the "
                             "runtime's ScaleSignals do not carry (attention entropy comes averaged over heads). "
                             "Use entropy_map_hxw.")
        if head_reduce != "mean":
            raise ValueError("toprovar.head_reduce must be 'mean': the runtime returns attention entropy averaged over heads.")
        check_choice("layer_mode", layer_mode, ("gate_detail_only", "gate_only", "skip_detail_layers", "uniform"))
        check_choice("entropy_norm", entropy_norm, ("minmax", "mean", "rank", "sum"))
        check_choice("alpha_min_semantics", alpha_min_semantics, ("min_prune", "min_keep"))
        check_choice("keep_mode", keep_mode, ("topk_deterministic", "weighted_sample"))
        check_choice("batch_keep", batch_keep, ("max", "mean"))
        check_choice("batch_depth", batch_depth, ("earliest", "median", "latest"))
        if depth_offset < 1:
            raise ValueError("toprovar.depth_offset must be >= 1: D is known only after scale D has been sampled, and a "
                             "scale's plan is fixed before it runs.")
        if rho_source == "layer_subset" and not rho_layers:
            raise ValueError("toprovar.rho_source=layer_subset needs rho_layers (block indices).")
        if not 0.0 <= alpha_min <= 1.0 or not 0.0 <= alpha_max <= 1.0:
            raise ValueError("toprovar: alpha_min and alpha_max must lie in [0, 1]")
        self.k = dict(locals())
        self.k.pop("self")
        for key, v in self.k.items():
            setattr(self, key, v)

    # -- per generation ---------------------------------------------------------------------
    def reset(self, ctx: GenerationContext) -> None:
        super().reset(ctx)
        n = self.n = len(ctx.schedule)
        self.exit_si = None if self.fixed_exit is None else resolve_scale(int(self.fixed_exit), n, what="toprovar.fixed_exit")
        self.svd_si = resolve_scale(int(self.svd_scale), n, what="toprovar.svd_scale")
        self.prunable = list(protected_blocks(ctx.depth, self.protect_first, self.protect_last))
        if self.rho_source == "mean_over_layers_heads":
            self.rho_blocks = list(range(ctx.depth))
        elif self.rho_source == "last_layer":
            self.rho_blocks = [ctx.depth - 1]
        else:
            self.rho_blocks = sorted({b % ctx.depth for b in self.rho_layers})
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
            blocks[l] = BlockPlan(mode="prune", keep=idx.to(self.ctx.device), n_keep=k, fill="pass",
                                  prune_kv=self.prune_kv)
            rec[int(l)] = k
        self.record[si] = {"n_keep": rec, "tokens": L, "entropy_from_scales": sorted(srcs)}
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
        per_block = [cond_rows(att[b], self.ctx).float() for b in self.rho_blocks if b in att]
        if not per_block:
            return
        H = torch.stack(per_block).mean(0)                      # (B, n_queries), mean over layers
        rho = (H < H.mean(-1, keepdim=True)).float().mean(-1)   # (B,)
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
