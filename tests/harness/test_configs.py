"""Every config file composes, every experiment composes, and every sweep names real options."""
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import varbench.harness  # noqa: F401  (registers the method presets' knob dataclasses in the ConfigStore)

CONF = Path(__file__).resolve().parents[2] / "varbench" / "conf"
GROUPS = ["model", "method", "benchmark", "timing", "runtime", "logger", "paths"]


def options(group):
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def _compose(overrides, hydra=False):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides, return_hydra_config=hydra)
    if not hydra:
        OmegaConf.to_container(cfg, resolve=True)   # every interpolation resolves
    return cfg


@pytest.mark.parametrize("group,option", [(g, o) for g in GROUPS for o in options(g)])
def test_every_option_composes(group, option):
    cfg = _compose([f"{group}={option}"])
    assert cfg[group] is not None


@pytest.mark.parametrize("option", options("evaluator"))
def test_every_evaluator_composes_and_is_registered(option):
    from varbench import evaluators

    # benchmark=smoke: the default protocol (protocol/${model}) brings its own evaluators, which evaluator=[...] adds to
    cfg = _compose(["benchmark=smoke", f"evaluator=[{option}]"])
    assert list(cfg.evaluator) == [option]
    assert cfg.evaluator[option].name in evaluators.REGISTRY


@pytest.mark.parametrize("exp", options("experiment"))
@pytest.mark.parametrize("model", options("model"))
def test_every_experiment_composes_and_sweeps_real_options(exp, model):
    cfg = _compose([f"+experiment={exp}", f"model={model}"], hydra=True)   # the sweep lives in the hydra node
    assert cfg.experiment_name == exp
    if exp == "compose_matrix" and model not in cfg.compose_matrix_methods:   # ScaleKV's budgets: 2B, 8B, toy only
        with pytest.raises(Exception, match=f"compose_matrix_methods.{model}"):   # named, at composition
            OmegaConf.to_container(cfg.hydra.sweeper.params, resolve=True)
        return
    params = OmegaConf.select(cfg, "hydra.sweeper.params") or {}
    if exp != "smoke":
        assert params, f"{exp}: no sweep found (a test that reads no sweep checks nothing)"
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
    if exp == "dpg_table":   # DPG-Bench on every model: mPLUG-large on the released ones, the tiny mPLUG otherwise
        released = model in ("infinity_2b", "infinity_8b", "hart_0p7b")
        assert cfg.benchmark.name == "dpgbench" and set(cfg.evaluator) == {"dpgbench" if released else "dpgbench_tiny"}
        return
    if exp.startswith("device_bench"):   # timing only, on random weights: no protocol benchmark, no evaluator
        assert cfg.benchmark.name == "smoke" and not cfg.get("evaluator"), exp
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
    from varbench.harness.build import build_policy_from_cfg

    from varbench.core.errors import ConfigError

    for m in options("method"):
        cfg = _compose([f"method={m}"])
        if m == "sparvar_scalekv":   # the composition matrix's refused cell: built only to state compose's reason
            with pytest.raises(ConfigError, match="sparvar \\+ scalekv is refused"):
                build_policy_from_cfg(cfg.method)
            continue
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


# -- the knob dataclasses change no preset (issue #12 item 12) -----------------------------------------
# tests/fixtures/method_presets_composed.json was generated by the code BEFORE the method presets were
# based on the knob dataclasses of varbench/policies/knobs.py (commit 2e0940c's YAMLs): for each preset,
# repr() of the composed `method` node (compose(config, method=<preset>), OmegaConf.to_container),
# resolved (VARBENCH_WEIGHTS unset) and raw (interpolations as written). Store hashes derive from the
# resolved config, so every preset must still compose to exactly that: same keys, values and types
# (0 stays int, 0.0 float; map keys stay ints). Key order is not compared (hashes sort keys).
PRESETS_BEFORE = Path(__file__).resolve().parents[1] / "fixtures" / "method_presets_composed.json"


def _typed(x):
    if isinstance(x, dict):
        return {(type(k).__name__, k): _typed(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_typed(v) for v in x]
    return (type(x).__name__, x)


# Deliberate changes since the fixture, each changing the hash of the presets it touches (old store
# entries are then not reused, as they should not be): method name -> {knob: new value}.
CHANGED_SINCE_FIXTURE = {
    # issue 20: adaptive methods decide per image at every batch size (varbench/engine/batch_split.py)
    "nova": {"batch_rule": "per_image"},
    "toprovar": {"batch_rule": "per_image"},
    "skipvar": {"batch_rule": "per_image"},
}


def _with_changes(node: dict) -> dict:
    changed = CHANGED_SINCE_FIXTURE.get(node.get("name"))
    if changed and isinstance(node.get("knobs"), dict):
        node = {**node, "knobs": {**node["knobs"], **changed}}
    return node


@pytest.mark.parametrize("preset", sorted(__import__("json").loads(PRESETS_BEFORE.read_text())))
def test_method_presets_compose_exactly_as_before_the_dataclasses(preset, monkeypatch):
    import ast
    import json

    monkeypatch.delenv("VARBENCH_WEIGHTS", raising=False)
    before = json.loads(PRESETS_BEFORE.read_text())[preset]
    assert preset in options("method"), f"{preset} was removed: drop it from {PRESETS_BEFORE.name} knowingly"
    from varbench.harness.per_model import apply_model_knobs

    cfg = _compose([f"method={preset}"])
    apply_model_knobs(cfg)   # as the job hashes it: a per-model alias (nova_toy) with its pinned block merged
    for mode, resolve in (("resolved", True), ("raw", False)):
        now = OmegaConf.to_container(cfg.method, resolve=resolve)
        now.pop("refuse", None)   # where a preset does not apply: in neither hash (ENTRY_EXCLUDE), so it renames nothing
        now.pop("per_model_applied", None)   # which per-model block was merged: in neither hash either
        want = _with_changes(ast.literal_eval(before[mode]))
        assert _typed(now) == _typed(want), f"{preset} ({mode}): {now!r} != {want}"


def test_base_presets_state_only_differences_from_their_dataclass():
    """Each base preset names its method's schema and sets no knob to the dataclass default, except where
    the default is not composed (it must be stated to be in the config)."""
    import dataclasses

    from varbench.policies.knobs import SCHEMAS

    bases = {"baseline": "baseline", "fastvar": "fastvar", "fastvar_generalised": "fastvar", "nova": "nova",
             "toprovar": "toprovar", "skip_last_1": "skip_last", "skip_last_2": "skip_last", "skipvar": "skipvar",
             "skipvar_ssim88": "skipvar", "skipvar_hybrid": "skipvar_fixed", "skipvar_skip2": "skipvar_fixed",
             "skipvar_uncond3": "skipvar_fixed", "nova_on_fastvar": "compose"}
    for preset, method in bases.items():
        raw = OmegaConf.to_container(OmegaConf.load(CONF / "method" / f"{preset}.yaml"))
        assert raw["defaults"] == [f"{method}_schema", "_self_"], preset
        fields = {f.name: f for f in dataclasses.fields(SCHEMAS[method])}
        for k, v in (raw.get("knobs") or {}).items():
            f = fields[k]
            default = list(f.default) if isinstance(f.default, tuple) else f.default
            assert v != default or not f.metadata["composed"], f"{preset}: knobs.{k}={v!r} repeats the dataclass default"
