"""What every backbone's runtime hands back and the helpers its loop shares.

`GenerationOutput` (images, codes, per-scale bits and traces, FLOPs, timings, the policy's stats),
`Timer` (wall-clock marks, CUDA events on a GPU), `new_generator` (the per-image sampling generator:
one function, so the fake-CUDA dry run stands generators in at one place for every backbone), and
`per_scale_values` (a knob given once or per scale).
"""
from __future__ import annotations

import dataclasses
import time
from typing import Optional

import torch


@dataclasses.dataclass
class GenerationOutput:
    images: Optional[torch.Tensor]          # (B, H, W, 3) uint8 RGB, None if decode=False
    summed_codes: torch.Tensor              # (B, d_vae, 1, H_lat, W_lat) before decode
    bits: list[Optional[torch.Tensor]]      # per scale (B, h, w, d) int64 on the transformer grid; None if no
                                            # image ran it, -1 in the rows of images that skipped it
    schedule: list[tuple[int, int]]
    trace: list[dict]                       # per scale: ran, executed tokens, keep fractions, entropy, ms, KV
                                            # bytes held and in use (of image 0's sub-batch; `image_traces`
                                            # has every image's)
    flops: dict                             # the batch's {"total", "text", "per_scale": [...]}
    timings_ms: dict                        # {"text", "ar", "decode", "per_scale": [...]}
    policy_stats: dict                      # the policy's stats; per-image decisions at batch > 1: {"per_image": [...]}
    token_entropy: list[Optional[torch.Tensor]]  # per scale (B, h*w) predictive entropy (NaN: that image skipped it)
    image_traces: list[list[dict]] = dataclasses.field(default_factory=list)  # per image: the trace of its sub-batch
    image_flops: list[dict] = dataclasses.field(default_factory=list)         # per image: its share of `flops`
    image_stats: list[dict] = dataclasses.field(default_factory=list)         # per image: its policy's stats
    no_effect_reasons: list[Optional[str]] = dataclasses.field(default_factory=list)  # per image: why its
                                            # policy changed nothing (every plan neutral), else None
    kv_bytes: list[dict] = dataclasses.field(default_factory=list)  # per scale, after it ran: the batch's KV


class Timer:
    """Wall-clock marks; CUDA events on GPU so nothing synchronises inside the loop."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks: list = []

    def mark(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self.marks.append(ev)
        else:
            self.marks.append(time.perf_counter())

    def intervals_ms(self) -> list[float]:
        if self.cuda:
            torch.cuda.synchronize()
            return [a.elapsed_time(b) for a, b in zip(self.marks, self.marks[1:])]
        return [(b - a) * 1e3 for a, b in zip(self.marks, self.marks[1:])]


def new_generator(device: torch.device, seed: int) -> torch.Generator:
    """The per-image sampling generator on `device`, seeded. One function so that the fake-CUDA dry
    run (`varbench.testing.fake_cuda`), where no CUDA generator can exist without a driver, can stand one in."""
    g = torch.Generator(device=device)
    g.manual_seed(int(seed))
    return g


def per_scale_values(v, n: int, name: str) -> list[float]:
    if isinstance(v, (int, float)):
        return [float(v)] * n
    v = [float(x) for x in v]
    if len(v) < n:
        raise ValueError(f"{name} has {len(v)} values but the schedule has {n} scales; give one per scale or a single number")
    return v[:n]
