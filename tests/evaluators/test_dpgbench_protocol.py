"""The dpgbench protocol end to end on the tiny models (wiring): DPG-Bench-layout prompts and a question file we
write, 4 images per prompt, scored by the tiny random mPLUG; the record carries overall and per-category
scores with n and ±, and the table shows a DPG-Bench breakdown."""
import json
from pathlib import Path

import pytest

CSV_HEAD = "item_id,text,keywords,proposition_id,dependency,category_broad,category_detailed,tuple,question_natural_language\n"


def _dpg_files(tmp_path):
    prompts = tmp_path / "data" / "dpgbench" / "prompts"
    prompts.mkdir(parents=True)
    items = {"countbench1": "two red apples on a white table", "partiprompts7": "a blue bus next to a tree",
             "42": "a cat sleeping on a sofa in the sun"}
    rows = ["skipped,x,x,1,0,entity,whole,entity - whole (x),Is this row read?\n"]      # ELLA skips the first row
    for item, text in items.items():
        (prompts / f"{item}.txt").write_text(text + "\n")
        rows += [f"{item},{text},k,1,0,entity,whole,entity - whole (thing),Is there a thing?\n",
                 f"{item},{text},k,2,1,attribute,color,\"attribute - color (thing, red)\",Is the thing red?\n",
                 f"{item},{text},k,3,0,global,,global (photo),Is this a photo?\n"]
    (tmp_path / "data" / "dpgbench" / "dpg_bench.csv").write_text(CSV_HEAD + "".join(rows))
    return prompts


@pytest.mark.integration
@pytest.mark.parametrize("model", ["tiny", "hart_tiny"])
def test_the_dpgbench_protocol_runs_end_to_end_on_the_tiny_models(tmp_path, model):
    from varbench.cli.callbacks import aggregate_experiment
    from varbench.harness.job import run_job
    from varbench.testing.jobs import job_config

    _dpg_files(tmp_path)
    common = (f"model={model}", f"benchmark=dpgbench_protocol/{model}", f"paths.data_dir={tmp_path}/data",
              "evaluator=[dpgbench_tiny]", "runtime.batch_size=4", "runtime.progress=false", "timing=none",
              "experiment_name=dpg")
    cfg = job_config(tmp_path, *common)
    assert cfg.benchmark.samples_per_prompt == 4 and list(cfg.evaluator) == ["dpgbench_tiny"]
    rec = json.loads((run_job(cfg) / "record.json").read_text())
    m = rec["metrics"]
    assert m["dpgbench_tiny/n_prompts"] == 3 and m["dpgbench_tiny/n_images"] == 12
    assert 0 <= m["dpgbench_tiny/overall"] <= 100 and "dpgbench_tiny/overall" in rec["uncertainty"]
    for cat in ("entity", "attribute", "global"):
        assert f"dpgbench_tiny/{cat}" in m and m[f"dpgbench_tiny/n_{cat}"] == 3.0   # one question each, 3 prompts
    assert rec["evaluators"]["dpgbench_tiny"]["questions_sha256"]
    run_job(job_config(tmp_path, *common, "method=skip_last_2"))
    result = aggregate_experiment(job_config(tmp_path, *common))
    table = "\n".join((g.folder / "table.md").read_text() for g in result.groups)
    assert "DPG-Bench (tiny mPLUG) by category" in table and "| Entity |" in table and "(n=3)" in table
