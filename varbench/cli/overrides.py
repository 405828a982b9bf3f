"""Command-line overrides checked before Hydra sees them, so a typo gets varbench's kind of answer.

Hydra answers ``method=nova_fats`` with a long "Could not load" message that lists internal
``*_schema`` entries and suggests nothing, and ``method.knobs.r_maxx=0.5`` with "Key 'r_maxx' is not
in struct". `check_overrides` answers both in one line, as a :class:`~varbench.core.errors.ConfigError`
the command prints and exits 2 on:

- a config-group option that does not exist (``model=``, ``method=``, ``evaluator=[...]``,
  ``+experiment=``, sweeps ``method=a,b`` too): the closest options, then every valid one, without
  the internal ``*_schema`` entries;
- a key that is not in the composed config (``method.knobs.r_maxx=0.5``): the closest keys at that
  place, and the ``+key=value`` spelling for adding a new one.

Options and keys are read from the same search path as the run: the packaged ``varbench/conf`` and a
``--config-dir`` of the user's. Anything this check does not understand is left to Hydra.
"""
from __future__ import annotations

import difflib
from pathlib import Path
from typing import Iterable, Sequence

from varbench.core.errors import ConfigError
from varbench.core.resources import CONF_DIR

#: Hydra flags that take a value as the next argument
_VALUE_FLAGS = {"--config-dir", "-cd", "--config-name", "-cn", "--config-path", "-cp", "--experimental-rerun"}
#: flags for which nothing is checked (Hydra's shell completion must stay silent)
_SKIP_FLAGS = {"--shell-completion", "-sc"}


def split_argv(argv: Sequence[str]) -> tuple[list[str], list[Path]]:
    """(overrides, extra config folders) from a command line; flags other than ``--config-dir`` are
    dropped."""
    overrides, dirs, i = [], [], 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("-"):
            flag, eq, value = arg.partition("=")
            if flag in _VALUE_FLAGS:
                if not eq:
                    i += 1
                    value = argv[i] if i < len(argv) else ""
                if flag in ("--config-dir", "-cd") and value:
                    dirs.append(Path(value))
        elif "=" in arg or arg.startswith("~"):
            overrides.append(arg)
        i += 1
    return overrides, dirs


def option_files(group: str, search: Iterable[Path]) -> dict[str, Path] | None:
    """``{option: its YAML}`` of config group `group` (``method``, ``benchmark/protocol``) over the
    search path, the first folder winning on a shared name (as in Hydra); None when no folder of that
    name exists."""
    found, any_dir = {}, False
    for root in search:
        folder = Path(root) / group
        if folder.is_dir():
            any_dir = True
            for p in sorted(folder.rglob("*.yaml")):   # nested options too: benchmark=protocol/toy
                found.setdefault(p.relative_to(folder).with_suffix("").as_posix(), p)
    return found if any_dir else None


def group_options(group: str, search: Iterable[Path]) -> list[str] | None:
    """The options of config group `group`, without internal ``*_schema`` entries; None when the
    group does not exist."""
    files = option_files(group, search)
    return None if files is None else sorted(n for n in files if not n.endswith("_schema"))


def _closest(name: str, names: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
    return f" Did you mean {', '.join(close)}?" if close else ""


def _values(override) -> list[str]:
    if override.is_sweep_override():
        return list(override.sweep_string_iterator())
    value = override.value()
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    return [] if value is None else [str(value)]


def check_groups(overrides, search: list[Path]) -> None:
    for o in overrides:
        group = o.key_or_group
        if o.is_delete() or group.startswith("hydra") or o.package:
            continue
        options = group_options(group, search)
        if options is None:
            continue
        for value in _values(o):
            if value not in options and value != "null":
                raise ConfigError(f"{o.input_line}: no {group} option {value!r}.{_closest(value, options)} "
                                  f"Options: {', '.join(options)}")


def first_choice(o) -> str:
    """The override as a plain (non-sweep) group selection, for composing one config to read keys from."""
    prefix = "+" if o.is_add() else ""
    if o.is_sweep_override():
        return f"{prefix}{o.key_or_group}={next(iter(o.sweep_string_iterator()))}"
    return o.input_line


def check_keys(overrides, search: list[Path]) -> None:
    """Keys set without ``+`` must exist in the config the group selections compose to."""
    keys = [o for o in overrides if not o.is_add() and not o.is_delete() and not o.key_or_group.startswith("hydra")
            and group_options(o.key_or_group, search) is None and not o.package]
    if not keys:
        return
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import DictConfig, OmegaConf

    import varbench.harness  # noqa: F401 - the method schemas the presets name

    groups = [first_choice(o) for o in overrides if o not in keys and not o.key_or_group.startswith("hydra")]
    extra = [f"hydra.searchpath=[{','.join('file://' + str(d.resolve()) for d in search[1:])}]"] if search[1:] else []
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(search[0]), version_base="1.3"):
            cfg = compose(config_name="config", overrides=groups + extra)
    except Exception:  # noqa: BLE001 - anything else is Hydra's to report, as before
        return
    finally:
        GlobalHydra.instance().clear()
    for o in keys:
        parts = o.key_or_group.split(".")
        node = cfg
        for depth, part in enumerate(parts):
            if not isinstance(node, DictConfig) or node._is_missing() or node._is_none():
                break   # a list index, an interpolation or an open value: Hydra checks the rest
            if part not in node:
                if not OmegaConf.is_struct(node):
                    break
                where = ".".join(parts[:depth])
                names = [str(k) for k in node.keys()]
                close = difflib.get_close_matches(part, names, n=3, cutoff=0.6)
                hint = f" Did you mean {', '.join((where + '.' if where else '') + c for c in close)}?" if close else ""
                raise ConfigError(f"{o.input_line}: {'.'.join(parts[:depth + 1])} is not a setting.{hint} "
                                  f"Settings {'of ' + where if where else 'at the top'}: {', '.join(names)}; "
                                  f"to add a new one, write +{o.input_line}")
            node = node[part]


def check_overrides(argv: Sequence[str]) -> None:
    """Raise one :class:`ConfigError` for the first override of `argv` that names no config-group
    option or no setting; return quietly when all are fine or when Hydra's own parser objects (Hydra
    then reports it as it always has)."""
    if any(a.partition("=")[0] in _SKIP_FLAGS for a in argv):
        return
    lines, dirs = split_argv(argv)
    if not lines:
        return
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        overrides = OverridesParser.create().parse_overrides(lines)
    except Exception:  # noqa: BLE001 - a syntax error: Hydra's message points at the character
        return
    search = [Path(CONF_DIR)] + dirs
    check_groups(overrides, search)
    check_keys(overrides, search)
