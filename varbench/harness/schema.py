"""The run record (``record.json``) and the trace rows (``traces.jsonl``), documented in one place.

One record per job (``store/<experiment>/entries/<entry_id>/record.json``), written by
:func:`varbench.harness.job.assemble_record` and sealed by ``DONE`` (the entry folder, its seal and
lock: :mod:`varbench.harness.records`). Beside it: ``samples_<evaluator>.jsonl`` (one row per image
and evaluator: ``prompt_index``, ``sample_index`` and the evaluator's fields) and ``traces.jsonl``
(:class:`TraceRow`, one row per image: per-scale trace, FLOPs and executed tokens, KV bytes and peak memory, method stats;
:mod:`varbench.harness.traces`). :func:`varbench.analysis.frame.records_to_frame` flattens records
into one pandas row each; blocks a record lacks (older records, hand-made ones) read as NaN there.

The types below are the schema (``TypedDict``: every key listed is written; ``None`` where a value
does not apply). :func:`check_record` compares a record (or, with ``kind=TraceRow``, a trace row)
with them; the job's tests run it on real records and traces, so a key added to either without a
line here fails the suite.

Spreads (:class:`Spread`) summarise a per-image quantity over the record's images; adaptive
methods (NOVA, ToProVAR, SkipVAR) do different work per prompt, and the spread says how much.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional, TypedDict, get_type_hints

#: The version of the record this module describes (``record.json``'s ``schema_version``).
SCHEMA_VERSION = 1


class Spread(TypedDict):
    """A per-image quantity over the record's images."""

    n: int
    mean: Optional[float]
    std: Optional[float]     # sample standard deviation (0 for one image)
    min: Optional[float]
    max: Optional[float]


class Experiment(TypedDict):
    name: str                # experiment_name
    tags: list               # the config's tags
    overrides: list          # Hydra's task overrides of this job (empty outside Hydra)
    job_num: Optional[int]   # Hydra's 0-based job number in a sweep
    shards: int              # 1, or n of shard=i/n (the record assembled from n shards)


class Model(TypedDict):
    name: str
    preset: str              # infinity_2b, infinity_8b, toy, tiny
    resolution: Optional[list]   # [H, W] of the generated images
    h_div_w: float
    dtype: str               # as resolved (auto -> bfloat16 on CUDA)
    weights: dict            # {file name: sha256} of every weight file loaded; {} for random weights


class Method(TypedDict):
    name: str                # the registered policy (nova, fastvar, ...)
    preset: Optional[str]    # the preset chosen (method=nova_fast); tables show it
    label: Optional[str]
    config: dict             # the composed method node (name, label, knobs)
    stats: dict              # the first image's policy stats; every image's are in traces.jsonl
    files: dict              # {name: sha256} of the files the method loads (SkipVAR's decision models); {} if none
    # did the method change anything (varbench/engine/effect.py)? An image is unchanged when every plan its
    # batch ran under was neutral (traces' plan_neutral) or its pixels equal the baseline's (fidelity)
    effect: Optional[str]    # "none" (no image changed: tables mark the row) | "partial" | "some";
                             # None for the baseline, or when some image's trace predates plan_neutral
    effect_reason: Optional[str]     # why, e.g. "fastvar: no schedule width in 32/40/48/64 at h/w 1.25 (1M)";
                                     # "every plan was neutral" when the policy gives no reason of its own
    unchanged_images: Optional[int]  # images the method left unchanged (None for the baseline)


class Seeds(TypedDict):
    base: int                # generation.seed
    rule: str                # varbench.core.seeds.SEED_RULE


class Benchmark(TypedDict):
    """:meth:`varbench.harness.prompts.PromptSet.describe` plus the seeds."""

    name: str
    loader: str
    source: Optional[str]    # the published location
    source_path: Optional[str]
    sha256: str              # of the prompt file(s) as read
    sha256_expected: Optional[str]   # the pinned official hash
    sha256_matches: Optional[bool]
    files: dict              # {file: sha256}
    items_sha256: str        # of the selected prompts (after limit / limit_per_tag)
    n_prompts: int
    full_size: int           # prompts before the selection
    samples_per_prompt: int
    selection: dict          # {"limit", "limit_per_tag"}
    seeds: Seeds


class TimingBlock(TypedDict, total=False):
    """One batch size of the timed pass (:func:`varbench.harness.timing.timed_pass`); ms blocks are
    ``{"median", "p10", "p90"}`` over the timed prompts' latencies (each prompt's median repeat);
    ``paired`` only when the baseline was timed interleaved."""

    text_ms: dict
    ar_ms: dict
    decode_ms: dict
    total_ms: dict
    per_prompt: dict         # {"ar_ms": [...], "total_ms": [...]}: one latency per timed prompt, in sample order
    ar_repeat_spread: Optional[float]   # the method's own repeats: p90 - p10 over their prompt's median, pooled
    images_per_s: Optional[float]
    peak_mem_bytes: Optional[int]   # CUDA only; over the whole pass, so with a paired baseline the higher of the
                                    # two: the method's own peak is the record's memory.peak_bytes (Memory)
    peak_reserved_bytes: Optional[int]   # CUDA only: max_memory_reserved over the pass (same caveat)
    nvml_bytes: Optional[int]       # CUDA only: the driver's reading after the pass (varbench.engine.nvml)
    per_scale_ms: list
    n_prompts: int           # prompts timed
    n_repeats: int           # timed generations of the method (prompts x repeats)
    repeats_ms: dict         # {"ar": [[...], ...], "total": [[...], ...]}: every repeat, per prompt
    paired: dict             # ar_speedup, ar_ci_low/high, e2e_*, ci_level, ci_kind, per-prompt repeats, reliable, ... (timing.py)


class Timing(TypedDict):
    device: str              # varbench.harness.provenance.device_label: "cpu (<CPU model>, <arch>, <threads> threads)" or
                             # "<GPU> (driver, torch, CUDA, cuDNN; host <CPU model>)"
    dtype: str
    prompts: list            # [{"index", "tag"}] of the timed prompts (varbench.harness.timing.timing_sample), in timing order
    n_prompts: int           # len(prompts): timing.prompts for adaptive methods, timing.prompts_static otherwise
    adaptive: bool           # the policy's plan depends on observed signals (Policy.adaptive)
    warmup: int              # untimed generations on the first prompt
    warmup_per_prompt: int   # untimed pairs before each further prompt (auto resolved)
    repeats: int             # timed pairs per prompt
    tries: list              # one row per pass run (timing.retime_unreliable re-times): try, waited_s, load_settled, reliable, ar_speedup, unreliable_reasons
    by_batch: dict           # {str(batch size): TimingBlock} of the last pass
    runtime: dict            # the systems knobs as applied (varbench.harness.job.runtime_knobs): compile,
                             # compile_fullgraph, compile_log (compiled runs: first_call_s, compiling_calls,
                             # compiling_s = compile time apart from the steady state, graphs, graph_breaks,
                             # calls; else None), quant, attn_backend, cuda_graphs


class _FlopsWhenPadded(TypedDict, total=False):
    padding: float   # a padded batch (varbench/engine/padded_batch.py): FLOPs run beyond the images' own work
                     # (not in total), per image; absent when nothing was padded


class Flops(_FlopsWhenPadded):
    """Analytic FLOPs per image, means over the record's images (a multiply-add = 2).

    ``total``, ``text``, ``ar``, ``per_scale`` and ``per_image`` are the **transformer only**
    (varbench/engine/flops.py; what CI gates on and the "FLOPs × (transformer)" column). The stages around
    it (varbench/engine/stage_flops.py) are separate: ``text_encoder`` (flan-t5-xl over its 512 padded
    tokens, HART's Qwen2 over the system prompt + 300 padded tokens, or the word encoder), ``vae_decode``
    (the decoder at the generated resolution, once per image whatever the method skipped) and ``end_to_end`` = total + text_encoder + vae_decode
    (the "FLOPs × (end to end)" column). The three are None for records whose traces predate them
    or whose encoder/VAE the count does not know."""

    total: float             # transformer only: its text-side projections + the AR loop
    text: float              # the transformer's text-side projections (pooled SOS, cross-attention K/V), not T5
    ar: float                # sum of per_scale (the next-scale loop)
    per_scale: list
    per_image: Spread        # of per-image transformer totals
    text_encoder: Optional[float]   # T5 / Qwen2 / word encoder, this image's share of its generation's encodes
    vae_decode: Optional[float]     # VAE decoder, one decode at the final latent grid
    end_to_end: Optional[float]     # total + text_encoder + vae_decode
    end_to_end_per_image: Spread    # of per-image end_to_end (n = 0 when end_to_end is None)


class Work(TypedDict):
    executed_tokens: Spread  # token-layers executed per image (mean over sublayers, summed over blocks and scales)
    dense_tokens: int        # what the dense forward executes
    keep_fraction: Spread    # executed / dense per image


class MemoryWeights(TypedDict):
    transformer: int         # bytes of the transformer's parameters and buffers (blocks in the run's dtype, the rest fp32)
    vae: int                 # bytes of the VAE's (fp32)


class Memory(TypedDict):
    """The job's memory (:mod:`varbench.engine.memory`). KV bytes are **per image** (its share of its
    generation's cache: the cache is per row, so a batch of B holds B times this), means over the
    record's images, from the trace rows. A record written before this block has ``memory: None``
    (older ones lack the key): tables read NaN."""

    kv_bytes_allocated: Optional[float]  # the KV-cache buffers held (preallocated for the whole schedule)
    kv_bytes_used_peak: Optional[float]  # the most bytes of cached positions in use, over the scales
    kv_bytes_per_scale: list             # per scale, the bytes in use after it (None where not recorded)
    attn_memory_bytes_peak: Optional[float]  # the most bytes attention plans kept between scales (SparVAR's
                                             # remembered key indices and O_cache; 0 for dense attention;
                                             # absent in records written before it)
    kv_dtype: str            # what K/V are cached in (float32 in fp32 runs, else bfloat16)
    batch: int               # images per generation call (runtime.batch_size): the peak is of such a call
    peak_bytes: Optional[int]    # the highest measured peak over the calls that made the images (see peak_kind)
    peak_kind: Optional[str]     # "cuda_max_memory_allocated" (reset before each generate call),
                                 # "cpu_rss_hwm" (the process's RSS high-water mark over the call, reset before
                                 # it), "cpu_ru_maxrss" (the process's peak RSS since it started: no reset
                                 # possible), "mixed" (images made on different devices: no peak), None
    peak_measured: str       # "generation": around each rt.generate of the generation stage (not the timed
                             # pass, whose peak also holds the paired baseline's); reused images keep theirs
    peak_reserved_bytes: Optional[int]   # CUDA: the most max_memory_reserved over those calls (allocated + the
                                         # allocator's cached blocks: what papers quoting torch report); None on the CPU
    nvml_bytes: Optional[int]    # CUDA: the most NVML reading after those calls (adds the CUDA context and library
                                 # workspaces: what nvidia-smi shows); None on the CPU or without pynvml
    nvml_note: Optional[str]     # "process" / "device: no per-process reading" / why there is no NVML reading
    weights_bytes: Optional[MemoryWeights]  # as the runtime holds them; analytic for the preset when assembled
                                            # without a runtime (shards); None: neither is known
    analytic_peak_bytes: Optional[int]      # weights + kv_bytes_allocated x batch: the model's lower bound of
                                            # peak_bytes (no activations, residual caches, text encoder)


class RunRecord(TypedDict):
    schema_version: int      # SCHEMA_VERSION
    entry_id: str            # the entry hash (config minus varbench.core.hashing.ENTRY_EXCLUDE, + sha256s)
    generation_id: str       # the image store's hash (varbench.core.hashing.GENERATION_KEYS, + sha256s)
    created: str             # UTC, ISO 8601 with offset, e.g. "2025-01-31T12:00:00+00:00"
    status: str              # "ok" (a job writes only "ok"; readers take a missing status as "ok" and skip any other)
    experiment: Experiment
    config: dict             # the resolved config, auto device/dtype pinned
    model: Model
    method: Method
    benchmark: Benchmark
    evaluators: dict         # {evaluator: version info (weights' sha256, backend, ...)}
    metrics: dict            # {"<evaluator>/<metric>": value}
    uncertainty: dict        # {"<evaluator>/<metric>": standard error} (see the evaluator)
    higher_is_better: dict   # {"<evaluator>/<metric>": bool}: the metric's direction, from its evaluator
                             # (varbench.analysis.frame.higher_is_better reads it from here)
    timing: Optional[Timing]     # None with timing=none
    flops: Optional[Flops]
    work: Optional[Work]
    memory: Optional[Memory]     # None when the trace rows predate it
    provenance: dict         # git commit, packages, torch/CUDA, host (varbench/harness/provenance.py)
    wall_s: float            # the job's wall time


class TraceScale(TypedDict):
    """One scale of a trace row: what the image's (sub-)batch ran there."""

    si: int                  # scale index
    h: int                   # token grid
    w: int
    ran: bool                # False: the scale was skipped
    keep_frac: Optional[list]        # per layer: the kept share of token-layer work; None when every layer ran in full
    entropy_mean: Optional[float]    # this image's mean predictive entropy (nats) at this scale; None when not run
    ms: Optional[float]              # the scale's time in the generating pass (not the timed pass)
    plan_neutral: Optional[bool]     # the policy's plan changed nothing here (varbench/engine/effect.py)
    kv_bytes_allocated: Optional[int]   # this image's share of its (sub-)batch's KV-cache buffers after this scale
    kv_bytes_used: Optional[int]        # ... and of the cached positions in use (varbench/engine/memory.py)
    attn_memory_bytes: Optional[int]    # ... and of the attention plans' memory after it (indices, O_cache)


class TraceFlops(TypedDict):
    """One image's FLOPs (varbench/engine/flops.py; the record's :class:`Flops` are their means)."""

    total: float             # transformer only
    text: float
    per_scale: list
    text_encoder: Optional[float]
    vae_decode: Optional[float]
    end_to_end: Optional[float]


class _TraceWorkWhenPadded(TypedDict, total=False):
    padding_flops: float     # this image's share of its padded batch's padding FLOPs (absent when not padded)


class TraceWork(_TraceWorkWhenPadded):
    flops: TraceFlops
    executed_tokens: float   # token-layers executed (mean over sublayers, summed over blocks and scales)
    dense_tokens: int        # what the dense forward executes


class TraceMemory(TypedDict):
    """One image's memory (:func:`varbench.engine.memory.image_memory`)."""

    kv_bytes_allocated: Optional[int]   # the most of its share of the KV-cache buffers over its scales
    kv_bytes_used_peak: Optional[int]   # the most of its share of the positions in use
    attn_memory_bytes_peak: Optional[int]   # the most of its share of the attention plans' memory
    peak_bytes: Optional[int]   # the generation call's measured peak (the whole batch's; see Memory.peak_kind)
    peak_kind: Optional[str]
    peak_reserved_bytes: Optional[int]  # CUDA: the call's max_memory_reserved (allocator blocks); None on the CPU
    nvml_bytes: Optional[int]    # CUDA: the driver's reading after the call (varbench.engine.nvml); None on the CPU
    nvml_note: Optional[str]     # "process", "device: no per-process reading", or why there is no reading


class TraceRow(TypedDict):
    """One row of ``traces.jsonl`` (the image store's and, copied, the entry's): one image."""

    prompt_index: int
    sample_index: int
    method: str              # method.name of the job that generated it
    scales: list             # [TraceScale], one per scale of the schedule
    resolution: list         # [H, W] of the generated image
    batch: int               # images generated together with it (its batch companions change its bits)
    work: TraceWork
    stats: dict              # the policy's per-image stats (method-specific, e.g. activation_scale, layer_labels)
    no_effect_reason: Optional[str]  # every plan neutral: why (varbench/engine/effect.py); else None
    memory: TraceMemory


def check_record(record: Mapping[str, Any], kind: type = RunRecord, where: str = "") -> list[str]:
    """Differences between ``record`` and the schema: missing keys (of total types), keys the
    schema does not list, and nested typed blocks checked the same way. Empty when it conforms."""
    hints = get_type_hints(kind)
    problems = []
    required = kind.__required_keys__
    for key in sorted(required - set(record)):
        problems.append(f"{where}{key}: missing")
    for key in sorted(set(record) - set(hints)):
        problems.append(f"{where}{key}: not in varbench.harness.schema.{kind.__name__}")
    for key, tp in hints.items():
        sub = _typed_dict(tp)
        value = record.get(key)
        if sub is not None and isinstance(value, Mapping):
            problems += check_record(value, sub, f"{where}{key}.")
    if kind is Timing and isinstance(record.get("by_batch"), Mapping):
        for bs, block in record["by_batch"].items():
            problems += check_record(block, TimingBlock, f"{where}by_batch.{bs}.")
    if kind is TraceRow and isinstance(record.get("scales"), list):
        for i, scale in enumerate(record["scales"]):
            problems += check_record(scale, TraceScale, f"{where}scales[{i}].")
    return problems


def _typed_dict(tp: Any) -> type | None:
    """The TypedDict in ``tp`` (``X`` or ``Optional[X]``), else None."""
    for t in (tp, *getattr(tp, "__args__", ())):
        if isinstance(t, type) and issubclass(t, dict) and hasattr(t, "__required_keys__"):
            return t
    return None
