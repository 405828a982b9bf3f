"""The policy interface every acceleration method implements.

A policy is a small object with per-generation state:

    policy.reset(ctx)                # at every generation start (no stale state between images)
    plan = policy.plan(si)           # before scale si runs
    policy.observe(si, signals)      # after scale si is sampled
    policy.stats()                   # JSON-able summary of what it did to this generation

Methods that only reshape plans (FastVAR, skip baselines) ignore `observe`; entropy-driven methods
(NOVA, ToProVAR) decide later scales from earlier signals. `observe` may read GPU tensors to the
host: it runs between scale steps, never inside one.
"""
from __future__ import annotations

import abc
from typing import Any

from ..plan import GenerationContext, ScalePlan, ScaleSignals


class Policy(abc.ABC):
    #: registry name, e.g. "fastvar"
    name: str = "policy"
    #: True when the plan depends on observed signals, so the work varies by prompt (the timed pass
    #: then times ``timing.prompts`` prompts instead of ``timing.prompts_static``)
    adaptive: bool = False

    def reset(self, ctx: GenerationContext) -> None:
        self.ctx = ctx

    @abc.abstractmethod
    def plan(self, si: int) -> ScalePlan:
        """The plan for scale `si` (called once per scale, in order)."""

    def observe(self, si: int, signals: ScaleSignals) -> None:
        """Signals measured at scale `si` (after sampling)."""

    def stats(self) -> dict[str, Any]:
        """What this policy did to the last generation (goes into the per-image trace)."""
        return {}

    def describe(self) -> dict[str, Any]:
        """The policy's configuration, for the run record."""
        return {"name": self.name}
