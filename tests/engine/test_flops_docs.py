"""Every FLOPs number in the docs is generated (experiments/flops_table.py) and must not drift.

The numbers in docs/methods.md sit in markers the generator fills; results/curated/flops_analytic.md is
the generator's table. Changing a preset's knobs, a policy's plans or flops.py without
`python -m experiments.flops_table --write` fails here, naming each stale place."""
import re

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
