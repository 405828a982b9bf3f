"""Flash attention with per-query attention entropy in the same pass (ToProVAR "Flash Attention Entropy").

One Triton program per (row * head, block of BLOCK_M queries) streams over all keys in blocks of
BLOCK_N (FlashAttention-2 forward, no mask: in Infinity's KV-cache self-attention every query of the
current scale sees every cached key). Besides the usual online-softmax state (running max m, running
sum of exponentials l, output accumulator) each query keeps

    a = sum_j exp(s_j - m) * (s_j - m)        (rescaled whenever m changes)

so that at the end  H = log(l) - a / l  =  logsumexp(s) - sum_j softmax(s)_j * s_j,
the Shannon entropy (nats) of that query's attention distribution. This is the brief's
H = m + log(l) - (sum exp(s - m) * s) / l written relative to the running max, which avoids the
cancellation between two O(|s|) terms. When the max moves from m_old to m_new the accumulator becomes
a_new = exp(m_old - m_new) * (a_old + (m_old - m_new) * l_old) + sum_block p * (s - m_new).

Numerics follow flash-attn: q, k, v in bf16 (or fp16); S = q k^T accumulated in fp32 and scaled in
fp32; softmax state, l and the entropy in fp32; P = exp(S - m) is rounded to the input dtype before
the P V product (fp32 accumulation); O is normalised by l in fp32 and stored in the input dtype.

Inputs that are neither bf16 nor fp16 (fp32) are cast to bf16 for the kernel and the output is cast
back to q's dtype (the entropy is then that of the bf16-rounded q, k). The PyTorch fallback (CPU
tensors, or force_triton=False) does NOT round through bf16: `F.scaled_dot_product_attention` in q's
dtype plus the chunked fp32 `varbench.engine.attention.attention_entropy`, i.e. what the runtime did before.
"""
from __future__ import annotations

import os
from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from varbench.engine.attention import attention_entropy

__all__ = ["flash_attention_with_entropy", "entropy_reference_per_head", "MAX_HEAD_DIM"]

try:  # the PyTorch fallback works without Triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    tl = None

MAX_HEAD_DIM = 256
_KERNEL_DTYPES = (torch.bfloat16, torch.float16)


def _flash_entropy_fwd(
    Q, K, V, O, ENT, KB,
    sqb, sqh, sqm, sqd,
    skb, skh, skn, skd,
    svb, svh, svn, svd,
    sob, soh, som, sod,
    skbb,
    n_heads, Lq, Lk, D, qk_scale,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, EMULATE_BF16: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):
    # Written as a plain function: it is wrapped by triton.jit (GPU) or by Triton's interpreter (CPU
    # tests) on first use.
    # EMULATE_BF16 (interpreter only): Triton 3.8's interpreter cannot tl.dot bf16 operands (it
    # matmuls their raw uint16 bits) and converts fp32 -> bf16 by truncation, whereas the GPU rounds
    # to nearest even. With the flag the same maths is done in fp32 on bf16-exact values: operands
    # are upcast exactly, P and O are rounded to bf16 (RNE, bit trick) before the P V dot / the
    # store. Products of bf16 values are exact in fp32, so this equals a bf16 dot with fp32
    # accumulation up to summation order.
    # HAS_BIAS: KB (rows, Lk) is 0 for a key the row attends to and -inf for one it does not (a padded
    # batch's key mask); a whole block of masked keys, or a row's first blocks, may be masked.
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // n_heads).to(tl.int64)                      # int64 offsets: big KV caches
    h = (pid_bh % n_heads).to(tl.int64)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    m_valid = offs_m < Lq
    d_valid = offs_d < D

    q = tl.load(Q + b * sqb + h * sqh + offs_m[:, None] * sqm + offs_d[None, :] * sqd,
                mask=m_valid[:, None] & d_valid[None, :], other=0.0)
    if EMULATE_BF16:
        q = q.to(tl.float32)
    k_base = K + b * skb + h * skh
    v_base = V + b * svb + h * svh

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    a_i = tl.zeros([BLOCK_M], dtype=tl.float32)             # sum p * (s - m_i)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    for start_n in range(0, Lk, BLOCK_N):
        n_idx = start_n + offs_n
        n_valid = n_idx < Lk
        kt = tl.load(k_base + n_idx[None, :] * skn + offs_d[:, None] * skd,
                     mask=n_valid[None, :] & d_valid[:, None], other=0.0)   # (BLOCK_D, BLOCK_N)
        if EMULATE_BF16:
            kt = kt.to(tl.float32)
        s = tl.dot(q, kt) * qk_scale                                         # fp32
        k_ok = n_valid
        if HAS_BIAS:
            kb = tl.load(KB + b * skbb + n_idx, mask=n_valid, other=float("-inf"))
            k_ok = n_valid & (kb == 0.0)
        s = tl.where(k_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))                 # -inf only while every key so far is masked
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)   # no -inf - -inf
        alpha = tl.exp(m_i - m_safe)                          # 0 on the first block
        p = tl.exp(s - m_safe[:, None])                       # 0 on masked keys
        ps = p * tl.where(k_ok[None, :], s - m_safe[:, None], 0.0)   # no 0 * -inf on masked keys
        shift = tl.where(l_i > 0.0, m_i - m_new, 0.0) * l_i    # no -inf * 0 on the first block
        a_i = alpha * (a_i + shift) + tl.sum(ps, 1)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + n_idx[:, None] * svn + offs_d[None, :] * svd,
                    mask=n_valid[:, None] & d_valid[None, :], other=0.0)     # (BLOCK_N, BLOCK_D)
        if EMULATE_BF16:
            pb = p.to(tl.uint32, bitcast=True)
            pb = (pb + 0x7FFF + ((pb >> 16) & 1)) & 0xFFFF0000
            acc = acc * alpha[:, None] + tl.dot(pb.to(tl.float32, bitcast=True), v.to(tl.float32))
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)   # P rounded to the input dtype
        m_i = m_new

    out = acc / l_i[:, None]
    if EMULATE_BF16:
        ob = out.to(tl.uint32, bitcast=True)
        ob = (ob + 0x7FFF + ((ob >> 16) & 1)) & 0xFFFF0000
        out = ob.to(tl.float32, bitcast=True)                # exact in bf16: the store cast is exact
    tl.store(O + b * sob + h * soh + offs_m[:, None] * som + offs_d[None, :] * sod,
             out.to(O.dtype.element_ty), mask=m_valid[:, None] & d_valid[None, :])
    ent = tl.log(l_i) - a_i / l_i
    tl.store(ENT + pid_bh * Lq + offs_m, ent, mask=m_valid)


_KERNELS: dict = {}


def _triton_interpreting() -> bool:
    """Whether triton.language was imported in interpreter mode (TRITON_INTERPRET=1 at import time).

    Triton's standard-library functions (tl.zeros, tl.sum, ...) are themselves jit functions bound at
    import time, so the interpreter only works if the variable was set before `import triton`."""
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(tl.zeros, InterpretedFunction)


def kernel(interpret: bool):
    """triton.jit / interpreter wrapper of `_flash_entropy_fwd`, built once per mode.

    The one launch point (`kernel(interpret)[grid](...)`), public so that the fake-CUDA dry run
    (`varbench.testing.fake_cuda`) and the fallback tests can stand in for the compiled kernel."""
    if interpret not in _KERNELS:
        if interpret:
            from triton.runtime.interpreter import InterpretedFunction

            if not _triton_interpreting():
                raise RuntimeError("the Triton kernel on CPU tensors needs Triton's interpreter: set "
                                   "TRITON_INTERPRET=1 before triton is first imported")
            from varbench.engine.kernels.interpreter_compat import patch_scalar_index

            patch_scalar_index()   # Triton 3.6 + NumPy >= 2.4: `range(0, Lk, ...)` (see that module)
            _KERNELS[interpret] = InterpretedFunction(_flash_entropy_fwd)
        else:
            import triton

            _KERNELS[interpret] = triton.jit(_flash_entropy_fwd)
    return _KERNELS[interpret]


def _next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def _launch_config(Lq: int, block_d: int, block_m: Optional[int], block_n: Optional[int]):
    if block_m is None:
        block_m = 128 if block_d <= 128 else 64
        block_m = max(16, min(block_m, _next_pow2(Lq)))       # tl.dot needs M >= 16
    if block_n is None:
        block_n = 64 if block_d <= 128 else 32      # d=256: BLOCK_N=64 spills registers on sm_90
    num_warps = 4 if block_d <= 64 else 8
    num_stages = 3 if block_d <= 128 else 2
    if block_m <= 32:
        num_warps = 4
    return block_m, block_n, num_warps, num_stages


def _check(q, k, v):
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"expected (rows, heads, L, c) tensors, got q{tuple(q.shape)} k{tuple(k.shape)} v{tuple(v.shape)}")
    rows, H, Lq, c = q.shape
    if k.shape[:2] != (rows, H) or k.shape[3] != c or v.shape[:3] != k.shape[:3] or v.shape[3] != c:
        raise ValueError(f"shape mismatch q{tuple(q.shape)} k{tuple(k.shape)} v{tuple(v.shape)}")
    if k.shape[2] < 1:
        raise ValueError("need at least one key")


def entropy_reference_per_head(q: torch.Tensor, k: torch.Tensor, scale: float = 1.0, chunk: int = 1024) -> torch.Tensor:
    """Per-head entropy (rows, H, Lq) fp32 of softmax(scale * q k^T), chunked over queries (fallback)."""
    out = []
    kf = k.float().transpose(-1, -2)
    for s0 in range(0, q.shape[2], chunk):
        s = (q[:, :, s0:s0 + chunk].float() @ kf) * scale
        lse = s.logsumexp(-1)
        out.append(lse - (s - lse.unsqueeze(-1)).exp().mul(s).sum(-1))
    return torch.cat(out, dim=2)


def _interpret_env() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def flash_attention_with_entropy(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float = 1.0,
    *,
    return_per_head: bool = False,
    force_triton: Optional[bool] = None,
    block_m: Optional[int] = None,
    block_n: Optional[int] = None,
    num_warps: Optional[int] = None,
    maxnreg: Optional[int] = None,
    key_bias: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Attention output and per-query attention entropy in one pass.

    q: (rows, H, Lq, c); k, v: (rows, H, Lk, c); any strides (no .contiguous() is made).
    key_bias: None, or per row which keys it attends to, 0 (attends) or -inf (not), (rows, Lk) or
    (rows, 1, 1, Lk) (`KVCache.key_mask`, a padded batch); any other value is refused by the kernel's
    reading (a key counts only where its bias is exactly 0).
    Returns (out, entropy): out (rows, H, Lq, c) in q's dtype, entropy fp32 (rows, Lq) = mean over
    heads (the convention of `varbench.engine.attention.attention_entropy`), or (rows, H, Lq) with
    `return_per_head=True`. Entropy is in nats of softmax(scale * q k^T).

    Dispatch (`force_triton`): None -> Triton kernel on CUDA tensors, and on CPU tensors only when
    TRITON_INTERPRET=1 (then through Triton's interpreter, which requires that variable to have been
    set before triton was first imported); True -> always the kernel (interpreter on CPU; raises if
    Triton is not in interpreter mode); False -> the PyTorch fallback (SDPA + chunked entropy).
    The kernel path allocates its outputs with torch.empty and never syncs, so it can be captured
    in a CUDA graph (after one warm-up call outside capture to compile).
    `block_m`/`block_n` override the tile sizes (tests; powers of 2, >= 16 on GPU); `num_warps` and
    `maxnreg` (a cap on registers per thread; ptxas spills beyond it) override the GPU launch
    (`experiments.flash_entropy_registers` compiles and times such configurations). None: the defaults of
    `_launch_config`.
    """
    _check(q, k, v)
    rows, H, Lq, c = q.shape
    Lk = k.shape[2]
    use_triton = force_triton if force_triton is not None else (q.is_cuda or _interpret_env())
    bias = None if key_bias is None else key_bias.reshape(rows, Lk)
    if bias is not None and bias.stride(1) != 1:   # the kernel reads a row's keys at unit stride
        bias = bias.contiguous()
    if not use_triton:
        kk = k if k.dtype == q.dtype else k.to(q.dtype)
        vv = v if v.dtype == q.dtype else v.to(q.dtype)
        mask = None if bias is None else bias.to(q.dtype)[:, None, None, :]
        out = F.scaled_dot_product_attention(q, kk, vv, attn_mask=mask, scale=scale)
        if return_per_head:
            if bias is not None:
                raise ValueError("return_per_head with a key_bias: the per-head reference takes no mask")
            return out, entropy_reference_per_head(q, k, scale)
        return out, attention_entropy(q if scale == 1.0 else q.float() * scale, k, key_mask=mask)

    if c > MAX_HEAD_DIM:
        raise ValueError(f"head dim {c} > {MAX_HEAD_DIM} not supported by the kernel")
    interpret = (not q.is_cuda) or _triton_interpreting()
    cdt = q.dtype if q.dtype in _KERNEL_DTYPES else torch.bfloat16
    qq = q if q.dtype == cdt else q.to(cdt)
    kk = k if k.dtype == cdt else k.to(cdt)
    vv = v if v.dtype == cdt else v.to(cdt)
    out = torch.empty((rows, H, Lq, c), dtype=cdt, device=q.device)
    ent = torch.empty((rows, H, Lq), dtype=torch.float32, device=q.device)
    if Lq > 0:
        block_d = max(16, _next_pow2(c))
        bm, bn, warps, num_stages = _launch_config(Lq, block_d, block_m, block_n)
        grid = ((Lq + bm - 1) // bm, rows * H)
        extra = {} if interpret else dict(num_warps=num_warps or warps, num_stages=num_stages,
                                          **({"maxnreg": int(maxnreg)} if maxnreg else {}))
        kb = ent if bias is None else bias   # any pointer when there is no bias (never read)
        kernel(interpret)[grid](
            qq, kk, vv, out, ent, kb,
            *qq.stride(), *kk.stride(), *vv.stride(), *out.stride(),
            0 if bias is None else bias.stride(0),
            H, Lq, Lk, c, float(scale),
            BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=block_d, EMULATE_BF16=interpret and cdt == torch.bfloat16,
            HAS_BIAS=bias is not None, **extra,
        )
    if out.dtype != q.dtype:
        out = out.to(q.dtype)
    return out, (ent if return_per_head else ent.mean(1))
