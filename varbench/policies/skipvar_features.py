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

Safety: joblib/pickle runs code while it loads. A `.pkl` folder is loaded only when every file is
byte-for-byte a released one (sha256 pinned in :mod:`varbench.policies.skipvar_release`) or the user
trusts it (`method.knobs.trust_decision_models=true`, or env `VARBENCH_TRUST_DECISION_MODELS=1`).
Folders varbench writes (`experiments.skipvar_train`, the shipped toy folder) hold the same four
estimators in skops' format (`*.skops` instead of `*.pkl`), which builds only allow-listed types and
runs no code; trees (Decision_Tree, Random_Forest) are skops-"untrusted" because scikit-learn indexes
their node arrays unchecked, so varbench checks every node index against the array bounds after
loading. A folder with both formats loads the `.skops` files.
"""
from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from varbench.core.errors import FixableError
from varbench.policies.skipvar_release import TRUST_ENV, released_folder, trusted_by_env

#: classifier file stems of the release (infinity.py line 287 uses Logistic_Regression)
CLASSIFIERS = ("Logistic_Regression", "Decision_Tree", "Random_Forest")
#: feature names, in the released order (`sample_input = [[diff_hf, new_ratio]]`)
FEATURES = ("hf_diff", "hf_ratio")
#: released FFT radius (`extract_high_freq_ratio_fft_circle(new_img, freq_ratio=0.4)`)
FFT_FREQ_RATIO = 0.4
PUBLISHED_AT = ("fakerone-li/SkipVAR on GitHub, folder SkipVAR/decision_model_ssim_{84,86,88}[_diff_only]/ "
                "(trained on Infinity-2B), or a folder written by `python -m experiments.skipvar_train`")
INSTALL_HINT = 'pip install -e ".[skipvar]" (scikit-learn, joblib and skops)'


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


def _require(modules: Sequence[str], why: str, them: str) -> Any:
    """The first of `modules`, imported with the rest; else DecisionModelError saying what to install."""
    try:
        loaded = [importlib.import_module(m) for m in modules]
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise DecisionModelError(f"{why}; {e}. Install {them}: {INSTALL_HINT}.") from None
    return loaded[0]


def require_joblib() -> Any:
    """joblib (with scikit-learn, whose objects the released files hold), or DecisionModelError."""
    return _require(("joblib", "sklearn"), "SkipVAR decision models are scikit-learn objects saved with joblib", "them")


def require_skops() -> Any:
    """skops.io (the format varbench writes decision models in), or DecisionModelError."""
    return _require(("skops.io",), "decision models saved by varbench are in skops' format (*.skops)", "it")


#: what reading each decision-model format imports: skops files hold scikit-learn objects too
_FORMAT_MODULES = {"skops": ("skops.io", "sklearn"), "pkl": ("joblib", "sklearn")}


def missing_decision_model_deps(fmt: str = "skops") -> Optional[str]:
    """Why decision models in format `fmt` cannot be read in this environment (the module that does not
    import and the install that fixes it), or None when they can. Checks imports only: no file is read."""
    for m in _FORMAT_MODULES[fmt]:
        try:
            importlib.import_module(m)
        except ImportError as e:
            return (f"SkipVAR decision models ({'.skops' if fmt == 'skops' else 'joblib .pkl'} files) are scikit-learn "
                    f"objects and need {', '.join(_FORMAT_MODULES[fmt])} to load; {e}. Install them: {INSTALL_HINT}")
    return None


def require_decision_model_deps(folder: str | Path, fmt: str) -> None:
    """DecisionModelError naming the folder, its format and the install, when `fmt` cannot be read here."""
    why = missing_decision_model_deps(fmt)
    if why is not None:
        raise DecisionModelError(f"{folder}: {why}.")


def folder_format(d: Path, classifier: str = "Logistic_Regression") -> str:
    """"skops" when `d` holds a complete .skops set (what the loader then reads), else "pkl"."""
    return "skops" if all((d / n).is_file() for n in model_files(classifier, "skops").values()) else "pkl"


#: file formats of a decision-model folder: "skops" (safe; what varbench writes) or "pkl" (joblib, released)
FORMATS = ("skops", "pkl")
#: skops types varbench allows beyond skops' own trusted set, each checked after loading (`_check_trees`)
_CHECKED_TYPES = ("sklearn.tree._tree.Tree",)


def model_files(classifier: str, fmt: str = "pkl") -> dict[str, str]:
    """{role: file name} of one decision-model folder, as the release names them (``fmt="pkl"``),
    or the same stems with ``.skops`` (the safe format varbench writes)."""
    if classifier not in CLASSIFIERS:
        raise ValueError(f"skipvar classifier must be one of {list(CLASSIFIERS)}, got {classifier!r}")
    if fmt not in FORMATS:
        raise ValueError(f"decision-model format must be one of {list(FORMATS)}, got {fmt!r}")
    return {"skip_model": f"skip_model_{classifier}.{fmt}", "skip_scaler": f"skip_model_scaler.{fmt}",
            "uncond_model": f"uncond_model_{classifier}.{fmt}", "uncond_scaler": f"uncond_model_scaler.{fmt}"}


def resolve_folder(folder: str | Path) -> Path:
    """The decision-model folder: as given, or (relative and absent here) inside the varbench package."""
    d = Path(folder).expanduser()
    if not d.is_absolute() and not d.exists() and (Path(__file__).resolve().parents[1] / d).is_dir():
        d = Path(__file__).resolve().parents[1] / d  # a folder shipped inside the package (toy/weights/...)
    return d


def decision_model_paths(folder: str | Path | None, classifier: str = "Logistic_Regression") -> dict[str, Path]:
    """{file name: path} of the four files :func:`load_decision_models` would read from ``folder``
    (the ``.skops`` set when complete, else the ``.pkl`` set; only the files that exist). The job
    hashes them into the generation key: retraining a folder in place makes new images."""
    if folder is None or str(folder) in ("", "None", "null"):
        return {}
    d = resolve_folder(folder)
    fmt = folder_format(d, classifier)
    return {n: d / n for n in model_files(classifier, fmt).values() if (d / n).is_file()}


@dataclasses.dataclass
class DecisionModels:
    """The two released classifiers with their scalers; `predict` applies the released cascade."""

    skip_model: Any
    skip_scaler: Any
    uncond_model: Any
    uncond_scaler: Any
    folder: str = ""
    classifier: str = "Logistic_Regression"
    fmt: str = "pkl"                      # "skops" (safe) or "pkl" (joblib)
    released_as: Optional[str] = None     # the released folder whose pinned bytes these are (pkl only)

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
        d = {"folder": self.folder, "classifier": self.classifier, "n_features": self.n_features,
             "format": self.fmt, "released_as": self.released_as}
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


def _check_trees(obj: Any, path: Path) -> None:
    """Every tree node's child and feature index within its arrays (what scikit-learn does not check
    and a crafted .skops file could abuse to read outside them): else DecisionModelError."""
    trees = [obj] if hasattr(obj, "tree_") else list(getattr(obj, "estimators_", []) or [])
    for t in (getattr(e, "tree_", None) for e in trees):
        if t is None:
            continue
        n, nf = int(t.node_count), int(getattr(obj, "n_features_in_", 0) or t.n_features)
        left, right, feat = np.asarray(t.children_left), np.asarray(t.children_right), np.asarray(t.feature)
        leaf = left == -1
        ok = (len(left) == len(right) == len(feat) == n and np.array_equal(leaf, right == -1)
              and ((left[~leaf] > 0) & (left[~leaf] < n) & (right[~leaf] > 0) & (right[~leaf] < n)).all()
              and ((feat[~leaf] >= 0) & (feat[~leaf] < nf)).all() and np.asarray(t.value).shape[0] == n)
        if not ok:
            raise DecisionModelError(f"{path}: a decision tree's node indices point outside its arrays; the file is "
                                     f"damaged or crafted. Retrain it with `python -m experiments.skipvar_train`.")


def _load_skops(path: Path, trust: bool) -> Any:
    sio = require_skops()
    try:
        untrusted = sio.get_untrusted_types(file=path)
        unknown = [t for t in untrusted if t not in _CHECKED_TYPES]
        if unknown and not trust:
            raise DecisionModelError(
                f"{path} holds types skops does not trust: {unknown}. Loading them could run code. If you made this "
                f"file (or trust who did), set method.knobs.trust_decision_models=true (or env {TRUST_ENV}=1); "
                f"otherwise retrain with `python -m experiments.skipvar_train`.")
        obj = sio.load(path, trusted=list(untrusted))
    except DecisionModelError:
        raise
    except Exception as e:  # noqa: BLE001 - report which file and why
        raise DecisionModelError(f"{path}: could not be loaded with skops ({type(e).__name__}: {e}).") from e
    _check_trees(obj, path)
    return obj


def _refuse_unknown_pickles(d: Path, names: list[str]) -> None:
    from varbench.core.filehash import sha256_file

    hashes = {n: sha256_file(d / n) for n in names}
    if released_folder(hashes) is not None:
        return
    shown = ", ".join(f"{n} ({h[:12]})" for n, h in hashes.items())
    raise DecisionModelError(
        f"{d}: these decision-model pickles are not the files SkipVAR released: {shown}. Loading a joblib/pickle "
        f"file executes code written into it, so varbench loads only the released bytes (sha256 pinned in "
        f"varbench/policies/skipvar_release.py) unless told otherwise. Fix: use the release's folder unchanged "
        f"(decision_model_ssim_84/86/88[_diff_only]), retrain in the safe format with `python -m "
        f"experiments.skipvar_train`, or, if you trust these files, set method.knobs.trust_decision_models=true "
        f"(or env {TRUST_ENV}=1).")


def load_decision_models(folder: str | Path, classifier: str = "Logistic_Regression",
                         trust: bool = False) -> DecisionModels:
    """Load a decision-model folder strictly: every one of the four files must exist and be a fitted
    estimator of the right shape. ``.skops`` files (what varbench writes) load without running code;
    ``.pkl`` files (the release's joblib pickles) load only when their sha256 is the released one,
    or with ``trust`` (``method.knobs.trust_decision_models``, or env ``VARBENCH_TRUST_DECISION_MODELS=1``):
    pickles run code while loading. A relative folder is looked up in the current directory, then
    inside the varbench package."""
    files = model_files(classifier)
    if folder is None or str(folder) in ("", "None", "null"):
        raise DecisionModelError("skipvar needs `decision_models`: a folder with the released decision models "
                                 f"({', '.join(files.values())}); published in {PUBLISHED_AT}.")
    d = resolve_folder(folder)
    trust = bool(trust) or trusted_by_env()
    fmt = folder_format(d, classifier)
    if fmt == "skops":
        files = model_files(classifier, "skops")
    missing = [n for n in files.values() if not (d / n).is_file()]
    if missing:
        raise DecisionModelError(f"SkipVAR decision models not found: {str(d)!r} lacks {missing}. They are published in "
                                 f"{PUBLISHED_AT}; point `decision_models` (env VARBENCH_WEIGHTS) at that folder.")
    released = None
    if fmt == "pkl":
        from varbench.core.filehash import sha256_file

        released = released_folder({n: sha256_file(d / n) for n in files.values()})
        if released is None and not trust:
            _refuse_unknown_pickles(d, list(files.values()))
    require_decision_model_deps(d, fmt)
    import warnings

    loaded = {}
    for role, name in files.items():
        if fmt == "skops":
            loaded[role] = _load_skops(d / name, trust)
            continue
        joblib = require_joblib()
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
    return DecisionModels(folder=str(d), classifier=classifier, fmt=fmt, released_as=released, **loaded)


def save_decision_models(folder: str | Path, classifier: str, skip_model, skip_scaler, uncond_model, uncond_scaler) -> dict[str, str]:
    """Write the four files in the released layout with skops (``*.skops``: loads without running
    code); returns {role: path}. A stale ``.pkl`` set of the same classifier is removed, so the
    folder holds one set (the loader would prefer the ``.skops`` one anyway)."""
    sio = require_skops()
    d = Path(folder)
    d.mkdir(parents=True, exist_ok=True)
    objs = {"skip_model": skip_model, "skip_scaler": skip_scaler, "uncond_model": uncond_model, "uncond_scaler": uncond_scaler}
    out = {}
    for role, name in model_files(classifier, "skops").items():
        sio.dump(objs[role], d / name)
        out[role] = str(d / name)
    for name in model_files(classifier, "pkl").values():
        (d / name).unlink(missing_ok=True)
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
