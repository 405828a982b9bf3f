"""The sweep plan (varbench.cli.sweep_plan) expands a command line into the jobs Hydra's basic
sweeper will launch: checked against Hydra's own expansion, and against the experiment files."""
from __future__ import annotations

import pytest
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper   # the released expansion, for the check
from hydra.core.override_parser.overrides_parser import OverridesParser

from varbench.cli.report import sweep_size
from varbench.cli.sweep_plan import job_overrides, plan_command


def _hydra_jobs(params: dict, overrides: list[str]) -> list[list[str]]:
    lines = [f"{k}={v}" for k, v in params.items()] + overrides
    batches = BasicSweeper.split_arguments(OverridesParser.create().parse_overrides(lines), None)
    return [list(job) for batch in batches for job in batch]


@pytest.mark.parametrize("params, overrides", [
    ({"method": "baseline,nova,nova_fast"}, ["model=toy"]),
    ({"method": "baseline,nova"}, ["method=fastvar,skip_last_1,skip_last_2", "generation.seed=0,1"]),   # the command line wins
    ({}, ["+experiment=smoke", "generation.seed=range(0,3)", "runtime.batch_size=choice(1,2)"]),
    ({"method": "a,b", "model": "toy,tiny"}, ["timing=none"]),
])
def test_the_jobs_are_hydras_jobs_in_hydras_order(params, overrides):
    ours = job_overrides(params, overrides)
    assert ours == _hydra_jobs(params, overrides)
    assert sweep_size(overrides, params) == len(ours)


def test_a_glob_sweep_is_left_to_hydra():
    assert job_overrides({}, ["method=glob(nova*)"]) is None


def test_an_experiment_plans_its_sweep_with_each_jobs_composed_config():
    plan = plan_command(["+experiment=nova_sweep", "model=toy"])
    assert plan.multirun                                    # the experiment sets hydra.mode: MULTIRUN
    methods = [str(j.cfg.method.get("preset") or j.cfg.method.name) for j in plan.jobs]
    assert len(plan.jobs) == 9 and plan.varying() == ["method"]
    assert {str(j.cfg.model.name) for j in plan.jobs} == {"toy"}
    assert [o for o in plan.jobs[1].overrides if o.startswith("method=")] == ["method=nova"]
    assert str(plan.jobs[1].cfg.method.name) == "nova" and methods[0] == "baseline"


def test_a_single_run_is_one_job_and_hydra_mode_run_wins():
    plan = plan_command(["+experiment=smoke", "hydra.mode=RUN", "method=nova"])
    assert not plan.multirun and len(plan.jobs) == 1 and str(plan.jobs[0].cfg.method.name) == "nova"
    assert plan_command(["--cfg", "job"]) is None          # prints a config: no job to plan


def test_a_per_model_method_list_without_the_model_is_one_config_error():
    from varbench.core.errors import ConfigError

    with pytest.raises(ConfigError, match="'compose_matrix_methods.tiny' not found.*choose one of them"):
        plan_command(["+experiment=compose_matrix", "model=tiny"])
    # the toy's list: {baseline, FastVAR, NOVA, SkipVAR, SparVAR, SparseVAR} x {full KV, ScaleKV}
    assert len(plan_command(["+experiment=compose_matrix", "model=toy"]).jobs) == 12
