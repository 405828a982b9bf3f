"""The fake-CUDA dry run (varbench/testing/fake_cuda.py, experiments/gpu_dryrun.py) and the GPU fallbacks.

The dry run executes the CUDA path of `generate` on fake tensors; these tests check that it finds
what it exists to find (a host read inside a step, a device mismatch, a non-flash attention call),
that its memory ledger agrees with torch's MemTracker, that memoised full blocks change no number,
and that a failing CUDA-graph capture or Triton kernel degrades to eager with one warning.
"""
import logging

import pytest
import torch

from experiments import gpu_dryrun
from varbench.engine.backbones.infinity.model import PRESETS
from varbench.engine.graphs import StepGraphs
from varbench.policies import build_policy
from varbench.testing.fake_cuda import FakeCuda, HostReadInStep, cuda_sdpa_backend
from varbench.testing.tiny import tiny_runtime

#: generates with a tiny random runtime (seconds per test): the full run's tier, not plain `pytest`'s
pytestmark = pytest.mark.runtime


def _gen(policy="baseline", batch=1, model="infinity_2b", depth=2, memo=True, **kw):
    with FakeCuda(memo_blocks=memo) as fc:
        rt = fc.runtime(model, depth=depth, **kw)
        out = fc.generate(rt, gpu_dryrun.make_policy(policy), batch)
        return fc, rt, out


@pytest.mark.integration
@pytest.mark.parametrize("model,preset", [("infinity_2b", "toprovar"), ("infinity_8b", "fastvar_8b_paper")])
def test_cli_reduced_depth_exits_0_and_prints_peaks(capsys, model, preset):
    """The CI run: the CLI at depth 2, real 1024² shapes, the 8B patchify path and the fused-entropy path."""
    rc = gpu_dryrun.main(["--model", model, "--methods", f"baseline,{preset}", "--batch", "2", "--depth", "2"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert out.count("peak") == 2 and "2 of 2 combinations ok" in out


def test_dry_run_shapes_dtypes_and_accounting():
    fc, rt, out = _gen("toprovar", batch=2)
    assert out.images.shape == (2, 1024, 1024, 3) and out.images.device.type == "cuda"
    assert {c["backend"] for c in fc.attention} == {"flash"} and {c["dtype"] for c in fc.attention} == {"bfloat16"}
    # the stood-in Triton kernel ran (ToProVAR asks for attention entropy), counted as one launch each
    assert sum(n.get("triton_flash_entropy", 0) for n in fc.ledger.op_names.values()) > 0
    # the peak holds at least the weights and the whole KV cache (bf16, preallocated for the schedule)
    weights = sum(p.numel() * p.element_size() for p in rt.model.parameters())
    cap = sum(h * w for h, w in out.schedule)
    kv = rt.cfg.depth * 2 * (2 * 2) * cap * rt.cfg.embed_dim * 2
    assert fc.ledger.peak >= weights + kv


def test_memoised_blocks_change_no_number():
    exact = _gen("baseline", batch=2, depth=4, memo=False)[0]
    memo = _gen("baseline", batch=2, depth=4, memo=True)[0]
    assert memo.ledger.peak == exact.ledger.peak
    assert dict(memo.ledger.ops) == dict(exact.ledger.ops)


def test_ledger_agrees_with_memtracker(monkeypatch):
    from torch.distributed._tools.mem_tracker import MemTracker

    # MemTracker's per-module stats refuse modules called more than once (the head runs every
    # scale); only its per-device totals are compared here
    monkeypatch.setattr(MemTracker, "_pre_fw_hook", lambda *a: None)
    monkeypatch.setattr(MemTracker, "_post_fw_hook", lambda *a: None)
    with FakeCuda(memo_blocks=False) as fc:
        rt = fc.runtime(PRESETS["tiny"])
        mt = MemTracker()
        mt.track_external(rt.model, rt.vae)
        with mt:
            fc.generate(rt, build_policy("baseline"), 2, pn="0.06M")
        theirs = mt.get_tracker_snapshot("peak")[torch.device("cuda", 0)]["Total"]
    assert theirs > 0
    assert abs(fc.ledger.peak - theirs) <= 4 * 512, (fc.ledger.peak, theirs)


def test_a_host_read_inside_a_step_fails(monkeypatch):
    import varbench.engine.backbones.infinity.state as state_mod   # where the step calls bit_entropy

    real = state_mod.bit_entropy
    monkeypatch.setattr(state_mod, "bit_entropy", lambda g: real(g) * float(g.max()))   # .item() in the step
    with pytest.raises(Exception, match="_local_scalar_dense|reads a device value"):
        _gen()
    monkeypatch.setattr(state_mod, "bit_entropy", lambda g: real(g) * torch.tensor([1.0], device=g.device))
    with pytest.raises(HostReadInStep, match="lift_fresh"):
        _gen()


def test_a_device_mismatch_inside_a_step_fails(monkeypatch):
    import varbench.engine.backbones.infinity.state as state_mod   # where the step calls bit_entropy

    real = state_mod.bit_entropy
    monkeypatch.setattr(state_mod, "bit_entropy", lambda g: real(g) + torch.zeros(g.shape[1]))   # a CPU tensor
    with pytest.raises(Exception, match="[Dd]evice"):
        _gen()


def test_non_flash_attention_is_reported():
    """An fp32 run would send attention to the memory-efficient kernel: the CLI's checks say so."""
    fc, rt, out = _gen(dtype=torch.float32)
    assert {c["backend"] for c in fc.attention} != {"flash"}
    assert any("not flash-attn/FlexAttention bf16" in e for e in gpu_dryrun._checks(rt, out, fc, 1))
    q = torch.empty(1, 2, 4, 64, dtype=torch.bfloat16)
    assert cuda_sdpa_backend(q, q, q) == "flash"
    assert cuda_sdpa_backend(q, q, q, attn_mask=torch.ones(1, 1, 1, 4, dtype=torch.bool)) == "efficient"


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("model", ["infinity_2b", "infinity_8b"])
def test_full_size_every_default_preset(model):
    assert gpu_dryrun.main(["--model", model, "--batch", "1,8"]) == 0


# ------------------------------------------------------------------ degrade, don't die
def test_failed_capture_falls_back_to_eager(monkeypatch, caplog):
    eager = [tiny_runtime(seed=0).generate(["a red circle"], [3], pn="0.25M", cfg=3.0, decode=False) for _ in range(2)]
    rt = tiny_runtime(seed=0)
    rt.cuda_graphs = True   # graph mode's bookkeeping on the CPU; the capture itself fails as on a bad driver

    def broken(graphs, state, fn):
        # a real capture runs nothing on the device, but its host side has run part of the step (KV
        # lengths advanced) and the generators were registered (their offsets moved) when the driver refuses
        state.kv.len = [n + 1 for n in state.kv.len]
        for g in state.generators:
            torch.rand(1, generator=g)
        raise RuntimeError("CUDA error: operation not permitted when stream is capturing")

    monkeypatch.setattr(StepGraphs, "capture", broken)
    with caplog.at_level(logging.WARNING, logger="varbench.engine.backbones.infinity.runtime"):
        outs = [rt.generate(["a red circle"], [3], pn="0.25M", cfg=3.0, decode=False) for _ in range(2)]
    for a, b in zip(eager, outs):
        assert torch.equal(a.summed_codes, b.summed_codes)
    warns = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warns) == 1 and "runtime.cuda_graphs=false" in warns[0].getMessage()
    assert rt.cuda_graphs is False and [f["knob"] for f in rt.fallbacks] == ["runtime.cuda_graphs=false"]


def test_failed_triton_kernel_falls_back_to_sdpa(monkeypatch, caplog):
    from varbench.engine.kernels import flash_entropy

    def broken(*a, **k):
        raise RuntimeError("triton: no kernel image is available for execution on the device (sm mismatch)")

    with caplog.at_level(logging.WARNING, logger="varbench.engine.backbones.infinity.runtime"):
        with FakeCuda() as fc:
            monkeypatch.setattr(flash_entropy, "kernel", broken)
            rt = fc.runtime("infinity_2b", depth=2)
            out = fc.generate(rt, gpu_dryrun.make_policy("toprovar"), 1)
    assert out.images is not None
    warns = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warns) == 1 and "runtime.fused_entropy=false" in warns[0].getMessage()
    assert rt.fused_entropy is False and [f["knob"] for f in rt.fallbacks] == ["runtime.fused_entropy=false"]


def test_scalekv_preset_runs_at_real_shapes_and_allocates_less():
    """The fake-CUDA dry run of the ScaleKV presets (2B, reduced depth): the selection runs inside the
    scale steps on CUDA tensors without a host read, the per-block capacities are what is allocated, and
    the peak drops. The released budget file is not shipped: `make_policy` stands in a budget of its shape."""
    import dataclasses

    from varbench.engine.backbones.infinity.model import PRESETS
    from varbench.engine.backbones.infinity.schedules import scale_schedule
    from varbench.engine.kv_cache import analytic_kv_bytes
    from varbench.engine.plan import GenerationContext

    base = gpu_dryrun.run_one("infinity_2b", "baseline", 2, depth=2)
    row = gpu_dryrun.run_one("infinity_2b", "scalekv", 2, depth=2)
    assert row["status"] == "ok", row["errors"]
    cfg = dataclasses.replace(PRESETS["infinity_2b"], depth=2)
    sched = tuple(scale_schedule(1.0, "1M"))
    ctx = GenerationContext(schedule=sched, depth=2, embed_dim=cfg.embed_dim, num_heads=cfg.num_heads, batch=2,
                            cfg_rows=True, cfg=(4.0,) * len(sched), tau=(1.0,) * len(sched))
    # what the fake device allocated is the analytic count (bf16, rows 4, 2048 channels): of the stand-in's
    # 2 blocks one drafts (all but 8 positions at each of its 4 compressions: 6,425 - 32 = 6,393 kept before
    # the 64x64 scale), one refines (1,052 = 10% of 10,521); the staging buffer holds 6,393 + 4,096. With
    # only 2 blocks the one staging buffer weighs as much as a block: 85% of the baseline here
    assert row["kv_bytes"] == analytic_kv_bytes(gpu_dryrun.make_policy("scalekv", 2), ctx) == 2 * 4 * 2048 * 2 * (6393 + 1052 + 10489)   # K+V, rows, C, bf16
    assert row["kv_bytes"] < 0.9 * base["kv_bytes"] and row["peak_bytes"] < base["peak_bytes"]
    tiny = gpu_dryrun.run_one("infinity_8b", "scalekv_8b", 1, depth=2)
    assert tiny["status"] == "ok", tiny["errors"]


# ------------------------------------------------------------------ HART (fp16 autocast, categorical tokens, diffusion head)
def _hart_gen(method="baseline", model="hart_tiny", batch=2, dtype=torch.float16):
    with FakeCuda() as fc:
        rt = fc.hart_runtime(model, dtype=dtype)
        out = fc.generate(rt, gpu_dryrun.make_hart_policy(model, method), batch, cfg=gpu_dryrun.HART_CFG, more_smooth=True)
        return fc, rt, out


@pytest.mark.parametrize("method", gpu_dryrun.methods("hart_tiny"))
def test_hart_tiny_dry_run(method):
    """The tiny HART through the whole CUDA path under fp16 autocast: top-k sampling, the gumbel mixture and
    the diffusion noise draw from stand-in generators (device-checked), attention is flash-attn in fp16
    (autocast's cast of the fp32 q/k), the decoder gives uint8 images on the device."""
    fc, rt, out = _hart_gen(method)
    assert gpu_dryrun._hart_checks(rt, out, fc, 2) == []
    assert {c["backend"] for c in fc.attention} == {"flash"} and {c["dtype"] for c in fc.attention} == {"float16"}
    ran = [t["si"] for t in out.trace if t["ran"]]
    modes = {t["si"]: {b["mode"] for b in t["blocks"]} for t in out.trace if t["ran"]}
    if method == "skip_last_2":   # stages 0, 1 of (1, 2, 3, 5); no diffusion head
        assert ran == [0, 1] and not any(t.get("diffusion") for t in out.trace)
    else:
        assert ran == [0, 1, 2, 3] and out.trace[-1]["diffusion"]
    if method == "fastvar_hart_tiny":  # the port's rule one grid down: the 3x3 and 5x5 stages pruned in both blocks
        assert modes[2] == modes[3] == {"prune"} and modes[1] == {"full"}
        assert [b["sa"] for b in out.trace[3]["blocks"]] == [25 - int(25 * 0.75)] * 2
    assert all(fc.ledger.ops[si] > 0 for si in ran)   # every stage ran as a step (the host-read guard was on)


def test_hart_0p7b_dry_run():
    """HART-0.7B at its real shapes (14 stages to 64x64, 24 blocks of 1536, the diffusion head, the 1024²
    decoder), batch 2, every method: ~20 s on 2 cores (every block runs; nothing memoised)."""
    from varbench.engine.backbones.hart.model import HART_PRESETS

    cfg = HART_PRESETS["hart_0p7b"]
    rows = {m: gpu_dryrun.run_one("hart_0p7b", m, 2) for m in gpu_dryrun.methods("hart_0p7b")}
    for m, r in rows.items():
        assert r["status"] == "ok", (m, r["errors"])
    base = rows["baseline"]
    # K and V of every position (300 text + 9,450 image tokens) in each of the 24 blocks, 4 rows (2 images and
    # their unconditional rows), 1536 channels, in fp16: the autocast dtype, which SDPA reads them in (the release
    # caches K in fp32, as F.normalize leaves it, and V in fp16; same attention outputs, test_hart_runtime.py)
    assert cfg.total_len == 9750 and base["kv_bytes"] == cfg.depth * 2 * 4 * cfg.total_len * cfg.embed_dim * 2
    assert base["peak_bytes"] >= base["weights_bytes"] + base["kv_bytes"]
    assert base["scales_run"] == list(range(14)) and rows["skip_last_2"]["scales_run"] == list(range(12))
    assert rows["skip_last_2"]["peak_bytes"] < base["peak_bytes"]


@pytest.mark.integration
def test_hart_cli_exits_0(capsys):
    rc = gpu_dryrun.main(["--model", "hart_tiny", "--batch", "1,2"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "6 of 6 combinations ok" in out and out.count("peak") == 6


def test_hart_host_read_inside_a_stage_fails(monkeypatch):
    import varbench.engine.backbones.hart.state as hart_state   # where the stage step calls categorical_entropy

    real = hart_state.categorical_entropy
    monkeypatch.setattr(hart_state, "categorical_entropy", lambda g: real(g) * float(g.max()))   # .item() in the step
    with pytest.raises(Exception, match="_local_scalar_dense|reads a device value"):
        _hart_gen()


def test_hart_generator_on_another_device_fails(monkeypatch):
    """The diffusion noise drawn from a plain CPU generator onto the CUDA device: CUDA refuses it, so must the dry run."""
    from varbench.engine.backbones.hart.state import HartState

    def cpu_noise(self, B, L, guided):
        g = torch.Generator().manual_seed(0)
        return lambda n: torch.randn(n, self.m.diffloss.net.in_channels, generator=g, device=self.rt.device)

    monkeypatch.setattr(HartState, "_per_image_noise", cpu_noise)
    with pytest.raises(Exception, match="randn on cuda:0 with a generator on cpu"):
        _hart_gen()


def test_hart_fp32_attention_is_reported():
    """Without autocast HART's attention would run the memory-efficient kernel in fp32: the checks say so."""
    fc, rt, out = _hart_gen(dtype=torch.float32)
    assert {c["backend"] for c in fc.attention} == {"efficient"}
    assert any("not flash-attn float32" in e for e in gpu_dryrun._hart_checks(rt, out, fc, 2))


# ------------------------------------------------------------------ SparVAR: sparse attention plans on CUDA
def test_sparvar_dry_run_uses_flash_for_gathered_keys_and_flex_for_block_masks():
    """SparVAR at the real 2B shapes (depth 2, bound_layer 0: block 0 CS4A, block 1 CSLA): the decision,
    the indexed scales' gathered attention (4-D flash batches) and the CSLA block masks (FlexAttention)
    run on CUDA tensors without a host read inside a step, in bf16."""
    from varbench.policies.sparvar import SparVAR

    with FakeCuda() as fc:
        rt = fc.runtime("infinity_2b", depth=2)
        out = fc.generate(rt, SparVAR(bound_layer=0), 1)
    assert out.images.shape == (1, 1024, 1024, 3)
    assert not gpu_dryrun._checks(rt, out, fc, 1)
    flex = [c for c in fc.attention if c["backend"] == "flex"]
    # CSLA on block 1 at scales 10, 11, 12 (csla_from_scale 10): q is the scale's whole grid, k the cache
    assert [(c["q"][2], c["k"][2]) for c in flex] == [(1600, 4121), (2304, 6425), (4096, 10521)]
    # the gathered groups as flash batch entries, one row at a time (the gathered keys of both rows would
    # outweigh the cache: G*K > 2L): heads 16 x groups (9 at 40² for O_hat, 12 at 48², 22 at 64²) of 192
    # queries over 784, 1,344 and 2,128 keys
    gathered = [(c["q"][1], c["q"][2], c["k"][2]) for c in fc.attention if c["q"][0] == 1 and c["q"][2] == 192]
    assert gathered == [(16 * 9, 192, 784)] * 2 + [(16 * 12, 192, 1344)] * 2 + [(16 * 22, 192, 2128)] * 2


def test_stand_in_generators_carry_their_device_on_themselves():
    """The stand-in generator is tagged by subclassing, not in a weak table keyed by the generator: before
    torch 2.14 (the device image has 2.11) a torch.Generator cannot be weakly referenced, and such a table
    failed 20 of 21 dry-run tests there. The tag changes no draw: a plain generator seeded the same agrees."""
    from varbench.testing import fake_cuda

    g = fake_cuda._tagged_generator("cuda:0", 7)
    assert isinstance(g, torch.Generator) and g.stands_in_for == torch.device("cuda:0")
    assert torch.equal(torch.randn(4, generator=g), torch.randn(4, generator=torch.Generator().manual_seed(7)))
    assert not hasattr(fake_cuda, "_GEN_DEVICE")


@pytest.mark.integration
def test_a_plan_made_from_signals_on_the_device_enters_the_fake_step():
    """SparseVAR's token maps come from its residual-change signal: under the dry run that signal is an
    `_OnDevice` stand-in (its host reads are counted), and the maps made from it must still become fake
    tensors for the step (a recursion in FakeTensorMode before). Until its images' plans diverge (scale
    9 on '1M') a batch of 8 waits for the host once per scale, as one image does: the residual change
    reaches the host in one transfer for the batch (`batch_split.host_signals`). After that SparseVAR's
    per-image token maps split the batch (post-block fills are not padded) and each sub-batch has its own."""
    one = gpu_dryrun.run_one("infinity_2b", "sparsevar", 1, depth=16)
    eight = gpu_dryrun.run_one("infinity_2b", "sparsevar", 8, depth=16)
    assert one["status"] == eight["status"] == "ok", (one["errors"], eight["errors"])
    syncs = eight["host_syncs_per_scale"]
    assert all(syncs.get(si, 0) <= 1 for si in range(9)), syncs
