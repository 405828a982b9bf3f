"""`python -m varbench [+experiment=NAME] [group=option ...] [key=value ...]` (Hydra)."""
from __future__ import annotations

import logging
import os
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

CONF = str(Path(__file__).resolve().parents[1] / "conf")


@hydra.main(version_base="1.3", config_path=CONF, config_name="config")
def main(cfg: DictConfig) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")         # weights come from local paths only
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    logging.getLogger("varbench").setLevel(logging.INFO)
    from .callbacks import aggregate_experiment
    from .job import run_job

    run_job(cfg)
    multirun = HydraConfig.get().mode.name == "MULTIRUN"
    if cfg.get("aggregate", True) and not multirun:
        aggregate_experiment(cfg)


if __name__ == "__main__":
    main()
