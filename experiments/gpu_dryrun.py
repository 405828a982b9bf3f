"""The GPU path before a GPU sees it: a fake-CUDA dry run of `generate` at the real shapes.

    python -m experiments.gpu_dryrun                                  # 2B, 8B and HART-0.7B, batch 1 and 8
    python -m experiments.gpu_dryrun --model infinity_8b --batch 1,8
    python -m experiments.gpu_dryrun --depth 2 --json /tmp/dry.json   # reduced depth (the CI test)
    python -m experiments.gpu_dryrun --model hart_0p7b --batch 2       # HART-0.7B (fp16 autocast)

For each model (random-weight Infinity-2B / 8B, built on meta, materialised as fake CUDA tensors:
`varbench.testing.fake_cuda`), each method's default preset and each batch size, one generation at 1024²
(`pn=1M`), cfg 4, bf16, `cuda_graphs` off (capture needs a device), with the Triton entropy kernel's
wrapper on (`fused_entropy`), text as `experiments.device_bench` feeds it (30 random tokens). It
fails (exit 1) on a device mismatch, a host read inside a scale step, an attention call that would
not run flash-attn in bf16, a block weight or KV cache not in bf16, or images of the wrong shape.

Printed per (model, method, batch): the predicted peak memory of the generation (weights + KV
cache + live activations, VAE decode included; what `torch.cuda.max_memory_allocated` would show
after a reset before the call, without CUDA-graph pools), its split, and the ops per scale that
launch device work (about the kernel launches of an eager step). With random weights an
entropy-driven method's plan comes from stand-in signals (see `varbench.testing.fake_cuda`): its row checks
the machinery at the real shapes, not a trained model's plan. SkipVAR's released decision models
are weights (not shipped): the toy's stand in, so its decision path runs.

HART (`--model hart_0p7b`; `hart_tiny` for the CI test): the random-weight HART-0.7B transformer
(14 stages to 64x64 tokens, 4096-word codebook, the residual diffusion head at the last stage) with its
tokenizer's quantizer and decoder, weights fp32 on the device and the loop under fp16 autocast, as
the release's sample.py runs it (`HartRuntime(dtype=torch.float16)`), cfg 4.5, `more_smooth` on (the
release's default: the gumbel mixture, whose draws are checked too), text as 30 random tokens padded
to HART's 300. Methods: the baseline, FastVAR's HART port and SkipLast(-2)
(`conf/method_set/gpu_dryrun/<model>.yaml`; on the tiny HART the port's rule one grid down, `fastvar_hart_tiny`). It fails on the same things, with HART's intents: every
weight fp32 on the device, every attention call flash-attn in fp16 (autocast's cast of HART's fp32
q/k included), images of the decoder's size, the diffusion head run at the last stage. All blocks
run for real (`--exact` changes nothing): 0.7B at batch 2 takes seconds.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

GIB = 1024 ** 3
#: model -> the default preset of every method (conf/method_set/gpu_dryrun/<model>.yaml; FastVAR's 8B preset is
#: the one written for 8B)
MODELS = ("infinity_2b", "infinity_8b", "hart_0p7b")
#: models the CLI also takes that are not run by default (the tiny HART: the CI test's quick case)
EXTRA_MODELS = ("hart_tiny",)


def methods(model: str) -> list[str]:
    """The dry run's method presets on ``model`` (conf/method_set/gpu_dryrun/<model>.yaml)."""
    from varbench.harness.presets import method_set

    return method_set("gpu_dryrun", model)


HART_CFG = 4.5   # the release's sample.py guidance scale


def is_hart(model: str) -> bool:
    return model.startswith("hart_")


def make_policy(preset: str, depth: int = 32, model: str = "infinity_2b"):
    """The preset's policy as a job on ``model`` builds it, with stand-ins for the data a dry run does not
    have: ScaleKV's released budget file (a synthetic budget of its shape) and SkipVAR's released
    decision models (the toy's)."""
    from varbench.engine.backbones.infinity.schedules import scale_schedule
    from varbench.harness.presets import resolve_method
    from varbench.policies.scalekv import synthetic_budgets

    m = resolve_method(preset, model=model)
    knobs = dict(m.knobs)

    def standin_budget(name, kn):
        if name == "scalekv" and kn.get("budget_file") and not Path(kn["budget_file"]).is_file():
            # the released budget file is data not shipped: a stand-in of its shape (the dry run checks machinery)
            return {**kn, "budget_file": None, "budgets": synthetic_budgets(scale_schedule(1.0, "1M"), depth)}
        return kn

    knobs = standin_budget(m.name, knobs)
    if m.name == "compose":   # a composition's ScaleKV member too
        knobs["policies"] = [{**p, "knobs": standin_budget(p["name"], dict(p.get("knobs") or {}))} for p in knobs["policies"]]
    if "decision_models" in knobs:  # the released folder is weights: the toy's decision models stand in
        knobs["decision_models"] = resolve_method("skipvar_toy").knobs["decision_models"]
    return m.build(**knobs)


def make_hart_policy(model: str, preset: str):
    """A HART method preset's policy as a job on ``model`` builds it."""
    from varbench.harness.presets import resolve_method

    return resolve_method(preset, model=model).build()


def _hart_checks(rt, out, fc, batch: int) -> list[str]:
    """What HART's CUDA path intends (the release's numerics); each failure as one line."""
    bad = []
    for part, mod in (("model", rt.model), ("quantizer", rt.quant), ("decoder", rt.vae)):
        for name, p in mod.named_parameters():
            if p.dtype != torch.float32 or p.device.type != "cuda":
                bad.append(f"{part} weight {name}: {p.dtype} on {p.device}, expected float32 on cuda (autocast computes in "
                           f"{rt.dtype})")
                break
    want = str(rt.dtype).replace("torch.", "")
    wrong = [c for c in fc.attention if c["backend"] != "flash" or c["dtype"] != want]
    if wrong:
        bad.append(f"{len(wrong)} of {len(fc.attention)} attention calls not flash-attn {want}, e.g. {wrong[0]}")
    if not fc.attention:
        bad.append("no attention call was seen")
    side = rt.vae.cfg.downsample * rt.cfg.patch_nums[-1]   # 16 x 64 = 1024 on the 0.7B
    if out.images is None or tuple(out.images.shape) != (batch, side, side, 3) or out.images.dtype != torch.uint8 \
            or out.images.device.type != "cuda":
        bad.append(f"images {None if out.images is None else (tuple(out.images.shape), out.images.dtype, out.images.device)}, "
                   f"expected ({batch}, {side}, {side}, 3) uint8 on cuda")
    ran = [t for t in out.trace if t["ran"]]
    if ran and ran[-1]["si"] == len(rt.cfg.patch_nums) - 1 and not ran[-1].get("diffusion"):
        bad.append("the last stage ran without the diffusion head")
    return bad


def _checks(rt, out, fc, batch: int) -> list[str]:
    """What the CUDA path intends; each failure as one line."""
    bad = []
    for name, p in rt.model.named_parameters():
        want = torch.bfloat16 if ".module." in name else torch.float32   # blocks live under block_chunks.*.module.*
        if p.dtype != want or p.device.type != "cuda":
            bad.append(f"weight {name}: {p.dtype} on {p.device}, expected {want} on cuda")
            break
    # flash-attn for dense and gathered attention; FlexAttention for a block-sparse plan (SparVAR's CSLA)
    # a padded batch's masked KV cache (varbench/engine/padded_batch.py) takes SDPA's memory-efficient kernel
    wrong = [c for c in fc.attention if (c["backend"] not in ("flash", "flex") and not (c.get("masked") and c["backend"] == "efficient"))
             or c["dtype"] != "bfloat16"]
    if wrong:
        bad.append(f"{len(wrong)} of {len(fc.attention)} attention calls not flash-attn/FlexAttention bf16, e.g. {wrong[0]}")
    if not fc.attention:
        bad.append("no attention call was seen")
    h, w = 1024, 1024
    if out.images is None or tuple(out.images.shape) != (batch, h, w, 3) or out.images.dtype != torch.uint8 \
            or out.images.device.type != "cuda":
        bad.append(f"images {None if out.images is None else (tuple(out.images.shape), out.images.dtype, out.images.device)}")
    return bad


def run_one(model: str, preset: str, batch: int, *, depth=None, memo_blocks: bool = True, fc_runtime=None,
            adaptive_batch: str = "pad") -> dict:
    """One (model, preset, batch) row. `adaptive_batch`: how Infinity runs per-image plans of
    different shapes ("pad": one padded step, the default; "split": sub-batches)."""
    from varbench.testing.fake_cuda import FakeCuda

    t0 = time.perf_counter()
    row = {"model": model, "method": preset, "batch": batch, "depth": depth}
    try:
        with FakeCuda(memo_blocks=memo_blocks) as fc:
            if is_hart(model):
                rt = fc.hart_runtime(model, depth=depth, dtype=torch.float16)
                weights = fc.ledger.now
                out = fc.generate(rt, make_hart_policy(model, preset), batch, cfg=HART_CFG, more_smooth=True)
                checks = _hart_checks
            else:
                rt = fc.runtime(model, depth=depth)
                rt.adaptive_batch = adaptive_batch
                weights = fc.ledger.now
                out = fc.generate(rt, make_policy(preset, rt.cfg.depth, model), batch)
                checks = _checks
            ran = [t for t in out.trace if t["ran"]]
            # the KV cache: one buffer (2, rows, H, capacity, c) per block (`varbench.engine.kv_cache.KVCache`;
            # bf16 on Infinity; on HART the autocast dtype, fp16 (HartState.kv_dtype: SDPA reads K/V in it))
            kv = out.kv_bytes[-1]["allocated"]   # per-block capacities (smaller under a KV budget) + its staging buffer
            row.update(
                peak_bytes=fc.ledger.peak, weights_bytes=weights, kv_bytes=kv,
                activations_bytes=fc.ledger.peak - weights - kv,
                ops_per_scale=[fc.ledger.ops.get(t["si"], 0) for t in ran],
                host_syncs=sum(fc.ledger.host_syncs.values()),
                # by the scale they follow ("setup": before the first step)
                host_syncs_per_scale={("setup" if k is None else int(k)): v for k, v in sorted(
                    fc.ledger.host_syncs.items(), key=lambda kv: -1 if kv[0] is None else kv[0])},
                padding_flops=out.flops.get("padding", 0.0), flops=out.flops["total"],
                scales_run=[t["si"] for t in ran],
                attention={b: sum(1 for c in fc.attention if c["backend"] == b) for b in {c["backend"] for c in fc.attention}},
                errors=checks(rt, out, fc, batch))
    except Exception as e:  # noqa: BLE001 - a failing combination is reported in its row; the run goes on
        row.update(errors=[f"{type(e).__name__}: {e}"])
    row["status"] = "ok" if not row["errors"] else "FAILED"
    row["seconds"] = round(time.perf_counter() - t0, 1)
    return row


def fmt_row(r: dict) -> str:
    if r["status"] != "ok":
        return f"{r['model']:12s} {r['method']:17s} b{r['batch']:<2d} FAILED: {'; '.join(r['errors'])[:400]}"
    ops = r["ops_per_scale"]
    return (f"{r['model']:12s} {r['method']:17s} b{r['batch']:<2d} peak {r['peak_bytes'] / GIB:7.2f} GiB "
            f"(weights {r['weights_bytes'] / GIB:5.2f} + KV {r['kv_bytes'] / GIB:5.2f} + act {r['activations_bytes'] / GIB:5.2f})  "
            f"ops/scale {ops}  syncs {r.get('host_syncs', '?')}  [{r['seconds']}s]")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=sorted([*MODELS, *EXTRA_MODELS]), action="append",
                    help="infinity_2b, infinity_8b, hart_0p7b or hart_tiny (repeatable; default all but hart_tiny)")
    ap.add_argument("--batch", default="1,8", help="comma-separated batch sizes (default 1,8)")
    ap.add_argument("--methods", default=None, help="comma-separated method presets (default: each method's default)")
    ap.add_argument("--depth", type=int, default=None, help="blocks per model (default: the preset's; CI uses 2)")
    ap.add_argument("--exact", action="store_true", help="run every block for real (slower; no memoised full blocks)")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows as JSON here")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    a = parse_args(argv)
    try:
        batches = [int(b) for b in a.batch.split(",") if b.strip()]
    except ValueError:
        print(f"--batch {a.batch!r}: give comma-separated integers, e.g. --batch 1,8", file=sys.stderr)
        return 2
    if not batches or min(batches) < 1:
        print(f"--batch {a.batch!r}: batch sizes must be >= 1, e.g. --batch 1,8", file=sys.stderr)
        return 2
    rows = []
    for model in a.model or sorted(MODELS):
        presets = a.methods.split(",") if a.methods else methods(model)
        for preset in presets:
            for b in batches:
                r = run_one(model, preset, b, depth=a.depth, memo_blocks=not a.exact)
                print(fmt_row(r), flush=True)
                rows.append(r)
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps({"schema": "gpu_dryrun/1", "rows": rows}, indent=1))
    failed = [r for r in rows if r["status"] != "ok"]
    print(f"{len(rows) - len(failed)} of {len(rows)} combinations ok")
    return 1 if failed else 0


def predicted_peaks(path: Path) -> dict:
    """{(model, method preset, batch): peak bytes} from a `--json` file."""
    rows = json.loads(Path(path).read_text())["rows"]
    return {(r["model"], r["method"], r["batch"]): r["peak_bytes"] for r in rows if r.get("status") == "ok"}


if __name__ == "__main__":
    sys.exit(main())
