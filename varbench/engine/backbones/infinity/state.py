"""The state of one generation and the scale step that advances it.

    state = GenState(rt, ctx, text, negative, schedule, h_div_w, seeds)
    signals = state.step(si, plan, cfg, tau, top_k, top_p)      # once per scale, in order

A `GenState` holds everything a generation accumulates: the KV cache (`varbench.engine.kv_cache.KVCache`), the summed codes,
the residual caches of scales that kept them, the per-image generators, the per-scale bits,
entropies and trace, and the per-block constants of its rows (text, AdaLN). Its `step` runs one
scale: the blocks under the plan, the head, guidance, sampling per image, and the accumulation of
the sampled codes; it returns the `ScaleSignals` the policy observes.

Inside a step, a full block takes the lean path (`GenState.full_block`, `varbench.engine.backbones.infinity.block_step`);
a block under a plan (pruned, keeping residuals, asked for attention entropy) takes
`varbench.engine.backbones.infinity.pruned.planned_block`, which computes its full sublayers with the same ops, so a
neutral plan reproduces the baseline bit for bit. In graph mode (`graphs` set, by the runtime) the
device work of a step (`core`) is captured and replayed by `varbench.engine.graphs.StepGraphs`.

Design rule: `core` reads no GPU value on the host and every shape in it follows from the
schedule and the plan, so it can be captured as a CUDA graph. Host reads happen between steps
(the policy's observe) and after the loop (traces).

Per-image decisions split a state into sub-batches (`split`, `varbench.engine.batch_split`): the
parts view the parent's cache rows instead of copying them.
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import torch
import torch.nn.functional as F

from varbench.engine import generation
from varbench.engine.backbones.infinity import pruned
from varbench.engine.backbones.infinity.block_step import BlockConsts, modulated_norm
from varbench.engine.backbones.infinity.bsq_vae import bits_to_codes, patchify_codes, unpatchify_bits
from varbench.engine.backbones.infinity.model import CrossAttnBlock, key_runs
from varbench.engine.backbones.infinity.sampling import bit_entropy, guided_logits, sample_bits
from varbench.engine.batch_split import image_rows, split_residuals, take_rows
from varbench.engine.kv_cache import KVCache, apply_kv_budget, kv_staging_capacity
from varbench.engine.plan import BlockPlan, GenerationContext, KVBudget, ScalePlan, ScaleSignals, is_neutral
from varbench.engine.sparse_attention import AttnMemory, check_attention_plans
from varbench.engine.text import TextBatch

_FULL = BlockPlan()


@dataclasses.dataclass
class StepOut:
    """What one scale step produced (in graph mode: the captured step's static tensors)."""

    logits: torch.Tensor                 # (rows, n, 2d) head output
    guided: torch.Tensor                 # (B, n, 2d) tempered, guided logits
    bits: torch.Tensor                   # (B, h, w, d)
    entropy: torch.Tensor                # (B, n)
    attn_ent: dict
    attn_idx: dict
    counts: list                         # per block executed tokens (host ints)
    residual_store: Optional[dict]
    attn_memory: dict = dataclasses.field(default_factory=dict)   # {block: AttnMemory} this step wrote
    residual_change: dict = dataclasses.field(default_factory=dict)   # (first, last) -> (rows, n) fp32


def _condition(rt, text: TextBatch, negative: Optional[TextBatch], cfg_rows: bool):
    """Normalised text for cross-attention, the pooled SOS/condition, and the shared AdaLN."""
    m = rt.model
    feats, mask = text.features, text.mask
    if cfg_rows:
        if negative is not None:
            un_f, un_m = negative.features, negative.mask
            if un_f.shape[0] == 1 and feats.shape[0] > 1:
                un_f, un_m = un_f.expand(feats.shape[0], -1, -1), un_m.expand(feats.shape[0], -1)
        else:
            # the learned placeholder replaces the prompt's tokens, same length as the prompt
            un_f = m.cfg_uncond[: feats.shape[1]].to(feats.dtype).unsqueeze(0).expand(feats.shape[0], -1, -1) * mask.unsqueeze(-1)
            un_m = mask
        lmax = max(feats.shape[1], un_f.shape[1])
        feats = torch.cat([F.pad(feats, (0, 0, 0, lmax - feats.shape[1])), F.pad(un_f, (0, 0, 0, lmax - un_f.shape[1]))])
        mask = torch.cat([F.pad(mask, (0, lmax - mask.shape[1])), F.pad(un_m, (0, lmax - un_m.shape[1]))])
    feats = m.text_norm(feats)
    cond = m.text_proj_for_sos(feats, mask, rt.ca_bf16)
    ca_text = m.text_proj_for_ca(feats)
    shared_gss = m.shared_ada_lin(cond.float()).float()
    return ca_text, mask, cond, shared_gss


class GenState:
    """Mutable state of one generation: residual stream input, KV cache, codes, residual caches.

    `rt` is the `InfinityRuntime` (model, dtype, device, RoPE tables, fallbacks); `ctx` the
    generation's context; `negative` the negative prompt's text or None (the learned placeholder).
    `graphs` is None (eager) or the `varbench.engine.graphs.StepGraphs` that capture this state's
    steps; the runtime sets it on the whole-batch states it keeps for graph mode."""

    #: per-image plans of different shapes may share one padded step (`varbench.engine.padded_batch`)
    pads_per_image_plans = True

    def __init__(self, rt, ctx: GenerationContext, text: TextBatch, negative: Optional[TextBatch],
                 sched: list[tuple[int, int]], h_div_w: float, seeds: Sequence[int],
                 kv_capacity: Optional[Sequence[int]] = None):
        """`kv_capacity`: per-block KV capacities between scales (`Policy.kv_capacity`), with a staging
        buffer for the scales that overflow them (`KVCache`); None: the whole schedule, no staging."""
        self.rt, self.m, self.ctx, self.sched = rt, rt.model, ctx, sched
        self.batch = ctx.batch
        self.rows = self.rows0 = ctx.rows
        self.ca_text, self.ca_mask, self.cond, self.shared_gss = _condition(rt, text, negative, ctx.cfg_rows)
        self.blocks: list[CrossAttnBlock] = self.m.blocks
        self._build_text_consts()
        self.kv_capacity = None if kv_capacity is None else [int(c) for c in kv_capacity]
        self.kv = KVCache(len(self.blocks), sum(h * w for h, w in sched) if kv_capacity is None else self.kv_capacity,
                          kv_staging_capacity(self.kv_capacity, sched))
        self.kv_appended: Optional[torch.Tensor] = None   # set by a planned block: grid positions it appended
        self.kv_dtype = torch.float32 if rt.dtype == torch.float32 else torch.bfloat16
        self.rope = [rt.rope_qkv(hw, h_div_w) for hw in sched]
        self.patch = 2 if rt.cfg.patchify else 1
        hl, wl = sched[-1]
        self.latent_size = (1, hl * self.patch, wl * self.patch)
        d_vae = rt.cfg.vae_codebook_dim
        self.summed_codes = torch.zeros(self.batch, d_vae, *self.latent_size, device=rt.device)
        self.generators = [generation.new_generator(rt.device, s) for s in seeds]
        self.residuals: dict[int, dict[tuple[int, str], torch.Tensor]] = {}
        #: per block, what its attention plans remembered (`varbench.engine.sparse_attention.AttnMemory`)
        self.attn_memory: dict[int, AttnMemory] = {}
        self.attn_written: dict[int, AttnMemory] = {}   # filled by the step in flight
        self.bits: list[Optional[torch.Tensor]] = []
        self.entropies: list[Optional[torch.Tensor]] = []
        self.trace: list[dict] = []
        #: per scale, after it ran: {"allocated", "used"} bytes of this state's KV cache (`KVCache.nbytes`)
        self.kv_bytes: list[dict[str, int]] = []
        self.dropped_uncond = False
        self.consts_full = self.consts
        self.h_div_w = h_div_w
        self.graphs = None                     # graph mode: this state's StepGraphs (varbench.engine.graphs)

    def _build_text_consts(self, row_tokens: Optional[list[int]] = None) -> None:
        """Per-block constants of this state's rows. Host reads happen here, once, before the loop:
        text tokens per row (FLOPs, text-length runs), unless `row_tokens` already gives them."""
        mask = self.ca_mask
        self.row_tokens = mask.sum(1).tolist() if row_tokens is None else row_tokens
        self.text_tokens = {self.rows0: sum(self.row_tokens), self.batch: sum(self.row_tokens[: self.batch])}
        runs = key_runs(mask, self.row_tokens)
        self.consts = [BlockConsts.build(b, self.shared_gss, self.ca_text, mask, runs, self.rt.ca_bf16) for b in self.blocks]

    def image_text_tokens(self, i: int) -> tuple[int, int]:
        """Text tokens of image i's conditional row and of its unconditional row (0 without CFG)."""
        return self.row_tokens[i], (self.row_tokens[self.batch + i] if self.rows0 == 2 * self.batch else 0)

    # -------------------------------------------------------------- sub-batches and reuse
    def split(self, parts: Sequence[Sequence[int]]) -> list["GenState"]:
        """States for `parts` (lists of image positions that together make this batch), to continue
        apart (per-image decisions, `varbench.engine.batch_split`). The big tensors are not copied: the KV
        cache's and the residual caches' rows are permuted in place so that each part's rows ([cond;
        uncond] of its images) lie together, and each part's state views its slice (one block's
        buffer is copied at a time, so a split costs no second cache). This state is spent after.
        The parts run eagerly: graph mode captures whole-batch states only, whose tensors live
        across generations."""
        parts = [list(p) for p in parts]
        kvs, residuals = self.kv.split(parts, self.batch), split_residuals(self.residuals, parts, self.batch)
        return [self._part(p, kv, res) for p, kv, res in zip(parts, kvs, residuals)]

    def _part(self, images: list[int], kv: KVCache, residuals: dict) -> "GenState":
        """The state of `images`, over its views of the split caches."""
        sub = object.__new__(GenState)
        sub.__dict__.update(self.__dict__)   # rt, model, schedule, RoPE tables, latent size: shared
        b, B = len(images), self.batch
        idx = torch.tensor(images, device=self.rt.device)
        sub.ctx = dataclasses.replace(self.ctx, batch=b)
        sub.batch, sub.rows0 = b, len(image_rows(images, B, self.rows0))
        sub.rows = b if self.dropped_uncond else sub.rows0
        sub.ca_text, sub.ca_mask, sub.cond, sub.shared_gss = (take_rows(t, images, B) for t in
                                                              (self.ca_text, self.ca_mask, self.cond, self.shared_gss))
        sub._build_text_consts([self.row_tokens[r] for r in image_rows(images, B, self.rows0)])
        sub.consts_full = sub.consts
        if self.dropped_uncond:
            sub.consts = [bc.first_rows(b) for bc in sub.consts]
        sub.kv, sub.residuals = kv, residuals
        sub.attn_memory = {bi: m.take_rows(image_rows(images, B, self.rows)) for bi, m in self.attn_memory.items()}
        sub.attn_written = {}
        sub.summed_codes = self.summed_codes.index_select(0, idx)
        sub.generators = [self.generators[i] for i in images]   # each image keeps drawing from its own
        sub.bits = [None if t is None else t.index_select(0, idx) for t in self.bits]
        sub.entropies = [None if t is None else t.index_select(0, idx) for t in self.entropies]
        sub.trace = list(self.trace)          # the entries so far are shared (they ran for these images too)
        sub.kv_bytes = list(self.kv_bytes)
        sub.graphs = None
        return sub

    def restart(self, text: TextBatch, negative: Optional[TextBatch], seeds: Sequence[int]) -> None:
        """Graph mode: begin a new generation in the same tensors (captured steps read their addresses)."""
        fresh = GenState(self.rt, self.ctx, text, negative, self.sched, self.h_div_w, seeds, self.kv_capacity)
        for old, new in zip(self.consts_full, fresh.consts):
            for name in BlockConsts.PER_PROMPT:
                getattr(old, name).copy_(getattr(new, name))
        self.cond.copy_(fresh.cond)
        self.ca_text, self.ca_mask, self.shared_gss = fresh.ca_text, fresh.ca_mask, fresh.shared_gss
        self.summed_codes.zero_()
        for g, seed in zip(self.generators, seeds):
            g.manual_seed(int(seed))
        self.text_tokens = fresh.text_tokens
        self.consts, self.rows, self.dropped_uncond = self.consts_full, self.rows0, False
        self.kv.restart()
        self.residuals, self.bits, self.entropies, self.trace, self.kv_bytes = {}, [], [], [], []
        self.attn_memory, self.attn_written = {}, {}

    # -------------------------------------------------------------- one scale
    def step(self, si: int, plan: ScalePlan, cfg: float, tau: float, top_k: int, top_p: float) -> Optional[ScaleSignals]:
        """Run scale `si` under `plan` (host side: checks, trace, signals; device side: `run_core`).
        None when the plan skips the scale."""
        h, w = self.sched[si]
        n = h * w
        if not plan.run:
            self.bits.append(None)
            self.entropies.append(None)
            self.kv_bytes.append(self.kv.nbytes())
            self.trace.append({"si": si, "h": h, "w": w, "ran": False, "rows": 0, "batch": self.batch, "tokens": n, "blocks": [],
                               "neutral": False})
            return None
        if plan.drop_uncond and self.ctx.cfg_rows and not self.dropped_uncond:
            self.dropped_uncond = True
            self.rows = self.batch
            self.kv.drop_uncond(self.batch)
            self.consts = [bc.first_rows(self.batch) for bc in self.consts]
            self.attn_memory = {bi: m.first_rows(self.batch) for bi, m in self.attn_memory.items()}
        elif self.dropped_uncond and not plan.drop_uncond:
            raise ValueError(f"scale {si}: the unconditional branch was dropped at an earlier scale and cannot return")
        for bi, bp in plan.blocks.items():
            if not 0 <= bi < len(self.blocks):
                raise ValueError(f"plan for scale {si} names block {bi}; the model has blocks 0..{len(self.blocks) - 1}")
            bp.validate(n)
        for bi, kb in plan.kv.items():
            if not 0 <= bi < len(self.blocks):
                raise ValueError(f"KV budget for scale {si} names block {bi}; the model has blocks 0..{len(self.blocks) - 1}")
            kb.validate()
        check_attention_plans(plan, si, n, len(self.blocks), self.kv.len)
        plan.validate_token_maps(self.batch, n, len(self.blocks))
        out = self.run_core(si, plan.on_device(self.rt.device), cfg, tau, top_k, top_p)
        if out.residual_store is not None:
            self.residuals[si] = out.residual_store
        self.attn_memory.update(out.attn_memory)
        for s in plan.release_residuals:
            self.residuals.pop(s, None)
        self.entropies.append(out.entropy)
        self.bits.append(out.bits)
        self.trace.append({"si": si, "h": h, "w": w, "ran": True, "rows": self.rows, "batch": self.batch, "tokens": n,
                           "text_tokens": self.text_tokens[self.rows], "blocks": out.counts,
                           "attn_memory_bytes": sum(m.nbytes() for m in self.attn_memory.values()),
                           # the image is what the released model makes (varbench.engine.effect)
                           "neutral": is_neutral(plan) and not any(c.get("kv_evicted") for c in out.counts)})
        self.kv_bytes.append(self.kv.nbytes())   # after this scale (and its evictions)
        cfg_active = self.rows == 2 * self.batch
        d = out.guided.shape[-1] // 2
        return ScaleSignals(
            scale=si, h=h, w=w, token_entropy=out.entropy, logits=out.guided.view(self.batch, n, d, 2),
            cond_logits=(out.logits[: self.batch].mul(1 / tau).view(self.batch, n, d, 2) if cfg_active else None),
            attention_entropy=out.attn_ent, attention_query_index=out.attn_idx,
            executed_tokens={bi: {k: c[k] for k in ("sa", "ca", "ffn")} for bi, c in enumerate(out.counts)},
            tau=tau, cfg=cfg, summed_codes=self.summed_codes, decode=self.rt.decode if self.rt.vae is not None else None,
            residual_change=out.residual_change,
        )

    def run_core(self, si: int, plan: ScalePlan, cfg: float, tau: float, top_k: int, top_p: float) -> StepOut:
        """The device work of scale `si`: eagerly, or in graph mode through this state's captured
        steps (`StepGraphs.run`). The fake-CUDA dry run wraps this to tell steps from the gaps between."""
        if self.graphs is None:
            return self.core(si, plan, cfg, tau, top_k, top_p)
        return self.graphs.run(self, si, plan, cfg, tau, top_k, top_p)

    def core(self, si: int, plan: ScalePlan, cfg: float, tau: float, top_k: int, top_p: float) -> StepOut:
        """The device work of one scale: blocks, head, guidance, sampling, code accumulation. No host
        reads of GPU values, so it can be captured as a CUDA graph."""
        h, w = self.sched[si]
        n = h * w
        x = self._scale_input(si, plan.input_resize)
        counts_all, attn_ent, attn_idx = [], {}, {}
        residual_store = {} if plan.keep_residuals else None
        self.attn_written = {}
        change_from: dict[tuple[int, int], torch.Tensor] = {}   # block range -> the stream entering its first block
        residual_change: dict[tuple[int, int], torch.Tensor] = {}
        for bi in range(len(self.blocks)):
            for rng in plan.residual_change_for:
                if rng[0] == bi:
                    change_from[rng] = x
            bp = plan.blocks.get(bi, _FULL)
            ap = plan.attn.get(bi)
            if ap is not None and ap.kind == "dense":
                ap = None
            counts = {"mode": bp.mode, "sa": 0, "kv": self.kv.len[bi], "qkv": 0, "ca": 0, "ffn": 0, "ent_q": 0}
            x_in, appended = x, None
            if bp.mode == "full" and bp.pad is None and residual_store is None and bi not in plan.attention_entropy_for \
                    and ap is None:
                x = self.full_block(si, bi, x)
                counts.update(sa=n, qkv=n, ca=n, ffn=n, kv=self.kv.len[bi])
            elif bp.mode != "skip":
                self.kv_appended = None
                x = pruned.planned_block(self, si, bi, x, bp, counts, residual_store,
                                         bi in plan.attention_entropy_for, plan.attention_entropy_queries, attn_ent, attn_idx,
                                         plan.attention_entropy_sampling, ap)
                appended = self.kv_appended
            budget = plan.kv.get(bi)
            if budget is not None and bp.mode != "skip":
                self.apply_kv_budget(si, bi, x_in, budget, appended, counts)
            self.kv.settle(bi, si == len(self.sched) - 1)   # nothing of this block left in the staging buffer
            counts_all.append(counts)
            # block bi has read what it caches from the released scales: free that now, not after the step
            # (the scale's new residuals grow meanwhile). Eagerly only: a captured step is replayed, and its
            # residuals live as long as the captured steps that wrote them anyway
            for s in (plan.release_residuals if self.graphs is None else ()):
                held = self.residuals.get(s)
                if held:
                    for key in [k for k in held if k[0] == bi]:
                        del held[key]
            for rng in plan.residual_change_for:
                if rng[1] == bi:   # the released order (x_out - x_in), squared, mean over channels
                    residual_change[rng] = ((x.float() - change_from.pop(rng).float()) ** 2).mean(dim=-1)
        if plan.post_fill is not None:
            x = self._post_fill(x, plan.post_fill)
        logits = self.m.logits(x, self.cond[:self.rows])
        guided = guided_logits(logits, self.batch, cfg, tau, self.rows == 2 * self.batch)
        bits = sample_bits(guided, self.generators, top_k, top_p).view(self.batch, h, w, -1)
        entropy = bit_entropy(guided)
        self._accumulate(si, bits, plan.code_mask)
        return StepOut(logits, guided, bits, entropy, attn_ent, attn_idx, counts_all, residual_store, self.attn_written,
                       residual_change)

    def _post_fill(self, x: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
        """`ScalePlan.post_fill`: token t of each row takes row's token source[image, t] (one gather, so
        every source is read before any fill); the image's map serves each of its CFG halves."""
        src = source.to(x.device, torch.long)
        src = src.repeat(self.rows // self.batch, 1)
        return x.gather(1, src.unsqueeze(-1).expand(-1, -1, x.shape[-1]))

    def apply_kv_budget(self, si: int, bi: int, x_in: torch.Tensor, budget: KVBudget,
                        appended: Optional[torch.Tensor], counts: dict) -> None:
        """After block bi ran at scale si on input `x_in`: `apply_kv_budget` (below) with this
        block's raw query projection (x_mod @ W_q^T, no bias) for a selector."""
        bc = self.consts[bi]
        rows, _, C = x_in.shape

        def query_proj(pos: torch.Tensor) -> torch.Tensor:
            xm = modulated_norm(x_in.index_select(1, pos), bc.scale1, bc.shift1, bc.eps)
            if bc.w_qkv.dim() == 2:   # a quantised (out, in) weight (runtime.quant): its kernel, then the q rows
                q = F.linear(xm.to(bc.wdtype), bc.w_qkv)[..., :C]
            else:
                q = torch.matmul(xm.to(bc.wdtype), bc.w_qkv[:, :, :C])
            return q.view(rows, pos.shape[0], bc.heads, -1).transpose(1, 2)

        h, w = self.sched[si]
        apply_kv_budget(self.kv, si, bi, h, w, self.rows, self.batch, budget, appended, counts, query_proj)

    def _scale_input(self, si: int, resize: str = "trilinear") -> torch.Tensor:
        """The residual stream entering scale si: SOS (+ start position) at scale 0, else the word
        embedding of the summed codes resized to this grid (`ScalePlan.input_resize`: trilinear as
        released, or area); plus the level embedding."""
        m = self.m
        if si == 0:
            x = self.cond.unsqueeze(1) + m.pos_start.expand(self.rows0, 1, -1)
            x = x[: self.rows]
        else:
            h, w = self.sched[si]
            nxt = F.interpolate(self.summed_codes, size=(1, h * self.patch, w * self.patch), mode=resize).squeeze(-3)
            if self.patch > 1:
                nxt = patchify_codes(nxt)
            nxt = nxt.reshape(*nxt.shape[:2], -1).permute(0, 2, 1)
            x = self.rt.embed_codes(nxt).repeat(self.rows // self.batch, 1, 1)
        return x + self.m.lvl_embed.weight[si]

    def _accumulate(self, si: int, bits_grid: torch.Tensor, code_mask: Optional[torch.Tensor] = None) -> None:
        """Bits -> BSQ codes (+-1/sqrt(d), L2-normalised) -> summed codes, as released. `code_mask`
        (B, h*w) bool (`ScalePlan.code_mask`): those tokens' codes are zeroed first."""
        b = bits_grid
        if self.patch > 1:  # (B, h, w, 4d) -> (B, 2h, 2w, d), the released pixel_shuffle order
            b = unpatchify_bits(b)
        codes = bits_to_codes(b).unsqueeze(1).permute(0, 4, 1, 2, 3)            # (B, d, 1, H, W)
        if code_mask is not None:
            bsz, h, w = bits_grid.shape[:3]
            m = code_mask.to(codes.device).view(bsz, h, w)
            if self.patch > 1:   # a token covers a patch x patch block of latent positions
                m = m.repeat_interleave(self.patch, 1).repeat_interleave(self.patch, 2)
            codes = codes.masked_fill(m[:, None, None], 0.0)
        if si != len(self.sched) - 1:
            self.summed_codes += F.interpolate(codes, size=self.latent_size, mode="trilinear")
        else:
            self.summed_codes += codes

    def full_block(self, si: int, bi: int, x: torch.Tensor) -> torch.Tensor:
        """The baseline block: every token, the fewest ops (see `varbench.engine.backbones.infinity.block_step`).
        Public as the hook that `experiments/runtime_ops.py` and the fake-CUDA dry run wrap."""
        bc, ops = self.consts[bi], self.rt.block_ops   # ops: eager, or compiled (runtime.compile)
        rot = ops.block_in(bc, x, self.rope[si])   # (3, rows, H, n, c)
        k, v = self.kv.append(bi, rot[1:], self.kv_dtype)
        q = rot[0]
        attn = F.scaled_dot_product_attention(q.to(k.dtype), k, v, attn_mask=self.kv.key_mask(bi), scale=1.0)
        return ops.block_out(bc, x, attn)
