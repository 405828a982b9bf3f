"""Locating, identifying and loading local weight files for evaluators.

Nothing here downloads: every evaluator takes explicit local paths (or `weights_dir` + file name) and
fails with one error that names the file, the path searched and where the file is published.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import torch

from varbench.core.errors import FixableError
from varbench.core.filehash import sha256_file
from varbench.core.missing import MissingFile, note
from varbench.engine.checkpoints import load_state_dict_strict



class WeightsNotFoundError(FixableError, FileNotFoundError):
    """A required weights/config file is not where the config says it is."""


class WrongWeightsError(FixableError, ValueError):
    """A weights file exists but is not the file the evaluator was configured for."""


def resolve_file(path: Optional[str], weights_dir: Optional[str], filename: str, *, what: str, published: str) -> Path:
    """Return the local path of `what`, or raise `WeightsNotFoundError` naming the fix.

    `path` wins when given; otherwise `weights_dir / filename`. The error lists the exact path that was
    searched and where the file can be obtained, because no evaluator downloads anything. Inside a
    preflight (:func:`varbench.core.missing.collecting`) a missing file is noted and its path returned.
    """
    if path:
        candidate = Path(os.path.expanduser(str(path)))
    elif weights_dir:
        candidate = Path(os.path.expanduser(str(weights_dir))) / filename
    else:
        candidate = Path(filename)
    if not candidate.exists():
        if note(MissingFile(f"{what} {filename}", str(candidate.resolve()), published,
                            "set `weights`/`weights_dir` of the evaluator config (usually via paths.weights_dir)")):
            return candidate        # a preflight collecting every missing file: go on to the next check
        raise WeightsNotFoundError(
            f"{what}: file {filename!r} not found; searched {str(candidate.resolve())!r}. "
            f"It is published at {published}; download it there and point the evaluator config at it "
            f"(set `weights`/`weights_dir`, usually via paths.weights_dir)."
        )
    return candidate


def check_sha256(path: Path, expected: Optional[str], *, what: str, known: Optional[dict[str, str]] = None) -> str:
    """Hash `path`; raise `WrongWeightsError` if it differs from `expected` or is a known *other* file.

    `known` maps sha256 -> human label of a file that is NOT the one wanted (e.g. the HPS v2.0
    checkpoint when v2.1 was asked for).
    """
    digest = sha256_file(path)
    if known and digest in known:
        raise WrongWeightsError(f"{what}: {str(path)!r} is {known[digest]} (sha256 {digest}), not the file configured.")
    if expected and digest.lower() != expected.lower():
        raise WrongWeightsError(
            f"{what}: {str(path)!r} has sha256 {digest}, expected {expected}. Wrong file or corrupted download; "
            f"fix the path or drop `expected_sha256` if you really mean this file."
        )
    return digest


def load_state_dict(path: Path, *, what: str, key: Optional[str] = None, weights_only: bool = True) -> dict:
    """`torch.load` a checkpoint on CPU and optionally unwrap `ckpt[key]`, with errors that say what was found."""
    try:
        obj = torch.load(str(path), map_location="cpu", weights_only=weights_only)
    except Exception as e:  # unpickling errors, truncated files
        raise WrongWeightsError(
            f"{what}: could not load {str(path)!r} as a torch checkpoint ({type(e).__name__}: {e}). "
            f"If it is a trusted pickle with Python objects, set weights_only=False."
        ) from e
    if key is not None:
        if not isinstance(obj, dict) or key not in obj:
            found = list(obj.keys())[:5] if isinstance(obj, dict) else type(obj).__name__
            raise WrongWeightsError(f"{what}: {str(path)!r} has no {key!r} entry (top-level: {found}); wrong kind of file?")
        obj = obj[key]
    if not isinstance(obj, dict):
        raise WrongWeightsError(f"{what}: {str(path)!r} does not hold a state dict (got {type(obj).__name__}).")
    return obj


def strict_load(module: torch.nn.Module, state: dict, *, what: str, path: Path, ignore_missing: tuple[str, ...] = ()) -> None:
    """Strict load of an evaluator's weights: `varbench.engine.checkpoints.load_state_dict_strict`
    raising `WrongWeightsError`; module keys ending in one of `ignore_missing` may be absent."""
    load_state_dict_strict(module, state, source=f"{what}: {str(path)!r}", error=WrongWeightsError,
                           hint="Wrong file or wrong model/version setting?",
                           may_miss=(lambda k: k.endswith(ignore_missing)) if ignore_missing else None)
