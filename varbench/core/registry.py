"""Name -> lazily imported object, with the closest names suggested on a typo.

`LazyRegistry` is the one implementation of a name registry in varbench: the methods
(`varbench.policies.REGISTRY`), the evaluators (`varbench.evaluators.REGISTRY`) and the prompt-set
loaders (`varbench.harness.prompts.LOADERS`) are instances. An entry is an object, or a ``"module:attr"``
string imported on first `load` (so importing a registry stays light and heavy dependencies load
only for the entries used). Reading an entry (``registry[name]``) gives what was registered; `load`
gives the object.

Three ways in, so that a user's own method, evaluator or prompt set needs no fork of varbench:

* **packaged** entries: the table in the registry's module (and `register` calls);
* **entry points** of installed distributions, in the registry's ``group`` (``varbench.methods``,
  ``varbench.evaluators``, ``varbench.prompt_loaders``). They are looked up once, on the first
  lookup or listing (so importing varbench never scans the installed packages), and imported only
  when loaded. A packaged name wins: an outside entry point of the same name is ignored with a
  warning that names its distribution, so ``method.name: fastvar`` in a record always means the
  packaged FastVAR, whatever is installed beside it. Two outside distributions that claim one name
  are an error when (and only when) that name is loaded;
* a **"module:attr" name** (``method.name: my_pkg.policy:MyPolicy``): imported directly, with no
  registration. The registry answers such names (``in``, `load`) but does not list them.

An outside entry that cannot be imported raises one `EntryLoadError` that names the entry point and
its distribution (or the "module:attr" name) and where the import failed, instead of the traceback
from deep inside someone else's package. Packaged entries keep their own errors (an optional
dependency that is not installed says which extra to install).
"""
from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import logging
import re
import traceback
from typing import Any, Callable, Iterator, Mapping, MutableMapping, Optional

from varbench.core.errors import BadSettingError, FixableError

log = logging.getLogger("varbench")

#: the entry-point groups varbench reads (registry kind -> group)
METHODS_GROUP = "varbench.methods"
EVALUATORS_GROUP = "varbench.evaluators"
PROMPT_LOADERS_GROUP = "varbench.prompt_loaders"

#: ``package.module:attr`` (attr may be dotted: ``module:Outer.Inner``), as in entry points
_IMPORT_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


class UnknownName(KeyError):
    """A name that is not in a registry; the message suggests the closest names and lists all."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class WrongKindError(BadSettingError, TypeError):
    """A ``module:attr`` name (or an entry point) that imports, but is not the kind of thing its slot
    takes: a function where a method slot takes a `Policy` subclass, a module where an evaluator
    class belongs. The message names the setting's value, what it is and what the slot takes."""


class EntryLoadError(FixableError, ImportError):
    """An outside entry (an entry point of an installed distribution, or a "module:attr" name) whose
    import failed. The message names the entry, its distribution and the failing line; it is an
    ``ImportError`` too, so callers that tolerate a missing scorer (the tables) still do."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def is_import_path(name: Any) -> bool:
    """True for a ``"package.module:attr"`` name (loaded directly, without registration)."""
    return isinstance(name, str) and bool(_IMPORT_PATH.match(name))


def _where(exc: BaseException) -> str:
    """``file:line`` of the innermost frame of `exc` (where the import actually failed)."""
    frames = traceback.extract_tb(exc.__traceback__)
    return f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""


def _summary(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}{_where(exc)}"


def _distribution(ep: importlib.metadata.EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return "an unknown distribution"
    return f"distribution {dist.name} {dist.version}"


def _describe_ep(ep: importlib.metadata.EntryPoint) -> str:
    return f"entry point {ep.name!r} = {ep.value!r} (group {ep.group}) of {_distribution(ep)}"


def import_object(path: str, kind: str) -> Any:
    """The object a ``"module:attr"`` name points at. A module or attribute that does not exist is an
    `UnknownName` (a wrong name: the closest attributes are suggested); a module whose own code fails
    to import is an `EntryLoadError` naming the failing line."""
    module, _, attr = path.partition(":")
    try:
        obj = importlib.import_module(module)
    except ModuleNotFoundError as e:
        missing = e.name or ""
        if missing and (module == missing or module.startswith(missing + ".")):
            raise UnknownName(f"Unknown {kind} {path!r}: there is no module {missing!r} (a name with ':' is read "
                              f"as module:attr; is its package installed, or its folder on PYTHONPATH?)") from None
        raise EntryLoadError(f"{kind} {path!r}: importing {module!r} failed: {_summary(e)}") from None
    except Exception as e:  # noqa: BLE001 - someone else's module: one clear line instead of its traceback
        raise EntryLoadError(f"{kind} {path!r}: importing {module!r} failed: {_summary(e)}") from None
    for i, part in enumerate(attr.split(".")):
        if not hasattr(obj, part):
            owner = ".".join([module, *attr.split(".")[:i]]) if i else module
            close = difflib.get_close_matches(part, [n for n in dir(obj) if not n.startswith("_")], n=3)
            hint = f" Did you mean {', '.join(close)}?" if close else ""
            raise UnknownName(f"Unknown {kind} {path!r}: {owner!r} has no attribute {part!r}.{hint}")
        obj = getattr(obj, part)
    return obj


class LazyRegistry(MutableMapping):
    """name -> target ("module:attr" string, imported on first `load`, or the object itself), plus
    the entry points of `group` (discovered on the first lookup) and any "module:attr" name."""

    def __init__(self, kind: str, entries: Optional[Mapping[str, Any]] = None, group: Optional[str] = None,
                 expects: Optional[Callable[[Any], Optional[str]]] = None):
        self.kind = kind
        #: what the slot takes: ``expects(obj)`` is None for a fitting object, else what it should be
        #: ("a subclass of varbench.engine.policy.Policy"); checked on outside entries (entry points and
        #: "module:attr" names) when they load, so a wrong kind fails with one line, not deep in a job
        self.expects = expects
        #: the entry-point group read for outside entries (None: packaged entries only)
        self.group = group
        self._targets: dict[str, Any] = dict(entries or {})
        self._loaded: dict[str, Any] = {}
        self._outside: Optional[dict[str, list[importlib.metadata.EntryPoint]]] = None

    # -- entry points ---------------------------------------------------------------------------
    def outside(self) -> dict[str, list[importlib.metadata.EntryPoint]]:
        """name -> entry points of `group` not shadowed by a packaged name (read once, then kept;
        `rescan` reads them again). Several for one name: a clash, an error when that name loads."""
        if self._outside is None:
            found: dict[str, list[importlib.metadata.EntryPoint]] = {}
            if self.group:
                for ep in importlib.metadata.entry_points(group=self.group):
                    if ep.name in self._targets:
                        log.warning("%s is ignored: varbench ships a %s of that name, which wins; register the "
                                    "outside one under another name", _describe_ep(ep), self.kind)
                        continue
                    same = found.setdefault(ep.name, [])
                    if all(e.value != ep.value for e in same):  # one distribution seen twice on the path
                        same.append(ep)
            self._outside = found
        return self._outside

    def rescan(self) -> None:
        """Forget the discovered entry points (e.g. after installing a package in this process)."""
        for name in self._outside or {}:
            self._loaded.pop(name, None)
        self._outside = None

    def _load_entry_point(self, name: str, kind: str) -> Any:
        eps = self.outside()[name]
        if len(eps) > 1:
            raise EntryLoadError(f"{kind} {name!r} is claimed by several installed distributions: "
                                 + "; ".join(_describe_ep(ep) for ep in eps)
                                 + ". Uninstall one, or give one a 'module:attr' name in the config.")
        ep = eps[0]
        try:
            return ep.load()
        except Exception as e:  # noqa: BLE001 - someone else's package: one clear line instead of its traceback
            raise EntryLoadError(f"{kind} {name!r}: {_describe_ep(ep)} cannot be loaded: {_summary(e)}. Fix or "
                                 f"reinstall that distribution, or uninstall it") from None

    def _check_kind(self, name: str, kind: str, obj: Any) -> Any:
        wanted = self.expects(obj) if self.expects is not None else None
        if wanted:
            what = f"the class {obj.__module__}.{obj.__qualname__}" if isinstance(obj, type) else \
                f"a {type(obj).__name__}" + (f" ({getattr(obj, '__name__', '')})" if getattr(obj, "__name__", "") else "")
            raise WrongKindError(f"{kind} {name!r} imports, but is {what}, not {wanted} (what a {kind} slot takes): "
                                 f"point at your {kind} instead")
        return obj

    # -- the mapping ----------------------------------------------------------------------------
    def __getitem__(self, name: str) -> Any:
        if name in self._targets:
            return self._targets[name]
        if isinstance(name, str) and name in self.outside():
            eps = self.outside()[name]
            return eps[0] if len(eps) == 1 else list(eps)
        if is_import_path(name):
            return name          # the name is its own target
        raise KeyError(name)

    def __contains__(self, name: object) -> bool:
        return name in self._targets or (isinstance(name, str) and (name in self.outside() or is_import_path(name)))

    def __setitem__(self, name: str, target: Any) -> None:
        self._targets[name] = target
        self._loaded.pop(name, None)

    def __delitem__(self, name: str) -> None:
        if name in self._targets:
            del self._targets[name]
        elif name in self.outside():
            del self.outside()[name]
        else:
            raise KeyError(name)
        self._loaded.pop(name, None)

    def __iter__(self) -> Iterator[str]:
        """Packaged names, then the outside (entry-point) names; never the "module:attr" ones."""
        return iter([*self._targets, *(n for n in self.outside() if n not in self._targets)])

    def __len__(self) -> int:
        return len(list(iter(self)))

    def __repr__(self) -> str:
        return f"LazyRegistry({self.kind!r}, {self._targets!r}, group={self.group!r})"

    def packaged(self) -> list[str]:
        """The packaged (and `register`-ed) names alone, without looking for entry points: what
        varbench's own tests iterate, so that an outside package installed beside it changes nothing."""
        return list(self._targets)

    def register(self, name: str, target: Any) -> None:
        """Add (or replace) `name`: an object, or a lazy ``"module:attr"`` string."""
        self[name] = target

    def close_matches(self, name: Any, n: int = 3) -> list[str]:
        """Up to `n` known names closest to `name` (for "did you mean")."""
        return difflib.get_close_matches(str(name), list(self), n=n)

    def unknown(self, name: Any, kind: Optional[str] = None) -> UnknownName:
        """The error for a name that is not registered: closest names, then every known name."""
        close = self.close_matches(name)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        return UnknownName(f"Unknown {kind or self.kind} {name!r}.{hint} Known: {', '.join(sorted(self))}.")

    def load(self, name: str, kind: Optional[str] = None) -> Any:
        """The object registered as `name` (packaged, an entry point, or a "module:attr" name), imported
        on first use; `UnknownName` (a KeyError) if none, `EntryLoadError` if an outside one fails."""
        kind = kind or self.kind
        if name not in self._loaded:
            if name in self._targets:
                target = self._targets[name]
                if isinstance(target, str):
                    module, _, attr = target.partition(":")
                    target = getattr(importlib.import_module(module), attr)
            elif isinstance(name, str) and name in self.outside():
                target = self._check_kind(name, kind, self._load_entry_point(name, kind))
            elif is_import_path(name):
                target = self._check_kind(name, kind, import_object(name, kind))
            else:
                raise self.unknown(name, kind)
            self._loaded[name] = target
        return self._loaded[name]


def resolve(registry: Mapping[str, Any], name: str, kind: str) -> Any:
    """`registry.load(name)` with `kind` in the error; a plain mapping is read as a `LazyRegistry`."""
    reg = registry if isinstance(registry, LazyRegistry) else LazyRegistry(kind, registry)
    return reg.load(name, kind)
