"""Run the CUDA code path of `InfinityRuntime.generate` / `HartRuntime.generate` without a GPU, at the real shapes.

    with FakeCuda() as fc:
        rt = fc.runtime("infinity_2b")                 # built on meta, materialised as fake CUDA
        out = fc.generate(rt, policy, batch=8)         # cfg 4, 1024², bf16, cuda_graphs off
    fc.report                                          # peak bytes, ops per scale, attention backends

    with FakeCuda() as fc:
        rt = fc.hart_runtime("hart_0p7b")              # HART-0.7B + tokenizer decoder, fp16 autocast
        out = fc.generate(rt, policy, batch=2, cfg=4.5, more_smooth=True)

Everything runs under `torch._subclasses.fake_tensor.FakeTensorMode`: tensors have real shapes,
dtypes, strides and devices (`cuda:0`) but no data and no memory, so a device mismatch, a wrong
dtype or a shape error fails here as it would on the GPU. What the mode cannot do is stood in, and
each stand-in is stated:

- Host reads *inside a scale step* (`GenState.run_core`, HART's `HartState.step`) are errors: `_local_scalar_dense`
  (`.item()`, `int(t)`, `.tolist()`) raises under fake tensors, ops with value-dependent output
  shapes (`nonzero`, boolean indexing) raise, and the ops `tests/engine/test_cuda_graphs.py` lists as host
  reads (`HOST_READS`, e.g. `torch.tensor(<host data>)` inside a step) raise `HostReadInStep`.
- Host reads *between steps* are allowed, as on the GPU. Small tensors made outside steps from host
  data (the text mask, `torch.ones`, ...) carry a real CPU "shadow" computed alongside (at most
  `SHADOW_NUMEL` elements), so the runtime's one-off reads before the loop (text lengths) get their
  true values. Policies see stand-ins: `StandInPolicy` hands `observe` real CPU tensors of the
  signals' shapes and dtypes filled with seeded random values (entropies uniform in [0, ln 2] for
  tokens and [0, ln(keys)] for attention, logits N(0, 1), block-range residual changes uniform in
  [0, 1], query positions evenly spaced over the scale) and runs `reset`/`plan`/`observe` on the
  CPU (`ctx.device="cpu"`); the plan's kept indices (and its post-block fill and code mask) reach
  the step as fake CPU tensors and the runtime moves them to the device as it does
  for any host plan. An entropy-driven method's *decisions* depend on the weights anyway: the dry
  run checks that its machinery runs at the real shapes, not which plan a trained model would get.
  SkipVAR's intermediate decode runs the real VAE on fake tensors (its memory counts) and gives
  the features random pixels of the decoded shape.
- Attention: SDPA on fake tensors would fall back to the math kernel (no device to ask), which
  materialises the L x Lk scores. The dry run chooses (after autocast's cast of the inputs, when
  autocast is on) as CUDA's dispatcher does for these inputs
  (`torch._C._get_sdp_priority_order()`; flash-attn for bf16/fp16 without a mask and head dim
  <= 256 % 8, memory-efficient for fp32 or a mask, else math) and calls that kernel's meta
  function. Every call's backend and dtypes are recorded (`report["attention"]`).
- The Triton entropy kernel is not launched: its wrapper runs (casts, output allocation, strides)
  and the launch is replaced by a check that every argument tensor is on the CUDA device. FlexAttention
  (a block-sparse attention plan, `varbench.engine.kernels.flex_block_mask`) is not compiled: the call
  checks its inputs' devices, is recorded with backend "flex" and returns an output of q's shape.
- CUDA events and `torch.cuda.synchronize` are no-ops; a per-image generator is a CPU generator
  tagged with the CUDA device (no generator can be made without a driver). Random draws: every torch
  call given a generator (`torch.multinomial`, `torch.randn(..., generator=)`, `Tensor.exponential_`, ...;
  Infinity's bit sampling, HART's top-k sampling, its gumbel `more_smooth` mixture and its diffusion
  noise) is checked first: the generator's (tagged) device must be the op's, its tensor input's or,
  for a factory op, its `device=` (the check CUDA makes: a CPU generator on a CUDA op raises there).
  The op then runs without the generator (FakeTensorMode's refs refuse one for `exponential_`, and the
  fake kernels draw nothing anyway): the output's shape, dtype and device come from the op's own meta
  function, as with any op, so only the values (which a fake tensor has none of) are not drawn.
- Autocast: `torch.autocast("cuda")` disables itself when no CUDA driver is present; here it is let on
  (`amp_definitely_not_available` answers False), so autocast's casts run on the fake CUDA tensors
  and a dtype mismatch under fp16/bf16 autocast (HART's release runs fp16) fails as on the GPU.

Memory: every storage an op creates under the mode is counted from creation until its last tensor
is freed (weakref finalisers), rounded up to the CUDA caching allocator's 512-byte blocks, as
`torch.cuda.max_memory_allocated` counts. `peak_bytes` is the high-water mark of that count since
`reset_peak()`: weights, KV cache and live activations; tests check it against
`torch.distributed._tools.mem_tracker.MemTracker`. Allocator fragmentation, cuBLAS workspaces and
the CUDA context are not in it (they are not in `max_memory_allocated` either, except workspaces).

Ops per scale: the aten ops a scale step dispatches that launch device work (views, metadata and
allocation-only ops excluded), about the kernel launches an eager step makes; a stood-in Triton
kernel counts one.

Host syncs (`ledger.host_syncs`, by the scale they follow): between steps, every copy of a device
value to the host and every host read of one (`.item()`, `float()`, `.tolist()`); a policy's reads
of signals still on the device count too (its stand-in signals are `_OnDevice`: each read counts
one), those the runtime already copied to the host do not. On a GPU each one waits for the
device's queue to drain.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import weakref
from collections import defaultdict
from typing import Any, Optional
from unittest import mock

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode, unset_fake_temporarily
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils.weak import WeakIdKeyDictionary

from varbench.engine.plan import ScaleSignals

#: ops that read device values on the host or copy host data in (the list of tests/engine/test_cuda_graphs.py)
HOST_READS = {"_local_scalar_dense", "item", "is_nonzero", "equal", "nonzero", "masked_select", "_unique",
              "_unique2", "unique_dim", "unique_consecutive", "repeat_interleave", "bincount", "histc",
              "lift_fresh", "lift_fresh_copy"}
#: ops that launch no device work (allocation, metadata)
NO_LAUNCH = {"empty", "empty_like", "empty_strided", "empty_permuted", "_local_scalar_dense", "lift_fresh",
             "detach", "alias", "_unsafe_view", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset",
             "is_same_size", "_has_compatible_shallow_copy_type", "set_", "resize_"}
SHADOW_NUMEL = 1 << 16
BLOCK = 512   # CUDACachingAllocator's smallest block: every allocation is rounded up to it
DEVICE = torch.device("cuda", 0)


class HostReadInStep(RuntimeError):
    """A scale step read a device value on the host (a sync on the GPU, a failure in graph capture)."""


class DeviceMismatch(RuntimeError):
    """A tensor or generator on another device than the op's inputs."""


# ----------------------------------------------------------------------------------- memory + ops
class _Ledger:
    """Bytes of live fake storages, their high-water mark, and per-scale op counts."""

    def __init__(self):
        self.seen = WeakIdKeyDictionary()      # live storages (weakly held) -> their rounded bytes
        self.now = self.peak = 0
        self.step: Optional[int] = None         # scale of the step being run, None between steps
        self.ops: dict[int, int] = defaultdict(int)
        self.op_names: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        #: host syncs by the scale they follow (None: before the first step): copies of device values
        #: to the host and reads of them (`.item()`, `float()`, `.tolist()`) between steps, the policy's
        #: included (`_OnDevice`); on a GPU each waits for the device to drain its queue
        self.host_syncs: dict[Optional[int], int] = defaultdict(int)
        self.last_step: Optional[int] = None

    def track(self, t: torch.Tensor) -> None:
        """Count t's storage from now until it is freed (a weakref on the storage, as MemTracker
        does: tensors themselves must stay free of weakrefs, `Module.to` swaps them)."""
        if not isinstance(t, FakeTensor) or t.device.type != "cuda":
            return
        st = t.untyped_storage()
        if st in self.seen:
            return
        nbytes = -(-st.nbytes() // BLOCK) * BLOCK
        self.seen[st] = nbytes
        self.now += nbytes
        self.peak = max(self.peak, self.now)
        weakref.finalize(st, self._release, nbytes)

    def _release(self, nbytes: int) -> None:
        self.now -= nbytes

    def reset_peak(self) -> None:
        self.peak = self.now


def _device_to_host(name: str, args, kwargs) -> bool:
    """Whether this copy brings a (fake) CUDA tensor's values to the host."""
    if name == "copy_":
        dst, src = args[0], args[1]
        return isinstance(src, torch.Tensor) and src.device.type == "cuda" and dst.device.type == "cpu"
    src, dev = args[0], kwargs.get("device")
    return isinstance(src, torch.Tensor) and src.device.type == "cuda" and dev is not None and torch.device(dev).type == "cpu"


class _OnDevice(torch.Tensor):
    """A stand-in signal for a tensor that lives on the GPU: each read of its values on the host
    (`.cpu()`, `.to("cpu")`, `.item()`, `float()`, `.tolist()`, ...) counts one host sync in the
    ledger, and gives a plain host tensor (free to read after). Ops on it stay `_OnDevice`."""

    ledger: Optional["_Ledger"] = None
    READS = {"cpu", "item", "tolist", "numpy", "__float__", "__int__", "__bool__", "__index__", "__format__", "__repr__"}

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        read = name in cls.READS or (name == "to" and any(_to_cpu_device(a) == "cpu" or a == torch.device("cpu")
                                                           for a in [*args[1:], kwargs.get("device")]))
        with torch._C.DisableTorchFunctionSubclass():
            res = func(*args, **kwargs)
        if read:
            if cls.ledger is not None:
                cls.ledger.host_syncs[cls.ledger.last_step] += 1
            return tree_map(lambda t: t.as_subclass(torch.Tensor) if isinstance(t, torch.Tensor) else t, res)
        return tree_map(lambda t: t.as_subclass(cls) if isinstance(t, torch.Tensor) and not isinstance(t, cls) else t, res)


def _to_cpu_device(v):
    if isinstance(v, torch.device) and v.type == "cuda":
        return torch.device("cpu")
    if isinstance(v, str) and v.startswith("cuda"):
        return "cpu"
    return v


class _DryRunMode(TorchDispatchMode):
    """Counts storages and ops, refuses host reads inside steps, keeps CPU shadows of small host data."""

    def __init__(self, ledger: _Ledger):
        super().__init__()
        self.ledger = ledger
        self.shadows = WeakIdKeyDictionary()   # fake tensor -> its real CPU shadow

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        led = self.ledger
        if led.step is not None:
            bool_index = name == "index" and any(isinstance(i, torch.Tensor) and i.dtype == torch.bool
                                                 for i in (args[1] if len(args) > 1 else []) if i is not None)
            if name in HOST_READS or bool_index:
                raise HostReadInStep(f"scale step {led.step}: {func} reads a device value on the host (or copies "
                                     "host data in); move it before the loop or into policy.observe")
            if name not in NO_LAUNCH and not func.is_view and func.namespace == "aten":
                led.ops[led.step] += 1
                led.op_names[led.step][name] += 1
        elif name in ("_local_scalar_dense", "item") and args[0] in self.shadows:
            led.host_syncs[led.last_step] += int(args[0].device.type == "cuda")
            with unset_fake_temporarily():
                return self.shadows[args[0]].item()
        elif name in ("_to_copy", "copy_") and _device_to_host(name, args, kwargs):
            led.host_syncs[led.last_step] += 1
        out = func(*args, **kwargs)
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                led.track(t)
        if led.step is None:
            self._shadow(func, args, kwargs, out)
        return out

    def _shadow(self, func, args, kwargs, out) -> None:
        """Outside steps: compute `func` on the CPU shadows too when every tensor input has one."""
        outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        if not outs or any(not isinstance(t, FakeTensor) or t.numel() > SHADOW_NUMEL for t in outs):
            return
        flat_in = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
        if any(a not in self.shadows for a in flat_in):
            return
        if not flat_in and func.overloadpacket.__name__.startswith("empty"):
            return  # uninitialised memory: nothing to shadow
        real_args, real_kwargs = tree_map(lambda a: self.shadows[a] if isinstance(a, torch.Tensor) else _to_cpu_device(a),
                                          (args, kwargs))
        try:
            with unset_fake_temporarily():
                res = func(*real_args, **real_kwargs)
        except Exception:  # noqa: BLE001 - a shadow is a convenience; without one a read raises as usual
            return
        for f, r in zip(outs, [r for r in tree_flatten(res)[0] if isinstance(r, torch.Tensor)]):
            if f is not None and r.shape == f.shape:
                self.shadows[f] = r


# ----------------------------------------------------------------------------------- attention
def cuda_sdpa_backend(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False) -> str:
    """The SDPA backend CUDA (sm80+) picks for these inputs: the enabled backends in the dispatcher's
    priority order, each with the input conditions of `sdp_utils.cpp` that matter here."""
    same = q.dtype == k.dtype == v.dtype
    c, cv = q.shape[-1], v.shape[-1]
    last_dense = all(t.stride(-1) == 1 for t in (q, k, v))
    names = {1: "flash", 2: "efficient", 0: "math"}
    for b in torch._C._get_sdp_priority_order():
        name = names.get(int(b))
        if name == "flash" and torch.backends.cuda.flash_sdp_enabled() and same and attn_mask is None \
                and q.dtype in (torch.float16, torch.bfloat16) and c == cv and c % 8 == 0 and c <= 256 and last_dense:
            return "flash"
        if name == "efficient" and torch.backends.cuda.mem_efficient_sdp_enabled() and same and last_dense \
                and q.dtype in (torch.float16, torch.bfloat16, torch.float32) and c % (8 if q.dtype != torch.float32 else 4) == 0:
            return "efficient"
        if name == "math" and torch.backends.cuda.math_sdp_enabled():
            return "math"
    return "math"


class _CudaSdpa(TorchFunctionMode):
    """Routes SDPA on fake CUDA tensors to the kernel CUDA would pick; records every call."""

    def __init__(self, calls: list):
        super().__init__()
        self.calls = calls

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            q, k, v = args[:3]
            if q.device.type == "cuda":
                if not (q.device == k.device == v.device):
                    raise DeviceMismatch(f"attention inputs on {q.device}, {k.device}, {v.device}")
                mask = kwargs.get("attn_mask", args[3] if len(args) > 3 else None)
                scale = kwargs.get("scale")
                if torch.is_autocast_enabled("cuda"):
                    # SDPA is on autocast's lower-precision list: its floating inputs are cast before the
                    # kernel is chosen (HART's fp32 q/k, from F.normalize, attend in fp16); this mode sits
                    # above autocast, so it casts as autocast would
                    dt = torch.get_autocast_dtype("cuda")
                    q, k, v = (t.to(dt) if t.is_floating_point() else t for t in (q, k, v))
                    mask = mask.to(dt) if mask is not None and mask.is_floating_point() else mask
                backend = cuda_sdpa_backend(q, k, v, mask)
                self.calls.append({"backend": backend, "dtype": str(q.dtype).replace("torch.", ""), "masked": mask is not None,
                                   "kv_dtype": str(k.dtype).replace("torch.", ""), "q": tuple(q.shape), "k": tuple(k.shape)})
                if backend == "flash":
                    return torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, scale=scale)[0]
                if backend == "efficient":
                    bias = None
                    if mask is not None:
                        bias = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill(~mask, float("-inf")) \
                            if mask.dtype == torch.bool else mask
                        bias = bias.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
                    return torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, bias, False, scale=scale)[0]
        return func(*args, **kwargs)


# ----------------------------------------------------------------------------------- stand-ins
class _NoEvent:
    def __init__(self, *a, **k):
        pass

    def record(self, *a, **k):
        pass

    def elapsed_time(self, other) -> float:
        return 0.0


class _StandInGenerator(torch.Generator):
    """A CPU generator tagged with the device it stands in for. A subclass carries the tag itself:
    torch.Generator takes no attributes, and before torch 2.14 it cannot be weakly referenced, so a
    side table keyed by the generator (WeakIdKeyDictionary) fails there and one keyed by id() would
    have to keep every generator alive."""

    stands_in_for: torch.device


def _tagged_generator(device, seed):
    g = _StandInGenerator()   # torch.Generator.__new__ takes the device only: set the rest afterwards
    g.manual_seed(int(seed))
    g.stands_in_for = torch.device(device)
    return g


def _same_device(a, b) -> bool:
    a, b = torch.device(a), torch.device(b)
    return a.type == b.type and (a.index or 0) == (b.index or 0)


class _StandInDraws(TorchFunctionMode):
    """Random draws given a generator (see the module docstring): the device check CUDA makes, then,
    for a stand-in generator, the call without it. At the torch-function level, where the generator is
    still the object `new_generator` returned (the dispatcher hands modes a fresh wrapper); `generator`
    is keyword-only in every torch API that takes one. Real generators on real CPU tensors (a stand-in
    policy's own draws) pass through untouched, and so do draws into meta tensors: the models are built
    on meta, where a seeded init (`nn.init.trunc_normal_(..., generator=<CPU>)`) draws nothing and no
    device can mismatch (torch >= 2.14's `nn.init` returns before drawing into a meta tensor; 2.11's
    calls `uniform_` on it)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        g = kwargs.get("generator")
        if g is not None:
            t = next((a for a in tree_flatten(args)[0] if isinstance(a, torch.Tensor)), None)
            dev = t.device if t is not None else torch.device(kwargs.get("device") or "cpu")
            if dev.type == "meta":
                return func(*args, **kwargs)
            stand_in = isinstance(g, _StandInGenerator)
            gdev = g.stands_in_for if stand_in else g.device
            if not _same_device(dev, gdev):
                name = getattr(func, "__name__", str(func))
                raise DeviceMismatch(f"{name} on {dev} with a generator on {gdev}")
            if stand_in:   # the fake kernels draw nothing; exponential_'s refs refuse a generator
                kwargs = {k: v for k, v in kwargs.items() if k != "generator"}
        return func(*args, **kwargs)


class _StandInKernel:
    """`flash_entropy.kernel(...)`: `[grid](*args)` checks the launch's tensors instead of running it."""

    def __init__(self, ledger: _Ledger):
        self.ledger = ledger

    def __call__(self, interpret):
        return self

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            devs = {a.device for a in args if isinstance(a, torch.Tensor)}
            if devs != {DEVICE}:
                raise DeviceMismatch(f"Triton entropy kernel launched with tensors on {sorted(map(str, devs))}")
            if self.ledger.step is not None:
                self.ledger.ops[self.ledger.step] += 1
                self.ledger.op_names[self.ledger.step]["triton_flash_entropy"] += 1
        return launch


class _StandInFlex:
    """`flex_block_attention(q, k, v, pattern, block)`: FlexAttention compiles a Triton kernel, which
    fake tensors cannot run. The stand-in checks the devices and dtypes, records the call (backend
    "flex") and returns the output's shape (q's), which is what the compiled kernel allocates."""

    def __init__(self, ledger: _Ledger, calls: list):
        self.ledger, self.calls = ledger, calls

    def __call__(self, q, k, v, pattern, block):
        devs = {t.device for t in (q, k, v)}   # the pattern may live on the host: the mask is built from it once
        if devs != {DEVICE}:
            raise DeviceMismatch(f"FlexAttention inputs on {sorted(map(str, devs))}")
        self.calls.append({"backend": "flex", "dtype": str(q.dtype).replace("torch.", ""),
                           "kv_dtype": str(k.dtype).replace("torch.", ""), "q": tuple(q.shape), "k": tuple(k.shape)})
        if self.ledger.step is not None:
            self.ledger.ops[self.ledger.step] += 1
            self.ledger.op_names[self.ledger.step]["flex_attention"] += 1
        return torch.empty_like(q)


class StandInPolicy:
    """Wraps a policy: its reset/plan/observe run on the CPU on stand-in signals (see the top)."""

    def __init__(self, inner, fc: "FakeCuda", seed: int = 0):
        self.inner, self.fc = inner, fc
        self.name = getattr(inner, "name", type(inner).__name__)
        self.gen = torch.Generator().manual_seed(seed)

    @property
    def per_image_decisions(self) -> bool:
        return self.inner.per_image_decisions

    @property
    def reads_signals_on_host(self) -> bool:
        return getattr(self.inner, "reads_signals_on_host", False)

    def fork(self) -> "StandInPolicy":
        """One stand-in per image (per-image decisions, `varbench.engine.batch_split`), each with its own
        stand-in draws, so the images of a batch diverge and the batch splits as it may on a GPU."""
        self._forks = getattr(self, "_forks", 0) + 1
        return StandInPolicy(self.inner.fork(), self.fc, int(self.gen.initial_seed()) + self._forks)

    def no_effect_reason(self):
        return self.inner.no_effect_reason()

    def kv_capacity(self):
        return self.inner.kv_capacity()

    def reset(self, ctx):
        with unset_fake_temporarily():
            self.inner.reset(dataclasses.replace(ctx, device="cpu"))

    def _fake(self, t: torch.Tensor) -> torch.Tensor:
        """A plan's host tensor as a fake one (a plan made from `_OnDevice` signals is one too: plain first)."""
        if isinstance(t, _OnDevice):
            with torch._C.DisableTorchFunctionSubclass():
                t = t.as_subclass(torch.Tensor)
        return self.fc.mode.from_tensor(t)

    def plan(self, si):
        with unset_fake_temporarily():
            plan = self.inner.plan(si)
        blocks = {bi: (bp if bp.keep is None else dataclasses.replace(bp, keep=self._fake(bp.keep)))
                  for bi, bp in plan.blocks.items()}
        kv = {bi: (kb if kb.keep is None else dataclasses.replace(kb, keep=self._fake(kb.keep)))
              for bi, kb in plan.kv.items()}
        attn = {bi: dataclasses.replace(ap, **{f: self._fake(getattr(ap, f))
                                               for f in ("local", "block_mask") if getattr(ap, f) is not None})
                for bi, ap in plan.attn.items()}
        maps = {name: self._fake(getattr(plan, name)) for name in ("post_fill", "code_mask")
                if getattr(plan, name) is not None}
        return dataclasses.replace(plan, blocks=blocks, kv=kv, attn=attn, **maps)

    def _standin(self, t: Optional[torch.Tensor], hi: float, n: Optional[int] = None) -> Optional[torch.Tensor]:
        if t is None:
            return None
        made = self._standin_values(t, hi, n)
        # a signal still on the device: the policy's reads of it are host syncs (counted); one the
        # runtime already copied to the host (`batch_split.host_signals`) is free to read
        return made.as_subclass(_OnDevice) if t.device.type == "cuda" else made

    def _standin_values(self, t: torch.Tensor, hi: float, n: Optional[int] = None) -> torch.Tensor:
        with unset_fake_temporarily():
            if not t.dtype.is_floating_point:   # query positions: evenly spaced over the scale's n tokens
                rows, k = t.shape
                return torch.linspace(0, n - 1, k).round().long().expand(rows, k).clone()
            if hi < 0:
                return torch.randn(t.shape, generator=self.gen).to(t.dtype)
            return (torch.rand(t.shape, generator=self.gen) * hi).to(t.dtype)

    def observe(self, si, sig: ScaleSignals):
        n = sig.h * sig.w
        kv_len = max(n, 2)   # at least this scale's tokens are keys: ln(n) bounds a stand-in entropy
        stand = dataclasses.replace(
            sig, token_entropy=self._standin(sig.token_entropy, math.log(2)),
            logits=self._standin(sig.logits, -1), cond_logits=self._standin(sig.cond_logits, -1),
            attention_entropy={bi: self._standin(e, math.log(kv_len)) for bi, e in sig.attention_entropy.items()},
            attention_query_index={bi: self._standin(i, 0, n) for bi, i in sig.attention_query_index.items()},
            summed_codes=self._standin(sig.summed_codes, -1),
            residual_change={r: self._standin(c, 1.0) for r, c in sig.residual_change.items()},
            decode=None if sig.decode is None else _StandInDecoder(self.fc, sig.decode.__self__).decode)
        with unset_fake_temporarily():
            self.inner.observe(si, stand)

    def stats(self):
        with unset_fake_temporarily():
            return self.inner.stats()


class _StandInDecoder:
    """`ScaleSignals.decode` for a stand-in policy: the real VAE on fake tensors, random pixels back."""

    def __init__(self, fc: "FakeCuda", rt):
        self.fc, self.rt = fc, rt
        self.vae = self  # SkipVAR's float_decoder looks for `decode.__self__.vae.decode`

    def _fake(self, codes):
        with self.fc.mode:
            return torch.empty(codes.shape, dtype=codes.dtype, device=DEVICE)

    def decode(self, codes):
        fake = self._fake(codes)
        if fake.ndim == 4:  # the VAE's own decode (float path)
            out = self.rt.vae.decode(fake)
        else:
            out = self.rt.decode(fake)
        with unset_fake_temporarily():
            lo = torch.rand(out.shape) * 2 - 1
            return lo if out.dtype.is_floating_point else ((lo + 1) * 127.5).to(out.dtype)


class _MemoFullBlock:
    """`GenState.full_block` for the dry run: a full block's fake computation depends only on
    (scale, input shape and dtype, rows, this block's KV length and whether its KV buffer exists),
    so after two real runs with the same key agree on their transient peak and op count, further
    blocks with that key are stood in by what a real block leaves behind (its K/V appended to the
    cache through the runtime's own `KVCache.append`, a new residual stream tensor) with the
    measured transient peak added to the ledger and the measured ops counted. Blocks under a plan
    (`varbench.engine.backbones.infinity.pruned.planned_block`) always run for real."""

    def __init__(self, real, ledger: _Ledger):
        self.real, self.led = real, ledger
        self.memo: dict = {}

    def __get__(self, state, owner=None):
        return lambda si, bi, x: self(state, si, bi, x)

    def __call__(self, state, si, bi, x):
        led = self.led
        key = (si, tuple(x.shape), x.dtype, state.rows, state.kv.len[bi], state.kv.kv[bi] is None,
               state.kv.capacities[bi])   # with the length: whether its append stages (KV budgets)
        seen = self.memo.get(key)
        if seen is None or seen[0] < 2:
            now0, outer_peak, ops0 = led.now, led.peak, led.ops[si]
            names0 = dict(led.op_names[si])
            led.peak = now0
            out = self.real(state, si, bi, x)
            delta = (led.peak - now0, led.ops[si] - ops0,
                     {k: v - names0.get(k, 0) for k, v in led.op_names[si].items() if v != names0.get(k, 0)})
            led.peak = max(outer_peak, led.peak)
            if seen is None:
                self.memo[key] = (1, delta)
            elif seen[1] == delta:
                self.memo[key] = (2, delta)
            return out
        transient, ops, names = seen[1]
        now0, ops0, names0 = led.now, led.ops[si], dict(led.op_names[si])
        bc = state.consts[bi]
        rows, n, c = x.shape
        kv = torch.empty((2, rows, bc.heads, n, c // bc.heads), dtype=torch.float32, device=x.device)
        state.kv.append(bi, kv, state.kv_dtype)
        del kv
        out = torch.empty_like(x)
        led.peak = max(led.peak, now0 + transient)
        led.ops[si] = ops0 + ops
        led.op_names[si] = defaultdict(int, names0)
        for k, v in names.items():
            led.op_names[si][k] += v
        return out


def _checked_noop_to(module: torch.nn.Module, *args, **kwargs) -> torch.nn.Module:
    """`Module.to` for fake parameters (which `Module._apply` cannot swap in torch 2.14): the
    runtime's `.to(device)` / `.to(dtype)` calls must be no-ops on a model materialised on the
    device in the runtime's dtypes; a call that would move or cast something is refused."""
    device, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
    for name, t in [*module.named_parameters(), *module.named_buffers()]:
        if (device is not None and t.device != torch.device(device) and not
                (torch.device(device).type == t.device.type == "cuda" and torch.device(device).index is None)) or \
                (dtype is not None and t.is_floating_point() and t.dtype != dtype):
            raise RuntimeError(f"dry run: {type(module).__name__}.to({device}, {dtype}) would change {name} "
                               f"({t.device}, {t.dtype}); materialise it so in FakeCuda.runtime")
    return module


# ----------------------------------------------------------------------------------- the session
class FakeCuda:
    """A fake-CUDA session: the modes, the stand-ins and the ledger (see the module docstring)."""

    def __init__(self, memo_blocks: bool = True):
        """`memo_blocks`: run each (scale, input shape) full block twice for real and stand in the
        rest by their effect (see `_MemoFullBlock`): the same peak and op counts (a test checks it
        against memo_blocks=False) in about 2/depth of the time."""
        self.memo_blocks = memo_blocks
        self.ledger = _Ledger()
        self.attention: list[dict] = []
        self.mode = FakeTensorMode(allow_non_fake_inputs=False)
        self._stack: Optional[contextlib.ExitStack] = None

    def __enter__(self) -> "FakeCuda":
        from varbench.engine import generation
        from varbench.engine.backbones.hart.state import HartState
        from varbench.engine.backbones.infinity import state
        from varbench.engine.backbones.infinity import schedules
        from varbench.engine.kernels import flash_entropy, flex_block_mask

        s = self._stack = contextlib.ExitStack()
        # a module-level cache of CPU tensors: real ones must not enter the fake mode, fake ones must
        # not outlive it (a later real run in this process would get them)
        schedules.freqs_grid.cache_clear()
        s.callback(schedules.freqs_grid.cache_clear)
        s.enter_context(mock.patch.object(torch.cuda, "Event", _NoEvent))
        s.enter_context(mock.patch.object(torch.cuda, "synchronize", lambda *a, **k: None))
        s.enter_context(mock.patch.object(generation, "new_generator", _tagged_generator))
        s.enter_context(mock.patch.object(flash_entropy, "kernel", _StandInKernel(self.ledger)))
        s.enter_context(mock.patch.object(flex_block_mask, "flex_block_attention", _StandInFlex(self.ledger, self.attention)))
        # autocast("cuda") turns itself off without a driver: let it on (see the module docstring)
        s.enter_context(mock.patch.object(torch.cuda.amp.common, "amp_definitely_not_available", lambda: False))
        led = self.ledger

        def stepped(real):
            def step(gen_state, si, *a, **k):
                led.step = si
                try:
                    return real(gen_state, si, *a, **k)
                finally:
                    led.step, led.last_step = None, si
            return step

        s.enter_context(mock.patch.object(state.GenState, "run_core", stepped(state.GenState.run_core)))
        s.enter_context(mock.patch.object(HartState, "step", stepped(HartState.step)))
        if self.memo_blocks:
            s.enter_context(mock.patch.object(state.GenState, "full_block",
                                              _MemoFullBlock(state.GenState.full_block, led)))
        s.enter_context(self.mode)
        self.dispatch = _DryRunMode(self.ledger)
        s.enter_context(self.dispatch)
        s.enter_context(_CudaSdpa(self.attention))
        s.enter_context(_StandInDraws())
        return self

    def __exit__(self, *exc):
        self._stack.close()
        return False

    # ------------------------------------------------------------------ building
    def runtime(self, preset: str | Any, *, depth: Optional[int] = None, dtype: torch.dtype = torch.bfloat16,
                fused_entropy: bool = True):
        """Infinity (a PRESETS name or an InfinityConfig, optionally with `depth` blocks) + its VAE,
        built on meta and materialised as fake CUDA tensors, blocks cast to `dtype` before
        materialising (as `experiments.device_bench` builds them), cuda_graphs off."""
        from varbench.engine.backbones.infinity.bsq_vae import BSQVAE
        from varbench.engine.backbones.infinity.model import PRESETS, Infinity
        from varbench.engine.backbones.infinity.runtime import InfinityRuntime

        cfg = PRESETS[preset] if isinstance(preset, str) else preset
        if depth is not None:
            cfg = dataclasses.replace(cfg, depth=depth, block_chunks=math.gcd(depth, cfg.block_chunks))
        with unset_fake_temporarily(), torch.device("meta"):
            model, vae = Infinity(cfg), BSQVAE(cfg.vae)
            if dtype != torch.float32:
                for b in model.blocks:
                    b.to(dtype)
        # `to_empty`, with the meta tensors' shapes and dtypes given to the fake mode as plain numbers
        fresh = lambda t: torch.empty(t.shape, dtype=t.dtype, device=DEVICE)  # noqa: E731
        model, vae = model._apply(fresh), vae._apply(fresh)
        with mock.patch.object(torch.nn.Module, "to", _checked_noop_to):
            return InfinityRuntime(model, vae, None, device=DEVICE, dtype=dtype, ca_bf16=True, cuda_graphs=False,
                                   fused_entropy=fused_entropy)

    def hart_runtime(self, preset: str | Any = "hart_0p7b", *, depth: Optional[int] = None,
                     dtype: torch.dtype = torch.float16, tokenizer: Optional[str] = None):
        """HART (a HART_PRESETS name or a HartConfig, optionally with `depth` blocks) + its tokenizer's
        quantizer and decoder (`tokenizer`: a HART_TOKENIZER_PRESETS name, default the preset's own
        name), built on meta and materialised as fake CUDA tensors in fp32, as the release keeps its
        weights; `dtype` float16 (the release) / bfloat16 runs the loop under autocast. No text
        encoder: `generate` hands the runtime pre-encoded text."""
        from varbench.engine.backbones.hart.model import HART_PRESETS, build_hart
        from varbench.engine.backbones.hart.runtime import HartRuntime
        from varbench.engine.backbones.hart.tokenizer import build_hart_tokenizer

        name = preset if isinstance(preset, str) else None
        cfg = HART_PRESETS[preset] if isinstance(preset, str) else preset
        if depth is not None:
            cfg = dataclasses.replace(cfg, depth=depth)
        tok = tokenizer or name
        if tok is None:
            raise ValueError("hart_runtime(HartConfig): name the tokenizer preset (tokenizer='hart_0p7b' or 'hart_tiny')")
        with unset_fake_temporarily():
            model = build_hart(cfg, "meta")
            quant, decoder = build_hart_tokenizer(tok, cfg.patch_nums, device="meta")
        fresh = lambda t: torch.empty(t.shape, dtype=t.dtype, device=DEVICE)  # noqa: E731
        model, quant, decoder = model._apply(fresh), quant._apply(fresh), decoder._apply(fresh)
        with mock.patch.object(torch.nn.Module, "to", _checked_noop_to):
            return HartRuntime(model, quant, decoder, None, device=DEVICE, dtype=dtype)

    def text(self, cfg, batch: int, length: int = 30):
        """Pre-encoded text as `experiments.device_bench` uses: `length` real tokens per prompt (an
        InfinityConfig's T5 width, or a HartConfig's Qwen2 width; HART pads it to its context)."""
        from varbench.engine.text import TextBatch

        width, most = (cfg.context_dim, cfg.context_token) if hasattr(cfg, "context_dim") else (cfg.text_channels, cfg.text_maxlen)
        length = min(length, most)
        return TextBatch(torch.empty(batch, length, width, device=DEVICE),
                         torch.ones(batch, length, dtype=torch.bool, device=DEVICE), [length] * batch)

    def generate(self, rt, policy, batch: int, *, pn: str = "1M", cfg: float = 4.0, text_len: int = 30, seed: int = 0,
                 **kw):
        """One generation of `batch` images under a stand-in of `policy`; the ledger's peak is reset
        first, so `self.ledger.peak` afterwards is that generation's peak (weights included). `kw` go
        to `rt.generate` (HART: `more_smooth`, `top_k`)."""
        text = self.text(rt.cfg, batch, text_len)
        self.ledger.reset_peak()
        self.ledger.ops.clear()
        self.ledger.op_names.clear()
        self.ledger.host_syncs.clear()
        self.ledger.last_step = None
        _OnDevice.ledger = self.ledger
        self.attention.clear()
        return rt.generate([""] * batch, list(range(batch)), StandInPolicy(policy, self, seed), pn=pn, cfg=cfg,
                           text=text, decode=True, **kw)
