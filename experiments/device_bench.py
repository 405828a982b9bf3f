"""The GPU device benchmark in one command: random-weight Infinity-2B and -8B at 1024², every method; HART-0.7B.

    bash scripts/device_bench.sh                                   # on the H200 (wheelhouse carried in)
    python -m experiments.device_bench                             # same, without the install step
    python -m experiments.device_bench --smoke --out /tmp/db       # CPU, tiny models, < 60 s (the CI test)
    python -m experiments.device_bench --job                       # through the job: +experiment=device_bench per model,
                                                                   # then results/curated/device_bench_job.md from its tables

Writes `results/curated/device_bench.json` and `results/curated/device_bench.md` (`--out DIR` moves both),
rewritten atomically after every section, so a run cut off by a time limit keeps what finished.

The job does most of this now: `python -m varbench +experiment=device_bench [model=infinity_8b|hart_0p7b]`
is an ordinary sweep over `conf/method_set/device_bench/<model>.yaml` with random weights (`model.random_weights`,
`model.text_encoder=word`), the job's timed pass under `timing=device` (paired ABBA baseline, intervals) and no
evaluators; its records pair, aggregate and report like any other (`+experiment=device_bench_smoke`: the CPU
version, tests/experiments/test_device_bench_experiment.py). This script stays for what the job cannot do yet:
  * one process over several models and batch sizes, ordered by value under a wall-clock budget, the JSON
    rewritten after every section (a sweep is one model per launch, with no budget);
  * graphed and eager items timed in the same rounds, and the eager-vs-graphed bit check (`torch.equal` bits at
    every scale; a job times one `runtime.cuda_graphs` mode, and records of both modes share a pairing key);
  * ToProVAR's attention-entropy share (the entropy-off item that replays recorded entropies, `EntropyPatch`);
  * the targets block (AR-loop seconds, batch scaling, FastVAR's speed-up, the entropy share) with verdicts;
  * text as precomputed random features (no text-encoder time at all; the job runs the random word encoder).
Its methods and presets come from the same place as the job's (`method_set`, `resolve_method`).

What is measured
----------------
Models: Infinity-2B and -8B architectures with RANDOM weights (latency does not depend on weight values),
built on the meta device, materialised on the GPU (`to_empty`; blocks directly in bf16) and filled with
N(0, std of PyTorch's default init) in a few seconds; the VAE (`model.cfg.vae` preset) is built on the
GPU with its default init. Text: precomputed random features of the real text width (2048) and
`--text-len` (30) tokens, so flan-t5-xl is not run: "text ms" is ~0 and "e2e" = text + AR loop + VAE
decode *without* T5 encoding. 1024² (`pn=1M`, 13 scales), cfg 4, tau 1, seeds 0..B-1 (the same in every
repeat, so data-dependent methods make the same plan every time).

Methods (conf/method_set/device_bench/<model>.yaml; each preset resolved as a job resolves it,
`varbench.harness.presets.resolve_method`):
  2B: baseline, fastvar (the release's 2B setting), nova, toprovar, skip_last_2, sparvar, sparsevar
  8B: baseline, fastvar_8b_paper (the only FastVAR preset written for 8B: ToProVAR Table 8's setting),
      nova, toprovar, skip_last_2, sparvar, sparsevar
With random weights the entropy-driven methods (NOVA, ToProVAR) decide from random-model entropies: their
rows time the machinery (entropy requests, plan building) and whatever plan that produces; each row
records the policy's own stats (e.g. ToProVAR's depth D) so a reader can see what was pruned.

HART-0.7B (model role `hart`, `--models ...,hart`): the random-weight HART-0.7B transformer (14 stages to
64x64 tokens, the residual diffusion head at the last stage; built on meta, `to_empty`, the same random
fill, weights fp32 as released) and its tokenizer's quantizer and decoder (default init, on the GPU),
the loop under fp16 autocast as the release's sample.py runs it (`HartRuntime(dtype=torch.float16)`),
1024² (HART's only resolution), batch 1, cfg as above, the runtime's defaults otherwise (released top-k;
`more_smooth` off, the harness's setting), text: random features of Qwen2's width (1536), `--text-len`
tokens padded to HART's 300. Methods (conf/method_set/device_bench/hart_0p7b.yaml): baseline, FastVAR's HART
port (`fastvar_hart`) and SkipLast(-2) (`skip_last_2`). Eager only (HART has no CUDA
graphs), one section after the graphed Infinity sections, `--hart-repeats` (15) timed rounds: ~0.3 s
per image (A100, fp16) makes it ~20-40 s with the build, and the script's budget skips what would
not fit as for any section. Paired speed-ups and intervals as for the Infinity rows; no target.

Protocol, per section (a model x batch x a list of (method, mode) items):
  * warm-up: `--warmup` untimed generations per item (CUDA graph capture happens here);
  * timing: `--repeats` rounds; in each round every item runs once, in an order rotated per round, so a
    method and its reference (the baseline in the same mode, in the same round) see the same machine
    state; stage times come from the runtime (`timings_ms`: CUDA events, read after the loop); the host
    also times each `generate` call between `torch.cuda.synchronize()`s ("wall");
  * per item: median and p10/p90 (varbench.harness.timing's `_stats`) of the AR loop, text, decode and
    e2e = text + AR + decode; per-scale median ms; images/s = batch / median e2e; peak memory =
    `torch.cuda.max_memory_allocated` after a reset before each call (absolute: weights, KV cache, and
    the runtime's captured-graph pools so far; only one model is resident at a time); FLOPs from the
    runtime's analytic count;
  * paired speed-up = median(reference AR) / median(method AR) over the same rounds, with a 95%
    percentile-bootstrap interval that resamples rounds (pairs kept together) and the per-round ratios.
    The baseline's row is paired with itself (exactly 1.0 [1.0, 1.0], a check of the pairing code).
  `varbench.harness.timing.timed_pass` is not used directly: it re-times the baseline once per method; here one
  round-robin times the baseline once per round for all methods of a section.

Eager vs graphed: `InfinityRuntime(..., cuda_graphs=...)` when the runtime accepts it; `rt.cuda_graphs`
is toggled per call. Bit check: the same seeds in eager and graphed mode must give identical bits at every
scale (`torch.equal`), per (model, method) at batch 1 (and at batch 8 when time allows); every timed item
also checks that its repeats reproduce their first repeat's bits ("repeatable").

ToProVAR's attention-entropy share (target <= 5%): ToProVAR is timed against the *same* ToProVAR plan
with the entropy computation removed. The bench (only the bench; the runtime is untouched) records, in one
untimed eager ToProVAR generation, every attention entropy the runtime computes, then, in the
"toprovar~entropy_off" item, answers every entropy request from that recording without computing anything:
`varbench.engine.backbones.infinity.pruned.attention_entropy` (the CPU / unfused path) returns the recorded tensor, and the fused
kernel `flash_attention_with_entropy` (the runtime's CUDA path: attention and entropy in one pass) becomes
plain SDPA plus the recorded entropy (see `EntropyPatch`, `--entropy-fn`). The policy therefore sees the
same entropies and makes the same plan (checked: equal analytic FLOPs), and the AR-time difference is what
the entropies cost (for the fused path: the fused kernel against SDPA). Answering with zeros instead would
change ToProVAR's plan (tests/experiments/test_device_bench.py shows it). The item runs on a second runtime sharing the
model's weights, so its captured graphs never contain the entropy work and it never replays the other
runtime's graphs. Share = 1 - median(off AR)/median(on AR), paired rounds, same bootstrap interval. If no
call reaches a patched function, the share is reported as not measured, never guessed.

Order and budget (`--budget-s`, default 430 s for this script; the shell wrapper adds the install):
  1 2B b1 baseline eager vs graphed   2 2B b1 methods graphed (+ entropy-off)   3 2B b1 bit check
  4 8B b1 baseline eager vs graphed   5 8B b1 methods graphed (+ entropy-off)   6 8B b1 bit check
  7 HART-0.7B b1 methods eager        8 2B b8 baseline graphed                  9 2B b8 methods graphed
  10 8B b8 baseline graphed           11 8B b8 methods graphed
  12.. the rest: methods eager (b1, b8), b8 eager baselines, b8 bit checks
Before the run the plan is printed and recorded ("plan") with an estimate per section from analytic FLOPs
(`estimate_section_s`: the baseline's FLOPs at an assumed MFU, eager launches on top) and without the
configurations whose predicted peak (the fake-CUDA dry run, `fit_reason`) exceeds the device's memory: those
get a row saying so (e.g. 8B NOVA at batch 8). `--plan-only` prints that plan and stops (no model is built).
Each section starts by dropping the runtimes' captured graphs (`clear_graphs`), and graphed items are timed
method by method, each on freshly cleared graphs (one method's captured steps and residuals never sit in
memory while another runs; rounds are then paired by index, not interleaved); a graphed item warms up until a
generation captures nothing new (`warm_until_settled`, at most `--max-graph-warmup`), so its timed rounds
only replay; a row records captures seen during its timed rounds (`timed_captures`, 0 when settled) and
every fallback the runtime took (`fallbacks`: a row that fell back says so and fails the run). Before every
generation the script projects what the
item (and the section's timed rounds) still need from the times measured so far; what would not fit is
skipped and listed as "skipped: time budget". Elapsed time is printed per section. Models are swapped
(freed, rebuilt) when a section needs the other one; a build takes seconds. A failure (e.g. out of
memory) is recorded in its row and the run goes on; the exit status is then 1.

`--smoke`: the same code on the CPU with the `tiny` preset in the 2B role and a patchified tiny variant
(the 8B's code path) in the 8B role, pn 0.06M, 1 warm-up + 2 repeats, batch 1 and 2, eager only (graphed
items and bit checks: "skipped: no CUDA"), cfg 4, and the tiny HART (`hart_tiny`, fp32, FastVAR's rule
moved onto its grids) in the HART role. The targets block is then computed from tiny models and
says so: its verdicts mean nothing about the targets.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import gc
import importlib
import inspect
import json
import math
import os
import random
import signal
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Optional

import torch

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = "device_bench/1"
GIB = 1024 ** 3
RANDOM_NOTE = ("weights are RANDOM (real architectures): times, memory and FLOPs only; images mean nothing, and "
               "entropy-driven methods decide from a random model's entropies")

#: role -> the model whose methods it runs (conf/method_set/device_bench/<model>.yaml: presets in priority order,
#: the baseline first); the smoke run's tiny models take the roles' Infinity sets and the tiny HART's own
ROLE_MODELS = {"2b": "infinity_2b", "8b": "infinity_8b", "hart": "hart_0p7b"}
SMOKE_ROLE_MODELS = {**ROLE_MODELS, "hart": "hart_tiny"}
#: the Infinity roles (the targets are theirs)
INFINITY_ROLES = ("2b", "8b")


def role_models(smoke: bool = False) -> dict[str, str]:
    return SMOKE_ROLE_MODELS if smoke else ROLE_MODELS


def role_methods(smoke: bool = False) -> dict[str, list[str]]:
    """Role -> the method presets the bench times there (conf/method_set/device_bench/<model>.yaml)."""
    from varbench.harness.presets import method_set

    return {role: method_set("device_bench", model) for role, model in role_models(smoke).items()}


def fastvar_preset(methods: list[str]) -> str:
    """The role's FastVAR preset (the target's): the first of its methods that builds FastVAR."""
    from varbench.harness.presets import resolve_method

    return next(m for m in methods if resolve_method(m).name == "fastvar")


TOPROVAR = "toprovar"
ENTROPY_OFF = "entropy_off"
#: first-guess seconds per generation per image (before anything is measured), for the budget
GUESS_S = {"2b": 1.5, "8b": 3.0, "hart": 0.6}
BUILD_GUESS_S = {"2b": 20.0, "8b": 40.0, "hart": 15.0}


# ---------------------------------------------------------------------------------------------------
# models
@dataclasses.dataclass
class ModelSpec:
    role: str            # "2b" | "8b"
    label: str
    preset: str          # PRESETS key, or a description for smoke variants
    cfg: Any             # InfinityConfig (HartConfig for the HART role)
    pn: str

    @property
    def hart(self) -> bool:
        return self.role == "hart"


def model_specs(smoke: bool, pn: Optional[str]) -> dict[str, ModelSpec]:
    """Role -> model. HART's pn is a label only (HART has one resolution: its patch_nums)."""
    from varbench.engine.backbones.hart.model import HART_PRESETS
    from varbench.engine.backbones.infinity.model import PRESETS

    if smoke:
        tiny = PRESETS["tiny"]
        return {"2b": ModelSpec("2b", "tiny (2B role)", "tiny", tiny, pn or "0.06M"),
                "8b": ModelSpec("8b", "tiny-patchify (8B role)", "tiny+patchify(codebook 64)",
                                dataclasses.replace(tiny, codebook_dim=64, patchify=True), pn or "0.06M"),
                "hart": ModelSpec("hart", "tiny HART (0.7B role)", "hart_tiny", HART_PRESETS["hart_tiny"], "20x20")}
    return {"2b": ModelSpec("2b", "Infinity-2B", "infinity_2b", PRESETS["infinity_2b"], pn or "1M"),
            "8b": ModelSpec("8b", "Infinity-8B", "infinity_8b", PRESETS["infinity_8b"], pn or "1M"),
            "hart": ModelSpec("hart", "HART-0.7B", "hart_0p7b", HART_PRESETS["hart_0p7b"], "1M")}


@torch.no_grad()
def fill_random_(model: torch.nn.Module, seed: int) -> None:
    """Random values for a model materialised with `to_empty`: N(0, 1/sqrt(3 fan_in)) for matrices (the std
    of PyTorch's default Linear init), the released init's constants/scales elsewhere; zero buffers."""
    dev = next(model.parameters()).device
    g = torch.Generator(device=dev).manual_seed(seed)
    for name, p in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "scale_mul_1H11":
            p.fill_(math.log(4.0))
        elif leaf == "ada_gss":
            p.normal_(0.0, 1.0 / math.sqrt(p.shape[-1]), generator=g)
        elif leaf == "cfg_uncond":
            p.normal_(0.0, 1.2 / math.sqrt(p.shape[-1]), generator=g)
        elif p.ndim == 1:
            p.fill_(1.0) if leaf == "weight" else p.zero_()
        else:
            fan_in = p.numel() // p.shape[0]
            p.normal_(0.0, 1.0 / math.sqrt(3 * fan_in), generator=g)
    for name, b in model.named_buffers():
        b.zero_()


def build_model(spec: ModelSpec, device: torch.device, dtype: torch.dtype, seed: int):
    """(Infinity, BSQVAE) with random weights on `device`; the Infinity blocks already in `dtype`."""
    from varbench.engine.backbones.infinity.bsq_vae import BSQVAE
    from varbench.engine.backbones.infinity.model import Infinity

    with torch.device("meta"):
        model = Infinity(spec.cfg)
    bad = [n for n, _ in model.named_buffers() if not n.endswith("zero_k_bias")]
    if bad:  # a buffer with meaning: to_empty + zero would be wrong, so build for real (slower)
        torch.manual_seed(seed)
        with torch.device(device):
            model = Infinity(spec.cfg)
    else:
        if dtype != torch.float32:
            for b in model.blocks:
                b.to(dtype)
        model = model.to_empty(device=device)
        fill_random_(model, seed)
    torch.manual_seed(seed + 1)
    with torch.device(device):
        vae = BSQVAE(spec.cfg.vae)
    return model, vae


def build_hart_model(spec: ModelSpec, device: torch.device, seed: int):
    """(HART, quantizer, decoder) with random weights on `device`, all fp32 (the release keeps HART's weights
    fp32 and runs the loop under autocast): the transformer on meta + `to_empty` + `fill_random_` (its one
    buffer, `zero_k_bias`, is zero by definition), the tokenizer parts built on the device (default init)."""
    from varbench.engine.backbones.hart.model import build_hart
    from varbench.engine.backbones.hart.tokenizer import build_hart_tokenizer

    model = build_hart(spec.cfg, "meta").to_empty(device=device)
    fill_random_(model, seed)
    torch.manual_seed(seed + 1)
    quant, decoder = build_hart_tokenizer(spec.preset, spec.cfg.patch_nums, device=device)
    return model, quant, decoder


def runtime_accepts_cuda_graphs() -> bool:
    from varbench.engine.backbones.infinity.runtime import InfinityRuntime

    return "cuda_graphs" in inspect.signature(InfinityRuntime.__init__).parameters


def make_runtime(model, vae, device: torch.device, dtype: torch.dtype, graphs_ok: bool):
    from varbench.engine.backbones.infinity.runtime import InfinityRuntime

    kw = {"cuda_graphs": device.type == "cuda"} if graphs_ok else {}
    return InfinityRuntime(model, vae, None, device=device, dtype=dtype, ca_bf16=True, **kw)


def random_text(cfg, batch: int, length: int, device: torch.device, seed: int):
    """Random text features of the model's text width (Infinity: T5's; HART: Qwen2's, padded to its context)."""
    from varbench.engine.text import TextBatch

    width, most = (cfg.context_dim, cfg.context_token) if hasattr(cfg, "context_dim") else (cfg.text_channels, cfg.text_maxlen)
    length = min(length, most)
    g = torch.Generator().manual_seed(seed)
    feats = torch.randn(batch, length, width, generator=g).to(device)
    return TextBatch(feats, torch.ones(batch, length, dtype=torch.bool, device=device), [length] * batch)


PREDICTED = ROOT / "results" / "curated" / "gpu_dryrun.json"
#: the share of the device's memory a configuration's predicted peak may use: the prediction is the eager
#: generation's allocations; the CUDA context, the caching allocator's rounding and fragmentation and the
#: captured graphs' pool come on top
MEMORY_HEADROOM = 0.92


@functools.lru_cache(maxsize=1)
def predicted_peaks() -> dict:
    """{(model preset, method preset, batch): bytes} predicted by `python -m experiments.gpu_dryrun
    --json results/curated/gpu_dryrun.json` (eager generation, no CUDA-graph pools); {} without it."""
    if not PREDICTED.is_file():
        return {}
    rows = json.loads(PREDICTED.read_text())["rows"]
    return {(r["model"], r["method"], r["batch"]): r["peak_bytes"] for r in rows if r.get("status") == "ok"}


def warm_until_settled(generate_once, keys, least: int, most: int) -> tuple[int, bool]:
    """Graphed warm-up: call `generate_once()` until a call adds no step key (`keys()`, e.g.
    `varbench.engine.graphs.graph_keys`: nothing newly run eagerly for the first time, nothing newly
    captured), at least `least` and at most `most` calls. Returns (calls, settled). A fixed count would
    leave captures (each ~0.05-0.2 s on a GPU) inside the timed rounds of a method whose steps settle one
    per generation (NOVA's residual chain: ~9 generations on the 1M schedule)."""
    n = 0
    while n < most:
        before = keys()
        generate_once()
        n += 1
        if n >= least and keys() == before:
            return n, True
    return n, False


def fit_reason(model_preset: str, method: str, batch: int, device_bytes: Optional[int],
               headroom: float = MEMORY_HEADROOM) -> Optional[str]:
    """Why (model, method, batch) is not planned: its predicted peak (the fake-CUDA dry run,
    `predicted_peaks`) exceeds `headroom` x the device's memory; None when it fits, when no device size
    is known (a CPU run) or when nothing predicts it (then it runs, and an OOM is recorded as a failure)."""
    if not device_bytes:
        return None
    pred = predicted_peaks().get((model_preset, method, batch))
    if pred is None or pred <= headroom * device_bytes:
        return None
    return (f"skipped: predicted peak {pred / GIB:.1f} GiB > {headroom:.0%} of the device's {device_bytes / GIB:.0f} GiB "
            f"(fake-CUDA dry run, results/curated/gpu_dryrun.json)")


# ---------------------------------------------------------------------------------------------------
# the plan's estimates (before anything is measured)
#: what the estimates assume: an H100/H200 SXM's dense bf16 peak, the share of it the AR loop reaches (model
#: FLOPs utilisation; the 2B target of 0.25 s at batch 1 is ~0.35), and an eager op's host cost (~40 ops per
#: block per scale). They order and cut the plan; the run measures and re-plans from its own times.
PEAK_TFLOPS = 989.0
ASSUMED_MFU = 0.35
EAGER_OPS_PER_BLOCK = 40
EAGER_OP_S = 6e-6
#: graphed warm-ups the estimate assumes per item (the run warms up until nothing is newly captured)
SETTLE_GUESS = 3
#: the VAE decode and the text side on top of the transformer's FLOPs (the decoder is ~8.6% of the 2B baseline)
DECODE_SHARE = 0.10


def analytic_flops(spec: ModelSpec, batch: int, text_len: int) -> float:
    """The baseline's transformer FLOPs of one generation of `batch` images (CFG rows), from its plans
    alone (`plan_trace`; HART: `hart_plan_flops`). A method does less: an upper bound for its items."""
    from varbench.engine.plan import ScalePlan

    if spec.hart:
        from varbench.engine.backbones.hart.flops import hart_plan_flops

        return float(hart_plan_flops(spec.cfg, [ScalePlan()] * len(spec.cfg.patch_nums), batch)["total"])
    from varbench.engine.backbones.infinity.flops import scale_flops, text_flops
    from varbench.engine.backbones.infinity.schedules import scale_schedule
    from varbench.engine.flops import plan_trace

    text_len = min(text_len, spec.cfg.text_maxlen)   # as `random_text` caps it
    sched = scale_schedule(1.0, spec.pn)
    trace = plan_trace(sched, [ScalePlan()] * len(sched), spec.cfg.depth, batch, True,
                       {2 * batch: 2 * batch * text_len, batch: batch * text_len})
    return text_flops(spec.cfg, 2 * batch * text_len, 2 * batch) + sum(scale_flops(spec.cfg, tr) for tr in trace)


def estimate_gen_s(spec: ModelSpec, batch: int, mode: str, text_len: int = 30, tflops: float = PEAK_TFLOPS,
                   mfu: float = ASSUMED_MFU) -> float:
    """Seconds of one generation: analytic FLOPs at `mfu` of `tflops`, plus the eager launches (graphed: none)."""
    compute = analytic_flops(spec, batch, text_len) * (1 + DECODE_SHARE) / (tflops * 1e12 * mfu)
    n_scales = len(spec.cfg.patch_nums) if spec.hart else len(Bench._schedule(spec))
    launches = 0.0 if mode == "graphed" else n_scales * spec.cfg.depth * EAGER_OPS_PER_BLOCK * EAGER_OP_S
    return compute + launches


def estimate_section_s(sec: "Section", spec: ModelSpec, warmup: int, repeats: int, text_len: int = 30,
                       tflops: float = PEAK_TFLOPS, mfu: float = ASSUMED_MFU) -> float:
    """The section's seconds from `estimate_gen_s`: per timed item its warm-ups (graphed: `SETTLE_GUESS`
    at least) and rounds, plus the entropy recording; per bit-checked method one eager and two graphed calls."""
    gen = functools.partial(estimate_gen_s, spec, sec.batch, text_len=text_len, tflops=tflops, mfu=mfu)
    if sec.kind == "bitcheck":
        return sum(gen("eager") + 2 * gen("graphed") for _ in sec.items)
    reps = sec.repeats or repeats
    total = 0.0
    for it in sec.items:
        mode = it[1]
        warm = max(warmup, SETTLE_GUESS) if mode == "graphed" else warmup
        total += (warm + reps) * gen(mode) + (gen("eager") if len(it) > 2 else 0.0)
    return total


def plan_budget(sections: list, specs: dict, a, device_bytes: Optional[int]) -> list[dict]:
    """The plan as the run will meet it: per section its items that fit the device's memory (`fit_reason`;
    the others listed with the reason), its estimated seconds (`estimate_section_s`, plus a model build
    when the role changes) and the running total against `a.budget_s`."""
    out, cum, loaded = [], 0.0, None
    for k, sec in enumerate(sections, 1):
        spec = specs[sec.role]
        skipped = {}
        for it in sec.items:
            method = it if isinstance(it, str) else it[0]
            why = fit_reason(spec.preset, method, sec.batch, device_bytes)
            if why:
                skipped[method] = why
        kept = [it for it in sec.items if (it if isinstance(it, str) else it[0]) not in skipped]
        est = estimate_section_s(dataclasses.replace(sec, items=kept), spec, a.warmup, a.repeats, a.text_len) if kept else 0.0
        if kept and loaded != sec.role:
            est += 2.0 if a.smoke else BUILD_GUESS_S[sec.role]
            loaded = sec.role
        cum += est
        out.append({"section": k, "title": sec.title, "estimate_s": round(est, 1), "cumulative_s": round(cum, 1),
                    "within_budget": cum <= a.budget_s, "not_planned": skipped})
    return out


def render_plan(plan: list[dict], budget_s: float) -> str:
    lines = [f"plan (estimates from analytic FLOPs at {ASSUMED_MFU:.0%} of {PEAK_TFLOPS:.0f} TFLOP/s; budget {budget_s:.0f}s):"]
    for p in plan:
        mark = "" if p["within_budget"] else "  [over budget: runs only if measured times allow]"
        lines.append(f"  {p['section']:2d} {p['title']:45s} ~{p['estimate_s']:6.1f}s  (total ~{p['cumulative_s']:6.1f}s){mark}")
        for m, why in p["not_planned"].items():
            lines.append(f"       {m}: {why}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------
# statistics
def stats(xs: list[float]) -> dict:
    from varbench.harness.timing import quantile_summary

    return quantile_summary(list(xs))


def paired_ratio(num: list[float], den: list[float], n_boot: int = 2000, seed: int = 0) -> dict:
    """median(num) / median(den) over rounds paired by index; 95% percentile bootstrap over rounds."""
    n = min(len(num), len(den))
    if n == 0:
        return {"ratio": None, "ci95": [None, None], "per_round": [], "n": 0}
    num, den = list(num[:n]), list(den[:n])
    point = statistics.median(num) / statistics.median(den)
    rng = random.Random(seed)
    boots = []
    for _ in range(n_boot):
        idx = [rng.randrange(n) for _ in range(n)]
        boots.append(statistics.median([num[i] for i in idx]) / statistics.median([den[i] for i in idx]))
    boots.sort()
    lo, hi = boots[int(0.025 * n_boot)], boots[min(n_boot - 1, int(math.ceil(0.975 * n_boot)) - 1)]
    return {"ratio": point, "ci95": [min(lo, point), max(hi, point)], "per_round": [a / b for a, b in zip(num, den)],
            "n": n}


def jsonable(x):
    """``x`` as JSON types for the bench's files: small tensors as lists (large ones as a shape note),
    non-finite floats as strings, anything unknown as its ``str``."""
    if isinstance(x, torch.Tensor):
        return x.tolist() if x.numel() <= 64 else f"<tensor {tuple(x.shape)}>"
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    return str(x)


# ---------------------------------------------------------------------------------------------------
# the entropy replay (bench-only monkeypatch)
#: where the runtime may take its attention entropy from (module:function); those that exist are patched.
#: `attention_entropy(q, k)` -> entropy; `flash_attention_with_entropy(q, k, v, scale)` -> (out, entropy).
ENTROPY_FNS = ("varbench.engine.backbones.infinity.pruned:attention_entropy",
               "varbench.engine.backbones.infinity.runtime:attention_entropy", "varbench.engine.backbones.infinity.runtime:flash_attention_with_entropy",
               "varbench.engine.backbones.infinity.block_step:attention_entropy", "varbench.engine.backbones.infinity.block_step:flash_attention_with_entropy",
               "varbench.engine.kernels:flash_attention_with_entropy",
               "varbench.engine.kernels.flash_entropy:flash_attention_with_entropy")


class EntropyPatch:
    """Record / replay the attention entropies the runtime computes (bench only; restored on exit).

    Recording calls the real functions and keeps a copy of each entropy. Replaying answers every call
    from the recording without computing an entropy: `attention_entropy` returns the recorded tensor;
    the fused `flash_attention_with_entropy` becomes plain SDPA (q's dtype, as the runtime attends when no
    entropy is asked for) plus the recorded entropy. Recordings are keyed by the `(si, bi)` locals (scale,
    block) of the nearest calling frame that has them, so a runtime that calls twice for one block (a
    warm-up and a graph capture) gets the same tensor both times; without them, by call order. Calls nested
    in a patched call (the fused fallback calls `attention_entropy`) pass straight through."""

    def __init__(self, targets: str | tuple = ENTROPY_FNS):
        targets = targets.split(",") if isinstance(targets, str) else list(targets)
        self.found: list[tuple[Any, str, Any]] = []   # (module, attr, original)
        for t in targets:
            mod, _, attr = t.strip().partition(":")
            try:
                m = importlib.import_module(mod)
            except Exception:  # noqa: BLE001 - a candidate module this runtime does not have
                continue
            if callable(getattr(m, attr, None)):
                self.found.append((m, attr, getattr(m, attr)))
        self.last_calls = 0
        self._depth = 0

    @property
    def available(self) -> bool:
        return bool(self.found)

    @property
    def names(self) -> list[str]:
        return [f"{m.__name__}:{a}" for m, a, _ in self.found]

    @staticmethod
    def _fused(attr: str) -> bool:
        return "with_entropy" in attr or "flash" in attr

    @staticmethod
    def _key(n: int):
        f = sys._getframe(2)
        for _ in range(8):
            if f is None:
                break
            loc = f.f_locals
            if "si" in loc and "bi" in loc:
                return (loc["si"], loc["bi"])
            f = f.f_back
        return ("call", n)

    @contextlib.contextmanager
    def _patched(self, make):
        for m, attr, orig in self.found:
            setattr(m, attr, make(attr, orig))
        try:
            yield
        finally:
            for m, attr, orig in self.found:
                setattr(m, attr, orig)

    @contextlib.contextmanager
    def recording(self, store: dict):
        def make(attr, orig):
            def rec(*a, **k):
                if self._depth:
                    return orig(*a, **k)
                key = self._key(len(store))
                self._depth += 1
                try:
                    out = orig(*a, **k)
                finally:
                    self._depth -= 1
                ent = out[1] if self._fused(attr) else out
                store[key] = ent.detach().clone()
                return out
            return rec

        with self._patched(make):
            yield

    @contextlib.contextmanager
    def replaying(self, store: dict):
        calls = [0]

        def make(attr, orig):
            def rep(*a, **k):
                key = self._key(calls[0])
                calls[0] += 1
                if key not in store:
                    raise RuntimeError(f"entropy replay: no recorded output for {key} (the plan diverged)")
                if not self._fused(attr):
                    return store[key]
                q, kk, v = a[:3]
                scale = a[3] if len(a) > 3 else k.get("scale", 1.0)
                kk = kk if kk.dtype == q.dtype else kk.to(q.dtype)
                v = v if v.dtype == q.dtype else v.to(q.dtype)
                bias = k.get("key_bias")   # a padded batch's key mask (varbench/engine/padded_batch.py)
                mask = None if bias is None else bias.reshape(q.shape[0], -1).to(q.dtype)[:, None, None, :]
                return torch.nn.functional.scaled_dot_product_attention(q, kk, v, attn_mask=mask, scale=scale), store[key]
            return rep

        try:
            with self._patched(make):
                yield
        finally:
            self.last_calls = calls[0]


# ---------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Item:
    method: str                  # preset name
    mode: str                    # eager | graphed
    variant: str = ""            # "" | entropy_off
    status: str = "pending"
    runs: list = dataclasses.field(default_factory=list)
    warm_walls: list = dataclasses.field(default_factory=list)
    bits: Optional[list] = None
    repeatable: Optional[bool] = True
    flops: Optional[float] = None
    policy_stats: Any = None
    replay_calls: list = dataclasses.field(default_factory=list)
    fallbacks: list = dataclasses.field(default_factory=list)   # the runtime's fallbacks in force during its calls
    warmups: int = 0                                             # warm-up calls made
    settled: Optional[bool] = None                               # graphed: a warm-up call captured nothing new
    timed_captures: int = 0                                      # step keys first met during timed rounds

    @property
    def name(self) -> str:
        return self.method + (f"~{self.variant}" if self.variant else "")


@dataclasses.dataclass
class Section:
    title: str
    role: str
    batch: int
    items: list                  # [(method, mode[, variant])]
    kind: str = "timed"          # timed | bitcheck
    repeats: Optional[int] = None  # timed rounds (None: --repeats)


def plan_sections(roles: list[str], batches: list[int], hart_repeats: Optional[int] = None,
                  role_sets: Optional[dict[str, list[str]]] = None) -> list[Section]:
    """The work, most important first (see the module docstring). At the larger batch the entropy-off item
    is left out (its second runtime would hold a second set of graph states: at 8B x 8 images the KV cache
    alone is ~96 GB) and eager and graphed runs go to separate sections (each section starts by dropping the
    runtimes' captured graphs and states). HART ("hart" in roles): one eager section at the first batch,
    after the graphed Infinity sections."""
    METHODS = role_sets or role_methods()   # noqa: N806 - role -> presets
    b1, bn = batches[0], batches[-1]
    hart = "hart" in roles
    roles = [r for r in roles if r != "hart"]
    S: list[Section] = []

    def methods(role, mode, with_entropy):
        its = [(m, mode) for m in METHODS[role]]
        if with_entropy and TOPROVAR in METHODS[role]:
            its.append((TOPROVAR, mode, ENTROPY_OFF))
        return its

    for role in roles:
        S.append(Section(f"{role} b{b1}: baseline eager vs graphed", role, b1, [("baseline", "eager"), ("baseline", "graphed")]))
        S.append(Section(f"{role} b{b1}: methods graphed", role, b1, methods(role, "graphed", True)))
        S.append(Section(f"{role} b{b1}: bit check eager vs graphed", role, b1, METHODS[role], "bitcheck"))
    if hart:   # before batch 8: a model of its own, and the only HART numbers
        S.append(Section(f"hart b{b1}: methods eager", "hart", b1, [(m, "eager") for m in METHODS["hart"]],
                         repeats=hart_repeats))
    if bn != b1:
        for role in roles:   # one model build per role
            S.append(Section(f"{role} b{bn}: baseline graphed", role, bn, [("baseline", "graphed")]))
            S.append(Section(f"{role} b{bn}: methods graphed", role, bn, methods(role, "graphed", False)))
    # the rest
    for role in roles:
        S.append(Section(f"{role} b{b1}: methods eager", role, b1, methods(role, "eager", True)))
    if bn != b1:
        for role in roles:
            S.append(Section(f"{role} b{bn}: baseline eager", role, bn, [("baseline", "eager")]))
            S.append(Section(f"{role} b{bn}: bit check eager vs graphed", role, bn, METHODS[role], "bitcheck"))
        for role in roles:
            S.append(Section(f"{role} b{bn}: methods eager", role, bn, methods(role, "eager", False)))
    return S


class Bench:
    def __init__(self, a: argparse.Namespace):
        self.a = a
        self.t0 = time.perf_counter()
        self.deadline = self.t0 + a.budget_s
        self.device = torch.device(a.device)
        self.cuda = self.device.type == "cuda"
        self.dtype = torch.bfloat16 if self.cuda else torch.float32
        self.hart_dtype = torch.float16 if self.cuda else torch.float32   # the release's autocast dtype on CUDA
        self.specs = model_specs(a.smoke, a.pn)
        self.device_bytes = (int(a.device_memory_gib * GIB) if a.device_memory_gib else
                             torch.cuda.get_device_properties(self.device).total_memory if self.cuda else None)
        self.graphs_ok = runtime_accepts_cuda_graphs()
        self.patch = EntropyPatch(a.entropy_fn)
        a.entropy_fn = ",".join(self.patch.names) or a.entropy_fn
        self.out_dir = Path(a.out)
        self.loaded: Optional[str] = None
        self.rt = self.rt_off = self.model = self.vae = None
        self.walls: dict[tuple, float] = {}          # (role, batch, mode, item name) -> seconds per call
        self.build_s: dict[str, float] = {}
        self.bits: dict[tuple, list] = {}            # (role, batch, mode, method) -> bits of one run
        self.entropy_store: dict[tuple, dict] = {}   # (role, batch) -> recorded entropy outputs
        self.texts: dict[tuple, Any] = {}            # (role, batch) -> TextBatch
        self.policies: dict[tuple, Any] = {}         # (role, preset) -> policy
        self.methods = role_methods(a.smoke)         # role -> method presets
        self.failed = 0
        self.inflight: Optional[tuple] = None        # (section, items) being timed: saved as provisional rows
        self.record: dict[str, Any] = {
            "schema": SCHEMA, "status": "running", "smoke": bool(a.smoke), "note": RANDOM_NOTE,
            "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "config": {"device": str(self.device), "dtype": str(self.dtype).replace("torch.", ""), "cfg": a.cfg,
                       "tau": 1.0, "warmup": a.warmup, "repeats": a.repeats, "batches": a.batch_list,
                       "text_tokens": a.text_len, "budget_s": a.budget_s, "entropy_fn": a.entropy_fn,
                       "models": {r: {"label": s.label, "preset": s.preset, "pn": s.pn,
                                      "schedule": self._schedule(s),
                                      "vae": f"HART tokenizer decoder ({s.preset})" if s.hart else s.cfg.vae}
                                  for r, s in self.specs.items()},
                       "hart": {"dtype": str(self.hart_dtype).replace("torch.", "") + " autocast, fp32 weights",
                                "methods": {p: self.method(p, "hart").config for p in self.methods["hart"]},
                                "repeats": a.hart_repeats},
                       "methods": {r: self.methods[r] for r in self.specs}},
            "env": self._env(), "runtime": {"cuda_graphs_param": self.graphs_ok,
                                            "entropy_fn_found": self.patch.available},
            "models": {}, "sections": [], "rows": [], "bitchecks": [], "entropy": [], "targets": [],
        }

    # ------------------------------------------------------------------ bookkeeping
    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def left(self) -> float:
        return self.deadline - time.perf_counter()

    def log(self, msg: str) -> None:
        print(f"[device_bench {self.elapsed():6.1f}s] {msg}", flush=True)

    @staticmethod
    def _schedule(spec: ModelSpec):
        from varbench.engine.backbones.infinity.schedules import scale_schedule

        if spec.hart:
            return [[p, p] for p in spec.cfg.patch_nums]
        return [list(s) for s in scale_schedule(1.0, spec.pn)]

    def _env(self) -> dict:
        from varbench.harness.provenance import collect_provenance

        try:
            prov = collect_provenance(str(self.device))
        except Exception as e:  # noqa: BLE001 - provenance must never stop a benchmark
            prov = {"error": f"{type(e).__name__}: {e}"}
        t = prov.get("torch") or {}
        git = prov.get("git") or {}
        # a device copy of the tree may have no .git: VARBENCH_GIT_SHA=$(git rev-parse HEAD) names the commit
        sha = git.get("sha") or os.environ.get("VARBENCH_GIT_SHA")
        return {"gpu": t.get("device_name") if self.cuda else None, "driver": t.get("driver"),
                "torch": torch.__version__, "cuda": torch.version.cuda, "git_sha": sha,
                "git_dirty": git.get("dirty"), "python": prov.get("python"), "host": prov.get("hostname"),
                "cpu_count": prov.get("cpu_count"), "torch_threads": torch.get_num_threads(), "provenance": prov}

    def save(self) -> None:
        """Rewrite the JSON and markdown (atomically): after every section, every graphed item and every
        round of the eager items, with the section in flight as provisional rows."""
        self.record["elapsed_s"] = round(self.elapsed(), 2)
        rows, entropy, failed = self.record["rows"], self.record["entropy"], self.failed
        if self.inflight is not None:   # the section being timed, as far as it got: a kill loses only the item in flight
            self.record["rows"], self.record["entropy"] = list(rows), list(entropy)
            n = len(self.record["rows"])
            try:
                self._rows(*self.inflight)
            except Exception as e:  # noqa: BLE001 - reporting must never cost the measurements
                self.log(f"provisional rows failed: {type(e).__name__}: {e}")
            for row in self.record["rows"][n:]:
                row["status"] = f"in flight at the last save: {row['status']}"
            self.failed = failed
        try:
            self._write()
        finally:
            self.record["rows"], self.record["entropy"] = rows, entropy

    def _write(self) -> None:
        from varbench.core.jsonio import atomic_write_bytes

        try:  # reporting must never cost the measurements
            self.record["targets"] = self.targets()
        except Exception as e:  # noqa: BLE001
            self.record["targets"] = [{"target": "targets could not be computed", "measured": f"{type(e).__name__}: {e}",
                                       "verdict": "ERROR", "detail": traceback.format_exc()[-800:]}]
        atomic_write_bytes(self.out_dir / "device_bench.json", (json.dumps(jsonable(self.record), indent=1) + "\n").encode())
        try:
            md = render_markdown(self.record)
        except Exception as e:  # noqa: BLE001
            md = f"# Device benchmark\n\nmarkdown rendering failed ({type(e).__name__}: {e}); see device_bench.json\n"
        atomic_write_bytes(self.out_dir / "device_bench.md", md.encode())

    # ------------------------------------------------------------------ models
    def ensure_model(self, role: str) -> bool:
        if self.loaded == role:
            return True
        need = self.build_s.get(role, BUILD_GUESS_S[role] if not self.a.smoke else 2.0)
        if self.left() < need + self.a.reserve_s:
            return False
        self.free_model()
        spec = self.specs[role]
        t = time.perf_counter()
        if spec.hart:
            from varbench.engine.backbones.hart.runtime import HartRuntime

            self.model, quant, self.vae = build_hart_model(spec, self.device, self.a.seed)
            self.rt = HartRuntime(self.model, quant, self.vae, None, device=self.device, dtype=self.hart_dtype)
        else:
            self.model, self.vae = build_model(spec, self.device, self.dtype, self.a.seed)
            self.rt = make_runtime(self.model, self.vae, self.device, self.dtype, self.graphs_ok)
            # a second runtime on the same weights, for the entropy-off item (its own graph caches)
            self.rt_off = make_runtime(self.model, self.vae, self.device, self.dtype, self.graphs_ok)
        self._sync()
        self.build_s[role] = time.perf_counter() - t
        self.loaded = role
        info = {"label": spec.label, "preset": spec.preset, "build_s": round(self.build_s[role], 2),
                "params_b": round(sum(p.numel() for p in self.model.parameters()) / 1e9, 4),
                "vae_params_m": round(sum(p.numel() for p in self.vae.parameters()) / 1e6, 2),
                "init": "meta + to_empty + N(0, 1/sqrt(3 fan_in)) fill"}
        if self.cuda:
            info["allocated_gib_after_build"] = round(torch.cuda.memory_allocated() / GIB, 3)
        self.record["models"].setdefault(role, {}).update(info)
        self.log(f"built {spec.label} in {self.build_s[role]:.1f}s ({info['params_b']} B params)")
        return True

    def free_model(self) -> None:
        if self.loaded is None:
            return
        self.rt = self.rt_off = self.model = self.vae = None
        self.bits = {k: v for k, v in self.bits.items() if k[0] != self.loaded}
        self.entropy_store = {k: v for k, v in self.entropy_store.items() if k[0] != self.loaded}
        self.texts = {k: v for k, v in self.texts.items() if k[0] != self.loaded}
        self.loaded = None
        gc.collect()
        if self.cuda:
            torch.cuda.empty_cache()

    def clear_graphs(self) -> None:
        """Drop captured graphs and their generation states (memory; each section warms up its own)."""
        for rt in (self.rt, self.rt_off):
            if rt is not None and hasattr(rt, "clear_graphs"):
                rt.clear_graphs()
        gc.collect()
        if self.cuda:
            torch.cuda.empty_cache()

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    # ------------------------------------------------------------------ one generation
    def method(self, preset: str, role: str = "2b"):
        """The preset as a job on the role's model resolves it (`varbench.harness.presets.resolve_method`).
        The smoke run's Infinity roles are played by tiny models: their presets take the `tiny` per-model
        blocks (a method whose knobs name 2B/8B blocks, e.g. SparseVAR's signal range, has one)."""
        from varbench.harness.presets import resolve_method

        role = role or "2b"
        model = "tiny" if self.a.smoke and role in INFINITY_ROLES else role_models(self.a.smoke)[role]
        return resolve_method(preset, model=model)

    def policy(self, preset: str, role: str = "2b"):
        """The method preset's policy on the role's model, built once."""
        key = (role or "2b", preset)
        if key not in self.policies:
            self.policies[key] = self.method(preset, role).build()
        return self.policies[key]

    def text(self, role: str, batch: int):
        if (role, batch) not in self.texts:
            self.texts[(role, batch)] = random_text(self.specs[role].cfg, batch, self.a.text_len, self.device, self.a.seed)
        return self.texts[(role, batch)]

    def _set_mode(self, rt, mode: str) -> None:
        if hasattr(rt, "cuda_graphs"):
            rt.cuda_graphs = mode == "graphed"

    def generate(self, role: str, batch: int, it: Item) -> tuple[dict, Any]:
        spec = self.specs[role]
        rt = self.rt_off if it.variant == ENTROPY_OFF else self.rt
        self._set_mode(rt, it.mode)
        text = self.text(role, batch)
        ctx = self.patch.replaying(self.entropy_store[(role, batch)]) if it.variant == ENTROPY_OFF else contextlib.nullcontext()
        self._sync()
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        t = time.perf_counter()
        with ctx:
            out = rt.generate(["random text features"] * batch, list(range(batch)), self.policy(it.method, role),
                              pn=spec.pn, cfg=self.a.cfg, tau=1.0, decode=True, text=text)
        self._sync()
        wall = time.perf_counter() - t
        if it.variant == ENTROPY_OFF:
            it.replay_calls.append(self.patch.last_calls)
        self._note_fallbacks(rt, it)
        tm = out.timings_ms
        run = {"ar": tm["ar"], "text": tm["text"], "decode": tm["decode"], "e2e": tm["text"] + tm["ar"] + tm["decode"],
               "per_scale": list(tm["per_scale"]), "wall": wall * 1e3, "flops": float(out.flops["total"]),
               "peak_bytes": torch.cuda.max_memory_allocated(self.device) if self.cuda else None}
        self.walls[(role, batch, it.mode, it.name)] = wall
        return run, out

    @staticmethod
    def _note_fallbacks(rt, it: Item) -> None:
        """Add to the item the runtime's fallbacks in force after its call (`rt.fallbacks`: a GPU feature
        that failed and was turned off, e.g. a refused capture or a Triton kernel that would not run). A
        fallback stays in force for the runtime's later calls, so every item timed after it carries it:
        its numbers are not the method's as configured. An eager item ignores the graph fallback (it
        never asked for graphs)."""
        for fb in getattr(rt, "fallbacks", []):
            if it.mode == "eager" and fb.get("knob", "").startswith("runtime.cuda_graphs"):
                continue
            if fb not in it.fallbacks:
                it.fallbacks.append(dict(fb))

    def guess_s(self, role: str, batch: int, mode: str, name: str) -> float:
        """Seconds one call of this item is expected to take, from what has been measured so far."""
        if (role, batch, mode, name) in self.walls:
            return self.walls[(role, batch, mode, name)]
        same = [v for (r, b, m, _), v in self.walls.items() if r == role and b == batch and m == mode]
        if same:
            return max(same)
        for want_mode in (mode, None):
            other = [(b, v) for (r, b, m, _), v in self.walls.items() if r == role and (want_mode is None or m == want_mode)]
            if other:
                b0, v = max(other)
                return v * max(1.0, batch / b0) * (2.5 if want_mode is None and mode == "eager" else 1.0)
        return (0.2 if self.a.smoke else GUESS_S[role]) * batch

    def fits(self, seconds: float) -> bool:
        return self.left() >= seconds + self.a.reserve_s

    # ------------------------------------------------------------------ sections
    def run_section(self, k: int, sec: Section) -> None:
        start = self.elapsed()
        entry = {"title": sec.title, "role": sec.role, "batch": sec.batch, "kind": sec.kind, "started_s": round(start, 1)}
        self.record["sections"].append(entry)
        self.log(f"section {k}: {sec.title} ({self.left():.0f}s left)")
        self.clear_graphs()
        if sec.kind == "bitcheck" and self._skip_reason("graphed"):   # no CUDA, or no cuda_graphs option
            entry["status"] = self._skip_reason("graphed")
            for m in sec.items:
                self.record["bitchecks"].append({"model": sec.role, "method": m, "batch": sec.batch, "result": entry["status"]})
        else:
            runnable = [i for i in sec.items if sec.kind == "bitcheck" or self._skip_reason(i[1]) is None]
            if runnable and not self.ensure_model(sec.role):
                entry["status"] = "skipped: time budget (model build)"
                self._skipped_rows(sec, "skipped: time budget (model build)")
            elif sec.kind == "bitcheck":
                self.bitcheck(sec)
                entry["status"] = "done"
            else:
                self.timed(sec)
                entry["status"] = "done"
        entry["elapsed_s"] = round(self.elapsed() - start, 1)
        self.log(f"section {k} {entry['status']} in {entry['elapsed_s']:.1f}s")
        self.save()

    def _skip_reason(self, mode: str) -> Optional[str]:
        if mode == "graphed" and not self.cuda:
            return "skipped: no CUDA"
        if mode == "graphed" and not self.graphs_ok:
            return "skipped: the runtime has no cuda_graphs option"
        return None

    def _skipped_rows(self, sec: Section, why: str) -> None:
        for spec in sec.items:
            it = Item(*spec)
            it.status = why
            self.record["rows"].append(self._row(sec, it, None, []))

    def _ensure_entropy_record(self, role: str, batch: int) -> Optional[str]:
        """Record ToProVAR's attention-entropy outputs once (eager, untimed); None or why not."""
        if not self.patch.available:
            return f"not measured: {self.a.entropy_fn} does not exist in this runtime"
        key = (role, batch)
        if key in self.entropy_store:
            return None if self.entropy_store[key] else f"not measured: no call reached {self.a.entropy_fn}"
        store: dict = {}
        self._set_mode(self.rt_off, "eager")
        spec = self.specs[role]
        with self.patch.recording(store):
            self.rt_off.generate(["random text features"] * batch, list(range(batch)), self.policy(TOPROVAR, role), pn=spec.pn,
                                 cfg=self.a.cfg, tau=1.0, decode=False, text=self.text(role, batch))
        self._sync()
        self.entropy_store[key] = store
        self.log(f"recorded {len(store)} attention-entropy outputs of ToProVAR ({role}, batch {batch})")
        return None if store else f"not measured: no call reached {self.a.entropy_fn} (entropy computed elsewhere?)"

    def timed(self, sec: Section) -> None:
        a = self.a
        if sec.repeats:   # a section's own round count (HART's)
            a = argparse.Namespace(**{**vars(a), "repeats": sec.repeats})
        items = [Item(*spec) for spec in sec.items]
        self.inflight = (sec, items)
        live: list[Item] = []
        for it in items:
            why = self._skip_reason(it.mode) or fit_reason(self.specs[sec.role].preset, it.method, sec.batch, self.device_bytes)
            if why is None and it.variant == ENTROPY_OFF:
                need = self.guess_s(sec.role, sec.batch, "eager", TOPROVAR)
                if not self.fits(need * (a.warmup + a.repeats + 1)):
                    why = "skipped: time budget"
                else:
                    try:
                        r = self._ensure_entropy_record(sec.role, sec.batch)
                        why = f"skipped: {r}" if r else None
                    except Exception as e:  # noqa: BLE001
                        why = f"failed: entropy record: {type(e).__name__}: {e}"
            if why is None:
                # this item's warm-up and rounds, plus the rounds of the items already warmed up
                need = self.guess_s(sec.role, sec.batch, it.mode, it.name) * (a.warmup + a.repeats) \
                    + a.repeats * sum(self.guess_s(sec.role, sec.batch, i.mode, i.name) for i in live)
                if not self.fits(need):
                    why = f"skipped: time budget (needs ~{need:.0f}s, {self.left():.0f}s left)"
            if why is not None:
                it.status = why
                continue
            if it.mode == "graphed":   # warmed up and timed on its own graphs, below
                it.status = "ok"
                continue
            try:
                for _ in range(a.warmup):
                    run, out = self.generate(sec.role, sec.batch, it)
                    it.warm_walls.append(run["wall"])
                it.warmups = a.warmup
                it.status = "ok"
                live.append(it)
            except Exception as e:  # noqa: BLE001 - record, go on with the other items
                self._fail(it, e)
        self._round_robin(sec, a, live)
        for it in items:
            if it.mode == "graphed" and it.status == "ok":
                self._graphed_item(sec, a, it)
        self.inflight = None
        for it in items:
            if it.status == "ok" and len(it.runs) < a.repeats:
                it.status = f"ok ({len(it.runs)} of {a.repeats} repeats: time budget)"
        self._rows(sec, items)
        for row in self.record["rows"][-len(items):]:
            self.log(row_line(row))
        # eager vs graphed of the same method in this section: a bit check for free
        for m in dict.fromkeys(i.method for i in items if not i.variant):
            e, g = (self.bits.get((sec.role, sec.batch, md, m)) for md in ("eager", "graphed"))
            if e is not None and g is not None and any(i.method == m and i.runs for i in items if i.mode == "eager") \
                    and any(i.method == m and i.runs for i in items if i.mode == "graphed"):
                self._bitcheck_entry(sec.role, m, sec.batch, e, g, "timed runs of this section")

    def _graph_keys(self, it: Item) -> int:
        from varbench.engine.graphs import graph_keys

        return graph_keys(self.rt_off if it.variant == ENTROPY_OFF else self.rt)

    def _graphed_item(self, sec: Section, a, it: Item) -> None:
        """One graphed item on freshly cleared graphs: warm up until a call captures nothing new, then its
        rounds; the graphs are dropped again after it (the next method starts from none)."""
        self.clear_graphs()
        guess = self.guess_s(sec.role, sec.batch, it.mode, it.name)
        if not self.fits(guess * (max(a.warmup, 2) + a.repeats)):
            it.status = f"skipped: time budget (needs ~{guess * (max(a.warmup, 2) + a.repeats):.0f}s, {self.left():.0f}s left)"
            return
        try:
            def once():
                run, _ = self.generate(sec.role, sec.batch, it)
                it.warm_walls.append(run["wall"])
            # at least 2: the runtime runs a step eagerly first and captures it the second time
            it.warmups, it.settled = warm_until_settled(once, lambda: self._graph_keys(it), max(a.warmup, 2),
                                                        max(a.max_graph_warmup, 2))
            if not it.settled:
                it.status = f"ok (graphs not settled after {it.warmups} warm-ups: timed rounds include captures)"
            for r in range(a.repeats):
                if not self.fits(self.guess_s(sec.role, sec.batch, it.mode, it.name)):
                    break
                before = self._graph_keys(it)
                run, out = self.generate(sec.role, sec.batch, it)
                it.timed_captures += self._graph_keys(it) - before
                run["round"] = r
                it.runs.append(run)
                self._keep_bits(sec, it, out)
        except Exception as e:  # noqa: BLE001
            self._fail(it, e)
        finally:
            self.clear_graphs()
            self.save()

    def _round_robin(self, sec: Section, a, live: list) -> None:
        """Timed rounds of the eager items: round-robin, order rotated per round."""
        for r in range(a.repeats):
            if not live:
                break
            need = sum(self.guess_s(sec.role, sec.batch, it.mode, it.name) for it in live)
            if not self.fits(need):
                self.log(f"stopping after {r} rounds: a round needs ~{need:.0f}s, {self.left():.0f}s left")
                break
            order = live[r % len(live):] + live[: r % len(live)]
            for it in order:
                if it.status != "ok":
                    continue
                try:
                    run, out = self.generate(sec.role, sec.batch, it)
                except Exception as e:  # noqa: BLE001
                    self._fail(it, e)
                    continue
                run["round"] = r
                it.runs.append(run)
                self._keep_bits(sec, it, out)
            self.save()

    def _fail(self, it: Item, e: Exception) -> None:
        self.failed += 1
        oom = isinstance(e, torch.cuda.OutOfMemoryError) if hasattr(torch.cuda, "OutOfMemoryError") else False
        it.status = f"failed: {'OOM: ' if oom else ''}{type(e).__name__}: {str(e)[:300]}"
        it.runs = []
        self.log(f"{it.name} {it.mode}: {it.status}")
        if not oom:
            traceback.print_exc()
        gc.collect()
        if self.cuda:
            torch.cuda.empty_cache()

    def _keep_bits(self, sec: Section, it: Item, out) -> None:
        bits = [None if b is None else b.detach() for b in out.bits]
        if it.bits is None:
            it.bits = bits
            it.flops = float(out.flops["total"])
            it.policy_stats = jsonable(out.policy_stats)
            if not it.variant:
                self.bits[(sec.role, sec.batch, it.mode, it.method)] = bits
        elif it.repeatable:
            it.repeatable = _bits_equal(it.bits, bits)[0]

    def bitcheck(self, sec: Section) -> None:
        """Eager vs graphed bits per method (same seeds); generates whichever side is not stored yet."""
        for m in sec.items:
            why = fit_reason(self.specs[sec.role].preset, m, sec.batch, self.device_bytes)
            if why:
                self.record["bitchecks"].append({"model": sec.role, "method": m, "batch": sec.batch, "result": why})
                continue
            self.clear_graphs()   # each method on its own graphs
            have = {md: self.bits.get((sec.role, sec.batch, md, m)) for md in ("eager", "graphed")}
            missing = [md for md, b in have.items() if b is None]
            need = sum(self.guess_s(sec.role, sec.batch, md, m) * (2 if md == "graphed" else 1) for md in missing)
            if not self.fits(need):
                self.record["bitchecks"].append({"model": sec.role, "method": m, "batch": sec.batch,
                                                 "result": "skipped: time budget"})
                continue
            try:
                fallbacks = []
                for md in missing:
                    it = Item(m, md)
                    last = []

                    def once():
                        last[:] = [self.generate(sec.role, sec.batch, it)[1]]
                    if md == "graphed":   # the bits of a call that only replayed (nothing newly run or captured)
                        warm_until_settled(once, lambda: self._graph_keys(it), 2, max(self.a.max_graph_warmup, 2))
                    else:
                        once()
                    have[md] = [None if b is None else b.detach() for b in last[0].bits]
                    fallbacks += [fb for fb in it.fallbacks if fb not in fallbacks]
                self._bitcheck_entry(sec.role, m, sec.batch, have["eager"], have["graphed"],
                                     "stored timed runs" if not missing else f"generated here: {missing}")
                if fallbacks:   # "graphed" bits that ran eagerly prove nothing
                    self.failed += 1
                    self.record["bitchecks"][-1].update(fallbacks=fallbacks, result="FELL BACK: " + self.record["bitchecks"][-1]["result"])
            except Exception as e:  # noqa: BLE001
                self.failed += 1
                self.record["bitchecks"].append({"model": sec.role, "method": m, "batch": sec.batch,
                                                 "result": f"failed: {type(e).__name__}: {str(e)[:300]}"})
                gc.collect()
                if self.cuda:
                    torch.cuda.empty_cache()

    def _bitcheck_entry(self, role, method, batch, eager, graphed, source) -> None:
        same, bad = _bits_equal(eager, graphed)
        self.record["bitchecks"] = [b for b in self.record["bitchecks"]
                                    if not (b["model"] == role and b["method"] == method and b["batch"] == batch)]
        self.record["bitchecks"].append({"model": role, "method": method, "batch": batch,
                                         "result": "equal" if same else "DIFFER", "differing_scales": bad,
                                         "scales": len(eager), "source": source})
        self.log(f"bit check {role} {method} b{batch}: {'equal' if same else 'DIFFER at scales %s' % bad}")

    # ------------------------------------------------------------------ rows
    def _rows(self, sec: Section, items: list[Item]) -> None:
        by = {(i.name, i.mode): i for i in items}
        for it in items:
            ref = None
            if it.variant == ENTROPY_OFF:
                ref = by.get((it.method, it.mode))
            elif it.method == "baseline":
                ref = it
            else:
                ref = by.get(("baseline", it.mode))
            self.record["rows"].append(self._row(sec, it, ref, items))
            if it.variant == ENTROPY_OFF:
                self._entropy_entry(sec, it, by.get((it.method, it.mode)))

    def _paired(self, it: Item, ref: Item, key: str = "ar") -> dict:
        """ref / it per round, over the rounds both have."""
        rounds = {r["round"]: r[key] for r in it.runs}
        pairs = [(r[key], rounds[r["round"]]) for r in ref.runs if r["round"] in rounds]
        return paired_ratio([p[0] for p in pairs], [p[1] for p in pairs])

    def _row(self, sec: Section, it: Item, ref: Optional[Item], items: list[Item]) -> dict:
        row = {"model": sec.role, "model_label": self.specs[sec.role].label, "method": it.name, "preset": it.method,
               "batch": sec.batch, "mode": it.mode, "section": sec.title, "status": it.status, "repeats": len(it.runs),
               "fallbacks": list(it.fallbacks), "warmups": it.warmups}
        if it.mode == "graphed":
            row.update(graphs_settled=it.settled, timed_captures=it.timed_captures)
            if it.timed_captures:   # a "graphed" time that includes captures is not the method's
                row["status"] = f"CAPTURED WHILE TIMED ({it.timed_captures} step keys): {row['status']}"
                row["check"] = "FAIL"
                self.failed += 1
        if it.fallbacks:   # never a silent fallback: the row says so and fails (exit status 1)
            knobs = ", ".join(dict.fromkeys(fb.get("knob", "?") for fb in it.fallbacks))
            row["status"] = f"FELL BACK ({knobs}): {it.status}"
            row["check"] = "FAIL"
            self.failed += 1
        if not it.runs:
            return row
        col = lambda k: [r[k] for r in it.runs]  # noqa: E731
        row.update({
            "ar_ms": stats(col("ar")), "text_ms": stats(col("text")), "decode_ms": stats(col("decode")),
            "e2e_ms": stats(col("e2e")), "wall_ms": stats(col("wall")),
            "per_scale_ms": [statistics.median(c) for c in zip(*col("per_scale"))],
            "warmup_wall_ms": it.warm_walls, "flops": it.flops, "bits_repeatable": it.repeatable,
            "policy_stats": it.policy_stats, "runs": it.runs,
        })
        row["images_per_s"] = sec.batch * 1e3 / row["e2e_ms"]["median"]
        peaks = [p for p in col("peak_bytes") if p is not None]
        row["peak_gib"] = max(peaks) / GIB if peaks else None
        pred = predicted_peaks().get((self.specs[sec.role].preset, it.method, sec.batch))
        row["predicted_peak_gib"] = pred / GIB if pred is not None else None   # fake-CUDA dry run, eager, no graph pools
        if ref is not None and ref.runs:
            p = self._paired(it, ref, "ar")
            row["paired"] = {"vs": f"{ref.name} ({ref.mode}, same rounds)", "ar_speedup": p["ratio"], "ar_ci95": p["ci95"],
                             "ar_per_round": p["per_round"], "n": p["n"],
                             "e2e_speedup": self._paired(it, ref, "e2e")["ratio"]}
            if ref.flops and it.flops:
                row["flops_ratio_vs_ref"] = ref.flops / it.flops
        base = next((i for i in items if i.method == "baseline" and not i.variant and i.flops), None)
        if base is None:
            base = next((r for r in self.record["rows"] if r["model"] == sec.role and r["batch"] == sec.batch
                         and r["preset"] == "baseline" and r.get("flops")), None)
            base_flops = base["flops"] if base else None
        else:
            base_flops = base.flops
        if base_flops and it.flops:
            row["flops_ratio_vs_baseline"] = base_flops / it.flops
        if it.mode == "graphed":
            eager = next((i for i in items if i.name == it.name and i.mode == "eager" and i.runs), None)
            if eager is not None:
                p = self._paired(it, eager, "ar")
                row["graphed_vs_eager"] = {"ar_speedup": p["ratio"], "ar_ci95": p["ci95"], "n": p["n"]}
        if it.variant == ENTROPY_OFF:
            row["replay_calls"] = it.replay_calls
        return row

    def _entropy_entry(self, sec: Section, off: Item, on: Optional[Item]) -> None:
        e = {"model": sec.role, "batch": sec.batch, "mode": off.mode, "method": TOPROVAR,
             "measure": "1 - median(AR with recorded entropies replayed) / median(AR computing them), paired rounds"}
        if on is None or not on.runs or not off.runs:
            e["status"] = off.status if not off.runs else (on.status if on else "toprovar not timed")
            self.record["entropy"].append(e)
            return
        p = self._paired(off, on, "ar")  # on / off
        if p["ratio"] is None:
            e["status"] = "not measured: no round timed both"
            self.record["entropy"].append(e)
            return
        share = lambda r: None if r is None else 1.0 - 1.0 / r  # noqa: E731
        e.update({"status": "ok", "on_ar_ms": stats([r["ar"] for r in on.runs])["median"],
                  "off_ar_ms": stats([r["ar"] for r in off.runs])["median"], "share": share(p["ratio"]),
                  "share_ci95": [share(p["ci95"][0]), share(p["ci95"][1])], "n": p["n"],
                  "same_plan": on.flops == off.flops, "flops_on": on.flops, "flops_off": off.flops,
                  "calls_recorded": len(self.entropy_store.get((sec.role, sec.batch), [])),
                  "calls_replayed_per_run": off.replay_calls})
        if not any(off.replay_calls):
            e["status"] = f"not measured: no call reached {self.a.entropy_fn} in the entropy-off runs"
        elif not e["same_plan"]:
            e["status"] = "invalid: the replayed run made a different plan (FLOPs differ)"
        self.record["entropy"].append(e)

    # ------------------------------------------------------------------ targets
    def _find(self, role, method, batch, mode=None) -> Optional[dict]:
        """The measured row (graphed preferred unless `mode`), latest section first."""
        rows = [r for r in self.record["rows"] if r["model"] == role and r["method"] == method and r["batch"] == batch
                and r.get("repeats")]
        for md in ([mode] if mode else ["graphed", "eager"]):
            cand = [r for r in rows if r["mode"] == md]
            if cand:  # the most repeats; among those the latest section
                return max(reversed(cand), key=lambda r: r["repeats"])
        return None

    def targets(self) -> list[dict]:
        b1, bn = self.a.batch_list[0], self.a.batch_list[-1]
        out = []
        smoke = " [SMOKE: tiny CPU model, says nothing about the target]" if self.a.smoke else ""

        def add(name, value_txt, verdict, detail=""):
            out.append({"target": name + smoke, "measured": value_txt, "verdict": verdict, "detail": detail})

        def where(r):
            return f"{r['mode']}, batch {r['batch']}, {r['repeats']} repeats"

        for role, limit in (("2b", 300.0), ("8b", 800.0)):
            if role not in self.specs:
                continue
            lab = self.specs[role].label
            r = self._find(role, "baseline", b1)
            name = f"{lab} baseline AR loop <= {limit / 1e3:.2f} s (batch {b1})"
            if r is None:
                add(name, "not measured", "NOT MEASURED", self._why_missing(role, "baseline", b1))
            else:
                v = r["ar_ms"]["median"]
                add(name, f"{v / 1e3:.3f} s [p10 {r['ar_ms']['p10'] / 1e3:.3f}, p90 {r['ar_ms']['p90'] / 1e3:.3f}] ({where(r)})",
                    "PASS" if v <= limit else "FAIL")
        for role in (r for r in INFINITY_ROLES if r in self.specs):
            lab = self.specs[role].label
            name = f"{lab} batch {bn} images/s >= 3x batch {b1} (baseline, e2e)"
            r1 = self._find(role, "baseline", b1, "graphed") or self._find(role, "baseline", b1, "eager")
            rn = self._find(role, "baseline", bn, r1["mode"]) if r1 else None
            if bn == b1 or r1 is None or rn is None:
                add(name, "not measured", "NOT MEASURED", self._why_missing(role, "baseline", bn))
            else:
                v = rn["images_per_s"] / r1["images_per_s"]
                ar = (bn / rn["ar_ms"]["median"]) / (b1 / r1["ar_ms"]["median"])
                add(name, f"{v:.2f}x ({rn['images_per_s']:.2f} vs {r1['images_per_s']:.2f} images/s, {r1['mode']})",
                    "PASS" if v >= 3.0 else "FAIL", f"AR loop alone: {ar:.2f}x")
        for role in (r for r in INFINITY_ROLES if r in self.specs):
            lab, fv = self.specs[role].label, fastvar_preset(self.methods[role])
            name = f"{lab} FastVAR default ({fv}) AR speed-up >= 2.5x over baseline (paired, batch {b1})"
            r = self._find(role, fv, b1)
            if r is None or "paired" not in r:
                add(name, "not measured", "NOT MEASURED", self._why_missing(role, fv, b1))
            else:
                p = r["paired"]
                add(name, f"{p['ar_speedup']:.2f}x [95% CI {p['ar_ci95'][0]:.2f}-{p['ar_ci95'][1]:.2f}] ({where(r)})",
                    "PASS" if p["ar_speedup"] >= 2.5 else "FAIL")
        for role in (r for r in INFINITY_ROLES if r in self.specs):
            lab = self.specs[role].label
            name = f"{lab} ToProVAR attention-entropy share of AR time <= 5% (batch {b1})"
            es = [e for e in self.record["entropy"] if e["model"] == role and e["batch"] == b1]
            ok = [e for e in es if e.get("status") == "ok"]
            e = next((x for x in ok if x["mode"] == "graphed"), None) or (ok[0] if ok else None)
            if e is None:
                add(name, "not measured", "NOT MEASURED", "; ".join(str(x.get("status")) for x in es) or "not run")
            else:
                add(name, f"{100 * e['share']:.1f}% [95% CI {100 * e['share_ci95'][0]:.1f}-{100 * e['share_ci95'][1]:.1f}%] "
                    f"(on {e['on_ar_ms']:.1f} ms, off {e['off_ar_ms']:.1f} ms, {e['mode']}, n {e['n']})",
                    "PASS" if e["share"] <= 0.05 else "FAIL")
        return out

    def _why_missing(self, role, method, batch) -> str:
        rows = [r for r in self.record["rows"] if r["model"] == role and r["method"] == method and r["batch"] == batch]
        return "; ".join(f"{r['mode']}: {r['status']}" for r in rows) or "not run (yet)"

    # ------------------------------------------------------------------ main
    def run(self) -> int:
        sections = plan_sections([r for r in (*INFINITY_ROLES, "hart") if r in self.a.model_list], self.a.batch_list,
                                 self.a.hart_repeats, self.methods)
        self.log(f"{len(sections)} sections on {self.record['env']['gpu'] or self.device}; budget {self.a.budget_s:.0f}s; "
                 f"runtime cuda_graphs option: {self.graphs_ok}")
        self.record["plan"] = plan_budget(sections, self.specs, self.a, self.device_bytes)
        print(render_plan(self.record["plan"], self.a.budget_s), flush=True)
        self.save()

        def on_term(signum, frame):  # `timeout` sends SIGTERM: leave a JSON that says so
            raise SystemExit(f"signal {signum} (time limit?)")

        signal.signal(signal.SIGTERM, on_term)
        try:
            for k, sec in enumerate(sections, 1):
                self.run_section(k, sec)
            self.record["status"] = "done"
        except BaseException as e:
            kind = "stopped" if isinstance(e, (SystemExit, KeyboardInterrupt)) else "failed"
            self.record["status"] = f"{kind} during section {len(self.record['sections'])}: {type(e).__name__}: {e}"
            self.save()
            raise
        finally:
            self.free_model()
        self.record["finished_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.save()
        self.log(f"{self.record['status']} -> {self.out_dir / 'device_bench.json'}, {self.out_dir / 'device_bench.md'}")
        print(render_targets(self.record["targets"]), flush=True)
        return 1 if self.failed else 0


def _bits_equal(a: list, b: list) -> tuple[bool, list[int]]:
    bad = []
    for si, (x, y) in enumerate(zip(a, b)):
        if (x is None) != (y is None) or (x is not None and not torch.equal(x, y)):
            bad.append(si)
    if len(a) != len(b):
        bad.append(min(len(a), len(b)))
    return not bad, bad


# ---------------------------------------------------------------------------------------------------
# markdown
def _ms(s: Optional[dict]) -> str:
    if not s or s.get("median") is None:
        return ""
    return f"{s['median']:.1f} [{s['p10']:.1f}-{s['p90']:.1f}]"


def row_line(r: dict) -> str:
    """One result row as a log line: AR median [p10-p90] and the paired speed-up [95% CI], as in the table."""
    p = r.get("paired") or {}
    sp = f"{p['ar_speedup']:.2f}x [{p['ar_ci95'][0]:.2f}-{p['ar_ci95'][1]:.2f}] vs {p['vs']}" if p.get("ar_speedup") else "no pair"
    ar = f"AR {_ms(r.get('ar_ms'))} ms" if r.get("ar_ms") else "not timed"
    return f"{r['model_label']} {r['method']} b{r['batch']} {r['mode']}: {ar}; paired AR speed-up {sp}; {r['status']}"


def render_targets(targets: list[dict]) -> str:
    lines = ["## Targets", "", "| target | measured | verdict |", "|---|---|---|"]
    for t in targets:
        extra = f" ({t['detail']})" if t.get("detail") else ""
        lines.append(f"| {t['target']} | {t['measured']}{extra} | **{t['verdict']}** |")
    return "\n".join(lines) + "\n"


def render_markdown(rec: dict) -> str:
    env, cfgd = rec["env"], rec["config"]
    L = [f"# Device benchmark: Infinity 2B/8B and HART-0.7B latency, random weights{' (SMOKE)' if rec['smoke'] else ''}", ""]
    L.append(f"GPU: {env.get('gpu') or 'none (' + cfgd['device'] + ')'} | driver {env.get('driver')} | torch {env.get('torch')} "
             f"(CUDA {env.get('cuda')}) | commit {(env.get('git_sha') or 'unknown')[:12]}{' (dirty)' if env.get('git_dirty') else ''}")
    L.append("")
    models = "; ".join(f"{m['label']}: {m['preset']}, pn {m['pn']} ({len(m['schedule'])} scales, last {m['schedule'][-1]})"
                       for m in cfgd["models"].values())
    L.append(f"Status: **{rec['status']}** after {rec.get('elapsed_s', 0):.0f} s (budget {cfgd['budget_s']:.0f} s). {models}. "
             f"cfg {cfgd['cfg']}, tau 1, {cfgd['dtype']}{' (HART: %s)' % cfgd['hart']['dtype'] if cfgd.get('hart') else ''}, "
             f"warm-up {cfgd['warmup']}, {cfgd['repeats']} timed rounds{' (HART: %s)' % cfgd['hart']['repeats'] if cfgd.get('hart') else ''}, "
             f"text: precomputed random features ({cfgd['text_tokens']} tokens; T5 not run). {rec['note']}.")
    L.append("")
    L.append(render_targets(rec["targets"]))
    L += ["## Results", "",
          "AR / e2e ms: median [p10-p90] over timed rounds; e2e = text + AR + decode (no T5). Speed-up: paired "
          "(same rounds) median(reference AR) / median(AR), 95% bootstrap CI over rounds; reference = baseline in "
          "the same mode (toprovar~entropy_off: toprovar).", "",
          "| model | method | batch | mode | AR ms | e2e ms | images/s | peak GiB (predicted: fake-CUDA dry run, eager) | FLOPs ratio | paired AR speed-up [95% CI] | graphed vs eager | n | status |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rec["rows"]:
        p = r.get("paired")
        sp = f"{p['ar_speedup']:.2f}x [{p['ar_ci95'][0]:.2f}-{p['ar_ci95'][1]:.2f}]" if p and p.get("ar_speedup") else ""
        ge = r.get("graphed_vs_eager")
        ge = f"{ge['ar_speedup']:.2f}x [{ge['ar_ci95'][0]:.2f}-{ge['ar_ci95'][1]:.2f}]" if ge and ge.get("ar_speedup") else ""
        fl = r.get("flops_ratio_vs_baseline")
        L.append(f"| {r['model_label']} | {r['method']} | {r['batch']} | {r['mode']} | {_ms(r.get('ar_ms'))} | {_ms(r.get('e2e_ms'))} | "
                 f"{'%.2f' % r['images_per_s'] if r.get('images_per_s') else ''} | "
                 f"{'%.2f' % r['peak_gib'] if r.get('peak_gib') is not None else ''}"
                 f"{' (pred %.2f)' % r['predicted_peak_gib'] if r.get('predicted_peak_gib') is not None else ''} | "
                 f"{'%.2f' % fl if fl else ''} | {sp} | {ge} | "
                 f"{r.get('repeats', 0)} | {r['status']} |")
    L += ["", "## ToProVAR attention-entropy cost", "",
          "Same plan, entropy outputs replayed from a recorded run instead of computed (bench-only patch of "
          f"`{cfgd['entropy_fn']}`); share = 1 - off/on (paired).", "",
          "| model | batch | mode | on AR ms | off AR ms | share [95% CI] | same plan | status |", "|---|---|---|---|---|---|---|---|"]
    for e in rec["entropy"]:
        if e.get("share") is not None:
            sh = f"{100 * e['share']:.1f}% [{100 * e['share_ci95'][0]:.1f}-{100 * e['share_ci95'][1]:.1f}%]"
            L.append(f"| {e['model']} | {e['batch']} | {e['mode']} | {e['on_ar_ms']:.1f} | {e['off_ar_ms']:.1f} | {sh} | "
                     f"{e['same_plan']} | {e['status']} |")
        else:
            L.append(f"| {e['model']} | {e['batch']} | {e['mode']} |  |  |  |  | {e['status']} |")
    L += ["", "## Bit checks: eager vs graphed, same seeds, torch.equal on every scale's bits", "",
          "| model | method | batch | result | source |", "|---|---|---|---|---|"]
    for b in rec["bitchecks"]:
        res = b["result"] + (f" (scales {b['differing_scales']})" if b.get("differing_scales") else "")
        L.append(f"| {b['model']} | {b['method']} | {b['batch']} | {res} | {b.get('source', '')} |")
    base = [r for r in rec["rows"] if r["preset"] == "baseline" and r.get("per_scale_ms")]
    if base:
        sched = {k: m["schedule"] for k, m in cfgd["models"].items()}
        L += ["", "## Per-scale ms (baseline, median)", ""]
        for role in dict.fromkeys(r["model"] for r in base):
            grid = sched[role]
            L += [f"| {cfgd['models'][role]['label']} | " + " | ".join(f"{h}x{w}" for h, w in grid) + " |",
                  "|---|" + "---|" * len(grid)]
            for r in (x for x in base if x["model"] == role):
                L.append(f"| b{r['batch']} {r['mode']} | " + " | ".join(f"{v:.1f}" for v in r["per_scale_ms"]) + " |")
            L.append("")
    L += ["", "## Sections", "", "| # | section | status | started s | took s |", "|---|---|---|---|---|"]
    for i, s in enumerate(rec["sections"], 1):
        L.append(f"| {i} | {s['title']} | {s.get('status', 'running')} | {s['started_s']} | {s.get('elapsed_s', '')} |")
    L += ["", "Written by `python -m experiments.device_bench` (method and protocol: its docstring); every number here is in "
          "device_bench.json with the raw per-round times."]
    return "\n".join(L) + "\n"


# ---------------------------------------------------------------------------------------------------
def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="CPU, tiny models, pn 0.06M, 1 warm-up + 2 repeats, batch 1 and 2")
    p.add_argument("--out", default=None, help="output folder (default results/curated; smoke: results/_scratch/device_bench_smoke)")
    p.add_argument("--device", default=None, help="default: cuda if available (cpu with --smoke)")
    p.add_argument("--models", default="2b,8b,hart", help="roles: 2b, 8b, hart (HART-0.7B)")
    p.add_argument("--batches", default=None, help="first and last are used (default 1,8; smoke 1,2)")
    p.add_argument("--warmup", type=int, default=None, help="untimed calls per item (default 2; smoke 1)")
    p.add_argument("--repeats", type=int, default=None, help="timed rounds (default 5; smoke 2)")
    p.add_argument("--hart-repeats", type=int, default=None, help="timed rounds of the HART section (default 15; smoke 2)")
    p.add_argument("--budget-s", type=float, default=None, help="wall budget of this script (default 430; smoke 120)")
    p.add_argument("--reserve-s", type=float, default=None, help="kept free at the end (default 8; smoke 1)")
    p.add_argument("--device-memory-gib", type=float, default=None,
                   help="the device's memory for the fit check (default: the CUDA device's; none on the CPU)")
    p.add_argument("--max-graph-warmup", type=int, default=16,
                   help="most warm-up calls of a graphed item while steps are still newly captured")
    p.add_argument("--plan-only", action="store_true",
                   help="print the plan (sections, estimates, what does not fit) and stop; builds no model")
    p.add_argument("--pn", default=None, help="resolution preset (default 1M; smoke 0.06M)")
    p.add_argument("--cfg", type=float, default=4.0)
    p.add_argument("--text-len", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: 1 for a CPU smoke run, else unchanged)")
    p.add_argument("--job", action="store_true",
                   help="run the bench as the ordinary job (one +experiment=device_bench sweep per --models role) and "
                        "write device_bench_job.md from its aggregated tables; --override adds job overrides")
    p.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                   help="--job: a Hydra override for every sweep (repeatable), e.g. --override timing.repeats=9")
    p.add_argument("--entropy-fn", default=",".join(ENTROPY_FNS),
                   help="comma list of module:function the entropy-off item answers from a recording (those that exist)")
    a = p.parse_args(argv)
    sm = a.smoke
    a.device = a.device or ("cpu" if sm or not torch.cuda.is_available() else "cuda")
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        p.error("--device cuda but CUDA is not available")
    # a smoke run never lands in results/curated by default (it would replace the device numbers)
    a.out = a.out or str(ROOT / "results" / ("_scratch/device_bench_smoke" if sm else "curated"))
    a.batch_list = [int(x) for x in (a.batches or ("1,2" if sm else "1,8")).split(",")]
    a.batch_list = [a.batch_list[0], a.batch_list[-1]]
    a.model_list = [m.strip() for m in a.models.split(",") if m.strip()]
    if any(m not in ROLE_MODELS for m in a.model_list):
        p.error(f"--models takes {sorted(ROLE_MODELS)}")
    a.warmup = a.warmup if a.warmup is not None else (1 if sm else 2)
    a.repeats = a.repeats if a.repeats is not None else (2 if sm else 5)
    a.hart_repeats = a.hart_repeats if a.hart_repeats is not None else (a.repeats if sm else 15)
    a.budget_s = a.budget_s if a.budget_s is not None else (120.0 if sm else 430.0)
    a.reserve_s = a.reserve_s if a.reserve_s is not None else (1.0 if sm else 8.0)
    if a.threads is None and sm and a.device == "cpu":
        a.threads = 1
    if a.repeats < 1 or a.hart_repeats < 1 or a.warmup < 0:
        p.error("--repeats >= 1, --hart-repeats >= 1, --warmup >= 0")
    return a


#: `--job`: role -> the model config its sweep runs (`--smoke`: the CPU's tiny models; the 8B role has no tiny
#: model config of its own, so a smoke run through the job leaves it out)
JOB_MODELS = {"2b": "infinity_2b", "8b": "infinity_8b", "hart": "hart_0p7b"}
JOB_SMOKE_MODELS = {"2b": "tiny", "hart": "hart_tiny"}


def run_through_job(roles: list[str], out: Path, smoke: bool, overrides: list[str]) -> int:
    """`--job`: the bench as the ordinary job, one `+experiment=device_bench` sweep per model (smoke:
    `device_bench_smoke`), each a subprocess as a user would launch it; then `<out>/device_bench_job.md` from the
    experiment's aggregated tables (every model's group, as the last sweep's aggregation wrote them). Returns 1
    when a sweep failed (its table then lacks the failed jobs and says so)."""
    import subprocess

    from varbench.analysis.layout import group_dirs
    from varbench.core.jsonio import atomic_write_bytes
    from varbench.harness.presets import compose_job_config

    exp = "device_bench_smoke" if smoke else "device_bench"
    models = JOB_SMOKE_MODELS if smoke else JOB_MODELS
    rc = 0
    for role in roles:
        if role not in models:
            print(f"[device_bench] --job: no model config for the {role} role here; left out")
            continue
        cmd = [sys.executable, "-m", "varbench", f"+experiment={exp}", f"model={models[role]}", *overrides]
        print("[device_bench] " + " ".join(cmd[1:]), flush=True)
        rc |= subprocess.run(cmd, cwd=ROOT).returncode != 0
    cfg = compose_job_config([f"+experiment={exp}", *overrides])
    results = Path(str(cfg.paths.results_dir)) / exp
    tables = [(g.name, (g / "table.md").read_text()) for g in group_dirs(results)]
    md = [f"# Device bench through the job (`python -m varbench +experiment={exp}`; generated by "
          "`python -m experiments.device_bench --job`, do not edit)", "", RANDOM_NOTE + ".", ""]
    for name, table in tables:
        md += [f"## {name}", "", table.strip(), ""]
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out / "device_bench_job.md", ("\n".join(md) + "\n").encode())
    print(f"[device_bench] wrote {out / 'device_bench_job.md'} ({len(tables)} table(s) from {results})")
    return 1 if rc or not tables else 0


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.job:
        return run_through_job(a.model_list, Path(a.out), a.smoke, a.override)
    if a.plan_only:
        specs = model_specs(a.smoke, a.pn)
        roles = [r for r in (*INFINITY_ROLES, "hart") if r in a.model_list]
        sections = plan_sections(roles, a.batch_list, a.hart_repeats, role_methods(a.smoke))
        dev = int(a.device_memory_gib * GIB) if a.device_memory_gib else (
            torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else None)
        print(render_plan(plan_budget(sections, specs, a, dev), a.budget_s))
        return 0
    old = torch.get_num_threads()
    if a.threads:  # tiny CPU models: one thread is fastest (and steady on a shared box); restored after
        torch.set_num_threads(a.threads)
    try:
        return Bench(a).run()
    finally:
        torch.set_num_threads(old)


if __name__ == "__main__":
    sys.exit(main())
