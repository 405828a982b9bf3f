"""Every FLOPs number in the docs is generated (experiments/flops_table.py) and must not drift.

The numbers in docs/methods.md sit in markers the generator fills; results/curated/flops_analytic.md is
the generator's table. Changing a preset's knobs, a policy's plans or flops.py without
`python -m experiments.flops_table --write` fails here, naming each stale place."""
import re

import pytest

from experiments import flops_table as ft
from varbench.policies import __file__ as policies_init
from pathlib import Path


def test_docs_and_table_match_the_generator():
    assert ft.check() == []


def test_a_hand_edited_number_is_caught(tmp_path, monkeypatch):
    doc = tmp_path / "methods.md"
    text = ft.DOCS[0].read_text()
    first = ft.MARKER.search(text)
    doc.write_text(text.replace(first.group(0), first.group(0).replace(first.group(4) + "<", "9.99<"), 1))
    monkeypatch.setattr(ft, "DOCS", [doc])
    monkeypatch.setattr(ft, "ROOT", tmp_path)
    monkeypatch.setattr(ft, "TABLE", ft.TABLE)  # unchanged, still compared
    problems = [p for p in ft.check() if "methods.md" in p]
    assert len(problems) == 1 and "9.99" in problems[0]


def test_method_cards_quote_no_flops_ratios():
    """Method cards point at the generated table instead of quoting our own FLOPs ratios."""
    for f in Path(policies_init).parent.glob("*.py"):
        doc = f.read_text().split('"""')[1] if '"""' in f.read_text() else ""
        assert not re.search(r"\d\.\d+x fewer FLOPs", doc), f"{f.name} quotes a FLOPs ratio; reference flops_analytic.md"


def _hart_rows(text: str) -> list[str]:
    """The rows of the method table in docs/methods.md's "## On HART" section."""
    section = text.split("## On HART", 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("| `")]


def test_the_on_hart_table_gives_hart_ratios_exactly_where_a_method_runs():
    """Every row of the "On HART" table that runs on HART carries generated HART markers (transformer and end to
    end), and a refused row none; every preset a HART marker names does run there."""
    text = ft.DOCS[0].read_text()
    rows = _hart_rows(text)
    assert rows and any(r.split("|")[2].strip().startswith("refused") for r in rows)
    for row in rows:
        marks = [m for m in ft.MARKER.finditer(row) if m["model"] == "hart"]
        runs = row.split("|")[2].strip().startswith("yes")
        assert bool(marks) == runs, row[:80]
        assert {m["preset"] for m in marks if m["scope"]} == {m["preset"] for m in marks if not m["scope"]}, row[:80]
        for m in marks:
            assert ft.hart_refusal(m["preset"]) is None, m.group(0)


def test_a_hand_edited_hart_number_is_caught(tmp_path, monkeypatch):
    text = ft.DOCS[0].read_text()
    first = next(m for m in ft.MARKER.finditer(text) if m["model"] == "hart" and m["preset"] != "baseline")
    doc = tmp_path / "methods.md"
    doc.write_text(text.replace(first.group(0), first.group(0).replace(first["value"] + "<", "9.99<"), 1))
    monkeypatch.setattr(ft, "DOCS", [doc])
    monkeypatch.setattr(ft, "ROOT", tmp_path)
    problems = [p for p in ft.check() if "methods.md" in p]
    assert len(problems) == 1 and "9.99" in problems[0] and "hart:" in problems[0]


def test_a_hart_marker_on_a_refused_preset_is_an_error_naming_why():
    with pytest.raises(ValueError, match="fastvar_2b_paper is refused on hart_0p7b: ToProVAR's FastVAR setting"):
        ft.fill_markers("<!--flops:hart:fastvar_2b_paper-->1.00<!--/flops-->")


def test_the_hart_table_counts_what_runs_and_says_why_the_rest_is_refused():
    """The generated HART section: a row per HART_METHODS preset, ratios where it runs, the refusal's reason where
    the YAML (`refuse: {hart: ...}`), the policy class (`backbones`) or its knobs refuse it."""
    lines = ft.render_hart_table()
    rows = {line.split("`")[1]: line for line in lines if line.startswith("| `")}
    assert list(rows) == list(ft.HART_METHODS)
    assert "refused: ToProVAR's FastVAR setting" in rows["fastvar_2b_paper"]           # the YAML's refuse
    # fastvar's per-model hart block is the port (varbench/harness/per_model.py): the row of its alias
    assert rows["fastvar"].split("|")[3:5] == rows["fastvar_hart"].split("|")[3:5]
    assert "refused: scalekv is written for infinity models, not hart" in rows["scalekv"]  # the class's backbones
    assert rows["baseline"].endswith("| 1.00 | 1.00 |")
    for name in ("fastvar_hart", "skip_last_1", "skipvar_uncond3", "nova", "toprovar"):
        t, e2e = (float(c) for c in rows[name].split("|")[3:5])
        assert t > e2e > 1.0, rows[name]   # end to end adds the same Qwen2 + decode work to both sides


def test_a_knob_the_policy_refuses_on_hart_is_a_refusal(monkeypatch):
    """No shipped preset sets NOVA's per-bit entropy knobs, which the built policy refuses on HART (its YAML and
    class allow HART): such a preset is refused by the built policy's `backbone_refusal`."""
    monkeypatch.setattr(ft, "load_method", lambda preset, model=None: ("nova", "NOVA", {"entropy_logits": "cond"}))
    assert "per-bit logits" in ft.hart_refusal.__wrapped__("nova")
