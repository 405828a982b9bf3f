"""Text encoders: flan-t5-xl as released, and a small word-level encoder for tiny/toy models.

Both return a `TextBatch`: padded features (B, Lmax, C) with a key mask, plus the per-prompt
lengths. (The released code packs them with cu_seqlens for flash-attn varlen; padding + mask is
the same attention.)
"""
from __future__ import annotations

import dataclasses
import hashlib
import re
from pathlib import Path
from typing import Optional, Sequence

import torch
import torch.nn as nn

from varbench.engine.checkpoints import load_state_dict_strict
from varbench.engine.stage_flops import per_image_shares, t5_encoder_flops, word_encoder_flops


@dataclasses.dataclass
class TextBatch:
    features: torch.Tensor     # (B, Lmax, C) float32, zeros past each prompt's length
    mask: torch.Tensor         # (B, Lmax) bool, True for real tokens
    lens: list[int]

    def to(self, device) -> "TextBatch":
        return TextBatch(self.features.to(device), self.mask.to(device), self.lens)


def pad_batch(feats: list[torch.Tensor]) -> TextBatch:
    lens = [f.shape[0] for f in feats]
    lmax = max(lens)
    out = feats[0].new_zeros(len(feats), lmax, feats[0].shape[-1])
    mask = torch.zeros(len(feats), lmax, dtype=torch.bool, device=feats[0].device)
    for i, f in enumerate(feats):
        out[i, : f.shape[0]] = f
        mask[i, : f.shape[0]] = True
    return TextBatch(out, mask, lens)


class T5TextEncoder(nn.Module):
    """google/flan-t5-xl encoder from a local Hugging Face folder, fp16 as released.

    Tokenisation: legacy tokenizer, max_length 512, truncation; features are the encoder's
    last_hidden_state (float32), cut to each prompt's attention-mask length.
    """

    def __init__(self, folder: str, dtype: torch.dtype = torch.float16, max_length: int = 512):
        super().__init__()
        from transformers import AutoTokenizer, T5EncoderModel

        from varbench.engine.checkpoints import require_file

        path = require_file(folder, "flan-t5-xl text encoder folder", setting="model.text_encoder.path")
        self.tokenizer = AutoTokenizer.from_pretrained(str(path), legacy=True)
        self.encoder = T5EncoderModel.from_pretrained(str(path), torch_dtype=dtype).eval()
        self.max_length = max_length

    def encode_flops(self, prompts: Sequence[str], negative_prompt: Optional[str] = None) -> list[float]:
        """Each image's share of one generation's encodes (`stage_flops.text_encoder_flops`): every prompt
        is padded to `max_length` and every position computes, so each costs the same
        (`stage_flops.t5_encoder_flops`)."""
        one = t5_encoder_flops(self.encoder.config, self.max_length)
        return per_image_shares([one] * len(prompts), one if negative_prompt else 0.0)

    @torch.no_grad()
    def forward(self, prompts: list[str]) -> TextBatch:
        dev = next(self.encoder.parameters()).device
        tok = self.tokenizer(text=prompts, max_length=self.max_length, padding="max_length", truncation=True, return_tensors="pt")
        ids, mask = tok.input_ids.to(dev), tok.attention_mask.to(dev)
        feats = self.encoder(input_ids=ids, attention_mask=mask)["last_hidden_state"].float()
        lens = mask.sum(-1).tolist()
        return pad_batch([f[:n] for f, n in zip(feats, lens)])


class WordTextEncoder(nn.Module):
    """A word-level encoder for tiny and toy models: lowercase words -> ids -> embedding, then
    `layers` pre-norm transformer layers over the prompt.

    Words outside `vocab` hash into `n_hash` extra buckets, so any prompt encodes. The embedding
    is learned with the toy model (and random for the tiny test model).

    `layers` trades a little compute for contextual features, the role flan-t5 plays for the
    released models: with 0, each word's feature is its embedding plus its position only, so the
    image model must itself work out which colour belongs to which noun and which way a relation
    word points; with layers, "red" in "a red circle left of a blue square" can carry that it
    modifies the left-hand object. The layers' output projections start at zero, so adding them
    to a trained encoder changes nothing until they are trained.
    """

    def __init__(self, dim: int, vocab: list[str] = (), n_hash: int = 64, max_len: int = 16, layers: int = 0,
                 heads: int = 4):
        super().__init__()
        self.vocab = {w: i for i, w in enumerate(vocab)}
        self.n_hash, self.max_len = n_hash, max_len
        self.embed = nn.Embedding(len(self.vocab) + n_hash, dim)
        self.pos = nn.Parameter(torch.zeros(max_len, dim))
        self.heads = heads
        self.context = nn.ModuleList(
            nn.TransformerEncoderLayer(dim, heads, dim_feedforward=4 * dim, dropout=0.0, activation="gelu",
                                       batch_first=True, norm_first=True) for _ in range(layers))
        for layer in self.context:  # residual branches start closed: the layer is the identity
            for lin in (layer.self_attn.out_proj, layer.linear2):
                nn.init.zeros_(lin.weight)
                nn.init.zeros_(lin.bias)

    def ids(self, prompt: str) -> list[int]:
        out = []
        for w in re.findall(r"[a-z0-9]+", prompt.lower())[: self.max_len] or ["<empty>"]:
            if w in self.vocab:
                out.append(self.vocab[w])
            else:
                out.append(len(self.vocab) + int(hashlib.sha1(w.encode()).hexdigest(), 16) % self.n_hash)
        return out

    def encode_flops(self, prompts: Sequence[str], negative_prompt: Optional[str] = None) -> list[float]:
        """Each image's share of one generation's encodes (`stage_flops.text_encoder_flops`): the layers
        over the batch's padded length (its longest prompt; `stage_flops.word_encoder_flops`), the
        negative prompt over its own; 0 with no layers (the embedding is a lookup)."""
        if not self.context:
            return [0.0] * len(prompts)
        lay = self.context[0]
        cost = lambda n: word_encoder_flops(self.embed.embedding_dim, len(self.context),  # noqa: E731
                                            lay.linear1.out_features, n)
        lmax = max(len(self.ids(p)) for p in prompts)      # the batch is padded to its longest prompt
        return per_image_shares([cost(lmax)] * len(prompts),
                                cost(len(self.ids(negative_prompt))) if negative_prompt else 0.0)

    def forward(self, prompts: list[str]) -> TextBatch:
        dev = self.embed.weight.device
        feats = []
        for p in prompts:
            ids = torch.tensor(self.ids(p), device=dev)
            feats.append(self.embed(ids) + self.pos[: len(ids)])
        batch = pad_batch(feats)
        if not self.context:
            return batch
        x = batch.features
        for layer in self.context:
            x = layer(x, src_key_padding_mask=~batch.mask)
        return TextBatch(x * batch.mask.unsqueeze(-1), batch.mask, batch.lens)

    def config(self) -> dict:
        """What `from_file` needs besides the state dict."""
        return {"dim": self.embed.embedding_dim, "vocab": list(self.vocab), "n_hash": self.n_hash,
                "max_len": self.max_len, "layers": len(self.context), "heads": self.heads}

    @classmethod
    def from_file(cls, path: str | Path) -> "WordTextEncoder":
        obj = torch.load(path, map_location="cpu", weights_only=True)
        # files written before `layers` existed have none
        enc = cls(dim=obj["dim"], vocab=list(obj["vocab"]), n_hash=obj["n_hash"], max_len=obj["max_len"],
                  layers=obj.get("layers", 0), heads=obj.get("heads", 4))
        load_state_dict_strict(enc, obj["state_dict"], source=f"word text encoder {str(path)!r}")
        return enc
