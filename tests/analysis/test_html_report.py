"""The self-contained HTML report: escaped text, no network, every listed figure embedded, the same
table as ``table.md``, the provenance of the records; and the page as a real browser renders it.

Unit tests build records in code (written with varbench.harness.records, aggregated by
``varbench.analysis.aggregate.aggregate``, which writes the tables and the speed/quality figures). The
browser tests run a toy sweep (the tiny model: a baseline and skip_last_2, three prompts, so the
folder holds an image grid too), write the report and open it in Debian's chromium headless: the
page's text must hold the table's method names and cells, each embedded image must decode (its
``naturalWidth`` read by a small script in a copy of the page, checked against a broken control
image), and the screenshot must have the window's size and not be blank.
"""
from __future__ import annotations

import base64
import html.parser
import io
import json
import os
import shutil
import subprocess

import numpy as np
import pytest

pd = pytest.importorskip("pandas")
PIL = pytest.importorskip("PIL")
from PIL import Image  # noqa: E402

from varbench.analysis.aggregate import aggregate  # noqa: E402
from varbench.analysis.html_report import ReportError, ReportGroup, ordered_rows, write_html_report  # noqa: E402
from varbench.analysis.plots import FIGURES_MANIFEST  # noqa: E402
from varbench.analysis.tables import build_sections  # noqa: E402
from varbench.harness.records import RunEntry  # noqa: E402

EVIL = "<script>alert('x')</script> & co"


# ------------------------------------------------------------------------------------------------
# reading a page back

class _Page(html.parser.HTMLParser):
    """Tags with their attributes, the cells of every table row, and the text (scripts/styles out)."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.rows: list[list[str]] = []
        self.text: list[str] = []
        self._cell: list[str] | None = None
        self._skip = 0

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag in ("script", "style"):
            self._skip += 1
        elif tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("script", "style"):
            self._skip -= 1
        elif tag in ("td", "th") and self._cell is not None:
            self.rows[-1].append("".join(self._cell))
            self._cell = None

    def handle_data(self, data):
        if self._skip:
            return
        self.text.append(data)
        if self._cell is not None:
            self._cell.append(data)


def parse(page: str) -> _Page:
    p = _Page()
    p.feed(page)
    return p


def md_rows(table_md: str) -> list[list[str]]:
    """The cells of every table row of ``table.md`` (headers included, separators out)."""
    rows = []
    for line in table_md.splitlines():
        if line.startswith("| "):
            cells = [c.strip().replace("\\|", "|") for c in line.strip()[1:-1].split(" | ")]
            rows.append(cells)
    return rows


# ------------------------------------------------------------------------------------------------
# records built in code

def record(entry_id, method, ar_ms, flops, metrics, *, label=None, sha="a" * 40, preset=None):
    return {
        "entry_id": entry_id, "generation_id": "g" + entry_id, "created": "2025-01-01T00:00:00+00:00",
        "experiment": {"name": "synthetic", "tags": [], "overrides": []},
        "config": {"method": method},
        "model": {"name": "infinity_2b", "preset": "2b", "resolution": [1024, 1024], "h_div_w": 1.0, "dtype": "bf16",
                  "weights": {"infinity_2b_reg.pth": "0123456789ab" + "f" * 52}},
        "method": {"name": method, "label": label, "config": {}, "stats": {}, **({"preset": preset} if preset else {})},
        "benchmark": {"name": "geneval", "sha256": "b" * 64, "items_sha256": "i" * 64, "n_prompts": 8,
                      "samples_per_prompt": 2, "seeds": {"base": 7}},
        "evaluators": {"geneval": {"version": "1.0.2"}, "hpsv2": {"version": "2.1"}},
        "metrics": {k: v[0] for k, v in metrics.items()},
        "uncertainty": {k: v[1] for k, v in metrics.items()},
        "timing": {"device": "H200", "dtype": "bf16", "warmup": 1, "repeats": 3, "by_batch": {
            "1": {"text_ms": {"median": 5.0}, "ar_ms": {"median": ar_ms}, "decode_ms": {"median": 10.0},
                  "total_ms": {"median": ar_ms + 20}, "images_per_s": 1000.0 / (ar_ms + 20)}}},
        "flops": {"total": flops, "ar": flops * 0.9, "per_scale": [flops / 2, flops / 2]},
        "provenance": {"cpu_model": "Test CPU", "git": {"sha": sha, "dirty": False}, "python": "3.11.7",
                       "packages": {"torch": "2.4.1", "varbench": "0.1.0"}, "torch": {"version": "2.4.1+cu124"}},
        "wall_s": 1.0,
    }


def put(root, rec):
    e = RunEntry(root, rec["entry_id"])
    e.write_record(rec)
    e.mark_done()


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    """A store whose find order is not the table's order (the baseline's entry id sorts last), a
    label that is an HTML injection, two code versions; aggregated into ``out`` with figures."""
    tmp = tmp_path_factory.mktemp("report")
    store = tmp / "store" / "synthetic"
    put(store, record("zz_base", "baseline", 100.0, 1e12, {"geneval/overall": (0.70, 0.02), "hpsv2/score": (0.300, 0.001)}))
    put(store, record("aa_fast", "fastvar", 40.0, 4e11, {"geneval/overall": (0.68, 0.02), "hpsv2/score": (0.305, 0.001)},
                      label=EVIL, preset="zz_fastvar_heavy", sha="b" * 40))
    put(store, record("bb_nova", "nova", 70.0, 6e11, {"geneval/overall": (0.69, 0.02), "hpsv2/score": (0.302, 0.001)},
                      label="nova r=0.5", preset="aa_nova"))
    with pytest.warns(UserWarning):   # no images in the store: the image grid is skipped with a warning
        [g] = aggregate(store, tmp / "results" / "synthetic").groups     # one model and resolution: one folder
    out, paired = g.folder, g.paired
    assert out.name == "infinity_2b-1024px"
    page = write_html_report(tmp / "results" / "synthetic" / "report.html", "synthetic <sweep>",
                             [ReportGroup("infinity_2b-1024px", out, paired, ["Not in this table: 1 job <failed>."])],
                             provenance={"store": str(store), "command": ["python", "-m", "varbench.aggregate"]})
    return {"page": page, "html": page.read_text(), "out": out, "paired": paired, "store": store}


def test_text_is_escaped_and_the_page_runs_no_script(synthetic):
    page = synthetic["html"]
    assert "<script" not in page.lower()                       # the label did not become a tag
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; co" in page
    parsed = parse(page)
    assert EVIL in "".join(parsed.text)                        # ...and reads back as the label itself
    assert "synthetic <sweep>" in "".join(parsed.text)
    assert "Not in this table: 1 job <failed>." in "".join(parsed.text)
    assert not [t for t, _ in parsed.tags if t in ("script", "iframe", "object", "embed", "link")]


def test_the_page_is_self_contained_and_embeds_every_listed_figure(synthetic):
    parsed = parse(synthetic["html"])
    refs = [v for _, attrs in parsed.tags for k, v in attrs.items() if k in ("src", "href", "srcset", "action")]
    assert refs and not [r for r in refs if r.lower().startswith(("http:", "https:", "//", "ftp:", "file:"))]
    assert "url(" not in synthetic["html"]                     # no CSS fetch either
    listed = json.loads((synthetic["out"] / FIGURES_MANIFEST).read_text())
    assert listed and all(n.startswith(("speed_vs_", "speedup_vs_flops")) for n in listed)
    imgs = {a["alt"]: a["src"] for t, a in parsed.tags if t == "img"}
    assert sorted(imgs) == sorted(listed)
    for name, src in imgs.items():
        head, _, data = src.partition(",")
        assert head == "data:image/png;base64"
        raw = base64.b64decode(data, validate=True)
        assert raw == (synthetic["out"] / name).read_bytes()  # the file itself, not a re-encode
        Image.open(io.BytesIO(raw)).verify()


def test_the_tables_are_table_md_in_its_row_order(synthetic):
    """Every row of table.md (header and cells) is a row of the page, in the same order, although
    the frame handed in is in the store's order (the baseline last)."""
    assert synthetic["paired"]["method"].tolist()[-1] == "baseline"   # the input really is out of order
    md = md_rows((synthetic["out"] / "table.md").read_text())
    page_rows = parse(synthetic["html"]).rows
    assert len(md) >= 4
    assert [r for r in page_rows if r in md] == md
    presets = [r[0] for r in md if r[0] not in ("method",)]
    # by preset (aa_nova before zz_fastvar_heavy), each shown by its label, which says more than the id
    assert presets[0] == "baseline" and presets[1:3] == ["nova r=0.5", EVIL]


def test_notes_and_provenance_are_on_the_page(synthetic):
    text = " ".join(parse(synthetic["html"]).text)
    assert "± = the evaluator's standard error" in text             # the tables' footnotes
    assert "Records from 2 code versions" in text                   # ...including the code-version note
    rows = parse(synthetic["html"]).rows
    facts = {r[0]: r[1] for r in rows if len(r) == 2}
    assert facts["torch"] == "2.4.1+cu124" and facts["dtype"] == "bf16" and facts["device"] == "H200"
    assert facts["weights sha256"] == "infinity_2b_reg.pth 0123456789ab…"
    assert facts["seeds"] == "base 7"
    assert facts["evaluators"].startswith("geneval ") and "(version 1.0.2)" in facts["evaluators"]
    assert facts["store"] == str(synthetic["store"])                 # the run-level provenance
    per_record = next(r for r in rows if r[:4] == ["method", "label", "entry", "created"])
    assert per_record[4:] == ["code version"]                        # the one fact that differs
    assert ["zz_fastvar_heavy", EVIL, "aa_fast", "2025-01-01T00:00:00+00:00", "b" * 12] in rows


def test_a_listed_figure_that_is_missing_is_refused_and_the_old_page_kept(synthetic, tmp_path):
    out = tmp_path / "g"
    shutil.copytree(synthetic["out"], out)
    (out / json.loads((out / FIGURES_MANIFEST).read_text())[0]).unlink()
    page = tmp_path / "report.html"
    page.write_text("previous report")
    with pytest.raises(ReportError, match="rerun the aggregate"):
        write_html_report(page, "t", [ReportGroup("g", out, synthetic["paired"], [])])
    assert page.read_text() == "previous report"
    (out / FIGURES_MANIFEST).write_text("{not json")
    with pytest.raises(ReportError, match="does not parse"):
        write_html_report(page, "t", [ReportGroup("g", out, synthetic["paired"], [])])


def test_no_group_is_refused_and_a_folder_without_figures_says_so(synthetic, tmp_path):
    with pytest.raises(ReportError, match="at least one"):
        write_html_report(tmp_path / "r.html", "t", [])
    page = write_html_report(tmp_path / "r.html", "t", [ReportGroup("a", tmp_path / "nothing", synthetic["paired"], []),
                                                        ReportGroup("a", tmp_path / "nothing", synthetic["paired"], [])])
    text = page.read_text()
    assert "No figures in this group" in text and "<img" not in text
    ids = [a["id"] for t, a in parse(text).tags if t == "section"]
    assert len(ids) == 2 and len(set(ids)) == 2                     # two groups of one name: two anchors
    assert [a["href"][1:] for t, a in parse(text).tags if t == "a" and a.get("href", "").startswith("#")] == ids


def test_ordered_rows_puts_the_baseline_first_and_keeps_the_directions(synthetic):
    paired = synthetic["paired"].copy()
    paired.attrs = {"higher_is_better": {"geneval/overall": True}}
    table = ordered_rows(paired)
    assert table["method"].tolist()[0] == "baseline"
    assert table.attrs == paired.attrs
    assert [s.rows[0][0] for s in build_sections(table)] == ["baseline"]


# ------------------------------------------------------------------------------------------------
# in a real browser

def _chromium() -> str:
    exe = next((shutil.which(n) for n in ("chromium", "chromium-browser") if shutil.which(n)), None)
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("CI is set but no chromium binary is on PATH: the report's browser test must run in CI "
                        "(.ci/run installs it: apt-get install -y --no-install-recommends chromium)")
        pytest.skip("no chromium binary on PATH (Debian: apt-get install chromium); the report's browser test "
                    "needs one (it fails instead of skipping when CI is set)")
    return exe


def _browse(exe: str, profile, *args: str, timeout: float = 120) -> str:
    # a profile of its own: two chromiums sharing the default one wait on its lock
    cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}", *args]
    res = subprocess.run(cmd, capture_output=True, timeout=timeout, check=False)
    assert res.returncode == 0, res.stderr.decode(errors="replace")[-2000:]
    return res.stdout.decode("utf-8")


def test_no_chromium_skips_with_the_reason_but_fails_under_ci(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))               # an empty folder: no browser on PATH
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="no chromium binary"):
        _chromium()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI is set but no chromium"):
        _chromium()


@pytest.fixture(scope="module")
def toy_report(tmp_path_factory):
    """A toy sweep (tiny model: baseline and skip_last_2 on three prompts) aggregated and reported."""
    from varbench.harness.job import run_job
    from varbench.testing.jobs import job_config

    root = tmp_path_factory.mktemp("toy_report")

    def cfg(*extra):
        return job_config(root, "evaluator=[fidelity]", "benchmark.limit=3", "runtime.batch_size=2",
                          "runtime.progress=false", "timing.repeats=2", "timing.warmup=0", "experiment_name=rep", *extra)

    run_job(cfg())
    run_job(cfg("method=skip_last_2"))
    [g] = aggregate(root / "store" / "rep", root / "results" / "rep").groups
    folder, paired = g.folder, g.paired
    assert folder.name == "tiny-128px"
    page = write_html_report(root / "results" / "rep" / "report.html", "rep",
                             [ReportGroup("tiny-128px", folder, paired, [])])
    return {"page": page, "folder": folder, "paired": paired}


@pytest.mark.integration
def test_chromium_renders_the_tables_and_decodes_every_image(toy_report, tmp_path):
    exe = _chromium()
    page, folder = toy_report["page"], toy_report["folder"]
    dom = _browse(exe, tmp_path / "profile", "--dump-dom", page.as_uri())
    text = " ".join(parse(dom).text)
    sections = build_sections(ordered_rows(toy_report["paired"]))
    cells = [c for s in sections for row in s.rows for c in row]
    # one name column (analysis/names.py): the id, or the label where it says more (here the composed
    # config names no preset, so the family skip_last is the id and the label says "2")
    assert "baseline" in cells and "Skip last 2 scales" in cells, cells
    assert any("×" in c for c in cells)                              # a speed-up cell is among them
    missing = [c for c in cells if c not in text]
    assert not missing, missing

    # a copy with a script that reports each image once the page has loaded; a broken control image
    # shows the check tells a decoded image from one that is not
    listed = json.loads((folder / FIGURES_MANIFEST).read_text())
    assert "image_grid.png" in listed
    probe = tmp_path / "probe.html"
    probe.write_text(page.read_text().replace("</body>", (
        '<img alt="control" src="data:image/png;base64,iVBORw0KGgoAAAAbroken">'
        '<pre id="probe">pending</pre><script>addEventListener("load", function () {'
        'document.getElementById("probe").textContent = JSON.stringify(Array.from(document.images).map('
        'function (i) { return [i.alt, i.naturalWidth, i.naturalHeight]; })); });</script></body>')))
    dom = _browse(exe, tmp_path / "profile", "--dump-dom", probe.as_uri())
    probe_text = next(t for t in parse(dom).text if t.startswith("[["))
    seen = {alt: (w, h) for alt, w, h in json.loads(probe_text)}
    assert seen.pop("control") == (0, 0)
    assert seen == {n: Image.open(folder / n).size for n in listed}   # every figure, at its own pixel size


@pytest.mark.integration
def test_chromium_screenshot_has_the_window_size_and_shows_the_page(toy_report, tmp_path):
    exe = _chromium()
    shot = tmp_path / "report.png"
    _browse(exe, tmp_path / "profile", f"--screenshot={shot}", "--window-size=1280,2000", toy_report["page"].as_uri())
    img = Image.open(shot)
    assert img.size == (1280, 2000)
    px = np.asarray(img.convert("RGB"))
    # measured on the toy report: 17% of pixels inked, ~62,000 colours (the image grid's pixels); a page
    # of a title, a line and a small table at this size: 0.1% inked, ~240 colours (anti-aliased text)
    ink = float((px.min(axis=2) < 235).mean())
    colours = len(np.unique(px.reshape(-1, 3), axis=0))
    assert ink > 0.05, ink                     # text, tables and the image grid, not a blank page
    assert colours > 5000, colours             # the embedded images' colours, not text alone
