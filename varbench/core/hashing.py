"""Config hashing: canonical JSON and the keys built on it (the image store's generation key, the
run record's entry key, the pairing key), depending on nothing but the config, the files' sha256
and the seed rule, so every layer can name a result by the same key.

:func:`config_hash` is the first 16 hex digits of the sha256 of the canonical JSON (sorted keys,
no whitespace, UTF-8, NaN refused) of a config *minus* the dotted key paths in ``exclude``. The
keys built on it:

* :func:`generation_hash` (the image store's key) hashes an explicit list, ``GENERATION_KEYS``:
  only what changes pixels (the model's preset/VAE/text encoder/random-init seed/schedule, every
  ``generation.*`` setting, ``method.name`` and ``method.knobs``, the prompt set's loader/seed/
  size/rewriter, ``runtime.device`` as a device *type* and ``runtime.dtype``, both resolved
  (``auto`` must be resolved by the caller: :func:`varbench.harness.job.prepare_job` pins them),
  ``runtime.fused_entropy``, ``runtime.batch_size``: batched matmuls round differently with other
  batch companions, see :mod:`varbench.harness.sharding`), and the systems knobs ``runtime.compile``,
  ``runtime.compile_fullgraph``, ``runtime.quant``, ``runtime.attn_backend``, ``runtime.adaptive_batch`` when not at their
  defaults (:data:`NEUTRAL_DEFAULTS`: at them every key is what it was before they existed), plus the sha256 of every weight file
  (``weights``, from :func:`varbench.core.filehash.weight_hashes`; never their paths), of the prompt
  file(s) (``benchmark_sha256``) and of the files the method loads (``method_files``: SkipVAR's
  decision models; absent for methods without files, so their hashes are unchanged). A key not in
  the list (labels, evaluators, timing, progress bars, ``runtime.cuda_graphs``: graphed bits equal
  eager; limits: prompt indices are stable across subsets and each image is generated with the
  batch companions it has in the full set) never regenerates images.
* :func:`entry_hash` (the run record's key) hashes the config minus ``ENTRY_EXCLUDE`` (where files
  go, mirroring, and switches that change no number of the record), with weight/prompt-file paths
  replaced by the same sha256 values.
* :func:`pair_key` (aggregation): the generation key minus the method, read back from a record
  (``config`` + ``model.weights`` + ``benchmark.sha256``).
* :func:`stable_hash`: a short id for nested facts (evaluator version info), not a config key.

Tests pin the values (tests/core/test_hash_keys.py): a change here renames every stored result.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
from typing import Any, Iterable, Mapping, Sequence

from varbench.core.seeds import SEED_RULE_VERSION


#: Paths whose *values* are replaced by the sha256 of the files they name (``weights``,
#: ``benchmark_sha256``): a path differs between machines, the bytes do not.
PATH_KEYS: tuple[str, ...] = ("model.weights", "model.vae", "model.text_encoder_path", "benchmark.path",
                              "benchmark.rewrite")   # the rewrite file: its sha256 joins benchmark_sha256 (key_sha256)

#: Left out of the entry hash: where files go, result mirroring, and switches that change no number
#: of the record (every name here exists in varbench/conf/).
ENTRY_EXCLUDE: tuple[str, ...] = (
    "paths", "logger", "hydra", "aggregate", "shard",
    "runtime.force", "runtime.progress", "runtime.save_images", "runtime.lock_wait_s",
    "method.refuse",   # where a preset does not apply (a config check): adding one renames no record
    "method.per_model", "method.per_model_applied",   # per-model knob values: the merged knobs are hashed, not
                                                      # where they came from (varbench/harness/per_model.py)
) + PATH_KEYS

#: Everything that changes a generated pixel (dotted paths into the resolved config; a path names
#: its whole subtree). Anything else is left out of the image store's key.
GENERATION_KEYS: tuple[str, ...] = (
    "model.preset", "model.vae_preset", "model.text_encoder", "model.random_weights", "model.seed",
    "model.schedule",
    "generation.h_div_w", "generation.pn", "generation.cfg", "generation.tau", "generation.top_k",
    "generation.top_p", "generation.negative_prompt", "generation.seed",
    "generation.more_smooth",   # HART's configs only (absent keys are left out: other hashes are unchanged)
    "method.name", "method.knobs",
    "benchmark.loader", "benchmark.seed", "benchmark.n_prompts", "benchmark.rewriter",
    "runtime.device", "runtime.dtype", "runtime.fused_entropy",
    "runtime.batch_size",   # an image's bits depend on its batch companions (varbench/harness/sharding.py)
    # per-image plans padded into one step or split (varbench/engine/padded_batch.py): batch rounding
    # differs; hashed only when not at its default (pad). Entries made before padding existed were split:
    # they keep their key (each image's decisions are its own either way; bits differ by batch rounding)
    "runtime.adaptive_batch",
    # the systems knobs (varbench/conf/runtime/default.yaml): compiled kernels, quantised weights and
    # another attention kernel round differently; hashed only when not at their default (below)
    "runtime.compile", "runtime.compile_fullgraph", "runtime.quant", "runtime.attn_backend",
)

#: Runtime knobs added after keys were first stored: at these values they are left out of every key
#: (generation, entry, pair), so a config that sets them to their default names the same images and
#: record as one written before they existed; any other value is hashed (it changes pixels).
NEUTRAL_DEFAULTS: dict[str, Any] = {"runtime.compile": "off", "runtime.compile_fullgraph": False,
                                    "runtime.quant": "none", "runtime.attn_backend": "auto",
                                    "runtime.adaptive_batch": "pad"}

#: The pairing key: the generation key without the method.
PAIR_KEYS: tuple[str, ...] = tuple(k for k in GENERATION_KEYS if not k.startswith("method."))

_DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}


def _to_plain(cfg: Any) -> Any:
    """OmegaConf nodes -> plain containers (resolved); anything else is returned as is."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf
    except ImportError:  # pragma: no cover - omegaconf is a dependency
        return cfg
    if isinstance(cfg, (DictConfig, ListConfig)):
        return OmegaConf.to_container(cfg, resolve=True)
    return cfg


def _canon(obj: Any, where: str = "") -> Any:
    if isinstance(obj, Mapping):
        return {str(k): _canon(v, f"{where}.{k}" if where else str(k)) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_canon(v, f"{where}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if isinstance(obj, float) and not math.isfinite(obj):
        raise ValueError(f"config value at {where!r} is {obj}; not hashable as canonical JSON")
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    raise TypeError(f"config value at {where!r} has type {type(obj).__name__}; only JSON types can be hashed")


def canonical_tree(cfg: Any) -> Any:
    """``cfg`` as plain JSON types, as every key here reads it: OmegaConf nodes resolved, paths as
    strings; a NaN or a non-JSON value raises, naming where it is."""
    return _canon(_to_plain(cfg))


def _drop(tree: dict, dotted: str) -> None:
    parts = dotted.split(".")
    node: Any = tree
    for p in parts[:-1]:
        if not isinstance(node, dict) or p not in node:
            return
        node = node[p]
    if isinstance(node, dict):
        node.pop(parts[-1], None)


def canonical_json(cfg: Any, exclude: Iterable[str] = ()) -> str:
    """The exact text that :func:`config_hash` hashes (useful to diff two configs)."""
    tree = _canon(_to_plain(cfg))
    if not isinstance(tree, dict):
        raise TypeError("config_hash expects a mapping at the top level")
    for key in exclude:
        _drop(tree, key)
    return json.dumps(tree, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def config_hash(cfg: Any, exclude: Iterable[str] = ()) -> str:
    """First 16 hex digits of sha256(canonical JSON of ``cfg`` minus dotted ``exclude`` paths)."""
    return hashlib.sha256(canonical_json(cfg, exclude).encode("utf-8")).hexdigest()[:16]


def _select(tree: Mapping, dotted: str) -> tuple[bool, Any]:
    node: Any = tree
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _normalise(key: str, value: Any) -> Any:
    if key == "runtime.device" and isinstance(value, str):
        return value.split(":", 1)[0]            # cuda:1 and cuda make the same pixels
    if key == "runtime.dtype" and isinstance(value, str):
        return _DTYPE_ALIASES.get(value, value)
    return value


def generation_key(cfg: Any, weights: Mapping[str, str] | None = None, benchmark_sha256: str | None = None,
                   keys: Sequence[str] = GENERATION_KEYS, method_files: Mapping[str, str] | None = None) -> dict:
    """The exact tree :func:`generation_hash` hashes: ``{"config": {dotted key: value}, "weights":
    {file name: sha256}, "benchmark_sha256": ...}``, plus ``"method_files"`` ({name: sha256} of the
    files the method loads, e.g. SkipVAR's decision models) when there are any: a method without
    files hashes as before. Keys absent from ``cfg`` are left out."""
    tree = _canon(_to_plain(cfg))
    if not isinstance(tree, dict):
        raise TypeError("generation_key expects a mapping at the top level")
    picked = {}
    for k in keys:
        present, value = _select(tree, k)
        if present and not (k in NEUTRAL_DEFAULTS and value == NEUTRAL_DEFAULTS[k]):
            picked[k] = _normalise(k, value)
    key = {"config": picked, "weights": dict(weights or {}), "benchmark_sha256": benchmark_sha256,
           "seed_rule": SEED_RULE_VERSION}
    if method_files:
        key["method_files"] = dict(sorted(method_files.items()))
    return key


def generation_hash(cfg: Any, weights: Mapping[str, str] | None = None, benchmark_sha256: str | None = None,
                    method_files: Mapping[str, str] | None = None) -> str:
    """Key of the image store folder: :data:`GENERATION_KEYS` of ``cfg`` (device/dtype resolved
    by the caller) plus the weight files', prompt files' and method files' sha256 (see the module
    docstring): replacing a SkipVAR decision model in place makes new images, as new weights do."""
    return config_hash(generation_key(cfg, weights, benchmark_sha256, method_files=method_files))


def entry_hash(cfg: Any, weights: Mapping[str, str] | None = None, benchmark_sha256: str | None = None,
               exclude: Iterable[str] = ENTRY_EXCLUDE, method_files: Mapping[str, str] | None = None) -> str:
    """Key of the run-record entry: ``cfg`` minus ``exclude`` plus the weight/prompt (and, when the
    method loads files, the method files') sha256 values. ``runtime.device`` counts by its type:
    the shards of one job on ``cuda:0`` .. ``cuda:3`` of one machine write one record."""
    tree = json.loads(canonical_json(cfg, exclude))
    if isinstance(tree.get("runtime"), dict) and "device" in tree["runtime"]:
        tree["runtime"]["device"] = _normalise("runtime.device", tree["runtime"]["device"])
    for k, default in NEUTRAL_DEFAULTS.items():   # at its default a later knob names the same record
        present, value = _select(tree, k)
        if present and value == default:
            _drop(tree, k)
    key = {"config": tree, "weights": dict(weights or {}), "benchmark_sha256": benchmark_sha256}
    if method_files:
        key["method_files"] = dict(sorted(method_files.items()))
    return config_hash(key)


def pair_key(rec: Mapping) -> str | None:
    """Pairing key of a run record: its generation key without the method (:data:`PAIR_KEYS`),
    from ``config``, ``model.weights`` and ``benchmark.sha256``. None without a ``config``."""
    cfg = rec.get("config")
    if not isinstance(cfg, Mapping):
        return None
    weights = (rec.get("model") or {}).get("weights") or {}
    bench = rec.get("benchmark") or {}
    bench_sha = bench.get("key_sha256") or bench.get("sha256")   # key_sha256: prompts + rewrite file, when rewritten
    return config_hash(generation_key(cfg, weights, bench_sha, keys=PAIR_KEYS))


def stable_hash(obj: Any, n: int = 12) -> str:
    """Short sha256 of the canonical JSON of ``obj`` (a stable id for nested facts)."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:n]
