"""CLIP score (Hessel et al. 2021, as torchmetrics defines it): ``100 * max(cos(E_image, E_text), 0)``
per image, averaged; the text-image agreement column of MJHQ-30K and of several VAR papers.

Model: OpenAI CLIP ViT-L/14 at 224 px, torchmetrics' default (`openai/clip-vit-large-patch14`) and the
model papers quote, built with open_clip (`ViT-L-14-quickgelu`: OpenAI's weights need QuickGELU) from
a named local file, the same open_clip-format state dict GenEval's colour classifier reads
(`open_clip_vit_l14_openai.bin`). Why open_clip and not torchmetrics' `CLIPScore`: torchmetrics 1.9
fails with transformers 5 (Lightning-AI/torchmetrics#3407) and fetches its model from the HF hub by
name; open_clip loads the file strictly and offline. The computation is torchmetrics' own: L2-normalised
image and text embeddings, cosine x 100, floored at 0 (torchmetrics' docstring; its code floors the
*mean*, which is the same number unless some image's cosine is negative; per-image rows keep the raw
cosine too). Preprocessing is OpenAI CLIP's (shorter side to 224, PIL bicubic,
centre crop, OpenAI mean/std), what the HF CLIPProcessor torchmetrics calls does; text is truncated to
CLIP's 77 tokens as there.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Sequence

import torch

from varbench.evaluators.base import Sample
from varbench.evaluators.per_image import PerImageEvaluator
from varbench.evaluators.weights import check_sha256, load_state_dict, resolve_file, strict_load

PUBLISHED = ("HF timm/vit_large_patch14_clip_224.openai (open_clip_pytorch_model.bin), i.e. open_clip "
             "ViT-L-14 'openai' weights; save it as open_clip_vit_l14_openai.bin")


class CLIPScoreEvaluator(PerImageEvaluator):
    """CLIP score (higher = the image matches its prompt better).

    Args:
        weights: path of the open_clip state dict; if unset, ``weights_dir / filename``.
        weights_dir: folder holding it (usually ``${paths.weights_dir}``).
        filename: default ``open_clip_vit_l14_openai.bin`` (shared with GenEval's colour classifier).
        model_name: open_clip architecture (``ViT-L-14-quickgelu`` for OpenAI's weights); tests name a tiny one.
        model_config: open_clip config JSON registered under its file stem (tiny test models).
        batch_size: images per forward (speed/memory only).
        device: torch device.
        expected_sha256: if set, the weights file must have this hash.
    """

    name = "clipscore"
    metrics = {"score": "clip_score"}
    higher_is_better = {"score": True}

    def __init__(self, weights: Optional[str] = None, weights_dir: Optional[str] = None,
                 filename: str = "open_clip_vit_l14_openai.bin", model_name: str = "ViT-L-14-quickgelu",
                 model_config: Optional[str] = None, batch_size: int = 16, device: str = "cpu",
                 expected_sha256: Optional[str] = None):
        self.weights, self.weights_dir, self.filename = weights, weights_dir, filename
        self.model_name, self.model_config = model_name, model_config
        self.batch_size, self.device, self.expected_sha256 = int(batch_size), device, expected_sha256
        self._model = self._tokenizer = self._transform = None
        self._path: Optional[Path] = None
        self._sha: Optional[str] = None

    def _file(self) -> Path:
        return resolve_file(self.weights, self.weights_dir, self.filename, what="CLIP score ViT-L/14 weights",
                            published=PUBLISHED)

    def preflight(self, metadata) -> None:
        self._file()

    def load(self, device: str) -> None:
        import open_clip
        from open_clip.transform import image_transform

        path = self._file()
        self._sha = check_sha256(path, self.expected_sha256, what="CLIP score weights")
        if self.model_config:
            open_clip.add_model_config(self.model_config)
        model = open_clip.create_model(self.model_name, pretrained=None, device="cpu")
        strict_load(model, load_state_dict(path, what="CLIP score weights"), what="CLIP score weights", path=path)
        size = model.visual.image_size
        self._transform = image_transform(size[0] if isinstance(size, (tuple, list)) else size, is_train=False)
        self._model = model.eval().to(device)
        self._tokenizer = open_clip.get_tokenizer(self.model_name)
        self._path = path

    @torch.no_grad()
    def cosines(self, images: Sequence, prompts: Sequence[str]) -> list[float]:
        """cos(image, prompt) of aligned images/prompts (OpenAI preprocessing, 77-token prompts)."""
        if self._model is None:
            raise RuntimeError("clipscore: call setup() before scoring")
        from varbench.evaluators.common import to_pil_rgb

        pix = torch.stack([self._transform(to_pil_rgb(im)) for im in images]).to(self.device)
        img = self._model.encode_image(pix).float()
        txt = self._model.encode_text(self._tokenizer(list(prompts)).to(self.device)).float()
        img = img / img.norm(dim=-1, keepdim=True)
        txt = txt / txt.norm(dim=-1, keepdim=True)
        return (img * txt).sum(-1).cpu().tolist()

    def score_batch(self, samples: Sequence[Sample]) -> list[dict]:
        cos = self.cosines([s.image for s in samples], [s.prompt for s in samples])
        return [{"clip_score": 100.0 * max(c, 0.0), "clip_cosine": c} for c in cos]

    def version_info(self) -> dict[str, Any]:
        import open_clip

        return {"scorer": "clipscore", "definition": "100*max(cos,0) per image (torchmetrics CLIPScore)",
                "model_name": self.model_name, "weights": self._path.name if self._path else None,
                "weights_sha256": self._sha, "preprocess": "OpenAI CLIP: shorter side 224 bicubic, centre crop",
                "open_clip": open_clip.__version__}
