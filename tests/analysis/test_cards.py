"""Figures and tables name, colour and mark a method from its policy's card (varbench.policies.cards),
a plugin given as ``module:Class`` included; a method whose class is not importable here still draws,
under its class name and a hash-picked colour."""
from __future__ import annotations

import sys

import numpy as np
import pytest

pd = pytest.importorskip("pandas")
pytest.importorskip("matplotlib")

from varbench.analysis.colours import family_colour, family_name  # noqa: E402
from varbench.analysis.cost_figures import family_marker  # noqa: E402
from varbench.analysis.names import display_name, display_names  # noqa: E402
from varbench.analysis.plots import speed_quality_figure  # noqa: E402
from varbench.policies import REGISTRY  # noqa: E402
from varbench.policies.cards import EXTRA_COLOURS, card_for  # noqa: E402

PLUGIN = '''
from varbench.engine.plan import ScalePlan
from varbench.engine.policy import MethodCard, Policy


class Halve(Policy):
    name = "halve"
    card = MethodCard(display_name="Halving", colour="#123456", marker="d", paper="Someone et al.")

    def plan(self, si):
        return ScalePlan()


class Bare(Policy):
    name = "bare_plugin"

    def plan(self, si):
        return ScalePlan()


class HalveAgain(Halve):        # a subclass is another method: it does not inherit the card
    pass
'''
PLUG = "cards_plugin:Halve"


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    (tmp_path / "cards_plugin.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield PLUG
    sys.modules.pop("cards_plugin", None)


def test_packaged_cards_hold_the_figure_words_colours_and_markers():
    """The values the figures have always used (Okabe-Ito, Tol), now on each policy class."""
    want = {"baseline": ("baseline", "#000000", "*"), "fastvar": ("FastVAR", "#0072B2", "s"),
            "nova": ("NOVA", "#D55E00", "^"), "toprovar": ("ToProVAR", "#009E73", "v"),
            "skipvar": ("SkipVAR", "#CC79A7", "D"), "skipvar_fixed": ("SkipVAR fixed skip", "#E69F00", "X"),
            "skip_last": ("skip last scales", "#56B4E9", "h"), "compose": ("composed methods", "#882255", "P"),
            "scalekv": ("ScaleKV", "#332288", "o"), "sparvar": ("SparVAR", "#EE6677", "8"),
            "sparsevar": ("SparseVAR", "#44AA99", "<")}
    assert sorted(want) == sorted(REGISTRY.packaged())
    for name, (words, colour, marker) in want.items():
        assert (family_name(name), family_colour(name), family_marker(name)) == (words, colour, marker), name
    assert len({family_colour(n) for n in want}) == len(want)          # one colour per family


def test_a_plugin_is_named_coloured_and_marked_by_its_card(plugin):
    assert (family_name(plugin), family_colour(plugin), family_marker(plugin)) == ("Halving", "#123456", "d")
    # without a card: the class name (module:Class) or the name given, a hash colour, the default marker
    for name, words in (("cards_plugin:Bare", "Bare"), ("cards_plugin:HalveAgain", "HalveAgain")):
        assert card_for(name).display_name == words and family_colour(name) in EXTRA_COLOURS
        assert family_marker(name) == "p"


def test_a_class_that_does_not_import_here_still_draws():
    """A record from another machine names a plugin this one lacks: its class name, no exception."""
    name = "not_installed_pkg.mod:Faster"
    assert family_name(name) == "Faster" and family_colour(name) in EXTRA_COLOURS and family_marker(name) == "p"
    assert card_for("no_such_method").display_name == "no_such_method"


def _frame(plugin_label):
    rows = [("baseline", "baseline", 1.0, 0.300), (PLUG, plugin_label, 1.8, 0.290), ("nova", "nova", 1.3, 0.299)]
    return pd.DataFrame([{"method": m, "method_label": lab, "method_preset": m, "speedup": x,
                          "paired_speedup": np.nan if m == "baseline" else x, "paired_speedup_ci_low": x - 0.1,
                          "paired_speedup_ci_high": x + 0.1, "speedup_reliable": True, "hpsv2/score": y,
                          "hpsv2/score_err": 0.002, "model": "toy", "resolution": "64x64", "benchmark": "toy",
                          "device": "cpu", "n_images": 8, "entry_id": f"e{i}"} for i, (m, lab, x, y) in enumerate(rows)])


def test_a_plugin_reads_as_its_card_in_the_table_names_and_the_figure(plugin):
    """The table's method cell and the figure's point label and legend say "Halving", never the
    module path; a preset of the user's own keeps its id (what they type to rerun it)."""
    f = _frame(PLUG)
    assert display_names(f) == ["baseline", "Halving", "nova"]
    assert display_name({"method": PLUG, "method_preset": PLUG, "method_label": f"{PLUG}(k=2)"}) == "Halving(k=2)"
    assert display_name({"method": PLUG, "method_preset": "halve_fast", "method_label": "Halve fast"}) == "halve_fast"
    fig = speed_quality_figure(f, "hpsv2/score")
    texts = [t.get_text() for t in fig.findobj(lambda a: hasattr(a, "get_text"))]
    assert "Halving" in texts and not any(PLUG in t for t in texts), texts
    [point] = [ln for ln in fig.axes[0].get_lines() if ln.get_gid() == "point:Halving"]
    assert point.get_color() == "#123456"


def test_an_aggregated_table_names_a_plugin_by_its_card(plugin, tmp_path):
    """The whole path: records of a plugin method (no preset, no label) aggregated into table.md."""
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
    try:
        from test_aggregate import make_record, write
    finally:
        sys.path.pop(0)
    from varbench.analysis.aggregate import aggregate

    store = tmp_path / "store"
    metrics = {"geneval/overall": (0.70, 0.02), "hpsv2/score": (0.300, 0.001)}
    write(store, make_record("base01", "baseline", 100.0, 120.0, 1e12, metrics))
    write(store, make_record("plug01", PLUG, 50.0, 70.0, 5e11, metrics))
    aggregate(store, tmp_path / "out", figures=False)
    [table] = (tmp_path / "out").glob("*/table.md")
    text = table.read_text()
    assert "| Halving " in text and PLUG not in text, text
