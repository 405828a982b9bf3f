"""CUDA graphs of scale steps: capture once, replay, and fall back to eager when capture fails.

On a GPU an eager scale step is ~40 kernel launches per block; replayed from a CUDA graph it is one
launch per scale. `StepGraphs` keeps the graphs of one generation state (`GenState.graphs`, set by
the runtime on the whole-batch states it keeps alive between calls in graph mode). A state is any
backbone's whose step is `state.core(si, plan, cfg, tau, top_k, top_p)` with static shapes (today
Infinity's `GenState`; its output is a `StepOut` of static tensors):

- a step is keyed by everything a graph bakes in (`key`): scale, plan shape, KV lengths, the
  addresses of the residuals it may read, sampling settings. A key's first sighting runs eagerly
  (allocations, lazy inits and kernel compilation happen there), its second is captured, later
  ones replay;
- kept indices are copied into static buffers (a replay reads their addresses, so a plan's
  indices may change between generations, their shape may not);
- after a replay the host-side KV lengths are restored to what the captured step left;
- a failed capture (driver, stream capture refused) undoes the capture's host-side effects (KV
  lengths, generator offsets), turns graph mode off for the runtime (`fall_back`, one warning
  naming `runtime.cuda_graphs=false`) and runs the step eagerly.

Every captured step of a runtime allocates from one memory pool (`InfinityRuntime.graph_pool`).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

import torch

from varbench.engine.plan import ScalePlan


@dataclasses.dataclass
class _CapturedStep:
    graph: "torch.cuda.CUDAGraph"
    out: Any                             # the state's step output (Infinity: `StepOut`), static tensors:
                                         # every replay overwrites them
    kv_len: list                         # KV lengths after the step (host state the replay must restore)


class StepGraphs:
    """The captured scale steps of one generation state, and what their replays read."""

    def __init__(self, rt):
        """`rt`: the `InfinityRuntime` (its device, its shared `graph_pool`, and `fall_back`)."""
        self.rt = rt
        self.steps: dict = {}                  # key -> _CapturedStep
        self.seen: set = set()                 # keys run once eagerly (captured at the second sighting)
        self.keep_buffers: dict = {}           # static copies of plans' kept indices, read by graphs
        self.static_ptrs: set = set()          # residual tensors that are captured steps' outputs

    def run(self, state, si: int, plan: ScalePlan, cfg, tau, top_k, top_p):
        """`state.core(...)` for scale si, eager or through a CUDA graph: first sighting of a key
        eager, second captured, then replayed. Returns the step's `StepOut` (bits and entropy
        copied out of a replay's static tensors)."""
        key = self.key(state, si, plan, cfg, tau, top_k, top_p)
        if key is None:
            return state.core(si, plan, cfg, tau, top_k, top_p)
        plan = self._static_keeps(si, plan)
        step = self.steps.get(key)
        if step is None:
            if key not in self.seen:  # allocations, lazy inits and kernel compilation happen here
                self.seen.add(key)
                return state.core(si, plan, cfg, tau, top_k, top_p)
            kv_len, rng = list(state.kv.len), [g.get_state() for g in state.generators]
            try:
                graph, out = self.capture(state, lambda: state.core(si, plan, cfg, tau, top_k, top_p))
            except Exception as err:  # noqa: BLE001 - any capture failure: degrade to eager, don't die
                # a capture runs nothing on the device: undo its host-side effects and run the step eagerly
                state.kv.len, state.kv.staged = kv_len, None
                for g, st in zip(state.generators, rng):
                    g.set_state(st)
                state.graphs = None
                self.rt.fall_back("runtime.cuda_graphs", err)
                return state.core(si, plan, cfg, tau, top_k, top_p)
            if out.residual_store is not None:
                self.static_ptrs.update(t.data_ptr() for t in out.residual_store.values())
            self.static_ptrs.update(t.data_ptr() for m in out.attn_memory.values() for t in m.tensors())
            step = self.steps[key] = _CapturedStep(graph, out, list(state.kv.len))
        else:
            step.graph.replay()
        state.kv.len = list(step.kv_len)
        out = step.out  # static tensors: overwritten by the next replay, so keep copies of what outlives it
        return dataclasses.replace(out, bits=out.bits.clone(), entropy=out.entropy.clone(),
                                   residual_change={r: c.clone() for r, c in out.residual_change.items()})

    def capture(self, state, fn):
        """Capture `fn` (one scale step of `state`) as a CUDA graph, then replay it once (capture
        runs nothing). The tests stand in for it to run graph mode's bookkeeping on the CPU."""
        if self.rt.graph_pool is None:
            self.rt.graph_pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        for g in state.generators:  # per-image generators advance on every replay as in eager mode
            graph.register_generator_state(g)
        with torch.cuda.graph(graph, pool=self.rt.graph_pool):
            out = fn()
        graph.replay()
        return graph, out

    def key(self, state, si: int, plan: ScalePlan, cfg, tau, top_k, top_p) -> Optional[tuple]:
        """Everything a captured step bakes in: the plan's shape (not its kept indices, which are
        copied into static buffers), its KV budgets (with the KV lengths they decide whether a block
        evicts), the KV lengths, and the addresses of the residuals it may read.
        None (run eagerly): the plan has a selector that is not a dataclass (no stable signature), or
        residuals of an eager step are alive (a graph would read their soon-freed memory)."""
        blocks = []
        if any(bp.pad is not None for bp in plan.blocks.values()) or any(m is not None for m in getattr(state.kv, "mask", ())):
            return None   # a padded batch (per-image shapes, `varbench.engine.padded_batch`) runs eagerly
        for bi, bp in sorted(plan.blocks.items()):
            sel = None
            if bp.selector is not None:
                if not dataclasses.is_dataclass(bp.selector):
                    return None
                sel = (type(bp.selector).__qualname__, dataclasses.astuple(bp.selector))
            blocks.append((bi, bp.mode, bp.n_keep, tuple(bp.sublayers), bp.fill, bp.cache_from, bp.prune_kv,
                           None if bp.keep is None else tuple(bp.keep.shape), sel))
        kv = []
        for bi, kb in sorted(plan.kv.items()):
            if kb.keep is not None or not dataclasses.is_dataclass(kb.selector):
                return None   # fixed positions (a forced test selection) or an opaque selector: eager
            kv.append((bi, kb.n_keep, kb.sel_queries, type(kb.selector).__qualname__, dataclasses.astuple(kb.selector)))
        residuals = tuple((src, k, t.data_ptr()) for src, d in sorted(state.residuals.items()) for k, t in sorted(d.items()))
        if any(ptr not in self.static_ptrs for *_, ptr in residuals):
            return None  # residuals from an eager step live in memory a graph must not hold on to
        attn = tuple((bi, ap.kind, ap.group, ap.n_keys, ap.remember, ap.use_o_cache, ap.block,
                      None if ap.local is None else tuple(ap.local.shape),
                      None if ap.block_mask is None else tuple(ap.block_mask.shape)) for bi, ap in sorted(plan.attn.items()))
        memory = tuple((bi, tuple(t.data_ptr() for t in m.tensors()))
                       for bi, m in sorted(getattr(state, "attn_memory", {}).items()))
        if any(ptr not in self.static_ptrs for _, ptrs in memory for ptr in ptrs):
            return None  # attention memory an eager step wrote: same reason as its residuals
        return (si, tuple(blocks), plan.keep_residuals, tuple(sorted(plan.attention_entropy_for)),
                plan.attention_entropy_queries, plan.attention_entropy_sampling, state.rows, tuple(state.kv.len), residuals,
                cfg, tau, top_k, top_p, tuple(kv), attn, memory, tuple(sorted(plan.residual_change_for)),
                plan.post_fill is None, plan.code_mask is None, plan.input_resize)

    def _static_keeps(self, si: int, plan: ScalePlan) -> ScalePlan:
        """The plan with every `keep` (and its `post_fill` / `code_mask` token maps) copied into a buffer
        that lives as long as this state."""
        maps = {}
        for name in ("post_fill", "code_mask"):
            t = getattr(plan, name)
            if t is not None:
                key = (si, name, tuple(t.shape))
                buf = self.keep_buffers.get(key)
                if buf is None:
                    buf = self.keep_buffers[key] = torch.empty(t.shape, dtype=t.dtype, device=self.rt.device)
                buf.copy_(t)
                maps[name] = buf
        if maps:
            plan = dataclasses.replace(plan, **maps)
        if plan.attn:
            plan = dataclasses.replace(plan, attn={bi: self._static_attn(si, bi, ap) for bi, ap in plan.attn.items()})
        if not any(bp.keep is not None for bp in plan.blocks.values()):
            return plan
        blocks = {}
        for bi, bp in plan.blocks.items():
            if bp.keep is not None:
                key = (si, bi, tuple(bp.keep.shape))
                buf = self.keep_buffers.get(key)
                if buf is None:
                    buf = self.keep_buffers[key] = torch.empty(bp.keep.shape, dtype=torch.long, device=self.rt.device)
                buf.copy_(bp.keep)
                bp = dataclasses.replace(bp, keep=buf)
            blocks[bi] = bp
        return dataclasses.replace(plan, blocks=blocks)

    def _static_attn(self, si: int, bi: int, ap):
        """An attention plan whose tensors (local keys, block mask) are copied into buffers that live
        as long as this state, as `keep` indices are: a graph reads their addresses."""
        fields = {}
        for name in ("local", "block_mask"):
            t = getattr(ap, name)
            if t is None:
                continue
            key = (si, bi, name, tuple(t.shape), t.dtype)
            buf = self.keep_buffers.get(key)
            if buf is None:
                buf = self.keep_buffers[key] = torch.empty(t.shape, dtype=t.dtype, device=self.rt.device)
            buf.copy_(t)
            fields[name] = buf
        return dataclasses.replace(ap, **fields) if fields else ap


def graph_keys(rt) -> int:
    """How many step keys the runtime's kept generation states have met (run once eagerly, or captured):
    it grows while graph mode is still warming up. A generation that adds none captured nothing and
    will capture nothing the next time (same inputs): from then on a timed call only replays. A chain of
    steps that read the previous step's residuals (NOVA) settles one step per generation, since a step
    reading an eager step's residuals stays eager (`StepGraphs.key`) until that step is captured."""
    total = 0
    for state in getattr(rt, "_graph_states", {}).values():
        g = getattr(state, "graphs", None)
        if g is not None:
            total += len(g.seen) + len(g.steps)
    return total

