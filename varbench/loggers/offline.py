"""W&B offline run folders that travel: read a run's ``.wandb`` file, list the files it names, and
point those names at the folder's new place after it was copied off the node.

Usage (on the machine the folders were copied to, before ``wandb sync``)::

    python -m varbench.publish --relocate results/wandb/offline-run-*      # or the wandb/ folder itself

    from varbench.loggers.offline import relocate, check, records
    report = relocate(run_dir)           # rewrites the artifact paths that moved; idempotent
    assert not check(run_dir)            # every named file present, inside the folder, with its digest

Why this is needed: a run's ``.wandb`` file (a LevelDB-style log of ``wandb.proto`` records) names
the staged copy of every artifact file (the per-image table's images, each table's JSON,
record.json) by *absolute* path, and ``wandb sync`` uploads from that path as written. varbench
stages those copies inside the run folder (:func:`varbench.loggers.wandb.stage_inside`), so a copied
folder holds them, but under a new absolute path: :func:`relocate` rewrites each path that points
into the run's ``wandb-data/`` folder so it points into the folder where the run now is. Everything
else a run names (``files/...``: metrics, media, console) is relative to the run folder already.

The file format (``wandb-core`` writes it): a 7-byte header (``:W&B``, magic, version), then 32 KiB
blocks of chunks ``crc32 (4, little-endian), length (2), type (1), data``; type 1 holds a whole
record, 2/3/4 its first/middle/last part; a block's last < 7 bytes are zeros; the CRC is zlib's
crc32 of the data seeded with the crc32 of the type byte. :func:`read_log` checks every CRC (a
damaged copy is a :class:`varbench.core.errors.GarbledFileError` naming the file) and
:func:`write_log` frames records the same way, so a file whose records are unchanged is rewritten
byte for byte (the tests check it).
"""
from __future__ import annotations

import gzip
import json
import struct
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

BLOCK = 32768
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4
MAGIC = b":W&B"
#: a run file without an exit record changed less than this many seconds ago may still be written
#: to by its run: :func:`relocate` refuses it (a crashed run's file, older, is relocated as it is)
LIVE_S = 60.0


def _data_dir() -> str:
    from varbench.loggers.wandb import DATA_DIR

    return DATA_DIR


def _crc(kind: int, data: bytes) -> int:
    return zlib.crc32(data, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF


def _garbled(msg: str):
    from varbench.core.errors import GarbledFileError

    return GarbledFileError(msg)


@dataclass
class Log:
    """A ``.wandb`` file split up: its header, each record's serialized bytes, and ``tail``, the
    bytes after the last whole record (a record still being written when the file was copied;
    empty for a finished run). :func:`write_log` leaves the tail out: no reader can use half a record."""
    header: bytes
    payloads: list[bytes] = field(default_factory=list)
    tail: bytes = b""


def read_log(path: str | Path) -> Log:
    """The records of the ``.wandb`` file ``path`` (every chunk's CRC checked)."""
    path = Path(path)
    data = path.read_bytes()
    if len(data) < HEADER or data[:4] != MAGIC:
        raise _garbled(f"{path} is not a W&B run file (no ':W&B' header): copy the run folder again")
    log = Log(header=data[:HEADER])
    i, buf, end = HEADER, b"", HEADER
    while i + HEADER <= len(data):
        left = BLOCK - i % BLOCK
        if left < HEADER:                                   # block trailer
            i += left
            continue
        crc, length, kind = struct.unpack("<IHB", data[i:i + HEADER])
        if kind == 0 and length == 0:                       # zero padding to the block's end
            i += left
            continue
        if i + HEADER + length > len(data):                 # cut off while being written
            break
        chunk = data[i + HEADER:i + HEADER + length]
        if kind not in (FULL, FIRST, MIDDLE, LAST) or _crc(kind, chunk) != crc:
            raise _garbled(f"{path} is damaged at byte {i} (chunk checksum mismatch): copy the run folder again")
        buf = chunk if kind in (FULL, FIRST) else buf + chunk
        i += HEADER + length
        if kind in (FULL, LAST):
            log.payloads.append(buf)
            buf, end = b"", i
    log.tail = data[end:]
    return log


def write_log(log: Log) -> bytes:
    """The bytes of a ``.wandb`` file holding ``log`` (the inverse of :func:`read_log`)."""
    out = bytearray(log.header)
    for payload in log.payloads:
        first = True
        while True:
            left = BLOCK - len(out) % BLOCK
            if left < HEADER:
                out += b"\0" * left
                continue
            frag, payload = payload[:left - HEADER], payload[left - HEADER:]
            kind = (FULL if not payload else FIRST) if first else (LAST if not payload else MIDDLE)
            out += struct.pack("<IHB", _crc(kind, frag), len(frag), kind) + frag
            first = False
            if not payload:
                break
    return bytes(out)


def run_file(run_dir: str | Path) -> Path:
    """The run's ``run-<id>.wandb`` file; a :class:`varbench.core.errors.ConfigError` naming the
    folder when it holds none (or several)."""
    from varbench.core.errors import ConfigError

    found = sorted(Path(run_dir).glob("run-*.wandb"))
    if len(found) != 1:
        raise ConfigError(f"{run_dir} is not one W&B run folder ({len(found)} run-*.wandb files): pass the "
                          "offline-run-<time>-<id> folders themselves, or the wandb/ folder that holds them")
    return found[0]


def records(run_dir: str | Path) -> Iterator:
    """Every ``wandb.proto`` record (``wandb_internal_pb2.Record``) of the run in ``run_dir``."""
    from wandb.proto import wandb_internal_pb2 as pb

    for payload in read_log(run_file(run_dir)).payloads:
        rec = pb.Record()
        rec.ParseFromString(payload)
        yield rec


@dataclass(frozen=True)
class FileRef:
    """One file a run names: an artifact entry's staged copy (``artifact``, ``name`` its path in
    the artifact, ``digest`` and ``algorithm`` as W&B recorded them) or a large artifact's manifest
    file (``name`` None)."""
    artifact: str
    name: str | None
    local_path: str
    digest: str | None = None
    algorithm: str = "MD5"


def _manifest_lines(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def references(run_dir: str | Path) -> list[FileRef]:
    """Every local file the run's records name: artifact entries (and the entries of manifests W&B
    wrote to a file, for artifacts of more than 100,000 files)."""
    out = []
    for rec in records(run_dir):
        if rec.WhichOneof("record_type") != "artifact":
            continue
        art, manifest = rec.artifact, rec.artifact.manifest
        for c in manifest.contents:
            if c.local_path:
                alg = next((json.loads(e.value_json) for e in c.extra if e.key == "alg"), "MD5")
                out.append(FileRef(art.name, c.path, c.local_path, c.digest, str(alg)))
        if manifest.manifest_file_path:
            out.append(FileRef(art.name, None, manifest.manifest_file_path))
            mpath = Path(manifest.manifest_file_path)
            if mpath.is_file():
                for e in _manifest_lines(mpath):
                    if e.get("local_path"):
                        out.append(FileRef(art.name, e.get("path"), e["local_path"], e.get("digest"),
                                           str((e.get("extra") or {}).get("alg", "MD5"))))
    return out


def moved_path(path: str, run_dir: Path) -> str:
    """``path`` pointed into ``run_dir`` when it lies in a run's ``wandb-data/`` folder
    (:data:`varbench.loggers.wandb.DATA_DIR`, wherever that run folder was); otherwise unchanged."""
    parts = Path(path).parts
    data = _data_dir()
    if data not in parts:
        return path
    k = len(parts) - 1 - parts[::-1].index(data)
    return str(Path(run_dir).resolve().joinpath(*parts[k:]))


@dataclass
class Relocation:
    run_dir: Path
    rewritten: int = 0          # paths changed in the .wandb file (and manifest files)
    files: int = 0              # files the run names
    problems: list[str] = field(default_factory=list)


def relocate(run_dir: str | Path) -> Relocation:
    """Point every artifact path of the run in ``run_dir`` that lies in a run's ``wandb-data/``
    folder at this folder, rewriting the ``.wandb`` file atomically (and any manifest file), then
    :func:`check` it. A second call changes nothing.

    Everything is read and checked before anything is written: the ``.wandb`` file to its end (a
    copy cut anywhere, before or after an earlier relocation, is a GarbledFileError naming it, and
    the file is left as it was), every manifest file, and every new path (one that would point out
    of ``run_dir``, e.g. a recorded ``wandb-data/../../..``, is a ConfigError: nothing outside the run
    folder is ever written). A run that may still be running (no exit record, file changed in the
    last :data:`LIVE_S` seconds) is a ConfigError, left untouched."""
    from varbench.core.jsonio import atomic_write_bytes
    from wandb.proto import wandb_internal_pb2 as pb

    run_dir = Path(run_dir)
    path = run_file(run_dir)
    log = read_log(path)
    if log.tail.strip(b"\0"):         # a record that never ended: a cut copy (or a run killed mid-write)
        raise _garbled(f"{path} is cut: its {len(log.tail)} byte(s) from byte {path.stat().st_size - len(log.tail)} "
                       "on are unreadable bytes after its last whole record (a partial copy; rewriting would drop "
                       "them); it was left as it was: copy the run folder again")
    report = Relocation(run_dir)
    ended, artifacts = False, []
    for n, payload in enumerate(log.payloads):
        rec = pb.Record()
        rec.ParseFromString(payload)
        kind = rec.WhichOneof("record_type")
        ended |= kind == "exit"
        if kind == "artifact":
            artifacts.append((n, rec))
    manifest_files, new_paths = [], []
    for n, rec in artifacts:
        manifest, hit = rec.artifact.manifest, 0
        for c in manifest.contents:
            if c.local_path and moved_path(c.local_path, run_dir) != c.local_path:
                c.local_path = moved_path(c.local_path, run_dir)
                new_paths.append((f"{rec.artifact.name}:{c.path}", c.local_path))
                hit += 1
        if manifest.manifest_file_path:
            new = moved_path(manifest.manifest_file_path, run_dir)
            if new != manifest.manifest_file_path:
                manifest.manifest_file_path = new
                new_paths.append((f"{rec.artifact.name}:manifest", new))
                hit += 1
            if Path(new).is_file():
                manifest_files.append(Path(new))
        if hit:
            log.payloads[n] = rec.SerializeToString()
            report.rewritten += hit
    in_log = report.rewritten                        # paths changed in the .wandb file itself
    age = time.time() - path.stat().st_mtime
    if in_log and not ended and age < LIVE_S:
        from varbench.core.errors import ConfigError

        raise ConfigError(f"{path} has no exit record and changed {age:.0f} s ago: its run may still be writing it "
                          "(rewriting it now would lose what comes next); relocate a run after it ends")
    manifests = {mf: _relocated_manifest(mf, run_dir) for mf in manifest_files}    # read (and checked) before any write
    for mf, (lines, hit) in manifests.items():
        new_paths += [(f"{mf.name}:{e.get('path')}", e["local_path"]) for e in lines if hit and e.get("local_path")]
    _refuse_escapes(path, run_dir, new_paths + [("manifest file", str(mf)) for mf, (_, hit) in manifests.items() if hit])
    for mf, (lines, hit) in manifests.items():   # first, so the .wandb file, rewritten last, names only relocated files
        if hit:
            body = "".join(json.dumps(e) + "\n" for e in lines).encode()
            atomic_write_bytes(mf, gzip.compress(body, compresslevel=1))
            report.rewritten += hit
    if in_log:
        atomic_write_bytes(path, write_log(log))
    report.problems = check(run_dir)
    report.files = len(references(run_dir))
    return report


def _refuse_escapes(path: Path, run_dir: Path, named: list[tuple[str, str]]) -> None:
    """A ConfigError, before anything is written, when a path relocation would write or point at lies
    outside ``run_dir`` once resolved (``..`` parts, a symlink out of the folder)."""
    from varbench.core.errors import ConfigError

    root = run_dir.resolve()
    out = [(what, p) for what, p in named if not Path(p).resolve().is_relative_to(root)]
    if out:
        what, p = out[0]
        raise ConfigError(f"{path}: {len(out)} recorded path(s) would point outside {root} after relocation "
                          f"(first: {what} -> {p}); nothing was rewritten. A run file naming paths outside its "
                          "folder was not written by varbench's sink: publish the record again with "
                          "`python -m varbench.publish --force`")


def _relocated_manifest(path: Path, run_dir: Path) -> tuple[list[dict], int]:
    """The lines of the manifest file ``path`` with their paths relocated (nothing written), and how
    many changed."""
    try:
        lines = _manifest_lines(path)
    except (OSError, EOFError, ValueError) as e:      # gzip.BadGzipFile is an OSError; a cut gzip an EOFError
        raise _garbled(f"{path} (an artifact manifest) cannot be read to its end ({e}); it was left as it was: "
                       "copy the run folder again") from None
    hit = 0
    for e in lines:
        if e.get("local_path") and moved_path(e["local_path"], run_dir) != e["local_path"]:
            e["local_path"] = moved_path(e["local_path"], run_dir)
            hit += 1
    return lines, hit


def _digest(path: Path, algorithm: str) -> str:
    from wandb.sdk.lib import hashutil

    return hashutil.xxh128_file_b64(path) if algorithm == "XXH128" else hashutil.md5_file_b64(path)


def check(run_dir: str | Path) -> list[str]:
    """What stops the run in ``run_dir`` from syncing as it is: each file it names that is missing,
    lies outside the run folder, or no longer has the digest W&B recorded. Empty: it travels."""
    run_dir = Path(run_dir).resolve()
    problems = []
    for ref in references(run_dir):
        where = f"{ref.artifact}:{ref.name or 'manifest'}"
        p = Path(ref.local_path)
        if not p.is_file():
            hint = ("it was staged outside the run folder (a run logged before varbench kept them inside, or "
                    "by another tool): copy that file too, or publish the record again with "
                    "`python -m varbench.publish --force`") if _data_dir() not in p.parts else \
                   "run `python -m varbench.publish --relocate` on this folder"
            problems.append(f"{where}: {p} is missing ({hint})")
        elif not p.resolve().is_relative_to(run_dir):
            problems.append(f"{where}: {p} lies outside {run_dir} (it will not travel with the folder)")
        elif ref.digest and _digest(p, ref.algorithm) != ref.digest:
            problems.append(f"{where}: {p} does not match its recorded {ref.algorithm} digest (changed after logging)")
    return problems


def run_dirs(paths: Iterable[str | Path]) -> list[Path]:
    """The run folders ``paths`` name: run folders themselves, or folders holding ``offline-run-*``
    / ``run-*`` folders (a ``wandb/`` folder, or its parent)."""
    out = []
    for p in map(Path, paths):
        if any(p.glob("run-*.wandb")):
            out.append(p)
            continue
        found = sorted(d for pat in ("*run-*", "wandb/*run-*") for d in p.glob(pat) if any(d.glob("run-*.wandb")))
        if not found:
            from varbench.core.errors import ConfigError

            raise ConfigError(f"no W&B run folder (one holding run-*.wandb) at or under {p}: pass the copied "
                              "offline-run-<time>-<id> folders, or the wandb/ folder that holds them")
        out.extend(found)
    return out
