"""The bytes Infinity's runtime holds for its weights (`varbench.engine.memory` has the KV-cache model
and the measured peak, shared by every backbone)."""
from __future__ import annotations

import torch

from varbench.engine.backbones.infinity.bsq_vae import BSQVAE
from varbench.engine.backbones.infinity.model import Infinity
from varbench.engine.memory import module_bytes


def weights_bytes(cfg, dtype: torch.dtype) -> dict[str, int]:
    """{"transformer", "vae"}: the bytes the runtime holds for `cfg`'s weights in a `dtype` run
    (`InfinityRuntime` casts the blocks to `dtype`, keeps the rest fp32), built on meta: no weights
    read, no memory used."""
    with torch.device("meta"):
        model, vae = Infinity(cfg), BSQVAE(cfg.vae)
        if dtype != torch.float32:
            for b in model.blocks:
                b.to(dtype)
    return {"transformer": module_bytes(model), "vae": module_bytes(vae)}
