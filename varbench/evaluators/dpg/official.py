"""The official DPG-Bench backend: ELLA's ``compute_dpg_bench.py`` in the user's environment, on the
2x2 grids it reads (``<item_id>.png``, sample k in crop k), its answers read back.

The script writes, per image, one line ``<image path>, <crop score 1>, ..., <crop score n>, <mean>`` to
``--res-path`` and one line ``<image path>, <crop box>, <question>, <answer>`` per question and crop to
``<res-path minus .txt>_detail.txt``, in question order; an image it cannot score is printed as ``Failed
filename: <file> <error>`` and left out. We rebuild each crop's row from its answers with our scorer and
check that our crop scores equal the script's (so the two implementations of the rules cannot drift).
"""
from __future__ import annotations

import re
import subprocess
from collections import defaultdict
from pathlib import Path
from typing import Any, Sequence

from varbench.evaluators.base import Sample
from varbench.evaluators.common import to_pil_rgb
from varbench.evaluators.dpg.grid import crop_boxes, make_grid
from varbench.evaluators.dpg.questions import ItemQuestions
from varbench.evaluators.dpg.scoring import row_for


def write_grids(samples: Sequence[Sample], folder: Path) -> tuple[dict[str, list[Sample]], int, int]:
    """Write one grid per prompt into ``folder``; returns ({item id: its samples by sample index},
    resolution, samples per prompt)."""
    by_item: dict[str, list[Sample]] = defaultdict(list)
    for s in samples:
        by_item[str(s.metadata.get("id"))].append(s)
    folder.mkdir(parents=True, exist_ok=True)
    sizes, counts = set(), set()
    for item_id, ss in by_item.items():
        ss.sort(key=lambda s: s.sample_index)
        images = [to_pil_rgb(s.image) for s in ss]
        sizes.add(images[0].size[0])
        counts.add(len(images))
        make_grid(images).save(folder / f"{item_id}.png")
    if len(sizes) != 1 or len(counts) != 1:
        raise ValueError(f"dpgbench official backend: ELLA's script takes one resolution and one image count per run; "
                         f"got resolutions {sorted(sizes)} and {sorted(counts)} images per prompt")
    return by_item, sizes.pop(), counts.pop()


def _parse_results(path: Path, image_dir: Path) -> dict[str, list[float]]:
    """{item id: per-crop scores} from the script's ``--res-path`` file."""
    out = {}
    prefix = str(image_dir)
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith(prefix):
            continue
        img, *nums = line.split(", ")
        out[Path(img).name.split(".")[0]] = [float(x) for x in nums[:-1]]
    return out


_DETAIL = re.compile(r"^(?P<img>.*?), \((?P<box>\d+, \d+, \d+, \d+)\), (?P<rest>.*)$")


def _parse_detail(path: Path) -> dict[tuple[str, tuple], list[str]]:
    """{(item id, crop box): answers in question order} from the ``_detail.txt`` file."""
    out: dict[tuple[str, tuple], list[str]] = defaultdict(list)
    for line in path.read_text(encoding="utf-8").splitlines():
        m = _DETAIL.match(line)
        if not m:
            continue
        box = tuple(int(x) for x in m["box"].split(", "))
        answer = m["rest"].rsplit(", ", 1)[-1]          # the question may hold ", "; mPLUG's short answers do not
        out[(Path(m["img"]).name.split(".")[0], box)].append(answer)
    return out


def run_official(samples: Sequence[Sample], items: dict[Any, ItemQuestions], python: str, script: Path,
                 questions: Path, root: Path, timeout_s: float) -> list[dict]:
    """Run ELLA's script on ``samples`` (every sample of each prompt) and return one row per sample."""
    image_dir = root / "grids"
    by_item, resolution, n = write_grids(samples, image_dir)
    res_path = root / "dpg_results.txt"          # outside the image folder: the script lists every file there
    for f in (res_path, root / "dpg_results_detail.txt"):
        f.unlink(missing_ok=True)
    cmd = [python, str(script), "--image-root-path", str(image_dir), "--resolution", str(resolution),
           "--pic-num", str(n), "--csv", str(questions), "--res-path", str(res_path), "--vqa-model", "mplug"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=str(Path(script).resolve().parent.parent))
    if proc.returncode != 0 or not res_path.exists():
        raise RuntimeError(f"dpgbench official scorer failed (exit {proc.returncode}): {' '.join(cmd)}\n"
                           f"stderr tail:\n{proc.stderr[-3000:]}")
    scores = _parse_results(res_path, image_dir)
    answers = _parse_detail(root / "dpg_results_detail.txt")
    failures = dict(re.findall(r"Failed filename: (\S+?)\.png (.*)", proc.stdout))
    rows = []
    boxes = crop_boxes(resolution, n)
    for item_id, ss in by_item.items():
        item = items.get(item_id)
        for k, s in enumerate(ss):
            if item_id not in scores:
                row = row_for(None, None, f"official script: {failures.get(item_id, 'no result line')}")
            else:
                got = answers.get((item_id, boxes[k]), [])
                qids = list(item.qid2question) if item is not None else []
                if item is None or len(got) != len(qids):
                    raise RuntimeError(f"dpgbench official backend: {item_id}: {len(got)} answers for crop {k}, "
                                       f"{len(qids)} questions in {questions.name}; the script and varbench read "
                                       f"the question file differently")
                row = row_for(item, dict(zip(qids, got)))
                if row["failed"] or abs(row["crop_score"] - scores[item_id][k]) > 1e-12:
                    raise RuntimeError(f"dpgbench official backend: {item_id} crop {k}: the script scored "
                                       f"{scores[item_id][k]}, varbench's rules {row['crop_score']} from the same answers")
            rows.append({"prompt_index": s.prompt_index, "sample_index": s.sample_index, "item_id": item_id, **row})
    return rows
