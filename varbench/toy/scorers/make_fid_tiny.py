"""Write the tiny random FID feature extractor: `fid_tiny_inception.pt`.

    python varbench/toy/scorers/make_fid_tiny.py

What it is for: `varbench/conf/evaluator/fid_tiny.yaml` runs the real FID code path (clean-fid's
resize, the TorchScript's `layers` module on (x - 128) / 128, the Fréchet distance) in smoke runs and
CI, where the 92 MB `inception-2015-12-05.pt` cannot exist. Same interface as that file: a TorchScript
module with a `layers` submodule mapping (n, 3, 299, 299) to (n, d) features; here d = 8 and the weights
are random (seed 0), so its FIDs mean nothing; only the plumbing is real.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

OUT = Path(__file__).resolve().parent / "fid_tiny_inception.pt"


class TinyInception(nn.Module):
    """`layers`: a strided conv, ReLU, global average pool, flatten -> 8 features."""

    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(nn.Conv2d(3, 8, kernel_size=13, stride=13), nn.ReLU(),
                                    nn.AdaptiveAvgPool2d(1), nn.Flatten())

    def forward(self, x):
        return self.layers(x)


def build() -> torch.jit.ScriptModule:
    torch.manual_seed(0)
    return torch.jit.script(TinyInception().eval())


if __name__ == "__main__":
    build().save(str(OUT))
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")
