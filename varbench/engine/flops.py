"""Analytic FLOPs from what the runtime executed (a multiply-add counts 2).

Counted per scale from its trace entry (rows = 2B with CFG, executed tokens per block/sublayer):
  self-attention  qkv projection 2*rows*n_qkv*C*3C, scores and weighted sum 2*2*rows*n_q*n_kv*C,
                  output projection 2*rows*n_q*C^2
  cross-attention q projection 2*rows*n_q*C^2, scores and sum 2*2*n_q*(text tokens over rows)*C,
                  output projection 2*rows*n_q*C^2
  FFN             2*2*rows*n_q*C*hidden
  head            2*rows*L*C*(2d)      next-scale word embedding 2*B*L*d*C
  entropy signal  2*rows*n_ent*n_kv*C (the extra score pass for requested attention entropies)
  KV selection    2*rows*n_sel*(C^2 + n_kv*C) (a KV budget's raw queries and their scores, ScaleKV)
  sparse attention an attention plan (SparVAR) replaces n_q*n_kv by the (query, key) pairs it scores
                  (`attn_pairs`: kept keys per query group, or a block mask's allowed pairs); a
                  decision adds `attn_extra_pairs` at 2*rows*pairs*C (the column-sum score pass
                  over every key, and O_hat over the kept keys: scores + weighted sum)
Per generation (`text_flops`): the pooled SOS, the text projection for cross-attention and each
block's text K/V projection (computed once per generation by this runtime). Norms, RoPE,
softmax exponentials and AdaLN vectors are not counted: they are O(L*C), not O(L*C^2).
These are hardware-independent numbers CI can gate on.

All of the above is the **transformer only** (``flops.total``; the "text" part is the transformer's
own text-side projections, not the T5 encoder). The stages around it, the text encoder and the VAE
decoder, are counted in :mod:`varbench.engine.stage_flops`; :func:`with_end_to_end` adds them to an
image's work and ``flops.end_to_end`` = transformer + text encoder + VAE decode. The decoder is
~8.6% of the 2B baseline at 1024², so a method's end-to-end ratio is lower than its transformer one.
"""
from __future__ import annotations

from varbench.core.aliases import moved_names


def self_attention_flops(rows: int, b: dict, c: int) -> int:
    """One block's self-attention from its trace counts (shared by every backbone): the qkv projection,
    scores + weighted sum, the output projection, the entropy signal's extra score pass, and a KV
    budget's selection (raw q projection of its queries and their scores over the cache)."""
    pairs = b.get("attn_pairs", b["sa"] * b["kv"])
    return (2 * rows * b["qkv"] * c * 3 * c + 4 * rows * pairs * c + 2 * rows * b["sa"] * c * c
            + 2 * rows * b.get("attn_extra_pairs", 0) * c
            + 2 * rows * b.get("ent_q", 0) * b["kv"] * c + 2 * rows * b.get("kv_sel_q", 0) * (c * c + b["kv"] * c))


def plan_trace(schedule, plans, depth: int, batch: int, cfg_rows: bool, text_tokens: dict[int, int]) -> list[dict]:
    """The trace the runtime records for `plans`, derived from the plans alone (no model run).

    Valid for plans whose shapes do not depend on signals (static `n_keep`); lets CI count the
    FLOPs of a 2B/8B configuration without running it. `text_tokens` maps a row count to the text
    tokens summed over those rows. `tests/engine/test_runtime.py` checks it against real runtime traces.
    """
    from varbench.engine.plan import is_neutral

    rows_full = 2 * batch if cfg_rows else batch
    rows = rows_full
    kv = [0] * depth
    remembered: dict[int, int] = {}   # block -> keys per query group its attention memory holds
    out = []
    for si, ((h, w), plan) in enumerate(zip(schedule, plans)):
        n = h * w
        if not plan.run:
            out.append({"si": si, "h": h, "w": w, "ran": False, "rows": 0, "batch": batch, "tokens": n, "blocks": [],
                        "neutral": False})
            continue
        if plan.drop_uncond and cfg_rows:
            rows = batch
        blocks = plan_block_counts(plan, n, kv, remembered, depth)
        out.append({"si": si, "h": h, "w": w, "ran": True, "rows": rows, "batch": batch, "tokens": n,
                    "text_tokens": text_tokens[rows], "blocks": blocks,
                    "neutral": is_neutral(plan) and not any(b.get("kv_evicted") for b in blocks)})
    return out


def plan_block_counts(plan, n: int, kv: list[int], remembered: dict[int, int], depth: int) -> list[dict]:
    """One scale's per-block trace counts under `plan` (n tokens), as the runtime records them;
    `kv` (keys each block holds before the scale) and `remembered` (keys per query group of each
    block's attention memory) are advanced in place. `plan_trace` per scale; a padded batch's
    per-image counts (`varbench.engine.padded_batch`)."""
    blocks = []
    for bi in range(depth):
        bp = plan.blocks.get(bi)
        mode = bp.mode if bp else "full"
        c = {"mode": mode, "sa": 0, "kv": kv[bi], "qkv": 0, "ca": 0, "ffn": 0, "ent_q": 0}
        if mode != "skip":
            k = {sub: (bp.n_keep if (mode == "prune" and sub in bp.sublayers) else n) for sub in ("sa", "ca", "ffn")}
            c.update(k)
            c["qkv"] = k["sa"] if (mode == "prune" and bp.prune_kv) else n
            kv[bi] += c["qkv"]
            c["kv"] = kv[bi]
            if bi in plan.attention_entropy_for:
                q = c["sa"]
                c["ent_q"] = q if plan.attention_entropy_queries is None else min(q, plan.attention_entropy_queries)
            ap = plan.attn.get(bi)
            if ap is not None and ap.kind != "dense":
                c.update(attention_plan_pairs(ap, n, kv[bi], remembered.get(bi, 0)))
                if ap.kind == "decide":
                    remembered[bi] = ap.n_keys
                elif ap.kind == "indexed" and ap.remember:
                    remembered[bi] = c["attn_pairs"] // n
            kb = plan.kv.get(bi)
            if kb is not None:   # as GenState.apply_kv_budget decides it
                c["kv_kept"] = kv[bi]
                if kv[bi] > kb.n_keep:
                    if kb.selector is not None:
                        c["kv_sel_q"] = kb.sel_queries
                    kv[bi] = c["kv_kept"] = kb.n_keep
                    c["kv_evicted"] = True
        blocks.append(c)
    return blocks


def attention_plan_pairs(ap, n: int, length: int, remembered: int) -> dict:
    """Trace counts of an attention plan over n queries and `length` cached keys, as
    `varbench.engine.sparse_attention` records them (`remembered`: keys per group of the block's memory)."""
    if ap.kind == "decide":
        return {"attn_pairs": n * length, "attn_extra_pairs": n * length + 2 * n * ap.n_keys}
    if ap.kind == "indexed":
        return {"attn_pairs": n * (remembered + (0 if ap.local is None else ap.local.shape[-1]))}
    if ap.kind == "block_mask":
        from varbench.engine.sparse_attention import mask_pairs

        return {"attn_pairs": ap.pairs if ap.pairs is not None else mask_pairs(ap.block_mask, ap.block, n, length)}
    return {}


def image_work(flops: dict, trace: list[dict]) -> dict:
    """One image's work, for its trace row: its FLOPs (`GenerationOutput.image_flops`: each scale's
    count divided by the images of the (sub-)batch that ran it, text tokens averaged over the batch;
    exact per image with per-image plans or ``runtime.batch_size=1``), executed token-layers (per
    block the mean over its sublayers of the tokens it ran, summed over blocks and run scales) and
    the dense count a full forward would execute."""
    executed = sum((b["sa"] + b["ca"] + b["ffn"]) / 3 for tr in trace if tr["ran"]
                   for b in tr["blocks"] if b["mode"] != "skip")
    depth = max((len(tr["blocks"]) for tr in trace if tr["ran"]), default=0)
    dense = sum(tr["tokens"] for tr in trace) * depth
    return {"flops": {"total": flops["total"], "text": flops["text"], "per_scale": list(flops["per_scale"])},
            "executed_tokens": float(executed), "dense_tokens": int(dense)}


def with_end_to_end(work: dict, text_encoder: float | None, vae_decode: float | None) -> dict:
    """``work`` (from :func:`image_work`) with its ``flops`` block extended by the stages around the
    transformer (:mod:`varbench.engine.stage_flops`, per image): ``text_encoder``, ``vae_decode`` and
    ``end_to_end`` = transformer total + both (None when either is not countable)."""
    f = work["flops"]
    f["text_encoder"], f["vae_decode"] = text_encoder, vae_decode
    f["end_to_end"] = None if text_encoder is None or vae_decode is None else f["total"] + text_encoder + vae_decode
    return work


def end_to_end_summary(rows: list[dict]) -> dict:
    """Means over trace rows' ``work.flops`` of ``text_encoder``, ``vae_decode`` and ``end_to_end``
    (None when any row lacks one: rows stored before these counts existed, or an uncountable
    stage), and the spread of per-image ``end_to_end``."""
    out = {}
    for key in ("text_encoder", "vae_decode", "end_to_end"):
        vals = [r["work"]["flops"].get(key) for r in rows]
        out[key] = None if not vals or any(v is None for v in vals) else sum(vals) / len(vals)
    e2e = [r["work"]["flops"]["end_to_end"] for r in rows] if out["end_to_end"] is not None else []
    out["end_to_end_per_image"] = _spread(e2e)
    return out


def _spread(values: list[float]) -> dict:
    import statistics

    if not values:
        return {"n": 0, "mean": None, "std": None, "min": None, "max": None}
    return {"n": len(values), "mean": statistics.fmean(values),
            "std": statistics.stdev(values) if len(values) > 1 else 0.0, "min": min(values), "max": max(values)}


def work_summary(rows: list[dict]) -> dict:
    """The record's ``flops`` and ``work`` blocks from per-image trace rows (see
    :func:`image_work`): means over the images, with the spread (n, mean, std, min, max) of
    per-image FLOPs, executed token-layers and keep fraction. Adaptive methods (NOVA, ToProVAR,
    SkipVAR) do different work per prompt; the spread says how much."""
    rows = [r for r in rows if r.get("work")]
    if not rows:
        return {"flops": None, "work": None}
    totals = [r["work"]["flops"]["total"] for r in rows]
    texts = [r["work"]["flops"]["text"] for r in rows]
    per_scale = [sum(col) / len(rows) for col in zip(*[r["work"]["flops"]["per_scale"] for r in rows])]
    executed = [r["work"]["executed_tokens"] for r in rows]
    keep = [r["work"]["executed_tokens"] / r["work"]["dense_tokens"] for r in rows if r["work"]["dense_tokens"]]
    flops = {"total": sum(totals) / len(rows), "text": sum(texts) / len(rows), "ar": sum(per_scale),
             "per_scale": per_scale, "per_image": _spread(totals)}
    flops.update(end_to_end_summary(rows))   # + text encoder, VAE decode, end to end
    if any("padding_flops" in r["work"] for r in rows):   # what a padded batch ran beyond the images' own work
        flops["padding"] = sum(r["work"].get("padding_flops", 0.0) for r in rows) / len(rows)
    work = {"executed_tokens": _spread(executed), "dense_tokens": rows[0]["work"]["dense_tokens"],
            "keep_fraction": _spread(keep)}
    return {"flops": flops, "work": work}


#: names that moved into a backbone's folder, still read from here (with a DeprecationWarning)
__getattr__ = moved_names(__name__)
