"""GenEval's scoring rules as pure functions (djghosh13/geneval @ af4902f, evaluation/evaluate_images.py).

Re-stated, not copied; agreement with upstream is checked case by case against
tests/fixtures/evaluators/geneval_cases.jsonl (upstream outcomes). The rules, in order:

1. Per image the confidence threshold is `counting_threshold` (0.9) for tag "counting", else `threshold`
   (0.3), for every class. Per class: order by score descending (numpy argsort reversed, so ties keep
   upstream's order), keep score > threshold, cap at `max_objects` (16), then greedy NMS only when
   `max_overlap` < 1 (default 1.0 = off; IoU with the +1-pixel convention).
2. `include` clauses in order: the `count` most confident objects of the class; fail if fewer. With
   `color`: fail if fewer than `count` of them are classified as that colour. With `position = [rel, k]`
   (only if still matched): fail if clause k failed, else *every* found object must be `rel` of *every*
   object of clause k. Each clause records its objects (or None on failure) for later position checks.
3. `exclude` clauses: fail if the class has >= `count` detections (after thresholding).
4. Relative position of A to B from box centres/sizes with a 0.1 x (size A + size B) dead zone.
5. Overall score = unweighted mean of the six per-tag accuracies.
"""
from __future__ import annotations

from typing import Callable, Iterable, Mapping, Optional, Sequence

import numpy as np

COLORS = ("red", "orange", "yellow", "green", "blue", "purple", "pink", "brown", "black", "white")
COLOR_TEMPLATES = ("a photo of a {c} {classname}", "a photo of a {c}-colored {classname}", "a photo of a {c} object")
TAGS = ("single_object", "two_object", "counting", "colors", "position", "color_attr")

#: The 80 COCO "thing" classes in the standard detector order, named as GenEval names them
#: (mouse/remote/keyboard become "computer mouse"/"tv remote"/"computer keyboard"). Checked against the
#: official object_names.txt by the tests when shared/data is present.
COCO80_GENEVAL = (
    "person", "bicycle", "car", "motorcycle", "airplane", "bus", "train", "truck", "boat", "traffic light",
    "fire hydrant", "stop sign", "parking meter", "bench", "bird", "cat", "dog", "horse", "sheep", "cow",
    "elephant", "bear", "zebra", "giraffe", "backpack", "umbrella", "handbag", "tie", "suitcase", "frisbee",
    "skis", "snowboard", "sports ball", "kite", "baseball bat", "baseball glove", "skateboard", "surfboard",
    "tennis racket", "bottle", "wine glass", "cup", "fork", "knife", "spoon", "bowl", "banana", "apple",
    "sandwich", "orange", "broccoli", "carrot", "hot dog", "pizza", "donut", "cake", "chair", "couch",
    "potted plant", "bed", "dining table", "toilet", "tv", "laptop", "computer mouse", "tv remote",
    "computer keyboard", "cell phone", "microwave", "oven", "toaster", "sink", "refrigerator", "book", "clock",
    "vase", "scissors", "teddy bear", "hair drier", "toothbrush",
)

#: An object is (box, mask): box = array [x1, y1, x2, y2, score, ...], mask = HxW bool array or None.
Obj = tuple


def compute_iou(box_a, box_b) -> float:
    """IoU with the inclusive-pixel (+1) convention upstream uses for its optional NMS."""
    def area(b):
        return max(b[2] - b[0] + 1, 0) * max(b[3] - b[1] + 1, 0)

    inter = area([max(box_a[0], box_b[0]), max(box_a[1], box_b[1]), min(box_a[2], box_b[2]), min(box_a[3], box_b[3])])
    union = area(box_a) + area(box_b) - inter
    return inter / union if union else 0


def select_detections(per_class: Sequence[np.ndarray], masks: Optional[Sequence[Sequence]], classnames: Sequence[str],
                      tag: str, threshold: float = 0.3, counting_threshold: float = 0.9, max_objects: int = 16,
                      max_overlap: float = 1.0) -> dict[str, list[Obj]]:
    """Rule 1: per-class arrays (N, >=5) (+ optional masks) -> {classname: [(box, mask), ...]} most confident first."""
    conf = counting_threshold if tag == "counting" else threshold
    detected: dict[str, list[Obj]] = {}
    for idx, name in enumerate(classnames):
        # keep the detector's dtype: upstream compares float32 scores with a Python float, which NumPy 2
        # does in float32 (a score of exactly float32(0.3) is *not* > 0.3); casting would flip such ties
        boxes = np.asarray(per_class[idx])
        if boxes.size == 0:
            continue
        order = np.argsort(boxes[:, 4])[::-1]
        order = order[boxes[order, 4] > conf]
        order = order[:max_objects].tolist()
        kept = []
        while order:
            top = order.pop(0)
            kept.append((boxes[top], None if masks is None else masks[idx][top]))
            order = [o for o in order if max_overlap == 1 or compute_iou(boxes[top], boxes[o]) < max_overlap]
        if kept:
            detected[name] = kept
    return detected


def position_scores(obj_a: Obj, obj_b: Obj, position_threshold: float = 0.1) -> Optional[tuple[float, float]]:
    """Rule 4's direction scores (dx, dy) of A relative to B, or None when A and B are in no relation.

    offset = centre A - centre B; each axis shrinks towards 0 by `position_threshold` x (size A +
    size B) and is divided by the length of the unshrunk offset; dx < -0.5 is "left of", dy < -0.5
    "above" (image y grows downward). The one implementation of GenEval's position rule: the
    evaluators use it through `relative_position`, the toy world to place its position scenes with
    room to spare (`toy.world._clear_relation`).
    """
    # same array ops as upstream so float32 boxes stay float32 (edge cases at 0.5 / 1e-3 must agree)
    boxes = np.array([obj_a[0], obj_b[0]])[:, :4].reshape(2, 2, 2)
    center_a, center_b = boxes.mean(axis=-2)
    dim_a, dim_b = np.abs(np.diff(boxes, axis=-2))[..., 0, :]
    offset = center_a - center_b
    revised = np.maximum(np.abs(offset) - position_threshold * (dim_a + dim_b), 0) * np.sign(offset)
    if np.all(np.abs(revised) < 1e-3):
        return None
    dx, dy = revised / np.linalg.norm(offset)
    return dx, dy


def relative_position(obj_a: Obj, obj_b: Obj, position_threshold: float = 0.1) -> set[str]:
    """Rule 4: where A is relative to B ("left of", "right of", "above", "below"; image y grows downward)."""
    scores = position_scores(obj_a, obj_b, position_threshold)
    if scores is None:
        return set()
    dx, dy = scores
    rel = set()
    if dx < -0.5:
        rel.add("left of")
    if dx > 0.5:
        rel.add("right of")
    if dy < -0.5:
        rel.add("above")
    if dy > 0.5:
        rel.add("below")
    return rel


def evaluate(objects: dict[str, list[Obj]], metadata: dict,
             classify_colors: Callable[[list[Obj], str], list[str]], position_threshold: float = 0.1) -> tuple[bool, str]:
    """Rules 2-3. `classify_colors(objs, classname)` returns one colour name per object (rule 5's CLIP step)."""
    correct, reasons, groups = True, [], []
    for req in metadata.get("include", []):
        cls, count = req["class"], req["count"]
        matched = True
        found = objects.get(cls, [])[:count]
        if len(found) < count:
            correct = matched = False
            reasons.append(f"expected {cls}>={count}, found {len(found)}")
        else:
            if "color" in req:
                colors = classify_colors(found, cls)
                n_ok = colors.count(req["color"])
                if n_ok < count:
                    correct = matched = False
                    reasons.append(f"expected {req['color']} {cls}>={count}, found {n_ok} {req['color']}; and "
                                   + ", ".join(f"{colors.count(c)} {c}" for c in COLORS if c in colors))
            if "position" in req and matched:
                rel, target = req["position"]
                if groups[target] is None:
                    correct = matched = False
                    reasons.append(f"no target for {cls} to be {rel}")
                else:
                    for obj in found:
                        for tgt in groups[target]:
                            true_rels = relative_position(obj, tgt, position_threshold)
                            if rel not in true_rels:
                                correct = matched = False
                                reasons.append(f"expected {cls} {rel} target, found {' and '.join(true_rels)} target")
                                break
                        if not matched:
                            break
        groups.append(found if matched else None)
    for req in metadata.get("exclude", []):
        cls = req["class"]
        if len(objects.get(cls, [])) >= req["count"]:
            correct = False
            reasons.append(f"expected {cls}<{req['count']}, found {len(objects[cls])}")
    return correct, "\n".join(reasons)


def tag_means(pairs: Iterable[tuple[str, float]]) -> dict[str, float]:
    """Per-tag accuracy from (tag, correct) pairs: {tag: mean}, tags in the order first seen."""
    sums: dict[str, list[float]] = {}
    for tag, v in pairs:
        s = sums.setdefault(tag, [0.0, 0])
        s[0] += float(v)
        s[1] += 1
    return {tag: total / n for tag, (total, n) in sums.items()}


def geneval_overall(tag_means: Mapping[str, float] | Iterable[float]) -> float:
    """Rule 5: GenEval's overall score, the unweighted mean of the per-tag means (NaN without tags).

    The one implementation: the real GenEval evaluator (`summarize` and its bootstrap) and the toy
    GenEval evaluator both use it, through `overall_of_groups` for prompt groups."""
    means = list(tag_means.values() if isinstance(tag_means, Mapping) else tag_means)
    return float(np.mean(means)) if means else float("nan")


def overall_of_groups(groups: Iterable[Iterable[tuple[str, float]]]) -> float:
    """`geneval_overall` over prompt groups of (tag, correct) pairs (the bootstrap's statistic)."""
    return geneval_overall(tag_means(pair for g in groups for pair in g))


def summarize(rows: Sequence[dict]) -> dict[str, float]:
    """Rule 5 (summary_scores.py): per-tag accuracy, overall = mean of tag means, plus image/prompt accuracy."""
    by_prompt: dict[int, list[bool]] = {}
    for r in rows:
        by_prompt.setdefault(r["prompt_index"], []).append(bool(r["correct"]))
    out = tag_means((r["tag"], bool(r["correct"])) for r in rows)
    out["overall"] = geneval_overall(out)
    out["correct_images"] = float(np.mean([bool(r["correct"]) for r in rows])) if rows else float("nan")
    out["correct_prompts"] = float(np.mean([any(v) for v in by_prompt.values()])) if rows else float("nan")
    return out
