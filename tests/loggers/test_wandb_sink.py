"""W&B sink: the summary a record maps to, and how a run is opened (mocked wandb). Real offline
runs of a job and of ``python -m varbench.publish`` are in tests/loggers/test_publish.py."""
from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

import varbench
from varbench.loggers.wandb import NullSink, WandbSink, summary_from_record

RECORD = {
    "entry_id": "0123456789abcdef", "generation_id": "g", "config": {"method": {"name": "nova"}},
    "model": {"name": "infinity_2b"}, "method": {"name": "nova", "label": "nova a=0.5"},
    "benchmark": {"name": "geneval"},
    "metrics": {"geneval/overall": 0.7, "hpsv2/score": 0.31}, "uncertainty": {"geneval/overall": 0.02},
    "timing": {"by_batch": {"1": {"ar_ms": {"median": 40.0}, "total_ms": {"median": 55.0},
                                  "images_per_s": 18.0, "peak_mem_bytes": 3 * 2**30}}},
    "flops": {"total": 2e12, "ar": 1.8e12, "text_encoder": 1e11, "vae_decode": 3e11, "end_to_end": 2.4e12},
    "wall_s": 12.0,
}


def test_summary_flattening():
    s = summary_from_record(RECORD)
    assert s["geneval/overall"] == 0.7 and s["geneval/overall_err"] == 0.02 and "hpsv2/score_err" not in s
    assert s["timing/bs1/ar_ms"] == 40.0 and s["timing/bs1/peak_mem_gb"] == 3.0
    assert s["flops/total"] == 2e12 and s["wall_s"] == 12.0
    assert s["flops/end_to_end"] == 2.4e12 and s["flops/vae_decode"] == 3e11 and s["flops/text_encoder"] == 1e11
    old = summary_from_record({**RECORD, "flops": {"total": 2e12, "ar": 1.8e12, "end_to_end": None}})
    assert "flops/end_to_end" not in old and old["flops/total"] == 2e12    # not counted: absent, never 0


class _FakeRun:
    def __init__(self, kwargs):
        self.kwargs = kwargs
        self.summary = {}
        self.logged = []
        self.artifacts = []
        self.finished = False
        self.id = f"run{len(_FakeWandb.runs)}"

    def log(self, data):
        self.logged.append(data)

    def log_artifact(self, art):
        self.artifacts.append(art)

    def finish(self):
        self.finished = True


class _FakeWandb(types.SimpleNamespace):
    runs: list = []


def _fake_module():
    mod = types.ModuleType("wandb")
    _FakeWandb.runs = []

    def init(**kwargs):
        run = _FakeRun(kwargs)
        _FakeWandb.runs.append(run)
        return run

    mod.init = init
    mod.Settings = lambda **kw: kw
    mod.Table = lambda columns, data: ("table", columns, data)
    mod.Image = lambda img, caption=None: ("image", caption)

    class Artifact:
        def __init__(self, name, type):
            self.name, self.type, self.files = name, type, []

        def add_file(self, path):
            self.files.append(open(path).read())  # read now: the temp dir goes away after logging

    mod.Artifact = Artifact
    return mod


def test_bad_mode_and_logger_none():
    from omegaconf import OmegaConf

    from varbench.loggers.publish import sink_from_cfg

    with pytest.raises(ValueError, match="logger.mode"):
        WandbSink(mode="offlne")
    none_cfg = OmegaConf.load(Path(varbench.__file__).parent / "conf" / "logger" / "none.yaml")
    assert none_cfg._target_.endswith(NullSink.__name__) and sink_from_cfg(none_cfg) is None


def test_bad_mode_is_a_config_error_naming_the_fix():
    from varbench.core.errors import ConfigError

    with pytest.raises(ConfigError, match=r"WANDB_MODE=offline"):
        WandbSink(mode="bogus")


def test_init_failure_is_a_config_error_naming_the_fix(monkeypatch, tmp_path):
    from varbench.core.errors import ConfigError

    mod = _fake_module()

    def init(**kwargs):
        raise RuntimeError("No API key configured. Use `wandb login` to log in.")

    mod.init = init
    monkeypatch.setitem(sys.modules, "wandb", mod)
    sink = WandbSink(mode="online", dir=tmp_path)
    with pytest.raises(ConfigError, match=r"wandb login.*WANDB_MODE=offline"):
        sink.init_run(name="n", job_type="j")


def test_init_run_passes_group_tags_and_timeout(monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", _fake_module())
    run = WandbSink(mode="offline", group="exp", tags=["t"], init_timeout=7).init_run(
        name="n", job_type="sweep", config={"a": 1}, tags=["sweep", None], group="other")
    kw = run.kwargs
    assert kw["group"] == "other" and kw["tags"] == ["sweep", "t"] and kw["settings"]["init_timeout"] == 7.0
    assert kw["config"] == {"a": 1} and kw["reinit"] == "finish_previous"
