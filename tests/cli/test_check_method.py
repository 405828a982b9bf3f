"""`python -m varbench.check_method module:Class` (varbench/cli/check_method.py): a method from outside
the package checked as the packaged ones are (varbench.policies.conformance), with one line per check
and the exit status saying whether it conforms (0), does not (1), or could not be checked (2)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from varbench.cli.check_method import main

ROOT = Path(__file__).resolve().parents[2]

#: an outside method (skip the last `drop` scales) and a broken one whose "neutral" setting still
#: changes the temperature of one scale, so its neutral run cannot equal the baseline
OUTSIDE = '''
from varbench.engine.plan import ScalePlan
from varbench.engine.policy import MethodCard, Policy


class DropLast(Policy):
    name = "drop_last"
    card = MethodCard(display_name="Drop last", paper="Nobody et al., a tiny test")
    NEUTRAL = {"drop": 0}
    ACTIVE = {"drop": 1}

    def __init__(self, drop: int = 1):
        if drop < 0:
            raise ValueError(f"drop must be >= 0, got {drop}")
        self.drop = drop

    def plan(self, si):
        return ScalePlan(run=si < len(self.ctx.schedule) - self.drop)


class LeakyNeutral(DropLast):
    def plan(self, si):
        return ScalePlan(tau=0.5) if si == 3 else super().plan(si)


class NoSettings(Policy):
    def plan(self, si):
        return ScalePlan()
'''


@pytest.fixture
def outside(tmp_path, monkeypatch):
    (tmp_path / "cm_outside.py").write_text(textwrap.dedent(OUTSIDE))
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def _run(capsys, *argv):
    rc = main(list(argv))
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


@pytest.mark.integration   # two tiny-runtime runs of the whole check (~1 min on 2 cores)
def test_an_outside_method_passes_and_a_leaky_neutral_fails(outside, capsys):
    rc, out, _ = _run(capsys, "cm_outside:DropLast")
    lines = out.splitlines()
    assert rc == 0, out
    assert lines[0].startswith("cm_outside:DropLast: Drop last (Nobody et al., a tiny test)")   # its card
    assert [line.split(":")[0] for line in lines[1:5]] == [
        "PASS neutral == baseline", "PASS active changes work", "PASS FLOPs and KV memory counted",
        "PASS batch > 1 decisions"]
    # dropping the last of 7 scales ('0.06M') saves its FLOPs: more than half of the total there
    ratio = float(lines[2].split("FLOPs x")[1].split()[0])
    assert ratio > 2.0, lines[2]
    rc, out, _ = _run(capsys, "cm_outside:LeakyNeutral")
    assert rc == 1, out
    fail = next(line for line in out.splitlines() if line.startswith("FAIL"))
    assert fail.startswith("FAIL neutral == baseline: ") and "bits differ" in fail
    # knobs given on the command line replace the class's: drop 0 as "active" changes nothing
    rc, out, _ = _run(capsys, "cm_outside:DropLast", "--active", '{"drop": 0}')
    assert rc == 1 and "FAIL active changes work: FLOPs x1.000 fewer, 0 bits changed" in out, out


@pytest.mark.parametrize("argv, says", [
    (["cm_outside:Missing"], "'cm_outside' has no attribute 'Missing'"),
    (["no_such_pkg.mod:Thing"], "there is no module 'no_such_pkg'"),
    (["cm_outside:ScalePlan"], "not a subclass of varbench.engine.policy.Policy"),
    (["cm_outside:NoSettings"], "declares no neutral setting: add the class attribute NEUTRAL"),
    (["cm_outside:DropLast", "--active", "{drop: 1}"], "--active is not JSON"),
    (["cm_outside:DropLast", "--neutral", "[0]"], "--neutral must be a JSON object"),
    (["cm_outside:DropLast", "--active", '{"drop": -1}'], "raised ValueError: drop must be >= 0, got -1"),
    (["cm_outside:DropLast", "--active", '{"dorp": 1}'], "raised TypeError"),
])
def test_bad_input_is_one_line_and_exit_2(outside, capsys, argv, says):
    rc, out, err = _run(capsys, *argv)
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: ") and says in err, err


def test_the_documented_spelling_runs_the_command(tmp_path):
    """`python -m varbench.check_method` is the alias of varbench.cli.check_method (varbench/core/aliases.py)."""
    proc = subprocess.run([sys.executable, "-m", "varbench.check_method", "varbench.engine.plan:ScalePlan"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "not a subclass of varbench.engine.policy.Policy" in proc.stderr
