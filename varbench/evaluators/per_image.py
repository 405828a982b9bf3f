"""The base of every metric that scores each image on its own: a subclass writes ``score(sample) ->
dict`` and declares which row values become which metrics; the base accumulates the rows, resumes
from them, and reports each metric's mean with the project's uncertainty (the bootstrap over
prompts of :func:`varbench.evaluators.common.mean_with_uncertainty`: several images of one prompt
are correlated, so prompts, not images, are resampled).

A plugin evaluator in full::

    class Brightness(PerImageEvaluator):
        name = "brightness"
        metrics = {"mean": "grey"}                 # metric name -> row key it averages
        higher_is_better = {"mean": True}

        def score(self, sample):
            grey = np.asarray(self.image(sample).convert("L"), dtype=np.float64).mean() / 255
            return {"grey": float(grey)}

Declared state (class attributes a subclass sets):

* ``metrics``: metric name -> row key; the mean of that key over every row (a row without the key,
  e.g. LPIPS switched off, leaves the metric out);
* ``group_by``: ``(row key, values)``: each metric also per value, as ``<metric>_<value>`` (HPSv2's
  styles), over the rows whose key holds it;
* ``higher_is_better``, ``needs_reference``, ``relative_to_baseline`` as on :class:`Evaluator`;
* ``batch_size``: how many samples one :meth:`score_batch` call gets (a batched model overrides
  ``score_batch`` and leaves ``score`` alone).

The rows are the only thing ``update`` accumulates (``self._rows``), and ``compute`` reads nothing
else, so a resumed, a sharded and an uninterrupted run give the same numbers. Weights are loaded by
:meth:`load` (once; ``setup`` calls it), never by the constructor, so building an evaluator to
aggregate stored rows stays cheap.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

from varbench.evaluators.base import EvalResult, Evaluator, Sample
from varbench.evaluators.common import mean_with_uncertainty, to_pil_rgb


class PerImageEvaluator(Evaluator):
    """Per-image scoring with declared metrics; see the module docstring."""

    name = "per_image"
    #: metric name -> the row key whose mean it is
    metrics: dict[str, str] = {}
    #: (row key, values): every metric also as ``<metric>_<value>`` over the rows with that value
    group_by: Optional[tuple[str, tuple[str, ...]]] = None
    #: samples per :meth:`score_batch` call (speed and memory only)
    batch_size: int = 16
    #: bootstrap resamples and seed of the uncertainty (changing them changes only the ±)
    n_boot: int = 1000
    boot_seed: int = 0
    device: str = "cpu"

    # -- what a subclass writes ----------------------------------------------------------------
    def score(self, sample: Sample) -> dict:
        """The row values of one image (``prompt_index``/``sample_index`` are added by the base)."""
        raise NotImplementedError(f"{type(self).__name__} must define score(sample) or score_batch(samples)")

    def score_batch(self, samples: Sequence[Sample]) -> list[dict]:
        """The row values of several images; override for a model that runs in batches."""
        return [self.score(s) for s in samples]

    def load(self, device: str) -> None:
        """Load weights (local paths only) onto ``device``; called once by :meth:`setup`."""

    def version_info(self) -> dict[str, Any]:
        return {"scorer": self.name, "version": getattr(self, "version", None)}

    # -- helpers --------------------------------------------------------------------------------
    @staticmethod
    def image(sample: Sample):
        """The sample's image as RGB PIL (a path is opened)."""
        return to_pil_rgb(sample.image)

    # -- the Evaluator lifecycle ----------------------------------------------------------------
    @property
    def _rows(self) -> list[dict]:
        rows = self.__dict__.get("_per_image_rows")
        if rows is None:
            rows = self.__dict__["_per_image_rows"] = []
        return rows

    @_rows.setter
    def _rows(self, rows: list[dict]) -> None:
        self.__dict__["_per_image_rows"] = rows

    def setup(self, device: Optional[str] = None) -> None:
        if device is not None:
            self.device = device
        if not self.__dict__.get("_per_image_loaded"):
            self.load(self.device)
            self.__dict__["_per_image_loaded"] = True

    def update(self, samples: Sequence[Sample]) -> None:
        bs = max(int(self.batch_size), 1)
        for i in range(0, len(samples), bs):
            chunk = samples[i:i + bs]
            values = self.score_batch(chunk)
            if len(values) != len(chunk):
                raise RuntimeError(f"{type(self).__name__}.score_batch returned {len(values)} rows for {len(chunk)} samples")
            for s, v in zip(chunk, values):
                self._rows.append({"prompt_index": s.prompt_index, "sample_index": s.sample_index, **v})

    def aggregate(self, rows: list[dict]) -> tuple[dict[str, float], dict[str, float]]:
        """``(metrics, uncertainty)`` of ``rows``: each declared metric's mean (and per group), plus
        ``n_images``. Override to transform rows first (fidelity caps PSNR) and call this."""
        metrics: dict[str, float] = {}
        unc: dict[str, float] = {}
        for metric, key in self.metrics.items():
            if rows and key in rows[0]:
                metrics[metric], unc[metric] = mean_with_uncertainty(rows, key, n_boot=self.n_boot, seed=self.boot_seed)
            if self.group_by is not None:
                gkey, values = self.group_by
                for value in values:
                    sub = [r for r in rows if r.get(gkey) == value]
                    if sub and key in sub[0]:
                        name = f"{metric}_{value}"
                        metrics[name], unc[name] = mean_with_uncertainty(sub, key, n_boot=self.n_boot, seed=self.boot_seed)
        metrics["n_images"] = float(len(rows))
        return metrics, unc

    def compute(self) -> EvalResult:
        metrics, unc = self.aggregate(list(self._rows))
        return EvalResult(metrics=metrics, uncertainty=unc, per_sample=list(self._rows))

    def reset(self) -> None:
        self._rows = []
