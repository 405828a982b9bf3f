"""Quality/FLOPs regression gate on the trained toy model (runs on a CPU in about a minute).

    python -m experiments.toy_regression --check      # compare with results/curated/toy_regression.json
    python -m experiments.toy_regression --write      # re-measure and write the reference (review the diff!)

For the baseline and each method's default config, generate a fixed prompt subset of the toy world
(fixed seeds), score it with the exact toy GenEval, and count analytic FLOPs. `--check` fails (exit
1, one line per violation) when a method's toy GenEval leaves reference ± `quality_tol`, or its
FLOPs ratio to the baseline leaves reference × (1 ± `flops_rel_tol`). FLOPs are exact, so their
tolerance only absorbs intended refactors; quality moves only when sampling or a method changes.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REFERENCE = Path(__file__).resolve().parents[1] / "results" / "curated" / "toy_regression.json"

from varbench.harness.presets import method_set, resolve_method

#: the gate's methods: conf/method_set/toy_regression/toy.yaml (*_toy: thresholds scaled to the toy schedule)
METHODS = method_set("toy_regression", "toy")
N_PROMPTS = 24           # 4 per GenEval tag
QUALITY_TOL = 0.10       # absolute, on toy GenEval overall (24 prompts: one prompt = 1/24 of a tag mean)
FLOPS_REL_TOL = 0.02     # relative, on the FLOPs ratio


def measure(methods=METHODS, n_prompts: int = N_PROMPTS, knob_overrides: dict | None = None) -> dict:
    """{method: {"toy_geneval": overall, "per_tag": {...}, "flops": per-image FLOPs, "flops_x": ratio}}."""
    from varbench.evaluators.base import Sample
    from varbench.toy.geneval import ToyGenEval
    from varbench.toy import world
    from varbench.toy.load import TOY_H_DIV_W, TOY_SCHEDULE, load_toy_runtime, toy_sampling

    rt = load_toy_runtime("cpu")
    prompts = world.prompt_set(n_prompts, seed=0)
    out = {}
    for name in methods:
        policy = resolve_method(name, model="toy").build(**(knob_overrides or {}).get(name, {}))
        ev = ToyGenEval()
        flops = kv = 0.0
        for i in range(0, n_prompts, 8):
            chunk = prompts[i:i + 8]
            res = rt.generate([p["prompt"] for p in chunk], [1000 * (i + j) for j in range(len(chunk))], policy,
                              schedule=TOY_SCHEDULE, h_div_w=TOY_H_DIV_W, **toy_sampling())
            from PIL import Image

            ev.update([Sample(prompt_index=i + j, sample_index=0, prompt=p["prompt"], metadata=p["metadata"],
                              image=Image.fromarray(res.images[j].numpy())) for j, p in enumerate(chunk)])
            # the mean over every prompt of its own work (adaptive methods vary); a padded batch's padding
            # (res.flops["padding"], varbench/engine/padded_batch.py) is batching overhead, not the method's
            flops += sum(f["total"] for f in res.image_flops) / n_prompts
            kv += res.kv_bytes[-1]["allocated"] / n_prompts   # KV bytes allocated per image (a batch of 8 holds 8)
        r = ev.compute()
        out[name] = {"toy_geneval": r.metrics["overall"],
                     "per_tag": {k: v for k, v in r.metrics.items() if k != "overall"}, "flops": flops, "kv_bytes": kv}
    base, base_kv = out["baseline"]["flops"], out["baseline"]["kv_bytes"]
    for v in out.values():
        v["flops_x"] = base / v["flops"]
        v["kv_x"] = base_kv / v["kv_bytes"]   # KV-cache memory saving (exact: allocated capacities)
    return out


def check(measured: dict, reference: dict) -> list[str]:
    tol_q, tol_f = reference["quality_tol"], reference["flops_rel_tol"]
    problems = []
    for name, ref in reference["methods"].items():
        got = measured.get(name)
        if got is None:
            problems.append(f"{name}: not measured")
            continue
        dq = got["toy_geneval"] - ref["toy_geneval"]
        if abs(dq) > tol_q:
            problems.append(f"{name}: toy GenEval {got['toy_geneval']:.3f} vs reference {ref['toy_geneval']:.3f} "
                            f"(moved {dq:+.3f}, tolerance ±{tol_q})")
        rel = got["flops_x"] / ref["flops_x"] - 1
        if abs(rel) > tol_f:
            problems.append(f"{name}: FLOPs ratio {got['flops_x']:.3f}x vs reference {ref['flops_x']:.3f}x "
                            f"({rel:+.1%}, tolerance ±{tol_f:.0%})")
        if "kv_x" in ref:   # references written before KV accounting have no memory entry
            rel = got["kv_x"] / ref["kv_x"] - 1
            if abs(rel) > tol_f:
                problems.append(f"{name}: KV memory ratio {got['kv_x']:.3f}x vs reference {ref['kv_x']:.3f}x "
                                f"({rel:+.1%}, tolerance ±{tol_f:.0%})")
    return problems


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--check", action="store_true")
    g.add_argument("--write", action="store_true")
    args = ap.parse_args(argv)
    measured = measure()
    table = "\n".join(f"  {n:16s} toy GenEval {v['toy_geneval']:.3f}   FLOPs x{v['flops_x']:.2f}" for n, v in measured.items())
    print(table)
    if args.write:
        REFERENCE.parent.mkdir(parents=True, exist_ok=True)
        from varbench.harness.provenance import git_info
        from varbench.toy.load import WEIGHTS_DIR, sha256

        provenance = {"command": "python -m experiments.toy_regression --write", "git": git_info(),
                      "toy_manifest_sha256": sha256(WEIGHTS_DIR / "manifest.json")}
        REFERENCE.write_text(json.dumps({"n_prompts": N_PROMPTS, "quality_tol": QUALITY_TOL, "flops_rel_tol": FLOPS_REL_TOL,
                                         "provenance": provenance, "methods": measured}, indent=1) + "\n")
        print(f"wrote {REFERENCE}")
        return 0
    problems = check(measured, json.loads(REFERENCE.read_text()))
    for p in problems:
        print("REGRESSION:", p)
    print(f"FAIL: {len(problems)} regression(s) against {REFERENCE.name}" if problems else
          f"PASS: {len(measured)} methods within the reference's tolerances ({REFERENCE.name})")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
