"""`varbench.harness.presets`: the one way a method name becomes a policy (the job's composition, for scripts
too), and the one way a script reads an experiment's method list (conf/method_set/<set>/<model>.yaml)."""
from __future__ import annotations

import textwrap

import pytest
from omegaconf import OmegaConf

from varbench.core.errors import ConfigError
from varbench.harness.presets import compose_job_config, method_set, preset_names, resolve_method


@pytest.mark.parametrize("preset", ["fastvar_8b_paper", "nova_scalekv_8b", "skip_last_2", "fastvar_hart_tiny"])
def test_a_preset_resolves_to_the_method_node_a_job_records(preset):
    """The job's `method` node (what a record stores under method.config) and the resolver's agree exactly,
    inherited defaults (`defaults: [fastvar, _self_]`, the `<method>_schema` knobs) and interpolations included."""
    job = OmegaConf.to_container(compose_job_config([f"method={preset}", "model=infinity_8b"]).method, resolve=True)
    r = resolve_method(preset, model="infinity_8b")
    assert r.config == job and (r.name, r.label, r.knobs) == (job["name"], job["label"], job["knobs"])
    assert type(r.build()).__name__ == type(r.policy_class(**job["knobs"])).__name__


def test_inherited_and_own_knobs():
    r = resolve_method("fastvar_8b_paper")
    assert r.name == "fastvar" and r.knobs["prune"] == {-4: 0.4, -3: 0.6, -2: 1.0, -1: 1.0}   # its own
    assert r.knobs["skip"] == [] and r.knobs["cache_scale"] == -5                             # fastvar.yaml's
    assert resolve_method("skip_last_2").config == {"name": "skip_last", "label": "Skip last 2 scales",
                                                    "knobs": {"run_scales": -2}}


def test_the_result_is_a_copy():
    r = resolve_method("fastvar")
    r.knobs["prune"][32] = 0.99
    assert resolve_method("fastvar").knobs["prune"][32] == 0.4


def test_refusal_reads_the_preset_then_the_built_policy():
    assert "use method=fastvar_hart" in resolve_method("fastvar_2b_paper").refusal("hart")   # the preset's refuse:
    assert resolve_method("fastvar_hart").refusal("hart") is None
    assert resolve_method("fastvar", model="hart_0p7b").refusal("hart") is None   # its per-model HART block
    assert "fastvar_generalised" in resolve_method("fastvar", model="toy").refusal("infinity")   # refused by model name
    assert "written for infinity models, not hart" in resolve_method("skipvar").refusal("hart")   # the class's backbones


def test_a_users_config_dir_is_searched_after_the_package(tmp_path):
    (tmp_path / "method").mkdir()
    (tmp_path / "method" / "mine.yaml").write_text(textwrap.dedent("""\
        defaults: [nova, _self_]       # a packaged preset, extended
        label: My NOVA
        knobs:
          t_min_tokens: 64
        """))
    (tmp_path / "method" / "skip_last_2.yaml").write_text("name: skip_last\nlabel: shadow\nknobs: {run_scales: -5}\n")
    with pytest.raises(ConfigError, match="neither a preset"):
        resolve_method("mine")                                  # not without the folder
    r = resolve_method("mine", config_dirs=[tmp_path])
    assert r.name == "nova" and r.label == "My NOVA" and r.knobs["t_min_tokens"] == 64
    assert r.knobs["q_sub"] == resolve_method("nova").knobs["q_sub"]      # the rest is nova.yaml's
    assert "mine" in preset_names([tmp_path])
    # as with --config-dir, the package's own preset of a name comes first
    assert resolve_method("skip_last_2", config_dirs=[tmp_path]).knobs == {"run_scales": -2}


def test_names_without_a_preset():
    r = resolve_method("varbench.policies.skip:SkipLast")
    assert r.name == "varbench.policies.skip:SkipLast" and r.knobs == {}
    assert r.display_name == getattr(getattr(r.policy_class, "card", None), "display_name", None) or r.name
    assert resolve_method("skip_last").name == "skip_last"               # a registered name, no YAML: its defaults
    with pytest.raises(ConfigError, match=r"Did you mean .*skip_last_2"):
        resolve_method("skip_last_3")
    with pytest.raises(ConfigError, match="neither a preset"):
        resolve_method("not a name")


def test_a_running_hydra_app_is_left_as_it_was():
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from varbench.core.resources import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR / "method"), version_base="1.3"):
        before = GlobalHydra.instance().hydra
        assert resolve_method("nova_fast", model="toy").name == "nova"
        assert GlobalHydra.instance().hydra is before


def test_method_set_reads_the_sets_file_in_order():
    assert method_set("main_table", "hart_0p7b") == ["baseline", "fastvar_hart", "nova", "toprovar", "skip_last_2",
                                                     "skipvar_hybrid"]
    assert method_set("device_bench", "infinity_8b")[:2] == ["baseline", "fastvar_8b_paper"]
    with pytest.raises(ConfigError, match="add varbench/conf/method_set/device_bench/nomodel.yaml"):
        method_set("device_bench", "nomodel")
