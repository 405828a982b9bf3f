"""The package's shape, checked from the source: layers import only layers below them, no import
circle (function-local imports count: a lazy import of a higher layer is still a circle), no private
name crosses a module boundary, and `varbench/` holds only packages beside `__init__`/`__main__`.
Inside `engine`, the backbone-agnostic seam imports no backbone (`engine.backbones.*`) and a backbone
imports the seam and its own folder only, never another backbone.

Every ``import``/``from ... import`` in the package is read with `ast` (no module is imported), so
the test also covers modules whose optional dependencies are not installed here."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "varbench"

#: Bottom to top. A module may import its own layer and the layers before it. `toy` (the toy world,
#: its exact evaluator and its training) sits above `evaluators` because its world uses GenEval's
#: position rules, and below `harness`, which loads its prompts and weights. `testing` (dev tools: tiny
#: random runtimes, the fake-CUDA dry run, a test job's config) sits above `harness`, whose configs it
#: composes, but is no layer of the product: only the CLI may import it (`TESTING_USERS`).
LAYERS = ["core", "engine", "policies", "evaluators", "toy", "harness", "testing", "analysis", "loggers", "cli"]
#: the production layers that may import `varbench.testing` (tests and experiments/ are outside the package)
TESTING_USERS = {"testing", "cli"}


def _modules(pkg: Path = PKG) -> dict[str, Path]:
    out = {}
    for path in sorted(pkg.rglob("*.py")):
        parts = path.relative_to(pkg.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _package_of(name: str, path: Path) -> str:
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def _imports(name: str, path: Path, modules: dict) -> list[tuple[str, str | None, int]]:
    """(imported module, imported name or None, line) for every varbench import in `path`."""
    tree = ast.parse(path.read_text(), filename=str(path))
    pkg = _package_of(name, path)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, None, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            for a in node.names:
                sub = f"{base}.{a.name}"
                found.append((sub, None, node.lineno) if sub in modules else (base, a.name, node.lineno))
    out = []
    for mod, attr, line in found:
        if mod != "varbench" and not mod.startswith("varbench."):
            continue
        while mod not in modules and "." in mod:
            mod = mod.rpartition(".")[0]
        out.append((mod, attr, line))
    return out


def _graph():
    modules = _modules()
    edges = {}
    for name, path in modules.items():
        deps = {}
        for mod, attr, line in _imports(name, path, modules):
            if mod != name:
                deps.setdefault(mod, (path, line))
        # Not counted: the implicit import of a module's own parent packages. A package's __init__
        # that re-exports its submodules (`evaluators/__init__` -> `evaluators.base`) is how a
        # package shows its API, not a lower module calling up; any import it makes outside the
        # package is an explicit edge here and is checked like every other.
        edges[name] = deps
    return modules, edges


def _layer(name: str) -> str | None:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def test_top_level_holds_only_packages():
    loose = sorted(p.name for p in PKG.glob("*.py") if p.name not in {"__init__.py", "__main__.py"})
    assert loose == [], f"modules at the top of varbench/ (move each into its layer): {loose}"
    packages = sorted(p.name for p in PKG.iterdir() if p.is_dir() and (p / "__init__.py").exists())
    assert set(packages) == set(LAYERS), f"top-level packages {packages} are not the layers {LAYERS}"


def test_each_layer_imports_only_layers_below_it():
    modules, edges = _graph()
    wrong = []
    for name, deps in edges.items():
        here = _layer(name)
        for dep, (path, line) in deps.items():
            there = _layer(dep)
            if dep == "varbench" or there is None and dep != "varbench.__main__":
                continue
            if name in ("varbench", "varbench.__main__"):
                allowed = {"varbench": {"core"}, "varbench.__main__": {"cli", "core"}}[name]
                if there not in allowed:
                    wrong.append(f"{path.relative_to(ROOT)}:{line} {name} -> {dep}")
                continue
            if there is not None and LAYERS.index(there) > LAYERS.index(here):
                wrong.append(f"{path.relative_to(ROOT)}:{line} {name} ({here}) -> {dep} ({there})")
    assert wrong == [], "imports of a higher layer:\n" + "\n".join(wrong)


def test_only_the_cli_imports_the_dev_tools():
    """`varbench.testing` is for tests, experiments and the CLI's dry run; the mechanism, methods,
    evaluators, harness and analysis never run on a tiny random model or a fake GPU."""
    assert _testing_imports(_graph()[1]) == []


def _testing_imports(edges: dict) -> list[str]:
    return [f"{path.relative_to(ROOT)}:{line} {name} -> {dep}" for name, deps in edges.items()
            for dep, (path, line) in deps.items()
            if _layer(dep) == "testing" and _layer(name) not in TESTING_USERS]


BACKBONES = "varbench.engine.backbones"


def _backbone(name: str) -> str | None:
    """`varbench.engine.backbones.<family>...` -> family; None for the seam (and the backbones' index)."""
    parts = name.split(".")
    return parts[3] if name.startswith(BACKBONES + ".") and len(parts) > 3 else None


def _backbone_imports(edges: dict) -> list[str]:
    """Engine imports that cross the seam the wrong way: the seam (every `engine` module outside
    `engine/backbones/`) into a backbone or the backbones' index, or one backbone into another (or
    into the index, which names every backbone)."""
    wrong = []
    for name, deps in edges.items():
        if _layer(name) != "engine" or name == BACKBONES:   # the index may name every backbone
            continue
        here = _backbone(name)
        for dep, (path, line) in deps.items():
            if dep != BACKBONES and not dep.startswith(BACKBONES + "."):
                continue
            there = _backbone(dep)
            if here is None:
                wrong.append(f"{path.relative_to(ROOT)}:{line} seam {name} -> backbone {dep}")
            elif there != here:
                wrong.append(f"{path.relative_to(ROOT)}:{line} backbone {here} ({name}) -> {dep}")
    return wrong


def test_the_engine_seam_imports_no_backbone_and_no_backbone_another():
    """A new backbone is a new folder: the seam (plan, policy, KV cache, pruned-residual fill, batch
    splitting, graphs, memory, FLOPs helpers, text encoders, generation output) knows none, and
    no backbone leans on another."""
    modules, edges = _graph()
    assert any(_backbone(m) == "infinity" for m in modules) and any(_backbone(m) == "hart" for m in modules)
    wrong = _backbone_imports(edges)
    assert wrong == [], "engine imports across the backbone seam:\n" + "\n".join(wrong)


def test_the_backbone_check_finds_a_crossing():
    """The check above can fail: a seam module importing a backbone, a backbone importing another or
    the index, each found; the seam, a backbone's own folder and the index itself pass."""
    at = (PKG / "engine" / "plan.py", 1)
    edges = {
        "varbench.engine.plan": {"varbench.engine.backbones.hart.model": at, "varbench.core.errors": at},
        "varbench.engine.stage_flops": {BACKBONES: at},
        "varbench.engine.backbones.hart.state": {"varbench.engine.backbones.infinity.state": at,
                                                "varbench.engine.backbones.hart.model": at, "varbench.engine.plan": at},
        "varbench.engine.backbones.infinity.runtime": {BACKBONES: at, "varbench.engine.kv_cache": at},
        BACKBONES: {"varbench.engine.backbones.hart.model": at},
    }
    assert [w.split(" ", 1)[1] for w in _backbone_imports(edges)] == [
        "seam varbench.engine.plan -> backbone varbench.engine.backbones.hart.model",
        "seam varbench.engine.stage_flops -> backbone varbench.engine.backbones",
        "backbone hart (varbench.engine.backbones.hart.state) -> varbench.engine.backbones.infinity.state",
        "backbone infinity (varbench.engine.backbones.infinity.runtime) -> varbench.engine.backbones",
    ]


def _cycles(edges: dict) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(edges[root]))]
        index[root] = low[root] = counter[0]; counter[0] += 1; stack.append(root); on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in edges:
                    continue
                if w not in index:
                    index[w] = low[w] = counter[0]; counter[0] += 1; stack.append(w); on.add(w)
                    work.append((w, iter(edges[w])))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop(); on.discard(w); comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_no_import_circle():
    _, edges = _graph()
    assert _cycles(edges) == []


def test_the_cycle_finder_finds_a_circle():
    """The check above can fail: a lazy import back up is a circle."""
    assert _cycles({"a": {"b": 0}, "b": {"c": 0}, "c": {"a": 0}, "d": {"a": 0}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b": 0}, "b": {}}) == []


@pytest.mark.parametrize("where", ["varbench", "experiments", "scripts"])
def test_no_private_name_crosses_a_module(where):
    modules = _modules()
    crossing = []
    for path in sorted((ROOT / where).rglob("*.py")):
        rel = path.relative_to(ROOT)
        name = ".".join(rel.with_suffix("").parts)
        for mod, attr, line in _imports(name, path, modules):
            leaf = mod.rpartition(".")[2]
            private_mod = leaf.startswith("_") and not leaf.startswith("__")
            private_attr = attr is not None and attr.startswith("_") and not attr.startswith("__")
            if private_mod or private_attr:
                crossing.append(f"{rel}:{line} {mod}{':' + attr if attr else ''}")
    assert crossing == [], "private names imported across modules:\n" + "\n".join(crossing)
