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
