"""Hydra callbacks: aggregate a whole sweep into one table when the multirun ends."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig


def failures_path(cfg: DictConfig) -> Path:
    """Where the jobs of the current sweep note their failures (one JSON line each)."""
    return Path(cfg.hydra.sweep.dir if "hydra" in cfg else cfg.paths.output_dir) / "failed_jobs.jsonl"


def aggregate_experiment(cfg: DictConfig) -> Path | None:
    """Tables + figures for every finished record of `cfg.experiment_name` -> results/<name>/."""
    from .aggregate import AggregationError, aggregate, markdown_table

    src = Path(cfg.paths.store_dir) / str(cfg.experiment_name)
    out = Path(cfg.paths.results_dir) / str(cfg.experiment_name)
    try:
        paired = aggregate(src, out)
    except AggregationError as e:
        print(f"[varbench] no table written: {e}")
        return None
    print(markdown_table(paired))
    print(f"[varbench] tables and figures: {out}")
    return out


class AggregateOnMultirunEnd(Callback):
    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if config.get("aggregate", True):
            aggregate_experiment(config)
        path = Path(config.hydra.sweep.dir) / "failed_jobs.jsonl"
        if path.exists():
            failed = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            print(f"[varbench] {len(failed)} job(s) of this sweep failed (details in the job logs):")
            for f in failed:
                print(f"  {' '.join(f['overrides'])}: {f['error']}")
            raise SystemExit(1)
