"""A user's own method and evaluator, without editing varbench (issue 22, "Extension without editing
the package"): a tiny outside package, "installed" as pip would leave it (the package plus a
``*.dist-info`` folder with its entry points, on PYTHONPATH; no pip, no network), and the user's
own ``conf/`` folder handed to ``python -m varbench --config-dir``. A real sweep on the tiny random
model (under a minute on 2 CPU cores) then runs the outside method, once by its entry-point name and once
as ``method.name: module:Class``, and scores every job with the outside evaluator, likewise both ways."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from varbench.analysis.layout import group_dirs

ROOT = Path(__file__).resolve().parents[2]

PACKAGE = {
    "__init__.py": "",
    "policy.py": '''
        """An outside method: skip the last `drop` scales (a cut-down skip_last)."""
        from varbench.engine.plan import ScalePlan
        from varbench.engine.policy import Policy


        class DropLast(Policy):
            name = "drop_last"

            def __init__(self, drop: int = 1):
                if drop < 0:
                    raise ValueError(f"drop_last.drop must be >= 0, got {drop}")
                self.drop = drop

            def plan(self, si):
                return ScalePlan(run=si < len(self.ctx.schedule) - self.drop)

            def describe(self):
                return {"name": self.name, "drop": self.drop}
        ''',
    "evaluator.py": '''
        """An outside evaluator: mean grey level of each image, times `scale`."""
        import numpy as np

        from varbench.evaluators.base import EvalResult, Evaluator, mean_and_stderr


        class Brightness(Evaluator):
            name = "brightness"
            higher_is_better = {"mean": True}

            def __init__(self, scale: float = 1.0, device: str = "cpu"):
                self.scale, self._rows = float(scale), []

            def setup(self, device="cpu"):
                pass

            def update(self, samples):
                for s in samples:
                    grey = np.asarray(s.image.convert("L"), dtype=np.float64).mean() / 255.0
                    self._rows.append({"prompt_index": s.prompt_index, "sample_index": s.sample_index,
                                       "brightness": float(grey * self.scale)})

            def compute(self):
                m, se = mean_and_stderr([r["brightness"] for r in self._rows])
                return EvalResult(metrics={"mean": m}, uncertainty={"mean": se}, per_sample=list(self._rows))

            def reset(self):
                self._rows = []

            def version_info(self):
                return {"scorer": "brightness-1", "scale": self.scale}
        ''',
}

ENTRY_POINTS = """\
[varbench.methods]
drop_last = brightpkg.policy:DropLast

[varbench.evaluators]
brightness = brightpkg.evaluator:Brightness
"""

CONF = {
    "method/drop_last.yaml": "name: drop_last                  # the entry point's name\nlabel: Drop last (outside)\nknobs:\n  drop: 1\n",
    "method/drop_last_direct.yaml": "name: brightpkg.policy:DropLast  # no registration at all\n"
                                    "label: Drop last (module:Class)\nknobs:\n  drop: 2\n",
    "evaluator/brightness.yaml": "brightness:\n  name: brightness\n",
    "evaluator/brightness_direct.yaml": "brightness_direct:\n  name: brightpkg.evaluator:Brightness\n  scale: 2.0\n",
    "experiment/mine.yaml": """\
        # @package _global_
        defaults:
          - override /model: tiny
          - override /benchmark: smoke
          - override /timing: none
          - override /evaluator: [brightness, brightness_direct]
        experiment_name: mine
        benchmark:
          limit: 2
        runtime:
          device: cpu
          progress: false
        hydra:
          mode: MULTIRUN
          sweeper:
            params:
              method: baseline,drop_last,drop_last_direct
        """,
}


def _write(folder: Path, files: dict) -> None:
    for rel, text in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(textwrap.dedent(text))


@pytest.mark.integration
def test_an_outside_method_and_evaluator_run_in_a_sweep_from_the_users_own_conf(tmp_path):
    site, conf = tmp_path / "site", tmp_path / "my_conf"
    _write(site / "brightpkg", PACKAGE)
    _write(site / "brightpkg-0.1.dist-info", {"METADATA": "Metadata-Version: 2.1\nName: brightpkg\nVersion: 0.1\n",
                                               "entry_points.txt": ENTRY_POINTS})
    _write(conf, CONF)
    env = {**os.environ, "VARBENCH_STORE": str(tmp_path / "store"),
           "PYTHONPATH": os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])])}
    cmd = [sys.executable, "-m", "varbench", "--config-dir", str(conf), "+experiment=mine",
           f"paths.output_root={tmp_path}", f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out

    records = [json.loads(p.read_text()) for p in (tmp_path / "store" / "mine").glob("entries/*/record.json")]
    by_name = {r["method"]["name"]: r for r in records}
    assert sorted(by_name) == ["baseline", "brightpkg.policy:DropLast", "drop_last"], out
    assert by_name["drop_last"]["method"]["label"] == "Drop last (outside)"
    assert by_name["drop_last"]["method"]["config"]["knobs"] == {"drop": 1}
    assert by_name["brightpkg.policy:DropLast"]["method"]["config"]["knobs"] == {"drop": 2}
    for name, r in by_name.items():
        m = r["metrics"]
        assert 0 < m["brightness/mean"] < 1, (name, m)                       # the outside evaluator's scores,
        assert m["brightness_direct/mean"] == pytest.approx(2 * m["brightness/mean"], rel=1e-12)  # both ways in
        assert r["evaluators"]["brightness"] == {"scorer": "brightness-1", "scale": 1.0}
        assert r["higher_is_better"]["brightness/mean"] is True and r["higher_is_better"]["brightness_direct/mean"] is True
        if name != "baseline":
            assert r["method"]["effect"] == "some", (name, r["method"])      # the outside policy did skip scales
            assert r["flops"]["total"] < by_name["baseline"]["flops"]["total"]
    rows = [json.loads(x) for x in next((tmp_path / "store" / "mine").glob("entries/*/samples_brightness.jsonl"))
            .read_text().splitlines()]
    assert len(rows) == 2 and {"prompt_index", "sample_index", "brightness"} <= set(rows[0])
    [folder] = group_dirs(tmp_path / "results" / "mine")          # one model and resolution: one folder
    table = (folder / "table.md").read_text()
    assert "Drop last (outside)" in table and "Drop last (module:Class)" in table and "brightness" in table, table
