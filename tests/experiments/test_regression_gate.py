"""The regression gate (`python -m experiments.regression`, issue #13 item 5) on the CPU, `--smoke` settings:
FLOPs ratios equal the analytic counter's, a reference round-trips through --update / --check in fresh
processes, a tampered reference fails naming the method and quantity, and without a reference the gate
says how to make one (exit 0, or 2 with --require-reference). The CUDA path (graphed hashes, the 2B model)
needs a GPU runner: .github/workflows/gpu-regression.yml."""
import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from experiments import regression as rg

ROOT = Path(__file__).resolve().parents[2]


def _gate(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "experiments.regression", "--device", "cpu", "--smoke", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """One full smoke measurement (toy + tiny-as-2B, every method), made by the CLI with no reference."""
    d = tmp_path_factory.mktemp("gate")
    proc = _gate("--check", "--reference", str(d / "absent.json"), "--out", str(d / "measured.json"))
    return d, proc, json.loads((d / "measured.json").read_text())


@pytest.mark.integration
def test_without_a_reference_the_gate_says_how_to_make_one(smoke):
    d, proc, _ = smoke
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "no reference for this device kind" in out and "--update" in out and str(d / "absent.json") in out, out
    strict = _gate("--check", "--measured", str(d / "measured.json"), "--reference", str(d / "absent.json"),
                   "--require-reference")
    assert strict.returncode == 2, strict.stdout + strict.stderr
    assert "no reference for this device kind" in strict.stdout


def test_default_reference_path_is_per_device_kind():
    assert rg.default_reference("NVIDIA H200", smoke=False) == rg.REF_DIR / "nvidia-h200.json"
    assert rg.default_reference("NVIDIA H200", smoke=True).name == "nvidia-h200-smoke.json"


@pytest.mark.integration
def test_every_method_was_measured_and_the_invariants_hold(smoke):
    _, _, m = smoke
    assert set(m["models"]) == {"toy", "2b"}
    assert list(m["models"]["toy"]) == rg.TOY_METHODS and list(m["models"]["2b"]) == rg.BIG_METHODS
    assert rg.invariants(m) == []
    for model, rows in m["models"].items():
        for name, r in rows.items():
            assert len(r["hash"]["eager"]) == 64 and r["hash"]["graphed"] is None        # CPU: no graphs
            lo, hi = r["speedup"]["ci95"]
            assert lo <= r["speedup"]["ratio"] <= hi, (model, name)
    toy = m["models"]["toy"]
    assert toy["baseline"]["toy_geneval"] == 1.0 and toy["baseline"]["ssim"] == pytest.approx(1.0)
    assert all(0 <= r["toy_geneval"] <= 1 and r["psnr"] < 100 for k, r in toy.items() if k != "baseline")


@pytest.mark.integration
def test_flops_ratios_equal_the_analytic_counter(smoke):
    """Static plans: the runtime's count equals the count from the plans alone (experiments.flops_table),
    and the gate's ratio is exactly baseline / method of those counts."""
    from experiments.flops_table import SCENARIO, method_flops
    from varbench.harness.presets import resolve_method

    _, _, m = smoke
    s = m["settings"]["2b"]
    rows = m["models"]["2b"]

    def analytic(preset):
        pcfg = resolve_method(preset, model="infinity_2b")
        return method_flops(pcfg.name, pcfg.knobs, s["preset"], 1.0, s["pn"], s["batch"],
                            s["text_tokens"], SCENARIO["nova_act"], SCENARIO["topro_D"])[0]

    base = analytic("baseline")
    static = [k for k, r in rows.items() if r["policy"] in rg.STATIC_POLICIES]
    assert {"baseline", "skip_last_2", "skipvar_hybrid"} <= set(static)
    for k in static:
        assert rows[k]["flops_analytic"]["plans"] == rows[k]["flops_analytic"]["runtime"] == analytic(k), k
        assert rows[k]["flops_x"] == base / analytic(k), k
    assert rows["skip_last_2"]["flops_x"] > 2                       # it really skipped work


@pytest.mark.integration
def test_a_reference_round_trips_through_update_and_check_in_fresh_processes(tmp_path):
    """Bits are deterministic across processes and the paired speed-ups land within tolerance."""
    ref = tmp_path / "ref.json"
    up = _gate("--models", "2b", "--update", "--reference", str(ref))
    assert up.returncode == 0 and ref.exists(), up.stdout + up.stderr
    r = json.loads(ref.read_text())
    assert r["provenance"]["torch"] and "commit" in r["provenance"] and r["env"]["kind"].startswith("cpu")
    ck = _gate("--models", "2b", "--check", "--reference", str(ref))
    assert ck.returncode == 0, ck.stdout + ck.stderr
    assert "PASS" in ck.stdout


def _problems_after(m: dict, edit) -> list[str]:
    ref = rg.as_reference(m, "test")
    edit(ref)
    return rg.check(m, ref)


@pytest.mark.integration
def test_a_tampered_reference_fails_naming_method_and_quantity(smoke, tmp_path):
    d, _, m = smoke
    assert rg.check(m, rg.as_reference(m, "test")) == []

    def flops(r):
        r["models"]["toy"]["nova_toy"]["flops_x"] *= 1.001
    def bits(r):
        r["models"]["2b"]["skip_last_2"]["hash"]["eager"] = "0" * 64
    def speed(r):
        r["models"]["toy"]["skip_last_2"]["speedup"]["ratio"] *= 3
    def geneval(r):
        r["models"]["toy"]["toprovar_toy"]["toy_geneval"] += 0.5
    def psnr(r):
        r["models"]["toy"]["skipvar_toy"]["psnr"] += 5
    def settings(r):
        r["profile"]["repeats"] += 1

    for edit, want in ((flops, "toy/nova_toy: FLOPs ratio"), (bits, "2b/skip_last_2: eager bits hash"),
                       (speed, "toy/skip_last_2: paired speed-up"), (geneval, "toy/toprovar_toy: toy GenEval"),
                       (psnr, "toy/skipvar_toy: fidelity PSNR"), (settings, "settings differ")):
        problems = _problems_after(m, edit)
        assert len(problems) == 1 and problems[0].startswith(want), (want, problems)

    # and through the CLI: exit 1 with the message
    ref = rg.as_reference(m, "test")
    flops(ref)
    (tmp_path / "tampered.json").write_text(json.dumps(ref))
    proc = _gate("--check", "--measured", str(d / "measured.json"), "--reference", str(tmp_path / "tampered.json"))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "REGRESSION: toy/nova_toy: FLOPs ratio" in proc.stdout


@pytest.mark.integration
def test_invariants_catch_graphed_bits_and_flops_count_mismatches(smoke):
    _, _, m = smoke
    bad = copy.deepcopy(m)
    bad["models"]["toy"]["nova_toy"]["hash"]["graphed"] = "f" * 64
    bad["models"]["2b"]["skip_last_2"]["flops_analytic"]["plans"] += 2.0
    problems = rg.invariants(bad)
    assert any(p.startswith("toy/nova_toy: graphed bits differ from eager") for p in problems), problems
    assert any(p.startswith("2b/skip_last_2: FLOPs counted by the runtime") for p in problems), problems
    assert len(problems) == 2
