"""FastVAR's HART port on varbench's HART runtime: the `fastvar` policy with the port's knobs reproduces
tests/fixtures/hart_golden/tiny_fastvar_hart_golden.pt's runs["fastvar"] (what csguoh/FastVAR's `HART/`
sampled; README there, "FastVAR golden").

* tokens equal at every stage in both runs (more_smooth off and on), the kept-token sets equal the
  port's in every block and sublayer, the trace counts L - int(L * ratio) executed tokens where the rule
  prunes, and the K/V cache holds the kept tokens only;
* floats within tolerances measured below; with the release's op order (kept tokens in descending-score
  order, attention as an explicit softmax) the floats are the port's to rounding (0 on the writing CPU
  without more_smooth), so what is left is summation order, not a semantic difference;
* the baseline policy on the same runtime is the unpruned release, not the port (the test discriminates).

The port's knobs (csguoh/FastVAR @ 34cdd651, HART/hart/modules/networks/): `compute_merge` prunes
grids of width 48 (ratio 0.5) and 64 (0.75) (fastvar_utils.py:41-48, `ratio_hard_code`); blocks cache
their branch outputs at 36 x 36 tokens (fastvar_basic.py:1213, `cache_scale_step = [36, 36]`); every
block prunes (`is_later_layer = True`, :1273), before attention and before the FFN (:1274, :1296);
nothing is skipped (the HART port has no skip rule, unlike its Infinity fork); the 2B rows rank
separately (`argsort` over dim 1 per row, fastvar_utils.py:19); only kept tokens make q, k, v (the
merged x enters `self.attn`, :1277) and the pruned positions take the resized cache (`unmerge`).

Measured (max abs over all stages vs runs["fastvar"]; ATEN_CPU_CAPABILITY native (AVX-512/AMX),
default and avx2, torch threads 2 (this machine's), 1 and 3; tokens equal in every setting):
  logsumexp of the raw logits <= 4.7e-5 and full logit rows <= 2.5e-5 (more_smooth on; off: 2.9e-6 /
  5.7e-6); diffusion output and f_hat <= 1.16e-2 (off; on: 4.4e-3), mean |f_hat diff| <= 3.9e-6
  (on the writing CPU's own paths: logit rows 5.1e-6 / 1.4e-5, f_hat 8.9e-3 / 4.4e-3, off / on).
  The logits differ from stage 0 on by SDPA vs the port's `slow_attn` (FastVAR's blocks use it without
  flash-attn: its no-pruning run differs from upstream by 6.7e-6 too, checks["no_pruning_vs_upstream"]);
  with more_smooth the gumbel mixture adds its last-bit difference (as `sample_hart` vs upstream, 1e-5).
  So no stage's logits pass 1e-5 without more_smooth (with it, stage 2's logit rows first, 1.1e-5, and
  that is the gumbel mixture); only the last stage's diffusion head output does.
  The large f_hat maximum is the diffusion head's first step (t=999), which multiplies the rounding of its
  input by sqrt(1/abar - 1) = 2.0e4 before the clamp: 1e-4 of the elements differ by more than 1e-3.
  Kept tokens in ascending position order (ours) instead of descending score (the port's) reorders the
  K/V cache and the attention sums: the generator measured that alone as f_hat 4.4e-4 / 5.1e-4
  (checks["ascending_kept_order_vs_release"]).
"""
from __future__ import annotations

import types

import pytest
import torch

import varbench.engine.backbones.hart.state as hart_state
from varbench.engine.backbones.hart.runtime import HartRuntime
from varbench.engine.text import TextBatch
from varbench.policies import selectors
from varbench.policies.baseline import Baseline
from varbench.policies.fastvar import FastVAR
from varbench.policies.selectors import PivotalSelector
from varbench.testing.tiny import strict_parity

from tests.engine.test_hart import ATOL, FASTVAR_RUNS, RTOL, check_against_record, load_fastvar_golden

#: generates with a tiny random runtime (seconds per test): the full run's tier, not plain `pytest`'s
pytestmark = pytest.mark.runtime

# f_hat / diffusion output: 2.6x the largest measured difference (1.16e-2, ATEN_CPU_CAPABILITY=default,
# more_smooth off); the mean 5x its largest (3.9e-6), so a wrong fill or selection (which moves most pruned
# positions: the port vs upstream differ by 2.1 in f_hat) cannot hide under the loose maximum.
F_HAT_ATOL = 3e-2
F_HAT_MEAN_ATOL = 2e-5
# With the release's op order (test below; more_smooth off): measured 0 natively, at most 3.8e-6 (logit rows)
# and 4.4e-4 (f_hat, ATEN_CPU_CAPABILITY=avx2) in the other settings; ~3-5x that.
RELEASE_ORDER_LOGIT_ATOL = 2e-5
RELEASE_ORDER_F_HAT_ATOL = 2e-3


def hart_port_policy(depth: int) -> FastVAR:
    """The `fastvar` policy with FastVAR's HART-port rule (module docstring: where each knob comes from)."""
    return FastVAR(addressing="width", prune={48: 0.5, 64: 0.75}, skip=[], cache_scale=36, block_range=[0, depth],
                   sublayers=["sa", "ffn"], cfg_selection="per_row", prune_kv=True, fill="cache")


@pytest.fixture(scope="module")
def port():
    fx, cfg, model, quant = load_fastvar_golden()
    i = fx["inputs"]
    text = TextBatch(i["label"], i["mask"].bool(), i["mask"].sum(1).tolist())
    return fx, cfg, HartRuntime(model, quant, None, None), text


def generate(port, run, policy, monkeypatch):
    """The runtime on the fixture's inputs with the release's generators (one pair for the batch, as recorded);
    returns (output, record) with record in `check_against_record`'s layout (raw logits of all 2B rows per
    stage, the diffusion head's output, tokens, f_hat) and the selector's kept indices in call order."""
    fx, _, rt, text = port
    logits, diffusion, kept = [], [], []
    model_logits, sample, select = rt.model.logits, hart_state.diffusion_sample, PivotalSelector.__call__

    def recorded_logits(h, c):
        logits.append(model_logits(h, c))
        return logits[-1]

    def recorded_sample(*a, **k):
        diffusion.append(sample(*a, **k))
        return diffusion[-1]

    def recorded_select(self, x, sctx):
        kept.append((sctx.w, sctx.block, sctx.sublayer, select(self, x, sctx)))
        return kept[-1][-1]

    monkeypatch.setattr(rt.model, "logits", recorded_logits)
    monkeypatch.setattr(hart_state, "diffusion_sample", recorded_sample)
    monkeypatch.setattr(PivotalSelector, "__call__", recorded_select)
    s = fx["seeds"]
    gens = (torch.Generator().manual_seed(s["g_seed"]), torch.Generator().manual_seed(s["diffusion_seed"]))
    out = rt.generate(["", ""], [0, 1], policy, cfg=run["cfg"], top_k=0, top_p=0.0, more_smooth=run["more_smooth"],
                      decode=False, text=text, generators=gens)
    monkeypatch.undo()
    record = {"tokens": [t.flatten(1) for t in out.bits], "logits": logits, "diffusion": diffusion[0],
              "f_hat": out.summed_codes}
    return out, record, kept


def expected_counts(fx, cfg) -> list[int]:
    """Executed tokens per stage under the port's rule: the text context at stage 0, L elsewhere, and
    L - int(L * ratio) at the pruned widths (fastvar_utils.py:47-48)."""
    ratio = fx["fastvar_rule"]["prune_ratio_by_width"]
    counts = [cfg.context_token]
    for p in cfg.patch_nums[1:]:
        L = p * p
        counts.append(L - int(L * ratio[p]) if p in ratio else L)
    return counts


@pytest.mark.parametrize("run_index", range(len(FASTVAR_RUNS)))
def test_fastvar_policy_reproduces_the_hart_port(port, run_index, monkeypatch):
    fx, cfg, rt, _ = port
    run = fx["runs"]["fastvar"][run_index]
    out, record, kept = generate(port, run, hart_port_policy(cfg.depth), monkeypatch)
    # tokens exactly at every stage; logits within test_hart's ATOL; diffusion output and f_hat as measured
    check_against_record(record, run, F_HAT_ATOL)
    assert (out.summed_codes - run["f_hat"]).abs().mean() < F_HAT_MEAN_ATOL
    # the kept sets are the port's, in its call order (width 48 then 64; blocks; attention then FFN)
    assert [(w, bl, {"sa": "attn"}.get(sub, sub)) for w, bl, sub, _ in kept] == \
        [(k["width"], k["block"], k["sublayer"]) for k in run["kept"]]
    for (w, bl, sub, idx), k in zip(kept, run["kept"]):
        assert torch.equal(idx.sort(1).values, k["indices"].long().sort(1).values), (w, bl, sub)
    # the trace: every block and sublayer ran on the rule's count; q, k, v from the kept tokens only
    want = expected_counts(fx, cfg)
    for si, tr in enumerate(out.trace):
        assert [(b["sa"], b["qkv"], b["ffn"]) for b in tr["blocks"]] == [(want[si],) * 3] * cfg.depth, si
    assert want[-1] == 1024 and want[-2] == 1152   # 64^2 - int(64^2 * 0.75), 48^2 - int(48^2 * 0.5)
    assert all(b["kv"] == sum(want) for b in out.trace[-1]["blocks"])   # the pruned tokens never became keys
    st = out.policy_stats
    at = {w: cfg.patch_nums.index(w) for w in (48, 64)}
    assert st["pruned"] == {at[48]: {"n_keep": 1152, "tokens": 48 * 48}, at[64]: {"n_keep": 1024, "tokens": 64 * 64}}
    assert st["cache_scale"] == cfg.patch_nums.index(36) and st["skipped"] == []


def test_with_the_release_op_order_the_floats_are_the_ports_to_rounding(port, monkeypatch):
    """The remaining float difference is summation order: kept tokens in the port's descending-score order
    (`argsort(descending=True)`, fastvar_utils.py:19) and attention as its explicit softmax (`slow_attn`,
    fastvar_basic.py:52) bring the floats to rounding (more_smooth off: 0 on the writing CPU)."""
    fx, cfg, rt, _ = port
    run = fx["runs"]["fastvar"][FASTVAR_RUNS.index((False, 4.5))]

    def descending(score, k, largest=True):   # the port's call on its (rows, L, 1) score
        return torch.argsort(score.unsqueeze(-1), dim=1, descending=largest)[:, :k, 0]

    def slow_attend(self, q, k, v):
        b, _, l, _ = q.shape
        out = (q.mul(self.scale) @ k.transpose(-2, -1)).softmax(dim=-1) @ v
        return self.proj(out.transpose(1, 2).reshape(b, l, -1))

    # generate() undoes every patch of `mp` (these too) once it has sampled
    with monkeypatch.context() as mp:
        mp.setattr(selectors, "topk_indices", descending)
        for blk in rt.model.blocks:
            mp.setattr(blk.attn, "attend", types.MethodType(slow_attend, blk.attn))
        _, record, kept = generate(port, run, hart_port_policy(cfg.depth), mp)
    # the kept tokens are the port's; their order too on the writing CPU (elsewhere near-equal scores may swap
    # places: the scores round differently on other ISA levels, so the exact order is a strict-parity check)
    assert all(torch.equal(idx.sort(-1).values, k["indices"].long().sort(-1).values) for (*_, idx), k in zip(kept, run["kept"]))
    if strict_parity():
        assert all(torch.equal(idx, k["indices"].long()) for (*_, idx), k in zip(kept, run["kept"]))
    for si, (a, b) in enumerate(zip(record["tokens"], run["tokens"])):
        assert torch.equal(a, b.long()), si
    for si, (lg, pos, at) in enumerate(zip(record["logits"], run["logits_pos"], run["logits_at"])):
        torch.testing.assert_close(lg[:, pos], at, atol=RELEASE_ORDER_LOGIT_ATOL, rtol=0, msg=f"stage {si}")
    torch.testing.assert_close(record["f_hat"], run["f_hat"], atol=RELEASE_ORDER_F_HAT_ATOL, rtol=0)


def test_baseline_on_the_same_runtime_is_the_release_not_the_port(port, monkeypatch):
    """The comparison discriminates: without the policy the runtime samples upstream's tokens, which differ
    from the port's from width 48 on (16% of the width-48 tokens, README)."""
    fx, cfg, _, _ = port
    run = fx["runs"]["fastvar"][0]
    out, record, _ = generate(port, run, Baseline(), monkeypatch)
    for pn, a, up, fv in zip(cfg.patch_nums, record["tokens"], fx["runs"]["upstream"][0]["tokens"], run["tokens"]):
        assert torch.equal(a, up.long()), pn
        assert torch.equal(a, fv.long()) == (pn < 48), pn
    torch.testing.assert_close(record["logits"][-1].logsumexp(-1), fx["runs"]["upstream"][0]["logits_lse"][-1],
                               atol=ATOL, rtol=RTOL)
    assert all(b["sa"] == 64 * 64 for b in out.trace[-1]["blocks"])
