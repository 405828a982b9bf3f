"""Loading Infinity's released transformer checkpoints (`varbench.engine.checkpoints` holds the strict
check and the file layouts every loader shares)."""
from __future__ import annotations

import os
from typing import Mapping

import torch
import torch.nn as nn

from varbench.engine.checkpoints import load_state_dict_strict, read_state_dict, require_file


#: buffers the released training model registered that inference does not use (dropped on load,
#: as the released `Infinity.load_state_dict` does)
_IGNORED_KEYS = ("lvl_1L", "attn_bias_for_masking", "Infinity_visible_kvlen", "Infinity_invisible_qlen")


def load_strict(module: nn.Module, sd: Mapping[str, torch.Tensor], source: str) -> None:
    """Load an Infinity checkpoint: drop the `module.` prefix and the released training-only buffers
    (`_IGNORED_KEYS`), then `load_state_dict_strict`."""
    sd = {k.removeprefix("module."): v for k, v in sd.items() if k not in _IGNORED_KEYS}
    load_state_dict_strict(module, sd, source=f"checkpoint {source}",
                           hint="check that the model preset matches the file (e.g. infinity_2b with infinity_2b_reg.pth).")


def load_infinity_weights(model: nn.Module, path: str | os.PathLike) -> None:
    p = require_file(path, "Infinity transformer weights")
    size = sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) if p.is_dir() else p.stat().st_size
    print(f"[varbench] loading Infinity weights {p.name} ({size / 2**30:.1f} GiB)", flush=True)   # a minute for 8B
    load_strict(model, read_state_dict(p), str(p))
