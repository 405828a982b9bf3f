"""`runtime.compile`: torch.compile of the per-block work of a scale step, for every method.

    rt.block_ops = block_ops("default", fullgraph=False)   # what `configure_runtime` does
    rt.block_ops = EAGER_OPS                               # the default: today's functions, unchanged bits

The seam. A scale step (`GenState.core`) mixes device work with host bookkeeping (the KV cache's
lengths, the plan's branches, per-image generators), so it is not compiled whole. What is compiled
is the pure tensor work of a block around its self-attention, in `BlockOps`:

- `block_in(bc, x, table)`: the modulated LayerNorm, the fused q/k/v projection, q/k normalisation
  and RoPE (a full block's whole input side);
- `block_out(bc, x, attn)`: the SA output projection and its gated residual, cross-attention, the
  FFN and its gated residual (a full block's whole output side);
- `qkv_rope`, `sa_out`, `cross_attention`, `ffn`: the same pieces one by one, for blocks under a
  plan (`pruned.planned_block`: gathers and residual caches stay eager between them).

Self-attention over the KV cache and the cache append stay eager between `block_in` and
`block_out`: the cache's lengths are host ints that grow every scale (each would be a guard and a
recompile), and the attention backend knob (`runtime.attn_backend`) then applies to it as it does
without compile. Every method runs its full blocks through `block_in`/`block_out` and its planned
blocks through the pieces, so compile composes with every method.

Shapes are static (`dynamic=False`): a scale's token count and the rows (CFG dropped or not) pick
one specialised graph each, compiled at its first sighting, i.e. in the first generation (the job's
image stage, or the timed pass's warm-up). The recompile limit is raised to `RECOMPILE_LIMIT` so
the 13 scales x plan shapes of a generation never silently fall back to eager (dynamo's default 8
would). A dynamic-shape graph would compile once but round differently per shape and is not what
CUDA graphs can replay.

Compile and CUDA graphs. `reduce-overhead` and `max-autotune` bring inductor's own CUDA graphs
(cudagraph trees); captured inside our scale-step graphs (`varbench.engine.graphs`) the two would
fight over capture and memory pools. Decision: with those modes `runtime.cuda_graphs=auto` turns
our graphs off (theirs replace them) and `runtime.cuda_graphs=true` is refused at the config
boundary; `default` has no CUDA graphs of its own and composes with ours (the compiled kernels
run at a step's first, eager sighting, then are captured with the step).

Numerics: compiled kernels fuse elementwise chains and may reorder reductions, so a compiled run is
not the eager run bit for bit (the image store key moves with `runtime.compile`); the test suite
measures the difference on the tiny model (tests/engine/test_compiled.py).
"""
from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Callable

import torch

from varbench.engine.backbones.infinity.block_step import cross_attention, ffn, modulated_norm, qkv_rope, sa_out

#: the values of `runtime.compile` (off: eager, the default)
COMPILE_MODES = ("off", "default", "reduce-overhead", "max-autotune")
#: modes whose inductor output brings its own CUDA graphs (they replace ours: see the module docstring)
MODES_WITH_OWN_CUDA_GRAPHS = ("reduce-overhead", "max-autotune")
#: recompiles allowed per compiled function: one graph per (scale shape, rows, plan shape)
RECOMPILE_LIMIT = 256


def block_in(bc, x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """A full block's input side: modulated LayerNorm, then `qkv_rope` -> (3, rows, H, n, c)."""
    return qkv_rope(bc, modulated_norm(x, bc.scale1, bc.shift1, bc.eps), table)


def block_out(bc, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
    """A full block's output side after self-attention: gated SA residual, cross-attention, gated FFN."""
    x = torch.addcmul(x, sa_out(bc, attn), bc.g1)
    x = x + cross_attention(bc, x)
    return torch.addcmul(x, ffn(bc, x), bc.g2)


@dataclasses.dataclass(frozen=True)
class BlockOps:
    """The block functions a scale step calls (eager, or compiled by `block_ops`)."""

    block_in: Callable
    block_out: Callable
    qkv_rope: Callable
    sa_out: Callable
    cross_attention: Callable
    ffn: Callable
    mode: str = "off"
    fullgraph: bool = False


#: the default: the module functions themselves, so the eager path runs exactly today's ops
EAGER_OPS = BlockOps(block_in=block_in, block_out=block_out, qkv_rope=qkv_rope, sa_out=sa_out,
                     cross_attention=cross_attention, ffn=ffn)


def block_ops(mode: str, fullgraph: bool = False) -> BlockOps:
    """`EAGER_OPS` for mode "off", else every function of it through `torch.compile(mode=...,
    fullgraph=..., dynamic=False)`. `fullgraph=True` makes a graph break an error instead of a silent
    split (a check that the whole block compiles as one graph; costs nothing when it does)."""
    if mode not in COMPILE_MODES:
        raise ValueError(f"runtime.compile must be one of {', '.join(COMPILE_MODES)}, got {mode!r}")
    if mode == "off":
        return EAGER_OPS
    import torch._dynamo.config as dynamo_config

    # a generation meets one shape per scale (and per plan shape): never fall back to eager silently
    dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, RECOMPILE_LIMIT)
    dynamo_config.accumulated_recompile_limit = max(dynamo_config.accumulated_recompile_limit, 8 * RECOMPILE_LIMIT)
    opts = {"mode": None if mode == "default" else mode, "fullgraph": bool(fullgraph), "dynamic": False}
    fns = {f.name: torch.compile(getattr(EAGER_OPS, f.name), **opts)
           for f in dataclasses.fields(BlockOps) if f.name not in ("mode", "fullgraph")}
    return BlockOps(**fns, mode=mode, fullgraph=bool(fullgraph))


def compile_counters() -> dict:
    """Dynamo's counters so far in this process: graphs compiled ("unique_graphs") and graph breaks
    (a record states how much compiling a run did; with `fullgraph` the breaks are 0)."""
    from torch._dynamo.utils import counters

    return {"unique_graphs": int(counters["stats"]["unique_graphs"]),
            "graph_breaks": int(sum(counters["graph_break"].values()))}


class CompileLog:
    """Compile time apart from the steady state: the wall time of the generations during which
    something was compiled (a new scale shape or plan shape: compile + one run), the first
    generation's, and how many graphs and graph breaks they made. A generation that compiled
    nothing is steady state (what the timed pass's repeats measure once its warm-up compiled)."""

    def __init__(self):
        self.first_call_s: float | None = None
        self.compiling_calls = 0
        self.compiling_s = 0.0
        self.graphs = 0
        self.graph_breaks = 0
        self.calls = 0

    @contextlib.contextmanager
    def watch(self):
        """Around one generation (`InfinityRuntime.generate`)."""
        before, t0 = compile_counters(), time.perf_counter()
        yield
        dt, after = time.perf_counter() - t0, compile_counters()
        self.calls += 1
        if self.first_call_s is None:
            self.first_call_s = dt
        new = after["unique_graphs"] - before["unique_graphs"]
        if new:
            self.compiling_calls += 1
            self.compiling_s += dt
            self.graphs += new
        self.graph_breaks += after["graph_breaks"] - before["graph_breaks"]

    def summary(self) -> dict:
        """{"first_call_s", "compiling_calls", "compiling_s", "graphs", "graph_breaks", "calls"}."""
        return {"first_call_s": self.first_call_s, "compiling_calls": self.compiling_calls,
                "compiling_s": self.compiling_s, "graphs": self.graphs, "graph_breaks": self.graph_breaks,
                "calls": self.calls}
