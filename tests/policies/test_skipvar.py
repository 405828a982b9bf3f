"""SkipVAR's adaptive policy against the release's rules (fakerone-li/SkipVAR @ 607be0e).

Each test names the released lines it checks. The features are checked against independent numpy
transcriptions of `extract_high_freq_sobel` / `extract_high_freq_ratio_fft_circle` (infinity.py
686-731); the decision cascade against 751-762; the actions against the flags of 561-593 and 616-617;
the decision inputs against 736-743 and 766-767. Loader tests fit scikit-learn models and save them
in the released layout (joblib); the released folders themselves are checked when present under
$VARBENCH_WEIGHTS/skipvar/ (requires_weights).
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from varbench.engine.backbones.infinity.schedules import scale_schedule
from varbench.engine.plan import GenerationContext, ScaleSignals
from varbench.policies import build_policy
from varbench.policies.skip import SkipVARFixed
from varbench.policies.skipvar import SkipVAR
from varbench.policies.skipvar_features import (DecisionModelError, DecisionModels, batch_action, features_from_images,
                                                hf_diff, hf_ratio, load_decision_models, model_files, resize_codes,
                                                sobel_magnitude)
from varbench.testing.tiny import tiny_runtime

SQ_1M = tuple(tuple(s) for s in scale_schedule(1.0, "1M"))


def ctx_for(schedule=SQ_1M, batch=1, cfg_rows=True):
    n = len(schedule)
    return GenerationContext(schedule=tuple(schedule), depth=4, embed_dim=64, num_heads=4, batch=batch,
                             cfg_rows=cfg_rows, cfg=(4.0,) * n, tau=(1.0,) * n)


# ----------------------------------------------------------------------------- numpy references
def np_sobel(img: np.ndarray) -> np.ndarray:
    """extract_high_freq_sobel: grey = channel mean; F.conv2d (cross-correlation) with
    [[1,0,-1],[2,0,-2],[1,0,-1]] and its transpose, zero padding 1; sqrt(gx^2 + gy^2)."""
    kx = np.array([[1, 0, -1], [2, 0, -2], [1, 0, -1]], dtype=np.float64)
    ky = kx.T
    g = img.mean(axis=0)
    p = np.pad(g, 1)
    H, W = g.shape
    gx, gy = np.zeros_like(g), np.zeros_like(g)
    for i in range(H):
        for j in range(W):
            win = p[i:i + 3, j:j + 3]
            gx[i, j], gy[i, j] = (win * kx).sum(), (win * ky).sum()
    return np.sqrt(gx ** 2 + gy ** 2)


def np_hf_ratio(img: np.ndarray, freq_ratio: float = 0.4) -> float:
    """extract_high_freq_ratio_fft_circle at batch 1: amplitude of the shifted FFT of the grey image,
    mask dist((y, x), (H//2, W//2)) > int(freq_ratio*min(H,W)/2), ratio to the total + 1e-6."""
    g = img.mean(axis=0)
    amp = np.abs(np.fft.fftshift(np.fft.fft2(g)))
    H, W = g.shape
    r = int(freq_ratio * min(H, W) / 2)
    y, x = np.mgrid[0:H, 0:W]
    mask = np.sqrt((y - H // 2) ** 2 + (x - W // 2) ** 2) > r
    return float((amp * mask).sum() / (amp.sum() + 1e-6))


def release_flags(skip_pred: int, uncond_pred: int) -> dict:
    """infinity.py 561-584 and 751-762: the flags the release sets from the two predictions."""
    flags = {f"skip{k}": False for k in range(4)} | {f"uncond{k}": False for k in range(1, 4)} | {"base": False}
    flags[f"skip{skip_pred}"] = True
    if skip_pred == 0:
        flags[{0: "base", 1: "uncond1", 2: "uncond2", 3: "uncond3"}[uncond_pred]] = True
    return flags


def release_runs(flags, si) -> bool:       # infinity.py 588-593: `break` before si 10/11/12
    return not ((flags["skip3"] and si >= 10) or (flags["skip2"] and si >= 11) or (flags["skip1"] and si >= 12))


def release_cond_only(flags, si) -> bool:  # infinity.py 616-617
    return (flags["uncond1"] and si >= 12) or (flags["uncond2"] and si >= 11) or (flags["uncond3"] and si >= 10)


# ----------------------------------------------------------------------------- features
def test_sobel_matches_the_released_kernel():
    img = torch.rand(2, 3, 9, 11, generator=torch.Generator().manual_seed(0)) * 2 - 1
    got = sobel_magnitude(img)
    assert got.shape == (2, 1, 9, 11)
    for b in range(2):
        np.testing.assert_allclose(got[b, 0].double().numpy(), np_sobel(img[b].double().numpy()), rtol=1e-5, atol=1e-5)


def test_hf_diff_is_the_released_l1_loss_per_image():
    g = torch.Generator().manual_seed(1)
    new, old = torch.rand(3, 3, 16, 16, generator=g), torch.rand(3, 3, 16, 16, generator=g)
    got = hf_diff(new, old)
    for b in range(3):   # F.l1_loss(sobel(new), sobel(old)) at the release's batch 1
        ref = F.l1_loss(sobel_magnitude(new[b:b + 1]), sobel_magnitude(old[b:b + 1]))
        assert got[b].item() == pytest.approx(ref.item(), rel=1e-6)
        assert got[b].item() == pytest.approx(np.abs(np_sobel(new[b].double().numpy()) - np_sobel(old[b].double().numpy())).mean(), rel=1e-5)
    assert hf_diff(new, new).abs().max().item() == 0.0


@pytest.mark.parametrize("hw", [(8, 8), (16, 16), (12, 20), (128, 128)])
def test_hf_ratio_matches_the_released_fft_circle(hw):
    img = torch.rand(3, 3, *hw, generator=torch.Generator().manual_seed(2)) * 2 - 1
    got = hf_ratio(img)
    for b in range(3):   # per image: the release's fftshift without dims is only right at its batch 1
        assert got[b].item() == pytest.approx(np_hf_ratio(img[b].double().numpy()), rel=1e-5)
    assert torch.allclose(got, torch.cat([hf_ratio(img[b:b + 1]) for b in range(3)]))
    const = torch.full((1, 3, *hw), 0.3)
    assert hf_ratio(const).item() == pytest.approx(0.0, abs=1e-6)   # all energy at DC, inside the circle


def test_feature_vector_is_the_released_order():
    g = torch.Generator().manual_seed(3)
    new, old = torch.rand(2, 3, 16, 16, generator=g), torch.rand(2, 3, 16, 16, generator=g)
    X = features_from_images(new, old)
    assert X.shape == (2, 2) and X.dtype == np.float64              # sample_input = [[diff_hf, new_ratio]]
    np.testing.assert_allclose(X[:, 0], hf_diff(new, old).double().numpy(), rtol=1e-6)
    np.testing.assert_allclose(X[:, 1], hf_ratio(new).double().numpy(), rtol=1e-6)
    np.testing.assert_allclose(features_from_images(new, old, n_features=1), X[:, :1])   # _diff_only: [HF_Diff]
    with pytest.raises(ValueError, match="1 .* or 2"):
        features_from_images(new, old, n_features=3)


# ----------------------------------------------------------------------------- decision cascade
class _Fixed:
    """A scikit-learn-like classifier that returns preset labels and records what it was asked."""

    def __init__(self, labels, classes=(0, 1, 2, 3)):
        self.labels, self.classes_, self.n_features_in_, self.asked = np.asarray(labels), np.array(classes), 2, []

    def predict(self, Z):
        self.asked.append(np.asarray(Z).copy())
        return self.labels[: len(Z)] if len(self.asked) == 1 else self.labels[: len(Z)]


class _Id:
    n_features_in_ = 2

    def transform(self, X):
        return np.asarray(X)


def test_uncond_model_is_asked_only_when_skip_says_zero():
    """infinity.py 751-762: skip_pred = skip_model(...); only `if skip_pred == 0` the uncond model."""
    skip = _Fixed([0, 2, 0, 3])
    unc = _Fixed([3, 1])
    dm = DecisionModels(skip, _Id(), unc, _Id())
    X = np.arange(8, dtype=float).reshape(4, 2)
    k, j = dm.predict(X)
    assert k.tolist() == [0, 2, 0, 3] and j.tolist() == [3, 0, 1, 0]
    np.testing.assert_array_equal(unc.asked[0], X[[0, 2]])                  # only the skip-0 samples
    for kk, jj in zip(k, j):                                                   # == the release's flags
        f = release_flags(int(kk), int(jj) if kk == 0 else 0)
        assert f[f"skip{kk}"] and (kk > 0 or f[{0: 'base', 1: 'uncond1', 2: 'uncond2', 3: 'uncond3'}[int(jj)]])


def test_batch_action_is_the_most_conservative_released_action():
    assert batch_action([2], [0]) == (2, 0)
    assert batch_action([0], [3]) == (0, 3)
    assert batch_action([2, 1, 3], [0, 0, 0]) == (1, 0)
    assert batch_action([0, 0], [3, 1]) == (0, 1)
    assert batch_action([1, 0], [0, 3]) == (0, 0)      # the skipping sample keeps CFG on the late scales
    for ks in range(4):
        for ju in range(4):
            k, j = batch_action([ks, 0], [3, ju])
            assert k == 0 and (j == 0 if ks else j == ju)


# ----------------------------------------------------------------------------- plans (synthetic signals)
class _FakeVAE:
    def __init__(self):
        self.calls = []

    def decode(self, z):
        self.calls.append(z.detach().clone())
        B, d, h, w = z.shape
        img = z[:, :3].repeat_interleave(4, -1).repeat_interleave(4, -2)   # any deterministic image
        return img.clamp(-1, 1)


class _FakeRuntime:
    def __init__(self):
        self.vae = _FakeVAE()

    def decode(self, codes):   # the public uint8 decode; the policy prefers the VAE's float output
        raise AssertionError("the float path should be used when the runtime exposes its VAE")


def drive(policy, ctx, d_vae=32, seed=0, latent=None):
    """Run plan/observe over a schedule with random summed codes; returns plans, the codes per scale
    and the fake runtime (its VAE saw the decision's inputs)."""
    rt = _FakeRuntime()
    g = torch.Generator().manual_seed(seed)
    H, W = latent or ctx.schedule[-1]
    policy.reset(ctx)
    plans, codes = [], {}
    summed = torch.zeros(ctx.batch, d_vae, 1, H, W)
    for si in range(len(ctx.schedule)):
        p = policy.plan(si)
        plans.append(p)
        if not p.run:
            continue
        summed += torch.randn(summed.shape, generator=g) * 0.1
        codes[si] = summed.clone()
        h, w = ctx.schedule[si]
        policy.observe(si, ScaleSignals(scale=si, h=h, w=w, token_entropy=torch.zeros(ctx.batch, h * w),
                                        logits=torch.zeros(ctx.batch, h * w, 1, 2), cond_logits=None,
                                        attention_entropy={}, attention_query_index={}, executed_tokens={},
                                        tau=1.0, cfg=4.0, summed_codes=summed, decode=rt.decode))
    return plans, codes, rt


def constant_decide(k, j, record=None):
    def decide(X):
        if record is not None:
            record.append(np.asarray(X))
        return np.full(len(X), k), np.full(len(X), j)
    return decide


def test_decision_inputs_are_the_released_ones_on_1M():
    """infinity.py 736-743, 766-767: codes after si 8 and si 9, trilinear to vae_scale_schedule[4]
    (8x8 on 1M), decoded; features of (new, old)."""
    rec = []
    pol = SkipVAR(decide=constant_decide(0, 0, rec))
    plans, codes, rt = drive(pol, ctx_for())
    assert pol.si_decide == 9 and pol.si_feature == 4
    assert len(rt.vae.calls) == 2                          # one decode of the new and one of the old codes
    new_in, old_in = rt.vae.calls
    assert new_in.shape == (1, 32, 8, 8)
    torch.testing.assert_close(new_in, F.interpolate(codes[9], size=(1, 8, 8), mode="trilinear").squeeze(-3))
    torch.testing.assert_close(old_in, F.interpolate(codes[8], size=(1, 8, 8), mode="trilinear").squeeze(-3))
    ref = features_from_images(rt.vae.decode(new_in), rt.vae.decode(old_in))
    np.testing.assert_allclose(rec[0], ref)
    assert pol.stats()["features"] == ref.tolist() and pol.stats()["feature_decode"] == "float"


def test_feature_grid_doubles_on_patchified_latents():
    """8B: vae_scale_schedule = 2x the token grid (apply_spatial_patchify), so scale 4 decodes 16x16."""
    pol = SkipVAR(decide=constant_decide(0, 0))
    _, _, rt = drive(pol, ctx_for(), latent=(128, 128))
    assert rt.vae.calls[0].shape[-2:] == (16, 16)


@pytest.mark.parametrize("skip_k", [0, 1, 2, 3])
@pytest.mark.parametrize("uncond_j", [0, 1, 2, 3])
def test_actions_follow_the_released_flags_on_1M(skip_k, uncond_j):
    plans, _, _ = drive(SkipVAR(decide=constant_decide(skip_k, uncond_j)), ctx_for())
    flags = release_flags(skip_k, uncond_j)
    for si, p in enumerate(plans):
        assert p.run == release_runs(flags, si), si
        if p.run:
            assert p.drop_uncond == release_cond_only(flags, si), si
            assert p.blocks == {} and p.cfg is None and p.tau is None


def test_uncond_action_changes_nothing_without_cfg():
    plans, _, _ = drive(SkipVAR(decide=constant_decide(0, 3)), ctx_for(cfg_rows=False))
    assert all(p.run and not p.drop_uncond for p in plans)


def test_batches_take_the_conservative_action_or_refuse():
    def decide(X):
        return np.array([2, 0, 0]), np.array([0, 3, 1])
    pol = SkipVAR(decide=decide, batch_rule="conservative")
    plans, _, _ = drive(pol, ctx_for(batch=3))
    st = pol.stats()
    assert st["per_sample"] == [{"skip": 2, "uncond": 0}, {"skip": 0, "uncond": 3}, {"skip": 0, "uncond": 1}]
    assert st["skip"] == 0 and st["uncond"] == 0 and all(p.run and not p.drop_uncond for p in plans)
    with pytest.raises(RuntimeError, match="different actions"):
        drive(SkipVAR(decide=decide, batch_rule="raise"), ctx_for(batch=3))
    agree = SkipVAR(decide=constant_decide(1, 0), batch_rule="raise")   # agreeing samples pass
    plans, _, _ = drive(agree, ctx_for(batch=3))
    assert [p.run for p in plans][-2:] == [True, False]


def test_knob_validation():
    with pytest.raises(ValueError, match="classifier"):
        SkipVAR(classifier="SVM")
    with pytest.raises(ValueError, match="batch_rule"):
        SkipVAR(batch_rule="vote")
    with pytest.raises(ValueError, match="scales after"):
        SkipVAR(decide=constant_decide(0, 0), decision_scale=-2).reset(ctx_for())
    with pytest.raises(ValueError, match="previous one"):
        SkipVAR(decide=constant_decide(0, 0), decision_scale=0).reset(ctx_for())
    pol = build_policy("skipvar", decision_models="/nonexistent/skipvar")   # lazy: builds and plans
    pol.reset(ctx_for())
    assert pol.plan(0).run and pol.describe()["decision_models"] == "/nonexistent/skipvar"


# ----------------------------------------------------------------------------- loader (released format)
# joblib pickles made here are not the released bytes: these tests load them with trust=True (the
# trust rule itself is tested in tests/policies/test_skipvar_trust.py)
def _fit_folder(tmp_path: Path, n_features=2, classifier="Logistic_Regression", uncond_classes=(1, 2, 3)):
    pytest.importorskip("sklearn")
    import joblib
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler
    from sklearn.tree import DecisionTreeClassifier

    rng = np.random.default_rng(0)
    X = np.c_[rng.normal(0.115, 0.058, 400), rng.normal(0.49, 0.076, 400)][:, :n_features]
    y = np.clip(((0.2 - X[:, 0]) / 0.05).astype(int), 0, 3)
    s_sc = StandardScaler().fit(X)
    est = (lambda: LogisticRegression(C=1.0, solver="lbfgs", max_iter=1500)) if classifier == "Logistic_Regression" \
        else (lambda: DecisionTreeClassifier(max_depth=8, random_state=0))
    s_m = est().fit(s_sc.transform(X), y)
    X0 = X[y == 0]
    yu = np.array(uncond_classes)[np.arange(len(X0)) % len(uncond_classes)]
    u_sc = StandardScaler().fit(X0)
    u_m = est().fit(u_sc.transform(X0), yu)
    names = model_files(classifier)
    for obj, role in ((s_m, "skip_model"), (s_sc, "skip_scaler"), (u_m, "uncond_model"), (u_sc, "uncond_scaler")):
        joblib.dump(obj, tmp_path / names[role])       # the release's joblib pickles, its file names
    return X, (s_m, s_sc, u_m, u_sc)


@pytest.mark.parametrize("classifier", ["Logistic_Regression", "Decision_Tree"])
def test_loader_reads_the_released_layout_and_predicts_as_sklearn(tmp_path, classifier):
    X, (s_m, s_sc, u_m, u_sc) = _fit_folder(tmp_path, classifier=classifier)
    dm = load_decision_models(tmp_path, classifier, trust=True)
    assert dm.n_features == 2
    k, j = dm.predict(X[:50])
    k_ref = s_m.predict(s_sc.transform(X[:50]))   # infinity.py 752-753, then 760-761 where k == 0
    j_ref = np.where(k_ref == 0, u_m.predict(u_sc.transform(X[:50])), 0)
    np.testing.assert_array_equal(k, k_ref)
    np.testing.assert_array_equal(j, j_ref)
    assert sorted(dm.describe()["uncond_model"]["classes"]) == [1, 2, 3]


def test_loader_diff_only_models(tmp_path):
    X, _ = _fit_folder(tmp_path, n_features=1)
    dm = load_decision_models(tmp_path, trust=True)
    assert dm.n_features == 1
    pol = SkipVAR(decision_models=str(tmp_path), trust_decision_models=True)
    assert pol.n_features == 1                         # the policy then computes [HF_Diff] only


def test_loader_is_strict(tmp_path):
    with pytest.raises(DecisionModelError, match="skip_model_Logistic_Regression.pkl.*published"):
        load_decision_models(tmp_path / "absent")
    with pytest.raises(DecisionModelError, match="needs `decision_models`"):
        load_decision_models(None)
    _fit_folder(tmp_path)
    (tmp_path / "uncond_model_scaler.pkl").unlink()
    with pytest.raises(DecisionModelError, match=r"lacks \['uncond_model_scaler.pkl'\]"):
        load_decision_models(tmp_path, trust=True)
    import joblib

    joblib.dump({"not": "a scaler"}, tmp_path / "uncond_model_scaler.pkl")
    with pytest.raises(DecisionModelError, match="not a fitted scikit-learn estimator"):
        load_decision_models(tmp_path, trust=True)
    (tmp_path / "uncond_model_scaler.pkl").write_bytes(b"garbage")
    with pytest.raises(DecisionModelError, match="could not be loaded"):
        load_decision_models(tmp_path, trust=True)


def test_loader_rejects_wrong_shapes(tmp_path):
    pytest.importorskip("sklearn")
    import joblib
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    X = np.random.default_rng(0).normal(size=(60, 3))
    y = np.arange(60) % 3
    for role, obj in (("skip_model", LogisticRegression().fit(X, y)), ("skip_scaler", StandardScaler().fit(X)),
                      ("uncond_model", LogisticRegression().fit(X, y)), ("uncond_scaler", StandardScaler().fit(X))):
        joblib.dump(obj, tmp_path / model_files("Logistic_Regression")[role])
    with pytest.raises(DecisionModelError, match="takes 3 features"):
        load_decision_models(tmp_path, trust=True)
    X2 = X[:, :2]
    joblib.dump(LogisticRegression().fit(X2, np.arange(60) % 5), tmp_path / "skip_model_Logistic_Regression.pkl")
    joblib.dump(StandardScaler().fit(X2), tmp_path / "skip_model_scaler.pkl")
    joblib.dump(LogisticRegression().fit(X2, y), tmp_path / "uncond_model_Logistic_Regression.pkl")
    joblib.dump(StandardScaler().fit(X2), tmp_path / "uncond_model_scaler.pkl")
    with pytest.raises(DecisionModelError, match=r"classes \[4\]"):
        load_decision_models(tmp_path, trust=True)


def test_missing_models_fail_at_the_first_decision_with_the_fix():
    rt = tiny_runtime(seed=0)
    pol = build_policy("skipvar", decision_models="/nonexistent/skipvar/decision_model_ssim_84")
    with pytest.raises(DecisionModelError, match="fakerone-li/SkipVAR"):
        rt.generate(["a red circle"], seeds=[0], policy=pol, cfg=3.0, tau=1.0, pn="0.06M")


RELEASED = ["decision_model_ssim_84", "decision_model_ssim_86", "decision_model_ssim_88", "decision_model_ssim_84_diff_only"]


@pytest.mark.requires_weights
@pytest.mark.parametrize("folder", RELEASED)
@pytest.mark.parametrize("classifier", ["Logistic_Regression", "Decision_Tree", "Random_Forest"])
def test_released_decision_models_load(folder, classifier):
    pytest.importorskip("sklearn")
    root = os.environ.get("VARBENCH_WEIGHTS")
    d = Path(root or "weights") / "skipvar" / folder
    if not (d / model_files(classifier)["skip_model"]).is_file():
        pytest.skip(f"{d} not present (copy the release's SkipVAR/{folder}/ there)")
    dm = load_decision_models(d, classifier)          # no trust needed: the bytes are the pinned release
    assert dm.released_as == folder
    assert dm.n_features == (1 if folder.endswith("diff_only") else 2)
    assert dm.describe()["skip_model"]["classes"] == [0, 1, 2, 3]
    X = np.array([[0.05, 0.40], [0.10, 0.50], [0.20, 0.60]])[:, :dm.n_features]
    k, j = dm.predict(X)
    assert set(k.tolist()) <= {0, 1, 2, 3} and all(jj == 0 for kk, jj in zip(k, j) if kk)
    assert k[0] >= k[2]   # a small high-frequency change allows more skipping than a large one


# ----------------------------------------------------------------------------- runtime (tiny, CPU)
PN = "0.06M"


@pytest.fixture(scope="module")
def rt(tiny_rt):
    return tiny_rt                  # tiny_runtime(seed=0), shared by the session (tests/conftest.py)


@pytest.mark.runtime
def test_no_action_reproduces_the_baseline(rt, tiny_baseline):
    base = tiny_baseline            # rt.generate(["a red circle"], seeds=[0], cfg=3.0, tau=1.0, pn=PN), shared
    pol = SkipVAR(decide=constant_decide(0, 0))
    out = rt.generate(["a red circle"], seeds=[0], policy=pol, cfg=3.0, tau=1.0, pn=PN)
    assert torch.equal(out.images, base.images) and torch.equal(out.summed_codes, base.summed_codes)
    assert pol.stats()["feature_decode"] == "float" and len(pol.stats()["features"]) == 1


@pytest.mark.runtime
@pytest.mark.parametrize("action", [("skip", 1), ("skip", 3), ("uncond", 1), ("uncond", 3)])
def test_each_action_is_the_fixed_arm_bit_for_bit(rt, action):
    kind, k = action
    pol = SkipVAR(decide=constant_decide(k, 0) if kind == "skip" else constant_decide(0, k))
    out = rt.generate(["a red circle", "two blue squares"], seeds=[0, 1], policy=pol, cfg=3.0, tau=1.0, pn=PN)
    fixed = SkipVARFixed(skip_last=k) if kind == "skip" else SkipVARFixed(uncond_from=-k)
    ref = rt.generate(["a red circle", "two blue squares"], seeds=[0, 1], policy=fixed, cfg=3.0, tau=1.0, pn=PN)
    assert torch.equal(out.images, ref.images)
    n = len(out.trace)
    if kind == "skip":
        assert [tr["ran"] for tr in out.trace] == [True] * (n - k) + [False] * k
    else:
        assert [tr["rows"] for tr in out.trace] == [4] * (n - k) + [2] * k


@pytest.mark.runtime
@pytest.mark.parametrize("rule", ["conservative", "per_image"])
def test_features_do_not_depend_on_the_batch(rt, rule):
    rec1, rec2 = [], []
    rt.generate(["a red circle"], seeds=[5], policy=SkipVAR(decide=constant_decide(0, 0, rec1)), cfg=3.0, tau=1.0, pn=PN)
    rt.generate(["two blue squares", "a red circle"], seeds=[6, 5],
                policy=SkipVAR(decide=constant_decide(0, 0, rec2), batch_rule=rule), cfg=3.0, tau=1.0, pn=PN)
    # conservative: one decision call for the batch; per_image: one call per image, each with its row
    mine = rec2[0][1] if rule == "conservative" else rec2[1][0]
    assert len(rec2) == (1 if rule == "conservative" else 2)
    np.testing.assert_allclose(mine, rec1[0][0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("absent", ["skops.io", "sklearn"])
def test_a_missing_decision_model_dependency_is_one_error_when_the_policy_is_built(monkeypatch, absent):
    """The device image has neither scikit-learn nor skops: building SkipVAR on a .skops folder says which
    module is missing and the install that fixes it, before any generation (not at the first decision
    scale); an injected decision needs neither."""
    import sys

    from varbench.harness.presets import resolve_method

    folder = resolve_method("skipvar_toy").knobs["decision_models"]
    monkeypatch.setitem(sys.modules, absent, None)   # `import <absent>` now raises ImportError
    with pytest.raises(DecisionModelError) as e:
        SkipVAR(decision_models=folder)
    msg = str(e.value)
    assert f"No module named '{absent}'" in msg or absent in msg
    assert 'pip install -e ".[skipvar]"' in msg and ".skops" in msg and "skipvar_toy" in msg
    SkipVAR(decision_models=folder, **SkipVAR.NEUTRAL)   # no error: an injected decision reads no folder
