"""Every config file composes, every experiment composes, and every sweep names real options."""
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

CONF = Path(__file__).resolve().parents[1] / "varbench" / "conf"
GROUPS = ["model", "method", "benchmark", "timing", "runtime", "logger", "paths"]


def options(group):
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def _compose(overrides):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    OmegaConf.to_container(cfg, resolve=True)   # every interpolation resolves
    return cfg


@pytest.mark.parametrize("group,option", [(g, o) for g in GROUPS for o in options(g)])
def test_every_option_composes(group, option):
    cfg = _compose([f"{group}={option}"])
    assert cfg[group] is not None


@pytest.mark.parametrize("option", options("evaluator"))
def test_every_evaluator_composes_and_is_registered(option):
    from varbench import evaluators

    cfg = _compose([f"evaluator=[{option}]"])
    assert list(cfg.evaluator) == [option]
    assert cfg.evaluator[option].name in evaluators.REGISTRY


@pytest.mark.parametrize("exp", options("experiment"))
def test_every_experiment_composes_and_sweeps_real_options(exp):
    cfg = _compose([f"+experiment={exp}"])
    assert cfg.experiment_name == exp
    params = OmegaConf.select(cfg, "hydra.sweeper.params") or {}
    for key, values in params.items():
        if key in GROUPS:
            for v in str(values).split(","):
                assert v.strip() in options(key), f"{exp}: sweep names {key}={v} but varbench/conf/{key}/{v}.yaml does not exist"


@pytest.mark.parametrize("exp", [e for e in options("experiment") if e != "smoke"])
@pytest.mark.parametrize("model", options("model"))
def test_experiments_pick_the_models_protocol(exp, model):
    cfg = _compose([f"+experiment={exp}", f"model={model}"])
    expected = {"infinity_2b": ("geneval", {"geneval"}), "infinity_8b": ("geneval", {"geneval"}),
                "tiny": ("smoke", {"fidelity"}), "toy": ("toy", {"toy_geneval", "fidelity"})}
    if exp == "toy_table":  # toy-only by construction: it sets model=toy itself
        cfg = _compose(["+experiment=toy_table"])
        assert cfg.model.name == "toy" and cfg.benchmark.name == "toy" and set(cfg.evaluator) == {"toy_geneval", "fidelity"}
        return
    if exp == "baseline_table" or model not in expected:
        return
    bench, evs = expected[model]
    assert cfg.benchmark.name == bench
    assert set(cfg.evaluator) == evs
    # an explicit benchmark replaces the protocol (and its evaluators); evaluators can be added
    cfg = _compose([f"+experiment={exp}", f"model={model}", "benchmark=smoke", "evaluator=[fidelity]"])
    assert cfg.benchmark.name == "smoke" and set(cfg.evaluator) == {"fidelity"}


def test_every_method_builds_its_policy():
    from varbench.build import build_policy_from_cfg

    for m in options("method"):
        cfg = _compose([f"method={m}"])
        policy = build_policy_from_cfg(cfg.method)
        assert policy.name == cfg.method.name


def test_unknown_method_suggests_the_closest_name():
    from varbench.policies import build_policy

    with pytest.raises(KeyError, match="Did you mean fastvar"):
        build_policy("fastvra")


def test_toy_model_config_matches_the_shipped_manifest():
    from varbench.toy.load import TOY_SCHEDULE, toy_sampling

    cfg = _compose(["model=toy"])
    assert [tuple(hw) for hw in cfg.model.schedule] == list(TOY_SCHEDULE)
    assert dict(cfg.model.sampling) == toy_sampling()
