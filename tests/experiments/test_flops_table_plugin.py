"""`experiments.flops_table` on a method from outside the package (issue 34: it crashed, reading only the
packaged configs): a ``module:Class`` name, and a preset in the user's own ``--config-dir``, are resolved as a
job resolves them and named by their display name (the preset's label, else the class's card, else the name)."""
from __future__ import annotations

import sys
import textwrap

import pytest

from experiments import flops_table as ft

POLICY = '''
    """An outside method: skip the last `drop` scales (a cut-down skip_last)."""
    import types

    from varbench.engine.plan import ScalePlan
    from varbench.engine.policy import Policy


    class DropLast(Policy):
        name = "drop_last"
        card = types.SimpleNamespace(display_name="Drop-last (its card)")   # what a method card carries

        def __init__(self, drop: int = 1):
            self.drop = drop

        def plan(self, si):
            return ScalePlan(run=si < len(self.ctx.schedule) - self.drop)


    class DropLastPlain(DropLast):
        card = None                                                          # no card: named by its import path
'''


@pytest.fixture
def outside(tmp_path, monkeypatch):
    pkg = tmp_path / "site" / "vb_outside_flops"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "policy.py").write_text(textwrap.dedent(POLICY))
    conf = tmp_path / "my_conf" / "method"
    conf.mkdir(parents=True)
    (conf / "drop_two_mine.yaml").write_text("name: vb_outside_flops.policy:DropLast\nlabel: Drop two (mine)\n"
                                              "knobs:\n  drop: 2\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    yield tmp_path / "my_conf"
    ft.use_config_dirs([])                      # later tests resolve without the user's folder
    sys.modules.pop("vb_outside_flops.policy", None)
    sys.modules.pop("vb_outside_flops", None)


def _rows(out: str) -> dict[str, tuple[str, list[str]]]:
    """config -> (display name, the numeric cells) of the printed table."""
    rows = {}
    for line in out.splitlines()[2:]:
        config, rest = line.split(None, 1)
        if "refused on HART" in rest:
            label, _, reason = rest.partition(" refused on HART: ")
            rows[config] = (label.strip(), ["refused", reason])
        else:
            *label, t, ratio, x, e2e, e2e_x = rest.split()
            rows[config] = (" ".join(label), [t, ratio, x, e2e, e2e_x])
    return rows


def test_an_outside_policy_and_a_users_preset_get_flops_rows_by_display_name(outside, capsys):
    ft.main(["--methods", "vb_outside_flops.policy:DropLast", "vb_outside_flops.policy:DropLastPlain",
             "drop_two_mine", "skip_last_1", "skip_last_2", "--config-dir", str(outside)])
    rows = _rows(capsys.readouterr().out)
    assert rows["vb_outside_flops.policy:DropLast"][0] == "Drop-last (its card)"
    assert rows["vb_outside_flops.policy:DropLastPlain"][0] == "vb_outside_flops.policy:DropLastPlain"
    assert rows["drop_two_mine"][0] == "Drop two (mine)"                # a preset's label wins over the card
    # the outside policy's plans are skip_last's: dropping 1 (its default) and 2 scales (the user's preset's
    # knob) cost exactly what the packaged skip_last_1 / skip_last_2 cost
    assert rows["vb_outside_flops.policy:DropLast"][1] == rows["skip_last_1"][1]
    assert rows["drop_two_mine"][1] == rows["skip_last_2"][1]
    assert float(rows["drop_two_mine"][1][2]) > float(rows["skip_last_1"][1][2]) > 1.0


def test_an_outside_policy_without_hart_in_its_backbones_is_refused_on_hart_not_a_crash(outside, capsys):
    assert ft.main(["--model", "hart_0p7b", "--methods", "vb_outside_flops.policy:DropLast"]) == 0
    label, (verdict, reason) = _rows(capsys.readouterr().out)["vb_outside_flops.policy:DropLast"]
    assert label == "Drop-last (its card)" and verdict == "refused"
    assert "written for infinity models, not hart" in reason


def test_an_unknown_method_is_one_clear_error(outside):
    from varbench.core.errors import ConfigError

    with pytest.raises(ConfigError, match=r"neither a preset .* Did you mean .*skip_last_1"):
        ft.main(["--methods", "skip_last_l"])
