"""The HART text-to-image transformer (mit-han-lab/hart), with the released parameter names.

HART = a next-scale AR transformer over discrete tokens (VAR-style scales, Llama blocks, 2-D RoPE) plus a
small residual diffusion MLP head that samples the continuous remainder of the last scale
(`diffloss.net`, an MLP with AdaLN, 8 respaced IDDPM steps). The modules here hold the weights and the
per-sublayer math; `varbench.engine.backbones.hart.sampling.sample_hart` is the released sampling loop on top of them.

Names and shapes equal the released `HARTForT2I` module tree (`tests/fixtures/keys/hart_0p7b.txt`,
derived from upstream's code), so a released `llm/` folder loads strictly (`load_hart_weights`).
The released code paths reproduced (upstream names in brackets):
- attention [LlamaAttention]: q/k/v from one `qkv_proj` with (q_bias, 0, v_bias); with `attn_l2_norm`
  cosine attention (q, k L2-normalised, q scaled by exp(min(scale_mul_1H11, ln 100)), softmax scale 1),
  else dot-product attention with softmax scale 0.25/sqrt(head_dim); 1-D RoPE on the text tokens at
  stage 0, HART's 2-D RoPE on image tokens (positions scaled to the last grid, offset by the prompt's
  last position id); no mask at inference (each stage sees all earlier stages and itself);
- norms [LlamaRMSNormFused, a CUDA kernel upstream]: RMSNorm *with* a weight even where upstream
  asks for `elementwise_affine=False` (its fused class ignores that flag), computed in fp32 as the
  kernel does (`rms_norm` below is its reference);
- blocks: plain pre-norm blocks with no AdaLN at all (`disable_aln=True, shared_aln=False`, the 0.7B's),
  one `scale_shift_table` per block plus the mask-averaged context (`disable_aln=True, shared_aln=True`),
  or a per-block `ada_lin` on the pooled context (`disable_aln=False`);
- FFN [LlamaMLP]: down(silu(gate(x)) * up(x)).
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path
from typing import Optional

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from varbench.core.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class HartConfig:
    depth: int
    embed_dim: int
    num_heads: int
    context_token: int               # text tokens per prompt (padded); stage 0 is these tokens
    context_dim: int                 # text encoder hidden size (Qwen2-1.5B: 1536)
    patch_nums: tuple[int, ...]
    vocab_size: int                  # tokenizer codebook size
    cvae: int                        # tokenizer latent channels
    mlp_ratio: float = 4.0
    norm_eps: float = 1e-6
    attn_l2_norm: bool = True
    disable_aln: bool = True
    shared_aln: bool = False         # upstream's config default, and the 0.7B's (see HART_PRESETS)
    use_timestep_embed: bool = True
    use_context_norm: bool = True
    sep_aln_pooling_mode: str = "max"
    diff_width: int = 1024
    diff_depth: int = 6
    num_sampling_steps: str = "8"
    share_quant_resi: int = 4        # tokenizer: number of shared phi convs
    quant_resi: float = 0.5

    @property
    def head_dim(self) -> int:
        return self.embed_dim // self.num_heads

    @property
    def ffn_hidden(self) -> int:    # LlamaMLP rule: 8/3 * ratio/4 * C, rounded up to 256
        return int((self.embed_dim * self.mlp_ratio * 2) / 3 + 255) // 256 * 256

    @property
    def total_len(self) -> int:     # context tokens + image tokens of stages 1.. (stage 0 is the context)
        return self.context_token + sum(p * p for p in self.patch_nums[1:])

    def __post_init__(self):
        if self.embed_dim % self.num_heads or self.head_dim % 4:
            raise ConfigError(f"HART needs embed_dim/num_heads divisible by 4 (2-D RoPE); got {self.embed_dim}/{self.num_heads}")
        if self.sep_aln_pooling_mode not in ("max", "avg"):
            raise ConfigError(f"sep_aln_pooling_mode must be 'max' or 'avg', got {self.sep_aln_pooling_mode!r}")


#: 0.7B values: patch_nums from FastVAR's HART port (fastvar_utils.py comment), 300 text tokens from the
#: released sample.py (--max_token_length), context_dim = Qwen2-1.5B hidden size, Cvae/vocab from the
#: released tokenizer config defaults, diffusion 1024x6 (37M parameters, the paper's number).
#: Plain blocks (`disable_aln=True, shared_aln=False`: no scale_shift_table, no ada_lin): FastVAR's HART port,
#: run on hart-0.7b-1024px (its inference.py default path), marks that branch as the one that runs ("# Here!!!" at
#: HART/hart/modules/networks/fastvar_basic.py:1272/1276/1301, FastVARAdaLNSelfAttn.forward, and
#: basic_hart.py:1321/1323/1338, AdaLNSelfAttn.forward) and implements its token pruning only there; upstream's
#: HARTForT2IConfig defaults to shared_aln=False. The remaining flags (depth 24, width 1536, 24 heads, timestep
#: level embedding, context norm, cosine attention) could NOT be checked against the released `llm/config.json`
#: here (no network): the parameter count they give (tests/fixtures/keys/README.md) is the paper's ~732M.
#: `hart_config_from_json` reads the real file when the weights are present, and loading is strict, so a wrong
#: guess is named, not hidden.
HART_PRESETS: dict[str, HartConfig] = {
    "hart_0p7b": HartConfig(depth=24, embed_dim=1536, num_heads=24, context_token=300, context_dim=1536,
                            patch_nums=(1, 2, 3, 4, 5, 7, 9, 12, 16, 21, 27, 36, 48, 64), vocab_size=4096, cvae=32,
                            disable_aln=True, shared_aln=False),
    # tiny random model for CPU tests, the 0.7B's flags (the hart_golden fixture's "plain" case)
    "hart_tiny": HartConfig(depth=2, embed_dim=64, num_heads=2, context_token=8, context_dim=48, patch_nums=(1, 2, 3, 5),
                            vocab_size=640, cvae=8, diff_width=32, diff_depth=2, disable_aln=True, shared_aln=False),
    # the same tiny model on 10 stages up to 16x16 (model=hart_tiny, the harness's CI model): enough stages and
    # tokens for every method's scale knobs and thresholds to mean something (the 4 stages above are the fixture's)
    "hart_tiny10": HartConfig(depth=2, embed_dim=64, num_heads=2, context_token=8, context_dim=48,
                              patch_nums=(1, 2, 3, 4, 5, 6, 8, 10, 13, 16), vocab_size=640, cvae=8, diff_width=32,
                              diff_depth=2, disable_aln=True, shared_aln=False),
}
#: the family's presets under the name every backbone gives them (`varbench.engine.backbones.preset_family`)
PRESETS = HART_PRESETS

#: released config.json keys -> HartConfig fields (the tokenizer's vocab/Cvae come from tokenizer/config.json)
_JSON_FIELDS = ("depth", "embed_dim", "num_heads", "context_token", "context_dim", "patch_nums", "mlp_ratio", "norm_eps",
                "attn_l2_norm", "disable_aln", "shared_aln", "use_timestep_embed", "use_context_norm",
                "sep_aln_pooling_mode", "diff_width", "diff_depth", "num_sampling_steps")


def hart_config_from_json(llm_config: str | os.PathLike, tokenizer_config: Optional[str | os.PathLike] = None) -> HartConfig:
    """A HartConfig from the released `llm/config.json` (+ `tokenizer/config.json` for vocab_size, z_channels).

    Refuses the code paths this module does not implement (gpt2 blocks, cross-attention) by name."""
    cfg = json.loads(Path(llm_config).read_text())
    for key, want in (("attn_type", "llama"), ("mlp_type", "llama"), ("use_cross_attn", False)):
        if cfg.get(key, want) != want:
            raise ConfigError(f"{llm_config}: {key}={cfg[key]!r} is not supported (only the released {key}={want!r})")
    kw = {k: cfg[k] for k in _JSON_FIELDS if k in cfg}
    kw["patch_nums"] = tuple(kw.get("patch_nums", ()))
    tok = json.loads(Path(tokenizer_config).read_text()) if tokenizer_config else {}
    kw["vocab_size"] = tok.get("vocab_size", 4096)
    kw["cvae"] = tok.get("z_channels", 32)
    kw["share_quant_resi"] = tok.get("share_quant_resi", 4)
    kw["quant_resi"] = tok.get("quant_resi", 0.5)
    try:
        return HartConfig(**kw)
    except TypeError as e:
        raise ConfigError(f"{llm_config}: lacks a field HART needs ({e})") from e


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """PyTorch reference of the released CUDA `rms_norm` kernel: s = rsqrt(sum(x^2)/C + eps) in fp32,
    out = (x*s cast to x's dtype) * weight."""
    xf = x.float()
    s = torch.rsqrt(xf.pow(2).sum(-1, keepdim=True) / x.shape[-1] + eps)
    return (xf * s).to(x.dtype) * weight.to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, c: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(c))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rope_1d(pos: torch.Tensor, head_dim: int, base: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin (B, L, head_dim) of the text tokens' 1-D RoPE [LlamaRotaryEmbedding1D]; pos (B, L)."""
    inv = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=pos.device).float() / head_dim))
    freqs = pos.float()[..., None] * inv                    # an outer product, as upstream's 1-long matmul
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def rope_2d(pos: torch.Tensor, head_dim: int, base: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin (B, L, head_dim) of HART's 2-D RoPE [LlamaRotaryEmbedding]; pos (B, L, 2) (row, col).

    Layout as released: [f(row), f(row), f(col), f(col)] with f over head_dim/4 frequencies (stride 4),
    and rotate_half pairs element i with i + head_dim/2 (a row frequency with the same column one)."""
    inv = 1.0 / (base ** (torch.arange(0, head_dim, 4, dtype=torch.int64, device=pos.device).float() / head_dim))
    freqs = pos.float().permute(0, 2, 1)[..., None] * inv   # (B, 2, L, hd/4)
    emb = torch.cat((freqs, freqs), dim=-1).transpose(1, 2).reshape(pos.shape[0], pos.shape[1], -1)
    return emb.cos(), emb.sin()


def stage_positions(patch_nums: tuple[int, ...], si: int, last_text_pos: torch.Tensor) -> torch.Tensor:
    """(B, pn*pn, 2) positions of stage si >= 1: grid coords scaled to the last grid, plus the prompt's
    last position id [get_position_ids + context_position_ids[:, -1]]."""
    pn, largest = patch_nums[si], patch_nums[-1]
    ar = torch.arange(pn, device=last_text_pos.device)
    coords = (torch.stack(torch.meshgrid(ar, ar, indexing="ij"), dim=-1) / pn * largest).reshape(-1, 2)
    return coords.unsqueeze(0) + last_text_pos[:, None, None]


class HartAttention(nn.Module):
    def __init__(self, cfg: HartConfig):
        super().__init__()
        c, h = cfg.embed_dim, cfg.num_heads
        self.num_heads, self.head_dim = h, c // h
        self.attn_l2_norm = cfg.attn_l2_norm
        if cfg.attn_l2_norm:
            self.scale = 1.0
            self.scale_mul_1H11 = nn.Parameter(torch.full((1, h, 1, 1), 4.0).log())
            self.max_scale_mul = torch.log(torch.tensor(100.0, device="cpu")).item()   # upstream's float32 value (cpu: builds on meta too)
        else:
            self.scale = 0.25 / math.sqrt(self.head_dim)
        self.qkv_proj = nn.Linear(c, 3 * c, bias=False)
        self.q_bias = nn.Parameter(torch.zeros(c))
        self.v_bias = nn.Parameter(torch.zeros(c))
        self.register_buffer("zero_k_bias", torch.zeros(c))
        self.proj = nn.Linear(c, c)

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, L, C) -> q, k (normalised, RoPE'd) and v, each (B, H, L, c)."""
        b, l, _ = x.shape
        bias = torch.cat((self.q_bias, self.zero_k_bias, self.v_bias))
        q, k, v = F.linear(x, self.qkv_proj.weight, bias).view(b, l, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        if self.attn_l2_norm:
            q = F.normalize(q, dim=-1).mul(self.scale_mul_1H11.clamp_max(self.max_scale_mul).exp())
            k = F.normalize(k, dim=-1)
        cos, sin = cos.to(v.dtype).unsqueeze(1), sin.to(v.dtype).unsqueeze(1)
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin, v

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        b, _, l, _ = q.shape
        out = F.scaled_dot_product_attention(q, k, v, scale=self.scale)
        return self.proj(out.transpose(1, 2).reshape(b, l, -1))


class LlamaMLP(nn.Module):
    def __init__(self, c: int, hidden: int):
        super().__init__()
        self.gate_proj = nn.Linear(c, hidden, bias=False)
        self.up_proj = nn.Linear(c, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, c, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def context_pooling(cond: torch.Tensor, mask: torch.Tensor, mode: str) -> torch.Tensor:
    """(B, C) pooled context [context_pooling]: mask-weighted mean ('avg', divided before summing as
    released) or max over all text positions, padding included ('max')."""
    if mode == "max":
        return cond.max(1).values
    m = mask.unsqueeze(-1)
    return (cond * m.to(cond.dtype) / m.sum(1).clamp_(1).unsqueeze(1)).sum(1)


class HartBlock(nn.Module):
    """x += g1 * attn(mod1(norm x)); x += g2 * ffn(mod2(norm x)) [AdaLNSelfAttn]."""

    def __init__(self, cfg: HartConfig):
        super().__init__()
        c = cfg.embed_dim
        self.cfg = cfg
        self.attn = HartAttention(cfg)
        self.ffn = LlamaMLP(c, cfg.ffn_hidden)
        self.ln_wo_grad = RMSNorm(c, cfg.norm_eps)
        if not cfg.disable_aln:
            self.ada_lin = nn.Sequential(nn.SiLU(inplace=False), nn.Linear(c, 6 * c))
        elif cfg.shared_aln:
            self.scale_shift_table = nn.Parameter(torch.randn(6, c) / c**0.5)

    def modulation(self, cond: torch.Tensor, mask: torch.Tensor) -> Optional[tuple[torch.Tensor, ...]]:
        """(gamma1, gamma2, scale1, scale2, shift1, shift2), each (B, 1, C); None for plain blocks.
        Constant over a generation (depends only on the prompt)."""
        if not self.cfg.disable_aln:
            pooled = context_pooling(cond, mask, self.cfg.sep_aln_pooling_mode).unsqueeze(1)
            return self.ada_lin(pooled).view(-1, 1, 6, self.cfg.embed_dim).unbind(2)
        if self.cfg.shared_aln:
            return (self.scale_shift_table[None] + context_pooling(cond, mask, "avg").unsqueeze(1)).chunk(6, dim=1)
        return None

    def forward(self, x: torch.Tensor, mod, cos, sin, cache: Optional[list]) -> torch.Tensor:
        """One block at inference; `cache` is this block's [k, v] (appended to, as upstream's kv_caching)."""
        if mod is None:
            h = self.ln_wo_grad(x)
        else:
            g1, g2, s1, s2, b1, b2 = mod
            h = self.ln_wo_grad(x).mul(s1.add(1)).add_(b1)
        q, k, v = self.attn.qkv(h, cos, sin)
        if cache is not None:
            if cache:
                k = torch.cat((cache[0], k), dim=2)
                v = torch.cat((cache[1], v), dim=2)
            cache[:] = [k, v]
        a = self.attn.attend(q, k, v)
        x = x + (a if mod is None else a.mul_(g1))
        if mod is None:
            return x + self.ffn(self.ln_wo_grad(x))
        return x + self.ffn(self.ln_wo_grad(x).mul(s2.add(1)).add_(b2)).mul(g2)


def timestep_embedding(t: torch.Tensor, dim: int, max_period: float = 10000.0) -> torch.Tensor:
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(0, half, dtype=torch.float32, device=t.device) / half)
    args = t[:, None].float() * freqs[None]
    emb = torch.cat((torch.cos(args), torch.sin(args)), dim=-1)
    return torch.cat((emb, torch.zeros_like(emb[:, :1])), dim=-1) if dim % 2 else emb


class TimestepEmbedder(nn.Module):
    """Sinusoidal embedding of a scalar -> MLP (the level embedding with use_timestep_embed, and the
    diffusion head's time embedding)."""

    def __init__(self, c: int, freq_dim: int = 256):
        super().__init__()
        self.freq_dim = freq_dim
        self.mlp = nn.Sequential(nn.Linear(freq_dim, c), nn.SiLU(), nn.Linear(c, c))

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return self.mlp(timestep_embedding(t, self.freq_dim).to(self.mlp[0].weight.dtype))


class AdaLNBeforeHead(nn.Module):
    def __init__(self, c: int, eps: float):
        super().__init__()
        self.c = c
        self.ln_wo_grad = RMSNorm(c, eps)
        self.ada_lin = nn.Sequential(nn.SiLU(inplace=False), nn.Linear(c, 2 * c))

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        if cond.dim() == 3 and cond.shape[1] > 1:   # max-pooled context, as released
            cond = cond.max(1, keepdim=True).values
        scale, shift = self.ada_lin(cond).view(-1, 1, 2, self.c).unbind(2)
        return self.ln_wo_grad(x).mul(scale.add(1)).add_(shift)


# ---------------------------------------------------------------- residual diffusion head (diffloss.net)

class ResBlock(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.in_ln = nn.LayerNorm(c, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(c, c), nn.SiLU(), nn.Linear(c, c))
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(c, 3 * c))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        shift, scale, gate = self.adaLN_modulation(y).chunk(3, dim=-1)
        return x + gate * self.mlp(self.in_ln(x) * (1 + scale) + shift)


class FinalLayer(nn.Module):
    def __init__(self, c: int, out: int):
        super().__init__()
        self.norm_final = nn.LayerNorm(c, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(c, out)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(c, 2 * c))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        shift, scale = self.adaLN_modulation(y).chunk(2, dim=-1)
        return self.linear(self.norm_final(x) * (1 + scale) + shift)


class SimpleMLPAdaLN(nn.Module):
    """The diffusion MLP: predicts (eps, variance fraction) of a Cvae-vector given the timestep and the
    transformer's last-layer feature z."""

    def __init__(self, in_ch: int, width: int, z_ch: int, depth: int):
        super().__init__()
        self.in_channels = in_ch
        self.time_embed = TimestepEmbedder(width)
        self.cond_embed = nn.Linear(z_ch, width)
        self.input_proj = nn.Linear(in_ch, width)
        self.res_blocks = nn.ModuleList(ResBlock(width) for _ in range(depth))
        self.final_layer = FinalLayer(width, 2 * in_ch)

    def forward(self, x: torch.Tensor, t: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        x = self.input_proj(x)
        y = self.time_embed(t) + self.cond_embed(c)
        for blk in self.res_blocks:
            x = blk(x, y)
        return self.final_layer(x, y)

    def forward_with_cfg(self, x: torch.Tensor, t: torch.Tensor, c: torch.Tensor, cfg: float) -> torch.Tensor:
        """Rows [cond; uncond] share the cond half's x; eps is guided, the variance output is not."""
        half = x[: len(x) // 2]
        out = self.forward(torch.cat((half, half)), t, c)
        eps, rest = out[:, : self.in_channels], out[:, self.in_channels:]
        ce, ue = torch.split(eps, len(eps) // 2, dim=0)
        he = ce * (1 + cfg) - cfg * ue
        return torch.cat((torch.cat((he, he)), rest), dim=1)


class DiffLoss(nn.Module):
    """Holds `net` under the released prefix `diffloss.net` (the training loss itself is not ported)."""

    def __init__(self, cfg: HartConfig):
        super().__init__()
        self.net = SimpleMLPAdaLN(cfg.cvae, cfg.diff_width, cfg.embed_dim, cfg.diff_depth)


class _Holder(nn.Module):
    pass


class HART(nn.Module):
    def __init__(self, cfg: HartConfig):
        super().__init__()
        self.cfg = cfg
        c = cfg.embed_dim
        self.word_embed = nn.Linear(cfg.cvae, c)
        self.context_embed = nn.Linear(cfg.context_dim, c)
        if cfg.use_context_norm:
            self.context_norm = RMSNorm(cfg.context_dim, cfg.norm_eps)
        self.lvl_embed = TimestepEmbedder(c) if cfg.use_timestep_embed else nn.Embedding(len(cfg.patch_nums), c)
        self.blocks = nn.ModuleList(HartBlock(cfg) for _ in range(cfg.depth))
        self.head_nm = AdaLNBeforeHead(c, cfg.norm_eps)
        self.head = nn.Linear(c, cfg.vocab_size)
        self.decoder_norm = RMSNorm(c, cfg.norm_eps)
        self.diffloss = DiffLoss(cfg)

    def embed_context(self, text: torch.Tensor) -> torch.Tensor:
        """(rows, context_token, context_dim) -> (rows, context_token, C): both the stage-0 tokens and the condition."""
        return self.context_embed(self.context_norm(text) if self.cfg.use_context_norm else text)

    def level_embeddings(self) -> torch.Tensor:
        """(1, total_len, C) per-position level embedding (0 for text, i for stage i) [lvl_embed(lvl_1L)]."""
        cfg = self.cfg
        lvl = torch.cat([torch.zeros(cfg.context_token, dtype=torch.long)] +
                        [torch.full((p * p,), i + 1, dtype=torch.long) for i, p in enumerate(cfg.patch_nums[1:])])
        lvl = lvl.to(self.word_embed.weight.device)
        return self.lvl_embed(lvl).unsqueeze(0)

    def logits(self, h: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        """(rows, L, V) token logits in fp32 [get_logits]."""
        return self.head(self.head_nm(h.float(), cond).float()).float()


class HartQuantizer(nn.Module):
    """The part of the hybrid tokenizer the AR loop uses: the codebook and the shared phi convs
    (`quantize.*` keys of the released tokenizer; the encoder/decoder are not ported yet)."""

    def __init__(self, cfg: HartConfig):
        super().__init__()
        self.cfg = cfg
        self.embedding = nn.Embedding(cfg.vocab_size, cfg.cvae)
        self.quant_resi = _Holder()
        self.quant_resi.qresi_ls = nn.ModuleList(nn.Conv2d(cfg.cvae, cfg.cvae, 3, padding=1) for _ in range(cfg.share_quant_resi))
        k = cfg.share_quant_resi
        self.ticks = np.linspace(1 / 3 / k, 1 - 1 / 3 / k, k) if k == 4 else np.linspace(1 / 2 / k, 1 - 1 / 2 / k, k)

    def phi(self, h: torch.Tensor, at: float) -> torch.Tensor:
        """phi_k(h) = (1 - r) h + r conv_k(h), k the tick nearest `at` in [0, 1] [PhiPartiallyShared]."""
        conv = self.quant_resi.qresi_ls[int(np.argmin(np.abs(self.ticks - at)))]
        r = abs(self.cfg.quant_resi)
        return h.mul(1 - r) + conv(h).mul_(r)

    def next_input(self, si: int, f_hat: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add stage si's (B, Cvae, pn, pn) to f_hat (in place, upsampled + phi) and return f_hat and the next
        stage's input grid (area-downsampled f_hat) [get_next_autoregressive_input]."""
        pns = self.cfg.patch_nums
        big = pns[-1]
        f_hat.add_(self.phi(F.interpolate(h, size=(big, big), mode="bicubic"), si / (len(pns) - 1)))
        return f_hat, F.interpolate(f_hat, size=(pns[si + 1], pns[si + 1]), mode="area")


#: persistent buffers of the released training module that inference rebuilds (dropped on load)
HART_IGNORED_KEYS = ("lvl_1L", "attn_bias_for_masking")
QUANT_IGNORED_KEYS = ("ema_vocab_hit_SV",)


def build_hart(preset: str | HartConfig, device: str | torch.device = "cpu") -> HART:
    """Build a preset (random init). `device="meta"` builds shapes only."""
    cfg = HART_PRESETS[preset] if isinstance(preset, str) else preset
    with torch.device(device):
        return HART(cfg)


def build_hart_quantizer(preset: str | HartConfig, device: str | torch.device = "cpu") -> HartQuantizer:
    cfg = HART_PRESETS[preset] if isinstance(preset, str) else preset
    with torch.device(device):
        return HartQuantizer(cfg)


def load_hart_state(model: nn.Module, sd: dict, source: str) -> None:
    """Strict load of a HART transformer (or, for a HartQuantizer, the tokenizer's `quantize.*` keys):
    every missing and unexpected key named (`checkpoints.load_state_dict_strict`)."""
    from varbench.engine.checkpoints import load_state_dict_strict

    if isinstance(model, HartQuantizer):
        sd = {k.removeprefix("quantize."): v for k, v in sd.items() if k.startswith("quantize.")}
        sd = {k: v for k, v in sd.items() if k not in QUANT_IGNORED_KEYS}
        hint = "check that the tokenizer folder matches the preset (vocab_size, z_channels, share_quant_resi)."
    else:
        sd = {k.removeprefix("module."): v for k, v in sd.items() if k not in HART_IGNORED_KEYS}
        hint = "check that the model preset matches the folder's config.json (see hart_config_from_json)."
    load_state_dict_strict(model, sd, source=source, hint=hint)


def load_hart_weights(model: HART, folder: str | os.PathLike, ema: bool = True) -> None:
    """Load a released `llm/` folder: `ema_model.bin` (what sample.py uses by default) or the safetensors /
    `pytorch_model.bin` weights."""
    from varbench.engine.checkpoints import read_state_dict, require_file

    p = require_file(folder, "HART transformer folder (hart-0.7b-1024px/llm)")
    cands = (["ema_model.bin"] if ema else []) + ["model.safetensors", "pytorch_model.bin"]
    for name in cands:
        if (p / name).exists():
            load_hart_state(model, read_state_dict(p / name), str(p / name))
            return
    require_file(p / cands[0], "HART transformer weights")
