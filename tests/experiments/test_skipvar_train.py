"""`python -m experiments.skipvar_train` on the trained toy model (CPU, < 2 minutes): it writes the
released file layout, the policy loads it, and at batch 1 the policy's decision is the fitted
models' prediction on the features recorded during training, applied as the fixed action arm."""
from __future__ import annotations

import json
import time

import numpy as np
import pytest
import torch

pytest.importorskip("sklearn")

from experiments.skipvar_train import labels_from_ssim  # noqa: E402


def test_labels_are_the_most_aggressive_action_that_keeps_the_threshold():
    assert labels_from_ssim({1: 0.95, 2: 0.90, 3: 0.80}, 0.88) == 2
    assert labels_from_ssim({1: 0.95, 2: 0.90, 3: 0.89}, 0.88) == 3
    assert labels_from_ssim({1: 0.85, 2: 0.80, 3: 0.70}, 0.88) == 0
    assert labels_from_ssim({"1": 0.99, "2": 0.5, "3": 0.99}, 0.9) == 3   # JSON keys; not assumed monotone


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from experiments.skipvar_train import main

    out = tmp_path_factory.mktemp("skipvar_toy")
    t0 = time.perf_counter()
    assert main(["--model", "toy", "--benchmark", "toy", "--limit", "8", "--threshold", "0.935",
                 "--classifier", "all", "--out", str(out)]) == 0
    return out, time.perf_counter() - t0


@pytest.mark.integration
def test_training_command_writes_the_released_layout(trained):
    from varbench.policies.skipvar_features import CLASSIFIERS, load_decision_models, model_files

    out, seconds = trained
    assert seconds < 120, f"skipvar_train on 8 toy prompts took {seconds:.0f} s"
    rep = json.loads((out / "report.json").read_text())
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert rep["n_samples"] == len(rows) == 8 and rep["model"] == "toy" and rep["features"] == ["hf_diff", "hf_ratio"]
    for c in CLASSIFIERS:
        assert all((out / f).is_file() for f in model_files(c, "skops").values())   # the safe format
        assert not any((out / f).exists() for f in model_files(c, "pkl").values())
        dm = load_decision_models(out, c)
        assert dm.n_features == 2
        assert rep["classifiers"][c]["train_skip_accuracy"] is not None
    for r in rows:
        assert set(r["ssim_skip"]) == set(r["ssim_uncond"]) == {"1", "2", "3"}
        assert r["skip_label"] == labels_from_ssim(r["ssim_skip"], 0.935)
        assert all(-1.0 <= v <= 1.0 for v in list(r["ssim_skip"].values()) + list(r["ssim_uncond"].values()))
    assert sum(rep["skip_label_counts"].values()) == 8


@pytest.mark.integration
@pytest.mark.parametrize("threshold", [0.935, 0.995])
def test_policy_applies_the_fitted_decision(trained, tmp_path, threshold):
    from experiments.skipvar_train import fit_models
    from varbench.policies import build_policy
    from varbench.policies.skip import SkipVARFixed
    from varbench.policies.skipvar_features import load_decision_models
    from varbench.toy.load import TOY_H_DIV_W, TOY_SCHEDULE, load_toy_runtime, toy_sampling

    out, _ = trained
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    folder = tmp_path / "dm"
    fit_models(rows, threshold, folder, ["Logistic_Regression"])       # a second target on the same samples
    dm = load_decision_models(folder)
    rt = load_toy_runtime("cpu")
    kw = dict(schedule=TOY_SCHEDULE, h_div_w=TOY_H_DIV_W, **toy_sampling())
    for r in rows[:2]:
        pol = build_policy("skipvar", decision_models=str(folder))
        img = rt.generate([r["prompt"]], [r["seed"]], pol, **kw).images
        st = pol.stats()
        np.testing.assert_allclose(st["features"][0], r["features"], rtol=1e-5, atol=1e-7)  # batch 8 in training, 1 here
        k, j = dm.predict(np.array([r["features"]]))
        assert st["per_sample"] == [{"skip": int(k[0]), "uncond": int(j[0])}]
        fixed = SkipVARFixed(skip_last=int(k[0]), uncond_from=-int(j[0]) if j[0] else None)
        assert torch.equal(img, rt.generate([r["prompt"]], [r["seed"]], fixed, **kw).images)
