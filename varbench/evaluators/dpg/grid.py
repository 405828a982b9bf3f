"""ELLA scores one image per prompt: a 2x2 grid of the prompt's 4 samples, cropped back into 4 squares
(``crop_tuples_list`` in ``compute_dpg_bench.py``). varbench stores the 4 samples themselves, so the native
backend scores them directly; the official backend writes the grid ELLA reads. ``crop`` of ``grid`` gives
the stored images back pixel for pixel (tests/evaluators/test_eval_dpgbench.py shows it): the two are the
same inputs to the VQA model."""
from __future__ import annotations

from typing import Sequence

from PIL import Image


def crop_boxes(resolution: int, n: int = 4) -> list[tuple[int, int, int, int]]:
    """ELLA's crop boxes (left, upper, right, lower), first ``n`` (``--pic-num``): top-left, top-right,
    bottom-left, bottom-right."""
    r = int(resolution)
    return [(0, 0, r, r), (r, 0, 2 * r, r), (0, r, r, 2 * r), (r, r, 2 * r, 2 * r)][:n]


def make_grid(images: Sequence[Image.Image]) -> Image.Image:
    """The 2x2 grid of up to 4 square images of one size, sample k in ELLA's crop k (unused cells black)."""
    if not 1 <= len(images) <= 4:
        raise ValueError(f"DPG-Bench grids hold 1 to 4 images, got {len(images)}")
    size = images[0].size
    if size[0] != size[1] or any(im.size != size for im in images):
        raise ValueError(f"DPG-Bench grids need square images of one size, got {[im.size for im in images]}")
    grid = Image.new("RGB", (2 * size[0], 2 * size[0]))
    for im, box in zip(images, crop_boxes(size[0], len(images))):
        grid.paste(im.convert("RGB"), box[:2])
    return grid


def crops(grid: Image.Image, resolution: int, n: int = 4) -> list[Image.Image]:
    """ELLA's ``crop_image`` for each box."""
    return [grid.crop(box) for box in crop_boxes(resolution, n)]
