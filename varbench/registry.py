"""Name -> lazily imported class, with the closest names suggested on a typo (policies, evaluators)."""
from __future__ import annotations

import difflib
import importlib
from typing import Mapping


def resolve(registry: Mapping[str, str], name: str, kind: str):
    """The class registered as `name` ("module:Class"), imported on first use."""
    if name not in registry:
        close = difflib.get_close_matches(name, registry, n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise KeyError(f"Unknown {kind} {name!r}.{hint} Known: {', '.join(sorted(registry))}.")
    module, cls = registry[name].split(":")
    return getattr(importlib.import_module(module), cls)
