"""The trained toy world: teacher-forced training computes what inference computes; the shipped
weights load strictly and match their manifest; training lowers the loss; the trained model draws
the world far better than a random one (measured with the exact toy GenEval)."""
from __future__ import annotations

import dataclasses
import shutil

import pytest
import torch

import varbench.engine.backbones.infinity.state as runtime_mod   # the scale step guides and samples there
from varbench.engine.backbones.infinity.model import PRESETS, Infinity
from varbench.engine.backbones.infinity.runtime import InfinityRuntime
from varbench.testing.tiny import perturb_
from varbench.toy import load as toy_load
from varbench.toy.forward import bit_targets, block_causal_mask, per_token_bit_ce, teacher_forced_logits
from varbench.toy.load import TOY_H_DIV_W, TOY_SCHEDULE, build_toy_text_encoder

PROMPTS = ["a photo of a red circle", "a photo of a blue square left of a yellow triangle"]


def _random_parts(seed=0, **overrides):
    cfg = dataclasses.replace(PRESETS["toy"], **overrides)
    torch.manual_seed(seed)
    model = Infinity(cfg)
    perturb_(model, seed + 1)  # released init has constant parts; perturb so every parameter matters
    text = build_toy_text_encoder(cfg.text_channels, cfg.text_maxlen)
    return model.eval(), text.eval()


def _random_bits(batch, schedule, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 2, (batch, h, w, d), generator=g) for h, w in schedule]


def _runtime_logits(monkeypatch, rt, prompts, bits, cfg, schedule):
    """Run the runtime with its sampler forced to `bits`; return the raw per-scale logits (rows, n, 2d)."""
    captured, si = [], [0]
    orig = runtime_mod.guided_logits

    def capture(logits, *a, **k):
        captured.append(logits.clone())
        return orig(logits, *a, **k)

    def forced(guided, generators, top_k, top_p):
        b = bits[si[0]]
        si[0] += 1
        return b.reshape(b.shape[0], -1, b.shape[-1])

    monkeypatch.setattr(runtime_mod, "guided_logits", capture)
    monkeypatch.setattr(runtime_mod, "sample_bits", forced)
    out = rt.generate(prompts, seeds=list(range(len(prompts))), cfg=cfg, tau=1.0, schedule=schedule,
                      h_div_w=TOY_H_DIV_W, decode=False)
    assert [torch.equal(a, b) for a, b in zip(out.bits, bits)] == [True] * len(bits)
    return captured


@pytest.mark.parametrize("ca_bf16, atol", [(False, 2e-4), (True, 3e-2)])
def test_teacher_forced_equals_runtime_logits_every_scale(monkeypatch, ca_bf16, atol):
    """With the same bits, the one-pass block-causal forward gives the runtime's logits at every
    scale, for the conditional rows and for the CFG unconditional rows (caption dropout path).
    fp32 differences come only from summation order (KV cache vs full masked attention); with the
    released bf16 rounding in cross-attention an input difference of 1e-6 can flip a bf16 rounding,
    hence the looser tolerance there."""
    model, text_enc = _random_parts()
    rt = InfinityRuntime(model, None, text_enc, ca_bf16=ca_bf16)
    sched = list(TOY_SCHEDULE)
    bits = _random_bits(len(PROMPTS), sched, model.cfg.codebook_dim)
    captured = _runtime_logits(monkeypatch, rt, PROMPTS, bits, cfg=3.0, schedule=sched)
    with torch.no_grad():
        text = text_enc(PROMPTS)
        cond = teacher_forced_logits(model, text, bits, sched, ca_bf16=ca_bf16)
        uncond = teacher_forced_logits(model, text, bits, sched, ca_bf16=ca_bf16, drop=torch.ones(2, dtype=torch.bool))
    b, off = len(PROMPTS), 0
    assert len(captured) == len(sched)
    for si, (h, w) in enumerate(sched):
        n = h * w
        torch.testing.assert_close(cond[:, off:off + n], captured[si][:b], atol=atol, rtol=0)
        torch.testing.assert_close(uncond[:, off:off + n], captured[si][b:], atol=atol, rtol=0)
        off += n
    # the two branches really differ (so the uncond comparison is not vacuous)
    assert (cond - uncond).abs().max() > 10 * atol


def test_prefix_pass_equals_full_pass_on_its_tokens():
    """Training steps on a schedule prefix (cheap coarse-scale steps) see exactly the full pass's logits."""
    model, text_enc = _random_parts(depth=2, block_chunks=1)
    sched = list(TOY_SCHEDULE)
    bits = _random_bits(2, sched, 16, seed=1)
    with torch.no_grad():
        text = text_enc(PROMPTS)
        full = teacher_forced_logits(model, text, bits, sched, ca_bf16=False)
        pre = teacher_forced_logits(model, text, bits[:5], sched[:5], ca_bf16=False, latent_hw=sched[-1])
    torch.testing.assert_close(pre, full[:, : pre.shape[1]], atol=1e-5, rtol=0)


def test_block_causal_mask_shape_and_visibility():
    m = block_causal_mask([(1, 1), (2, 2)])
    assert m.shape == (5, 5)
    assert m[0].tolist() == [True, False, False, False, False]   # SOS sees only itself
    assert m[1:].all()                                             # scale 1 sees scale 0 and all of itself


def test_short_training_run_lowers_loss():
    """A few AdamW steps on a handful of scenes' real VAE bits lower the per-bit cross entropy."""
    import numpy as np

    from varbench.engine.backbones.infinity.bsq_vae import BSQVAE
    from varbench.toy import world
    from varbench.toy.train import image_batch

    torch.manual_seed(0)
    model, text_enc = _random_parts(depth=2, block_chunks=1)
    model.train()
    vae = BSQVAE("toy").eval()
    rng = np.random.default_rng(0)
    scenes = [world.sample_scene(rng) for _ in range(4)]
    sched = list(TOY_SCHEDULE)
    with torch.no_grad():
        bits = vae.encode_to_bits(image_batch(scenes), sched)
    opt = torch.optim.AdamW(list(model.parameters()) + list(text_enc.parameters()), lr=2e-3)
    losses = []
    for _ in range(12):
        logits = teacher_forced_logits(model, text_enc([s.caption for s in scenes]), bits, sched)
        loss = per_token_bit_ce(logits, bit_targets(bits)).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    # random init sits near ln 2 = 0.693 per bit; 12 steps on 4 fixed scenes must fit noticeably
    assert losses[-1] < losses[0] - 0.05, losses


@pytest.mark.integration
def test_training_driver_checkpoints_and_resumes(tmp_path):
    """`--save-every` writes loadable weights during the run (a kill loses at most N steps) and
    `--resume` continues from them, recording what it resumed."""
    import json
    import shutil

    from varbench.toy.train import main

    if not (toy_load.WEIGHTS_DIR / toy_load.FILES["vae"]).is_file():
        pytest.skip("shipped toy VAE absent")
    shutil.copy(toy_load.WEIGHTS_DIR / toy_load.FILES["vae"], tmp_path)
    # the driver sets torch's thread count process-wide: keep it, other tests compare bits exactly
    common = ["--stage", "infinity", "--out", str(tmp_path), "--batch", "2", "--log-every", "1",
              "--threads", str(torch.get_num_threads())]
    main(common + ["--steps", "2", "--save-every", "1"])
    first = torch.load(tmp_path / toy_load.FILES["infinity"], weights_only=True)
    first_sha = toy_load.sha256(tmp_path / toy_load.FILES["infinity"])
    main(common + ["--steps", "1", "--resume"])
    man = json.loads((tmp_path / toy_load.MANIFEST).read_text())
    assert man["stages"]["infinity"]["resumed_from"]["sha256"][toy_load.FILES["infinity"]] == first_sha
    assert man["stages"]["infinity"]["resumed_from"]["steps_done"] == 2
    second = torch.load(tmp_path / toy_load.FILES["infinity"], weights_only=True)
    assert any(not torch.equal(first[k], second[k]) for k in first)   # the resumed step trained
    assert not list(tmp_path.glob("*.tmp"))                          # atomic writes left nothing behind


# ------------------------------------------------------------------------------ shipped weights
needs_shipped = pytest.mark.skipif(not (toy_load.WEIGHTS_DIR / toy_load.MANIFEST).is_file(),
                                   reason="varbench/toy/weights/manifest.json absent (weights not trained yet)")


@needs_shipped
def test_shipped_weights_match_manifest_and_load_strictly():
    man = toy_load.read_manifest()
    for kind, name in toy_load.FILES.items():
        assert man["files"][name]["sha256"] == toy_load.sha256(toy_load.WEIGHTS_DIR / name)
    total = sum(man["files"][n]["bytes"] for n in toy_load.FILES.values())
    assert total < 25 * 2**20
    rt = toy_load.load_toy_runtime()
    assert rt.cfg == PRESETS["toy"]
    assert [tuple(s) for s in man["schedule"]] == list(TOY_SCHEDULE)
    assert set(toy_load.toy_sampling()) >= {"cfg", "tau", "top_k", "top_p"}
    # the record behind docs/toy.md's claim: the shipped model at its shipped sampling settings
    # scores >= 0.8 (the toy world's bar) on the full 60 x 2 evaluation, a same-size random one ~0
    ev = man["eval"]
    assert ev["trained"]["sampling"] == toy_load.toy_sampling()
    assert (ev["trained"]["n_prompts"], ev["trained"]["n_samples"]) == (60, 2)
    assert ev["trained"]["metrics"]["overall"] >= 0.8 and ev["random"]["metrics"]["overall"] <= 0.1


@needs_shipped
def test_modified_or_missing_weight_file_is_refused(tmp_path):
    for name in list(toy_load.FILES.values()) + [toy_load.MANIFEST]:
        shutil.copy(toy_load.WEIGHTS_DIR / name, tmp_path / name)
    p = tmp_path / toy_load.FILES["infinity"]
    data = bytearray(p.read_bytes())
    data[-1] ^= 1
    p.write_bytes(bytes(data))
    with pytest.raises(toy_load.ToyWeightsError, match="sha256"):
        toy_load.load_toy_runtime(weights_dir=tmp_path)
    p.unlink()
    with pytest.raises(toy_load.ToyWeightsError, match="toy_infinity.pt.*not found"):
        toy_load.load_toy_runtime(weights_dir=tmp_path)


# Quality gate. 12 prompts x 1 sample (2 per GenEval tag) at the shipped sampling settings; these
# are exactly sample 0 of the first 12 prompts of the recorded 60 x 2 evaluation (same prompt set,
# same seeds), so on the training machine this subset scores a known value (manifest
# eval.subset12). The threshold leaves a margin below it for other CPUs/BLAS builds, where float
# rounding can flip a sampled bit and change an image. Each tag has 2 samples here, so one flipped
# outcome moves the overall (mean of tag means) by 1/12 ~ 0.083; the margin allows two.
QUALITY_MARGIN = 0.17


@pytest.mark.integration
@needs_shipped
def test_trained_toy_model_draws_the_world_and_a_random_one_does_not():
    from varbench.toy.train import evaluate_runtime, random_runtime

    man = toy_load.read_manifest()
    sampling = toy_load.toy_sampling()
    trained_rt = toy_load.load_toy_runtime()
    trained = evaluate_runtime(trained_rt, 12, 1, 0, sampling)["metrics"]
    random_ = evaluate_runtime(random_runtime(0, len(trained_rt.text_encoder.context)), 12, 1, 0, sampling)["metrics"]
    assert trained["overall"] >= man["eval"]["subset12"]["overall"] - QUALITY_MARGIN, trained
    assert random_["overall"] <= 0.1, random_
    # measured 1.00 vs 0.00 on this subset (1.000 vs 0.008 on the full 60 x 2 set); 0.7 leaves the
    # QUALITY_MARGIN above for another machine and still fails a model that only 3/4 learned the world
    assert trained["overall"] - random_["overall"] >= 0.7
