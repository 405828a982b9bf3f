"""The BSQ-VAE ("bitwise tokenizer") that Infinity generates into, written for this project.

Infinity's transformer predicts *bits*: each latent token of the VAE grid carries `codebook_dim`
binary digits (32 for the 2B model, 14 for the 8B model). This module owns everything on the VAE
side of that contract:

* a CNN encoder/decoder pair (Flux/LDM style: ResNet blocks, GroupNorm, no attention), whose
  `state_dict()` keys and shapes are identical to the released checkpoints
  `infinity_vae_d32reg.pth` and `infinity_vae_d56_f8_14_patchify.pth` (the key lists are pinned in
  `tests/fixtures/keys/vae_*.txt`, derived from the upstream module tree);
* multi-scale binary spherical quantisation (BSQ) of the encoder latent into per-scale bit maps
  (`encode_to_bits`), the bit -> code map (`bits_to_codes`) and the interpolation Infinity uses to
  accumulate codes across scales (`upsample_codes`, `bits_to_summed_codes`);
* the 8B "spatial patchify" mapping between the transformer's (h, w, 4d) token bits and the VAE's
  (2h, 2w, d) grid (`unpatchify_bits`, `patchify_codes`);
* strict checkpoint loading (`load_vae`) that reports every missing/unexpected key at once
  (`checkpoints.load_state_dict_strict`).

Numerics follow upstream FoundationVision/Infinity (commit 4c27bbb54a99) operation for operation,
so bits agree exactly and decoded images to float rounding (checked against upstream outputs in
`tests/engine/test_vae.py`). Where upstream carries training-only or unused machinery (losses, stochastic
depth, bit flips, 3-D convolutions, projections that are Identity for the released configs) it is
left out; the released configurations never use it.

Latent layout conventions used throughout (B = batch, d = bits per token):
    continuous latent / codes   (B, d, H, W)   float, channels first
    bits of one scale           (B, h, w, d)   int64 in {0, 1}, channels last (the transformer's
                                               per-token label order)
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

from varbench.core.errors import FixableError
from varbench.engine.backbones.infinity.stage_flops import decoder_flops
from varbench.engine.checkpoints import CheckpointMismatch, load_state_dict_strict

__all__ = [
    "VAEConfig",
    "VAE_PRESETS",
    "BSQVAE",
    "load_vae",
    "load_vae_state_dict",
    "bits_to_codes",
    "expected_bit_mask",
    "PRESET_FILES",
    "VAEWeightsNotFoundError",
    "CheckpointMismatchError",
    "normalize_scale_schedule",
    "unpatchify_bits",
    "patchify_bits",
    "patchify_codes",
]

HF_PUBLISHED_AT = "https://huggingface.co/FoundationVision/Infinity"

# Upstream (multiscale_bsq.py) hard-codes these two interpolation modes: residuals are shrunk to a
# scale's grid with area averaging, codes are grown back to the full grid trilinearly on a
# (B, C, 1, H, W) tensor (trilinear with a singleton time axis equals bilinear, align_corners=False).
Z_INTERPOLATE_DOWN = "area"
Z_INTERPOLATE_UP = "trilinear"


# --------------------------------------------------------------------------------------------------
# configuration
# --------------------------------------------------------------------------------------------------


def _group_count(channels: int) -> int:
    """Upstream's GroupNorm rule: 32 groups when possible, else 24, else unsupported."""
    if channels % 32 == 0:
        return 32
    if channels % 24 == 0:
        return 24
    raise ValueError(
        f"BSQ-VAE stage width {channels} is divisible by neither 32 nor 24 (GroupNorm group rule); "
        f"choose base_ch/ch_mult so every width base_ch*m is a multiple of 32 or 24."
    )


@dataclass(frozen=True)
class VAEConfig:
    """Size knobs of the BSQ-VAE.

    codebook_dim:   bits per latent token (d). More bits = finer reconstruction but a harder
                    prediction task for the transformer (it predicts 2 logits per bit).
    patch_size:     pixels per latent token along each side; must be a power of two with
                    log2(patch_size) <= len(ch_mult) - 1 (one stride-2 stage per factor of 2).
                    Larger = shorter token sequences, blurrier reconstructions.
    base_ch:        channel width of the first stage; every stage width is base_ch * ch_mult[i].
                    Widths must be divisible by 32 or 24 (upstream's GroupNorm group rule).
    ch_mult:        per-stage width multipliers, encoder order (the decoder mirrors them).
    num_res_blocks: ResNet blocks per encoder stage (the decoder uses one more per stage).
                    Depth buys quality at linear cost.
    in_channels:    image channels (3 = RGB in [-1, 1]).
    """

    codebook_dim: int = 32
    patch_size: int = 16
    base_ch: int = 128
    ch_mult: tuple[int, ...] = (1, 2, 4, 4, 4)
    num_res_blocks: int = 2
    in_channels: int = 3

    def __post_init__(self):
        object.__setattr__(self, "ch_mult", tuple(int(m) for m in self.ch_mult))
        n_down = math.log2(self.patch_size) if self.patch_size > 0 else -1
        if n_down < 0 or not float(n_down).is_integer():
            raise ValueError(f"VAEConfig.patch_size={self.patch_size} must be a power of two (e.g. 8 or 16).")
        if int(n_down) > len(self.ch_mult) - 1:
            raise ValueError(
                f"VAEConfig.patch_size={self.patch_size} needs {int(n_down)} stride-2 stages but ch_mult="
                f"{self.ch_mult} has only {len(self.ch_mult) - 1}; add stages or lower patch_size."
            )
        if self.codebook_dim < 1 or self.num_res_blocks < 1 or self.base_ch < 1:
            raise ValueError(f"VAEConfig sizes must be positive, got {self}.")
        for width in sorted({self.base_ch} | {self.base_ch * m for m in self.ch_mult}):
            _group_count(width)  # raises with the fix if the width is not normalisable

    def decode_flops(self, latent_hw) -> float:
        """One image's decode on a (h, w) latent grid (`stage_flops.decoder_flops`; read by
        `varbench.engine.stage_flops.vae_decode_flops`)."""
        return decoder_flops(self, latent_hw)

    @property
    def num_down(self) -> int:
        """Number of stride-2 stages (= log2(patch_size))."""
        return int(math.log2(self.patch_size))


VAE_PRESETS: dict[str, VAEConfig] = {
    # infinity_vae_d32reg.pth, used by Infinity-2B (vae_type=32): 16x downsampling, 32 bits/token.
    "d32reg": VAEConfig(codebook_dim=32, patch_size=16, base_ch=128, ch_mult=(1, 2, 4, 4, 4), num_res_blocks=2),
    # infinity_vae_d56_f8_14_patchify.pth, used by Infinity-8B (vae_type=14, apply_spatial_patchify=1):
    # 8x downsampling, 14 bits/token; the transformer sees 2x2 groups of tokens as one 56-bit token.
    "d56_f8_14_patchify": VAEConfig(codebook_dim=14, patch_size=8, base_ch=128, ch_mult=(1, 2, 4, 4), num_res_blocks=2),
    # A tiny VAE for CPU experiments and tests (about 0.9M parameters): 4x downsampling, 16 bits.
    "toy": VAEConfig(codebook_dim=16, patch_size=4, base_ch=32, ch_mult=(1, 2, 2), num_res_blocks=1),
}

# Released file name of each released preset (for error messages).
PRESET_FILES = {
    "d32reg": "infinity_vae_d32reg.pth",
    "d56_f8_14_patchify": "infinity_vae_d56_f8_14_patchify.pth",
}


# --------------------------------------------------------------------------------------------------
# building blocks (the `.conv` / `.norm` wrapper levels exist only to reproduce the checkpoint keys)
# --------------------------------------------------------------------------------------------------


class _Conv(nn.Module):
    """A Conv2d stored under `.conv` (checkpoint keys are `...<name>.conv.weight`)."""

    def __init__(self, c_in: int, c_out: int, kernel_size: int, stride: int = 1, padding: int = 0):
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, kernel_size, stride=stride, padding=padding)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


class _GroupNorm(nn.Module):
    """GroupNorm (eps 1e-6, affine) stored under `.norm`."""

    def __init__(self, channels: int):
        super().__init__()
        self.norm = nn.GroupNorm(_group_count(channels), channels, eps=1e-6, affine=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


def _swish(x: torch.Tensor) -> torch.Tensor:
    # Written as upstream writes it (not F.silu) so results agree bit for bit.
    return x * torch.sigmoid(x)


class _ResBlock(nn.Module):
    """Pre-activation ResNet block: GN-swish-conv3x3 twice, 1x1 shortcut when widths differ."""

    def __init__(self, c_in: int, c_out: int):
        super().__init__()
        self.norm1 = _GroupNorm(c_in)
        self.conv1 = _Conv(c_in, c_out, 3, padding=1)
        self.norm2 = _GroupNorm(c_out)
        self.conv2 = _Conv(c_out, c_out, 3, padding=1)
        if c_in != c_out:
            self.nin_shortcut = _Conv(c_in, c_out, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(_swish(self.norm1(x)))
        h = self.conv2(_swish(self.norm2(h)))
        if hasattr(self, "nin_shortcut"):
            x = self.nin_shortcut(x)
        return x + h


class _Downsample(nn.Module):
    """Stride-2 3x3 conv after zero-padding one pixel on the right and bottom only."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv = _Conv(channels, channels, 3, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(x, (0, 1, 0, 1), mode="constant", value=0.0))


class _Upsample(nn.Module):
    """Nearest-neighbour 2x upsampling followed by a 3x3 conv."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv = _Conv(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.interpolate(x, scale_factor=2, mode="nearest"))


class _Stage(nn.Module):
    """One resolution level: `block` (ResNet blocks), optional `downsample`/`upsample`."""

    def __init__(self, blocks: Iterable[nn.Module]):
        super().__init__()
        self.block = nn.ModuleList(blocks)


class _Mid(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.block_1 = _ResBlock(channels, channels)
        self.block_2 = _ResBlock(channels, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block_2(self.block_1(x))


class Encoder(nn.Module):
    """Image (B, 3, H, W) in [-1, 1] -> continuous latent (B, d, H/p, W/p)."""

    def __init__(self, cfg: VAEConfig):
        super().__init__()
        ch, mult = cfg.base_ch, cfg.ch_mult
        self.conv_in = _Conv(cfg.in_channels, ch, 3, padding=1)
        self.down = nn.ModuleList()
        c_in = ch
        for level, m in enumerate(mult):
            c_out = ch * m
            blocks = []
            for _ in range(cfg.num_res_blocks):
                blocks.append(_ResBlock(c_in, c_out))
                c_in = c_out
            stage = _Stage(blocks)
            if level < cfg.num_down:  # the first log2(p) levels halve the resolution
                stage.downsample = _Downsample(c_in)
            self.down.append(stage)
        self.mid = _Mid(c_in)
        self.norm_out = _GroupNorm(c_in)
        self.conv_out = _Conv(c_in, cfg.codebook_dim, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(x)
        for stage in self.down:
            for block in stage.block:
                h = block(h)
            if hasattr(stage, "downsample"):
                h = stage.downsample(h)
        h = self.mid(h)
        return self.conv_out(_swish(self.norm_out(h)))


class Decoder(nn.Module):
    """Latent codes (B, d, h, w) -> image (B, 3, h*p, w*p), unclamped.

    `up[i]` is the stage at resolution level i (0 = full resolution); it runs from the coarsest
    level down, each level with num_res_blocks + 1 blocks, levels 1..log2(p) ending in an upsample.
    """

    def __init__(self, cfg: VAEConfig):
        super().__init__()
        ch, mult, n = cfg.base_ch, cfg.ch_mult, len(cfg.ch_mult)
        c_top = ch * mult[-1]
        self.conv_in = _Conv(cfg.codebook_dim, c_top, 3, padding=1)
        self.mid = _Mid(c_top)
        # Input width of each level when walking from the coarsest level (n-1) to level 0.
        widths_in = {}
        c_in = c_top
        for level in reversed(range(n)):
            widths_in[level] = c_in
            c_in = ch * mult[level]
        self.up = nn.ModuleList()
        for level in range(n):
            c_out = ch * mult[level]
            blocks = [_ResBlock(widths_in[level] if j == 0 else c_out, c_out) for j in range(cfg.num_res_blocks + 1)]
            stage = _Stage(blocks)
            if 1 <= level <= cfg.num_down:
                stage.upsample = _Upsample(c_out)
            self.up.append(stage)
        self.norm_out = _GroupNorm(ch * mult[0])
        self.conv_out = _Conv(ch * mult[0], cfg.in_channels, 3, padding=1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        h = self.mid(self.conv_in(z))
        for stage in reversed(self.up):
            for block in stage.block:
                h = block(h)
            if hasattr(stage, "upsample"):
                h = stage.upsample(h)
        return self.conv_out(_swish(self.norm_out(h)))


# --------------------------------------------------------------------------------------------------
# quantiser
# --------------------------------------------------------------------------------------------------


class _BitQuantizer(nn.Module):
    """Binary spherical quantisation of one scale (upstream `BSQ`, `new_quant=True` path).

    Each token vector is L2-normalised, then every coordinate snaps to +-1/sqrt(d) by its sign
    (a coordinate of exactly 0 gives bit 0). The only state is `mask` (2^(d-1), ..., 2, 1), a
    persistent int64 buffer kept because the released checkpoints carry it; bit <-> integer
    conversion uses it.
    """

    def __init__(self, codebook_dim: int):
        super().__init__()
        self.codebook_dim = codebook_dim
        self.codebook_scale = 1.0 / math.sqrt(codebook_dim)
        self.register_buffer("mask", expected_bit_mask(codebook_dim))

    def forward(self, z_5d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, d, T, h, w) float -> (quantised (B, d, T, h, w), bits (B, T, h, w, d) int64)."""
        z = F.normalize(z_5d.permute(0, 2, 3, 4, 1).float().contiguous(), dim=-1)
        one = torch.ones((), dtype=z.dtype, device=z.device)
        zhat = torch.where(z > 0, one, -one) * (1.0 / (self.codebook_dim ** 0.5))
        # Upstream returns the straight-through value z + (zhat - z), which equals zhat only up to
        # rounding; we keep the same expression so residuals (hence later bits) match exactly.
        q = z + (zhat - z).detach()
        bits = (q > 0).long()
        return q.permute(0, 4, 1, 2, 3), bits

    def bits_to_codes(self, bits: torch.Tensor) -> torch.Tensor:
        """Bits (..., d) in {0,1} -> codes (..., d); see the module function `bits_to_codes`."""
        return bits_to_codes(bits)


def bits_to_codes(bits: torch.Tensor) -> torch.Tensor:
    """Bits (..., d) in {0,1} -> BSQ codes (..., d) float32: each bit to +-1/sqrt(d), then
    L2-normalised per token (released `BSQ`'s requantisation, same ops in the same order).

    The one bits -> codes map: the quantiser (`_BitQuantizer.bits_to_codes`), the runtime's
    per-scale accumulation (`InfinityRuntime`) and the toy trainer's teacher forcing
    (`toy.forward.scale_inputs`) all call it; they differ only in the layout they put `d` in after.
    """
    s = 1.0 / math.sqrt(bits.shape[-1])
    return F.normalize(bits.float() * s * 2 - s, dim=-1)


class _MultiScaleQuantizer(nn.Module):
    """Holds the per-scale quantiser under the checkpoint name `lfq` (see `BSQVAE.quantizer`)."""

    def __init__(self, codebook_dim: int):
        super().__init__()
        self.lfq = _BitQuantizer(codebook_dim)


def expected_bit_mask(codebook_dim: int) -> torch.Tensor:
    """The value of the `quantizer.lfq.mask` buffer: 2**(d-1), ..., 2, 1 as int64."""
    return 2 ** torch.arange(codebook_dim - 1, -1, -1)


ScaleSchedule = Sequence[Union[tuple[int, int], tuple[int, int, int]]]


def normalize_scale_schedule(schedule: ScaleSchedule) -> list[tuple[int, int]]:
    """Accept [(h, w), ...] or Infinity's [(1, h, w), ...]; return [(h, w), ...]."""
    out = []
    for item in schedule:
        item = tuple(int(v) for v in item)
        if len(item) == 3:
            if item[0] != 1:
                raise ValueError(f"scale {item}: only images (t=1) are supported; use (1, h, w) or (h, w).")
            item = item[1:]
        if len(item) != 2 or min(item) < 1:
            raise ValueError(f"scale {item}: expected (h, w) or (1, h, w) with positive sizes.")
        out.append(item)
    if not out:
        raise ValueError("empty scale schedule")
    return out


# --------------------------------------------------------------------------------------------------
# the VAE
# --------------------------------------------------------------------------------------------------


class BSQVAE(nn.Module):
    """Infinity's BSQ-VAE: encoder, decoder and multi-scale bit quantiser.

    The state dict has exactly the released checkpoint's keys, including the quirk that the
    quantiser is registered twice (`quantizer` and its alias `quantize`), so the `lfq.mask` buffer
    appears under both names.
    """

    def __init__(self, cfg: VAEConfig | str = "d32reg"):
        super().__init__()
        if isinstance(cfg, str):
            cfg = _preset(cfg)
        self.cfg = cfg
        self.codebook_dim = cfg.codebook_dim
        self.encoder = Encoder(cfg)
        self.decoder = Decoder(cfg)
        self.quantizer = _MultiScaleQuantizer(cfg.codebook_dim)
        self.quantize = self.quantizer  # upstream alias; kept so the state-dict keys match

    @property
    def lfq(self) -> _BitQuantizer:
        return self.quantizer.lfq

    # ---- continuous path -----------------------------------------------------------------------

    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """Images (B, 3, H, W) in [-1, 1] -> continuous latent (B, d, H/p, W/p), float32."""
        self._check_images(images)
        return self.encoder(images).float()

    def decode(self, latent: torch.Tensor) -> torch.Tensor:
        """Summed codes / latent (B, d, h, w) -> image (B, 3, h*p, w*p) clamped to [-1, 1]."""
        if latent.ndim == 5 and latent.shape[2] == 1:  # accept upstream's (B, d, 1, h, w)
            latent = latent.squeeze(2)
        if latent.ndim != 4 or latent.shape[1] != self.codebook_dim:
            raise ValueError(f"decode expects (B, {self.codebook_dim}, h, w) codes, got {tuple(latent.shape)}.")
        return self.decoder(latent).clamp(-1, 1)

    # ---- bits ------------------------------------------------------------------------------------

    def encode_to_bits(self, images: torch.Tensor, scale_schedule: ScaleSchedule) -> list[torch.Tensor]:
        """Images -> per-scale bits [(B, h_k, w_k, d) int64], the labels Infinity is trained on.

        `scale_schedule` lists VAE-grid sizes, coarse to fine, and must end at the full latent size
        (for the 8B patchify VAE pass the doubled "vae scale schedule"). Residual quantisation as in
        upstream training (`BitwiseSelfCorrection.flip_requant` with no bit flips): at scale k the
        residual r = latent - sum of earlier codes (each upsampled trilinearly to the full grid) is
        area-downsampled to (h_k, w_k) (not at the last scale), L2-normalised per token and
        sign-quantised. The same bits come out of upstream `MultiScaleBSQ.forward` (checked).
        """
        return self.quantize_latent(self.encode(images), scale_schedule)[0]

    def quantize_latent(self, latent: torch.Tensor, scale_schedule: ScaleSchedule) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Continuous latent (B, d, H, W) -> (per-scale bits, summed quantised codes (B, d, H, W))."""
        labels, _, summed = self._residual_quantize(latent, scale_schedule)
        return labels, summed

    def self_correction_bits(self, latent: torch.Tensor, scale_schedule: ScaleSchedule, strength: float,
                             num_scales: int, generator: torch.Generator | None = None
                             ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Infinity's Bitwise Self-Correction (upstream `BitwiseSelfCorrection.flip_requant`):
        (labels, inputs), both per-scale bits.

        At each of the first `num_scales` scales a flip rate p is drawn uniformly from
        {0, 0.01, ..., strength} (one p per scale, shared by the batch, as upstream), each bit of
        that scale is flipped with probability p, and the *flipped* codes are what later scales'
        residuals are computed from and what the transformer sees as input. The labels of later
        scales therefore teach the model to correct earlier mistakes, which is what it has to do
        at sampling time. strength 0 gives labels == inputs == `quantize_latent`'s bits.
        """
        def flip(k: int, bits: torch.Tensor) -> torch.Tensor:
            if k >= num_scales or strength <= 0:
                return bits
            steps = int(round(100 * strength))
            p = int(torch.randint(0, steps + 1, (), generator=generator)) * 0.01
            mask = torch.rand(bits.shape, generator=generator) < p
            return torch.where(mask.to(bits.device), 1 - bits, bits)

        labels, inputs, _ = self._residual_quantize(latent, scale_schedule, flip)
        return labels, inputs

    def _residual_quantize(self, latent, scale_schedule, flip=None):
        sched = normalize_scale_schedule(scale_schedule)
        B, d, H, W = latent.shape
        if d != self.codebook_dim:
            raise ValueError(f"latent has {d} channels, this VAE quantises {self.codebook_dim}.")
        if sched[-1] != (H, W):
            raise ValueError(f"scale schedule must end at the latent size {(H, W)}, ends at {sched[-1]}.")
        full = latent.float().unsqueeze(2)  # (B, d, 1, H, W): upstream works on 5-D tensors
        summed = torch.zeros_like(full)
        labels, inputs = [], []
        for k, (h, w) in enumerate(sched):
            residual = full - summed
            if k != len(sched) - 1:
                residual = F.interpolate(residual, size=(1, h, w), mode=Z_INTERPOLATE_DOWN)
            q, bits = self.lfq(residual)
            labels.append(bits[:, 0])
            used = bits if flip is None else flip(k, bits)
            inputs.append(used[:, 0])
            if used is not bits:  # requantise from the flipped bits (upstream `noise_apply_requant`)
                q = self.lfq.bits_to_codes(used).permute(0, 4, 1, 2, 3)
            summed = summed + F.interpolate(q, size=(1, H, W), mode=Z_INTERPOLATE_UP)
        return labels, inputs, summed.squeeze(2)

    def bits_to_codes(self, bits: torch.Tensor) -> torch.Tensor:
        """Bits (B, h, w, d) in {0,1} -> codes (B, d, h, w): +-1/sqrt(d), L2-normalised per token."""
        if bits.ndim != 4 or bits.shape[-1] != self.codebook_dim:
            raise ValueError(
                f"bits_to_codes expects (B, h, w, {self.codebook_dim}) bits, got {tuple(bits.shape)}"
                + ("; for the 8B VAE unpatchify (h, w, 4d) token bits first (unpatchify_bits)." if bits.ndim == 4 and bits.shape[-1] == 4 * self.codebook_dim else ".")
            )
        return self.lfq.bits_to_codes(bits).permute(0, 3, 1, 2)

    @staticmethod
    def upsample_codes(codes: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
        """Resize codes (B, d, h, w) -> (B, d, H, W) exactly as upstream accumulates them.

        Upstream calls F.interpolate(mode='trilinear') on the (B, d, 1, h, w) tensor, both to grow a
        scale's codes to the full grid and to shrink the running sum to the next scale's grid (the
        transformer's next input), so this one function serves both directions.
        """
        return F.interpolate(codes.unsqueeze(2), size=(1, int(size[0]), int(size[1])), mode=Z_INTERPOLATE_UP).squeeze(2)

    def bits_to_summed_codes(self, bits_per_scale: Sequence[torch.Tensor], size: tuple[int, int] | None = None) -> torch.Tensor:
        """Sum the codes of several scales on one grid, as Infinity's sampling loop does.

        `size` defaults to the last given scale's (h, w). Every scale is upsampled to `size` with
        `upsample_codes`, except a last scale that already has that size, which is added as is
        (upstream's `summed_codes += codes`). Infinity's early stop (`trunk_scale`) corresponds to
        passing a prefix of the scales together with the full schedule's final `size`.
        """
        if not bits_per_scale:
            raise ValueError("bits_to_summed_codes needs at least one scale.")
        target = tuple(int(v) for v in (size or bits_per_scale[-1].shape[1:3]))
        summed = 0
        for k, bits in enumerate(bits_per_scale):
            codes = self.bits_to_codes(bits)
            if k == len(bits_per_scale) - 1 and tuple(codes.shape[-2:]) == target:
                summed = summed + codes
            else:
                summed = summed + self.upsample_codes(codes, target)
        return summed

    # ---- helpers ---------------------------------------------------------------------------------

    def _check_images(self, images: torch.Tensor) -> None:
        p = self.cfg.patch_size
        if images.ndim != 4 or images.shape[1] != self.cfg.in_channels:
            raise ValueError(f"expected images (B, {self.cfg.in_channels}, H, W) in [-1, 1], got {tuple(images.shape)}.")
        if images.shape[2] % p or images.shape[3] % p:
            raise ValueError(f"image size {tuple(images.shape[2:])} is not a multiple of the VAE patch size {p}; resize or crop.")


# --------------------------------------------------------------------------------------------------
# 8B spatial patchify (transformer token bits (h, w, 4d) <-> VAE grid (2h, 2w, d))
# --------------------------------------------------------------------------------------------------


def unpatchify_bits(token_bits: torch.Tensor) -> torch.Tensor:
    """(B, h, w, 4d) transformer bits -> (B, 2h, 2w, d) VAE bits (upstream pixel_shuffle(2)).

    Channel c*4 + i*2 + j of token (y, x) becomes bit c of VAE cell (2y + i, 2x + j).
    """
    if token_bits.ndim != 4 or token_bits.shape[-1] % 4:
        raise ValueError(f"expected (B, h, w, 4d) token bits, got {tuple(token_bits.shape)}.")
    return F.pixel_shuffle(token_bits.permute(0, 3, 1, 2), 2).permute(0, 2, 3, 1)


def patchify_bits(vae_bits: torch.Tensor) -> torch.Tensor:
    """Inverse of `unpatchify_bits`: (B, 2h, 2w, d) -> (B, h, w, 4d) (upstream pixel_unshuffle(2))."""
    return F.pixel_unshuffle(vae_bits.permute(0, 3, 1, 2), 2).permute(0, 2, 3, 1)


def patchify_codes(codes: torch.Tensor) -> torch.Tensor:
    """(B, d, 2h, 2w) codes -> (B, 4d, h, w): the 8B transformer's next-scale input layout."""
    return F.pixel_unshuffle(codes, 2)


# --------------------------------------------------------------------------------------------------
# loading
# --------------------------------------------------------------------------------------------------


class VAEWeightsNotFoundError(FixableError, FileNotFoundError):
    """The VAE checkpoint is not where the caller said."""


class CheckpointMismatchError(CheckpointMismatch):
    """A VAE checkpoint's keys or shapes differ from the module's (a `CheckpointMismatch`)."""


def _preset(name: str) -> VAEConfig:
    try:
        return VAE_PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown VAE preset {name!r}; choose one of {sorted(VAE_PRESETS)}.") from None


def _legacy_name_map(model_keys: set[str], sd: dict) -> dict:
    """Rename keys saved without the `.conv` / `.norm` wrapper level (`...conv1.weight`) to ours.

    Upstream's loader (`bsq_vae/vae.py::load_cnn`) accepts both spellings, so a checkpoint written
    by an older module tree would load there; we accept the same two spellings and nothing else.
    """
    out = {}
    for k, v in sd.items():
        if k not in model_keys:
            stem, _, leaf = k.rpartition(".")
            for wrapper in ("conv", "norm"):
                alt = f"{stem}.{wrapper}.{leaf}"
                if alt in model_keys and alt not in sd:
                    k = alt
                    break
        out[k] = v
    return out


def load_vae_state_dict(model: BSQVAE, sd: dict, source: str = "state dict") -> BSQVAE:
    """Strictly load `sd` (optionally wrapped under "vae") into `model`; raise one listing error."""
    if isinstance(sd, dict) and "vae" in sd and isinstance(sd["vae"], dict):
        sd = sd["vae"]
    if not isinstance(sd, dict):
        raise CheckpointMismatchError(f"{source}: expected a state dict (or a dict with key 'vae'), got {type(sd).__name__}.")
    own_keys = set(model.state_dict())
    sd = _legacy_name_map(own_keys, dict(sd))
    # The bit mask is a pure function of d; supply it if a checkpoint omits it, but refuse a wrong one
    # (a different value would mean a different bit order, i.e. the wrong tokenizer).
    mask = expected_bit_mask(model.codebook_dim)
    for name in ("quantizer.lfq.mask", "quantize.lfq.mask"):
        if name not in sd:
            sd[name] = mask
        elif tuple(sd[name].shape) == tuple(mask.shape) and not torch.equal(sd[name].cpu().long(), mask):
            raise CheckpointMismatchError(f"{source}: {name} is not 2**(d-1..0) for d={model.codebook_dim}; wrong tokenizer.")
    load_state_dict_strict(model, sd, source=source, error=CheckpointMismatchError)
    return model


def load_vae(path: str | os.PathLike, preset: str | VAEConfig, *, device: str | torch.device = "cpu") -> BSQVAE:
    """Build the BSQ-VAE for `preset` and strictly load the released checkpoint at `path`.

    The file is read with `torch.load(map_location="cpu", weights_only=True)`; weights under the
    "vae" key are used when present (the released files also hold other training state). Returns
    the model in eval mode with gradients off.
    """
    cfg = _preset(preset) if isinstance(preset, str) else preset
    p = Path(os.path.expanduser(str(path)))
    if not p.is_file():
        expected = PRESET_FILES.get(preset if isinstance(preset, str) else "", p.name)
        raise VAEWeightsNotFoundError(
            f"BSQ-VAE checkpoint {expected!r} not found; searched {str(p.resolve())!r}. It is published at "
            f"{HF_PUBLISHED_AT} (file {expected}); download it and pass its path (paths.weights_dir)."
        )
    sd = torch.load(p, map_location="cpu", weights_only=True)
    model = load_vae_state_dict(BSQVAE(cfg), sd, source=f"checkpoint {str(p)!r}")
    return model.to(device).eval().requires_grad_(False)
