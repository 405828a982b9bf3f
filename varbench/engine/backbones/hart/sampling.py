"""HART's released sampling loop (`HARTForT2I.autoregressive_infer_cfg`) and residual diffusion sampler,
on `varbench.engine.backbones.hart` modules. Reproduces the release bit for bit in tokens on the
`tests/fixtures/hart_golden` fixture; a foundation for the runtime seam (no Policy hooks yet).

Released behaviour kept on purpose (each is visible in the fixture):
- CFG weight t = cfg * si / (S - 1) per stage; the last stage (and its diffusion head) reuses the
  *previous* stage's ratio (a loop variable upstream), i.e. t = cfg * (S - 2) / (S - 1).
- Stage 0 samples one token from the logits of the last text position.
- top_k = 600 for stages < 7, else 300; top-p off by default. The top-k mask is applied in place, so
  `more_smooth` (gumbel-softmax mixing of the codebook) sees the top-k-masked logits.
- The last stage is one MaskGIT iteration over all tokens (the release's default), so the random
  order it draws does not matter.
- The diffusion head draws its noise from a second generator (the release uses the global one),
  including noise for the unconditional rows and for the final step, which are then unused.
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np
import torch

from varbench.engine.backbones.hart.model import HART, HartQuantizer, rope_1d, rope_2d, stage_positions


def sample_top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float, generator: torch.Generator) -> torch.Tensor:
    """(B, l) samples from (B, l, V) logits; masks `logits` in place (as released)."""
    b, l, v = logits.shape
    if top_k > 0:
        logits.masked_fill_(logits < logits.topk(top_k, largest=True, sorted=False, dim=-1)[0].amin(dim=-1, keepdim=True), -torch.inf)
    if top_p > 0:
        sl, si = logits.sort(dim=-1, descending=False)
        remove = sl.softmax(dim=-1).cumsum_(dim=-1) <= (1 - top_p)
        remove[..., -1:] = False
        logits.masked_fill_(remove.scatter(si.ndim - 1, si, remove), -torch.inf)
    return torch.multinomial(logits.softmax(dim=-1).view(-1, v), num_samples=1, replacement=True, generator=generator).view(b, l)


def gumbel_mix(logits: torch.Tensor, tau: float, codebook: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Soft codebook mixture softmax((logits + Gumbel) / tau) @ codebook [gumbel_softmax_with_rng, hard=False]."""
    g = -torch.empty_like(logits, memory_format=torch.legacy_contiguous_format).exponential_(generator=generator).log()
    return ((logits + g) / tau).softmax(-1) @ codebook.unsqueeze(0)


class DiffusionSchedule:
    """The respaced IDDPM schedule of `create_diffusion(timestep_respacing=steps, noise_schedule="cosine")`
    with learned-range variance, in float64 as released."""

    def __init__(self, steps: str = "8", T: int = 1000):
        ab = lambda t: math.cos((t + 0.008) / 1.008 * math.pi / 2) ** 2   # noqa: E731
        base = np.array([min(1 - ab((i + 1) / T) / ab(i / T), 0.999) for i in range(T)], dtype=np.float64)
        use = sorted(self._space(T, steps))
        acp, last, betas = np.cumprod(1.0 - base), 1.0, []
        for i in use:
            betas.append(1 - acp[i] / last)
            last = acp[i]
        self.timestep_map = use
        b = np.array(betas, dtype=np.float64)
        a = np.cumprod(1.0 - b)
        prev = np.append(1.0, a[:-1])
        pv = b * (1.0 - prev) / (1.0 - a)
        self.num_steps = len(b)
        self.sqrt_recip = np.sqrt(1.0 / a)
        self.sqrt_recipm1 = np.sqrt(1.0 / a - 1)
        self.log_var_clipped = np.log(np.append(pv[1], pv[1:]))
        self.log_betas = np.log(b)
        self.coef1 = b * np.sqrt(prev) / (1.0 - a)
        self.coef2 = (1.0 - prev) * np.sqrt(1.0 - b) / (1.0 - a)
        self._on: dict[str, dict[str, torch.Tensor]] = {}

    #: the per-step arrays the sampler multiplies by
    COEFFICIENTS = ("log_betas", "log_var_clipped", "sqrt_recip", "sqrt_recipm1", "coef1", "coef2")

    def coefficients(self, device) -> dict[str, torch.Tensor]:
        """The per-step arrays as float32 tensors on `device` (each float64 value rounded once, exactly what
        the release's per-step `torch.tensor(arr[i], dtype=float64).float()` gives), made on the first call
        per device. The sampler indexes them on the device: a host number copied in at every step is a
        blocking host -> device copy (a stream sync) on CUDA. `HartState` calls this before its loop."""
        key = str(torch.device(device))
        if key not in self._on:
            self._on[key] = {k: torch.tensor(getattr(self, k), dtype=torch.float64, device=device).float()
                             for k in self.COEFFICIENTS}
        return self._on[key]

    @staticmethod
    def _space(T: int, steps: str) -> set[int]:
        counts = [int(x) for x in str(steps).split(",")]
        size_per, extra, start, out = T // len(counts), T % len(counts), 0, []
        for i, n in enumerate(counts):
            size = size_per + (1 if i < extra else 0)
            stride, at = (1 if n <= 1 else (size - 1) / (n - 1)), 0.0
            for _ in range(n):   # accumulated, as released (round(j * stride) could differ at a tie)
                out.append(start + round(at))
                at += stride
            start += size
        return set(out)


def diffusion_sample(net, z: torch.Tensor, cfg: float, generator: Optional[torch.Generator], sched: DiffusionSchedule,
                     temperature: float = 1.0, vae_scale: float = 0.6, randn=None) -> torch.Tensor:
    """(N, Cvae) residual latents for conditions z (N, C) [DiffLoss.sample + p_sample_loop]. With cfg != 1
    the rows are [cond; uncond] and share noise.

    Noise: `randn(rows)` -> (rows, Cvae) when given (the runtime's per-image draws), else one draw from
    `generator` per call over all rows, as the release draws from the global generator."""
    n, cc, dev = z.shape[0], net.in_channels, z.device
    if randn is None:
        randn = lambda rows: torch.randn(rows, cc, generator=generator, device=dev)   # noqa: E731
    if cfg != 1.0:
        noise = randn(n // 2)
        x = torch.cat((noise, noise))
        fn = lambda x, t: net.forward_with_cfg(x, t, z, cfg)   # noqa: E731
    else:
        x = randn(n)
        fn = lambda x, t: net(x, t, z)   # noqa: E731
    c = sched.coefficients(dev)   # 0-d views c[k][i] below: no host value enters the loop
    for i in reversed(range(sched.num_steps)):
        out = fn(x, torch.full((n,), sched.timestep_map[i], dtype=torch.long, device=dev))
        eps, var = torch.split(out, cc, dim=1)
        frac = (var + 1) / 2
        log_var = frac * c["log_betas"][i] + (1 - frac) * c["log_var_clipped"][i]
        x0 = (c["sqrt_recip"][i] * x - c["sqrt_recipm1"][i] * eps).clamp(-1, 1)
        mean = c["coef1"][i] * x0 + c["coef2"][i] * x
        noise = randn(x.shape[0])
        nonzero = float(i != 0)
        x = mean + nonzero * torch.exp(0.5 * log_var) * noise * temperature
    return x * vae_scale


@torch.no_grad()
def sample_hart(model: HART, quant: HartQuantizer, text: torch.Tensor, text_mask: torch.Tensor, text_pos: torch.Tensor,
                cfg: float = 4.5, seed: int = 0, diffusion_generator: Optional[torch.Generator] = None,
                top_p: float = 0.0, more_smooth: bool = False, use_diffusion: bool = True) -> dict:
    """Generate the final latent f_hat (B, Cvae, P, P) for B prompts.

    text (B, context_token, context_dim) encoder states, text_mask (B, context_token) bool, text_pos
    (B, context_token) position ids (cumsum(mask) - 1). `seed` seeds the token sampler; the diffusion head
    draws from `diffusion_generator` (default: a generator seeded with `seed`).
    Returns {"f_hat", "tokens": [per stage (B, l)], "logits": [per stage (2B, l, V), before CFG],
    "diffusion": (2B*L, Cvae) head output or None}.
    """
    cfg_m, dev = model.cfg, text.device
    pns, S, B, C = cfg_m.patch_nums, len(cfg_m.patch_nums), text.shape[0], cfg_m.embed_dim
    rng = torch.Generator(device=dev).manual_seed(seed)
    dgen = diffusion_generator or torch.Generator(device=dev).manual_seed(seed)
    cond = model.embed_context(torch.cat((text, torch.zeros_like(text))))
    pos = torch.cat((text_pos, torch.zeros_like(text_pos)))
    mask = torch.cat((text_mask, torch.zeros_like(text_mask)))
    mask[B:, 0] = 1
    mods = [blk.modulation(cond, mask) for blk in model.blocks]
    caches = [[] for _ in model.blocks]
    lvl_pos = model.level_embeddings()
    x = cond + lvl_pos[:, : cfg_m.context_token]
    f_hat = cond.new_zeros(B, cfg_m.cvae, pns[-1], pns[-1])
    rec = {"tokens": [], "logits": [], "diffusion": None}
    hd = cfg_m.head_dim

    def run_blocks(x, si):
        cos, sin = rope_1d(pos, hd) if si == 0 else rope_2d(stage_positions(pns, si, pos[:, -1]), hd)
        for blk, mod, cache in zip(model.blocks, mods, caches):
            x = blk(x, mod, cos, sin, cache)
        return x

    def pick(logits, si, ratio):
        idx = sample_top_k_top_p(logits, top_k=600 if si < 7 else 300, top_p=top_p, generator=rng)
        rec["tokens"].append(idx)
        if not more_smooth:
            return idx, quant.embedding(idx)
        tau = max(0.27 * (1 - ratio * 0.95), 0.005)
        return idx, gumbel_mix(logits.mul(1 + ratio), tau, quant.embedding.weight, rng)

    cur, ratio = 0, 0.0
    for si, pn in enumerate(pns[:-1]):
        ratio = si / (S - 1)
        cur += cfg_m.context_token if si == 0 else pn * pn
        h = run_blocks(x, si)
        logits = model.logits(h, cond)
        rec["logits"].append(logits)
        t = cfg * ratio
        logits = (1 + t) * logits[:B] - t * logits[B:]
        if si == 0:
            logits = logits[:, [-1], :]
        _, emb = pick(logits, si, ratio)
        f_hat, nxt = quant.next_input(si, f_hat, emb.transpose_(1, 2).reshape(B, cfg_m.cvae, pn, pn))
        x = model.word_embed(nxt.view(B, cfg_m.cvae, -1).transpose(1, 2)) + lvl_pos[:, cur: cur + pns[si + 1] ** 2]
        x = x.repeat(2, 1, 1)

    si = S - 1
    h = run_blocks(x, si)
    logits = model.logits(h, cond)
    rec["logits"].append(logits)
    t = cfg * ratio   # the previous stage's ratio, as released
    logits = (1 + t) * logits[:B] - t * logits[B:]
    idx, emb = pick(logits, si, ratio)
    if use_diffusion:
        disc = model.word_embed(quant.embedding(idx))
        z = model.decoder_norm(h + torch.cat((disc, disc)))
        n, L = z.shape[:2]
        resid = diffusion_sample(model.diffloss.net, z.reshape(n * L, C), t, dgen, DiffusionSchedule(cfg_m.num_sampling_steps))
        rec["diffusion"] = resid
        emb = emb + resid.reshape(n, L, -1).chunk(2, dim=0)[0]
    f_hat += emb.transpose(1, 2).reshape(B, cfg_m.cvae, pns[-1], pns[-1])
    rec["f_hat"] = f_hat
    return rec
