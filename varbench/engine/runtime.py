"""The Infinity next-scale loop: the one mechanism every method runs on.

    rt = InfinityRuntime(model, vae, text_encoder)
    out = rt.generate(["a red circle"], seeds=[0], policy=Baseline(), cfg=4.0, tau=1.0)

Per scale: ask the policy for a `ScalePlan`; run the blocks under it (full / skip / prune with a
cached-residual or pass-through fill); compute logits, temper, guide, sample bits per image;
accumulate codes with the VAE's trilinear interpolation; hand `ScaleSignals` to the policy.

A full block is `block_step`'s lean path (constants prepared once per generation, ~40 ops); a
block under a plan (pruned, keeping residuals, asked for attention entropy) runs `_block`, which
computes its full sublayers with the same ops, so a neutral plan reproduces the baseline bit for bit.

Design rules (CUDA graphs): nothing inside a scale step (`_GenState._core`) reads GPU values on the
host; every shape inside a step follows from the schedule and the plan (`n_keep` is static). Host
reads happen between steps (policy.observe) and after the loop (traces). In graph mode
(`cuda_graphs`) a step is captured per (scale, plan signature, KV lengths, residual addresses) and
replayed; everything it reads lives in a generation state reused in place across calls.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import time
from typing import Optional, Sequence

import torch
import torch.nn.functional as F

from varbench.engine.batch_split import group_by_plan, image_rows, merge_plans, scatter_images, select_signals, take_rows
from varbench.engine.flops import scale_flops, text_flops
from varbench.engine.models.bsq_vae import bits_to_codes, patchify_codes, unpatchify_bits
from varbench.engine.block_step import BlockConsts, cross_attention, ffn, modulated_norm, qkv_rope, rope_qkv_table, sa_out
from varbench.engine.models.infinity import CrossAttnBlock, Infinity, key_runs
from varbench.engine.models.schedules import nearest_template, rope_reference_grid, rope_table, scale_schedule
from varbench.engine.models.text import TextBatch
from varbench.engine.plan import BlockPlan, GenerationContext, ScalePlan, ScaleSignals, SelectorContext, entropy_query_pick
from varbench.engine.policy import NeutralPolicy, Policy
from varbench.engine.plan import is_neutral
from varbench.engine.sampling import bit_entropy, guided_logits, sample_bits

log = logging.getLogger("varbench.engine.runtime")

_FULL = BlockPlan()


@dataclasses.dataclass
class GenerationOutput:
    images: Optional[torch.Tensor]          # (B, H, W, 3) uint8 RGB, None if decode=False
    summed_codes: torch.Tensor              # (B, d_vae, 1, H_lat, W_lat) before decode
    bits: list[Optional[torch.Tensor]]      # per scale (B, h, w, d) int64 on the transformer grid; None if no
                                            # image ran it, -1 in the rows of images that skipped it
    schedule: list[tuple[int, int]]
    trace: list[dict]                       # per scale: ran, executed tokens, keep fractions, entropy, ms (of
                                            # image 0's sub-batch; `image_traces` has every image's)
    flops: dict                             # the batch's {"total", "text", "per_scale": [...]}
    timings_ms: dict                        # {"text", "ar", "decode", "per_scale": [...]}
    policy_stats: dict                      # the policy's stats; per-image decisions at batch > 1: {"per_image": [...]}
    token_entropy: list[Optional[torch.Tensor]]  # per scale (B, h*w) predictive entropy (NaN: that image skipped it)
    image_traces: list[list[dict]] = dataclasses.field(default_factory=list)  # per image: the trace of its sub-batch
    image_flops: list[dict] = dataclasses.field(default_factory=list)         # per image: its share of `flops`
    image_stats: list[dict] = dataclasses.field(default_factory=list)         # per image: its policy's stats
    no_effect_reasons: list[Optional[str]] = dataclasses.field(default_factory=list)  # per image: why its
                                            # policy changed nothing (every plan neutral), else None


class _Timer:
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


class _KVCache:
    """Per-block K/V buffers (2, rows, H, capacity, c) preallocated for the whole schedule; blocks may
    hold different lengths (pruned K/V, skipped blocks). Static capacity keeps each step's shapes static."""

    def __init__(self, depth: int, capacity: int):
        self.full: list[Optional[torch.Tensor]] = [None] * depth   # all rows, as allocated
        self.kv: list[Optional[torch.Tensor]] = [None] * depth     # the rows in use
        self.len = [0] * depth
        self.capacity = capacity

    def restart(self) -> None:
        """Empty, keeping the buffers (graph mode: captured steps write to these addresses)."""
        self.kv, self.len = list(self.full), [0] * len(self.len)

    def append(self, bi: int, kv: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """kv (2, rows, H, n, c) -> this block's K, V so far, each (rows, H, len, c)."""
        if self.kv[bi] is None:
            two, rows, heads, _, c = kv.shape
            self.kv[bi] = self.full[bi] = kv.new_empty((2, rows, heads, self.capacity, c), dtype=dtype)
        buf, start = self.kv[bi], self.len[bi]
        self.len[bi] = end = start + kv.shape[3]
        buf.narrow(3, start, kv.shape[3]).copy_(kv)
        return buf.narrow(3, 0, end).unbind(0)

    def view(self, rows) -> "_KVCache":
        """A cache over `rows(buffer)` of every block's rows in use (views: appends write into this
        cache's memory), with the same capacity and lengths."""
        new = _KVCache(len(self.len), self.capacity)
        new.kv = [None if t is None else rows(t) for t in self.kv]
        new.full, new.len = list(new.kv), list(self.len)
        return new

    def drop_uncond(self, batch: int) -> None:
        self.kv = [None if t is None else t[:, :batch] for t in self.kv]


def _gather_rows(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """x (rows, L, C), idx (rows, K) -> (rows, K, C)."""
    return x.gather(1, idx.unsqueeze(-1).expand(-1, -1, x.shape[-1]))


def attention_entropy(q: torch.Tensor, k: torch.Tensor, chunk: int = 1024) -> torch.Tensor:
    """Exact per-query entropy of softmax(q k^T) (scale 1: q carries the cosine scale), mean over heads.

    H = logsumexp(s) - sum softmax(s) * s, evaluated in query chunks so the full L x L attention
    matrix is never held; (rows, H, Lq, c) x (rows, H, Lk, c) -> (rows, Lq).
    """
    out = []
    for s0 in range(0, q.shape[2], chunk):
        s = q[:, :, s0:s0 + chunk].float() @ k.float().transpose(-1, -2)
        lse = s.logsumexp(-1)
        out.append(lse - (s - lse.unsqueeze(-1)).exp().mul(s).sum(-1))
    return torch.cat(out, dim=2).mean(1)


class InfinityRuntime:
    """Holds the transformer, VAE and text encoder; runs generations under a policy."""

    def __init__(self, model: Infinity, vae, text_encoder, device: str | torch.device = "cpu",
                 dtype: torch.dtype = torch.float32, ca_bf16: bool = True, cuda_graphs: Optional[bool] = None,
                 fused_entropy: bool = True):
        """`dtype=torch.bfloat16` casts the blocks to bf16 and computes as the released bf16 autocast
        run does, with the casts written out (`varbench.engine.block_step`): word embedding and blocks in
        bf16, LayerNorms, q/k normalisation, RoPE, the residual stream and the head in fp32.
        `ca_bf16` computes cross-attention as the released flash-attn call does (bf16 inputs, P and
        output) even in fp32 runs; False is exact fp32 attention (a reference, not the release).

        `cuda_graphs` (None: True on CUDA) replays each scale step from a CUDA graph captured once
        per (scale, plan signature, state): the host launches one graph per scale instead of
        ~40 ops per block. A step's first occurrence runs eagerly, its second is captured. Graph
        mode keeps one generation state per input shape alive between calls (`clear_graphs`).
        `fused_entropy` (CUDA only): attention entropy requested by a plan comes out of the
        attention pass itself (`varbench.engine.kernels.flash_entropy`); its attention output then rounds
        like flash-attn but is not SDPA's bit for bit. False: SDPA + a second chunked pass."""
        self.device = torch.device(device)
        self.model = model.to(self.device).eval()
        self.vae = vae.to(self.device).eval() if vae is not None else None
        self.text_encoder = text_encoder.to(self.device).eval() if text_encoder is not None else None
        self.dtype = dtype
        self.ca_bf16 = ca_bf16
        if dtype != torch.float32:
            for b in self.model.blocks:
                b.to(dtype)
        self.cfg = model.cfg
        self.cuda_graphs = self.device.type == "cuda" if cuda_graphs is None else bool(cuda_graphs)
        if self.cuda_graphs and self.device.type != "cuda":
            raise ValueError(f"cuda_graphs=True needs a CUDA device, but the runtime is on {self.device}; "
                             "set runtime.cuda_graphs=false (or auto) on the CPU")
        self.fused_entropy = fused_entropy
        self._graph_states: dict = {}
        self._graph_pool = None
        self.max_graph_states = 1
        self.fallbacks: list[dict] = []   # {"knob", "error"}: GPU features that failed here and were turned off

    def fall_back(self, knob: str, err: BaseException) -> None:
        """A GPU feature failed on this machine (driver, Triton or SM mismatch): turn it off for this
        runtime, log one warning naming the knob that avoids the attempt, and record it."""
        attr = knob.rsplit(".", 1)[-1]
        setattr(self, attr, False)
        if attr == "cuda_graphs":
            self.clear_graphs()
        self.fallbacks.append({"knob": f"{knob}=false", "error": f"{type(err).__name__}: {err}"[:500]})
        log.warning("%s failed on this device (%s: %s); continuing eagerly without it. Set %s=false to skip "
                    "the attempt.", attr, type(err).__name__, str(err)[:300], knob)

    def clear_graphs(self) -> None:
        """Drop every captured graph and the generation states they read (frees their memory)."""
        self._graph_states.clear()
        self._graph_pool = None

    def rope_qkv(self, grid: tuple[int, int], h_div_w: float) -> torch.Tensor:
        """The scale's RoPE as one complex table for (q, k, v), (h*w, 3, 1, c/2), cached per grid."""
        return self._rope_qkv(tuple(grid), rope_reference_grid(h_div_w))

    @functools.lru_cache(maxsize=128)
    def _rope_qkv(self, grid, ref) -> torch.Tensor:
        return rope_qkv_table(rope_table(self.cfg.head_dim, grid, ref)).to(self.device)

    def embed_codes(self, codes: torch.Tensor) -> torch.Tensor:
        """word_embed of the next scale's input codes; in a bf16 run a bf16 linear, as under autocast."""
        we = self.model.word_embed
        if self.dtype == torch.float32:
            return we(codes)
        return F.linear(codes.to(self.dtype), we.weight.to(self.dtype), we.bias.to(self.dtype))

    # ------------------------------------------------------------------ text
    @torch.no_grad()
    def encode_text(self, prompts: Sequence[str]) -> TextBatch:
        return self.text_encoder(list(prompts)).to(self.device)

    def _condition(self, text: TextBatch, negative: Optional[TextBatch], cfg_rows: bool):
        """Normalised text for cross-attention, the pooled SOS/condition, and the shared AdaLN."""
        m = self.model
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
        cond = m.text_proj_for_sos(feats, mask, self.ca_bf16)
        ca_text = m.text_proj_for_ca(feats)
        shared_gss = m.shared_ada_lin(cond.float()).float()
        return ca_text, mask, cond, shared_gss

    # ------------------------------------------------------------------ generate
    @torch.no_grad()
    def generate(
        self,
        prompts: Sequence[str],
        seeds: Sequence[int],
        policy: Optional[Policy] = None,
        *,
        h_div_w: float = 1.0,
        pn: str = "1M",
        cfg: float | Sequence[float] = 4.0,
        tau: float | Sequence[float] = 1.0,
        top_k: int = 900,
        top_p: float = 0.97,
        negative_prompt: Optional[str] = None,
        decode: bool = True,
        text: Optional[TextBatch] = None,
        negative_text: Optional[TextBatch] = None,
        schedule: Optional[Sequence[tuple[int, int]]] = None,
    ) -> GenerationOutput:
        """Generate one image per prompt; image i draws from a generator seeded with seeds[i].

        cfg / tau: a number, or one value per scale. top_k / top_p act per bit (top_k >= 2 is a no-op).
        text / negative_text: pre-encoded text features (skip the text encoder); a negative prompt
        replaces the learned unconditional placeholder in the CFG branch.
        A policy with per-image decisions (`Policy.per_image_decisions`) runs, at batch > 1, as one
        fork per image and is itself left untouched: read `out.image_stats` for what each did.
        """
        policy = policy or NeutralPolicy()
        batch = len(prompts)
        if len(seeds) != batch:
            raise ValueError(f"got {batch} prompts but {len(seeds)} seeds; pass one seed per prompt")
        sched = [tuple(s) for s in (schedule or scale_schedule(h_div_w, pn))]
        n_scales = len(sched)
        if n_scales > self.cfg.num_levels:
            raise ValueError(f"schedule has {n_scales} scales but the model has {self.cfg.num_levels} level embeddings")
        cfgs = _per_scale(cfg, n_scales, "cfg")
        taus = _per_scale(tau, n_scales, "tau")
        cfg_rows = any(c != 1 for c in cfgs)
        dev = self.device
        timer = _Timer(dev)

        timer.mark()
        if text is None:
            text = self.encode_text(prompts)
        negative = negative_text if negative_text is not None else (
            self.encode_text([negative_prompt]) if negative_prompt else None)
        negative = negative if cfg_rows else None
        timer.mark()

        ctx = GenerationContext(schedule=tuple(sched), depth=self.cfg.depth, embed_dim=self.cfg.embed_dim,
                                num_heads=self.cfg.num_heads, batch=batch, cfg_rows=cfg_rows,
                                cfg=tuple(cfgs), tau=tuple(taus), device=str(dev))
        # per-image decisions (varbench.engine.batch_split): each image plans with its own copy of the
        # policy; images whose plans share a shape run as one sub-batch
        per_image = batch > 1 and getattr(policy, "per_image_decisions", False)   # duck-typed policies: shared
        policies = [policy.fork() for _ in range(batch)] if per_image else [policy]
        for p in policies:
            p.reset(dataclasses.replace(ctx, batch=1) if per_image else ctx)
        root = self._state(ctx, text, negative, sched, h_div_w, seeds)
        tflops = text_flops(self.cfg, root.text_tokens[root.rows0], root.rows0)
        image_tokens = [root.image_text_tokens(i) for i in range(batch)]
        groups = [(list(range(batch)), root)]
        del root   # after a split nothing may hold the whole batch's KV cache (graph mode keeps its own)
        scale_marks = _Timer(dev)
        for si in range(n_scales):
            scale_marks.mark()
            if per_image:
                groups = self._per_image_step(si, groups, policies, cfgs, taus, top_k, top_p)
                continue
            state = groups[0][1]
            plan = policy.plan(si)
            signals = state.step(si, plan, cfgs[si] if plan.cfg is None else plan.cfg,
                                 taus[si] if plan.tau is None else plan.tau, top_k, top_p)
            if signals is not None:
                policy.observe(si, signals)
        scale_marks.mark()
        timer.mark()
        state0 = groups[0][1]
        if len(groups) == 1:
            # graph mode: the state's buffer is refilled by the next generation, so hand out a copy
            summed_codes = state0.summed_codes if state0.graphs is None else state0.summed_codes.clone()
        else:
            summed_codes = scatter_images([(g, st.summed_codes) for g, st in groups], batch, 0.0)
        images = None
        if decode:
            images = self.decode(summed_codes)
        timer.mark()

        text_ms, ar_ms, decode_ms = timer.intervals_ms()
        per_scale_ms = scale_marks.intervals_ms()
        image_traces: list[list[dict]] = [None] * batch
        for g, st in groups:
            for tr, ms in zip(st.trace, per_scale_ms):
                tr["ms"] = ms
            for i in g:
                image_traces[i] = st.trace
        image_flops = [_image_flops(self.cfg, tr, tokens) for tr, tokens in zip(image_traces, image_tokens)]
        # the batch's count: each sub-batch's entry once (entries before a split are shared)
        per_scale_flops = [sum(scale_flops(self.cfg, tr) for tr in {id(st.trace[si]): st.trace[si] for _, st in groups}.values())
                           for si in range(n_scales)]
        image_stats = [p.stats() for p in policies] if per_image else [policy.stats()] * batch
        reasons = [_no_effect_reason(p, tr) for p, tr in zip(policies if per_image else [policy] * batch, image_traces)]
        return GenerationOutput(
            images=images, summed_codes=summed_codes, schedule=sched, trace=image_traces[0],
            bits=[scatter_images([(g, st.bits[si]) for g, st in groups], batch, -1) for si in range(n_scales)],
            token_entropy=[scatter_images([(g, st.entropies[si]) for g, st in groups], batch, float("nan"))
                           for si in range(n_scales)],
            flops={"total": tflops + sum(per_scale_flops), "text": tflops, "per_scale": per_scale_flops},
            timings_ms={"text": text_ms, "ar": ar_ms, "decode": decode_ms, "per_scale": per_scale_ms},
            policy_stats={"per_image": image_stats} if per_image else image_stats[0],
            image_traces=image_traces, image_flops=image_flops, image_stats=image_stats, no_effect_reasons=reasons,
        )

    def _per_image_step(self, si, groups, policies, cfgs, taus, top_k, top_p):
        """Scale si for every sub-batch: each image's policy plans, images with same-shaped plans run
        together (a sub-batch whose images disagree splits here), each image observes its own rows."""
        out = []
        for images, state in groups:
            plans = [policies[i].plan(si) for i in images]
            parts = group_by_plan(plans)
            subs = [state] if len(parts) == 1 else state.split(parts)
            for part, sub in zip(parts, subs):
                members = [images[j] for j in part]
                plan = merge_plans([plans[j] for j in part], state.ctx.cfg_rows)
                signals = sub.step(si, plan, cfgs[si] if plan.cfg is None else plan.cfg,
                                   taus[si] if plan.tau is None else plan.tau, top_k, top_p)
                if signals is not None:
                    for k, i in enumerate(members):
                        policies[i].observe(si, select_signals(signals, k, len(members)))
                out.append((members, sub))
        return out

    def _state(self, ctx, text, negative, sched, h_div_w, seeds) -> "_GenState":
        """A fresh generation state; in graph mode the one of the previous call with the same shapes,
        refilled in place (its tensors are what the captured graphs read and write)."""
        if not self.cuda_graphs:
            return _GenState(self, ctx, text, negative, sched, h_div_w, seeds)
        key = (ctx, tuple(text.features.shape), tuple(text.lens), None if negative is None else
               (tuple(negative.features.shape), tuple(negative.lens)), nearest_template(h_div_w))
        state = self._graph_states.get(key)
        if state is None:
            # each state holds a whole KV cache: keep only the newest (a new prompt length or batch
            # size starts over eagerly; the timed pass repeats one shape and replays)
            while len(self._graph_states) >= self.max_graph_states:
                self._graph_states.pop(next(iter(self._graph_states)))
            state = self._graph_states[key] = _GenState(self, ctx, text, negative, sched, h_div_w, seeds)
            state.graphs = {}
        else:
            state.restart(text, negative, seeds)
        return state

    @torch.no_grad()
    def decode(self, summed_codes: torch.Tensor) -> torch.Tensor:
        """Codes -> uint8 RGB (B, H, W, 3): (x + 1) / 2 * 255, truncated as released (clamped first).

        Images decode one at a time so an image's pixels do not depend on its batch neighbours
        (batched convolutions may pick other kernels)."""
        # channels-last, the layout the released loop leaves its summed codes in: the decoder's
        # convolutions round differently per layout (about 1e-5, enough to flip uint8 pixels)
        img = torch.cat([self.vae.decode(c.squeeze(-3).float().contiguous(memory_format=torch.channels_last))
                         for c in summed_codes.split(1)])
        img = ((img + 1) / 2).clamp_(0, 1)
        return img.permute(0, 2, 3, 1).mul_(255).to(torch.uint8)


def _image_flops(cfg, trace: list[dict], tokens: tuple[int, int]) -> dict:
    """One image's FLOPs: every count is linear in the rows except cross-attention's, which goes with
    each row's text length, so an image's share is its scale entries counted for its own rows and
    its own prompt's text tokens (`tokens`: cond row, uncond row). They sum to the batch's count."""
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


def _no_effect_reason(policy: Policy, trace: list[dict]) -> Optional[str]:
    """Why `policy` changed nothing for an image whose every plan was neutral (its own reason, or
    the generic one); None if some plan was not neutral."""
    from varbench.engine.effect import NEUTRAL_REASON

    if not all(tr.get("neutral") for tr in trace):
        return None
    hook = getattr(policy, "no_effect_reason", None)
    return (hook() if hook is not None else None) or NEUTRAL_REASON


def new_generator(device: torch.device, seed: int) -> torch.Generator:
    """The per-image sampling generator on `device`, seeded. One function so that the fake-CUDA dry
    run (`varbench.engine.fake_cuda`), where no CUDA generator can exist without a driver, can stand one in."""
    g = torch.Generator(device=device)
    g.manual_seed(int(seed))
    return g


def _per_scale(v, n: int, name: str) -> list[float]:
    if isinstance(v, (int, float)):
        return [float(v)] * n
    v = [float(x) for x in v]
    if len(v) < n:
        raise ValueError(f"{name} has {len(v)} values but the schedule has {n} scales; give one per scale or a single number")
    return v[:n]


@dataclasses.dataclass
class _StepOut:
    """What one scale step produced (in graph mode: the captured step's static tensors)."""

    logits: torch.Tensor                 # (rows, n, 2d) head output
    guided: torch.Tensor                 # (B, n, 2d) tempered, guided logits
    bits: torch.Tensor                   # (B, h, w, d)
    entropy: torch.Tensor                # (B, n)
    attn_ent: dict
    attn_idx: dict
    counts: list                         # per block executed tokens (host ints)
    residual_store: Optional[dict]


@dataclasses.dataclass
class _CapturedStep:
    graph: "torch.cuda.CUDAGraph"
    out: _StepOut
    kv_len: list                         # KV lengths after the step (host state the replay must restore)


class _GenState:
    """Mutable state of one generation: residual stream input, KV cache, codes, residual caches."""

    def __init__(self, rt: InfinityRuntime, ctx: GenerationContext, text: TextBatch, negative: Optional[TextBatch],
                 sched: list[tuple[int, int]], h_div_w: float, seeds: Sequence[int]):
        self.rt, self.m, self.ctx, self.sched = rt, rt.model, ctx, sched
        self.batch = ctx.batch
        self.rows = self.rows0 = ctx.rows
        self.ca_text, self.ca_mask, self.cond, self.shared_gss = rt._condition(text, negative, ctx.cfg_rows)
        self.blocks: list[CrossAttnBlock] = self.m.blocks
        self._build_text_consts()
        self.kv = _KVCache(len(self.blocks), sum(h * w for h, w in sched))
        self.kv_dtype = torch.float32 if rt.dtype == torch.float32 else torch.bfloat16
        self.rope = [rt.rope_qkv(hw, h_div_w) for hw in sched]
        self.patch = 2 if rt.cfg.patchify else 1
        hl, wl = sched[-1]
        self.latent_size = (1, hl * self.patch, wl * self.patch)
        d_vae = rt.cfg.vae_codebook_dim
        self.summed_codes = torch.zeros(self.batch, d_vae, *self.latent_size, device=rt.device)
        self.generators = [new_generator(rt.device, s) for s in seeds]
        self.residuals: dict[int, dict[tuple[int, str], torch.Tensor]] = {}
        self.bits: list[Optional[torch.Tensor]] = []
        self.entropies: list[Optional[torch.Tensor]] = []
        self.trace: list[dict] = []
        self.dropped_uncond = False
        self.consts_full = self.consts
        self.h_div_w = h_div_w
        self.graphs: Optional[dict] = None     # graph mode: plan/state key -> _CapturedStep
        self.seen: set = set()                 # keys run once eagerly (captured at the second sighting)
        self.keep_buffers: dict = {}           # static copies of plans' kept indices, read by graphs
        self.static_ptrs: set = set()          # residual tensors that are captured steps' outputs

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

    def split(self, parts: Sequence[Sequence[int]]) -> list["_GenState"]:
        """States for `parts` (lists of image positions that together make this batch), to continue
        apart (per-image decisions, `varbench.engine.batch_split`). The big tensors are not copied: the KV
        cache's and the residual caches' rows are permuted in place so that each part's rows ([cond;
        uncond] of its images) lie together, and each part's state views its slice (one block's
        buffer is copied at a time, so a split costs no second cache). This state is spent after.
        The parts run eagerly: graph mode captures whole-batch states only, whose tensors live
        across generations."""
        B, parts = self.batch, [list(p) for p in parts]

        def permute(t: torch.Tensor, dim: int) -> None:
            rows = [r for p in parts for r in image_rows(p, B, t.shape[dim])]
            if rows != list(range(len(rows))):
                t.copy_(t.index_select(dim, torch.tensor(rows, device=t.device)))

        for t in self.kv.kv:
            if t is not None:
                permute(t, 1)
        for cached in self.residuals.values():
            for t in cached.values():
                permute(t, 0)
        subs, first = [], 0
        for p in parts:
            subs.append(self._part(p, first))
            first += len(p)
        return subs

    def _part(self, images: list[int], first: int) -> "_GenState":
        """The state of `images`, whose cache rows start at image `first` after `split`'s permutation."""
        sub = object.__new__(_GenState)
        sub.__dict__.update(self.__dict__)   # rt, model, schedule, RoPE tables, latent size: shared
        b, B = len(images), self.batch

        def rows_of(t: torch.Tensor, dim: int) -> torch.Tensor:   # this part's slice of a permuted tensor
            per = t.shape[dim] // B
            return t.narrow(dim, first * per, b * per)

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
        sub.kv = self.kv.view(lambda t: rows_of(t, 1))
        sub.residuals = {s: {k: rows_of(t, 0) for k, t in d.items()} for s, d in self.residuals.items()}
        sub.summed_codes = self.summed_codes.index_select(0, idx)
        sub.generators = [self.generators[i] for i in images]   # each image keeps drawing from its own
        sub.bits = [None if t is None else t.index_select(0, idx) for t in self.bits]
        sub.entropies = [None if t is None else t.index_select(0, idx) for t in self.entropies]
        sub.trace = list(self.trace)          # the entries so far are shared (they ran for these images too)
        sub.graphs, sub.seen, sub.keep_buffers, sub.static_ptrs = None, set(), {}, set()
        return sub

    def restart(self, text: TextBatch, negative: Optional[TextBatch], seeds: Sequence[int]) -> None:
        """Graph mode: begin a new generation in the same tensors (captured steps read their addresses)."""
        fresh = _GenState(self.rt, self.ctx, text, negative, self.sched, self.h_div_w, seeds)
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
        self.residuals, self.bits, self.entropies, self.trace = {}, [], [], []

    # -------------------------------------------------------------- input of scale si
    def _scale_input(self, si: int) -> torch.Tensor:
        m = self.m
        if si == 0:
            x = self.cond.unsqueeze(1) + m.pos_start.expand(self.rows0, 1, -1)
            x = x[: self.rows]
        else:
            h, w = self.sched[si]
            nxt = F.interpolate(self.summed_codes, size=(1, h * self.patch, w * self.patch), mode="trilinear").squeeze(-3)
            if self.patch > 1:
                nxt = patchify_codes(nxt)
            nxt = nxt.reshape(*nxt.shape[:2], -1).permute(0, 2, 1)
            x = self.rt.embed_codes(nxt).repeat(self.rows // self.batch, 1, 1)
        return x + self.m.lvl_embed.weight[si]

    # -------------------------------------------------------------- one scale
    def step(self, si: int, plan: ScalePlan, cfg: float, tau: float, top_k: int, top_p: float) -> Optional[ScaleSignals]:
        h, w = self.sched[si]
        n = h * w
        if not plan.run:
            self.bits.append(None)
            self.entropies.append(None)
            self.trace.append({"si": si, "h": h, "w": w, "ran": False, "rows": 0, "batch": self.batch, "tokens": n, "blocks": [],
                               "neutral": False})
            return None
        if plan.drop_uncond and self.ctx.cfg_rows and not self.dropped_uncond:
            self.dropped_uncond = True
            self.rows = self.batch
            self.kv.drop_uncond(self.batch)
            self.consts = [bc.first_rows(self.batch) for bc in self.consts]
        elif self.dropped_uncond and not plan.drop_uncond:
            raise ValueError(f"scale {si}: the unconditional branch was dropped at an earlier scale and cannot return")
        for bi, bp in plan.blocks.items():
            if not 0 <= bi < len(self.blocks):
                raise ValueError(f"plan for scale {si} names block {bi}; the model has blocks 0..{len(self.blocks) - 1}")
            bp.validate(n)
        out = self._run_core(si, plan, cfg, tau, top_k, top_p)
        if out.residual_store is not None:
            self.residuals[si] = out.residual_store
        for s in plan.release_residuals:
            self.residuals.pop(s, None)
        self.entropies.append(out.entropy)
        self.bits.append(out.bits)
        self.trace.append({"si": si, "h": h, "w": w, "ran": True, "rows": self.rows, "batch": self.batch, "tokens": n,
                           "text_tokens": self.text_tokens[self.rows], "blocks": out.counts,
                           "neutral": is_neutral(plan)})   # the image is what the released model makes (varbench.engine.effect)
        cfg_active = self.rows == 2 * self.batch
        d = out.guided.shape[-1] // 2
        return ScaleSignals(
            scale=si, h=h, w=w, token_entropy=out.entropy, logits=out.guided.view(self.batch, n, d, 2),
            cond_logits=(out.logits[: self.batch].mul(1 / tau).view(self.batch, n, d, 2) if cfg_active else None),
            attention_entropy=out.attn_ent, attention_query_index=out.attn_idx,
            executed_tokens={bi: {k: c[k] for k in ("sa", "ca", "ffn")} for bi, c in enumerate(out.counts)},
            tau=tau, cfg=cfg, summed_codes=self.summed_codes, decode=self.rt.decode if self.rt.vae is not None else None,
        )

    def _core(self, si: int, plan: ScalePlan, cfg: float, tau: float, top_k: int, top_p: float) -> "_StepOut":
        """The device work of one scale: blocks, head, guidance, sampling, code accumulation. No host
        reads of GPU values, so it can be captured as a CUDA graph."""
        h, w = self.sched[si]
        n = h * w
        x = self._scale_input(si)
        counts_all, attn_ent, attn_idx = [], {}, {}
        residual_store = {} if plan.keep_residuals else None
        for bi in range(len(self.blocks)):
            bp = plan.blocks.get(bi, _FULL)
            counts = {"mode": bp.mode, "sa": 0, "kv": self.kv.len[bi], "qkv": 0, "ca": 0, "ffn": 0, "ent_q": 0}
            if bp.mode == "full" and residual_store is None and bi not in plan.attention_entropy_for:
                x = self._full_block(si, bi, x)
                counts.update(sa=n, qkv=n, ca=n, ffn=n, kv=self.kv.len[bi])
            elif bp.mode != "skip":
                x = self._block(si, bi, x, bp, counts, residual_store,
                                bi in plan.attention_entropy_for, plan.attention_entropy_queries, attn_ent, attn_idx,
                                plan.attention_entropy_sampling)
            counts_all.append(counts)
        logits = self.m.logits(x, self.cond[:self.rows])
        guided = guided_logits(logits, self.batch, cfg, tau, self.rows == 2 * self.batch)
        bits = sample_bits(guided, self.generators, top_k, top_p).view(self.batch, h, w, -1)
        entropy = bit_entropy(guided)
        self._accumulate(si, bits)
        return _StepOut(logits, guided, bits, entropy, attn_ent, attn_idx, counts_all, residual_store)

    def _run_core(self, si, plan, cfg, tau, top_k, top_p) -> "_StepOut":
        """Eager, or through a CUDA graph: first sighting of a key eager, second captured, then replayed."""
        key = None if self.graphs is None else self._graph_key(si, plan, cfg, tau, top_k, top_p)
        if key is None:
            return self._core(si, plan, cfg, tau, top_k, top_p)
        plan = self._static_keeps(si, plan)
        step = self.graphs.get(key)
        if step is None:
            if key not in self.seen:  # allocations, lazy inits and kernel compilation happen here
                self.seen.add(key)
                return self._core(si, plan, cfg, tau, top_k, top_p)
            kv_len, rng = list(self.kv.len), [g.get_state() for g in self.generators]
            try:
                graph, out = self._capture(lambda: self._core(si, plan, cfg, tau, top_k, top_p))
            except Exception as err:  # noqa: BLE001 - any capture failure: degrade to eager, don't die
                # a capture runs nothing on the device: undo its host-side effects and run the step eagerly
                self.kv.len = kv_len
                for g, st in zip(self.generators, rng):
                    g.set_state(st)
                self.graphs = None
                self.rt.fall_back("runtime.cuda_graphs", err)
                return self._core(si, plan, cfg, tau, top_k, top_p)
            if out.residual_store is not None:
                self.static_ptrs.update(t.data_ptr() for t in out.residual_store.values())
            step = self.graphs[key] = _CapturedStep(graph, out, list(self.kv.len))
        else:
            step.graph.replay()
        self.kv.len = list(step.kv_len)
        out = step.out  # static tensors: overwritten by the next replay, so keep copies of what outlives it
        return dataclasses.replace(out, bits=out.bits.clone(), entropy=out.entropy.clone())

    def _capture(self, fn):
        """Capture `fn` (one scale step) as a CUDA graph, then replay it once (capture runs nothing)."""
        if self.rt._graph_pool is None:
            self.rt._graph_pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        for g in self.generators:  # per-image generators advance on every replay as in eager mode
            graph.register_generator_state(g)
        with torch.cuda.graph(graph, pool=self.rt._graph_pool):
            out = fn()
        graph.replay()
        return graph, out

    def _graph_key(self, si, plan: ScalePlan, cfg, tau, top_k, top_p) -> Optional[tuple]:
        """Everything a captured step bakes in: the plan's shape (not its kept indices, which are
        copied into static buffers), the KV lengths, and the addresses of the residuals it may read.
        None (run eagerly): the plan has a selector that is not a dataclass (no stable signature), or
        residuals of an eager step are alive (a graph would read their soon-freed memory)."""
        blocks = []
        for bi, bp in sorted(plan.blocks.items()):
            sel = None
            if bp.selector is not None:
                if not dataclasses.is_dataclass(bp.selector):
                    return None
                sel = (type(bp.selector).__qualname__, dataclasses.astuple(bp.selector))
            blocks.append((bi, bp.mode, bp.n_keep, tuple(bp.sublayers), bp.fill, bp.cache_from, bp.prune_kv,
                           None if bp.keep is None else tuple(bp.keep.shape), sel))
        residuals = tuple((src, k, t.data_ptr()) for src, d in sorted(self.residuals.items()) for k, t in sorted(d.items()))
        if any(ptr not in self.static_ptrs for *_, ptr in residuals):
            return None  # residuals from an eager step live in memory a graph must not hold on to
        return (si, tuple(blocks), plan.keep_residuals, tuple(sorted(plan.attention_entropy_for)),
                plan.attention_entropy_queries, plan.attention_entropy_sampling, self.rows, tuple(self.kv.len), residuals,
                cfg, tau, top_k, top_p)

    def _static_keeps(self, si: int, plan: ScalePlan) -> ScalePlan:
        """The plan with every `keep` copied into a buffer that lives as long as this state."""
        if not any(bp.keep is not None for bp in plan.blocks.values()):
            return plan
        blocks = {}
        for bi, bp in plan.blocks.items():
            if bp.keep is not None:
                key = (si, bi, tuple(bp.keep.shape))
                buf = self.keep_buffers.get(key)
                if buf is None:
                    buf = self.keep_buffers[key] = torch.empty(bp.keep.shape, dtype=torch.long, device=self.rt.device)
                buf.copy_(bp.keep)
                bp = dataclasses.replace(bp, keep=buf)
            blocks[bi] = bp
        return dataclasses.replace(plan, blocks=blocks)

    def _accumulate(self, si: int, bits_grid: torch.Tensor) -> None:
        """Bits -> BSQ codes (+-1/sqrt(d), L2-normalised) -> summed codes, as released."""
        b = bits_grid
        if self.patch > 1:  # (B, h, w, 4d) -> (B, 2h, 2w, d), the released pixel_shuffle order
            b = unpatchify_bits(b)
        codes = bits_to_codes(b).unsqueeze(1).permute(0, 4, 1, 2, 3)            # (B, d, 1, H, W)
        if si != len(self.sched) - 1:
            self.summed_codes += F.interpolate(codes, size=self.latent_size, mode="trilinear")
        else:
            self.summed_codes += codes

    # -------------------------------------------------------------- one block, every token
    def _full_block(self, si: int, bi: int, x: torch.Tensor) -> torch.Tensor:
        """The baseline block: the fewest ops (see `varbench.engine.block_step`)."""
        bc = self.consts[bi]
        rot = qkv_rope(bc, modulated_norm(x, bc.scale1, bc.shift1, bc.eps), self.rope[si])   # (3, rows, H, n, c)
        k, v = self.kv.append(bi, rot[1:], self.kv_dtype)
        q = rot[0]
        attn = F.scaled_dot_product_attention(q.to(k.dtype), k, v, scale=1.0)
        x = torch.addcmul(x, sa_out(bc, attn), bc.g1)
        x = x + cross_attention(bc, x)
        return torch.addcmul(x, ffn(bc, x), bc.g2)

    # -------------------------------------------------------------- one block under a plan
    def _block(self, si, bi, x, bp: BlockPlan, counts, residual_store,
               want_entropy: bool, entropy_queries: Optional[int], attn_ent: dict, attn_idx: dict,
               entropy_sampling: str = "even"):
        bc = self.consts[bi]
        h, w = self.sched[si]
        rows, n, _ = x.shape
        pruned = bp.mode == "prune"

        def indices(sub):
            if not pruned or sub not in bp.sublayers:
                return None
            if bp.keep is not None:
                idx = bp.keep
            else:
                idx = bp.selector(x, SelectorContext(scale=si, block=bi, sublayer=sub, h=h, w=w, batch=self.batch,
                                                     cfg_rows=rows == 2 * self.batch))
            idx = idx.to(x.device)
            return idx[:rows] if idx.shape[0] >= rows else idx.repeat(rows // idx.shape[0], 1)

        # --- self-attention
        idx = indices("sa")
        xin = modulated_norm(x, bc.scale1, bc.shift1, bc.eps)
        table = self.rope[si]
        if idx is not None and bp.prune_kv:  # only kept tokens make q, k, v
            rot = qkv_rope(bc, _gather_rows(xin, idx), table[idx])
            counts["qkv"] = idx.shape[1]
        else:
            rot = qkv_rope(bc, xin, table)
            counts["qkv"] = n
        kk, vv = self.kv.append(bi, rot[1:], self.kv_dtype)
        q = rot[0]
        if idx is not None and not bp.prune_kv:  # every token gives K/V, kept tokens query
            q = q.gather(2, idx[:, None, :, None].expand(-1, q.shape[1], -1, q.shape[3]))
        qpos = idx
        counts["kv"] = kk.shape[2]
        fused = want_entropy and self.rt.fused_entropy and x.device.type == "cuda"
        if fused:  # entropy of every query from the attention pass itself (ToProVAR's Flash Attention Entropy)
            from varbench.engine.kernels import flash_attention_with_entropy

            try:
                attn, ent_all = flash_attention_with_entropy(q.to(kk.dtype), kk, vv, scale=1.0)
            except Exception as err:  # noqa: BLE001 - Triton/driver/SM mismatch: SDPA + a second pass instead
                self.rt.fall_back("runtime.fused_entropy", err)
                fused = False
        if not fused:
            attn = F.scaled_dot_product_attention(q.to(kk.dtype), kk, vv, scale=1.0)
        if want_entropy:
            sub_pos = qpos if qpos is not None else torch.arange(n, device=x.device).expand(rows, -1)
            pick = None
            if entropy_queries is not None and entropy_queries < q.shape[2]:
                pick = entropy_query_pick(q.shape[2], entropy_queries, si, entropy_sampling, x.device)
                sub_pos = sub_pos[:, pick]
            if fused:
                attn_ent[bi] = ent_all if pick is None else ent_all[:, pick]
            else:
                attn_ent[bi] = attention_entropy(q if pick is None else q[:, :, pick], kk)
            attn_idx[bi] = sub_pos
            counts["ent_q"] = sub_pos.shape[1]
        counts["sa"] = q.shape[2]
        x = self._apply_branch(si, bi, "sa", x, sa_out(bc, attn), bc.g1, idx, bp, residual_store)

        # --- cross-attention
        idx = indices("ca")
        xq = x if idx is None else _gather_rows(x, idx)
        counts["ca"] = xq.shape[1]
        x = self._apply_branch(si, bi, "ca", x, cross_attention(bc, xq), None, idx, bp, residual_store)

        # --- FFN
        idx = indices("ffn")
        xq = x if idx is None else _gather_rows(x, idx)
        counts["ffn"] = xq.shape[1]
        return self._apply_branch(si, bi, "ffn", x, ffn(bc, xq), bc.g2, idx, bp, residual_store)

    def _apply_branch(self, si, bi, sub, x, branch, gate, idx, bp: BlockPlan, residual_store):
        """x + gate * branch. Full sublayers compute it as the lean block does (bit for bit); pruned
        ones fill the pruned positions first (cached residual or nothing)."""
        if idx is None:
            if residual_store is not None:
                residual_store[(bi, sub)] = branch.float() if gate is None else branch.float().mul(gate)
            return x + branch if gate is None else torch.addcmul(x, branch, gate)
        rows, n, c = x.shape
        branch = branch.float() if gate is None else branch.float().mul(gate)
        if bp.fill == "pass":
            return x.scatter_add(1, idx.unsqueeze(-1).expand(-1, -1, c), branch)
        base = self._cached_branch(si, bi, sub, rows, bp.cache_from)
        full = base.scatter(1, idx.unsqueeze(-1).expand(-1, -1, c), branch)
        if residual_store is not None:
            residual_store[(bi, sub)] = full
        return x + full

    def _cached_branch(self, si, bi, sub, rows, cache_from) -> torch.Tensor:
        """The branch output cached at `cache_from` (default: the nearest earlier scale that kept
        residuals), area-resized to this scale's grid."""
        src = cache_from
        if src is None:
            src = next((c for c in sorted(self.residuals, reverse=True) if c < si and (bi, sub) in self.residuals[c]), None)
        return self._resize_cached(si, bi, sub, rows, src)

    def _resize_cached(self, si, bi, sub, rows, src) -> torch.Tensor:
        if src is None or (bi, sub) not in self.residuals.get(src, {}):
            raise ValueError(f"scale {si} block {bi}: fill='cache' needs an earlier scale run with keep_residuals=True "
                             f"(none found for sublayer {sub}); set keep_residuals on the cache scale or use fill='pass'")
        cached = self.residuals[src][(bi, sub)][:rows]
        hs, ws = self.sched[src]
        h, w = self.sched[si]
        c = cached.shape[-1]
        grid = cached.transpose(1, 2).reshape(rows, c, hs, ws)
        return F.interpolate(grid, size=(h, w), mode="area").reshape(rows, c, h * w).transpose(1, 2)
