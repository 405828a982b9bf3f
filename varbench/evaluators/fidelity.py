"""Fidelity to the baseline: how close an accelerated run's image is to the unaccelerated image made from
the same prompt and seed (`Sample.reference`). Identical pipelines give PSNR = inf, SSIM = 1, LPIPS = 0.

PSNR/SSIM are torchmetrics' functional versions on [0, 1] RGB (data_range 1, SSIM Gaussian 11x11,
sigma 1.5). LPIPS needs a torchvision backbone checkpoint in the torch hub cache; no download is
attempted, so without it LPIPS is skipped and `version_info()["lpips"]` says so.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from varbench.evaluators.base import Sample
from varbench.evaluators.common import to_pil_rgb
from varbench.evaluators.per_image import PerImageEvaluator

#: torchvision checkpoint file each LPIPS backbone loads from `torch.hub.get_dir()/checkpoints`
LPIPS_BACKBONE_FILES = {"alex": "alexnet-owt-7be5be79.pth", "vgg": "vgg16-397923af.pth",
                        "squeeze": "squeezenet1_1-b8a52dc0.pth"}
#: PSNR of identical images is infinite; per-sample rows keep inf, the mean caps each value here so one
#: identical pair does not make the average infinite (documented cap, recorded).
PSNR_CAP_DB = 100.0


def _to_tensor(img) -> torch.Tensor:
    arr = np.asarray(to_pil_rgb(img), dtype=np.float32) / 255.0
    return torch.from_numpy(arr).permute(2, 0, 1)[None]


class FidelityEvaluator(PerImageEvaluator):
    """PSNR (dB, higher = closer), SSIM (higher = closer), LPIPS (lower = closer, optional).

    Args:
        lpips: "auto" (use if the backbone weights are cached locally), True (require them), False (skip).
        lpips_net: "alex" (default, the usual LPIPS), "vgg" or "squeeze".
        device: torch device.
    """

    name = "fidelity"
    needs_reference = True
    relative_to_baseline = True   # already a comparison with the baseline: no delta in tables
    higher_is_better = {"psnr": True, "ssim": True, "lpips": False}
    metrics = {"psnr": "psnr", "ssim": "ssim", "lpips": "lpips"}   # lpips only when its backbone is there

    def __init__(self, lpips: Any = "auto", lpips_net: str = "alex", device: str = "cpu"):
        if lpips_net not in LPIPS_BACKBONE_FILES:
            raise ValueError(f"fidelity: lpips_net must be one of {sorted(LPIPS_BACKBONE_FILES)}, got {lpips_net!r}")
        self.lpips_mode, self.lpips_net, self.device = lpips, lpips_net, device
        self._lpips = None
        self._lpips_status = "not set up"
        self._lpips_sha: Optional[str] = None

    def _lpips_weights(self) -> Path:
        return Path(torch.hub.get_dir()) / "checkpoints" / LPIPS_BACKBONE_FILES[self.lpips_net]

    def preflight(self, metadata) -> None:
        if self.lpips_mode is True and not self._lpips_weights().exists():
            self._missing_lpips()

    def _missing_lpips(self):
        from varbench.evaluators.weights import WeightsNotFoundError

        w = self._lpips_weights()
        raise WeightsNotFoundError(
            f"fidelity LPIPS: backbone file {w.name!r} not found; searched {str(w)!r}. It is published by "
            f"torchvision (download.pytorch.org/models/{w.name}); place it there or set lpips: auto/false.")

    def load(self, device: str) -> None:
        if self.lpips_mode is False or self._lpips is not None:
            self._lpips_status = "disabled" if self.lpips_mode is False else self._lpips_status
            return
        w = self._lpips_weights()
        if not w.exists():
            if self.lpips_mode is True:
                self._missing_lpips()
            # the file's name, never its path: the same scorer on two hosts (or TORCH_HOME) must pair
            self._lpips_status = f"skipped: {w.name} not present in the torch hub cache"
            return
        from torchmetrics.image.lpip import LearnedPerceptualImagePatchSimilarity

        self._lpips = LearnedPerceptualImagePatchSimilarity(net_type=self.lpips_net, normalize=True).to(device).eval()
        from varbench.core.filehash import sha256_file

        self._lpips_status = f"on ({self.lpips_net}, {w.name})"
        self._lpips_sha = sha256_file(w)

    @torch.no_grad()
    def score(self, s: Sample) -> dict:
        from torchmetrics.functional.image import peak_signal_noise_ratio, structural_similarity_index_measure

        if s.reference is None:
            raise ValueError(f"fidelity: Sample(prompt_index={s.prompt_index}, sample_index={s.sample_index}) has no "
                             f"reference image; run the baseline first and pass its image as Sample.reference.")
        x, y = _to_tensor(s.image), _to_tensor(s.reference)
        if x.shape != y.shape:
            raise ValueError(f"fidelity: image {tuple(x.shape[2:])} and reference {tuple(y.shape[2:])} differ in size "
                             f"(prompt {s.prompt_index}, sample {s.sample_index}); compare same-resolution runs.")
        row = {"psnr": float(peak_signal_noise_ratio(x, y, data_range=1.0)),
               "ssim": float(structural_similarity_index_measure(x, y, data_range=1.0))}
        if self._lpips is not None:
            row["lpips"] = float(self._lpips(x.to(self.device), y.to(self.device)))
        return row

    def aggregate(self, rows: list[dict]):
        capped = [{**r, "psnr": min(r["psnr"], PSNR_CAP_DB) if not math.isnan(r["psnr"]) else r["psnr"]} for r in rows]
        return super().aggregate(capped)

    def version_info(self) -> dict[str, Any]:
        import torchmetrics

        # names and sha256 only, never a path (this dict is hashed to pair a run with its baseline)
        info = {"scorer": "fidelity", "psnr": "torchmetrics data_range=1 (RGB [0,1])", "psnr_cap_db_in_mean": PSNR_CAP_DB,
                "ssim": "torchmetrics gaussian 11, sigma 1.5, data_range=1", "lpips": self._lpips_status,
                "torchmetrics": torchmetrics.__version__}
        if self._lpips_sha is not None:
            info["lpips_weights_sha256"] = self._lpips_sha
        return info
