"""Per-image seeds: which generator seed image (prompt p, sample s) of a run with base seed b uses.

Rule (``SEED_RULE``): ``numpy.random.SeedSequence(entropy=b, spawn_key=(p, s))``, its first
64-bit state word with the top bit cleared (torch generators take any value in [0, 2**63)).

Why this rule:
* independent of batching, sharding, limits and order: the seed depends only on (b, p, s);
* different base seeds never share images: SeedSequence hashes (entropy, spawn_key) with a
  well-mixed function, so seed 1's image (p, s) is not seed 0's image (p, s+1) as it was under
  the earlier ``b + 1000*p + s`` (collisions need a 63-bit hash collision);
* the rule is numpy's documented mechanism for independent streams, reproducible anywhere.

``SEED_RULE_VERSION`` is part of the image store's key (:func:`varbench.core.hashing.generation_key`), so
images made under another rule are never reused as if they had these seeds.
"""
from __future__ import annotations

import numpy as np

SEED_RULE = "SeedSequence(entropy=base, spawn_key=(prompt_index, sample_index)).generate_state(1, uint64)[0] & (2**63-1)"
SEED_RULE_VERSION = 2   # 1 was base + 1000*prompt_index + sample_index


def image_seed(base: int, prompt_index: int, sample_index: int) -> int:
    """The generator seed of image (prompt_index, sample_index) under base seed ``base``."""
    if int(base) < 0 or int(prompt_index) < 0 or int(sample_index) < 0:
        raise ValueError(f"seeds need non-negative base/prompt/sample indices, got {base}, {prompt_index}, {sample_index}")
    ss = np.random.SeedSequence(entropy=int(base), spawn_key=(int(prompt_index), int(sample_index)))
    return int(ss.generate_state(1, dtype=np.uint64)[0]) & (2**63 - 1)
