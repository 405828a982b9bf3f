"""The Infinity next-scale loop: the one mechanism every method runs on.

    rt = InfinityRuntime(model, vae, text_encoder)
    out = rt.generate(["a red circle"], seeds=[0], policy=Baseline(), cfg=4.0, tau=1.0)

Per scale: ask the policy for a `ScalePlan`; run the blocks under it (full / skip / prune with a
cached-residual or pass-through fill); compute logits, temper, guide, sample bits per image;
accumulate codes with the VAE's trilinear interpolation; hand `ScaleSignals` to the policy.

This module is the loop; what it hands back (`GenerationOutput`) is the seam's
(`varbench.engine.generation`, the same for every backbone). One scale's work lives beside it in this
folder:
- `state`: the generation state (codes, residual caches, generators, its `KVCache` from
  `varbench.engine.kv_cache`) and its scale step (`GenState.step`); a full block is `block_step`'s lean
  path (constants prepared once per generation, ~40 ops);
- `pruned`: a block under a plan (pruned, keeping residuals, asked for attention entropy), computing
  its full sublayers with the same ops, so a neutral plan reproduces the baseline bit for bit;
and in the seam: `varbench.engine.attention` (the exact attention entropy; the fused kernel is
`kernels/`), `varbench.engine.graphs` (CUDA-graph capture and replay of scale steps, and its eager
fallback), `varbench.engine.batch_split` (per-image decisions, sub-batches that share a plan).

Design rules (CUDA graphs): nothing inside a scale step (`GenState.core`) reads GPU values on the
host; every shape inside a step follows from the schedule and the plan (`n_keep` is static). Host
reads happen between steps (policy.observe) and after the loop (traces). In graph mode
(`cuda_graphs`) a step is captured per (scale, plan signature, KV lengths, residual addresses) and
replayed; everything it reads lives in a generation state reused in place across calls.
"""
from __future__ import annotations

import contextlib
import functools
import logging
from typing import Optional, Sequence

import torch
import torch.nn.functional as F

from varbench.engine.backbones.infinity.block_step import rope_qkv_table
from varbench.engine.backbones.infinity.compiled import EAGER_OPS, CompileLog
from varbench.engine.backbones.infinity.flops import image_flops, scale_flops, text_flops
from varbench.engine.backbones.infinity.model import Infinity
from varbench.engine.backbones.infinity.schedules import nearest_template, rope_reference_grid, rope_table, scale_schedule
from varbench.engine.backbones.infinity.state import GenState
from varbench.engine.batch_split import (batch_kv_bytes, image_policies, image_traces, part_entries, scatter_images,
                                         scatter_per_scale, step_groups)
from varbench.engine.effect import no_effect_reason
from varbench.engine.generation import GenerationOutput, Timer, per_scale_values
from varbench.engine.graphs import StepGraphs
from varbench.engine.kv_cache import note_kv_bytes, policy_kv_capacity
from varbench.engine.plan import GenerationContext
from varbench.engine.policy import NeutralPolicy, Policy
from varbench.engine.text import TextBatch

log = logging.getLogger("varbench.engine.backbones.infinity.runtime")


                                            # cache {"allocated", "used"} bytes (`KVCache.nbytes`, summed
                                            # over sub-batches; allocated includes the staging buffer of
                                            # KV budgets); "allocated" is the same at every scale once each
                                            # block has appended (buffers are preallocated)


class InfinityRuntime:
    """Holds the transformer, VAE and text encoder; runs generations under a policy."""

    def __init__(self, model: Infinity, vae, text_encoder, device: str | torch.device = "cpu",
                 dtype: torch.dtype = torch.float32, ca_bf16: bool = True, cuda_graphs: Optional[bool] = None,
                 fused_entropy: bool = True):
        """`dtype=torch.bfloat16` casts the blocks to bf16 and computes as the released bf16 autocast
        run does, with the casts written out (`varbench.engine.backbones.infinity.block_step`): word embedding and blocks in
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
        self._graph_states: dict = {}      # graph mode: input shapes -> the GenState kept for them
        self.graph_pool = None             # the memory pool of every captured step (made at the first capture)
        self.max_graph_states = 1
        self.fallbacks: list[dict] = []   # {"knob", "error"}: GPU features that failed here and were turned off
        #: per-image plans of different shapes at batch > 1: "pad" runs them as one padded step
        #: (`varbench.engine.padded_batch`: the launches of one batch, the padding's FLOPs), "split"
        #: as sub-batches of equal shape (no padding, a batch's launches per sub-batch)
        self.adaptive_batch = "pad"
        #: the block functions a scale step calls: eager (today's ops), or compiled (`runtime.compile`,
        #: varbench.engine.backbones.infinity.compiled)
        self.block_ops = EAGER_OPS
        self.compile_log = CompileLog()    # compile time apart from the steady state (compiled runs only)
        self.attn_backend = "auto"         # runtime.attn_backend (varbench.engine.attn_backend)
        self.quant = "none"                # runtime.quant (varbench.engine.backbones.infinity.quant)

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
        self.graph_pool = None

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

    # ------------------------------------------------------------------ generate
    def knobs_context(self):
        """What wraps every generation for the systems knobs: the compile log when the blocks are
        compiled (compile time apart from the steady state) and the attention backend
        (`runtime.attn_backend`; nothing at auto)."""
        from varbench.engine.attn_backend import attention_backend

        stack = contextlib.ExitStack()
        if self.block_ops.mode != "off":
            stack.enter_context(self.compile_log.watch())
        stack.enter_context(attention_backend(self.attn_backend))
        return stack

    def knobs_summary(self) -> dict:
        """The systems knobs as this runtime applies them (the record's `timing.runtime` and provenance)."""
        return {"compile": self.block_ops.mode, "compile_fullgraph": self.block_ops.fullgraph,
                "compile_log": self.compile_log.summary() if self.block_ops.mode != "off" else None,
                "quant": self.quant, "attn_backend": self.attn_backend, "cuda_graphs": bool(self.cuda_graphs)}

    def generate(self, *args, **kwargs) -> GenerationOutput:
        """`_generate` (below: one image per prompt under a policy) inside `knobs_context`."""
        with self.knobs_context():
            return self._generate(*args, **kwargs)

    @torch.no_grad()
    def _generate(
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
        cfgs = per_scale_values(cfg, n_scales, "cfg")
        taus = per_scale_values(tau, n_scales, "tau")
        cfg_rows = any(c != 1 for c in cfgs)
        dev = self.device
        timer = Timer(dev)

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
        per_image, policies = image_policies(policy, ctx)
        root = self._state(ctx, text, negative, sched, h_div_w, seeds, policy_kv_capacity(policies, ctx))
        tflops = text_flops(self.cfg, root.text_tokens[root.rows0], root.rows0)
        image_tokens = [root.image_text_tokens(i) for i in range(batch)]
        groups = [(list(range(batch)), root)]
        del root   # after a split nothing may hold the whole batch's KV cache (graph mode keeps its own)

        def run(si, state, plan):
            signals = state.step(si, plan, cfgs[si] if plan.cfg is None else plan.cfg,
                                 taus[si] if plan.tau is None else plan.tau, top_k, top_p)
            note_kv_bytes(state)
            return signals

        scale_marks = Timer(dev)
        for si in range(n_scales):
            scale_marks.mark()
            groups = step_groups(si, groups, policies, per_image, run)
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
        traces = image_traces(groups, batch, per_scale_ms)
        per_image_flops = [image_flops(self.cfg, tr, tokens) for tr, tokens in zip(traces, image_tokens)]
        # the batch's count: each sub-batch's entry once (entries before a split are shared)
        per_scale_flops = [sum(scale_flops(self.cfg, tr) for tr in part_entries(groups, "trace", si)) for si in range(n_scales)]
        flops = {"total": tflops + sum(per_scale_flops), "text": tflops, "per_scale": per_scale_flops}
        if any(tr.get("padded") for trace in traces for tr in trace):   # what padding added to the images' own work
            flops["padding"] = flops["total"] - sum(f["total"] for f in per_image_flops)
        image_stats = [p.stats() for p in policies] if per_image else [policy.stats()] * batch
        reasons = [no_effect_reason(p, tr) for p, tr in zip(policies if per_image else [policy] * batch, traces)]
        return GenerationOutput(
            images=images, summed_codes=summed_codes, schedule=sched, trace=traces[0],
            bits=scatter_per_scale(groups, "bits", batch, n_scales, -1),
            token_entropy=scatter_per_scale(groups, "entropies", batch, n_scales, float("nan")),
            flops=flops,
            timings_ms={"text": text_ms, "ar": ar_ms, "decode": decode_ms, "per_scale": per_scale_ms},
            policy_stats={"per_image": image_stats} if per_image else image_stats[0],
            image_traces=traces, image_flops=per_image_flops, image_stats=image_stats, no_effect_reasons=reasons,
            kv_bytes=batch_kv_bytes(groups, n_scales),
        )

    def _state(self, ctx, text, negative, sched, h_div_w, seeds, kv_capacity=None) -> GenState:
        """A fresh generation state; in graph mode the one of the previous call with the same shapes,
        refilled in place (its tensors are what the captured graphs read and write).
        `kv_capacity`: per-block KV capacities (None: the whole schedule)."""
        if not self.cuda_graphs:
            return GenState(self, ctx, text, negative, sched, h_div_w, seeds, kv_capacity)
        key = (ctx, tuple(text.features.shape), tuple(text.lens), None if negative is None else
               (tuple(negative.features.shape), tuple(negative.lens)), nearest_template(h_div_w),
               None if kv_capacity is None else tuple(kv_capacity))
        state = self._graph_states.get(key)
        if state is None:
            # each state holds a whole KV cache: keep only the newest (a new prompt length or batch
            # size starts over eagerly; the timed pass repeats one shape and replays)
            while len(self._graph_states) >= self.max_graph_states:
                self._graph_states.pop(next(iter(self._graph_states)))
            state = self._graph_states[key] = GenState(self, ctx, text, negative, sched, h_div_w, seeds, kv_capacity)
            state.graphs = StepGraphs(self)
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


