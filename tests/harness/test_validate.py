"""Config validation before compute (issue #12 item 12): one named error per bad setting."""
import json
import re
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from varbench.harness.prompts import PromptSetError, load_prompt_set
from varbench.harness.config import validate_config
from varbench.core.errors import ConfigError

CONF = Path(__file__).resolve().parents[2] / "varbench" / "conf"
METHODS = sorted(p.stem for p in (CONF / "method").glob("*.yaml"))


def _cfg(*extra, experiment="smoke"):
    from varbench.harness.per_model import apply_model_knobs

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"+experiment={experiment}", *extra])
    apply_model_knobs(cfg, extra)   # as the command line merges the model's knob block: a knob set here wins
    return cfg


#: the composition matrix's cells whose members compose refuses (varbench.policies.compose.INCOMPATIBLE): kept
#: as presets so the matrix lists the refusal with its reason; they validate to that reason on every model
REFUSED_COMPOSITIONS = {"sparvar_scalekv"}


@pytest.mark.parametrize("model", ["tiny", "toy", "infinity_2b", "hart_tiny", "hart_0p7b"])
@pytest.mark.parametrize("method", METHODS)
def test_every_shipped_method_validates_or_is_refused_for_its_backbone(method, model):
    """Each shipped preset validates on each model, or, where it does not apply to the model (its name or
    its family), is refused with its reason (and only then)."""
    from varbench.harness.build import model_family
    from varbench.harness.config import preset_refusal

    cfg = _cfg(f"method={method}", f"model={model}")
    reason = preset_refusal(cfg.method, model_family(cfg.model), cfg.model.name)
    if reason is None and method in REFUSED_COMPOSITIONS:
        with pytest.raises(ConfigError, match="is refused"):
            validate_config(cfg)
        return
    if reason is None:
        validate_config(cfg)
        return
    with pytest.raises(ConfigError, match=re.escape(f"on model={model}: {reason}")):
        validate_config(cfg)


@pytest.mark.parametrize("exp", sorted(p.stem for p in (CONF / "experiment").glob("*.yaml")))
def test_every_experiment_validates(exp):
    validate_config(_cfg(experiment=exp))


@pytest.mark.parametrize("overrides, needle", [
    (["method.name=bogus"], "method.name: Unknown method 'bogus'"),
    (["method.name=novaa"], "Did you mean nova"),
    (["method=nova", "method.knobs.keep_multiple=2.5"],
     "method.knobs.keep_multiple=2.5 does not fit nova's keep_multiple: must be int >= 1"),
    (["method=nova", "method.knobs.t_min_tokens=abc"],
     "method.knobs.t_min_tokens='abc' does not fit nova's t_min_tokens: must be int >= 0"),
    (["method=nova", "method.knobs.q_sub=0"], "method.knobs.q_sub=0: must be >= 1 (or null), got 0"),
    (["method=nova", "+method.knobs.qsub=3"], "method.knobs.qsub: nova has no knob 'qsub'. Did you mean 'q_sub'?"),
    (["method=nova", "method.knobs.r_max=2"], "method.knobs.r_max=2: must be >= 0.0 and <= 1.0, got 2"),
    (["method=nova", "method.knobs.r_min=0.95"], "need 0 <= r_min <= r_max <= 1"),       # cross-knob: the constructor
    (["method=nova", "method.knobs.fill=paste"], "method.knobs.fill='paste': 'paste' is not one of ['cache', 'pass']"),
    (["method=nova", "+method.knobs.sublayers=[sa,mlp]"], "method.knobs.sublayers=['sa', 'mlp']: 'mlp' is not one of"),
    (["method=nova", "method.knobs.layer_entropy_lag=0"], "method.knobs.layer_entropy_lag=0: 0 is not one of [1]"),
    (["model=infinity_2b", "method=nova", "method.knobs.t_force=20"],
     "method.knobs.t_force=20: scale index 20 is outside the 13-scale schedule (valid: -13..12"),
    (["model=infinity_2b", "method=nova", "method.knobs.skip_last_scales=13"], "method.knobs.skip_last_scales=13: must be 0..12"),
    (["method=toprovar", "method.knobs.alpha_max=1.5"], "method.knobs.alpha_max=1.5: must be >= 0.0 and <= 1.0"),
    (["method=toprovar", "method.knobs.layer_mode=fast"], "method.knobs.layer_mode='fast': 'fast' is not one of"),
    (["model=toy", "method=toprovar", "method.knobs.svd_scale=9"],
     "method.knobs.svd_scale=9: scale index 9 is outside the 9-scale schedule"),
    (["model=infinity_2b", "method=toprovar_fixed_exit", "method.knobs.fixed_exit=-14"],
     "method.knobs.fixed_exit=-14: scale index -14 is outside the 13-scale schedule"),
    (["method=toprovar", "+method.knobs.alpha=0.5"], "method.knobs.alpha: toprovar has no knob 'alpha'. Did you mean"),
    (["method=skip_last_1", "method.knobs.run_scales=0"], "method.knobs.run_scales=0: must be 1..10"),
    (["method=skip_last_1", "method.knobs.run_scales=-13"], "method.knobs.run_scales=-13: must be 1..10"),
    (["method=skip_last_1", "method.knobs.run_scales=50"], "50 > 10 would silently run every scale"),
    (["method=nova_schema"], "method=nova_schema (or a preset without a label) is the knob schema"),
    (["model=infinity_2b", "method=skipvar_skip2", "method.knobs.skip_last=13"], "method.knobs.skip_last=13: must be 0..12"),
    (["method=skipvar_uncond3", "method.knobs.uncond_from=abc"], "method.knobs.uncond_from='abc' does not fit"),
    (["method=skipvar", "method.knobs.fft_freq_ratio=2"], "method.knobs.fft_freq_ratio=2: must be > 0.0 and < 2.0"),
    (["method=skipvar", "method.knobs.classifier=SVM"], "method.knobs.classifier='SVM': 'SVM' is not one of"),
    (["method=nova_on_fastvar", "method.knobs.conflict=both"], "method.knobs.conflict='both': 'both' is not one of"),
    (["method=nova_on_fastvar", "+method.knobs.policies.1.knobs.q_sub=0"],
     "method.knobs.policies[1].knobs.q_sub=0: must be >= 1 (or null), got 0"),
    (["model=infinity_2b", "method=nova_on_fastvar", "+method.knobs.policies.0.knobs.skip=[40]"],
     "method.knobs.policies[0].knobs.skip: scale index 40 is outside the 13-scale schedule"),
    (["method=nova_on_fastvar", "+method.knobs.policies.0.knobs.prun=1"],
     "method.knobs.policies[0].knobs.prun: fastvar has no knob 'prun'. Did you mean 'prune'?"),
    (["method=baseline", "+method.knobs.skip=1"], "method.knobs.skip: baseline has no knob 'skip'"),
    (["runtime.lock_wait_s=-5"], "runtime.lock_wait_s must be a number of seconds >= 0 (or -1: wait forever), got -5"),
    (["runtime.lock_wait_s=abc"], "runtime.lock_wait_s must be a number of seconds >= 0 (or -1: wait forever), got 'abc'"),
    (["runtime.batch_size=0"], "runtime.batch_size must be >= 1, got 0"),
    (["runtime.batch_size=-1"], "runtime.batch_size must be >= 1, got -1"),
    (["runtime.batch_size=abc"], "runtime.batch_size must be an integer"),
    (["runtime.dtype=fp16"], "runtime.dtype"),
    (["runtime.device=gpu"], "runtime.device"),
    (["timing.repeats=abc"], "timing.repeats must be an integer, got 'abc'"),
    (["timing.repeats=0"], "timing.repeats must be >= 1"),
    (["timing.batch_sizes=[0]"], "timing.batch_sizes"),
    (["generation.seed=[0,1]"], "generation.seed must be one non-negative integer"),
    (["generation.top_p=1.5"], "generation.top_p"),
    (["generation.tau=0"], "generation.tau must be > 0"),
    (["generation.cfg=abc"], "generation.cfg must be a number or a list of numbers"),
    (["generation.pn=2M"], "generation.pn must be one of"),
    # the toy's fixed schedule: a pn or aspect ratio would be recorded and hashed but not used
    (["model=toy", "generation.pn=1M"], "model=toy generates on its own fixed schedule"),
    (["model=toy", "generation.h_div_w=0.5"], "generation.h_div_w=0.5 cannot change it"),
    (["benchmark.limit=0"], "benchmark.limit must be >= 1"),
    (["benchmark.loader=genevl"], "Did you mean 'geneval'"),
    (["model=toy", "method=fastvar_generalised", "method.knobs.skip=[40]"],
     "method.knobs.skip: scale index 40 is outside the 9-scale schedule"),
    (["model=toy", "method=fastvar_generalised", "method.knobs.cache_scale=-12"],
     "method.knobs.cache_scale: scale index -12 is outside the 9-scale schedule"),
    (["method=fastvar", "method.knobs.prune={32: 1.5}"],
     "method.knobs.prune={32: 1.5, 40: 0.5}: each value must be >= 0.0 and <= 1.0, got 1.5"),
    (["method=fastvar", "method.knobs.skip=[-1]"], "addressing=width reads prune/skip/cache_scale as token-map widths"),
    (["method=fastvar_generalised", "method.knobs.skip=abc"], "method.knobs.skip='abc'"),
])
def test_bad_setting_is_named(overrides, needle):
    with pytest.raises(ConfigError) as e:
        validate_config(_cfg(*overrides))
    assert needle in str(e.value), str(e.value)


def test_timing_none_still_validates():
    validate_config(_cfg("timing=none"))


@pytest.mark.parametrize("wait", ["0", "-1", "2.5", "3600"])
def test_lock_wait_s_accepts_seconds_and_forever(wait):
    validate_config(_cfg(f"runtime.lock_wait_s={wait}"))


# -- the knob dataclasses (each policy's Knobs, checked by varbench/policies/knobs.py) ----------------
def test_every_registered_method_has_a_documented_knob_dataclass():
    """Each registered method declares its knobs (its policy's Knobs) and the dataclass's docstring
    says what every knob does."""
    import dataclasses

    from varbench.policies import REGISTRY
    from varbench.policies.knobs import SCHEMAS

    packaged = REGISTRY.packaged()
    assert all(name in SCHEMAS for name in packaged)
    for name, cls in ((n, SCHEMAS[n]) for n in packaged):
        fields = [f.name for f in dataclasses.fields(cls)]
        assert cls.__doc__ and all(k in cls.__doc__ for k in fields), f"{cls.__name__} docstring misses a knob"


def test_knob_dataclasses_are_frozen_and_check_on_construction():
    import dataclasses

    from varbench.policies.fastvar import FastVARKnobs
    from varbench.policies.nova import NOVAKnobs

    k = NOVAKnobs()
    with pytest.raises(dataclasses.FrozenInstanceError):
        k.q_sub = 3
    with pytest.raises(ConfigError, match=r"method.knobs.q_sub=0: must be >= 1 \(or null\), got 0"):
        NOVAKnobs(q_sub=0)
    with pytest.raises(ConfigError, match="method.knobs.prune=.*each value must be >= 0.0 and <= 1.0, got 1.5"):
        FastVARKnobs(prune={32: 1.5})


# -- every failure of the issue: one error naming the setting, or the file and line -------------------
def _geneval(tmp_path, monkeypatch, text):
    import varbench.harness.prompts as prompts

    monkeypatch.setattr(prompts, "_resolve_file", lambda *a, **k: ("0" * 64, None))
    f = tmp_path / "evaluation_metadata.jsonl"
    f.write_text(text)
    return f


GOOD = json.dumps({"tag": "single_object", "prompt": "a cat"})


@pytest.mark.parametrize("text, needle", [
    ("", "{f}: holds no prompts"),
    ("\n\n", "{f}: holds no prompts"),
    (GOOD + "\n" + json.dumps({"tag": "x"}) + "\n", "{f}:2: has no \"prompt\" text"),
    (GOOD + "\n" + GOOD + "\n{not json\n", "{f}:3:2 (byte "),     # line, column and byte offset (issue 40)
    (GOOD + "\n" + json.dumps(["a cat"]) + "\n", "{f}:2: has no \"prompt\" text"),
    (json.dumps({"prompt": 3}) + "\n", "{f}:1: has no \"prompt\" text"),
])
def test_bad_prompt_file_names_file_and_line(tmp_path, monkeypatch, text, needle):
    f = _geneval(tmp_path, monkeypatch, text)
    with pytest.raises(PromptSetError) as e:
        load_prompt_set({"loader": "geneval", "path": str(f)})
    assert needle.format(f=f) in str(e.value), str(e.value)


ROW = json.dumps({"prompt_index": 0, "sample_index": 0, "v": 1})


@pytest.mark.parametrize("name", ["samples_geneval.jsonl", "traces.jsonl"])
@pytest.mark.parametrize("text, needle", [
    (ROW + "\n{garbled\n" + ROW + "\n", "line 2 is not JSON"),
    ("{garbled\n", "line 1 is not JSON"),
    (ROW + "\n[1, 2]\n", "line 2 is list JSON, not an object"),
    (ROW + "\n\xff\xfe\n" + ROW + "\n", "line 2 is not JSON"),
])
def test_garbled_jsonl_names_file_and_line(tmp_path, name, text, needle):
    from varbench.core.jsonio import read_jsonl

    f = tmp_path / name
    f.write_bytes(text.encode("latin-1") if "\xff" in text else text.encode())
    with pytest.raises(ValueError) as e:
        read_jsonl(f)
    assert f"{f}: {needle}" in str(e.value), str(e.value)


@pytest.mark.parametrize("tail", ['{"prompt_index": 1, "samp', "[1, 2", "\xe2"])
def test_a_torn_last_line_is_still_dropped(tmp_path, tail):
    """A kill mid-append leaves an unterminated last line: dropped on purpose, not an error."""
    from varbench.core.jsonio import read_jsonl

    f = tmp_path / "samples_geneval.jsonl"
    f.write_bytes((ROW + "\n").encode() + tail.encode("latin-1" if tail == "\xe2" else "utf-8"))
    assert read_jsonl(f) == [json.loads(ROW)]


@pytest.mark.integration
def test_cli_refuses_a_bad_knob_before_any_compute(tmp_path):
    """`python -m varbench method=nova method.knobs.keep_multiple=2.5` on the tiny CPU model: exits
    non-zero within seconds naming the knob, its value and the allowed range; nothing is written to the
    store (no image folder, no entry)."""
    import os
    import subprocess
    import sys
    import time

    root = Path(__file__).resolve().parents[2]
    cmd = [sys.executable, "-m", "varbench", "+experiment=smoke", "model=tiny", "evaluator=[]", "timing=none",
           "logger=none", "benchmark.limit=1", "runtime.progress=false", "method=nova",
           "method.knobs.keep_multiple=2.5", f"paths.output_root={tmp_path}"]
    env = {**os.environ, "VARBENCH_STORE": str(tmp_path / "store"), "HYDRA_FULL_ERROR": "0"}
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=120)
    took = time.monotonic() - t0
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert proc.returncode == 2, out
    assert "[varbench] config error: method.knobs.keep_multiple=2.5 does not fit nova's keep_multiple: must be int >= 1" in out, out
    assert "Traceback" not in out, out                             # one line, not a stack
    assert took < 60, f"took {took:.0f}s: validation must come before any model is built"
    store = tmp_path / "store"
    assert not (store / "images").exists() and not list(store.glob("**/entries/*")), sorted(store.rglob("*"))


def test_run_job_validates_before_loading_anything(tmp_path, monkeypatch):
    import varbench.harness.job as job

    def boom(*a, **k):
        raise AssertionError("compute started")
    monkeypatch.setattr(job, "build_runtime", boom)
    monkeypatch.setattr(job, "load_prompt_set", boom)
    with pytest.raises(ConfigError, match="runtime.batch_size"):
        job.run_job(_cfg("runtime.batch_size=-1", f"paths.store_dir={tmp_path}/store"))
    assert not (tmp_path / "store").exists()


def test_empty_geneval_file_is_named(tmp_path, monkeypatch):
    import varbench.harness.prompts as prompts

    monkeypatch.setattr(prompts, "_resolve_file", lambda *a, **k: ("0" * 64, None))
    f = tmp_path / "evaluation_metadata.jsonl"
    f.write_text("")
    with pytest.raises(PromptSetError, match=f"{f}: holds no prompts"):
        load_prompt_set({"loader": "geneval", "path": str(f)})
    f.write_text(json.dumps({"tag": "single_object", "prompt": "a cat"}) + "\n" + json.dumps({"tag": "x"}) + "\n")
    with pytest.raises(PromptSetError, match=f"{f}:2: has no \"prompt\" text"):
        load_prompt_set({"loader": "geneval", "path": str(f)})


def test_imagereward_row_without_prompt_is_named(tmp_path, monkeypatch):
    import varbench.harness.prompts as prompts

    monkeypatch.setattr(prompts, "_resolve_file", lambda *a, **k: ("0" * 64, None))
    f = tmp_path / "benchmark-prompts.json"
    f.write_text(json.dumps([{"id": 1, "prompt": "a"}, {"id": 2}]))
    with pytest.raises(PromptSetError, match="entry 1 .* needs \"id\" and \"prompt\""):
        load_prompt_set({"loader": "imagereward", "path": str(f)})
    f.write_text("[]")
    with pytest.raises(PromptSetError, match="non-empty JSON list"):
        load_prompt_set({"loader": "imagereward", "path": str(f)})


def _systems_cfg(*overrides):
    from hydra import compose, initialize_config_dir

    from varbench.harness.config import validate_config

    conf = str(Path(__file__).resolve().parents[2] / "varbench" / "conf")
    with initialize_config_dir(config_dir=conf, version_base="1.3"):
        cfg = compose(config_name="config", overrides=["model=tiny", *overrides])
    return lambda: validate_config(cfg)


def test_compile_knob_is_checked_at_the_boundary():
    from varbench.core.errors import BadSettingError, IncompatibleSettingsError

    _systems_cfg("runtime.compile=default", "runtime.compile_fullgraph=true")()   # accepted
    with pytest.raises(BadSettingError, match=r"runtime.compile must be one of off, default, reduce-overhead, max-autotune"):
        _systems_cfg("runtime.compile=fast")()
    with pytest.raises(BadSettingError, match="runtime.compile_fullgraph must be true or false"):
        _systems_cfg("runtime.compile=default", "runtime.compile_fullgraph=maybe")()
    with pytest.raises(IncompatibleSettingsError, match="use runtime.cuda_graphs=auto"):
        _systems_cfg("runtime.compile=reduce-overhead", "runtime.cuda_graphs=true")()
    with pytest.raises(IncompatibleSettingsError, match="HART.*use runtime.compile=off"):
        _systems_cfg("model=hart_tiny", "method=fastvar_hart", "runtime.compile=default")()


def test_quant_and_attn_backend_are_checked_at_the_boundary():
    import importlib.util

    from varbench.core.errors import BadSettingError, IncompatibleSettingsError

    with pytest.raises(BadSettingError, match="runtime.quant must be one of none, int8_weight_only, fp8_dynamic"):
        _systems_cfg("runtime.quant=int4")()
    with pytest.raises(BadSettingError, match="fp8_dynamic needs a CUDA GPU.*use runtime.quant=int8_weight_only"):
        _systems_cfg("runtime.device=cpu", "runtime.quant=fp8_dynamic")()
    if importlib.util.find_spec("torchao") is None:
        with pytest.raises(BadSettingError, match=r"needs torchao.*pip install 'torchao==0.18.0'"):
            _systems_cfg("runtime.device=cpu", "runtime.quant=int8_weight_only")()
    else:
        _systems_cfg("runtime.device=cpu", "runtime.quant=int8_weight_only")()
        with pytest.raises(IncompatibleSettingsError, match="HART.*use runtime.quant=none"):
            _systems_cfg("model=hart_tiny", "method=fastvar_hart", "runtime.device=cpu", "runtime.quant=int8_weight_only")()
    _systems_cfg("runtime.device=cpu", "runtime.attn_backend=math")()
    with pytest.raises(BadSettingError, match="attn_backend=efficient has no CPU kernel"):
        _systems_cfg("runtime.device=cpu", "runtime.attn_backend=efficient")()
    with pytest.raises(BadSettingError, match="runtime.attn_backend must be one of"):
        _systems_cfg("runtime.attn_backend=sdpa")()
