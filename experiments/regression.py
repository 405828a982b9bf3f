"""The GPU regression gate: every method's default against a reference made on the same GPU kind.

    python -m experiments.regression --device cuda --check          # CI on a GPU runner (< 10 min on one GPU)
    python -m experiments.regression --device cuda --update         # write the reference for this GPU kind
    python -m experiments.regression --device cpu --smoke --check   # the same code on a CPU, small settings (tests)

Models: the trained toy model (`model=toy`, its 16x16 schedule, fixed toy-world prompts) and Infinity-2B
with RANDOM weights at a reduced schedule (`pn` 0.25M: 10 scales up to 32x32, random text features; built
as experiments/device_bench.py builds it). `--smoke` uses the `tiny` preset in the 2B role (pn 0.06M) and
fewer prompts and repeats. Methods: the baseline and each method's default preset, from
conf/method_set/regression/ (`TOY_METHODS`: toy.yaml, the toy regression gate's toy variants; `BIG_METHODS`:
infinity_2b.yaml, the device bench's 2B set plus SkipVAR's fixed hybrid).

Measured per (model, method), and how `--check` compares it with the reference (`TOLERANCES`):
  * FLOPs ratio to the baseline (analytic count of what ran, varbench.engine.flops): exact (relative 1e-9). On the
    2B model, methods with static plans are also counted from their plans alone
    (experiments.flops_table.method_flops) and must equal what the runtime counted.
  * paired speed-up of the AR loop against the baseline: varbench.harness.timing.timed_pass with the baseline
    interleaved, and a 95% bootstrap interval over rounds (device_bench.paired_ratio). A regression is an
    interval entirely outside reference x (1 +- speedup_rel_tol): 10% on a GPU, 50% on a CPU (shared
    CPUs drift; there it is a plumbing check). GPU runs time graphed (the runtime's default).
  * sha256 of the sampled bits (every scale, fixed prompts and seeds), eager and, on CUDA, graphed: equal to
    the reference's. Independently of any reference, graphed bits must equal eager bits, and every graphed
    replay must give the same bits.
  * toy model only: toy GenEval (exact detector, GenEval rules) within +-0.10 and fidelity to the baseline's
    images (PSNR within +-1 dB, SSIM within +-0.02).
Bits, plans and hence FLOPs of data-dependent methods depend on the GPU kind (and driver, torch), so
references are per GPU kind: `results/curated/regression/<gpu-kind>.json` (`-smoke` suffix for --smoke),
written by `--update` with the GPU name, driver, torch/CUDA versions and the commit. Without a reference the
gate says so and how to make one, and exits 0 (only the invariants above are checked) unless
`--require-reference` is given (then exit 2). Exit 1: a regression (one line per method and quantity).
`--out FILE` saves the measurement; `--measured FILE` checks a saved one without measuring again.
"""
from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import platform
import re
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from experiments import device_bench as db
from varbench.harness.presets import method_set, resolve_method
from experiments import toy_regression as toyreg

ROOT = Path(__file__).resolve().parents[1]
REF_DIR = ROOT / "results" / "curated" / "regression"
SCHEMA = "regression/1"

#: the gate's methods per model: conf/method_set/regression/{toy,infinity_2b}.yaml
TOY_METHODS = method_set("regression", "toy")
BIG_METHODS = method_set("regression", "infinity_2b")
#: policies whose plans do not depend on what the model computes: their FLOPs are also counted from plans alone
STATIC_POLICIES = {"baseline", "skip_last", "fastvar", "skipvar_fixed"}

#: what --check allows. FLOPs are exact counts; speed-ups are noisy (the CPU value is loose on purpose);
#: quality moves only if bits move, and then the tolerance says how far is still acceptable
TOLERANCES = {"flops_rel": 1e-9, "speedup_rel": {"cuda": 0.10, "cpu": 0.50},
              "toy_geneval": toyreg.QUALITY_TOL, "psnr_db": 1.0, "ssim": 0.02}

#: the two settings. Each knob trades gate time against power: more prompts resolve smaller quality
#: moves; more repeats narrow the speed-up interval; a larger pn times the 2B model closer to the paper's 1M
PROFILES = {
    "full": {"toy_prompts": 24, "toy_chunk": 8, "big_pn": "0.25M", "big_batch": 2, "text_len": 30, "cfg": 4.0,
             "warmup": 3, "repeats": 9, "graph_calls": 3},
    "smoke": {"toy_prompts": 6, "toy_chunk": 6, "big_pn": "0.06M", "big_batch": 2, "text_len": 30, "cfg": 4.0,
              "warmup": 1, "repeats": 3, "graph_calls": 3},
}


# ---------------------------------------------------------------------------------------------------
# environment and reference files
def device_kind(device: torch.device) -> str:
    """What references are keyed by: the GPU's name, or the CPU's model (bits may differ across ISAs)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    model = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"cpu {model or platform.processor() or platform.machine()}"


def slug(kind: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", kind.lower()).strip("-")


def default_reference(kind: str, smoke: bool) -> Path:
    return REF_DIR / f"{slug(kind)}{'-smoke' if smoke else ''}.json"


def environment(device: torch.device) -> dict:
    """GPU name, driver, torch/CUDA versions and the commit (VARBENCH_GIT_SHA when the tree has no .git)."""
    from varbench.harness.provenance import git_info, torch_info

    t = torch_info(str(device)) or {}
    git = git_info()
    return {"kind": device_kind(device), "device": str(device), "gpu": t.get("device_name") if device.type == "cuda" else None,
            "driver": t.get("driver"), "torch": torch.__version__, "cuda": torch.version.cuda,
            "commit": git.get("sha") or os.environ.get("VARBENCH_GIT_SHA"), "dirty": git.get("dirty"),
            "python": platform.python_version(), "torch_threads": torch.get_num_threads()}


def how_to_make(kind: str, path: Path, smoke: bool, device: str) -> str:
    cmd = f"python -m experiments.regression --device {device}{' --smoke' if smoke else ''} --update"
    return (f"no reference for this device kind ({kind!r}): {path} does not exist. Make one on this machine with\n"
            f"    {cmd}\nthen review and commit {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path} "
            f"(it records the GPU, driver, torch version and commit).")


# ---------------------------------------------------------------------------------------------------
# measuring
def bits_hash(bits: list[Optional[torch.Tensor]]) -> str:
    """sha256 over every scale's sampled bits (shape included; a skipped scale hashes as 'skip')."""
    h = hashlib.sha256()
    for si, b in enumerate(bits):
        if b is None:
            h.update(f"{si}:skip;".encode())
            continue
        t = b.detach().to("cpu", torch.int8).contiguous()
        h.update(f"{si}:{tuple(t.shape)};".encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()


class Target:
    """One model under test: how to run a fixed batch (quality and hashes) and one timed image."""

    name: str
    rt: Any
    chunks: list            # fixed (prompts/texts, seeds) batches; chunk 0 is hashed
    quality: bool

    def run(self, policy, chunk) -> Any:
        raise NotImplementedError

    def timed(self, policy) -> Any:
        raise NotImplementedError


class ToyTarget(Target):
    def __init__(self, device: torch.device, prof: dict):
        from varbench.toy import world
        from varbench.toy.load import TOY_H_DIV_W, TOY_SCHEDULE, load_toy_runtime, toy_sampling

        self.name, self.quality = "toy", True
        self.rt = load_toy_runtime(device)
        self.kw = dict(schedule=TOY_SCHEDULE, h_div_w=TOY_H_DIV_W, **toy_sampling())
        self.prompts = world.prompt_set(prof["toy_prompts"], seed=0)
        n, c = len(self.prompts), prof["toy_chunk"]
        # seeds as experiments/toy_regression.py: prompt i draws seed 1000 i
        self.chunks = [(list(range(i, min(n, i + c)))) for i in range(0, n, c)]
        self.info = {"schedule": [list(s) for s in TOY_SCHEDULE], "prompts": n, "sampling": toy_sampling()}

    def run(self, policy, chunk):
        return self.rt.generate([self.prompts[i]["prompt"] for i in chunk], [1000 * i for i in chunk], policy, **self.kw)

    def timed(self, policy):
        return self.rt.generate([self.prompts[0]["prompt"]], [0], policy, **self.kw)


class BigTarget(Target):
    """Infinity-2B (tiny under --smoke) with random weights, random text features, reduced schedule."""

    def __init__(self, device: torch.device, prof: dict, smoke: bool):
        self.name, self.quality = "2b", False
        self.spec = db.model_specs(smoke, prof["big_pn"])["2b"]
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        model, vae = db.build_model(self.spec, device, dtype, seed=0)
        self.rt = db.make_runtime(model, vae, device, dtype, db.runtime_accepts_cuda_graphs())
        self.cfg, self.text_len = prof["cfg"], min(prof["text_len"], self.spec.cfg.text_maxlen)
        self.texts = {b: db.random_text(self.spec.cfg, b, self.text_len, device, seed=0) for b in (1, prof["big_batch"])}
        self.chunks = [list(range(prof["big_batch"]))]
        self.info = {"preset": self.spec.preset, "pn": self.spec.pn, "batch": prof["big_batch"],
                     "text_tokens": self.text_len, "cfg": self.cfg, "weights": "random (device_bench.build_model, seed 0)"}

    def run(self, policy, chunk):
        b = len(chunk)
        return self.rt.generate(["random text features"] * b, list(chunk), policy, pn=self.spec.pn, cfg=self.cfg,
                                tau=1.0, decode=True, text=self.texts[b])

    def timed(self, policy):
        return self.rt.generate(["random text features"], [0], policy, pn=self.spec.pn, cfg=self.cfg, tau=1.0,
                                decode=True, text=self.texts[1])

    def analytic_flops(self, preset_cfg: dict) -> Optional[float]:
        """FLOPs of the hashed batch counted from the plans alone (static policies only), else None."""
        if preset_cfg["name"] not in STATIC_POLICIES:
            return None
        from experiments.flops_table import SCENARIO, method_flops

        total, _ = method_flops(preset_cfg["name"], preset_cfg.get("knobs") or {}, self.spec.preset, 1.0, self.spec.pn,
                                len(self.chunks[0]), self.text_len, SCENARIO["nova_act"], SCENARIO["topro_D"])
        return total


def _graphs_possible(rt) -> bool:
    return rt.device.type == "cuda" and hasattr(rt, "cuda_graphs")


def timed_speedup(target: Target, policy, base_policy, prof: dict, device: torch.device) -> dict:
    """Paired AR speed-up of `policy` over the baseline: varbench.harness.timing.timed_pass interleaves the two; the
    per-round times it discards are kept here for device_bench.paired_ratio's bootstrap interval."""
    from varbench.harness.timing import timed_pass

    calls: dict[str, list[float]] = {"method": [], "baseline": []}

    def wrap(pol, key: str) -> Callable[[int], Any]:
        def gen(_bs: int):
            out = target.timed(pol)
            calls[key].append(float(out.timings_ms["ar"]))
            return out
        return gen

    by_batch = timed_pass(wrap(policy, "method"), [1], prof["warmup"], prof["repeats"], device,
                          reference=wrap(base_policy, "baseline"))["1"]
    n = prof["repeats"]
    pr = db.paired_ratio(calls["baseline"][-n:], calls["method"][-n:])
    return {"ratio": pr["ratio"], "ci95": pr["ci95"], "n": pr["n"], "per_round": pr["per_round"],
            "ar_ms": by_batch["ar_ms"]["median"], "baseline_ar_ms": by_batch["paired"]["reference_ar_ms"]}


def measure_target(target: Target, methods: list[str], prof: dict, device: torch.device, log=print) -> dict:
    from PIL import Image

    from varbench.harness.build import configure_runtime
    from varbench.evaluators.base import Sample
    from varbench.evaluators.fidelity import FidelityEvaluator
    from varbench.toy.geneval import ToyGenEval

    rt = configure_runtime(target.rt, {"cuda_graphs": "auto", "fused_entropy": True})
    graphs = _graphs_possible(rt)
    timing_mode = rt.cuda_graphs           # what a job uses (graphed on CUDA)
    model = "toy" if not isinstance(target, BigTarget) else "infinity_2b"
    base_policy = resolve_method("baseline", model=model).build()
    out: dict[str, Any] = {}
    base_images = None
    for preset in methods:
        t0 = time.perf_counter()
        method = resolve_method(preset, model=model)
        policy, pcfg = method.build(), {"name": method.name, "knobs": method.knobs}
        row: dict[str, Any] = {"policy": pcfg["name"]}
        try:
            rt.cuda_graphs = False
            gens = [target.run(policy, ch) for ch in target.chunks]
            n_img = sum(len(ch) for ch in target.chunks)
            row["flops"] = sum(float(g.flops["total"]) for g in gens) / n_img
            row["hash"] = {"eager": bits_hash(gens[0].bits), "graphed": None}
            row["policy_stats"] = db.jsonable(gens[0].policy_stats)
            if isinstance(target, BigTarget):
                a = target.analytic_flops(pcfg)
                row["flops_analytic"] = {"runtime": float(gens[0].flops["total"]), "plans": a}
            if graphs:   # capture at the second sighting, replay after: hash every call, keep the last
                rt.cuda_graphs = True
                hs = [bits_hash(target.run(policy, target.chunks[0]).bits) for _ in range(prof["graph_calls"])]
                row["hash"]["graphed"], row["graphed_stable"] = hs[-1], len(set(hs)) == 1
            if target.quality:
                images = [Image.fromarray(img.cpu().numpy()) for g in gens for img in g.images]
                idx = [i for ch in target.chunks for i in ch]
                ev = ToyGenEval()
                ev.update([Sample(prompt_index=i, sample_index=0, prompt=target.prompts[i]["prompt"],
                                  metadata=target.prompts[i]["metadata"], image=im) for i, im in zip(idx, images)])
                row["toy_geneval"] = ev.compute().metrics["overall"]
                if preset == "baseline":
                    base_images = images
                if base_images is not None:
                    fid = FidelityEvaluator(lpips=False)
                    fid.setup()
                    fid.update([Sample(prompt_index=i, sample_index=0, prompt="", image=im, reference=ref)
                                for i, im, ref in zip(idx, images, base_images)])
                    m = fid.compute().metrics
                    row["psnr"], row["ssim"] = m["psnr"], m["ssim"]
            rt.cuda_graphs = timing_mode
            if preset == "baseline":
                row["speedup"] = {"ratio": 1.0, "ci95": [1.0, 1.0], "n": 0, "note": "the reference itself"}
            else:
                row["speedup"] = timed_speedup(target, policy, base_policy, prof, device)
        except Exception as e:  # noqa: BLE001 - one method's failure is reported, the others still run
            row["error"] = f"{type(e).__name__}: {e}"
        finally:
            rt.cuda_graphs = timing_mode
        if hasattr(rt, "clear_graphs"):   # bound graph memory: each method captures its own steps
            rt.clear_graphs()
        row["seconds"] = round(time.perf_counter() - t0, 2)
        out[preset] = row
        sp = row.get("speedup") or {}
        log(f"  {target.name:4s} {preset:20s} FLOPs {row.get('flops', float('nan')):.4g}  "
            f"speed-up {sp.get('ratio') or float('nan'):.2f} [{(sp.get('ci95') or [0, 0])[0]:.2f}-"
            f"{(sp.get('ci95') or [0, 0])[1]:.2f}]  {row.get('error', '')}  ({row['seconds']:.1f}s)")
    base = out.get("baseline", {}).get("flops")
    for row in out.values():
        row["flops_x"] = base / row["flops"] if base and row.get("flops") else None
    return out


def measure(device: torch.device, smoke: bool, models=("toy", "2b"), methods: Optional[dict] = None, log=print) -> dict:
    """The measurement JSON: env, settings and {model: {method: row}}."""
    prof = PROFILES["smoke" if smoke else "full"]
    methods = methods or {"toy": TOY_METHODS, "2b": BIG_METHODS}
    t0 = time.perf_counter()
    rec: dict[str, Any] = {"schema": SCHEMA, "smoke": smoke, "env": environment(device), "profile": dict(prof),
                           "tolerances": TOLERANCES, "models": {}, "settings": {}}
    for name in models:
        log(f"[regression {time.perf_counter() - t0:6.1f}s] {name}: building")
        target = ToyTarget(device, prof) if name == "toy" else BigTarget(device, prof, smoke)
        rec["settings"][name] = {**target.info, "methods": list(methods[name])}
        rec["models"][name] = measure_target(target, list(methods[name]), prof, device, log)
        del target
        if device.type == "cuda":
            torch.cuda.empty_cache()
    rec["elapsed_s"] = round(time.perf_counter() - t0, 1)
    rec["measured_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    log(f"[regression] measured in {rec['elapsed_s']:.0f}s on {rec['env']['kind']}")
    return rec


# ---------------------------------------------------------------------------------------------------
# checking
def invariants(measured: dict) -> list[str]:
    """What must hold without any reference: no method failed, graphed bits = eager bits (and every replay
    the same), and static plans' FLOPs counted from the plans = what the runtime counted."""
    problems = []
    for model, rows in measured["models"].items():
        for m, r in rows.items():
            where = f"{model}/{m}"
            if r.get("error"):
                problems.append(f"{where}: failed: {r['error']}")
                continue
            h = r.get("hash") or {}
            if h.get("graphed") is not None and h["graphed"] != h.get("eager"):
                problems.append(f"{where}: graphed bits differ from eager bits (sha256 {h['graphed'][:12]} vs {h['eager'][:12]})")
            if r.get("graphed_stable") is False:
                problems.append(f"{where}: graphed replays gave different bits for the same seeds")
            fa = r.get("flops_analytic") or {}
            if fa.get("plans") is not None and fa["plans"] != fa["runtime"]:
                problems.append(f"{where}: FLOPs counted by the runtime {fa['runtime']:.6g} != counted from the plans "
                                f"{fa['plans']:.6g} (varbench.engine.flops.plan_trace)")
    return problems


def _differs(a, b, rel: float) -> bool:
    return abs(a - b) > rel * max(abs(a), abs(b), 1e-300)


def check(measured: dict, reference: dict) -> list[str]:
    """One line per violation, naming model/method and the quantity."""
    problems = []
    if reference.get("schema") != SCHEMA:
        return [f"reference schema {reference.get('schema')!r}, this gate writes {SCHEMA!r}: re-make it with --update"]
    if measured["env"]["kind"] != reference["env"]["kind"]:
        problems.append(f"reference is for {reference['env']['kind']!r}, this is {measured['env']['kind']!r}: "
                        "bits and speed-ups are per device kind")
    for key in ("smoke", "profile", "settings"):
        if measured.get(key) != reference.get(key):
            problems.append(f"settings differ from the reference's ({key}: {reference.get(key)} vs now {measured.get(key)}); "
                            "re-make the reference with --update")
    if problems:
        return problems
    tol = reference["tolerances"]
    sp_tol = tol["speedup_rel"]["cuda" if measured["env"]["device"].startswith("cuda") else "cpu"]
    for model, ref_rows in reference["models"].items():
        got_rows = measured["models"].get(model, {})
        for m, ref in ref_rows.items():
            where = f"{model}/{m}"
            got = got_rows.get(m)
            if got is None or got.get("error"):
                problems.append(f"{where}: not measured" + (f" ({got['error']})" if got else ""))
                continue
            if ref.get("flops_x") is not None and (got.get("flops_x") is None or _differs(got["flops_x"], ref["flops_x"], tol["flops_rel"])):
                problems.append(f"{where}: FLOPs ratio {got.get('flops_x')} vs reference {ref['flops_x']} (exact count; "
                                f"tolerance relative {tol['flops_rel']:g})")
            for mode in ("eager", "graphed"):
                want = (ref.get("hash") or {}).get(mode)
                have = (got.get("hash") or {}).get(mode)
                if want is not None and have != want:
                    problems.append(f"{where}: {mode} bits hash {str(have)[:12]} vs reference {want[:12]} "
                                    "(sampled bits changed for the same prompts and seeds)")
            rs, gs = ref.get("speedup") or {}, got.get("speedup") or {}
            if m != "baseline" and rs.get("ratio") and gs.get("ratio"):
                lo_ok, hi_ok = rs["ratio"] * (1 - sp_tol), rs["ratio"] * (1 + sp_tol)
                lo, hi = gs["ci95"]
                if hi < lo_ok or lo > hi_ok:
                    problems.append(f"{where}: paired speed-up {gs['ratio']:.3f}x [95% CI {lo:.3f}-{hi:.3f}] vs reference "
                                    f"{rs['ratio']:.3f}x (allowed {lo_ok:.3f}-{hi_ok:.3f}: ±{sp_tol:.0%})")
            if ref.get("toy_geneval") is not None:
                d = got["toy_geneval"] - ref["toy_geneval"]
                if abs(d) > tol["toy_geneval"]:
                    problems.append(f"{where}: toy GenEval {got['toy_geneval']:.3f} vs reference {ref['toy_geneval']:.3f} "
                                    f"(moved {d:+.3f}, tolerance ±{tol['toy_geneval']})")
            for q, t, unit in (("psnr", tol["psnr_db"], " dB"), ("ssim", tol["ssim"], "")):
                if ref.get(q) is not None:
                    d = got[q] - ref[q]
                    if abs(d) > t:
                        problems.append(f"{where}: fidelity {q.upper()} {got[q]:.3f}{unit} vs reference {ref[q]:.3f}{unit} "
                                        f"(moved {d:+.3f}, tolerance ±{t}{unit})")
    return problems


def as_reference(measured: dict, command: str) -> dict:
    ref = {k: copy.deepcopy(v) for k, v in measured.items() if k != "elapsed_s"}
    ref["provenance"] = {"command": command, "written_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                         "gpu": measured["env"]["gpu"], "driver": measured["env"]["driver"],
                         "torch": measured["env"]["torch"], "cuda": measured["env"]["cuda"],
                         "commit": measured["env"]["commit"], "dirty": measured["env"]["dirty"]}
    return ref


# ---------------------------------------------------------------------------------------------------
def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--check", action="store_true", help="compare with the reference for this device kind (default)")
    g.add_argument("--update", action="store_true", help="write the reference for this device kind")
    p.add_argument("--device", default="auto", help="cuda | cpu | auto (cuda when available)")
    p.add_argument("--smoke", action="store_true", help="tiny in the 2B role, fewer prompts and repeats (CPU tests)")
    p.add_argument("--reference", default=None, help="reference file (default results/curated/regression/<device kind>[-smoke].json)")
    p.add_argument("--require-reference", action="store_true", help="exit 2 when no reference exists for this device kind")
    p.add_argument("--models", default="toy,2b", help="comma list of toy, 2b")
    p.add_argument("--out", default=None, help="also write the measurement JSON here")
    p.add_argument("--measured", default=None, help="check this saved measurement (--out of an earlier run) instead of measuring")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default 1 on a CPU: steadier, deterministic)")
    a = p.parse_args(argv)
    if a.device == "auto":
        a.device = "cuda" if torch.cuda.is_available() else "cpu"
    if a.device.startswith("cuda") and not torch.cuda.is_available() and not a.measured:
        p.error("--device cuda but CUDA is not available here (use --device cpu --smoke for the CPU plumbing check)")
    a.model_list = [m.strip() for m in a.models.split(",") if m.strip()]
    if not set(a.model_list) <= {"toy", "2b"}:
        p.error("--models takes toy, 2b")
    if a.update and a.measured:
        p.error("--update measures; to turn a saved measurement into a reference, copy it after review")
    return a


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.measured:
        measured = json.loads(Path(a.measured).read_text())
    else:
        device = torch.device(a.device)
        old = torch.get_num_threads()
        threads = a.threads or (1 if device.type == "cpu" else None)
        if threads:
            torch.set_num_threads(threads)
        try:
            measured = measure(device, a.smoke, a.model_list)
        finally:
            torch.set_num_threads(old)
        measured = json.loads(json.dumps(db.jsonable(measured)))   # compared as a reference file will be read
        if a.out:
            Path(a.out).parent.mkdir(parents=True, exist_ok=True)
            Path(a.out).write_text(json.dumps(measured, indent=1) + "\n")
    kind, smoke = measured["env"]["kind"], measured["smoke"]
    ref_path = Path(a.reference) if a.reference else default_reference(kind, smoke)
    problems = invariants(measured)
    if a.update:
        if problems:
            for x in problems:
                print("INVARIANT:", x)
            print(f"reference NOT written ({ref_path}): fix the above first")
            return 1
        cmd = "python -m experiments.regression " + " ".join(argv if argv is not None else sys.argv[1:])
        ref_path.parent.mkdir(parents=True, exist_ok=True)
        ref_path.write_text(json.dumps(db.jsonable(as_reference(measured, cmd)), indent=1) + "\n")
        print(f"wrote {ref_path} for {kind!r} (review the diff, then commit it)")
        return 0
    if not ref_path.exists():
        for x in problems:
            print("REGRESSION:", x)
        print(how_to_make(kind, ref_path, smoke, measured["env"]["device"].split(":")[0]))
        if problems:
            return 1
        return 2 if a.require_reference else 0
    problems += check(measured, json.loads(ref_path.read_text()))
    for x in problems:
        print("REGRESSION:", x)
    n = sum(len(v) for v in measured["models"].values())
    print(f"{'FAIL' if problems else 'PASS'}: {n} (model, method) rows against {ref_path} ({len(problems)} problem(s))")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
