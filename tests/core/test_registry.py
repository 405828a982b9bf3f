"""`LazyRegistry` beyond its packaged table (issue 22, "Extension without editing the package"):
entry points of installed distributions, found on the first lookup; packaged names winning over
outside ones; one clear error for an entry point that cannot be imported; and "module:attr" names
loaded without registration (methods through `validate_config`, evaluators through `build_evaluator`).

The "installed distribution" is a ``*.dist-info`` folder (METADATA + entry_points.txt) beside a
module on a ``sys.path`` folder: what pip leaves behind, without pip."""
import logging
import textwrap

import pytest

from varbench.core.errors import FixableError
from varbench.core.registry import EntryLoadError, LazyRegistry, UnknownName, is_import_path

GROUP = "varbench.test_widgets"   # a group of these tests' own: the real registries never see it


def install(site, dist, version, entry_points, modules):
    """Write modules (name -> source) and a ``<dist>-<version>.dist-info`` declaring `entry_points`
    ({group: {name: "module:attr"}}) into the folder `site`."""
    site.mkdir(parents=True, exist_ok=True)
    for name, src in modules.items():
        (site / f"{name}.py").write_text(textwrap.dedent(src))
    info = site / f"{dist}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{n} = {v}\n" for n, v in eps.items()) + "\n" for group, eps in entry_points.items()))
    return site


def test_entry_points_are_found_on_first_lookup_and_loaded_only_when_used(tmp_path, monkeypatch):
    reg = LazyRegistry("widget", {"plain": dict}, group=GROUP)      # made before the package is "installed"
    install(tmp_path, "widgets-plus", "1.2", {GROUP: {"gizmo": "vb_ext_gizmo:Gizmo", "fancy_gizmo": "vb_ext_gizmo:Gizmo"}},
            {"vb_ext_gizmo": "IMPORTED = True\nclass Gizmo:\n    pass\n"})
    monkeypatch.syspath_prepend(str(tmp_path))
    import sys

    assert "gizmo" in reg and list(reg) == ["plain", "gizmo", "fancy_gizmo"] and len(reg) == 3
    assert reg.packaged() == ["plain"]
    assert reg["gizmo"].value == "vb_ext_gizmo:Gizmo"                 # reading gives the entry point
    assert "vb_ext_gizmo" not in sys.modules                          # listed, not imported
    assert reg.load("gizmo").__name__ == "Gizmo" and reg.load("gizmo") is reg.load("fancy_gizmo")
    with pytest.raises(UnknownName, match=r"Unknown widget 'gizmoo'\. Did you mean gizmo.*Known: fancy_gizmo, gizmo, plain\."):
        reg.load("gizmoo")                                             # suggestions include outside names


def test_a_packaged_name_wins_over_an_outside_one_with_a_warning_naming_its_distribution(tmp_path, monkeypatch, caplog):
    install(tmp_path, "shadowing-dist", "0.3", {GROUP: {"plain": "vb_ext_shadow:NotDict"}},
            {"vb_ext_shadow": "class NotDict:\n    pass\n"})
    monkeypatch.syspath_prepend(str(tmp_path))
    reg = LazyRegistry("widget", {"plain": dict}, group=GROUP)
    with caplog.at_level(logging.WARNING, logger="varbench"):
        assert list(reg) == ["plain"] and list(reg) == ["plain"]
    assert [r.getMessage() for r in caplog.records] == [      # once, not at every lookup
        "entry point 'plain' = 'vb_ext_shadow:NotDict' (group varbench.test_widgets) of distribution shadowing-dist 0.3 "
        "is ignored: varbench ships a widget of that name, which wins; register the outside one under another name"]
    assert reg.load("plain") is dict


def test_a_broken_entry_point_is_one_error_naming_the_distribution_and_the_entry_point(tmp_path, monkeypatch):
    install(tmp_path, "broken-dist", "2.0", {GROUP: {"broken": "vb_ext_broken:Thing", "gone": "vb_ext_gone:Thing"}},
            {"vb_ext_broken": "import math\nimport vb_ext_no_such_dependency\nclass Thing:\n    pass\n"})
    monkeypatch.syspath_prepend(str(tmp_path))
    reg = LazyRegistry("widget", group=GROUP)
    with pytest.raises(EntryLoadError) as e:
        reg.load("broken")
    msg = str(e.value)
    assert msg.startswith("widget 'broken': entry point 'broken' = 'vb_ext_broken:Thing' (group varbench.test_widgets) "
                          "of distribution broken-dist 2.0 cannot be loaded: ModuleNotFoundError: No module named "
                          "'vb_ext_no_such_dependency' (at "), msg
    assert "vb_ext_broken.py:2)" in msg and "reinstall that distribution" in msg   # the line that failed
    assert isinstance(e.value, FixableError) and isinstance(e.value, ImportError)  # printed alone; `except ImportError` holds
    assert e.value.__cause__ is None and e.value.__suppress_context__               # no traceback from inside the package
    with pytest.raises(EntryLoadError, match=r"'gone' = 'vb_ext_gone:Thing' .* of distribution broken-dist 2.0"):
        reg.load("gone")                                                            # a module that is not there at all


def test_two_distributions_claiming_one_name_fail_only_when_it_is_loaded(tmp_path, monkeypatch):
    for dist in ("first-dist", "second-dist"):
        install(tmp_path / dist, dist, "1.0", {GROUP: {"twin": f"vb_ext_{dist[:-5]}:Twin", f"only_{dist[:-5]}": "builtins:dict"}},
                {f"vb_ext_{dist[:-5]}": "class Twin:\n    pass\n"})
        monkeypatch.syspath_prepend(str(tmp_path / dist))
    reg = LazyRegistry("widget", group=GROUP)
    assert reg.load("only_first") is dict and sorted(reg) == ["only_first", "only_second", "twin"]
    with pytest.raises(EntryLoadError, match=r"widget 'twin' is claimed by several installed distributions: .*first-dist"
                                             r".*second-dist|second-dist.*first-dist"):
        reg.load("twin")


def test_module_attr_names_load_without_registration(tmp_path, monkeypatch):
    (tmp_path / "vb_ext_direct.py").write_text("class Outer:\n    class Inner:\n        pass\n")
    (tmp_path / "vb_ext_fails.py").write_text("x = 1\nraise RuntimeError('config file missing')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    reg = LazyRegistry("widget", {"plain": dict}, group=None)
    assert is_import_path("a.b:C.D") and not is_import_path("plain") and not is_import_path("a b:c")
    assert "collections:OrderedDict" in reg and list(reg) == ["plain"]     # answered, not listed
    import collections

    assert reg.load("collections:OrderedDict") is collections.OrderedDict
    assert reg.load("vb_ext_direct:Outer.Inner").__qualname__ == "Outer.Inner"
    with pytest.raises(UnknownName, match=r"'collections' has no attribute 'OrderedDcit'\. Did you mean OrderedDict"):
        reg.load("collections:OrderedDcit")
    with pytest.raises(UnknownName, match=r"there is no module 'vb_ext_nowhere'"):
        reg.load("vb_ext_nowhere.policy:Mine")
    with pytest.raises(EntryLoadError, match=r"widget 'vb_ext_fails:X': importing 'vb_ext_fails' failed: "
                                             r"RuntimeError: config file missing \(at .*vb_ext_fails.py:2\)"):
        reg.load("vb_ext_fails:X")
    with pytest.raises(UnknownName, match="Did you mean plain"):          # plain names: the suggestion still works
        reg.load("plian")


def test_the_registries_read_their_entry_point_groups():
    from varbench import evaluators, policies
    from varbench.harness import prompts

    assert (policies.REGISTRY.group, evaluators.REGISTRY.group, prompts.LOADERS.group) == (
        "varbench.methods", "varbench.evaluators", "varbench.prompt_loaders")


POLICY = """
from varbench.engine.plan import ScalePlan
from varbench.engine.policy import Policy
from varbench.evaluators.base import EvalResult, Evaluator


class DropLast(Policy):
    name = "drop_last"

    def __init__(self, drop: int = 1):
        if drop < 0:
            raise ValueError(f"drop must be >= 0, got {drop}")
        self.drop = drop

    def plan(self, si):
        return ScalePlan(run=si < len(self.ctx.schedule) - self.drop)


class Const(Evaluator):
    name = "const"

    def __init__(self, value: float = 1.0, device: str = "cpu"):
        self.value, self._rows = value, []

    def setup(self, device="cpu"): pass
    def update(self, samples): pass
    def compute(self): return EvalResult(metrics={"value": self.value})
    def reset(self): self._rows = []
    def version_info(self): return {"scorer": "const"}
"""


def test_method_and_evaluator_names_given_as_module_attr(tmp_path, monkeypatch):
    from hydra import compose, initialize_config_dir

    from varbench.core.errors import ConfigError
    from varbench.core.resources import CONF_DIR
    from varbench.evaluators import build_evaluator
    from varbench.harness.config import validate_config
    from varbench.harness.scoring import evaluator_class, preflight

    (tmp_path / "vb_ext_mine.py").write_text(POLICY)
    monkeypatch.syspath_prepend(str(tmp_path))

    def cfg(*extra):
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return compose(config_name="config", overrides=["+experiment=smoke", *extra])

    policy = validate_config(cfg("method.name=vb_ext_mine:DropLast", "+method.knobs.drop=2"))
    assert type(policy).__name__ == "DropLast" and policy.drop == 2
    with pytest.raises(ConfigError, match=r"method.knobs.drop='x' does not fit vb_ext_mine:DropLast's drop: int"):
        validate_config(cfg("method.name=vb_ext_mine:DropLast", "+method.knobs.drop=x"))   # knobs checked by signature
    with pytest.raises(ConfigError, match=r"method.name: Unknown method 'vb_ext_mine:DropLats': 'vb_ext_mine' has no "
                                          r"attribute 'DropLats'\. Did you mean DropLast"):
        validate_config(cfg("method.name=vb_ext_mine:DropLats"))
    assert build_evaluator("vb_ext_mine:Const", value=3.0).compute().metrics == {"value": 3.0}
    assert evaluator_class({"name": "vb_ext_mine:Const"}).__name__ == "Const"
    preflight({"mine": {"name": "vb_ext_mine:Const", "value": 2.0}}, [], "cpu")
    with pytest.raises(ConfigError, match=r"evaluator.mine.name: Unknown evaluator 'fidelty'\. Did you mean fidelity"):
        preflight({"mine": {"name": "fidelty"}}, [], "cpu")


def test_no_outside_entry_point_is_looked_up_at_import(monkeypatch):
    """Building a registry scans no installed package, nor does a packaged name: an unknown one does, once."""
    import importlib.metadata as md

    calls, real = [], md.entry_points
    monkeypatch.setattr(md, "entry_points", lambda **kw: calls.append(kw) or real(**kw))
    reg = LazyRegistry("widget", {"plain": dict}, group=GROUP)
    assert calls == []
    assert reg.load("plain") is dict and "plain" in reg
    assert calls == []
    assert "other" not in reg
    list(reg), reg.close_matches("x")
    assert calls == [{"group": GROUP}]
