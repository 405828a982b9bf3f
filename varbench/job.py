"""One job: generate (or reuse) a benchmark's images under a method, score them, time them, and
write the run record. Every step is resumable; nothing finished is lost on a crash or kill.

Order of work, and what a relaunch does at each step:
1. entry hash from the resolved config -> `store/<experiment>/entries/<hash>/`; DONE -> skip.
2. images: only the (prompt, sample) pairs missing from `store/images/<generation hash>/` are
   generated (images are keyed by everything that changes pixels, so a new evaluator or timing
   setting never regenerates); per-image traces are appended as they are made.
3. scoring: each evaluator's per-sample rows go to `samples_<name>.jsonl`, its aggregate to
   `eval_<name>.json`; a finished evaluator is not rerun.
4. timing: a separate timed pass (warm-up, synchronised repeats).
5. `record.json`, then `DONE`; then the W&B mirror.
"""
from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from .build import build_policy_from_cfg, build_runtime, configure_runtime, generation_resolution, resolve_device, resolve_dtype
from .prompts import load_prompt_set
from .provenance import collect_provenance, weight_hashes
from .records import RunEntry, append_jsonl, read_jsonl, utc_now
from .store import ImageStore, entry_hash, generation_hash

log = logging.getLogger("varbench")

SEED_RULE = "seed + 1000 * prompt_index + sample_index"


def image_seed(base: int, p: int, s: int) -> int:
    return int(base) + 1000 * int(p) + int(s)


def _tqdm(total, desc, enabled):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, disable=not enabled, leave=False, dynamic_ncols=True)


def _gen_kwargs(cfg: DictConfig, rt) -> dict:
    g = cfg.generation
    kw = dict(h_div_w=float(g.h_div_w), pn=str(g.pn), top_k=int(g.top_k), top_p=float(g.top_p),
              cfg=OmegaConf.to_object(g.cfg) if OmegaConf.is_list(g.cfg) else float(g.cfg),
              tau=OmegaConf.to_object(g.tau) if OmegaConf.is_list(g.tau) else float(g.tau),
              negative_prompt=g.negative_prompt)
    schedule = cfg.model.get("schedule")
    if schedule is not None:
        kw["schedule"] = [tuple(hw) for hw in schedule]
    return kw


def _trace_row(out, b: int, p: int, s: int, method: str) -> dict:
    scales = []
    for si, tr in enumerate(out.trace):
        keep = None
        if tr["ran"] and any(blk["mode"] != "full" for blk in tr["blocks"]):
            n = tr["tokens"]
            keep = [0.0 if blk["mode"] == "skip" else (blk["sa"] + blk["ca"] + blk["ffn"]) / (3 * n) for blk in tr["blocks"]]
        ent = out.token_entropy[si]
        scales.append({"si": si, "h": tr["h"], "w": tr["w"], "ran": tr["ran"], "keep_frac": keep,
                       "entropy_mean": None if ent is None else float(ent[b].mean()), "ms": tr.get("ms")})
    return {"prompt_index": p, "sample_index": s, "method": method, "scales": scales,
            "stats": _jsonable(out.policy_stats)}


def _jsonable(obj):
    return json.loads(json.dumps(obj, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o)))


def generate_missing(rt, policy, prompt_set, store: ImageStore, cfg: DictConfig, traces_path: Path,
                     method_name: str) -> int:
    """Generate and store every image of the benchmark that the store lacks, or whose file no
    longer matches its recorded sha256 (said on stdout). Returns the count.

    Per batch: the image files are written, then their trace rows appended to ``traces_path``
    (fsynced), and only then are the images committed to the store's ``images.jsonl``; an image
    counts as stored only once committed, so a kill or a full disk at any point leaves no stored
    image without its trace row (an uncommitted image is regenerated on the next run)."""
    from PIL import Image

    todo = store.missing(prompt_set.items, prompt_set.samples_per_prompt)
    bad = store.corrupt(prompt_set.items, prompt_set.samples_per_prompt)
    if bad:
        shown = ", ".join(str(store.path(p, s)) for p, s in bad[:5]) + (" ..." if len(bad) > 5 else "")
        log.warning("%d stored image(s) no longer match their sha256: %s", len(bad), shown)
        print(f"[varbench] regenerating {len(bad)} stored image(s) whose file no longer matches the sha256 "
              f"recorded when it was generated: {shown}")
        todo = sorted(set(todo) | set(bad))
    if not todo:
        return 0
    by_index = {it.index: it for it in prompt_set.items}
    kw = _gen_kwargs(cfg, rt)
    bs = int(cfg.runtime.batch_size)
    bar = _tqdm(len(todo), f"generate {method_name}", cfg.runtime.progress)
    for i in range(0, len(todo), bs):
        chunk = todo[i:i + bs]
        prompts = [by_index[p].prompt for p, _ in chunk]
        seeds = [image_seed(cfg.generation.seed, p, s) for p, s in chunk]
        out = rt.generate(prompts, seeds, policy, **kw)
        rows, written = [], []
        for b, (p, s) in enumerate(chunk):
            item = by_index[p]
            _, digest = store.write_image(p, s, Image.fromarray(out.images[b].cpu().numpy()),
                                          metadata={**item.metadata, "prompt": item.prompt})
            rows.append(_trace_row(out, b, p, s, method_name))
            written.append((p, s, digest))
        append_jsonl(traces_path, rows)   # traces first: a committed image always has its trace row
        store.commit(written)
        bar.update(len(chunk))
    bar.close()
    return len(todo)


def _baseline_cfg(cfg: DictConfig) -> DictConfig:
    base = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    base.method = {"name": "baseline", "label": "Baseline", "knobs": {}}
    return base


def score(entry: RunEntry, evaluators_cfg, prompt_set, store: ImageStore, ref_store: ImageStore | None,
          device: torch.device, progress: bool) -> dict[str, dict]:
    """Run each configured evaluator over the stored images; finished evaluators are reused."""
    from varbench.evaluators import Sample, build_evaluator

    results = {}
    keys = [(it, s) for it in prompt_set.items for s in range(prompt_set.samples_per_prompt)]
    for name, ecfg in (evaluators_cfg or {}).items():
        done_path = entry.dir / f"eval_{name}.json"
        if done_path.exists():
            results[name] = json.loads(done_path.read_text())
            continue
        kwargs = OmegaConf.to_container(ecfg, resolve=True)
        kwargs.pop("name", None)
        if "device" in kwargs and kwargs["device"] in (None, "auto"):
            kwargs["device"] = str(device)
        ev = build_evaluator(ecfg.name, **kwargs)
        ev.setup(str(device))
        if ev.needs_reference and ref_store is None:
            raise ValueError(f"evaluator {name} needs the baseline's images; they could not be located")
        ev.reset()
        bar = _tqdm(len(keys), f"score {name}", progress)
        for i in range(0, len(keys), 16):
            batch = []
            for it, s in keys[i:i + 16]:
                batch.append(Sample(prompt_index=it.index, sample_index=s, prompt=it.prompt, image=store.load(it.index, s),
                                    seed=0, metadata=it.metadata,
                                    reference=ref_store.load(it.index, s) if ev.needs_reference else None))
            ev.update(batch)
            bar.update(len(batch))
        bar.close()
        res = ev.compute()
        samples_path = entry.samples_path(name)
        if samples_path.exists():
            samples_path.unlink()       # a partial file from an interrupted run of this evaluator
        append_jsonl(samples_path, res.per_sample)
        results[name] = {"metrics": res.metrics, "uncertainty": res.uncertainty, "version": _jsonable(ev.version_info()),
                         "higher_is_better": dict(ev.higher_is_better)}
        tmp = done_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(results[name], indent=1, default=str))
        tmp.replace(done_path)
    return results


def run_job(cfg: DictConfig) -> Path:
    """Run (or skip, or resume) the job for `cfg`; returns the entry folder."""
    t0 = time.perf_counter()
    from .validate import validate_config

    validate_config(cfg)  # before any compute: a bad setting fails here, named
    resolved = OmegaConf.to_container(cfg, resolve=True)
    store_root = Path(cfg.paths.store_dir)
    exp = str(cfg.experiment_name)
    device = resolve_device(str(cfg.runtime.device))
    dtype = resolve_dtype(str(cfg.runtime.dtype), device)
    _pin_runtime(resolved, device, dtype)   # "auto" hashes (and is recorded) as what it resolved to
    prompt_set = load_prompt_set(cfg.benchmark)
    weights = _weight_hashes(cfg.model)     # sha256 of every weight file: retrained weights change the hashes
    ehash = entry_hash(resolved, weights, prompt_set.sha256)
    entry = RunEntry(store_root / exp, ehash)
    if entry.is_done() and not cfg.runtime.force:
        entry.verify()  # a finished entry that no longer matches its seal is an error, not a skip
        log.info("finished record found, skipping: %s", entry.dir)
        print(f"[varbench] skip (finished): {entry.dir}")
        return entry.dir

    ghash = generation_hash(resolved, weights, prompt_set.sha256)
    store = ImageStore(store_root, ghash)
    with entry.lock():
        rt = configure_runtime(build_runtime(cfg.model, device, dtype), cfg.runtime)
        policy = build_policy_from_cfg(cfg.method)
        store.write_manifest(resolved)
        traces_path = store.dir / "traces.jsonl"
        n_new = generate_missing(rt, policy, prompt_set, store, cfg, traces_path, cfg.method.name)
        print(f"[varbench] images: {n_new} generated, stored under {store.dir}")

        ref_store = None
        if any(c.name == "fidelity" for c in (cfg.get("evaluator") or {}).values()):
            bcfg = _baseline_cfg(cfg)
            bres = _pin_runtime(OmegaConf.to_container(bcfg, resolve=True), device, dtype)
            ref_store = ImageStore(store_root, generation_hash(bres, weights, prompt_set.sha256))
            if (ref_store.missing(prompt_set.items, prompt_set.samples_per_prompt)
                    or ref_store.corrupt(prompt_set.items, prompt_set.samples_per_prompt)):
                from .policies.baseline import Baseline

                ref_store.write_manifest(OmegaConf.to_container(bcfg, resolve=True))
                generate_missing(rt, Baseline(), prompt_set, ref_store, bcfg,
                                 ref_store.dir / "traces.jsonl", "baseline")
        ev_results = score(entry, cfg.get("evaluator"), prompt_set, store, ref_store, device, cfg.runtime.progress)

        timing, flops = None, None
        kw = _gen_kwargs(cfg, rt)
        item = prompt_set.items[min(int(cfg.timing.prompt_index), len(prompt_set.items) - 1)]
        probe = rt.generate([item.prompt], [image_seed(cfg.generation.seed, item.index, 0)], policy, **kw)
        flops = {"total": probe.flops["total"], "ar": sum(probe.flops["per_scale"]), "text": probe.flops["text"],
                 "per_scale": probe.flops["per_scale"]}
        if cfg.timing.enabled:
            from .timing import timed_pass

            bar = _tqdm(int(cfg.timing.repeats) * len(cfg.timing.batch_sizes), "timing", cfg.runtime.progress)
            def run(p):
                return lambda bs: rt.generate([item.prompt] * bs,
                                              [image_seed(cfg.generation.seed, item.index, k) for k in range(bs)], p, **kw)

            from .policies.baseline import Baseline

            paired = cfg.timing.get("paired_baseline", True) and cfg.method.name != "baseline"
            by_batch = timed_pass(run(policy), list(cfg.timing.batch_sizes), int(cfg.timing.warmup),
                                  int(cfg.timing.repeats), device, bar, reference=run(Baseline()) if paired else None)
            bar.close()
            timing = {"device": _device_name(device), "dtype": str(dtype).replace("torch.", ""),
                      "warmup": int(cfg.timing.warmup), "repeats": int(cfg.timing.repeats), "by_batch": by_batch}

        traces = read_jsonl(traces_path) if traces_path.exists() else []
        keep = {(it.index, s) for it in prompt_set.items for s in range(prompt_set.samples_per_prompt)}
        latest = {}
        for row in traces:
            if (row["prompt_index"], row["sample_index"]) in keep:
                latest[(row["prompt_index"], row["sample_index"])] = row
        if latest and not entry.traces_path.exists():
            entry.append_traces(list(latest.values()))

        record = {
            "schema_version": 1, "entry_id": ehash, "generation_id": ghash, "created": utc_now(), "status": "ok",
            "experiment": {"name": exp, "tags": list(cfg.tags), "overrides": _overrides(), "job_num": _job_num()},
            "config": resolved,
            "model": {"name": cfg.model.name, "preset": cfg.model.preset,
                      "resolution": generation_resolution(rt, float(cfg.generation.h_div_w), str(cfg.generation.pn),
                                                          kw.get("schedule")),
                      "h_div_w": float(cfg.generation.h_div_w), "dtype": str(dtype).replace("torch.", ""),
                      "weights": weights},
            "method": {"name": cfg.method.name, "label": cfg.method.get("label"),
                       "config": OmegaConf.to_container(cfg.method, resolve=True), "stats": _jsonable(probe.policy_stats)},
            "benchmark": {**prompt_set.describe(), "seeds": {"base": int(cfg.generation.seed), "rule": SEED_RULE}},
            "evaluators": {k: v["version"] for k, v in ev_results.items()},
            "metrics": {f"{k}/{m}": v for k, r in ev_results.items() for m, v in r["metrics"].items()},
            "uncertainty": {f"{k}/{m}": v for k, r in ev_results.items() for m, v in r["uncertainty"].items()},
            "higher_is_better": {f"{k}/{m}": v for k, r in ev_results.items() for m, v in r.get("higher_is_better", {}).items()},
            "timing": timing, "flops": flops,
            "provenance": collect_provenance(str(device)),
            "wall_s": time.perf_counter() - t0,
        }
        entry.write_record(record, force=bool(cfg.runtime.force))
        entry.mark_done()
    print(f"[varbench] record: {entry.record_path}")
    _publish(cfg, record, probe, store, prompt_set)
    return entry.dir


def _publish(cfg, record, probe, store, prompt_set) -> None:
    from hydra.utils import instantiate

    if cfg.logger is None or not cfg.logger.get("_target_"):
        return
    sink = instantiate(cfg.logger)
    rows = [{"scale": i, "h": tr["h"], "w": tr["w"], "ran": tr["ran"], "ms": tr.get("ms"), "flops": f}
            for i, (tr, f) in enumerate(zip(probe.trace, probe.flops["per_scale"]))]
    images = [(it.prompt, store.load(it.index, 0)) for it in prompt_set.items[:16]]
    sink.publish(record, per_scale_rows=rows, images=images)


def _pin_runtime(tree: dict, device: torch.device, dtype: torch.dtype) -> dict:
    """Replace ``runtime.device``/``runtime.dtype`` ``auto`` in a resolved config by what they
    resolved to here (in place; returned): ``auto`` and its resolution make the same pixels."""
    rt = tree.get("runtime")
    if isinstance(rt, dict):
        if str(rt.get("device")) == "auto":
            rt["device"] = device.type
        if str(rt.get("dtype")) == "auto":
            rt["dtype"] = str(dtype).replace("torch.", "")
    return tree


def _weight_files(model_cfg) -> dict:
    """``{name: path}`` of every file or folder the model loads weights from (none for random init)."""
    if model_cfg.get("preset") == "toy":
        from .toy.load import FILES, WEIGHTS_DIR

        return {name: WEIGHTS_DIR / name for name in FILES.values()}
    if model_cfg.get("random_weights"):
        return {}
    out = {}
    paths = [model_cfg.get("weights"), model_cfg.get("vae")]
    if model_cfg.get("text_encoder") == "t5":
        paths.append(model_cfg.get("text_encoder_path"))
    for p in paths:
        if p:
            out[Path(str(p)).name] = str(p)
    return out


def _weight_hashes(model_cfg) -> dict:
    """``{file name: sha256}`` of the model's weights (folders: ``<folder>/<file>``); no paths."""
    return weight_hashes(_weight_files(model_cfg))

def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    import platform

    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def _overrides() -> list[str]:
    try:
        from hydra.core.hydra_config import HydraConfig

        return list(HydraConfig.get().overrides.task)
    except Exception:
        return []


def _job_num():
    try:
        from hydra.core.hydra_config import HydraConfig

        return HydraConfig.get().job.get("num")
    except Exception:
        return None
