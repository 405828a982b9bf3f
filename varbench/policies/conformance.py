"""Does a method do what a policy must? The checks behind `python -m varbench.check_method` and
tests/policies/test_policies_conformance.py (one implementation for both).

On the tiny random Infinity (`varbench.testing.tiny_runtime`, the 7-scale '0.06M' schedule, CFG 3,
on the CPU) a method, given its neutral and active knobs (`Policy.NEUTRAL`, `Policy.ACTIVE` unless
given), must:

* **neutral**: under its neutral knobs reproduce the baseline bit for bit (every scale's bits, the
  summed codes and the decoded image);
* **active**: under its active knobs change FLOPs or bits (a method that changes neither measures
  nothing);
* **counted**: count its work: FLOPs (the total is the text part plus the per-scale parts, one per
  scale) and the KV cache it allocates, both positive; the ratios to the baseline are printed;
* **batch**: at batch > 1 give each image the decisions it gets alone (the scales, rows, blocks and
  tokens that ran, and its FLOPs), as `varbench.engine.batch_split` promises for per-image decisions
  and as any plan that does not read the prompt must. An adaptive method that makes one plan for the
  whole batch is not held to it (the check says so).

Usage::

    from varbench.testing import tiny_runtime
    from varbench.policies.conformance import run_checks
    for check in run_checks(MyPolicy, tiny_runtime(seed=0)):   # or neutral={...}, active={...}
        print(check.line())                      # "PASS neutral == baseline: ..."

Bits at batch > 1 are not compared: batched matmuls round differently with other batch companions
(tests/engine/test_batch_split.py), so a flipped bit there says nothing about the method.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Optional, Sequence

from varbench.engine.policy import Policy

#: the tiny runtime's schedule and guidance for every check
PN, CFG, TAU = "0.06M", 3.0, 1.0
#: the one prompt of the batch-1 checks
PROMPT, SEED = "a red circle", 0
#: the batch of the batch check (prompts whose entropies differ, so adaptive methods disagree)
BATCH_PROMPTS = ("a red circle", "two blue squares", "a green triangle above a cat", "a photo of a dog")
BATCH_SEEDS = (0, 1, 2, 3)

_MISSING = object()

#: what each declared setting means, for the message that asks a method to declare it
HOW = {
    "NEUTRAL": "NEUTRAL = {knob: value, ...} (constructor knobs under which its plans change nothing)",
    "ACTIVE": ("ACTIVE = {knob: value, ...} (constructor knobs under which it changes FLOPs or bits on the tiny "
               "runtime at pn '0.06M'), or ACTIVE = None if it has none (the baseline)"),
}


class MissingSetting(LookupError):
    """A method declares no NEUTRAL / ACTIVE setting; the message names its class and what to add."""


def declared(cls: type, what: str, name: Optional[str] = None) -> Any:
    """The `what` setting (``"NEUTRAL"`` or ``"ACTIVE"``) the policy class declares; `MissingSetting`
    naming the class and the attribute to add when it declares none."""
    value = getattr(cls, what, _MISSING)
    if value is _MISSING:
        who = f"registered method {name!r} ({cls.__module__}.{cls.__qualname__})" if name else \
            f"{cls.__module__}.{cls.__qualname__}"
        raise MissingSetting(f"{who} declares no {what.lower()} setting: add the class attribute {HOW[what]} "
                             "beside its Knobs")
    return value


@dataclasses.dataclass(frozen=True)
class Check:
    """One check's verdict: ok True (PASS), False (FAIL) or None (SKIP: not applicable), with numbers."""

    name: str
    ok: Optional[bool]
    detail: str

    def line(self) -> str:
        word = "PASS" if self.ok else "SKIP" if self.ok is None else "FAIL"
        return f"{word} {self.name}: {self.detail}"


def generate(rt, policy: Optional[Policy] = None, prompts: Sequence[str] = (PROMPT,), seeds: Sequence[int] = (SEED,)):
    """One generation on `rt` with the checks' settings (`policy` None: the baseline)."""
    return rt.generate(list(prompts), list(seeds), policy=policy, cfg=CFG, tau=TAU, pn=PN)


def same_bits(a, b) -> bool:
    """Every scale's bits and the summed codes of two generations are equal."""
    import torch

    if len(a.bits) != len(b.bits):
        return False
    for x, y in zip(a.bits, b.bits):
        if (x is None) != (y is None) or (x is not None and not torch.equal(x, y)):
            return False
    return torch.equal(a.summed_codes, b.summed_codes)


def bits_changed(a, b) -> int:
    """How many bits differ between two generations of one image (a skipped scale counts whole)."""
    n = 0
    for x, y in zip(a.bits, b.bits):
        if x is None or y is None:
            n += 0 if x is y else (x if x is not None else y).numel()
        else:
            n += int((x != y).sum())
    return n


def kv_allocated(out) -> int:
    """The most KV-cache bytes a generation allocated (`GenerationOutput.kv_bytes`); 0 when none counted."""
    return max((int(k.get("allocated") or 0) for k in out.kv_bytes), default=0)


def check_neutral(rt, policy: Policy, baseline) -> Check:
    """Under its neutral knobs the method reproduces the baseline bit for bit (FLOPs may differ: a
    method may still measure, as ToProVAR's entropies)."""
    import torch

    out = generate(rt, policy)
    bits, images = same_bits(out, baseline), torch.equal(out.images, baseline.images)
    if bits and images:
        return Check("neutral == baseline", True, "bits, summed codes and image identical")
    return Check("neutral == baseline", False, f"{bits_changed(out, baseline)} bits differ"
                 + ("" if images else f", image differs ({int((out.images != baseline.images).sum())} values)")
                 + ": a neutral setting must change nothing")


def check_active(rt, policy: Policy, baseline):
    """Under its active knobs the method changes FLOPs or bits. Returns (check, the generation)."""
    out = generate(rt, policy)
    ratio = baseline.flops["total"] / out.flops["total"] if out.flops["total"] else math.inf
    n = bits_changed(out, baseline)
    ok = out.flops["total"] != baseline.flops["total"] or not same_bits(out, baseline)
    detail = f"FLOPs x{ratio:.3f} fewer, {n} bits changed"
    return Check("active changes work", ok, detail + ("" if ok else ": the active setting changed neither")), out


def check_counted(out, baseline) -> Check:
    """FLOPs (text + one entry per scale = total) and the KV cache allocated are counted, with the
    ratios to the baseline."""
    fl = out.flops
    problems = []
    per_scale = list(fl.get("per_scale") or [])
    if not fl.get("total", 0) > 0:
        problems.append(f"FLOPs total {fl.get('total')!r} is not positive")
    if len(per_scale) != len(out.schedule):
        problems.append(f"{len(per_scale)} per-scale FLOPs for {len(out.schedule)} scales")
    elif not math.isclose(fl.get("text", 0.0) + sum(per_scale), fl.get("total", 0.0), rel_tol=1e-9):
        problems.append(f"text + per-scale FLOPs {fl.get('text', 0.0) + sum(per_scale):.6g} != total {fl.get('total')}")
    kv, kv_base = kv_allocated(out), kv_allocated(baseline)
    if kv <= 0:
        problems.append("no KV-cache bytes counted")
    ratio = f"FLOPs x{baseline.flops['total'] / fl['total']:.3f} fewer" if fl.get("total", 0) > 0 else "FLOPs ?"
    mem = f"KV allocated x{kv_base / kv:.3f} smaller ({kv} of {kv_base} bytes)" if kv > 0 else "KV ?"
    return Check("FLOPs and KV memory counted", not problems, f"{ratio}, {mem}" + (f": {'; '.join(problems)}" if problems else ""))


def kept(trace) -> list:
    """What a trace says ran: per scale (ran, rows per image, per block (mode, tokens per sublayer))."""
    return [(tr["ran"], tr["rows"] // tr["batch"],
             [(b["mode"], b["sa"], b["ca"], b["ffn"], b["qkv"]) for b in tr.get("blocks") or []]) for tr in trace]


def check_batch(rt, make_policy, prompts: Sequence[str] = BATCH_PROMPTS, seeds: Sequence[int] = BATCH_SEEDS) -> Check:
    """At batch > 1 each image gets the decisions it gets alone (what ran, and its FLOPs). `make_policy`
    builds a fresh policy with the active knobs."""
    policy = make_policy()
    if policy.adaptive and not policy.per_image_decisions:
        return Check("batch > 1 decisions", None, f"{type(policy).__name__} makes one plan for the whole batch "
                     "(adaptive, no per-image decisions): not compared with batch 1")
    out = generate(rt, policy, prompts, seeds)
    traces = out.image_traces or [out.trace] * len(prompts)
    flops = out.image_flops or [None] * len(prompts)
    bad = []
    for i, (p, s) in enumerate(zip(prompts, seeds)):
        alone = generate(rt, make_policy(), [p], [s])
        if kept(traces[i]) != kept(alone.trace):
            bad.append(f"image {i}: ran other scales/blocks/tokens than alone")
        elif flops[i] is not None and not math.isclose(flops[i]["total"], alone.flops["total"], rel_tol=1e-9):
            bad.append(f"image {i}: FLOPs {flops[i]['total']:.6g} at batch {len(prompts)} vs {alone.flops['total']:.6g} alone")
    parts = len({id(t) for t in out.image_traces}) if out.image_traces else 1
    detail = f"{len(prompts)} images, {parts} sub-batch{'es' if parts != 1 else ''}"
    return Check("batch > 1 decisions", not bad, detail + (f": {'; '.join(bad)}" if bad else ", each as alone"))


def run_checks(cls: type, rt, neutral: Optional[Mapping[str, Any]] = None, active: Optional[Mapping[str, Any]] = None,
               name: Optional[str] = None) -> list[Check]:
    """Every check of the module docstring for the policy class `cls` on the runtime `rt` (the tiny
    random one: ``varbench.testing.tiny_runtime(seed=0)``, built by the caller so that this
    module needs no dev tool); `neutral` / `active`: its knobs for the two settings (default: the
    class's `NEUTRAL` / `ACTIVE`, `MissingSetting` when it declares none)."""
    neutral = dict(declared(cls, "NEUTRAL", name) if neutral is None else neutral)
    active = declared(cls, "ACTIVE", name) if active is None else active
    baseline = generate(rt)
    checks = [check_neutral(rt, cls(**neutral), baseline)]
    if active is None:
        checks.append(Check("active changes work", None, "no active setting (ACTIVE = None: a reference method)"))
        return checks
    active = dict(active)
    check, out = check_active(rt, cls(**active), baseline)
    checks += [check, check_counted(out, baseline), check_batch(rt, lambda: cls(**active))]
    return checks
