"""mPLUG visual question answering (``damo/mplug_visual-question-answering_coco_large_en``, DPG-Bench's VQA
model) in plain PyTorch, written from ModelScope's ``modelscope/models/multi_modal/mplug/`` (1.31.0:
``modeling_mplug.py``, ``clip/clip.py``, ``predictor.py``; the VQA preprocessor in
``preprocessors/multi_modal.py``) so that it runs on transformers 5, where ModelScope's code does not build.

What runs, per (image, question), as ModelScope's pipeline runs it:

1. image: RGB, PIL bicubic resize to ``image_res``² (504), [0, 1], OpenAI CLIP mean/std;
2. vision: CLIP ViT (``visual_encoder.visual``: patch conv, class token, positional embedding already
   sized for 504², pre-LN, QuickGELU residual blocks on ``nn.MultiheadAttention``, ``ln_post``; no
   projection: ``skip_last_layer=True``), then ``visn_fc`` + ``visn_layer_norm`` (eps 1e-12) when the
   vision width differs from the text width;
3. question: lower-cased, uncased WordPiece, padded/truncated to 25 tokens;
4. text encoder: BERT (``text_encoder_layers``), bidirectional, -10000 additive padding mask;
5. fusion: ``fusion_layers`` of the BERT config's layers; layer k (counted from the first fusion layer)
   is text self-attention + cross-attention to the image, except every ``stride_layer``-th (k > 0),
   which is self-attention over [image; text] jointly (the image part is then *added* to the image
   states); the decoder attends to [image states; question states];
6. decoder: BERT with cross-attention (``text_decode_layers``) + MLM head, beam search from [CLS] (101):
   5 beams, at most 10 tokens, [SEP] (102) ends, scores length-normalised by ((5 + step) / 6)^0.6,
   re-running the decoder on the whole prefix each step (no cache), as ``predictor.TextGenerator``;
7. answer: the best hypothesis decoded without special tokens.

Weights: the released folder (``pytorch_model.bin``, ``config.yaml``, ``config_bert.json``, ``vocab.txt``),
loaded *strictly by the released names* (after ModelScope's own rename: every ``model.`` removed); keys
the VQA path never reads are named and allowed: CLIP's text tower inside ``visual_encoder``, the
momentum-distillation copies (``*_m``), position-id buffers. Parity with ModelScope's implementation on
tiny random configs: ``tests/fixtures/evaluators/mplug_parity/``.
"""
from __future__ import annotations

import json
import math
import re
from collections import OrderedDict
from pathlib import Path
from typing import Any, Optional, Sequence

import torch
from torch import nn

from varbench.evaluators.weights import resolve_file

PUBLISHED = ("ModelScope hub damo/mplug_visual-question-answering_coco_large_en (pytorch_model.bin, config.yaml, "
             "config_bert.json, vocab.txt; e.g. `modelscope download --model damo/mplug_visual-question-answering_coco_large_en`)")
FILES = ("pytorch_model.bin", "config.yaml", "config_bert.json", "vocab.txt")
MEAN = (0.48145466, 0.4578275, 0.40821073)
STD = (0.26862954, 0.26130258, 0.27577711)
QUESTION_TOKENS = 25          # MPlugPreprocessor(tokenizer_max_length=25)
START, END = 101, 102         # TextGenerator's fixed [CLS] / [SEP] ids
#: checkpoint keys the VQA path never reads (allowed in the file, not built)
UNUSED = (r"^visual_encoder\.(transformer|token_embedding|positional_embedding|ln_final|text_projection|logit_scale)",
          r"^(visual_encoder|text_encoder|fusion_encoder|text_decoder|visn_fc|visn_layer_norm)_m\.",
          r"^text_decoder\.cls\.predictions\.decoder\.bias$",       # tied to cls.predictions.bias
          r"\.pooler\.")


def required_files(folder: Path) -> list[Path]:
    """The released folder's files, each checked to exist (a preflight notes each missing one)."""
    return [resolve_file(str(Path(folder) / f), None, f, what="DPG-Bench VQA model mPLUG-large", published=PUBLISHED)
            for f in FILES]


def read_config(folder: Path) -> tuple[dict, dict]:
    """(config.yaml as a dict with MPlugConfig's defaults, config_bert.json)."""
    import yaml

    defaults = dict(image_res=504, vision_width=1024, clip_name="ViT-L-14", min_length=1, max_length=10, beam_size=5,
                    clip_image_resolution=224, clip_vision_layers=24, clip_vision_width=1024,
                    clip_vision_patch_size=14, bert_config="config_bert.json")
    cfg = {**defaults, **(yaml.safe_load((Path(folder) / "config.yaml").read_text()) or {})}
    bert = json.loads((Path(folder) / cfg["bert_config"]).read_text())
    return cfg, bert


# -- vision: CLIP ViT as clip/clip.py builds it -----------------------------------------------------------
class _LayerNorm(nn.LayerNorm):
    def forward(self, x):
        return super().forward(x).type(x.dtype)


class _QuickGELU(nn.Module):
    def forward(self, x):
        return x * torch.sigmoid(1.702 * x)


class _ResidualAttentionBlock(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.attn = nn.MultiheadAttention(d, heads)
        self.ln_1 = _LayerNorm(d)
        self.mlp = nn.Sequential(OrderedDict([("c_fc", nn.Linear(d, 4 * d)), ("gelu", _QuickGELU()),
                                              ("c_proj", nn.Linear(4 * d, d))]))
        self.ln_2 = _LayerNorm(d)

    def forward(self, x):
        h = self.ln_1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln_2(x))


class _Transformer(nn.Module):
    def __init__(self, width: int, layers: int, heads: int):
        super().__init__()
        self.resblocks = nn.Sequential(*[_ResidualAttentionBlock(width, heads) for _ in range(layers)])

    def forward(self, x):
        return self.resblocks(x)


class VisualTransformer(nn.Module):
    """``clip.VisualTransformer`` with ``skip_last_layer=True`` (``ln_post``, no ``proj`` product)."""

    def __init__(self, image_res: int, patch: int, width: int, layers: int, embed_dim: int):
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, kernel_size=patch, stride=patch, bias=False)
        self.class_embedding = nn.Parameter(torch.zeros(width))
        self.positional_embedding = nn.Parameter(torch.zeros((image_res // patch) ** 2 + 1, width))
        self.ln_pre = _LayerNorm(width)
        self.transformer = _Transformer(width, layers, width // 64)
        self.ln_post = _LayerNorm(width)
        self.proj = nn.Parameter(torch.zeros(width, embed_dim))     # in the checkpoint; unused by VQA

    def forward(self, x):
        x = self.conv1(x)
        x = x.reshape(x.shape[0], x.shape[1], -1).permute(0, 2, 1)
        zeros = torch.zeros(x.shape[0], 1, x.shape[-1], dtype=x.dtype, device=x.device)
        x = torch.cat([self.class_embedding.to(x.dtype) + zeros, x], dim=1)
        x = x + self.positional_embedding.to(x.dtype)[:x.size(1), :]
        x = self.ln_pre(x).permute(1, 0, 2)
        x = self.transformer(x).permute(1, 0, 2)
        return self.ln_post(x)


class _VisualEncoder(nn.Module):
    """Holds ``visual`` under the checkpoint's ``visual_encoder.visual.*`` names."""

    def __init__(self, cfg: dict):
        super().__init__()
        self.visual = VisualTransformer(cfg["image_res"], cfg["clip_vision_patch_size"], cfg["clip_vision_width"],
                                        cfg["clip_vision_layers"], cfg.get("clip_embed_dim", 768))


# -- text: BERT pieces as modeling_mplug.py builds them -----------------------------------------------------
def _act(name: str):
    return {"gelu": nn.GELU(), "relu": nn.ReLU(), "gelu_new": nn.GELU(approximate="tanh")}[name]


class _SelfAttention(nn.Module):
    def __init__(self, c: dict, cross: bool):
        super().__init__()
        self.heads = c["num_attention_heads"]
        self.head = c["hidden_size"] // self.heads
        kv_in = c.get("encoder_width", c["hidden_size"]) if cross else c["hidden_size"]
        self.query = nn.Linear(c["hidden_size"], self.heads * self.head)
        self.key = nn.Linear(kv_in, self.heads * self.head)
        self.value = nn.Linear(kv_in, self.heads * self.head)

    def _split(self, x):
        return x.view(*x.shape[:-1], self.heads, self.head).permute(0, 2, 1, 3)

    def forward(self, h, mask, kv=None, kv_mask=None):
        src, m = (kv, kv_mask) if kv is not None else (h, mask)
        q, k, v = self._split(self.query(h)), self._split(self.key(src)), self._split(self.value(src))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head)
        if m is not None:
            scores = scores + m
        ctx = torch.matmul(nn.Softmax(dim=-1)(scores), v).permute(0, 2, 1, 3).contiguous()
        return ctx.view(*ctx.shape[:-2], self.heads * self.head)


class _AddNorm(nn.Module):
    def __init__(self, c: dict, d_in: int):
        super().__init__()
        self.dense = nn.Linear(d_in, c["hidden_size"])
        self.LayerNorm = nn.LayerNorm(c["hidden_size"], eps=c.get("layer_norm_eps", 1e-12))

    def forward(self, h, residual):
        return self.LayerNorm(self.dense(h) + residual)


class _Attention(nn.Module):
    def __init__(self, c: dict, cross: bool = False):
        super().__init__()
        self.self = _SelfAttention(c, cross)
        self.output = _AddNorm(c, c["hidden_size"])

    def forward(self, h, mask, kv=None, kv_mask=None):
        return self.output(self.self(h, mask, kv, kv_mask), h)


class _Intermediate(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        self.dense = nn.Linear(c["hidden_size"], c["intermediate_size"])
        self.act = _act(c.get("hidden_act", "gelu"))

    def forward(self, h):
        return self.act(self.dense(h))


class _Layer(nn.Module):
    """``BertLayer`` / ``FusionLayer``: self-attention, optional cross-attention, feed-forward."""

    def __init__(self, c: dict, cross: bool):
        super().__init__()
        self.attention = _Attention(c)
        if cross:
            self.crossattention = _Attention(c, cross=True)
        self.intermediate = _Intermediate(c)
        self.output = _AddNorm(c, c["intermediate_size"])

    def forward(self, h, mask, kv=None, kv_mask=None):
        h = self.attention(h, mask)
        if kv is not None:
            h = self.crossattention(h, mask, kv, kv_mask)
        return self.output(self.intermediate(h), h)


class _Embeddings(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        self.word_embeddings = nn.Embedding(c["vocab_size"], c["hidden_size"], padding_idx=c.get("pad_token_id", 0))
        self.position_embeddings = nn.Embedding(c["max_position_embeddings"], c["hidden_size"])
        self.token_type_embeddings = nn.Embedding(c.get("type_vocab_size", 2), c["hidden_size"])
        self.LayerNorm = nn.LayerNorm(c["hidden_size"], eps=c.get("layer_norm_eps", 1e-12))
        self.register_buffer("position_ids", torch.arange(c["max_position_embeddings"]).expand((1, -1)))

    def forward(self, ids):
        n = ids.shape[1]
        tok = torch.zeros(ids.shape, dtype=torch.long, device=ids.device)
        e = self.word_embeddings(ids) + self.token_type_embeddings(tok)
        return self.LayerNorm(e + self.position_embeddings(self.position_ids[:, :n]))


class _Stack(nn.Module):
    def __init__(self, c: dict, n: int, cross: bool):
        super().__init__()
        self.layer = nn.ModuleList([_Layer(c, cross) for _ in range(n)])


class _BertModel(nn.Module):
    """``BertModel(add_pooling_layer=False)``: embeddings + layers."""

    def __init__(self, c: dict, n: int, cross: bool):
        super().__init__()
        self.embeddings = _Embeddings(c)
        self.encoder = _Stack(c, n, cross)


class _FusionModel(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        self.encoder = _Stack(c, c["num_hidden_layers"], cross=True)
        self.start = max(0, c["num_hidden_layers"] - c.get("fusion_layers", c["num_hidden_layers"]))
        self.stride = c.get("stride_layer", 100)

    def forward(self, text, text_mask, image, image_mask):
        for i in range(self.start, len(self.encoder.layer)):
            k, layer = i - self.start, self.encoder.layer[i]
            if k == 0 or k % self.stride != 0:
                text = layer(text, text_mask, image, image_mask)
            else:                     # joint self-attention over [image; text], then split, image added
                joint = layer.attention(torch.cat([image, text], 1), torch.cat([image_mask, text_mask], 3))
                joint = layer.output(layer.intermediate(joint), joint)
                new_image, text = torch.split(joint, (image.shape[1], text.shape[1]), 1)
                image = image + new_image
        return image, text


class _PredictionTransform(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        self.dense = nn.Linear(c["hidden_size"], c["hidden_size"])
        self.act = _act(c.get("hidden_act", "gelu"))
        self.LayerNorm = nn.LayerNorm(c["hidden_size"], eps=c.get("layer_norm_eps", 1e-12))

    def forward(self, h):
        return self.LayerNorm(self.act(self.dense(h)))


class _Predictions(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        self.transform = _PredictionTransform(c)
        self.decoder = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)
        self.bias = nn.Parameter(torch.zeros(c["vocab_size"]))

    def forward(self, h):
        # ModelScope ties decoder.bias to bias: one fused linear, as there
        return nn.functional.linear(self.transform(h), self.decoder.weight, self.bias)


class _Cls(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        self.predictions = _Predictions(c)


class _Decoder(nn.Module):
    """``BertLMHeadModel``: causal BERT with cross-attention + MLM head."""

    def __init__(self, c: dict, n: int):
        super().__init__()
        self.bert = _BertModel(c, n, cross=True)
        self.cls = _Cls(c)

    def forward(self, ids, memory, memory_mask):
        n = ids.shape[1]
        causal = (torch.arange(n, device=ids.device)[None, :] <= torch.arange(n, device=ids.device)[:, None])
        mask = (1.0 - causal.to(memory.dtype))[None, None] * -10000.0
        h = self.bert.embeddings(ids)
        for layer in self.bert.encoder.layer:
            h = layer(h, mask, memory, memory_mask)
        return self.cls.predictions(h)


def _extended(mask: torch.Tensor, dtype) -> torch.Tensor:
    """Self-attention padding mask as BertModel makes it: 0 or -10000."""
    return (1.0 - mask[:, None, None, :].to(dtype)) * -10000.0


def _inverted(mask: torch.Tensor, dtype) -> torch.Tensor:
    """Cross-attention mask as transformers' ``invert_attention_mask`` makes it: 0 or the dtype's minimum."""
    return (1.0 - mask[:, None, None, :].to(dtype)) * torch.finfo(dtype).min


class MPlugVQAModel(nn.Module):
    """The parameters of ``MPlugForVisualQuestionAnswering`` that VQA inference reads, under their names."""

    def __init__(self, cfg: dict, bert: dict):
        super().__init__()
        self.cfg, self.bert_cfg = cfg, bert
        self.visual_encoder = _VisualEncoder(cfg)
        self.large = bert["hidden_size"] != cfg["vision_width"]
        if self.large:
            self.visn_fc = nn.Linear(cfg["vision_width"], bert["hidden_size"])
            self.visn_layer_norm = nn.LayerNorm(bert["hidden_size"], eps=1e-12)
        self.text_encoder = _BertModel(bert, bert["text_encoder_layers"], cross=False)
        self.fusion_encoder = _FusionModel(bert)
        self.text_decoder = _Decoder(bert, bert["text_decode_layers"])

    def image_states(self, pixels: torch.Tensor) -> torch.Tensor:
        x = self.visual_encoder.visual(pixels)
        return self.visn_layer_norm(self.visn_fc(x)) if self.large else x

    def question_states(self, image: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[image; question] states after fusion, and their 0/1 mask (what the decoder attends to)."""
        dtype = image.dtype
        text_mask = _extended(mask, dtype)
        h = self.text_encoder.embeddings(ids)
        for layer in self.text_encoder.encoder.layer:
            h = layer(h, text_mask)
        image_atts = torch.ones(image.shape[:-1], dtype=torch.long, device=image.device)
        img, txt = self.fusion_encoder(h, text_mask, image, _inverted(image_atts, dtype))
        return torch.cat([img, txt], 1), torch.cat([image_atts, mask], 1)

    @torch.no_grad()
    def beam_search(self, states: torch.Tensor, atts: torch.Tensor) -> list[tuple[list[int], float]]:
        """``TextGenerator._fast_translate_batch`` (no sampling, out_size 1): the best (ids, score) per row."""
        beam, max_len, min_len = int(self.cfg["beam_size"]), int(self.cfg["max_length"]), int(self.cfg["min_length"])
        device, batch = states.device, states.shape[0]
        memory = states.repeat_interleave(beam, dim=0)
        memory_mask = _inverted(atts.repeat_interleave(beam, dim=0), states.dtype)
        batch_offset = torch.arange(batch, device=device)
        beam_offset = torch.arange(0, batch * beam, step=beam, device=device)
        alive = torch.full([batch * beam, 1], START, dtype=torch.long, device=device)
        topk_log_probs = torch.tensor([0.0] + [float("-inf")] * (beam - 1), device=device).repeat(batch)
        hypotheses: list[list] = [[] for _ in range(batch)]
        best: list[Optional[tuple]] = [None] * batch
        for step in range(max_len):
            logits = self.text_decoder(alive, memory, memory_mask)[:, -1, :]
            vocab = logits.size(-1)
            log_probs = torch.log(torch.softmax(logits.view(-1, vocab), dim=-1))
            if step < min_len:
                log_probs[:, END] = -1e20
            penalty = ((5.0 + (step + 1)) / 6.0) ** 0.6
            log_probs += topk_log_probs.view(-1).unsqueeze(1)
            scores = (log_probs / penalty).reshape(-1, beam * vocab)
            topk_scores, topk_ids = scores.topk(beam, dim=-1)
            topk_log_probs = topk_scores * penalty
            topk_beam = torch.div(topk_ids, vocab, rounding_mode="floor")
            topk_ids = topk_ids.fmod(vocab)
            batch_index = topk_beam + beam_offset[:topk_beam.size(0)].unsqueeze(1)
            alive = torch.cat([alive.index_select(0, batch_index.view(-1)), topk_ids.view(-1, 1)], -1)
            finished = topk_ids.eq(END)
            if step + 1 == max_len:
                finished.fill_(1)
            end = finished[:, 0].eq(1)
            if finished.any():
                preds = alive.view(-1, beam, alive.size(-1))
                for i in range(finished.size(0)):
                    b = int(batch_offset[i])
                    if end[i]:
                        finished[i].fill_(1)
                    for j in finished[i].nonzero().view(-1):
                        hypotheses[b].append((topk_scores[i, j], preds[i, j, 0:]))
                    if end[i]:
                        s, p = sorted(hypotheses[b], key=lambda x: x[0], reverse=True)[0]
                        best[b] = (p.tolist(), float(s))
                keep = end.eq(0).nonzero().view(-1)
                if len(keep) == 0:
                    break
                topk_log_probs = topk_log_probs.index_select(0, keep)
                batch_index = batch_index.index_select(0, keep)
                batch_offset = batch_offset.index_select(0, keep)
                alive = preds.index_select(0, keep).view(-1, alive.size(-1))
            select = batch_index.view(-1)
            memory = memory.index_select(0, select)
            memory_mask = memory_mask.index_select(0, select)
        return best


def preprocess(image, size: int) -> torch.Tensor:
    """``MPlugPreprocessor``'s image transform: RGB, PIL bicubic to size², [0, 1], CLIP mean/std."""
    import numpy as np
    from PIL import Image

    im = image.convert("RGB").resize((size, size), Image.BICUBIC)
    t = torch.from_numpy(np.asarray(im, dtype=np.float32) / 255.0).permute(2, 0, 1)
    return (t - torch.tensor(MEAN)[:, None, None]) / torch.tensor(STD)[:, None, None]


def map_checkpoint(state: dict) -> tuple[dict, list[str]]:
    """ModelScope's rename (every ``model.`` removed, ``checkpoint['model']``/``['module']`` unwrapped), then
    the keys VQA never reads set aside (``UNUSED``); returns (kept, set aside)."""
    for wrap in ("model", "module"):
        if isinstance(state.get(wrap), dict):
            state = state[wrap]
    renamed = {k.replace("model.", ""): v for k, v in state.items()}
    kept, unused = {}, []
    for k, v in renamed.items():
        (unused.append(k) if any(re.search(p, k) for p in UNUSED) else kept.__setitem__(k, v))
    return kept, unused


class MPlugVQA:
    """Answers questions about images with mPLUG; ``answer(images, questions) -> list[str]``."""

    def __init__(self, folder: Path, device: str = "cpu", batch_size: int = 16):
        from transformers import BertTokenizer

        from varbench.core.filehash import sha256_file
        from varbench.evaluators.weights import load_state_dict, strict_load

        folder = Path(folder)
        ckpt, *_ = required_files(folder)
        cfg, bert = read_config(folder)
        self.model = MPlugVQAModel(cfg, bert)
        kept, self.unused = map_checkpoint(load_state_dict(ckpt, what="mPLUG checkpoint"))
        strict_load(self.model, kept, what="mPLUG checkpoint", path=ckpt, ignore_missing=("position_ids",))
        self.model.eval().to(device)
        self.tokenizer = BertTokenizer.from_pretrained(str(folder), do_lower_case=True)
        self.device, self.batch_size, self.cfg = device, max(int(batch_size), 1), cfg
        self._info = {"vqa": "mplug (varbench native)", "vqa_weights_sha256": sha256_file(ckpt),
                      "vqa_image_res": cfg["image_res"], "beam_size": cfg["beam_size"], "max_length": cfg["max_length"]}
        self._cache: tuple[Any, torch.Tensor] | None = None

    def info(self) -> dict:
        return dict(self._info)

    def _image(self, image) -> torch.Tensor:
        """Vision states of ``image``, reused while the same image object is asked about."""
        if self._cache is None or self._cache[0] is not image:
            pix = preprocess(image, int(self.cfg["image_res"]))[None].to(self.device)
            self._cache = (image, self.model.image_states(pix))
        return self._cache[1]

    @torch.no_grad()
    def answer(self, images: Sequence, questions: Sequence[str]) -> list[str]:
        out: list[str] = []
        for i in range(0, len(questions), self.batch_size):
            imgs, qs = images[i:i + self.batch_size], questions[i:i + self.batch_size]
            tok = self.tokenizer([q.lower() for q in qs], padding="max_length", truncation=True,
                                 max_length=QUESTION_TOKENS, return_tensors="pt")
            image = torch.cat([self._image(im) for im in imgs])
            states, atts = self.model.question_states(image, tok.input_ids.to(self.device),
                                                      tok.attention_mask.to(self.device))
            for ids, _ in self.model.beam_search(states, atts):
                # transformers 4.x's decode default (ModelScope's environment): clean up spaces before punctuation
                out.append(self.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=True))
        return out
