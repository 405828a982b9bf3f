"""Memory of a generation: the analytic model (KV cache, weights) and the measured peak.

    kv = kv_plan_bytes(cfg, trace, torch.bfloat16)        # trace: the runtime's, or flops.plan_trace's
    kv.allocated, kv.used_peak, kv.used_per_scale         # integer bytes
    weights_bytes(cfg, torch.bfloat16)                    # {"transformer", "vae"}, built on meta
    with measure_peak(device) as peak: rt.generate(...)   # peak["bytes"], peak["kind"]

**The KV cache** (`varbench.engine.kv_cache.KVCache`) holds, per block, one buffer
(2, rows, heads, capacity, head_dim) for K and V, allocated at the block's first append and kept
for the whole generation; `capacity` is every token of the schedule (static shapes for CUDA
graphs). A cached position of one row in one block costs 2 * embed_dim * element size bytes
(`kv_position_bytes`; K/V are fp32 in fp32 runs, bf16 otherwise). So:

- *allocated* = sum over blocks that ever append of rows_at_first_append * capacity * position
  bytes: what the cache holds. Pruning tokens (FastVAR's `prune_kv`), skipping a scale or
  dropping the unconditional rows (SkipVAR) do **not** change it: the buffers are preallocated.
  A block skipped at every scale allocates nothing; a KV budget that sizes buffers per block
  (`capacity` as a per-block list) does, plus the one staging buffer shared by all blocks that
  such a budget needs while a block holds its kept positions and a whole scale (`staging`).
- *used* after a scale = sum over blocks of rows_in_use * positions_cached * position bytes:
  what attention can read. Pruned K/V append fewer positions, a skipped scale or block appends
  none, `drop_uncond` halves the rows in use from that scale on, and a KV budget (`budget`:
  the positions a block keeps after a scale, the rest evicted for good) caps the positions.

The runtime records both per scale in its trace entries (`kv_bytes_allocated`, `kv_bytes_used`,
from `KVCache.nbytes()`: tensor shapes, no device read), and
`tests/engine/test_memory.py` checks that this model gives the same integers from the plans alone.

**Weights**: the transformer's parameters and buffers as the runtime holds them (blocks in the
run's dtype, the rest fp32) and the VAE's (fp32), counted on a model built on the meta device.

**Measured peak** (`measure_peak`): CUDA: `torch.cuda.max_memory_allocated` after
`reset_peak_memory_stats` at entry (weights, KV cache, activations, the graph pool; no context,
no fragmentation). CPU: the process's resident-set high-water mark (Linux `VmHWM`, reset at entry
through `/proc/self/clear_refs`; where that cannot be reset, `getrusage`'s `ru_maxrss`, the
process's peak since it started: the kind says which). RSS also holds the text encoder, the VAE,
Python and torch's own pages, so on the CPU compare it across methods of one job setup only.
"""
from __future__ import annotations

import contextlib
import dataclasses
import resource
import sys
from typing import Iterator, Mapping, Optional, Sequence

import torch

from varbench.core.aliases import moved_names

#: the peak's kinds, as records name them
PEAK_CUDA = "cuda_max_memory_allocated"
PEAK_RSS = "cpu_rss_hwm"                 # VmHWM over the measured call
PEAK_RSS_LIFETIME = "cpu_ru_maxrss"      # the process's peak RSS since it started (could not reset)


def kv_cache_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the runtime caches K/V in for a run in `dtype` (`GenState.kv_dtype`'s rule; HART's under
    fp16/bf16 autocast: that dtype)."""
    return torch.float32 if dtype == torch.float32 else dtype


def kv_position_bytes(cfg, dtype: torch.dtype) -> int:
    """Bytes of one cached position of one row in one block: K and V, heads * head_dim each."""
    el = torch.empty((), dtype=kv_cache_dtype(dtype)).element_size()
    return 2 * cfg.num_heads * cfg.head_dim * el


@dataclasses.dataclass(frozen=True)
class KVBytes:
    """The KV cache of one generation (the whole batch), in bytes."""

    allocated: int                     # buffers held at the end (and from the first scale on)
    used_per_scale: list[int]          # bytes in use after each scale
    allocated_per_block: list[int]
    rows: int                          # rows of the buffers as allocated (2B with CFG)
    staging: int = 0                   # bytes of the shared staging buffer (in `allocated`, not per block)

    @property
    def used_peak(self) -> int:
        return max(self.used_per_scale, default=0)

    def per_image(self, batch: int) -> "KVBytes":
        """One image's share (every quantity is a multiple of the batch: rows are per image)."""
        return KVBytes(self.allocated // batch, [u // batch for u in self.used_per_scale],
                       [a // batch for a in self.allocated_per_block], self.rows // batch, self.staging // batch)


def kv_plan_bytes(cfg, trace: Sequence[Mapping], dtype: torch.dtype,
                  capacity: int | Sequence[int] | None = None,
                  budget: Optional[Mapping[tuple[int, int], int]] = None, staging: int = 0) -> KVBytes:
    """The KV bytes of a generation from its per-scale trace entries (the runtime's
    `GenerationOutput.trace` of one (sub-)batch, or `varbench.engine.flops.plan_trace` from plans
    alone: entries with ``ran``, ``rows``, ``tokens`` and per block ``mode`` and ``qkv``, the
    positions it appended).

    `capacity`: positions per block buffer; None = every token of the schedule (the runtime's
    rule), an int for all blocks, or one per block (a budget that sizes buffers per block).
    `budget`: {(scale, block): positions} the block keeps after that scale (the rest evicted for
    good; absent = keep all). Without `budget` the positions equal the trace's ``kv`` counts.
    `staging`: positions of the runtime's one staging buffer shared by all blocks
    (`varbench.engine.kv_cache.kv_staging_capacity` of the capacities; 0: none, the baseline). It is
    allocated with the first block's buffer (that block's rows) and counted in `allocated`, never in
    used (`KVCache.nbytes`); during a scale a block may hold up to it, after the scale at most its
    own capacity, except at the last scale, where the runtime drops the staged K/V unread (the
    block keeps what it held before). With the plans' budgets, capacities and this, `allocated`
    equals `varbench.engine.kv_cache.analytic_kv_bytes` (tested)."""
    depth = max((len(tr["blocks"]) for tr in trace if tr["ran"]), default=0)
    cap = [sum(tr["tokens"] for tr in trace)] * depth if capacity is None else (
        [int(capacity)] * depth if isinstance(capacity, int) else [int(c) for c in capacity])
    if len(cap) != depth:
        raise ValueError(f"capacity gives {len(cap)} blocks but the trace has {depth}")
    pos = kv_position_bytes(cfg, dtype)
    alloc_rows: list[Optional[int]] = [None] * depth
    length = [0] * depth
    rows = 0
    used = []
    stage_rows = None                  # the staging buffer takes the rows of the first block's buffer
    for t, tr in enumerate(trace):
        before = list(length)
        if tr["ran"]:
            rows = tr["rows"]          # drop_uncond: the rows in use shrink to the batch from here on
            for bi, blk in enumerate(tr["blocks"]):
                if blk["mode"] == "skip":
                    continue
                if alloc_rows[bi] is None:
                    alloc_rows[bi] = rows
                    stage_rows = rows if stage_rows is None else stage_rows
                length[bi] += blk["qkv"]
                if length[bi] > max(cap[bi], staging):
                    raise ValueError(f"scale {tr['si']} block {bi}: {length[bi]} cached positions exceed the "
                                     f"buffer's capacity {cap[bi]}" + (f" and the staging buffer's {staging}" if staging else ""))
        if budget:
            for bi in range(depth):
                keep = budget.get((tr["si"], bi))
                if keep is not None:
                    length[bi] = min(length[bi], int(keep))
        for bi in range(depth):
            if length[bi] > cap[bi]:   # still staged after the scale
                if t != len(trace) - 1:
                    raise ValueError(f"scale {tr['si']} block {bi}: keeps {length[bi]} positions after the scale but its "
                                     f"buffer holds {cap[bi]} between scales (a budget or capacity too small)")
                length[bi] = before[bi]   # the last scale: its staged K/V are read and dropped (KVCache.settle)
        used.append(sum(rows * n * pos for n, r in zip(length, alloc_rows) if r is not None))
    per_block = [0 if r is None else r * c * pos for r, c in zip(alloc_rows, cap)]
    stage = 0 if stage_rows is None else stage_rows * int(staging) * pos
    return KVBytes(sum(per_block) + stage, used, per_block, max((r for r in alloc_rows if r is not None), default=0),
                   stage)


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes a tensor holds. A tensor subclass that wraps others (torchao's quantised weights,
    `runtime.quant`) holds its inner tensors (int8 payload + scales), not numel x its nominal dtype."""
    if type(t) not in (torch.Tensor, torch.nn.Parameter) and hasattr(t, "__tensor_flatten__"):
        names, _ = t.__tensor_flatten__()
        return sum(tensor_bytes(getattr(t, n)) for n in names)
    return t.numel() * t.element_size()


def module_bytes(module: torch.nn.Module) -> int:
    """Bytes of a module's parameters and buffers as held (their dtypes; quantised weights by their payload)."""
    return sum(tensor_bytes(t) for t in (*module.parameters(), *module.buffers()))


# ----------------------------------------------------------------------------- measured peak
def _vm_hwm() -> Optional[int]:
    """This process's resident-set high-water mark in bytes (Linux), else None."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _reset_hwm() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0: ``5`` into ``/proc/self/clear_refs``)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _ru_maxrss() -> int:
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(r) if sys.platform == "darwin" else int(r) * 1024    # bytes on macOS, KiB on Linux


@contextlib.contextmanager
def measure_peak(device: torch.device | str) -> Iterator[dict]:
    """The peak memory of the enclosed work: yields a dict filled on exit with ``bytes`` and
    ``kind`` (`PEAK_CUDA`, `PEAK_RSS`, or `PEAK_RSS_LIFETIME` where the RSS peak cannot be
    reset); on CUDA also ``reserved_bytes`` (`max_memory_reserved`), ``nvml_bytes`` and ``nvml_note``
    (the driver's reading after the work, `varbench.engine.nvml`; None and why where there is none);
    None on the CPU. Reads allocator counters, NVML and /proc only: no device synchronisation."""
    device = torch.device(device)
    out: dict = {"bytes": None, "kind": None, "reserved_bytes": None, "nvml_bytes": None, "nvml_note": None}
    if device.type == "cuda":
        from varbench.engine.nvml import nvml_used_bytes

        torch.cuda.reset_peak_memory_stats(device)
        yield out
        nvml, note = nvml_used_bytes(device)
        # as papers report memory: the allocator's reserved peak (allocated + its cached blocks) and
        # the driver's reading (adds the CUDA context and library workspaces; varbench.engine.nvml)
        out.update(bytes=int(torch.cuda.max_memory_allocated(device)), kind=PEAK_CUDA,
                   reserved_bytes=int(torch.cuda.max_memory_reserved(device)), nvml_bytes=nvml, nvml_note=note)
        return
    reset = _reset_hwm()
    yield out
    hwm = _vm_hwm() if reset else None
    out.update(bytes=hwm, kind=PEAK_RSS) if hwm is not None else out.update(bytes=_ru_maxrss(), kind=PEAK_RSS_LIFETIME)


# ----------------------------------------------------------------------------- trace rows -> record
def image_memory(trace_scales: Sequence[Mapping], peak: Optional[Mapping]) -> dict:
    """One image's trace-row ``memory`` block: the most KV bytes its share of the cache held and
    used over its scales (None for scales from a runtime that did not record them), the most bytes
    its attention plans' memory held (remembered key indices and O_cache: SparVAR; 0 without), and
    the peak of the generation call that made it (its whole batch)."""
    alloc = [s["kv_bytes_allocated"] for s in trace_scales if s.get("kv_bytes_allocated") is not None]
    used = [s["kv_bytes_used"] for s in trace_scales if s.get("kv_bytes_used") is not None]
    attn = [s["attn_memory_bytes"] for s in trace_scales if s.get("attn_memory_bytes") is not None]
    return {"kv_bytes_allocated": max(alloc) if alloc else None, "kv_bytes_used_peak": max(used) if used else None,
            "attn_memory_bytes_peak": max(attn) if attn else None,
            "peak_bytes": (peak or {}).get("bytes"), "peak_kind": (peak or {}).get("kind"),
            "peak_reserved_bytes": (peak or {}).get("reserved_bytes"), "nvml_bytes": (peak or {}).get("nvml_bytes"),
            "nvml_note": (peak or {}).get("nvml_note")}


def _max_of(mem: Sequence[Mapping], key: str) -> Optional[int]:
    """The most of ``key`` over the rows that have it (None when none has: CPU, or rows stored before it)."""
    vals = [m[key] for m in mem if m.get(key) is not None]
    return max(vals) if vals else None


def memory_summary(rows: Sequence[Mapping], batch: int, weights: Optional[Mapping[str, int]], dtype: str) -> Optional[dict]:
    """The record's ``memory`` block from the entry's trace rows (``varbench.harness.schema.Memory``);
    None when no row carries memory (rows stored before it was recorded)."""
    import statistics

    mem = [r["memory"] for r in rows if isinstance(r.get("memory"), Mapping)]
    if not mem or len(mem) != len(rows):
        return None

    def mean(key):
        vals = [m[key] for m in mem if m.get(key) is not None]
        return statistics.fmean(vals) if len(vals) == len(mem) else None

    scales = [[s.get("kv_bytes_used") for s in r["scales"]] for r in rows]
    per_scale = [statistics.fmean(col) if all(v is not None for v in col) else None for col in zip(*scales)]
    kinds = {m.get("peak_kind") for m in mem if m.get("peak_bytes") is not None}
    peak = max(m["peak_bytes"] for m in mem if m.get("peak_bytes") is not None) if len(kinds) == 1 else None
    kv = mean("kv_bytes_allocated")
    wt = sum(weights.values()) if weights else None
    return {"kv_bytes_allocated": kv, "kv_bytes_used_peak": mean("kv_bytes_used_peak"), "kv_bytes_per_scale": per_scale,
            "attn_memory_bytes_peak": mean("attn_memory_bytes_peak"),
            "kv_dtype": dtype, "batch": int(batch),
            "peak_bytes": peak, "peak_kind": kinds.pop() if len(kinds) == 1 else ("mixed" if kinds else None),
            "peak_measured": "generation",
            "peak_reserved_bytes": _max_of(mem, "peak_reserved_bytes"), "nvml_bytes": _max_of(mem, "nvml_bytes"),
            "nvml_note": next((m["nvml_note"] for m in mem if m.get("nvml_note")), None),
            "weights_bytes": dict(weights) if weights else None,
            "analytic_peak_bytes": None if kv is None or wt is None else int(wt + kv * batch)}


#: names that moved into a backbone's folder, still read from here (with a DeprecationWarning)
__getattr__ = moved_names(__name__)
