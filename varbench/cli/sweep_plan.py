"""The jobs a command line will run, composed before Hydra launches any of them.

``plan_command(argv)`` reads a ``python -m varbench ...`` command line the way Hydra's basic sweeper
does: the experiment's ``hydra.sweeper.params`` first, the command line's overrides after them (a
key given in both takes the command line's value, in the params' place), every sweep (``a,b``,
``range(...)``, ``choice(...)``) expanded into the product of its values, in order. Each job's
config is then composed as the job itself will see it (without the ``hydra`` node). The preflight
(:mod:`varbench.harness.preflight`) and ``--dry-run`` (:mod:`varbench.cli.dry_run`) read this plan.

Hydra runs a single job when neither ``-m``/``--multirun`` is given nor the config sets
``hydra.mode: MULTIRUN``; then a sweep override is an error of Hydra's, and the plan holds the one
job. ``glob(...)`` sweeps need Hydra's config loader: the plan is then None and the caller leaves
the command to Hydra.
"""
from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path
from typing import Optional, Sequence

from omegaconf import DictConfig

from omegaconf.errors import InterpolationKeyError

from varbench.cli.overrides import first_choice, split_argv
from varbench.core.errors import ConfigError
from varbench.core.resources import CONF_DIR

_MULTIRUN_FLAGS = {"-m", "--multirun"}


@dataclasses.dataclass
class PlannedJob:
    """One job of the plan: its overrides (as Hydra passes them to the job) and its config."""

    overrides: list[str]
    cfg: DictConfig


@dataclasses.dataclass
class SweepPlan:
    multirun: bool
    jobs: list[PlannedJob]
    search: list[Path]            # the config search path: the packaged conf, then --config-dir folders

    def varying(self) -> list[str]:
        """The override keys whose values differ between jobs (what tells the jobs apart)."""
        per_job = [dict(o.partition("=")[::2] for o in job.overrides) for job in self.jobs]
        keys = list(dict.fromkeys(k for d in per_job for k in d))
        return [k for k in keys if len({d.get(k) for d in per_job}) > 1]


def job_overrides(sweep_params: Optional[dict], overrides: Sequence[str]) -> Optional[list[list[str]]]:
    """Every job's override list, as Hydra's basic sweeper builds them (see the module docstring);
    None when a sweep cannot be expanded without the config loader (``glob``)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    lines = [f"{k}={v}" for k, v in (sweep_params or {}).items()] + list(overrides)
    by_key: dict[str, list[str]] = {}
    for o in OverridesParser.create().parse_overrides(lines):
        key = o.get_key_element()
        if o.is_sweep_override():
            try:
                by_key[key] = [f"{key}={v}" for v in o.sweep_string_iterator()]
            except Exception:  # noqa: BLE001 - glob() needs the config repository
                return None
        else:
            by_key[key] = [f"{key}={o.get_value_element_as_str()}"]
    return [list(x) for x in itertools.product(*by_key.values())]


def compose_job(search: Sequence[Path], overrides: Sequence[str], hydra_node: bool = False) -> DictConfig:
    """The config one job of ``overrides`` composes to (Hydra's compose API over ``search``), with the
    model's per-model knob block merged as the job will merge it (:mod:`varbench.harness.per_model`)."""
    from hydra import compose

    import varbench.harness  # noqa: F401 - the method schemas the presets name
    from varbench.harness.per_model import apply_model_knobs

    extra = [f"hydra.searchpath=[{','.join('file://' + str(Path(d).resolve()) for d in search[1:])}]"] if search[1:] else []
    with _hydra(search[0]):
        cfg = compose(config_name="config", overrides=list(overrides) + extra, return_hydra_config=hydra_node)
    apply_model_knobs(cfg, overrides)
    return cfg


class _hydra:
    """``initialize_config_dir`` with Hydra's global state cleared before and after (the command's
    own ``@hydra.main`` initialises it again)."""

    def __init__(self, conf: Path):
        self.conf = conf

    def __enter__(self):
        from hydra import initialize_config_dir
        from hydra.core.global_hydra import GlobalHydra

        GlobalHydra.instance().clear()
        self.ctx = initialize_config_dir(config_dir=str(Path(self.conf).resolve()), version_base="1.3")
        self.ctx.__enter__()

    def __exit__(self, *exc):
        from hydra.core.global_hydra import GlobalHydra

        try:
            self.ctx.__exit__(*exc)
        finally:
            GlobalHydra.instance().clear()
        return False


def plan_command(argv: Sequence[str]) -> Optional[SweepPlan]:
    """The jobs of a command line (see the module docstring); None when Hydra must be left to
    decide (a glob sweep, a flag that runs no job such as ``--help`` or ``--cfg``)."""
    from omegaconf import OmegaConf

    if any(a.partition("=")[0] in ("--help", "-h", "--hydra-help", "--cfg", "-c", "--info", "-i",
                                   "--shell-completion", "-sc", "--version") for a in argv):
        return None
    overrides, dirs = split_argv(argv)
    search = [Path(CONF_DIR)] + dirs
    flagged = any(a in _MULTIRUN_FLAGS for a in argv)
    first = [_first_value(o) for o in overrides]
    primary = compose_job(search, first, hydra_node=True)
    multirun = flagged or str(OmegaConf.select(primary, "hydra.mode")) == "RunMode.MULTIRUN"
    if not multirun:
        cfg = compose_job(search, overrides)
        return SweepPlan(False, [PlannedJob(list(overrides), cfg)], search)
    params = OmegaConf.select(primary, "hydra.sweeper.params")
    try:   # resolved, as Hydra instantiates the sweeper (compose_matrix picks its method list by model)
        params = OmegaConf.to_container(params, resolve=True) if params is not None else {}
    except InterpolationKeyError as e:
        raise ConfigError(f"this experiment's sweep (hydra.sweeper.params) cannot be built for this command: "
                          f"{str(e).splitlines()[0]}. An experiment with a per-model method list (e.g. "
                          "compose_matrix_methods in compose_matrix.yaml) has entries only for the models it "
                          "lists: choose one of them or add yours") from None
    lists = job_overrides(params, overrides)
    if lists is None:
        return None
    return SweepPlan(True, [PlannedJob(o, compose_job(search, o)) for o in lists], search)


def _first_value(line: str) -> str:
    """``key=a,b`` -> ``key=a``: the first job's choice, for composing the sweep's primary config
    (whose ``hydra`` node holds the sweeper's params); anything else as given."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        return first_choice(OverridesParser.create().parse_override(line))
    except Exception:  # noqa: BLE001 - Hydra reports syntax errors itself
        return line
