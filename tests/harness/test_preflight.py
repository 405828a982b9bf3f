"""The preflight (varbench.harness.preflight): every missing file of a sweep, each named once."""
from __future__ import annotations

import pytest

from varbench.core.missing import MissingFilesError, collecting
from varbench.evaluators.weights import WeightsNotFoundError, resolve_file
from varbench.harness.preflight import check_files, job_files_missing
from varbench.testing.jobs import job_config


def test_resolve_file_raises_alone_and_notes_inside_a_preflight(tmp_path):
    with pytest.raises(WeightsNotFoundError, match="published at https://example.org"):
        resolve_file(None, str(tmp_path), "x.pt", what="X checkpoint", published="https://example.org")
    with collecting() as notes:
        got = resolve_file(None, str(tmp_path), "x.pt", what="X checkpoint", published="https://example.org")
        resolve_file(None, str(tmp_path), "y.pt", what="Y checkpoint", published="https://example.org/y")
    assert got == tmp_path / "x.pt"                       # the caller goes on to its next check
    assert [(n.what, n.path, n.published) for n in notes] == [
        ("X checkpoint x.pt", str((tmp_path / "x.pt").resolve()), "https://example.org"),
        ("Y checkpoint y.pt", str((tmp_path / "y.pt").resolve()), "https://example.org/y")]


def test_one_evaluator_names_all_of_its_files(tmp_path):
    """ImageReward reads a checkpoint and a tokenizer folder: both are named, not only the first."""
    cfg = job_config(tmp_path, "evaluator=[imagereward]", f"paths.weights_dir={tmp_path}/w")
    whats = [m.what for m in job_files_missing(cfg)]
    assert whats == ["evaluator imagereward: ImageReward checkpoint ImageReward.pt",
                     "evaluator imagereward: ImageReward tokenizer (bert-base-uncased) vocab.txt"]


def test_a_sweep_gets_one_list_with_the_jobs_that_need_each_file(tmp_path):
    w = f"paths.weights_dir={tmp_path}/w"
    cfgs = [job_config(tmp_path, "model=infinity_2b", "evaluator=[hpsv2]", w),
            job_config(tmp_path, "model=infinity_2b", "evaluator=[hpsv2,imagereward]", w),
            job_config(tmp_path, "model=infinity_2b", "evaluator=[hpsv2]", "benchmark=geneval",
                       f"paths.data_dir={tmp_path}/d", w)]
    with pytest.raises(MissingFilesError) as info:
        check_files(cfgs, ["job a", "job b", "job c"])
    msg, missing = str(info.value), info.value.missing
    # 3 model files + HPSv2 for every job, ImageReward's two for job b, GenEval's prompts for job c
    assert len(missing) == 7 and msg.startswith("7 files the sweep needs are missing (no job was started; 3 jobs checked)")
    assert msg.count("(every job)") == 4
    assert msg.count("(1 of 3 jobs: job b)") == 2 and msg.count("(1 of 3 jobs: job c)") == 1
    assert "evaluation_metadata.jsonl" in msg and "published at: https://raw.githubusercontent.com/djghosh13/geneval" in msg


def test_nothing_missing_is_silent(tmp_path):
    check_files([job_config(tmp_path), job_config(tmp_path, "model=toy", "method=nova")])   # packaged weights only


def test_a_methods_release_files_are_named_too(tmp_path):
    """ScaleKV's budget file and SkipVAR's decision models come from their releases: missing, they are
    listed with the model's files (a composed method's members included); the toy ones ship."""
    w = f"paths.weights_dir={tmp_path}/w"
    whats = [m.what for m in job_files_missing(job_config(tmp_path, "method=nova_scalekv", w))]
    assert whats == ["method scalekv: ScaleKV budget file 2b_10%_budget.json"]
    whats = [m.what for m in job_files_missing(job_config(tmp_path, "method=skipvar", w))]
    assert whats == ["method skipvar: SkipVAR decision models"]
    assert job_files_missing(job_config(tmp_path, "model=toy", "method=scalekv_toy")) == []
    assert job_files_missing(job_config(tmp_path, "model=toy", "method=skipvar_toy")) == []


PLUGIN = '''
from varbench.engine.plan import ScalePlan
from varbench.engine.policy import Policy, RequiredFile


class TableDriven(Policy):
    """An outside method that reads a lookup table named by its knob `table`."""
    name = "table_driven"

    def __init__(self, table=None):
        self.table = table

    @classmethod
    def required_files(cls, knobs):
        return [RequiredFile("lookup table", str(knobs["table"]), "https://example.org/tables", knob="table")]

    def plan(self, si):
        return ScalePlan()
'''


def test_a_plugin_methods_declared_file_is_named(tmp_path, monkeypatch):
    """The preflight knows no knob names: it asks the method's class (here an outside one, given as
    module:Class), and names the file it declares with the setting that points at it, also inside a
    composition (the member's name and its `policies[i]` setting)."""
    (tmp_path / "pf_plugin.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    table = tmp_path / "absent.tbl"
    cfg = job_config(tmp_path, "method.name=pf_plugin:TableDriven", f"+method.knobs.table={table}")
    [m] = job_files_missing(cfg)
    assert (m.what, m.path, m.published) == ("method pf_plugin:TableDriven: lookup table", str(table),
                                             "https://example.org/tables")
    assert m.fix == "put it there, or set method.knobs.table to its path"
    composed = job_config(tmp_path, "method=nova_on_fastvar",
                          f"method.knobs.policies=[{{name: fastvar}}, {{name: 'pf_plugin:TableDriven', knobs: {{table: '{table}'}}}}]")
    [m] = job_files_missing(composed)
    assert m.what == "method pf_plugin:TableDriven: lookup table"
    assert m.fix == "put it there, or set method.knobs.policies[1].knobs.table to its path"
    table.write_text("1 2 3\n")                           # present: nothing to name
    assert job_files_missing(cfg) == []
