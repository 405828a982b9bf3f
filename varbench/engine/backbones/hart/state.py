"""One HART generation's state and its stage step, on the shared plan seam.

    state = HartState(rt, ctx, text, negative, seeds, kv_capacity, generators)
    signals = state.step(si, plan, cfg, tau, top_k, top_p, more_smooth)     # once per stage, in order

What a stage does (the release's `autoregressive_infer_cfg`, `varbench.engine.backbones.hart.sampling`):
the blocks over the stage's tokens (stage 0: the text context; stage si > 0: the word embedding of
the area-downsampled f_hat), the head, guidance with the release's ramp t = cfg * si / (S - 1),
top-k sampling, the codebook embedding (or the gumbel mixture with `more_smooth`), the shared phi
convs into f_hat; at the last stage also the residual diffusion head.

Under a plan, as on Infinity (`varbench.engine.backbones.infinity.pruned`; the shared rules live in the seam):
- a block "skip" is the identity (no K/V appended); "prune" runs each sublayer in `sublayers`
  ("sa", "ffn": HART has no cross-attention) on the kept tokens only, chosen by the plan's indices
  or selector on the live stream before each sublayer; `prune_kv` drops the pruned tokens from the
  stage's K/V (their RoPE positions are the kept tokens' own); pruned positions are filled with the
  cached branch output of an earlier stage that kept residuals, area-resized (`fill="cache"`,
  FastVAR's restoration), or pass through (`fill="pass"`);
- `keep_residuals` stores each block's branch outputs (times the AdaLN gate where there is one);
- `attention_entropy_for` measures the per-query self-attention entropy exactly
  (`varbench.engine.attention`); at stage 0 the one query whose logits sample the 1x1 token (the
  last text position);
- `kv` budgets evict with the shared rule (`varbench.engine.kv_cache.apply_kv_budget`);
- a skipped stage samples nothing and adds nothing to f_hat; the next stage reads f_hat as it is
  (area-downsampled); a skipped last stage also skips the diffusion head;
- `drop_uncond` runs the conditional rows only from then on (no guidance).
Stage 0 is the text context (the prompt's tokens, not a 1x1 grid): it runs in full, and a plan that
prunes, skips or budgets it is refused.

Sampling draws per image from its own generators (token and diffusion), so an image does not depend
on its batch; with `generators=(tokens, diffusion)` one pair serves the whole batch and is consumed
exactly as the release consumes its generator and the global RNG (the parity tests use this).

Per-image decisions split a state into sub-batches (`HartState.split`, `varbench.engine.batch_split`),
as on Infinity: the parts view the parent's KV and residual cache rows instead of copying them.
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import torch
import torch.nn.functional as F

from varbench.engine import generation
from varbench.engine.attention import attention_entropy
from varbench.engine.backbones.hart.model import rope_1d, rope_2d, stage_positions
from varbench.engine.backbones.hart.sampling import diffusion_sample, gumbel_mix, sample_top_k_top_p
from varbench.engine.batch_split import image_rows, split_residuals, take_rows
from varbench.engine.kv_cache import KVCache, apply_kv_budget, kv_staging_capacity
from varbench.engine.plan import BlockPlan, GenerationContext, ScalePlan, ScaleSignals, SelectorContext, entropy_query_pick, is_neutral
from varbench.engine.residuals import cached_branch
from varbench.engine.text import TextBatch

_FULL = BlockPlan()
SUBLAYERS = ("sa", "ffn")


def release_top_k(si: int) -> int:
    """The release's top-k per stage: 600 for stages < 7, else 300 (its `top_k` argument is unused)."""
    return 600 if si < 7 else 300


def cfg_ratio(si: int, n_stages: int) -> float:
    """The release's guidance ramp: stage si's weight is cfg * ratio; the last stage reuses the stage
    before's ratio (a loop variable upstream), (S - 2) / (S - 1)."""
    return (min(si, n_stages - 2)) / (n_stages - 1)


def categorical_entropy(logits: torch.Tensor) -> torch.Tensor:
    """(B, L, V) -> (B, L) entropy of softmax(logits) in nats (the distribution sampled from, before top-k)."""
    lp = logits.float().log_softmax(-1)
    return -(lp.exp() * lp.nan_to_num(neginf=0.0)).sum(-1)


def _gather(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """x (rows, L, C), idx (rows, K) -> (rows, K, C)."""
    return x.gather(1, idx.unsqueeze(-1).expand(-1, -1, x.shape[-1]))


class HartState:
    """Everything one generation accumulates: KV cache, f_hat, the next stage's input, residual
    caches, generators, per-stage tokens / entropies / trace."""

    def __init__(self, rt, ctx: GenerationContext, text: TextBatch, negative: Optional[TextBatch],
                 seeds: Sequence[int], kv_capacity: Optional[list[int]] = None, generators=None):
        self.rt, self.m, self.ctx = rt, rt.model, ctx
        cfg = self.m.cfg
        self.cfg, self.pns = cfg, cfg.patch_nums
        self.sched = [(p, p) for p in cfg.patch_nums]
        self.batch = B = len(seeds)
        self.rows = self.rows0 = 2 * B if ctx.cfg_rows else B
        dev = rt.device
        feats, mask = _pad_context(text, cfg.context_token, dev)
        if ctx.cfg_rows:
            if negative is not None:
                nf, nm = _pad_context(negative, cfg.context_token, dev)
                nf, nm = nf.expand(B, -1, -1), nm.expand(B, -1)
            else:   # the release's unconditional rows: zero context, one real position
                nf, nm = torch.zeros_like(feats), torch.zeros_like(mask)
                nm[:, 0] = True
            feats, mask = torch.cat((feats, nf)), torch.cat((mask, nm))
        pos = mask.long().cumsum(1) - 1
        if ctx.cfg_rows and negative is None:
            pos[B:] = 0   # the release passes zero position ids for the unconditional rows
        self.cond = self.m.embed_context(feats)                              # (rows, T, C)
        self.mods = [blk.modulation(self.cond, mask) for blk in self.m.blocks]
        self.lvl = self.m.level_embeddings()
        self.mask, self.pos = mask, pos
        hd = cfg.head_dim
        self.rope = [rope_1d(pos, hd)] + [rope_2d(stage_positions(self.pns, si, pos[:, -1]), hd)
                                          for si in range(1, len(self.pns))]
        self.offsets = [0, cfg.context_token]
        for p in self.pns[1:-1]:
            self.offsets.append(self.offsets[-1] + p * p)
        # stage 0 holds the T context tokens, where a policy's count (on the 1x1 schedule) has 1
        full = cfg.total_len
        extra = cfg.context_token - 1
        caps = None if kv_capacity is None else [min(full, int(c) + extra) for c in kv_capacity]
        staging = kv_staging_capacity(caps, [(1, cfg.context_token)] + self.sched[1:])
        self.kv = KVCache(cfg.depth, full if caps is None else caps, staging)
        # K/V in the autocast dtype: attention (SDPA) reads them cast to it anyway, so its outputs equal the
        # release's, whose K stays fp32 (F.normalize) and V fp16; without this, stacking would keep V in fp32 too
        self.kv_dtype = torch.float32 if rt.dtype == torch.float32 else rt.dtype
        self.f_hat = torch.zeros(B, cfg.cvae, self.pns[-1], self.pns[-1], device=dev)
        self.next_grid: Optional[torch.Tensor] = None                       # (B, Cvae, p, p) input of the next stage
        self.shared = generators is not None
        if self.shared:
            self.token_gen, self.diff_gen = generators
        else:
            # through generation.new_generator: the one seam the fake-CUDA dry run stands generators in at
            self.token_gens = [generation.new_generator(dev, s) for s in seeds]
            self.diff_gens = [generation.new_generator(dev, s) for s in seeds]
        self.residuals: dict[int, dict] = {}
        self.tokens: list[Optional[torch.Tensor]] = []
        self.entropies: list[Optional[torch.Tensor]] = []
        self.trace: list[dict] = []
        self.kv_bytes: list[dict] = []
        self.dropped_uncond = False
        self.diffusion = rt.diffusion_schedule()   # its coefficients already on the device: the head only indexes them

    # ------------------------------------------------------------------ sub-batches
    def split(self, parts: Sequence[Sequence[int]]) -> list["HartState"]:
        """States for `parts` (lists of image positions that together make this batch), to continue
        apart (per-image decisions, `varbench.engine.batch_split`), as `GenState.split` on Infinity:
        the KV cache's and the residual caches' rows are permuted in place and each part views its
        slice (no second cache); the per-row constants (context embeddings, AdaLN modulation, RoPE
        tables) are taken per part, f_hat, the next stage's input and the history are copied, and
        each image keeps its own generators (the runtime refuses a split with the release's shared
        generators, which serve the whole batch in row order). This state is spent after."""
        parts = [list(p) for p in parts]
        kvs, residuals = self.kv.split(parts, self.batch), split_residuals(self.residuals, parts, self.batch)
        return [self._part(p, kv, res) for p, kv, res in zip(parts, kvs, residuals)]

    def _part(self, images: list[int], kv: KVCache, residuals: dict) -> "HartState":
        """The state of `images`, over its views of the split caches."""
        sub = object.__new__(HartState)
        sub.__dict__.update(self.__dict__)   # rt, model, schedule, level embeddings, offsets, diffusion: shared
        b, B = len(images), self.batch
        idx = torch.tensor(images, device=self.rt.device)

        def rows(t: torch.Tensor) -> torch.Tensor:   # a per-row constant: (rows0, ...) in [cond; uncond] order
            return take_rows(t, images, B)

        sub.ctx = dataclasses.replace(self.ctx, batch=b)
        sub.batch, sub.rows0 = b, len(image_rows(images, B, self.rows0))
        sub.rows = b if self.dropped_uncond else sub.rows0
        sub.cond, sub.mask, sub.pos = rows(self.cond), rows(self.mask), rows(self.pos)
        sub.mods = [None if mod is None else tuple(rows(m) for m in mod) for mod in self.mods]
        sub.rope = [(rows(cos), rows(sin)) for cos, sin in self.rope]
        sub.kv, sub.residuals = kv, residuals
        sub.f_hat = self.f_hat.index_select(0, idx)
        sub.next_grid = None if self.next_grid is None else self.next_grid.index_select(0, idx)
        sub.token_gens = [self.token_gens[i] for i in images]   # each image keeps drawing from its own
        sub.diff_gens = [self.diff_gens[i] for i in images]
        sub.tokens = [None if t is None else t.index_select(0, idx) for t in self.tokens]
        sub.entropies = [None if t is None else t.index_select(0, idx) for t in self.entropies]
        sub.trace = list(self.trace)          # the entries so far are shared (they ran for these images too)
        sub.kv_bytes = list(self.kv_bytes)
        return sub

    # ------------------------------------------------------------------ one stage
    def step(self, si: int, plan: ScalePlan, cfg: float, tau: float, top_k: int, top_p: float,
             more_smooth: bool) -> Optional[ScaleSignals]:
        h, w = self.sched[si]
        last = si == len(self.pns) - 1
        self._check(si, plan)
        if not plan.run:
            self.tokens.append(None)
            self.entropies.append(None)
            if not last:
                self.next_grid = F.interpolate(self.f_hat, size=(self.pns[si + 1],) * 2, mode="area")
            self.kv_bytes.append(self.kv.nbytes())
            self.trace.append({"si": si, "h": h, "w": w, "ran": False, "rows": 0, "batch": self.batch, "tokens": h * w,
                               "blocks": [], "neutral": False, "sublayers": list(SUBLAYERS)})
            return None
        if plan.drop_uncond and self.ctx.cfg_rows and not self.dropped_uncond:
            self.dropped_uncond, self.rows = True, self.batch
            self.kv.drop_uncond(self.batch)
        elif self.dropped_uncond and not plan.drop_uncond:
            raise ValueError(f"stage {si}: the unconditional branch was dropped at an earlier stage and cannot return")
        sparse = sorted(bi for bi, ap in plan.attn.items() if ap.kind != "dense")
        if sparse:   # the attention-plan seam is Infinity's (varbench.engine.sparse_attention); HART's blocks attend densely
            raise ValueError(f"stage {si}: attention plans ({plan.attn[sparse[0]].kind!r} on blocks {sparse}) are not "
                             "supported on HART; only the Infinity runtime reads ScalePlan.attn")
        x, counts, attn_ent, attn_idx, residuals = self._blocks(si, plan)
        logits = self.m.logits(x, self.cond[: self.rows])                     # (rows, n, V) fp32
        if residuals is not None:
            self.residuals[si] = residuals
        for s in plan.release_residuals:
            self.residuals.pop(s, None)
        B = self.batch
        t = cfg * cfg_ratio(si, len(self.pns))
        guided = (1 + t) * logits[:B] - t * logits[B:] if self.rows == 2 * B else logits[:B]
        if si == 0:   # a slice, not `[:, [-1], :]`: a list index is copied host -> device (a sync) at every call
            guided = guided[:, -1:, :]
        if tau != 1.0:
            guided = guided / tau
        entropy = categorical_entropy(guided)
        idx = self._sample(guided, release_top_k(si) if top_k <= 0 else top_k, top_p)
        emb = self._embed(si, idx, guided, more_smooth)
        if last:
            emb = self._diffusion(x, idx, emb, t)
        grid = emb.transpose(1, 2).reshape(B, self.cfg.cvae, h, w)
        if last:
            self.f_hat += grid
        else:
            self.f_hat, self.next_grid = self.rt.quant.next_input(si, self.f_hat, grid)
        self.tokens.append(idx.view(B, h, w))
        self.entropies.append(entropy)
        n = x.shape[1]
        self.trace.append({"si": si, "h": h, "w": w, "ran": True, "rows": self.rows, "batch": B, "tokens": n,
                           "text_tokens": 0, "blocks": counts, "sublayers": list(SUBLAYERS), "diffusion": last,
                           "neutral": is_neutral(plan) and not any(c.get("kv_evicted") for c in counts)})
        self.kv_bytes.append(self.kv.nbytes())
        cond_rows = logits[:B, -1:] if si == 0 else logits[:B]
        return ScaleSignals(scale=si, h=h, w=w, token_entropy=entropy, logits=guided,
                            cond_logits=cond_rows / tau if self.rows == 2 * B else None,
                            attention_entropy=attn_ent, attention_query_index=attn_idx,
                            executed_tokens={bi: {k: c[k] for k in ("sa", "ca", "ffn")} for bi, c in enumerate(counts)},
                            tau=tau, cfg=cfg, summed_codes=self.f_hat, decode=None)

    def _check(self, si: int, plan: ScalePlan) -> None:
        depth = len(self.m.blocks)
        if (plan.residual_change_for or plan.post_fill is not None or plan.code_mask is not None
                or plan.input_resize != "trilinear"):
            raise ValueError("HART's runtime has no block-range residual signal, post-block fill, code mask or input "
                             "resize choice (ScalePlan.residual_change_for / post_fill / code_mask / input_resize): "
                             "they are Infinity seams")
        for bi in [*plan.blocks, *plan.kv]:
            if not 0 <= bi < depth:
                raise ValueError(f"plan for stage {si} names block {bi}; the model has blocks 0..{depth - 1}")
        if si == 0 and (not plan.run or plan.kv or plan.keep_residuals or any(bp.mode != "full" for bp in plan.blocks.values())):
            raise ValueError("HART's stage 0 is the text context (the prompt's tokens), not a token grid: a plan may not "
                             "skip, prune, budget or cache it; start the method at stage 1")
        for bp in plan.blocks.values():
            bp.validate(self.sched[si][0] * self.sched[si][1])
            if bp.mode == "prune" and "ca" in bp.sublayers and not set(bp.sublayers) & set(SUBLAYERS):
                raise ValueError("HART has no cross-attention: a pruned block needs 'sa' or 'ffn' in its sublayers")
        for kb in plan.kv.values():
            kb.validate()

    # ------------------------------------------------------------------ the blocks
    def _input(self, si: int) -> torch.Tensor:
        if si == 0:
            return (self.cond + self.lvl[:, : self.cfg.context_token])[: self.rows]
        p = self.pns[si]
        x = self.m.word_embed(self.next_grid.reshape(self.batch, self.cfg.cvae, -1).transpose(1, 2))
        x = x + self.lvl[:, self.offsets[si]: self.offsets[si] + p * p]
        return x.repeat(self.rows // self.batch, 1, 1)

    def _blocks(self, si: int, plan: ScalePlan):
        x = self._input(si)
        cos, sin = (t[: self.rows] for t in self.rope[si])
        store = {} if plan.keep_residuals else None
        counts_all, attn_ent, attn_idx = [], {}, {}
        for bi, blk in enumerate(self.m.blocks):
            bp = plan.blocks.get(bi, _FULL)
            counts = {"mode": bp.mode, "sa": 0, "kv": self.kv.len[bi], "qkv": 0, "ca": 0, "ffn": 0, "ent_q": 0}
            x_in, appended = x, None
            if bp.mode != "skip":
                x, appended = self._block(si, bi, blk, x, bp, cos, sin, counts, store,
                                          bi in plan.attention_entropy_for, plan, attn_ent, attn_idx)
            budget = plan.kv.get(bi)
            if budget is not None and bp.mode != "skip":
                apply_kv_budget(self.kv, si, bi, *self.sched[si], self.rows, self.batch, budget, appended, counts,
                                self._query_proj(blk, bi, x_in))
            self.kv.settle(bi, si == len(self.pns) - 1)
            counts_all.append(counts)
        return x, counts_all, attn_ent, attn_idx, store

    def _norm(self, blk, mod, x: torch.Tensor, which: int) -> torch.Tensor:
        h = blk.ln_wo_grad(x)
        if mod is None:
            return h
        scale, shift = (mod[2], mod[4]) if which == 1 else (mod[3], mod[5])
        return h.mul(scale.add(1)).add_(shift)

    def _query_proj(self, blk, bi: int, x_in: torch.Tensor):
        def query_proj(pos: torch.Tensor) -> torch.Tensor:   # raw x_mod @ W_q^T, no bias (a KV selector's input)
            a = blk.attn
            xm = self._norm(blk, self.mods[bi], x_in.index_select(1, pos), 1)
            q = F.linear(xm, a.qkv_proj.weight[: a.num_heads * a.head_dim])
            return q.view(x_in.shape[0], pos.shape[0], a.num_heads, a.head_dim).transpose(1, 2)
        return query_proj

    def _block(self, si, bi, blk, x, bp: BlockPlan, cos, sin, counts, store, want_entropy, plan, attn_ent, attn_idx):
        """Block bi on x (rows, n, C) under bp; mirrors `HartBlock.forward` op for op on full sublayers."""
        rows, n, _ = x.shape
        mod = self.mods[bi]
        if mod is not None:
            mod = tuple(m[: rows] for m in mod)
        g1, g2 = (None, None) if mod is None else (mod[0], mod[1])
        pruned = bp.mode == "prune"
        h, w = self.sched[si]

        def indices(sub):
            if not pruned or sub not in bp.sublayers:
                return None
            idx = bp.keep if bp.keep is not None else bp.selector(
                x, SelectorContext(scale=si, block=bi, sublayer=sub, h=h, w=w, batch=self.batch, cfg_rows=rows == 2 * self.batch))
            idx = idx.to(x.device)
            return idx[:rows] if idx.shape[0] >= rows else idx.repeat(rows // idx.shape[0], 1)

        # --- self-attention
        idx = indices("sa")
        hin = self._norm(blk, mod, x, 1)
        if idx is not None and bp.prune_kv:   # only kept tokens make q, k, v, at their own positions
            q, k, v = blk.attn.qkv(_gather(hin, idx), _gather(cos, idx), _gather(sin, idx))
        else:
            q, k, v = blk.attn.qkv(hin, cos, sin)
        counts["qkv"] = q.shape[2]
        kk, vv = self.kv.append(bi, torch.stack((k, v)), self.kv_dtype)
        appended = idx if (idx is not None and bp.prune_kv) else None
        if idx is not None and not bp.prune_kv:
            q = q.gather(2, idx[:, None, :, None].expand(-1, q.shape[1], -1, q.shape[3]))
        counts["kv"], counts["sa"] = kk.shape[2], q.shape[2]
        if want_entropy:
            self._attention_entropy(si, bi, q, kk, blk.attn.scale, idx, n, plan, counts, attn_ent, attn_idx)
        x = self._apply(si, bi, "sa", x, blk.attn.attend(q, kk, vv), g1, idx, bp, store)
        # --- FFN
        idx = indices("ffn")
        xq = x if idx is None else _gather(x, idx)
        counts["ffn"] = xq.shape[1]
        return self._apply(si, bi, "ffn", x, blk.ffn(self._norm(blk, mod, xq, 2)), g2, idx, bp, store), appended

    def _attention_entropy(self, si, bi, q, k, scale, idx, n, plan, counts, attn_ent, attn_idx):
        rows = q.shape[0]
        if si == 0:   # the query that samples the stage's one token: the last text position
            q, pos = q[:, :, -1:], torch.zeros(rows, 1, dtype=torch.long, device=q.device)
        else:
            pos = idx if idx is not None else torch.arange(n, device=q.device).expand(rows, -1)
            kq = plan.attention_entropy_queries
            if kq is not None and kq < q.shape[2]:
                pick = entropy_query_pick(q.shape[2], kq, si, plan.attention_entropy_sampling, q.device)
                q, pos = q[:, :, pick], pos[:, pick]
        attn_ent[bi] = attention_entropy(q * scale, k)
        attn_idx[bi] = pos
        counts["ent_q"] = pos.shape[1]

    def _apply(self, si, bi, sub, x, branch, gate, idx, bp: BlockPlan, store):
        """x + gate * branch, as the release writes it on full sublayers; pruned ones fill first."""
        if idx is None:
            out = branch if gate is None else branch.mul_(gate)
            if store is not None:
                store[(bi, sub)] = out.float()
            return x + out
        rows, _, c = x.shape
        branch = branch.float() if gate is None else branch.float().mul(gate)
        if bp.fill == "pass":
            return x.scatter_add(1, idx.unsqueeze(-1).expand(-1, -1, c), branch.to(x.dtype))
        full = cached_branch(self, si, bi, sub, rows, bp.cache_from).scatter(1, idx.unsqueeze(-1).expand(-1, -1, c), branch)
        if store is not None:
            store[(bi, sub)] = full
        return x + full.to(x.dtype)

    # ------------------------------------------------------------------ sampling
    def _sample(self, guided: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
        """(B, l) tokens; masks `guided` in place to its top-k (the release's in-place filter)."""
        if self.shared:
            return sample_top_k_top_p(guided, top_k, top_p, self.token_gen)
        return torch.cat([sample_top_k_top_p(guided[i: i + 1], top_k, top_p, g) for i, g in enumerate(self.token_gens)])

    def _embed(self, si: int, idx: torch.Tensor, masked: torch.Tensor, more_smooth: bool) -> torch.Tensor:
        """(B, l, Cvae): the codebook vectors, or with `more_smooth` the release's gumbel mixture
        of the top-k-masked logits (temperature falling with the stage)."""
        book = self.rt.quant.embedding
        if not more_smooth:
            return book(idx)
        ratio = cfg_ratio(si, len(self.pns))
        tau = max(0.27 * (1 - ratio * 0.95), 0.005)
        scaled = masked.mul(1 + ratio)
        if self.shared:
            return gumbel_mix(scaled, tau, book.weight, self.token_gen)
        return torch.cat([gumbel_mix(scaled[i: i + 1], tau, book.weight, g) for i, g in enumerate(self.token_gens)])

    def _diffusion(self, x: torch.Tensor, idx: torch.Tensor, emb: torch.Tensor, t: float) -> torch.Tensor:
        """emb + the residual diffusion head's sample for the last stage [HART's hybrid tokens]."""
        m, B = self.m, self.batch
        disc = m.word_embed(self.rt.quant.embedding(idx))
        z = m.decoder_norm(x + disc.repeat(self.rows // B, 1, 1))
        rows, L, C = z.shape
        guided = rows == 2 * B
        randn = None if self.shared else self._per_image_noise(B, L, guided)
        resid = diffusion_sample(m.diffloss.net, z.reshape(rows * L, C), t if guided else 1.0,
                                 self.diff_gen if self.shared else None, self.diffusion, randn=randn)
        return emb + resid.reshape(rows, L, -1)[:B]

    def _per_image_noise(self, B: int, L: int, guided: bool):
        """Noise for the head's rows laid out [cond images; uncond images], each image's from its own
        generator, drawn as the release draws at batch 1 (so an image equals its batch-1 run)."""
        cc, dev = self.m.diffloss.net.in_channels, self.rt.device

        def randn(n_rows: int) -> torch.Tensor:
            per = n_rows // B
            draws = [torch.randn(per, cc, generator=g, device=dev) for g in self.diff_gens]
            if guided and per == 2 * L:   # [cond_i; uncond_i] per image -> [cond_0..B; uncond_0..B]
                return torch.cat([d[:L] for d in draws] + [d[L:] for d in draws])
            return torch.cat(draws)
        return randn


def _pad_context(text: TextBatch, length: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, length, D) features and (B, length) mask: the released tokenizer pads to max_length."""
    f, m = text.features.to(device).float(), text.mask.to(device)
    if f.shape[1] > length:
        raise ValueError(f"text has {f.shape[1]} tokens but HART's context holds {length}; truncate the prompt "
                         "(the released encoder truncates at max_token_length)")
    if f.shape[1] < length:
        f = F.pad(f, (0, 0, 0, length - f.shape[1]))
        m = F.pad(m, (0, length - m.shape[1]), value=False)
    return f, m
