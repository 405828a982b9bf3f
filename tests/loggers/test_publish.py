"""varbench.loggers.publish: real offline W&B runs (no network) read back from their .wandb files.

Two real tiny jobs (the toy model, 3 prompts, toy GenEval: the baseline and skip_last_2, whose
score drops to 0) make a store once per module; each test copies it, so markers never leak."""
from __future__ import annotations

import hashlib
import json
import shutil
import types
from pathlib import Path

import pytest

pytest.importorskip("wandb")

from varbench.loggers.offline import check, read_log, records, references, run_file, write_log  # noqa: E402
from varbench.loggers.publish import MARKER, SWEEP_MARKER, JobRun, main, republish, tables_digest  # noqa: E402

from varbench.core.errors import ConfigError  # noqa: E402
from varbench.testing.jobs import job_config  # noqa: E402

#: the results folder of the toy model's records (varbench.analysis.layout.group_dir_name("toy", "64x64"))
TOY = "toy-64px"



def _cfg(tmp, *extra):
    return job_config(tmp, "model=toy", "benchmark=toy", "evaluator=[toy_geneval]", "benchmark.limit=3",
                      "benchmark.samples_per_prompt=1", "runtime.batch_size=3", "runtime.progress=false",
                      "timing.repeats=2", "timing.warmup=0", "experiment_name=exp", *extra)


# -- reading an offline run back (varbench.loggers.offline reads the .wandb log of protobuf records) ----
def read_run(run_dir: Path) -> dict:
    out = {"summary": {}, "config": {}, "history": [], "exit_code": None, "artifacts": {}}

    def key(u):
        return u.key or "/".join(u.nested_key)

    for r in records(run_dir):
        kind = r.WhichOneof("record_type")
        if kind == "run":
            out.update(id=r.run.run_id, name=r.run.display_name, group=r.run.run_group, job_type=r.run.job_type,
                       tags=list(r.run.tags))
            out["config"].update({key(u): json.loads(u.value_json) for u in r.run.config.update})
        elif kind == "config":
            out["config"].update({key(u): json.loads(u.value_json) for u in r.config.update})
        elif kind == "summary":
            out["summary"].update({key(u): json.loads(u.value_json) for u in r.summary.update})
        elif kind == "history":
            out["history"].append({key(it): json.loads(it.value_json) for it in r.history.item})
        elif kind == "artifact":
            out["artifacts"][r.artifact.name] = [(c.path, c.local_path) for c in r.artifact.manifest.contents]
        elif kind == "exit":
            out["exit_code"] = r.exit.exit_code
    return out


def runs_in(wb_dir: Path, wait_s: float = 15.0) -> list[dict]:
    """Every offline run under ``wb_dir``; waits (up to ``wait_s``) for W&B's service to flush each
    finished run's exit record to its file."""
    import time

    deadline = time.monotonic() + wait_s
    while True:
        runs = [read_run(d) for d in sorted(Path(wb_dir).glob("wandb/offline-run-*"))]
        if all(r["exit_code"] is not None for r in runs) or time.monotonic() > deadline:
            return runs
        time.sleep(0.2)


def _table(run: dict, name: str) -> dict:
    """A logged table's JSON, from the run's table artifact (``run-<id>-<name>``; a key with ``/``
    is named without them plus a suffix, ``run-<id>-toy-64pxtable-47eHwA``, its file keeps the key)."""
    plain = f"run-{run['id']}-{name}"
    keys = [k for k in run["artifacts"] if k == plain or ("/" in name and k.startswith(plain.replace("/", "") + "-"))]
    assert len(keys) == 1, (name, sorted(run["artifacts"]))
    files = dict(run["artifacts"][keys[0]])
    return json.loads(Path(files[f"{name}.table.json"]).read_text())


# -- fixtures ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def toy_store(tmp_path_factory):
    from varbench.harness.job import run_job

    root = tmp_path_factory.mktemp("toy")
    base = run_job(_cfg(root))
    method = run_job(_cfg(root, "method=skip_last_2"))
    for e in (base, method):          # a store as logger=none leaves it: nothing published
        (e / MARKER).unlink(missing_ok=True)
    return root, base.name, method.name


@pytest.fixture
def store(toy_store, tmp_path):
    """A private copy of the toy store: (tmp root, baseline entry dir, method entry dir)."""
    root, b, m = toy_store
    shutil.copytree(root / "store", tmp_path / "store")
    entries = tmp_path / "store" / "exp" / "entries"
    return tmp_path, entries / b, entries / m


@pytest.fixture
def wb(offline_wandb):
    """Offline W&B (tests/loggers/conftest.py); runs under ``wb/``."""
    return offline_wandb / "wb"


def _job(root, *extra):
    from varbench.harness.job import prepare_job

    return prepare_job(_cfg(root, "logger=wandb", f"logger.dir={root}/wb", *extra))


# -- a job's run ---------------------------------------------------------------------------------
@pytest.mark.integration
def test_job_run_streams_progress_and_ends_with_paired_speedup_and_delta(store, wb):
    root, base_dir, method_dir = store
    job = _job(root, "method=skip_last_2")
    assert job.entry.dir == method_dir
    run = JobRun.open(job)
    assert run.active and list(wb.glob("wandb/offline-run-*"))            # open before any compute
    run.progress("generate", 1, 3)
    run.progress("generate", 3, 3)                                        # a stage's end always logs
    seen = []
    bar = run.wrap(types.SimpleNamespace(update=seen.append, close=lambda: seen.append("closed"), n=0), "score toy", 2)
    bar.update(1)
    bar.update(1)
    bar.close()
    assert seen == [1, 1, "closed"] and bar.n == 0                          # the bar still gets everything
    record = job.entry.read()
    base = json.loads((base_dir / "record.json").read_text())
    run.finish(job, record)

    [r] = runs_in(wb)
    s = r["summary"]
    assert r["exit_code"] == 0 and r["group"] == "exp" and r["job_type"] == "skip_last"
    [folder] = wb.glob("wandb/offline-run-*")                            # self-contained: it can be carried off
    assert check(folder) == [] and all(Path(x.local_path).is_relative_to(folder.resolve()) for x in references(folder))
    assert {"skip_last", "toy"} <= set(r["tags"])
    assert r["config"]["varbench"]["entry_id"] == method_dir.name
    assert r["config"]["generation"]["seed"] == 0                         # the resolved config
    assert any(h.get("progress/generate") == 1.0 for h in r["history"])
    assert any(h.get("progress/score/toy") == 1.0 and h.get("progress/score/toy_done") == 2 for h in r["history"])
    assert s["paired/status"] == "paired" and s["paired/baseline_entry"] == base_dir.name
    assert s["paired/speedup_ci_low"] <= s["paired/speedup"] <= s["paired/speedup_ci_high"]
    # value: CPU noise here; paired repeats over every timed prompt (timing.repeats per prompt)
    tm = record["timing"]
    assert s["paired/speedup"] > 0 and s["paired/n_repeats"] == tm["n_prompts"] * 2 and "paired/speedup_reliable" in s
    assert s["paired/flops_x"] > s["paired/flops_x_e2e"] > 1                 # the shared decode dilutes it
    assert s["flops/end_to_end"] == record["flops"]["end_to_end"] > s["flops/total"]
    delta = record["metrics"]["toy_geneval/overall"] - base["metrics"]["toy_geneval/overall"]
    assert delta < 0 and s["toy_geneval/overall_delta"] == pytest.approx(delta)
    assert s["toy_geneval/overall"] == record["metrics"]["toy_geneval/overall"]
    assert s["timing/bs1/ar_ms"] == record["timing"]["by_batch"]["1"]["ar_ms"]["median"]

    per_image = _table(r, "per_image")
    cols = per_image["columns"]
    assert cols[:5] == ["image", "prompt", "tag", "prompt_index", "sample_index"] and "toy_geneval/correct" in cols
    assert [row[cols.index("prompt_index")] for row in per_image["data"]] == [0, 1, 2]
    assert per_image["data"][0][1] == job.prompt_set.items[0].prompt
    assert sum(p.endswith(".png") for p, _ in r["artifacts"][f"run-{r['id']}-per_image"]) == 3   # the images
    per_scale = _table(r, "per_scale")
    ran = [row[per_scale["columns"].index("ran_frac")] for row in per_scale["data"]]
    assert ran[-2:] == [0.0, 0.0] and ran[0] == 1.0                        # skip_last_2 skips the last two
    assert f"record-{method_dir.name}" in r["artifacts"]

    marker = json.loads((method_dir / MARKER).read_text())
    assert marker["id"] == r["id"] and marker["mode"] == "offline"
    job.entry.verify()                                                    # the marker is outside the seal
    republish(job, record)                                                # published: nothing more
    assert len(runs_in(wb)) == 1


@pytest.mark.integration
def test_without_a_finished_baseline_the_summary_says_so(store, wb):
    root, base_dir, method_dir = store
    shutil.rmtree(base_dir)
    job = _job(root, "method=skip_last_2")
    run = JobRun.open(job)
    run.finish(job, job.entry.read())
    [r] = runs_in(wb)
    assert r["summary"]["paired/status"].startswith("no baseline record finished yet")
    assert r["summary"]["paired/speedup"] > 0                           # the in-job paired timing is the record's own
    assert not any(k.endswith("_delta") for k in r["summary"]) and "paired/flops_x" not in r["summary"]


@pytest.mark.integration
def test_a_wandb_error_in_finish_leaves_no_marker_and_the_next_launch_publishes(store, wb, monkeypatch, capsys):
    import wandb

    root, _, method_dir = store
    job = _job(root, "method=skip_last_2")
    run = JobRun.open(job)
    real_table = wandb.Table

    def broken(*a, **k):
        raise wandb.Error("upload refused")

    monkeypatch.setattr(wandb, "Table", broken)
    run.finish(job, job.entry.read())                                    # never raises
    assert "the record is finished and safe" in capsys.readouterr().out
    assert not (method_dir / MARKER).exists()
    assert runs_in(wb)[0]["exit_code"] == 1

    monkeypatch.setattr(wandb, "Table", real_table)
    republish(job, job.entry.read())                                      # the skip path of the next launch
    assert (method_dir / MARKER).exists() and len(runs_in(wb)) == 2


@pytest.mark.integration
def test_fail_marks_the_run_failed(store, wb):
    root, _, method_dir = store
    job = _job(root, "method=skip_last_2")
    run = JobRun.open(job)
    run.fail(RuntimeError("out of memory"))
    run.finish(job, None)                                                 # already ended: no-op
    [r] = runs_in(wb)
    assert r["exit_code"] == 1 and r["summary"]["error"] == "RuntimeError: out of memory"
    assert not (method_dir / MARKER).exists()


def _bare_job(tmp_path, *extra):
    cfg = _cfg(tmp_path, *extra)
    return types.SimpleNamespace(cfg=cfg)


def test_bad_mode_fails_at_open_naming_the_fix(wb, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "bogus")
    with pytest.raises(ConfigError, match=r"WANDB_MODE=offline") as e:
        JobRun.open(_bare_job(tmp_path, "logger=wandb", f"logger.dir={wb}"))
    assert "'bogus'" in str(e.value)
    assert not wb.exists()


def test_online_without_api_key_fails_at_open_naming_the_fix(wb, tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))                                 # no ~/.netrc
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(home / ".config" / "wandb"))
    monkeypatch.setenv("WANDB_MODE", "online")
    from varbench.harness.job import prepare_job

    job = prepare_job(_cfg(tmp_path, "logger=wandb", f"logger.dir={wb}", "logger.init_timeout=5"))
    with pytest.raises(ConfigError, match=r"wandb login") as e:
        JobRun.open(job)
    assert "WANDB_MODE=offline" in str(e.value)


@pytest.mark.integration
def test_logger_none_does_nothing(store, wb):
    root, _, method_dir = store
    from varbench.harness.job import prepare_job

    job = prepare_job(_cfg(root, "method=skip_last_2"))
    run = JobRun.open(job)
    assert not run.active
    run.progress("generate", 1, 2)
    bar = object()
    assert run.wrap(bar, "generate", 2) is bar
    run.finish(job, job.entry.read())
    run.fail(RuntimeError("x"))
    republish(job, job.entry.read())
    assert not (method_dir / MARKER).exists() and not wb.exists()


@pytest.mark.integration
def test_disabled_mode_publishes_nothing_and_writes_no_marker(store, wb, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    root, _, method_dir = store
    job = _job(root, "method=skip_last_2")
    JobRun.open(job).finish(job, job.entry.read())
    assert not (method_dir / MARKER).exists()


# -- later, from the records alone -------------------------------------------------------------
@pytest.mark.integration
def test_cli_publishes_each_record_once_and_the_sweep_table(store, wb, capsys):
    root, base_dir, method_dir = store
    args = [str(root / "store" / "exp"), "--mode", "offline", "--dir", str(wb), "--results", str(root / "res")]
    assert main(args) == 0
    runs = runs_in(wb)
    by_type = {r["job_type"]: r for r in runs}
    assert len(runs) == 3 and set(by_type) == {"baseline", "skip_last", "sweep"}
    assert (base_dir / MARKER).exists() and (method_dir / MARKER).exists()
    s = by_type["skip_last"]["summary"]
    overall = [json.loads((d / "record.json").read_text())["metrics"]["toy_geneval/overall"] for d in (method_dir, base_dir)]
    assert s["paired/status"] == "paired" and s["toy_geneval/overall_delta"] == pytest.approx(overall[0] - overall[1])
    assert by_type["baseline"]["summary"]["paired/status"] == "is baseline"
    per_image = _table(by_type["skip_last"], "per_image")
    assert per_image["data"][0][1]                                       # prompts from the image store's metadata
    sweep = by_type["sweep"]
    assert sweep["group"] == "exp" and sweep["exit_code"] == 0
    table = _table(sweep, f"{TOY}/table")                                # each group's table under its name
    assert "paired_speedup" in table["columns"] and len(table["data"]) == 2
    assert "| baseline |" in sweep["summary"]["table_md"] and f"## {TOY}" in sweep["summary"]["table_md"]
    assert any(k.startswith(f"{TOY}/figures/speed_vs_toy_geneval") for k in sweep["summary"])
    assert any(k.startswith(f"{TOY}/qualitative/image_grid") for k in sweep["summary"])
    assert (root / "res" / TOY / "table.md").exists() and (root / "res" / "tidy.csv").exists()
    capsys.readouterr()

    assert main(args) == 0                                                # again: everything skipped
    out = capsys.readouterr().out
    assert out.count("skip (published)") == 2 and "logged already" in out
    assert len(runs_in(wb)) == 3


@pytest.mark.integration
def test_cli_bad_mode_exits_2(store, wb, capsys):
    root, _, _ = store
    assert main([str(root / "store" / "exp"), "--mode", "bogus", "--dir", str(wb)]) == 2
    err = capsys.readouterr().err
    assert "--mode" in err and "online, offline, disabled" in err and "logger.mode" not in err  # this CLI's option


@pytest.mark.integration
def test_cli_disabled_mode_does_not_say_published(store, wb, capsys):
    root, base_dir, _ = store
    assert main([str(root / "store" / "exp"), "--mode", "disabled", "--dir", str(wb), "--no-sweep"]) == 0
    out = capsys.readouterr().out
    assert "2 checked, nothing published (W&B disabled)" in out and "] published" not in out
    assert not (base_dir / MARKER).exists()


# -- the sweep run at the end of a sweep -------------------------------------------------------
@pytest.mark.integration
def test_aggregate_experiment_logs_the_sweep_run_and_survives_a_wandb_failure(store, wb, monkeypatch, capsys):
    from varbench.cli.callbacks import aggregate_experiment
    from varbench.loggers.wandb import WandbSink

    root, _, _ = store
    cfg = _cfg(root, "logger=wandb", f"logger.dir={wb}")
    result = aggregate_experiment(cfg)
    out = result.out
    assert [g.folder for g in result.groups] == [out / TOY]
    assert (out / TOY / "table.csv").exists() and (out / TOY / "image_grid.png").exists()
    [r] = runs_in(wb)
    assert r["job_type"] == "sweep" and any(k.startswith(f"{TOY}/table/") for k in r["summary"])
    marker = root / "store" / "exp" / SWEEP_MARKER      # written by the end-of-sweep run too, not only by publish
    want = hashlib.sha256(TOY.encode() + b"\0" + (out / TOY / "table.csv").read_bytes() + b"\0").hexdigest()
    assert json.loads(marker.read_text())["table_sha256"] == tables_digest(out) == want
    assert main([str(root / "store" / "exp"), "--mode", "offline", "--dir", str(wb), "--results", str(out)]) == 0
    assert "this table was logged already" in capsys.readouterr().out
    assert len([x for x in runs_in(wb) if x["job_type"] == "sweep"]) == 1   # publish did not log the sweep again

    def refuse(self, **kw):
        raise ConfigError("no network")

    monkeypatch.setattr(WandbSink, "init_run", refuse)
    assert aggregate_experiment(cfg).out == out                          # the table still comes out
    assert "W&B sweep run not logged" in capsys.readouterr().out


# -- the job's wiring (varbench/cli/run.py subscribes W&B to the job's hooks) -------------------------
@pytest.mark.integration
def test_run_job_with_logger_wandb_offline_publishes_the_paired_summary(toy_store, tmp_path, wb):
    from varbench.cli.run import run

    root, base_name, method_name = toy_store
    shutil.copytree(root / "store", tmp_path / "store")
    shutil.rmtree(tmp_path / "store" / "exp" / "entries" / method_name)  # the method job runs for real
    entry = run(_cfg(tmp_path, "method=skip_last_2", "logger=wandb", f"logger.dir={wb}"))
    runs = [r for r in runs_in(wb) if r["job_type"] == "skip_last"]
    assert len(runs) == 1 and runs[0]["exit_code"] == 0
    s = runs[0]["summary"]
    assert s["paired/status"] == "paired" and s["paired/baseline_entry"] == base_name
    assert "toy_geneval/overall_delta" in s and s["paired/speedup"] > 0
    assert any(h.get("progress/timing") == 1.0 for h in runs[0]["history"])   # the images were stored already
    assert (entry / MARKER).exists()


@pytest.mark.integration
def test_a_job_that_finds_its_entry_finished_after_waiting_opens_no_run(store, wb, monkeypatch):
    """Another job finished the entry while this one waited for its lock: this job skips it and,
    because the run opens only inside the lock, leaves no empty W&B run behind (it used to)."""
    import varbench.harness.job as job_module
    from varbench.cli.run import run

    root, base, _ = store
    (base / MARKER).write_text("{}")                  # published already: the skip republishes nothing
    real = job_module._finished
    calls = []

    def finished_after_the_wait(job):                 # not finished when the job starts; finished once it has the lock
        calls.append(1)
        return False if len(calls) == 1 else real(job)

    monkeypatch.setattr(job_module, "_finished", finished_after_the_wait)
    entry = run(_cfg(root, "logger=wandb", f"logger.dir={wb}"))
    assert entry == base and len(calls) == 2
    assert runs_in(wb) == []


# -- offline runs that travel (copied off an air-gapped node, relocated, then `wandb sync`) ----------
def _sha(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _staged(run: dict, artifact: str, name: str) -> Path:
    return Path(dict(run["artifacts"][artifact])[name])


@pytest.mark.integration
def test_offline_runs_travel_every_file_they_name_moves_with_the_folder(store, wb, tmp_path, capsys):
    """Both job runs and the sweep run, logged offline as on an air-gapped node, are moved to
    another folder with W&B's own data and cache folders gone; after ``--relocate`` every file
    their .wandb names is inside the moved folder with the bytes that were logged, and the same
    holds after a second move."""
    import numpy as np
    from PIL import Image

    from varbench.harness.store import ImageStore

    root, base_dir, method_dir = store
    res = root / "res"
    assert main([str(root / "store" / "exp"), "--mode", "offline", "--dir", str(wb), "--results", str(res),
                 "--log-images", "-1"]) == 0
    assert all(r["exit_code"] == 0 for r in runs_in(wb))          # waits until every file is complete
    assert not [p for p in (tmp_path / "wbdata").rglob("*") if p.is_file()]   # nothing staged in W&B's data dir
    before = {}
    for d in wb.glob("wandb/offline-run-*"):
        refs = references(d)
        assert refs and all(Path(r.local_path).is_relative_to(d.resolve()) for r in refs)
        before[d.name] = {(r.artifact, r.name): _sha(r.local_path) for r in refs}
        f = run_file(d)                      # varbench's writer frames records exactly as wandb-core does
        assert write_log(read_log(f)) == f.read_bytes()
    assert len(before) == 3

    carried = tmp_path / "elsewhere" / "wandb"                     # carried off the node
    carried.parent.mkdir()
    shutil.move(str(wb / "wandb"), str(carried))
    for gone in ("wbdata", "wbcache"):
        shutil.rmtree(tmp_path / gone, ignore_errors=True)
    moved = sorted(carried.glob("offline-run-*"))
    stale = [p for d in moved for p in check(d)]
    assert stale and all("is missing" in p and "--relocate" in p for p in stale)   # they still name the old place

    capsys.readouterr()
    assert main(["--relocate", str(carried)]) == 0
    out = capsys.readouterr().out
    assert "3 of 3 run(s) ready" in out and "pointed here" in out
    for d in moved:
        assert check(d) == []
        refs = references(d)
        assert all(Path(r.local_path).is_relative_to(d.resolve()) for r in refs)
        assert {(r.artifact, r.name): _sha(r.local_path) for r in refs} == before[d.name]
        for rec in records(d):                                      # metrics, media, console: under files/
            if rec.WhichOneof("record_type") == "files":
                assert all((d / "files" / f.path).is_file() for f in rec.files.files)

    runs = {r["job_type"]: r for r in (read_run(d) for d in moved)}
    method = runs["skip_last"]
    record = json.loads((method_dir / "record.json").read_text())
    logged = json.loads(_staged(method, f"record-{method_dir.name}", "record.json").read_text())
    assert logged == record                                         # record.json as the store holds it
    per_image = _table(method, "per_image")                         # read from the moved folder
    images = ImageStore(root / "store", record["generation_id"])
    art = f"run-{method['id']}-per_image"
    col = per_image["columns"]
    for row in per_image["data"]:
        cell = row[0]
        png = _staged(method, art, cell["path"])
        assert _sha(png) == cell["sha256"]                          # the bytes W&B logged for that cell
        stored = images.load(row[col.index("prompt_index")], row[col.index("sample_index")])
        assert np.array_equal(np.asarray(Image.open(png).convert("RGB")), np.asarray(stored.convert("RGB")))
    assert len(per_image["data"]) == 3
    sweep = runs["sweep"]
    assert _sha(_staged(sweep, "table-exp", f"{TOY}/table.csv")) == _sha(res / TOY / "table.csv")   # per group folder

    again = tmp_path / "third"                                      # moved once more: relocate again
    shutil.move(str(carried), str(again))
    assert main(["--relocate", *map(str, again.glob("offline-run-*"))]) == 0
    assert all(check(d) == [] for d in again.glob("offline-run-*"))
    frozen = {d: run_file(d).read_bytes() for d in again.glob("offline-run-*")}
    capsys.readouterr()
    assert main(["--relocate", str(again)]) == 0                    # nothing left to change
    assert "paths already point here" in capsys.readouterr().out
    assert all(run_file(d).read_bytes() == b for d, b in frozen.items())
