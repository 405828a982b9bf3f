"""Command-line typos answered in one line before Hydra runs (varbench/cli/overrides.py)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from varbench.cli.overrides import check_overrides, group_options, split_argv
from varbench.core.errors import ConfigError
from varbench.core.resources import CONF_DIR

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("argv, closest", [
    (["model=tiny", "method=nova_fats"], "nova_fast"),
    (["evaluator=[toy_genevel,fidelity]"], "toy_geneval"),
    (["+experiment=nova_swep"], "nova_sweep"),
    (["-m", "method=nova,nova_fats"], "nova_fast"),            # a sweep's every choice is checked
    (["modle=tiny"], None),                                     # not a group, not a key: the key check answers
])
def test_an_unknown_option_names_the_closest_and_no_internal_entry(argv, closest):
    with pytest.raises(ConfigError) as e:
        check_overrides(argv)
    msg = str(e.value)
    assert "\n" not in msg and "_schema" not in msg
    if closest:
        assert f"Did you mean {closest}" in msg


def test_an_unknown_key_without_plus_names_the_closest_key_and_the_plus_spelling():
    with pytest.raises(ConfigError) as e:
        check_overrides(["method=nova", "method.knobs.r_maxx=0.5"])
    msg = str(e.value)
    assert "Did you mean method.knobs.r_max?" in msg and "+method.knobs.r_maxx=0.5" in msg
    with pytest.raises(ConfigError, match=r"Did you mean runtime\.batch_size\?"):
        check_overrides(["-m", "runtime.batch_sise=1,2"])


@pytest.mark.parametrize("argv", [
    ["+experiment=smoke", "model=toy", "method=nova_toy", "runtime.batch_size=2", "timing.enabled=false"],
    ["-m", "method=baseline,nova_toy", "evaluator=[toy_geneval,fidelity]", "benchmark=toy", "benchmark.n_prompts=3"],
    ["+method.knobs.new_knob=1", "hydra.run.dir=/tmp/x", "hydra/launcher=local", "~logger"],
    ["method=nova", "method.knobs.r_max=0.5", "--config-dir", str(CONF_DIR), "--cfg", "job"],
    ["method=nova_toy", "method.knobs.r_max=0.5"],
    ["method=[unclosed"],          # a syntax error stays Hydra's to report, with its caret
])
def test_valid_overrides_pass(argv):
    check_overrides(argv)


def test_a_users_config_dir_adds_options(tmp_path):
    (tmp_path / "method").mkdir()
    (tmp_path / "method" / "mine.yaml").write_text("name: baseline\nlabel: Mine\nknobs: {}\n")
    with pytest.raises(ConfigError):
        check_overrides(["method=mine"])
    check_overrides(["method=mine", "--config-dir", str(tmp_path)])
    check_overrides([f"--config-dir={tmp_path}", "method=mine"])
    assert "mine" in group_options("method", [CONF_DIR, tmp_path])
    assert split_argv(["-cd", str(tmp_path), "a=1", "-m"]) == (["a=1"], [tmp_path])


@pytest.mark.integration
def test_the_command_prints_one_line_naming_the_closest_option():
    """`python -m varbench model=tiny method=nova_fats` (the issue's example): exit 2, a few lines."""
    out = subprocess.run([sys.executable, "-m", "varbench", "model=tiny", "method=nova_fats"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    lines = [x for x in (out.stdout + out.stderr).splitlines() if x.strip()]
    assert len(lines) <= 3 and "nova_fast" in lines[-1] and "_schema" not in lines[-1]
