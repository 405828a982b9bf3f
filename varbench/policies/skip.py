"""Scale-skip baselines: `skip_last` and `skipvar_fixed`.

Method card: `skip_last`
------------------------
Changes: runs only the first `run_scales` scales; the image decodes the codes summed so far (the
         released `trunk_scale` of Infinity's loop). The ablation arm that separates FastVAR's
         dominant saving (skipping 48² and 64²: `run_scales: 11` on a 1M schedule) from its token
         pruning.
Knobs:   run_scales  scales to run (negative: all but the last |k|; None: all). Fewer -> faster,
                     less high-frequency detail.

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
Knobs:   skip_last   number of last scales not run (more -> faster, blurrier).
         uncond_from scale index (negative from the end) from which the unconditional branch is
                     dropped; None = never. Earlier -> faster (half the rows), weaker guidance
                     on the late detail scales. Without CFG (cfg=1) it changes nothing.
"""
from __future__ import annotations

from typing import Any, Optional

from varbench.engine.plan import GenerationContext, ScalePlan
from varbench.engine.policy import Policy
from varbench.policies.common import resolve_scale


class SkipLast(Policy):
    name = "skip_last"

    def __init__(self, run_scales: Optional[int] = None):
        if run_scales is not None and not isinstance(run_scales, int):
            raise TypeError(f"skip_last.run_scales must be an int or None, got {run_scales!r}")
        if run_scales == 0:
            raise ValueError("skip_last.run_scales=0 would run no scale at all; use >= 1 (or negative: all but the last |k|).")
        self.run_scales = run_scales

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


class SkipVARFixed(Policy):
    name = "skipvar_fixed"

    def __init__(self, skip_last: int = 0, uncond_from: Optional[int] = None):
        if skip_last < 0:
            raise ValueError(f"skipvar_fixed.skip_last must be >= 0, got {skip_last}")
        self.skip_last, self.uncond_from = int(skip_last), uncond_from

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
