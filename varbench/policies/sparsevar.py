"""SparseVAR (ICCV'25, arXiv 2507.20454) as a policy: a THIRD-PARTY reconstruction.

Method card
-----------
Source: the only public implementation, Weepingchestnut/Lvar @ f94b7ec (`models/sparsevar/`; the
official Caesarhhh/SparseVAR is README-only). Its steps against the release, line by line: docs/methods.md ("SparseVAR")
(kept with the integrator's notes) and the fixture README tests/fixtures/sparsevar_release/README.md.
Changes, at every scale: the next scale's input is the summed codes AREA-resized to its grid (the VAE's
`z_interplote_down`; Infinity's inference resizes trilinearly: `input_resize`). Then, from
`start_prune_stage` (schedule index 10: 40x40 on the 13-scale 1M schedule) on, each scale si
planned from scale si-1's signals:
  1. the residual-change signal of scale si-1: per token, mean over channels of the squared change of
     the residual stream from entering block `signal_blocks[0]` to leaving block `signal_blocks[1]`
     (`ScalePlan.residual_change_for`; the release's chunk 3 of 8: blocks 12-15 on the 2B), the mean of
     the two CFG halves;
  2. keep fraction = the share of those tokens whose change exceeds `keep_threshold` (0.6) of the
     largest; kept at si: the int(h*w * share) tokens with the largest nearest-upsampled change (in the
     release's sort order); every block runs on them only (pruned tokens give no K/V, pass every block
     unchanged);
  3. anchors: a stride-`anchor_stride` (4) grid plus the last row and column; the cosine similarity of
     scale si-1's guided logits (nearest-upsampled) at the token and at each of 4 candidate anchors (as
     released: the first four anchors of the list for every token, see `anchor_candidates`);
  4. after the last block a pruned token whose best similarity exceeds `recover_threshold` (0.8) takes
     its most similar anchor's hidden state (`ScalePlan.post_fill`); the others keep their scale input,
     are sampled, and their codes are zeroed (`ScalePlan.code_mask`).
Equal to the release at batch 1 (tests/engine/test_sparsevar_release.py: kept, recovered and zeroed sets
and bits on a tiny random model).

Reproduced release quirks (knobs where a reading differs): the logit "feature" of a grid cell is the
release's raw reshape of the (tokens, 2d) logits to (2d, h, w) without a transpose (`anchor_features:
release`; `token` is the evidently intended per-token logits); the 4 "nearest" anchors are the first
four of the list for every token (a gather along the wrong axis; `anchor_candidates: release`,
`nearest` is the intent); at batch 1 the anchors are not forced into
the kept set; a keep count of 0 keeps every token (the release's `[-0:]`); the unused `beta=0.99` argument
(the effective threshold is lf_anchor's 0.8).

Deviations (ours):
  - batch > 1: each image decides alone, exactly as at batch 1 (per-image forks; images whose kept
    counts differ run as separate sub-batches; an image's signals, hence its decisions, equal those it
    gets alone up to the rounding of batched matmuls: `check_method`'s batch check). The release instead takes the max change over the whole
    batch and the largest share over images (one count), forces the anchors into the kept set and
    truncates every image's set to the shortest image's, and zeroes codes through `view(1, 32, -1)`,
    which mixes images (and fails on any VAE but the 2B's 32 channels);
  - any VAE: the code mask zeroes a token's codes on any code width, and under the 8B's 2x2 patchify
    all four latent positions of the token (the release's hard-coded 32 channels crash on the 8B);
    non-square grids (the release assumes h == w) and cfg = 1 (the release assumes CFG rows) work;
  - the release also runs, in every attention call, a probe-key importance estimate whose result is
    discarded (BS:190, 323): not run here (no effect on outputs; the release's timings include it);
  - a scale that keeps every token runs the plain full plan (the release gathers it into its sort
    order: same values up to summation order).
Kept count: data dependent, read to the host once per scale (in `plan`, between steps, from the signals
`observe` kept); each count is its own static plan shape (CUDA graph mode captures each distinct count;
eager otherwise). `keep_multiple` buckets the counts (rounded up), trading a few kept tokens for fewer
shapes and, at batch > 1, fewer sub-batch splits.
Not on HART: the release has no HART path (refused with the reason).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch
import torch.nn.functional as F

from varbench.engine.plan import BlockPlan, GenerationContext, ScalePlan, ScaleSignals
from varbench.engine.policy import DocRow, MethodCard, Policy
from varbench.policies.common import resolve_scale
from varbench.policies.knobs import MethodKnobs, knob

RELEASE = "Weepingchestnut/Lvar @ f94b7ec (third-party; models/sparsevar/sparsevar_model.py)"


@dataclass(frozen=True)
class SparseVARKnobs(MethodKnobs, method="sparsevar"):
    """SparseVAR's knobs (release defaults; Lvar's `autoregressive_infer_cfg` and `lf_anchor` argument
    names in brackets); which way each trades speed against quality:

    start_prune_stage  first pruned scale, a schedule index (negative from the end) [start_prune_stage=10:
                       40x40 of the 1M schedule]. Earlier -> more scales pruned -> faster, riskier.
    signal_blocks      [first, last] blocks whose residual change ranks the tokens (inclusive); null = the
                       release's chunk 3 of 8 (`specific_mse_layer=3`, `block_chunks=8`): blocks
                       3*depth//8 .. 4*depth//8 - 1 (2B: 12-15; 8B: 15-19). Speed-neutral; which tokens
                       count as changing.
    keep_threshold     a token counts as changing when its change exceeds this fraction of the largest;
                       the share that does is the next scale's keep fraction [compress_ratio=0.6].
                       Higher -> fewer tokens kept -> faster, lower quality.
    anchor_stride      spacing of the anchor grid (plus the last row/column) [local_window_size=4]. Denser
                       (smaller) -> more pruned tokens recoverable from a near anchor (fewer zeroed codes).
    recover_threshold  a pruned token copies its best anchor's output when their upsampled-logit cosine
                       similarity exceeds this [lf_anchor's beta=0.8]; otherwise its codes are zeroed.
                       Lower -> more copies, fewer zeroed codes (speed-neutral).
    anchor_features    release (the release's raw reshape of the (tokens, 2d) logits to (2d, h, w): a
                       cell's "feature" mixes tokens) | token (each token's own 2d logits, the evident
                       intent). Speed-neutral.
    anchor_candidates  release (every token is compared with the first four anchors of the list, (0, 0),
                       (0, s), (0, 2s), (0, 3s) on large grids: what the release's gather effectively
                       does) | nearest (each token's 4 nearest anchors, the evident intent). Speed-neutral.
    prune              false: the policy only observes (no token is pruned, filled or zeroed).
    input_resize       area (the release: SparseVAR_Infinity resizes the summed codes to the next scale's
                       grid with the VAE's `z_interplote_down`, area, SV:824, at EVERY scale; Infinity's own
                       inference and every other method use trilinear) | trilinear. Speed-neutral.
    keep_multiple      round each kept count UP to a multiple of this (1 = the release's exact count):
                       bucketing, so fewer distinct counts occur (fewer CUDA graph captures; at batch > 1
                       images whose counts round alike share a sub-batch instead of splitting). Larger ->
                       a few more tokens kept (slower, closer to the baseline), fewer shapes.
    """

    start_prune_stage: int = knob(10, scale="index")
    signal_blocks: Optional[Sequence[int]] = knob(None, ge=0)
    keep_threshold: float = knob(0.6, ge=0.0, le=1.0)
    anchor_stride: int = knob(4, ge=1)
    recover_threshold: float = knob(0.8, ge=-1.0, le=1.0)
    anchor_features: str = knob("release", choices=("release", "token"))
    anchor_candidates: str = knob("release", choices=("release", "nearest"))
    prune: bool = knob(True)
    input_resize: str = knob("area", choices=("area", "trilinear"))
    keep_multiple: int = knob(1, ge=1)


def release_signal_blocks(depth: int) -> tuple[int, int]:
    """The release's residual-change range: chunk 3 of 8 (`specific_mse_layer=3`, `block_chunks=8`)."""
    first, last = 3 * depth // 8, 4 * depth // 8 - 1
    return first, max(first, last)


def anchor_axis(n: int, stride: int) -> torch.Tensor:
    """Anchor coordinates along one axis of n cells: 0, stride, 2*stride, ... plus n-1, appended as the
    release does (`generate_anchors_from_flat`: its test `stride % n != 0` appends n-1 for every n except
    the divisors of the stride, even when n-1 is already on the grid)."""
    idx = torch.arange(0, n, stride)
    if stride % n != 0:
        idx = torch.cat([idx, torch.tensor([n - 1])])
    return idx


def anchor_candidates(h: int, w: int, stride: int, which: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(anchors (A, 2) long as (row, col), candidates (h*w, 4) indices into anchors): the anchors each grid
    token is compared with. Static per (grid, stride).

    "release": what the release's `map_to_best_corner` (SV:55-57) effectively compares: it sorts the
    anchors by squared distance but then gathers along the token axis of an anchor list expanded over
    tokens, which returns the FIRST FOUR anchors of the list ((0, 0), (0, s), (0, 2s), ... in row-major
    order) for every token, whatever their distance. "nearest": the 4 nearest anchors by squared
    distance (ties in `sort` order), the evident intent."""
    rows, cols = anchor_axis(h, stride), anchor_axis(w, stride)
    gy, gx = torch.meshgrid(rows, cols, indexing="ij")
    anchors = torch.stack([gy.flatten(), gx.flatten()], dim=-1)
    m = min(4, anchors.shape[0])
    if which == "release":
        return anchors, torch.arange(m).expand(h * w, -1).contiguous()
    pos = torch.arange(h * w)[None]
    i, j = pos // w, pos % w
    dis = (i[:, None, :] - anchors[None, :, None, 0]) ** 2 + (j[:, None, :] - anchors[None, :, None, 1]) ** 2
    nearest = dis.sort(1)[1][:, :m]                       # (1, 4, h*w)
    return anchors, nearest[0].transpose(0, 1).contiguous()


def anchor_match(features: torch.Tensor, anchors: torch.Tensor, nearest: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """features (B, h, w, C) -> (best anchor's flat token index (B, h*w), best similarity (B, h*w)): the
    cosine similarity of each token's feature with its 4 candidate anchors' (`anchor_candidates`), the most
    similar (first on ties), as the release's `map_to_best_corner` computes them."""
    b, h, w, _ = features.shape
    pos = torch.arange(h * w, device=features.device)
    bi = torch.arange(b, device=features.device)[:, None]
    at_pos = features[bi, (pos // w)[None].expand(b, -1), (pos % w)[None].expand(b, -1), :]          # (B, T, C)
    corners = anchors.to(features.device)[nearest.to(features.device)]                               # (T, 4, 2)
    bidx = torch.arange(b, device=features.device)[:, None, None].expand(-1, h * w, nearest.shape[1])
    corner_f = features[bidx, corners[None, ..., 0].expand(b, -1, -1), corners[None, ..., 1].expand(b, -1, -1), :]
    sims = F.cosine_similarity(at_pos.unsqueeze(2), corner_f, dim=-1)                                 # (B, T, 4)
    best = sims.argmax(dim=-1)
    best_pos = corners[None].expand(b, -1, -1, -1).gather(2, best[..., None, None].expand(-1, -1, 1, 2))[:, :, 0]
    return best_pos[..., 0] * w + best_pos[..., 1], sims.max(-1)[0]


@dataclass
class ScaleDecision:
    """What SparseVAR decided for one scale of one image batch (B rows; B = 1 per image)."""

    keep: torch.Tensor          # (B, k) long, kept tokens in the release's order
    pruned: torch.Tensor        # (B, n - k) long, ascending
    recover: torch.Tensor       # (B, n - k) bool: copies its anchor after the last block
    source: torch.Tensor        # (B, n - k) long: that anchor's token index
    post_fill: torch.Tensor     # (B, n) long: token -> its source (itself where not recovered)
    code_mask: torch.Tensor     # (B, n) bool: codes zeroed (pruned and not recovered)


def decide(change: torch.Tensor, logits: torch.Tensor, prev_hw: tuple[int, int], hw: tuple[int, int], k: int,
           stride: int, recover_threshold: float, anchor_features: str, candidates: str = "release") -> ScaleDecision:
    """The release's `lf_anchor` for a batch of B images deciding alike (B = 1 per image): `change` (B, n_prev)
    the CFG-mean residual change of the previous scale, `logits` (B, n_prev, 2d) its guided, tempered
    logits, k the kept count (1..n-1)."""
    (hp, wp), (h, w) = prev_hw, hw
    b, n = change.shape[0], h * w
    metric = F.interpolate(change.reshape(b, 1, hp, wp), size=(h, w), mode="nearest")
    keep = metric.reshape(b, -1).sort(1)[1][:, -k:]
    mask = torch.ones(b, n, dtype=torch.bool, device=change.device)
    mask.scatter_(1, keep, False)
    pruned = torch.arange(n, device=change.device).expand(b, -1)[mask].view(b, -1)
    if anchor_features == "release":
        feat = logits.reshape(b, -1, hp, wp)
    else:
        feat = logits.reshape(b, hp * wp, -1).permute(0, 2, 1).reshape(b, -1, hp, wp)
    feat = F.interpolate(feat, size=(h, w), mode="nearest").permute(0, 2, 3, 1)
    anchors, nearest = anchor_candidates(h, w, stride, candidates)
    best, sim = anchor_match(feat, anchors, nearest)
    recover = sim.gather(1, pruned) > recover_threshold
    source = best.gather(1, pruned)
    post_fill = torch.arange(n, device=change.device).repeat(b, 1)
    post_fill.scatter_(1, pruned, torch.where(recover, source, pruned))
    code_mask = torch.zeros(b, n, dtype=torch.bool, device=change.device)
    code_mask.scatter_(1, pruned, ~recover)
    return ScaleDecision(keep, pruned, recover, source, post_fill, code_mask)


class SparseVAR(Policy):
    name = "sparsevar"
    card = MethodCard(
        display_name="SparseVAR", colour="#44AA99", marker="<",
        paper="SparseVAR: Exploring Sparsity in Visual AutoRegressive Modeling for Training-Free Acceleration "
              "(ICCV 2025, arXiv 2507.20454)",
        code=RELEASE,
        reconstructed=("third-party reconstruction: the only public code is Lvar's, not the authors' "
                       "(Caesarhhh/SparseVAR is README-only)",
                       "per-image decisions at batch > 1 (the release is batch-1 code)",
                       "code masks on any VAE (the release hard-codes the 2B's 32 channels)"),
        doc_rows=(DocRow("`sparsevar`",
                         source="Lvar's third-party SparseVAR (`models/sparsevar`, f94b7ec)",
                         changes="next-scale inputs area-resized (Infinity: trilinear); from 40x40 on: keeps the "
                                 "tokens whose residual stream changed most (blocks 12-15 on 2B) at the previous "
                                 "scale, share above 0.6 of the max; a pruned token copies the most similar of "
                                 "four anchors (as released: the first four of a stride-4 grid) when their "
                                 "upsampled logits agree (cos > 0.8), else its codes are zeroed",
                         reconstructed="third-party code (not the authors'); per-image decisions at batch > 1 "
                                       "(the release: batch 1); 8B code masks (the release: 2B VAE only)",
                         flops=("{flops:sparsevar}*", "{flops:e2e:sparsevar}*")),))
    backbones = frozenset({"infinity"})
    adaptive = True                 # the kept count and set come from the prompt's own earlier scale
    per_image_decisions = True      # each image decides alone, as the release does at batch 1
    Knobs = SparseVARKnobs
    #: the policy only observes, with Infinity's own input resize
    NEUTRAL = {"prune": False, "input_resize": "trilinear"}
    #: on the tiny runtime's '0.06M' (7 scales, up to 16x16): the last two scales pruned, blocks 1-2 ranked;
    #: a random model's residual change is nearly uniform (every token above 0.6 of the max: nothing pruned),
    #: so the threshold is raised to 0.95 (about a quarter of the tokens kept)
    ACTIVE = {"start_prune_stage": -2, "signal_blocks": [1, 2], "keep_threshold": 0.95}

    def __init__(self, **knobs: Any):
        kn = SparseVARKnobs(**knobs)
        if kn.signal_blocks is not None and (len(kn.signal_blocks) != 2 or kn.signal_blocks[0] > kn.signal_blocks[1]):
            raise ValueError(f"sparsevar.signal_blocks must be [first, last] with first <= last, got {list(kn.signal_blocks)}")
        self.k = kn.as_dict()
        for key, v in self.k.items():
            setattr(self, key, v)

    def backbone_refusal(self, backbone: str) -> Optional[str]:
        if backbone == "infinity":
            return None
        return (f"sparsevar is not available on {backbone}: its only public implementation (Lvar's third-party "
                "SparseVAR) is written for Infinity's bit-token head and VAE codes and has no HART path; "
                "pick a method that supports HART (docs/methods.md)")

    def reset(self, ctx: GenerationContext) -> None:
        super().reset(ctx)
        reason = self.backbone_refusal(ctx.backbone)
        if reason:
            raise ValueError(reason)
        n = len(ctx.schedule)
        self.start = resolve_scale(int(self.start_prune_stage), n, what="sparsevar.start_prune_stage")
        rng = release_signal_blocks(ctx.depth) if self.signal_blocks is None else tuple(int(b) for b in self.signal_blocks)
        if rng[1] >= ctx.depth:
            raise ValueError(f"sparsevar.signal_blocks {list(rng)} names blocks beyond the model's 0..{ctx.depth - 1}")
        self.range = rng
        # per-generation state
        self.pending: Optional[tuple[int, torch.Tensor, torch.Tensor]] = None   # (scale, change, logits)
        self.record: dict[int, dict[str, Any]] = {}
        self.decisions: dict[int, ScaleDecision] = {}

    def _observes(self, si: int) -> bool:
        return self.prune and self.start is not None and self.start - 1 <= si < len(self.ctx.schedule) - 1

    def plan(self, si: int) -> ScalePlan:
        want = frozenset({self.range}) if self._observes(si) else frozenset()
        rs = self.input_resize if si > 0 else "trilinear"     # scale 0's input is the SOS, not codes
        p = self.pending
        if not (self.prune and self.start is not None and si >= self.start and p is not None and p[0] == si - 1):
            return ScalePlan(residual_change_for=want, input_resize=rs)
        _, change, logits = p
        h, w = self.ctx.schedule[si]
        n = h * w
        # the release: the share of tokens above keep_threshold of the max (over the image; fp32), times
        # this scale's tokens in fp32, truncated; 0 keeps every token (`[-0:]`)
        share = ((change / change.max()) > self.keep_threshold).float().mean(1).max()
        k = int(n * share)
        if self.keep_multiple > 1 and k > 0:
            k = min(n, -(-k // self.keep_multiple) * self.keep_multiple)
        self.record[si] = {"share": float(share), "kept": n if k in (0, n) else k, "tokens": n}
        if k == 0 or k == n:
            return ScalePlan(residual_change_for=want, input_resize=rs)
        d = decide(change, logits, self.ctx.schedule[si - 1], (h, w), k, self.anchor_stride,
                   self.recover_threshold, self.anchor_features, self.anchor_candidates)
        self.decisions[si] = d
        self.record[si].update(recovered=int(d.recover.sum()), zeroed=int(d.code_mask.sum()))
        bp = BlockPlan(mode="prune", keep=d.keep, n_keep=k, fill="pass", prune_kv=True)
        return ScalePlan(blocks={b: bp for b in range(self.ctx.depth)}, residual_change_for=want,
                         post_fill=d.post_fill, code_mask=d.code_mask, input_resize=rs)

    def observe(self, si: int, signals: ScaleSignals) -> None:
        if not self._observes(si) or self.range not in signals.residual_change:
            return
        c = signals.residual_change[self.range]
        b = signals.logits.shape[0]
        if c.shape[0] == 2 * b:      # the mean over the CFG halves, as released
            c = torch.stack([c[:b], c[b:]]).mean(0)
        self.pending = (si, c, signals.logits.reshape(b, signals.h * signals.w, -1))

    def no_effect_reason(self) -> Optional[str]:
        if not self.prune and self.input_resize == "trilinear":
            return "sparsevar: prune=false and input_resize=trilinear (observes only)"
        n = len(self.ctx.schedule)
        if self.start is None or self.start == 0:
            return (f"sparsevar: start_prune_stage={self.start_prune_stage} is not a scale after the first on this "
                    f"{n}-scale schedule (the sparsevar preset's per-model toy block counts it from the end)")
        return "sparsevar: every pruned scale kept all its tokens (the share above keep_threshold rounded to all)"

    def stats(self) -> dict[str, Any]:
        return {"signal_blocks": list(self.range), "scales": {int(s): r for s, r in sorted(self.record.items())}}

    def describe(self) -> dict[str, Any]:
        d = {"name": self.name}
        d.update({k: (list(v) if isinstance(v, tuple) else v) for k, v in self.k.items()})
        return d
