import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
#: The official prompt files (GenEval, HPSv2, ImageReward, DPG-Bench) as published: $VARBENCH_TEST_DATA,
#: else ../shared/data beside the checkout. Tests that read them skip without them (README).
SHARED_DATA = Path(os.environ.get("VARBENCH_TEST_DATA") or ROOT.parent / "shared" / "data")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("WANDB_SILENT", "true")


@pytest.fixture(scope="session")
def tiny_rt():
    from varbench.testing import tiny_runtime

    return tiny_runtime(seed=0)
