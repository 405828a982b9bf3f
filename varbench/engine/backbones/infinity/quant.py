"""`runtime.quant`: torchao quantisation of the transformer blocks' linears, for every method.

    quantise_blocks(rt, "int8_weight_only")     # what `configure_runtime` does; "none" changes nothing

What is quantised: in every block the six per-token linears (self-attention's fused q/k/v and
output projection, cross-attention's query and output projection, the FFN's two layers): the
matmuls whose cost grows with the tokens of a scale. The once-per-generation linears (AdaLN
modulation, the prompt's cross-attention K/V), the embeddings, the head, the text encoder and the
VAE stay in the run's dtype.

- `int8_weight_only` (torchao `Int8WeightOnlyConfig`): int8 weights with a per-output-channel
  scale, activations in the run's dtype; runs on the CPU and on CUDA. Trades weight memory (1/4 of
  fp32's, 1/2 of bf16's for these layers) and memory-bound matmul time for rounding every weight to
  256 levels per channel: images differ from the unquantised run (the fidelity column shows how
  much).
- `fp8_dynamic` (torchao `Float8DynamicActivationFloat8WeightConfig`): fp8 (e4m3) weights and
  activations scaled per call; needs a CUDA GPU with fp8 tensor cores (sm_89+: Ada, Hopper) and is
  refused at the config boundary elsewhere (varbench/harness/config.py).

How the block code takes them. The baseline's lean path keeps pre-transposed weights expanded over
the rows (`block_step.BlockConsts`, one `baddbmm` per linear); a quantised weight is a torchao tensor
subclass that has no such view, so `BlockConsts` keeps it as the (out, in) weight and
`block_step.linear` calls `F.linear` on it (torchao's kernel). With `quant=none` nothing here runs
and the blocks are the same tensors: the baseline's bits do not move.
"""
from __future__ import annotations

import torch

#: the values of `runtime.quant`
QUANT_MODES = ("none", "int8_weight_only", "fp8_dynamic")
#: the per-token linears of a block that are quantised (paths inside a `CrossAttnBlock`)
BLOCK_LINEARS = ("sa.mat_qkv", "sa.proj", "ca.mat_q", "ca.proj", "ffn.fc1", "ffn.fc2")
#: the torchao release these calls are written against (pyproject's `quant` extra)
TORCHAO_PIN = "torchao==0.18.0"


def torchao_missing() -> str | None:
    """Why torchao cannot be used here (with the fix), or None when it imports."""
    try:
        import torchao.quantization  # noqa: F401
    except Exception as e:  # noqa: BLE001 - ImportError, or a torch it was not built for
        return (f"runtime.quant needs torchao ({type(e).__name__}: {e}); install it with "
                f"`pip install '{TORCHAO_PIN}'` (the `quant` extra, which scripts/setup.sh installs) or set runtime.quant=none")
    return None


def fp8_refusal(device_type: str) -> str | None:
    """Why fp8_dynamic cannot run on `device_type` (with the fix), or None."""
    if device_type != "cuda":
        return ("runtime.quant=fp8_dynamic needs a CUDA GPU with fp8 tensor cores (sm_89+); "
                f"runtime.device is {device_type}: use runtime.quant=int8_weight_only (runs on the CPU) or none")
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        if (major, minor) < (8, 9):
            return (f"runtime.quant=fp8_dynamic needs sm_89+ (Ada, Hopper); this GPU is sm_{major}{minor}: "
                    f"use runtime.quant=int8_weight_only or none")
    return None


def _config(mode: str):
    from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, Int8WeightOnlyConfig

    if mode == "int8_weight_only":
        return Int8WeightOnlyConfig()
    return Float8DynamicActivationFloat8WeightConfig()


def quantise_blocks(rt, mode: str) -> None:
    """Quantise `BLOCK_LINEARS` of every block of `rt.model` in place (module docstring); sets
    `rt.quant`. "none": nothing."""
    if mode not in QUANT_MODES:
        raise ValueError(f"runtime.quant must be one of {', '.join(QUANT_MODES)}, got {mode!r}")
    rt.quant = mode
    if mode == "none":
        return
    missing = torchao_missing()
    if missing:
        raise RuntimeError(missing)
    from torchao.quantization import quantize_

    cfg = _config(mode)
    for block in rt.model.blocks:
        quantize_(block, cfg, filter_fn=lambda module, fqn: isinstance(module, torch.nn.Linear) and fqn in BLOCK_LINEARS)


def is_quantised(weight: torch.Tensor) -> bool:
    """A torchao quantised weight (a tensor subclass), not a plain tensor or parameter."""
    return type(weight) not in (torch.Tensor, torch.nn.Parameter)


def quantised_weight_dtypes(rt) -> dict:
    """{block linear path: the dtype its weight is stored in} of block 0 (int8 / float8_e4m3fn when
    quantised; the run's dtype when not): what a test and the record can check."""
    block = rt.model.blocks[0]
    out = {}
    for path in BLOCK_LINEARS:
        w = block.get_submodule(path).weight
        inner = getattr(w, "qdata", None)   # torchao 0.18's Int8Tensor / Float8Tensor keep the payload here
        out[path] = str((inner if inner is not None else w).dtype).replace("torch.", "")
    return out
