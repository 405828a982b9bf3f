"""The machinery every method's knobs share: types and ranges, the checks, the Hydra schemas.

Each method states its knobs once, in its own policy file: a frozen dataclass (``NOVAKnobs`` in
``varbench/policies/nova.py``, ...) subclassing :class:`MethodKnobs`, set as the policy's ``Knobs``.
Its fields are the knobs a config may set under ``method.knobs``; each field holds the default, its
annotation the type, and its metadata (:func:`knob`) the range or choices; its docstring says which
way each knob trades speed against quality. The policy's constructor builds its knobs from it (so
each default exists once) and keeps only the cross-knob rules (``r_min <= r_max``).

:data:`SCHEMAS` maps each registered method name (``method.name``) to its dataclass, found through
the method registry (:data:`varbench.policies.REGISTRY`: the class's ``Knobs``). :func:`check_knobs`
checks a config's knobs against it (unknown knob -> the closest known one; wrong type; out of range
or not a choice; a scale index outside the schedule) and raises
:class:`varbench.core.errors.ConfigError` naming ``method.knobs.<knob>``, the value and what is
allowed. Constructing a dataclass (``NOVAKnobs(q_sub=0)``) runs the same checks (``__post_init__``).
:func:`type_matches` / :func:`describe_type` read an annotation; config validation also uses them
for a method without a dataclass (its constructor's annotations).

Hydra: :func:`register` stores ``<method>_schema`` (``{name, knobs: <composed defaults>}``) in the
ConfigStore, group ``method`` (and at the root, for tools that compose a preset file with
``conf/method`` as the config dir). Each method's base preset starts with
``defaults: [<method>_schema, _self_]`` and states only what differs. The stored node is a plain
(untyped) dict generated from the dataclass, not the dataclass itself, on purpose: a typed node
would turn ``0`` into ``0.0`` for a float knob (``protect_first: 0``), which changes the resolved
config and so every store hash; and a type error would surface as a Hydra composition error instead
of the named :class:`ConfigError` below. Validation at start-up (``validate_config``) enforces the
dataclass instead.

``composed=False`` knobs are accepted and checked but not put into the composed config unless a
preset or an override sets them: adding their key to presets that never had it would change those
presets' hashes (NOVA's ``sublayers``; FastVAR's block fractions, which only index-addressed presets
state).
"""
from __future__ import annotations

import collections.abc as cabc
import dataclasses
import difflib
import functools
import inspect
import typing
from dataclasses import field
from typing import Any, Mapping, Optional, Sequence

from varbench.core.errors import ConfigError
from varbench.policies import REGISTRY

#: the default folder of weight files, as a config interpolation (for knobs that name a file)
WEIGHTS_DIR = "${oc.env:VARBENCH_WEIGHTS,weights}"


def knob(default: Any, *, choices: Sequence[Any] | None = None, ge: float | None = None, gt: float | None = None,
         le: float | None = None, lt: float | None = None, scale: str | None = None, composed: bool = True):
    """A knob field. choices: allowed values (each element, for a list knob). ge/gt/le/lt: bounds (each
    element or map value, for containers). scale: ``index`` (a schedule index, negative from the end:
    -n..n-1), ``count`` (a number of last scales: 0..n-1) or ``run`` (scales run: >= 1, or negative
    all-but-|k| with -n < k), checked against the schedule when it is known. composed: whether the
    default is put into the composed config (see the module docstring)."""
    md = {k: v for k, v in dict(choices=tuple(choices) if choices is not None else None, ge=ge, gt=gt, le=le, lt=lt,
                                 scale=scale).items() if v is not None}
    md["composed"] = composed
    return field(default=default, metadata=md)


class MethodKnobs:
    """Base of a method's knob dataclass: ``__post_init__`` checks every field against its type and
    range. Subclass it as ``@dataclass(frozen=True) class <Name>Knobs(MethodKnobs, method="<name>")``
    (the method name is for messages)."""

    method = "?"

    def __init_subclass__(cls, method: Optional[str] = None, **kw):
        super().__init_subclass__(**kw)
        if method is not None:
            cls.method = method

    def __post_init__(self):
        for f in dataclasses.fields(self):
            check_value(type(self), f.name, getattr(self, f.name), f"method.knobs.{f.name}")

    def as_dict(self) -> dict[str, Any]:
        """{knob: value} in field order (values as given: a list stays a list)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def check_config(cls, knobs: Mapping[str, Any], n_scales: Optional[int], where: str) -> None:
        """Checks of a config's knobs beyond each field's own (after those pass); raises ConfigError.
        Default: none. `compose` checks each member against its own method here."""


# -- the registered methods' dataclasses -------------------------------------------------------------
def knobs_class(method: str) -> Optional[type]:
    """The knob dataclass of registered `method` (its policy's ``Knobs``); None if it declares none."""
    return getattr(REGISTRY.load(method), "Knobs", None)


class MethodSchemas(Mapping):
    """method name -> knob dataclass, for every registered method that declares one; a live view of
    the registry (a method registered later is in it)."""

    def _all(self) -> dict[str, type]:
        return {name: k for name in REGISTRY if (k := knobs_class(name)) is not None}

    def __getitem__(self, method: str) -> type:
        k = knobs_class(method) if method in REGISTRY else None
        if k is None:
            raise KeyError(method)
        return k

    def __iter__(self):
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


#: method name -> knob dataclass (see :class:`MethodSchemas`)
SCHEMAS = MethodSchemas()


# -- Hydra schemas -----------------------------------------------------------------------------------
def _plain(v: Any) -> Any:
    if isinstance(v, tuple):
        return [_plain(x) for x in v]
    if isinstance(v, Mapping):
        return {k: _plain(x) for k, x in v.items()}
    return v


def schema_node(name: str, *, resolve: bool = False) -> dict:
    """``{"name": method, "knobs": {...}}``: the composed defaults of ``<method>`` (or ``<method>_schema``)."""
    method = name[: -len("_schema")] if name.endswith("_schema") else name
    cls = SCHEMAS[method]
    node = {"name": method, "knobs": {f.name: _plain(f.default) for f in dataclasses.fields(cls)
                                       if f.metadata.get("composed", True)}}
    if resolve:
        from omegaconf import OmegaConf

        node = OmegaConf.to_container(OmegaConf.create(node), resolve=True)
    return node


def register() -> None:
    """Store ``<method>_schema`` in Hydra's ConfigStore for every packaged method with a knob dataclass
    (idempotent). Called when :mod:`varbench.harness` is imported; it imports every packaged method.
    Methods from other packages (entry points) are not imported here: a broken plugin must fail only
    the run that names it, and their YAML carries its own defaults instead of ``<method>_schema``."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    for method in REGISTRY.packaged():
        if knobs_class(method) is None:
            continue
        node = schema_node(method)
        cs.store(group="method", name=f"{method}_schema", node=node)
        cs.store(name=f"{method}_schema", node=node)   # conf/method as the config dir (experiments' loaders)


# -- checks ------------------------------------------------------------------------------------------
def _bounds(md: Mapping[str, Any]) -> str:
    parts = []
    if "ge" in md or "gt" in md:
        parts.append(f">= {md['ge']}" if "ge" in md else f"> {md['gt']}")
    if "le" in md or "lt" in md:
        parts.append(f"<= {md['le']}" if "le" in md else f"< {md['lt']}")
    return " and ".join(parts)


def _in_bounds(x: Any, md: Mapping[str, Any]) -> bool:
    return not (("ge" in md and x < md["ge"]) or ("gt" in md and x <= md["gt"])
                or ("le" in md and x > md["le"]) or ("lt" in md and x >= md["lt"]))


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def type_matches(value: Any, tp: Any) -> bool:
    """Whether a YAML value fits annotation `tp`; lenient where the annotation says little."""
    if tp is Any or tp is inspect.Parameter.empty:
        return True
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Union or (origin is not None and str(origin) == "<class 'types.UnionType'>"):
        return any(type_matches(value, a) for a in args)
    if tp is type(None):
        return value is None
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return _is_int(value)
    if tp is float:
        return _is_num(value)
    if tp is str:
        return isinstance(value, (str, int, float)) and not isinstance(value, bool)  # choices: the constructor's
    if origin in (cabc.Sequence, list, tuple) or tp in (list, tuple):
        if not isinstance(value, (list, tuple)):
            return False
        inner = args[0] if args else Any
        return all(type_matches(v, inner) for v in value)
    if origin in (cabc.Mapping, dict) or tp is dict:
        if not isinstance(value, Mapping):
            return False
        if len(args) == 2:
            kt, vt = args
            key_ok = (lambda k: _is_int(k) or (isinstance(k, str) and k.lstrip("-").isdigit())) if kt is int else (
                lambda k: type_matches(k, kt))
            return all(key_ok(k) and type_matches(v, vt) for k, v in value.items())
        return True
    return True


def describe_type(tp: Any) -> str:
    """An annotation as a reader would write it (``Optional[int]``, ``Sequence[str]``)."""
    s = str(tp).replace("typing.", "").replace("collections.abc.", "")
    return s.replace("<class '", "").replace("'>", "").replace("NoneType", "None")


@functools.lru_cache(maxsize=None)
def _fields(cls: type) -> dict[str, tuple[Any, Mapping[str, Any]]]:
    """{knob: (type, metadata)} of a knob dataclass (annotations resolved once per class)."""
    hints = typing.get_type_hints(cls)
    return {f.name: (hints[f.name], f.metadata) for f in dataclasses.fields(cls)}


def _choice_ok(v: Any, choices: tuple) -> bool:
    return v in choices or (not isinstance(v, (bool, str)) and _is_num(v) and str(v) in choices)


def check_value(cls: type, key: str, value: Any, where: str, n_scales: int | None = None) -> None:
    """One knob of `cls` against its type, range/choices and (given n_scales) the schedule."""
    tp, md = _fields(cls)[key]
    if not type_matches(value, tp):
        raise ConfigError(f"{where}={value!r} does not fit {cls.method}'s {key}: must be {describe_type(tp)}"
                          + (f" {_bounds(md)}" if _bounds(md) else "")
                          + (f", one of {list(md['choices'])}" if "choices" in md else ""))
    if value is None:
        return
    items = list(value.values()) if isinstance(value, Mapping) else list(value) if isinstance(value, (list, tuple)) else [value]
    if "choices" in md:
        bad = [v for v in items if not _choice_ok(v, md["choices"])]
        if bad:
            raise ConfigError(f"{where}={value!r}: {bad[0]!r} is not one of {list(md['choices'])}")
    if _bounds(md):
        bad = [v for v in items if _is_num(v) and not _in_bounds(v, md)]
        if bad:
            what = "each value" if isinstance(value, Mapping) else "each entry" if len(items) != 1 or value is not bad[0] else ""
            null = " (or null)" if type_matches(None, tp) and not what else ""
            raise ConfigError(f"{where}={value!r}: {what + ' ' if what else ''}must be {_bounds(md)}{null}, got {bad[0]!r}")
    scale = md.get("scale")
    if scale and n_scales is not None:
        n = n_scales
        for v in items:
            if not _is_int(v):
                continue
            if scale == "index" and not -n <= v < n:
                raise ConfigError(f"{where}={value!r}: scale index {v} is outside the {n}-scale schedule "
                                  f"(valid: {-n}..{n - 1}, negative from the end); it would be silently ignored")
            if scale == "count" and not 0 <= v < n:
                raise ConfigError(f"{where}={v}: must be 0..{n - 1} on this {n}-scale schedule "
                                  f"({v} would leave no scale to run)")
            if scale == "run" and (v == 0 or v <= -n or v > n):
                raise ConfigError(f"{where}={v}: must be 1..{n} (scales run) or negative -1..{-(n - 1)} "
                                  f"(all but the last |k|) on this {n}-scale schedule; "
                                  + (f"{v} runs no scale" if v <= 0 else f"{v} > {n} would silently run every scale"))
    elif scale == "run" and value == 0:
        raise ConfigError(f"{where}=0 would run no scale at all; use >= 1 (or negative: all but the last |k|)")


def check_knobs(method: str, knobs: Mapping[str, Any], n_scales: int | None = None,
                where: str = "method.knobs") -> None:
    """Every knob of `method` is known and fits its dataclass field, then the dataclass's own
    `check_config` (compose: each member against its own method)."""
    cls = SCHEMAS.get(method)
    if cls is None:
        return   # a method without a knob dataclass: validation checks its constructor's signature
    names = [f.name for f in dataclasses.fields(cls)]
    for key, value in knobs.items():
        key = str(key)
        if key not in names:
            close = difflib.get_close_matches(key, names, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{where}.{key}: {method} has no knob {key!r}.{hint} "
                              f"Knobs: {', '.join(names) or '(none)'}")
        check_value(cls, key, value, f"{where}.{key}", n_scales)
    cls.check_config(knobs, n_scales, where)
