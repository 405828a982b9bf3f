"""`skipvar`: SkipVAR's sample-adaptive decision model.

Method card: `skipvar`
----------------------
Paper:   SkipVAR: Accelerating Visual Autoregressive Modeling via Adaptive Frequency-Aware Skipping
         (Li et al., arXiv 2506.08908); code fakerone-li/SkipVAR @ 607be0e,
         `infinity/models/infinity.py::autoregressive_infer_cfg_SkipVAR` (lines 463-800),
         `infinity/models/basic.py::SelfAttention.forward_cond` (312-369).
Changes, step by step:
  1. as released: after the scale before the decision scale (si 8) the summed codes are kept
     (infinity.py 766-767: `old_codes = summed_codes.clone()`).
  2. as released: at the decision scale (si 9) the summed codes and the kept copy are resized
     (trilinear) to the latent grid of scale 4 (8x8 on 1M) and VAE-decoded (infinity.py 736-743).
  3. as released: features [HF_Diff, HF_Ratio] (Sobel L1 difference; FFT energy outside radius
     int(0.4*min(H,W)/2)), or [HF_Diff] for the `_diff_only` models (infinity.py 686-748; see
     `skipvar_features`).
  4. as released: StandardScaler + classifier (joblib pickles, Logistic_Regression by default,
     infinity.py 285-290): skip model k in {0..3}; only if k == 0 the uncond model j in {0..3}
     (infinity.py 751-762).
  5. as released: action skip k = the last k scales do not run (`break` at si 12/11/10 for
     k = 1/2/3, infinity.py 588-593); the image decodes the codes summed so far.
  6. as released (mechanism), with one numeric difference: uncond j = from scale n-j on (12/11/10)
     only the conditional rows run (their K/V cache continues, the unconditional cache is dropped,
     logits = cfg*c + (1-cfg)*c = the conditional logits; infinity.py 616-645, basic.py 340-348)
     = `ScalePlan(drop_uncond=True)`. The release recomputes the text conditioning of those scales
     (AdaLN input `cond_BD_step12`, cross-attention K/V `ca_kv_step12`) with bf16 autocast disabled
     (infinity.py 486-494), while its baseline rows use autocast-computed ones; here the cond rows
     keep the baseline's conditioning (differences at bf16 rounding level).
  7. reconstructed (release: batch 1 only, `.item()` and the KV-cache slice `B==1`): batch > 1.
     Decisions are per sample. `batch_rule: per_image` (default) gives every sample its own
     action, as at batch 1: the runtime splits the batch where samples disagree
     (`varbench.engine.batch_split`). `conservative` makes one plan for the batch from the most
     conservative per-sample action (skip min k; drop the unconditional branch only where every
     sample does; slower, and a sample's image depends on its batch companions); `raise` refuses
     a batch whose samples disagree.
  8. reconstructed (release: indices 9/8/4 and 10/11/12 hard-coded for the 13-scale 1M schedules):
     other schedules. The decision scale counts from the end (-4 = 9 of 13), the feature grid is
     an absolute index (4), actions count from the end. On 1M schedules this is the release.
  9. the feature images: decoded in fp32 through the runtime's VAE (clamped to [-1, 1] as
     released); the release decodes under bf16 autocast (numeric difference only). Without access
     to the runtime's VAE the public uint8 `ScaleSignals.decode` is used (stats say which).
Decision models: released folders `SkipVAR/decision_model_ssim_{84,86,88}` (2B, 3k samples,
         targets "SSIM to the baseline >= 0.84/0.86/0.88") and `decision_model_ssim_84_diff_only`;
         not shipped here. `python -m experiments.skipvar_train` fits the same file set on any model
         (reconstructed: the release ships no training code; see that module's card), written in
         skops' format (`*.skops`), which loads without running code.
         Safety: the released files are joblib pickles, and loading a pickle executes code written
         into it. varbench loads a `.pkl` only if its sha256 is the released file's (pinned in
         `skipvar_release.py`), or with `trust_decision_models=true` / env
         VARBENCH_TRUST_DECISION_MODELS=1. The decision-model files' sha256 are part of the
         generation key: retraining a folder in place makes new images and a new record.
Knobs:   `SkipVARKnobs` below.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

import numpy as np
import torch

from varbench.engine.plan import GenerationContext, ScalePlan, ScaleSignals
from varbench.engine.policy import DocRow, MethodCard, Policy, RequiredFile
from varbench.policies.common import resolve_scale
from varbench.policies.knobs import WEIGHTS_DIR, MethodKnobs, knob
from varbench.policies.skipvar_features import (CLASSIFIERS, FFT_FREQ_RATIO, PUBLISHED_AT, DecisionModels, batch_action,
                                               decision_model_paths, features_from_images, float_decoder,
                                               folder_format, load_decision_models, require_decision_model_deps,
                                               resize_codes, resolve_folder)

#: released action counts: skip1..3 / uncond1..3 (infinity.py 561-584)
MAX_ACTION = 3


#: a decision injected instead of the models: features (B, n_features) -> (skip (B,), uncond (B,))
Decide = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]


def fixed_decision(skip: int, uncond: int) -> Decide:
    """A `decide=` stand-in for the decision models: every sample gets the action (skip, uncond)."""
    return lambda X: (np.full(len(X), skip), np.full(len(X), uncond))


@dataclass(frozen=True)
class SkipVARKnobs(MethodKnobs, method="skipvar"):
    """SkipVAR's knobs (as released; the card above): at decision_scale, frequency features of a small
    decode choose per sample skip1/2/3 (last 1-3 scales not run) or uncond1/2/3 (cond-only rows).

    decision_models  folder of the four decision-model files (strict: missing/invalid -> error at the
                     first decision); a higher SSIM target -> fewer/lighter actions, slower. The
                     config's default is the released ssim_84 folder under the weights folder; built
                     from Python without it, None (only with `decide=` injection, as in tests).
    classifier       Logistic_Regression (released default) | Decision_Tree | Random_Forest.
    decision_scale   index of the decision scale (negative from the end; -4 = 9 on 1M). Earlier ->
                     more scales the decision can save, less reliable features.
    feature_scale    schedule index whose latent grid the codes are resized to before decoding (4 = 8x8
                     on 1M).
    fft_freq_ratio   HF_Ratio radius = int(ratio * min(H, W) / 2) (released 0.4).
    batch_rule       per_image (each sample its own action, as at batch 1; the runtime splits a batch
                     where samples disagree) | conservative (one plan per batch: the most conservative
                     per-sample action) | raise (refuse a batch whose samples disagree; see step 7).
    trust_decision_models  false (default): refuse ``.pkl`` files that are not the released bytes
                     (joblib/pickle runs code while loading); true: load them anyway (only for files
                     you trust; env VARBENCH_TRUST_DECISION_MODELS=1 does the same for every job). Not
                     composed: presets that never set it keep their hashes.
    """
    decision_models: Optional[str] = knob(f"{WEIGHTS_DIR}/skipvar/decision_model_ssim_84")
    classifier: str = knob("Logistic_Regression", choices=CLASSIFIERS)
    decision_scale: int = knob(-4, scale="index")
    feature_scale: int = knob(4, scale="index")
    fft_freq_ratio: float = knob(FFT_FREQ_RATIO, gt=0.0, lt=2.0)
    batch_rule: str = knob("per_image", choices=("per_image", "conservative", "raise"))
    trust_decision_models: bool = knob(False, composed=False)


class SkipVAR(Policy):
    name = "skipvar"
    #: the method's card (varbench.engine.policy.MethodCard): figures, tables, `varbench.list`, docs/methods.md
    card = MethodCard(
        display_name='SkipVAR', colour='#CC79A7', marker='D',
        paper='SkipVAR: Accelerating Visual Autoregressive Modeling via Adaptive Frequency-Aware Skipping (Li '
              'et al., arXiv 2506.08908)',
        code='fakerone-li/SkipVAR @ 607be0e',
        reconstructed=('the batch > 1 rule',
                       'non-1M schedules',
                       "the decision models' training command"),
        doc_rows=(DocRow('`skipvar`',
                         source='fakerone-li/SkipVAR (code + released decision models)',
                         changes='at scale 9 the frequency features of an 8x8-grid decode pick, per sample, '
                                 'skip the last 1-3 scales or (if none) cond-only rows on the last 1-3',
                         reconstructed='batch > 1 rule, non-1M schedules, the training command (see '
                                       '[SkipVAR](#skipvar))',
                         flops=('per sample one of: skip1/2/3 '
                                '{flops:skipvar_skip2\\|skip_last=1}/{flops:skipvar_skip2}/{flops:skipvar_skip2\\|skip_last=3}, '
                                'uncond1/2/3 '
                                '{flops:skipvar_uncond3\\|uncond_from=-1}/{flops:skipvar_uncond3\\|uncond_from=-2}/{flops:skipvar_uncond3}, '
                                'none 1.00 (+ two 8x8 decodes)',
                                'per sample one of: skip1/2/3 '
                                '{flops:e2e:skipvar_skip2\\|skip_last=1}/{flops:e2e:skipvar_skip2}/{flops:e2e:skipvar_skip2\\|skip_last=3}, '
                                'uncond1/2/3 '
                                '{flops:e2e:skipvar_uncond3\\|uncond_from=-1}/{flops:e2e:skipvar_uncond3\\|uncond_from=-2}/{flops:e2e:skipvar_uncond3}, '
                                'none 1.00 (+ two 8x8 decodes)')),))
    adaptive = True   # decisions read entropy / features of the prompt's own earlier scales
    Knobs = SkipVARKnobs
    #: the decision "no action" for every sample, injected (no decision-model files needed)
    NEUTRAL = {"decide": fixed_decision(0, 0)}
    #: the decision "skip the last scale" for every sample, injected
    ACTIVE = {"decide": fixed_decision(1, 0)}

    @classmethod
    def required_files(cls, knobs: Mapping[str, Any]) -> list[RequiredFile]:
        """The decision-model folder `decision_models` names (released on 2B, or trained by
        `python -m experiments.skipvar_train`); present when it holds a complete set."""
        folder = (knobs or {}).get("decision_models")
        if folder in (None, "", "None", "null"):
            return []
        return [RequiredFile("SkipVAR decision models", str(resolve_folder(folder).resolve()), PUBLISHED_AT,
                             knob="decision_models", present=bool(decision_model_paths(folder)),
                             fix="point {setting} (env VARBENCH_WEIGHTS) at that folder, or train one: "
                                 "python -m experiments.skipvar_train")]

    def __init__(self, *, decide: Optional[Decide] = None, n_features: int = 2, **knobs: Any):
        """knobs: `SkipVARKnobs`. decide / n_features: a decision (and its feature count) injected
        instead of a folder, for tests and training."""
        knobs.setdefault("decision_models", None)   # the config default is an interpolation into the weights folder
        kn = SkipVARKnobs(**knobs)
        self.decision_models, self.classifier = kn.decision_models, kn.classifier
        self.decision_scale, self.feature_scale = kn.decision_scale, kn.feature_scale
        self.fft_freq_ratio, self.batch_rule = float(kn.fft_freq_ratio), kn.batch_rule
        self._decide, self._n_features = decide, int(n_features)   # test/training injection instead of a folder
        self._models: Optional[DecisionModels] = None
        self.trust_decision_models = bool(kn.trust_decision_models)   # load pickles that are not the released files
        if decide is None and self.decision_models not in (None, "", "None", "null"):
            # at the input boundary: a missing scikit-learn/skops/joblib is one error naming the install, raised
            # when the policy is built (a job's build, before any model loads), not at the first decision scale
            d = resolve_folder(self.decision_models)
            require_decision_model_deps(d, folder_format(d, self.classifier))

    @property
    def per_image_decisions(self) -> bool:
        return self.batch_rule == "per_image"

    def fork(self) -> "SkipVAR":
        if self._decide is None:
            self.load()   # load once, so the per-image copies share the models
        return super().fork()

    # ------------------------------------------------------------------ decision model
    def load(self) -> DecisionModels:
        """Load (once) the decision models named by `decision_models`; strict."""
        if self._models is None:
            self._models = load_decision_models(self.decision_models, self.classifier, trust=self.trust_decision_models)
        return self._models

    def _predict(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self._decide is not None:
            return self._decide(X)
        return self.load().predict(X)

    @property
    def n_features(self) -> int:
        return self._n_features if self._decide is not None else self.load().n_features

    # ------------------------------------------------------------------ policy
    def reset(self, ctx: GenerationContext) -> None:
        super().reset(ctx)
        n = len(ctx.schedule)
        si = resolve_scale(self.decision_scale, n, what="skipvar.decision_scale")
        if si is None or si < 1:
            raise ValueError(f"skipvar.decision_scale={self.decision_scale} needs a scale with a previous one on a "
                             f"{n}-scale schedule.")
        if si + MAX_ACTION >= n:
            raise ValueError(f"skipvar.decision_scale={self.decision_scale} (scale {si}) leaves {n - 1 - si} scales after "
                             f"it; the released actions act on the last {MAX_ACTION} (needs si <= {n - 1 - MAX_ACTION}).")
        fs = resolve_scale(self.feature_scale, n, what="skipvar.feature_scale")
        if fs is None:
            raise ValueError(f"skipvar.feature_scale={self.feature_scale} is outside the {n}-scale schedule.")
        self.si_decide, self.si_feature = si, fs
        self._old: Optional[torch.Tensor] = None
        self.skip_k, self.uncond_j = 0, 0
        self._trace: dict[str, Any] = {}

    def plan(self, si: int) -> ScalePlan:
        n = len(self.ctx.schedule)
        if si <= self.si_decide:
            return ScalePlan()
        if self.skip_k and si >= n - self.skip_k:
            return ScalePlan(run=False)
        drop = self.ctx.cfg_rows and self.uncond_j > 0 and si >= n - self.uncond_j
        return ScalePlan(drop_uncond=drop)

    def _grid(self, signals: ScaleSignals) -> tuple[int, int]:
        """The feature scale's grid on the VAE latent (x2 on patchified models, like vae_scale_schedule)."""
        H, W = signals.summed_codes.shape[-2:]
        hL, wL = self.ctx.schedule[-1]
        h, w = self.ctx.schedule[self.si_feature]
        return h * (H // hL), w * (W // wL)

    def observe(self, si: int, signals: ScaleSignals) -> None:
        if si not in (self.si_decide - 1, self.si_decide):
            return
        if signals.summed_codes is None:
            raise RuntimeError("skipvar needs ScaleSignals.summed_codes (the runtime's accumulated codes).")
        codes = resize_codes(signals.summed_codes, self._grid(signals))
        if si == self.si_decide - 1:
            self._old = codes.clone()
            return
        dec, how = float_decoder(signals.decode)
        if dec is None:
            raise RuntimeError("skipvar decodes the intermediate image and needs a runtime with a VAE (ScaleSignals.decode).")
        if self._old is None:
            raise RuntimeError(f"skipvar: scale {si - 1} was not observed (did it run?); the decision needs its codes.")
        new_img, old_img = dec(codes), dec(self._old)
        X = features_from_images(new_img, old_img, self.n_features, self.fft_freq_ratio)
        skip, uncond = self._predict(X)
        skip, uncond = [int(k) for k in np.asarray(skip).reshape(-1)], [int(j) for j in np.asarray(uncond).reshape(-1)]
        if len(skip) != self.ctx.batch or len(uncond) != self.ctx.batch:
            raise RuntimeError(f"skipvar: the decision gave {len(skip)}/{len(uncond)} actions for a batch of {self.ctx.batch}.")
        for k, j in zip(skip, uncond):
            if not (0 <= k <= MAX_ACTION and 0 <= j <= MAX_ACTION):
                raise RuntimeError(f"skipvar: action (skip {k}, uncond {j}) is outside the released 0..{MAX_ACTION}.")
        per_sample = [(k, 0 if k else j) for k, j in zip(skip, uncond)]
        if self.ctx.batch > 1 and len(set(per_sample)) > 1 and self.batch_rule == "raise":
            raise RuntimeError(f"skipvar: samples of this batch chose different actions {per_sample} and the runtime "
                               f"applies one plan per batch; generate at batch 1 or use batch_rule=conservative.")
        self.skip_k, self.uncond_j = batch_action([k for k, _ in per_sample], [j for _, j in per_sample])
        self._old = None
        self._trace = {"features": X.tolist(), "per_sample": [{"skip": k, "uncond": j} for k, j in per_sample],
                       "feature_decode": how}

    def stats(self) -> dict[str, Any]:
        n = len(self.ctx.schedule)
        skipped = list(range(n - self.skip_k, n)) if self.skip_k else []
        uncond_from = n - self.uncond_j if (self.uncond_j and self.ctx.cfg_rows) else None
        return {"decision_scale": self.si_decide, "feature_scale": self.si_feature, "skip": self.skip_k,
                "uncond": self.uncond_j, "skipped": skipped, "uncond_dropped_from": uncond_from, **self._trace}

    def describe(self) -> dict[str, Any]:
        d = {"name": self.name, "decision_models": self.decision_models, "classifier": self.classifier,
             "decision_scale": self.decision_scale, "feature_scale": self.feature_scale,
             "fft_freq_ratio": self.fft_freq_ratio, "batch_rule": self.batch_rule}
        if self._models is not None:
            d["models"] = self._models.describe()
        if self._decide is not None:
            d["decide"] = "injected"
        return d
