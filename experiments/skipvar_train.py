"""Fit SkipVAR decision models on any model, in the released file layout.

    python -m experiments.skipvar_train --model toy --benchmark toy --limit 24 --threshold 0.84 --out store/skipvar/toy_ssim_84
    python -m experiments.skipvar_train --model infinity_2b --benchmark geneval --threshold 0.84 --out weights/skipvar/mine

Then `method=skipvar method.knobs.decision_models=<out>`.

Method card (training; the release ships trained models, no training code):
  1. reconstructed: generate every prompt with the baseline; at the decision scale the `skipvar`
     policy's own feature code records [HF_Diff, HF_Ratio] (the features are as released).
  2. reconstructed: generate it again with each released action: skip k (last k scales not run)
     and uncond j (conditional rows only from scale n-j), k, j in 1..3 (the action set is released).
  3. as published (README/readme: "SSIM threshold of 0.88/0.86/0.84"): target = SSIM of the action's
     image to the baseline's. The SSIM here is the project's fidelity SSIM (torchmetrics, RGB in
     [0, 1], Gaussian 11x11, sigma 1.5): reconstructed, the release does not say which.
  4. reconstructed: labels. Skip label = the largest k whose SSIM >= threshold (0 if none); uncond
     label = the largest j whose SSIM >= threshold (0 if none), and the uncond model is fitted only
     on samples with skip label 0 (the released uncond scalers saw 519/754/1060 samples for
     0.84/0.86/0.88 against 2400 for every skip scaler, which fits this rule and an 80/20 split of
     the README's 3k samples).
  5. as released (the pickled estimators' parameters): StandardScaler, then
     LogisticRegression(C=1, lbfgs, max_iter=1500, multinomial), DecisionTreeClassifier(max_depth=8),
     RandomForestClassifier(n_estimators=200, max_depth=6). Saved (a varbench choice, not the
     release's joblib pickles, which run code when loaded) with skops as
     {skip,uncond}_model_{Logistic_Regression,Decision_Tree,Random_Forest}.skops + {skip,uncond}_model_scaler.skops:
     the same estimators, loaded back without running code.
  6. reconstructed: a class set with a single label (few prompts, or a model where no action
     ever keeps the threshold) is fitted as scikit-learn's DummyClassifier (most frequent / constant
     0), in the same files; report.json says so.

Outputs in --out: the model files, samples.jsonl (features, SSIM per action, labels per prompt),
report.json (settings, label counts, accuracies, timings, versions).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import torch

ACTIONS = (1, 2, 3)   # released skip1..3 / uncond1..3
CLASSIFIER_PARAMS = {  # the released pickles' estimator parameters
    "Logistic_Regression": dict(C=1.0, solver="lbfgs", max_iter=1500),
    "Decision_Tree": dict(max_depth=8),
    "Random_Forest": dict(n_estimators=200, max_depth=6),
}


def _estimator(name: str, seed: int):
    if name == "Logistic_Regression":
        from sklearn.linear_model import LogisticRegression

        return LogisticRegression(**CLASSIFIER_PARAMS[name])   # multinomial is lbfgs' default for > 2 classes
    if name == "Decision_Tree":
        from sklearn.tree import DecisionTreeClassifier

        return DecisionTreeClassifier(random_state=seed, **CLASSIFIER_PARAMS[name])
    if name == "Random_Forest":
        from sklearn.ensemble import RandomForestClassifier

        return RandomForestClassifier(random_state=seed, **CLASSIFIER_PARAMS[name])
    raise ValueError(f"unknown classifier {name!r}; use {sorted(CLASSIFIER_PARAMS)}")


def labels_from_ssim(ssim: dict[int, float], threshold: float) -> int:
    """The largest action k (1..3) whose SSIM to the baseline is >= threshold; 0 if none."""
    ssim = {int(k): float(v) for k, v in ssim.items()}   # keys are strings after a JSON round trip
    ok = [k for k in ACTIONS if ssim[k] >= threshold]
    return max(ok) if ok else 0


def ssim_to(images: torch.Tensor, reference: torch.Tensor) -> list[float]:
    """Per-image SSIM of uint8 (B, H, W, 3) images to the reference, as the fidelity evaluator computes it."""
    from torchmetrics.functional.image import structural_similarity_index_measure as ssim

    a = images.permute(0, 3, 1, 2).float().div(255.0)
    b = reference.permute(0, 3, 1, 2).float().div(255.0)
    return [float(v) for v in ssim(a, b, data_range=1.0, reduction="none").reshape(-1)]


def compose_cfg(model: str, benchmark: Optional[str], overrides: Sequence[str] = ()):
    from varbench.harness.presets import compose_job_config

    return compose_job_config([f"model={model}", f"benchmark={benchmark or 'protocol/' + model}", *overrides])


def collect(rt, prompts: Sequence[str], seeds: Sequence[int], gen_kwargs: dict, *, batch: int = 8,
            decision_scale: int = -4, feature_scale: int = 4, log=print) -> list[dict]:
    """Baseline + every action for each prompt: features at the decision scale and SSIM per action."""
    from varbench.policies.skip import SkipVARFixed
    from varbench.policies.skipvar import SkipVAR

    rows: list[dict] = []
    for i in range(0, len(prompts), batch):
        ps, ss = list(prompts[i:i + batch]), list(seeds[i:i + batch])
        recorded: list[np.ndarray] = []

        def record(X, _rec=recorded):
            _rec.append(np.asarray(X))
            z = np.zeros(len(X), dtype=np.int64)
            return z, z

        # one decision call for the whole batch (every action 0: the baseline's images); features are
        # per sample either way (tests/policies/test_skipvar.py::test_features_do_not_depend_on_the_batch)
        probe = SkipVAR(decide=record, decision_scale=decision_scale, feature_scale=feature_scale,
                        batch_rule="conservative")
        base = rt.generate(ps, ss, probe, **gen_kwargs)
        if len(recorded) != 1:
            raise RuntimeError("the baseline pass did not reach the decision scale")
        X = recorded[0]
        ssim = {("skip", k): ssim_to(rt.generate(ps, ss, SkipVARFixed(skip_last=k), **gen_kwargs).images, base.images)
                for k in ACTIONS}
        ssim.update({("uncond", j): ssim_to(rt.generate(ps, ss, SkipVARFixed(uncond_from=-j), **gen_kwargs).images,
                                            base.images) for j in ACTIONS})
        for b, (p, s) in enumerate(zip(ps, ss)):
            rows.append({"prompt": p, "seed": int(s), "features": [float(v) for v in X[b]],
                         "ssim_skip": {k: ssim[("skip", k)][b] for k in ACTIONS},
                         "ssim_uncond": {j: ssim[("uncond", j)][b] for j in ACTIONS}})
        log(f"  {min(i + batch, len(prompts))}/{len(prompts)} prompts")
    return rows


def _fit(name: str, X: np.ndarray, y: np.ndarray, seed: int):
    """(scaler, classifier, note). A single class -> DummyClassifier (the released files need some estimator)."""
    from sklearn.dummy import DummyClassifier
    from sklearn.preprocessing import StandardScaler

    scaler = StandardScaler().fit(X)
    Z = scaler.transform(X)
    if len(np.unique(y)) < 2:
        return scaler, DummyClassifier(strategy="most_frequent").fit(Z, y), f"one class ({int(y[0])}): DummyClassifier"
    return scaler, _estimator(name, seed).fit(Z, y), None


def fit_models(rows: list[dict], threshold: float, out: Path, classifiers: Sequence[str], *, test_frac: float = 0.2,
               seed: int = 0, n_features: int = 2) -> dict:
    from varbench.policies.skipvar_features import load_decision_models, save_decision_models

    X = np.array([r["features"][:n_features] for r in rows], dtype=np.float64)
    y_skip = np.array([labels_from_ssim(r["ssim_skip"], threshold) for r in rows], dtype=np.int64)
    y_unc = np.array([labels_from_ssim(r["ssim_uncond"], threshold) for r in rows], dtype=np.int64)
    for r, k, j in zip(rows, y_skip, y_unc):
        r["skip_label"], r["uncond_label"] = int(k), int(j)
    n = len(rows)
    idx = np.random.default_rng(seed).permutation(n)
    n_test = int(round(n * test_frac)) if n >= 10 else 0
    test, train = idx[:n_test], idx[n_test:]
    for i in test:
        rows[i]["split"] = "test"
    for i in train:
        rows[i]["split"] = "train"
    rep: dict[str, Any] = {"n_samples": n, "n_train": int(len(train)), "n_test": int(n_test), "threshold": threshold,
                           "skip_label_counts": {int(k): int((y_skip == k).sum()) for k in range(4)},
                           "uncond_label_counts_among_skip0": {int(j): int((y_unc[y_skip == 0] == j).sum()) for j in range(4)},
                           "classifiers": {}}
    unc_train = train[y_skip[train] == 0]
    for name in classifiers:
        s_scaler, s_model, s_note = _fit(name, X[train], y_skip[train], seed)
        if len(unc_train):
            u_scaler, u_model, u_note = _fit(name, X[unc_train], y_unc[unc_train], seed)
        else:  # no training sample keeps every scale: the uncond model is never consulted by such a skip model
            from sklearn.dummy import DummyClassifier
            from sklearn.preprocessing import StandardScaler

            u_scaler = StandardScaler().fit(X[train])
            u_model = DummyClassifier(strategy="constant", constant=0).fit(u_scaler.transform(X[train]), np.zeros(len(train), np.int64))
            u_note = "no training sample with skip label 0: DummyClassifier(constant 0)"
        save_decision_models(out, name, s_model, s_scaler, u_model, u_scaler)
        dm = load_decision_models(out, name)            # what the policy will load, read back
        entry: dict[str, Any] = {"skip_model": type(s_model).__name__, "uncond_model": type(u_model).__name__,
                                 "notes": [x for x in (s_note, u_note) if x]}
        for split, ids in (("train", train), ("test", test)):
            if len(ids):
                k, j = dm.predict(X[ids])
                entry[f"{split}_skip_accuracy"] = float((k == y_skip[ids]).mean())
                both = (k == 0) & (y_skip[ids] == 0)
                entry[f"{split}_uncond_accuracy"] = float((j[both] == y_unc[ids][both]).mean()) if both.any() else None
        rep["classifiers"][name] = entry
    return rep


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="toy", help="varbench/conf/model option (toy, tiny, infinity_2b, infinity_8b)")
    ap.add_argument("--benchmark", default=None, help="varbench/conf/benchmark option for the prompts (default: protocol/<model>)")
    ap.add_argument("--limit", type=int, default=None, help="first N prompts of the benchmark")
    ap.add_argument("--threshold", type=float, default=0.84, help="SSIM target (released: 0.84, 0.86, 0.88)")
    ap.add_argument("--classifier", default="all", help="Logistic_Regression | Decision_Tree | Random_Forest | all")
    ap.add_argument("--diff-only", action="store_true", help="fit on [HF_Diff] alone (the released _diff_only variant)")
    ap.add_argument("--decision-scale", type=int, default=-4)
    ap.add_argument("--feature-scale", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--test-frac", type=float, default=0.2)
    ap.add_argument("--seed", type=int, default=0, help="split / estimator seed (image seeds follow generation.seed)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", required=True, help="folder for the model files, samples.jsonl and report.json")
    ap.add_argument("overrides", nargs="*", help="extra Hydra overrides, e.g. model.weights=/path generation.cfg=4")
    a = ap.parse_args(argv)

    from varbench.harness.build import build_runtime, generation_kwargs, resolve_device, resolve_dtype
    from varbench.harness.job import image_seed
    from varbench.policies.skipvar_features import CLASSIFIERS, require_joblib, require_skops
    from varbench.harness.prompts import load_prompt_set

    require_joblib()
    require_skops()       # the models are written in skops' format: fail before generating anything
    classifiers = list(CLASSIFIERS) if a.classifier == "all" else [a.classifier]
    for c in classifiers:
        if c not in CLASSIFIERS:
            ap.error(f"--classifier {c!r}: use one of {list(CLASSIFIERS)} or all")
    t0 = time.perf_counter()
    cfg = compose_cfg(a.model, a.benchmark, a.overrides)
    device = resolve_device(a.device)
    rt = build_runtime(cfg.model, device, resolve_dtype("auto", device))
    ps = load_prompt_set(cfg.benchmark)
    items = list(ps.items)[: a.limit] if a.limit else list(ps.items)
    prompts = [it.prompt for it in items]
    seeds = [image_seed(cfg.generation.seed, it.index, 0) for it in items]
    kw = generation_kwargs(cfg, rt)
    print(f"skipvar_train: {len(prompts)} prompts on {a.model}, 7 generations each (baseline + skip1..3 + uncond1..3)")
    rows = collect(rt, prompts, seeds, kw, batch=a.batch, decision_scale=a.decision_scale, feature_scale=a.feature_scale)
    t_gen = time.perf_counter() - t0
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rep = fit_models(rows, a.threshold, out, classifiers, test_frac=a.test_frac, seed=a.seed, n_features=1 if a.diff_only else 2)
    import sklearn

    rep.update({"model": a.model, "benchmark": str(cfg.benchmark.name), "n_prompts": len(prompts),
                "features": ["hf_diff"] if a.diff_only else ["hf_diff", "hf_ratio"],
                "decision_scale": a.decision_scale, "feature_scale": a.feature_scale,
                "generation": {k: v for k, v in kw.items() if k != "negative_prompt"},
                "mean_ssim": {f"skip{k}": float(np.mean([r["ssim_skip"][k] for r in rows])) for k in ACTIONS}
                | {f"uncond{j}": float(np.mean([r["ssim_uncond"][j] for r in rows])) for j in ACTIONS},
                "seconds": {"generate": round(t_gen, 1), "total": round(time.perf_counter() - t0, 1)},
                "versions": {"sklearn": sklearn.__version__, "torch": torch.__version__}, "device": str(device)})
    with open(out / "samples.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    (out / "report.json").write_text(json.dumps(rep, indent=2, default=str) + "\n")
    print(json.dumps({k: rep[k] for k in ("skip_label_counts", "uncond_label_counts_among_skip0", "mean_ssim", "seconds")}))
    for name, e in rep["classifiers"].items():
        print(f"  {name}: " + ", ".join(f"{k}={v}" for k, v in e.items()))
    print(f"wrote {out}/ (use: method=skipvar method.knobs.decision_models={out})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
