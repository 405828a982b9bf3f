"""docs/methods.md's method tables are generated from the policies' cards (varbench/cli/method_docs.py):
`--check` passes on the committed doc, fails when a card changes, and `--write` rewrites only its two
blocks (the prose, the FLOPs numbers and the other generators' blocks stay)."""
from __future__ import annotations

import dataclasses
import re

import pytest

from varbench.cli import method_docs as M
from varbench.policies.nova import NOVA


def test_the_committed_doc_matches_the_cards():
    assert M.check() == []
    assert M.main(["--check"]) == 0


@pytest.fixture
def doc(tmp_path):
    path = tmp_path / "methods.md"
    path.write_text(M.DOC.read_text(encoding="utf-8"), encoding="utf-8")
    return path


def _outside_blocks(text: str) -> str:
    for block in M.BLOCKS:
        text = re.sub(re.escape(M.begin(block)) + r".*?" + re.escape(M.end(block)), "", text, flags=re.S)
    return text


def test_a_changed_card_fails_the_check_until_written(doc, monkeypatch, capsys):
    before = doc.read_text(encoding="utf-8")
    monkeypatch.setattr(NOVA, "card", dataclasses.replace(NOVA.card, display_name="NOVA-2", doc_rows=(
        dataclasses.replace(NOVA.card.doc_rows[0], changes="something else"),)))
    assert [p.split(": ", 1)[1] for p in M.check(doc)] == [
        f"the {b} block differs from the policies' cards: run {M.COMMAND}" for b in M.BLOCKS]
    assert M.main(["--check", "--doc", str(doc)]) == 1
    M.write(doc)
    after = doc.read_text(encoding="utf-8")
    assert M.check(doc) == []
    assert "| `nova` | NOVA-2 |" in after and "| `nova` | NOVA (abstract + secondary summary) | something else |" in after
    # everything outside the two blocks is as it was: prose, the HART table, toprovar-sensitivity
    assert _outside_blocks(after) == _outside_blocks(before)
    # and every FLOPs number of the doc survives the rewrite
    assert [m.group(0) for m in M.FLOPS.finditer(after)] == [m.group(0) for m in M.FLOPS.finditer(before)]


def test_a_regenerated_flops_number_is_kept(doc):
    """experiments.flops_table --write changes numbers inside the rows block: still in step with the cards."""
    text = doc.read_text(encoding="utf-8")
    doc.write_text(text.replace("<!--flops:nova-->", "<!--flops:nova-->9", 1), encoding="utf-8")
    assert M.check(doc) == []


def test_a_plugin_method_is_rendered_from_its_card(tmp_path, monkeypatch, capsys):
    (tmp_path / "docs_plugin.py").write_text(
        "from varbench.engine.plan import ScalePlan\nfrom varbench.engine.policy import MethodCard, Policy\n\n\n"
        "class Halve(Policy):\n    card = MethodCard(display_name='Halving', paper='Someone et al.', code='none public')\n\n"
        "    def plan(self, si):\n        return ScalePlan()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert M.main(["--print", "--method", "docs_plugin:Halve"]) == 0
    out = capsys.readouterr().out
    assert "| `docs_plugin:Halve` | Halving | Someone et al. | none public | – | infinity | – |" in out
    assert "| `docs_plugin:Halve` | none public | – | – | – | – |" in out      # its default row in the method table
