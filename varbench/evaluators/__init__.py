"""Evaluators: one module per metric behind `varbench.evaluators.base.Evaluator`.

`build_evaluator(name, cfg)` looks a name up in `REGISTRY` (module path + class), imports it lazily
(so `import evaluators` stays light and heavy deps load only when used), and suggests the closest
name on a typo.
"""
from __future__ import annotations

from varbench.registry import resolve

from .base import EvalResult, Evaluator, Sample  # noqa: F401

#: evaluator name -> "module:Class". Modules import lazily.
REGISTRY: dict[str, str] = {}


def register(name: str, target: str) -> None:
    REGISTRY[name] = target


def build_evaluator(name: str, **kwargs) -> Evaluator:
    return resolve(REGISTRY, name, "evaluator")(**kwargs)


register("toy_geneval", "varbench.evaluators.toy_geneval:ToyGenEval")
register("hpsv2", "varbench.evaluators.hpsv2:HPSv2Evaluator")
register("imagereward", "varbench.evaluators.imagereward:ImageRewardEvaluator")
register("geneval", "varbench.evaluators.geneval:GenEvalEvaluator")
register("fidelity", "varbench.evaluators.fidelity:FidelityEvaluator")
