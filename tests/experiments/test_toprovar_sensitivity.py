"""ToProVAR's sensitivity table (issue 20 item 6): docs/methods.md carries the generated table of FLOPs
x fewer of the Table 10 rows over each reconstructed knob's range; it parses, covers the grid, its
verdicts agree with its own numbers, and its default cells are what the generator computes."""
from __future__ import annotations

import re

import pytest

from experiments import toprovar_sensitivity as ts
from experiments.flops_table import x_fewer

NAMES = [name for name, _, _ in ts.ROWS]


def _parsed() -> list[dict]:
    body = ts.section(ts.DOC.read_text())
    assert body is not None, "docs/methods.md lacks the toprovar-sensitivity markers"
    rows = []
    for line in body.splitlines():
        m = re.match(r"\| `(\w+)` \| ([^|]+) \| " + r" \| ".join([r"([\d.]+)"] * len(NAMES)) + r" \| ([^|]+) \| (✓|✗) \|$", line)
        if m:
            g = m.groups()
            rows.append({"knob": g[0], "setting": g[1].strip(), "values": dict(zip(NAMES, map(float, g[2:2 + len(NAMES)]))),
                         "order": g[-2].strip(), "holds": g[-1] == "✓"})
    return rows


def test_docs_table_is_present_covers_the_grid_and_agrees_with_itself():
    rows = _parsed()
    want = [(k, ts._setting_label(s)) for k, settings in ts.GRID.items() for s in settings]
    assert [(r["knob"], r["setting"]) for r in rows] == want            # every setting, once, in order
    for r in rows:                                                      # verdicts follow from the numbers
        assert r["order"] == ts.order_of(r["values"]) and r["holds"] == ts.paper_order_holds(r["values"]), r
    defaults = [r for r in rows if r["setting"].endswith("(default)")]
    assert len(defaults) == len(ts.GRID)                                # one default per knob ...
    assert all(r["values"] == defaults[0]["values"] for r in defaults)  # ... and they are the same presets
    # the cheapest cell, recomputed: the generator and the doc agree
    assert defaults[0]["values"]["scale only"] == round(x_fewer("toprovar_scale_only"), 2)
    body = ts.section(ts.DOC.read_text())
    assert all(f"- `{k}`: the paper's order" in body for k in ts.GRID)


def test_order_and_verdict_rules():
    paper = {"scale only": 5.2, "scale + layer": 2.69, "full": 2.61, "scale + token": 2.01}
    assert ts.paper_order_holds(paper) and ts.order_of(paper) == "scale only > scale + layer > full > scale + token"
    tie = {**paper, "full": 2.691, "scale + layer": 2.692}             # equal at 2 decimals: a tie, not the order
    assert not ts.paper_order_holds(tie)
    assert ts.order_of(tie) == "scale only > scale + layer = full > scale + token"
    behind = {**paper, "full": 1.95}
    assert not ts.paper_order_holds(behind) and ts.order_of(behind).endswith("scale + token > full")
    text = ts.render([{"knob": "beta", "setting": "beta 1 (default)", "values": paper, "order": ts.order_of(paper),
                       "holds": True},
                      {"knob": "beta", "setting": "beta 4", "values": behind, "order": ts.order_of(behind), "holds": False}])
    assert "- `beta`: the paper's order holds at 1 of 2 settings: beta 1 (default)." in text


def test_write_replaces_only_the_marked_section(tmp_path):
    doc = tmp_path / "methods.md"
    doc.write_text(f"before\n{ts.BEGIN}\nold table\n{ts.END}\nafter\n")
    res = [{"knob": "beta", "setting": "beta 1 (default)", "values": dict.fromkeys(NAMES, 1.0), "order": "x", "holds": False}]
    ts.write(doc, res)
    text = doc.read_text()
    assert text.startswith("before\n") and text.endswith(f"{ts.END}\nafter\n") and "old table" not in text
    assert ts.section(text) == ts.render(res)
    (tmp_path / "bare.md").write_text("no markers\n")
    with pytest.raises(SystemExit, match="markers"):
        ts.write(tmp_path / "bare.md", res)


@pytest.mark.slow
def test_docs_table_matches_a_full_regeneration():
    assert ts.section(ts.DOC.read_text()) == ts.render(ts.compute())
