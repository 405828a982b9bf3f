"""Registers and spills of the fused entropy kernel per launch configuration, compiled ahead of time (no GPU).

    python -m experiments.flash_entropy_registers                    # sm_90a (H100/H200), head dim 128
    python -m experiments.flash_entropy_registers --arch 80 --head-dim 64,128

Triton compiles `varbench.engine.kernels.flash_entropy._flash_entropy_fwd` for the target (`triton.compile` of
an `ASTSource` with `GPUTarget("cuda", arch, 32)`; ptxas ships with Triton's NVIDIA backend), and
`cuobjdump --dump-resource-usage` reads the cubin's registers per thread (REG), spill memory (LOCAL bytes per
thread: 0 means no spills) and static shared memory; Triton's metadata gives the dynamic shared memory.
From those: CTAs per SM by registers (65,536 per SM, allocated per warp in units of 256) and by shared memory
(228 KiB per SM on sm_90, 164 KiB on sm_80, 1 KiB reserved per CTA), and resident warps per SM.

Registers are not speed: fewer registers per thread let more CTAs share an SM (latency hiding), but a
configuration with smaller tiles does more passes over K/V. This ranks configurations by what can be known
without a device; timing them (against SDPA's flash kernel) needs the GPU: `experiments.device_bench` times
the runtime's default configuration. Every row here is a configuration `flash_attention_with_entropy`
can launch (`block_m`/`block_n` arguments; num_warps/num_stages come from `_launch_config`, overridable here).
"""
from __future__ import annotations

import argparse
import inspect
import os
import re
import subprocess
import tempfile
from typing import Optional, Sequence

#: per-SM limits by compute capability: (registers, shared memory bytes usable by CTAs)
SM_LIMITS = {80: (65536, 164 * 1024), 86: (65536, 100 * 1024), 89: (65536, 100 * 1024), 90: (65536, 228 * 1024)}
MAX_WARPS_PER_SM = 64
_CONSTEXPRS = ("BLOCK_M", "BLOCK_N", "BLOCK_D", "EMULATE_BF16", "HAS_BIAS")
_POINTERS = ("Q", "K", "V", "O", "ENT", "KB")


def signature(dtype: str = "bf16") -> dict[str, str]:
    """Triton's type string of every kernel argument: pointers to `dtype` (ENT fp32), strides and sizes i32,
    the scale fp32, the tile sizes constexpr."""
    from varbench.engine.kernels import flash_entropy as fe

    sig = {}
    for name in inspect.signature(fe._flash_entropy_fwd).parameters:
        if name in _POINTERS:
            sig[name] = "*fp32" if name == "ENT" else f"*{dtype}"
        elif name in _CONSTEXPRS:
            sig[name] = "constexpr"
        else:
            sig[name] = "fp32" if name == "qk_scale" else "i32"
    return sig


def resource_usage(cubin: bytes) -> dict[str, int]:
    """REG / LOCAL / SHARED / STACK of the cubin's kernel, as cuobjdump prints them."""
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True, check=True).stdout
    line = next(ln for ln in out.splitlines() if "REG:" in ln)
    return {k: int(v) for k, v in re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", line)}


def compile_config(arch: int, block_m: int, block_n: int, block_d: int, num_warps: int, num_stages: int,
                   dtype: str = "bf16", maxnreg: Optional[int] = None, has_bias: bool = False) -> dict:
    """One configuration compiled for sm_<arch> (sm_90 -> sm_90a): its registers, spills (the stack frame
    ptxas gives spilled registers: cuobjdump's STACK; LOCAL stays 0 here), shared memory and occupancy.
    `maxnreg` caps the registers per thread (Triton's launch option of that name): ptxas then spills the rest.
    `has_bias`: the variant with a key bias (a padded batch's key mask)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from varbench.engine.kernels import flash_entropy as fe

    src = ASTSource(fn=triton.jit(fe._flash_entropy_fwd), signature=signature(dtype),
                    constexprs=dict(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, EMULATE_BF16=False, HAS_BIAS=has_bias))
    k = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=dict(num_warps=num_warps, num_stages=num_stages,
                                                                           **({"maxnreg": maxnreg} if maxnreg else {})))
    use = resource_usage(k.asm["cubin"])
    regs_sm, smem_sm = SM_LIMITS.get(arch, SM_LIMITS[90])
    regs_per_warp = -(-use["REG"] * 32 // 256) * 256
    smem = int(k.metadata.shared) + use["SHARED"] + 1024
    ctas = min(regs_sm // (regs_per_warp * num_warps), smem_sm // max(smem, 1), MAX_WARPS_PER_SM // num_warps)
    return {"block_m": block_m, "block_n": block_n, "block_d": block_d, "num_warps": num_warps,
            "num_stages": num_stages, "maxnreg": maxnreg, "regs": use["REG"], "spill_bytes": use["LOCAL"], "stack": use["STACK"],
            "smem_kib": smem / 1024, "ctas_per_sm": ctas, "warps_per_sm": ctas * num_warps}


def default_config(head_dim: int, lq: int = 4096) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) the runtime launches for a long scale of this head dim."""
    from varbench.engine.kernels import flash_entropy as fe

    return fe._launch_config(lq, max(16, fe._next_pow2(head_dim)), None, None)


def sweep(arch: int, head_dims: list[int], block_ms: list[int], block_ns: list[int], warps: list[int],
          stages: list[int], dtype: str = "bf16", maxnregs: Sequence[Optional[int]] = (None,)) -> list[dict]:
    rows = []
    for d in head_dims:
        block_d = max(16, 1 << (d - 1).bit_length())
        for bm in block_ms:
            for bn in block_ns:
                for w in warps:
                    for s, cap in ((s, cap) for s in stages for cap in maxnregs):
                        try:
                            r = compile_config(arch, bm, bn, block_d, w, s, dtype, cap)
                        except Exception as e:  # noqa: BLE001 - a configuration that does not compile is a row too
                            r = {"block_m": bm, "block_n": bn, "block_d": block_d, "num_warps": w, "num_stages": s,
                                 "error": f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"}
                        r["head_dim"] = d
                        r["default"] = default_config(d)[:4] == (bm, bn, w, s) and cap is None
                        rows.append(r)
                        print(render_row(r), flush=True)
    return rows


def render_row(r: dict) -> str:
    head = (f"d{r['head_dim']:<4} BLOCK_M {r['block_m']:<4} BLOCK_N {r['block_n']:<4} warps {r['num_warps']} "
            f"stages {r['num_stages']}" + (f" maxnreg {r['maxnreg']}" if r.get("maxnreg") else ""))
    if "error" in r:
        return f"{head}  does not compile: {r['error']}"
    return (f"{head}  regs {r['regs']:3d}  spill {r['spill_bytes']:4d} B  stack {r['stack']:4d} B  smem {r['smem_kib']:6.1f} KiB  "
            f"CTAs/SM {r['ctas_per_sm']}  warps/SM {r['warps_per_sm']:2d}{'  <- runtime default' if r['default'] else ''}")


#: what `--time` compares at Infinity-2B's attention shapes: the runtime's default (BLOCK_M 128, BLOCK_N 64,
#: 8 warps: 255 registers, no spill, 1 CTA = 8 warps per SM on sm_90a) and the configurations the register
#: sweep found with more warps per SM and (almost) no spill: 64x32 with 8 warps capped at 128 registers (4 bytes
#: of spill, 2 CTAs = 16 warps per SM) and 64x32 with 4 warps (233 registers, no spill, 2 CTAs = 8 warps)
TIMED_CONFIGS = ({"label": "default 128x64 w8", "block_m": None, "block_n": None, "num_warps": None, "maxnreg": None},
                 {"label": "64x32 w8 maxnreg128", "block_m": 64, "block_n": 32, "num_warps": 8, "maxnreg": 128},
                 {"label": "64x32 w4", "block_m": 64, "block_n": 32, "num_warps": 4, "maxnreg": None})
#: (rows = 2 x batch with CFG, heads, Lq, Lk, head dim): Infinity-2B at 1M, batch 1: the last scale (64x64 tokens
#: over the whole cache, 10,521 keys) and the 32x32 scale (1,024 queries, 2,521 keys)
TIMED_SHAPES = ((2, 16, 4096, 10521, 128), (2, 16, 1024, 2521, 128))


def time_configs(shapes=TIMED_SHAPES, configs=TIMED_CONFIGS, rep_ms: int = 100) -> list[dict]:
    """On a CUDA device: each configuration's time per call (triton.testing.do_bench, median) beside SDPA's
    flash kernel on the same bf16 q, k, v (attention without the entropy: what ToProVAR's fused pass is
    weighed against)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench

    from varbench.engine.kernels.flash_entropy import flash_attention_with_entropy

    rows = []
    for rows_, h, lq, lk, d in shapes:
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(rows_, h, n, d, device="cuda", generator=g, dtype=torch.bfloat16) for n in (lq, lk, lk))
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            sdpa = do_bench(lambda: F.scaled_dot_product_attention(q, k, v), rep=rep_ms, return_mode="median")
        row = {"shape": [rows_, h, lq, lk, d], "sdpa_flash_ms": sdpa}
        for c in configs:
            kw = {k_: v_ for k_, v_ in c.items() if k_ != "label"}
            ms = do_bench(lambda: flash_attention_with_entropy(q, k, v, **kw), rep=rep_ms, return_mode="median")
            row[c["label"]] = ms
        rows.append(row)
        print(f"q{tuple(q.shape)} k{tuple(k.shape)}: SDPA flash {sdpa:.3f} ms; " + "; ".join(
            f"{c['label']} {row[c['label']]:.3f} ms ({row[c['label']] / sdpa:.2f}x SDPA)" for c in configs), flush=True)
    return rows


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x]


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", type=int, default=90, help="compute capability x10 (90: sm_90a, H100/H200)")
    p.add_argument("--head-dim", default="128", help="head dims (Infinity 2B/8B: 128)")
    p.add_argument("--block-m", default="64,128")
    p.add_argument("--block-n", default="32,64,128")
    p.add_argument("--num-warps", default="4,8")
    p.add_argument("--num-stages", default="2,3")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    p.add_argument("--maxnreg", default="", help="register caps to try besides none, e.g. 128,168")
    p.add_argument("--time", action="store_true",
                   help="on a CUDA device: time TIMED_CONFIGS against SDPA's flash kernel at TIMED_SHAPES (no sweep)")
    a = p.parse_args(argv)
    if a.time:
        import torch

        if not torch.cuda.is_available():
            print("--time needs a CUDA device (the register sweep does not: run without --time)")
            return 2
        time_configs()
        return 0
    rows = sweep(a.arch, _ints(a.head_dim), _ints(a.block_m), _ints(a.block_n), _ints(a.num_warps),
                 _ints(a.num_stages), a.dtype, (None, *_ints(a.maxnreg)))
    ok = [r for r in rows if "error" not in r]
    clean = [r for r in ok if r["spill_bytes"] == 0 and r["stack"] == 0]
    print(f"{len(ok)} of {len(rows)} compiled; {len(clean)} without spills")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
