"""`python -m varbench.list`: every option of the search path, with what it is (varbench/cli/listing.py)."""
from __future__ import annotations

import re

from omegaconf import OmegaConf

from varbench.cli.listing import main, method_family
from varbench.core.resources import CONF_DIR


def _run(capsys, *argv) -> str:
    assert main(list(argv)) == 0
    return capsys.readouterr().out


def test_methods_lists_every_option_with_label_and_family_and_no_schema(capsys):
    out = _run(capsys, "methods")
    options = sorted(p.stem for p in (CONF_DIR / "method").glob("*.yaml"))
    listed = [line.split()[0] for line in out.splitlines()[2:] if line and not line.startswith((" ", "families", "models:", "per model"))]
    assert sorted(listed) == options and not any(n.endswith("_schema") for n in listed)
    row = next(line for line in out.splitlines() if line.startswith("nova_fast "))
    assert "NOVA fast (reconstructed)" in row and re.search(r"\snova\s", row)
    composed = next(line for line in out.splitlines() if line.startswith("nova_on_fastvar "))
    assert " compose " in composed                                          # a composed method's family
    # each family's card (display name, paper, code), then its docstring's first sentence
    assert ("  fastvar: FastVAR; paper: FastVAR: Linear Visual Autoregressive Modeling via Cached Token Pruning "
            "(Guo et al., ICCV 2025); code: csguoh/FastVAR @ 34cdd651\n      `fastvar`: cached token pruning") in out
    # models: where the knobs validate; FastVAR's released widths (40, 48, 64) are not on tiny's schedule
    assert "  hart_0p7b, hart_tiny, infinity_2b, infinity_8b, tiny, toy  " in next(line for line in out.splitlines() if line.startswith("baseline "))
    # a method that does not apply to a backbone is not listed there, whatever files it needs
    scalekv = next(line for line in out.splitlines() if line.startswith("scalekv "))
    assert "hart" not in scalekv and "infinity_2b" in scalekv
    fastvar = next(line for line in out.splitlines() if line.startswith("fastvar "))
    mark = re.search(r"tiny(\[\d+\])", fastvar).group(1)
    assert f"  {mark} method.knobs: widths [40, 48, 64] are not on this 10-scale schedule" in out
    # per model: which block applies where, or the refusal (varbench/harness/per_model.py)
    assert "  nova: toy: per_model.toy (t_min_tokens, min_tokens_to_prune)\n" in out
    per_model = next(line for line in out.splitlines() if line.startswith("  fastvar: "))
    assert per_model.startswith("  fastvar: hart_0p7b, hart_tiny: per_model.hart (") and "toy: refused: FastVAR's released" in per_model
    assert ", toy" not in fastvar and ", toy" in scalekv   # refused on the toy; ScaleKV's toy budget validates there


def test_a_family_follows_the_defaults_chain():
    options = {p.stem: p for p in (CONF_DIR / "method").glob("*.yaml")}
    assert method_family("nova_fast", options) == "nova"           # defaults: [nova, _self_] -> nova_schema
    assert method_family("skip_last_2", options) == "skip_last"


def test_experiments_list_their_jobs_from_the_sweep(capsys):
    out = _run(capsys, "experiments")
    params = OmegaConf.load(CONF_DIR / "experiment" / "nova_sweep.yaml").hydra.sweeper.params
    methods = [m.strip() for m in str(params.method).split(",")]
    lines = out.splitlines()
    i = next(k for k, line in enumerate(lines) if line.startswith("+experiment=nova_sweep "))
    assert f"({len(methods)} jobs)" in lines[i] and lines[i + 1].strip() == f"method: {', '.join(methods)}"


def test_evaluators_name_their_weight_files_and_a_users_config_dir_adds_options(capsys, tmp_path):
    (tmp_path / "evaluator").mkdir()
    (tmp_path / "evaluator" / "mine.yaml").write_text("# My metric.\nmine:\n  name: my_pkg.m:Metric\n  checkpoint: mine.pt\n")
    out = _run(capsys, "evaluators", "--config-dir", str(tmp_path))
    assert "evaluator=hpsv2  (hpsv2)" in out and "filename: HPS_v2.1_compressed.pt" in out
    assert "evaluator=mine  (my_pkg.m:Metric)  My metric." in out and "checkpoint: mine.pt" in out


PLUGIN = """
from varbench.engine.plan import ScalePlan
from varbench.engine.policy import MethodCard, Policy


class Halve(Policy):
    \"\"\"An outside method for the listing.\"\"\"
    name = "halve"
    card = MethodCard(display_name="Halving (outside)", paper="Someone et al., arXiv 0000.00000")

    def plan(self, si):
        return ScalePlan()
"""


def test_a_plugin_method_is_listed_by_its_card(capsys, tmp_path, monkeypatch):
    """A user's `method=` option naming an outside class (module:Class) lists its family with the
    class's card, as a packaged one; a class that does not import says so instead of failing."""
    (tmp_path / "ls_plugin.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "method").mkdir()
    (tmp_path / "method" / "halve.yaml").write_text("# Halving, from outside.\nname: ls_plugin:Halve\nlabel: Halve\n")
    (tmp_path / "method" / "gone.yaml").write_text("name: ls_gone:Nothing\n")
    out = _run(capsys, "methods", "--config-dir", str(tmp_path))
    assert "  ls_plugin:Halve: Halving (outside); paper: Someone et al., arXiv 0000.00000\n" \
           "      An outside method for the listing." in out
    assert "  ls_gone:Nothing: (its policy does not import here)" in out
