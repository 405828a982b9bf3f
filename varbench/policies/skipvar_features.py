"""SkipVAR's frequency features and decision models (fakerone-li/SkipVAR @ 607be0e).

Features (as released, `infinity/models/infinity.py` 686-748, inside `autoregressive_infer_cfg_SkipVAR`):
at the decision scale (si == 9) the summed codes after that scale ("new") and the copy saved after
the previous scale ("old", si == 8) are each resized with trilinear interpolation to the latent grid
of scale 4 (`vae_scale_schedule[4]`: 8x8 on the 1M schedule) and VAE-decoded (float image in
[-1, 1], the VAE clamps). Then

    HF_Diff  = mean |Sobel(new) - Sobel(old)|              (F.l1_loss of the two Sobel magnitudes)
    HF_Ratio = sum_{r > R} |FFT(new)| / (sum |FFT(new)| + 1e-6),   R = int(0.4 * min(H, W) / 2)

Sobel: grey = channel mean, kernels [[1,0,-1],[2,0,-2],[1,0,-1]] and its transpose (cross-correlation,
zero padding 1), magnitude sqrt(gx^2 + gy^2). FFT: 2-D FFT of the grey image, fftshift, amplitude,
circular mask of pixels farther than R from (H//2, W//2). The released feature vector is
[HF_Diff, HF_Ratio]; the `_diff_only` models take [HF_Diff] (`SkipVAR/readme.md`).

Decision models (as released, `infinity.py` 285-290 and 751-762): scikit-learn objects saved with
joblib in one folder, `{skip,uncond}_model_{Logistic_Regression,Decision_Tree,Random_Forest}.pkl`
plus `{skip,uncond}_model_scaler.pkl` (StandardScaler). The skip model predicts k in {0,1,2,3} on
the scaled features; only when k == 0 the uncond model predicts j in {0,1,2,3} (0 = base).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import FixableError

#: classifier file stems of the release (infinity.py line 287 uses Logistic_Regression)
CLASSIFIERS = ("Logistic_Regression", "Decision_Tree", "Random_Forest")
#: feature names, in the released order (`sample_input = [[diff_hf, new_ratio]]`)
FEATURES = ("hf_diff", "hf_ratio")
#: released FFT radius (`extract_high_freq_ratio_fft_circle(new_img, freq_ratio=0.4)`)
FFT_FREQ_RATIO = 0.4
PUBLISHED_AT = ("fakerone-li/SkipVAR on GitHub, folder SkipVAR/decision_model_ssim_{84,86,88}[_diff_only]/ "
                "(trained on Infinity-2B), or a folder written by `python -m experiments.skipvar_train`")
INSTALL_HINT = 'pip install -e ".[skipvar]" (scikit-learn and joblib)'


# ----------------------------------------------------------------------------------------- features
def _grey(img: torch.Tensor) -> torch.Tensor:
    if img.ndim != 4 or img.shape[1] != 3:
        raise ValueError(f"expected a (B, 3, H, W) image, got {tuple(img.shape)}")
    return img.float().mean(dim=1, keepdim=True)


def sobel_magnitude(img: torch.Tensor) -> torch.Tensor:
    """(B, 3, H, W) -> (B, 1, H, W) Sobel gradient magnitude of the channel-mean image."""
    gx_k = torch.tensor([[[[1.0, 0.0, -1.0], [2.0, 0.0, -2.0], [1.0, 0.0, -1.0]]]], device=img.device)
    gy_k = gx_k.permute(0, 1, 3, 2)
    g = _grey(img)
    gx = F.conv2d(g, gx_k, padding=1)
    gy = F.conv2d(g, gy_k, padding=1)
    return torch.sqrt(gx ** 2 + gy ** 2)


def hf_diff(new_img: torch.Tensor, old_img: torch.Tensor) -> torch.Tensor:
    """(B,) mean absolute difference of the Sobel magnitudes (the release's F.l1_loss, per image)."""
    return (sobel_magnitude(new_img) - sobel_magnitude(old_img)).abs().flatten(1).mean(1)


def hf_ratio(img: torch.Tensor, freq_ratio: float = FFT_FREQ_RATIO) -> torch.Tensor:
    """(B,) share of the FFT amplitude outside the centred circle of radius int(freq_ratio*min(H,W)/2)."""
    g = _grey(img)
    # the release's fftshift has no dims (it also rolls batch and channel: harmless only at its batch 1)
    amp = torch.fft.fftshift(torch.fft.fft2(g), dim=(-2, -1)).abs()
    _, _, H, W = amp.shape
    cy, cx = H // 2, W // 2
    radius = int(freq_ratio * min(H, W) / 2)
    y = torch.arange(H, device=img.device).view(H, 1)
    x = torch.arange(W, device=img.device).view(1, W)
    mask = (((y - cy) ** 2 + (x - cx) ** 2).float().sqrt() > radius).float()
    return ((amp * mask).sum(dim=(1, 2, 3)) / (amp.sum(dim=(1, 2, 3)) + 1e-6))


def resize_codes(summed_codes: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """(B, d, 1, H, W) summed codes -> (B, d, 1, h, w), the release's trilinear resize."""
    return F.interpolate(summed_codes.float(), size=(1, int(grid[0]), int(grid[1])), mode="trilinear")


def features_from_images(new_img: torch.Tensor, old_img: torch.Tensor, n_features: int = 2,
                         freq_ratio: float = FFT_FREQ_RATIO) -> np.ndarray:
    """(B, n_features) float64: [HF_Diff, HF_Ratio] (n_features=2) or [HF_Diff] (n_features=1)."""
    if n_features not in (1, 2):
        raise ValueError(f"SkipVAR decision models take 1 ([HF_Diff]) or 2 ([HF_Diff, HF_Ratio]) features, got {n_features}")
    cols = [hf_diff(new_img, old_img)]
    if n_features == 2:
        cols.append(hf_ratio(new_img, freq_ratio))
    return torch.stack(cols, 1).double().cpu().numpy()


# -------------------------------------------------------------------------------- decision models
class DecisionModelError(FixableError, RuntimeError):
    """A SkipVAR decision-model folder is missing, incomplete or not in the released format."""


def _require_joblib():
    try:
        import joblib  # noqa: F401
        import sklearn  # noqa: F401
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise DecisionModelError(f"SkipVAR decision models are scikit-learn objects saved with joblib; {e}. "
                                 f"Install them: {INSTALL_HINT}.") from None
    import joblib
    return joblib


def model_files(classifier: str) -> dict[str, str]:
    """{role: file name} of one decision-model folder, as the release names them."""
    if classifier not in CLASSIFIERS:
        raise ValueError(f"skipvar classifier must be one of {list(CLASSIFIERS)}, got {classifier!r}")
    return {"skip_model": f"skip_model_{classifier}.pkl", "skip_scaler": "skip_model_scaler.pkl",
            "uncond_model": f"uncond_model_{classifier}.pkl", "uncond_scaler": "uncond_model_scaler.pkl"}


@dataclasses.dataclass
class DecisionModels:
    """The two released classifiers with their scalers; `predict` applies the released cascade."""

    skip_model: Any
    skip_scaler: Any
    uncond_model: Any
    uncond_scaler: Any
    folder: str = ""
    classifier: str = "Logistic_Regression"

    @property
    def n_features(self) -> int:
        return int(self.skip_scaler.n_features_in_)

    def predict(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(B, n_features) -> (skip k per sample, uncond j per sample); j is 0 wherever k > 0
        (infinity.py 751-762: the uncond model is asked only when the skip model says 0)."""
        X = np.asarray(X, dtype=np.float64).reshape(-1, self.n_features)
        skip = np.asarray(self.skip_model.predict(self.skip_scaler.transform(X)), dtype=np.int64)
        uncond = np.zeros_like(skip)
        ask = skip == 0
        if ask.any():
            uncond[ask] = np.asarray(self.uncond_model.predict(self.uncond_scaler.transform(X[ask])), dtype=np.int64)
        return skip, uncond

    def describe(self) -> dict[str, Any]:
        d = {"folder": self.folder, "classifier": self.classifier, "n_features": self.n_features}
        for role in ("skip_model", "uncond_model"):
            m = getattr(self, role)
            d[role] = {"class": type(m).__name__, "classes": [int(c) for c in getattr(m, "classes_", [])],
                       "sklearn_version": getattr(m, "_sklearn_version", None)}
        return d


def _check_pair(role: str, model: Any, scaler: Any, path: Path) -> None:
    for obj, what in ((model, "model"), (scaler, "scaler")):
        if not hasattr(obj, "n_features_in_"):
            raise DecisionModelError(f"{path}: the {role} {what} is not a fitted scikit-learn estimator "
                                     f"(got {type(obj).__name__}).")
    if not (hasattr(scaler, "transform") and hasattr(model, "predict") and hasattr(model, "classes_")):
        raise DecisionModelError(f"{path}: the {role} files must hold a scaler with transform() and a classifier with "
                                 f"predict()/classes_ (got {type(scaler).__name__}, {type(model).__name__}).")
    nf_m, nf_s = int(model.n_features_in_), int(scaler.n_features_in_)
    if nf_m != nf_s or nf_m not in (1, 2):
        raise DecisionModelError(f"{path}: the {role} scaler takes {nf_s} features and the classifier {nf_m}; SkipVAR's "
                                 f"are 2 ([HF_Diff, HF_Ratio]) or 1 ([HF_Diff], the _diff_only models).")
    bad = sorted(set(int(c) for c in model.classes_) - {0, 1, 2, 3})
    if bad:
        raise DecisionModelError(f"{path}: the {role} classifier predicts classes {bad}; SkipVAR's actions are 0..3.")


def load_decision_models(folder: str | Path, classifier: str = "Logistic_Regression") -> DecisionModels:
    """Load a released (or `experiments.skipvar_train`-written) decision-model folder with joblib,
    strictly: every one of the four files must exist and be a fitted estimator of the right shape.
    A relative folder is looked up in the current directory, then inside the varbench package."""
    files = model_files(classifier)
    if folder is None or str(folder) in ("", "None", "null"):
        raise DecisionModelError("skipvar needs `decision_models`: a folder with the released decision models "
                                 f"({', '.join(files.values())}); published in {PUBLISHED_AT}.")
    d = Path(folder).expanduser()
    if not d.is_absolute() and not d.exists() and (Path(__file__).resolve().parents[1] / d).is_dir():
        d = Path(__file__).resolve().parents[1] / d  # a folder shipped inside the package (toy/weights/...)
    missing = [n for n in files.values() if not (d / n).is_file()]
    if missing:
        raise DecisionModelError(f"SkipVAR decision models not found: {str(d)!r} lacks {missing}. They are published in "
                                 f"{PUBLISHED_AT}; point `decision_models` (env VARBENCH_WEIGHTS) at that folder.")
    joblib = _require_joblib()
    import warnings

    loaded = {}
    for role, name in files.items():
        with warnings.catch_warnings():
            # the released pickles come from scikit-learn 1.6.1; newer versions warn but load them
            warnings.filterwarnings("ignore", message=".*Trying to unpickle estimator.*")
            try:
                loaded[role] = joblib.load(d / name)
            except Exception as e:  # noqa: BLE001 - report which file and why
                raise DecisionModelError(f"{d / name}: could not be loaded with joblib ({type(e).__name__}: {e}).") from e
    _check_pair("skip", loaded["skip_model"], loaded["skip_scaler"], d)
    _check_pair("uncond", loaded["uncond_model"], loaded["uncond_scaler"], d)
    if loaded["skip_scaler"].n_features_in_ != loaded["uncond_scaler"].n_features_in_:
        raise DecisionModelError(f"{d}: the skip and uncond models take different feature counts.")
    return DecisionModels(folder=str(d), classifier=classifier, **loaded)


def save_decision_models(folder: str | Path, classifier: str, skip_model, skip_scaler, uncond_model, uncond_scaler) -> dict[str, str]:
    """Write the four files in the released layout (joblib.dump); returns {role: path}."""
    joblib = _require_joblib()
    d = Path(folder)
    d.mkdir(parents=True, exist_ok=True)
    objs = {"skip_model": skip_model, "skip_scaler": skip_scaler, "uncond_model": uncond_model, "uncond_scaler": uncond_scaler}
    out = {}
    for role, name in model_files(classifier).items():
        joblib.dump(objs[role], d / name)
        out[role] = str(d / name)
    return out


def batch_action(skip: Sequence[int], uncond: Sequence[int]) -> tuple[int, int]:
    """One (skip k, uncond j) for a batch that shares a plan: the most conservative per-sample action.

    Every sample gets at least the computation it asked for at every scale: the batch skips only the
    scales every sample skips (min k); it drops the unconditional branch only where every sample
    drops it (min j, a sample that chose to skip counting as j = 0, as the release leaves CFG on
    for it). min over samples of (k, j) in the release's action set is again a released action."""
    skip = [int(k) for k in skip]
    k = min(skip)
    j = min(int(u) if s == 0 else 0 for s, u in zip(skip, uncond))
    return k, (j if k == 0 else 0)


def float_decoder(decode) -> tuple[Optional[Any], str]:
    """The runtime's VAE as a float decoder (codes -> image in [-1, 1], clamped as released), and
    which path is used: "float" when the runtime exposes its VAE, else "uint8" (the public
    `ScaleSignals.decode`, whose truncation to 8 bits the release's features do not have)."""
    vae = getattr(getattr(decode, "__self__", None), "vae", None)
    if vae is not None and hasattr(vae, "decode"):
        def dec(codes: torch.Tensor) -> torch.Tensor:
            # one image at a time, channels-last, as the runtime decodes (its pixels do not depend on the batch)
            return torch.cat([vae.decode(c.squeeze(-3).float().contiguous(memory_format=torch.channels_last)).float()
                              for c in codes.split(1)])
        return dec, "float"
    if decode is None:
        return None, "none"

    def dec_u8(codes: torch.Tensor) -> torch.Tensor:
        img = decode(codes)                                  # (B, H, W, 3) uint8
        return img.permute(0, 3, 1, 2).float().div(255.0).mul(2.0).sub(1.0)
    return dec_u8, "uint8"
