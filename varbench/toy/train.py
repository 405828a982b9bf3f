"""Train the toy-world model on a CPU: the BSQ-VAE, then the tiny Infinity on its multi-scale bits.

    python -m varbench.toy.train                      # all stages, writes varbench/toy/weights/
    python -m varbench.toy.train --stage eval         # re-measure the shipped weights
    python -m varbench.toy.train --vae-steps 20 --steps 20 --out /tmp/toy   # smoke run

Stages (each deterministic given `--seed` and the thread count):
1. vae: encoder -> multi-scale BSQ (straight-through) over TOY_SCHEDULE -> decoder on fresh world
   renders every step, L1 + L2 reconstruction loss. Checked by toy GenEval of reconstructed
   ground-truth renders.
2. infinity: VAE frozen; each step renders fresh scenes, encodes them to per-scale bits (the
   released training labels) and trains the 'toy' Infinity + word encoder with per-bit cross
   entropy on all scales, teacher-forced (`varbench.toy.forward`) on inputs perturbed by Infinity's
   Bitwise Self-Correction (`BSQVAE.self_correction_bits`), with caption dropout to the
   learned `cfg_uncond` rows so classifier-free guidance works. Every `prefix_every`-th step trains
   only the first `prefix_scales` scales (about a quarter of the compute): the coarse scales fix
   layout, colour and count, i.e. what GenEval measures, so they get more updates per CPU second.
3. eval: generate with `InfinityRuntime` for a fixed prompt set, score with `ToyGenEval`, for a few
   sampling settings; the best becomes the default recorded in the manifest. A random-weight model
   of the same size is scored too.

Fresh scenes every step mean no data set is stored and nothing is seen twice; the scene stream is
a numpy generator seeded from `--seed`.
"""
from __future__ import annotations

import argparse
import io
import dataclasses
import json
import math
import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import torch

from varbench.core.jsonio import atomic_write_bytes
from varbench.engine.backbones.infinity.bsq_vae import BSQVAE
from varbench.engine.backbones.infinity.model import PRESETS, Infinity
from varbench.engine.checkpoints import load_state_dict_strict
from varbench.toy import world
from varbench.toy.forward import bit_targets, per_token_bit_ce, teacher_forced_logits
from varbench.toy.load import (FILES, MANIFEST, TOY_H_DIV_W, TOY_IMAGE_SIZE, TOY_MODEL_PRESET, TOY_SCHEDULE, TOY_VAE_PRESET,
                   WEIGHTS_DIR, build_toy_text_encoder, sha256)


@dataclasses.dataclass
class TrainConfig:
    """Knobs. Sizes were chosen for ~1 hour on 2 shared CPU cores (see the manifest's wall times)."""

    seed: int = 0
    threads: int = 2
    # VAE: more steps = sharper reconstructions (the decoder must keep shapes' outlines crisp)
    vae_steps: int = 300
    vae_batch: int = 8
    vae_lr: float = 2e-3
    vae_resume: str = ""             # continue from this VAE state dict (a second phase; recorded)
    vae_fg_weight: float = 4.0       # extra loss weight on object pixels: the grey background is
                                     # ~90% of a render and otherwise dominates, leaving colours muddy
    # Infinity: steps x batch = scenes seen; lr with linear warmup then cosine to 10%
    steps: int = 900
    resume: bool = False             # continue the Infinity + text encoder in --out (a further phase; recorded)
    batch: int = 16
    lr: float = 1.5e-3
    warmup: int = 40
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    caption_dropout: float = 0.1     # share of rows trained unconditional (CFG needs > 0)
    prefix_every: int = 2            # every k-th step trains only the coarse prefix; 0 = never
    prefix_scales: int = 7           # scales in the prefix (7 = up to 10x10 of TOY_SCHEDULE)
    scale_weighting: str = "sqrt"    # per-scale loss weight ~ tokens^p: "tokens" (p=1), "sqrt", "uniform"
    bsc_strength: float = 0.2        # Bitwise Self-Correction: max bit-flip rate of the inputs (0 = pure
                                     # teacher forcing). Higher = more robust to the model's own sampling
                                     # errors at inference, but noisier inputs to learn from
    bsc_scales: int = 8              # BSC flips the first this many scales (upstream 2B: 13 of 13)
    text_layers: int = 2             # contextual transformer layers in the word encoder (the flan-t5 role).
                                     # More = colour/noun binding and relation words pre-resolved in the
                                     # text features, at a few ms per step. On --resume from an encoder with
                                     # fewer layers, the new ones are added as identities (zero-init outputs)
    tag_weights: str = ""            # Infinity stage: relative sampling weight of caption forms, e.g.
                                     # "position=3,color_attr=2"; unnamed tags weigh 1. More weight on the
                                     # forms a model gets wrong buys accuracy there per CPU minute
    log_every: int = 25
    save_every: int = 200            # Infinity stage: write the weights every N steps (atomically), so a
                                     # killed run loses at most N steps and `--resume` continues it; 0 = end only
    max_minutes: float = 0.0         # >0: a stage's wall budget: its lr schedule runs on
                                     # max(step / steps, elapsed / budget) and it stops at the budget,
                                     # so a slow (shared) CPU still ends annealed. Breaks bit-exact
                                     # determinism (steps_done is recorded); 0 = fully deterministic
    # eval
    eval_prompts: int = 60
    eval_samples: int = 2
    eval_prompt_seed: int = 0
    # sampling settings are chosen on a separate prompt set (seed eval_prompt_seed + 1), so the
    # reported score is not selected on its own prompts
    sweep_prompts: int = 72
    sweep: str = ("cfg=2,tau=1.0,top_p=0.97;cfg=3,tau=1.0,top_p=0.97;cfg=3,tau=0.5,top_p=0.97;cfg=4,tau=0.7,top_p=0.97;"
                  "cfg=4,tau=1.0,top_p=0.97;cfg=5,tau=1.0,top_p=0.97")  # ties go to the first listed


def image_batch(scenes: Sequence[world.ToyScene], size: int = TOY_IMAGE_SIZE) -> torch.Tensor:
    """Renders as (B, 3, H, W) float in [-1, 1] (the VAE's input convention)."""
    arr = np.stack([np.array(world.render(s, size)) for s in scenes])
    return torch.from_numpy(arr).permute(0, 3, 1, 2).float().div(127.5).sub(1)


_BG = torch.tensor(world.BACKGROUND, dtype=torch.float32) / 127.5 - 1


def _lr(step: int, total: int, base: float, warmup: int, time_frac: float = 0.0) -> float:
    """Linear warmup, then cosine from base to base/10 over max(step progress, wall-time progress)."""
    if step < warmup:
        return base * (step + 1) / warmup
    t = min(1.0, max((step - warmup) / max(1, total - warmup), time_frac))
    return base * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def _time_frac(t0: float, cfg: "TrainConfig") -> float:
    return (time.time() - t0) / (cfg.max_minutes * 60) if cfg.max_minutes else 0.0


def scale_weights(schedule, mode: str) -> torch.Tensor:
    p = {"tokens": 1.0, "sqrt": 0.5, "uniform": 0.0}[mode]
    w = torch.tensor([float(h * w) ** p for h, w in schedule])
    return w / w.sum()


# ------------------------------------------------------------------------------------------- VAE
def train_vae(cfg: TrainConfig, log=print) -> tuple[BSQVAE, dict]:
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng([cfg.seed, 1])
    vae = BSQVAE(TOY_VAE_PRESET)
    if cfg.vae_resume:
        load_state_dict_strict(vae, torch.load(cfg.vae_resume, map_location="cpu", weights_only=True),
                               source=f"toy VAE {str(cfg.vae_resume)!r}")
        resumed_sha = sha256(Path(cfg.vae_resume))
        rng = np.random.default_rng([cfg.seed, 11])  # fresh scenes, not a replay of phase 1
    opt = torch.optim.Adam(vae.parameters(), lr=cfg.vae_lr, betas=(0.9, 0.99))
    curve, t0, ema = [], time.time(), None
    vae.train()
    for step in range(cfg.vae_steps):
        for g in opt.param_groups:
            g["lr"] = _lr(step, cfg.vae_steps, cfg.vae_lr, 20, _time_frac(t0, cfg))
        imgs = image_batch([world.sample_scene(rng) for _ in range(cfg.vae_batch)])
        _, summed = vae.quantize_latent(vae.encode(imgs), TOY_SCHEDULE)
        rec = vae.decoder(summed)
        fg = ((imgs - _BG.view(1, 3, 1, 1)).abs().amax(1, keepdim=True) > 0.05).float()
        wpix = 1 + cfg.vae_fg_weight * fg
        err = rec - imgs
        l1 = err.abs().mean()
        loss = (wpix * (err.abs() + err.pow(2))).mean() / wpix.mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(vae.parameters(), 1.0)
        opt.step()
        ema = loss.item() if ema is None else 0.9 * ema + 0.1 * loss.item()
        if step % cfg.log_every == 0 or step == cfg.vae_steps - 1:
            curve.append({"step": step, "loss": round(ema, 5), "l1": round(l1.item(), 5), "s": round(time.time() - t0, 1)})
            log(f"vae {step:5d} loss {ema:.4f} l1 {l1.item():.4f} {time.time() - t0:.0f}s")
        if cfg.max_minutes and time.time() - t0 > cfg.max_minutes * 60:
            log(f"vae: stopping at step {step} (max_minutes)")
            break
    vae.eval().requires_grad_(False)
    extra = {"resumed_from_sha256": resumed_sha} if cfg.vae_resume else {}
    return vae, {**extra, "curve": curve, "steps_done": step + 1, "wall_s": round(time.time() - t0, 1), "final_loss": ema}


@torch.no_grad()
def vae_recon_geneval(vae: BSQVAE, n: int, seed: int) -> dict:
    """ToyGenEval of ground-truth renders after encode -> bits -> summed codes -> decode."""
    from varbench.toy.geneval import ToyGenEval
    from PIL import Image

    ev = ToyGenEval()
    items = world.prompt_set(n, seed)
    scenes = [world.sample_scene(it["scene_seed"], it["metadata"]["tag"]) for it in items]
    imgs = image_batch(scenes)
    bits = vae.encode_to_bits(imgs, TOY_SCHEDULE)
    summed = vae.bits_to_summed_codes(bits)
    rec = ((vae.decode(summed) + 1) / 2).clamp(0, 1).permute(0, 2, 3, 1).mul(255).to(torch.uint8).numpy()
    ok = [ev.score_image(Image.fromarray(r), it["metadata"])[0] for r, it in zip(rec, items)]
    gt_ok = [ev.score_image(world.render(s), it["metadata"])[0] for s, it in zip(scenes, items)]
    l1 = (torch.from_numpy(rec).float() - imgs.add(1).mul(127.5).permute(0, 2, 3, 1)).abs().mean().item()
    return {"recon_accuracy": float(np.mean(ok)), "ground_truth_accuracy": float(np.mean(gt_ok)),
            "recon_l1_uint8": round(l1, 3), "n": n}


# -------------------------------------------------------------------------------------- Infinity
def _atomic_save(obj, path: Path) -> None:
    """torch.save that a kill mid-write cannot truncate: the previous file stays until the new one is whole."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    atomic_write_bytes(path, buf.getvalue())


def save_infinity(out: Path, model: Infinity, text_enc) -> None:
    """Write the Infinity and text-encoder files (the manifest, with hashes, is written separately)."""
    _atomic_save(model.state_dict(), out / FILES["infinity"])
    _atomic_save({**text_enc.config(), "state_dict": text_enc.state_dict()}, out / FILES["text"])


def load_text_for_resume(text_enc, saved: dict) -> None:
    """Load a saved word encoder into `text_enc`, which may have more context layers than it: those
    keep their identity init. Anything else that does not match is an error."""
    have = saved.get("layers", 0)
    if have > len(text_enc.context):
        raise ValueError(f"--text-layers {len(text_enc.context)} is fewer than the {have} layers of the encoder "
                         f"being resumed; pass --text-layers {have} (layers are never dropped)")
    new = tuple(f"context.{i}." for i in range(have, len(text_enc.context)))
    load_state_dict_strict(text_enc, saved["state_dict"], source="saved text encoder", error=ValueError,
                           may_miss=lambda k: k.startswith(new))


def parse_tag_weights(text: str):
    """"position=3,color_attr=2" -> a function rng -> tag (None = uniform, the world's own draw)."""
    if not text.strip():
        return lambda rng: None
    w = {t: 1.0 for t in world.TAGS}
    for part in text.split(","):
        tag, _, val = part.partition("=")
        if tag.strip() not in w:
            raise ValueError(f"--tag-weights: unknown tag {tag.strip()!r}; expected one of {', '.join(world.TAGS)}")
        w[tag.strip()] = float(val)
    p = np.array([w[t] for t in world.TAGS]) / sum(w.values())
    return lambda rng: world.TAGS[int(rng.choice(len(p), p=p))]


def train_infinity(cfg: TrainConfig, vae: BSQVAE, log=print, resume_from: Optional[Path] = None,
                   out: Optional[Path] = None):
    torch.manual_seed(cfg.seed + 2)
    rng = np.random.default_rng([cfg.seed, 2])
    gen = torch.Generator().manual_seed(cfg.seed + 3)
    mcfg = PRESETS[TOY_MODEL_PRESET]
    model = Infinity(mcfg)
    text_enc = build_toy_text_encoder(mcfg.text_channels, mcfg.text_maxlen, cfg.text_layers)
    if resume_from is not None:
        # fresh scenes, not a replay of an earlier phase: every resumed checkpoint seeds its own stream
        rng = np.random.default_rng([cfg.seed, 12, int(sha256(resume_from / FILES["infinity"])[:15], 16)])
        load_state_dict_strict(model, torch.load(resume_from / FILES["infinity"], map_location="cpu", weights_only=True),
                               source=f"toy Infinity {str(resume_from / FILES['infinity'])!r}")
        load_text_for_resume(text_enc, torch.load(resume_from / FILES["text"], map_location="cpu", weights_only=True))
    params = list(model.parameters()) + list(text_enc.parameters())
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=cfg.lr, betas=(0.9, 0.97))
    sched = list(TOY_SCHEDULE)
    sizes = [h * w for h, w in sched]
    tag_sampler = parse_tag_weights(cfg.tag_weights)
    curve, t0 = [], time.time()
    ema, ema_scale = None, torch.zeros(len(sched))
    model.train()
    text_enc.train()
    for step in range(cfg.steps):
        for g in opt.param_groups:
            g["lr"] = _lr(step, cfg.steps, cfg.lr, cfg.warmup, _time_frac(t0, cfg))
        scenes = [world.sample_scene(rng, tag_sampler(rng)) for _ in range(cfg.batch)]
        with torch.no_grad():
            labels, inputs = vae.self_correction_bits(vae.encode(image_batch(scenes)), sched, cfg.bsc_strength,
                                                      cfg.bsc_scales, gen)
        k = cfg.prefix_scales if (cfg.prefix_every and step % cfg.prefix_every == cfg.prefix_every - 1) else len(sched)
        text = text_enc([s.caption for s in scenes])
        drop = torch.rand(cfg.batch, generator=gen) < cfg.caption_dropout
        logits = teacher_forced_logits(model, text, inputs[:k], sched[:k], h_div_w=TOY_H_DIV_W, drop=drop,
                                       latent_hw=sched[-1])
        ce = per_token_bit_ce(logits, bit_targets(labels[:k]))                  # (B, L)
        per_scale = torch.stack([c.mean() for c in ce.split(sizes[:k], dim=1)])
        w = scale_weights(sched[:k], cfg.scale_weighting)
        loss = (per_scale * w).sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        opt.step()
        with torch.no_grad():
            ema_scale[:k] = torch.where(ema_scale[:k] == 0, per_scale, 0.9 * ema_scale[:k] + 0.1 * per_scale)
            if k == len(sched):
                ema = loss.item() if ema is None else 0.9 * ema + 0.1 * loss.item()
        if step % cfg.log_every == 0 or step == cfg.steps - 1:
            row = {"step": step, "loss_full": None if ema is None else round(ema, 5),
                   "ce_per_scale": [round(v, 4) for v in ema_scale.tolist()], "lr": round(opt.param_groups[0]["lr"], 6),
                   "s": round(time.time() - t0, 1)}
            curve.append(row)
            log(f"inf {step:5d} loss {row['loss_full']} ce/scale {row['ce_per_scale']} {row['s']:.0f}s")
        if cfg.save_every and out is not None and step % cfg.save_every == cfg.save_every - 1:
            save_infinity(out, model, text_enc)
        if cfg.max_minutes and time.time() - t0 > cfg.max_minutes * 60:
            log(f"infinity: stopping at step {step} (max_minutes)")
            break
    model.eval().requires_grad_(False)
    text_enc.eval().requires_grad_(False)
    return model, text_enc, {"curve": curve, "steps_done": step + 1, "wall_s": round(time.time() - t0, 1),
                             "final_loss_full": ema, "final_ce_per_scale": ema_scale.tolist()}


# ------------------------------------------------------------------------------------------ eval
def parse_sweep(text: str) -> list[dict]:
    out = []
    for part in filter(None, (p.strip() for p in text.split(";"))):
        d = {"top_k": 900}
        for kv in part.split(","):
            k, v = kv.split("=")
            d[k.strip()] = float(v) if k.strip() != "top_k" else int(v)
        out.append(d)
    return out


@torch.no_grad()
def evaluate_runtime(rt, n_prompts: int, n_samples: int, prompt_seed: int, sampling: dict, batch: int = 24) -> dict:
    """Toy GenEval of `rt` on prompt_set(n_prompts, prompt_seed), `n_samples` seeds per prompt.

    Sample j of prompt i uses seed 1000 * j + i."""
    from varbench.evaluators.base import Sample
    from varbench.toy.geneval import ToyGenEval
    from PIL import Image

    items = world.prompt_set(n_prompts, prompt_seed)
    jobs = [(i, j) for j in range(n_samples) for i in range(n_prompts)]
    ev = ToyGenEval(n_boot=200)
    t0 = time.time()
    for b0 in range(0, len(jobs), batch):
        chunk = jobs[b0:b0 + batch]
        out = rt.generate([items[i]["prompt"] for i, _ in chunk], [1000 * j + i for i, j in chunk],
                          schedule=TOY_SCHEDULE, h_div_w=TOY_H_DIV_W, **sampling)
        ev.update([Sample(prompt_index=i, sample_index=j, prompt=items[i]["prompt"], image=Image.fromarray(img.numpy()),
                          seed=1000 * j + i, metadata=items[i]["metadata"]) for (i, j), img in zip(chunk, out.images)])
    res = ev.compute()
    return {"metrics": {k: round(v, 4) for k, v in res.metrics.items()},
            "uncertainty": {k: round(v, 4) for k, v in res.uncertainty.items()},
            "n_prompts": n_prompts, "n_samples": n_samples, "prompt_seed": prompt_seed, "sampling": sampling,
            "wall_s": round(time.time() - t0, 1)}


def random_runtime(seed: int = 0, text_layers: int = 0):
    """A same-size toy model with random weights (and the trained... nothing): the floor."""
    from varbench.engine.backbones.infinity.runtime import InfinityRuntime

    torch.manual_seed(seed)
    mcfg = PRESETS[TOY_MODEL_PRESET]
    return InfinityRuntime(Infinity(mcfg), BSQVAE(TOY_VAE_PRESET), build_toy_text_encoder(mcfg.text_channels, mcfg.text_maxlen,
                                                                                              text_layers))


# ---------------------------------------------------------------------------------------- driver
def _git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent,
                              check=True).stdout.strip()
    except Exception:  # pragma: no cover - not a git checkout
        return "unknown"


def _machine() -> dict:
    return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
            "python": platform.python_version()}


def write_manifest(out: Path, info: dict) -> None:
    files = {}
    for name in FILES.values():
        p = out / name
        if p.is_file():
            files[name] = {"sha256": sha256(p), "bytes": p.stat().st_size}
    info = {**info, "files": files}
    atomic_write_bytes(out / MANIFEST, (json.dumps(info, indent=1) + "\n").encode())


def main(argv: Optional[list[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--stage", choices=["all", "vae", "infinity", "eval"], default="all")
    ap.add_argument("--out", default=str(WEIGHTS_DIR), help="weights folder (read by later stages, written by all)")
    for f in dataclasses.fields(TrainConfig):
        if isinstance(f.default, bool):
            ap.add_argument("--" + f.name.replace("_", "-"), action="store_true", default=f.default)
        else:
            ap.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=f.default)
    args = ap.parse_args(argv)
    cfg = TrainConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig)})
    torch.set_num_threads(cfg.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log_path = out / "train.log"  # appended by every stage: the human-readable training record

    def log(msg):
        print(msg, flush=True)
        with open(log_path, "a") as f:
            f.write(msg + "\n")

    man_path = out / MANIFEST
    info = json.loads(man_path.read_text()) if man_path.is_file() else {}
    info.update({"world_version": world.WORLD_VERSION, "schedule": [list(s) for s in TOY_SCHEDULE], "h_div_w": TOY_H_DIV_W,
                 "image_size": TOY_IMAGE_SIZE, "model_preset": dataclasses.asdict(PRESETS[TOY_MODEL_PRESET]),
                 "vae_preset": TOY_VAE_PRESET, "machine": _machine()})
    info.setdefault("config", {}).update(dataclasses.asdict(cfg))
    info.setdefault("stages", {})

    if args.stage in ("all", "vae"):
        vae, st = train_vae(cfg, log)
        _atomic_save(vae.state_dict(), out / FILES["vae"])
        st["recon_geneval"] = vae_recon_geneval(vae, cfg.eval_prompts, cfg.eval_prompt_seed)
        log(f"vae recon geneval {st['recon_geneval']}")
        if cfg.vae_resume:
            st["resumed_from"] = {"path": cfg.vae_resume, "sha256": st.pop("resumed_from_sha256"),
                                  "previous": info.get("stages", {}).get("vae")}
        info["stages"]["vae"] = {**st, "git_commit": _git_commit()}
        write_manifest(out, info)
    else:
        vae = BSQVAE(TOY_VAE_PRESET)
        load_state_dict_strict(vae, torch.load(out / FILES["vae"], map_location="cpu", weights_only=True),
                               source=f"toy VAE {str(out / FILES['vae'])!r}")
        vae.eval().requires_grad_(False)

    if args.stage in ("all", "infinity"):
        prev = info["stages"].get("infinity") if cfg.resume else None
        if cfg.resume:
            prev = {**prev, "sha256": {n: sha256(out / n) for n in (FILES["infinity"], FILES["text"])}}
        model, text_enc, st = train_infinity(cfg, vae, log, resume_from=out if cfg.resume else None, out=out)
        if prev is not None:
            st["resumed_from"] = prev

        save_infinity(out, model, text_enc)
        info["stages"]["infinity"] = {**st, "git_commit": _git_commit()}
        write_manifest(out, info)

    if args.stage in ("all", "eval"):
        from varbench.toy.load import load_toy_runtime

        rt = load_toy_runtime(weights_dir=out)
        results = []
        for s in parse_sweep(cfg.sweep):
            r = evaluate_runtime(rt, cfg.sweep_prompts, 1, cfg.eval_prompt_seed + 1, s)
            log(f"sweep {s}: {r['metrics']} ({r['wall_s']}s)")
            results.append(r)
        chosen = max(results, key=lambda r: r["metrics"]["overall"])["sampling"]
        best = evaluate_runtime(rt, cfg.eval_prompts, cfg.eval_samples, cfg.eval_prompt_seed, chosen)
        log(f"eval trained {chosen}: {best['metrics']} +- {best['uncertainty']}")
        rnd = evaluate_runtime(random_runtime(cfg.seed, len(rt.text_encoder.context)), cfg.eval_prompts, cfg.eval_samples, cfg.eval_prompt_seed, chosen)
        # the quality test's subset (sample 0 of the first 12 prompts), measured here for its threshold
        sub = evaluate_runtime(rt, 12, 1, cfg.eval_prompt_seed, chosen)
        log(f"eval random model: {rnd['metrics']}")
        recon = vae_recon_geneval(rt.vae, cfg.eval_prompts, cfg.eval_prompt_seed)  # on this world version
        log(f"vae recon geneval ({world.WORLD_VERSION}) {recon}")
        info["sampling"] = best["sampling"]
        info["eval"] = {"sweep": results, "trained": best, "random": rnd, "subset12": sub["metrics"],
                        "vae_recon": recon, "git_commit": _git_commit()}
        write_manifest(out, info)
    log(f"done; manifest at {man_path}")


if __name__ == "__main__":
    main()
