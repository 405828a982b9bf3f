"""Run records: one content-addressed entry folder per resolved configuration, sealed when done.

Usage::

    from varbench.harness.records import RunEntry, find_entries
    entry = RunEntry("store/nova_sweep", entry_hash)   # -> store/nova_sweep/entries/<entry_hash>/
    if entry.is_done():
        ...                                          # finished: skip (unless runtime.force)
    with entry.lock(wait_s=600):                     # LOCK (OS lock, dies with its holder): one writer
        todo = [k for k in keys if k not in entry.scored_keys("hpsv2")]   # resume
        entry.append_samples("hpsv2", rows)          # per batch; fsynced
        entry.append_traces(trace_rows)
        entry.write_record(record)                   # atomic
        entry.mark_done()                            # DONE = sha256 of every file, written last
    find_entries("store/nova_sweep")                 # finished entry folders, for
                                                     # varbench.analysis.frame.records_to_frame

Entry folder ``<root>/entries/<entry_hash>/``:

* ``record.json``: the run record, written atomically (temp file + ``os.replace``). Its keys,
  types and meaning are documented in one place, :mod:`varbench.harness.schema` (``RunRecord``;
  :func:`varbench.harness.schema.check_record` compares a record with it).
* ``samples_<evaluator>.jsonl``: one JSON object per scored image (at least ``prompt_index``,
  ``sample_index``); appended per batch with flush + fsync, so a kill loses at most the batch in
  flight. Readers drop a truncated last line; the next append first cuts it off, so the file is
  always valid JSONL again before new rows land. Later rows win over earlier ones with the same
  (prompt_index, sample_index).
* ``traces.jsonl``: one row per image (same rules), :class:`varbench.harness.schema.TraceRow`,
  written by :mod:`varbench.harness.traces`.
* ``DONE``: written last; seals every file of the entry (all regular files under the folder
  except ``DONE``, ``LOCK`` and dot-named temp files) by sha256. Format (JSON)::

      {"format": "varbench-done/2",
       "files": {"record.json": "<sha256 hex>", "samples_hpsv2.jsonl": "<sha256 hex>", ...}}

  An entry with ``DONE`` is finished and is never rewritten unless ``force=True``. Reading a
  finished entry checks the seal (:meth:`RunEntry.verify`): a changed, missing or unsealed file,
  or an empty or garbled ``DONE``, raises :class:`SealError` naming the file. A ``DONE`` written
  by older code (one line: the sha256 of ``record.json`` alone) raises :class:`LegacySealError`,
  whose message gives the fix: ``python -m varbench.cli.records reseal <entry folder>`` (checks
  record.json against the old hash, then seals every file as it is now) or a rerun with
  ``runtime.force=true``.
* ``LOCK``: present while a job writes the entry (see :meth:`RunEntry.lock`).
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import os
from pathlib import Path
from typing import Iterable, Iterator, Mapping

from varbench.core.errors import FixableError, writing
from varbench.core.jsonio import append_jsonl, atomic_write_bytes, dumps_line, json_default, read_jsonl, repair_tail
from varbench.core.locks import DEFAULT_WAIT_S
from varbench.harness.schema import SCHEMA_VERSION


class EntryFinishedError(FixableError, RuntimeError):
    """Attempt to rewrite an entry that has DONE (pass force=True to mean it)."""


class EntryLockedError(FixableError, RuntimeError):
    """Another job holds the entry's LOCK."""


class SealError(FixableError, ValueError):
    """A finished entry does not match its DONE seal (or DONE itself is empty or garbled)."""


class LegacySealError(SealError):
    """DONE was written by older code and seals record.json only (see :meth:`RunEntry.reseal`)."""


DONE_FORMAT = "varbench-done/2"
_UNSEALED = ("DONE", "LOCK")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _legacy_message(entry_dir: Path) -> str:
    return (f"{entry_dir}: DONE was written by older varbench and seals record.json only, so the other "
            f"files cannot be checked. Run `python -m varbench.cli.records reseal {entry_dir}` (checks record.json "
            f"against the old hash, then seals every file as it is now), or rerun its job with runtime.force=true")


def utc_now() -> str:
    """UTC ISO 8601 timestamp with offset, second resolution (the ``created`` field)."""
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


class RunEntry:
    """The record folder ``<root>/entries/<entry_hash>/``; see the module docstring."""

    def __init__(self, root: str | os.PathLike, entry_hash: str):
        self.root = Path(root)
        self.entry_hash = entry_hash
        self.dir = self.root / "entries" / entry_hash

    @classmethod
    def from_dir(cls, path: str | os.PathLike) -> "RunEntry":
        """The entry stored in folder ``path`` (wherever it lives, e.g. a copied results tree)."""
        path = Path(path)
        entry = cls(path.parent.parent, path.name)
        entry.dir = path
        return entry

    # paths ---------------------------------------------------------------------------------
    @property
    def record_path(self) -> Path:
        return self.dir / "record.json"

    @property
    def done_path(self) -> Path:
        return self.dir / "DONE"

    @property
    def traces_path(self) -> Path:
        return self.dir / "traces.jsonl"

    def samples_path(self, evaluator: str) -> Path:
        if not evaluator or "/" in evaluator or os.sep in evaluator:
            raise ValueError(f"evaluator name {evaluator!r} must be a plain name (it becomes a file name)")
        return self.dir / f"samples_{evaluator}.jsonl"

    # state ---------------------------------------------------------------------------------
    def is_done(self) -> bool:
        return self.done_path.is_file()

    def _check_writable(self, force: bool) -> None:
        if self.is_done():
            if not force:
                raise EntryFinishedError(f"{self.dir} is finished (DONE exists); pass force=True "
                                         "(runtime.force=true) to redo it")
            self.done_path.unlink()  # the entry is unfinished again until mark_done

    @contextlib.contextmanager
    def lock(self, wait_s: float | None = DEFAULT_WAIT_S) -> Iterator[Path]:
        """Hold the entry's ``LOCK`` (:class:`varbench.core.locks.FileLock`: an OS lock the kernel drops
        when the holder dies) for the duration of the block; one writer per entry.

        A second job on the same entry waits up to ``wait_s`` seconds (``runtime.lock_wait_s``;
        None or negative: forever; 0: not at all) for the live holder, saying whom it waits for,
        then raises :class:`EntryLockedError` naming the holder and the knob. A LOCK left by a
        killed job (SIGKILL, OOM, node loss) is taken over at once and the job resumes. On entry,
        temp files left in the entry folder by killed writes (``*.tmp``) are removed.
        """
        from varbench.core.locks import FileLock, clean_stray_tmp

        with writing(self.dir):
            self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / "LOCK"
        with FileLock(path, what=f"entry {self.dir}", wait_s=wait_s, error=EntryLockedError):
            clean_stray_tmp(self.dir, recursive=True, patterns=("*.tmp",))   # only this entry's writers, all locked out
            yield path

    # writing -------------------------------------------------------------------------------
    def write_record(self, record: Mapping, force: bool = False) -> Path:
        """Write ``record.json`` atomically; refuses on a finished entry unless ``force``."""
        self._check_writable(force)
        rec = dict(record)
        rec.setdefault("schema_version", SCHEMA_VERSION)
        rec.setdefault("entry_id", self.entry_hash)
        rec.setdefault("created", utc_now())
        text = json.dumps(rec, indent=2, sort_keys=True, ensure_ascii=False, default=json_default)
        atomic_write_bytes(self.record_path, text.encode("utf-8"))
        return self.record_path

    def append_samples(self, evaluator: str, rows: Iterable[Mapping], force: bool = False) -> int:
        self._check_writable(force)
        rows = list(rows)
        for r in rows:
            if "prompt_index" not in r or "sample_index" not in r:
                raise ValueError(f"per-sample rows need prompt_index and sample_index; got keys {sorted(r)}")
        return append_jsonl(self.samples_path(evaluator), rows)

    def append_traces(self, rows: Iterable[Mapping], force: bool = False) -> int:
        self._check_writable(force)
        return append_jsonl(self.traces_path, rows)

    def write_traces(self, rows: Iterable[Mapping], force: bool = False) -> int:
        """Replace ``traces.jsonl`` by ``rows`` in one atomic write (temp file + ``os.replace``): a
        kill or a full disk mid-copy leaves the old file or the whole new one, never a part that a
        relaunch would take for complete. Returns the row count."""
        self._check_writable(force)
        rows = list(rows)
        atomic_write_bytes(self.traces_path, "".join(dumps_line(r) for r in rows).encode("utf-8"))
        return len(rows)

    def _sealed_files(self) -> list[str]:
        """Relative (posix) paths of the files DONE seals: every regular file but DONE, any LOCK
        and dot-named (temp or marker) files."""
        out = []
        for p in self.dir.rglob("*"):
            rel = p.relative_to(self.dir)
            if p.is_file() and p.name not in _UNSEALED and not any(part.startswith(".") for part in rel.parts):
                out.append(rel.as_posix())
        return sorted(out)

    def mark_done(self) -> Path:
        """Write DONE (the sha256 of every file of the entry); the last step of a job."""
        if not self.record_path.is_file():
            raise FileNotFoundError(f"cannot mark {self.dir} done: write_record() first")
        for p in [self.traces_path, *self.dir.glob("samples_*.jsonl")]:
            repair_tail(p)  # a finished entry's JSONL files are always clean for pandas
        files = {rel: _sha256(self.dir / rel) for rel in self._sealed_files()}
        text = json.dumps({"format": DONE_FORMAT, "files": files}, indent=1, sort_keys=True) + "\n"
        atomic_write_bytes(self.done_path, text.encode())
        return self.done_path

    def seal(self) -> dict[str, str]:
        """The sealed ``{relative path: sha256}`` of a finished entry's DONE.

        Raises :class:`SealError` for an empty or garbled DONE and :class:`LegacySealError` for a
        DONE written by older code (the sha256 of record.json alone)."""
        raw = self.done_path.read_bytes()
        text = raw.decode("utf-8", errors="replace").strip()
        if not text:
            raise SealError(f"{self.done_path} is empty: the entry's seal is lost, so nothing in it can be "
                            f"trusted; rerun its job with runtime.force=true")
        if len(text) == 64 and all(c in "0123456789abcdef" for c in text):
            raise LegacySealError(_legacy_message(self.dir))
        try:
            data = json.loads(text)
            files = data["files"]
            ok = (data.get("format") == DONE_FORMAT and isinstance(files, dict) and "record.json" in files
                  and all(isinstance(v, str) and len(v) == 64 for v in files.values()))
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
            ok = False
        if not ok:
            raise SealError(f"{self.done_path} is garbled (not a {DONE_FORMAT} seal naming record.json): the "
                            f"entry cannot be checked; rerun its job with runtime.force=true")
        return dict(files)

    def verify(self, names: Iterable[str] | None = None) -> None:
        """Check a finished entry against DONE: every sealed file (or only ``names``, relative
        paths) must exist with its sealed sha256, and (when checking all) no unsealed file may have
        appeared. Raises :class:`SealError` naming the first offending file; no-op without DONE."""
        if not self.is_done():
            return
        files = self.seal()
        fix = "rerun its job with runtime.force=true"
        if names is None:
            extra = sorted(set(self._sealed_files()) - set(files))
            if extra:
                raise SealError(f"{self.dir / extra[0]} appeared after the entry was marked DONE (not in its "
                                f"seal); {fix}")
            names = files
        for rel in names:
            path = self.dir / rel
            if rel not in files:
                if path.exists():
                    raise SealError(f"{path} appeared after the entry was marked DONE (not in its seal); {fix}")
                continue  # never existed: nothing to check (e.g. no traces for this entry)
            if not path.is_file():
                raise SealError(f"{path} is missing from a finished entry (DONE seals it); {fix}")
            got = _sha256(path)
            if got != files[rel]:
                raise SealError(f"{path} changed after it was marked DONE (DONE says {files[rel][:12]}, "
                                f"file is {got[:12]}); {fix}")

    def reseal(self) -> Path:
        """Upgrade a DONE written by older code: record.json must still match the old hash; then
        every file is sealed as it is now (the other files are taken on trust, once)."""
        text = self.done_path.read_text(errors="replace").strip() if self.is_done() else ""
        if not (len(text) == 64 and all(c in "0123456789abcdef" for c in text)):
            self.seal()  # raises for empty / garbled
            return self.done_path  # already a current seal
        got = _sha256(self.record_path)
        if got != text:
            raise SealError(f"{self.record_path} changed after it was marked DONE (DONE says {text[:12]}, file "
                            f"is {got[:12]}); not resealing: rerun its job with runtime.force=true")
        return self.mark_done()

    # reading -------------------------------------------------------------------------------
    def read(self, verify: bool = True) -> dict:
        """The record dict. With ``verify`` and DONE present, every sealed file is checked
        (:meth:`verify`)."""
        if verify:
            self.verify()
        return json.loads(self.record_path.read_bytes())

    def read_samples(self, evaluator: str) -> list[dict]:
        """Per-sample rows, deduplicated by (prompt_index, sample_index), later rows winning."""
        self.verify([self.samples_path(evaluator).name])
        rows = read_jsonl(self.samples_path(evaluator))
        by_key = {(int(r["prompt_index"]), int(r["sample_index"])): r for r in rows}
        return list(by_key.values())

    def scored_keys(self, evaluator: str) -> set[tuple[int, int]]:
        """(prompt_index, sample_index) already scored by ``evaluator`` (for resume)."""
        return {(int(r["prompt_index"]), int(r["sample_index"])) for r in read_jsonl(self.samples_path(evaluator))}

    def read_traces(self) -> list[dict]:
        self.verify([self.traces_path.name])
        return read_jsonl(self.traces_path)


# ---------------------------------------------------------------------------------------------
# Finding finished entries

def find_entries(path: str | os.PathLike) -> list[Path]:
    """Finished entry folders (holding DONE and record.json) under ``path``, sorted; ``path``
    may itself be an entry folder."""
    path = Path(path)
    if (path / "DONE").is_file() and (path / "record.json").is_file():
        return [path]
    return sorted({p.parent for p in path.rglob("DONE") if (p.parent / "record.json").is_file()})


# the command moved to the cli layer; the old spelling says where
if __name__ == "__main__":
    raise SystemExit("the records command is `python -m varbench.cli.records {verify,reseal} PATH...`")
