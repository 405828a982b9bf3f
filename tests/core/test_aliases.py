"""Module paths from before the layered layout keep working (varbench/core/aliases.py)."""
from __future__ import annotations

import importlib
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from varbench.core import aliases

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("old", sorted(aliases.COMMANDS))
def test_documented_commands_run_their_new_module(old):
    """`python -m <old path> --help` runs the module now living elsewhere (its usage line prints)."""
    out = subprocess.run([sys.executable, "-m", old, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "usage:" in out.stdout


def test_every_alias_points_at_a_module_that_exists():
    for old, new in {**aliases.COMMANDS, **aliases.MOVED}.items():
        for target in (new,) if isinstance(new, str) else new:
            assert importlib.util.find_spec(target) is not None, f"{old} -> {target}: no such module"
        assert importlib.util.find_spec(old.rpartition(".")[0]) is not None   # its parent package is real


@pytest.mark.parametrize("old", sorted(aliases.MOVED))
def test_every_moved_path_imports(old):
    """Each old path imports and reads its new module (a comment that swallowed an entry, as
    `varbench.schema` once was, fails here: the key is missing and the import raises)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        module = importlib.import_module(old)
        targets = aliases.MOVED[old]
        first = importlib.import_module(targets if isinstance(targets, str) else targets[0])
    assert module.__doc__ == first.__doc__


def test_the_schema_alias_is_its_own_entry():
    assert aliases.MOVED["varbench.schema"] == "varbench.harness.schema"


#: names that left a module, as an old notebook imports them: (old module, name, where it lives now)
OLD_NAMES = [
    ("varbench.engine.runtime", "InfinityRuntime", "varbench.engine.backbones.infinity.runtime"),
    ("varbench.engine.runtime", "GenerationOutput", "varbench.engine.generation"),
    ("varbench.engine.runtime", "analytic_kv_bytes", "varbench.engine.kv_cache"),
    ("varbench.engine.state", "GenState", "varbench.engine.backbones.infinity.state"),
    ("varbench.engine.state", "KVCache", "varbench.engine.kv_cache"),
    ("varbench.engine.state", "new_generator", "varbench.engine.generation"),
    ("varbench.engine.pruned", "cached_branch", "varbench.engine.residuals"),
    ("varbench.engine.flops", "scale_flops", "varbench.engine.backbones.infinity.flops"),
    ("varbench.engine.stage_flops", "hart_decoder_flops", "varbench.engine.backbones.hart.stage_flops"),
    ("varbench.engine.stage_flops", "preset_stage_flops", "varbench.engine.backbones"),
    ("varbench.engine.memory", "weights_bytes", "varbench.engine.backbones.infinity.memory"),
    ("varbench.engine.checkpoints", "load_infinity_weights", "varbench.engine.backbones.infinity.checkpoints"),
    ("varbench.engine.models.checkpoints", "load_infinity_weights", "varbench.engine.backbones.infinity.checkpoints"),
    ("varbench.engine.models.hart.model", "HART_PRESETS", "varbench.engine.backbones.hart.model"),
    ("varbench.engine.testing", "tiny_runtime", "varbench.testing.tiny"),
    ("varbench.testing", "tiny_runtime", "varbench.testing.tiny"),
]


@pytest.mark.parametrize("old, name, new", OLD_NAMES)
def test_a_name_that_moved_still_imports_from_its_old_module(old, name, new):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        got = getattr(importlib.import_module(old), name)
    assert got is getattr(importlib.import_module(new), name)


def test_every_moved_name_lives_where_the_table_says():
    for module, names in aliases.MOVED_NAMES.items():
        for name, target in names.items():
            assert name in vars(importlib.import_module(target)), f"{module}.{name} -> {target}: not there"
            assert name not in vars(importlib.import_module(module)), f"{module}.{name} still defined at its old place"


def test_a_moved_name_warns_with_its_new_place():
    from varbench.engine import flops

    with pytest.warns(DeprecationWarning, match="varbench.engine.backbones.infinity.flops"):
        flops.scale_flops
    with pytest.raises(AttributeError, match="no_such_name"):
        flops.no_such_name


def test_an_old_import_path_warns_and_reads_the_new_module():
    sys.modules.pop("varbench.records", None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old = importlib.import_module("varbench.records")
    from varbench.harness.records import RunEntry

    from varbench.analysis.frame import records_to_frame

    assert old.RunEntry is RunEntry and old.records_to_frame is records_to_frame   # split in two: both halves
    assert any(issubclass(w.category, DeprecationWarning) and "varbench.harness.records" in str(w.message)
               for w in caught)


def test_a_real_module_wins_over_an_alias():
    """The alias finder is consulted last: a path that exists as a module is never shadowed."""
    from importlib.machinery import PathFinder

    kinds = [f if isinstance(f, type) else type(f) for f in sys.meta_path]   # PathFinder sits there as a class
    assert kinds.index(aliases.AliasFinder) > kinds.index(PathFinder)
    assert importlib.import_module("varbench.harness.job").__file__.endswith("varbench/harness/job.py")


def test_an_old_submodule_path_is_the_new_module_not_a_second_copy():
    """`varbench.engine.models` is an alias of a package: its old submodules are the aliases listed,
    each reading the module it moved to (not the file of the same name found under the new folder)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        old = importlib.import_module("varbench.engine.models.infinity")
    from varbench.engine.backbones.infinity.model import Infinity

    assert old.Infinity is Infinity
