"""FID with clean-fid's protocol (Parmar et al. 2022, ``mode="clean"``), in two forms:

* ``fid`` (fidelity group): a method's images against the baseline's images of the same prompts
  and seeds (``Sample.reference``), as ScaleKV and SkipVAR report it; identical image sets give 0.
* ``fid_dataset``: the images against a reference image folder (MJHQ-30K: ``reference_dir`` = the
  dataset's image folder), whose statistics are computed once and cached.

The protocol, step for step as clean-fid 0.1.35 (``cleanfid/resize.py``, ``utils.py``,
``inception_torchscript.py``, ``fid.py``): the RGB uint8 image, each channel resized on its own to
299 x 299 as a float32 PIL image with bicubic filtering and clipped to [0, 255] (no quantisation
after resizing: the "clean" in clean-fid); the Inception-v3 TorchScript of the TensorFlow FID
weights (``inception-2015-12-05.pt``, the file clean-fid and StyleGAN2-ADA download) fed
``(x - 128) / 128`` through its ``layers`` module, 2048 pool features; mean and ``np.cov`` of the
features of each set; the Fréchet distance with ``scipy.linalg.sqrtm`` and clean-fid's fallback
(``eps`` on the diagonal when the product is singular, the real part kept). Why our own code and not
the clean-fid package: it is not a dependency here and downloads the Inception file to /tmp at
every first use; its resizing and distance are re-implemented (30 lines) and checked against the
package itself (tests/evaluators/test_eval_fid.py, fixture written with clean-fid 0.1.35). Why not
torchmetrics' FID: it resizes the uint8 image with torch-fidelity's own bilinear, not clean-fid's
protocol, so its numbers differ from the published ones by the resizing.

FID is a statistic of the whole set, not a mean: each image's row holds its features (float32,
base64), ``aggregate`` computes FID from all rows, and the uncertainty is a bootstrap over prompts only
when ``n_boot`` > 0 (each resample costs a 2048 x 2048 ``sqrtm``, about a second). Below 2048 images the
covariance is singular and FID is biased upwards: compare methods on the same image count only.
"""
from __future__ import annotations

import base64
import hashlib
import os
import random
import warnings
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import torch

from varbench.evaluators.base import Sample
from varbench.evaluators.per_image import PerImageEvaluator
from varbench.evaluators.weights import check_sha256, resolve_file

INCEPTION_FILE = "inception-2015-12-05.pt"
PUBLISHED = ("https://nvlabs-fi-cdn.nvidia.com/stylegan2-ada-pytorch/pretrained/metrics/inception-2015-12-05.pt "
             "(the TorchScript clean-fid downloads)")
#: clean-fid's image extensions (cleanfid/utils.py EXTENSIONS), found recursively in a reference folder
EXTENSIONS = ("bmp", "jpg", "jpeg", "pgm", "png", "ppm", "tif", "tiff", "webp", "JPEG", "JPG", "PNG")


def clean_resize(image, size: tuple[int, int] = (299, 299)) -> np.ndarray:
    """clean-fid's resize: each channel as a float32 PIL image, bicubic to ``size`` (width, height), clipped
    to [0, 255]; returns float32 HWC (no quantisation)."""
    from PIL import Image

    from varbench.evaluators.common import to_pil_rgb

    arr = np.asarray(to_pil_rgb(image))
    chans = []
    for c in range(3):
        im = Image.fromarray(arr[:, :, c].astype(np.float32), mode="F").resize(size, resample=Image.BICUBIC)
        chans.append(np.asarray(im).clip(0, 255).reshape(size[1], size[0], 1))
    return np.concatenate(chans, axis=2).astype(np.float32)


def frechet_distance(mu1, sigma1, mu2, sigma2, eps: float = 1e-6) -> float:
    """clean-fid's ``frechet_distance``: ||mu1-mu2||^2 + Tr(S1 + S2 - 2 sqrt(S1 S2))."""
    from scipy import linalg

    mu1, mu2 = np.atleast_1d(mu1), np.atleast_1d(mu2)
    sigma1, sigma2 = np.atleast_2d(sigma1), np.atleast_2d(sigma2)
    diff = mu1 - mu2
    with warnings.catch_warnings():   # scipy >= 1.17 deprecates `disp`; clean-fid's call, kept for its result
        warnings.simplefilter("ignore", DeprecationWarning)
        covmean, _ = linalg.sqrtm(sigma1.dot(sigma2), disp=False)
    if not np.isfinite(covmean).all():      # singular product: clean-fid adds eps to both diagonals
        offset = np.eye(sigma1.shape[0]) * eps
        covmean = linalg.sqrtm((sigma1 + offset).dot(sigma2 + offset))
    if np.iscomplexobj(covmean):
        covmean = covmean.real
    return float(diff.dot(diff) + np.trace(sigma1) + np.trace(sigma2) - 2 * np.trace(covmean))


def stats(feats: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(mean, covariance) as clean-fid computes them (``np.mean(axis=0)``, ``np.cov(rowvar=False)``)."""
    return np.mean(feats, axis=0), np.cov(feats, rowvar=False)


def encode(feat: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(feat, dtype="<f4").tobytes()).decode("ascii")


def decode(text: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), dtype="<f4")


class _InceptionFeatures(PerImageEvaluator):
    """The Inception feature extractor both FIDs share."""

    higher_is_better = {"fid": False}
    batch_size = 32

    def __init__(self, weights: Optional[str] = None, weights_dir: Optional[str] = None, filename: str = INCEPTION_FILE,
                 batch_size: int = 32, device: str = "cpu", n_boot: int = 0, expected_sha256: Optional[str] = None):
        self.weights, self.weights_dir, self.filename = weights, weights_dir, filename
        self.batch_size, self.device, self.n_boot = int(batch_size), device, int(n_boot)
        self.expected_sha256 = expected_sha256
        self._net = None
        self._path: Optional[Path] = None
        self._sha: Optional[str] = None

    def _file(self) -> Path:
        return resolve_file(self.weights, self.weights_dir, self.filename, what="FID Inception-v3 TorchScript",
                            published=PUBLISHED)

    def preflight(self, metadata) -> None:
        self._file()

    def load(self, device: str) -> None:
        from varbench.evaluators.weights import WrongWeightsError

        path = self._file()
        self._sha = check_sha256(path, self.expected_sha256, what="FID Inception")
        try:
            net = torch.jit.load(str(path), map_location="cpu").eval()
        except Exception as e:  # noqa: BLE001 - not a TorchScript archive
            raise WrongWeightsError(f"FID Inception: {str(path)!r} is not a TorchScript file ({type(e).__name__}: {e}); "
                                    f"it must be {INCEPTION_FILE} from {PUBLISHED}.") from e
        if not hasattr(net, "layers"):
            raise WrongWeightsError(f"FID Inception: {str(path)!r} has no `layers` module; it must be {INCEPTION_FILE}.")
        self._net = net.to(device)
        self._path = path

    @torch.no_grad()
    def features(self, images: Sequence) -> np.ndarray:
        """(n, d) float32 pool features of ``images`` (clean-fid's resize and normalisation)."""
        if self._net is None:
            raise RuntimeError(f"{self.name}: call setup() before scoring")
        x = torch.stack([torch.from_numpy(clean_resize(im).transpose(2, 0, 1).copy()) for im in images])
        x = (x.to(self.device) - 128) / 128
        return self._net.layers.forward(x).reshape(len(images), -1).float().cpu().numpy()

    def version_info(self) -> dict[str, Any]:
        import scipy

        return {"scorer": self.name, "protocol": "clean-fid 0.1.35 mode=clean (own implementation)",
                "weights": self._path.name if self._path else None, "weights_sha256": self._sha,
                "n_boot": self.n_boot, "scipy": scipy.__version__}

    def _fid_with_bootstrap(self, rows: list[dict], key: str, ref) -> tuple[dict, dict]:
        """FID of the rows' ``key`` features against ``ref`` (fixed (mu, sigma), or a row key of paired
        features); with ``n_boot`` > 0 its bootstrap over prompts."""
        if len(rows) < 2:
            return {"n_images": float(len(rows))}, {}
        feats = np.stack([decode(r[key]) for r in rows])

        def fid_of(idx):
            mu, sig = stats(feats[idx])
            if isinstance(ref, str):
                mu2, sig2 = stats(np.stack([decode(rows[i][ref]) for i in idx]))
            else:
                mu2, sig2 = ref
            return frechet_distance(mu, sig, mu2, sig2)

        every = list(range(len(rows)))
        metrics, unc = {"fid": fid_of(every), "n_images": float(len(rows))}, {}
        if self.n_boot > 0:
            groups: dict[int, list[int]] = {}
            for i, r in enumerate(rows):
                groups.setdefault(r["prompt_index"], []).append(i)
            prompts = list(groups.values())
            rng = random.Random(self.boot_seed)
            vals = [fid_of([i for _ in prompts for i in prompts[rng.randrange(len(prompts))]]) for _ in range(self.n_boot)]
            unc["fid"] = float(np.std(vals, ddof=1)) if len(vals) > 1 else 0.0
        return metrics, unc


class FIDEvaluator(_InceptionFeatures):
    """FID of a method's images against the baseline's images of the same prompts and seeds (lower =
    closer to the unaccelerated model's output distribution; 0 for identical sets).

    Args:
        weights / weights_dir / filename: the Inception TorchScript (``inception-2015-12-05.pt``).
        batch_size: images per forward (speed/memory only).
        device: torch device.
        n_boot: bootstrap resamples over prompts for the ± (0 = none; each costs one 2048² sqrtm).
        expected_sha256: if set, the Inception file must have this hash.
    """

    name = "fid"
    needs_reference = True
    relative_to_baseline = True   # already a comparison with the baseline: no delta in tables

    def score_batch(self, samples: Sequence[Sample]) -> list[dict]:
        for s in samples:
            if s.reference is None:
                raise ValueError(f"fid: Sample(prompt_index={s.prompt_index}, sample_index={s.sample_index}) has no "
                                 f"reference image; run the baseline first and pass its image as Sample.reference.")
        f = self.features([s.image for s in samples])
        g = self.features([s.reference for s in samples])
        return [{"feat": encode(a), "ref_feat": encode(b)} for a, b in zip(f, g)]

    def aggregate(self, rows: list[dict]):
        return self._fid_with_bootstrap(rows, "feat", "ref_feat")


def reference_files(folder: Path) -> list[Path]:
    """Every image under ``folder`` (recursively), sorted, as clean-fid's folder FID lists them."""
    return sorted({p for ext in EXTENSIONS for p in folder.rglob(f"*.{ext}")}, key=str)


def folder_digest(files: Sequence[Path], root: Path) -> str:
    """A cheap identity of a reference folder: sha256 over its files' relative names and sizes."""
    h = hashlib.sha256()
    for p in files:
        h.update(f"{p.relative_to(root).as_posix()}\t{p.stat().st_size}\n".encode())
    return h.hexdigest()


class DatasetFIDEvaluator(_InceptionFeatures):
    """FID of the images against a reference image folder (MJHQ-30K's 30,000 images; lower = closer).

    Args:
        reference_dir: the folder of reference images (searched recursively, clean-fid's extensions).
        stats_cache: folder for the reference statistics (``fid_stats_<digest>.npz``; computed once per
            folder and Inception file); usually ``${paths.store_dir}/fid_stats``.
        published: where the reference set is published (named when the folder is missing).
        other args as ``fid``.
    """

    name = "fid_dataset"

    def __init__(self, reference_dir: Optional[str] = None, stats_cache: Optional[str] = None,
                 published: str = "https://huggingface.co/datasets/playgroundai/MJHQ-30K (mjhq30k_imgs.zip, unpacked)",
                 weights: Optional[str] = None, weights_dir: Optional[str] = None, filename: str = INCEPTION_FILE,
                 batch_size: int = 32, device: str = "cpu", n_boot: int = 0, expected_sha256: Optional[str] = None):
        super().__init__(weights=weights, weights_dir=weights_dir, filename=filename, batch_size=batch_size,
                         device=device, n_boot=n_boot, expected_sha256=expected_sha256)
        self.reference_dir, self.stats_cache, self.published = reference_dir, stats_cache, published
        self._ref_stats = None
        self._ref_digest: Optional[str] = None

    def _folder(self) -> Path:
        from varbench.evaluators.weights import WeightsNotFoundError
        from varbench.core.missing import MissingFile, note

        folder = Path(os.path.expanduser(str(self.reference_dir or "")))
        if not self.reference_dir or not folder.is_dir() or not reference_files(folder):
            where = str(folder.resolve()) if self.reference_dir else "(reference_dir is not set)"
            if note(MissingFile("FID reference image folder", where, self.published,
                                "set evaluator.<name>.reference_dir to the unpacked image folder")):
                return folder
            raise WeightsNotFoundError(
                f"FID reference image folder not found or empty.\n  searched: {where}\n  published at: {self.published}\n"
                f"  fix: set the evaluator's reference_dir to the unpacked image folder.")
        return folder

    def preflight(self, metadata) -> None:
        self._file()
        self._folder()

    def load(self, device: str) -> None:
        super().load(device)
        folder = self._folder()
        files = reference_files(folder)
        self._ref_digest = folder_digest(files, folder)
        cache = Path(os.path.expanduser(str(self.stats_cache))) if self.stats_cache else Path("fid_stats")
        path = cache / f"fid_stats_{self._ref_digest[:16]}_{self._sha[:16]}.npz"
        if path.is_file():
            with np.load(path) as z:
                self._ref_stats = (z["mu"], z["sigma"])
            return
        feats = []
        for i in range(0, len(files), self.batch_size):
            feats.append(self.features(files[i:i + self.batch_size]))
        self._ref_stats = stats(np.concatenate(feats))
        cache.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp.npz")
        np.savez(tmp, mu=self._ref_stats[0], sigma=self._ref_stats[1], n=len(files))
        os.replace(tmp, path)

    def score_batch(self, samples: Sequence[Sample]) -> list[dict]:
        return [{"feat": encode(a)} for a in self.features([s.image for s in samples])]

    def aggregate(self, rows: list[dict]):
        if self._ref_stats is None:
            self.setup(self.device)           # aggregating stored rows needs the (cached) reference statistics
        return self._fid_with_bootstrap(rows, "feat", self._ref_stats)

    def version_info(self) -> dict[str, Any]:
        return {**super().version_info(), "reference_digest": self._ref_digest,
                "reference": Path(str(self.reference_dir)).name if self.reference_dir else None}
