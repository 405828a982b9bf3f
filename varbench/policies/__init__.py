"""Policy registry: `build_policy(name, **knobs)`; a typo gets the closest names suggested."""
from __future__ import annotations

import difflib
import importlib

from .base import Policy  # noqa: F401

#: method name -> "module:Class" (imported lazily)
REGISTRY: dict[str, str] = {
    "baseline": "varbench.policies.baseline:Baseline",
    "fastvar": "varbench.policies.fastvar:FastVAR",
    "nova": "varbench.policies.nova:NOVA",
    "toprovar": "varbench.policies.toprovar:ToProVAR",
    "skip_last": "varbench.policies.skip:SkipLast",
    "skipvar_fixed": "varbench.policies.skip:SkipVARFixed",
    "compose": "varbench.policies.compose:Compose",
}


def build_policy(name: str, **knobs) -> Policy:
    if name not in REGISTRY:
        close = difflib.get_close_matches(name, REGISTRY, n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise KeyError(f"Unknown method {name!r}.{hint} Known: {', '.join(sorted(REGISTRY))}.")
    module, cls = REGISTRY[name].split(":")
    return getattr(importlib.import_module(module), cls)(**knobs)
