import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
#: The official prompt files (GenEval, HPSv2, ImageReward, DPG-Bench) as published: $VARBENCH_TEST_DATA,
#: else ../shared/data beside the checkout. Tests that read them skip without them (docs/testing.md).
SHARED_DATA = Path(os.environ.get("VARBENCH_TEST_DATA") or ROOT.parent / "shared" / "data")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("WANDB_SILENT", "true")


@pytest.fixture(scope="session")
def tiny_rt():
    from varbench.testing.tiny import tiny_runtime

    return tiny_runtime(seed=0)


#: The settings of `tiny_baseline`: a test that compares with it generates with exactly these.
TINY_BASELINE = dict(seeds=[0], cfg=3.0, tau=1.0, pn="0.06M")   # 0.06M: 7 scales, up to 16x16


@pytest.fixture(scope="session")
def tiny_baseline(tiny_rt):
    """The baseline generation of "a red circle" on `tiny_rt` (TINY_BASELINE), generated once per session:
    the reference the policy tests compare neutral settings with, bit for bit. Read it, never modify it."""
    return tiny_rt.generate(["a red circle"], **TINY_BASELINE)


def pytest_collection_modifyitems(config, items):
    """Every `gpu` test skips, with the reason, where torch sees no CUDA device (`pytest -m gpu` on
    a CPU machine reports skips, never a driver error from inside a test)."""
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="gpu test: no CUDA device here (torch.cuda.is_available() is False)")
    for item in gpu_items:
        item.add_marker(skip)
