"""The installed package is the product (issue #12 item 15): a wheel built from this checkout
carries its configs, evaluators and bundled toy/tiny-scorer files, installs only `varbench` (no
top-level `evaluators`/`experiments` that could shadow other packages), and its CLI runs a job from
a folder outside any checkout, writing under the output root and nowhere else."""
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # build from a copy: setuptools writes build/ and *.egg-info/ next to the sources
    src = tmp_path_factory.mktemp("src") / "varbench-src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", ".venv", ".wheelhouse", "store", "outputs", "results",
                                                             "build", "*.egg-info", "__pycache__", "tests", "wandb"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(src)],
                   check=True, capture_output=True, text=True, timeout=300)
    (whl,) = out.glob("varbench-*.whl")
    return whl


@pytest.mark.integration
def test_wheel_holds_only_varbench_with_its_configs_and_bundled_files(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert top == {"varbench"}, top
    for needed in ["varbench/conf/config.yaml", "varbench/conf/method/nova.yaml", "varbench/conf/experiment/smoke.yaml",
                   "varbench/evaluators/geneval/evaluator.py", "varbench/toy/weights/toy_infinity.pt",
                   "varbench/toy/scorers/hps_tiny_random.pt", "varbench/toy/scorers/geneval_tiny/m2f/config.json"]:
        assert needed in names, needed
    # every config file of the checkout is in the wheel
    confs = {str(p.relative_to(ROOT)) for p in (ROOT / "varbench" / "conf").rglob("*.yaml")}
    assert confs <= set(names), sorted(confs - set(names))[:5]


def test_no_production_config_points_into_the_tests_folder():
    offenders = [str(p.relative_to(ROOT)) for p in (ROOT / "varbench" / "conf").rglob("*.yaml")
                 if "tests/fixtures" in p.read_text()]
    assert not offenders, offenders


@pytest.mark.integration
def test_installed_cli_runs_a_job_outside_a_checkout(wheel, tmp_path):
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
                   check=True, capture_output=True, text=True, timeout=300)
    work = tmp_path / "elsewhere"
    work.mkdir()
    # the installed copy must win over the editable checkout: PYTHONPATH comes before site-packages
    env = {k: v for k, v in os.environ.items() if not k.startswith("VARBENCH_")}
    env["PYTHONPATH"] = str(site)
    cmd = [sys.executable, "-m", "varbench", "+experiment=smoke", "evaluator=[hpsv2_tiny]", "timing=none",
           "benchmark.limit=1", "runtime.progress=false"]
    proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    (record,) = (work / "store" / "smoke" / "entries").glob("*/record.json")
    rec = json.loads(record.read_text())
    assert "hpsv2_tiny/score" in " ".join(rec["metrics"]) or any(k.startswith("hpsv2_tiny/") for k in rec["metrics"])
    import_probe = subprocess.run([sys.executable, "-c", "import varbench, varbench.evaluators; print(varbench.__file__)"],
                                  cwd=work, env=env, capture_output=True, text=True, timeout=120)
    assert import_probe.stdout.strip().startswith(str(site)), import_probe.stdout + import_probe.stderr
    assert sorted(p.name for p in work.iterdir()) == ["outputs", "results", "store"]   # nothing written elsewhere
