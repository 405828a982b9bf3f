"""Analytic FLOPs of HART from what its runtime executed (a multiply-add counts 2), in the style of
`varbench.engine.flops` (same trace entries, same per-block counts):

  self-attention  qkv 2*rows*n_qkv*C*3C, scores + weighted sum 4*rows*n_q*n_kv*C, proj 2*rows*n_q*C^2
  FFN             (Llama: gate, up, down) 3 * 2*rows*n*C*hidden
  head            2*rows*n*C*V (stage 0: over every text position, as released) + its AdaLN 2*rows*C*2C
  next input      word embedding 2*B*n*Cvae*C (stages > 0); the shared phi conv on the P x P f_hat,
                  2*B*P^2*Cvae^2*9, after every stage but the last
  diffusion head  last stage: per sampling step over rows*L vectors (CFG: 2B*L, as released): input
                  projection, time MLP, condition projection, per residual block AdaLN (3W) + MLP
                  (2 W^2), the final AdaLN and projection; plus the discrete tokens' word embedding
  entropy signal  2*rows*n_ent*n_kv*C; KV selection 2*rows*n_sel*(C^2 + n_kv*C), as on Infinity
Per generation (`hart_text_flops`): the context projection 2*rows*T*D*C (and per-block `ada_lin`
where the preset has it). Norms, RoPE, softmax, bicubic/area resizes and the gumbel mixture of
`more_smooth` (2*B*n*V*Cvae per stage, under 1% of a stage) are not counted.

From plans alone (`hart_plan_trace`, no model run): the entries `HartState.step` records, for plans
whose shapes do not depend on signals, so a HART configuration's FLOPs are countable without weights
(experiments/flops_table.py; tests/engine/test_hart_runtime.py checks it against real generations).
"""
from __future__ import annotations

from varbench.engine.backbones.hart.sampling import DiffusionSchedule
from varbench.engine.flops import plan_trace, self_attention_flops


def diffusion_flops(cfg, vectors: int) -> float:
    """The residual diffusion head over `vectors` rows for all its sampling steps."""
    w, cc, c = cfg.diff_width, cfg.cvae, cfg.embed_dim
    per = 2 * cc * w + 2 * (256 * w + w * w) + 2 * c * w
    per += cfg.diff_depth * (2 * w * 3 * w + 2 * 2 * w * w)
    per += 2 * w * 2 * w + 2 * w * 2 * cc
    return float(DiffusionSchedule(cfg.num_sampling_steps).num_steps * vectors * per)


def hart_scale_flops(cfg, tr: dict) -> float:
    """One stage's FLOPs from its trace entry (0 for a skipped stage)."""
    if not tr.get("ran"):
        return 0.0
    c, hid, v = cfg.embed_dim, cfg.ffn_hidden, cfg.vocab_size
    rows, n, batch = tr["rows"], tr["tokens"], tr["batch"]
    total = 0.0
    for b in tr["blocks"]:
        if b["mode"] == "skip":
            continue
        total += self_attention_flops(rows, b, c)
        total += 3 * 2 * rows * b["ffn"] * c * hid
    total += 2 * rows * n * c * v + 2 * rows * c * 2 * c
    grid = tr["h"] * tr["w"]
    if tr["si"] > 0:
        total += 2 * batch * grid * cfg.cvae * c
    p = cfg.patch_nums[-1]
    if tr.get("diffusion"):
        total += diffusion_flops(cfg, rows * grid) + 2 * batch * grid * cfg.cvae * c
    else:
        total += 2 * batch * p * p * cfg.cvae * cfg.cvae * 9
    return float(total)


def hart_text_flops(cfg, rows: int) -> float:
    """Per generation: the context projection of every row (and `ada_lin` per block, where present)."""
    total = 2 * rows * cfg.context_token * cfg.context_dim * cfg.embed_dim
    if not cfg.disable_aln:
        total += 2 * rows * cfg.embed_dim * 6 * cfg.embed_dim * cfg.depth
    return float(total)


def hart_image_flops(cfg, trace: list[dict]) -> dict:
    """One image's share of a batch's FLOPs: every count is linear in the rows, so each stage
    counts for the image's own rows (2 with CFG, 1 after `drop_uncond`)."""
    def own(tr):
        if not tr["ran"]:
            return tr
        return {**tr, "rows": tr["rows"] // tr["batch"], "batch": 1}

    per_scale = [hart_scale_flops(cfg, own(tr)) for tr in trace]
    rows0 = trace[0]["rows"] // trace[0]["batch"] if trace and trace[0]["ran"] else 2
    text = hart_text_flops(cfg, rows0)
    return {"total": text + sum(per_scale), "text": text, "per_scale": per_scale}


def hart_plan_trace(cfg, plans, batch: int, cfg_rows: bool = True) -> list[dict]:
    """The trace `HartState.step` records for `plans` (one per stage of `cfg.patch_nums`), from the
    plans alone: `varbench.engine.flops.plan_trace`'s rule (pruned, skipped and budgeted blocks, KV
    growth, dropped uncond rows) on HART's stages, where stage 0 is the text context: it runs over
    `cfg.context_token` positions (the policy's 1x1 grid has 1) and appends that many to every block's
    K/V, and an attention-entropy request there measures one query (the last text position's). HART has
    no cross-attention (ca 0 whatever a plan's sublayers say) and no text tokens in the loop; the last
    stage, if it runs, runs the diffusion head. A stage-0 plan the runtime refuses is refused here."""
    pns = cfg.patch_nums
    if len(plans) != len(pns):
        raise ValueError(f"hart_plan_trace: {len(plans)} plans for {len(pns)} stages {pns}")
    p0 = plans[0]
    if not p0.run or p0.kv or p0.keep_residuals or any(bp.mode != "full" for bp in p0.blocks.values()):
        raise ValueError("HART's stage 0 is the text context (the prompt's tokens), not a token grid: a plan may not "
                         "skip, prune, budget or cache it; start the method at stage 1")
    sched = [(1, cfg.context_token)] + [(p, p) for p in pns[1:]]
    trace = plan_trace(sched, plans, cfg.depth, batch, cfg_rows, {2 * batch: 0, batch: 0})
    for tr in trace:
        tr["sublayers"] = ["sa", "ffn"]          # HartState's SUBLAYERS
        if tr["si"] == 0:
            tr["h"] = tr["w"] = 1
        if not tr["ran"]:
            continue
        tr["diffusion"] = tr["si"] == len(pns) - 1
        for b in tr["blocks"]:
            b["ca"] = 0
            if tr["si"] == 0 and b["ent_q"]:
                b["ent_q"] = 1
    return trace


def hart_plan_flops(cfg, plans, batch: int, cfg_rows: bool = True) -> dict:
    """The batch's FLOPs as `HartRuntime.generate` reports them (`out.flops`) for `plans`, from the
    plans alone: ``{"total", "text", "per_scale"}``."""
    trace = hart_plan_trace(cfg, plans, batch, cfg_rows)
    text = hart_text_flops(cfg, 2 * batch if cfg_rows else batch)
    per_scale = [hart_scale_flops(cfg, tr) for tr in trace]
    return {"total": text + sum(per_scale), "text": text, "per_scale": per_scale}
