"""Scale-skip baselines: `skip_last` and `skipvar_fixed`.

Method card: `skip_last`
------------------------
Changes: runs only the first `run_scales` scales; the image decodes the codes summed so far (the
         released `trunk_scale` of Infinity's loop). The ablation arm that separates FastVAR's
         dominant saving (skipping 48² and 64²: `run_scales: 11` on a 1M schedule) from its token
         pruning.
Knobs:   `SkipLastKnobs` below.

Method card: `skipvar_fixed`
----------------------------
Paper:   SkipVAR: Accelerating Visual Autoregressive Modeling via Adaptive Frequency-Aware Skipping
         (Li et al., arXiv 2506.08908); code fakerone-li/SkipVAR.
Changes: the two actions SkipVAR's decision model chooses between, as fixed policies (no decision
         model: it needs scikit-learn pickles trained on 2B samples, out of scope here):
         "skipN" - do not run the last N scales (released skip1/2/3 = stop before 12/11/10);
         "uncondN" - from scale s on, run only the conditional rows: logits are cond-only and the
         unconditional K/V stop growing (released uncond1/2/3 = from 12/11/10 on).
Reconstructed: nothing in the mechanics; the fixed combination (the paper's "hybrid w/o DM") is
         not specified, so the presets pick one and say so.
Knobs:   `SkipVARFixedKnobs` below.

On HART: skipping HART's last stage also skips its residual diffusion head (the image decodes the
tokens summed so far); cond-only rows (`uncond_from`) drop HART's unconditional rows as on Infinity.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from varbench.engine.plan import GenerationContext, ScalePlan
from varbench.engine.policy import DocRow, MethodCard, Policy
from varbench.policies.common import resolve_scale
from varbench.policies.knobs import MethodKnobs, knob


@dataclass(frozen=True)
class SkipLastKnobs(MethodKnobs, method="skip_last"):
    """skip_last's knob.

    run_scales   scales run (negative: all but the last |k|; null: all). Fewer -> faster, less
                 high-frequency detail.
    """
    run_scales: Optional[int] = knob(None, scale="run")


class SkipLast(Policy):
    name = "skip_last"
    #: the method's card (varbench.engine.policy.MethodCard): figures, tables, `varbench.list`, docs/methods.md
    card = MethodCard(
        display_name='skip last scales', colour='#56B4E9', marker='h',
        paper=None,
        code='Infinity `trunk_scale`',
        reconstructed=(),
        doc_rows=(DocRow('`skip_last`',
                         source='Infinity `trunk_scale`',
                         changes='stops after k scales',
                         reconstructed='–',
                         flops=('{flops:skip_last_2} (k = 11)',
                                '{flops:e2e:skip_last_2} (k = 11)')),))
    backbones = frozenset({"infinity", "hart"})   # scale skipping needs nothing model-specific
    Knobs = SkipLastKnobs
    #: every scale runs
    NEUTRAL = {"run_scales": None}
    #: the last two scales dropped
    ACTIVE = {"run_scales": -2}

    def __init__(self, **knobs: Any):
        self.run_scales = SkipLastKnobs(**knobs).run_scales   # run_scales=0 is refused there

    def reset(self, ctx: GenerationContext) -> None:
        super().reset(ctx)
        n = len(ctx.schedule)
        k = n if self.run_scales is None else (self.run_scales if self.run_scales > 0 else n + self.run_scales)
        if k < 1:
            raise ValueError(f"skip_last.run_scales={self.run_scales} leaves no scale of a {n}-scale schedule.")
        self.k = min(k, n)

    def plan(self, si: int) -> ScalePlan:
        return ScalePlan(run=si < self.k)

    def stats(self) -> dict[str, Any]:
        return {"run_scales": self.k, "skipped": list(range(self.k, len(self.ctx.schedule)))}

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "run_scales": self.run_scales}


@dataclass(frozen=True)
class SkipVARFixedKnobs(MethodKnobs, method="skipvar_fixed"):
    """skipvar_fixed's knobs: SkipVAR's two actions as fixed policies (no decision model).

    skip_last    number of last scales not run; more -> faster, blurrier.
    uncond_from  scale index (negative from the end) from which the unconditional branch is dropped
                 (cond-only rows); null = never. Earlier -> faster (half the rows), weaker guidance
                 on the late detail scales. Without CFG (cfg=1) it changes nothing.
    """
    skip_last: int = knob(0, ge=0, scale="count")
    uncond_from: Optional[int] = knob(None, scale="index")


class SkipVARFixed(Policy):
    name = "skipvar_fixed"
    #: the method's card (varbench.engine.policy.MethodCard): figures, tables, `varbench.list`, docs/methods.md
    card = MethodCard(
        display_name='SkipVAR fixed skip', colour='#E69F00', marker='X',
        paper='SkipVAR: Accelerating Visual Autoregressive Modeling via Adaptive Frequency-Aware Skipping (Li '
              'et al., arXiv 2506.08908)',
        code='fakerone-li/SkipVAR',
        reconstructed=('the fixed combination (`skipvar_hybrid`): not a released action',),
        doc_rows=(DocRow('`skipvar_fixed`',
                         source="SkipVAR's actions as fixed arms",
                         changes='skips the last N scales and/or drops the uncond branch from scale s',
                         reconstructed='`skipvar_hybrid` (skip1+uncond3) is not a released action',
                         flops=('{flops:skipvar_hybrid} (skipvar_hybrid)',
                                '{flops:e2e:skipvar_hybrid} (skipvar_hybrid)')),))
    backbones = frozenset({"infinity", "hart"})   # skips and cond-only rows: both backbones carry CFG rows
    Knobs = SkipVARFixedKnobs
    #: every scale runs with both CFG branches
    NEUTRAL = {"skip_last": 0, "uncond_from": None}
    #: the last scale skipped, the unconditional branch dropped from the third scale from the end
    ACTIVE = {"skip_last": 1, "uncond_from": -3}

    def __init__(self, **knobs: Any):
        kn = SkipVARFixedKnobs(**knobs)
        self.skip_last, self.uncond_from = int(kn.skip_last), kn.uncond_from

    def reset(self, ctx: GenerationContext) -> None:
        super().reset(ctx)
        n = len(ctx.schedule)
        if self.skip_last >= n:
            raise ValueError(f"skipvar_fixed.skip_last={self.skip_last} would skip all {n} scales.")
        self.first_skipped = n - self.skip_last
        self.uncond_si = None
        if self.uncond_from is not None and ctx.cfg_rows:
            self.uncond_si = resolve_scale(int(self.uncond_from), n, what="skipvar_fixed.uncond_from")

    def plan(self, si: int) -> ScalePlan:
        if si >= self.first_skipped:
            return ScalePlan(run=False)
        return ScalePlan(drop_uncond=self.uncond_si is not None and si >= self.uncond_si)

    def stats(self) -> dict[str, Any]:
        n = len(self.ctx.schedule)
        return {"skipped": list(range(self.first_skipped, n)),
                "uncond_dropped_from": self.uncond_si if self.uncond_si is not None and self.uncond_si < self.first_skipped else None}

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "skip_last": self.skip_last, "uncond_from": self.uncond_from}
