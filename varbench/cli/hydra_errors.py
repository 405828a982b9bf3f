"""Hydra's errors, caught at the command line and said in one line (exit 2), like every other input fault.

Hydra stays the composer; what it raises while composing a command's configs (a YAML file that does
not parse, an override-grammar mistake, ``+key`` on a key that exists, ``~key`` on one that does not,
a config group option it cannot find) reaches the user through :func:`translate` as a
:class:`~varbench.core.errors.FixableError`: the file with its line and column, or the override with
the fix. ``HYDRA_FULL_ERROR=1`` turns the translation off, so Hydra's own full trace is still one
setting away (:func:`full_error`).

:func:`check_config_dirs` reads every YAML file of each ``--config-dir`` strictly before Hydra does
(:func:`varbench.core.inputs.read_yaml`: a parse error names file, line and column; a key given twice,
which YAML would silently keep the last of, is refused; a file whose top level is not a mapping too).
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Optional, Sequence

from varbench.core.errors import ConfigError, FixableError, MalformedFileError


def full_error() -> bool:
    """True when the user asked for Hydra's full traces (``HYDRA_FULL_ERROR=1``)."""
    return os.environ.get("HYDRA_FULL_ERROR", "") == "1"


def _chain(exc: BaseException):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


_APPEND = re.compile(r"Could not append to config\. An item is already at '([^']+)'")
_DELETE = re.compile(r"Could not delete from config\. '([^']+)' does not exist")
_PLAIN = re.compile(r"Either remove \+ prefix: '([^']+)'")


def translate(exc: BaseException) -> Optional[FixableError]:
    """The one-line error for an exception Hydra (or PyYAML under it) raised while composing; None
    when it is not an input fault this knows (the caller re-raises it: a bug keeps its traceback)."""
    import yaml
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    for e in _chain(exc):
        if isinstance(e, FixableError):
            return e
        if isinstance(e, yaml.MarkedYAMLError):
            mark = e.problem_mark or e.context_mark
            problem = " ".join(x for x in (e.context, e.problem) if x)
            if mark is not None and mark.name and Path(mark.name).exists():
                return MalformedFileError(mark.name, f"is not valid YAML: {problem}", line=mark.line + 1,
                                          column=mark.column + 1, fix="correct the config file at that place")
            return ConfigError(f"a config file is not valid YAML: {problem}")
    msg = str(exc).strip()
    first = msg.splitlines()[0] if msg else type(exc).__name__
    m = _APPEND.search(msg)
    if m:
        key = m.group(1)
        given = _PLAIN.search(msg)
        line = given.group(1) if given else f"{key}=..."
        return ConfigError(f"+{line}: {key} exists: drop the + (write {line}), or write ++{line} "
                           "to set it whether or not it exists")
    m = _DELETE.search(msg)
    if m:
        return ConfigError(f"~{m.group(1)}: {m.group(1)} does not exist, so there is nothing to delete: drop the override")
    if isinstance(exc, HydraException) or isinstance(exc, OmegaConfBaseException):
        hint = " (override grammar: https://hydra.cc/docs/advanced/override_grammar/basic)" \
            if type(exc).__name__ == "OverrideParseException" else ""
        return ConfigError(f"{first}{hint}; HYDRA_FULL_ERROR=1 shows Hydra's full trace")
    return None


def check_config_dirs(dirs: Sequence[Path]) -> None:
    """Each ``--config-dir`` is a folder, and each YAML file in it parses as a mapping, strictly (see
    the module docstring). A folder that does not exist is named as missing."""
    from varbench.core.inputs import read_yaml
    from varbench.core.missing import MissingFile, MissingFilesError

    for d in dirs:
        d = Path(d)
        if not d.exists():
            raise MissingFilesError(f"--config-dir {d} does not exist (searched: {d.resolve()}): pass the folder "
                                    "that holds your config groups (method/, benchmark/, ...)",
                                    [MissingFile("--config-dir", str(d.resolve()))])
        if not d.is_dir():
            raise MalformedFileError(d, "is a file; --config-dir takes a folder holding config groups "
                                        "(method/, benchmark/, ...)")
        for f in sorted(d.rglob("*.yaml")):
            data = read_yaml(f, "config file")
            if data is not None and not isinstance(data, dict):
                raise MalformedFileError(f, f"holds a {type(data).__name__}, not a mapping of settings; a config "
                                            "file is `key: value` lines (docs/extending.md)", line=1)
