"""`baseline`: the released Infinity behaviour. Every scale runs in full.

It is a real policy that goes through the same plan/observe calls as every method, so a method's
speed-up is measured against the same per-scale overhead.
"""
from __future__ import annotations

from dataclasses import dataclass

from varbench.engine.policy import DocRow, MethodCard, NeutralPolicy
from varbench.policies.knobs import MethodKnobs


@dataclass(frozen=True)
class BaselineKnobs(MethodKnobs, method="baseline"):
    """The released Infinity behaviour: every scale, every block, every token. No knobs."""


class Baseline(NeutralPolicy):
    name = "baseline"
    #: the method's card (varbench.engine.policy.MethodCard): figures, tables, `varbench.list`, docs/methods.md
    card = MethodCard(
        display_name='baseline', colour='#000000', marker='*',
        paper=None,
        code=None,
        reconstructed=(),
        doc_rows=(DocRow('`baseline`',
                         source='Infinity',
                         changes='nothing',
                         reconstructed='–',
                         flops=('1.00',
                                '1.00')),))
    Knobs = BaselineKnobs
    #: no knobs: it is the baseline
    NEUTRAL = {}
    #: none: the baseline is the reference the other methods are measured against
    ACTIVE = None
