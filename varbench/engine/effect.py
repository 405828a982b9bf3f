"""Did the method change anything? The record's ``method.effect`` from the per-image traces.

A preset can do nothing on some settings (FastVAR's released width rule prunes nothing at 8 of 15
aspect ratios, nor on the toy and tiny schedules); its row would then look like a result equal to
the baseline. Two per-image signals, both cheap and exact:

(a) plans: every plan the policy emitted for the image's batch was neutral
    (:func:`varbench.engine.plan.is_neutral`; the runtime notes it per scale in the trace, per
    image under per-image decisions, and the job writes it as the trace rows'
    ``plan_neutral``). Residual caching and attention-entropy requests only observe, so they do
    not count as an effect (on CUDA the fused entropy kernel may still move the last bits of a
    block that asked for entropy; the method decided nothing, so the image counts as unchanged).
(b) pixels: the image is bit-identical to the baseline's (the fidelity evaluator's per-sample PSNR
    is infinite), where fidelity was scored.

An image is unchanged if (a) or (b) holds, changed if neither can hold (a plan changed something and
fidelity is absent or finite), and unknown when its trace predates ``plan_neutral`` and fidelity was
not scored. ``effect``: "none" (every image unchanged), "partial" (some), "some" (none unchanged),
None (the baseline itself, or any image unknown: regenerate its images to know).
"""
from __future__ import annotations

import math
from collections import Counter
from typing import Iterable, Mapping, Optional

#: the reason recorded when every plan was neutral and the policy gives none of its own
NEUTRAL_REASON = "every plan was neutral"

#: the reason when an image is unchanged only because its pixels equal the baseline's
IDENTICAL_REASON = "every image bit-identical to the baseline's"



def no_effect_reason(policy, trace: list[dict]) -> Optional[str]:
    """Why `policy` changed nothing for an image whose every plan was neutral (its own
    `no_effect_reason()`, or the generic :data:`NEUTRAL_REASON`); None if some plan was not neutral.
    `trace`: the image's per-scale runtime trace (`GenerationOutput.image_traces`)."""
    if not all(tr.get("neutral") for tr in trace):
        return None
    hook = getattr(policy, "no_effect_reason", None)
    return (hook() if hook is not None else None) or NEUTRAL_REASON

def image_unchanged(trace: Mapping, psnr: Optional[float] = None) -> Optional[bool]:
    """True / False / None (unknown) for one image's trace row and its fidelity PSNR (or None)."""
    flags = [sc.get("plan_neutral") for sc in trace.get("scales") or []]
    neutral = None if not flags or any(f is None for f in flags) else all(flags)
    identical = None if psnr is None else bool(math.isinf(psnr) and psnr > 0)
    if neutral or identical:
        return True
    if neutral is False:
        return False
    return None


def method_effect(traces: Iterable[Mapping], psnr: Mapping[tuple, float], method: str) -> dict:
    """``{"effect", "effect_reason", "unchanged_images"}`` for the record's ``method`` block.

    traces: the record's per-image trace rows; psnr: {(prompt_index, sample_index): fidelity PSNR}
    (empty without fidelity); method: the policy name ("baseline" is the reference: never marked).
    effect_reason: the policies' reasons of the unchanged images (``no_effect_reason`` in the trace
    rows, most frequent first), or :data:`IDENTICAL_REASON`; None unless some image is unchanged."""
    if method == "baseline":
        return {"effect": None, "effect_reason": None, "unchanged_images": None}
    verdicts, reasons = [], Counter()
    for row in traces:
        key = (row.get("prompt_index"), row.get("sample_index"))
        v = image_unchanged(row, psnr.get(key))
        verdicts.append(v)
        if v:
            reasons[row.get("no_effect_reason") or IDENTICAL_REASON] += 1
    n_same = sum(1 for v in verdicts if v)
    if not verdicts or any(v is None for v in verdicts):
        effect = None
    elif n_same == len(verdicts):
        effect = "none"
    else:
        effect = "partial" if n_same else "some"
    reason = "; ".join(r for r, _ in reasons.most_common()) or None
    return {"effect": effect, "effect_reason": reason, "unchanged_images": n_same}


def console_line(name: str, info: Mapping, n_images: int) -> Optional[str]:
    """The one line a job prints when its method changed nothing (or nothing for some images)."""
    if info.get("effect") == "none":
        return (f"[varbench] {name}: NO EFFECT on any of the {n_images} images ({info['effect_reason']}); "
                "the record says method.effect='none' and its table row is marked 'no effect'")
    if info.get("effect") == "partial":
        return (f"[varbench] {name}: no effect on {info['unchanged_images']} of the {n_images} images "
                f"({info['effect_reason']})")
    return None
