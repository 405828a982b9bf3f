"""How a job's images are split into shards and batches, so that every way of running it (whole,
sharded, resumed, on a subset of the prompts) puts each image in the same batch.

Batched forwards are not bit-identical across batch compositions: a matmul over 2 rows may round
differently from one over 1 (measured on this CPU at width 512, fp32: 1-3 sampled bits of the last
two scales flipped in 2 of 8 images, up to 16/255 per pixel, depending on the batch companions).
So an image's bits depend on which images shared its batch, and varbench fixes that set:

* a *block* is ``block_prompts`` consecutive prompts of the benchmark by their stable index
  (block ``b`` holds prompts ``b*P .. b*P+P-1`` of the full prompt file, with all their samples);
* generation batches (``runtime.batch_size`` images, which is part of the image store's key) are
  cut inside each block from the block's full key list (:func:`generation_batches`); a job
  generates every batch that holds an image it lacks, whole, and stores only the images it lacks
  (a prefix ``benchmark.limit`` or a resumed job computes at most one batch of companions more,
  a scattered selection such as ``limit_per_tag`` up to ``batch_size - 1`` per image: use
  ``runtime.batch_size=1`` for small scattered subsets);
* scoring batches (:data:`varbench.harness.scoring.SCORE_BATCH`) are cut inside each block from the job's
  own keys (:func:`batches`): a sharded, a resumed and a whole run score every image in the same
  company, so their scores are equal bit for bit;
* shard ``i/n`` takes every ``n``-th of the job's blocks, starting at ``i``.
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
    """Prompts per block: enough for the largest batch."""
    return max(1, math.ceil(max(batch_sizes) / max(1, samples_per_prompt)))


def key_blocks(items: Sequence[Any], samples_per_prompt: int, prompts_per_block: int) -> list[list]:
    """``[[(item, sample), ...], ...]``: the job's keys grouped by the block of each prompt's stable
    index (``item.index // prompts_per_block``), blocks in order; empty blocks are left out."""
    groups: dict[int, list] = {}
    for it in items:
        groups.setdefault(int(it.index) // prompts_per_block, []).extend((it, s) for s in range(samples_per_prompt))
    return [groups[b] for b in sorted(groups)]


def batches(blocks: Sequence[list], size: int) -> list[list]:
    """Batches of at most ``size`` keys, cut inside each block from its key list."""
    return [blk[i:i + size] for blk in blocks for i in range(0, len(blk), size)]


def generation_batches(blocks: Sequence[list], all_items: Sequence[Any], samples_per_prompt: int,
                       prompts_per_block: int, size: int) -> list[list]:
    """The generation batches that hold the keys of ``blocks``: each block's *full* key list (every
    prompt of ``all_items`` in that block, all samples) cut into batches of ``size``; only the
    batches holding at least one key of ``blocks`` are returned."""
    by_block: dict[int, list] = {}
    for it in all_items:
        by_block.setdefault(int(it.index) // prompts_per_block, []).append(it)
    out = []
    for blk in blocks:
        b = int(blk[0][0].index) // prompts_per_block
        mine = {(int(it.index), s) for it, s in blk}
        full = [(it, s) for it in sorted(by_block[b], key=lambda it: int(it.index)) for s in range(samples_per_prompt)]
        out += [batch for batch in batches([full], size) if any((int(it.index), s) in mine for it, s in batch)]
    return out
