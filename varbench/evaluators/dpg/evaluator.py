"""DPG-Bench scorer (ELLA's protocol: 4 images per prompt, a VQA model answers each prompt's yes/no questions
about each image, dependency zeroing, per-prompt mean, overall and per-category x 100).

Backends, as GenEval has them:

* ``native`` (default): an in-process VQA model answers each question on each stored image (ELLA's crop k
  is our sample k, pixel for pixel: ``grid.py``); the model is mPLUG-large
  (``damo/mplug_visual-question-answering_coco_large_en``), re-implemented in plain PyTorch in
  ``varbench/evaluators/dpg/mplug.py`` (504² input, beam search 5, max length 10).
* ``official``: ELLA's own ``dpg_bench/compute_dpg_bench.py`` run as a subprocess in a Python environment
  you name (one with ``modelscope``, transformers 4.x, ``accelerate``), on the 2x2 grids it expects; its
  per-crop answers are read back (``*_detail.txt``) and scored by the same code, and its own per-image
  scores are checked against ours.
* ``module:Class``: any VQA model with ``answer(images, questions) -> list[str]`` (a plugin, or tests).

One row per stored image (= one crop): the answers, the raw 0/1 scores, the crop's score after dependency
zeroing, or why it failed; ``scoring.aggregate`` turns rows into the published numbers, quirks included
(``scoring.py``). The question file is the user's copy of ELLA's ``dpg_bench.csv``, read as ELLA reads it
(``questions.py``); its sha256 is part of ``version_info`` (so a record names the file it was scored with,
and aggregation refuses to compare records scored with different files).
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Optional, Sequence

from varbench.evaluators.base import EvalResult, Evaluator, Sample
from varbench.evaluators.common import to_pil_rgb
from varbench.evaluators.dpg.questions import PUBLISHED, ItemQuestions, read_dpg_questions
from varbench.evaluators.dpg.scoring import aggregate, row_for
from varbench.evaluators.weights import WeightsNotFoundError, check_sha256, resolve_file

ELLA_SCRIPT = "https://github.com/TencentQQGYLab/ELLA/blob/3c228f1dc6c4d3cad0a47493816151a419f14db3/dpg_bench/compute_dpg_bench.py"


class DPGBenchEvaluator(Evaluator):
    """DPG-Bench score (higher = more of each dense prompt's facts hold in its images).

    Args:
        questions: the user's copy of ELLA's ``dpg_bench/dpg_bench.csv``.
        backend: ``native`` | ``official`` | ``module:Class`` (see the module docstring).
        vqa_dir: native: the mPLUG folder (``pytorch_model.bin``, ``config.json``, ``vocab.txt``; relative
            paths resolve under ``weights_dir``).
        weights_dir: folder the relative ``vqa_dir`` is under (usually ``${paths.weights_dir}``).
        batch_size: native: questions per VQA forward (speed/memory only).
        device: torch device.
        expected_sha256: if set, the question file must have this hash.
        official_python / official_script: the official backend's interpreter and ELLA's script.
        image_dir: official backend: where the grids go (null = a temporary folder).
        official_timeout_s: official backend: subprocess time limit.
        n_boot: bootstrap resamples over prompts for the categories' ± (the overall's is the exact
            standard error over prompts).
    """

    name = "dpgbench"
    higher_is_better = {"overall": True}

    def __init__(self, questions: Optional[str] = None, backend: str = "native", vqa_dir: str = "mplug_vqa_coco_large_en",
                 weights_dir: Optional[str] = None, batch_size: int = 16, device: str = "cpu",
                 expected_sha256: Optional[str] = None, official_python: Optional[str] = None,
                 official_script: Optional[str] = None, image_dir: Optional[str] = None,
                 official_timeout_s: float = 12 * 3600, n_boot: int = 1000):
        if backend not in ("native", "official") and ":" not in str(backend):
            raise ValueError(f"dpgbench: backend must be 'native', 'official' or 'module:Class', got {backend!r}")
        self.questions, self.backend, self.vqa_dir, self.weights_dir = questions, str(backend), vqa_dir, weights_dir
        self.batch_size, self.device, self.expected_sha256 = int(batch_size), device, expected_sha256
        self.official_python, self.official_script, self.image_dir = official_python, official_script, image_dir
        self.official_timeout_s, self.n_boot = float(official_timeout_s), int(n_boot)
        self._items: Optional[dict[Any, ItemQuestions]] = None
        self._sha: Optional[str] = None
        self._vqa = None
        self._vqa_info: dict = {}
        self._rows: list[dict] = []
        self._pending: list[Sample] = []
        self._tmp: Optional[str] = None

    # -- files ------------------------------------------------------------------------------------
    def _questions_file(self) -> Path:
        return resolve_file(self.questions, None, "dpg_bench.csv", what="DPG-Bench question file",
                            published=PUBLISHED + " (not shipped with varbench; set the evaluator's `questions`)")

    def _vqa_path(self) -> Path:
        p = Path(os.path.expanduser(str(self.vqa_dir)))
        return p if p.is_absolute() or not self.weights_dir else Path(os.path.expanduser(str(self.weights_dir))) / p

    def preflight(self, metadata: Sequence[dict]) -> None:
        self._questions_file()
        if metadata and not all("id" in m for m in metadata):
            raise ValueError("dpgbench scores DPG-Bench prompts (benchmark=dpgbench: metadata with the prompt's "
                             "file id); these prompts have no 'id'")
        if self.backend == "native":
            from varbench.evaluators.dpg.mplug import required_files

            required_files(self._vqa_path())
        elif self.backend == "official":
            self._official_files()

    def _official_files(self) -> tuple[str, Path]:
        py = self.official_python
        if not py or not Path(py).exists():
            raise WeightsNotFoundError(
                f"dpgbench official backend: python executable {py!r} not found. Set official_python to the "
                f"interpreter of an environment with modelscope, transformers 4.x and accelerate "
                f"(see /work/shared/reference/modelscope_mplug_env.md or ELLA's README).")
        script = Path(os.path.expanduser(str(self.official_script or "")))
        if not script.is_file():
            raise WeightsNotFoundError(f"dpgbench official backend: {str(script)!r} not found; set official_script to "
                                       f"ELLA's dpg_bench/compute_dpg_bench.py ({ELLA_SCRIPT}).")
        return py, script

    # -- lifecycle --------------------------------------------------------------------------------
    def setup(self, device: Optional[str] = None) -> None:
        if device is not None:
            self.device = device
        if self._items is None:
            path = self._questions_file()
            self._sha = check_sha256(path, self.expected_sha256, what="DPG-Bench question file")
            self._items = read_dpg_questions(path)
            self._qpath = path
        if self._vqa is not None:
            return
        if self.backend == "native":
            from varbench.evaluators.dpg.mplug import MPlugVQA

            self._vqa = MPlugVQA(self._vqa_path(), device=self.device, batch_size=self.batch_size)
            self._vqa_info = self._vqa.info()
        elif self.backend == "official":
            py, script = self._official_files()
            self._vqa_info = {"official_script": script.name, "official_script_sha256": check_sha256(script, None, what="ELLA script")}
        else:
            from varbench.core.registry import import_object

            self._vqa = import_object(self.backend, "DPG-Bench VQA model")()
            self._vqa_info = {"vqa": self.backend}

    def _item(self, s: Sample) -> Optional[ItemQuestions]:
        return self._items.get(s.metadata.get("id")) if self._items is not None else None

    def update(self, samples: Sequence[Sample]) -> None:
        if self._items is None:
            raise RuntimeError("dpgbench: call setup() before update()")
        if self.backend == "official":
            self._pending.extend(samples)
            return
        for s in samples:
            item = self._item(s)
            if item is None:
                row = row_for(None, None, f"no questions for item id {s.metadata.get('id')!r}")
            else:
                qids = list(item.qid2question)
                answers = self._vqa.answer([to_pil_rgb(s.image)] * len(qids), [item.qid2question[q] for q in qids])
                row = row_for(item, dict(zip(qids, answers)))
            self._rows.append({"prompt_index": s.prompt_index, "sample_index": s.sample_index,
                               "item_id": str(s.metadata.get("id")), **row})

    def compute(self) -> EvalResult:
        if self.backend == "official" and self._pending:
            from varbench.evaluators.dpg.official import run_official

            if self.image_dir is None and self._tmp is None:
                self._tmp = tempfile.mkdtemp(prefix="dpgbench_")     # ours: removed by reset()
            root = Path(self.image_dir or self._tmp)
            py, script = self._official_files()
            self._rows.extend(run_official(self._pending, self._items, py, script, self._qpath, root,
                                           self.official_timeout_s))
            self._pending = []
        rows = sorted(self._rows, key=lambda r: (r["prompt_index"], r["sample_index"]))
        metrics, unc = aggregate(rows, n_boot=self.n_boot)
        return EvalResult(metrics=metrics, uncertainty=unc, per_sample=rows)

    def reset(self) -> None:
        self._rows, self._pending = [], []
        if self._tmp:
            import shutil

            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def version_info(self) -> dict[str, Any]:
        return {"scorer": "dpgbench", "protocol": "ELLA compute_dpg_bench.py @3c228f1 (quirks kept: first CSV row "
                "skipped, categories from the last crop before zeroing, failed images dropped)",
                "backend": self.backend, "questions": "dpg_bench.csv", "questions_sha256": self._sha,
                "n_boot": self.n_boot, **self._vqa_info}
