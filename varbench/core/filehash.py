"""File hashes: one `sha256_file` for the whole package (weights, prompt files, decision models,
records' sealed files), cached in this process and, for big files, on disk, so a multi-GB checkpoint
is hashed once per machine; `weight_hashes` names weight files without their paths."""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path


_SHA_CACHE: dict = {}
_CHUNK = 4 << 20
#: Files at least this large also use the on-disk cache (a multi-GB checkpoint is hashed once per
#: machine, not once per job); smaller ones are cheaper to hash than to look up.
DISK_CACHE_MIN_BYTES = 64 << 20



def sha_cache_path() -> Path:
    """The on-disk sha256 cache: ``$VARBENCH_SHA_CACHE``, else ``$XDG_CACHE_HOME`` (or
    ``~/.cache``) ``/varbench/sha256.json``. Entries are keyed by (real path, size, mtime_ns)."""
    env = os.environ.get("VARBENCH_SHA_CACHE")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "varbench" / "sha256.json"



def _disk_cache_get(key: str) -> str | None:
    try:
        return json.loads(sha_cache_path().read_text()).get(key)
    except (OSError, ValueError, AttributeError):
        return None



def _disk_cache_put(key: str, digest: str) -> None:
    path = sha_cache_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            data = json.loads(path.read_text())
            data = data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            data = {}
        data[key] = digest
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=0, sort_keys=True)
        os.replace(tmp, path)
    except OSError:  # a read-only home: the cache is an optimisation, never a requirement
        pass



def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 of a file's bytes, read in 4 MiB chunks; cached by (real path, size, mtime_ns)
    in this process and, for files of at least :data:`DISK_CACHE_MIN_BYTES`, on disk
    (:func:`sha_cache_path`), so a multi-GB checkpoint is hashed once. Rewriting a file changes
    its mtime (or size), so a retrained file is always hashed again."""
    st = os.stat(path)
    key = (os.path.realpath(path), st.st_size, st.st_mtime_ns)
    if key not in _SHA_CACHE:
        disk_key = f"{key[0]}|{key[1]}|{key[2]}"
        big = st.st_size >= DISK_CACHE_MIN_BYTES
        digest = _disk_cache_get(disk_key) if big else None
        if digest is None:
            digest = _hash_chunks(path, st.st_size, show=big)
            if big:
                _disk_cache_put(disk_key, digest)
        _SHA_CACHE[key] = digest
    return _SHA_CACHE[key]



def _hash_chunks(path: str | os.PathLike, size: int, show: bool) -> str:
    """sha256 of a file in 4 MiB chunks; ``show``: a byte progress bar (a first hash of an 8B
    checkpoint takes minutes; tqdm hides it when stderr is not a terminal)."""
    from tqdm.auto import tqdm

    from varbench.core.interrupt import check_stop

    h = hashlib.sha256()
    with open(path, "rb") as f, tqdm(total=size, unit="B", unit_scale=True, unit_divisor=1024, leave=False,
                                     desc=f"sha256 {Path(path).name} (once; cached)",
                                     disable=None if show else True) as bar:
        while True:
            check_stop()   # Ctrl-C stops a first hash between chunks, not after the whole file
            block = f.read(_CHUNK)
            if not block:
                break
            h.update(block)
            bar.update(len(block))
    return h.hexdigest()



def weight_hashes(named: dict[str, str | os.PathLike | None]) -> dict[str, str]:
    """``{name: sha256}`` of weight files, keyed by machine-independent names, never paths.

    ``named`` maps a name (e.g. the configured file's base name) to a file or a folder; a folder
    contributes every regular file under it, as ``<name>/<relative path>`` (hidden files and
    folders skipped: caches, ``.git``). ``None`` or a missing path contributes nothing (the loader
    reports missing weights itself)."""
    out: dict[str, str] = {}
    for name, path in named.items():
        if path is None:
            continue
        p = Path(path)
        if p.is_file():
            out[name] = sha256_file(p)
        elif p.is_dir():
            for f in sorted(p.rglob("*")):
                rel = f.relative_to(p)
                if f.is_file() and not any(part.startswith(".") for part in rel.parts):
                    out[f"{name}/{rel.as_posix()}"] = sha256_file(f)
    return dict(sorted(out.items()))



def sha256_bytes(data: bytes) -> str:
    """Hex sha256 of ``data``."""
    return hashlib.sha256(data).hexdigest()
