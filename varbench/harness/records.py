"""Run records: one content-addressed entry per resolved configuration.

Usage::

    from varbench.harness.records import RunEntry, find_entries, records_to_frame
    entry = RunEntry("results", entry_hash)          # -> results/entries/<entry_hash>/
    if entry.is_done():
        ...                                          # finished: skip (unless runtime.force)
    with entry.lock(wait_s=600):                     # LOCK (OS lock, dies with its holder): one writer
        todo = [k for k in keys if k not in entry.scored_keys("hpsv2")]   # resume
        entry.append_samples("hpsv2", rows)          # per batch; fsynced
        entry.append_traces(trace_rows)
        entry.write_record(record)                   # atomic
        entry.mark_done()                            # DONE = sha256 of every file, written last
    df = records_to_frame(find_entries("results"))   # tidy, one row per finished record

    import pandas as pd                              # per-sample rows, for pandas users:
    pd.read_json(entry.dir / "samples_hpsv2.jsonl", lines=True)

Entry folder ``<root>/entries/<entry_hash>/``:

* ``record.json``: the schema below, written atomically (temp file + ``os.replace``).
* ``samples_<evaluator>.jsonl``: one JSON object per scored image (at least ``prompt_index``,
  ``sample_index``); appended per batch with flush + fsync, so a kill loses at most the batch in
  flight. Readers drop a truncated last line; the next append first cuts it off, so the file is
  always valid JSONL again before new rows land. Later rows win over earlier ones with the same
  (prompt_index, sample_index).
* ``traces.jsonl``: per-image traces (same rules). Row format::

      {"prompt_index": int, "sample_index": int, "method": str,
       "scales": [{"si": int, "h": int, "w": int, "ran": bool,
                   "keep_frac": [float per layer] | null,   # null: every layer ran in full
                   "entropy_mean": float | null,             # mean predictive entropy (nats)
                   "ms": float | null,
                   "plan_neutral": bool | null}, ...],      # the policy's plan changed nothing here
       "stats": {method-specific, e.g. "activation_scale", "depth_D", "layer_labels": [str]},
       "no_effect_reason": str | null}              # every plan neutral: why (varbench/engine/effect.py)

* ``DONE``: written last; seals every file of the entry (all regular files under the folder
  except ``DONE``, ``LOCK`` and dot-named temp files) by sha256. Format (JSON)::

      {"format": "varbench-done/2",
       "files": {"record.json": "<sha256 hex>", "samples_hpsv2.jsonl": "<sha256 hex>", ...}}

  An entry with ``DONE`` is finished and is never rewritten unless ``force=True``. Reading a
  finished entry checks the seal (:meth:`RunEntry.verify`): a changed, missing or unsealed file,
  or an empty or garbled ``DONE``, raises :class:`SealError` naming the file. A ``DONE`` written
  by older code (one line: the sha256 of ``record.json`` alone) raises :class:`LegacySealError`,
  whose message gives the fix: ``python -m varbench.harness.records reseal <entry folder>`` (checks
  record.json against the old hash, then seals every file as it is now) or a rerun with
  ``runtime.force=true``.
* ``LOCK``: present while a job writes the entry (see :meth:`RunEntry.lock`).

``record.json`` schema (``schema_version`` 1)::

    {
      "schema_version": 1,
      "entry_id": str,              # the entry hash (folder name)
      "generation_id": str,         # the image-store hash (images/<generation_id>/)
      "created": str,               # UTC ISO 8601, e.g. "2025-01-31T12:00:00+00:00"
      "status": "ok" | "failed" | "partial",   # optional, default "ok"
      "experiment": {"name": str, "tags": [str], "overrides": [str], "job_num": int|null},
      "config": {...},              # the resolved Hydra config
      "model": {"name": str, "preset": str,
                "resolution": [H, W],          # pixels, e.g. [1024, 1024]
                "h_div_w": float,              # aspect-ratio template, e.g. 1.0
                "dtype": str,
                "weights": {"<file name>": "<sha256>"}},
      "method": {"name": str, "label": str|null,   # label: short table name, e.g. "fastvar r=0.4"
                 "config": {...}, "stats": {...}},
      "benchmark": {"name": str, "source": str, "sha256": str, "items_sha256": str,
                    "n_prompts": int, "samples_per_prompt": int,
                    "seeds": any JSON},       # e.g. {"base": 0, "rule": "base + 1000*p + s"}
                    # (+ the other keys of PromptSet.describe())
      "evaluators": {"<name>": {version_info...}},
      "metrics": {"<evaluator>/<metric>": float},
      "uncertainty": {"<evaluator>/<metric>": float},   # standard error (or bootstrap std)
      "timing": {"device": str, "dtype": str, "warmup": int, "repeats": int,
                 "by_batch": {"<bs>": {"text_ms": {"median", "p10", "p90"},
                                       "ar_ms": {...}, "decode_ms": {...}, "total_ms": {...},
                                       "images_per_s": float, "peak_mem_bytes": int|null,
                                       "per_scale_ms": [float, ...]}}},
      "flops": {"total": float,     # per image, transformer only (its text projections + AR loop)
                "ar": float,        # the next-scale transformer loop only
                "per_scale": [float, ...],
                "end_to_end": float|null},  # + text encoder + VAE decode (varbench.harness.schema.Flops)
      "provenance": {...},          # varbench.harness.provenance.collect_provenance()
      "wall_s": float
    }

Missing optional blocks are fine; the frame shows NaN for what a record lacks.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

from varbench.core.errors import FixableError, writing
from varbench.core.jsonio import append_jsonl, atomic_write_bytes, dumps_line, json_default, read_jsonl, repair_tail
from varbench.harness.store import PAIR_KEYS, generation_key
from varbench.core.locks import DEFAULT_WAIT_S
from varbench.harness.store import pair_key as _store_pair_key

SCHEMA_VERSION = 1


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
            f"files cannot be checked. Run `python -m varbench.harness.records reseal {entry_dir}` (checks record.json "
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
# Finding records and flattening them into a tidy frame

def find_entries(path: str | os.PathLike) -> list[Path]:
    """Finished entry folders (holding DONE and record.json) under ``path``, sorted; ``path``
    may itself be an entry folder."""
    path = Path(path)
    if (path / "DONE").is_file() and (path / "record.json").is_file():
        return [path]
    return sorted({p.parent for p in path.rglob("DONE") if (p.parent / "record.json").is_file()})


def stable_hash(obj: Any, n: int = 12) -> str:
    """Short sha256 of the canonical JSON of ``obj`` (a stable id for nested facts)."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:n]


def _compact(obj: Any) -> str:
    """A short, stable string for a JSON value (long ones become ``sha:<hash>``)."""
    if obj is None:
        return ""
    text = obj if isinstance(obj, str) else json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return text if len(text) <= 48 else "sha:" + stable_hash(obj)


def method_label(method: Mapping) -> str:
    """``method.label`` if given, else ``name`` plus its scalar config knobs (``fastvar(r=0.4)``)."""
    if method.get("label"):
        return str(method["label"])
    name = str(method.get("name", "?"))
    cfg = method.get("config") or {}
    knobs = [f"{k}={v}" for k, v in sorted(cfg.items())
             if k not in ("_target_", "name", "label") and isinstance(v, (int, float, str, bool))]
    return f"{name}({','.join(knobs)})" if knobs else name


def pair_key(rec: Mapping) -> str | None:
    """The pairing key of a record (:func:`varbench.harness.store.pair_key`: the image store's generation key
    minus the method, weights' sha256 included). None when the record has no ``config``
    (hand-made or pre-config records); aggregation then warns and pairs on the coarse keys only."""
    return _store_pair_key(rec)


def pair_config(rec: Mapping) -> dict | None:
    """The settings :func:`pair_key` hashes, by dotted key (to name what differs)."""
    cfg = rec.get("config")
    if not isinstance(cfg, Mapping):
        return None
    return generation_key(cfg, keys=PAIR_KEYS)["config"]


def _pick_batch(by_batch: Mapping) -> tuple[str | None, Mapping]:
    """The timing block the tidy columns come from: batch size 1 if timed, else the smallest."""
    if not by_batch:
        return None, {}
    if "1" in by_batch:
        return "1", by_batch["1"]
    key = min(by_batch, key=lambda k: int(k))
    return key, by_batch[key]


def _median(block: Any) -> float:
    """The median of a ``{"median", "p10", "p90"}`` block (or a bare number); NaN if absent."""
    if isinstance(block, Mapping):
        v = block.get("median")
        return float(v) if v is not None else float("nan")
    return float(block) if block is not None else float("nan")


def _num(v: Any) -> float:
    try:
        return float(v) if v is not None else float("nan")
    except (TypeError, ValueError):
        return float("nan")


def _method_preset(rec: Mapping) -> str | None:
    """The Hydra choice of the method group (``nova_fast``): ``method.preset`` when the job wrote
    it, else the last ``method=...`` command-line override, else None."""
    method = rec.get("method") or {}
    if method.get("preset"):
        return str(method["preset"])
    exp = rec.get("experiment")
    for o in reversed((exp.get("overrides") or []) if isinstance(exp, Mapping) else []):
        if isinstance(o, str) and o.startswith("method="):
            return o.split("=", 1)[1]
    return None


def _timing_cfg(rec: Mapping) -> Mapping:
    cfg = (rec.get("config") or {}).get("timing") if isinstance(rec.get("config"), Mapping) else None
    return cfg if isinstance(cfg, Mapping) else {}


def _paired_columns(rec: Mapping, tb: Mapping) -> dict[str, Any]:
    """The paired speed-up columns: estimates, intervals and the reliability verdict
    (:mod:`varbench.harness.timing`), re-derived from the stored repeats with the record's own
    ``config.timing`` knobs (the defaults where it has none; :func:`varbench.harness.timing.rederive`). A
    record timed before per-repeat ratios were kept keeps its ratio of medians, with no interval,
    marked unreliable."""
    from varbench.harness import timing as T
    nan = float("nan")
    p = tb.get("paired") or {}
    n_rep = tb.get("n_repeats", (rec.get("timing") or {}).get("repeats"))
    out = {"paired_speedup": _num(p.get("ar_speedup")), "paired_speedup_ci_low": nan, "paired_speedup_ci_high": nan,
           "paired_speedup_ci_level": nan, "paired_e2e_speedup": _num(p.get("e2e_speedup")), "paired_e2e_speedup_ci_low": nan,
           "paired_e2e_speedup_ci_high": nan, "n_repeats": int(n_rep) if n_rep is not None else None,
           "reference_spread": _num(p.get("reference_spread")), "timing_order": p.get("order"),
           "paired_ci_kind": None, "speedup_reliable": None, "unreliable_reason": None}
    if not p:
        return out
    kw = T.protocol_kwargs(_timing_cfg(rec))
    block = T.rederive(p, kw["ci_level"], kw["bootstrap_resamples"], kw["bootstrap_seed"])
    if block is None:
        out["speedup_reliable"] = False
        out["unreliable_reason"] = "no per-repeat ratios (timed before the interval protocol): no interval"
        return out
    reliable, reasons = T.judge(block, kw["ci_level"], **{k: kw[k] for k in T._THRESHOLDS})
    out.update({"paired_speedup": block["ar_speedup"], "paired_speedup_ci_low": _num(block["ar_ci_low"]),
                "paired_speedup_ci_high": _num(block["ar_ci_high"]), "paired_speedup_ci_level": block["ci_level"],
                "paired_e2e_speedup": block["e2e_speedup"], "paired_e2e_speedup_ci_low": _num(block["e2e_ci_low"]),
                "paired_e2e_speedup_ci_high": _num(block["e2e_ci_high"]), "n_repeats": block["n_repeats"],
                "reference_spread": _num(block.get("reference_spread")), "paired_ci_kind": block.get("ci_kind"),
                "speedup_reliable": reliable, "unreliable_reason": "; ".join(reasons) or None})
    return out


def _own_spread(rec: Mapping, tb: Mapping) -> dict[str, Any]:
    """``ar_spread``: the row's own AR repeat times' spread (p90 - p10 over the median; per-prompt
    protocol: pooled within prompts, ``ar_repeat_spread``); ``ar_ms_reliable``: that spread within
    the record's ``timing.max_reference_spread`` (a pass whose machine speed moved makes its own ms,
    and any ratio of separately timed jobs built on them, unreliable)."""
    from varbench.harness import timing as T
    limit = T.protocol_kwargs(_timing_cfg(rec))["max_reference_spread"]
    if tb.get("ar_repeat_spread") is not None:
        spread = float(tb["ar_repeat_spread"])
        return {"ar_spread": spread, "ar_ms_reliable": spread <= limit}
    block = tb.get("ar_ms")
    if "per_prompt" in tb or not isinstance(block, Mapping) or None in (block.get("p10"), block.get("p90")) \
            or not block.get("median"):
        return {"ar_spread": float("nan"), "ar_ms_reliable": None}
    spread = (float(block["p90"]) - float(block["p10"])) / float(block["median"])
    return {"ar_spread": spread, "ar_ms_reliable": spread <= limit}


def _timed_prompts(timing: Mapping, tb: Mapping) -> dict[str, Any]:
    """How much was timed: ``n_prompts_timed`` (a record older than the per-prompt protocol timed
    one prompt), ``repeats_per_prompt``, ``timing_tries`` (passes run, re-times included)."""
    if not timing:
        return {"n_prompts_timed": None, "repeats_per_prompt": None, "timing_tries": None}
    n = tb.get("n_prompts", timing.get("n_prompts", 1))
    return {"n_prompts_timed": int(n) if n is not None else None,
            "repeats_per_prompt": int(timing["repeats"]) if timing.get("repeats") is not None else None,
            "timing_tries": len(timing.get("tries") or []) or 1}


def _device_columns(rec: Mapping, timing: Mapping) -> dict[str, Any]:
    """``device``: the timing block's label, else provenance's (``device``; an older record:
    ``torch.device_name``, just the architecture on a CPU); ``device_name``: provenance's
    ``torch.device_name``; ``device_known``: the record names the machine's CPU model (records from
    before it did cannot tell two machines of one architecture apart: paired, but flagged)."""
    prov = rec.get("provenance") or {}
    torch_name = (prov.get("torch") or {}).get("device_name")
    return {"device": timing.get("device") or prov.get("device") or torch_name, "device_name": torch_name,
            "device_known": bool(prov.get("cpu_model")) and "unknown CPU" not in str(timing.get("device") or prov.get("device"))}


def _random_weights(rec: Mapping) -> bool:
    """The model ran with random weights (``model.random_weights``; the toy's trained weights are not random)."""
    model_cfg = (rec.get("config") or {}).get("model") if isinstance(rec.get("config"), Mapping) else None
    return bool(isinstance(model_cfg, Mapping) and model_cfg.get("random_weights"))


def _skipped_metrics(evals: Mapping) -> str | None:
    """``<evaluator>/<part>: <status>`` for every part an evaluator reports as skipped or disabled
    in its version_info (e.g. fidelity's LPIPS without backbone weights); None if none."""
    out = []
    for name, info in (evals or {}).items():
        for key, val in (info.items() if isinstance(info, Mapping) else []):
            if isinstance(val, str) and val.startswith(("skipped", "disabled")):
                out.append(f"{name}/{key}: {val}")
    return "; ".join(out) or None


def _identical_images(rec: Mapping, path: str | None) -> bool | None:
    """Whether every image is bit-identical to its baseline image, from the fidelity evaluator:
    every per-sample PSNR infinite (``samples_fidelity.jsonl``), or without that file, the mean
    PSNR at the evaluator's cap with SSIM exactly 1. None without fidelity metrics."""
    metrics = rec.get("metrics") or {}
    if "fidelity/psnr" not in metrics:
        return None
    if path is not None:
        rows = read_jsonl(Path(path) / "samples_fidelity.jsonl")
        vals = [r.get("psnr") for r in rows if r.get("psnr") is not None]
        if vals:
            return all(math.isinf(v) and v > 0 for v in vals)
    cap = ((rec.get("evaluators") or {}).get("fidelity") or {}).get("psnr_cap_db_in_mean")
    psnr, ssim = metrics.get("fidelity/psnr"), metrics.get("fidelity/ssim")
    return bool(cap is not None and psnr is not None and psnr >= cap and ssim == 1.0)


def _git(rec: Mapping) -> Mapping:
    git = (rec.get("provenance") or {}).get("git") if isinstance(rec.get("provenance"), Mapping) else None
    return git if isinstance(git, Mapping) else {}


def code_version(rec_or_row: Mapping) -> str:
    """``<12-digit sha>`` of the commit that wrote a record (or a frame row), ``+dirty`` when its
    checkout had uncommitted changes; ``unknown commit`` outside a git checkout."""
    if "git_sha" in rec_or_row:
        sha, dirty = rec_or_row.get("git_sha"), rec_or_row.get("git_dirty")
    else:
        sha, dirty = _git(rec_or_row).get("sha"), _git(rec_or_row).get("dirty")
    if not isinstance(sha, str) or not sha:
        return "unknown commit"
    return sha[:12] + ("+dirty" if str(dirty).lower() == "true" else "")   # numpy/pandas booleans too


def record_to_row(rec: Mapping, path: str | None = None) -> dict[str, Any]:
    """Flatten one record into the tidy frame's columns (see :func:`records_to_frame`)."""
    nan = float("nan")
    model = rec.get("model") or {}
    method = rec.get("method") or {}
    bench = rec.get("benchmark") or {}
    timing = rec.get("timing") or {}
    flops = rec.get("flops") or {}
    exp = rec.get("experiment")
    res = model.get("resolution")
    evals = rec.get("evaluators") or {}
    bs, tb = _pick_batch(timing.get("by_batch") or {})
    n_prompts, spp = bench.get("n_prompts"), bench.get("samples_per_prompt")
    peak = tb.get("peak_mem_bytes")
    selection = bench.get("selection")
    row: dict[str, Any] = {
        "experiment": exp.get("name") if isinstance(exp, Mapping) else exp,
        "entry_id": rec.get("entry_id"),
        "generation_id": rec.get("generation_id"),
        "created": rec.get("created"),
        "status": rec.get("status", "ok"),
        "model": model.get("name"),
        "preset": model.get("preset"),
        "method": method.get("name"),
        "method_preset": _method_preset(rec) or method.get("name"),
        "method_label": method_label(method),
        "resolution": f"{res[0]}x{res[1]}" if isinstance(res, (list, tuple)) and len(res) == 2 else (res or None),
        "h_div_w": model.get("h_div_w"),
        "benchmark": bench.get("name"),
        "benchmark_sha256": bench.get("sha256"),
        "prompts_sha256": bench.get("items_sha256"),
        # False: the prompt file's sha256 differs from the official one (None: no official hash pinned)
        "benchmark_sha256_matches": bench.get("sha256_matches"),
        "random_weights": _random_weights(rec),
        "n_prompts": int(n_prompts) if n_prompts is not None else None,
        "samples_per_prompt": int(spp) if spp is not None else None,
        "n_images": int(n_prompts) * int(spp) if n_prompts is not None and spp is not None else None,
        # the prompt selection (limit, limit_per_tag), so sections never merge different subsets
        "prompt_selection": _compact({k: v for k, v in selection.items() if v is not None})
        if isinstance(selection, Mapping) else _compact(selection),
        "seeds": _compact(bench.get("seeds")),
        # the machine (CPU model; GPU, driver, torch, CUDA, cuDNN), and whether the record names it
        **_device_columns(rec, timing),
        "pair_key": pair_key(rec),
        "dtype": timing.get("dtype") or model.get("dtype"),
        "evaluator_versions": stable_hash(evals),
        "timing_bs": int(bs) if bs is not None else None,
        "text_ms": _median(tb.get("text_ms")),
        "ar_ms": _median(tb.get("ar_ms")),
        # per-prompt AR latency over the timed prompts (older records: over repeats of one prompt)
        "ar_ms_p10": _num((tb.get("ar_ms") or {}).get("p10")) if isinstance(tb.get("ar_ms"), Mapping) else nan,
        "ar_ms_p90": _num((tb.get("ar_ms") or {}).get("p90")) if isinstance(tb.get("ar_ms"), Mapping) else nan,
        **_timed_prompts(timing, tb),
        "decode_ms": _median(tb.get("decode_ms")),
        "total_ms": _median(tb.get("total_ms")),
        "images_per_s": float(tb["images_per_s"]) if tb.get("images_per_s") is not None else nan,
        # in-process ratios against the baseline timed interleaved in the same job (timing.paired_baseline)
        **_paired_columns(rec, tb),
        **_own_spread(rec, tb),
        "peak_mem_gb": peak / 2**30 if peak is not None else nan,  # GiB
        "flops_total": float(flops["total"]) if flops.get("total") is not None else nan,
        "flops_ar": float(flops["ar"]) if flops.get("ar") is not None else nan,
        "flops_e2e": float(flops["end_to_end"]) if flops.get("end_to_end") is not None else nan,
        "identical_images": _identical_images(rec, path),
        # the method changed nothing (varbench/engine/effect.py): "none" rows are marked in table.md
        "method_effect": method.get("effect"),
        "method_effect_reason": method.get("effect_reason"),
        "unchanged_images": method.get("unchanged_images"),
        "skipped_metrics": _skipped_metrics(evals),
        "wall_s": rec.get("wall_s"),
        # the code that wrote the record (provenance.git): tables name the commits when they differ
        "git_sha": _git(rec).get("sha"),
        "git_dirty": _git(rec).get("dirty"),
        "path": path,
    }
    for name, info in evals.items():
        row[f"version/{name}"] = stable_hash(info)
    unc = rec.get("uncertainty") or {}
    for key, val in (rec.get("metrics") or {}).items():
        row[key] = float(val) if val is not None else nan
        e = unc.get(key)
        row[f"{key}_err"] = float(e) if e is not None else nan
    return row


def records_to_frame(paths: Iterable[str | os.PathLike]):
    """Tidy ``pandas.DataFrame``: one row per finished record.

    ``paths``: entry folders or ``record.json`` files (see :func:`find_entries`). Columns:
    experiment, entry_id, generation_id, created, status, model, preset (the model's), method (the
    policy name, e.g. ``nova``), method_preset (the config chosen, e.g. ``nova_fast``; tables show
    it), method_label, resolution ("HxW"), h_div_w, benchmark, benchmark_sha256, prompts_sha256,
    n_prompts, samples_per_prompt, n_images, prompt_selection (limit / limit_per_tag), seeds,
    benchmark_sha256_matches (False: not the official prompt file), random_weights, device (the
    timing block's device label, else provenance's; :func:`varbench.harness.provenance.device_label`),
    device_name (provenance's ``torch.device_name``, for every record), device_known (the record
    names its CPU model), pair_key (:func:`pair_key`), dtype,
    evaluator_versions (short hash of all evaluators' version_info), one ``version/<evaluator>``
    per evaluator, timing_bs (the batch size the timing columns come from: 1 if measured, else
    the smallest), text_ms, ar_ms, decode_ms, total_ms (medians over the timed prompts of each
    prompt's median repeat; older records: over repeats of one prompt), ar_ms_p10/ar_ms_p90 (over
    the timed prompts), n_prompts_timed, repeats_per_prompt, timing_tries (passes run,
    ``timing.retime_unreliable``), images_per_s; the paired speed-up against the baseline timed
    interleaved in the same job (:mod:`varbench.harness.timing`): paired_speedup (AR loop) and
    paired_e2e_speedup (ratio of summed per-prompt times; one prompt: median per-repeat ratio),
    paired_speedup_ci_low/high and paired_e2e_speedup_ci_low/high (bootstrap over prompts, or the
    order-statistic interval for one prompt: paired_ci_kind; ``<column>_ci_low`` names the column
    bounded), paired_speedup_ci_level (the coverage attained or nominal), n_repeats,
    reference_spread (the baseline's own p90-p10 over median), ar_spread and ar_ms_reliable (the
    row's own AR repeats' p90-p10 over median, within ``timing.max_reference_spread``), timing_order, speedup_reliable
    (bool; None without a paired block), unreliable_reason; peak_mem_gb (GiB), flops_total
    (transformer only), flops_ar, flops_e2e (transformer + text encoder + VAE decode), identical_images
    (every image bit-identical to the baseline's, from fidelity; None without it), method_effect /
    method_effect_reason / unchanged_images (did the method change anything: "none" | "partial" |
    "some", why not, how many images it left unchanged; record ``method.effect``), skipped_metrics
    (evaluator parts skipped, e.g. LPIPS without weights), wall_s, git_sha and git_dirty
    (``provenance.git`` of the code that wrote the record), path, and per metric ``<evaluator>/<metric>`` and ``<evaluator>/<metric>_err`` (the
    evaluator's standard error of the mean; fidelity's PSNR mean caps identical pairs, see
    ``identical_images``).
    """

    import pandas as pd

    rows, legacy = [], []
    for p in paths:
        p = Path(p)
        entry_dir = p.parent if p.name == "record.json" else p
        entry = RunEntry.from_dir(entry_dir)
        if not entry.is_done():
            continue
        try:
            rows.append(record_to_row(entry.read(), str(entry_dir)))
        except LegacySealError:
            legacy.append(entry_dir)
    if legacy:  # one message for all of them, with the command that fixes them
        dirs = " ".join(str(d) for d in legacy)
        raise LegacySealError(f"{len(legacy)} entr{'y' if len(legacy) == 1 else 'ies'} sealed by older varbench "
                              f"(DONE holds record.json's hash only, so the other files cannot be checked): "
                              f"{dirs}. Run `python -m varbench.harness.records reseal {dirs}` (checks record.json "
                              f"against the old hash, then seals every file as it is now), or rerun those jobs "
                              f"with runtime.force=true")
    return pd.DataFrame(rows)


def metric_columns(frame) -> list[str]:
    """The ``<evaluator>/<metric>`` value columns of a frame (not ``_err``/``_delta``/``version/``)."""
    return [c for c in frame.columns
            if "/" in c and not c.startswith("version/") and not c.endswith(("_err", "_delta"))]


def main(argv: Iterable[str] | None = None) -> int:
    """``python -m varbench.harness.records {verify,reseal} PATH...``: check finished entries against
    DONE, or upgrade DONE files written by older code (see :meth:`RunEntry.reseal`)."""
    import argparse
    import sys

    ap = argparse.ArgumentParser(prog="python -m varbench.harness.records", description=main.__doc__.split("\n\n")[0])
    ap.add_argument("command", choices=["verify", "reseal"])
    ap.add_argument("paths", nargs="+", help="entry folders, or folders to search for them")
    args = ap.parse_args(None if argv is None else list(argv))
    bad = 0
    for d in [e for p in args.paths for e in find_entries(p)]:
        entry = RunEntry.from_dir(d)
        try:
            entry.reseal() if args.command == "reseal" else entry.verify()
            print(f"ok: {d}")
        except SealError as e:
            bad += 1
            print(f"error: {e}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
