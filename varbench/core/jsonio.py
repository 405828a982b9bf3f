"""Files a job writes, written so a kill never leaves half of one: `atomic_write_bytes` (temp file,
fsync, rename), JSON (`read_json`, `write_json`) and append-only JSONL (`append_jsonl`, `read_jsonl`,
which drops a last line cut short by a kill and names the fix for any other garbled line)."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable, Mapping

from varbench.core.errors import GarbledFileError, writing
from varbench.core.locks import file_mode


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a same-folder temp file, fsync, and ``os.replace``.

    The file gets the mode ``open()`` would give it (``0o666 & ~umask``; ``mkstemp`` alone makes
    0600, unreadable by the rest of a group sharing the store). A killed write leaves a
    ``.<name>.<random>.tmp`` file, removed by :func:`varbench.core.locks.clean_stray_tmp` when the next
    job takes the folder's lock."""
    path = Path(path)
    with writing(path):      # a read-only or full disk: one error naming the file and the fix
        _atomic_write(path, data)



def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, file_mode())
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def json_default(obj: Any) -> Any:
    # numpy scalars / arrays and paths show up in rows built by evaluators; store them plainly.
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")



def dumps_line(row: Mapping) -> str:
    return json.dumps(row, ensure_ascii=False, default=json_default, allow_nan=True) + "\n"



#: what to do about a garbled line: each line is one image's row, and a relaunch redoes what has no row
_JSONL_FIX = ("Fix: delete that line (a relaunch regenerates or rescores what it described), or the file; "
              "in a finished entry, rerun its job with runtime.force=true")



def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """Rows of a JSONL file; a truncated (unterminated, unparsable) last line is dropped."""
    path = Path(path)
    if not path.exists():
        return []
    data = path.read_bytes()
    lines = data.split(b"\n")
    rows = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        torn = i == len(lines) - 1   # last chunk with no newline: maybe a write cut short by a kill
        try:
            row = json.loads(line)
        except ValueError as e:      # JSONDecodeError, or UnicodeDecodeError (bytes cut mid-character)
            if torn:
                break
            raise GarbledFileError(f"{path}: line {i + 1} is not JSON (not the last line, so not a cut-off write): "
                                   f"{e}; the line starts {line[:60]!r}. {_JSONL_FIX}") from None
        if not isinstance(row, dict):
            if torn:
                break
            raise GarbledFileError(f"{path}: line {i + 1} is {type(row).__name__} JSON, not an object (each line of "
                                   f"a record's .jsonl is one row): {line[:60]!r}. {_JSONL_FIX}")
        rows.append(row)
    return rows



def repair_tail(path: Path) -> None:
    """Cut an unterminated last line so appended rows start on a fresh line."""
    if not path.exists():
        return
    size = path.stat().st_size
    if size == 0:
        return
    with open(path, "rb+") as f:
        f.seek(-1, os.SEEK_END)
        if f.read(1) == b"\n":
            return
        # Walk back to the last newline (lines are short relative to memory; read the whole tail).
        f.seek(0)
        data = f.read()
        cut = data.rfind(b"\n") + 1  # 0 if the file holds only one partial line
        f.truncate(cut)
        f.flush()
        os.fsync(f.fileno())



def read_json(path: str | os.PathLike) -> Any:
    """A JSON file a job wrote; a garbled one is one error naming the file and the fix."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise GarbledFileError(f"{path} is garbled ({e}); delete it and relaunch the job to rewrite it") from None



def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Write ``obj`` as JSON atomically (:func:`varbench.core.jsonio.atomic_write_bytes`)."""
    atomic_write_bytes(Path(path), json.dumps(obj, indent=1, sort_keys=True, default=str).encode("utf-8"))



def append_jsonl(path: str | os.PathLike, rows: Iterable[Mapping]) -> int:
    """Append rows (one JSON object per line), flush and fsync; returns the count written."""
    path = Path(path)
    text = "".join(dumps_line(r) for r in rows)
    with writing(path):      # a read-only or full disk: one error naming the file and the fix
        path.parent.mkdir(parents=True, exist_ok=True)
        repair_tail(path)
        if not text:
            return 0
        with open(path, "a", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
    return text.count("\n")
