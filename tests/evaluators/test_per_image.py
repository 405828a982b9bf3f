"""The per-image evaluator base (varbench/evaluators/per_image.py): a plugin in ten lines gets rows,
resuming, per-group metrics and the bootstrap-over-prompts uncertainty of the packaged scorers."""
import math

import numpy as np
import pytest
from PIL import Image

from varbench.evaluators import PerImageEvaluator, Sample
from varbench.evaluators.base import bootstrap_std
from varbench.evaluators.fidelity import FidelityEvaluator
from varbench.evaluators.hpsv2 import HPSv2Evaluator
from varbench.evaluators.imagereward import ImageRewardEvaluator
from varbench.toy.geneval import ToyGenEval


class Brightness(PerImageEvaluator):                     # the whole plugin (docs/extending.md)
    name = "brightness"
    metrics = {"mean": "grey"}
    higher_is_better = {"mean": True}

    def score(self, sample):
        grey = np.asarray(self.image(sample).convert("L"), dtype=np.float64).mean() / 255
        return {"grey": float(grey)}


def _flat(level: int, size: int = 8) -> Image.Image:
    return Image.new("RGB", (size, size), (level, level, level))


def _samples(levels):
    """levels[p][s]: grey level of sample s of prompt p."""
    return [Sample(p, s, f"prompt {p}", _flat(v), metadata={"kind": "even" if p % 2 == 0 else "odd"})
            for p, row in enumerate(levels) for s, v in enumerate(row)]


def test_a_ten_line_plugin_scores_aggregates_and_resumes():
    ev = Brightness()
    ev.setup("cpu")
    ev.update(_samples([[0], [51], [102], [255]]))
    res = ev.compute()
    # one image per prompt: the mean of the grey levels, and the plain standard error of the mean
    vals = [0.0, 0.2, 0.4, 1.0]
    mean = sum(vals) / 4
    se = math.sqrt(sum((v - mean) ** 2 for v in vals) / 3 / 4)
    assert res.metrics == {"mean": pytest.approx(mean), "n_images": 4.0}
    assert res.uncertainty["mean"] == pytest.approx(se)
    assert [(r["prompt_index"], r["sample_index"]) for r in res.per_sample] == [(0, 0), (1, 0), (2, 0), (3, 0)]
    # rows alone rebuild the numbers (a resumed or sharded job)
    again = Brightness()
    again.restore(res.per_sample)
    assert again.compute().metrics == res.metrics and again.compute().uncertainty == res.uncertainty
    assert Brightness().version_info() == {"scorer": "brightness", "version": None}


def test_several_images_per_prompt_get_the_bootstrap_over_prompts():
    levels = [[0, 51], [102, 102], [255, 204], [51, 0]]
    ev = Brightness()
    ev.update(_samples(levels))
    res = ev.compute()
    groups = [[v / 255 for v in row] for row in levels]
    # the same resampling of prompts as every packaged scorer (1000 resamples, seed 0)
    assert res.uncertainty["mean"] == pytest.approx(bootstrap_std(groups, n_boot=1000, seed=0))


def test_group_by_adds_one_metric_per_value_and_batches_are_split():
    class ByKind(Brightness):
        group_by = ("kind", ("even", "odd", "absent"))
        batch_size = 3

        def score_batch(self, samples):
            assert len(samples) <= 3                     # the declared batch size
            return [dict(super(ByKind, self).score(s), kind=s.metadata["kind"]) for s in samples]

    ev = ByKind()
    ev.update(_samples([[0], [255], [51], [255], [102]]))
    m = ev.compute().metrics
    assert m["mean_even"] == pytest.approx((0 + 0.2 + 0.4) / 3) and m["mean_odd"] == pytest.approx(1.0)
    assert "mean_absent" not in m and m["n_images"] == 5.0


def test_a_plugin_without_score_says_what_to_write():
    class Empty(PerImageEvaluator):
        name = "empty"

    with pytest.raises(NotImplementedError, match="score"):
        Empty().update(_samples([[0]]))


@pytest.mark.parametrize("cls", [HPSv2Evaluator, ImageRewardEvaluator, FidelityEvaluator])
def test_the_packaged_per_image_scorers_are_built_on_the_base(cls):
    assert issubclass(cls, PerImageEvaluator) and cls.metrics
    assert set(cls.metrics) <= set(cls.higher_is_better)


def test_toy_geneval_is_built_on_the_base_with_geneval_aggregation():
    assert issubclass(ToyGenEval, PerImageEvaluator) and ToyGenEval.aggregate is not PerImageEvaluator.aggregate
