"""`nova`: entropy-driven activation scale, scale- and layer-linked ratios, low-entropy pruning with
cached residual fill.

Method card
-----------
Paper:   NOVA: Adaptive Visual Autoregressive Acceleration via Dual-Linkage Entropy Analysis
         (Zhang et al., arXiv 2602.01345). No public code; only the abstract is primary. The
         equations come from a secondary (AI-written) summary; everything else is reconstructed
         (reference notes: nova_toprovar.md §2.5, knobs §6.2). Treat it as "NOVA-like".
Changes: after each scale the policy reads the predictive entropy of every sampled token; it finds
         the *activation scale* t* online, where the growth of the mean entropy slows (an
         inflection); from t*+1 on, blocks prune the tokens whose entropy at the previous scale
         (upsampled) was lowest, at a ratio linked to the scale (grows with t, shrinks while
         entropy still grows) and to the layer (less pruning in layers whose attention entropy is
         above the mean of the layers before them). Pruned slots take the previous scale's
         residual update of the same block/sublayer, area-upsampled (FastVAR's restoration).
Per step, where it comes from (PUBLISHED = NOVA's abstract; 2ND = a secondary, AI-written blog
summary, not the authors; RECONSTRUCTED = ours). Each line names its test:
  activation at the inflection   PUBLISHED idea; g_t = H_t - H_{t-1} and the moving average 2ND;
    of entropy growth            rule, window, baseline, t_min/t_force RECONSTRUCTED
                                 (tests/policies/test_policies_plans.py::test_nova_activation_ratio_and_token_choice,
                                 ::test_nova_forced_activation_and_refused_knobs)
  scale-linked ratio             PUBLISHED idea; sigmoid form 2ND (`ratio_form: blog_literal`);
                                 `monotone`, rho/lam/c0/r_min/r_max RECONSTRUCTED (same tests)
  layer-linked ratio             PUBLISHED idea; "vs the mean of the previous layers" 2ND; the exp
                                 form, mu and attention entropy as the layer signal RECONSTRUCTED
                                 (::test_nova_layer_linkage_prunes_less_where_attention_entropy_is_higher)
  prune the low-entropy tokens   PUBLISHED; ranking by the previous scale's map RECONSTRUCTED
                                 (::test_nova_activation_ratio_and_token_choice)
  fill from the prior scale's    PUBLISHED idea; FastVAR-CTR mechanics (per block and sublayer,
    residual cache               area upsampling) RECONSTRUCTED
                                 (tests/policies/test_nova_knobs.py::test_fill_follows_the_previous_scale)
Choices inside the published steps that no source states (RECONSTRUCTED, each a knob or named
here; tests/policies/test_nova_knobs.py unless said otherwise):
  the entropy H          guided logits (the distribution actually sampled, CFG applied), tempered by
                         tau, binary entropy per bit averaged over the bits of a token, in nats
                         (`entropy_logits=guided`, `entropy_temp=tau`, `entropy_norm=per_bit_mean`);
                         the blog says only "the entropy of the predicted token distribution";
  q_sub queries          the layer entropy is measured on q_sub=256 queries per block, EVENLY spaced
                         over the executed queries by default; the reference notes say a *random*
                         subsample: `q_sub_sampling=random` draws a fixed pseudo-random subset per
                         scale (seeded by the scale index, varbench.engine.plan.entropy_query_pick)
                         (::test_q_sub_sampling_knob);
  layer entropy rows     E_{t,l} is the mean over the *conditional* rows only (the uncond half of
                         CFG is not read), over heads and the sampled queries;
  baseline b             the growth baseline that normalises g in the monotone ratio is computed once,
                         from the batch-mean entropy curve, as soon as g_1..g_4 exist, and then frozen
                         for the generation (activation detection uses each image's own b);
  t in the ratio         schedule indices are 0-based everywhere (t, t*): the sigmoid reads
                         rho * t / (t* + 1) (monotone) or rho * (t* + 1) / t (blog_literal) with
                         0-based t; a 1-based reading shifts every ratio.
Unstated by every source (RECONSTRUCTED defaults, each a knob; tests/policies/test_nova_knobs.py):
  prune_kv=True          whether pruned tokens' K/V are dropped (as FastVAR does) or stay as keys
                         (::test_prune_kv_knob);
  protect_first=0, protect_last=0, sublayers=(sa, ca, ffn)
                         which blocks and sublayers NOVA touches: all, read into the abstract's
                         claim of a wider "acceleration scope" than FastVAR's blocks 3..27
                         (::test_block_and_sublayer_knobs);
  skip_last_scales=0     whether the last scales are skipped as in FastVAR; guessed from NOVA's
                         0.84 s on 2B vs FastVAR's 0.80 s with two scales skipped
                         (::test_skip_last_scales_knob).
Every numeric default is a reconstruction as well (rho/lam/c0 calibrated to a FLOPs target).

Online causality: a plan is fixed before its scale runs, so every signal a scale's plan uses
comes from scales already sampled: the ratio at t uses the last observed growth g_{t-1}; the layer
entropies come from the previous scale (layer_entropy_lag=1); the token ranking is the previous
scale's entropy map. lag 0 (the same scale's earlier layer) would need a plan that changes its
kept count mid-scale; the runtime's static shapes forbid it, so it is refused.

Batch: `batch_rule: per_image` (default) decides every image alone, as at batch 1 (its own
activation, ratios from its own entropies); the runtime splits a batch where images disagree
(`varbench.engine.batch_split`). `shared`: one plan per batch (static shapes, no split): each image detects
its own activation and `batch_activation` reduces them (earliest: fastest; latest: safest; median;
mean_curve: detect once on the batch-mean entropy curve); ratios use batch-mean entropies; the kept
*tokens* are still chosen per image (each prompt's own entropy map; its uncond row reuses the choice).

Knobs: `NOVAKnobs` below (each knob's default, type, range, and which way it trades speed against
quality).

On HART (translated): the predictive entropy is the categorical entropy of the guided, tempered
softmax over HART's 4096-word codebook (on Infinity, the mean per-bit entropy: `entropy_norm`
per_bit_mean); the per-bit variants (`entropy_logits: cond`, `entropy_temp: 1`, `entropy_norm:
per_token_sum`) read Infinity's bit logits and are refused on HART. Every threshold keeps its
Infinity default (RECON, untuned for HART). HART's stage 0 (the text context) is never pruned.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import AbstractSet, Any, Optional, Sequence

import torch

from varbench.engine.plan import BlockPlan, GenerationContext, ScalePlan, ScaleSignals
from varbench.engine.policy import DocRow, MethodCard, Policy
from varbench.policies.common import cond_rows, expand_to_rows, n_keep_from_ratio, protected_blocks, resolve_scale
from varbench.policies.knobs import MethodKnobs, knob
from varbench.policies.selectors import binary_entropy_from_logits, complete_map, topk_indices, upsample_map


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


@dataclass(frozen=True)
class NOVAKnobs(MethodKnobs, method="nova"):
    """NOVA's knobs. Every default is RECON (reconstructed) unless the card above says otherwise; which
    way each knob trades speed against quality:

    entropy_logits  guided | cond: entropy of the sampled (guided) or the conditional distribution
                    (neutral on speed).
    entropy_temp    tau | "1": entropy of the tempered or untempered logits.
    entropy_norm    per_bit_mean | per_token_sum (the scale of H; matters to beta_baseline and lam).
    inflection_rule ma_below_baseline (delta_t < beta_baseline * b) | second_diff (g_t - g_{t-1} < 0:
                    growth peaks).
    ma_window       causal2 (g_{t-1}, g_t) | lookahead2 (the blog's (g_t + g_{t+1})/2; known one
                    scale later, so pruning starts one scale later: slower, safer).
    baseline_scales growth indices averaged into the baseline b (default the first four, g_1..g_4).
    beta_baseline   higher -> activation earlier -> faster.
    t_min_tokens    never activate before the first scale with this many tokens (256 = 16²).
    t_force         latest activation scale (index, negative from the end; -4 = 32² on '1M'; null:
                    never forced). Earlier -> faster.
    ratio_form      monotone (r grows with t, shrinks with growth: the blog's prose) |
                    blog_literal (sigmoid(rho*(t*+1)/t - lam*tanh(g)) as printed).
    rho, lam, c0    the sigmoid's slope in scale, growth penalty (lambda) and offset; higher rho / c0
                    and lower lam -> more pruning -> faster. Defaults 1.0 / 0.5 / -0.5 (RECON), chosen
                    so that in the scenario of experiments/flops_table.py NOVA's FLOPs ratio lands near
                    FastVAR's (both generated into results/curated/flops_analytic.md; NOVA reports
                    2.89x latency, FastVAR 2.6-2.7x).
    r_min, r_max    floor / cap of every ratio (r_max = 0 makes the policy neutral).
    ratio_is_keep   read the sigmoid as a keep fraction instead (flips the direction).
    layer_entropy   attn_subsample (exact attention entropy of q_sub queries per block: layer linkage
                    on) | none. (logit_lens would need per-layer hidden states the runtime does not
                    expose.)
    q_sub           queries sampled for layer entropy (cost O(q_sub * keys) per block; null = all).
    q_sub_sampling  RECON: even (evenly spaced queries, the default) | random (the reference notes'
                    reading: a fixed pseudo-random subset per scale). Speed-neutral; changes which
                    queries E_{t,l} sees. Not composed by default, so existing NOVA store entries keep
                    their hash.
    mu              strength of layer linkage (0 = every layer gets the scale ratio).
    layer_entropy_lag  must be 1 (the previous scale): plans are fixed before a scale runs.
    token_score     prev_scale_pred_entropy (default) | per_layer_attn (each layer ranks by its own
                    per-query attention entropy at the previous scale; needs every query: slower).
    upsample        area | nearest | bilinear resize of the previous scale's map.
    cache_source    prev_scale | activation_scale | fixed (cache_scale; fixed_24 = fixed). Closer caches
                    fill better; memory: residuals are kept for every candidate scale.
    cache_scale     index used by cache_source=fixed (-5 = 24² on '1M', FastVAR's).
    fill            cache (NOVA) | pass (ablation: pruned tokens unchanged).
    -- unstated by every NOVA source; these defaults are RECONSTRUCTIONS:
    prune_kv        RECON: drop pruned tokens from the scale's K/V, as FastVAR (faster) | false: keep
                    them as keys (queries-only pruning: slower, closer to the baseline).
    protect_first, protect_last  RECON: blocks never pruned at either end (0: NOVA states none);
                    a count or a fraction of depth. More protection -> slower, safer.
    sublayers       RECON: sublayers a pruned block prunes (all three, as FastVAR); fewer -> slower,
                    closer to the baseline. Not composed by default, so existing NOVA store entries
                    keep their hash.
    skip_last_scales  RECON: FastVAR-style full skipping of the last scales (0: guessed from NOVA's
                    latency). More -> much faster, loses the finest detail.
    -- end of the unstated choices
    min_tokens_to_prune  scales smaller than this never prune (saves nothing there).
    batch_rule      per_image (each image decides alone, as at batch 1; the runtime splits a batch
                    where images disagree) | shared (one plan per batch: faster batches, an image then
                    depends on its batch companions; see Batch above).
    batch_activation  batch_rule=shared: earliest (fastest) | median | latest (safest) | mean_curve.
    keep_multiple   round kept counts up to a multiple (8/64 help kernels; 1 = exact).
    """
    entropy_logits: str = knob("guided", choices=("guided", "cond"))
    entropy_temp: str = knob("tau", choices=("tau", "1"))
    entropy_norm: str = knob("per_bit_mean", choices=("per_bit_mean", "per_token_sum"))
    inflection_rule: str = knob("ma_below_baseline", choices=("ma_below_baseline", "second_diff"))
    ma_window: str = knob("causal2", choices=("causal2", "lookahead2"))
    baseline_scales: Sequence[int] = knob((1, 2, 3, 4), ge=0)
    beta_baseline: float = knob(1.0)
    t_min_tokens: int = knob(256, ge=0)
    t_force: Optional[int] = knob(-4, scale="index")
    ratio_form: str = knob("monotone", choices=("monotone", "blog_literal"))
    rho: float = knob(1.0)
    lam: float = knob(0.5)
    c0: float = knob(-0.5)
    r_min: float = knob(0.0, ge=0.0, le=1.0)
    r_max: float = knob(0.9, ge=0.0, le=1.0)
    ratio_is_keep: bool = knob(False)
    layer_entropy: str = knob("attn_subsample", choices=("attn_subsample", "none"))
    q_sub: Optional[int] = knob(256, ge=1)
    q_sub_sampling: str = knob("even", choices=("even", "random"), composed=False)
    mu: float = knob(0.5)
    layer_entropy_lag: int = knob(1, choices=(1,))
    token_score: str = knob("prev_scale_pred_entropy", choices=("prev_scale_pred_entropy", "per_layer_attn"))
    upsample: str = knob("area", choices=("area", "nearest", "bilinear"))
    cache_source: str = knob("prev_scale", choices=("prev_scale", "activation_scale", "fixed", "fixed_24"))
    cache_scale: int = knob(-5, scale="index")
    fill: str = knob("cache", choices=("cache", "pass"))
    prune_kv: bool = knob(True)
    protect_first: float = knob(0, ge=0)
    protect_last: float = knob(0, ge=0)
    skip_last_scales: int = knob(0, ge=0, scale="count")
    min_tokens_to_prune: int = knob(256, ge=0)
    batch_activation: str = knob("median", choices=("earliest", "median", "latest", "mean_curve"))
    batch_rule: str = knob("per_image", choices=("per_image", "shared"))
    keep_multiple: int = knob(1, ge=1)
    sublayers: Sequence[str] = knob(("sa", "ca", "ffn"), choices=("sa", "ca", "ffn"), composed=False)


class NOVA(Policy):
    name = "nova"
    #: the method's card (varbench.engine.policy.MethodCard): figures, tables, `varbench.list`, docs/methods.md
    card = MethodCard(
        display_name='NOVA', colour='#D55E00', marker='^',
        paper='NOVA: Adaptive Visual Autoregressive Acceleration via Dual-Linkage Entropy Analysis (Zhang et '
              'al., arXiv 2602.01345)',
        code='none public',
        reconstructed=('the equations: from a secondary (AI-written) summary',
                       'everything numeric and every choice no source states (knobs with reconstructed '
                       'defaults)'),
        doc_rows=(DocRow('`nova`',
                         source='NOVA (abstract + secondary summary)',
                         changes='online activation scale from predictive-entropy growth; scale- and '
                                 'layer-linked ratios; keeps high-entropy tokens; previous-scale residual cache',
                         reconstructed='almost everything numeric; and the choices no source states, each a '
                                       "knob with a reconstructed default: pruned tokens' K/V dropped "
                                       '(`prune_kv`; `nova_keep_kv` keeps them: {flops:nova_keep_kv}*), every '
                                       'block and sublayer pruned (`protect_first/last`, `sublayers`), no '
                                       'last-scale skipping (`skip_last_scales`; `nova_skip2`); inside the '
                                       'published steps: the entropy (guided, τ-tempered, mean per bit), q_sub '
                                       "queries evenly spaced (`q_sub_sampling: random` for the notes' random "
                                       'subset), layer entropy from the cond rows only, the growth baseline b '
                                       'frozen from the batch-mean curve, 0-based t in the ratio',
                         flops=('{flops:nova}*',
                                '{flops:e2e:nova}*')),))
    backbones = frozenset({"infinity", "hart"})   # per-bit entropy variants: Infinity only (backbone_refusal)
    adaptive = True   # decisions read entropy / features of the prompt's own earlier scales
    Knobs = NOVAKnobs
    #: every ratio capped at 0: nothing pruned
    NEUTRAL = {"r_max": 0.0}
    #: on the tiny runtime's '0.06M' (7 scales, up to 16x16): token minimums scaled down to 4x4 and the
    #: activation forced at the third scale from the end
    ACTIVE = {"t_min_tokens": 16, "min_tokens_to_prune": 16, "t_force": -3}

    def __init__(self, **knobs: Any):
        # the two refused readings, explained before the generic choice check
        if knobs.get("layer_entropy") == "logit_lens":
            raise ValueError("nova.layer_entropy=logit_lens needs per-layer hidden states pushed through the head; the "
                             "runtime's ScaleSignals do not carry them. Use attn_subsample or none.")
        if knobs.get("layer_entropy_lag", 1) != 1:
            raise ValueError("nova.layer_entropy_lag must be 1: lag 0 (this scale's previous layer) would change a kept "
                             "count after the scale's plan is fixed, which static-shape plans cannot express.")
        kn = NOVAKnobs(**knobs)   # types, ranges and choices (ConfigError naming the knob)
        if not kn.r_min <= kn.r_max:
            raise ValueError(f"nova: need 0 <= r_min <= r_max <= 1, got r_min={kn.r_min}, r_max={kn.r_max}")
        if not kn.sublayers:
            raise ValueError(f"nova.sublayers must be a non-empty subset of (sa, ca, ffn), got {list(kn.sublayers)}")
        self.k = kn.as_dict()
        self.k["cache_source"] = "fixed" if kn.cache_source == "fixed_24" else kn.cache_source
        self.k["entropy_temp"] = str(kn.entropy_temp)
        self.k["sublayers"] = tuple(kn.sublayers)
        for key, v in self.k.items():
            setattr(self, key, v)
        self.baseline_scales = tuple(int(s) for s in kn.baseline_scales)

    #: observe reads token / attention entropies on the host (one copy per scale, not one per block)
    reads_signals_on_host = True

    @property
    def per_image_decisions(self) -> bool:
        return self.batch_rule == "per_image"

    # -- per generation ---------------------------------------------------------------------
    def backbone_refusal(self, backbone: str) -> Optional[str]:
        if backbone == "infinity" or (backbone == "hart" and (self.entropy_logits, self.entropy_temp, self.entropy_norm)
                                      == ("guided", "tau", "per_bit_mean")):
            return None
        if backbone != "hart":
            return super().backbone_refusal(backbone)
        # HART's tokens are categorical: only the runtime's token entropy (of the guided, tempered
        # softmax the sampler draws from) translates; the variants read Infinity's per-bit logits
        return (f"nova: entropy_logits/entropy_temp/entropy_norm={self.entropy_logits}/{self.entropy_temp}/"
                f"{self.entropy_norm} read Infinity's per-bit logits; on {backbone} only the defaults "
                "(guided/tau/per_bit_mean: the sampled distribution's entropy) apply")

    def reset(self, ctx: GenerationContext) -> None:
        super().reset(ctx)
        reason = self.backbone_refusal(ctx.backbone)
        if reason:
            raise ValueError(reason)
        n = len(ctx.schedule)
        self.n = n
        self.skipped = set(range(n - self.skip_last_scales, n))
        first_big = next((si for si in range(n) if ctx.tokens(si) >= self.t_min_tokens), n)
        need = max(self.baseline_scales) + 1 if self.inflection_rule == "ma_below_baseline" else 0
        self.t_min = max(first_big, need, 2)
        self.t_force_si = None if self.t_force is None else resolve_scale(int(self.t_force), n, what="nova.t_force")
        self.cache_fixed = resolve_scale(int(self.cache_scale), n, what="nova.cache_scale") if self.cache_source == "fixed" else None
        self.prunable_blocks = protected_blocks(ctx.depth, self.protect_first, self.protect_last)
        self.enabled = self.r_max > 0.0 and len(self.prunable_blocks) > 0
        # per-generation state (nothing survives a reset)
        self.H: dict[int, torch.Tensor] = {}             # scale -> (B,) mean token entropy per image
        self.maps: dict[int, torch.Tensor] = {}          # scale -> (B, L) token entropy map
        self.layer_E: dict[int, dict[int, float]] = {}   # scale -> {block: mean attention entropy}
        self.layer_maps: dict[int, tuple[int, torch.Tensor]] = {}  # block -> (scale, latest complete map)
        self.t_star_img: list[Optional[int]] = [None] * ctx.batch
        self.t_star: Optional[int] = None
        self.decided_after: Optional[int] = None
        self.resid_scales: set[int] = set()   # scales whose residuals exist (they ran with keep_residuals)
        self._pending_resid: Optional[int] = None
        self.record: dict[int, dict[str, Any]] = {}
        self.baseline_b: Optional[float] = None

    # -- helpers ------------------------------------------------------------------------------
    def _could_prune(self, si: int) -> bool:
        """Whether scale si may still be pruned (before knowing t*)."""
        return (self.enabled and 0 <= si < self.n and si not in self.skipped and si >= self.t_min + 1
                and self.ctx.tokens(si) >= self.min_tokens_to_prune
                and (self.t_star is None or si > self.t_star)
                and (self.cache_fixed is None or si > self.cache_fixed))

    def scheduled_skips(self) -> frozenset:
        """The last `skip_last_scales` scales, never run."""
        return frozenset(self.skipped)

    def may_fill_after(self, si: int, not_run: AbstractSet[int]) -> bool:
        """Whether a later scale that runs may still be pruned with a cache fill."""
        if not self.enabled or self.fill != "cache":
            return False
        return any(self._could_prune(s) for s in range(si + 1, self.n) if s not in not_run)

    def _will_prune(self, si: int) -> bool:
        return self.t_star is not None and self._could_prune(si) and (self.decided_after is None or si > self.decided_after)

    def _growth(self, curve: dict[int, float], t: int) -> Optional[float]:
        if t in curve and (t - 1) in curve:
            return curve[t] - curve[t - 1]
        return None

    def _detect(self, curve: dict[int, float], t: int) -> Optional[int]:
        """Activation scale decided after observing scale t for one entropy curve, or None."""
        g = lambda s: self._growth(curve, s)  # noqa: E731
        c = t if self.ma_window == "causal2" else t - 1
        if c < self.t_min:
            return None
        if self.inflection_rule == "ma_below_baseline":
            gs = [g(s) for s in self.baseline_scales]
            if any(v is None for v in gs) or g(t) is None or g(t - 1) is None:
                return None
            b = sum(gs) / len(gs)
            delta = (g(t - 1) + g(t)) / 2.0
            hit = delta < self.beta_baseline * b
        else:
            if g(t) is None or g(t - 1) is None:
                return None
            hit = g(t) - g(t - 1) < 0
        return c if hit else None

    def _baseline(self, curve: dict[int, float]) -> Optional[float]:
        gs = [self._growth(curve, s) for s in self.baseline_scales]
        return None if any(v is None for v in gs) else sum(gs) / len(gs)

    def _entropy(self, sig: ScaleSignals) -> torch.Tensor:
        if (self.entropy_logits, self.entropy_temp, self.entropy_norm) == ("guided", "tau", "per_bit_mean"):
            return sig.token_entropy.float()
        logits = sig.cond_logits if (self.entropy_logits == "cond" and sig.cond_logits is not None) else sig.logits
        if self.entropy_temp == "1":
            logits = logits.float() * float(sig.tau)  # undo the 1/tau the runtime applied
        return binary_entropy_from_logits(logits, "mean" if self.entropy_norm == "per_bit_mean" else "sum")

    def _scale_ratio(self, t: int) -> tuple[float, float]:
        """(scale-linked reduction ratio r_t, the growth used) for scale t from observed scales."""
        seen = sorted(self.H)
        curve = {s: float(self.H[s].mean()) for s in seen}
        g = curve[seen[-1]] - curve[seen[-2]] if len(seen) >= 2 else 0.0
        ts = self.t_star
        if self.ratio_form == "blog_literal":
            r = _sigmoid(self.rho * (ts + 1) / t - self.lam * math.tanh(g))
        else:
            b = self.baseline_b if self.baseline_b not in (None, 0.0) else 1.0
            r = _sigmoid(self.rho * t / (ts + 1) - self.lam * math.tanh(g / abs(b)) + self.c0)
        if self.ratio_is_keep:
            r = 1.0 - r
        return min(self.r_max, max(self.r_min, r)), g

    def _layer_ratios(self, r_t: float, src: Optional[int]) -> dict[int, float]:
        blocks = list(self.prunable_blocks)
        E = self.layer_E.get(src, {}) if src is not None else {}
        if self.layer_entropy == "none" or self.mu == 0.0 or not E:
            return {l: r_t for l in blocks}
        out = {}
        for l in blocks:
            prev = [E[j] for j in range(l) if j in E]
            if l not in E or not prev:
                out[l] = r_t
                continue
            mean_prev = sum(prev) / len(prev)
            rel = (E[l] - mean_prev) / (abs(mean_prev) + 1e-8)
            out[l] = min(self.r_max, max(self.r_min, r_t * math.exp(-self.mu * rel)))
        return out

    # -- the policy ---------------------------------------------------------------------------
    def plan(self, si: int) -> ScalePlan:
        if si in self.skipped:
            return ScalePlan(run=False)
        if not self.enabled:
            return ScalePlan()
        nxt_could = any(self._could_prune(s) for s in range(si + 1, self.n))
        keep_res = False
        if self.fill == "cache" and nxt_could:
            if self.cache_source == "prev_scale":
                keep_res = si >= self.t_min and self._could_prune(si + 1)
            elif self.cache_source == "activation_scale":
                keep_res = self.t_star is None and si >= self.t_min
            else:
                keep_res = si == self.cache_fixed
        want_E = nxt_could and si >= self.t_min and (
            self.layer_entropy == "attn_subsample" or self.token_score == "per_layer_attn")
        att_for = frozenset(range(self.ctx.depth)) if want_E else frozenset()
        att_q = None if self.token_score == "per_layer_attn" else self.q_sub
        self._pending_resid = si if keep_res else None  # counted once the scale has actually run

        blocks: dict[int, BlockPlan] = {}
        if self._will_prune(si):
            src = max(s for s in self.maps if s < si)  # the last sampled scale
            r_t, g = self._scale_ratio(si)
            r_l = self._layer_ratios(r_t, src)
            L = self.ctx.tokens(si)
            h, w = self.ctx.schedule[si]
            if self.fill == "cache":
                want = {"prev_scale": src, "activation_scale": self.t_star, "fixed": self.cache_fixed}[self.cache_source]
                # under composition a scale this policy planned may not have run: fall back to the
                # nearest earlier scale whose residuals exist, or leave this scale unpruned
                cache_from = want if want in self.resid_scales else max((s for s in self.resid_scales if s <= want), default=None)
                if cache_from is None:
                    self.record[si] = {"unpruned": f"no residual cache at or before scale {want}"}
                    return ScalePlan(keep_residuals=keep_res, attention_entropy_for=att_for,
                                     attention_entropy_queries=att_q if want_E else None,
                                     attention_entropy_sampling=self.q_sub_sampling if want_E else "even")
            else:
                cache_from = None
            score = upsample_map(self.maps[src], self.ctx.schedule[src], (h, w), self.upsample)
            order = torch.argsort(score, dim=-1, descending=True, stable=True)
            n_keeps = {}
            for l, r in r_l.items():
                k = n_keep_from_ratio(L, r)
                if self.keep_multiple > 1:
                    k = min(L, -(-k // self.keep_multiple) * self.keep_multiple)
                if k >= L:
                    continue
                if self.token_score == "per_layer_attn" and l in self.layer_maps:
                    s_l, m = self.layer_maps[l]
                    idx = topk_indices(upsample_map(m, self.ctx.schedule[s_l], (h, w), self.upsample), k)
                else:  # the predictive-entropy ranking (also the fallback before a layer's map exists)
                    idx = order[:, :k].sort(dim=-1).values
                blocks[l] = BlockPlan(mode="prune", keep=expand_to_rows(idx, self.ctx),
                                      n_keep=k, sublayers=self.sublayers, fill=self.fill, cache_from=cache_from,
                                      prune_kv=self.prune_kv)
                n_keeps[l] = k
            self.record[si] = {"scale_ratio": r_t, "growth_used": g, "layer_ratios": {int(l): r_l[l] for l in r_l},
                               "n_keep": n_keeps, "tokens": L, "cache_from": cache_from}
        # prev_scale: once this scale has run, only its own residuals can be read again
        release = frozenset(s for s in self.resid_scales if s < si) if self.cache_source == "prev_scale" else frozenset()
        self.resid_scales -= release
        return ScalePlan(blocks=blocks, keep_residuals=keep_res, attention_entropy_for=att_for,
                         attention_entropy_queries=att_q if want_E else None, release_residuals=release,
                         attention_entropy_sampling=self.q_sub_sampling if want_E else "even")

    def observe(self, si: int, signals: ScaleSignals) -> None:
        if not self.enabled:
            return
        if getattr(self, "_pending_resid", None) == si:
            self.resid_scales.add(si)
        ent = self._entropy(signals).detach().to("cpu")
        self.maps = {s: m for s, m in self.maps.items() if s >= si - 1}  # keep memory bounded
        self.maps[si] = ent
        self.H[si] = ent.mean(dim=-1)
        if signals.attention_entropy:
            blocks = list(signals.attention_entropy)   # one host read for every block's mean, not one per block
            means = torch.stack([cond_rows(e, self.ctx).float().mean() for e in signals.attention_entropy.values()]).tolist()
            self.layer_E[si] = {int(b): m for b, m in zip(blocks, means)}
            if self.token_score == "per_layer_attn":
                pos = signals.attention_query_index or {}
                for b, e in signals.attention_entropy.items():
                    b, e = int(b), cond_rows(e, self.ctx)
                    prev = None
                    if b in self.layer_maps:  # a pruned block measured only its kept queries
                        s0, m0 = self.layer_maps[b]
                        prev = upsample_map(m0, self.ctx.schedule[s0], self.ctx.schedule[si], self.upsample)
                    p = pos.get(b) if isinstance(pos, dict) else pos
                    p = None if p is None else cond_rows(p, self.ctx)
                    self.layer_maps[b] = (si, complete_map(e, p, self.ctx.tokens(si), prev))
        # per-image activation (tracked for the stats even after the batch decision), then one
        # batch decision
        curves = [{s: float(self.H[s][i]) for s in self.H} for i in range(self.ctx.batch)]
        mean_curve = {s: float(self.H[s].mean()) for s in self.H}
        if self.baseline_b is None:
            self.baseline_b = self._baseline(mean_curve)
        forced = self.t_force_si is not None and si >= self.t_force_si and self.t_star is None
        if self.batch_activation == "mean_curve":
            t = self._detect(mean_curve, si)
            if t is None and forced:
                t = si
            if t is not None and self.t_star is None:
                self.t_star_img = [t] * self.ctx.batch
                self.t_star, self.decided_after = t, si
            return
        for i, curve in enumerate(curves):
            if self.t_star_img[i] is None:
                t = self._detect(curve, si)
                self.t_star_img[i] = si if (t is None and forced) else t
        done = sorted(t for t in self.t_star_img if t is not None)
        need = {"earliest": 1, "median": (self.ctx.batch - 1) // 2 + 1, "latest": self.ctx.batch}[self.batch_activation]
        if len(done) >= need and self.t_star is None:
            self.t_star, self.decided_after = done[need - 1], si

    def no_effect_reason(self) -> Optional[str]:
        """Why every plan was neutral: nothing prunable, no prunable scale on this schedule, or no
        activation detected."""
        if not self.enabled:
            return "nova: nothing to prune (r_max = 0 or every block protected)"
        if not any(si not in self.skipped and self.ctx.tokens(si) >= self.min_tokens_to_prune
                   for si in range(self.t_min + 1, self.n)):
            h, w = self.ctx.schedule[-1]
            return (f"nova: no prunable scale on this {self.n}-scale schedule ending at {h}x{w}: pruning starts after "
                    f"scale t_min={self.t_min} (t_min_tokens={self.t_min_tokens}) and needs >= "
                    f"min_tokens_to_prune={self.min_tokens_to_prune} tokens (the *_toy presets scale both down)")
        if self.t_star is None:
            return "nova: no activation scale was detected (no inflection, and t_force not reached)"
        return None

    def stats(self) -> dict[str, Any]:
        return {
            "activation_scale": self.t_star,
            "activation_decided_after": self.decided_after,
            "activation_per_image": list(self.t_star_img),
            "scale_entropy": {int(s): [float(v) for v in h] for s, h in sorted(self.H.items())},
            "baseline_growth": self.baseline_b,
            "ratios": {int(s): r for s, r in sorted(self.record.items())},
            "skipped": sorted(self.skipped),
        }

    def describe(self) -> dict[str, Any]:
        d = {"name": self.name}
        d.update({k: (list(v) if isinstance(v, tuple) else v) for k, v in self.k.items()})
        return d
