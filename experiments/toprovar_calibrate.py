"""Calibrate ToProVAR's scale-depth threshold tau the way the paper does (appendix A.2), on any model.

    python -m experiments.toprovar_calibrate model=toy                      # toy model, its protocol prompts
    python -m experiments.toprovar_calibrate model=infinity_2b benchmark=hpsv2 benchmark.limit=50 \\
        --method toprovar --out results/toprovar_calibration/2b.json

Procedure (A.2, as published): pre-sample a small prompt set (the paper: ~50 prompts from HPSv2 and
DPG-Bench) with the unaccelerated model; at every scale s record the mean attention entropy and the
low-entropy ratio rho_s (Eq. 3); the scatter of rho_s for images whose SSIM to the full-scale image
exceeds 0.8 centres near the chosen tau (0.4 on Infinity).
Reconstructed details (the paper shows a figure, not a rule):
  - "the image at scale s" is the decode of the codes summed up to s (what stopping after s yields);
    SSIM against the final image (torchmetrics, Gaussian 11, sigma 1.5, as the fidelity evaluator);
    the last scale is left out (its image is the reference);
  - tau = the median (`--center`) of rho_s over those points (`--points all`), or over each image's
    first scale that clears the SSIM bar (`--points first`: the earliest safe exit);
  - rho_s pools the entropies of the blocks the method's `rho_source` names, at scales with at least
    its `d_min_tokens` tokens, exactly as the policy computes it online.
Plans stay neutral (entropy requests only observe), so the images are the baseline's.
Writes a JSON report (`--out`) and prints a per-scale table, the calibrated tau, and the depth D it
gives each calibration image under the method's rule.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Optional

import torch

CONF = Path(__file__).resolve().parents[1] / "varbench" / "conf"


class EntropyProbe:
    """A neutral policy that asks for the rho_s entropies at every eligible scale and keeps, per scale,
    rho_s and mean attention entropy per prompt and the decoded image so far."""

    name = "toprovar_calibration_probe"

    def __init__(self, rho_source: str, rho_layers, d_min_tokens: int, rho_queries: Optional[int], decode: bool):
        self.rho_source, self.rho_layers = rho_source, rho_layers
        self.d_min_tokens, self.rho_queries, self.decode = int(d_min_tokens), rho_queries, decode

    # Policy protocol (duck-typed: varbench.engine.policy.Policy)
    def reset(self, ctx) -> None:
        from varbench.policies.toprovar import rho_blocks_for

        self.ctx = ctx
        self.blocks = rho_blocks_for(self.rho_source, ctx.depth, self.rho_layers)
        self.rho: dict[int, list[float]] = {}
        self.mean_entropy: dict[int, list[float]] = {}
        self.images: dict[int, torch.Tensor] = {}

    def plan(self, si: int):
        from varbench.engine.plan import ScalePlan

        if self.ctx.tokens(si) < self.d_min_tokens:
            return ScalePlan()
        return ScalePlan(attention_entropy_for=frozenset(self.blocks), attention_entropy_queries=self.rho_queries)

    def observe(self, si: int, signals) -> None:
        from varbench.policies.common import cond_rows
        from varbench.policies.toprovar import low_entropy_ratio

        att = signals.attention_entropy or {}
        rho = low_entropy_ratio(att, self.blocks, self.ctx)
        if rho is not None:
            self.rho[si] = [float(r) for r in rho]
            H = torch.stack([cond_rows(att[b], self.ctx).float().cpu() for b in self.blocks if b in att]).mean(0)
            self.mean_entropy[si] = [float(v) for v in H.mean(-1)]
        if rho is not None and self.decode and signals.decode is not None and signals.summed_codes is not None:
            self.images[si] = signals.decode(signals.summed_codes).cpu()

    def stats(self) -> dict:
        return {}

    def describe(self) -> dict:
        return {"name": self.name}


def ssim(a: torch.Tensor, b: torch.Tensor) -> list[float]:
    """Per-image SSIM of uint8 (B, H, W, 3) batches on [0, 1] RGB, as evaluators/fidelity.py."""
    from torchmetrics.functional.image import structural_similarity_index_measure as fn

    x = a.float().div(255).permute(0, 3, 1, 2)
    y = b.float().div(255).permute(0, 3, 1, 2)
    return [float(v) for v in fn(x, y, data_range=1.0, reduction="none").reshape(-1)]


def depth_for(rhos: dict[int, float], tau: float, rule: str) -> Optional[int]:
    """D = min{s : rho_s >= tau} (or <= tau for the appendix rule) over the recorded scales."""
    for si in sorted(rhos):
        if (rhos[si] >= tau) if rule == "rho_ge_tau" else (rhos[si] <= tau):
            return si
    return None


def calibrate(points: list[dict], ssim_bar: float, which: str, center: str) -> Optional[float]:
    good = [p for p in points if p["ssim"] is not None and p["ssim"] >= ssim_bar and not p["last"]]
    if which == "first":
        first: dict[int, dict] = {}
        for p in sorted(good, key=lambda p: p["scale"]):
            first.setdefault(p["image"], p)
        good = list(first.values())
    vals = [p["rho"] for p in good]
    if not vals:
        return None
    return float(statistics.median(vals) if center == "median" else statistics.fmean(vals))


def run(overrides: list[str], method: str = "toprovar", ssim_bar: float = 0.8, which: str = "all",
        center: str = "median", batch: Optional[int] = None, limit: Optional[int] = None) -> dict[str, Any]:
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from varbench.harness.build import build_runtime, configure_runtime, generation_kwargs, resolve_device, resolve_dtype
    from varbench.harness.job import image_seed
    from varbench.harness.per_model import apply_model_knobs
    from varbench.harness.prompts import load_prompt_set

    t0 = time.perf_counter()
    ov = list(overrides)
    if not any(o.split("=")[0].lstrip("+") == "benchmark" for o in ov):  # default: the model's protocol prompts
        model = next((o.split("=", 1)[1] for o in ov if o.split("=")[0] == "model"), None)
        if model is None:
            raise SystemExit("pass model=<preset> (and benchmark=<set>, e.g. hpsv2, for a released model)")
        ov.append(f"benchmark=protocol/{model}")
    ov.append(f"method={method}")
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=ov)
    apply_model_knobs(cfg, ov)   # the model's per-model knob block (toprovar on the toy), as a job merges it
    knobs = OmegaConf.to_container(cfg.method.knobs, resolve=True)
    if cfg.method.name != "toprovar":
        raise SystemExit(f"--method {method} is not a ToProVAR preset (name {cfg.method.name!r})")
    device = resolve_device(str(cfg.runtime.device))
    rt = configure_runtime(build_runtime(cfg.model, device, resolve_dtype(str(cfg.runtime.dtype), device)), cfg.runtime)
    prompts = load_prompt_set(cfg.benchmark).items
    if limit is not None:
        prompts = prompts[:limit]
    kw = generation_kwargs(cfg, rt)
    bs = int(batch or cfg.runtime.batch_size)
    rule = knobs.get("depth_rule", "rho_ge_tau")
    probe = EntropyProbe(knobs.get("rho_source", "mean_over_layers_heads"), knobs.get("rho_layers"),
                         knobs.get("d_min_tokens", 256), knobs.get("rho_queries"), decode=True)
    points: list[dict] = []
    per_image: list[dict] = []
    n_scales = None
    for start in range(0, len(prompts), bs):
        chunk = prompts[start:start + bs]
        seeds = [image_seed(cfg.generation.seed, it.index, 0) for it in chunk]
        out = rt.generate([it.prompt for it in chunk], seeds, probe, **kw)
        n_scales = len(out.schedule)
        final = out.images.cpu()
        for si in range(n_scales):
            sims = ssim(probe.images[si], final) if si in probe.images else [None] * len(chunk)
            for b, it in enumerate(chunk):
                if si in probe.rho:
                    points.append({"image": start + b, "prompt": it.prompt, "scale": si, "hw": list(out.schedule[si]),
                                   "rho": probe.rho[si][b], "mean_entropy": probe.mean_entropy[si][b],
                                   "ssim": sims[b], "last": si == n_scales - 1})
        for b, it in enumerate(chunk):
            per_image.append({"prompt": it.prompt, "rho": {si: probe.rho[si][b] for si in sorted(probe.rho)}})
    tau = calibrate(points, ssim_bar, which, center)
    sched = {p["scale"]: p["hw"] for p in points}
    per_scale = []
    for si in sorted(sched):
        ps = [p for p in points if p["scale"] == si]
        sims = [p["ssim"] for p in ps if p["ssim"] is not None]
        per_scale.append({"scale": si, "hw": sched[si], "mean_entropy": statistics.fmean(p["mean_entropy"] for p in ps),
                          "rho_mean": statistics.fmean(p["rho"] for p in ps),
                          "ssim_mean": statistics.fmean(sims) if sims else None,
                          "share_above_bar": (sum(s >= ssim_bar for s in sims) / len(sims)) if sims else None})
    configured = float(knobs.get("tau", 0.4))
    depths = {"configured": [depth_for(im["rho"], configured, rule) for im in per_image],
              "calibrated": [depth_for(im["rho"], tau, rule) if tau is not None else None for im in per_image]}
    return {"model": str(cfg.model.name), "benchmark": str(cfg.benchmark.name), "method": method, "n_images": len(per_image),
            "n_scales": n_scales, "ssim_bar": ssim_bar, "points_rule": which, "center": center, "depth_rule": rule,
            "tau_calibrated": tau, "tau_configured": configured, "per_scale": per_scale, "depth_D": depths,
            "points": points, "seconds": time.perf_counter() - t0}


def render(rep: dict) -> str:
    lines = [f"# ToProVAR tau calibration: {rep['model']}, {rep['benchmark']}, {rep['n_images']} images, "
             f"SSIM bar {rep['ssim_bar']}, {rep['points_rule']} points, {rep['center']}",
             "", "| scale | h x w | mean attn entropy | mean rho_s | mean SSIM to final | share >= bar |",
             "|---|---|---|---|---|---|"]
    for r in rep["per_scale"]:
        f = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
        lines.append(f"| {r['scale']} | {r['hw'][0]}x{r['hw'][1]} | {f(r['mean_entropy'])} | {f(r['rho_mean'])} | "
                     f"{f(r['ssim_mean'])} | {f(r['share_above_bar'])} |")
    tau = rep["tau_calibrated"]
    lines += ["", f"tau (calibrated) = {'none: no scale cleared the SSIM bar' if tau is None else f'{tau:.3f}'}"
              f"; configured tau = {rep['tau_configured']}",
              f"depth D per image ({rep['depth_rule']}): configured {rep['depth_D']['configured']}, "
              f"calibrated {rep['depth_D']['calibrated']}", f"({rep['seconds']:.1f} s)"]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 epilog="Other arguments are Hydra overrides of varbench/conf/config.yaml (model=..., benchmark=...).")
    ap.add_argument("--method", default="toprovar", help="ToProVAR preset whose rho knobs (rho_source, d_min_tokens, "
                                                         "depth_rule) the calibration follows; toy: toprovar_toy")
    ap.add_argument("--ssim", type=float, default=0.8, help="SSIM bar to the full-scale image (paper: 0.8)")
    ap.add_argument("--points", choices=["all", "first"], default="all")
    ap.add_argument("--center", choices=["median", "mean"], default="median")
    ap.add_argument("--limit", type=int, default=50, help="calibration prompts (paper: ~50)")
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--out", type=Path, default=None, help="write the JSON report here")
    a, overrides = ap.parse_known_args(argv)
    rep = run(overrides, a.method, a.ssim, a.points, a.center, a.batch, a.limit)
    print(render(rep))
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(rep, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
