"""The HART next-stage loop on the shared seams: `HartRuntime.generate` asks the same `Policy` for
plans, hands it the same `ScaleSignals`, and returns the same `GenerationOutput` as `InfinityRuntime`.

    rt = HartRuntime(model, quant, decoder, text_encoder)
    out = rt.generate(["a red circle"], seeds=[0], policy=Baseline(), cfg=4.5)

What is shared with Infinity: the plan and signal types (`varbench.engine.plan`), the policy
interface, the KV cache and its budget rule (`varbench.engine.kv_cache`), the pruned-branch cache
fill (`varbench.engine.residuals.cached_branch`), the exact attention entropy, the generation output and
timing marks (`varbench.engine.generation`), the trace and FLOPs formats. What is HART's (this folder): stage 0 is the text context, tokens are
categorical over a 4096-word codebook (token entropy = the entropy of the guided softmax), f_hat
grows through the shared phi convs, and the last stage adds the residual diffusion head's sample
(timed inside the AR loop and counted in its FLOPs, `varbench.engine.backbones.hart.flops`).

The schedule a policy sees is HART's patch_nums as square grids ((1, 1), (2, 2), ..., (64, 64)
for the 0.7B): HART is square-only at its trained resolution (1024², 64x64 tokens).
CFG rows are always carried, as released: the guidance weight at stage si is cfg * si / (S - 1),
so even cfg = 0 runs the unconditional rows (the release does; `drop_uncond` plans drop them).
Numerics: fp32, or fp16/bf16 autocast (`dtype=torch.float16` is what the release's sample.py runs
on CUDA: the whole loop under `torch.autocast(float16)`).
Policies with per-image decisions run at batch > 1 as on Infinity (`varbench.engine.batch_split`):
one fork per image, images whose plans share a shape run as one sub-batch, and a sub-batch splits
(`HartState.split`) where its images disagree; a batch whose plans all agree runs exactly as the
batched baseline. Not with the release's shared generators (`generators=`), which are consumed
batch-wide in row order: there a per-image policy at batch > 1 is refused.
"""
from __future__ import annotations

import contextlib
import logging
from typing import Optional, Sequence

import torch

from varbench.engine.backbones.hart.flops import hart_image_flops, hart_scale_flops, hart_text_flops
from varbench.engine.backbones.hart.model import HART, HartQuantizer
from varbench.engine.backbones.hart.sampling import DiffusionSchedule
from varbench.engine.backbones.hart.state import HartState
from varbench.engine.batch_split import (batch_kv_bytes, image_policies, image_traces, part_entries, scatter_images,
                                         scatter_per_scale, step_groups)
from varbench.engine.effect import no_effect_reason
from varbench.engine.generation import GenerationOutput, Timer, per_scale_values
from varbench.engine.kv_cache import note_kv_bytes, policy_kv_capacity
from varbench.engine.plan import GenerationContext
from varbench.engine.policy import NeutralPolicy, Policy
from varbench.engine.text import TextBatch

log = logging.getLogger("varbench.engine.hart")


class HartRuntime:
    """Holds the HART transformer, the tokenizer (quantizer + decoder) and the text encoder."""

    family = "hart"

    def __init__(self, model: HART, quant: HartQuantizer, decoder: Optional[torch.nn.Module], text_encoder,
                 device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32):
        """`dtype`: float32 computes in fp32; float16 / bfloat16 run the loop under autocast in that
        dtype (the release: float16 on CUDA), weights stay fp32 as the release keeps them."""
        if dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise ValueError(f"HART runs in float32, float16 or bfloat16 (autocast), not {dtype}")
        self.device = torch.device(device)
        self.model = model.to(self.device).eval()
        self.quant = quant.to(self.device).eval()
        self.vae = decoder.to(self.device).eval() if decoder is not None else None
        self.text_encoder = text_encoder.to(self.device).eval() if text_encoder is not None else None
        self.dtype = dtype
        self.cfg = model.cfg
        self.cuda_graphs = False        # not on HART: the loop runs eagerly
        self.fused_entropy = False
        self.fallbacks: list[dict] = []
        self.attn_backend = "auto"      # runtime.attn_backend (varbench.engine.attn_backend); no compile, no quant here
        self._diffusion: Optional[DiffusionSchedule] = None   # built on first use (diffusion_schedule)

    def diffusion_schedule(self) -> DiffusionSchedule:
        """The diffusion head's respaced schedule, built once per runtime with its per-step coefficients
        on the runtime's device (every generation reuses them: no host -> device copy per generation)."""
        if self._diffusion is None:
            self._diffusion = DiffusionSchedule(self.cfg.num_sampling_steps)
            self._diffusion.coefficients(self.device)
        return self._diffusion

    def clear_graphs(self) -> None:
        """Nothing is captured on HART (the harness calls this on every runtime)."""

    def autocast(self):
        if self.dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    @property
    def schedule(self) -> list[tuple[int, int]]:
        return [(p, p) for p in self.cfg.patch_nums]

    @torch.no_grad()
    def encode_text(self, prompts: Sequence[str]) -> TextBatch:
        return self.text_encoder(list(prompts)).to(self.device)

    # ------------------------------------------------------------------ generate
    def generate(self, *args, **kwargs) -> GenerationOutput:
        """`_generate` (below) under the attention backend `runtime.attn_backend` picks."""
        from varbench.engine.attn_backend import attention_backend

        with attention_backend(self.attn_backend):
            return self._generate(*args, **kwargs)

    @torch.no_grad()
    def _generate(self, prompts: Sequence[str], seeds: Sequence[int], policy: Optional[Policy] = None, *,
                 h_div_w: float = 1.0, pn: Optional[str] = None, cfg: float | Sequence[float] = 4.5,
                 tau: float | Sequence[float] = 1.0, top_k: int = 0, top_p: float = 0.0, more_smooth: bool = False,
                 negative_prompt: Optional[str] = None, decode: bool = True, text: Optional[TextBatch] = None,
                 negative_text: Optional[TextBatch] = None, schedule: Optional[Sequence[tuple[int, int]]] = None,
                 generators: Optional[tuple[torch.Generator, torch.Generator]] = None) -> GenerationOutput:
        """One image per prompt; image i draws its tokens and its diffusion noise from generators
        seeded with seeds[i] (batch-independent). `generators=(tokens, diffusion)` instead consumes
        one pair for the whole batch exactly as the release does (parity with upstream at any batch).

        cfg: the release's guidance scale (a number, or one per stage), ramped as the release ramps it.
        tau: temperature on the guided logits (1: the release, which has none). top_k: 0 = the release's
        rule (600 for stages < 7, else 300), else one top-k for every stage; top_p: 0 = off (released).
        more_smooth: the release's gumbel-softmax mixing of the codebook (sample.py's default True).
        pn is accepted for the harness's sake and ignored (HART has one resolution); a schedule
        other than the model's patch_nums, or h_div_w != 1, is refused."""
        policy = policy or NeutralPolicy()
        refuse = getattr(policy, "backbone_refusal", None)   # duck-typed policies (no Policy base) declare nothing
        refusal = refuse("hart") if refuse is not None else None
        if refusal:
            raise ValueError(refusal)
        batch = len(prompts)
        if len(seeds) != batch:
            raise ValueError(f"got {batch} prompts but {len(seeds)} seeds; pass one seed per prompt")
        if abs(float(h_div_w) - 1.0) > 1e-6:
            raise ValueError(f"HART generates square images only (h_div_w=1.0), got h_div_w={h_div_w}")
        sched = self.schedule
        if schedule is not None and [tuple(s) for s in schedule] != sched:
            raise ValueError(f"HART's stages are its patch_nums {self.cfg.patch_nums}; an explicit schedule "
                             f"{list(schedule)} cannot change them (the level embeddings and RoPE are trained on them)")
        n = len(sched)
        cfgs, taus = per_scale_values(cfg, n, "cfg"), per_scale_values(tau, n, "tau")
        ctx = GenerationContext(schedule=tuple(sched), depth=self.cfg.depth, embed_dim=self.cfg.embed_dim,
                                num_heads=self.cfg.num_heads, batch=batch, cfg_rows=True, cfg=tuple(cfgs),
                                tau=tuple(taus), device=str(self.device), backbone="hart")
        # per-image decisions (varbench.engine.batch_split): each image plans with its own fork;
        # images whose plans share a shape run as one sub-batch
        per_image, policies = image_policies(policy, ctx)
        if per_image and generators is not None:
            raise ValueError("a policy with per-image decisions at batch > 1 splits the batch into sub-batches, which the "
                             "release's shared generators (generators=(tokens, diffusion)) cannot follow; pass "
                             "generators=None (per-image seeds) or the method's shared batch rule")
        timer = Timer(self.device)
        timer.mark()
        text = text if text is not None else self.encode_text(prompts)
        negative = negative_text if negative_text is not None else (self.encode_text([negative_prompt]) if negative_prompt else None)
        timer.mark()

        def run(si, state, plan):
            signals = state.step(si, plan, cfgs[si] if plan.cfg is None else plan.cfg,
                                 taus[si] if plan.tau is None else plan.tau, top_k, top_p, more_smooth)
            note_kv_bytes(state)
            return signals

        with self.autocast():
            root = HartState(self, ctx, text, negative, seeds, policy_kv_capacity(policies, ctx), generators)
            tflops = hart_text_flops(self.cfg, root.rows0)
            groups = [(list(range(batch)), root)]
            del root   # after a split nothing may hold the whole batch's KV cache
            marks = Timer(self.device)
            for si in range(n):
                marks.mark()
                groups = step_groups(si, groups, policies, per_image, run)
            marks.mark()
        timer.mark()
        f_hat = scatter_images([(g, st.f_hat) for g, st in groups], batch, 0.0)
        images = self.decode(f_hat) if decode else None
        timer.mark()
        text_ms, ar_ms, decode_ms = timer.intervals_ms()
        per_scale_ms = marks.intervals_ms()
        traces = image_traces(groups, batch, per_scale_ms)
        # the batch's count: each sub-batch's entry once (entries before a split are shared)
        per_scale = [sum(hart_scale_flops(self.cfg, tr) for tr in part_entries(groups, "trace", si)) for si in range(n)]
        deciders = policies if per_image else policies * batch   # the policy behind each image
        image_stats = [p.stats() for p in policies] * (1 if per_image else batch)
        return GenerationOutput(
            images=images, summed_codes=f_hat, schedule=sched, trace=traces[0],
            bits=scatter_per_scale(groups, "tokens", batch, n, -1),
            flops={"total": tflops + sum(per_scale), "text": tflops, "per_scale": per_scale},
            timings_ms={"text": text_ms, "ar": ar_ms, "decode": decode_ms, "per_scale": per_scale_ms},
            policy_stats={"per_image": image_stats} if per_image else image_stats[0],
            token_entropy=scatter_per_scale(groups, "entropies", batch, n, float("nan")), image_traces=traces,
            image_flops=[hart_image_flops(self.cfg, tr) for tr in traces], image_stats=image_stats,
            no_effect_reasons=[no_effect_reason(p, tr) for p, tr in zip(deciders, traces)],
            kv_bytes=batch_kv_bytes(groups, n))

    @torch.no_grad()
    def decode(self, f_hat: torch.Tensor) -> torch.Tensor:
        """f_hat (B, Cvae, P, P) -> uint8 RGB (B, H, W, 3) with the tokenizer's decoder, one image at
        a time (an image's pixels do not depend on its batch neighbours)."""
        if self.vae is None:
            raise ValueError("this HART runtime has no tokenizer decoder; build it with one, or generate(decode=False)")
        return self.vae.decode(f_hat.float())   # HartImageDecoder.decode: per image, as released


__all__ = ["HartRuntime"]
