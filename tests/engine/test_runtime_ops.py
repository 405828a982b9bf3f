"""The eager step's host cost, counted: dispatched aten ops per block (deterministic, so CI gates it).

On a GPU every dispatched op is a launch or a host-side view; an eager step of ~120 ops per block
made the small scales cost as much as the reference code's (issue #10). The target is <= 40 per block
in the baseline path with CFG on (fp32 CPU, ca_bf16 as released)."""
import pytest

from experiments.runtime_ops import ops_per_block

#: generates with a tiny random runtime (seconds per test): the full run's tier, not plain `pytest`'s
pytestmark = pytest.mark.runtime


def test_baseline_block_dispatches_at_most_40_ops_at_every_scale():
    per_block, per_scale, _ = ops_per_block(pn="0.06M", depth=8)
    assert len(per_block) == 7
    assert max(per_block) <= 40, per_block
    # the count is per block: outside the blocks (embedding, head, sampling) it does not grow with depth
    assert all(b == int(b) for b in per_block)


def test_hot_block_floor_times_every_scale_and_leaves_the_runtime_as_it_was():
    from experiments.runtime_ops import _runtime, _text, hot_block_us
    from varbench.engine.backbones.infinity.state import GenState
    full_block = GenState.full_block
    rt = _runtime(depth=4, width=64, heads=2)
    before = rt.generate(["x"], [0], pn="0.06M", cfg=4.0, text=_text(), decode=False)
    hot = hot_block_us(rt, pn="0.06M", repeats=3)
    assert len(hot) == len(before.schedule) and all(t > 0 for t in hot)
    assert GenState.full_block is full_block  # the recording hook is gone
    # re-running a block in place must not have disturbed what the next generation computes
    after = rt.generate(["x"], [0], pn="0.06M", cfg=4.0, text=_text(), decode=False)
    assert all(a.equal(b) for a, b in zip(before.bits, after.bits))
