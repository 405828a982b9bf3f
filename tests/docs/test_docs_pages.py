"""The README stays a two-minute read, and no page links or points at something that is not there.

* README.md has at most 150 lines (issue 34: everything else lives in docs/).
* Every relative link in README.md and docs/*.md names an existing file, and every #anchor a heading of
  the page it points into.
* README.md shows, verbatim, the test command CI runs (the last line of .ci/run): a reader who copies it
  runs what CI runs.
* A "docs/<page>.md, '<section>'" pointer in the package (an error message, a help text) names a
  heading that exists, so a message never sends a user to a section that was renamed.
* scripts/test_stats.py, which writes the test counts into docs/testing.md, reads its tiers from the
  same files the runs use and maps test ids to JUnit names as pytest does.
"""
from __future__ import annotations

import importlib.util
import re
import sys
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 150  # issue 34's bound: a README read in two minutes, the rest in docs/


def _prose(text: str) -> str:
    """The page without fenced code blocks and inline code, where `[x](y)` is not a link."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def _links(page: Path) -> list[str]:
    return re.findall(r"\]\(([^)\s]+)\)", _prose(page.read_text()))


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    heading = re.sub(r"`", "", heading.strip().lower())
    kept = "".join(ch for ch in heading if ch in " -_" or unicodedata.category(ch)[0] in "LN")
    return kept.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in _prose_keep_headings(page.read_text()):
        slug = _slug(line.lstrip("#"))
        n = seen.get(slug, 0)
        out.add(slug if n == 0 else f"{slug}-{n}")
        seen[slug] = n + 1
    return out


def _prose_keep_headings(text: str) -> list[str]:
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return [ln for ln in text.splitlines() if re.match(r"#{1,6} ", ln)]


def test_readme_is_short():
    n = len((ROOT / "README.md").read_text().splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines (at most {README_MAX_LINES}): move detail into docs/"


def test_the_link_checker_sees_links_and_anchors():
    """The checks below would pass vacuously if no link were found; the README links every page."""
    readme_targets = {link.split("#")[0] for link in _links(ROOT / "README.md")}
    assert {f"docs/{p.name}" for p in PAGES[1:]} <= readme_targets
    assert _slug("Running with the released weights") == "running-with-the-released-weights"
    assert _slug("Without a cluster: `hydra/launcher=local`") == "without-a-cluster-hydralauncherlocal"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_point_at_existing_files_and_headings(page):
    broken = []
    for link in _links(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", link):  # http:, https:, mailto: are not checked here
            continue
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        if not target.exists():
            broken.append(f"{link} (no file {target.relative_to(ROOT) if target.is_relative_to(ROOT) else target})")
        elif anchor and target.suffix == ".md" and anchor not in _anchors(target):
            broken.append(f"{link} (no heading with anchor #{anchor} in {target.name})")
    assert not broken, f"{page.relative_to(ROOT)}: broken links: {broken}"


def test_readme_shows_the_ci_test_command_verbatim():
    run = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines() if ln.strip()]
    command = run[-1]
    assert "pytest" in command, f".ci/run's last line is not the test command: {command!r}"
    readme_lines = [ln.strip() for ln in (ROOT / "README.md").read_text().splitlines()]
    assert command in readme_lines, f"README.md must show .ci/run's command on a line of its own: {command}"


def test_pointers_into_docs_name_existing_sections():
    pointers = []
    for src in (ROOT / "varbench").rglob("*.py"):
        for page, section in re.findall(r"(docs/[\w-]+\.md), '([^']+)'", src.read_text()):
            pointers.append((src, page, section))
    assert pointers, "expected the preflight's pointer to docs/running.md's weights section"
    for src, page, section in pointers:
        target = ROOT / page
        assert target.exists(), f"{src.relative_to(ROOT)} points at {page}, which does not exist"
        assert _slug(section) in _anchors(target), f"{src.relative_to(ROOT)} points at {page}, '{section}': no such heading"


def _test_stats():
    """scripts/test_stats.py as a module (scripts/ is not a package; dataclasses need it in sys.modules)."""
    name = "varbench_scripts_test_stats"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / "test_stats.py")
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


def test_test_stats_reads_the_tiers_the_runs_use():
    ts = _test_stats()
    tiers = ts.read_tiers(ROOT)
    assert f'-m "{tiers.full}"' in ts.ci_command(ROOT)
    assert "integration" in tiers.markers and "integration" in tiers.quick
    # a plain integration test is in the full tier and not in the quick one; a gpu test in neither
    assert ts.matches(tiers.full, frozenset({"integration"})) and not ts.matches(tiers.quick, frozenset({"integration"}))
    assert not ts.matches(tiers.full, frozenset({"gpu"})) and ts.matches(tiers.quick, frozenset())


def test_test_stats_counts_and_blocks():
    ts = _test_stats()
    tiers = ts.Tiers(quick="not integration and not gpu", full="not gpu", markers=("integration", "gpu"))
    items = {"t.py::a": frozenset(), "t.py::b": frozenset({"integration"}), "t.py::c": frozenset({"gpu"}),
             "t.py::d": frozenset({"integration", "gpu"})}
    table = ts.render_counts(tiers, items)
    # quick: a only; full: a, b; integration: b, d (only b in full); gpu: c, d; all: 4
    assert "| quick: plain `pytest` | `-m \"not integration and not gpu\"` (pyproject's addopts) | 1 |" in table
    assert "| full: CI, `.ci/run` | `-m \"not gpu\"` | 2 |" in table
    assert "| marked `integration` | `-m integration` | 2 (1 of them in the full tier) |" in table
    assert "| all | `-m \"\"` | 4 |" in table
    doc = f"x\n{ts.COUNTS[0]}\nold\n{ts.COUNTS[1]}\ny\n"
    assert ts.replace_block(doc, ts.COUNTS, "new") == f"x\n{ts.COUNTS[0]}\nnew\n{ts.COUNTS[1]}\ny\n"
    with pytest.raises(ts.StatsError, match="exactly one"):
        ts.replace_block("no markers here", ts.COUNTS, "new")


def test_test_stats_junit_names_are_pytests(tmp_path):
    from _pytest.junitxml import mangle_test_address

    ts = _test_stats()
    for nodeid in ("tests/core/test_x.py::test_a", "tests/core/test_x.py::TestK::test_b[p/1-2.py]",
                   "tests/a/b/test_y.py::test_c[x::y]"):
        names = mangle_test_address(nodeid)
        assert ts.junit_address(nodeid) == (".".join(names[:-1]), names[-1])
    xml = tmp_path / "r.xml"
    xml.write_text('<testsuites><testsuite><testcase classname="tests.core.test_x" name="test_a" time="2.5"/>'
                   '<testcase classname="tests.core.test_x" name="test_z" time="0.5"><skipped/></testcase>'
                   "</testsuite></testsuites>")
    items = {"tests/core/test_x.py::test_a": frozenset({"integration"})}
    cases = ts.read_junit(xml, items)
    assert [(c.nodeid, c.seconds, c.outcome) for c in cases] == [
        ("tests/core/test_x.py::test_a", 2.5, "passed"), ("tests.core.test_x::test_z", 0.5, "skipped")]
    text = ts.render_durations(ts.Tiers("", "", ("integration",)), items, cases, "here")
    assert "2 tests, 3 s of test time; 1 passed, 1 skipped." in text
    assert "- marked `integration`: 2 s (83% of the test time)" in text  # 2.5 of 3.0 s


def test_testing_page_has_the_figure_blocks():
    ts = _test_stats()
    text = (ROOT / ts.DOC).read_text()
    for start, end in (ts.COUNTS, ts.DURATIONS):
        assert text.count(start) == 1 and text.count(end) == 1 and text.index(start) < text.index(end)
