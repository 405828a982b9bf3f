"""The Infinity transformer, with the released parameter names, as modules the runtime drives.

Parameter names and shapes equal the released checkpoints (`tests/fixtures/keys/infinity_*.txt`),
so `infinity_2b_reg.pth` and the 8B shards load unchanged. The modules hold weights and the
per-sublayer math; the next-scale loop, KV cache, pruning and sampling live in `varbench.engine.backbones.infinity.runtime`.

Numerics follow the released inference path:
- AdaLN modulation in fp32: (ada_gss + shared_ada_lin(cond)) -> gamma1, gamma2, scale1, scale2,
  shift1, shift2; LayerNorm without affine, eps 1e-6.
- Self-attention: q/k L2-normalised, q scaled by exp(min(scale_mul_1H11, ln 100)), 2-D RoPE after
  normalisation, softmax scale 1, no mask (each scale sees all earlier scales and itself).
- Cross-attention: plain 1/sqrt(d) attention over the prompt's own text tokens (varlen); the
  released code always runs it through flash-attn in bf16 (P rounded to bf16 before P.V), which
  `ca_bf16` reproduces with SDPA on bf16 tensors.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclasses.dataclass(frozen=True)
class InfinityConfig:
    depth: int
    embed_dim: int
    num_heads: int
    codebook_dim: int            # bits per transformer token (d_vae; 4x the VAE's for patchify)
    text_channels: int = 2048    # flan-t5-xl hidden size
    text_maxlen: int = 512
    mlp_ratio: float = 4.0
    block_chunks: int = 8
    norm_eps: float = 1e-6
    num_levels: int = 15         # lvl_embed rows
    patchify: bool = False       # 8B: 2x2 spatial patchify between transformer grid and VAE grid
    pool_head_dim: Optional[int] = None  # TextAttentivePool head dim; None = released rule (128, or 64 above 4096)
    vae: str = "d32reg"          # matching VAE preset

    @property
    def head_dim(self) -> int:
        return self.embed_dim // self.num_heads

    @property
    def ffn_hidden(self) -> int:
        return round(self.embed_dim * self.mlp_ratio / 256) * 256

    @property
    def vae_codebook_dim(self) -> int:
        return self.codebook_dim // 4 if self.patchify else self.codebook_dim


PRESETS: dict[str, InfinityConfig] = {
    "infinity_2b": InfinityConfig(depth=32, embed_dim=2048, num_heads=16, codebook_dim=32, vae="d32reg"),
    "infinity_8b": InfinityConfig(depth=40, embed_dim=3584, num_heads=28, codebook_dim=56, patchify=True,
                                  vae="d56_f8_14_patchify"),
    # A tiny random model for CPU tests: same classes, same code paths.
    "tiny": InfinityConfig(depth=4, embed_dim=64, num_heads=2, codebook_dim=16, text_channels=64, text_maxlen=16,
                           block_chunks=2, pool_head_dim=32, vae="toy"),
    # The trained toy-world model (varbench/toy: weights shipped in-repo, schedule TOY_SCHEDULE to 16x16).
    "toy": InfinityConfig(depth=6, embed_dim=128, num_heads=4, codebook_dim=16, text_channels=64, text_maxlen=16,
                          block_chunks=2, pool_head_dim=32, vae="toy"),
}


class TextRMSNorm(nn.Module):
    """RMSNorm with affine weight (the released `text_norm`), computed in fp32."""

    def __init__(self, c: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(c))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return ((xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True).add_(self.eps))) * self.weight).to(x.dtype)


KeyRuns = tuple[tuple[int, int, int], ...]


def key_runs(key_mask: torch.Tensor, lens: Optional[list[int]] = None) -> KeyRuns:
    """Maximal runs of rows with the same key length: ((row0, row1, length), ...). Reads the mask on
    the host (unless the row lengths `lens` are given), so compute it once per generation (text is
    constant over the loop), not per block."""
    lens = key_mask.sum(1).tolist() if lens is None else lens
    runs, r0 = [], 0
    for r in range(1, len(lens) + 1):
        if r == len(lens) or lens[r] != lens[r0]:
            runs.append((r0, r, int(lens[r0])))
            r0 = r
    return tuple(runs)


def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor, scale: float,
                     bf16: bool, runs: Optional[KeyRuns] = None) -> torch.Tensor:
    """Attention of q (B, H, Lq, c) over padded k/v (B, H, Lk, c) with key_mask (B, Lk) True = real.

    `bf16` computes as the released flash-attn varlen call does: q, k, v in bf16, each sequence
    attending to its own keys only, the softmax numerators P rounded to bf16 before P.V, the output
    in bf16 (returned in q's dtype). SDPA on bf16 tensors without a mask rounds the same way (CPU and
    CUDA flash kernels), so each run of equal-length rows is one unmasked call on keys [:length].
    `runs` are `key_runs(key_mask)`, passed in by callers that already have them.
    `bf16=False` is exact fp32 attention over the mask (a reference, not the released numerics).
    """
    if not bf16:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask[:, None, None, :], scale=scale)
    out_dtype = q.dtype
    q, k, v = (t.to(torch.bfloat16) for t in (q, k, v))
    runs = key_runs(key_mask) if runs is None else runs
    if len(runs) == 1:
        n = runs[0][2]
        out = F.scaled_dot_product_attention(q, k[:, :, :n], v[:, :, :n], scale=scale)
    else:
        out = torch.cat([F.scaled_dot_product_attention(q[a:b], k[a:b, :, :n], v[a:b, :, :n], scale=scale)
                         for a, b, n in runs])
    return out.to(out_dtype)


class CrossAttention(nn.Module):
    """Cross-attention to text (`ca` in blocks) or, with `for_attn_pool`, a 1-query attentive pool."""

    def __init__(self, embed_dim: int, kv_dim: int, num_heads: int, for_attn_pool: bool = False):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, embed_dim // num_heads
        self.scale = 1 / math.sqrt(self.head_dim)
        self.for_attn_pool = for_attn_pool
        if for_attn_pool:
            self.mat_q = nn.Parameter(torch.zeros(1, num_heads, self.head_dim))
        else:
            self.mat_q = nn.Linear(embed_dim, embed_dim, bias=True)
        self.mat_kv = nn.Linear(kv_dim, embed_dim * 2, bias=False)
        self.v_bias = nn.Parameter(torch.zeros(embed_dim))
        self.register_buffer("zero_k_bias", torch.zeros(embed_dim))
        self.proj = nn.Linear(embed_dim, embed_dim)

    def text_kv(self, text: torch.Tensor, key_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Project padded text (B, Lk, kv_dim) to per-head K, V (B, H, Lk, c). Constant per generation."""
        b, lk, _ = text.shape
        kv = F.linear(text, self.mat_kv.weight, torch.cat((self.zero_k_bias, self.v_bias)))
        kv = kv.view(b, lk, 2, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        return kv[0], kv[1]

    def attend(self, x: Optional[torch.Tensor], k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor,
               bf16: bool = True, runs: Optional[KeyRuns] = None) -> torch.Tensor:
        if self.for_attn_pool:
            b = k.shape[0]
            q = self.mat_q.to(k.dtype).expand(b, -1, -1).unsqueeze(2)          # (B, H, 1, c)
        else:
            b, lq, _ = x.shape
            q = self.mat_q(x).view(b, lq, self.num_heads, self.head_dim).transpose(1, 2)
        out = varlen_attention(q, k, v, key_mask, self.scale, bf16, runs)
        out = out.transpose(1, 2).reshape(b, -1, self.num_heads * self.head_dim)
        return self.proj(out)


class TextAttentivePool(nn.Module):
    """Pools the text tokens into one vector: the SOS token and the AdaLN condition."""

    def __init__(self, ct5: int, d: int, head_dim: Optional[int] = None):
        super().__init__()
        head_dim = head_dim or (64 if d > 4096 else 128)
        self.ca = CrossAttention(embed_dim=d, kv_dim=ct5, num_heads=ct5 // head_dim, for_attn_pool=True)

    def forward(self, text: torch.Tensor, key_mask: torch.Tensor, bf16: bool = True) -> torch.Tensor:
        k, v = self.ca.text_kv(text, key_mask)
        return self.ca.attend(None, k, v, key_mask, bf16).squeeze(1)


class SelfAttention(nn.Module):
    """Cosine self-attention weights; the runtime calls `qkv` and `attend` around its KV cache."""

    def __init__(self, embed_dim: int, num_heads: int):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, embed_dim // num_heads
        self.scale_mul_1H11 = nn.Parameter(torch.full((1, num_heads, 1, 1), 4.0).log())
        self.max_scale_mul = math.log(100)
        self.mat_qkv = nn.Linear(embed_dim, embed_dim * 3, bias=False)
        self.q_bias = nn.Parameter(torch.zeros(embed_dim))
        self.v_bias = nn.Parameter(torch.zeros(embed_dim))
        self.register_buffer("zero_k_bias", torch.zeros(embed_dim))
        self.proj = nn.Linear(embed_dim, embed_dim)

    def qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, L, C) -> normalised, scaled q and normalised k (fp32), v; each (B, H, L, c). No RoPE yet."""
        b, l, _ = x.shape
        bias = torch.cat((self.q_bias, self.zero_k_bias, self.v_bias))
        q, k, v = F.linear(x, self.mat_qkv.weight, bias).view(b, l, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        scale_mul = self.scale_mul_1H11.clamp_max(self.max_scale_mul).exp()
        q = F.normalize(q, dim=-1, eps=1e-12).mul(scale_mul)
        k = F.normalize(k, dim=-1, eps=1e-12)
        return q, k, v

    def out(self, attn: torch.Tensor) -> torch.Tensor:
        """attn (B, H, L, c) -> (B, L, C) through the output projection."""
        b, h, l, c = attn.shape
        return self.proj(attn.transpose(1, 2).reshape(b, l, h * c))


class FFN(nn.Module):
    def __init__(self, c: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(c, hidden)
        self.act = nn.GELU(approximate="tanh")
        self.fc2 = nn.Linear(hidden, c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class CrossAttnBlock(nn.Module):
    """One t2i block: x += g1*SA(mod(LN x)); x += CA(LN_affine x); x += g2*FFN(mod(LN x))."""

    def __init__(self, cfg: InfinityConfig):
        super().__init__()
        c = cfg.embed_dim
        self.eps = cfg.norm_eps
        self.sa = SelfAttention(c, cfg.num_heads)
        self.ca = CrossAttention(c, c, cfg.num_heads)
        self.ffn = FFN(c, cfg.ffn_hidden)
        self.ca_norm = nn.LayerNorm(c, eps=cfg.norm_eps)
        self.ada_gss = nn.Parameter(torch.randn(1, 1, 6, c) / c**0.5)

    def modulation(self, shared_gss: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(gamma1, gamma2, scale1, scale2, shift1, shift2), each (rows, 1, C), in fp32."""
        return (self.ada_gss.float() + shared_gss.float()).unbind(2)

    def modulated_norm(self, x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x.float(), (x.shape[-1],), eps=self.eps).mul(scale.add(1)).add_(shift)


class AdaLNBeforeHead(nn.Module):
    def __init__(self, c: int, d: int, eps: float):
        super().__init__()
        self.eps = eps
        self.ada_lin = nn.Sequential(nn.SiLU(inplace=False), nn.Linear(d, 2 * c))

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        scale, shift = self.ada_lin(cond).view(-1, 1, 2, x.shape[-1]).unbind(2)
        return F.layer_norm(x, (x.shape[-1],), eps=self.eps).mul(scale.add(1)).add_(shift)


class _Chunk(nn.Module):
    """A chunk of blocks under `block_chunks.{c}.module.{j}`, the released key layout."""

    def __init__(self, blocks: list[nn.Module]):
        super().__init__()
        self.module = nn.ModuleList(blocks)


class SharedAdaLin(nn.Linear):
    def forward(self, cond: torch.Tensor) -> torch.Tensor:
        return super().forward(cond).reshape(-1, 1, 6, self.weight.shape[0] // 6)


class Infinity(nn.Module):
    def __init__(self, cfg: InfinityConfig):
        super().__init__()
        if cfg.depth % cfg.block_chunks:
            raise ValueError(f"depth {cfg.depth} is not divisible by block_chunks {cfg.block_chunks}")
        self.cfg = cfg
        c, ct5 = cfg.embed_dim, cfg.text_channels
        init_std = math.sqrt(1 / c / 3)
        uncond = torch.empty(cfg.text_maxlen, ct5)
        nn.init.trunc_normal_(uncond, std=1.2, generator=torch.Generator().manual_seed(0))
        self.cfg_uncond = nn.Parameter(uncond / ct5**0.5)
        self.text_norm = TextRMSNorm(ct5, cfg.norm_eps)
        self.text_proj_for_sos = TextAttentivePool(ct5, c, cfg.pool_head_dim)
        self.text_proj_for_ca = nn.Sequential(nn.Linear(ct5, c), nn.GELU(approximate="tanh"), nn.Linear(c, c))
        self.pos_start = nn.Parameter(torch.randn(1, 1, c) * init_std)
        self.lvl_embed = nn.Embedding(cfg.num_levels, c)
        nn.init.trunc_normal_(self.lvl_embed.weight, std=init_std)
        self.word_embed = nn.Linear(cfg.codebook_dim, c)
        self.shared_ada_lin = nn.Sequential(nn.SiLU(inplace=False), SharedAdaLin(c, 6 * c))
        per = cfg.depth // cfg.block_chunks
        blocks = [CrossAttnBlock(cfg) for _ in range(cfg.depth)]
        self.block_chunks = nn.ModuleList(_Chunk(blocks[i * per:(i + 1) * per]) for i in range(cfg.block_chunks))
        self.head_nm = AdaLNBeforeHead(c, c, cfg.norm_eps)
        self.head = nn.Linear(c, 2 * cfg.codebook_dim)

    @property
    def blocks(self) -> list[CrossAttnBlock]:
        return [b for chunk in self.block_chunks for b in chunk.module]

    def logits(self, h: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        """Per-bit 2-way logits (rows, L, 2d), in fp32 as released."""
        return self.head(self.head_nm(h.float(), cond.float()))


def build_infinity(preset: str | InfinityConfig, device: str | torch.device = "cpu") -> Infinity:
    """Build a preset (random init). `device="meta"` builds shapes only (no memory)."""
    cfg = PRESETS[preset] if isinstance(preset, str) else preset
    with torch.device(device):
        return Infinity(cfg)
