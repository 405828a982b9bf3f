"""Strict loading of the released checkpoint files, unchanged.

Layouts handled (facts from the released repositories):
- Infinity-2B `infinity_2b_reg.pth`: a flat state dict (fp32 pickle).
- Infinity-8B `infinity_8b_weights/`: sharded safetensors `model-0000K-of-0000N.safetensors` plus
  `model.safetensors.index.json` (its `weight_map` names the shard of every key).
- Training checkpoints `ar-ckpt-*.pth`: weights nested under ['trainer']['gpt_fsdp'].
- VAE files: weights under 'vae' (see `bsq_vae.load_vae`).

Every load is strict: a mismatch raises one `CheckpointMismatch` naming the file and every missing
and unexpected key (and shape mismatches); `load_state_dict_strict` is the one implementation of that
check, used by every loader in varbench. `torch.load` always runs with weights_only=True.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable, Mapping

import torch
import torch.nn as nn

from varbench.core.aliases import moved_names
from varbench.core.errors import FixableError

PUBLISHED_AT = {
    "infinity_2b_reg.pth": "https://huggingface.co/FoundationVision/Infinity (file infinity_2b_reg.pth)",
    "infinity_8b_weights": "https://huggingface.co/FoundationVision/Infinity (folder infinity_8b_weights/)",
    "infinity_vae_d32reg.pth": "https://huggingface.co/FoundationVision/Infinity (file infinity_vae_d32reg.pth)",
    "infinity_vae_d56_f8_14_patchify.pth": "https://huggingface.co/FoundationVision/Infinity (file infinity_vae_d56_f8_14_patchify.pth)",
    "flan-t5-xl": "https://huggingface.co/google/flan-t5-xl (download the folder; only the encoder is used)",
    "hart-0.7b-1024px/llm": "https://huggingface.co/mit-han-lab/hart-0.7b-1024px (folder llm/)",
    "hart-0.7b-1024px/tokenizer": "https://huggingface.co/mit-han-lab/hart-0.7b-1024px (folder tokenizer/)",
    "Qwen2-VL-1.5B-Instruct": "https://huggingface.co/mit-han-lab/Qwen2-VL-1.5B-Instruct (download the folder)",
}

class CheckpointMismatch(FixableError, RuntimeError):
    """A checkpoint whose keys or shapes do not fit the model; the message names the file and every key."""


class WeightsNotFound(FixableError, FileNotFoundError):
    """A weight file that is not there; the message names where it was looked for and where it is published."""


def require_file(path: str | os.PathLike, what: str, setting: str = "paths.weights_dir") -> Path:
    """Return `path` if it exists; otherwise raise one error saying what, where, and where to get it."""
    p = Path(path)
    if p.exists():
        return p
    published = PUBLISHED_AT.get(p.name, "see docs/running.md, 'Running with the released weights'")
    raise WeightsNotFound(
        f"{what} not found: {p.name}\n  searched: {p.resolve()}\n  published at: {published}\n"
        f"  fix: put the file there, or point `{setting}` (env VARBENCH_WEIGHTS) at the folder holding it."
    )


def read_state_dict(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Read a .pth file, a .safetensors file, or a sharded safetensors folder (with its index)."""
    p = Path(path)
    if p.is_dir():
        index = p / "model.safetensors.index.json"
        if not index.exists():
            raise CheckpointMismatch(f"{p} is a folder but has no model.safetensors.index.json (expected the sharded 8B layout)")
        from safetensors.torch import load_file

        from tqdm.auto import tqdm

        weight_map = json.loads(index.read_text())["weight_map"]
        sd: dict[str, torch.Tensor] = {}
        for shard in tqdm(sorted(set(weight_map.values())), desc=f"load {p.name}", unit="shard", leave=False):
            sd.update(load_file(str(require_file(p / shard, "checkpoint shard"))))
        missing_in_shards = sorted(set(weight_map) - set(sd))
        if missing_in_shards:
            raise CheckpointMismatch(f"index lists keys absent from the shards: {missing_in_shards[:20]}")
        return sd
    if p.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(p))
    try:   # memory-mapped: the file's pages back the tensors until they are copied into the model (half the peak RAM)
        obj = torch.load(p, map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError as e:
        if "mmap" not in str(e):
            raise
        obj = torch.load(p, map_location="cpu", weights_only=True)   # a legacy (pre-zip) file cannot be mapped
    return unwrap_state_dict(obj)


def unwrap_state_dict(obj: Mapping) -> dict[str, torch.Tensor]:
    """Find the model weights in a released or training checkpoint object."""
    if "trainer" in obj and isinstance(obj["trainer"], Mapping) and "gpt_fsdp" in obj["trainer"]:
        obj = obj["trainer"]["gpt_fsdp"]
    for key in ("state_dict", "model"):
        if key in obj and isinstance(obj[key], Mapping) and not isinstance(obj[key], torch.Tensor):
            obj = obj[key]
    return {k: v for k, v in obj.items() if isinstance(v, torch.Tensor)}


#: what a mismatch error suggests unless the caller knows better
DEFAULT_HINT = "Is it the right file for this model / preset?"


def mismatch_report(module: nn.Module, state: Mapping[str, torch.Tensor], source: str, *,
                    may_miss: Callable[[str], bool] | None = None, limit: int = 20) -> str | None:
    """One message naming every missing key, unexpected key and shape mismatch of `state` against
    `module` (at most `limit` of each kind listed, with counts), or None when they match.

    `may_miss(key)` marks module keys the file may lack (they keep their initial values)."""
    own = module.state_dict()
    missing = [k for k in own if k not in state and not (may_miss and may_miss(k))]
    unexpected = [k for k in state if k not in own]
    shapes = [f"{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(own[k].shape)}"
              for k in own if k in state and hasattr(state[k], "shape") and tuple(state[k].shape) != tuple(own[k].shape)]
    if not (missing or unexpected or shapes):
        return None

    def block(title, items):
        more = f"\n    ... and {len(items) - limit} more" if len(items) > limit else ""
        return f"  {title} ({len(items)}):" + "".join(f"\n    {x}" for x in items[:limit]) + more

    parts = [block(t, i) for t, i in (("missing keys", missing), ("unexpected keys", unexpected), ("shape mismatches", shapes)) if i]
    return (f"{source} does not match {type(module).__name__}: {len(missing)} missing, {len(unexpected)} unexpected, "
            f"{len(shapes)} wrong shape.\n" + "\n".join(parts))


def load_state_dict_strict(module: nn.Module, state: Mapping[str, torch.Tensor], *, source: str,
                           error: type[Exception] = CheckpointMismatch, hint: str = DEFAULT_HINT,
                           may_miss: Callable[[str], bool] | None = None) -> None:
    """`module.load_state_dict(state, strict=True)`, except that a mismatch raises one `error` that
    names `source` (the file) and lists every missing and unexpected key and shape mismatch
    (`mismatch_report`), followed by `hint`.

    This is the one strict loader: the Infinity checkpoints (`load_strict`), the BSQ-VAE
    (`bsq_vae.load_vae_state_dict`), the evaluators' weights (`evaluators._weights.strict_load`),
    the toy model, the word text encoder and the GenEval mmdet converter all load through it, so every
    mismatch reads the same.
    `may_miss(key)` lets module keys be absent from `state` (they keep their initial values; the
    load is then non-strict for exactly those keys).
    """
    message = mismatch_report(module, state, source, may_miss=may_miss)
    if message:
        raise error(message + (f"\n  fix: {hint}" if hint else ""))
    own = module.state_dict()
    module.load_state_dict(state, strict=not (may_miss and any(k not in state for k in own)))


#: names that moved into a backbone's folder, still read from here (with a DeprecationWarning)
__getattr__ = moved_names(__name__)
