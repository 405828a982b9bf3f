"""HART's image decoder: the released `hart-0.7b-1024px/tokenizer` folder turned into pixels.

The AR loop ends with a latent f_hat (B, Cvae, 64, 64); the tokenizer's `post_quant_conv` and
`decoder` (a VQGAN-style conv decoder, 16x upsampling) turn it into an image, as upstream's
`HARTAutoEncoder.fhat_to_img` does, and the release maps it to pixels:
- `fhat_to_img` clamps to [-1, 1] (hart_autoencoder.py);
- `autoregressive_infer_cfg` returns `.add_(1).mul_(0.5)`, i.e. [0, 1] (hart_transformer_t2i.py);
- `sample.py::save_images` multiplies by 255 and casts with numpy's `astype(np.uint8)`, which
  truncates (no rounding). `HartImageDecoder.decode` does the same three steps.

Names equal the released module tree (`vae.post_quant_conv.*`, `vae.decoder.*`, `vae.quantize.*` in a
`HARTAutoEncoderWithDisc` file), so the folder loads strictly (`load_hart_tokenizer`). What image
generation does not use is dropped on purpose and by name, never silently: `TOKENIZER_DROPPED_PREFIXES`
(the encoder and `quant_conv`, which turn images into latents, and the training discriminator; plus the
second decoder when `double_decoder`). Each dropped prefix must be present: a file without them is not
a HART tokenizer file, and the loader says so.
"""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from varbench.core.errors import ConfigError
from varbench.engine.backbones.hart.model import HartQuantizer, load_hart_state
from varbench.engine.backbones.hart.stage_flops import hart_decoder_flops


@dataclasses.dataclass(frozen=True)
class HartTokenizerConfig:
    """What the decoder and the quantizer need from the tokenizer's config.json.

    Defaults are upstream `HARTAutoEncoderConfig`'s (mit-han-lab/hart@e28a41f); `num_res_blocks=2` and
    self-attention at the lowest resolution are fixed in upstream's code (not config fields)."""
    vocab_size: int = 4096
    z_channels: int = 32             # Cvae, the latent channels
    ch: int = 160
    ch_mult: tuple[int, ...] = (1, 1, 2, 2, 4)
    num_res_blocks: int = 2
    quant_conv_ks: int = 3
    quant_resi: float = 0.5
    share_quant_resi: int = 4
    v_patch_nums: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 8, 10, 13, 16)
    double_decoder: bool = False

    @property
    def downsample(self) -> int:
        return 2 ** (len(self.ch_mult) - 1)

    def decode_flops(self, latent_hw) -> float:
        """One image's decode on a (h, w) latent grid (`stage_flops.hart_decoder_flops`; read by
        `varbench.engine.stage_flops.vae_decode_flops`)."""
        return hart_decoder_flops(self, latent_hw)

    def __post_init__(self):
        bad = [self.ch * m for m in self.ch_mult if (self.ch * m) % 32]
        if bad:   # every GroupNorm has 32 groups
            raise ConfigError(f"HART tokenizer: ch * ch_mult must be multiples of 32 (GroupNorm(32)); got {bad}")
        if self.share_quant_resi < 2 or abs(self.quant_resi) <= 1e-6:
            raise ConfigError(f"HART tokenizer: only partially shared phi convs are implemented (share_quant_resi >= 2, "
                              f"quant_resi != 0); got share_quant_resi={self.share_quant_resi}, quant_resi={self.quant_resi}")


#: hart_0p7b: upstream's defaults (the folder's config.json was not reachable when this was written;
#: `hart_tokenizer_config_from_json` reads the real file). Inferred, not read: `v_patch_nums` = the
#: transformer's 14 scales (it only sizes `quantize.ema_vocab_hit_SV`, dropped on load), and
#: `double_decoder=False`. The 64x64 latent and 16x upsampling (ch_mult has 5 levels) give 1024 px, as released.
HART_TOKENIZER_PRESETS: dict[str, HartTokenizerConfig] = {
    "hart_0p7b": HartTokenizerConfig(v_patch_nums=(1, 2, 3, 4, 5, 7, 9, 12, 16, 21, 27, 36, 48, 64)),
    # tiny random decoder for CPU tests, with the codebook of the tiny transformer (HART_PRESETS["hart_tiny"])
    "hart_tiny": HartTokenizerConfig(vocab_size=640, z_channels=8, ch=32, ch_mult=(1, 1, 2), v_patch_nums=(1, 2, 3, 5)),
}

#: the tokenizer config.json's model_type (upstream HARTAutoEncoderWithDisc, what HARTForT2I loads)
TOKENIZER_MODEL_TYPE = "hart_autoencoder_with_disc"
#: quantizer types whose inference path is the one HartQuantizer implements: both have the same keys and
#: the same next-scale input for every stage but the last, and HART's last stage adds its tokens directly
_QUANTIZER_TYPES = ("var_hybrid", "var")
_JSON_FIELDS = ("vocab_size", "z_channels", "ch", "ch_mult", "quant_conv_ks", "quant_resi", "share_quant_resi",
                "v_patch_nums", "double_decoder")


def hart_tokenizer_config_from_json(path: str | os.PathLike) -> HartTokenizerConfig:
    """A HartTokenizerConfig from the released `tokenizer/config.json`; absent fields keep upstream's defaults.

    Fields that only matter for encoding images or for training (beta, using_znorm, dropout, levels, ...) are
    not read."""
    cfg = json.loads(Path(path).read_text())
    if cfg.get("model_type") != TOKENIZER_MODEL_TYPE:
        raise ConfigError(f"{path}: model_type={cfg.get('model_type')!r}, not a HART tokenizer "
                          f"(expected {TOKENIZER_MODEL_TYPE!r}: the hart-0.7b-1024px/tokenizer folder)")
    if cfg.get("quantizer_type", "var") not in _QUANTIZER_TYPES:
        raise ConfigError(f"{path}: quantizer_type={cfg['quantizer_type']!r} is not supported (only {_QUANTIZER_TYPES})")
    kw = {k: cfg[k] for k in _JSON_FIELDS if k in cfg}
    for k in ("ch_mult", "v_patch_nums"):
        if k in kw:
            kw[k] = tuple(kw[k])
    return HartTokenizerConfig(**kw)


# ---------------------------------------------------------------- decoder (upstream basic_vae.Decoder)

def _group_norm(c: int) -> nn.GroupNorm:
    return nn.GroupNorm(32, c, eps=1e-6, affine=True)


class ResnetBlock(nn.Module):
    """x -> shortcut(x) + conv2(silu(norm2(conv1(silu(norm1(x)))))); a 1x1 `nin_shortcut` when channels change."""

    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.norm1 = _group_norm(cin)
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.norm2 = _group_norm(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.nin_shortcut = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(F.silu(self.norm2(h)))   # dropout 0 at inference (upstream: Identity)
        return self.nin_shortcut(x) + h


class AttnBlock(nn.Module):
    """Single-head self-attention over the H*W positions, q/k/v from one 1x1 conv, softmax scale C^-1/2."""

    def __init__(self, c: int):
        super().__init__()
        self.c = c
        self.norm = _group_norm(c)
        self.qkv = nn.Conv2d(c, 3 * c, 1)
        self.proj_out = nn.Conv2d(c, c, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, _, h, w = x.shape
        q, k, v = self.qkv(self.norm(x)).reshape(b, 3, self.c, h * w).unbind(1)   # each (B, C, HW)
        # explicit bmm as released (not SDPA): the same summation order, so parity is at the last bit
        attn = torch.bmm(q.transpose(1, 2).contiguous(), k.contiguous()).mul_(self.c ** -0.5).softmax(dim=2)
        out = torch.bmm(v.contiguous(), attn.transpose(1, 2).contiguous())
        return x + self.proj_out(out.view(b, self.c, h, w))


class Upsample2x(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.interpolate(x, scale_factor=2, mode="nearest"))


class _Mid(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.block_1 = ResnetBlock(c, c)
        self.attn_1 = AttnBlock(c)
        self.block_2 = ResnetBlock(c, c)


class _Level(nn.Module):
    """One resolution of the decoder: num_res_blocks + 1 ResnetBlocks (each followed by an AttnBlock at
    the lowest resolution), then a 2x upsample unless it is the full resolution."""

    def __init__(self, cin: int, cout: int, n_blocks: int, attn: bool, upsample: bool):
        super().__init__()
        self.block = nn.ModuleList(ResnetBlock(cin if j == 0 else cout, cout) for j in range(n_blocks))
        self.attn = nn.ModuleList(AttnBlock(cout) for _ in range(n_blocks)) if attn else nn.ModuleList()
        if upsample:
            self.upsample = Upsample2x(cout)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        for j, blk in enumerate(self.block):
            h = blk(h)
            if len(self.attn):
                h = self.attn[j](h)
        return self.upsample(h) if hasattr(self, "upsample") else h


class HartDecoder(nn.Module):
    """(B, Cvae, h, w) -> (B, 3, h * 2^(L-1), w * 2^(L-1)), L = len(ch_mult). `up[i]` is level i (0: full
    resolution); it runs from the lowest resolution up, as released."""

    def __init__(self, cfg: HartTokenizerConfig):
        super().__init__()
        chs = [cfg.ch * m for m in cfg.ch_mult]
        top = len(chs) - 1
        self.conv_in = nn.Conv2d(cfg.z_channels, chs[top], 3, padding=1)
        self.mid = _Mid(chs[top])
        cin_of = [chs[i + 1] if i < top else chs[top] for i in range(len(chs))]   # each level starts from the one below
        self.up = nn.ModuleList(_Level(cin_of[i], chs[i], cfg.num_res_blocks + 1, attn=(i == top), upsample=(i != 0))
                                for i in range(len(chs)))
        self.norm_out = _group_norm(chs[0])
        self.conv_out = nn.Conv2d(chs[0], 3, 3, padding=1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        h = self.mid.block_2(self.mid.attn_1(self.mid.block_1(self.conv_in(z))))
        for level in reversed(self.up):
            h = level(h)
        return self.conv_out(F.silu(self.norm_out(h)))


class HartImageDecoder(nn.Module):
    """`post_quant_conv` + `decoder` of the tokenizer (released names without the `vae.` prefix)."""

    def __init__(self, cfg: HartTokenizerConfig):
        super().__init__()
        self.cfg = cfg
        ks = cfg.quant_conv_ks
        self.post_quant_conv = nn.Conv2d(cfg.z_channels, cfg.z_channels, ks, padding=ks // 2)
        self.decoder = HartDecoder(cfg)

    def fhat_to_img(self, f_hat: torch.Tensor) -> torch.Tensor:
        """(B, Cvae, h, w) -> (B, 3, H, W) in [-1, 1] (clamped, as released)."""
        return self.decoder(self.post_quant_conv(f_hat)).clamp_(-1, 1)

    @torch.no_grad()
    def decode(self, f_hat: torch.Tensor) -> torch.Tensor:
        """f_hat (B, Cvae, h, w) -> uint8 RGB (B, H, W, 3): ((x + 1) * 0.5) * 255, truncated, as released.

        Images decode one at a time, so an image's pixels do not depend on its batch neighbours (a batched
        convolution may pick another kernel; the decoder's 1024 px activations are also large). The map to
        uint8 runs in float32 (the released CUDA run did it in fp16 under autocast: where fp16 rounds x * 255
        across an integer, its pixel differs by 1)."""
        dtype = self.post_quant_conv.weight.dtype
        imgs = [self.fhat_to_img(f.to(dtype)).float() for f in f_hat.split(1)]
        img = torch.cat(imgs).add_(1).mul_(0.5)
        return img.permute(0, 2, 3, 1).mul_(255).to(torch.uint8)


# ---------------------------------------------------------------- building and strict loading

@dataclasses.dataclass(frozen=True)
class QuantizerFields:
    """The HartConfig fields HartQuantizer reads, filled from the tokenizer config (`patch_nums`: the scales
    the AR loop runs, i.e. the transformer's, which the release passes to the quantizer explicitly)."""
    vocab_size: int
    cvae: int
    share_quant_resi: int
    quant_resi: float
    patch_nums: tuple[int, ...]


def quantizer_fields(cfg: HartTokenizerConfig, patch_nums: Optional[tuple[int, ...]] = None) -> QuantizerFields:
    return QuantizerFields(cfg.vocab_size, cfg.z_channels, cfg.share_quant_resi, cfg.quant_resi,
                           tuple(patch_nums or cfg.v_patch_nums))


def build_hart_tokenizer(cfg: str | HartTokenizerConfig, patch_nums: Optional[tuple[int, ...]] = None,
                         device: str | torch.device = "cpu") -> tuple[HartQuantizer, HartImageDecoder]:
    """(quantizer, decoder) with random init; `device="meta"` builds shapes only."""
    cfg = HART_TOKENIZER_PRESETS[cfg] if isinstance(cfg, str) else cfg
    with torch.device(device):
        return HartQuantizer(quantizer_fields(cfg, patch_nums)), HartImageDecoder(cfg)


def dropped_prefixes(cfg: HartTokenizerConfig) -> tuple[str, ...]:
    """Key prefixes of a released tokenizer file that image generation does not use (dropped by name):
    the image encoder and its `quant_conv`, the GAN discriminator, and with `double_decoder` the second
    decoder (upstream's `fhat_to_img` uses the first)."""
    base = ("vae.encoder.", "vae.quant_conv.", "disc.")
    return base + (("vae.decoder2.", "vae.post_quant_conv2.") if cfg.double_decoder else ())


def split_tokenizer_state(sd: dict[str, torch.Tensor], cfg: HartTokenizerConfig, source: str
                          ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """A released tokenizer state dict -> (`quantize.*` keys, decoder keys without `vae.`). Every dropped
    prefix must be present (else `CheckpointMismatch`: not a HART tokenizer file); other keys pass on to the
    strict loads, which name anything unexpected."""
    from varbench.engine.checkpoints import CheckpointMismatch

    drop = dropped_prefixes(cfg)
    absent = [p for p in drop if not any(k.startswith(p) for k in sd)]
    if absent:
        raise CheckpointMismatch(f"{source} has no keys under {absent}: not a released HART tokenizer "
                                 f"(HARTAutoEncoderWithDisc) state dict. fix: point at hart-0.7b-1024px/tokenizer.")
    kept = {k.removeprefix("vae."): v for k, v in sd.items() if not k.startswith(drop)}
    quant = {k: v for k, v in kept.items() if k.startswith("quantize.")}
    return quant, {k: v for k, v in kept.items() if not k.startswith("quantize.")}


def load_tokenizer_state(quant: HartQuantizer, decoder: HartImageDecoder, sd: dict[str, torch.Tensor], source: str) -> None:
    """Strict loads of both parts; missing and unexpected keys named (`checkpoints.load_state_dict_strict`)."""
    from varbench.engine.checkpoints import load_state_dict_strict

    q_sd, d_sd = split_tokenizer_state(sd, decoder.cfg, source)
    load_hart_state(quant, q_sd, source)
    load_state_dict_strict(decoder, d_sd, source=source,
                           hint="check the tokenizer folder's config.json (ch, ch_mult, z_channels) against its weights.")


_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def load_hart_tokenizer(folder: str | os.PathLike, patch_nums: Optional[tuple[int, ...]] = None,
                        device: str | torch.device = "cpu") -> tuple[HartQuantizer, HartImageDecoder]:
    """(quantizer, decoder) from a released `tokenizer/` folder (config.json + weights), loaded strictly,
    in eval mode without gradients. `patch_nums`: the transformer's scales (HartConfig.patch_nums), which
    the quantizer's next-scale inputs follow; default the tokenizer config's own `v_patch_nums`."""
    from varbench.engine.checkpoints import read_state_dict, require_file

    p = require_file(folder, "HART tokenizer folder (hart-0.7b-1024px/tokenizer)", setting="model.vae")
    cfg = hart_tokenizer_config_from_json(require_file(p / "config.json", "HART tokenizer config.json", setting="model.vae"))
    if (p / "model.safetensors.index.json").exists():
        src = p                                  # sharded safetensors (read_state_dict reads the index)
    else:
        src = next((p / n for n in _WEIGHT_FILES if (p / n).exists()), None)
        if src is None:
            require_file(p / _WEIGHT_FILES[0], "HART tokenizer weights", setting="model.vae")
    quant, decoder = build_hart_tokenizer(cfg, patch_nums)
    load_tokenizer_state(quant, decoder, read_state_dict(src), str(src))
    for m in (quant, decoder):
        m.to(device).eval().requires_grad_(False)
    return quant, decoder
