"""Write the test suite's counts (and, given a JUnit XML, its durations) into docs/testing.md.

Figures that change every round are written by this script, never by hand:

    python scripts/test_stats.py                      # collect (no test runs), rewrite the counts block
    python scripts/test_stats.py --check              # exit 1 when the counts block is stale
    python scripts/test_stats.py --junit report.xml --label "CI, 2 cores, fresh clone"
                                                      # also rewrite the durations block from that run

The counts come from one `pytest --collect-only -m ""` (every test, no filter; about a minute on two
cores) and each test's markers: the tiers are the marker expressions the project itself uses, read
from its files, so they cannot drift from what is run: the quick tier from pyproject's `addopts`
(plain `pytest`), the full tier from the last line of `.ci/run` (CI, and the README's test command).
Durations come from a run that already happened (`pytest --junitxml=report.xml ...`), because timing
the suite here would cost minutes of a shared machine; without `--junit` the durations block is kept
as it is.
"""
from __future__ import annotations

import argparse
import re
import shlex
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
DOC = Path("docs/testing.md")
COUNTS = ("<!-- test-stats:start -->", "<!-- test-stats:end -->")
DURATIONS = ("<!-- test-durations:start -->", "<!-- test-durations:end -->")


class StatsError(Exception):
    """A project file this script reads is not in the shape it expects; the message names the fix."""


@dataclass(frozen=True)
class Tiers:
    quick: str    # plain `pytest`: the -m of pyproject's addopts
    full: str     # CI: the -m of .ci/run's last line
    markers: tuple[str, ...]  # every registered marker, in pyproject's order


def marker_expression(args: str, where: str) -> str:
    """The argument of `-m` in a command line (the last one wins, as in pytest)."""
    words = shlex.split(args)
    found = [words[i + 1] for i, w in enumerate(words[:-1]) if w == "-m"]
    if not found:
        raise StatsError(f"no `-m <expression>` in {where}: {args!r}; the tiers are read from it")
    return found[-1]


def ci_command(root: Path) -> str:
    """The test command `.ci/run` runs: its last non-empty line (the README shows it verbatim)."""
    lines = [ln.strip() for ln in (root / ".ci" / "run").read_text().splitlines() if ln.strip()]
    return lines[-1]


def read_tiers(root: Path) -> Tiers:
    ini = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    markers = tuple(m.split(":", 1)[0].strip() for m in ini.get("markers", []))
    return Tiers(quick=marker_expression(ini["addopts"], "pyproject.toml's addopts"),
                 full=marker_expression(ci_command(root), ".ci/run's last line"),
                 markers=markers)


def matches(expression: str, marks: frozenset[str]) -> bool:
    """Whether a test with these markers is selected by `-m expression` (pytest's own evaluator)."""
    from _pytest.mark.expression import Expression

    return Expression.compile(expression).evaluate(lambda name, **_: name in marks)


class _Collector:
    """A pytest plugin that keeps each collected test's id and marker names."""

    def __init__(self):
        self.items: dict[str, frozenset[str]] = {}

    def pytest_collection_finish(self, session):
        for item in session.items:
            self.items[item.nodeid] = frozenset(m.name for m in item.iter_markers())


def collect(root: Path) -> dict[str, frozenset[str]]:
    """Every test of the suite (no -m filter) with its markers; collection only, nothing runs."""
    import contextlib
    import io
    import os

    import pytest

    collector = _Collector()
    out = io.StringIO()
    cwd = os.getcwd()
    os.chdir(root)
    try:
        with contextlib.redirect_stdout(out):
            rc = pytest.main(["--collect-only", "-q", "-m", "", "-p", "no:cacheprovider"], plugins=[collector])
    finally:
        os.chdir(cwd)
    if rc != 0:
        raise StatsError(f"pytest --collect-only failed (exit {int(rc)}); fix the collection errors:\n"
                         + out.getvalue()[-3000:])
    return collector.items


def _n(k: int) -> str:
    return f"{k:,}"


def render_counts(tiers: Tiers, items: dict[str, frozenset[str]]) -> str:
    marks = list(items.values())
    quick = sum(matches(tiers.quick, m) for m in marks)
    full = sum(matches(tiers.full, m) for m in marks)
    rows = [
        "| tier | selected by | tests |",
        "|---|---|---|",
        f"| quick: plain `pytest` | `-m \"{tiers.quick}\"` (pyproject's addopts) | {_n(quick)} |",
        f"| full: CI, `.ci/run` | `-m \"{tiers.full}\"` | {_n(full)} |",
    ]
    for name in tiers.markers:
        tagged = [m for m in marks if name in m]
        in_full = sum(matches(tiers.full, m) for m in tagged)
        rows.append(f"| marked `{name}` | `-m {name}` | {_n(len(tagged))} ({_n(in_full)} of them in the full tier) |")
    rows.append(f"| all | `-m \"\"` | {_n(len(marks))} |")
    return ("\n".join(rows) + "\n\nCollected (not run) by `python scripts/test_stats.py`; "
            "`--check` fails when these counts are stale.")


def junit_address(nodeid: str) -> tuple[str, str]:
    """(classname, name) pytest's --junitxml writes for a test id (its `mangle_test_address`)."""
    path, bracket, params = nodeid.partition("[")
    names = path.split("::")
    names[0] = re.sub(r"\.py$", "", names[0].replace("/", "."))
    names[-1] += bracket + params
    return ".".join(names[:-1]), names[-1]


@dataclass(frozen=True)
class Case:
    nodeid: str
    seconds: float
    outcome: str  # passed, skipped, failed, error


def read_junit(path: Path, items: dict[str, frozenset[str]]) -> list[Case]:
    by_address = {junit_address(nodeid): nodeid for nodeid in items}
    cases = []
    for tc in ET.parse(path).getroot().iter("testcase"):
        address = (tc.get("classname", ""), tc.get("name", ""))
        nodeid = by_address.get(address, "::".join(a for a in address if a))
        kinds = {child.tag for child in tc}
        outcome = ("error" if "error" in kinds else "failed" if "failure" in kinds
                   else "skipped" if "skipped" in kinds else "passed")
        cases.append(Case(nodeid, float(tc.get("time") or 0.0), outcome))
    if not cases:
        raise StatsError(f"{path} has no <testcase>: pass the file `pytest --junitxml=FILE` wrote")
    return cases


def render_durations(tiers: Tiers, items: dict[str, frozenset[str]], cases: list[Case], label: str,
                     slowest: int = 10) -> str:
    total = sum(c.seconds for c in cases)
    outcomes = {o: sum(c.outcome == o for c in cases) for o in ("passed", "skipped", "failed", "error")}
    said = ", ".join(f"{_n(k)} {o}" for o, k in outcomes.items() if k)
    lines = [f"Last timed run ({label}): {_n(len(cases))} tests, {total:,.0f} s of test time; {said}."]
    for name in tiers.markers:
        part = sum(c.seconds for c in cases if name in items.get(c.nodeid, frozenset()))
        if part:
            lines.append(f"- marked `{name}`: {part:,.0f} s ({100 * part / total:.0f}% of the test time)")
    lines += ["", f"The {slowest} slowest:", "", "| s | test |", "|---|---|"]
    for c in sorted(cases, key=lambda c: -c.seconds)[:slowest]:
        lines.append(f"| {c.seconds:.1f} | `{c.nodeid}` |")
    lines += ["", "Written by `python scripts/test_stats.py --junit FILE` from that run's JUnit XML."]
    return "\n".join(lines)


def replace_block(text: str, markers: tuple[str, str], body: str) -> str:
    start, end = markers
    if text.count(start) != 1 or text.count(end) != 1 or text.index(start) > text.index(end):
        raise StatsError(f"{DOC} needs exactly one {start} ... {end} pair; put it back where the figures go")
    head, rest = text.split(start)
    _, tail = rest.split(end)
    return f"{head}{start}\n{body}\n{end}{tail}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 when a block would change")
    ap.add_argument("--junit", type=Path, help="a JUnit XML of a finished run: also write the durations block")
    ap.add_argument("--label", default="a run", help="which run the JUnit XML is (machine, date)")
    ap.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    try:
        tiers = read_tiers(args.root)
        items = collect(args.root)
        doc = args.root / DOC
        old = doc.read_text()
        new = replace_block(old, COUNTS, render_counts(tiers, items))
        if args.junit:
            new = replace_block(new, DURATIONS, render_durations(tiers, items, read_junit(args.junit, items), args.label))
    except StatsError as e:
        print(f"test_stats: {e}", file=sys.stderr)
        return 2
    if args.check:
        if new != old:
            print(f"{DOC}: the test figures are stale; run `python scripts/test_stats.py` and commit it",
                  file=sys.stderr)
            return 1
        print(f"{DOC}: test figures current ({len(items):,} tests collected)")
        return 0
    doc.write_text(new)
    print(f"{DOC}: written ({len(items):,} tests collected)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
