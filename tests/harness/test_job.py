"""The job runner end to end on the tiny model: record, skip on relaunch, image reuse, resume."""
import json
from pathlib import Path

import pytest

from varbench.harness.job import run_job
from varbench.testing.jobs import job_config


def _cfg(tmp_path, *extra):
    return job_config(tmp_path, "evaluator=[fidelity]", "benchmark.limit=3", "runtime.batch_size=2",
                      "runtime.progress=false", "timing.repeats=2", "timing.warmup=0", *extra)


@pytest.mark.integration
def test_record_then_skip_then_reuse_then_resume(tmp_path, capsys):
    cfg = _cfg(tmp_path)
    entry = run_job(cfg)
    rec = json.loads((entry / "record.json").read_text())
    assert (entry / "DONE").exists()
    assert rec["metrics"]["fidelity/ssim"] == pytest.approx(1.0)          # baseline vs itself
    assert rec["benchmark"]["n_prompts"] == 3 and len(rec["benchmark"]["sha256"]) == 64
    assert rec["timing"]["repeats"] == 2 and rec["timing"]["by_batch"]["1"]["ar_ms"]["median"] > 0
    assert len(rec["flops"]["per_scale"]) == 10 and rec["flops"]["total"] > rec["flops"]["ar"] > 0
    assert rec["provenance"]["git"] is not None
    traces = [json.loads(line) for line in (entry / "traces.jsonl").read_text().splitlines()]
    assert len(traces) == 3 and len(traces[0]["scales"]) == 10
    out = capsys.readouterr().out
    assert "images: 3 generated" in out

    before = (entry / "record.json").stat().st_mtime_ns
    assert run_job(cfg) == entry                                           # finished: skipped
    assert (entry / "record.json").stat().st_mtime_ns == before
    assert "skip (finished)" in capsys.readouterr().out

    # another experiment with the same generation settings reuses the stored images
    other = run_job(_cfg(tmp_path, "experiment_name=other"))
    assert other != entry and "images: 0 generated" in capsys.readouterr().out

    # a crash before DONE: the entry resumes, generating only what is missing
    (other / "DONE").unlink()
    (other / "record.json").unlink()
    rec_images = Path(tmp_path / "store" / "images" / rec["generation_id"])
    (rec_images / "00001" / "samples" / "0000.png").unlink()
    run_job(_cfg(tmp_path, "experiment_name=other"))
    assert "images: 1 generated" in capsys.readouterr().out
    assert (other / "DONE").exists()


@pytest.mark.integration
def test_a_method_run_pairs_with_its_baseline_in_the_table(tmp_path):
    from varbench.cli.callbacks import aggregate_experiment

    run_job(_cfg(tmp_path, "experiment_name=pair"))
    run_job(_cfg(tmp_path, "experiment_name=pair", "method=skip_last_2"))
    result = aggregate_experiment(_cfg(tmp_path, "experiment_name=pair"))
    [g] = result.groups                                   # one model and resolution: one folder
    assert g.folder.parent == tmp_path / "results" / "pair"
    table = (g.folder / "table.md").read_text()
    assert "| baseline |" in table and "speed-up" in table
    import pandas as pd

    tidy = pd.read_csv(result.out / "tidy.csv")
    row = tidy[tidy["method"] == "skip_last"].iloc[0]
    assert row["flops_x"] > 1.0                    # skipping the last scales saves FLOPs
    assert row["paired_speedup"] > 0 and "paired speed-up" in table   # baseline timed inside the job too
    assert row["fidelity/ssim"] < 1.0              # and changes the image


@pytest.mark.integration
def test_logger_wandb_offline_mirrors_the_finished_record(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WANDB_MODE", "offline")
    from varbench.cli.run import run   # the command's wiring: logger=wandb subscribes W&B to the job

    entry = run(_cfg(tmp_path, "logger=wandb", f"logger.dir={tmp_path}/wb", "evaluator=[]", "timing=none"))
    runs = list((tmp_path / "wb" / "wandb").glob("offline-run-*"))
    assert (entry / "DONE").exists() and len(runs) == 1
    assert list(runs[0].glob("run-*.wandb"))
    assert f"W&B offline run: {runs[0]} (upload it with `wandb sync {runs[0]}`)" in capsys.readouterr().out


@pytest.mark.integration
def test_smoke_record_carries_every_weight_free_scorer(tmp_path):
    """The smoke experiment's own evaluator list (tiny random HPSv2, ImageReward and native GenEval
    backbones + fidelity) runs through the real scorer code and lands in the record with provenance."""
    cfg = job_config(tmp_path, "benchmark.limit_per_tag=1", "runtime.progress=false", "timing.repeats=1", "timing.warmup=0")
    rec = json.loads((run_job(cfg) / "record.json").read_text())
    for name in ("hpsv2_tiny/score", "imagereward_tiny/score", "geneval_tiny/overall", "fidelity/psnr"):
        assert name in rec["metrics"], sorted(rec["metrics"])
    ge = [v for k, v in rec["evaluators"].items() if k.startswith("geneval_tiny")]
    assert ge and ge[0]["detector"] == "tiny-random" and len(ge[0]["detector_sha256"]) == 1


@pytest.mark.parametrize("evaluator, error", [
    ("hpsv2", "WeightsNotFoundError"),      # a scorer's checkpoint that is not there
    ("toy_geneval", "ConfigError"),         # a scorer that cannot read this benchmark's prompts
])
def test_a_job_whose_scorer_cannot_run_fails_before_generating_anything(tmp_path, evaluator, error):
    """Checked before the model is built: without it the whole generation ran first (minutes to
    hours of GPU time on a real benchmark), then scoring failed."""
    from varbench.core.errors import names_its_fix
    from varbench.core.errors import ConfigError
    from varbench.evaluators.weights import WeightsNotFoundError

    cfg = _cfg(tmp_path, f"evaluator=[{evaluator}]", f"paths.weights_dir={tmp_path}/none")  # smoke prompts: not toy-world
    with pytest.raises((WeightsNotFoundError, ConfigError)) as info:
        run_job(cfg)
    assert type(info.value).__name__ == error and names_its_fix(info.value)
    assert not list((tmp_path / "store").rglob("*.png")), "images were generated before the check"
    assert not list((tmp_path / "store").rglob("record.json"))


def test_what_the_command_line_chose_comes_in_through_the_job_context(tmp_path):
    """The job reads no Hydra state: the CLI passes the method preset chosen, the overrides and the job
    number in (`JobContext`); a programmatic run passes none and the config names the preset."""
    from varbench.cli.context import hydra_context
    from varbench.harness.job import JobContext, prepare_job

    cfg = _cfg(tmp_path, "method=skip_last_2")
    assert hydra_context() is None                                   # no Hydra app around a test
    plain = prepare_job(cfg)
    assert plain.context == JobContext() and plain.preset == "skip_last"   # the policy's name: no preset key
    chosen = prepare_job(cfg, JobContext(method_choice="skip_last_2", overrides=("method=skip_last_2",), job_num=4))
    assert chosen.preset == "skip_last_2"                            # the preset file chosen, as tables show it
    assert chosen.context.overrides == ("method=skip_last_2",) and chosen.context.job_num == 4
    assert chosen.entry.dir == plain.entry.dir                       # the context names, it hashes nothing


@pytest.mark.integration
def test_the_record_carries_the_job_context(tmp_path):
    from varbench.harness.job import JobContext

    entry = run_job(_cfg(tmp_path), context=JobContext(overrides=("+experiment=smoke", "benchmark.limit=3"), job_num=2))
    rec = json.loads((entry / "record.json").read_text())
    assert rec["experiment"]["overrides"] == ["+experiment=smoke", "benchmark.limit=3"]
    assert rec["experiment"]["job_num"] == 2
