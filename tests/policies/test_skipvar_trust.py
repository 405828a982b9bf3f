"""SkipVAR's decision models: pickles run code, so only pinned or trusted ones load; varbench writes
skops; the files are part of the generation key (issue 21 items 2-3)."""
from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("sklearn")
pytest.importorskip("skops")

import varbench  # noqa: E402
from varbench.policies.skipvar_features import (CLASSIFIERS, DecisionModelError, load_decision_models,  # noqa: E402
                                                model_files, save_decision_models)
from varbench.policies.skipvar_release import RELEASED_SHA256, TRUST_ENV  # noqa: E402

TOY_DM = Path(varbench.__file__).parent / "toy" / "weights" / "skipvar_toy_93"


class _RunsCode:
    """Unpickling this calls exec: what any pickle can do to the machine that loads it."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({str(self.marker)!r}, 'w').write('ran')",))


def _evil_folder(tmp_path: Path) -> tuple[Path, Path]:
    d, marker = tmp_path / "dm", tmp_path / "code_ran"
    d.mkdir()
    for name in model_files("Logistic_Regression").values():
        (d / name).write_bytes(pickle.dumps(_RunsCode(marker)))
    return d, marker


def _models(n=200, seed=0, shift=0.0):
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    rng = np.random.default_rng(seed)
    X = np.c_[rng.normal(0.1 + shift, 0.05, n), rng.normal(0.5, 0.08, n)]
    y = np.clip(((0.2 - X[:, 0]) / 0.05).astype(int), 0, 3)
    sc = StandardScaler().fit(X)
    m = LogisticRegression(max_iter=1500).fit(sc.transform(X), y)
    return dict(skip_model=m, skip_scaler=sc, uncond_model=m, uncond_scaler=sc)


def test_an_unknown_pickle_is_refused_before_it_can_run_code(tmp_path, monkeypatch):
    monkeypatch.delenv(TRUST_ENV, raising=False)
    d, marker = _evil_folder(tmp_path)
    with pytest.raises(DecisionModelError) as info:
        load_decision_models(d)
    msg = str(info.value)
    assert "executes code" in msg and "trust_decision_models=true" in msg and TRUST_ENV in msg
    assert "experiments.skipvar_train" in msg
    assert not marker.exists(), "the pickle's code ran while the loader only meant to check it"


@pytest.mark.parametrize("how", ["knob", "env"])
def test_trust_loads_it_anyway(tmp_path, monkeypatch, how):
    """The two documented ways to load a pickle that is not the release's (the code then runs: here
    it only writes a marker, and the loader then refuses the non-estimator it produced)."""
    from varbench.policies.skipvar import SkipVAR

    d, marker = _evil_folder(tmp_path)
    monkeypatch.delenv(TRUST_ENV, raising=False)
    if how == "env":
        monkeypatch.setenv(TRUST_ENV, "1")
    pol = SkipVAR(decision_models=str(d), trust_decision_models=how == "knob")
    with pytest.raises(DecisionModelError, match="not a fitted scikit-learn estimator"):
        pol.load()
    assert marker.read_text() == "ran"


def test_the_trust_knob_validates_and_is_not_composed_into_presets(tmp_path):
    from varbench.core.errors import ConfigError
    from varbench.harness.config import validate_config
    from varbench.testing.jobs import job_config

    validate_config(job_config(tmp_path, "method=skipvar_toy", "+method.knobs.trust_decision_models=true"))
    with pytest.raises(ConfigError, match="trust_decision_models"):
        validate_config(job_config(tmp_path, "method=skipvar_toy", "+method.knobs.trust_decision_models=maybe"))
    assert "trust_decision_models" not in job_config(tmp_path, "method=skipvar").method.knobs


def test_pickles_with_the_pinned_release_bytes_load_without_trust(tmp_path, monkeypatch):
    """The pin mechanism, on a folder made here (the released files are not shipped): its sha256 put
    in the table as if released."""
    import joblib

    from varbench.core.filehash import sha256_file
    from varbench.policies import skipvar_release

    monkeypatch.delenv(TRUST_ENV, raising=False)
    d = tmp_path / "decision_model_ssim_84"
    d.mkdir()
    for role, obj in _models().items():
        joblib.dump(obj, d / model_files("Logistic_Regression")[role])
    with pytest.raises(DecisionModelError, match="not the files SkipVAR released"):
        load_decision_models(d)
    pins = {n: sha256_file(d / n) for n in model_files("Logistic_Regression").values()}
    monkeypatch.setattr(skipvar_release, "RELEASED_SHA256", {"fake_release": pins})
    dm = load_decision_models(d)
    assert dm.released_as == "fake_release" and dm.fmt == "pkl"
    assert dm.describe()["released_as"] == "fake_release"


def test_the_pin_table_covers_every_released_file():
    """fakerone-li/SkipVAR @ 607be0e ships four folders of 8 pickles (3 classifiers x 2 + 2 scalers)."""
    assert sorted(RELEASED_SHA256) == ["decision_model_ssim_84", "decision_model_ssim_84_diff_only",
                                       "decision_model_ssim_86", "decision_model_ssim_88"]
    names = {n for c in CLASSIFIERS for n in model_files(c).values()}
    for folder, files in RELEASED_SHA256.items():
        assert set(files) == names, folder
        assert all(len(h) == 64 and set(h) <= set("0123456789abcdef") for h in files.values()), files   # sha256 hex


def test_varbench_writes_skops_and_loads_it_without_trust(tmp_path, monkeypatch):
    monkeypatch.delenv(TRUST_ENV, raising=False)
    objs = _models()
    save_decision_models(tmp_path, "Logistic_Regression", **objs)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(model_files("Logistic_Regression", "skops").values())
    dm = load_decision_models(tmp_path)
    assert dm.fmt == "skops" and dm.released_as is None
    X = np.random.default_rng(1).normal([0.1, 0.5], [0.05, 0.08], size=(40, 2))
    np.testing.assert_array_equal(dm.skip_model.predict(dm.skip_scaler.transform(X)),
                                  objs["skip_model"].predict(objs["skip_scaler"].transform(X)))
    # the shipped toy folder is in the safe format too, trees included (their node indices are checked)
    for c in ("Logistic_Regression", "Decision_Tree"):
        assert load_decision_models(TOY_DM, c).fmt == "skops"
    assert not list(TOY_DM.glob("*.pkl"))


class Unlisted:
    """A type skops does not trust (nothing but sklearn's and numpy's are)."""


def test_a_skops_file_with_an_untrusted_type_is_refused(tmp_path, monkeypatch):
    import skops.io as sio

    monkeypatch.delenv(TRUST_ENV, raising=False)
    save_decision_models(tmp_path, "Logistic_Regression", **_models())
    sio.dump(Unlisted(), tmp_path / "uncond_model_scaler.skops")
    with pytest.raises(DecisionModelError, match="types skops does not trust.*Unlisted"):
        load_decision_models(tmp_path)


def test_replacing_the_decision_models_changes_the_generation_and_entry_keys(tmp_path):
    """`experiments.skipvar_train --out <same folder>` retrains in place: the old images and record
    must not be reused."""
    from varbench.core.hashing import generation_hash
    from varbench.harness.job import prepare_job
    from varbench.testing.jobs import job_config

    d = tmp_path / "dm"
    shutil.copytree(TOY_DM, d)
    cfg = job_config(tmp_path, "method=skipvar_toy", f"method.knobs.decision_models={d}")
    before = prepare_job(cfg)
    assert sorted(before.method_files) == sorted(f"decision_models/{n}" for n in model_files("Logistic_Regression", "skops").values())
    save_decision_models(d, "Logistic_Regression", **_models(seed=3, shift=0.02))    # retrained, same names
    after = prepare_job(cfg)
    assert after.store.generation_hash != before.store.generation_hash
    assert after.entry.entry_hash != before.entry.entry_hash
    # a method without files hashes exactly as before this change (no "method_files" key)
    base = prepare_job(job_config(tmp_path))
    assert base.method_files == {}
    assert base.store.generation_hash == generation_hash(base.resolved, base.weights, base.prompt_set.sha256)
