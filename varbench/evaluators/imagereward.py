"""ImageReward (THUDM/ImageReward v1.0) re-implemented on maintained `transformers` BLIP modules.

Architecture (shared/reference/evaluators.md §2): BLIP ViT-L/16 @224 vision tower (LayerNorm eps 1e-6,
all 197 tokens kept) -> BERT-base text encoder with cross-attention to the image tokens in every layer
(bidirectional, `[CLS]` first, uncased WordPiece, padded/truncated to 35 tokens) -> `[CLS]` hidden state
-> 5 linear layers without activations (768->1024->128->64->16->1) -> `(r - mean) / std` with the
published constants. The upstream `image-reward` package does not import on transformers >= 4.56 and
loads with `strict=False`; here the checkpoint goes through an explicit key map and a strict load.

Preprocessing as upstream: PIL bicubic resize of the *shorter* side to 224 -> centre crop -> RGB ->
[0,1] -> OpenAI CLIP mean/std.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Optional, Sequence

import torch
from torch import nn

from varbench.evaluators.per_image import PerImageEvaluator
from varbench.evaluators.weights import WrongWeightsError, check_sha256, load_state_dict, resolve_file, strict_load
from varbench.evaluators.base import Sample

#: published reward normalisation (ImageReward.py: self.mean / self.std)
IR_MEAN = 0.16717362830052426
IR_STD = 1.0333394966054072
MAX_LENGTH = 35
IMAGE_SIZE = 224
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
PUBLISHED_CKPT = "https://huggingface.co/THUDM/ImageReward (file ImageReward.pt)"
PUBLISHED_TOK = "https://huggingface.co/bert-base-uncased (vocab.txt; put it in a folder and set tokenizer_dir)"

#: The released ImageReward-v1.0 architecture. `model_config` JSON files use the same two sections.
REAL_CONFIG = {
    "vision": dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16,
                   image_size=224, patch_size=16, layer_norm_eps=1e-6, hidden_act="gelu"),
    "text": dict(vocab_size=30524, hidden_size=768, encoder_hidden_size=1024, intermediate_size=3072,
                 num_hidden_layers=12, num_attention_heads=12, max_position_embeddings=512,
                 layer_norm_eps=1e-12, hidden_act="gelu"),
}
HEAD_DIMS = (1024, 128, 64, 16, 1)


def ir_preprocess(image) -> torch.Tensor:
    """Upstream `_transform(224)`: Resize(224, BICUBIC) -> CenterCrop(224) -> RGB -> ToTensor -> Normalize."""
    import torchvision.transforms.functional as TF
    from torchvision.transforms import InterpolationMode

    img = TF.resize(image, IMAGE_SIZE, InterpolationMode.BICUBIC)
    img = TF.center_crop(img, IMAGE_SIZE).convert("RGB")
    return TF.normalize(TF.to_tensor(img), CLIP_MEAN, CLIP_STD)


class _Head(nn.Module):
    """The reward MLP; `layers` indices match the checkpoint (`mlp.layers.{0,2,4,6,7}`)."""

    def __init__(self, in_dim: int):
        super().__init__()
        d = (in_dim,) + HEAD_DIMS
        self.layers = nn.Sequential(nn.Linear(d[0], d[1]), nn.Dropout(0.2), nn.Linear(d[1], d[2]), nn.Dropout(0.2),
                                    nn.Linear(d[2], d[3]), nn.Dropout(0.1), nn.Linear(d[3], d[4]), nn.Linear(d[4], d[5]))

    def forward(self, x):
        return self.layers(x)


class ImageRewardModel(nn.Module):
    """vision (BlipVisionModel) + text (BlipTextModel with cross-attention) + mlp head."""

    def __init__(self, config: dict):
        super().__init__()
        from transformers.models.blip.configuration_blip import BlipTextConfig, BlipVisionConfig
        from transformers.models.blip.modeling_blip import BlipVisionModel
        from transformers.models.blip.modeling_blip_text import BlipTextModel

        self.vision = BlipVisionModel(BlipVisionConfig(**config["vision"]))
        # is_decoder=True in the *config* only makes HF build the cross-attention layers; forward runs with
        # is_decoder=False (bidirectional self-attention), as upstream's BertModel in "multimodal" mode.
        self.text = BlipTextModel(BlipTextConfig(**config["text"], is_decoder=True), add_pooling_layer=False)
        self.mlp = _Head(config["text"]["hidden_size"])

    def forward(self, pixel_values, input_ids, attention_mask):
        img = self.vision(pixel_values=pixel_values).last_hidden_state
        img_mask = torch.ones(img.shape[:-1], dtype=torch.long, device=img.device)
        out = self.text(input_ids=input_ids, attention_mask=attention_mask, encoder_hidden_states=img,
                        encoder_attention_mask=img_mask, is_decoder=False)
        r = self.mlp(out.last_hidden_state[:, 0, :].float())
        return ((r - IR_MEAN) / IR_STD).squeeze(-1)


# ---- checkpoint key map (upstream ImageReward.pt -> ImageRewardModel) --------------------------------
_VISION_RULES = [
    (r"^cls_token$", "embeddings.class_embedding"),
    (r"^pos_embed$", "embeddings.position_embedding"),
    (r"^patch_embed\.proj\.(weight|bias)$", r"embeddings.patch_embedding.\1"),
    (r"^blocks\.(\d+)\.norm1\.(weight|bias)$", r"encoder.layers.\1.layer_norm1.\2"),
    (r"^blocks\.(\d+)\.norm2\.(weight|bias)$", r"encoder.layers.\1.layer_norm2.\2"),
    (r"^blocks\.(\d+)\.attn\.qkv\.(weight|bias)$", r"encoder.layers.\1.self_attn.qkv.\2"),
    (r"^blocks\.(\d+)\.attn\.proj\.(weight|bias)$", r"encoder.layers.\1.self_attn.projection.\2"),
    (r"^blocks\.(\d+)\.mlp\.(fc1|fc2)\.(weight|bias)$", r"encoder.layers.\1.mlp.\2.\3"),
    (r"^norm\.(weight|bias)$", r"post_layernorm.\1"),
]
#: keys in ImageReward.pt that scoring does not use (BLIP's contrastive projections; the position-id buffer)
_UNUSED = (r"^blip\.vision_proj\.", r"^blip\.text_proj\.", r"^blip\.text_encoder\.embeddings\.position_ids$")


def map_imagereward_state_dict(sd: dict) -> tuple[dict, list[str]]:
    """Map upstream keys to ours. Returns (mapped, dropped); any key matching no rule raises."""
    out, dropped, unknown = {}, [], []
    for k, v in sd.items():
        if any(re.search(p, k) for p in _UNUSED):
            dropped.append(k)
        elif k.startswith("blip.visual_encoder."):
            sub = k[len("blip.visual_encoder."):]
            for pat, rep in _VISION_RULES:
                if re.match(pat, sub):
                    out["vision." + re.sub(pat, rep, sub)] = v
                    break
            else:
                unknown.append(k)
        elif k.startswith("blip.text_encoder."):
            out["text." + k[len("blip.text_encoder."):]] = v
        elif k.startswith("mlp.layers."):
            out[k] = v
        else:
            unknown.append(k)
    if unknown:
        raise WrongWeightsError(f"ImageReward checkpoint has {len(unknown)} keys outside the known layout, "
                                f"e.g. {unknown[:4]}: not an ImageReward.pt?")
    return out, dropped


def load_tokenizer(tokenizer_dir: Path):
    """BERT-uncased WordPiece from a local folder, plus the two tokens BLIP adds ([DEC] bos, [ENC])."""
    from transformers import BertTokenizer

    tok = BertTokenizer.from_pretrained(str(tokenizer_dir), do_lower_case=True)
    tok.add_special_tokens({"bos_token": "[DEC]"})
    tok.add_special_tokens({"additional_special_tokens": ["[ENC]"]})
    return tok


class ImageRewardEvaluator(PerImageEvaluator):
    """ImageReward-v1.0 reward (higher = preferred by the ImageReward human-preference model).

    Args:
        weights: path to `ImageReward.pt`; if unset, `weights_dir / filename`.
        weights_dir: folder with the checkpoint (usually `${paths.weights_dir}`).
        filename: checkpoint file name (default "ImageReward.pt").
        tokenizer_dir: folder holding bert-base-uncased's `vocab.txt`; relative paths resolve under
            `weights_dir`. Default "bert-base-uncased".
        model_config: optional JSON with "vision"/"text" sections overriding the architecture (tests use a
            tiny one); default is the released ViT-L + BERT-base.
        batch_size: images per forward; speed/memory only.
        device: torch device.
        expected_sha256: if set, the checkpoint must have this hash.
    """

    name = "imagereward"
    higher_is_better = {"score": True}
    metrics = {"score": "imagereward"}
    needs_reference = False

    def __init__(self, weights: Optional[str] = None, weights_dir: Optional[str] = None, filename: str = "ImageReward.pt",
                 tokenizer_dir: str = "bert-base-uncased", model_config: Optional[str] = None, batch_size: int = 16,
                 device: str = "cpu", expected_sha256: Optional[str] = None):
        self.weights, self.weights_dir, self.filename = weights, weights_dir, filename
        self.tokenizer_dir, self.model_config = tokenizer_dir, model_config
        self.batch_size, self.device, self.expected_sha256 = int(batch_size), device, expected_sha256
        self._model: Optional[ImageRewardModel] = None
        self._tok = None
        self._path = self._sha = self._tok_path = None

    def _files(self) -> tuple[Path, Path]:
        """(checkpoint, tokenizer folder), each checked to exist."""
        path = resolve_file(self.weights, self.weights_dir, self.filename, what="ImageReward checkpoint",
                            published=PUBLISHED_CKPT)
        tok_dir = Path(self.tokenizer_dir)
        if not tok_dir.is_absolute() and self.weights_dir:
            tok_dir = Path(self.weights_dir) / tok_dir
        resolve_file(str(tok_dir / "vocab.txt"), None, "vocab.txt", what="ImageReward tokenizer (bert-base-uncased)",
                     published=PUBLISHED_TOK)
        return path, tok_dir

    def preflight(self, metadata) -> None:
        self._files()

    def setup(self, device: Optional[str] = None) -> None:
        if self._model is not None and device is not None:
            self._model.to(device)
        super().setup(device)

    def load(self, device: str) -> None:
        path, tok_dir = self._files()
        self._sha = check_sha256(path, self.expected_sha256, what="ImageReward checkpoint")
        from varbench.core.inputs import read_json   # strict: a malformed file names its line, column and byte

        config = read_json(Path(self.model_config), "ImageReward model config") if self.model_config else REAL_CONFIG
        model = ImageRewardModel(config)
        mapped, _ = map_imagereward_state_dict(load_state_dict(path, what="ImageReward checkpoint"))
        pos = mapped.get("text.embeddings.position_ids")
        strict_load(model, mapped, what="ImageReward checkpoint", path=path,
                    ignore_missing=("embeddings.position_ids",) if pos is None else ())
        self._model = model.eval().to(device)
        self._tok = load_tokenizer(tok_dir)
        if len(self._tok) != config["text"]["vocab_size"]:
            raise WrongWeightsError(f"ImageReward tokenizer in {str(tok_dir)!r} has {len(self._tok)} tokens (with [DEC], "
                                    f"[ENC]) but the text model expects {config['text']['vocab_size']}: wrong vocab.txt?")
        self._path, self._tok_path = path, tok_dir

    def tokenize(self, prompts: Sequence[str]):
        return self._tok(list(prompts), padding="max_length", truncation=True, max_length=MAX_LENGTH, return_tensors="pt")

    @torch.no_grad()
    def rewards(self, images: Sequence, prompts: Sequence[str]) -> list[float]:
        """Normalised ImageReward of aligned images/prompts."""
        if self._model is None:
            raise RuntimeError("imagereward: call setup() before scoring")
        from varbench.evaluators.common import to_pil_rgb

        pix = torch.stack([ir_preprocess(to_pil_rgb(im) if not hasattr(im, "mode") else im) for im in images])
        t = self.tokenize(prompts)
        r = self._model(pix.to(self.device), t.input_ids.to(self.device), t.attention_mask.to(self.device))
        return r.float().cpu().tolist()

    def score_batch(self, samples: Sequence[Sample]) -> list[dict]:
        return [{"imagereward": r} for r in self.rewards([s.image for s in samples], [s.prompt for s in samples])]

    def version_info(self) -> dict[str, Any]:
        import transformers

        from varbench.core.filehash import sha256_file

        # files by name and sha256, never by path: identical scorers on two machines agree
        vocab = Path(self._tok_path) / "vocab.txt" if self._tok_path else None
        return {"scorer": "imagereward-v1.0", "implementation": "varbench transformers-BLIP re-implementation of THUDM/ImageReward",
                "weights": Path(self._path).name if self._path else None, "weights_sha256": self._sha,
                "tokenizer_vocab_sha256": sha256_file(vocab) if vocab is not None and vocab.is_file() else None,
                "max_length": MAX_LENGTH,
                "normalisation": [IR_MEAN, IR_STD], "preprocess": "shorter-side-224 PIL bicubic + centre crop + CLIP norm",
                "model_config": ({"file": Path(self.model_config).name, "sha256": sha256_file(self.model_config)}
                                 if self.model_config else "ImageReward-v1.0 (ViT-L/16 + BERT-base)"),
                "transformers": transformers.__version__}
