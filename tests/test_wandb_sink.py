"""W&B sink: what a run receives (mocked wandb), and real offline/disabled runs (no network)."""
from __future__ import annotations

import sys
import types

import pytest
from PIL import Image

from varbench.wandb_sink import NullSink, WandbSink, summary_from_record

RECORD = {
    "entry_id": "0123456789abcdef", "generation_id": "g", "config": {"method": {"name": "nova"}},
    "model": {"name": "infinity_2b"}, "method": {"name": "nova", "label": "nova a=0.5"},
    "benchmark": {"name": "geneval"},
    "metrics": {"geneval/overall": 0.7, "hpsv2/score": 0.31}, "uncertainty": {"geneval/overall": 0.02},
    "timing": {"by_batch": {"1": {"ar_ms": {"median": 40.0}, "total_ms": {"median": 55.0},
                                  "images_per_s": 18.0, "peak_mem_bytes": 3 * 2**30}}},
    "flops": {"total": 2e12, "ar": 1.8e12}, "wall_s": 12.0,
}
ROWS = [{"scale": 0, "h": 1, "w": 1, "ms": 0.5, "flops": 1e9}, {"scale": 1, "h": 2, "w": 2, "ms": 0.7, "flops": 4e9}]


def test_summary_flattening():
    s = summary_from_record(RECORD)
    assert s["geneval/overall"] == 0.7 and s["geneval/overall_err"] == 0.02 and "hpsv2/score_err" not in s
    assert s["timing/bs1/ar_ms"] == 40.0 and s["timing/bs1/peak_mem_gb"] == 3.0
    assert s["flops/total"] == 2e12 and s["wall_s"] == 12.0


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


def test_publish_creates_and_finishes_one_run_per_call(monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", _fake_module())
    sink = WandbSink(mode="offline", project="p", group="exp", tags=["t"])
    info = sink.publish(RECORD, ROWS, [("a cat", Image.new("RGB", (4, 4)))])
    sink.publish(RECORD, [], [])
    assert len(_FakeWandb.runs) == 2 and all(r.finished for r in _FakeWandb.runs)
    run = _FakeWandb.runs[0]
    kw = run.kwargs
    assert kw["mode"] == "offline" and kw["group"] == "exp" and kw["reinit"] == "finish_previous"
    assert kw["job_type"] == "nova" and set(kw["tags"]) == {"t", "nova", "infinity_2b"}
    assert kw["config"]["varbench"]["entry_id"] == RECORD["entry_id"]
    assert run.summary["geneval/overall"] == 0.7 and run.summary["timing/bs1/ar_ms"] == 40.0
    table = next(d["per_scale"] for d in run.logged if "per_scale" in d)
    assert table[1] == ["scale", "h", "w", "ms", "flops"] and table[2][1] == [1, 2, 2, 0.7, 4e9]
    assert any("samples" in d for d in run.logged)
    assert run.artifacts and '"entry_id": "0123456789abcdef"' in run.artifacts[0].files[0]
    assert info["summary"] == run.summary and info["id"] == "run0"


def test_run_is_finished_even_if_logging_fails(monkeypatch):
    mod = _fake_module()
    mod.Table = lambda **kw: (_ for _ in ()).throw(RuntimeError("boom"))
    monkeypatch.setitem(sys.modules, "wandb", mod)
    with pytest.raises(RuntimeError, match="boom"):
        WandbSink(mode="offline").publish(RECORD, ROWS, [])
    assert _FakeWandb.runs[0].finished


def test_bad_mode_and_null_sink():
    with pytest.raises(ValueError, match="logger.mode"):
        WandbSink(mode="offlne")
    assert NullSink().publish(RECORD, ROWS, []) is None


@pytest.fixture
def real_wandb(monkeypatch, tmp_path):
    pytest.importorskip("wandb")
    for var in ("WANDB_MODE", "WANDB_DIR", "WANDB_RUN_ID", "WANDB_RESUME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("WANDB_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "config"))


def test_offline_writes_a_run_dir(real_wandb, tmp_path):
    sink = WandbSink(mode="offline", project="varbench-test", dir=tmp_path)
    a = sink.publish(RECORD, ROWS, [("a cat", Image.new("RGB", (8, 8), (255, 0, 0)))])
    b = sink.publish(RECORD, ROWS, [])
    assert a["id"] != b["id"]  # sequential jobs in one process never merge
    files = sorted((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert {f.stem for f in files} == {f"run-{a['id']}", f"run-{b['id']}"}


def test_disabled_mode_writes_nothing(real_wandb, tmp_path):
    info = WandbSink(mode="disabled", dir=tmp_path).publish(RECORD, ROWS, [])
    assert info["summary"]["hpsv2/score"] == 0.31 and info["dir"] is None
    assert not (tmp_path / "wandb").exists()


def test_bad_mode_is_a_config_error_naming_the_fix():
    from varbench.validate import ConfigError

    with pytest.raises(ConfigError, match=r"WANDB_MODE=offline"):
        WandbSink(mode="bogus")


def test_init_failure_is_a_config_error_naming_the_fix(monkeypatch, tmp_path):
    from varbench.validate import ConfigError

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
