"""Memory in every record (issue 24 item 3): per-scale KV bytes in each trace row, the record's
``memory`` block, and its frame columns; records without the block still load (NaN).

The tiny random model on the CPU ('0.25M', 10 scales, CFG 3), 3 prompts at batch 2 (one batch of 2, one of 1)."""
from __future__ import annotations

import json
import math

import pytest
import torch

from varbench.analysis.frame import record_to_row, records_to_frame
from varbench.engine.backbones.infinity.memory import weights_bytes
from varbench.engine.backbones.infinity.model import PRESETS
from varbench.engine.backbones.infinity.schedules import scale_schedule
from varbench.engine.flops import plan_trace
from varbench.engine.memory import PEAK_RSS, PEAK_RSS_LIFETIME, kv_plan_bytes
from varbench.engine.plan import ScalePlan
from varbench.harness.job import run_job
from varbench.harness.schema import TraceRow, check_record
from varbench.testing.jobs import job_config


def _run(tmp_path, method):
    cfg = job_config(tmp_path, "evaluator=[]", "benchmark.limit=3", "runtime.batch_size=2", "runtime.progress=false",
                     "timing=none", f"method={method}", f"experiment_name=mem_{method}")
    entry = run_job(cfg)
    rec = json.loads((entry / "record.json").read_text())
    traces = [json.loads(line) for line in (entry / "traces.jsonl").read_text().splitlines()]
    return entry, rec, traces


@pytest.mark.integration
def test_records_carry_kv_bytes_and_the_peak(tmp_path):
    e_base, base, base_tr = _run(tmp_path, "baseline")
    e_skip, skip, skip_tr = _run(tmp_path, "skip_last_2")
    for rec, traces in ((base, base_tr), (skip, skip_tr)):
        assert check_record(rec) == [] and [check_record(t, TraceRow) for t in traces] == [[]] * 3

    # the baseline's per-image KV bytes are the analytic model's for the tiny preset (fp32 on the CPU)
    cfg, sched = PRESETS["tiny"], scale_schedule(1.0, "0.25M")
    model = kv_plan_bytes(cfg, plan_trace(sched, [ScalePlan()] * len(sched), cfg.depth, 1, True, {2: 2, 1: 1}),
                          torch.float32)
    mem = base["memory"]
    assert mem["kv_bytes_allocated"] == model.allocated and mem["kv_bytes_used_peak"] == model.used_peak
    assert mem["kv_bytes_per_scale"] == model.used_per_scale
    for t in base_tr:   # every image, whichever batch it was in (2 or 1 images): its own share
        assert [s["kv_bytes_used"] for s in t["scales"]] == model.used_per_scale
        assert t["memory"]["kv_bytes_allocated"] == model.allocated
    # skipping the last two scales: the same buffers (preallocated for the schedule), fewer positions in use
    assert skip["memory"]["kv_bytes_allocated"] == model.allocated
    assert skip["memory"]["kv_bytes_used_peak"] == model.used_per_scale[-3] < model.used_peak

    # the peak was measured around each generate call (the process's RSS on the CPU), above the model's bound
    assert mem["peak_kind"] in (PEAK_RSS, PEAK_RSS_LIFETIME) and mem["batch"] == 2 and mem["kv_dtype"] == "float32"
    assert mem["weights_bytes"] == weights_bytes(cfg, torch.float32)
    assert mem["analytic_peak_bytes"] == sum(mem["weights_bytes"].values()) + 2 * model.allocated
    assert mem["peak_bytes"] > mem["analytic_peak_bytes"]

    # frame columns, GiB; an older record without the block loads with NaN
    frame = records_to_frame([e_base, e_skip]).set_index("entry_id")
    b, s = frame.loc[base["entry_id"]], frame.loc[skip["entry_id"]]
    assert b["kv_gb"] == pytest.approx(model.allocated / 2**30) and b["memory_batch"] == 2
    assert s["kv_used_gb"] < b["kv_used_gb"] and s["kv_gb"] == b["kv_gb"]
    assert b["peak_gb"] == pytest.approx(mem["peak_bytes"] / 2**30) and b["peak_kind"] == mem["peak_kind"]
    old = record_to_row({k: v for k, v in base.items() if k != "memory"})
    assert math.isnan(old["kv_gb"]) and math.isnan(old["peak_gb"]) and old["peak_kind"] is None


@pytest.mark.integration
def test_reused_images_keep_their_peak_and_old_trace_rows_give_no_memory_block(tmp_path):
    """A second experiment reusing the images (no generation) records the peak measured when they
    were made; trace rows stored before memory was recorded make ``memory: None``, not a wrong number."""
    entry, rec, _ = _run(tmp_path, "baseline")
    cfg = job_config(tmp_path, "evaluator=[]", "benchmark.limit=3", "runtime.batch_size=2", "runtime.progress=false",
                     "timing=none", "experiment_name=again")
    again = json.loads((run_job(cfg) / "record.json").read_text())
    assert again["memory"]["peak_bytes"] == rec["memory"]["peak_bytes"] is not None

    store = next((tmp_path / "store" / "images").iterdir()) / "traces.jsonl"
    rows = [json.loads(line) for line in store.read_text().splitlines()]
    for r in rows:          # as an older varbench wrote them
        r.pop("memory")
        for s in r["scales"]:
            s.pop("kv_bytes_allocated"), s.pop("kv_bytes_used")
    store.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = job_config(tmp_path, "evaluator=[]", "benchmark.limit=3", "runtime.batch_size=2", "runtime.progress=false",
                     "timing=none", "experiment_name=older")
    older = json.loads((run_job(cfg) / "record.json").read_text())
    assert older["memory"] is None and check_record(older) == []
