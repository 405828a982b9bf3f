"""The scoring stage: run each configured evaluator over the stored images, resumable per batch.

Per evaluator ``<name>`` (the key under ``evaluator:`` in the config), in the scoring folder (the
entry folder, or a shard's folder of it):

* ``samples_<name>.jsonl``: the per-sample rows, appended (fsynced) after every scored batch; a
  relaunch hands them back to the scorer (:meth:`Evaluator.restore`) and scores only the images
  without a row, so an interruption costs at most one batch;
* ``versions.json``: ``{name: version_info}`` of each scorer as set up (weights' sha256...), so an
  entry can be assembled from its shards without loading any weights.

The metrics are always computed by :func:`metrics_from_rows` from every row sorted by (prompt,
sample): a resumed, a sharded and an uninterrupted run give the same numbers bit for bit.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Iterable, Mapping

from omegaconf import OmegaConf

from varbench.core.jsonio import append_jsonl, read_json, read_jsonl, write_json

log = logging.getLogger("varbench")

#: images per scorer call and per fsynced append of rows
SCORE_BATCH = 16


def evaluator_kwargs(ecfg: Any, device: str) -> tuple[str, dict]:
    """``(registered evaluator class name, constructor kwargs)`` of one ``evaluator.<name>`` node."""
    kwargs = OmegaConf.to_container(ecfg, resolve=True) if OmegaConf.is_config(ecfg) else dict(ecfg)
    cls_name = kwargs.pop("name")
    if kwargs.get("device") in (None, "auto"):
        if "device" in kwargs:
            kwargs["device"] = device
    return cls_name, kwargs


def preflight(evaluators_cfg: Any, metadata: list[dict], device: str) -> None:
    """Before any image is generated, every configured evaluator checks that it will be able to
    score them (:meth:`varbench.evaluators.base.Evaluator.preflight`): a missing checkpoint fails
    the job in seconds instead of after the whole generation. Prompts an evaluator cannot score, or
    a bad evaluator setting, raise ConfigError; missing weight files raise their own error."""
    from varbench.evaluators import build_evaluator
    from varbench.evaluators.weights import WrongWeightsError
    from varbench.core.errors import ConfigError
    from varbench.core.registry import UnknownName

    for name, ecfg in (evaluators_cfg or {}).items():
        cls_name, kwargs = evaluator_kwargs(ecfg, device)
        try:
            build_evaluator(cls_name, **kwargs).preflight(metadata)
        except WrongWeightsError:
            raise
        except UnknownName as e:           # a typo'd evaluator name: the closest names, as a config error
            raise ConfigError(f"evaluator.{name}.name: {e}") from None
        except (ValueError, TypeError) as e:
            raise ConfigError(f"evaluator {name}: {e}") from None


def evaluator_class(ecfg: Any) -> type:
    """The evaluator class of one ``evaluator.<name>`` node, imported lazily (no weights touched)."""
    from varbench.evaluators import REGISTRY
    from varbench.core.registry import resolve

    return resolve(REGISTRY, ecfg["name"] if isinstance(ecfg, Mapping) else ecfg.name, "evaluator")


def needs_reference(evaluators_cfg: Any) -> bool:
    """True if any configured evaluator compares with the baseline's images (``needs_reference``)."""
    return any(evaluator_class(e).needs_reference for e in (evaluators_cfg or {}).values())


def _key(row: Mapping) -> tuple[int, int]:
    return int(row["prompt_index"]), int(row["sample_index"])


def latest_rows(rows: Iterable[Mapping]) -> list[dict]:
    """One row per (prompt, sample), the last written winning, sorted by (prompt, sample)."""
    out = {_key(r): dict(r) for r in rows}
    return [out[k] for k in sorted(out)]


def metrics_from_rows(name: str, ecfg: Any, rows: Iterable[Mapping], device: str = "cpu") -> dict:
    """Aggregate metrics of evaluator ``name`` from its per-sample rows (no weights needed):
    ``{"metrics", "uncertainty", "higher_is_better", "n_rows"}``."""
    from varbench.evaluators import build_evaluator

    cls_name, kwargs = evaluator_kwargs(ecfg, device)
    ev = build_evaluator(cls_name, **kwargs)
    ev.reset()
    rows = latest_rows(rows)
    ev.restore(rows)
    res = ev.compute()
    return {"metrics": res.metrics, "uncertainty": res.uncertainty,
            "higher_is_better": dict(ev.higher_is_better), "n_rows": len(rows)}


def score_images(folder: Path, evaluators_cfg: Any, key_batches: list[list], load_image, load_reference,
                 device: str, progress) -> None:
    """Write every evaluator's per-sample rows for the keys of ``key_batches`` into ``folder`` (resuming).

    ``key_batches``: batches of ``[(PromptItem, sample_index)]`` (:func:`varbench.harness.sharding.batches`:
    fixed by the benchmark, not by what is left to do, so a resumed or sharded run scores each
    image in the same company and gets the same bits); ``load_image(p, s)`` / ``load_reference(p, s)``
    give PIL images (the reference only for evaluators that need it); ``progress(total, desc)``
    makes a progress bar.
    """
    from varbench.evaluators import Sample, build_evaluator

    versions_path = folder / "versions.json"
    versions = read_json(versions_path) if versions_path.exists() else {}
    for name, ecfg in (evaluators_cfg or {}).items():
        samples_path = folder / f"samples_{name}.jsonl"
        done = {_key(r) for r in read_jsonl(samples_path)} if samples_path.exists() else set()
        todo_batches = [[(it, s) for it, s in batch if (it.index, s) not in done] for batch in key_batches]
        todo_batches = [b for b in todo_batches if b]
        todo = [k for b in todo_batches for k in b]
        if not todo and name in versions:
            continue
        cls_name, kwargs = evaluator_kwargs(ecfg, device)
        ev = build_evaluator(cls_name, **kwargs)
        ev.setup(device)
        versions[name] = json.loads(json.dumps(ev.version_info(), default=str))
        write_json(versions_path, versions)
        if done:
            print(f"[varbench] score {name}: resuming, {len(done)} image(s) already scored, {len(todo)} to go")
        ev.reset()
        bar = progress(len(todo), f"score {name}")
        for chunk in todo_batches:
            n_before = len(ev.scored_rows())
            ev.update([Sample(prompt_index=it.index, sample_index=s, prompt=it.prompt, image=load_image(it.index, s),
                              metadata=it.metadata,
                              reference=_reference(load_reference, name, it.index, s) if ev.needs_reference else None)
                       for it, s in chunk])
            append_jsonl(samples_path, ev.scored_rows()[n_before:])   # fsynced: a kill loses this batch at most
            bar.update(len(chunk))
        bar.close()
        n_before = len(ev.scored_rows())
        ev.compute()                                   # a deferred backend adds its rows here
        append_jsonl(samples_path, ev.scored_rows()[n_before:])


def _reference(load_reference, name: str, p: int, s: int):
    if load_reference is None:
        raise RuntimeError(f"evaluator {name} needs the baseline's images, but none were made for this job")
    return load_reference(p, s)


def collect_scores(folders: list[Path], evaluators_cfg: Any, keys: list, device: str = "cpu") -> dict[str, dict]:
    """Metrics per evaluator from the rows under ``folders`` (one folder, or every shard's), for
    exactly ``keys``; raises if an image has no row. ``{name: {"metrics", "uncertainty",
    "higher_is_better", "version", "n_rows"}}``."""
    wanted = {(it.index, s) for it, s in keys}
    out = {}
    for name, ecfg in (evaluators_cfg or {}).items():
        rows, version = [], None
        for folder in folders:
            path = folder / f"samples_{name}.jsonl"
            if path.exists():
                rows += read_jsonl(path)
            vpath = folder / "versions.json"
            if vpath.exists() and version is None:
                version = read_json(vpath).get(name)
        rows = [r for r in latest_rows(rows) if _key(r) in wanted]
        missing = wanted - {_key(r) for r in rows}
        if missing:
            raise RuntimeError(f"evaluator {name}: {len(missing)} image(s) have no score row "
                               f"(first: prompt {min(missing)[0]}, sample {min(missing)[1]}); rerun the job to score them")
        res = metrics_from_rows(name, ecfg, rows, device)
        out[name] = {**res, "version": version}
    return out


def write_samples(folder: Path, name: str, rows: list[dict]) -> None:
    """Replace ``samples_<name>.jsonl`` in ``folder`` by ``rows`` (used when assembling shards)."""
    path = folder / f"samples_{name}.jsonl"
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    append_jsonl(tmp, rows)
    tmp.replace(path)
