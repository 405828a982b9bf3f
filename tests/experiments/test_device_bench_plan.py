"""experiments/device_bench.py, what the first GPU run depends on (issue 37 section 1): a fallback is never
silent, nothing is planned that its own predicted peak says will not fit, the plan's order and estimate fit
the device budget, and graphed items are timed only after their graphs settled, each method on its own
graph state. On the CPU: tiny smoke models, and graph mode's bookkeeping with an emulated capture."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from experiments import device_bench as db


def _rows(rec, **kw):
    return [r for r in rec["rows"] if all(r.get(k) == v for k, v in kw.items())]


@pytest.mark.integration
def test_a_row_that_fell_back_says_so_and_fails(tmp_path, monkeypatch):
    """ToProVAR's first call finds the fused entropy kernel broken (as a Triton failure would): the runtime
    turns it off (`fall_back`) and runs on. Every row timed with it off records the fallback, says so in its
    status and fails the run (exit 1); the row timed before it (section 1's baseline) is clean."""
    from varbench.engine.backbones.infinity.runtime import InfinityRuntime

    real = InfinityRuntime.generate

    def generate(self, prompts, seeds, policy=None, **kw):
        if getattr(policy, "name", "") == "toprovar" and not self.fallbacks:
            self.fall_back("runtime.fused_entropy", RuntimeError("triton: no kernel for this device"))
        return real(self, prompts, seeds, policy, **kw)

    monkeypatch.setattr(InfinityRuntime, "generate", generate)
    rc = db.main(["--smoke", "--models", "2b", "--batches", "1", "--out", str(tmp_path), "--budget-s", "600"])
    rec = json.loads((tmp_path / "device_bench.json").read_text())
    assert rc == 1
    clean = _rows(rec, method="baseline", mode="eager", section="2b b1: baseline eager vs graphed")
    assert clean and clean[0]["fallbacks"] == [] and clean[0]["status"] == "ok"
    fell = _rows(rec, method="toprovar", mode="eager")
    assert fell and fell[0]["fallbacks"][0]["knob"] == "runtime.fused_entropy=false"
    assert fell[0]["status"].startswith("FELL BACK (runtime.fused_entropy=false)") and fell[0]["check"] == "FAIL"
    assert "FELL BACK" in (tmp_path / "device_bench.md").read_text()
    assert all("fallbacks" in r for r in rec["rows"])   # every row records them, none or some


def _args(*extra):
    return db.parse_args(["--device-memory-gib", "139", "--budget-s", "400", *extra])


def test_the_plan_puts_batch_one_and_hart_before_batch_eight():
    titles = [s.title for s in db.plan_sections(["2b", "8b", "hart"], [1, 8])]
    assert titles[:7] == ["2b b1: baseline eager vs graphed", "2b b1: methods graphed", "2b b1: bit check eager vs graphed",
                          "8b b1: baseline eager vs graphed", "8b b1: methods graphed", "8b b1: bit check eager vs graphed",
                          "hart b1: methods eager"]
    assert titles[7:11] == ["2b b8: baseline graphed", "2b b8: methods graphed", "8b b8: baseline graphed", "8b b8: methods graphed"]


def test_a_configuration_whose_predicted_peak_does_not_fit_is_not_planned():
    """results/curated/gpu_dryrun.json predicts 8B NOVA at batch 8 at 172.4 GiB: over 92% of an H200's 139 GiB,
    so neither its timed row nor its bit check is planned; 8B FastVAR (124.6 GiB) and the 8B baseline (115.2 GiB)
    at batch 8 are, and nothing is left out without a device size (a CPU run) or without a prediction."""
    h200 = 139 * db.GIB
    why = db.fit_reason("infinity_8b", "nova", 8, h200)
    assert why and "172.4 GiB" in why and "139 GiB" in why
    assert db.fit_reason("infinity_8b", "fastvar_8b_paper", 8, h200) is None
    assert db.fit_reason("infinity_8b", "baseline", 8, h200) is None
    assert db.fit_reason("infinity_8b", "nova", 8, None) is None
    assert db.fit_reason("tiny", "nova", 8, h200) is None
    plan = db.plan_budget(db.plan_sections(["2b", "8b", "hart"], [1, 8]), db.model_specs(False, None), _args(), h200)
    left_out = {(p["title"], m) for p in plan for m in p["not_planned"]}
    assert left_out == {("8b b8: methods graphed", "nova"), ("8b b8: bit check eager vs graphed", "nova"),
                        ("8b b8: methods eager", "nova")}


def test_the_estimate_comes_from_analytic_flops():
    """The estimate is the baseline's FLOPs (+10% for decode and text) at 35% of 989 TFLOP/s, plus 40 eager ops
    per block and scale at 6 us when eager. The FLOPs are the runtime's own count: the tiny model's generation
    reports exactly `analytic_flops`, and every term is linear in the batch's rows (exactly 8x at batch 8)."""
    specs = db.model_specs(False, None)
    two = specs["2b"]
    f1 = db.analytic_flops(two, 1, 30)
    assert db.analytic_flops(two, 8, 30) == pytest.approx(8 * f1, rel=1e-12)
    graphed = db.estimate_gen_s(two, 1, "graphed")
    assert graphed == pytest.approx(f1 * 1.1 / (989e12 * 0.35))
    assert db.estimate_gen_s(two, 1, "eager") - graphed == pytest.approx(13 * two.cfg.depth * 40 * 6e-6)
    tiny = db.model_specs(True, None)["2b"]
    model, vae = db.build_model(tiny, torch.device("cpu"), torch.float32, 0)
    rt = db.make_runtime(model, vae, torch.device("cpu"), torch.float32, False)
    out = rt.generate(["x"] * 2, [0, 1], None, pn=tiny.pn, cfg=4.0, tau=1.0, decode=False,
                      text=db.random_text(tiny.cfg, 2, 30, torch.device("cpu"), 0))
    assert float(out.flops["total"]) == pytest.approx(db.analytic_flops(tiny, 2, 30), rel=1e-12)


def test_the_default_plan_states_its_estimates_and_fits_batch_one_and_hart():
    """With the shell script's bench budget (400 s of the ~9 minute command) every batch-1 section and HART
    are estimated to fit; what does not is marked, and --plan-only prints it without building a model."""
    plan = db.plan_budget(db.plan_sections(["2b", "8b", "hart"], [1, 8]), db.model_specs(False, None), _args(), 139 * db.GIB)
    assert all(p["within_budget"] for p in plan[:7]) and plan[6]["title"] == "hart b1: methods eager"
    assert not plan[-1]["within_budget"]
    assert plan[-1]["cumulative_s"] == pytest.approx(sum(p["estimate_s"] for p in plan), abs=0.1 * len(plan))


def test_plan_only_prints_the_plan(capsys):
    assert db.main(["--plan-only", "--device-memory-gib", "139", "--budget-s", "400"]) == 0
    out = capsys.readouterr().out
    assert "hart b1: methods eager" in out and "nova: skipped: predicted peak 172.4 GiB" in out


def _copy_into(static, new):
    """A replay's write into a captured output. An expanded (stride-0) output is written through its one
    stored element per broadcast dimension, as a kernel writing the underlying storage does."""
    if isinstance(static, torch.Tensor):
        for d, st in enumerate(static.stride()):
            if st == 0 and static.shape[d] > 1:
                static, new = static.narrow(d, 0, 1), new.narrow(d, 0, 1)
        static.copy_(new)
    elif isinstance(static, dict):
        for k in static:
            _copy_into(static[k], new[k])
    elif dataclasses.is_dataclass(static):
        for f in dataclasses.fields(static):
            _copy_into(getattr(static, f.name), getattr(new, f.name))


def _emulated_capture(captures):
    """StepGraphs.capture on the CPU (as tests/engine/test_cuda_graphs.py emulates it): "capture" runs the
    step, "replay" runs it again into the captured outputs (host KV lengths untouched, as a replay runs no
    Python); `captures` counts the captures."""
    def capture(graphs, state, fn):
        captures.append(1)
        out = fn()

        class Graph:
            def replay(self):
                host_kv_len = list(state.kv.len)
                fresh = fn()
                state.kv.len = host_kv_len
                for f in dataclasses.fields(out):
                    _copy_into(getattr(out, f.name), getattr(fresh, f.name))
        return Graph(), out
    return capture


@pytest.mark.integration
def test_graphed_items_warm_up_until_settled_each_on_its_own_graphs(tmp_path, monkeypatch):
    """The smoke bench with graph mode emulated on the CPU: every graphed item starts on cleared graphs (no
    step key of the method before it), warms up until a call captured nothing new, and its timed rounds
    capture nothing (`timed_captures` 0, checked against the emulated captures themselves)."""
    from varbench.engine.graphs import StepGraphs, graph_keys

    captures: list = []
    monkeypatch.setattr(StepGraphs, "capture", _emulated_capture(captures))
    monkeypatch.setattr(db.Bench, "_skip_reason", lambda self, mode: None)   # graphed items on the CPU
    starts, in_timed = [], []
    real_gen = db.Bench.generate

    def generate(self, role, batch, it):
        if it.mode == "graphed" and not it.warm_walls and not it.runs:
            starts.append((it.name, graph_keys(self.rt)))
        n = len(captures)
        out = real_gen(self, role, batch, it)
        if it.mode == "graphed" and it.settled is not None:   # a timed round
            in_timed.append((it.name, len(captures) - n))
        return out

    monkeypatch.setattr(db.Bench, "generate", generate)
    rc = db.main(["--smoke", "--models", "2b", "--batches", "1", "--out", str(tmp_path), "--budget-s", "600",
                  "--warmup", "1", "--repeats", "2"])
    rec = json.loads((tmp_path / "device_bench.json").read_text())
    assert rc == 0, [r["status"] for r in rec["rows"]]
    graphed = _rows(rec, mode="graphed")
    names = [r["method"] for r in graphed]
    assert "nova" in names and "baseline" in names
    assert captures, "nothing was captured"
    assert starts and all(keys == 0 for _, keys in starts), starts
    for r in graphed:
        assert r["status"] == "ok" and r["graphs_settled"] is True and r["timed_captures"] == 0, r
        assert r["warmups"] >= 2 and r["repeats"] == 2
    assert sum(n for _, n in in_timed) == 0, in_timed
    checks = [b for b in rec["bitchecks"] if b["model"] == "2b" and b["batch"] == 1]   # graphed (emulated) == eager bits
    assert checks and all(b["result"] == "equal" for b in checks), checks
    print({r["method"]: r["warmups"] for r in graphed})


def test_warm_until_settled_stops_at_the_first_quiet_call():
    """Keys grow 0 -> 3 -> 5 -> 6 -> 6: settled after the 4th call (the first that adds none); at least `least`
    calls; not settled when `most` runs out first."""
    state = {"k": 0}
    growth = [3, 2, 1, 0, 0, 0]

    def once():
        state["k"] += growth.pop(0)
    assert db.warm_until_settled(once, lambda: state["k"], 2, 16) == (4, True)
    state["k"], growth[:] = 0, [3, 2, 1, 0]
    assert db.warm_until_settled(once, lambda: state["k"], 2, 3) == (3, False)
    state["k"], growth[:] = 0, [0, 0, 0]
    assert db.warm_until_settled(once, lambda: state["k"], 2, 16) == (2, True)


@pytest.mark.runtime
def test_a_residual_chain_settles_one_scale_per_generation(monkeypatch):
    """A policy whose every pruned step fills from the previous scale's residuals (as NOVA's does): a step
    reading an eager step's residuals stays eager, so the chain is captured one scale per generation. Two
    fixed warm-ups (the bench's old rule) leave a capture in the next, "timed", call; warming up until settled
    takes more calls, and then the next call captures nothing."""
    from varbench.engine.graphs import StepGraphs, graph_keys
    from varbench.engine.plan import BlockPlan, ScalePlan
    from varbench.engine.policy import Policy
    from varbench.testing.tiny import tiny_runtime

    class Chain(Policy):
        name = "chain"

        def plan(self, si):
            if si < 2:
                return ScalePlan()
            if si == 2:
                return ScalePlan(keep_residuals=True)
            n = self.ctx.tokens(si)
            keep = torch.arange(n // 2).expand(self.ctx.rows, -1)
            return ScalePlan(keep_residuals=True, blocks={1: BlockPlan(mode="prune", keep=keep, n_keep=n // 2, cache_from=si - 1)})

    captures: list = []
    monkeypatch.setattr(StepGraphs, "capture", _emulated_capture(captures))

    def runtime():
        rt = tiny_runtime(seed=0)
        rt.cuda_graphs = True
        return rt, lambda: rt.generate(["a red circle"], [3], Chain(), pn="0.25M", cfg=3.0, decode=False)

    rt, once = runtime()
    once(), once()
    n = len(captures)
    once()
    assert len(captures) > n, "two warm-ups already settled: the chain does not exercise the rule"
    rt, once = runtime()
    calls, settled = db.warm_until_settled(once, lambda: graph_keys(rt), 2, 30)
    assert settled and calls > 3   # 10 on this schedule: one more scale of the chain per call
    n = len(captures)
    once()
    assert len(captures) == n


@pytest.mark.integration
def test_a_kill_keeps_every_finished_round_of_the_section_in_flight(tmp_path, monkeypatch):
    """`timeout` sends SIGTERM (the bench raises SystemExit) in the second timed round of the batch-1 eager
    methods: the JSON on disk already has that section's rows from its first round, marked in flight, besides
    every finished section; the run's status says where it stopped."""
    real_gen = db.Bench.generate

    def generate(self, role, batch, it):
        if self.record["sections"][-1]["title"] == "2b b1: methods eager" and it.method == "nova" and it.runs:
            raise SystemExit("signal 15 (time limit?)")
        return real_gen(self, role, batch, it)

    monkeypatch.setattr(db.Bench, "generate", generate)
    with pytest.raises(SystemExit):
        db.main(["--smoke", "--models", "2b", "--batches", "1", "--out", str(tmp_path), "--budget-s", "600", "--repeats", "3"])
    rec = json.loads((tmp_path / "device_bench.json").read_text())
    assert rec["status"].startswith("stopped during section 4")
    assert _rows(rec, section="2b b1: baseline eager vs graphed", method="baseline", mode="eager")[0]["repeats"] == 3
    cut = _rows(rec, section="2b b1: methods eager")
    assert cut and all(r["status"].startswith("in flight at the last save") for r in cut)
    assert {r["method"]: r["repeats"] for r in cut}["baseline"] >= 1 and {r["method"]: r["repeats"] for r in cut}["nova"] == 1


@pytest.mark.integration
def test_the_device_command_runs_tests_then_the_bench_within_its_limit(tmp_path):
    """scripts/device_check.sh on the CPU (`--smoke`): the named gpu test files first (they skip here), then the
    bench with what is left of LIMIT_S less 20 s for the report; both outputs land in $OUT."""
    import os
    import re
    import subprocess
    import sys

    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable, "LIMIT_S": "200", "TESTS_S": "60",
           "WHEELS": str(tmp_path / "none"), "OMP_NUM_THREADS": "1"}
    p = subprocess.run(["bash", "scripts/device_check.sh", "--smoke", "--models", "2b", "--batches", "1"], cwd=db.ROOT,
                       env=env, capture_output=True, text=True, timeout=400)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    log = (tmp_path / "device_check.log").read_text()
    assert re.search(r"gpu tests: exit [05]: .*skipped", log), log
    budget = int(re.search(r"bench budget (\d+)s", log).group(1))
    assert 150 <= budget <= 180   # 200 - 20 - the install and the tests' seconds
    rec = json.loads((tmp_path / "device_bench.json").read_text())
    assert rec["status"] == "done" and rec["config"]["budget_s"] == budget and rec["plan"]
    assert log.index("gpu tests:") < log.index("bench budget")
