"""Run one job as ``python -m varbench`` does: its observers wired from the config.

Usage::

    from varbench.cli.run import run
    entry_dir = run(cfg)          # = run_job(cfg) with W&B (logger=wandb) and the result line

The job (:mod:`varbench.harness.job`) only calls hooks (:mod:`varbench.harness.events`); which
observers listen is decided here, from the config: the ``logger`` group's ``_target_``
(``varbench/conf/logger/*.yaml``: ``logger=wandb`` mirrors to W&B,
:func:`varbench.loggers.observer.observers_from_cfg`), then the console's result line
(:class:`varbench.cli.report.ResultLine`), in that order (the W&B run's address is printed before
the result line).
"""
from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from varbench.cli.context import hydra_context
from varbench.harness.events import JobObserver
from varbench.harness.job import prepare_job, run_prepared_job


def logger_observers(cfg: DictConfig) -> list[JobObserver]:
    """The observers ``cfg.logger`` names (W&B for ``logger=wandb``; none for ``logger=none``). A
    bad ``logger.mode`` is a ConfigError naming the fix."""
    from varbench.loggers.observer import observers_from_cfg

    return observers_from_cfg(cfg.get("logger"))


def job_observers(cfg: DictConfig) -> list[JobObserver]:
    """Every observer of a job the command runs: :func:`logger_observers`, then the result line."""
    from varbench.cli.report import ResultLine

    return [*logger_observers(cfg), ResultLine()]


def run(cfg: DictConfig) -> Path:
    """Run (or skip, or resume) the job for ``cfg`` with its observers; returns the entry folder.
    The config is validated first (a bad setting fails before the logger is looked at), then a
    bad ``logger.mode`` fails, both before any compute. What the command line chose (the method
    preset, the overrides, the sweep's job number) goes in from the running Hydra app
    (:func:`varbench.cli.context.hydra_context`; none outside one)."""
    job = prepare_job(cfg, hydra_context())
    return run_prepared_job(job, job_observers(job.cfg))
