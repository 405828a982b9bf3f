"""DPG-Bench's scoring, as ELLA's ``compute_dpg_one_sample`` and ``main`` compute it, from VQA answers.

Per image (one prompt's 2x2 grid in ELLA; our 4 stored images are its 4 crops, see ``grid.py``), per
crop: every question answered; a question scores 1 if the answer is exactly ``"yes"``; then, in the
file's question order and *in place*, a question is zeroed if a parent it depends on (ids in
``dependency``, 0 = none) now scores 0, looking at the parents in their listed order and stopping at the
first zero one (so a zeroed question zeroes its own dependants later in the order, and a parent id that
is not a question of the item raises, unless a zero parent came before it). The crop's score is the mean
over its questions; the image's, the mean over its crops; the benchmark's, the mean over images, x 100.

Quirks kept (they are in the published numbers):

* the per-category scores use the **last crop's answers before dependency zeroing** (ELLA's
  ``qid2scores_orig`` is overwritten at every crop; only the last survives);
* an image whose scoring raises (no questions for its id, a dependency on a question that does not
  exist) is **dropped**, from the overall and the category scores alike (ELLA prints "Failed filename"
  and goes on); we count them (``n_failed``);
* categories come from the ``tuple`` column: level 2 = the text before ``(`` (``entity - whole``),
  level 1 = its part before ``-`` (``entity``).
"""
from __future__ import annotations

import math
import re
from collections import defaultdict
from typing import Any, Mapping, Sequence

from varbench.evaluators.base import bootstrap_std, mean_and_stderr
from varbench.evaluators.dpg.questions import ItemQuestions, category_of


class DPGScoringError(Exception):
    """What makes ELLA drop an image (its ``except Exception``)."""


def crop_scores(item: ItemQuestions, answers: Mapping[int, str]) -> tuple[dict, float]:
    """(raw 0/1 scores before zeroing, the crop's score after zeroing) of one crop's answers."""
    raw = {qid: float(answers[qid] == "yes") for qid in item.qid2question}
    scores = dict(raw)
    for qid, parents in item.qid2dependency.items():
        for parent in parents:
            if parent == 0:
                continue
            if parent not in scores:
                raise DPGScoringError(f"question {qid} depends on {parent}, which is not a question of this item")
            if scores[parent] == 0:
                scores[qid] = 0
                break
    return raw, sum(scores.values()) / len(scores)


def slug(category: str) -> str:
    """A metric-name form of a category: ``entity - whole`` -> ``entity_whole``."""
    return re.sub(r"[^0-9a-z]+", "_", category.lower()).strip("_")


def aggregate(rows: Sequence[Mapping], n_boot: int = 1000, seed: int = 0) -> tuple[dict, dict]:
    """``(metrics, uncertainty)`` from per-crop rows (``prompt_index``, ``sample_index``, ``crop_score``,
    ``raw`` {qid: 0/1}, ``categories`` {qid: level-2 category}, ``failed``): ``overall`` and each category
    x 100 (level 1 by its name, ``entity``; level 2 as ``l2_entity_whole``), each with ``n_<name>`` (questions
    scored) and a ± (standard error over prompts for the overall; bootstrap over prompts for categories);
    ``n_prompts`` scored, ``n_failed`` dropped, ``n_images``."""
    by_prompt: dict[int, list[Mapping]] = defaultdict(list)
    for r in rows:
        by_prompt[int(r["prompt_index"])].append(r)
    per_prompt, failed = [], 0
    cat_groups: dict[str, list[list[float]]] = defaultdict(list)
    l1_groups: dict[str, list[list[float]]] = defaultdict(list)
    for p in sorted(by_prompt):
        crops = sorted(by_prompt[p], key=lambda r: int(r["sample_index"]))
        if any(r.get("failed") for r in crops):
            failed += 1
            continue
        scores = [float(r["crop_score"]) for r in crops]
        per_prompt.append(sum(scores) / len(scores))
        last = crops[-1]                                  # categories: the last crop, before zeroing
        mine: dict[str, list[float]] = defaultdict(list)
        for qid, value in last["raw"].items():
            mine[last["categories"][qid]].append(float(value))
        for cat, vals in mine.items():
            cat_groups[cat].append(vals)
            l1_groups[cat.split("-")[0].strip()].append(vals)
    metrics: dict[str, float] = {}
    unc: dict[str, float] = {}
    if per_prompt:
        mean, se = mean_and_stderr(per_prompt)
        metrics["overall"], unc["overall"] = 100.0 * mean, 100.0 * se
    for groups, name_of in ((l1_groups, slug), (cat_groups, lambda c: "l2_" + slug(c))):
        for cat in sorted(groups):
            vals = [v for g in groups[cat] for v in g]
            name = name_of(cat)
            metrics[name] = 100.0 * sum(vals) / len(vals)
            metrics[f"n_{name}"] = float(len(vals))
            unc[name] = 100.0 * bootstrap_std(groups[cat], n_boot=n_boot, seed=seed)
    metrics["n_prompts"] = float(len(per_prompt))
    metrics["n_failed"] = float(failed)
    metrics["n_images"] = float(len(rows))
    return metrics, unc


def ella_overall(per_image_scores: Sequence[float]) -> float:
    """ELLA's printed DPG-Bench score from its per-image scores (``np.mean * 100``)."""
    import numpy as np

    return float(np.mean(per_image_scores)) * 100 if per_image_scores else math.nan


def row_for(item: ItemQuestions | None, answers: Mapping[int, str] | None, reason: str | None = None) -> dict[str, Any]:
    """One crop's row (without its keys): answers, raw scores, the zeroed crop score, categories; or
    ``failed`` with the reason, as ELLA would drop it."""
    if item is None:
        return {"failed": reason or "no questions for this item id", "crop_score": None}
    try:
        if answers is None:
            raise DPGScoringError(reason or "no answers")
        raw, score = crop_scores(item, answers)
    except (DPGScoringError, KeyError) as e:
        return {"failed": f"{type(e).__name__}: {e}", "crop_score": None,
                "answers": {str(k): v for k, v in (answers or {}).items()}}
    return {"failed": None, "crop_score": score, "answers": {str(k): answers[k] for k in item.qid2question},
            "raw": {str(k): v for k, v in raw.items()},
            "categories": {str(k): category_of(t) for k, t in item.qid2tuple.items()}}
