"""Helpers for tests and studies that run whole jobs: the config a command line composes."""
from __future__ import annotations


def job_config(root, *overrides: str):
    """The job config ``python -m varbench +experiment=smoke <overrides>`` composes, with the store and
    results under ``root`` (what the job tests run; later overrides win)."""
    from hydra import compose, initialize_config_dir

    from varbench.core.resources import CONF_DIR
    from varbench.harness.per_model import apply_model_knobs

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[
            "+experiment=smoke", f"paths.store_dir={root}/store", f"paths.results_dir={root}/results", *overrides])
    apply_model_knobs(cfg, overrides)   # the model's knob block, the overrides' knobs kept (as the command line does)
    return cfg
