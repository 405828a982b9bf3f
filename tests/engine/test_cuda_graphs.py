"""Graph mode: per-scale steps captured once and replayed must give the eager bits, bit for bit.

On CUDA (`gpu` marker) the real thing. On the CPU, the graph bookkeeping (state reuse across
generations, plan keys, static kept-index buffers, KV lengths restored after a replay, residuals of
eager steps never baked into a graph) runs with an emulated graph: "capture" runs the step, "replay"
runs it again and copies its results into the captured step's output tensors, as a real replay
overwrites static outputs. A bookkeeping mistake (a stale KV length, a kept-index buffer not
refreshed, a state not reset) changes the bits of the later generations.
"""
import dataclasses
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from varbench.engine.backbones.infinity.schedules import scale_schedule
from varbench.engine.backbones.infinity.state import GenState
from varbench.engine.graphs import StepGraphs
from varbench.engine.plan import BlockPlan, ScalePlan
from varbench.engine.policy import Policy
from varbench.policies import build_policy
from varbench.policies.skipvar_features import missing_decision_model_deps
from varbench.testing.tiny import tiny_runtime

#: generates with a tiny random runtime (seconds per test): the full run's tier, not plain `pytest`'s
pytestmark = pytest.mark.runtime

PN = "0.25M"
PROMPTS = [["a red circle"], ["two blue squares"], ["a green triangle"], ["a red circle"]]


class RandomKeepPolicy(Policy):
    """Prunes block 1 at scale 4 with indices drawn anew every generation (fixed shape), keeps
    residuals at scale 3 for the fill: exercises static keep buffers and residual addresses."""

    name = "random_keep"

    def __init__(self):
        self.g = torch.Generator().manual_seed(5)

    def plan(self, si):
        if si == 3:
            return ScalePlan(keep_residuals=True)
        if si == 4:
            n = self.ctx.tokens(si)
            idx = torch.randperm(n, generator=self.g)[: n // 2].sort().values.expand(self.ctx.rows, -1)
            return ScalePlan(blocks={1: BlockPlan(mode="prune", keep=idx, n_keep=n // 2, cache_from=3)})
        return ScalePlan()


def _copy_into(static, new):
    if isinstance(static, torch.Tensor):
        static.copy_(new)
    elif isinstance(static, dict):
        for k in static:
            _copy_into(static[k], new[k])
    elif dataclasses.is_dataclass(static):   # e.g. an AttnMemory: its tensors are the step's static outputs
        for f in dataclasses.fields(static):
            _copy_into(getattr(static, f.name), getattr(new, f.name))


def _emulated_capture(graphs, state, fn):
    out = fn()

    class Graph:
        def replay(self_graph):
            host_kv_len = list(state.kv.len)  # a real replay runs no Python: host state stays as it was
            fresh = fn()
            state.kv.len = host_kv_len
            for f in dataclasses.fields(out):
                _copy_into(getattr(out, f.name), getattr(fresh, f.name))

    return Graph(), out


def _scalekv():
    """ScaleKV with a budget of the released shape on this schedule: evictions from scale 4 on, appends
    through the staging buffer (kept + the scale's tokens overflow each block's own buffer)."""
    from varbench.policies.scalekv import synthetic_budgets

    return build_policy("scalekv", budgets=synthetic_budgets(scale_schedule(1.0, PN), 4, base_capacity=64), base_capacity=64)


def _run(rt, make_policy, prompts_list, seeds=(3,)):
    return [rt.generate(p, list(seeds), make_policy(), pn=PN, cfg=3.0, decode=False) for p in prompts_list]


def _sparvar():
    """SparVAR's tiny block (decide at 20², indexed and CSLA after): remembered indices and O_cache that
    captured steps write and later captured steps read, a static block mask per scale."""
    from varbench.harness.presets import resolve_method

    return resolve_method("sparvar", model="tiny").build()


@pytest.mark.parametrize("make_policy", [lambda: None, RandomKeepPolicy,
                                         lambda: build_policy("fastvar", prune={-3: 0.5}, skip=[-1], cache_scale=None),
                                         _scalekv, _sparvar],
                         ids=["baseline", "random_keep", "fastvar", "scalekv", "sparvar"])
def test_emulated_graphs_give_the_eager_bits(monkeypatch, make_policy):
    eager = _run(tiny_runtime(seed=0), make_policy, PROMPTS)
    rt = tiny_runtime(seed=0)
    rt.cuda_graphs = True
    captured = []
    monkeypatch.setattr(StepGraphs, "capture", lambda graphs, state, fn: captured.append(1) or _emulated_capture(graphs, state, fn))
    graphed = _run(rt, make_policy, PROMPTS)
    assert captured, "no step was captured"
    for g, (a, b) in enumerate(zip(eager, graphed)):
        for si, (x, y) in enumerate(zip(a.bits, b.bits)):
            assert (x is None) == (y is None)
            if x is not None:
                assert torch.equal(x, y), f"generation {g}, scale {si}: graphed bits differ from eager"
        assert torch.equal(a.summed_codes, b.summed_codes)
        assert [t["blocks"] for t in a.trace] == [t["blocks"] for t in b.trace]
    state = next(iter(rt._graph_states.values()))
    n_ran = sum(1 for t in graphed[-1].trace if t["ran"])
    assert len(state.graphs.steps) >= n_ran - 1  # every executed step is captured by the 4th generation


def test_graph_mode_keeps_one_state_per_shape_and_restarts_it(monkeypatch):
    monkeypatch.setattr(StepGraphs, "capture", _emulated_capture)
    rt = tiny_runtime(seed=0)
    rt.cuda_graphs = True
    a = rt.generate(["a red circle"], [1], pn=PN, cfg=3.0, decode=False)
    state = next(iter(rt._graph_states.values()))
    b = rt.generate(["a red circle"], [1], pn=PN, cfg=3.0, decode=False)
    assert len(rt._graph_states) == 1 and next(iter(rt._graph_states.values())) is state
    assert torch.equal(a.summed_codes, b.summed_codes)  # restarted: zeroed codes, KV lengths, generators
    rt.generate(["a red circle", "two blue squares"], [1, 2], pn=PN, cfg=3.0, decode=False)
    assert len(rt._graph_states) == 1 and next(iter(rt._graph_states.values())) is not state  # newest shape only
    rt.clear_graphs()
    assert not rt._graph_states


def test_cuda_graphs_need_cuda():
    from varbench.testing.tiny import tiny_runtime as make

    rt = make(seed=0)
    with pytest.raises(ValueError, match="cuda_graphs=True needs a CUDA device"):
        type(rt)(rt.model, rt.vae, rt.text_encoder, device="cpu", cuda_graphs=True)


# ---------------------------------------------------------------------------------------- CUDA
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("method", ["baseline", "fastvar", "toprovar", "scalekv", "sparvar"])
def test_cuda_graphed_bits_equal_eager_bits(dtype, method):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    base = tiny_runtime(seed=0)
    eager = type(base)(base.model, base.vae, base.text_encoder, device="cuda", dtype=dtype, cuda_graphs=False)
    graphed = type(base)(base.model, base.vae, base.text_encoder, device="cuda", dtype=dtype, cuda_graphs=True)
    sched = scale_schedule(1.0, PN)
    knobs = {"fastvar": dict(prune={-3: 0.5}, skip=[-1]), "toprovar": {}, "baseline": {}, "scalekv": None,
             "sparvar": None}[method]
    make = {"scalekv": _scalekv, "sparvar": _sparvar}.get(method) or (lambda: build_policy(method, **knobs))
    for prompts in PROMPTS:
        out_e = eager.generate(prompts, [3], make(), pn=PN, cfg=3.0, decode=False)
        out_g = graphed.generate(prompts, [3], make(), pn=PN, cfg=3.0, decode=False)
        for si in range(len(sched)):
            if out_e.bits[si] is not None:
                assert torch.equal(out_e.bits[si], out_g.bits[si]), f"{method} {dtype}: scale {si} differs"
    state = next(iter(graphed._graph_states.values()))
    assert state.graphs.steps, "nothing was captured"


# ------------------------------------------------------------------ nothing in a captured step reads the device
#: ops that read a tensor's value on the host, or whose output shape depends on values, or (lift_fresh:
#: `torch.tensor(<Python data>)`) copy host data to the device: on CUDA each one synchronises, and inside
#: stream capture it fails ("operation not permitted when stream is capturing") or, worse, bakes the
#: value seen at capture into every replay
from varbench.testing.fake_cuda import HOST_READS  # noqa: E402  one list, shared with the fake-CUDA dry run


class _HostReadDetector(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.found = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        bool_index = name == "index" and any(isinstance(i, torch.Tensor) and i.dtype == torch.bool
                                             for i in (args[1] if len(args) > 1 else []) if i is not None)
        if name in HOST_READS or bool_index:
            self.found.append(str(func))
        return func(*args, **(kwargs or {}))


class _SeenAll(set):
    """Every key counts as seen, so each step is captured at its first occurrence."""

    def __contains__(self, key):
        return True


#: presets whose data-dependent rule makes no cut on the tiny random model (ToProVAR's literal
#: rho <= tau depth rule selects no block there): their steps are checked, but they are the baseline's
IDLE_ON_TINY = {"toprovar_rho_le"}
#: CUDA graphs are the Infinity runtime's: presets that refuse Infinity (`refuse: {infinity: ...}`, e.g. fastvar_hart)
#: never run there
PRESETS = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "varbench" / "conf" / "method").glob("*.yaml")
                 if "infinity:" not in p.read_text() and p.stem != "sparvar_scalekv")   # that cell is refused by compose


@pytest.mark.parametrize("preset", PRESETS)
def test_captured_steps_of_every_method_preset_never_read_device_values(monkeypatch, preset):
    """Every step of every shipped method preset is captured in graph mode, and what is captured
    dispatches no op that reads a value on the host and makes no tensor off the runtime's device
    (emulated capture on the CPU, see the top)."""
    from varbench.harness.presets import resolve_method

    detector = _HostReadDetector()

    def capture(graphs, state, fn):
        # default device "meta": a tensor made without device= (CPU on a CUDA run: a crash or a host
        # copy inside the capture) meets the step's real tensors and fails loudly
        with detector, torch.device("meta"):
            return _emulated_capture(graphs, state, fn)

    init = StepGraphs.__init__

    def init_seeing_all(self, *a, **k):
        init(self, *a, **k)
        self.seen = _SeenAll()

    monkeypatch.setattr(StepGraphs, "capture", capture)
    monkeypatch.setattr(StepGraphs, "__init__", init_seeing_all)
    rt = tiny_runtime(seed=0)
    rt.cuda_graphs = True
    graphable = []  # per executed scale: does graph mode capture it (or keep it eager)?
    run_core = GenState.run_core
    monkeypatch.setattr(GenState, "run_core", lambda self, si, plan, *a: graphable.append(
        (si, self.graphs.key(self, si, plan, *a) is not None)) or run_core(self, si, plan, *a))
    c = resolve_method(preset, model="tiny")
    knobs = c.knobs
    toy_decisions = resolve_method("skipvar_toy").knobs["decision_models"]
    if "decision_models" in knobs:  # SkipVAR's released decision models are weights: the toy's stand in
        knobs["decision_models"] = toy_decisions
    members = knobs.get("policies") if c.name == "compose" else [{"name": c.name, "knobs": knobs}]
    for m in members or []:
        if m["name"] == "skipvar" and "decision_models" in (m.get("knobs") or {}):   # a composed member's too
            m["knobs"]["decision_models"] = toy_decisions
        if m["name"] == "scalekv":   # the released budgets are data (not shipped) for 32/40 blocks: one of their shape
            from varbench.policies.scalekv import RELEASED_BASE_CAPACITY, synthetic_budgets

            kn = m["knobs"] if m["knobs"] is knobs else m.setdefault("knobs", {})
            base = kn.get("base_capacity", RELEASED_BASE_CAPACITY)
            kn.update(budget_file=None, budgets=synthetic_budgets(scale_schedule(1.0, PN), 4, base_capacity=base))
    reads_decision_models = any(m["name"] == "skipvar" and (m.get("knobs") or {}).get("decision_models")
                                for m in members or [])
    if reads_decision_models and (why := missing_decision_model_deps("skops")):
        # the device image has no scikit-learn/skops (the optional `skipvar` extra): say so, not crash
        pytest.skip(f"{preset}: {why}")
    policy = build_policy(c.name, **knobs)
    out = rt.generate(["two blue squares"], [3], policy, pn=PN, cfg=3.0, decode=False)
    acted = [t["si"] for t in out.trace if not t["ran"] or t["rows"] != 2 * t["batch"]
             or any(b["mode"] != "full" or b.get("kv_evicted") or "attn_pairs" in b for b in t["blocks"])]
    if preset == "baseline" or preset not in IDLE_ON_TINY:  # else only the baseline's path would be checked
        assert (preset == "baseline") == (not acted), f"{preset}: scales the method acted on: {acted}"
    # a shipped preset's steps are all graphed (a selector that is not a dataclass would keep its scale eager)
    assert graphable and all(ok for _, ok in graphable), f"{preset}: scales run eagerly: {[si for si, ok in graphable if not ok]}"
    assert not detector.found, f"{preset}: a captured step reads device values on the host: {sorted(set(detector.found))}"
