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

from varbench.engine.backbones.hart.flops import diffusion_flops, hart_scale_flops
from varbench.engine.backbones.hart.model import build_hart, build_hart_quantizer, load_hart_state
from varbench.engine.backbones.hart.runtime import HartRuntime
from varbench.engine.backbones.hart.sampling import DiffusionSchedule, sample_hart
from varbench.engine.plan import BlockPlan, KVBudget, ScalePlan
from varbench.engine.policy import Policy
from varbench.engine.text import TextBatch
from varbench.policies import build_policy
from varbench.policies.nova import NOVA
from varbench.policies.selectors import PivotalSelector
from varbench.policies.toprovar import ToProVAR
from varbench.testing.tiny import tiny_hart_runtime

from tests.engine.test_hart import ATOL, GOLDEN, RTOL, case_config

#: generates with a tiny random runtime (seconds per test): the full run's tier, not plain `pytest`'s
pytestmark = pytest.mark.runtime

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
    the same bits as caching fp32 K (the release's, from F.normalize); checked on CPU bf16 autocast, with SDPA's
    math kernel (CPU's fused bf16 kernel needs AVX-512 and fails on other ISA levels)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from varbench.engine.backbones.hart import state as hart_state
    from varbench.policies.baseline import Baseline

    rt = tiny_hart_runtime(0, patch_nums=(1, 2, 3, 4, 5, 6, 8, 10, 13, 16))
    rt.dtype = torch.bfloat16
    init = hart_state.HartState.__init__

    def fp32_cache(self, *a, **k):
        init(self, *a, **k)
        self.kv_dtype = torch.float32

    with sdpa_kernel(SDPBackend.MATH):
        low = rt.generate(PROMPTS, [1, 2], Baseline(), decode=False)
        monkeypatch.setattr(hart_state.HartState, "__init__", fp32_cache)
        high = rt.generate(PROMPTS, [1, 2], Baseline(), decode=False)
    assert all(torch.equal(x, y) for x, y in zip(low.bits, high.bits))
    assert torch.equal(low.summed_codes, high.summed_codes)
    assert 2 * low.kv_bytes[-1]["allocated"] == high.kv_bytes[-1]["allocated"]


# ---------------------------------------------------------------------- per-image decisions at batch > 1
THREE = ["a red circle", "two blue squares", "a green triangle above a cat"]


class ByImage(Plans):
    """A per-image policy keyed on which image it is: fork k (the runtime forks once per image, in
    image order) plans `common` overridden by `own[k]`. Make a fresh one per generation."""
    per_image_decisions = True

    def __init__(self, own=None, common=None):
        super().__init__(dict(common or {}))
        self.own, self.common, self.forks = own or {}, dict(common or {}), 0

    def fork(self):
        f = Plans({**self.common, **self.own.get(self.forks, {})})
        f.per_image_decisions = True
        self.forks += 1
        return f


def _three(rt, policy=None):
    return rt.generate(THREE, [0, 1, 2], policy, cfg=4.5)


def _kept(trace) -> list:
    """What a trace says ran: per stage (ran, rows per image, per block (mode, tokens per sublayer))."""
    return [(tr["ran"], tr["rows"] // tr["batch"], [(b["mode"], b["sa"], b["ffn"], b["qkv"]) for b in tr["blocks"]])
            for tr in trace]


@pytest.fixture(scope="module")
def rt_dec():
    return tiny_hart_runtime(seed=0)


@pytest.fixture(scope="module")
def base3(rt_dec):
    return _three(rt_dec)


def _observing(rt):
    """Neutral plans that still ask for every signal (residuals kept, attention entropy of every block)."""
    return {si: ScalePlan(keep_residuals=si > 0, attention_entropy_for=frozenset(range(rt.cfg.depth)))
            for si in range(len(rt.schedule))}


@pytest.mark.parametrize("make", [lambda rt: ByImage(common=_observing(rt)),
                                  lambda rt: build_policy("nova", **NOVA.NEUTRAL),
                                  lambda rt: build_policy("toprovar", **ToProVAR.NEUTRAL)],
                         ids=["observing", "nova", "toprovar"])
def test_per_image_plans_that_agree_are_the_batched_baseline_bit_for_bit(rt_dec, base3, make):
    """Per-image decisions whose plans all agree (here: all neutral) run the batch as one: the
    batched baseline's tokens, f_hat and images exactly (batch-1 runs would round otherwise)."""
    policy = make(rt_dec)
    assert policy.per_image_decisions
    out = _three(rt_dec, policy)
    assert len({id(t) for t in out.image_traces}) == 1 and out.trace[-1]["batch"] == 3   # never split
    assert all(torch.equal(a, b) for a, b in zip(out.bits, base3.bits))
    assert torch.equal(out.summed_codes, base3.summed_codes)
    assert torch.equal(out.images, base3.images)
    assert len(out.policy_stats["per_image"]) == 3 and all(r is not None for r in out.no_effect_reasons)


def _acts(rt):
    """Image 1's own plans, each of which splits the batch: a skipped last stage; pruning with a
    cached fill (the cache stage already splits: keeping residuals is part of a plan's shape);
    dropping the unconditional rows, then also skipping the last stage after every image dropped them."""
    last = len(rt.schedule) - 1
    n = rt.schedule[last - 1][0] ** 2
    prune = {bi: BlockPlan(mode="prune", selector=PivotalSelector(n // 2), n_keep=n // 2, sublayers=("sa", "ffn"))
             for bi in range(rt.cfg.depth)}
    drop = {si: ScalePlan(drop_uncond=True) for si in (last - 1, last)}
    return {"skip_last": ({}, {last: ScalePlan(run=False)}, last),
            "prune": ({}, {last - 2: ScalePlan(keep_residuals=True), last - 1: ScalePlan(blocks=prune)}, last - 2),
            "drop_then_skip": (drop, {last: ScalePlan(run=False, drop_uncond=True)}, last)}


@pytest.mark.parametrize("case", ["skip_last", "prune", "drop_then_skip"])
def test_images_that_decide_differently_split_and_each_gets_its_own_plan(rt_dec, case):
    _check_split(rt_dec, case)


@pytest.mark.parametrize("blocks", [dict(disable_aln=False), dict(shared_aln=True)], ids=["ada_lin", "shared_aln"])
def test_a_split_carries_each_images_adaln_modulation(blocks):
    """The presets with AdaLN (the tiny default has plain blocks): a part's modulation rows are its
    images' own (a mix-up changes every token after the split)."""
    _check_split(tiny_hart_runtime(seed=0, **blocks), "prune")


def _check_split(rt, case):
    """Image 1 acts, images 0 and 2 do not: the batch splits at the first stage their plans differ,
    and each image gets what the batched run (three images, one plan: the plan of its group) gives it.

    Guaranteed (the same computation): every stage before the split runs the batch of three, so
    there each image's tokens and entropies equal that batched run's exactly; an image whose
    sub-batch runs nothing after the split keeps the batch's f_hat exactly. After the split a
    sub-batch has other matmul shapes than the batch of three, so it equals the batched run (and the
    image run alone) up to their rounding. Measured on the tiny models (f_hat |.| <= 6): tokens
    identical to both; f_hat max |diff| against the batched run 0 for the 2-image sub-batch and
    7.2e-6 for the 1-image one, against the image alone up to 8.8e-6 (plain blocks) / 8e-5
    (shared_aln); uint8 images identical."""
    common, own, split_at = _acts(rt)[case]
    out = _three(rt, ByImage({1: own}, common))
    refs = {i: _three(rt, Plans({**common, **(own if i == 1 else {})})) for i in (0, 1)}   # the batch, one plan
    for i in range(3):
        ref = refs[1 if i == 1 else 0]
        alone = rt.generate([THREE[i]], [i], Plans({**common, **(own if i == 1 else {})}), cfg=4.5)
        mine = [None if t is None else t[i] for t in out.bits]
        for si in range(split_at):
            assert torch.equal(mine[si], ref.bits[si][i]) and torch.equal(out.token_entropy[si][i], ref.token_entropy[si][i])
        for si, (a, r, one) in enumerate(zip(mine, ref.bits, alone.bits)):
            assert (one is None) == (r is None)
            if one is None:   # skipped by this image: -1 (NaN entropy) in its row where others ran it, else None
                if a is not None:
                    assert bool((a == -1).all()) and bool(torch.isnan(out.token_entropy[si][i]).all())
                continue
            # batch rounding only (see above); a flipped token would diverge the rest of that image
            for b in (r[i], one[0]):
                assert (a == b).float().mean() > 0.97
        for b in (ref.summed_codes[i], alone.summed_codes[0]):
            torch.testing.assert_close(out.summed_codes[i], b, atol=5e-4, rtol=1e-4)   # ~6x the spread above
        if out.images is not None:
            assert (out.images[i].int() - alone.images[0].int()).abs().float().mean() < 1.0
        assert _kept(out.image_traces[i]) == _kept(alone.trace) == _kept(ref.trace)
    if case != "prune":   # image 1 ran nothing after the split: the batch's f_hat, exactly
        assert torch.equal(out.summed_codes[1], refs[1].summed_codes[1])
        assert out.bits[-1] is not None and bool((out.bits[-1][1] == -1).all())
    assert len({id(t) for t in out.image_traces}) == 2 and out.image_traces[0] is out.image_traces[2]
    assert out.image_traces[0][split_at]["batch"] == 2 and out.image_traces[1][split_at]["batch"] == 1
    assert out.image_traces[0][split_at - 1] is out.image_traces[1][split_at - 1]   # shared before the split


def test_per_image_traces_flops_and_kv_bytes_are_each_images_own(rt_dec):
    """An image's trace, FLOPs and stats are those of its own plans (its run alone); the batch's
    FLOPs and KV bytes count each sub-batch once."""
    common, own, _ = _acts(rt_dec)["prune"]
    out = _three(rt_dec, ByImage({1: own}, common))
    alone = [rt_dec.generate([THREE[i]], [i], Plans(own if i == 1 else {}), cfg=4.5) for i in range(3)]
    for i, one in enumerate(alone):
        assert _kept(out.image_traces[i]) == _kept(one.trace)
        # analytic counts from the same trace entries: equal up to float summation order
        assert out.image_flops[i]["total"] == pytest.approx(one.flops["total"], rel=1e-12)
        assert out.image_flops[i]["per_scale"] == pytest.approx(one.flops["per_scale"], rel=1e-12)
    assert out.image_flops[1]["total"] < out.image_flops[0]["total"]
    assert out.flops["total"] == pytest.approx(sum(o.flops["total"] for o in alone), rel=1e-12)
    assert out.flops["per_scale"] == pytest.approx([sum(v) for v in zip(*[o.flops["per_scale"] for o in alone])], rel=1e-12)
    for si, kb in enumerate(out.kv_bytes):
        for k in ("allocated", "used"):
            assert kb[k] == sum(o.kv_bytes[si][k] for o in alone), (si, k)
    # every image's entry of a stage carries that stage's wall time; image 1 acted, the others did not
    assert [tr["ms"] for tr in out.image_traces[1]] == out.timings_ms["per_scale"]
    assert out.no_effect_reasons[1] is None and out.no_effect_reasons[0] is not None
    assert len(out.policy_stats["per_image"]) == 3


def test_a_hart_split_views_the_parents_caches_instead_of_copying_them(rt_dec, monkeypatch):
    """After a split the parts' KV caches and residual caches live in the parent's memory (rows
    permuted in place), as on Infinity."""
    from varbench.engine.backbones.hart.state import HartState

    seen, real = [], HartState.split

    def spy(self, parts):
        held = lambda st: ({t.untyped_storage().data_ptr() for t in st.kv.kv if t is not None}   # noqa: E731
                           | {t.untyped_storage().data_ptr() for d in st.residuals.values() for t in d.values()})
        parent = held(self)
        subs = real(self, parts)
        seen.extend(bool(held(s)) and held(s) <= parent for s in subs)
        return subs

    monkeypatch.setattr(HartState, "split", spy)
    common, own, _ = _acts(rt_dec)["prune"]
    _three(rt_dec, ByImage({1: own}, common))
    assert seen and all(seen)


def test_per_image_decisions_refuse_the_release_shared_generators(rt):
    gens = (torch.Generator().manual_seed(0), torch.Generator().manual_seed(1))
    with pytest.raises(ValueError, match="shared generators"):
        _run(rt, ByImage(), generators=gens)
    _run(rt, Plans(), generators=gens)   # one policy for the batch: the release's consumption, as before


# --- FLOPs from plans alone (hart_plan_trace, experiments/flops_table.py --model hart_0p7b) ---------------------
#: the tiny model on stages that hold FastVAR's HART widths (36 cached, 48 and 64 pruned), so `fastvar_hart` acts
#: with its preset knobs; 4 is there so that drop_uncond (-3) and skip_last (-2) start after a small stage
FLOPS_PATCH_NUMS = (1, 2, 4, 36, 48, 64)
#: the keys of a trace entry (and of its blocks) that the FLOPs count reads
ENTRY_KEYS = ("si", "h", "w", "ran", "rows", "batch", "tokens", "diffusion")
BLOCK_KEYS = ("mode", "qkv", "sa", "kv", "ca", "ffn", "ent_q", "kv_sel_q", "kv_kept", "kv_evicted")


@pytest.fixture(scope="module")
def rt_flops():
    return tiny_hart_runtime(seed=0, decoder=False, patch_nums=FLOPS_PATCH_NUMS)


def _counted(trace):
    return [({k: tr.get(k) for k in ENTRY_KEYS}, [{k: b.get(k) for k in BLOCK_KEYS} for b in tr["blocks"]])
            for tr in trace]


@pytest.mark.parametrize("preset", ["baseline", "fastvar_hart", "skip_last_2", "skipvar_uncond3"])
def test_flops_from_plans_equal_a_real_generation(rt_flops, preset):
    """flops_table's HART path (the preset's YAML knobs, its plans under the scenario, `hart_plan_trace`) counts
    exactly what a real generation reports (`out.flops`, per stage and in total: the same formulas over the same
    integer counts, so equality is exact) for a baseline, FastVAR's width-addressed HART port (pruned and
    cached), a skip preset (the last stage's diffusion head not run) and a drop_uncond preset (rows halve)."""
    from experiments import flops_table as ft
    from varbench.engine.backbones.hart.flops import hart_plan_flops

    assert ft.hart_refusal(preset) is None
    name, _, knobs = ft.load_method(preset)
    trace, _ = ft.hart_method_trace(name, knobs, rt_flops.cfg, len(PROMPTS), 8, 11)
    out = rt_flops.generate(PROMPTS, [0, 1], build_policy(name, **knobs), cfg=4.5, decode=False)
    assert _counted(trace) == _counted(out.trace)
    want = ft.hart_method_flops(name, knobs, rt_flops.cfg, len(PROMPTS), 8, 11)[0]
    assert want == out.flops["total"]
    assert [hart_scale_flops(rt_flops.cfg, tr) for tr in trace] == out.flops["per_scale"]
    base = ft.hart_method_flops("baseline", {}, rt_flops.cfg, len(PROMPTS), 8, 11)[0]
    assert (want < base) == (preset != "baseline")   # each preset changes the count (what the test tells apart)
    if preset == "fastvar_hart":
        assert {tr["si"] for tr in trace if any(b["mode"] == "prune" for b in tr["blocks"])} == {4, 5}
    if preset == "skip_last_2":
        assert [tr["ran"] for tr in trace][-2:] == [False, False] and not any(tr.get("diffusion") for tr in trace)
    if preset == "skipvar_uncond3":
        assert [tr["rows"] for tr in trace] == [4, 4, 4, 2, 2, 2]
    assert hart_plan_flops(rt_flops.cfg, [ScalePlan()] * len(FLOPS_PATCH_NUMS), len(PROMPTS))["total"] == base


def _entropy_requests():
    """Attention entropies asked of every block at every stage, a subsample of 5 queries from stage 2 on."""
    every = frozenset(range(2))
    return Plans({si: ScalePlan(attention_entropy_for=every, attention_entropy_queries=5 if si >= 2 else None)
                  for si in range(len(FLOPS_PATCH_NUMS))})


@pytest.mark.parametrize("make", [lambda: NOVA(**{**NOVA.ACTIVE, "r_min": 0.3, "baseline_scales": (1, 2)}), lambda: ToProVAR(**ToProVAR.ACTIVE),
                                  lambda: ToProVAR(**{**ToProVAR.ACTIVE, "layer_mode": "full", "tau": 0.4}),
                                  _entropy_requests],
                         ids=["nova", "toprovar_uniform", "toprovar_full", "entropy_requests"])
def test_flops_from_an_adaptive_policys_plans_equal_its_generation(rt_flops, make):
    """The plans a policy actually made in a real generation (recorded), counted from the plans alone, equal its
    `out.flops`: pruned blocks with selectors (NOVA, ToProVAR with their ACTIVE knobs: thresholds lowered so they
    act on the tiny stages; NOVA's growth baseline from stages 1-2, so it may act from stage 4 of 6, and its ratio
    floored at 0.3, as its entropy falls on the random model), skipped layers, attention-entropy requests (one query at stage 0, HART's last text
    position; a query subsample later)."""
    from varbench.engine.backbones.hart.flops import hart_plan_flops, hart_plan_trace

    pol, plans = make(), {}
    plan = pol.plan
    pol.plan = lambda si: plans.setdefault(si, plan(si))
    out = rt_flops.generate(PROMPTS[:1], [0], pol, cfg=4.5, decode=False)
    recorded = [plans[si] for si in range(len(FLOPS_PATCH_NUMS))]
    trace = hart_plan_trace(rt_flops.cfg, recorded, 1)
    assert _counted(trace) == _counted(out.trace)
    assert hart_plan_flops(rt_flops.cfg, recorded, 1) == out.flops
    if isinstance(pol, Plans):
        assert [b["ent_q"] for tr in trace for b in tr["blocks"]] == [1, 1, 4, 4] + [5, 5] * 4
    else:
        assert any(b["mode"] != "full" for tr in trace for b in tr["blocks"])   # it acted


def test_flops_from_plans_refuse_what_the_runtime_refuses(rt_flops):
    from varbench.engine.backbones.hart.flops import hart_plan_trace

    n = len(FLOPS_PATCH_NUMS)
    with pytest.raises(ValueError, match="stage 0 is the text context"):
        hart_plan_trace(rt_flops.cfg, [ScalePlan(run=False)] + [ScalePlan()] * (n - 1), 1)
    with pytest.raises(ValueError, match="plans for"):
        hart_plan_trace(rt_flops.cfg, [ScalePlan()] * (n - 1), 1)
