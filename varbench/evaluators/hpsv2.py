"""HPSv2 / HPSv2.1 human-preference score, as published by tgxs002/HPSv2.

Model: open_clip `ViT-H-14` (plain GELU) whose weights are replaced by the HPS checkpoint
(`HPS_v2.1_compressed.pt`, tensors under `"state_dict"`), loaded strictly. Score per image =
cosine(image embedding, text embedding) x 100, the scale `hpsv2.evaluate()` reports (32.2 for
Infinity-2B). We do not use the `hpsv2` package (stale pins, downloads at every call); see
shared/reference/evaluators.md §3.

Preprocessing is HPS's own (`light_augmentation=True` eval transform), not open_clip's default:
RGB -> [0,1] tensor -> resize the *longest* side to 224 with tensor bicubic -> zero pad centred ->
OpenAI mean/std. Tensor bicubic resizing antialiases by default on torchvision >= 0.17 (and did not
before), which changes pixels substantially; `antialias` is therefore an explicit, recorded knob.

Aggregation: per-style means for the HPDv2 benchmark styles (`Sample.metadata["style"]` in anime,
concept-art, paintings, photo) and the overall mean over all images. Upstream prints each style as the
mean of its 80-image chunk means, which equals the plain mean when the style has a multiple of 80
images (the benchmark has 800); we report the plain mean.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Sequence

import torch

from varbench.evaluators.common import to_pil_rgb
from varbench.evaluators.per_image import PerImageEvaluator
from varbench.evaluators.weights import WrongWeightsError, check_sha256, load_state_dict, resolve_file, strict_load
from varbench.evaluators.base import Sample

OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)
HPS_STYLES = ("anime", "concept-art", "paintings", "photo")
#: version -> checkpoint file name on the HF hub repo xswu/HPSv2
HPS_FILES = {"v2.0": "HPS_v2_compressed.pt", "v2.1": "HPS_v2.1_compressed.pt"}
PUBLISHED = "https://huggingface.co/xswu/HPSv2 (files HPS_v2.1_compressed.pt / HPS_v2_compressed.pt)"
#: sha256 of the released checkpoints, when known. Not documented in our references, so empty: the hash
#: of whatever file is used is recorded in version_info instead, and `expected_sha256` can pin it.
KNOWN_SHA256: dict[str, str] = {}


def hps_preprocess(image, size: int = 224, antialias: bool = True) -> torch.Tensor:
    """HPS eval transform (longest side -> `size`, zero pad, normalise) for one PIL image -> (3, size, size).

    Mirrors HPS's `ResizeMaxSize`: new size = round(dim * size / max(h, w)) with Python rounding, pad
    split as (pad//2, pad - pad//2). Upstream skips resizing *and padding* when the longest side already
    equals `size`, which leaves a non-square tensor for e.g. 224x100 that its model cannot take; we pad in
    that case (identical output whenever upstream works).
    """
    import torchvision.transforms.functional as TF
    from torchvision.transforms import InterpolationMode

    t = TF.to_tensor(to_pil_rgb(image))
    h, w = t.shape[1:]
    scale = size / float(max(h, w))
    if scale != 1.0:
        new_size = [round(h * scale), round(w * scale)]
        t = TF.resize(t, new_size, InterpolationMode.BICUBIC, antialias=antialias)
    pad_h, pad_w = size - t.shape[1], size - t.shape[2]
    if pad_h or pad_w:
        t = TF.pad(t, [pad_w // 2, pad_h // 2, pad_w - pad_w // 2, pad_h - pad_h // 2], fill=0)
    return TF.normalize(t, OPENAI_MEAN, OPENAI_STD)


class HPSv2Evaluator(PerImageEvaluator):
    """HPSv2.1 (default) or v2.0 scorer.

    Args:
        weights: path to the HPS checkpoint; if unset, `weights_dir / filename`.
        weights_dir: folder holding the checkpoint (usually `${paths.weights_dir}`).
        filename: checkpoint file name; defaults to the published name of `version`.
        version: "v2.1" (what papers call HPSv2.1) or "v2.0". Recorded; a file named for the other
            version is refused, since the two give different numbers with the same architecture.
        model_name: open_clip architecture; "ViT-H-14" for the real scorer. Tests pass a tiny config.
        model_config: optional path to an open_clip model-config JSON registered under its file stem
            (lets tests build a tiny model through the same code path).
        batch_size: images per forward; only memory/speed, not results.
        device: torch device for scoring.
        antialias: tensor-bicubic antialiasing in preprocessing (True = modern torchvision, what
            Infinity's environment used). Changes scores; recorded.
        precision: "fp32", or "amp" = fp16 autocast on CUDA like upstream (faster, ~1e-3 score noise).
        expected_sha256: if set, the checkpoint must have this hash.
    """

    name = "hpsv2"
    needs_reference = False
    metrics = {"score": "hps"}          # x100 cosine; per style as score_<style>
    higher_is_better = {"score": True, **{f"score_{style}": True for style in HPS_STYLES}}
    group_by = ("style", HPS_STYLES)

    def __init__(self, weights: Optional[str] = None, weights_dir: Optional[str] = None, filename: Optional[str] = None,
                 version: str = "v2.1", model_name: str = "ViT-H-14", model_config: Optional[str] = None,
                 batch_size: int = 16, device: str = "cpu", antialias: bool = True, precision: str = "fp32",
                 expected_sha256: Optional[str] = None):
        if version not in HPS_FILES:
            raise ValueError(f"hpsv2: version must be one of {sorted(HPS_FILES)}, got {version!r}")
        if precision not in ("fp32", "amp"):
            raise ValueError(f"hpsv2: precision must be 'fp32' or 'amp', got {precision!r}")
        self.weights, self.weights_dir = weights, weights_dir
        self.filename = filename or HPS_FILES[version]
        self.version, self.model_name, self.model_config = version, model_name, model_config
        self.batch_size, self.device, self.antialias, self.precision = int(batch_size), device, bool(antialias), precision
        self.expected_sha256 = expected_sha256
        self._model = None
        self._tokenizer = None
        self._path: Optional[Path] = None
        self._sha: Optional[str] = None

    # -- lifecycle -------------------------------------------------------------------------------
    def _checkpoint(self) -> Path:
        return resolve_file(self.weights, self.weights_dir, self.filename, what=f"HPS {self.version} checkpoint",
                            published=PUBLISHED)

    def preflight(self, metadata) -> None:
        self._checkpoint()

    def setup(self, device: Optional[str] = None) -> None:
        if self._model is not None and device is not None:
            self._model.to(device)
        super().setup(device)

    def load(self, device: str) -> None:
        path = self._checkpoint()
        other = [v for v, f in HPS_FILES.items() if v != self.version and Path(path).name == f]
        if other:
            raise WrongWeightsError(
                f"HPS: {str(path)!r} is named like the {other[0]} checkpoint but version={self.version!r} was asked "
                f"for. Use {HPS_FILES[self.version]!r} (published at {PUBLISHED}) or set version={other[0]!r}.")
        known_other = {h: f"the HPS {v} checkpoint" for v, h in KNOWN_SHA256.items() if v != self.version}
        self._sha = check_sha256(path, self.expected_sha256 or KNOWN_SHA256.get(self.version),
                                 what=f"HPS {self.version} checkpoint", known=known_other)
        import open_clip

        if self.model_config:
            open_clip.add_model_config(self.model_config)
        model = open_clip.create_model(self.model_name, pretrained=None, precision="fp32", device="cpu",
                                       output_dict=True)
        state = load_state_dict(path, what="HPS checkpoint", key="state_dict")
        strict_load(model, state, what=f"HPS {self.version} checkpoint", path=path)
        self._model = model.eval().to(device)
        self._tokenizer = open_clip.get_tokenizer(self.model_name)
        self._path = path

    @torch.no_grad()
    def score_cosines(self, images: Sequence, prompts: Sequence[str]) -> list[float]:
        """Raw HPS (cosine, *not* x100) for aligned images/prompts."""
        if self._model is None:
            raise RuntimeError("hpsv2: call setup() before scoring")
        pix = torch.stack([hps_preprocess(im, antialias=self.antialias) for im in images]).to(self.device)
        tok = self._tokenizer(list(prompts)).to(self.device)
        use_amp = self.precision == "amp" and str(self.device).startswith("cuda")
        with torch.autocast("cuda", dtype=torch.float16, enabled=use_amp):
            out = self._model(pix, tok)
            img_f, txt_f = out["image_features"], out["text_features"]
            cos = (img_f.float() * txt_f.float()).sum(-1)  # = diag(img @ txt.T); features are L2-normalised
        return cos.cpu().tolist()

    def score_batch(self, samples: Sequence[Sample]) -> list[dict]:
        cos = self.score_cosines([s.image for s in samples], [s.prompt for s in samples])
        return [{"style": s.metadata.get("style"), "hps": 100.0 * c, "hps_cosine": c} for s, c in zip(samples, cos)]

    def version_info(self) -> dict[str, Any]:
        import torchvision

        return {
            "scorer": f"hps{self.version}", "implementation": "varbench open_clip re-implementation of tgxs002/HPSv2",
            # the weights by name and sha256, never by path: identical scorers on two machines agree
            "model_name": self.model_name, "weights": Path(self._path).name if self._path else None, "weights_sha256": self._sha,
            "preprocess": "longest-side-224 bicubic tensor resize + zero pad + OpenAI norm",
            "antialias": self.antialias, "precision": self.precision, "score_scale": 100,
            "torchvision": torchvision.__version__,
        }
