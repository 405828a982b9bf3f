"""Small helpers shared by evaluators: image coercion and per-prompt aggregation."""
from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import Iterable

from PIL import Image

from varbench.evaluators.base import bootstrap_std, mean_and_stderr


def to_pil_rgb(image) -> Image.Image:
    """Accept a PIL image or a path; return an RGB PIL image (EXIF orientation is not applied here)."""
    if isinstance(image, (str, Path)):
        with Image.open(image) as im:
            im.load()
            image = im.copy()
    if not isinstance(image, Image.Image):
        raise TypeError(f"Sample.image must be a PIL.Image or a path, got {type(image).__name__}")
    return image.convert("RGB") if image.mode != "RGB" else image


def group_by_prompt(rows: Iterable[dict], key: str) -> list[list[float]]:
    """Per-prompt lists of `row[key]`, in first-seen prompt order (for the prompt bootstrap)."""
    groups: "OrderedDict[int, list[float]]" = OrderedDict()
    for r in rows:
        groups.setdefault(r["prompt_index"], []).append(float(r[key]))
    return list(groups.values())


def mean_with_uncertainty(rows: list[dict], key: str, n_boot: int = 1000, seed: int = 0) -> tuple[float, float]:
    """Mean of `row[key]` and its uncertainty.

    With several samples per prompt the bootstrap over prompts is used (samples of one prompt are
    correlated); with one sample per prompt it reduces to the plain standard error, computed exactly.
    """
    groups = group_by_prompt(rows, key)
    flat = [v for g in groups for v in g]
    mean, se = mean_and_stderr(flat)
    if any(len(g) > 1 for g in groups):
        se = bootstrap_std(groups, n_boot=n_boot, seed=seed)
    return mean, se
