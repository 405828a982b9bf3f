"""GenEval: the evaluator (`evaluator`), its scoring rules (`rules`) and the mmdet checkpoint converter
(`convert_mmdet`, ``python -m varbench.evaluators.geneval_convert_mmdet``)."""
from varbench.evaluators.geneval.evaluator import GenEvalEvaluator  # noqa: F401
