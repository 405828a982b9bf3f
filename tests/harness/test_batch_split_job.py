"""A toy job at runtime.batch_size=4 stores the same per-image decisions as at batch 1."""
import json

import pytest

from varbench.harness.job import run_job
from varbench.testing.jobs import job_config

pytestmark = pytest.mark.integration   # every test here runs whole toy jobs (run_job)


def _traces(tmp_path, method, batch):
    cfg = job_config(tmp_path, "model=toy", "benchmark=toy", f"method={method}", "evaluator=[toy_geneval]",
                     "benchmark.limit=8", "benchmark.samples_per_prompt=1", f"runtime.batch_size={batch}",
                     "runtime.progress=false", "timing.enabled=false", f"experiment_name=b{batch}")
    entry = run_job(cfg)
    rows = [json.loads(line) for line in (entry / "traces.jsonl").read_text().splitlines()]
    return {(r["prompt_index"], r["sample_index"]): r for r in rows}


def _decisions(method, row):
    st = row["stats"]
    ran = [s["ran"] for s in row["scales"]]
    keep = [s["keep_frac"] for s in row["scales"]]
    if method.startswith("nova"):
        return st["activation_scale"], {s: r.get("n_keep") for s, r in st["ratios"].items()}, ran, keep
    return st["skip"], st["uncond"], ran, keep


@pytest.mark.parametrize("method", ["nova_toy", "skipvar_toy"])
def test_batch_4_and_batch_1_store_the_same_per_image_decisions(tmp_path, method):
    one, four = _traces(tmp_path, method, 1), _traces(tmp_path, method, 4)
    assert one.keys() == four.keys() and len(one) == 8
    for k in one:
        assert _decisions(method, four[k]) == _decisions(method, one[k]), k
        assert four[k]["work"]["flops"]["total"] == pytest.approx(one[k]["work"]["flops"]["total"], rel=1e-12)
    assert {r["batch"] for r in four.values()} == {4}
    # the batch really disagreed (so the batch-4 job split): more than one decision among its images
    print(sorted({repr(_decisions(method, r)[:2]) for r in one.values()}))
    assert len({repr(_decisions(method, r)) for r in one.values()}) > 1
