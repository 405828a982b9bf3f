"""One Infinity block at one scale, with as few dispatched ops as the math allows.

Everything that is constant over a generation is prepared once per block (`BlockConsts`): the
AdaLN modulation, the cosine-attention scale, transposed weights expanded over the rows (so every
linear is one `baddbmm` on (rows, n, C)), the prompt's cross-attention K/V in the dtype the
attention kernel takes. A full block then dispatches about 40 aten ops (CPU, fp32, CFG on;
`experiments/runtime_ops.py` counts them). On a GPU each op is a kernel launch or a host-side view,
so this is what an eager scale step costs before any CUDA graph.

Numerics are the released ones (`varbench/engine/backbones/infinity/model.py` documents them); the fused forms
below change results only in the last ulp (fused multiply-adds), which the upstream golden tests
check at the level of sampled bits:
- modulated LayerNorm: `addcmul(shift, LN(x), 1 + scale)`; residual: `addcmul(x, branch, gamma)`;
- q and k are normalised together, in place, as `F.normalize` does (x / max(||x||, 1e-12)), then q
  takes its per-head scale (k is multiplied by exactly 1);
- RoPE is one complex multiply of (q, k, v) by a per-scale table whose v slot is 1 + 0i (exact), so
  q, k and v leave it in one tensor and K/V go to the cache in one copy.

dtypes (bf16 runtime, as the released autocast run computes): block weights bf16, the residual
stream and every LayerNorm fp32, linears in bf16 with bf16 outputs, q/k normalisation and RoPE in
fp32, attention in bf16 (the KV cache holds bf16: the released fp32 K is cast to bf16 at every
attention call, which rounds to the same values), branch outputs added to the fp32 stream.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional

import torch
import torch.nn.functional as F

from varbench.engine.backbones.infinity.model import CrossAttnBlock, KeyRuns, varlen_attention


def _expand_t(weight: torch.Tensor, rows: int) -> torch.Tensor:
    """(out, in) weight -> (rows, in, out) view: `baddbmm(bias, x, w)` is then x @ W^T + b.
    A quantised weight (`runtime.quant`, a torchao tensor subclass) has no such view: it stays the
    (out, in) weight, and `linear` calls `F.linear` on it (varbench/engine/backbones/infinity/quant.py)."""
    if type(weight) not in (torch.Tensor, torch.nn.Parameter):
        return weight
    return weight.t().expand(rows, -1, -1)


@dataclasses.dataclass
class BlockConsts:
    """What one block needs at every scale of a generation, prepared once (rows = [cond; uncond])."""

    g1: torch.Tensor            # (rows, 1, C) fp32: gamma of the SA branch
    g2: torch.Tensor            # gamma of the FFN branch
    scale1: torch.Tensor        # 1 + AdaLN scale before SA
    shift1: torch.Tensor
    scale2: torch.Tensor        # 1 + AdaLN scale before the FFN
    shift2: torch.Tensor
    qk_scale: torch.Tensor      # (2, H, 1, 1) fp32: the cosine-attention scale for q, 1 for k
    w_qkv: torch.Tensor         # (rows, C, 3C) and the fused [q_bias, 0, v_bias]
    b_qkv: torch.Tensor
    w_sa: torch.Tensor
    b_sa: torch.Tensor
    ca_norm_w: torch.Tensor     # fp32 affine of the cross-attention LayerNorm
    ca_norm_b: torch.Tensor
    w_caq: torch.Tensor
    b_caq: torch.Tensor
    w_ca: torch.Tensor
    b_ca: torch.Tensor
    w_fc1: torch.Tensor
    b_fc1: torch.Tensor
    w_fc2: torch.Tensor
    b_fc2: torch.Tensor
    text_k: torch.Tensor        # (rows, H, L, c) prompt keys / values, already in the kernel's dtype
    text_v: torch.Tensor
    text_mask: torch.Tensor     # (rows, L) bool
    text_runs: KeyRuns          # rows sharing a text length (see `key_runs`)
    ca_bf16: bool
    eps: float
    heads: int

    #: fields that depend on the prompt (refilled in place when graph mode reuses the tensors)
    PER_PROMPT = ("g1", "g2", "scale1", "shift1", "scale2", "shift2", "text_k", "text_v", "text_mask")

    @classmethod
    def build(cls, block: CrossAttnBlock, shared_gss: torch.Tensor, ca_text: torch.Tensor, ca_mask: torch.Tensor,
              runs: KeyRuns, ca_bf16: bool) -> "BlockConsts":
        rows = shared_gss.shape[0]
        wdt = block.sa.mat_qkv.weight.dtype
        g1, g2, s1, s2, sh1, sh2 = block.modulation(shared_gss)
        sa, ca, ffn = block.sa, block.ca, block.ffn
        # clamp in the weights' dtype, exp in fp32: what autocast does with a bf16 scale_mul_1H11
        q_scale = sa.scale_mul_1H11.clamp_max(sa.max_scale_mul).float().exp().view(-1, 1, 1)
        qk_scale = torch.stack([q_scale, torch.ones_like(q_scale)])
        tk, tv = ca.text_kv(ca_text.to(wdt), ca_mask)
        if ca_bf16:
            tk, tv = tk.to(torch.bfloat16), tv.to(torch.bfloat16)
            if len(runs) == 1:  # one text length: the attention call reads exactly the real keys
                tk, tv = tk[:, :, :runs[0][2]], tv[:, :, :runs[0][2]]
        return cls(
            g1=g1, g2=g2, scale1=s1.add(1), shift1=sh1, scale2=s2.add(1), shift2=sh2, qk_scale=qk_scale,
            w_qkv=_expand_t(sa.mat_qkv.weight, rows), b_qkv=torch.cat((sa.q_bias, sa.zero_k_bias.to(wdt), sa.v_bias)),
            w_sa=_expand_t(sa.proj.weight, rows), b_sa=sa.proj.bias,
            ca_norm_w=block.ca_norm.weight.float(), ca_norm_b=block.ca_norm.bias.float(),
            w_caq=_expand_t(ca.mat_q.weight, rows), b_caq=ca.mat_q.bias,
            w_ca=_expand_t(ca.proj.weight, rows), b_ca=ca.proj.bias,
            w_fc1=_expand_t(ffn.fc1.weight, rows), b_fc1=ffn.fc1.bias,
            w_fc2=_expand_t(ffn.fc2.weight, rows), b_fc2=ffn.fc2.bias,
            text_k=tk, text_v=tv, text_mask=ca_mask, text_runs=runs, ca_bf16=ca_bf16, eps=block.eps,
            heads=sa.num_heads)

    def first_rows(self, rows: int) -> "BlockConsts":
        """The same constants for the first `rows` rows (the conditional half after `drop_uncond`)."""
        def cut(name, v):
            if not isinstance(v, torch.Tensor) or v.dim() < 2 or v is self.qk_scale:
                return v
            if name.startswith("w_") and v.dim() == 2:   # a quantised (out, in) weight: no rows to cut
                return v
            return v[:rows]
        fields = {f.name: cut(f.name, getattr(self, f.name)) for f in dataclasses.fields(self)}
        fields["text_runs"] = tuple((a, min(b, rows), n) for a, b, n in self.text_runs if a < rows)
        return dataclasses.replace(self, **fields)

    @property
    def wdtype(self) -> torch.dtype:
        return self.w_qkv.dtype


def _dense_as(t: torch.Tensor, strides: tuple[int, ...]) -> bool:
    """t has these strides (dims of size 1 may have any stride)."""
    return all(st == want for size, st, want in zip(t.shape, t.stride(), strides) if size > 1)


def split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """(rows, n, H*c) -> (rows, H, n, c) as one view op (`as_strided`) when x is dense."""
    rows, n, hc = x.shape
    # compiled (runtime.compile): the plain view, which the compiler can trace (storage offsets it cannot)
    if not torch.compiler.is_compiling() and _dense_as(x, (n * hc, hc, 1)):
        return x.as_strided((rows, heads, n, hc // heads), (n * hc, hc // heads, hc, 1), x.storage_offset())
    return x.view(rows, n, heads, -1).transpose(1, 2)


def merge_heads(o: torch.Tensor) -> torch.Tensor:
    """Attention output (rows, H, n, c) -> (rows, n, H*c). The flash kernels (CPU and CUDA) write
    their output token-major, so this is one view op; any other layout is copied."""
    rows, h, n, c = o.shape
    if not torch.compiler.is_compiling() and _dense_as(o, (n * h * c, c, h * c, 1)):
        return o.as_strided((rows, n, h * c), (n * h * c, h * c, 1), o.storage_offset())
    return o.transpose(1, 2).reshape(rows, n, h * c)


def modulated_norm(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, eps: float) -> torch.Tensor:
    """LayerNorm without affine, then the per-row AdaLN (1 + scale, shift), in fp32."""
    return torch.addcmul(shift, F.layer_norm(x, (x.shape[-1],), eps=eps), scale)


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """x (rows, n, in) in the weights' dtype @ W^T + b, one baddbmm; a quantised (out, in) weight
    (`runtime.quant`): `F.linear`, which torchao's weight subclass serves with its kernel."""
    x = x if x.dtype == w.dtype else x.to(w.dtype)
    if w.dim() == 2:
        return F.linear(x, w, b)
    return torch.baddbmm(b, x, w)


def qkv_rope(bc: BlockConsts, xin: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Modulated input (rows, n, C) -> (3, rows, H, n, c) fp32 (a view): cosine-normalised, scaled q;
    normalised k; v; q and k rotated by the scale's RoPE `table` ((n or rows x n), 3, 1, c/2, complex)."""
    rows, n, _ = xin.shape
    qkv = linear(xin, bc.w_qkv, bc.b_qkv).view(rows, n, 3, bc.heads, -1, 2)
    if qkv.dtype != torch.float32:  # bf16 run: normalise in fp32 (v converts exactly)
        qkv = qkv.float()
    qk = qkv[:, :, :2]
    qk.div_(torch.linalg.vector_norm(qk, dim=(-2, -1), keepdim=True).clamp_min_(1e-12)).mul_(bc.qk_scale)
    rot = torch.view_as_real(torch.view_as_complex(qkv) * table)        # dense (rows, n, 3, H, c/2, 2)
    hc = rot.shape[3] * rot.shape[4] * 2
    c = hc // bc.heads
    return rot.as_strided((3, rows, bc.heads, n, c), (hc, n * 3 * hc, c, 3 * hc, 1))


def sa_out(bc: BlockConsts, attn: torch.Tensor) -> torch.Tensor:
    """Attention output (rows, H, n, c) -> the SA branch before its gate, (rows, n, C)."""
    return linear(merge_heads(attn), bc.w_sa, bc.b_sa)


def cross_attention(bc: BlockConsts, x: torch.Tensor) -> torch.Tensor:
    """The CA branch for tokens x (rows, n, C): affine LayerNorm, q projection, attention over the
    prompt's keys (flash-attn's bf16 rounding when `ca_bf16`), output projection."""
    xn = F.layer_norm(x, (x.shape[-1],), bc.ca_norm_w, bc.ca_norm_b, bc.eps)
    q = split_heads(linear(xn, bc.w_caq, bc.b_caq), bc.heads)
    if bc.ca_bf16 and len(bc.text_runs) == 1:
        out = F.scaled_dot_product_attention(q.to(torch.bfloat16), bc.text_k, bc.text_v,
                                             scale=1 / math.sqrt(q.shape[-1]))
    else:
        out = varlen_attention(q, bc.text_k, bc.text_v, bc.text_mask, 1 / math.sqrt(q.shape[-1]), bc.ca_bf16,
                               bc.text_runs)
    return linear(merge_heads(out), bc.w_ca, bc.b_ca)


def ffn(bc: BlockConsts, x: torch.Tensor) -> torch.Tensor:
    """The FFN branch (before its gate) for tokens x (rows, n, C)."""
    h = linear(modulated_norm(x, bc.scale2, bc.shift2, bc.eps), bc.w_fc1, bc.b_fc1)
    return linear(F.gelu(h, approximate="tanh"), bc.w_fc2, bc.b_fc2)


def rope_qkv_table(table: torch.Tensor) -> torch.Tensor:
    """`rope_table` (2, n, c/2) cos/sin -> (n, 3, 1, c/2) complex: q and k rotate, v (slot 2) gets 1."""
    rot = torch.complex(table[0], table[1])
    return torch.stack([rot, rot, torch.ones_like(rot)], dim=1).unsqueeze(2)
