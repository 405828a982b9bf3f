"""Config validation before compute (issue #12 item 12): one named error per bad setting."""
import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from varbench.prompts import PromptSetError, load_prompt_set
from varbench.validate import ConfigError, validate_config

CONF = Path(__file__).resolve().parents[1] / "varbench" / "conf"
METHODS = sorted(p.stem for p in (CONF / "method").glob("*.yaml"))


def _cfg(*extra, experiment="smoke"):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=[f"+experiment={experiment}", *extra])


@pytest.mark.parametrize("model", ["tiny", "toy", "infinity_2b"])
@pytest.mark.parametrize("method", METHODS)
def test_every_shipped_method_validates(method, model):
    validate_config(_cfg(f"method={method}", f"model={model}"))


@pytest.mark.parametrize("exp", sorted(p.stem for p in (CONF / "experiment").glob("*.yaml")))
def test_every_experiment_validates(exp):
    validate_config(_cfg(experiment=exp))


@pytest.mark.parametrize("overrides, needle", [
    (["method.name=bogus"], "method.name: Unknown method 'bogus'"),
    (["method.name=novaa"], "Did you mean nova"),
    (["method=nova", "method.knobs.keep_multiple=2.5"], "method.knobs.keep_multiple=2.5"),
    (["method=nova", "method.knobs.t_min_tokens=abc"], "method.knobs.t_min_tokens='abc'"),
    (["method=nova", "method.knobs.q_sub=0"], "nova.q_sub must be an integer >= 1 or null, got 0"),
    (["method=nova", "+method.knobs.qsub=3"], "method.knobs.qsub: nova has no knob 'qsub'. Did you mean 'q_sub'?"),
    (["method=nova", "method.knobs.r_max=2"], "r_max"),
    (["runtime.batch_size=0"], "runtime.batch_size must be >= 1, got 0"),
    (["runtime.batch_size=-1"], "runtime.batch_size must be >= 1, got -1"),
    (["runtime.batch_size=abc"], "runtime.batch_size must be an integer"),
    (["runtime.dtype=fp16"], "runtime.dtype"),
    (["runtime.device=gpu"], "runtime.device"),
    (["timing.repeats=abc"], "timing.repeats must be an integer, got 'abc'"),
    (["timing.repeats=0"], "timing.repeats must be >= 1"),
    (["timing.batch_sizes=[0]"], "timing.batch_sizes"),
    (["generation.seed=[0,1]"], "generation.seed must be one non-negative integer"),
    (["generation.top_p=0"], "generation.top_p"),
    (["generation.tau=0"], "generation.tau must be > 0"),
    (["generation.cfg=abc"], "generation.cfg must be a number or a list of numbers"),
    (["generation.pn=2M"], "generation.pn must be one of"),
    (["benchmark.limit=0"], "benchmark.limit must be >= 1"),
    (["benchmark.loader=genevl"], "Did you mean 'geneval'"),
    (["model=toy", "method=fastvar_generalised", "method.knobs.skip=[40]"],
     "method.knobs.skip: scale index 40 is outside the 9-scale schedule"),
    (["model=toy", "method=fastvar_generalised", "method.knobs.cache_scale=-12"],
     "method.knobs.cache_scale: scale index -12 is outside the 9-scale schedule"),
    (["method=fastvar", "method.knobs.prune={32: 1.5}"], "prune ratios must be in [0, 1]"),
    (["method=fastvar_generalised", "method.knobs.skip=abc"], "method.knobs.skip='abc'"),
])
def test_bad_setting_is_named(overrides, needle):
    with pytest.raises(ConfigError) as e:
        validate_config(_cfg(*overrides))
    assert needle in str(e.value), str(e.value)


def test_timing_none_still_validates():
    validate_config(_cfg("timing=none"))


def test_run_job_validates_before_loading_anything(tmp_path, monkeypatch):
    import varbench.job as job

    def boom(*a, **k):
        raise AssertionError("compute started")
    monkeypatch.setattr(job, "build_runtime", boom)
    monkeypatch.setattr(job, "load_prompt_set", boom)
    with pytest.raises(ConfigError, match="runtime.batch_size"):
        job.run_job(_cfg("runtime.batch_size=-1", f"paths.store_dir={tmp_path}/store"))
    assert not (tmp_path / "store").exists()


def test_empty_geneval_file_is_named(tmp_path, monkeypatch):
    import varbench.prompts as prompts

    monkeypatch.setattr(prompts, "_resolve_file", lambda *a, **k: ("0" * 64, None))
    f = tmp_path / "evaluation_metadata.jsonl"
    f.write_text("")
    with pytest.raises(PromptSetError, match=f"{f} holds no prompts"):
        load_prompt_set({"loader": "geneval", "path": str(f)})
    f.write_text(json.dumps({"tag": "single_object", "prompt": "a cat"}) + "\n" + json.dumps({"tag": "x"}) + "\n")
    with pytest.raises(PromptSetError, match=f"{f}:2 has no \"prompt\" text"):
        load_prompt_set({"loader": "geneval", "path": str(f)})


def test_imagereward_row_without_prompt_is_named(tmp_path, monkeypatch):
    import varbench.prompts as prompts

    monkeypatch.setattr(prompts, "_resolve_file", lambda *a, **k: ("0" * 64, None))
    f = tmp_path / "benchmark-prompts.json"
    f.write_text(json.dumps([{"id": 1, "prompt": "a"}, {"id": 2}]))
    with pytest.raises(PromptSetError, match="entry 1 .* needs \"id\" and \"prompt\""):
        load_prompt_set({"loader": "imagereward", "path": str(f)})
    f.write_text("[]")
    with pytest.raises(PromptSetError, match="non-empty JSON list"):
        load_prompt_set({"loader": "imagereward", "path": str(f)})
