"""A deterministic stand-in VQA model for DPG-Bench tests: its answer depends on the image's pixels and
the question's text, and is sometimes ``"Yes"`` (which ELLA's exact ``== "yes"`` counts as no). The
generator of tests/fixtures/evaluators/dpg_ella/ ran ELLA's own script with the same rule."""
from __future__ import annotations

import hashlib

import numpy as np

ANSWERS = ("no", "Yes", "yes", "yes", "no")


def fake_answer(image, question: str) -> str:
    level = int(np.asarray(image.convert("RGB"), dtype=np.float64).mean())
    return ANSWERS[(hashlib.sha256(question.encode("utf-8")).digest()[0] + level) % len(ANSWERS)]


class FakeVQA:
    """``backend: varbench.testing.dpg_vqa:FakeVQA`` of the dpgbench evaluator."""

    def answer(self, images, questions):
        return [fake_answer(im, q) for im, q in zip(images, questions)]
