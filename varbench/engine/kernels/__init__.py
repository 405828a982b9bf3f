"""Fused GPU kernels (Triton). Importing this package is light: Triton and the kernels load lazily.

- `flash_attention_with_entropy(q, k, v, scale=1.0)`: FlashAttention-2 style forward that also returns
  each query's attention entropy (ToProVAR's "Flash Attention Entropy"); see `flash_entropy`.
"""


def flash_attention_with_entropy(*args, **kwargs):
    from varbench.engine.kernels.flash_entropy import flash_attention_with_entropy as f

    return f(*args, **kwargs)


__all__ = ["flash_attention_with_entropy"]
