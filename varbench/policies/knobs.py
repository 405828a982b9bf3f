"""Each method's knobs, stated once: default, type and allowed range/choices (issue #12 item 12).

One frozen dataclass per method (``NOVAKnobs``, ``FastVARKnobs``, ...). Its fields are the knobs a
config may set under ``method.knobs``; each field holds the default, its annotation the type, and its
metadata (:func:`knob`) the range or choices. ``SCHEMAS`` maps the registered method name
(``method.name``) to its dataclass. :func:`check_knobs` checks a config's knobs against it (unknown
knob -> the closest known one; wrong type; out of range or not a choice; a scale index outside the
schedule) and raises :class:`varbench.core.errors.ConfigError` naming ``method.knobs.<knob>``, the
value and what is allowed. Constructing a dataclass (``NOVAKnobs(q_sub=0)``) runs the same checks
(``__post_init__``), so the types and ranges live here and nowhere else; cross-knob rules
(``r_min <= r_max``) stay with the policy's constructor, which validation also runs.

Hydra: :func:`register` stores ``<method>_schema`` (``{name, knobs: <composed defaults>}``) in the
ConfigStore, group ``method`` (and at the root, for tools that compose a preset file with
``conf/method`` as the config dir). Each method's base preset starts with
``defaults: [<method>_schema, _self_]`` and states only what differs. The stored node is a plain
(untyped) dict generated from the dataclass, not the dataclass itself, on purpose: a typed node
would turn ``0`` into ``0.0`` for a float knob (``protect_first: 0``), which changes the resolved
config and so every store hash; and a type error would surface as a Hydra composition error instead
of the named :class:`ConfigError` below. Validation at start-up (``validate_config``) enforces the
dataclass instead.

``composed=False`` knobs are accepted and checked but not put into the composed config unless a
preset or an override sets them: adding their key to presets that never had it would change those
presets' hashes (NOVA's ``sublayers``; FastVAR's block fractions, which only index-addressed presets
state).
"""
from __future__ import annotations

import dataclasses
import difflib
import typing
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

#: method name -> knob dataclass (filled by @_schema)
SCHEMAS: dict[str, type] = {}

_WEIGHTS = "${oc.env:VARBENCH_WEIGHTS,weights}"


def knob(default: Any, *, choices: Sequence[Any] | None = None, ge: float | None = None, gt: float | None = None,
         le: float | None = None, lt: float | None = None, scale: str | None = None, composed: bool = True):
    """A knob field. choices: allowed values (each element, for a list knob). ge/gt/le/lt: bounds (each
    element or map value, for containers). scale: ``index`` (a schedule index, negative from the end:
    -n..n-1), ``count`` (a number of last scales: 0..n-1) or ``run`` (scales run: >= 1, or negative
    all-but-|k| with -n < k), checked against the schedule when it is known. composed: whether the
    default is put into the composed config (see the module docstring)."""
    md = {k: v for k, v in dict(choices=tuple(choices) if choices is not None else None, ge=ge, gt=gt, le=le, lt=lt,
                                 scale=scale).items() if v is not None}
    md["composed"] = composed
    return field(default=default, metadata=md)


def _schema(name: str):
    def deco(cls):
        cls.method = name
        SCHEMAS[name] = cls
        return cls
    return deco


class _Knobs:
    """Base: ``__post_init__`` checks every field against its type and range."""

    method = "?"

    def __post_init__(self):
        for f in dataclasses.fields(self):
            check_value(type(self), f.name, getattr(self, f.name), f"method.knobs.{f.name}")


# ---------------------------------------------------------------------------------------------------
@_schema("baseline")
@dataclass(frozen=True)
class BaselineKnobs(_Knobs):
    """The released Infinity behaviour: every scale, every block, every token. No knobs."""


@_schema("fastvar")
@dataclass(frozen=True)
class FastVARKnobs(_Knobs):
    """FastVAR (varbench/policies/fastvar.py): cached token pruning on late scales + skipping the last scales.

    addressing     index (ours, generalised: keys are schedule indices, negative from the end) | width
                   (the released rule: keys are token-map widths; preset `fastvar`). Decides how prune,
                   skip and cache_scale are read.
    prune          {scale: ratio}; kept = L - int(L*ratio). Higher -> faster, lower quality; 1.0 = skip the
                   scale, 0 = leave it alone. null = the addressing's default (index {-4: 0.4, -3: 0.5},
                   width {32: 0.4, 40: 0.5}); every preset states it (a map merges key by key in Hydra).
    skip           scales not run at all: the dominant saving; fewer -> slower, sharper. null = the
                   addressing's default (index [-2, -1], width [48, 64]).
    cache_scale    index: the unpruned scale whose residuals fill pruned slots (null: just before the first
                   pruned); width: the edge C of the C x C cache scale (released 24). Closer -> better fill.
    block_range    [first, stop): absolute pruned blocks (released [3, 28]); null: the fractions below.
                   Wider -> faster, riskier.
    first_block_frac / last_block_frac  pruned blocks [round(depth*first), round(depth*last)) when
                   block_range is null (3/32, 28/32: 3..27 on the 2B, 4..34 on the 8B, an extrapolation).
                   Not composed by default: only the index-addressed presets state them.
    cfg_selection  per_row (released: cond/uncond rows rank separately) | cond (one mask per prompt);
                   speed-neutral.
    prune_kv       drop pruned tokens from the scale's K/V (released, faster) | false: queries-only
                   pruning (slower, closer to the baseline).
    fill           cache (released restoration) | pass (ablation: pruned tokens unchanged; same speed).
    sublayers      pruned sublayers (released: all three); fewer -> slower.
    """
    addressing: str = knob("index", choices=("index", "width"))
    prune: Optional[Mapping[int, float]] = knob(None, ge=0.0, le=1.0)
    skip: Optional[Sequence[int]] = knob(None)
    cache_scale: Optional[int] = knob(-5)
    block_range: Optional[Sequence[int]] = knob(None, ge=0)
    first_block_frac: float = knob(3 / 32, ge=0.0, le=1.0, composed=False)
    last_block_frac: float = knob(28 / 32, ge=0.0, le=1.0, composed=False)
    cfg_selection: str = knob("per_row", choices=("per_row", "cond"))
    prune_kv: bool = knob(True)
    fill: str = knob("cache", choices=("cache", "pass"))
    sublayers: Sequence[str] = knob(("sa", "ca", "ffn"), choices=("sa", "ca", "ffn"))


@_schema("nova")
@dataclass(frozen=True)
class NOVAKnobs(_Knobs):
    """NOVA, reconstructed (no public code; varbench/policies/nova.py). Every default is RECON unless the
    card says otherwise; which way each knob trades speed against quality:

    entropy_logits    guided | cond: entropy of the sampled (guided) or the conditional distribution.
    entropy_temp      tau | "1": entropy of tempered or untempered logits.
    entropy_norm      per_bit_mean | per_token_sum (rescales H; interacts with lam, beta_baseline).
    inflection_rule   ma_below_baseline (delta_t < beta*b) | second_diff (growth peaks).
    ma_window         causal2 | lookahead2 (the blog's window; decides a scale later: slower, safer).
    baseline_scales   growth indices averaged into the baseline b.
    beta_baseline     higher -> earlier activation -> faster.
    t_min_tokens      never activate before the first scale with this many tokens (256 = 16²).
    t_force           latest activation scale (-4 = 32² on '1M'); earlier -> faster; null: never forced.
    ratio_form        monotone (ratio grows with scale) | blog_literal (formula as printed).
    rho               slope in scale; higher -> more pruning late -> faster.
    lam               growth penalty (lambda); higher -> less pruning while entropy grows -> slower.
    c0                offset of the sigmoid; higher -> more pruning everywhere -> faster.
    r_min, r_max      floor / cap of every ratio (r_max = 0: neutral, nothing pruned).
    ratio_is_keep     read the sigmoid as a keep fraction (flips direction).
    layer_entropy     attn_subsample (layer linkage on) | none.
    q_sub             queries sampled per block for layer entropy (cost); null = all.
    q_sub_sampling    RECON: even (evenly spaced queries, the default) | random (a fixed pseudo-random
                      subset per scale, the reference notes' reading). Speed-neutral. Not composed by
                      default, so existing NOVA store entries keep their hash.
    mu                layer-linkage strength (0 = every layer gets the scale ratio).
    layer_entropy_lag must be 1 (previous scale): plans are fixed before a scale runs.
    token_score       prev_scale_pred_entropy | per_layer_attn (each layer ranks by its own attention
                      entropy; every query measured: slower).
    upsample          area | nearest | bilinear resize of the previous scale's map.
    cache_source      prev_scale | activation_scale | fixed (cache_scale; fixed_24 = fixed); closer caches
                      fill better.
    cache_scale       used when cache_source=fixed (-5 = 24² on '1M', FastVAR's).
    fill              cache (NOVA) | pass (ablation).
    -- unstated by every NOVA source; these defaults are RECONSTRUCTIONS:
    prune_kv          RECON: drop pruned tokens from the scale's K/V, as FastVAR (faster) | false: keep them.
    protect_first     RECON: first blocks never pruned (0 = all prunable); a count or a fraction of depth.
    protect_last      RECON: last blocks never pruned; more protection -> slower, safer.
    sublayers         RECON: sublayers a pruned block prunes (all, as FastVAR); fewer -> slower. Not
                      composed by default, so existing NOVA store entries keep their hash.
    skip_last_scales  RECON: FastVAR-style skipping of the last scales (0: guessed from NOVA's latency);
                      more -> faster.
    -- end of the unstated choices
    min_tokens_to_prune  smaller scales never prune.
    batch_rule        per_image (each image decides alone, as at batch 1; the runtime splits a batch
                      where images disagree) | shared (one plan per batch: faster batches, an image
                      then depends on its batch companions).
    batch_activation  batch_rule=shared: earliest (fastest) | median | latest (safest) | mean_curve.
    keep_multiple     round kept counts up to a multiple (8/64 help kernels; 1 = exact).
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


_LAYER_MODES = ("full", "gate_detail_only", "gate_only", "skip_detail_layers", "uniform")


@_schema("toprovar")
@dataclass(frozen=True)
class ToProVARKnobs(_Knobs):
    """ToProVAR, the full method (A.1.5 "Scale + Layer + Token"; varbench/policies/toprovar.py has the
    provenance of every step). FACT = the paper states it, RECON = reconstructed.

    tau               FACT 0.4. rho_ge_tau: lower -> earlier depth D -> faster.
    depth_rule        rho_ge_tau (main text) | rho_le_tau (appendix Eq. 13).
    depth_offset      first pruned scale = D + offset (>= 1; larger -> slower, safer).
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
    layer_mode: str = knob("full", choices=_LAYER_MODES)
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


@_schema("skip_last")
@dataclass(frozen=True)
class SkipLastKnobs(_Knobs):
    """Scale-skip baseline: run only the first scales.

    run_scales   scales run (negative: all but the last |k|; null: all); fewer -> faster, less detail.
    """
    run_scales: Optional[int] = knob(None, scale="run")


@_schema("skipvar_fixed")
@dataclass(frozen=True)
class SkipVARFixedKnobs(_Knobs):
    """SkipVAR's actions as fixed policies (no decision model).

    skip_last    last scales not run; more -> faster, blurrier.
    uncond_from  scale from which the unconditional branch is dropped (cond-only rows; null: never);
                 earlier -> faster (half the rows), weaker guidance on detail scales.
    """
    skip_last: int = knob(0, ge=0, scale="count")
    uncond_from: Optional[int] = knob(None, scale="index")


@_schema("skipvar")
@dataclass(frozen=True)
class SkipVARKnobs(_Knobs):
    """SkipVAR as released (varbench/policies/skipvar.py): at decision_scale, frequency features of a small
    decode choose per sample skip1/2/3 (last 1-3 scales not run) or uncond1/2/3 (cond-only rows).

    decision_models  folder of the 4 joblib decision models (missing -> error at the first decision);
                     a higher SSIM target -> fewer/lighter actions, slower.
    classifier       Logistic_Regression (released default) | Decision_Tree | Random_Forest.
    decision_scale   decision scale (negative from the end; -4 = 9 on 1M); earlier -> more to save,
                     weaker features.
    feature_scale    schedule index whose latent grid the codes are resized to before decoding (4 = 8x8
                     on 1M).
    fft_freq_ratio   HF_Ratio radius = int(ratio * min(H, W) / 2) (released 0.4).
    batch_rule       per_image (each sample its own action, as at batch 1; the runtime splits a batch
                     where samples disagree) | conservative (one plan per batch: the most conservative
                     per-sample action) | raise (refuse a batch whose samples disagree).
    trust_decision_models  load ``.pkl`` decision models that are not the released files (joblib/pickle
                     runs code while loading: only for files you trust; env VARBENCH_TRUST_DECISION_MODELS=1
                     does the same for every job). Not composed: presets that never set it keep their hashes.
    """
    decision_models: Optional[str] = knob(f"{_WEIGHTS}/skipvar/decision_model_ssim_84")
    classifier: str = knob("Logistic_Regression", choices=("Logistic_Regression", "Decision_Tree", "Random_Forest"))
    decision_scale: int = knob(-4, scale="index")
    feature_scale: int = knob(4, scale="index")
    fft_freq_ratio: float = knob(0.4, gt=0.0, lt=2.0)
    batch_rule: str = knob("per_image", choices=("per_image", "conservative", "raise"))
    trust_decision_models: bool = knob(False, composed=False)


@_schema("compose")
@dataclass(frozen=True)
class ComposeKnobs(_Knobs):
    """Several policies in one generation (varbench/policies/compose.py); each member's knobs are checked
    against its own method's dataclass.

    policies   [{name, knobs}, ...], at least two.
    conflict   error | first | last: whose BlockPlan wins when two members prune the same block.
    cache      own | first: redirect later members' cache fills to the first member's cache scale.
    """
    policies: Sequence[Mapping[str, Any]] = knob(())
    conflict: str = knob("error", choices=("error", "first", "last"))
    cache: str = knob("own", choices=("own", "first"))


# ---------------------------------------------------------------------------------------------------
def _plain(v: Any) -> Any:
    if isinstance(v, tuple):
        return [_plain(x) for x in v]
    if isinstance(v, Mapping):
        return {k: _plain(x) for k, x in v.items()}
    return v


def schema_node(name: str, *, resolve: bool = False) -> dict:
    """``{"name": method, "knobs": {...}}``: the composed defaults of ``<method>`` (or ``<method>_schema``)."""
    method = name[: -len("_schema")] if name.endswith("_schema") else name
    cls = SCHEMAS[method]
    node = {"name": method, "knobs": {f.name: _plain(f.default) for f in dataclasses.fields(cls)
                                       if f.metadata.get("composed", True)}}
    if resolve:
        from omegaconf import OmegaConf

        node = OmegaConf.to_container(OmegaConf.create(node), resolve=True)
    return node


def register() -> None:
    """Store ``<method>_schema`` for every method in Hydra's ConfigStore (idempotent)."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    for method in SCHEMAS:
        node = schema_node(method)
        cs.store(group="method", name=f"{method}_schema", node=node)
        cs.store(name=f"{method}_schema", node=node)   # conf/method as the config dir (experiments' loaders)


# -- checks ------------------------------------------------------------------------------------------
def _bounds(md: Mapping[str, Any]) -> str:
    parts = []
    if "ge" in md or "gt" in md:
        parts.append(f">= {md['ge']}" if "ge" in md else f"> {md['gt']}")
    if "le" in md or "lt" in md:
        parts.append(f"<= {md['le']}" if "le" in md else f"< {md['lt']}")
    return " and ".join(parts)


def _in_bounds(x: Any, md: Mapping[str, Any]) -> bool:
    return not (("ge" in md and x < md["ge"]) or ("gt" in md and x <= md["gt"])
                or ("le" in md and x > md["le"]) or ("lt" in md and x >= md["lt"]))


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _choice_ok(v: Any, choices: tuple) -> bool:
    return v in choices or (not isinstance(v, (bool, str)) and _is_num(v) and str(v) in choices)


def check_value(cls: type, key: str, value: Any, where: str, n_scales: int | None = None) -> None:
    """One knob of `cls` against its type, range/choices and (given n_scales) the schedule."""
    from varbench.harness.config import _describe, _matches
    from varbench.core.errors import ConfigError

    f = {f.name: f for f in dataclasses.fields(cls)}[key]
    tp = typing.get_type_hints(cls)[key]
    md = f.metadata
    if not _matches(value, tp):
        raise ConfigError(f"{where}={value!r} does not fit {cls.method}'s {key}: must be {_describe(tp)}"
                          + (f" {_bounds(md)}" if _bounds(md) else "")
                          + (f", one of {list(md['choices'])}" if "choices" in md else ""))
    if value is None:
        return
    items = list(value.values()) if isinstance(value, Mapping) else list(value) if isinstance(value, (list, tuple)) else [value]
    if "choices" in md:
        bad = [v for v in items if not _choice_ok(v, md["choices"])]
        if bad:
            raise ConfigError(f"{where}={value!r}: {bad[0]!r} is not one of {list(md['choices'])}")
    if _bounds(md):
        bad = [v for v in items if _is_num(v) and not _in_bounds(v, md)]
        if bad:
            what = "each value" if isinstance(value, Mapping) else "each entry" if len(items) != 1 or value is not bad[0] else ""
            null = " (or null)" if _matches(None, tp) and not what else ""
            raise ConfigError(f"{where}={value!r}: {what + ' ' if what else ''}must be {_bounds(md)}{null}, got {bad[0]!r}")
    scale = md.get("scale")
    if scale and n_scales is not None:
        n = n_scales
        for v in items:
            if not _is_int(v):
                continue
            if scale == "index" and not -n <= v < n:
                raise ConfigError(f"{where}={value!r}: scale index {v} is outside the {n}-scale schedule "
                                  f"(valid: {-n}..{n - 1}, negative from the end); it would be silently ignored")
            if scale == "count" and not 0 <= v < n:
                raise ConfigError(f"{where}={v}: must be 0..{n - 1} on this {n}-scale schedule "
                                  f"({v} would leave no scale to run)")
            if scale == "run" and (v == 0 or v <= -n or v > n):
                raise ConfigError(f"{where}={v}: must be 1..{n} (scales run) or negative -1..{-(n - 1)} "
                                  f"(all but the last |k|) on this {n}-scale schedule; "
                                  + (f"{v} runs no scale" if v <= 0 else f"{v} > {n} would silently run every scale"))
    elif scale == "run" and value == 0:
        raise ConfigError(f"{where}=0 would run no scale at all; use >= 1 (or negative: all but the last |k|)")


def check_knobs(method: str, knobs: Mapping[str, Any], n_scales: int | None = None,
                where: str = "method.knobs") -> None:
    """Every knob of `method` is known and fits its dataclass field (compose members recursively)."""
    from varbench.core.errors import ConfigError

    cls = SCHEMAS.get(method)
    if cls is None:
        return   # a method registered elsewhere (a plugin): its constructor checks its knobs
    names = [f.name for f in dataclasses.fields(cls)]
    for key, value in knobs.items():
        key = str(key)
        if key not in names:
            close = difflib.get_close_matches(key, names, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{where}.{key}: {method} has no knob {key!r}.{hint} "
                              f"Knobs: {', '.join(names) or '(none)'}")
        check_value(cls, key, value, f"{where}.{key}", n_scales)
    if method == "compose":
        for i, spec in enumerate(knobs.get("policies") or ()):
            at = f"{where}.policies[{i}]"
            if not isinstance(spec, Mapping) or not isinstance(spec.get("name"), str):
                raise ConfigError(f"{at} must be {{name: <method>, knobs: {{...}}}}, got {spec!r}")
            unknown = set(spec) - {"name", "knobs"}
            if unknown:
                raise ConfigError(f"{at}: unknown key(s) {sorted(unknown)}; a member is {{name, knobs}}")
            sub = spec.get("knobs") or {}
            if not isinstance(sub, Mapping):
                raise ConfigError(f"{at}.knobs must be a mapping, got {sub!r}")
            check_knobs(spec["name"], sub, n_scales, f"{at}.knobs")


def knobs_of(method: str, knobs: Mapping[str, Any]) -> Any:
    """The frozen dataclass for a method's knobs (defaults filled in); raises ConfigError."""
    return SCHEMAS[method](**{str(k): v for k, v in knobs.items()})
