"""The timed pass: warm-up discarded, synchronised repeats, median and p10/p90 per stage.

Runs separately from the image-writing pass, on one benchmark prompt, for each batch size.
Stage times come from the runtime (CUDA events on GPU, read once after the loop):
text encoding, the AR loop, VAE decode; total = their sum. Peak memory is CUDA's
max_memory_allocated (None on the CPU).
"""
from __future__ import annotations

import statistics
from typing import Callable

import torch


def _stats(xs: list[float]) -> dict:
    xs = sorted(xs)
    if not xs:
        return {"median": None, "p10": None, "p90": None}

    def q(p):
        if len(xs) == 1:
            return xs[0]
        k = (len(xs) - 1) * p
        lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
        return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)

    return {"median": statistics.median(xs), "p10": q(0.1), "p90": q(0.9)}


def timed_pass(generate: Callable[[int], object], batch_sizes, warmup: int, repeats: int,
               device: torch.device, progress=None, reference: Callable[[int], object] | None = None) -> dict:
    """`generate(bs)` runs one generation of `bs` images and returns a GenerationOutput.

    With `reference` (the baseline policy's generate), each timed repeat of the method is followed by
    one of the reference, interleaved, so both see the same machine state; the record then carries
    the in-process ratios under `by_batch[bs]["paired"]` (median reference / median method), the
    number that survives noisy or shared machines.
    """
    by_batch = {}
    for bs in batch_sizes:
        for _ in range(warmup):
            generate(bs)
            if reference is not None:
                reference(bs)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
        runs, ref_runs = [], []
        for _ in range(repeats):
            out = generate(bs)
            runs.append(out.timings_ms)
            if reference is not None:
                ref_runs.append(reference(bs).timings_ms)
            if progress is not None:
                progress.update(1)
        text = [r["text"] for r in runs]
        ar = [r["ar"] for r in runs]
        dec = [r["decode"] for r in runs]
        tot = [a + b + c for a, b, c in zip(text, ar, dec)]
        per_scale = [statistics.median(col) for col in zip(*[r["per_scale"] for r in runs])] if runs else []
        med_total = statistics.median(tot) if tot else None
        by_batch[str(bs)] = {
            "text_ms": _stats(text), "ar_ms": _stats(ar), "decode_ms": _stats(dec), "total_ms": _stats(tot),
            "images_per_s": (bs * 1e3 / med_total) if med_total else None,
            "peak_mem_bytes": torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
            "per_scale_ms": per_scale,
        }
        if ref_runs:
            ref_ar = statistics.median(r["ar"] for r in ref_runs)
            ref_tot = statistics.median(r["text"] + r["ar"] + r["decode"] for r in ref_runs)
            by_batch[str(bs)]["paired"] = {"reference_ar_ms": ref_ar, "reference_total_ms": ref_tot,
                                           "ar_speedup": ref_ar / statistics.median(ar),
                                           "e2e_speedup": ref_tot / med_total}
    return by_batch
