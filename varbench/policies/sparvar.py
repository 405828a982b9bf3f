"""SparVAR: sparse attention for the last scales, no token or scale dropped (`sparvar`).

Method card
-----------
Paper:   SparVAR (CVPR'26, arXiv 2602.04361); the official CAS-CLab/SparVAR is README-only, so this
         follows the only public code, Weepingchestnut/Lvar @ f94b7ecc (models/sparvar/, defaults in
         models/sparvar/sparse-attn-config.yml), checked against it on a tiny random model
         (tests/engine/test_sparvar_release.py).
Changes: self-attention only; nothing is evicted, every token runs every block.
         CS4A, blocks <= `bound_layer`: at `decision_scale` (40² on 1M) attention is dense and each
         group of 192 queries remembers the `top_keys` share of the cache with the largest softmax
         column sums (784 of 4,121 keys at 40²) and O_cache = O - O_hat; at every later scale each
         group attends to its nearest remembered group's keys plus a band of its own scale's keys
         (a cs4a_ws window, united over the group; 1,344 keys at 48², 2,128 at 64²) and adds the
         upsampled O_cache. CSLA, blocks > `bound_layer`, from scale 10: a block-sparse mask, a sink
         (the first `attn_sink` scales) plus a per-scale window (`win_size`), in 128x128 blocks.
Reconstructed / chosen (each a knob):
  - column sums in fp32, as the release's Triton colsum kernel (its naive reference casts to bf16);
  - `first_n_dense_layers` is 0: the yml sets 2 but the release's check is commented out;
  - `mlp_sparsity` is off: the yml enables Chipmunk's MLP sparsity, yet no module on the Infinity
    path reads it (the FFN is plain);
  - schedules other than the square 1M: the release hard-codes that schedule; here every pattern is
    computed from the running schedule (scale indices as in the release).
Not on HART: the release patches Infinity's attention only.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from varbench.engine.plan import AttnPlan, GenerationContext, ScalePlan
from varbench.engine.policy import DocRow, MethodCard, Policy
from varbench.engine.sparse_attention import mask_pairs
from varbench.policies.common import resolve_scale
from varbench.policies.knobs import MethodKnobs, knob
from varbench.policies.sparvar_patterns import csla_block_mask, cumulative_tokens, kept_key_count, local_band

RELEASE_CS4A_WS = (1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 7, 9)
RELEASE_WIN_SIZE = (-1, -1, -1, -1, -1, -1, -1, -1, 1, 1, 3, 5, 7)


@dataclass(frozen=True)
class SparVARKnobs(MethodKnobs, method="sparvar"):
    """sparvar's knobs (release defaults; docs/methods.md says what each trades).

    decision_scale        scale where CS4A decides its keys (dense there); later -> fewer sparse scales.
    bound_layer           blocks <= it use CS4A, blocks above it CSLA; higher -> more adaptive, less sparse.
    top_keys              share of the cache each query group keeps at the decision; lower -> faster, coarser.
    counts_multiple_of    kernel granularity of key counts (CUDA FA3 kernel: 112; Triton: 64).
    query_group           queries per group sharing one key set (the kernels' 192-row tile).
    cs4a_ws               per scale, the local window (ws x ws) of own-scale keys added at indexed scales.
    attn_sink             CSLA: scales whose keys every query keeps.
    win_size              per key scale, CSLA's window edge (-1: none of that scale).
    csla_from_scale       first scale where blocks above bound_layer use CSLA (release: 10, hard-coded).
    csla_block            CSLA block edge in tokens (FlexAttention's 128).
    first_n_dense_layers  blocks kept dense everywhere (release: effectively 0, see the card).
    use_o_cache           add the remembered O - O_hat (False: sparse output alone; lower quality).
    skip_last_scales      the release's scale skipping (0, 1 or 2 last scales not run).
    drop_uncond_last_scales  last scales run with the conditional rows only (0..3).
    mlp_sparsity          "off" only: see the card.
    """
    decision_scale: int = knob(10, scale="index")
    bound_layer: int = knob(10, ge=-1)
    top_keys: float = knob(0.2, gt=0, le=1)
    counts_multiple_of: int = knob(112, ge=1)
    query_group: int = knob(192, ge=1)
    cs4a_ws: Sequence[int] = knob(RELEASE_CS4A_WS, ge=1)
    attn_sink: int = knob(5, ge=0)
    win_size: Sequence[int] = knob(RELEASE_WIN_SIZE, ge=-1)
    csla_from_scale: int = knob(10, scale="index")
    csla_block: int = knob(128, ge=1)
    first_n_dense_layers: int = knob(0, ge=0)
    use_o_cache: bool = knob(True)
    skip_last_scales: int = knob(0, ge=0, scale="count")
    drop_uncond_last_scales: int = knob(0, ge=0, scale="count")
    mlp_sparsity: str = knob("off", choices=("off",))


class SparVAR(Policy):
    name = "sparvar"
    card = MethodCard(
        display_name="SparVAR", colour="#EE6677", marker="8",
        paper="SparVAR: training-free sparse attention for visual autoregressive models (CVPR'26, arXiv 2602.04361)",
        code="Weepingchestnut/Lvar @ f94b7ecc (third-party release; CAS-CLab/SparVAR is README-only)",
        reconstructed=("fp32 column sums (the release's kernel; its naive reference is bf16)",
                       "patterns from the running schedule (the release hard-codes the square 1M)"),
        doc_rows=(DocRow("`sparvar`", source="Lvar `models/sparvar/` (CS4A + CSLA)",
                         changes="sparse attention at 40²–64²: remembered top keys + local band, block-sparse upper layers",
                         reconstructed="fp32 column sums; schedule-generic patterns",
                         flops=("{flops:sparvar}", "{flops:e2e:sparvar}")),))
    backbones = frozenset({"infinity"})
    Knobs = SparVARKnobs
    #: every block dense everywhere: no attention plan at all
    NEUTRAL = {"first_n_dense_layers": 10_000}
    #: the tiny runtime's 7-scale schedule: decide at 4, sparse after, small groups and counts
    ACTIVE = {"decision_scale": 3, "bound_layer": 0, "top_keys": 0.3, "counts_multiple_of": 4, "query_group": 8,
              "cs4a_ws": (1, 1, 1, 1, 3, 3, 3), "attn_sink": 2, "win_size": (-1, -1, 1, 1, 3, 3, 3),
              "csla_from_scale": 3, "csla_block": 8}

    def __init__(self, **knobs: Any):
        self.kn = SparVARKnobs(**knobs)

    def backbone_refusal(self, backbone: str):
        if backbone != "infinity":
            return "SparVAR's release patches Infinity's self-attention only (Weepingchestnut/Lvar models/sparvar/)"
        return None

    def reset(self, ctx: GenerationContext) -> None:
        super().reset(ctx)
        kn, sched, n = self.kn, ctx.schedule, len(ctx.schedule)
        for name in ("cs4a_ws", "win_size"):
            if len(getattr(kn, name)) < n:
                raise ValueError(f"sparvar.{name} has {len(getattr(kn, name))} entries; the schedule has {n} scales")
        # a schedule too short for a scale index: that part does nothing (no_effect_reason says so)
        self.decide_at = resolve_scale(kn.decision_scale, n, what="sparvar.decision_scale")
        self.csla_at = resolve_scale(kn.csla_from_scale, n, what="sparvar.csla_from_scale")
        self.run_until = n - kn.skip_last_scales
        self.cond_from = n - kn.drop_uncond_last_scales
        cum = cumulative_tokens(sched)
        self.n_keys, self.local, self.csla = 0, {}, {}
        if self.decide_at is not None:
            self.n_keys = kept_key_count(kn.top_keys, cum[self.decide_at + 1], kn.counts_multiple_of)
            if self.n_keys < 1:
                raise ValueError(f"sparvar.top_keys={kn.top_keys} keeps no key of the {cum[self.decide_at + 1]}-key cache "
                                 f"at scale {self.decide_at} once rounded to counts_multiple_of={kn.counts_multiple_of}")
            self.local = {si: local_band(sched, si, kn.cs4a_ws[si], kn.query_group, kn.counts_multiple_of)
                          for si in range(self.decide_at + 1, n)}
        for si in range(self.csla_at if self.csla_at is not None else n, n):
            blocks, _ = csla_block_mask(sched, si, kn.attn_sink, kn.win_size, kn.csla_block)
            h, w = sched[si]
            self.csla[si] = (blocks, mask_pairs(blocks, kn.csla_block, h * w, cum[si + 1]))

    def _attn(self, si: int, bi: int):
        kn = self.kn
        if bi < kn.first_n_dense_layers:
            return None
        if bi <= kn.bound_layer:
            if self.decide_at is None:
                return None
            if si == self.decide_at:
                return AttnPlan("decide", group=kn.query_group, n_keys=self.n_keys, use_o_cache=kn.use_o_cache)
            if si > self.decide_at:
                return AttnPlan("indexed", group=kn.query_group, local=self.local[si], use_o_cache=kn.use_o_cache)
            return None
        if si in self.csla:
            blocks, pairs = self.csla[si]
            return AttnPlan("block_mask", block_mask=blocks, block=kn.csla_block, pairs=pairs)
        return None

    def plan(self, si: int) -> ScalePlan:
        if si >= self.run_until:
            return ScalePlan(run=False)
        attn = {bi: ap for bi in range(self.ctx.depth) if (ap := self._attn(si, bi)) is not None}
        return ScalePlan(attn=attn, drop_uncond=self.ctx.cfg_rows and si >= self.cond_from)

    def stats(self) -> dict[str, Any]:
        return {"decision_scale": self.decide_at, "kept_keys": self.n_keys,
                "indexed_keys": {si: self.n_keys + sum(self.local[s].shape[1] for s in range(self.decide_at + 1, si + 1))
                                 for si in self.local},
                "skipped": list(range(self.run_until, len(self.ctx.schedule)))}

    def no_effect_reason(self):
        n = len(self.ctx.schedule)
        if self.decide_at is None and not self.csla and self.run_until == n and self.cond_from == n:
            return (f"the {n}-scale schedule has no scale {self.kn.decision_scale} (decision) or "
                    f"{self.kn.csla_from_scale} (CSLA): SparVAR acts on the 1M schedule's 40²-64² scales")
        return None

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, **self.kn.as_dict()}
