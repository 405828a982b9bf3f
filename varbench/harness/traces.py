"""Per-image trace rows: decoded from a generation's output, and copied into the entry.

A trace row (:class:`varbench.harness.schema.TraceRow`) says, per scale, what the image's (sub-)batch
ran (``keep_frac`` per layer, ``ran``), whether its policy's plan was neutral, its mean entropy,
its timing and its share of the KV cache, plus its FLOPs and executed tokens
(:func:`varbench.engine.flops.image_work`), its memory (:func:`varbench.engine.memory.image_memory`)
and its policy's stats. The job writes one row per generated image into the image store's
``traces.jsonl`` (:func:`trace_row`, before the image is committed) and, when it assembles the
record, the latest row of every image of the benchmark into the entry (:func:`entry_traces`).
"""
from __future__ import annotations

import json
from typing import Iterable

from varbench.core.errors import FixableError
from varbench.core.jsonio import read_jsonl
from varbench.engine.flops import image_work, with_end_to_end
from varbench.engine.memory import image_memory


class TraceCountError(FixableError):
    """The trace rows of an entry do not cover every one of its images."""


def trace_row(out, b: int, p: int, s: int, method: str, stages: dict | None = None, peak: dict | None = None) -> dict:
    """Image b's trace row: per scale what its (sub-)batch ran, whether its plan was neutral, its
    entropy, and its own FLOPs and policy stats (per-image decisions give every image its own);
    ``out``: the batch's :class:`varbench.engine.generation.GenerationOutput`; ``p``, ``s``: the
    image's prompt and sample index; ``stages``: its text-encoder and VAE-decode FLOPs
    (:func:`varbench.engine.stage_flops.stage_flops`) for the end-to-end count;
    ``no_effect_reason``: why its policy changed nothing, when every plan was neutral
    (:mod:`varbench.engine.effect`); ``peak``: the generation call's measured peak memory
    (:func:`varbench.engine.memory.measure_peak`, the whole batch's), None where not measured.
    Per scale the image's share of its (sub-)batch's KV cache (bytes held and in use: the
    (sub-)batch's divided by its images; exact, every row belongs to one image)."""
    scales = []
    for si, tr in enumerate(out.image_traces[b]):
        keep = None
        if tr["ran"] and any(blk["mode"] != "full" for blk in tr["blocks"]):
            n = tr["tokens"]
            keep = [0.0 if blk["mode"] == "skip" else (blk["sa"] + blk["ca"] + blk["ffn"]) / (3 * n) for blk in tr["blocks"]]
        ent = out.token_entropy[si]
        share = lambda key: None if tr.get(key) is None else tr[key] // tr["batch"]  # noqa: E731
        scales.append({"si": si, "h": tr["h"], "w": tr["w"], "ran": tr["ran"], "keep_frac": keep,
                       "entropy_mean": None if ent is None or not tr["ran"] else float(ent[b].mean()), "ms": tr.get("ms"),
                       "plan_neutral": tr.get("neutral"),
                       "kv_bytes_allocated": share("kv_bytes_allocated"), "kv_bytes_used": share("kv_bytes_used"),
                       "attn_memory_bytes": share("attn_memory_bytes")})
    return {"prompt_index": p, "sample_index": s, "method": method, "scales": scales,
            "resolution": list(out.images.shape[1:3]), "batch": len(out.image_traces),
            # transformer FLOPs as before, plus the text encoder, VAE decode and end to end
            "work": {**with_end_to_end(image_work(out.image_flops[b], out.image_traces[b]),
                                       (stages or {}).get("text_encoder"), (stages or {}).get("vae_decode")),
                     # a padded batch (varbench/engine/padded_batch.py): its padding's FLOPs, the image's share
                     **({"padding_flops": out.flops["padding"] / len(out.image_traces)} if "padding" in out.flops else {})},
            "stats": _jsonable(out.image_stats[b]), "no_effect_reason": out.no_effect_reasons[b],
            "memory": image_memory(scales, peak)}


def _jsonable(obj):
    """``obj`` as plain JSON types (tensors and arrays as lists, anything else unknown as its str)."""
    return json.loads(json.dumps(obj, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o)))


def entry_traces(store, entry, keys: Iterable[tuple[int, int]], force: bool = False) -> list[dict]:
    """The latest trace row of every image ``keys`` (``(prompt_index, sample_index)``: the whole
    benchmark's) from the image store ``store``'s ``traces.jsonl``, copied into ``entry``'s
    (a :class:`varbench.harness.records.RunEntry`) ``traces.jsonl``; the rows, sorted.

    The copy is one atomic write, redone whenever the entry's file differs (a copy cut short by an
    older varbench, a kill or a full disk is replaced, never kept), and the store must hold a row
    for every image: short of that, :class:`TraceCountError` stops the job before DONE (keep-ratio
    heatmaps, entropy figures and the W&B per-scale table would silently read fewer images).
    ``force``: rewrite the entry's file even if the entry is finished (``runtime.force``)."""
    path = store.dir / "traces.jsonl"
    wanted = set(keys)
    latest = {}
    for row in (read_jsonl(path) if path.exists() else []):
        k = (row["prompt_index"], row["sample_index"])
        if k in wanted:
            latest[k] = row
    rows = [latest[k] for k in sorted(latest)]
    if len(rows) != len(wanted):
        lacking = sorted(wanted - set(latest))
        shown = ", ".join(f"prompt {p} sample {s}" for p, s in lacking[:5]) + (" ..." if len(lacking) > 5 else "")
        raise TraceCountError(
            f"{path} holds trace rows for {len(rows)} of the {len(wanted)} images of this entry (none for {shown}); "
            f"the entry is not marked done. Fix: delete those images' lines from {store.index_path} (a relaunch "
            f"regenerates them with their traces), or the store folder {store.dir}")
    if rows:
        current = read_jsonl(entry.traces_path) if entry.traces_path.exists() else None
        if current != rows:
            entry.write_traces(rows, force=force)
        if len(read_jsonl(entry.traces_path)) != len(rows):  # read back: what DONE will seal
            raise TraceCountError(f"{entry.traces_path} does not hold the {len(rows)} rows just written; "
                                  "relaunch the job (the copy is redone)")
    return rows
