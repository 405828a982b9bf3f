"""Re-measure how far the upstream-golden comparison moves across CPU kernel paths (issue 20).

    python tests/engine/measure_parity_spread.py [--json out.json]

Runs every case of tests/fixtures/upstream_golden/ (teacher-forced, see tests/engine/golden_parity.py) in a
subprocess per setting below: ATen's dispatch level, MKL's code path (MKL_CBWR,
MKL_ENABLE_INSTRUCTIONS), oneDNN's ISA cap (the bf16 SDPA and convolutions), and torch threads. For
each setting it prints, against the fixture and against the unmodified run, the numbers the
tolerances in tests/engine/test_upstream_parity.py are built on. `pytest -m slow
tests/engine/test_upstream_parity.py` runs it and checks the tolerances still hold under every setting.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

#: (label, environment) of each setting; the first is the machine's own default paths
SETTINGS = [
    ("default", {}),
    ("threads=1", {"VARBENCH_PARITY_THREADS": "1"}),
    ("OMP_NUM_THREADS=1", {"OMP_NUM_THREADS": "1"}),
    ("ATEN_CPU_CAPABILITY=default", {"ATEN_CPU_CAPABILITY": "default"}),
    ("ATEN_CPU_CAPABILITY=avx2", {"ATEN_CPU_CAPABILITY": "avx2"}),
    ("ATEN_CPU_CAPABILITY=avx512", {"ATEN_CPU_CAPABILITY": "avx512"}),
    ("MKL_CBWR=COMPATIBLE", {"MKL_CBWR": "COMPATIBLE"}),
    ("MKL_CBWR=AVX2", {"MKL_CBWR": "AVX2"}),
    ("MKL_CBWR=AVX512", {"MKL_CBWR": "AVX512"}),
    ("MKL_ENABLE_INSTRUCTIONS=AVX2", {"MKL_ENABLE_INSTRUCTIONS": "AVX2"}),
    ("ONEDNN_MAX_CPU_ISA=AVX2", {"ONEDNN_MAX_CPU_ISA": "AVX2"}),
    ("ONEDNN_MAX_CPU_ISA=AVX512_CORE", {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}),   # no AVX512-BF16
    ("all-scalar,threads=1", {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE",
                              "ONEDNN_MAX_CPU_ISA": "SSE41", "VARBENCH_PARITY_THREADS": "1"}),
    ("all-avx2,threads=1", {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2",
                            "OMP_NUM_THREADS": "1"}),
]


def child(out: str) -> None:
    import torch

    from golden_parity import CASES, load_golden, run_case

    if os.environ.get("VARBENCH_PARITY_THREADS"):
        torch.set_num_threads(int(os.environ["VARBENCH_PARITY_THREADS"]))
    golden = load_golden()
    res = {}
    for case in CASES:
        r = run_case(golden, case)
        res[case] = {"guided": r.guided, "ours": r.ours, "expo": r.expo, "pooled": r.pooled,
                     "summed_codes": r.summed_codes, "image": r.image, "top_k": r.top_k, "top_p": r.top_p}
    from varbench.testing.tiny import cpu_fingerprint

    torch.save({"cases": res, "hps": hps_spread(), "fingerprint": cpu_fingerprint()}, out)


def hps_spread() -> dict:
    """HPSv2 preprocessing (bicubic antialiased resize) against tests/fixtures/evaluators/hps_golden.json."""
    import torch
    from PIL import Image

    from varbench.evaluators.hpsv2 import hps_preprocess

    fix = ROOT / "tests" / "fixtures" / "evaluators"
    gold = json.loads((fix / "hps_golden.json").read_text())
    worst = {"strided_max": 0.0, "strided_differ": 0, "strided_of": 0, "sum_max": 0.0}
    for row in gold["rows"]:
        t = hps_preprocess(Image.open(fix / "images" / row["image"]))
        d = (t.flatten()[::997].double() - torch.tensor(row["pre_strided"], dtype=torch.float64)).abs()
        worst["strided_max"] = max(worst["strided_max"], float(d.max()))
        worst["strided_differ"] += int((d > 0).sum())
        worst["strided_of"] += d.numel()
        worst["sum_max"] = max(worst["sum_max"], abs(float(t.double().sum()) - row["pre_sum"]))
    return worst


def summarise(run: dict, base: dict, golden: dict) -> dict:
    """Per case: the spreads of one setting's run against the fixture and against the default run."""
    import torch

    from golden_parity import CASES, near_threshold

    s = {}
    for case, bf16 in CASES.items():
        r, b, c = run["cases"][case], base["cases"][case], golden["cases"][case]
        ref_bits = [x.long().reshape(-1) for x in c["bits"]]
        row = {
            "logits_vs_default_max": max(float((x - y).abs().max()) for x, y in zip(r["guided"], b["guided"])),
            "expo_equal_default": all(torch.equal(x, y) for x, y in zip(r["expo"], b["expo"])),
            "pooled_vs_default_max": float((r["pooled"] - b["pooled"]).abs().max()),
            "pooled_vs_fixture_max": float((r["pooled"] - c["debug"]["sos_cond_BD"]).abs().max())
            if "sos_cond_BD" in c.get("debug", {}) else None,
            "codes_vs_fixture_max": float((r["summed_codes"] - c["summed_codes"]).abs().max()),
            "bits": sum(x.numel() for x in ref_bits),
            "flips": sum(int((o != f).sum()) for o, f in zip(r["ours"], ref_bits)),
        }
        delta = 1e-2 if bf16 else 1e-4
        near = [near_threshold(gd, e, r["top_k"], r["top_p"], delta) for gd, e in zip(r["guided"], r["expo"])]
        row["near"] = sum(int(n.sum()) for n in near)
        row["far_flips"] = sum(int(((o != f) & ~n).sum()) for o, f, n in zip(r["ours"], ref_bits, near))
        img = r["image"].int() - c["image_uint8"].flip(-1).int()
        row["image_max_absdiff"] = int(img.abs().max())
        row["image_frac_differ"] = float((img != 0).float().mean())
        if "sampler_logits" in c.get("debug", {}):
            per = [(x - y.reshape(-1, 2)).abs() for x, y in zip(r["guided"], c["debug"]["sampler_logits"])]
            row["logits_vs_fixture_max_per_scale"] = [float(d.max()) for d in per]
            row["logits_vs_fixture_frac_1e-4_per_scale"] = [float((d > 1e-4).float().mean()) for d in per]
            allv = torch.cat([d.reshape(-1) for d in per])
            row["logits_vs_fixture_frac_1e-4_all"] = float((allv > 1e-4).float().mean())
        s[case] = row
    return s


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--json", help="write the summary here")
    ap.add_argument("--only", nargs="*", help="labels of the settings to run (default: all)")
    a = ap.parse_args()
    if a.child:
        return child(a.child)
    import torch

    from golden_parity import GOLD

    golden = torch.load(GOLD, weights_only=True)
    settings = [s for s in SETTINGS if not a.only or s[0] in a.only or s[0] == "default"]
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, env in settings:
            out = str(Path(tmp) / "run.pt")
            keep = {k: v for k, v in os.environ.items() if k not in {k2 for _, e in SETTINGS for k2 in e}}
            subprocess.run([sys.executable, __file__, "--child", out], env={**keep, **env}, check=True, cwd=ROOT)
            runs[label] = torch.load(out, weights_only=True)
    base = runs["default"]
    summary = {label: {"fingerprint": run["fingerprint"], "hps": run["hps"], "cases": summarise(run, base, golden)}
               for label, run in runs.items()}
    text = json.dumps(summary, indent=1)
    if a.json:
        Path(a.json).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
