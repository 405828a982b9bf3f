"""The evaluator protocol: every metric in varbench is one `Evaluator`.

Lifecycle (torchmetrics-style explicit state):

    ev = build_evaluator("hpsv2", cfg)      # cheap: no weights touched
    ev.setup(device)                        # loads weights from local paths; clear error if absent
    for batch in batches: ev.update(batch)  # list[Sample]; accumulates per-sample scores
    result = ev.compute()                   # aggregate metrics + uncertainty + per-sample rows
    ev.reset()                              # forget accumulated samples, keep weights

`version_info()` returns everything needed to tell two scorers apart (scorer version string,
weights path + sha256, preprocessing choices); it is stored in the run record, and aggregation
refuses to compare numbers whose `version_info` differs.
"""
from __future__ import annotations

import abc
import dataclasses
import math
import random
from typing import Any, Sequence


@dataclasses.dataclass
class Sample:
    """One generated image and what is known about how it was made.

    `prompt_index`/`sample_index` locate it in the benchmark (GenEval layout
    `<prompt_index:05d>/samples/<sample_index:04d>.png`); `metadata` is the benchmark's own record
    for the prompt (GenEval's `tag`/`include`/`exclude`, HPSv2's `style`, ...). `reference` is the
    paired baseline image (same model, prompt, seed) when an evaluator asked for it (fidelity).
    """

    prompt_index: int
    sample_index: int
    prompt: str
    image: Any  # PIL.Image.Image (RGB)
    seed: int = 0
    metadata: dict = dataclasses.field(default_factory=dict)
    reference: Any = None


@dataclasses.dataclass
class EvalResult:
    """What `compute()` returns.

    metrics:      flat {metric_name: value}; the record stores them as `<evaluator>/<metric>`.
    uncertainty:  {metric_name: standard error (or bootstrap std) of that value}; absent = unknown.
    per_sample:   one JSON-able dict per scored sample (must include prompt_index, sample_index);
                  written to `samples_<evaluator>.jsonl`.
    """

    metrics: dict[str, float]
    uncertainty: dict[str, float] = dataclasses.field(default_factory=dict)
    per_sample: list[dict] = dataclasses.field(default_factory=list)


class Evaluator(abc.ABC):
    """Base class. Subclasses set `name` and `higher_is_better` (per metric name)."""

    name: str = "evaluator"
    #: metric name -> True if larger is better; the aggregation step uses it to colour deltas.
    higher_is_better: dict[str, bool] = {}
    #: True if `update` needs `Sample.reference` (the paired baseline image).
    needs_reference: bool = False
    #: True if the metrics already compare the image with the baseline's (fidelity: PSNR/SSIM/LPIPS
    #: against `Sample.reference`); aggregation then shows no delta against the baseline's own value.
    relative_to_baseline: bool = False

    @abc.abstractmethod
    def setup(self, device: str = "cpu") -> None:
        """Load weights (from local paths only) and move to `device`. Idempotent."""

    def preflight(self, metadata: Sequence[dict]) -> None:
        """Before any image is generated: raise now what `setup` or `update` would raise later for
        prompts with this `metadata` (a weight file that is not there, prompts this scorer cannot
        read), without loading or hashing anything heavy. Default: nothing to check."""

    @abc.abstractmethod
    def update(self, samples: Sequence[Sample]) -> None:
        """Score `samples` and accumulate their per-sample rows."""

    @abc.abstractmethod
    def compute(self) -> EvalResult:
        """Aggregate what `update` accumulated."""

    @abc.abstractmethod
    def reset(self) -> None:
        """Drop accumulated samples (weights stay loaded)."""

    @abc.abstractmethod
    def version_info(self) -> dict[str, Any]:
        """Identify the scorer: implementation version, weights file + sha256, preprocessing."""

    # resuming -------------------------------------------------------------------------------
    # Every evaluator keeps its per-sample rows in ``self._rows`` and computes its metrics from
    # them alone, so a job can write rows as each batch is scored, and after an interruption (or
    # from the shards of a sharded job) hand them back instead of scoring the images again.
    def scored_rows(self) -> list[dict]:
        """The per-sample rows accumulated so far (``update`` appends; a deferred backend such as
        GenEval's official subprocess may add them only in ``compute``)."""
        return getattr(self, "_rows", [])

    def restore(self, rows: Sequence[dict]) -> None:
        """Take per-sample rows written by an earlier run of this scorer as if ``update`` had
        produced them (``compute`` then aggregates old and new rows alike). Needs no weights."""
        if not hasattr(self, "_rows"):
            raise TypeError(f"{type(self).__name__} keeps no per-sample rows; it cannot resume")
        self._rows.extend(dict(r) for r in rows)


def mean_and_stderr(values: Sequence[float]) -> tuple[float, float]:
    """Mean and its standard error (0 for fewer than two values)."""
    n = len(values)
    if n == 0:
        return float("nan"), float("nan")
    mean = sum(values) / n
    if n < 2:
        return mean, 0.0
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(var / n)


def bootstrap_std(groups: Sequence[Sequence[float]], statistic=None, n_boot: int = 1000, seed: int = 0) -> float:
    """Bootstrap standard deviation of `statistic` over *prompts*.

    `groups[i]` holds the per-sample values of prompt i; prompts are resampled with replacement
    (samples of one prompt are correlated, so resampling images would understate the spread).
    `statistic` maps a list of groups to a float (default: mean of all values).
    """
    if statistic is None:
        def statistic(gs):
            flat = [v for g in gs for v in g]
            return sum(flat) / max(len(flat), 1)
    if len(groups) < 2:
        return 0.0
    rng = random.Random(seed)
    stats = []
    for _ in range(n_boot):
        pick = [groups[rng.randrange(len(groups))] for _ in range(len(groups))]
        stats.append(statistic(pick))
    m = sum(stats) / len(stats)
    return math.sqrt(sum((s - m) ** 2 for s in stats) / (len(stats) - 1))
