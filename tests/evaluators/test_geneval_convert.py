"""mmdet Mask2Former -> transformers conversion (evaluators/geneval_convert_mmdet.py).

No real checkpoint exists here, so the tests prove: the converter's idea of the mmdet key layout equals
the hand-derived fixture; a fixture-shaped state dict fills every HF Swin-S key; and each non-rename
transform reproduces the mmdet computation numerically on tiny random weights (reference forwards below
are written from mmdet/mmcv's module semantics, with torch's own nn.MultiheadAttention standing in for
mmcv's wrapper, which is exactly what mmcv calls).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from varbench.core.resources import TINY_SCORERS_DIR
from varbench.evaluators.geneval.convert_mmdet import (CONVERTER_VERSION, HF_ONLY, ConversionError, build_hf_config,
                                              convert_state_dict, expected_hf_shapes, expected_mmdet_shapes, main,
                                              merge_permutation, swin_relative_position_index)

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "keys" / "mmdet_mask2former_swin_s.json"
TINY = dict(backbone=dict(embed_dim=16, depths=[1, 1, 2, 1], num_heads=[1, 1, 2, 2], window_size=7, image_size=64),
            hidden_dim=32, feature_size=32, mask_feature_size=32, encoder_layers=1, decoder_layers=3, num_queries=12,
            encoder_feedforward_dim=64, dim_feedforward=64, num_attention_heads=2)


def _random_mmdet_sd(cfg, seed=0):
    g = torch.Generator().manual_seed(seed)
    ws = cfg.backbone_config.window_size
    return {k: swin_relative_position_index(ws) if k.endswith("relative_position_index") else torch.randn(s, generator=g)
            for k, s in expected_mmdet_shapes(cfg).items()}


@pytest.fixture(scope="module")
def tiny():
    cfg = build_hf_config(**TINY)
    src = _random_mmdet_sd(cfg)
    return cfg, src, convert_state_dict(src, cfg)


def _sub(sd, prefix):
    return {k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)}


# --------------------------------------------------------------------------------------------- keys
def test_fixture_equals_converter_layout_for_swin_s():
    fx = json.loads(FIXTURE.read_text())
    assert "mmdetection" in fx["source"] and fx["num_tensors"] == len(fx["keys"]) == 649
    got = {k: list(v) for k, v in expected_mmdet_shapes(build_hf_config()).items()}
    assert list(got) == list(fx["keys"]) and got == fx["keys"]


def test_fixture_checkpoint_fills_every_hf_swin_s_key():
    cfg = build_hf_config()
    assert cfg.backbone_config.depths == [2, 2, 18, 2] and cfg.num_labels == 80 and cfg.id2label[0] == "person"
    fx = json.loads(FIXTURE.read_text())["keys"]
    # torch.empty: shapes are what is under test; the one value-checked buffer gets its real value
    src = {k: swin_relative_position_index(7) if k.endswith("relative_position_index") else torch.empty(s)
           for k, s in fx.items()}
    hf = convert_state_dict(src, cfg)
    want = expected_hf_shapes(cfg)
    assert list(hf) == list(want) and all(tuple(hf[k].shape) == want[k] for k in want)
    # every source parameter lands in HF exactly once: element counts agree up to HF-only/dropped tensors
    n_src = sum(math.prod(s) for k, s in fx.items() if not k.endswith("relative_position_index"))
    n_hf = sum(math.prod(s) for k, s in want.items() if k not in HF_ONLY)
    assert n_src == n_hf == 68_739_547


# ----------------------------------------------------------------------------------- pitfall 1
def _mmdet_patch_merging(x, hw, norm_w, norm_b, red_w):
    """mmdet PatchMerging: nn.Unfold(2, stride 2) gathers (C, kh, kw)-ordered features, then LN, Linear."""
    B, L, C = x.shape
    x = x.view(B, *hw, C).permute(0, 3, 1, 2)
    x = F.unfold(x, kernel_size=2, stride=2).transpose(1, 2)
    return F.linear(F.layer_norm(x, (4 * C,), norm_w, norm_b), red_w)


def test_patch_merging_matches_unfold_reference(tiny):
    from transformers.models.swin.modeling_swin import SwinPatchMerging

    cfg, src, hf = tiny
    C = cfg.backbone_config.embed_dim * 2  # stage 1 -> 2 merge
    m = SwinPatchMerging(dim=C)
    m.load_state_dict(_sub(hf, "model.pixel_level_module.encoder.swin.encoder.layers.1.downsample."))
    x = torch.randn(2, 6 * 4, C)
    p = "backbone.stages.1.downsample."
    ref = _mmdet_patch_merging(x, (6, 4), src[p + "norm.weight"], src[p + "norm.bias"], src[p + "reduction.weight"])
    with torch.no_grad():
        out = m(x, (6, 4))
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
        # not vacuous: without the permutation the outputs differ
        m.reduction.weight.copy_(src[p + "reduction.weight"])
        m.norm.weight.copy_(src[p + "norm.weight"])
        m.norm.bias.copy_(src[p + "norm.bias"])
        assert not torch.allclose(m(x, (6, 4)), ref, atol=1e-3)
    assert sorted(merge_permutation(3).tolist()) == list(range(12))


# -------------------------------------------------------------------------------- pitfalls 2, 3
def _mmdet_rel_index(ws):
    """mmdet WindowMSA's index ('double_step_seq' + flip), written from its definition in swin.py."""
    seq = (torch.arange(0, (2 * ws - 1) * ws, 2 * ws - 1)[:, None] + torch.arange(ws)[None, :]).reshape(1, -1)
    return (seq + seq.T).flip(1)


def test_relative_position_index_that_is_dropped_equals_hf_recomputed():
    from transformers.models.swin.modeling_swin import SwinRelativePositionBias

    for ws in (3, 7, 12):
        hf_index = SwinRelativePositionBias(1, (ws, ws)).relative_position_index.view(ws * ws, ws * ws)
        assert torch.equal(_mmdet_rel_index(ws), hf_index)
        assert torch.equal(swin_relative_position_index(ws), hf_index)


def _mmdet_window_msa(x, qkv_w, qkv_b, proj_w, proj_b, table, heads, ws, mask=None):
    B, N, C = x.shape
    qkv = F.linear(x, qkv_w, qkv_b).reshape(B, N, 3, heads, C // heads).permute(2, 0, 3, 1, 4)
    q, k, v = qkv[0] * (C // heads) ** -0.5, qkv[1], qkv[2]
    attn = q @ k.transpose(-2, -1)
    bias = table[_mmdet_rel_index(ws).view(-1)].view(N, N, -1).permute(2, 0, 1)
    attn = attn + bias.unsqueeze(0)
    if mask is not None:
        nw = mask.shape[0]
        attn = (attn.view(B // nw, nw, heads, N, N) + mask.unsqueeze(1).unsqueeze(0)).view(-1, heads, N, N)
    return F.linear((attn.softmax(-1) @ v).transpose(1, 2).reshape(B, N, C), proj_w, proj_b)


def test_swin_window_attention_matches_fused_qkv_reference(tiny):
    from transformers.models.swin.modeling_swin import SwinAttention

    cfg, src, hf = tiny
    bb = cfg.backbone_config
    stage, heads, ws = 2, bb.num_heads[2], bb.window_size
    C = bb.embed_dim * 2 ** stage
    # float64: randn weights give large logits; in fp32 the two softmax paths differ by ~1e-3 in places
    att = SwinAttention(bb, C, heads, ws).eval().double()
    att.load_state_dict(_sub(hf, f"model.pixel_level_module.encoder.swin.encoder.layers.{stage}.blocks.1.attention."))
    p = f"backbone.stages.{stage}.blocks.1.attn.w_msa."
    w = {k: src[p + k].double() for k in ("qkv.weight", "qkv.bias", "proj.weight", "proj.bias",
                                           "relative_position_bias_table")}
    x = torch.randn(4, ws * ws, C, dtype=torch.float64)
    mask = torch.where(torch.rand(2, ws * ws, ws * ws) < 0.3, -100.0, 0.0).double()  # shifted-window style, 2 windows
    for m in (None, mask):
        ref = _mmdet_window_msa(x, w["qkv.weight"], w["qkv.bias"], w["proj.weight"], w["proj.bias"],
                                w["relative_position_bias_table"], heads, ws, m)
        with torch.no_grad():
            torch.testing.assert_close(att(x, m)[0], ref, rtol=1e-9, atol=1e-9)


def _mmdet_decoder_layer(src, p, heads, query, key, value, query_pos, key_pos, attn_mask):
    """mmcv BaseTransformerLayer with operation_order (cross_attn, norm, self_attn, norm, ffn, norm)."""
    D = query.shape[-1]

    def mha(i, q, k, v, mask):
        m = torch.nn.MultiheadAttention(D, heads).eval()
        m.load_state_dict({n: src[f"{p}attentions.{i}.attn.{n}"] for n in
                           ("in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias")})
        return m(q, k, v, attn_mask=mask)[0]

    def ln(i, x):
        return F.layer_norm(x, (D,), src[f"{p}norms.{i}.weight"], src[f"{p}norms.{i}.bias"])

    x = ln(0, query + mha(0, query + query_pos, key + key_pos, value, attn_mask))
    x = ln(1, x + mha(1, x + query_pos, x + query_pos, x, None))
    h = F.relu(F.linear(x, src[p + "ffns.0.layers.0.0.weight"], src[p + "ffns.0.layers.0.0.bias"]))
    return ln(2, x + F.linear(h, src[p + "ffns.0.layers.1.weight"], src[p + "ffns.0.layers.1.bias"]))


def test_decoder_layer_matches_mmcv_reference(tiny):
    """Cross-attn copied fused, self-attn in_proj split into q/k/v, norms.0/1/2 -> cross/self/final."""
    from transformers.models.mask2former.modeling_mask2former import (Mask2FormerAttention,
                                                                      Mask2FormerMaskedAttentionDecoderLayer)

    cfg, src, hf = tiny
    D, H, Q, B, HW = cfg.hidden_dim, cfg.num_attention_heads, cfg.num_queries, 2, 15
    layer = Mask2FormerMaskedAttentionDecoderLayer(cfg).eval()
    layer.load_state_dict(_sub(hf, "model.transformer_module.decoder.layers.1."))
    g = torch.Generator().manual_seed(1)
    query, qpos = torch.randn(Q, B, D, generator=g), torch.randn(Q, B, D, generator=g)
    mem, kpos = torch.randn(HW, B, D, generator=g), torch.randn(HW, B, D, generator=g)
    mask = torch.rand(B * H, Q, HW, generator=g) < 0.4
    mask[..., 0] = False  # no fully masked row (both sides un-mask those identically anyway)
    src_p = "panoptic_head.transformer_decoder.layers.1."
    ref = _mmdet_decoder_layer(src, src_p, H, query, mem, mem, qpos, kpos, mask)
    with torch.no_grad():
        out = layer(query, level_index=0, position_embeddings=[kpos], query_position_embeddings=qpos,
                    encoder_hidden_states=[mem], encoder_attention_mask=mask)[0]
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
        # the self-attention alone, against torch's fused nn.MultiheadAttention
        sa = Mask2FormerAttention(D, H).eval()
        sa.load_state_dict(_sub(hf, "model.transformer_module.decoder.layers.1.self_attn."))
        mha = torch.nn.MultiheadAttention(D, H).eval()
        mha.load_state_dict({n: src[f"{src_p}attentions.1.attn.{n}"] for n in
                             ("in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias")})
        torch.testing.assert_close(sa(query, position_embeddings=qpos)[0],
                                   mha(query + qpos, query + qpos, query)[0], rtol=1e-4, atol=1e-5)


def _mmcv_msdeform_encoder_layer(src, p, heads, query, query_pos, shapes, ref):
    """mmcv MultiScaleDeformableAttention (pytorch path) in a ('self_attn','norm','ffn','norm') layer.

    query/query_pos (N, B, C) as mmcv's batch_first=False; ref (B, N, levels, 2) in [0, 1] (x, y).
    """
    lin = lambda x, n: F.linear(x, src[f"{p}{n}.weight"], src[f"{p}{n}.bias"])
    N, B, C = query.shape
    L, P, hd = len(shapes), 4, C // heads
    q = (query + query_pos).transpose(0, 1)
    v = lin(query.transpose(0, 1), "attentions.0.value_proj").view(B, N, heads, hd)  # value = query without pos
    off = lin(q, "attentions.0.sampling_offsets").view(B, N, heads, L, P, 2)
    aw = lin(q, "attentions.0.attention_weights").view(B, N, heads, L * P).softmax(-1).view(B, N, heads, L, P)
    wh = torch.tensor([[w, h] for h, w in shapes], dtype=query.dtype)
    loc = ref[:, :, None, :, None, :] + off / wh[None, None, None, :, None, :]
    out, start = 0, 0
    for l, (h, w) in enumerate(shapes):
        v_l = v[:, start:start + h * w].permute(0, 2, 3, 1).reshape(B * heads, hd, h, w)
        start += h * w
        grid = (2 * loc[:, :, :, l] - 1).transpose(1, 2).reshape(B * heads, N, P, 2)
        sampled = F.grid_sample(v_l, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
        out = out + (sampled * aw[:, :, :, l].transpose(1, 2).reshape(B * heads, 1, N, P)).sum(-1)
    out = lin(out.view(B, C, N).transpose(1, 2), "attentions.0.output_proj").transpose(0, 1)
    ln = lambda x, i: F.layer_norm(x, (C,), src[f"{p}norms.{i}.weight"], src[f"{p}norms.{i}.bias"])
    x = ln(query + out, 0)
    return ln(x + lin(F.relu(lin(x, "ffns.0.layers.0.0")), "ffns.0.layers.1"), 1)


def test_pixel_decoder_encoder_layer_matches_mmcv_reference(tiny):
    """MSDeformAttn weights copied by name, norms.0/1 -> self_attn_layer_norm/final_layer_norm."""
    from transformers.models.mask2former.modeling_mask2former import Mask2FormerPixelDecoderEncoderLayer

    cfg, src, hf = tiny
    layer = Mask2FormerPixelDecoderEncoderLayer(cfg).eval().double()
    layer.load_state_dict(_sub(hf, "model.pixel_level_module.decoder.encoder.layers.0."))
    src64 = {k: v.double() for k, v in src.items()}
    shapes, B, C = [(2, 3), (3, 4), (5, 6)], 2, cfg.feature_size
    N = sum(h * w for h, w in shapes)
    g = torch.Generator().manual_seed(2)
    query, pos = torch.randn(N, B, C, generator=g, dtype=torch.float64), torch.randn(N, B, C, generator=g, dtype=torch.float64)
    # mmdet's reference points: pixel centres normalised per level, shared by all levels (valid ratio 1)
    ref = torch.cat([torch.stack(torch.meshgrid((torch.arange(h) + 0.5) / h, (torch.arange(w) + 0.5) / w,
                                                indexing="ij")[::-1], -1).reshape(-1, 2) for h, w in shapes])
    ref = ref.double()[None, :, None].repeat(B, 1, len(shapes), 1)
    expect = _mmcv_msdeform_encoder_layer(src64, "panoptic_head.pixel_decoder.encoder.layers.0.",
                                          cfg.num_attention_heads, query, pos, shapes, ref)
    starts = torch.tensor([0] + list(np.cumsum([h * w for h, w in shapes])[:-1]))
    with torch.no_grad():
        out = layer(query.transpose(0, 1), torch.zeros(B, N, dtype=torch.bool), position_embeddings=pos.transpose(0, 1),
                    reference_points=ref, spatial_shapes_list=shapes, level_start_index=starts)[0]
    torch.testing.assert_close(out.transpose(0, 1), expect, rtol=1e-9, atol=1e-9)


# ----------------------------------------------------------------------------------- pitfall 4
def test_class_logits_keep_no_object_last(tiny):
    from transformers import Mask2FormerForUniversalSegmentation

    cfg, src, hf = tiny
    assert torch.equal(hf["class_predictor.weight"], src["panoptic_head.cls_embed.weight"])
    assert torch.equal(hf["class_predictor.bias"], src["panoptic_head.cls_embed.bias"])
    assert hf["class_predictor.weight"].shape[0] == cfg.num_labels + 1
    # HF's own convention: its loss weights the *last* logit as no-object, like mmdet's
    # class_weight=[1.0]*80 + [0.1]; the converter writes the same buffer HF initialises.
    fresh = Mask2FormerForUniversalSegmentation(cfg).state_dict()["criterion.empty_weight"]
    assert fresh[-1].item() == pytest.approx(0.1) and torch.all(fresh[:-1] == 1)
    assert torch.equal(hf["criterion.empty_weight"], fresh)


# ------------------------------------------------------------------------------------ strictness
def test_missing_extra_and_misshapen_keys_raise_one_error_naming_them(tiny):
    cfg, src, _ = tiny
    bad = dict(src)
    del bad["panoptic_head.query_feat.weight"]
    bad["panoptic_head.bogus.weight"] = torch.zeros(3)
    bad["panoptic_head.cls_embed.bias"] = torch.zeros(cfg.num_labels + 2)
    bad["backbone.stages.0.blocks.0.attn.w_msa.relative_position_index"] = torch.zeros(49, 49, dtype=torch.long)
    with pytest.raises(ConversionError) as ei:
        convert_state_dict(bad, cfg)
    msg = str(ei.value)
    for needle in ("panoptic_head.bogus.weight", "model.transformer_module.queries_features.weight",
                   "class_predictor.bias", "backbone.stages.0.blocks.0.attn.w_msa.relative_position_index",
                   "--config-json"):
        assert needle in msg, needle
    assert "panoptic_head.cls_embed.bias -> class_predictor.bias" in msg  # mismatch names both sides
    # a source with more decoder layers than the config (2 mmdet layers vs 1) is refused by name
    with pytest.raises(ConversionError, match=r"transformer_decoder\.layers\.1\.norms\.2\.bias -> "
                                              r"model\.transformer_module\.decoder\.layers\.1\.final_layer_norm"):
        convert_state_dict(src, build_hf_config(**{**TINY, "decoder_layers": 2}))


def test_input_not_modified(tiny):
    cfg, src, _ = tiny
    snapshot = {k: v.clone() for k, v in src.items()}
    convert_state_dict(src, cfg)
    assert snapshot.keys() == src.keys() and all(torch.equal(snapshot[k], src[k]) for k in src)


# ------------------------------------------------------------------------------------------ CLI
def test_cli_round_trip_loads_in_geneval_detector(tiny, tmp_path):
    from PIL import Image

    from varbench.evaluators.geneval.evaluator import Mask2FormerDetector
    from varbench.evaluators.geneval.rules import COCO80_GENEVAL
    from varbench.core.filehash import sha256_file

    cfg, src, hf = tiny
    pth = tmp_path / "m2f.pth"
    torch.save({"meta": {"mmdet_version": "2.24.1", "CLASSES": tuple(COCO80_GENEVAL)}, "state_dict": src}, pth)
    cj = tmp_path / "tiny.json"
    cj.write_text(json.dumps(TINY))
    out = tmp_path / "hf"
    assert main([str(pth), str(out), "--config-json", str(cj)]) == 0
    rec = json.loads((out / "conversion.json").read_text())
    assert rec["source_sha256"] == sha256_file(pth) and rec["converter_version"] == CONVERTER_VERSION
    assert rec["mmdet_version"] == "2.24.1" and rec["mmdet_classes"][0] == "person"
    assert list(out.glob("*.safetensors"))
    det = Mask2FormerDetector(out, "cpu", scale=(64, 64))
    loaded = det.model.state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in hf.items())
    img = Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 56, 3), dtype=np.uint8))
    per_class, per_masks = det(img)
    assert len(per_class) == 80 and sum(len(a) for a in per_class) == min(100, cfg.num_queries * 80)
    assert all(np.isfinite(a).all() for a in per_class if len(a))
    # the evaluator records which mmdet file the folder was converted from
    from varbench.evaluators import build_evaluator

    clip = TINY_SCORERS_DIR / "geneval_tiny"
    ev = build_evaluator("geneval", backend="native", weights_dir=str(tmp_path), detector_dir="hf",
                         detector_name="mmdet-converted", clip_weights=str(clip / "clip.bin"), clip_model="clip_tiny_qg",
                         clip_model_config=str(clip / "clip_tiny_qg.json"), detector_scale=(64, 64), device="cpu")
    ev.setup("cpu")
    assert ev.version_info()["detector_conversion"]["source_sha256"] == sha256_file(pth)


def test_cli_names_missing_source(tmp_path):
    with pytest.raises(FileNotFoundError, match="743b7d99"):
        main([str(tmp_path / "nope.pth"), str(tmp_path / "out")])
