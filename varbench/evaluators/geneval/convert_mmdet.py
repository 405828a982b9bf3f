"""Convert GenEval's mmdet 2.x Mask2Former checkpoint into a transformers `save_pretrained` folder.

GenEval (djghosh13/geneval `evaluation/evaluate_images.py`) scores with the mmdet 2.x checkpoint
`mask2former_swin-s-p4-w7-224_lsj_8x2_50e_coco_20220504_001756-743b7d99.pth`, built from
`configs/mask2former/mask2former_swin-s-p4-w7-224_lsj_8x2_50e_coco.py` (open-mmlab/mmdetection 2.x):
Swin-S backbone (embed 96, depths 2-2-18-2, heads 3-6-12-24, window 7), MSDeformAttn pixel decoder
(6 layers, 256 ch, 3 levels x 4 points, 8 heads), 9-layer masked-attention decoder, 100 queries,
80 COCO thing classes (+1 no-object). The `native` backend of `evaluators/geneval.py` runs the same
network as transformers `Mask2FormerForUniversalSegmentation`; only these weights make its numbers
comparable with published GenEval numbers (the 0.3/0.9 thresholds were tuned on them).

Source key layout (mmdet 2.x module tree; `tests/fixtures/keys/mmdet_mask2former_swin_s.json` lists
every key and shape and says how it was derived):
  backbone.*          mmdet/models/backbones/swin.py + PatchEmbed/PatchMerging (models/utils/transformer.py)
  panoptic_head.pixel_decoder.*        mmdet/models/plugins/msdeformattn_pixel_decoder.py
  panoptic_head.transformer_decoder.*  DetrTransformerDecoder of mmcv 1.x BaseTransformerLayers
  panoptic_head.{query_embed,query_feat,level_embed,cls_embed,mask_embed}.*  mask2former_head.py

What is not a plain rename, and why:
* Swin PatchMerging (`backbone.stages.N.downsample.{reduction.weight,norm.*}`): mmdet gathers the 2x2
  neighbourhood with `nn.Unfold(2, stride 2)`, whose channel index is `c*4 + kh*2 + kw`; HF (like the
  original Swin) concatenates `[x(0::2,0::2), x(1::2,0::2), x(0::2,1::2), x(1::2,1::2)]`, index
  `(kw*2 + kh)*C + c`. The reduction's input columns and the LayerNorm's weight/bias are permuted by
  `merge_permutation` (the inverse of mmdet's own `swin_converter` fix-up).
* Fused projections: Swin `attn.w_msa.qkv` ([q; k; v] rows, heads contiguous inside each) and the
  decoder *self*-attention's `attentions.1.attn.in_proj_*` (torch `nn.MultiheadAttention`, wrapped by
  mmcv) are split into HF `q_proj/k_proj/v_proj`. The decoder *cross*-attention is an
  `nn.MultiheadAttention` on both sides and is copied fused.
* mmcv's BaseTransformerLayer numbers attentions/norms in `operation_order`: decoder
  ('cross_attn','norm','self_attn','norm','ffn','norm') -> attentions.0 = cross, attentions.1 = self,
  norms.0/1/2 = after cross/self/ffn; pixel-decoder encoder ('self_attn','norm','ffn','norm').
* `relative_position_index` (persistent buffer in mmdet, non-persistent and recomputed in HF) is
  dropped, after checking it equals the standard Swin index (`swin_relative_position_index`).
* Class logits: mmdet `cls_embed` and HF `class_predictor` both put the no-object logit last
  (mmdet's instance post-processing keeps `softmax(...)[:, :-1]`; HF's loss weights `empty_weight[-1]`
  as no-object), and both order the 80 classes as COCO's thing classes, so it is copied as is.
* HF-only tensors, filled with neutral values and listed in `HF_ONLY`: the Swin model's final
  `layernorm` (unused by `SwinBackbone`, which normalises each stage with `hidden_states_norms`) and the
  loss buffer `criterion.empty_weight` (ones, no-object weight last, as HF initialises it).

Everything else is strict: `convert_state_dict` raises one `ConversionError` naming every source key
it could not map, every HF key left unfilled and every shape mismatch.

CLI: `python -m varbench.evaluators.geneval_convert_mmdet SRC.pth OUT_DIR [--config-json J]` writes
`OUT_DIR/{config.json, model.safetensors, conversion.json}`; `conversion.json` records the source's
sha256 and name, its mmdet meta (version, CLASSES) when present, and `CONVERTER_VERSION`.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Optional

import torch

CONVERTER_VERSION = "1"
MMDET_CHECKPOINT = "mask2former_swin-s-p4-w7-224_lsj_8x2_50e_coco_20220504_001756-743b7d99.pth"
MMDET_CONFIG = "configs/mask2former/mask2former_swin-s-p4-w7-224_lsj_8x2_50e_coco.py (open-mmlab/mmdetection 2.x)"

_BB = "model.pixel_level_module.encoder."       # HF SwinBackbone
_PD = "model.pixel_level_module.decoder."       # HF Mask2FormerPixelDecoder
_TM = "model.transformer_module."               # HF Mask2FormerTransformerModule

# Source keys dropped on purpose (each is value-checked before it is dropped).
KNOWN_SOURCE_ONLY = (r"backbone\.stages\.\d+\.blocks\.\d+\.attn\.w_msa\.relative_position_index",)
# HF keys with no mmdet counterpart: name -> why, and how they are filled.
HF_ONLY = {
    _BB + "swin.layernorm.weight": "SwinModel's final norm; SwinBackbone never uses it (filled with ones)",
    _BB + "swin.layernorm.bias": "SwinModel's final norm; SwinBackbone never uses it (filled with zeros)",
    "criterion.empty_weight": "loss-only class weights (filled as HF does: ones, no_object_weight last)",
}


class ConversionError(ValueError):
    """The source state dict does not match the mmdet Mask2Former layout for the requested config."""


# ---------------------------------------------------------------------------------------------------
# config
def build_hf_config(num_labels: int = 80, id2label: Optional[Mapping[int, str]] = None,
                    backbone: Optional[Mapping[str, Any]] = None, **overrides):
    """`Mask2FormerConfig` of GenEval's detector (Swin-S, 80 COCO classes); keyword overrides shrink it.

    `backbone` overrides `SwinConfig` fields (tests use a tiny Swin); other keywords override
    `Mask2FormerConfig` fields. The defaults equal the mmdet config's values, which are also the
    values of HF's `facebook/mask2former-swin-small-coco-instance` (decoder_layers=10 in HF means the
    9 mmdet layers: HF counts the initial mask prediction as a layer).
    """
    from transformers import Mask2FormerConfig, SwinConfig

    from varbench.evaluators.geneval.rules import COCO80_GENEVAL

    bb = dict(embed_dim=96, depths=[2, 2, 18, 2], num_heads=[3, 6, 12, 24], window_size=7, mlp_ratio=4.0,
              drop_path_rate=0.3, qkv_bias=True, image_size=224, patch_size=4, hidden_act="gelu",
              use_absolute_embeddings=False, out_features=["stage1", "stage2", "stage3", "stage4"])
    bb.update(backbone or {})
    if id2label is None:
        id2label = dict(enumerate(COCO80_GENEVAL)) if num_labels == 80 else {i: f"class_{i}" for i in range(num_labels)}
    kw = dict(feature_size=256, mask_feature_size=256, hidden_dim=256, encoder_feedforward_dim=1024,
              dim_feedforward=2048, encoder_layers=6, decoder_layers=10, num_attention_heads=8, num_queries=100,
              activation_function="relu", pre_norm=False, enforce_input_projection=False, common_stride=4,
              feature_strides=[4, 8, 16, 32], no_object_weight=0.1, use_pretrained_backbone=False)
    kw.update(overrides)
    cfg = Mask2FormerConfig(backbone_config=SwinConfig(**bb), num_labels=num_labels,
                            id2label={int(k): v for k, v in id2label.items()},
                            label2id={v: int(k) for k, v in id2label.items()}, **kw)
    _check_supported(cfg)
    return cfg


def _check_supported(cfg) -> None:
    """Architectural choices the mmdet model fixes; a config outside them cannot be a conversion target."""
    bb = cfg.backbone_config
    problems = []
    if cfg.feature_size != cfg.hidden_dim:
        problems.append(f"feature_size ({cfg.feature_size}) != hidden_dim ({cfg.hidden_dim}): mmdet uses one feat_channels")
    if cfg.enforce_input_projection or cfg.pre_norm:
        problems.append("enforce_input_projection/pre_norm must be False (mmdet: Identity input projs, post-norm layers)")
    if len(bb.depths) != 4 or list(bb.out_features) != ["stage1", "stage2", "stage3", "stage4"]:
        problems.append("backbone must have 4 stages, all four as out_features (mmdet out_indices=(0,1,2,3))")
    if list(cfg.feature_strides) != [4, 8, 16, 32] or cfg.common_stride != 4:
        problems.append("feature_strides [4,8,16,32] and common_stride 4 (one FPN level) are what mmdet builds")
    if problems:
        raise ConversionError("unsupported Mask2Former config for mmdet conversion: " + "; ".join(problems))


# ---------------------------------------------------------------------------------------------------
# tensor transforms
def merge_permutation(channels: int) -> torch.Tensor:
    """Index `p` with `hf[..., h] = mmdet[..., p[h]]` for the 4*channels PatchMerging features.

    HF position h = j*C + c takes neighbour j = kw*2 + kh (order (0,0),(1,0),(0,1),(1,1) as (kh, kw));
    mmdet's nn.Unfold puts that value at c*4 + kh*2 + kw.
    """
    j = torch.arange(4).repeat_interleave(channels)
    c = torch.arange(channels).repeat(4)
    kh, kw = j % 2, j // 2
    return c * 4 + kh * 2 + kw


def swin_relative_position_index(window: int) -> torch.Tensor:
    """Standard Swin relative-position index (ws*ws, ws*ws): (dh + ws-1) * (2ws-1) + (dw + ws-1)."""
    ys, xs = torch.meshgrid(torch.arange(window), torch.arange(window), indexing="ij")
    ys, xs = ys.flatten(), xs.flatten()
    dh = ys[:, None] - ys[None, :] + window - 1
    dw = xs[:, None] - xs[None, :] + window - 1
    return dh * (2 * window - 1) + dw


def _split3(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if t.shape[0] % 3:
        raise ConversionError(f"fused q/k/v tensor of shape {tuple(t.shape)} has a first dim not divisible by 3")
    return tuple(x.clone() for x in t.chunk(3, dim=0))  # type: ignore[return-value]


# ---------------------------------------------------------------------------------------------------
# key rules: (source regex, function(match, tensor) -> iterable of (hf_key, tensor))
Rule = tuple["re.Pattern[str]", Callable[[re.Match, torch.Tensor], Iterator[tuple[str, torch.Tensor]]]]


def _rename(template: str, first: Optional[Callable[[int], int]] = None):
    """Rename by `template.format(*groups)`; `first` re-numbers the first group (e.g. norm0 -> stage1)."""
    def f(m: re.Match, t: torch.Tensor):
        g = list(m.groups())
        if first is not None:
            g[0] = str(first(int(g[0])))
        yield template.format(*g), t
    return f


def _qkv(prefix_tmpl: str, names=("q_proj", "k_proj", "v_proj")):
    def f(m: re.Match, t: torch.Tensor):
        *g, kind = m.groups()
        prefix = prefix_tmpl.format(*g)
        for name, part in zip(names, _split3(t)):
            yield f"{prefix}.{name}.{kind}", part
    return f


def _merge(template: str):
    def f(m: re.Match, t: torch.Tensor):
        four_c = t.shape[-1]
        if four_c % 4:
            raise ConversionError(f"{m.string}: last dim {four_c} is not 4*C")
        yield template.format(*m.groups()), t[..., merge_permutation(four_c // 4)].clone()
    return f


def _rules() -> list[Rule]:
    blk = r"backbone\.stages\.(\d+)\.blocks\.(\d+)\."
    hblk = _BB + "swin.encoder.layers.{0}.blocks.{1}."
    enc = r"panoptic_head\.pixel_decoder\.encoder\.layers\.(\d+)\."
    henc = _PD + "encoder.layers.{0}."
    dec = r"panoptic_head\.transformer_decoder\.layers\.(\d+)\."
    hdec = _TM + "decoder.layers.{0}."
    wb = r"(weight|bias)"
    table = [
        # --- Swin backbone
        (r"backbone\.patch_embed\.projection\." + wb, _rename(_BB + "swin.embeddings.patch_embeddings.projection.{0}")),
        (r"backbone\.patch_embed\.norm\." + wb, _rename(_BB + "swin.embeddings.norm.{0}")),
        (blk + r"norm1\." + wb, _rename(hblk + "layernorm_before.{2}")),
        (blk + r"norm2\." + wb, _rename(hblk + "layernorm_after.{2}")),
        (blk + r"attn\.w_msa\.qkv\." + wb, _qkv(hblk + "attention")),
        (blk + r"attn\.w_msa\.proj\." + wb, _rename(hblk + "attention.o_proj.{2}")),
        (blk + r"attn\.w_msa\.relative_position_bias_table",
         _rename(hblk + "attention.relative_position_bias.relative_position_bias_table")),
        (blk + r"ffn\.layers\.0\.0\." + wb, _rename(hblk + "mlp.fc1.{2}")),
        (blk + r"ffn\.layers\.1\." + wb, _rename(hblk + "mlp.fc2.{2}")),
        (r"backbone\.stages\.(\d+)\.downsample\.reduction\.weight",
         _merge(_BB + "swin.encoder.layers.{0}.downsample.reduction.weight")),
        (r"backbone\.stages\.(\d+)\.downsample\.norm\." + wb, _merge(_BB + "swin.encoder.layers.{0}.downsample.norm.{1}")),
        (r"backbone\.norm(\d)\." + wb, _rename(_BB + "hidden_states_norms.stage{0}.{1}", first=lambda i: i + 1)),
        # --- pixel decoder (input_convs[i] is encoder level i, lowest resolution first, as HF input_projections)
        (r"panoptic_head\.pixel_decoder\.input_convs\.(\d+)\.conv\." + wb, _rename(_PD + "input_projections.{0}.0.{1}")),
        (r"panoptic_head\.pixel_decoder\.input_convs\.(\d+)\.gn\." + wb, _rename(_PD + "input_projections.{0}.1.{1}")),
        (enc + r"attentions\.0\.(sampling_offsets|attention_weights|value_proj|output_proj)\." + wb,
         _rename(henc + "self_attn.{1}.{2}")),
        (enc + r"ffns\.0\.layers\.0\.0\." + wb, _rename(henc + "fc1.{1}")),
        (enc + r"ffns\.0\.layers\.1\." + wb, _rename(henc + "fc2.{1}")),
        (enc + r"norms\.0\." + wb, _rename(henc + "self_attn_layer_norm.{1}")),
        (enc + r"norms\.1\." + wb, _rename(henc + "final_layer_norm.{1}")),
        (r"panoptic_head\.pixel_decoder\.level_encoding\.weight", _rename(_PD + "level_embed")),
        # mmdet's forward applies lateral_convs[i]/output_convs[i] to backbone level i -> HF adapter_{i+1}/layer_{i+1}
        (r"panoptic_head\.pixel_decoder\.lateral_convs\.(\d+)\.conv\.weight",
         _rename(_PD + "adapter_{0}.0.weight", first=lambda i: i + 1)),
        (r"panoptic_head\.pixel_decoder\.lateral_convs\.(\d+)\.gn\." + wb,
         _rename(_PD + "adapter_{0}.1.{1}", first=lambda i: i + 1)),
        (r"panoptic_head\.pixel_decoder\.output_convs\.(\d+)\.conv\.weight",
         _rename(_PD + "layer_{0}.0.weight", first=lambda i: i + 1)),
        (r"panoptic_head\.pixel_decoder\.output_convs\.(\d+)\.gn\." + wb,
         _rename(_PD + "layer_{0}.1.{1}", first=lambda i: i + 1)),
        (r"panoptic_head\.pixel_decoder\.mask_feature\." + wb, _rename(_PD + "mask_projection.{0}")),
        # --- masked-attention decoder: attentions.0 = cross (fused in HF too), attentions.1 = self (split)
        (dec + r"attentions\.0\.attn\.in_proj_(weight|bias)", _rename(hdec + "cross_attn.in_proj_{1}")),
        (dec + r"attentions\.0\.attn\.out_proj\." + wb, _rename(hdec + "cross_attn.out_proj.{1}")),
        (dec + r"attentions\.1\.attn\.in_proj_(weight|bias)", _qkv(hdec + "self_attn")),
        (dec + r"attentions\.1\.attn\.out_proj\." + wb, _rename(hdec + "self_attn.out_proj.{1}")),
        (dec + r"norms\.0\." + wb, _rename(hdec + "cross_attn_layer_norm.{1}")),
        (dec + r"norms\.1\." + wb, _rename(hdec + "self_attn_layer_norm.{1}")),
        (dec + r"norms\.2\." + wb, _rename(hdec + "final_layer_norm.{1}")),
        (dec + r"ffns\.0\.layers\.0\.0\." + wb, _rename(hdec + "fc1.{1}")),
        (dec + r"ffns\.0\.layers\.1\." + wb, _rename(hdec + "fc2.{1}")),
        (r"panoptic_head\.transformer_decoder\.post_norm\." + wb, _rename(_TM + "decoder.layernorm.{0}")),
        (r"panoptic_head\.query_embed\.weight", _rename(_TM + "queries_embedder.weight")),
        (r"panoptic_head\.query_feat\.weight", _rename(_TM + "queries_features.weight")),
        (r"panoptic_head\.level_embed\.weight", _rename(_TM + "level_embed.weight")),
        (r"panoptic_head\.mask_embed\.([024])\." + wb,  # Sequential(Linear, ReLU, Linear, ReLU, Linear)
         _rename(_TM + "decoder.mask_predictor.mask_embedder.{0}.0.{1}", first=lambda i: i // 2)),
        (r"panoptic_head\.cls_embed\." + wb, _rename("class_predictor.{0}")),
    ]
    return [(re.compile(p + r"$"), f) for p, f in table]


_RULES = _rules()
_SOURCE_ONLY = [re.compile(p + r"$") for p in KNOWN_SOURCE_ONLY]


# ---------------------------------------------------------------------------------------------------
# expected key sets
def expected_hf_shapes(config) -> dict[str, tuple[int, ...]]:
    """Every `state_dict` key of `Mask2FormerForUniversalSegmentation(config)` with its shape (meta build)."""
    from transformers import Mask2FormerForUniversalSegmentation

    with torch.device("meta"):
        model = Mask2FormerForUniversalSegmentation(config)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def expected_mmdet_shapes(config) -> dict[str, tuple[int, ...]]:
    """The mmdet 2.x checkpoint keys (and shapes) of the network `config` describes, in mmdet naming.

    Used to build random test checkpoints of any size; for `build_hf_config()` it must equal the
    hand-derived fixture `tests/fixtures/keys/mmdet_mask2former_swin_s.json`.
    """
    bb = config.backbone_config
    C, ws, mlp = bb.embed_dim, bb.window_size, bb.mlp_ratio
    F_, D, M = config.feature_size, config.hidden_dim, config.mask_feature_size
    H, Q = config.num_attention_heads, config.num_queries
    s: dict[str, tuple[int, ...]] = {}

    def lin(k, o, i, bias=True):
        s[k + ".weight"] = (o, i)
        if bias:
            s[k + ".bias"] = (o,)

    def norm(k, n):
        s[k + ".weight"], s[k + ".bias"] = (n,), (n,)

    s["backbone.patch_embed.projection.weight"] = (C, bb.num_channels, bb.patch_size, bb.patch_size)
    s["backbone.patch_embed.projection.bias"] = (C,)
    norm("backbone.patch_embed.norm", C)
    for i, (depth, heads) in enumerate(zip(bb.depths, bb.num_heads)):
        c = C * 2 ** i
        for j in range(depth):
            p = f"backbone.stages.{i}.blocks.{j}."
            norm(p + "norm1", c)
            s[p + "attn.w_msa.relative_position_bias_table"] = ((2 * ws - 1) ** 2, heads)
            s[p + "attn.w_msa.relative_position_index"] = (ws * ws, ws * ws)
            lin(p + "attn.w_msa.qkv", 3 * c, c)
            lin(p + "attn.w_msa.proj", c, c)
            norm(p + "norm2", c)
            lin(p + "ffn.layers.0.0", int(mlp * c), c)
            lin(p + "ffn.layers.1", c, int(mlp * c))
        if i < len(bb.depths) - 1:
            norm(f"backbone.stages.{i}.downsample.norm", 4 * c)
            lin(f"backbone.stages.{i}.downsample.reduction", 2 * c, 4 * c, bias=False)
    for i in range(len(bb.depths)):
        norm(f"backbone.norm{i}", C * 2 ** i)
    in_ch = [C * 2 ** i for i in range(len(bb.depths))]
    pd = "panoptic_head.pixel_decoder."
    for k, i in enumerate(reversed(range(len(in_ch) - 3, len(in_ch)))):
        s[f"{pd}input_convs.{k}.conv.weight"], s[f"{pd}input_convs.{k}.conv.bias"] = (F_, in_ch[i], 1, 1), (F_,)
        norm(f"{pd}input_convs.{k}.gn", F_)
    for l in range(config.encoder_layers):
        p = f"{pd}encoder.layers.{l}."
        lin(p + "attentions.0.sampling_offsets", H * 3 * 4 * 2, F_)
        lin(p + "attentions.0.attention_weights", H * 3 * 4, F_)
        lin(p + "attentions.0.value_proj", F_, F_)
        lin(p + "attentions.0.output_proj", F_, F_)
        lin(p + "ffns.0.layers.0.0", config.encoder_feedforward_dim, F_)
        lin(p + "ffns.0.layers.1", F_, config.encoder_feedforward_dim)
        norm(p + "norms.0", F_)
        norm(p + "norms.1", F_)
    s[pd + "level_encoding.weight"] = (3, F_)
    s[pd + "lateral_convs.0.conv.weight"] = (F_, in_ch[0], 1, 1)
    norm(pd + "lateral_convs.0.gn", F_)
    s[pd + "output_convs.0.conv.weight"] = (F_, F_, 3, 3)
    norm(pd + "output_convs.0.gn", F_)
    s[pd + "mask_feature.weight"], s[pd + "mask_feature.bias"] = (M, F_, 1, 1), (M,)
    for l in range(config.decoder_layers - 1):
        p = f"panoptic_head.transformer_decoder.layers.{l}."
        for a in (0, 1):
            s[p + f"attentions.{a}.attn.in_proj_weight"], s[p + f"attentions.{a}.attn.in_proj_bias"] = (3 * D, D), (3 * D,)
            lin(p + f"attentions.{a}.attn.out_proj", D, D)
        lin(p + "ffns.0.layers.0.0", config.dim_feedforward, D)
        lin(p + "ffns.0.layers.1", D, config.dim_feedforward)
        for n in range(3):
            norm(p + f"norms.{n}", D)
    norm("panoptic_head.transformer_decoder.post_norm", D)
    s["panoptic_head.query_embed.weight"] = (Q, D)
    s["panoptic_head.query_feat.weight"] = (Q, D)
    s["panoptic_head.level_embed.weight"] = (3, D)
    lin("panoptic_head.cls_embed", config.num_labels + 1, D)
    lin("panoptic_head.mask_embed.0", D, D)
    lin("panoptic_head.mask_embed.2", D, D)
    lin("panoptic_head.mask_embed.4", M, D)
    return s


# ---------------------------------------------------------------------------------------------------
def convert_state_dict(mmdet_sd: Mapping[str, torch.Tensor], config=None) -> dict[str, torch.Tensor]:
    """mmdet 2.x Mask2Former state dict -> `Mask2FormerForUniversalSegmentation(config).state_dict()`.

    Pure (inputs untouched). `config` defaults to `build_hf_config()` (GenEval's Swin-S). Raises one
    `ConversionError` listing every unmapped source key, every unfilled HF key and every shape mismatch.
    """
    config = config if config is not None else build_hf_config()
    _check_supported(config)
    expected = expected_hf_shapes(config)
    out: dict[str, torch.Tensor] = {}
    origin: dict[str, str] = {}  # HF key -> source key, for error messages
    unmapped, bad_buffers, dup = [], [], []
    for key, tensor in mmdet_sd.items():
        if any(p.match(key) for p in _SOURCE_ONLY):
            n = int(round(tensor.shape[0] ** 0.5)) if tensor.dim() == 2 else -1
            if tensor.dim() != 2 or n * n != tensor.shape[0] or not torch.equal(
                    tensor.to("cpu", torch.long), swin_relative_position_index(n)):
                bad_buffers.append(key)
            continue
        for pattern, fn in _RULES:
            m = pattern.match(key)
            if m:
                for hk, ht in fn(m, tensor):
                    if hk in out:
                        dup.append(f"{origin[hk]} and {key} -> {hk}")
                    out[hk], origin[hk] = ht, key
                break
        else:
            unmapped.append(key)
    for hk in HF_ONLY:
        if hk in expected and hk not in out:
            out[hk] = _hf_only_value(hk, expected[hk], config)
    produced_unknown = sorted(f"{origin[k]} -> {k}" for k in out if k not in expected)
    missing = sorted(k for k in expected if k not in out)
    mismatched = sorted(f"{origin.get(k, '(HF-only)')} -> {k}: got {tuple(out[k].shape)}, HF expects {expected[k]}"
                        for k in out if k in expected and tuple(out[k].shape) != expected[k])
    problems = []
    if unmapped:
        problems.append(f"{len(unmapped)} source key(s) with no mapping: {sorted(unmapped)}")
    if produced_unknown:
        problems.append(f"{len(produced_unknown)} source key(s) map to HF keys this config lacks (more layers/stages "
                        f"than the config?): {produced_unknown}")
    if missing:
        problems.append(f"{len(missing)} HF key(s) left unfilled (source lacks them?): {missing}")
    if mismatched:
        problems.append(f"{len(mismatched)} shape mismatch(es): {mismatched}")
    if bad_buffers:
        problems.append(f"relative_position_index differs from the standard Swin index (not the expected "
                        f"backbone): {sorted(bad_buffers)}")
    if dup:
        problems.append(f"HF key(s) written twice: {sorted(dup)}")
    if problems:
        raise ConversionError("mmdet -> HF Mask2Former conversion failed; " + " | ".join(problems) +
                              f". Expected source: {MMDET_CHECKPOINT} ({MMDET_CONFIG}); for another size pass a "
                              f"matching config (CLI: --config-json).")
    return {k: out[k].contiguous() for k in expected}


def _hf_only_value(key: str, shape, config) -> torch.Tensor:
    if key == "criterion.empty_weight":
        w = torch.ones(shape)
        w[-1] = config.no_object_weight
        return w
    return torch.ones(shape) if key.endswith("weight") else torch.zeros(shape)


# ---------------------------------------------------------------------------------------------------
# files
def load_mmdet_checkpoint(path: Path, trust_pickle: bool = False) -> tuple[dict[str, torch.Tensor], dict]:
    """(state_dict, meta) from an mmdet `.pth` (a bare state dict or `{"state_dict": ..., "meta": ...}`).

    `weights_only=True` by default (no arbitrary code from the pickle); `trust_pickle` lifts that for
    files whose `meta` holds objects the safe loader rejects.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"mmdet checkpoint {str(path)!r} not found. GenEval's is {MMDET_CHECKPOINT}, published at "
                                f"https://download.openmmlab.com/mmdetection/v2.0/mask2former/"
                                f"mask2former_swin-s-p4-w7-224_lsj_8x2_50e_coco/{MMDET_CHECKPOINT}")
    try:
        obj = torch.load(str(path), map_location="cpu", weights_only=not trust_pickle)
    except Exception as e:  # noqa: BLE001 - re-raised with the fix named
        if trust_pickle:
            raise
        raise ConversionError(f"torch.load(weights_only=True) refused {str(path)!r} ({type(e).__name__}: {e}). If the "
                              f"file is from a source you trust, rerun with --trust-pickle.") from e
    meta = {}
    if isinstance(obj, Mapping) and "state_dict" in obj:
        meta = dict(obj.get("meta") or {})
        obj = obj["state_dict"]
    if not isinstance(obj, Mapping) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise ConversionError(f"{str(path)!r} holds no tensor state dict (top-level or under 'state_dict').")
    return dict(obj), meta


def convert_checkpoint(src: Path, out_dir: Path, config=None, trust_pickle: bool = False) -> dict:
    """Convert `src` and write `out_dir` (save_pretrained safetensors + conversion.json); returns that record."""
    from transformers import Mask2FormerForUniversalSegmentation

    from varbench.evaluators.weights import sha256_file

    sd, meta = load_mmdet_checkpoint(src, trust_pickle)
    classes = meta.get("CLASSES")
    if config is None:
        id2label = dict(enumerate(classes)) if classes and len(classes) == 80 else None
        config = build_hf_config(id2label=id2label)
    if classes is not None and len(classes) != config.num_labels:
        raise ConversionError(f"{str(src)!r} meta lists {len(classes)} CLASSES but the target config has "
                              f"{config.num_labels} labels; GenEval needs the 80-class COCO instance model.")
    hf_sd = convert_state_dict(sd, config)
    model = Mask2FormerForUniversalSegmentation(config)
    from varbench.engine.checkpoints import load_state_dict_strict

    load_state_dict_strict(model, hf_sd, source=f"{str(src)!r} converted", error=ConversionError,
                           hint="the converter and the target config disagree; report it with the file's sha256.")
    out_dir = Path(out_dir)
    model.eval().save_pretrained(str(out_dir), safe_serialization=True)
    record = {"converter": "evaluators/geneval_convert_mmdet.py", "converter_version": CONVERTER_VERSION,
              "source_file": Path(src).name, "source_sha256": sha256_file(Path(src)),
              "source_num_tensors": len(sd), "expected_source": MMDET_CHECKPOINT,
              "mmdet_version": meta.get("mmdet_version"), "mmdet_classes": list(classes) if classes else None,
              "dropped_source_keys": list(KNOWN_SOURCE_ONLY), "hf_only_keys": HF_ONLY}
    (out_dir / "conversion.json").write_text(json.dumps(record, indent=1))
    return record


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m varbench.evaluators.geneval_convert_mmdet", description=__doc__.split("\n")[0])
    ap.add_argument("src", type=Path, help=f"mmdet .pth (GenEval: {MMDET_CHECKPOINT})")
    ap.add_argument("out_dir", type=Path, help="output folder for save_pretrained (+ conversion.json)")
    ap.add_argument("--config-json", type=Path, default=None,
                    help="JSON of build_hf_config keyword overrides, e.g. {\"backbone\": {\"embed_dim\": 32}, "
                         "\"hidden_dim\": 64}; default: GenEval's Swin-S")
    ap.add_argument("--trust-pickle", action="store_true", help="torch.load with weights_only=False (trusted files only)")
    a = ap.parse_args(argv)
    cfg = build_hf_config(**json.loads(a.config_json.read_text())) if a.config_json else None
    rec = convert_checkpoint(a.src, a.out_dir, cfg, a.trust_pickle)
    print(f"wrote {a.out_dir} (source sha256 {rec['source_sha256']}, converter v{CONVERTER_VERSION})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
