"""Evaluators: one module per metric behind `varbench.evaluators.base.Evaluator`.

`build_evaluator(name, cfg)` looks a name up in `REGISTRY` (a `varbench.core.registry.LazyRegistry` of
module path + class), imports it lazily (so `import evaluators` stays light and heavy deps load only
when used), and suggests the closest name on a typo.
"""
from __future__ import annotations

from varbench.core.registry import EVALUATORS_GROUP, LazyRegistry

from varbench.evaluators.base import EvalResult, Evaluator, Sample  # noqa: F401
from varbench.evaluators.per_image import PerImageEvaluator  # noqa: F401

#: evaluator name -> "module:Class". Modules import lazily. Installed packages add theirs through the
#: `varbench.evaluators` entry-point group; an evaluator `name: pkg.module:Class` needs no entry at all.
def _an_evaluator_class(obj) -> str | None:
    """None for an `Evaluator` subclass (what an evaluator slot takes); else what it should be."""
    return None if isinstance(obj, type) and issubclass(obj, Evaluator) else "a subclass of varbench.evaluators.base.Evaluator"


REGISTRY = LazyRegistry("evaluator", group=EVALUATORS_GROUP, expects=_an_evaluator_class)


def register(name: str, target: str) -> None:
    REGISTRY.register(name, target)


def build_evaluator(name: str, **kwargs) -> Evaluator:
    return REGISTRY.load(name)(**kwargs)


register("toy_geneval", "varbench.toy.geneval:ToyGenEval")
register("hpsv2", "varbench.evaluators.hpsv2:HPSv2Evaluator")
register("imagereward", "varbench.evaluators.imagereward:ImageRewardEvaluator")
register("geneval", "varbench.evaluators.geneval.evaluator:GenEvalEvaluator")
register("fidelity", "varbench.evaluators.fidelity:FidelityEvaluator")
register("clipscore", "varbench.evaluators.clipscore:CLIPScoreEvaluator")
register("fid", "varbench.evaluators.fid:FIDEvaluator")
register("fid_dataset", "varbench.evaluators.fid:DatasetFIDEvaluator")
register("dpgbench", "varbench.evaluators.dpg.evaluator:DPGBenchEvaluator")
