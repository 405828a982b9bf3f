"""Image store keyed by generation hash, in GenEval's folder layout.

Usage::

    from varbench.core.hashing import generation_hash
    from varbench.harness.store import ImageStore
    gen = generation_hash(resolved_cfg, weights, prompt_set.sha256)   # GENERATION_KEYS + sha256s
    store = ImageStore("results", gen)            # -> results/images/<gen>/
    store.write_manifest(resolved_cfg)            # once: what made these images (generation.json)
    for p, s in store.missing(prompt_set.items, prompt_set.samples_per_prompt):
        store.save(p, s, pil_image, metadata=item.metadata | {"prompt": item.prompt})
    img = store.load(0, 0)

Layout (GenEval's ``evaluate_images.py`` reads ``images/<gen>/`` directly)::

    <root>/images/<generation_hash>/
        generation.json                        # the hashed config (write_manifest)
        images.jsonl                           # one row per committed image: prompt_index,
                                               #   sample_index, file, sha256 (later rows win)
        traces.jsonl                           # per-image traces (written by varbench.harness.job)
        <prompt_index:05d>/metadata.jsonl      # one line: the prompt's metadata incl. "prompt"
        <prompt_index:05d>/samples/<sample_index:04d>.png

Every file is written to a temporary name in the same folder, fsynced, and moved into place with
``os.replace``, so a killed job leaves either the whole file or none. An image counts as stored
only once its row (with the file's sha256) is in ``images.jsonl``: ``write_image()`` writes the
file, ``commit()`` appends the rows (flush + fsync) -- ``save()`` does both. A caller with more
to keep per image (the job's traces) writes that between the two, so a kill at any point leaves
no stored image without it. ``missing()`` lists what a relaunch still has to generate (no file,
or no row: images written by older code without ``images.jsonl`` are regenerated);
``corrupt()`` lists stored images whose file no longer matches its sha256, and ``load()``
refuses such a file (:class:`ImageHashError`).

The keys (the generation hash names the folder): :mod:`varbench.core.hashing`.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

from varbench.core.errors import FixableError
from varbench.core.hashing import canonical_tree
from varbench.core.jsonio import append_jsonl, atomic_write_bytes, read_jsonl
from varbench.core.locks import DEFAULT_WAIT_S, FileLock, clean_stray_tmp


class ImageHashError(FixableError, ValueError):
    """A stored image's file does not match the sha256 recorded when it was written."""


class ImageStore:
    """Images of one generation configuration under ``<root>/images/<generation_hash>/``."""

    def __init__(self, root: str | os.PathLike, generation_hash: str, image_format: str = "png"):
        self.root = Path(root)
        self.generation_hash = generation_hash
        self.dir = self.root / "images" / generation_hash
        # PNG (lossless) by default: the scorers see exactly the generated pixels.
        self.image_format = image_format.lower()

    def prompt_dir(self, prompt_index: int) -> Path:
        return self.dir / f"{int(prompt_index):05d}"

    def path(self, prompt_index: int, sample_index: int) -> Path:
        return self.prompt_dir(prompt_index) / "samples" / f"{int(sample_index):04d}.{self.image_format}"

    @property
    def index_path(self) -> Path:
        return self.dir / "images.jsonl"

    def index(self) -> dict[tuple[int, int], dict]:
        """Committed images: ``{(prompt_index, sample_index): row}`` (later rows win)."""

        try:
            st = self.index_path.stat()
        except FileNotFoundError:
            return {}
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        cached = getattr(self, "_index_cache", None)
        if cached is None or cached[0] != stamp:  # reread only when the file changed
            cached = (stamp, {(int(r["prompt_index"]), int(r["sample_index"])): r for r in read_jsonl(self.index_path)})
            self._index_cache = cached
        return cached[1]

    def has(self, prompt_index: int, sample_index: int) -> bool:
        """The image file exists and is committed (its sha256 row is in ``images.jsonl``)."""
        return (int(prompt_index), int(sample_index)) in self.index() and self.path(prompt_index, sample_index).is_file()

    @contextlib.contextmanager
    def generation_lock(self, wait_s: float | None = DEFAULT_WAIT_S, part: str | None = None) -> Iterator[FileLock]:
        """Hold ``<store>/LOCK`` while generating into this store: one generating job per
        generation hash (a sweep's method jobs all need the baseline's images for fidelity).

        A job that finds another live job generating here waits up to ``wait_s`` seconds
        (``runtime.lock_wait_s``; None or negative: forever), saying whom it waits for, then
        raises :class:`varbench.core.locks.LockTimeoutError` naming the holder and the knob. A lock
        left by a killed job is taken over at once. On entry, temp files of killed writes
        (``.*.tmp``, anywhere under the store folder) are removed. Check :meth:`missing` again
        inside the block: the job waited for may have generated everything. ``part`` (a shard's
        name, ``i-of-n``) locks only that part of the prompts (``LOCK.<part>``), so the shards of
        one job generate side by side while two jobs wanting the same shard still wait::

            with store.generation_lock(wait_s=cfg.runtime.lock_wait_s):
                if store.missing(items, spp):
                    generate(...)
        """
        name = "LOCK" if part is None else f"LOCK.{part}"
        lock = FileLock(self.dir / name, what=f"image store {self.dir} (its images are being generated)",
                        wait_s=wait_s)
        with lock:
            clean_stray_tmp(self.dir, recursive=True)
            yield lock

    def write_manifest(self, cfg: Any) -> Path:
        """Store the hashed config beside the images (idempotent; first writer wins)."""
        path = self.dir / "generation.json"
        if not path.exists():
            text = json.dumps({"generation_hash": self.generation_hash, "config": canonical_tree(cfg)},
                              indent=2, sort_keys=True, ensure_ascii=False)
            atomic_write_bytes(path, text.encode("utf-8"))
        return path

    def save(self, prompt_index: int, sample_index: int, image: Any, metadata: Mapping | None = None) -> Path:
        """Write one image (PIL) and, if absent, the prompt's ``metadata.jsonl`` line, then commit it.

        ``metadata`` should include ``"prompt"`` (GenEval reads it from there); the whole mapping
        is written as one JSON line.
        """
        path, digest = self.write_image(prompt_index, sample_index, image, metadata)
        self.commit([(prompt_index, sample_index, digest)])
        return path

    def commit(self, done: Iterable[tuple[int, int, str]]) -> None:
        """Append ``(prompt_index, sample_index, sha256)`` rows to ``images.jsonl`` in one
        fsynced write: from here on these images count as stored."""

        append_jsonl(self.index_path, [{"prompt_index": int(p), "sample_index": int(s),
                                        "file": self.path(p, s).relative_to(self.dir).as_posix(), "sha256": d}
                                       for p, s, d in done])

    def write_image(self, prompt_index: int, sample_index: int, image: Any,
                    metadata: Mapping | None = None) -> tuple[Path, str]:
        """Write the image file (and the prompt's metadata line) without committing it; returns
        ``(path, sha256 of the file's bytes)`` for :meth:`commit`."""
        import io

        meta_path = self.prompt_dir(prompt_index) / "metadata.jsonl"
        if metadata is not None and not meta_path.exists():
            line = json.dumps(dict(metadata), ensure_ascii=False) + "\n"
            atomic_write_bytes(meta_path, line.encode("utf-8"))
        buf = io.BytesIO()
        fmt = {"png": "PNG", "jpg": "JPEG", "jpeg": "JPEG", "webp": "WEBP"}.get(self.image_format)
        if fmt is None:
            raise ValueError(f"image_format {self.image_format!r} not supported; use png (lossless), jpg or webp")
        image.save(buf, format=fmt)
        path = self.path(prompt_index, sample_index)
        data = buf.getvalue()
        atomic_write_bytes(path, data)
        return path, hashlib.sha256(data).hexdigest()

    def load(self, prompt_index: int, sample_index: int, verify: bool = True):
        """The stored image as an RGB ``PIL.Image`` (fully read, file closed).

        With ``verify`` the file's bytes must match the sha256 committed in ``images.jsonl``
        (:class:`ImageHashError` otherwise, naming the file; ``FileNotFoundError`` if uncommitted)."""
        import io

        from PIL import Image

        path = self.path(prompt_index, sample_index)
        if not path.is_file():
            raise FileNotFoundError(f"no stored image for prompt {prompt_index} sample {sample_index}: {path}")
        data = path.read_bytes()
        if verify:
            row = self.index().get((int(prompt_index), int(sample_index)))
            if row is None:
                raise FileNotFoundError(f"{path} was never committed to {self.index_path} (a write cut short, or "
                                        f"written by older varbench); regenerate it (relaunch the job)")
            got = hashlib.sha256(data).hexdigest()
            if got != row["sha256"]:
                raise ImageHashError(f"{path} does not match the sha256 recorded when it was generated "
                                     f"({row['sha256'][:12]} recorded, file is {got[:12]}); relaunch the job to "
                                     f"regenerate it")
        with Image.open(io.BytesIO(data)) as im:
            return im.convert("RGB")

    def corrupt(self, items: Sequence[Any], samples_per_prompt: int) -> list[tuple[int, int]]:
        """Committed (prompt_index, sample_index) pairs whose file no longer matches its sha256."""
        index = self.index()
        out = []
        for it in items:
            p = int(getattr(it, "index", it))
            for s in range(samples_per_prompt):
                row, path = index.get((p, s)), self.path(p, s)
                if row is not None and path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() != row["sha256"]:
                    out.append((p, s))
        return out

    def read_metadata(self, prompt_index: int) -> dict:
        with open(self.prompt_dir(prompt_index) / "metadata.jsonl", encoding="utf-8") as f:
            return json.loads(f.readline())

    def missing(self, items: Sequence[Any], samples_per_prompt: int) -> list[tuple[int, int]]:
        """(prompt_index, sample_index) pairs not yet stored, in generation order.

        ``items`` are PromptItems (anything with ``.index``) or plain ints.
        """
        index = self.index()
        out = []
        for it in items:
            p = int(getattr(it, "index", it))
            for s in range(samples_per_prompt):
                if (p, s) not in index or not self.path(p, s).is_file():
                    out.append((p, s))
        return out
