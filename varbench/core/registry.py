"""Name -> lazily imported object, with the closest names suggested on a typo.

`LazyRegistry` is the one implementation of a name registry in varbench: the methods
(`varbench.policies.REGISTRY`), the evaluators (`varbench.evaluators.REGISTRY`) and the prompt-set
loaders (`varbench.harness.prompts.LOADERS`) are instances. An entry is an object, or a ``"module:attr"``
string imported on first `load` (so importing a registry stays light and heavy dependencies load
only for the entries used). Reading an entry (``registry[name]``) gives what was registered; `load`
gives the object.
"""
from __future__ import annotations

import difflib
import importlib
from typing import Any, Iterator, Mapping, MutableMapping, Optional


class UnknownName(KeyError):
    """A name that is not in a registry; the message suggests the closest names and lists all."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class LazyRegistry(MutableMapping):
    """name -> target ("module:attr" string, imported on first `load`, or the object itself)."""

    def __init__(self, kind: str, entries: Optional[Mapping[str, Any]] = None):
        self.kind = kind
        self._targets: dict[str, Any] = dict(entries or {})
        self._loaded: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        return self._targets[name]

    def __setitem__(self, name: str, target: Any) -> None:
        self._targets[name] = target
        self._loaded.pop(name, None)

    def __delitem__(self, name: str) -> None:
        del self._targets[name]
        self._loaded.pop(name, None)

    def __iter__(self) -> Iterator[str]:
        return iter(self._targets)

    def __len__(self) -> int:
        return len(self._targets)

    def __repr__(self) -> str:
        return f"LazyRegistry({self.kind!r}, {self._targets!r})"

    def register(self, name: str, target: Any) -> None:
        """Add (or replace) `name`: an object, or a lazy ``"module:attr"`` string."""
        self[name] = target

    def close_matches(self, name: Any, n: int = 3) -> list[str]:
        """Up to `n` registered names closest to `name` (for "did you mean")."""
        return difflib.get_close_matches(str(name), list(self._targets), n=n)

    def unknown(self, name: Any, kind: Optional[str] = None) -> UnknownName:
        """The error for a name that is not registered: closest names, then every known name."""
        close = self.close_matches(name)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        return UnknownName(f"Unknown {kind or self.kind} {name!r}.{hint} Known: {', '.join(sorted(self._targets))}.")

    def load(self, name: str, kind: Optional[str] = None) -> Any:
        """The object registered as `name`, imported on first use; `UnknownName` (a KeyError) if none."""
        if name not in self._targets:
            raise self.unknown(name, kind)
        if name not in self._loaded:
            target = self._targets[name]
            if isinstance(target, str):
                module, _, attr = target.partition(":")
                target = getattr(importlib.import_module(module), attr)
            self._loaded[name] = target
        return self._loaded[name]


def resolve(registry: Mapping[str, Any], name: str, kind: str) -> Any:
    """`registry.load(name)` with `kind` in the error; a plain mapping is read as a `LazyRegistry`."""
    reg = registry if isinstance(registry, LazyRegistry) else LazyRegistry(kind, registry)
    return reg.load(name, kind)
