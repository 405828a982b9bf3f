"""Run our runtime on the cases of the upstream golden fixture and record what a portable comparison needs.

Shared by tests/engine/test_upstream_parity.py (the comparison) and tests/engine/measure_parity_spread.py (which
re-measures, under other CPU kernel paths, the spreads the tolerances there are built on).

A run is *teacher-forced*: after our sampler has drawn a scale's bits (and we have recorded them), the
fixture's bits for that scale are fed forward instead. So a bit that legitimately flips on another CPU
(its decision margin within the logits' rounding spread) does not change every later scale: each scale
is compared given the released code's own history, every bit of every scale is checked, and the image
is decoded from the released bits. Where every bit agrees (the writer's CPU) forcing changes nothing.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from varbench.engine.backbones.infinity.bsq_vae import BSQVAE, VAEConfig, load_vae_state_dict
from varbench.engine.backbones.infinity.checkpoints import load_strict
from varbench.engine.backbones.infinity.model import Infinity, InfinityConfig
from varbench.engine.backbones.infinity.runtime import InfinityRuntime
from varbench.engine.backbones.infinity.sampling import filter_top_k_top_p_
from varbench.engine.text import TextBatch
from varbench.testing.tiny import strict_parity  # noqa: F401  (re-exported for the parity tests)

GOLD_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "upstream_golden"
GOLD = GOLD_DIR / "tiny_infinity_golden.pt"
WRITER = GOLD_DIR / "writer.json"     # which CPU / ISA wrote the fixture (read by the strict mode's messages)

# name -> ca_bf16 flag of our runtime (True: the released bf16 flash-attn numerics; False: pure fp32)
CASES = {
    "a_cfg4_tau1": True,
    "b_cfg3_tau05": True,
    "c_per_scale_cfg_tau": True,
    "d_cfg1_no_guidance": True,
    "e_nonsquare_hdivw0.5_cfg4": True,
    "f_negative_prompt_cfg4": True,
    "g_no_topk_topp_cfg4": True,
    "i_1M_cfg4_tau1": True,            # 13 scales: where P rounding first flips bits at scale 3
    "a_cfg4_tau1_fp32_ca": False,      # released bf16 cast dropped: pure fp32 cross-attention
}


def writer_info() -> dict:
    return json.loads(WRITER.read_text())


def load_golden():
    """(fixture dict, Infinity, BSQVAE) with the fixture's weights loaded strictly, in fp32."""
    g = torch.load(GOLD, weights_only=True)
    assert g["format_version"] == 2
    k = g["infinity_kwargs"]
    cfg = InfinityConfig(depth=k["depth"], embed_dim=k["embed_dim"], num_heads=k["num_heads"], codebook_dim=16,
                         text_channels=k["text_channels"], text_maxlen=k["text_maxlen"], block_chunks=k["block_chunks"],
                         vae="golden")
    model = Infinity(cfg)
    load_strict(model, {n: t.float() if t.is_floating_point() else t for n, t in g["infinity_state_dict"].items()}, "golden")
    v = g["vae_kwargs"]
    vae = BSQVAE(VAEConfig(codebook_dim=v["codebook_dim"], patch_size=v["patch_size"], base_ch=v["base_ch"],
                           ch_mult=tuple(v["encoder_ch_mult"]), num_res_blocks=2))
    load_vae_state_dict(vae, {n: t.float() if t.is_floating_point() else t for n, t in g["vae_state_dict"].items()})
    return g, model, vae


def text_batch(feats: torch.Tensor) -> TextBatch:
    return TextBatch(feats[None].float(), torch.ones(1, feats.shape[0], dtype=torch.bool), [feats.shape[0]])


def decide(pairs: torch.Tensor, expo: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """The bit torch.multinomial(probs, 1, replacement=True) picks for logit pairs (N, 2), given the Exp(1)
    draws it makes: on the CPU a single sample is argmax(probs / E) with E ~ Exp(1) per category
    (aten multinomial's fast path). The replay is checked against the real draw in every run."""
    probs = filter_top_k_top_p_(pairs.clone(), top_k, top_p).softmax(dim=-1)
    return (probs / expo).argmax(dim=-1)


def near_threshold(pairs: torch.Tensor, expo: torch.Tensor, top_k: int, top_p: float, delta: float) -> torch.Tensor:
    """Bits (N,) whose decision changes when each logit moves by at most `delta`.

    The decision depends only on d = l1 - l0 and is monotone in it (bit 1 iff d > log(E1/E0), clamped
    by top-p's cut-off), so testing the two extreme shifts of d by -/+ 2*delta is enough."""
    shift = torch.tensor([delta, -delta], dtype=pairs.dtype)
    return decide(pairs + shift, expo, top_k, top_p) != decide(pairs - shift, expo, top_k, top_p)


@dataclass
class CaseRun:
    guided: list       # per scale: (L*16, 2) fp32 logit pairs entering the sampler (after tau and CFG)
    ours: list         # per scale: (L*16,) int64, the bits our sampler drew given the fixture's history
    ref: list          # per scale: (L*16,) int64, the fixture's bits
    expo: list         # per scale: (L*16, 2) the Exp(1) draws the multinomial call made (replayed)
    top_k: int
    top_p: float
    pooled: torch.Tensor         # TextAttentivePool output (rows [cond, uncond])
    pool_attn: torch.Tensor      # its attention output, the input of its output projection (bf16 values)
    summed_codes: torch.Tensor   # decoded from the fixture's bits (teacher-forced)
    image: torch.Tensor          # (1, H, W, 3) uint8 RGB
    schedule: list


def run_case(golden, case: str, force: bool = True, **overrides) -> CaseRun:
    """One generation of `case`, recording sampler inputs, our bits and the replayed draws per scale.

    force=True feeds the fixture's bits forward after each scale (module docstring). `overrides`
    replace entries of the case's inputs (the tests' mutations: a wrong cfg must be caught)."""
    import varbench.engine.backbones.infinity.state as rtmod   # the scale step samples there

    g, model, vae = golden
    c = g["cases"][case]
    inp = {**c["inputs"], **overrides}
    ref_bits = [b.long().reshape(-1) for b in c["bits"]]
    rec = {"guided": [], "ours": [], "expo": [], "pooled": [], "topk": None}
    orig = rtmod.sample_bits

    def spy(guided, gens, top_k, top_p):
        assert guided.shape[0] == 1 and len(gens) == 1, "the fixture's cases are batch 1"
        replay = torch.Generator()
        replay.set_state(gens[0].get_state())
        pairs = guided.reshape(-1, 2)
        expo = torch.empty(pairs.shape, dtype=torch.float32).exponential_(1, generator=replay)
        bits = orig(guided, gens, top_k, top_p)
        assert torch.equal(decide(pairs, expo, top_k, top_p), bits.reshape(-1)), (
            "replaying torch.multinomial as argmax(p / Exp(1)) no longer reproduces its draws: torch changed "
            "its CPU sampler; update golden_parity.decide")
        si = len(rec["ours"])
        rec["guided"].append(pairs.clone())
        rec["ours"].append(bits.reshape(-1).clone())
        rec["expo"].append(expo)
        rec["topk"] = (top_k, top_p)
        if force and si < len(ref_bits) and ref_bits[si].numel() == bits.numel():
            return ref_bits[si].to(bits.dtype).view_as(bits)
        return bits

    hook = model.text_proj_for_sos.register_forward_hook(lambda m, i, o: rec["pooled"].append(o.detach().clone()))
    pre = model.text_proj_for_sos.ca.proj.register_forward_pre_hook(
        lambda m, a: rec.setdefault("pool_attn", a[0].detach().clone()))
    rtmod.sample_bits = spy
    try:
        rt = InfinityRuntime(model, vae, None, ca_bf16=CASES[case])
        neg = text_batch(inp["neg_kv_compact"]) if "neg_kv_compact" in inp else None
        out = rt.generate(["<features given>"], [inp["g_seed"]], h_div_w=inp["h_div_w"], pn=inp["pn"],
                          cfg=inp["cfg_list"], tau=inp["tau_list"], top_k=inp["top_k"], top_p=inp["top_p"],
                          text=text_batch(inp["text_kv_compact"]), negative_text=neg)
    finally:
        rtmod.sample_bits = orig
        hook.remove()
        pre.remove()
    assert len(rec["pooled"]) == 1
    return CaseRun(rec["guided"], rec["ours"], ref_bits, rec["expo"], rec["topk"][0], rec["topk"][1],
                   rec["pooled"][0], rec["pool_attn"].reshape(rec["pooled"][0].shape), out.summed_codes, out.images, list(out.schedule))


def unpack(d: dict) -> torch.Tensor:
    """A release fixture's packed bool mask ``{"shape", "packed"}`` (numpy.packbits of the flattened mask)."""
    import math

    import numpy as np

    shape = d["shape"]
    return torch.from_numpy(np.unpackbits(d["packed"].numpy(), count=math.prod(shape)).reshape(shape).astype(bool))


def release_forced_run(policy, ref_bits: list, case: str = "i_1M_cfg4_tau1", golden=None):
    """`policy` on the golden tiny model's `case`, teacher-forced to a release fixture's bits (`ref_bits`: per
    scale, the release's bits) as run_case is to the golden's: our bits are recorded, the release's fed
    forward. Shared by the release-equivalence tests (ScaleKV, SparVAR, SparseVAR), whose fixtures ran the
    release on this model and case. Returns (CaseRun, GenerationOutput); the CaseRun's pooled/image are None."""
    import varbench.engine.backbones.infinity.state as rtmod

    g, model, vae = golden or load_golden()
    inp = g["cases"][case]["inputs"]
    rec = {"ours": [], "guided": [], "expo": []}
    orig = rtmod.sample_bits

    def spy(guided, gens, top_k, top_p):
        replay = torch.Generator()
        replay.set_state(gens[0].get_state())
        pairs = guided.reshape(-1, 2)
        expo = torch.empty(pairs.shape, dtype=torch.float32).exponential_(1, generator=replay)
        b = orig(guided, gens, top_k, top_p)
        assert torch.equal(decide(pairs, expo, top_k, top_p), b.reshape(-1))
        si = len(rec["ours"])
        rec["ours"].append(b.reshape(-1).clone())
        rec["guided"].append(pairs.clone())
        rec["expo"].append(expo)
        return ref_bits[si].to(b.dtype).view_as(b)

    rtmod.sample_bits = spy
    try:
        rt = InfinityRuntime(model, vae, None, ca_bf16=CASES[case])
        out = rt.generate(["<features given>"], [inp["g_seed"]], policy, h_div_w=inp["h_div_w"], pn=inp["pn"],
                          cfg=inp["cfg_list"], tau=inp["tau_list"], top_k=inp["top_k"], top_p=inp["top_p"],
                          text=text_batch(inp["text_kv_compact"]), decode=False)
    finally:
        rtmod.sample_bits = orig
    run = CaseRun(rec["guided"], rec["ours"], [b.reshape(-1) for b in ref_bits], rec["expo"], inp["top_k"], inp["top_p"],
                  None, None, out.summed_codes, None, list(out.schedule))
    return run, out


@dataclass
class BitReport:
    bits: int          # bits compared (every bit of every scale)
    near: int          # bits whose decision a logit move of `delta` could change
    flips: int         # bits that differ from the fixture and are near the threshold: rounding flips
    far: dict          # scale -> count of bits that differ although their margin exceeds `delta`

    def describe(self, case: str, delta: float) -> str:
        return (f"{case}: {sum(self.far.values())} bits differ from the released code with a decision margin "
                f"beyond the logit tolerance {delta:g} (per scale: {self.far}); {self.flips} near-threshold "
                f"flips, {self.near} of {self.bits} bits near the threshold")


def compare_bits(run: CaseRun, delta: float) -> BitReport:
    """Our bits against the fixture's, scale by scale, each given the fixture's history (teacher forcing)."""
    near = flips = n = 0
    far = {}
    for si, (pairs, ours, ref, expo) in enumerate(zip(run.guided, run.ours, run.ref, run.expo)):
        nt = near_threshold(pairs, expo, run.top_k, run.top_p, delta)
        diff = ours != ref
        n += ours.numel()
        near += int(nt.sum())
        flips += int((diff & nt).sum())
        if int((diff & ~nt).sum()):
            far[si] = int((diff & ~nt).sum())
    return BitReport(n, near, flips, far)
