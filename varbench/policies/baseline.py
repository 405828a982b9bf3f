"""`baseline`: the released Infinity behaviour. Every scale runs in full.

It is a real policy that goes through the same plan/observe calls as every method, so a method's
speed-up is measured against the same per-scale overhead.
"""
from __future__ import annotations

from varbench.engine.policy import NeutralPolicy


class Baseline(NeutralPolicy):
    name = "baseline"
