"""One job: generate (or reuse) a benchmark's images under a method, score them, time them, and
write the run record. Every stage is resumable; nothing finished is lost on a crash or kill.

Stages, each a function below, and what a relaunch does at each:

1. :func:`prepare_job` (no compute): validate the config, pin ``auto`` device/dtype, load the
   prompt set, hash the weights; the entry hash names ``store/<experiment>/entries/<hash>/``
   (DONE: skip) and the generation hash names ``store/images/<hash>/``.
2. :func:`generate_stage`: only the (prompt, sample) pairs missing from the image store are
   generated; each batch's trace rows (with the image's FLOPs and executed tokens) are written
   before its images are committed.
3. :func:`reference_stage`: when an evaluator compares with the baseline (``needs_reference``),
   the baseline's images under the same generation settings, generated once per generation hash.
4. :func:`score_stage` (:mod:`varbench.harness.scoring`): per evaluator, rows appended per batch; a
   relaunch scores only the images without a row.
5. :func:`time_stage`: a separate timed pass over a fixed sample of the prompts (warm-up, repeats
   interleaved with the baseline on the same prompt and seeds).
6. :func:`assemble_record`: the record (schema: :mod:`varbench.harness.schema`), then ``DONE``.

Around the stages the job tells its observers what happens (:mod:`varbench.harness.events`:
started once it holds its lock, progress per batch, finished or failed, skipped on a relaunch);
the command line subscribes W&B (``logger=wandb``: a run open while the job runs, the finished
record mirrored, a failed mirror retried by the next launch) and its result line.

Sharding (``shard=i/n``): shard i takes blocks i, i+n, i+2n, ... of the benchmark's prompts
(:mod:`varbench.harness.sharding`: batches never straddle blocks, so they are the same sharded or not), generates and
scores them into ``entries/<hash>/shards/<i>-of-<n>/`` (shard 0 also times), and marks its shard
done; whichever shard finishes last (or ``python -m varbench.job assemble <entry folder>``, or ``python -m varbench.aggregate``,
:mod:`varbench.cli.assemble`) assembles the one record from all shards' rows (:func:`assemble_shards`). Scores equal those of the unsharded run bit for
bit: metrics are always computed from every row sorted by (prompt, sample).
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from pathlib import Path
from typing import Sequence

import torch
from omegaconf import DictConfig, OmegaConf

from varbench.core.aliases import moved_names
from varbench.core.errors import FixableError
from varbench.core.hashing import entry_hash, generation_hash
from varbench.core.interrupt import GracefulStop, uninterruptible
from varbench.core.jsonio import append_jsonl, read_json, read_jsonl, write_json
from varbench.core.locks import DEFAULT_WAIT_S
from varbench.core.seeds import SEED_RULE, image_seed
from varbench.engine.flops import work_summary
from varbench.engine.memory import measure_peak
from varbench.engine.stage_flops import stage_flops
from varbench.harness.build import (build_policy_from_cfg, build_runtime, configure_runtime, generation_kwargs,
                                    generation_resolution, method_file_hashes, model_family, model_weight_hashes,
                                    resolve_device, resolve_dtype)
from varbench.harness.events import JobObserver, ObservedBar, notify
from varbench.harness.prompts import PromptSet, load_prompt_set
from varbench.harness.provenance import collect_provenance
from varbench.harness.records import RunEntry, utc_now
from varbench.harness.schema import SCHEMA_VERSION
from varbench.harness.scoring import SCORE_BATCH, collect_scores, latest_rows, needs_reference, preflight, score_images, write_samples
from varbench.harness.sharding import Shard, batches, block_prompts, generation_batches, key_blocks
from varbench.harness.store import ImageStore
from varbench.harness.traces import entry_traces, trace_row

log = logging.getLogger("varbench")

__all__ = ["run_job", "run_prepared_job", "prepare_job", "image_seed", "SEED_RULE", "assemble_shards"]


# -- the job's shared state ------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class JobContext:
    """What the command line chose, beyond the composed config: passed in by the CLI layer
    (:func:`varbench.cli.context.hydra_context`, from the running Hydra app), never read here from
    Hydra's global state. A programmatic run (tests, scripts) passes none and gets the defaults."""

    method_choice: str | None = None      # the method preset chosen (``method=nova_fast`` -> ``nova_fast``)
    overrides: tuple[str, ...] = ()      # the command line's task overrides, as typed (recorded)
    job_num: int | None = None           # Hydra's 0-based number of this job in a sweep (recorded)


@dataclasses.dataclass
class Job:
    """Everything the stages share, decided before any compute (see :func:`prepare_job`)."""

    cfg: DictConfig
    resolved: dict             # the resolved config, device/dtype pinned
    device: torch.device
    dtype: torch.dtype
    prompt_set: PromptSet
    weights: dict              # {file name: sha256}
    entry: RunEntry
    store: ImageStore
    shard: Shard
    preset: str | None         # the method preset chosen (``method=nova_fast``); tables show it
    t0: float
    method_files: dict = dataclasses.field(default_factory=dict)   # {name: sha256} of the files the method loads
    observers: list = dataclasses.field(default_factory=list)      # JobObserver hooks (varbench.harness.events)
    context: JobContext = dataclasses.field(default_factory=JobContext)   # what the command line chose
    started: bool = False      # job_started was announced (so job_finished / job_failed follow)
    #: wall seconds of each stage this process ran ({"build", "generate", "score", "time"}): the result
    #: line says which one the time went to (on a loaded CPU the timed pass is most of a small job)
    stage_s: dict = dataclasses.field(default_factory=dict)

    @contextlib.contextmanager
    def stage(self, name: str):
        """Add the block's wall time to ``stage_s[name]``."""
        t = time.perf_counter()
        try:
            yield
        finally:
            self.stage_s[name] = self.stage_s.get(name, 0.0) + time.perf_counter() - t

    @property
    def prompts_per_block(self) -> int:
        return block_prompts(self.prompt_set.samples_per_prompt, int(self.cfg.runtime.batch_size), SCORE_BATCH)

    @property
    def blocks(self) -> list[list]:
        """This shard's blocks of ``[(PromptItem, sample_index)]`` (:mod:`varbench.harness.sharding`)."""
        return self.shard.blocks(key_blocks(self.prompt_set.items, self.prompt_set.samples_per_prompt,
                                            self.prompts_per_block))

    @property
    def keys(self) -> list:
        """``[(PromptItem, sample_index)]`` of this job's shard."""
        return [k for blk in self.blocks for k in blk]

    @property
    def all_keys(self) -> list:
        return [(it, s) for it in self.prompt_set.items for s in range(self.prompt_set.samples_per_prompt)]

    @property
    def work_dir(self) -> Path:
        """Where this job's scores go: the entry folder, or its shard's folder."""
        if self.shard.count == 1:
            return self.entry.dir
        return self.entry.dir / "shards" / self.shard.name

    @property
    def lock_wait_s(self) -> float | None:
        """How long to wait for another live job holding a lock this job needs (``runtime.lock_wait_s``)."""
        v = self.cfg.runtime.get("lock_wait_s", DEFAULT_WAIT_S)
        return None if v is None else float(v)

    @property
    def progress(self) -> bool:
        return bool(self.cfg.runtime.progress)

    def bar(self, total: int, desc: str):
        from tqdm.auto import tqdm

        bar = tqdm(total=total, desc=f"{desc} [{self.preset}]" if self.preset else desc, disable=not self.progress,
                   leave=False, dynamic_ncols=True)
        if not self.observers:
            return bar
        return ObservedBar(bar, desc, total, lambda stage, done, n: self.notify("progress", stage, done, n))

    def notify(self, hook: str, *args) -> None:
        """Call ``hook`` (:class:`varbench.harness.events.JobObserver`) of every observer of this job."""
        notify(self.observers, hook, self, *args)


def prepare_job(cfg: DictConfig, context: JobContext | None = None) -> Job:
    """Stage 1: everything decided by the config and the files, before any model is built.
    ``context``: what the command line chose (:class:`JobContext`; None: a programmatic run)."""
    from varbench.harness.config import validate_config
    from varbench.harness.per_model import apply_model_knobs

    t0 = time.perf_counter()
    context = context or JobContext()
    apply_model_knobs(cfg, context.overrides)   # the model's knob values (command-line knobs win), before the checks, hashes and build
    validate_config(cfg)  # before any compute: a bad setting fails here, named
    resolved = OmegaConf.to_container(cfg, resolve=True)
    device = resolve_device(str(cfg.runtime.device))
    dtype = resolve_dtype(str(cfg.runtime.dtype), device, model_family(cfg.model))
    pin_runtime(resolved, device, dtype)   # "auto" hashes (and is recorded) as what it resolved to
    prompt_set = load_prompt_set(cfg.benchmark)
    weights = model_weight_hashes(cfg.model)     # sha256 of every weight file: retrained weights change the hashes
    mfiles = method_file_hashes(resolved.get("method") or {})   # e.g. SkipVAR's decision models, retrained in place
    store_root = Path(cfg.paths.store_dir)
    entry = RunEntry(store_root / str(cfg.experiment_name), entry_hash(resolved, weights, prompt_set.key_sha256,
                                                                       method_files=mfiles))
    store = ImageStore(store_root, generation_hash(resolved, weights, prompt_set.key_sha256, method_files=mfiles))
    shard = Shard.parse(cfg.get("shard"))
    check_shard_fits(shard, prompt_set, int(cfg.runtime.batch_size))
    return Job(cfg, resolved, device, dtype, prompt_set, weights, entry, store, shard,
               method_preset(cfg, context), t0, method_files=mfiles, context=context)


def check_shard_fits(shard: Shard, prompt_set: PromptSet, batch_size: int) -> None:
    """Refuse (:class:`~varbench.core.errors.IncompatibleSettingsError`, before any work) a shard count
    that leaves some shard without prompts. A shard takes whole blocks (a block holds a whole
    generation and scoring batch, :mod:`varbench.harness.sharding`), so ``benchmark.limit=6`` with
    ``runtime.batch_size=4`` makes 2 blocks: at most 2 shards. Every shard of the count refuses alike
    (shard 0 too), so no part is written that could never be assembled."""
    if shard.count == 1:
        return
    spp = prompt_set.samples_per_prompt
    n_blocks = len(key_blocks(prompt_set.items, spp, block_prompts(spp, batch_size, SCORE_BATCH)))
    if n_blocks < shard.count:
        from varbench.core.errors import IncompatibleSettingsError

        raise IncompatibleSettingsError(
            f"shard={shard.index}/{shard.count} with {len(prompt_set.items)} prompt(s) of {spp} image(s) at "
            f"runtime.batch_size={batch_size}: the prompts make {n_blocks} block(s) (a block holds whole batches, "
            f"varbench/harness/sharding.py), so {shard.count - n_blocks} of {shard.count} shards would get no "
            f"prompts. Use at most {n_blocks} shard(s), or more prompts")


# -- stages ----------------------------------------------------------------------------------
def generate_stage(job: Job, rt, policy, store: ImageStore | None = None, cfg: DictConfig | None = None,
                   method_name: str | None = None) -> int:
    """Stage 2: generate and store every image of this job's shard that the store lacks, or whose
    file no longer matches its recorded sha256 (said on stdout). Returns the count.

    Per batch: the image files are written, then their trace rows appended (fsynced) to the
    store's ``traces.jsonl``, and only then are the images committed to ``images.jsonl``; an image
    counts as stored only once committed, so a kill or a full disk at any point leaves no stored
    image without its trace row (an uncommitted image is regenerated on the next run)."""
    from PIL import Image

    store = store or job.store
    cfg = cfg or job.cfg
    method_name = method_name or str(cfg.method.name)
    spp = job.prompt_set.samples_per_prompt
    items = [it for it, s in job.keys if s == 0]
    missing, bad = store.missing(items, spp), store.corrupt(items, spp)   # corrupt() hashes every stored image: once
    if not missing and not bad:
        return 0
    # one generating job per (store, shard): a sweep's method jobs that all need the baseline's
    # images wait for the job making them instead of making them again
    part = job.shard.name if job.shard.count > 1 else None
    with store.generation_lock(wait_s=job.lock_wait_s, part=part):
        # the job waited for may have made the missing ones, or regenerated the corrupt ones
        missing = store.missing(items, spp)
        bad = store.corrupt(sorted({p for p, _ in bad}), spp) if bad else []
        _announce_corrupt(store, bad)
        todo = sorted(set(missing) | set(bad))
        if not todo:
            return 0
        store.write_manifest(OmegaConf.to_container(cfg, resolve=True))
        kw = generation_kwargs(cfg, rt)
        ps = job.prompt_set
        bar = job.bar(len(todo), f"generate {method_name}")
        wanted = set(todo)
        # whole batches of fixed members (varbench.harness.sharding): an image's bits do not depend on how
        # the job was split, limited or resumed; companions already stored are computed, not written
        for batch in generation_batches(job.blocks, ps.all_items or ps.items, ps.samples_per_prompt,
                                        job.prompts_per_block, int(cfg.runtime.batch_size)):
            chunk = [(it.index, s) for it, s in batch if (it.index, s) in wanted]
            if not chunk:
                continue
            with uninterruptible():   # SIGTERM finishes and commits the batch in flight, then stops
                with measure_peak(rt.device) as peak:   # this call's peak memory, into its images' trace rows
                    out = rt.generate([it.generation_prompt for it, _ in batch],
                                      [image_seed(cfg.generation.seed, it.index, s) for it, s in batch], policy, **kw)
                rows, written = [], []
                stages = stage_flops(rt, [it.generation_prompt for it, _ in batch], out.summed_codes.shape[-2:],
                                     kw.get("negative_prompt"))   # text encoder + VAE decode per image
                for b, (item, s) in enumerate(batch):
                    if (item.index, s) not in wanted:
                        continue
                    _, digest = store.write_image(item.index, s, Image.fromarray(out.images[b].cpu().numpy()),
                                                  metadata=_image_metadata(item))
                    rows.append(trace_row(out, b, item.index, s, method_name, stages[b], peak))
                    written.append((item.index, s, digest))
                append_jsonl(store.dir / "traces.jsonl", rows)   # traces first: a committed image always has its trace row
                store.commit(written)
            bar.update(len(chunk))
        bar.close()
    return len(todo)


def _image_metadata(item) -> dict:
    """What is stored beside an image: the benchmark's metadata, its prompt, and the rewritten prompt
    it was generated from when there is one."""
    meta = {**item.metadata, "prompt": item.prompt}
    if item.rewritten is not None:
        meta["generated_from"] = item.rewritten
    return meta


def _announce_corrupt(store: ImageStore, bad: list[tuple[int, int]]) -> None:
    if not bad:
        return
    shown = ", ".join(str(store.path(p, s)) for p, s in bad[:5]) + (" ..." if len(bad) > 5 else "")
    log.warning("%d stored image(s) no longer match their sha256: %s", len(bad), shown)
    print(f"[varbench] regenerating {len(bad)} stored image(s) whose file no longer matches the sha256 "
          f"recorded when it was generated: {shown}")


def reference_stage(job: Job, rt) -> ImageStore | None:
    """Stage 3: the baseline's images under this job's generation settings, for evaluators that
    compare with them; generated here only if no other job has made them."""
    if not needs_reference(job.cfg.get("evaluator")):
        return None
    bcfg = _baseline_cfg(job.cfg)
    bres = pin_runtime(OmegaConf.to_container(bcfg, resolve=True), job.device, job.dtype)
    ref = ImageStore(job.store.root, generation_hash(bres, job.weights, job.prompt_set.key_sha256))
    if ref.dir == job.store.dir:
        return ref                                         # this job is the baseline
    from varbench.policies.baseline import Baseline

    generate_stage(job, rt, Baseline(), store=ref, cfg=bcfg, method_name="baseline")
    return ref


def score_stage(job: Job, ref_store: ImageStore | None) -> None:
    """Stage 4: every configured evaluator's per-sample rows for this job's images (resuming)."""
    job.work_dir.mkdir(parents=True, exist_ok=True)
    score_images(job.work_dir, job.cfg.get("evaluator"), batches(job.blocks, SCORE_BATCH), job.store.load,
                 ref_store.load if ref_store is not None else None, str(job.device), job.bar)


def time_stage(job: Job, rt, policy) -> dict | None:
    """Stage 5: the timed pass (:mod:`varbench.harness.timing`) on a fixed sample of the benchmark's prompts
    (:func:`varbench.harness.timing.timing_sample`): ``timing.prompts`` of them for a policy whose work
    depends on what it observes (``policy.adaptive``), ``timing.prompts_static`` (the sample's
    first ones) otherwise; each prompt with the seeds its images had. With
    ``timing.retime_unreliable`` > 0 an unreliable paired pass is timed again, after the load
    settles, up to that many more times; the last pass is the one recorded, every try is listed
    in ``tries``. None if timing is off."""
    cfg = job.cfg
    tcfg = cfg.timing
    if not tcfg.enabled:
        return None
    check_no_fallback(job, rt, "before the timed pass")   # fell back while generating: fail before timing it
    from varbench.harness.timing import protocol_kwargs, timed_pass, timing_sample, wait_for_steady_load
    from varbench.policies.baseline import Baseline

    kw = generation_kwargs(cfg, rt)
    adaptive = bool(getattr(policy, "adaptive", False))
    n = int(tcfg.get("prompts", 1) if adaptive else tcfg.get("prompts_static", 1))
    items = timing_sample(job.prompt_set.items, n, int(tcfg.get("prompt_seed", 0)))
    wpp = tcfg.get("warmup_per_prompt", "auto")
    wpp = (int(tcfg.warmup) if getattr(rt, "cuda_graphs", False) else 0) if wpp in (None, "auto") else int(wpp)

    def run(p):
        def gen(bs, k=0):
            it = items[k]
            return rt.generate([it.generation_prompt] * bs, [image_seed(cfg.generation.seed, it.index, s) for s in range(bs)], p, **kw)
        return gen

    paired = tcfg.get("paired_baseline", True) and cfg.method.name != "baseline"
    reference = run(Baseline()) if paired else None
    max_tries = 1 + int(tcfg.get("retime_unreliable", 0) or 0)
    tries = []
    for attempt in range(max_tries):
        wait = None
        if attempt:
            wait = wait_for_steady_load(float(tcfg.get("retime_max_wait_s", 120)),
                                        max_change=float(tcfg.get("retime_settle_change", 0.25))) \
                if job.device.type != "cuda" else {"waited_s": 0.0, "settled": None, "load": None}
            print(f"[varbench] timing: re-timing an unreliable pass (try {attempt + 1} of {max_tries}; "
                  f"waited {wait['waited_s']:.0f} s for the load to settle)")
        bar = job.bar(int(tcfg.repeats) * len(items) * len(tcfg.batch_sizes), "timing")
        by_batch = timed_pass(run(policy), list(tcfg.batch_sizes), int(tcfg.warmup), int(tcfg.repeats), job.device, bar,
                              reference=reference, n_prompts=len(items), warmup_per_prompt=wpp,
                              **protocol_kwargs(tcfg))
        bar.close()
        unreliable = {bs: b["paired"]["unreliable_reasons"] for bs, b in by_batch.items()
                      if "paired" in b and not b["paired"]["reliable"]}
        tries.append({"try": attempt + 1, "waited_s": None if wait is None else wait["waited_s"],
                      "load_settled": None if wait is None else wait["settled"],
                      "reliable": not unreliable if paired else None,
                      "ar_speedup": {bs: b["paired"]["ar_speedup"] for bs, b in by_batch.items() if "paired" in b},
                      "unreliable_reasons": unreliable})
        if not unreliable:
            break
    check_no_fallback(job, rt, "during the timed pass")
    return {"device": _device_name(job.device), "dtype": str(job.dtype).replace("torch.", ""),
            "prompts": [{"index": it.index, "tag": it.metadata.get("tag")} for it in items],
            "n_prompts": len(items), "adaptive": adaptive, "warmup": int(tcfg.warmup), "warmup_per_prompt": wpp,
            "repeats": int(tcfg.repeats), "tries": tries, "by_batch": by_batch, "runtime": runtime_knobs(rt)}


class FellBackError(FixableError, RuntimeError):
    """The runtime turned a GPU feature off (a refused CUDA-graph capture, a Triton kernel that would not
    run) under a timing protocol that forbids it (``timing.fail_on_fallback``)."""


def check_no_fallback(job: Job, rt, when: str) -> None:
    """With ``timing.fail_on_fallback`` (the device protocol, ``timing=device``): FellBackError when the
    runtime fell back (``rt.fallbacks``), so a record never carries "graphed" or "fused" timings that ran
    eagerly or on SDPA; the entry stays unfinished and the sweep reports the job as failed, as
    ``experiments.device_bench`` fails such a row. Without it the fallbacks are recorded
    (``provenance.runtime_fallbacks``) and the job goes on."""
    fell = list(getattr(rt, "fallbacks", None) or [])
    if not fell or not job.cfg.timing.get("fail_on_fallback", False):
        return
    what = "; ".join(f"{f['knob']} ({f['error']})" for f in fell)
    knobs = " ".join(f["knob"] for f in fell)
    raise FellBackError(
        f"the runtime fell back {when}: {what}. Timings under this protocol would be labelled with a feature "
        f"that did not run, so the job stops. Fix the cause, or time without the feature on purpose: {knobs} "
        f"(or timing.fail_on_fallback=false to record the fallback in provenance.runtime_fallbacks and go on).")


def assemble_record(job: Job, rt, timing: dict | None, score_dirs: list[Path]) -> dict:
    """Stage 6: the run record (:class:`varbench.harness.schema.RunRecord`) from the stored traces, the
    score rows under ``score_dirs`` and the timed pass; also copies the images' trace rows into
    the entry (``traces.jsonl``)."""
    cfg = job.cfg
    scores = collect_scores(score_dirs, cfg.get("evaluator"), job.all_keys, str(job.device))
    traces = entry_traces(job.store, job.entry, [(it.index, s) for it, s in job.all_keys], force=bool(cfg.runtime.force))
    work = work_summary(traces)
    effect = _method_effect(job, traces, score_dirs)
    first = traces[0] if traces else {}
    resolution = first.get("resolution")              # [H, W] of the generated images
    if resolution is None and rt is not None:
        resolution = generation_resolution(rt, float(cfg.generation.h_div_w), str(cfg.generation.pn),
                                           generation_kwargs(cfg, rt).get("schedule"))
    return {
        "schema_version": SCHEMA_VERSION, "entry_id": job.entry.entry_hash, "generation_id": job.store.generation_hash,
        "created": utc_now(), "status": "ok",
        "experiment": {"name": str(cfg.experiment_name), "tags": list(cfg.tags), "overrides": list(job.context.overrides),
                       "job_num": job.context.job_num, "shards": job.shard.count},
        "config": {**job.resolved, "shard": None},   # the whole job's record, whichever shard assembled it
        "model": {"name": cfg.model.name, "preset": cfg.model.preset, "resolution": resolution,
                  "h_div_w": float(cfg.generation.h_div_w), "dtype": str(job.dtype).replace("torch.", ""),
                  "weights": job.weights},
        "method": {"name": cfg.method.name, "preset": job.preset, "label": cfg.method.get("label"),
                   "config": OmegaConf.to_container(cfg.method, resolve=True), "files": job.method_files,
                   "stats": first.get("stats") or {},   # the first image's; every image's are in traces.jsonl
                   **effect},
        "benchmark": {**job.prompt_set.describe(), "seeds": {"base": int(cfg.generation.seed), "rule": SEED_RULE}},
        "evaluators": {k: v["version"] for k, v in scores.items()},
        "metrics": {f"{k}/{m}": v for k, r in scores.items() for m, v in r["metrics"].items()},
        "uncertainty": {f"{k}/{m}": v for k, r in scores.items() for m, v in r["uncertainty"].items()},
        "higher_is_better": {f"{k}/{m}": v for k, r in scores.items() for m, v in r["higher_is_better"].items()},
        "timing": timing, "flops": work["flops"], "work": work["work"],
        "memory": _memory(job, rt, traces),
        # GPU features that failed on this device and were turned off (runtime.fall_back): the
        # timings then are eager ones; [] when nothing fell back, absent when no runtime was built here
        "provenance": {**collect_provenance(str(job.device)),
                       **({"runtime_fallbacks": list(rt.fallbacks)} if hasattr(rt, "fallbacks") else {}),
                       # the systems knobs as applied (compile, its compile time, quant, attention backend)
                       **({"runtime_knobs": runtime_knobs(rt)} if rt is not None else {})},
        "wall_s": time.perf_counter() - job.t0,
    }


def _memory(job: Job, rt, traces: list[dict]) -> dict | None:
    """The record's ``memory`` block (:class:`varbench.harness.schema.Memory`): the trace rows' KV bytes
    and measured peaks, the weights as the runtime holds them (analytic for the model preset when
    the record is assembled without a runtime), and the analytic lower bound of the peak."""
    from varbench.engine.backbones.infinity.memory import weights_bytes
    from varbench.engine.backbones.infinity.model import PRESETS
    from varbench.engine.memory import kv_cache_dtype, memory_summary, module_bytes

    preset = str(job.cfg.model.preset)
    # without a runtime: the job's dtype, but the toy model runs fp32 whatever runtime.dtype says (build_runtime)
    dtype = rt.dtype if rt is not None else (torch.float32 if preset == "toy" else job.dtype)
    if rt is not None:
        weights = {"transformer": module_bytes(rt.model), "vae": module_bytes(rt.vae) if rt.vae is not None else 0}
    elif preset in PRESETS:
        weights = weights_bytes(PRESETS[preset], dtype)
    else:
        weights = None
    return memory_summary(traces, int(job.cfg.runtime.batch_size), weights, str(kv_cache_dtype(dtype)).replace("torch.", ""))


def _method_effect(job: Job, traces: list[dict], score_dirs: list[Path]) -> dict:
    """The record's ``method.effect`` (:mod:`varbench.engine.effect`), said once on the console when the
    method changed nothing for some or all images."""
    from varbench.engine.effect import console_line, method_effect

    psnr = {}
    for folder in score_dirs:   # pixels identical to the baseline's, where fidelity was scored
        path = Path(folder) / "samples_fidelity.jsonl"
        for r in latest_rows(read_jsonl(path)) if path.exists() else []:
            if r.get("psnr") is not None:
                psnr[(r["prompt_index"], r["sample_index"])] = float(r["psnr"])
    info = method_effect(traces, psnr, str(job.cfg.method.name))
    line = console_line(job.preset or str(job.cfg.method.name), info, len(traces))
    if line:
        print(line)
    return info


# -- the job ---------------------------------------------------------------------------------
def run_job(cfg: DictConfig, observers: Sequence[JobObserver] = (), context: JobContext | None = None) -> Path:
    """Run (or skip, or resume) the job for ``cfg``; returns the entry folder.

    ``observers`` (:class:`varbench.harness.events.JobObserver`) hear what happens; the command line
    wires them from the config (``logger=wandb``, its result line: :func:`varbench.cli.run.run`),
    a caller of this function passes its own (none: nothing is mirrored, nothing more is printed).
    ``context``: what the command line chose (:class:`JobContext`; None: a programmatic run).
    Same as :func:`run_prepared_job` on :func:`prepare_job`'s job."""
    return run_prepared_job(prepare_job(cfg, context), observers)


def run_prepared_job(job: Job, observers: Sequence[JobObserver] = ()) -> Path:
    """Run (or skip, or resume) a prepared job; returns the entry folder.

    SIGTERM/SIGINT (Slurm's time limit, preemption, Ctrl-C) finish the batch in flight, commit
    it and exit with 128 + the signal's number (:mod:`varbench.core.interrupt`); the relaunch resumes.
    The observers hear ``job_started`` once the job holds its entry's (or shard's) lock and has
    work to do, before any model is built (a W&B run opens there, so a missing login fails then,
    naming the fix, and a job that finds its entry finished leaves no run: it says ``job_skipped``).
    The evaluators check their files and the prompts before anything is generated (`scoring.preflight`)."""
    job.observers = list(observers)
    with GracefulStop():
        if _finished(job):
            return job.entry.dir
        preflight(job.cfg.get("evaluator"), [it.metadata for it in job.prompt_set.items], str(job.device))
        try:
            record = _run_shard(job) if job.shard.count > 1 else _run_whole(job)
        except BaseException as e:
            if job.started:
                job.notify("job_failed", e)
            raise
        if job.started:
            job.notify("job_finished", record)        # None: a shard that did not assemble the record
    return job.entry.dir


def _run_whole(job: Job) -> dict | None:
    with _no_empty_folder(job.entry.dir), job.entry.lock(wait_s=job.lock_wait_s):
        if _finished(job):                           # another job finished it while this one waited
            return None
        _start(job)
        with job.stage("build"):
            rt, policy = _build(job)
        with job.stage("generate"):
            n_new = generate_stage(job, rt, policy)
        print(f"[varbench] images: {n_new} generated, stored under {job.store.dir}")
        with job.stage("score"):
            score_stage(job, reference_stage(job, rt))   # the baseline's reference images count as scoring's
        with job.stage("time"):
            timing = time_stage(job, rt, policy)
        record = assemble_record(job, rt, timing, [job.entry.dir])
        with uninterruptible():
            job.entry.write_record(record, force=bool(job.cfg.runtime.force))
            job.entry.mark_done()
    print(f"[varbench] record: {job.entry.record_path}")
    return record


def _start(job: Job) -> None:
    """Announce ``job_started`` once the job holds its lock and knows it has work, so a job that
    finds its entry finished by another one starts nothing (e.g. leaves no empty W&B run). An
    observer that cannot work (a missing W&B login) fails here, before any model is built."""
    job.started = True    # set first: an observer failing here still hears job_failed, as do the others
    job.notify("job_started")


def _finished(job: Job) -> bool:
    """A finished entry (not forced) is skipped, after checking its seal; its observers hear
    ``job_skipped`` (W&B publishes it if its mirror failed last time, or ``logger=wandb`` was added
    since; the console prints its result line)."""
    if not job.entry.is_done() or job.cfg.runtime.force:
        return False
    job.entry.verify()  # a finished entry that no longer matches its seal is an error, not a skip
    record = job.entry.read()
    print(f"[varbench] skip (finished): {job.entry.dir} {_written_by(record)}")
    job.notify("job_skipped", record)
    return True


def _written_by(record: dict) -> str:
    """``(written by commit <sha>)``, and when this code is another commit, says so and how to redo it:
    a relaunch from newer code would otherwise keep an old record without a word."""
    from varbench.harness.provenance import code_version, git_info

    then, now = code_version(record), code_version({"provenance": {"git": git_info()}})
    if then == now:
        return f"(written by commit {then}, this code)"
    return (f"(written by commit {then}; this code is {now}: the record is the older code's, rerun with "
            f"runtime.force=true to redo it)")


def _run_shard(job: Job) -> dict | None:
    """This shard's images and scores; the record if this shard was the last and assembled it."""
    sdir = job.work_dir
    shard_entry = RunEntry.from_dir(sdir)
    with _no_empty_folder(job.entry.dir), _no_empty_folder(sdir), shard_entry.lock(wait_s=job.lock_wait_s):
        _start(job)
        if not (sdir / "SHARD_DONE").exists():
            rt, policy = _build(job) if job.keys or job.shard.index == 0 else (None, None)  # shard 0 also times
            n_new = generate_stage(job, rt, policy)
            print(f"[varbench] shard {job.shard.name}: {n_new} image(s) generated")
            score_stage(job, reference_stage(job, rt))
            if job.shard.index == 0:                  # one shard times; the others only generate and score
                write_json(sdir / "timing.json", time_stage(job, rt, policy))
            # what `python -m varbench.job assemble` needs to rebuild this job without Hydra
            write_json(sdir / "job.json", {"config": OmegaConf.to_container(job.cfg, resolve=True), "preset": job.preset})
            write_json(sdir / "SHARD_DONE", {"images": len(job.keys), "finished": utc_now()})
    return job.entry.read() if assemble_shards(job) else None


def assemble_shards(job: Job) -> bool:
    """Assemble the record from every shard once all are done; False while some are missing.
    Called by each shard when it finishes (the last one wins the entry lock and assembles)."""
    shards = [job.entry.dir / "shards" / Shard(i, job.shard.count).name for i in range(job.shard.count)]
    missing = [s.name for s in shards if not (s / "SHARD_DONE").exists()]
    others = other_shard_counts(job.entry.dir, job.shard.count)
    if others:
        print(f"[varbench] warning: {job.entry.dir / 'shards'} also holds shards of another count ({', '.join(others)}): "
              f"the record is assembled from the {job.shard.count} shards of this count only; the others are "
              "ignored (relaunch them with shard=i/" f"{job.shard.count}, or delete their folders)")
    if missing:
        print(f"[varbench] shard {job.shard.name} done; waiting for shard(s) {', '.join(missing)} to assemble the record")
        return False
    with job.entry.lock(wait_s=job.lock_wait_s), uninterruptible():
        if job.entry.is_done():
            return True
        check_shards_belong(job, shards)                    # before anything is written into the entry
        for name in (job.cfg.get("evaluator") or {}):       # the entry's own sample files, from every shard
            rows = [r for s in shards if (s / f"samples_{name}.jsonl").exists() for r in read_jsonl(s / f"samples_{name}.jsonl")]
            write_samples(job.entry.dir, name, latest_rows(rows))
        versions = {}
        for s in shards:
            if (s / "versions.json").exists():
                versions = {**read_json(s / "versions.json"), **versions}
        write_json(job.entry.dir / "versions.json", versions)
        timing_path = shards[0] / "timing.json"
        timing = read_json(timing_path) if timing_path.exists() else None
        record = assemble_record(job, None, timing, [job.entry.dir])
        job.entry.write_record(record, force=bool(job.cfg.runtime.force))
        job.entry.mark_done()
    print(f"[varbench] record (assembled from {job.shard.count} shards): {job.entry.record_path}")
    return True


def other_shard_counts(entry_dir: Path, count: int) -> list[str]:
    """The shard folders of ``entry_dir`` made with another ``n`` than ``count`` (``shard=1/3`` next to
    ``shard=0/2``): they can never join this count's record."""
    folder = Path(entry_dir) / "shards"
    if not folder.is_dir():
        return []
    return sorted(d.name for d in folder.iterdir() if d.is_dir() and "-of-" in d.name
                  and d.name.rsplit("-of-", 1)[1] != str(count))


class ShardAssemblyError(FixableError):
    """A sharded entry cannot be rebuilt from its folder (no finished shard, or moved files)."""


def check_shards_belong(job: Job, shards: Sequence[Path]) -> None:
    """Every part is of this entry, by its config identity (not only by count): each shard's recorded
    config (``job.json``) must hash to this entry (:func:`varbench.core.hashing.entry_hash`, with this
    job's weight, prompt and method-file hashes). A part copied in from another job (another seed, a
    moved folder) is a :class:`ShardAssemblyError` naming it, raised before anything is written."""
    for s in shards:
        meta = s / "job.json"
        if not meta.exists():
            continue
        try:
            cfg = read_json(meta)["config"]
            key = entry_hash(pin_runtime(cfg, job.device, job.dtype), job.weights, job.prompt_set.sha256,
                             method_files=job.method_files)
        except (KeyError, TypeError) as e:
            raise ShardAssemblyError(f"{meta} has no readable config ({type(e).__name__}: {e}); nothing was "
                                     "written: delete that shard folder and run the shard again") from None
        if key != job.entry.entry_hash:
            raise ShardAssemblyError(f"shard {s.name} of {job.entry.dir} belongs to another job: its config "
                                     f"({meta}) hashes to {key[:12]}, not this entry's {job.entry.entry_hash[:12]} "
                                     "(copied or moved files?); nothing was written: delete that shard folder "
                                     "and run the shard again")


def job_from_shards(entry_dir: str | Path) -> Job:
    """The job of a sharded entry, rebuilt without Hydra from the config its finished shards wrote
    (``shards/*/job.json``), for :func:`assemble_shards` (``python -m varbench.job assemble``: the
    last shard was killed after finishing its part). Raises :class:`ShardAssemblyError` when no
    shard finished or the config no longer hashes to ``entry_dir``."""
    entry_dir = Path(entry_dir)
    metas = sorted((entry_dir / "shards").glob("*/job.json"))
    if not metas:
        raise ShardAssemblyError(f"{entry_dir} has no finished shards (shards/*/job.json)")
    meta = read_json(metas[0])
    job = prepare_job(OmegaConf.create(meta["config"]))
    job.preset = meta.get("preset") or job.preset
    if job.entry.dir.resolve() != entry_dir.resolve():
        raise ShardAssemblyError(f"the shards' config hashes to {job.entry.dir}, not {entry_dir}: were files moved?")
    return job


def ready_sharded_entries(path: str | Path) -> list[Path]:
    """Sharded entry folders under ``path`` whose shards are all done (``SHARD_DONE``) but whose
    record is missing (no ``DONE``: the last shard was killed after finishing its part), sorted."""
    ready = []
    for shards_dir in sorted(Path(path).rglob("shards")):
        entry = shards_dir.parent
        names = [d.name for d in shards_dir.iterdir() if d.is_dir()]
        counts = {int(n.rsplit("-of-", 1)[1]) for n in names if "-of-" in n}
        if len(counts) > 1 and not (entry / "DONE").exists():
            log.warning("%s holds shards of %s different counts (%s): none is assembled; relaunch every shard with "
                        "one count (shard=i/n) or delete the other count's folders", shards_dir, len(counts),
                        ", ".join(sorted(names)))
        if (entry / "DONE").exists() or len(counts) != 1:
            continue
        n = counts.pop()
        if all((shards_dir / f"{i}-of-{n}" / "SHARD_DONE").exists() for i in range(n)):
            ready.append(entry)
    return ready


# -- helpers ---------------------------------------------------------------------------------
def method_preset(cfg: DictConfig, context: JobContext | None = None) -> str | None:
    """The method preset chosen on the command line (``method=nova_fast`` -> ``nova_fast``, from
    ``context``), else the config's own ``method.preset`` or ``method.name`` (a programmatic run)."""
    if context is not None and context.method_choice:
        return str(context.method_choice)
    return cfg.method.get("preset") or cfg.method.get("name")


def _build(job: Job):
    rt = configure_runtime(build_runtime(job.cfg.model, job.device, job.dtype), job.cfg.runtime)
    return rt, build_policy_from_cfg(job.cfg.method)


class _no_empty_folder:
    """On failure, remove ``folder`` if the job left it empty (no entry folders with nothing in them)."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.existed = self.folder.exists()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if exc[0] is not None and not self.existed and self.folder.is_dir():
            # bottom-up rmdir: only empty folders go, never a file another job wrote meanwhile
            for d in sorted((p for p in self.folder.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
                with contextlib.suppress(OSError):
                    d.rmdir()
            with contextlib.suppress(OSError):
                self.folder.rmdir()
        return False


def _baseline_cfg(cfg: DictConfig) -> DictConfig:
    base = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    base.method = {"name": "baseline", "label": "Baseline", "knobs": {}}
    return base


def pin_runtime(tree: dict, device: torch.device, dtype: torch.dtype) -> dict:
    """Replace ``runtime.device``/``runtime.dtype`` ``auto`` in a resolved config by what they
    resolved to here (in place; returned): ``auto`` and its resolution make the same pixels."""
    rt = tree.get("runtime")
    if isinstance(rt, dict):
        if str(rt.get("device")) == "auto":
            rt["device"] = device.type
        if str(rt.get("dtype")) == "auto":
            rt["dtype"] = str(dtype).replace("torch.", "")
    return tree


def runtime_knobs(rt) -> dict:
    """The systems knobs as the runtime applies them (`InfinityRuntime.knobs_summary`: compile mode and
    its compile log, quant, attention backend, CUDA graphs); HART's runtime has none of them (all off)."""
    if hasattr(rt, "knobs_summary"):
        return rt.knobs_summary()
    return {"compile": "off", "compile_fullgraph": False, "compile_log": None, "quant": "none",
            "attn_backend": getattr(rt, "attn_backend", "auto"), "cuda_graphs": bool(getattr(rt, "cuda_graphs", False))}


def _device_name(device: torch.device) -> str:
    """The timing block's device label (:func:`varbench.harness.provenance.device_label`: CPU model, and on
    CUDA the GPU, driver, torch, CUDA and cuDNN versions), the same string provenance records."""
    from varbench.harness.provenance import device_label

    return device_label(str(device))


#: names that moved out (`varbench.core.aliases.MOVED_NAMES`), still read from here with a DeprecationWarning
__getattr__ = moved_names(__name__)
