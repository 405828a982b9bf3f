"""Strict readers for the files a user gives: text, JSON, JSON Lines and YAML, decoded and parsed in
one place so that every fault is a :class:`~varbench.core.errors.MalformedFileError` naming the file
and where it went wrong, never a parser's own exception.

Usage (any loader of prompt sets, question files, configs)::

    from varbench.core.inputs import read_text, read_json, read_jsonl, read_yaml, position

    text = read_text(path, "DPG-Bench prompt file")          # str; UTF-8, strictly
    data = read_json(path, "ImageReward prompt file")        # duplicate keys refused
    for line_no, obj in read_jsonl(path, "GenEval prompt file"): ...
    cfg = read_yaml(path, "method config")                   # duplicate keys refused, line/column named
    raise malformed(path, text, char_index, "a row needs 4 columns")   # a parser of one's own (CSV ...)

The tolerance rule (the same for every format; docs/running.md, "What varbench accepts in a file"):
a file is UTF-8; one leading byte-order mark is skipped; blank lines of a line-based file (JSON Lines,
CSV) are skipped; a prompt's surrounding whitespace is not part of it. Nothing else is repaired: a
byte that is not UTF-8, a parse error, a key given twice, a value of the wrong shape, a folder where a
file belongs, are each refused with the file and the line and column (or byte offset) named.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterator

from varbench.core.errors import MalformedFileError

BOM = "\ufeff"


def position(text: str, index: int) -> tuple[int, int, int]:
    """``(line, column, byte)`` of character ``index`` of ``text``: 1-based line and column (in
    characters), 0-based byte offset in the UTF-8 encoding (what ``cmp``/``xxd`` show)."""
    index = max(0, min(index, len(text)))
    head = text[:index]
    line = head.count("\n") + 1
    column = index - (head.rfind("\n") + 1) + 1
    return line, column, len(head.encode("utf-8"))


def malformed(path: str | os.PathLike, text: str, index: int, problem: str, fix: str = "",
              bom: bool = False) -> MalformedFileError:
    """The error for a fault at character ``index`` of the decoded ``text`` of ``path`` (``bom``: the
    file began with a byte-order mark that :func:`read_text` skipped, 3 bytes before ``text``)."""
    line, column, byte = position(text, index)
    return MalformedFileError(path, problem, line=line, column=column, byte=byte + (3 if bom else 0), fix=fix)


def read_bytes(path: str | os.PathLike, what: str = "file") -> bytes:
    """The bytes of ``path``; a folder, a special file or an unreadable file is a
    :class:`MalformedFileError` (a missing one stays ``FileNotFoundError``: the caller says where to
    get it)."""
    p = Path(path)
    if p.is_dir():
        raise MalformedFileError(p, f"is a folder; the {what} must be a file")
    if p.exists() and not p.is_file():
        raise MalformedFileError(p, f"is not a regular file (a device, socket or pipe); the {what} must be a file")
    try:
        return p.read_bytes()
    except FileNotFoundError:
        raise
    except OSError as e:
        raise MalformedFileError(p, f"cannot be read ({e.strerror or e}); the {what} must be readable",
                                 fix="check its permissions") from None


def decode(path: str | os.PathLike, data: bytes, what: str = "file") -> str:
    """``data`` (the bytes of ``path``) as UTF-8 text, strictly, one leading byte-order mark skipped."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise MalformedFileError(path, f"is not UTF-8 text (byte {data[e.start:e.start + 1].hex()} cannot be decoded: "
                                 f"{e.reason}); the {what} must be UTF-8", line=data.count(b"\n", 0, e.start) + 1,
                                 byte=e.start,
                                 fix="re-save it as UTF-8 (e.g. iconv -f latin1 -t utf-8)") from None
    return text[1:] if text.startswith(BOM) else text


def read_text(path: str | os.PathLike, what: str = "file") -> str:
    """The text of ``path`` (UTF-8, strictly; see the module docstring)."""
    return decode(path, read_bytes(path, what), what)


def parse_json(path: str | os.PathLike, text: str, what: str = "file", bom: bool = False) -> Any:
    """``text`` (the decoded text of ``path``) parsed as JSON; a syntax error or a key given twice
    names the line, column and byte."""
    def fault(i: int, problem: str) -> MalformedFileError:
        return malformed(path, text, i, problem, bom=bom)

    try:
        return json.loads(text, object_pairs_hook=_no_duplicates_at(path, text, 0, fault))
    except json.JSONDecodeError as e:
        raise fault(e.pos, f"is not valid JSON ({e.msg}); the {what} must be JSON") from None


def _no_duplicates_at(path, text: str, offset: int, fault):
    def hook(pairs):
        seen = set()
        for k, _ in pairs:
            if k in seen:
                first = text.find(json.dumps(k))
                second = text.find(json.dumps(k), first + 1)
                raise fault(max(second if second >= 0 else first, 0), f"key {k!r} is given twice (JSON keeps only the last; keep the one you mean)")
            seen.add(k)
        return dict(pairs)
    return hook


def read_json(path: str | os.PathLike, what: str = "file") -> Any:
    """``path`` parsed as one JSON value (strict UTF-8, duplicate keys refused)."""
    data = read_bytes(path, what)
    text = decode(path, data, what)
    return parse_json(path, text, what, bom=data.startswith(b"\xef\xbb\xbf"))


def read_jsonl(path: str | os.PathLike, what: str = "file") -> Iterator[tuple[int, Any]]:
    """``(line index, value)`` of every non-blank line of the JSON Lines file ``path`` (0-based line
    index, as prompt indices count); a line that does not parse names its line, column and byte."""
    data = read_bytes(path, what)
    text = decode(path, data, what)
    bom = data.startswith(b"\xef\xbb\xbf")
    start = 0
    for i, line in enumerate(text.split("\n")):
        if line.strip():
            yield i, parse_json_line(path, text, line, start, what, bom)
        start += len(line) + 1


def parse_json_line(path, text: str, line: str, start: int, what: str, bom: bool) -> Any:
    def fault(i: int, problem: str) -> MalformedFileError:
        return malformed(path, text, start + i, problem, bom=bom)

    try:
        return json.loads(line, object_pairs_hook=_no_duplicates_at(path, line, 0, fault))
    except json.JSONDecodeError as e:
        raise fault(e.pos, f"is not a JSON value ({e.msg}); every line of the {what} is one JSON object") from None


def read_yaml(path: str | os.PathLike, what: str = "config file") -> Any:
    """``path`` parsed as YAML the way Hydra reads it (OmegaConf's loader: ``1e-3`` is a float), with
    every fault named at its line and column: a syntax error, a key given twice (YAML would keep the
    last silently), a tab where indentation belongs."""
    import yaml
    from omegaconf._utils import get_yaml_loader

    data = read_bytes(path, what)
    text = decode(path, data, what)
    try:
        return yaml.load(text, Loader=_strict_loader(get_yaml_loader()))
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        problem = " ".join(x for x in (e.context, e.problem) if x)
        line, column = (mark.line + 1, mark.column + 1) if mark is not None else (None, None)
        byte = len(text[:mark.index].encode("utf-8")) if mark is not None else None
        raise MalformedFileError(path, f"is not valid YAML: {problem}", line=line, column=column, byte=byte,
                                 fix=f"correct the {what} at that place") from None
    except yaml.YAMLError as e:
        raise MalformedFileError(path, f"is not valid YAML: {e}") from None


_LOADERS: dict = {}


def _strict_loader(base):
    """``base`` (a PyYAML loader class) refusing a mapping key given twice, at the second one."""
    if base in _LOADERS:
        return _LOADERS[base]
    import yaml

    class Strict(base):     # type: ignore[misc, valid-type]
        def construct_mapping(self, node, deep=False):
            seen = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                try:
                    hashed = key in seen
                except TypeError:
                    hashed = False
                if hashed:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {key!r} is given twice (YAML keeps only the last; keep the one you mean)",
                        key_node.start_mark)
                try:
                    seen.add(key)
                except TypeError:
                    pass
            return super().construct_mapping(node, deep=deep)

    _LOADERS[base] = Strict
    return Strict
