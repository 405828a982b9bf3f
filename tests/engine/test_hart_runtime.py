"""HartRuntime: the HART loop on the shared seams.

* equal to the released loop: on the hart_golden fixture (what mit-han-lab/hart sampled, README there)
  the runtime's tokens are the release's exactly, and it equals our transcription of the release
  (`sample_hart`) bit for bit in the same process (same ops, same order);
* per-image generators: an image does not depend on its batch, and at batch 1 equals the release;
* the seams: a neutral plan (residuals kept, attention entropy asked) reproduces the baseline bit for
  bit; pruning with a cached fill, stage skips, KV budgets and drop_uncond do what the plan says, and
  the trace / FLOPs count what ran.
"""
from __future__ import annotations

import math

import pytest
import torch

from varbench.engine.models.hart.flops import diffusion_flops, hart_scale_flops
from varbench.engine.models.hart.model import build_hart, build_hart_quantizer, load_hart_state
from varbench.engine.models.hart.runtime import HartRuntime
from varbench.engine.models.hart.sampling import DiffusionSchedule, sample_hart
from varbench.engine.models.text import TextBatch
from varbench.engine.plan import BlockPlan, KVBudget, ScalePlan
from varbench.engine.policy import Policy
from varbench.engine.testing import tiny_hart_runtime
from varbench.policies.selectors import PivotalSelector

from tests.engine.test_hart import ATOL, GOLDEN, RTOL, case_config

PROMPTS = ["a red circle", "two blue squares"]


class Plans(Policy):
    """Fixed plans per stage (absent: full), recording the signals."""
    name = "plans"
    NEUTRAL, ACTIVE = {}, None
    backbones = frozenset({"hart"})

    def __init__(self, plans=None):
        self.plans = plans or {}

    def reset(self, ctx):
        self.ctx, self.signals = ctx, {}

    def plan(self, si):
        p = self.plans.get(si)
        return p(si) if callable(p) else (p or ScalePlan())

    def observe(self, si, signals):
        self.signals[si] = signals


@pytest.fixture(scope="module")
def golden():
    return torch.load(GOLDEN, weights_only=False)


def _golden_runtime(golden, case):
    cfg = case_config(golden, case)
    model, quant = build_hart(cfg).eval(), build_hart_quantizer(cfg).eval()
    load_hart_state(model, golden["weights"][case], "golden weights")
    load_hart_state(quant, golden["tokenizer_weights"][case], "golden tokenizer")
    i = golden["inputs"]
    return HartRuntime(model, quant, None, None), TextBatch(i["label"], i["mask"].bool(), i["mask"].sum(1).tolist())


def _release_generators(golden):
    s = golden["seeds"]
    return torch.Generator().manual_seed(s["g_seed"]), torch.Generator().manual_seed(s["diffusion_seed"])


@pytest.mark.parametrize("run_index", range(4))
def test_runtime_equals_the_released_loop(golden, run_index):
    run = golden["runs"][run_index]
    rt, text = _golden_runtime(golden, run["case"])
    out = rt.generate(["", ""], [0, 1], cfg=run["cfg"], more_smooth=run["more_smooth"], text=text, decode=False,
                      generators=_release_generators(golden))
    for si, (a, b) in enumerate(zip(out.bits, run["tokens"])):
        assert torch.equal(a.flatten(1), b), f"stage {si} tokens differ from the release's"
    torch.testing.assert_close(out.summed_codes, run["f_hat"], atol=ATOL, rtol=RTOL)
    # our transcription of the release, same process: the same ops in the same order, so bit for bit
    i = golden["inputs"]
    ref = sample_hart(rt.model, rt.quant, i["label"], i["mask"], i["pos"], cfg=run["cfg"], seed=golden["seeds"]["g_seed"],
                      diffusion_generator=torch.Generator().manual_seed(golden["seeds"]["diffusion_seed"]),
                      more_smooth=run["more_smooth"])
    assert torch.equal(out.summed_codes, ref["f_hat"])


def test_per_image_generators_make_images_batch_independent_and_equal_the_release_at_batch_1(golden):
    rt, text = _golden_runtime(golden, "shared_aln")
    both = rt.generate(["", ""], [5, 9], cfg=4.5, text=text, decode=False)
    i = golden["inputs"]
    for b, seed in enumerate((5, 9)):
        one = TextBatch(text.features[b: b + 1], text.mask[b: b + 1], text.lens[b: b + 1])
        alone = rt.generate([""], [seed], cfg=4.5, text=one, decode=False)
        for si in range(len(both.bits)):
            assert torch.equal(both.bits[si][b], alone.bits[si][0]), (b, si)
        ref = sample_hart(rt.model, rt.quant, i["label"][b: b + 1], i["mask"][b: b + 1], i["pos"][b: b + 1], cfg=4.5,
                          seed=seed)   # the release at batch 1: one generator per stream, seeded alike
        for si, tok in enumerate(ref["tokens"]):
            assert torch.equal(alone.bits[si].flatten(1), tok), (b, si)
        torch.testing.assert_close(alone.summed_codes, ref["f_hat"], atol=1e-6, rtol=1e-6)
    assert not torch.equal(both.bits[-1][0], both.bits[-1][1])


@pytest.fixture(scope="module")
def rt():
    return tiny_hart_runtime(seed=0, decoder=False)


def _run(rt, policy=None, **kw):
    return rt.generate(PROMPTS, [0, 1], policy, cfg=4.5, decode=False, **kw)


def test_neutral_plans_reproduce_the_baseline_bit_for_bit(rt):
    base = _run(rt)
    depth = rt.cfg.depth
    observing = Plans({si: ScalePlan(keep_residuals=si > 0, attention_entropy_for=frozenset(range(depth)),
                                     blocks={0: BlockPlan()}) for si in range(len(rt.schedule))})
    out = _run(rt, observing)
    assert torch.equal(out.summed_codes, base.summed_codes)
    assert all(torch.equal(a, b) for a, b in zip(out.bits, base.bits))
    assert all(tr["neutral"] for tr in out.trace)
    # the signals: per-token categorical entropy within [0, ln V], attention entropy within [0, ln n_kv]
    sig = observing.signals
    for si, s in sig.items():
        assert s.token_entropy.shape == (2, s.h * s.w)
        assert (s.token_entropy >= -1e-5).all() and (s.token_entropy <= math.log(rt.cfg.vocab_size) + 1e-5).all()
        for bi, ent in s.attention_entropy.items():
            n_kv = out.trace[si]["blocks"][bi]["kv"]
            assert ent.shape == (4, s.h * s.w) and (ent <= math.log(n_kv) + 1e-4).all()
    assert sig[0].attention_query_index[0].tolist() == [[0]] * 4   # stage 0: the query that samples the token


def test_pruning_with_cached_fill_changes_only_the_pruned_stage_and_counts_it(rt):
    base = _run(rt)
    last = len(rt.schedule) - 1
    n = rt.schedule[last][0] ** 2
    keep = n // 2
    prune = {bi: BlockPlan(mode="prune", selector=PivotalSelector(keep), n_keep=keep, sublayers=("sa", "ffn"))
             for bi in range(rt.cfg.depth)}
    out = _run(rt, Plans({last - 1: ScalePlan(keep_residuals=True), last: ScalePlan(blocks=prune)}))
    assert all(torch.equal(out.bits[si], base.bits[si]) for si in range(last))
    assert not torch.equal(out.summed_codes, base.summed_codes)
    blocks = out.trace[last]["blocks"]
    assert all(b["sa"] == b["qkv"] == b["ffn"] == keep for b in blocks)
    assert out.flops["per_scale"][last] < base.flops["per_scale"][last]
    assert out.flops["per_scale"][:last] == base.flops["per_scale"][:last]
    # without an earlier stage that kept residuals, the cache fill names the fix
    with pytest.raises(ValueError, match="keep_residuals"):
        _run(rt, Plans({last: ScalePlan(blocks=prune)}))


def test_pass_fill_equals_identity_for_pruned_tokens_at_keep_all(rt):
    """fill='pass' with every token kept is the full block (the scatter covers every position)."""
    base = _run(rt)
    last = len(rt.schedule) - 1
    n = rt.schedule[last][0] ** 2
    every = torch.arange(n).expand(4, -1)
    plan = ScalePlan(blocks={bi: BlockPlan(mode="prune", keep=every, n_keep=n, fill="pass", sublayers=("sa", "ffn"))
                             for bi in range(rt.cfg.depth)})
    out = _run(rt, Plans({last: plan}))
    torch.testing.assert_close(out.summed_codes, base.summed_codes, atol=1e-5, rtol=1e-5)
    assert torch.equal(out.bits[last], base.bits[last])


def test_skipping_the_last_stage_keeps_the_codes_so_far_and_skips_the_diffusion_head(rt):
    base = _run(rt)
    last = len(rt.schedule) - 1
    out = _run(rt, Plans({last: ScalePlan(run=False)}))
    assert out.bits[last] is None and out.token_entropy[last] is None and not out.trace[last]["ran"]
    assert all(torch.equal(out.bits[si], base.bits[si]) for si in range(last))
    assert out.flops["per_scale"][last] == 0.0
    # f_hat = the sum of the earlier stages' (phi-refined) contributions: what the baseline held before its last stage
    grid = base.summed_codes - out.summed_codes
    assert grid.abs().max() > 0


def test_stage_0_is_the_text_context_and_cannot_be_pruned(rt):
    with pytest.raises(ValueError, match="stage 0 is the text context"):
        _run(rt, Plans({0: ScalePlan(run=False)}))
    with pytest.raises(ValueError, match="h_div_w"):
        rt.generate(PROMPTS, [0, 1], h_div_w=1.5, decode=False)


def test_kv_budget_evicts_and_allocates_less(rt):
    base = _run(rt)
    si = 2
    held_before = rt.cfg.context_token + sum(p * p for p in rt.cfg.patch_nums[1:si + 1])
    n_keep = held_before - 3
    keep = torch.arange(3, held_before).expand(4, rt.cfg.num_heads, -1)

    class Budget(Plans):
        def kv_capacity(self):
            full = sum(h * w for h, w in self.ctx.schedule)
            return [full] * self.ctx.depth

    out = _run(rt, Budget({si: ScalePlan(kv={0: KVBudget(n_keep=n_keep, keep=keep)})}))
    assert out.trace[si]["blocks"][0]["kv_kept"] == n_keep and out.trace[si]["blocks"][0].get("kv_evicted")
    assert out.trace[si + 1]["blocks"][0]["kv"] == n_keep + rt.cfg.patch_nums[si + 1] ** 2
    assert not out.trace[si]["neutral"]
    assert all(torch.equal(out.bits[s], base.bits[s]) for s in range(si + 1))
    assert out.kv_bytes[-1]["used"] < base.kv_bytes[-1]["used"]


def test_drop_uncond_runs_the_conditional_rows_only(rt):
    last = len(rt.schedule) - 1
    out = _run(rt, Plans({si: ScalePlan(drop_uncond=True) for si in range(last - 1, last + 1)}))
    assert [tr["rows"] for tr in out.trace] == [4] * (last - 1) + [2, 2]
    base = _run(rt)
    assert out.flops["per_scale"][last] < base.flops["per_scale"][last]


def test_flops_count_the_diffusion_head_inside_the_loop(rt):
    out = _run(rt)
    last = out.trace[-1]
    assert last["diffusion"]
    grid = last["h"] * last["w"]
    without = dict(last, diffusion=False)
    # the last stage's count = its transformer work + the diffusion head over 2B*L vectors (8 steps) +
    # the discrete tokens' word embedding, instead of the phi conv the other stages end with
    p = rt.cfg.patch_nums[-1]
    expected = (hart_scale_flops(rt.cfg, without) - 2 * 2 * p * p * rt.cfg.cvae ** 2 * 9
                + diffusion_flops(rt.cfg, 4 * grid) + 2 * 2 * grid * rt.cfg.cvae * rt.cfg.embed_dim)
    assert out.flops["per_scale"][-1] == pytest.approx(expected)
    assert diffusion_flops(rt.cfg, 1) > 0
    assert out.flops["total"] == pytest.approx(out.flops["text"] + sum(out.flops["per_scale"]))
    assert sum(f["total"] for f in out.image_flops) == pytest.approx(out.flops["total"])


@pytest.mark.gpu
def test_cuda_fp16_autocast_runs_the_release_numerics():
    """On CUDA in float16 (the release's sample.py: the whole loop under fp16 autocast): the same
    shapes and a valid generation; early stages sample as in fp32 (their logits differ by fp16
    rounding, ~1e-3, far below the gaps between the top candidates of a random tiny model)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    cpu = tiny_hart_runtime(seed=0, decoder=False)
    ref = _run(cpu)
    gpu = HartRuntime(cpu.model, cpu.quant, None, cpu.text_encoder, device="cuda", dtype=torch.float16)
    out = _run(gpu)
    assert [t.shape for t in out.bits] == [t.shape for t in ref.bits]
    assert torch.equal(out.bits[0].cpu(), ref.bits[0])
    assert torch.isfinite(out.summed_codes).all()
    assert out.timings_ms["ar"] > 0


def test_images_decode_per_image_with_the_tokenizer_decoder():
    rt = tiny_hart_runtime(seed=0)
    out = rt.generate(PROMPTS, [0, 1], cfg=4.5)
    p = rt.cfg.patch_nums[-1] * rt.vae.cfg.downsample
    assert out.images.shape == (2, p, p, 3) and out.images.dtype == torch.uint8
    # decoding does not depend on the batch (the transformer's floats may: other matmul shapes)
    assert torch.equal(rt.decode(out.summed_codes[1:]), out.images[1:])
    assert out.images.float().std() > 0
    assert out.timings_ms["decode"] > 0


def test_diffusion_coefficients_on_the_device_are_the_released_per_step_values():
    """The head indexes its coefficients from tensors made once per device (no host number copied in at each
    of its steps: a blocking copy on CUDA); each must equal the release's `torch.tensor(arr[i], float64).float()`
    exactly, or the head's sample would move."""
    sched = DiffusionSchedule("8")
    c = sched.coefficients("cpu")
    assert sched.coefficients(torch.device("cpu")) is c   # made once per device
    for k in DiffusionSchedule.COEFFICIENTS:
        assert c[k].shape == (sched.num_steps,) and c[k].dtype == torch.float32
        for i in range(sched.num_steps):
            assert torch.equal(c[k][i], torch.tensor(getattr(sched, k)[i], dtype=torch.float64).float()), (k, i)


def test_kv_cache_in_the_autocast_dtype_changes_no_bit(monkeypatch):
    """Under autocast, SDPA reads K/V cast to the autocast dtype, so caching them in it (half of fp32) gives
    the same bits as caching fp32 K (the release's, from F.normalize); checked on CPU bf16 autocast."""
    from varbench.engine.models.hart import state as hart_state
    from varbench.policies.baseline import Baseline

    rt = tiny_hart_runtime(0, patch_nums=(1, 2, 3, 4, 5, 6, 8, 10, 13, 16))
    rt.dtype = torch.bfloat16
    low = rt.generate(PROMPTS, [1, 2], Baseline(), decode=False)
    init = hart_state.HartState.__init__

    def fp32_cache(self, *a, **k):
        init(self, *a, **k)
        self.kv_dtype = torch.float32

    monkeypatch.setattr(hart_state.HartState, "__init__", fp32_cache)
    high = rt.generate(PROMPTS, [1, 2], Baseline(), decode=False)
    assert all(torch.equal(x, y) for x, y in zip(low.bits, high.bits))
    assert torch.equal(low.summed_codes, high.summed_codes)
    assert 2 * low.kv_bytes[-1]["allocated"] == high.kv_bytes[-1]["allocated"]
