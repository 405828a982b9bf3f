"""How a job's images are split into shards and batches, so that every way of running it (whole,
sharded, resumed) puts the same images in the same batch.

Batched forwards are not bit-identical across batch compositions (a matmul over 3 rows may round
differently from one over 5), so "scores equal the unsharded run's bit for bit" needs batches that
do not depend on how the work was split. The unit is a *block*: ``block_prompts`` consecutive
prompts of the benchmark (all their samples). Generation batches (``runtime.batch_size``) and
scoring batches (:data:`varbench.scoring.SCORE_BATCH`) are cut inside each block, always from the
block's full key list; shard ``i/n`` takes blocks ``i, i+n, i+2n, ...``. A relaunch generates or
scores only the missing members of each batch, so a batch that was lost whole is redone with the
same members.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence


@dataclasses.dataclass(frozen=True)
class Shard:
    """``shard=i/n``: this job's part of the benchmark (``index`` i of ``count`` n)."""

    index: int = 0
    count: int = 1

    @classmethod
    def parse(cls, spec: Any) -> "Shard":
        if spec in (None, "", "0/1"):
            return cls()
        try:
            i, n = (int(x) for x in str(spec).split("/"))
        except ValueError:
            raise ValueError(f"shard must look like i/n (e.g. shard=0/4), got {spec!r}") from None
        if not (n >= 1 and 0 <= i < n):
            raise ValueError(f"shard={spec}: need 0 <= i < n")
        return cls(i, n)

    @property
    def name(self) -> str:
        return f"{self.index}-of-{self.count}"

    def blocks(self, all_blocks: Sequence[list]) -> list[list]:
        """This shard's blocks (every ``count``-th, starting at ``index``)."""
        return list(all_blocks[self.index::self.count])


def block_prompts(samples_per_prompt: int, *batch_sizes: int) -> int:
    """Prompts per block: enough for the largest batch, so no batch is cut short by a block edge
    more than once per block."""
    return max(1, math.ceil(max(batch_sizes) / max(1, samples_per_prompt)))


def key_blocks(items: Sequence[Any], samples_per_prompt: int, prompts_per_block: int) -> list[list]:
    """``[[(item, sample), ...], ...]``: the benchmark's keys, ``prompts_per_block`` prompts a block."""
    keys = [(it, s) for it in items for s in range(samples_per_prompt)]
    per = prompts_per_block * samples_per_prompt
    return [keys[i:i + per] for i in range(0, len(keys), per)]


def batches(blocks: Sequence[list], size: int) -> list[list]:
    """Batches of at most ``size`` keys, cut inside each block from its full key list."""
    return [blk[i:i + size] for blk in blocks for i in range(0, len(blk), size)]
