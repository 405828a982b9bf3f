"""`experiments/` is a set of scripts on the package's public API: no script imports another in a circle
(function-local imports count), and none reaches for a private varbench name (a ``_name`` module or
attribute), which the package may change without notice. Read with `ast`; nothing is imported."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXPERIMENTS = ROOT / "experiments"


def _imports(path: Path) -> list[tuple[str, str | None, int]]:
    """(module, imported name or None, line) of every import in ``path``, function-local ones included."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [(a.name, None, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:                      # relative: from the experiments package
                base = ".".join(["experiments", *([node.module] if node.module else [])])
            out += [(base, a.name, node.lineno) for a in node.names]
    return out


def _graph() -> dict[str, set[str]]:
    scripts = {p.stem for p in EXPERIMENTS.glob("*.py") if p.stem != "__init__"}
    edges: dict[str, set[str]] = {}
    for s in scripts:
        deps = set()
        for mod, name, _ in _imports(EXPERIMENTS / f"{s}.py"):
            if mod == "experiments" and name in scripts:          # from experiments import device_bench
                deps.add(name)
            elif mod.startswith("experiments.") and mod.split(".")[1] in scripts:
                deps.add(mod.split(".")[1])
        edges[s] = deps - {s}
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every elementary circle found by a depth-first walk (each reported once, from its smallest name)."""
    found = set()
    out = []

    def walk(start, node, path):
        for nxt in sorted(edges.get(node, ())):
            if nxt == start:
                key = tuple(path)
                if min(path) == start and key not in found:
                    found.add(key)
                    out.append([*path, start])
            elif nxt not in path and nxt > start:
                walk(start, nxt, [*path, nxt])

    for s in sorted(edges):
        walk(s, s, [s])
    return out


def test_the_circle_finder_finds_a_circle():
    """The check below could fail: a two-script circle (device_bench <-> gpu_dryrun, as it once was) is found."""
    assert _cycles({"device_bench": {"gpu_dryrun"}, "gpu_dryrun": {"device_bench"}, "flops_table": set()}) == [
        ["device_bench", "gpu_dryrun", "device_bench"]]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_no_import_circle_between_experiment_scripts():
    edges = _graph()
    assert "device_bench" in edges and "gpu_dryrun" in edges
    assert _cycles(edges) == []


def test_experiments_import_only_public_varbench_names():
    bad = []
    for path in sorted(EXPERIMENTS.glob("*.py")):
        for mod, name, line in _imports(path):
            if mod != "varbench" and not mod.startswith("varbench."):
                continue
            private = [p for p in mod.split(".") if p.startswith("_")] + ([name] if name and name.startswith("_") else [])
            if private:
                bad.append(f"{path.relative_to(ROOT)}:{line}: {mod}{'.' + name if name else ''}")
    assert bad == []


def test_method_presets_resolve_one_way():
    """No script composes method presets itself (Hydra's compose / initialize, or reads conf/method/*.yaml):
    `varbench.harness.presets.resolve_method` is the one way."""
    offenders = []
    for path in sorted(EXPERIMENTS.glob("*.py")):
        text = path.read_text()
        for needle in ("initialize_config_dir", "from hydra import compose", '"conf" / "method"', "def load_preset"):
            if needle in text:
                offenders.append(f"{path.name}: {needle}")
    assert offenders == []
