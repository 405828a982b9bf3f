"""Analytic FLOPs of what Infinity's runtime executed, from its trace (a multiply-add counts 2).

Per scale (`scale_flops`): every block's self-attention (`varbench.engine.flops.self_attention_flops`,
shared by every backbone), cross-attention over the prompt's tokens, the FFN, the head, and the
next-scale word embedding; per generation (`text_flops`): the pooled SOS, the text projection and
each block's text K/V; per image (`image_flops`): its share of both. `varbench.engine.flops` states
what is and is not counted.
"""
from __future__ import annotations

from varbench.engine.flops import self_attention_flops


def scale_flops(cfg, tr: dict) -> float:
    """FLOPs of one scale from its trace entry (0 for a skipped scale)."""
    if not tr.get("ran"):
        return 0.0
    c, hid, d = cfg.embed_dim, cfg.ffn_hidden, cfg.codebook_dim
    rows, n = tr["rows"], tr["tokens"]
    text = tr["text_tokens"]
    total = 0.0
    for b in tr["blocks"]:
        if b["mode"] == "skip":
            continue
        total += self_attention_flops(rows, b, c)
        total += 2 * rows * b["ca"] * c * c * 2 + 4 * b["ca"] * text * c
        total += 4 * rows * b["ffn"] * c * hid
    total += 2 * rows * n * c * 2 * d
    if tr["si"] > 0:
        total += 2 * tr["batch"] * n * d * c
    return float(total)


def text_flops(cfg, text_tokens: int, rows: int) -> float:
    """Per-generation text-side FLOPs over `text_tokens` tokens summed over the rows."""
    c, ct5 = cfg.embed_dim, cfg.text_channels
    pool = 2 * text_tokens * ct5 * 2 * c + 2 * rows * c * c
    proj = 2 * text_tokens * (ct5 * c + c * c)
    per_block_kv = 2 * text_tokens * c * 2 * c * cfg.depth
    return float(pool + proj + per_block_kv)


def image_flops(cfg, trace: list[dict], tokens: tuple[int, int]) -> dict:
    """One image's FLOPs: every count is linear in the rows except cross-attention's, which goes with
    each row's text length, so an image's share is its scale entries counted for its own rows and
    its own prompt's text tokens (`tokens`: cond row, uncond row). They sum to the batch's count
    (`GenerationOutput.image_flops`)."""
    cond, uncond = tokens

    def own(tr):
        if not tr["ran"]:
            return tr
        both = tr["rows"] == 2 * tr["batch"]
        return {**tr, "rows": 2 if both else 1, "batch": 1, "text_tokens": cond + uncond if both else cond}

    per_scale = [scale_flops(cfg, own(tr)) for tr in trace]
    rows0 = 2 if trace and trace[0]["rows"] == 2 * trace[0]["batch"] else 1
    text = text_flops(cfg, cond + (uncond if rows0 == 2 else 0), rows0)
    return {"total": text + sum(per_scale), "text": text, "per_scale": per_scale}
