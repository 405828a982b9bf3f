"""The W&B side every varbench run goes through: the logger's settings, one guarded place that
opens a run, and what a record's summary is.

Usage::

    from varbench.loggers.wandb import WandbSink, summary_from_record
    sink = WandbSink(mode="offline", project="varbench", group="nova_sweep", dir="results")
    run = sink.init_run(name="nova-0123abcd", job_type="nova", config={...})   # ConfigError naming the fix
    run.summary.update(summary_from_record(record))

``summary_from_record`` flattens a record into the flat metrics (``<evaluator>/<metric>`` and
``..._err``), timing medians of every batch size (``timing/bs<k>/<part>_ms``,
``timing/bs<k>/images_per_s``, ``timing/bs<k>/peak_mem_gb``), ``flops/total`` and ``flops/ar``
(transformer only), ``flops/text_encoder``, ``flops/vae_decode``, ``flops/end_to_end`` (transformer +
both; absent when not counted) and ``wall_s``. Every run is opened with ``reinit="finish_previous"``, so the jobs of a Hydra multirun
that share one process never merge into one run.

Modes: ``online`` needs network and an API key (without network, W&B waits ``init_timeout``
seconds then fails: use ``offline`` on air-gapped nodes and ``wandb sync`` later; an offline run's
folder holds every file it names, :func:`stage_inside`, and ``python -m varbench.publish --relocate``
readies a copied one for ``wandb sync``, :mod:`varbench.loggers.offline`); ``disabled``
runs the same code path with a no-op run (tests, CI). ``wandb`` is imported lazily so
``logger=none`` never needs it.

A job's own run (opened when the job starts, live progress and system metrics, the record's
summary with its paired speed-up and deltas at the end) and the sweep-level run are in
:mod:`varbench.loggers.publish`; :meth:`WandbSink.init_run` is the one place a run is opened, and turns a
bad mode or a missing login into a :class:`varbench.core.errors.ConfigError` naming the fix.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable, Mapping

MODES = ("online", "offline", "disabled")

#: folder inside an offline run's folder that W&B stages artifact files into (``WANDB_DATA_DIR``;
#: the files are under ``<DATA_DIR>/artifacts/staging/``), see :func:`stage_inside`
DATA_DIR = "wandb-data"
DATA_ENV = "WANDB_DATA_DIR"

#: what to do when W&B cannot open a run (printed with every start-up error)
LOGIN_FIX = ("run `wandb login` (or set WANDB_API_KEY), or set WANDB_MODE=offline to write the runs locally "
             "and `wandb sync` them later, or WANDB_MODE=disabled / logger=none for no W&B at all")


def _config_error(msg: str):
    from varbench.core.errors import ConfigError

    return ConfigError(msg)


def check_mode(mode: Any) -> str:
    """``mode`` if it is one of :data:`MODES`, else a ConfigError naming the fix."""
    if mode not in MODES:
        raise _config_error(f"logger.mode (WANDB_MODE) must be one of {', '.join(MODES)}, got {mode!r}: set "
                            "WANDB_MODE=offline (or online / disabled), or logger.mode=offline")
    return str(mode)


class NullSink:
    """``logger=none`` (``conf/logger/none.yaml``'s target): no W&B at all.
    :func:`varbench.loggers.publish.sink_from_cfg` maps it to None, so nothing is ever called on it."""


def summary_from_record(record: Mapping) -> dict[str, float]:
    """The flat summary dict a record maps to (see module docstring)."""
    out: dict[str, float] = {}
    unc = record.get("uncertainty") or {}
    for k, v in (record.get("metrics") or {}).items():
        out[k] = v
        if unc.get(k) is not None:
            out[f"{k}_err"] = unc[k]
    for bs, tb in ((record.get("timing") or {}).get("by_batch") or {}).items():
        for part in ("text_ms", "ar_ms", "decode_ms", "total_ms"):
            block = tb.get(part)
            if isinstance(block, Mapping) and block.get("median") is not None:
                out[f"timing/bs{bs}/{part}"] = block["median"]
        if tb.get("images_per_s") is not None:
            out[f"timing/bs{bs}/images_per_s"] = tb["images_per_s"]
        if tb.get("peak_mem_bytes") is not None:
            out[f"timing/bs{bs}/peak_mem_gb"] = tb["peak_mem_bytes"] / 2**30
    flops = record.get("flops") or {}
    for k in ("total", "ar", "text_encoder", "vae_decode", "end_to_end"):
        if flops.get(k) is not None:
            out[f"flops/{k}"] = flops[k]
    if record.get("wall_s") is not None:
        out["wall_s"] = record["wall_s"]
    return out


def log_record_artifact(run, record: Mapping) -> None:
    """Upload ``record`` as ``record.json`` in an artifact ``record-<entry_id>`` of type ``varbench-record``."""
    import wandb

    art = wandb.Artifact(f"record-{record.get('entry_id', 'unknown')}", type="varbench-record")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "record.json"
        path.write_text(json.dumps(record, indent=2, sort_keys=True, default=str))
        art.add_file(str(path))
        run.log_artifact(art)


class WandbSink:
    """Publish finished records, one W&B run per call.

    Args:
        mode: "online" | "offline" | "disabled" (see module docstring for the trade-offs).
        project, entity: W&B destination (entity None = the API key's default).
        group: groups runs in the UI; the experiment name is a good choice.
        dir: folder under which W&B writes ``wandb/`` (offline runs live there until synced).
        tags: extra tags; the method and model names are added per run.
        log_record: also upload the record JSON as an artifact.
        log_images: cap on sample images logged per run (0 = none; in a job's per-image table, -1 = all).
        init_timeout: seconds W&B may take to open a run (online) before that is a ConfigError.
        progress_every_s: a job's live progress is logged at most this often (varbench.loggers.publish).
        log_sweep: also log the sweep-level run after aggregation (varbench.loggers.publish.log_sweep).
    """

    def __init__(self, mode: str = "online", project: str = "varbench", entity: str | None = None,
                 group: str | None = None, dir: str | os.PathLike | None = None,
                 tags: Iterable[str] = (), log_record: bool = True, log_images: int = 16,
                 init_timeout: float = 90.0, progress_every_s: float = 1.0, log_sweep: bool = True):
        self.mode = check_mode(mode)   # a ConfigError (a ValueError) naming the fix
        self.project = project
        self.entity = entity
        self.group = group
        self.dir = str(dir) if dir is not None else None
        self.tags = [str(t) for t in (tags or ())]
        self.log_record = log_record
        self.log_images = int(log_images)
        self.init_timeout = float(init_timeout)
        self.progress_every_s = float(progress_every_s)
        self.log_sweep = bool(log_sweep)

    def init_run(self, *, name: str, job_type: str | None, config: Mapping | None = None,
                 tags: Iterable[str] = (), group: str | None = None):
        """Open one W&B run (finishing any run still open in this process). A missing login, a
        bad mode or an unreachable server is a :class:`varbench.core.errors.ConfigError` naming the
        fix (:data:`LOGIN_FIX`)."""
        try:
            import wandb
        except ImportError as e:
            raise _config_error(f"logger=wandb needs the wandb package ({e}): `pip install wandb`, or "
                                "logger=none") from None
        if self.dir:
            Path(self.dir).mkdir(parents=True, exist_ok=True)
        try:
            run = wandb.init(
                mode=self.mode, project=self.project, entity=self.entity, group=group or self.group, dir=self.dir,
                name=name, job_type=job_type, tags=sorted({*self.tags, *(str(t) for t in tags if t)}),
                config=dict(config or {}), reinit="finish_previous",
                settings=wandb.Settings(disable_git=True, save_code=False, silent=True,
                                        init_timeout=self.init_timeout),
            )
        except Exception as e:  # noqa: BLE001 - UsageError (no API key), CommError (no network), bad settings
            raise _config_error(f"W&B could not open a run in mode {self.mode!r} ({type(e).__name__}: {e}); "
                                f"{LOGIN_FIX}") from e
        if self.mode == "offline":
            stage_inside(run)
        return run


def run_folder(run) -> Path | None:
    """The folder of an open run (``<dir>/wandb/offline-run-<time>-<id>``): its ``files/`` folder's
    parent; None for a run without one (``disabled``)."""
    files = getattr(run, "dir", None)
    return Path(files).parent if files else None


def stage_inside(run) -> Path | None:
    """Make an offline run self-contained: W&B copies every file added to an artifact (the per-image
    table's images, the tables' JSON, record.json) into a staging folder that the run's ``.wandb``
    names by absolute path, by default ``~/.local/share/wandb/artifacts/staging/``, outside the run
    folder, so a copied ``offline-run-*`` folder lost them. W&B reads that place from ``WANDB_DATA_DIR``
    each time it stages a file (``wandb.sdk.artifacts.staging``), so pointing it at
    ``<run folder>/``:data:`DATA_DIR` for the run's lifetime puts those copies inside the run folder;
    the previous value comes back when the run finishes. Media logged directly (figures) already land
    in the run's ``files/media/``. After the folder moved, :func:`varbench.loggers.offline.relocate`
    rewrites the absolute paths for ``wandb sync``. Returns the data folder (None: no run folder)."""
    folder = run_folder(run)
    if folder is None:
        return None
    data = folder / DATA_DIR
    data.mkdir(parents=True, exist_ok=True)
    before = os.environ.get(DATA_ENV)
    os.environ[DATA_ENV] = str(data)

    def restore() -> None:
        if os.environ.get(DATA_ENV) != str(data):      # someone else set it since: theirs stays
            return
        if before is None:
            os.environ.pop(DATA_ENV, None)
        else:
            os.environ[DATA_ENV] = before

    _on_finish(run, restore)
    return data


def _on_finish(run, fn) -> None:
    """Call ``fn`` when ``run`` finishes (W&B's teardown hooks; if this wandb has none, the setting
    stays until the next run replaces it, which only moves later stagings of this process)."""
    try:
        from wandb.sdk.wandb_run import TeardownHook, TeardownStage

        run._teardown_hooks.append(TeardownHook(fn, TeardownStage.LATE))
    except (ImportError, AttributeError):
        pass
