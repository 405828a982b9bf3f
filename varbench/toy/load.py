"""Load the trained toy-world model shipped in `varbench/toy/weights/`.

    from varbench.toy.load import load_toy_runtime, TOY_SCHEDULE, TOY_H_DIV_W, toy_sampling
    rt = load_toy_runtime()
    out = rt.generate(prompts, seeds, schedule=TOY_SCHEDULE, h_div_w=TOY_H_DIV_W, **toy_sampling())

The weights were produced by `python -m varbench.toy.train` (see its docstring); `manifest.json`
records each file's sha256, the training config, losses, wall time, machine and the measured toy
GenEval. Loading checks every hash first, so a stale or hand-edited file fails loudly.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import torch

from varbench.core.errors import FixableError
from varbench.core.filehash import sha256_file as sha256
from varbench.engine.backbones.infinity.bsq_vae import BSQVAE, load_vae_state_dict
from varbench.engine.backbones.infinity.model import PRESETS, Infinity
from varbench.engine.checkpoints import load_state_dict_strict
from varbench.engine.text import WordTextEncoder
from varbench.toy import world

#: Token grids of the toy model, coarse to fine: 9 scales ending at the VAE's 16x16 latent of a
#: 64x64 image. Pass as `schedule=` to `InfinityRuntime.generate` (the released `pn` tables start
#: at 16-pixel tokens and do not fit a 64-pixel image).
TOY_SCHEDULE: tuple[tuple[int, int], ...] = ((1, 1), (2, 2), (3, 3), (4, 4), (6, 6), (8, 8), (10, 10), (13, 13), (16, 16))
#: Aspect ratio the toy model was trained at (square images); selects the RoPE reference grid.
TOY_H_DIV_W = 1.0
#: Rendered image side the VAE was trained on (the world's default).
TOY_IMAGE_SIZE = 64
#: Presets used by the toy model.
TOY_MODEL_PRESET = "toy"
TOY_VAE_PRESET = "toy"

WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"
FILES = {"vae": "toy_vae.pt", "infinity": "toy_infinity.pt", "text": "toy_text_encoder.pt"}
MANIFEST = "manifest.json"
PUBLISHED_AT = "the varbench git repository (varbench/toy/weights/), produced by `python -m varbench.toy.train`"


class ToyWeightsError(FixableError, RuntimeError):
    """A toy weight file is missing or differs from the manifest."""


def toy_vocab() -> list[str]:
    """Every word a toy-world caption can contain (the text encoder's vocabulary, fixed order)."""
    words = ["a", "an", "photo", "of", "and", "left", "right", "above", "below"]
    words += list(world.SHAPES) + [world.PLURALS[s] for s in world.SHAPES]
    words += list(world.PALETTE) + [world.NUMBER_WORDS[n] for n in sorted(world.NUMBER_WORDS)]
    return list(dict.fromkeys(words))


def build_toy_text_encoder(dim: int, max_len: int, layers: int = 0) -> WordTextEncoder:
    """The word encoder the toy model trains: the world's vocabulary, a few hash buckets for
    unknown words (they then encode, but meaninglessly), `layers` contextual layers."""
    return WordTextEncoder(dim=dim, vocab=toy_vocab(), n_hash=8, max_len=max_len, layers=layers)


def read_manifest(weights_dir: Optional[Path] = None) -> dict:
    d = Path(weights_dir or WEIGHTS_DIR)
    p = d / MANIFEST
    if not p.is_file():
        raise ToyWeightsError(f"toy weights manifest {MANIFEST!r} not found; searched {str(p)!r}. It is published in "
                              f"{PUBLISHED_AT}; restore it with git checkout or retrain.")
    try:
        manifest = json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:     # truncated or hand-edited
        raise ToyWeightsError(f"toy weights manifest {str(p)!r} is not valid JSON ({e}); restore it with "
                              f"`git checkout -- varbench/toy/weights/{MANIFEST}` (it is published in {PUBLISHED_AT}), "
                              "or retrain with `python -m varbench.toy.train`, which rewrites it.") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        raise ToyWeightsError(f"toy weights manifest {str(p)!r} has no \"files\" table of sha256 values; restore it "
                              f"with `git checkout -- varbench/toy/weights/{MANIFEST}` or retrain.")
    return manifest


def verified_path(kind: str, weights_dir: Optional[Path] = None, manifest: Optional[dict] = None) -> Path:
    """Path of weight file `kind` ('vae', 'infinity', 'text') after checking its sha256."""
    d = Path(weights_dir or WEIGHTS_DIR)
    manifest = manifest or read_manifest(d)
    name = FILES[kind]
    p = d / name
    if not p.is_file():
        raise ToyWeightsError(f"toy weight file {name!r} not found; searched {str(p)!r}. It is published in {PUBLISHED_AT}.")
    want = manifest["files"][name]["sha256"]
    got = sha256(p)
    if got != want:
        raise ToyWeightsError(f"toy weight file {str(p)!r} has sha256 {got} but manifest.json expects {want}; "
                              "the file is stale or modified: restore it (git checkout) or retrain and rewrite the manifest.")
    return p


def toy_sampling(weights_dir: Optional[Path] = None) -> dict:
    """Default sampling settings of the shipped toy model (cfg, tau, top_k, top_p), from the manifest."""
    return dict(read_manifest(weights_dir)["sampling"])


def load_toy_runtime(device: str | torch.device = "cpu", weights_dir: Optional[str | Path] = None):
    """Build the 'toy' Infinity + 'toy' BSQ-VAE + word encoder and strictly load the shipped weights."""
    from varbench.engine.backbones.infinity.runtime import InfinityRuntime

    d = Path(weights_dir or WEIGHTS_DIR)
    manifest = read_manifest(d)
    cfg = PRESETS[TOY_MODEL_PRESET]
    model = Infinity(cfg)
    path = verified_path("infinity", d, manifest)
    load_state_dict_strict(model, torch.load(path, map_location="cpu", weights_only=True), source=f"toy Infinity {str(path)!r}")
    vae = BSQVAE(TOY_VAE_PRESET)
    load_vae_state_dict(vae, torch.load(verified_path("vae", d, manifest), map_location="cpu", weights_only=True),
                        source=f"toy VAE {FILES['vae']}")
    text = WordTextEncoder.from_file(verified_path("text", d, manifest))
    for m in (model, vae, text):
        m.requires_grad_(False)
    return InfinityRuntime(model, vae, text, device=device)
