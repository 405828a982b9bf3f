"""HART transformer: released key names/shapes, strict loading, and parity with the released sampling loop.

* tests/fixtures/keys/hart_0p7b.txt (+ _tokenizer_quantize.txt): upstream HARTForT2I's state dict for the
  0.7B flags (how it was written: the file's header and tests/fixtures/keys/README.md).
* tests/fixtures/hart_golden/tiny_hart_golden.pt: what mit-han-lab/hart's `autoregressive_infer_cfg`
  sampled on CPU for tiny random models (tests/fixtures/hart_golden/README.md). Tokens must be equal;
  floats within a tolerance (measured difference on the writing CPU: 0 for every tensor).
"""
from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path

import pytest
import torch

from varbench.core.errors import ConfigError
from varbench.engine.models.checkpoints import CheckpointMismatch
from varbench.engine.models.hart.model import (HART_IGNORED_KEYS, HART_PRESETS, QUANT_IGNORED_KEYS, build_hart,
                                         build_hart_quantizer, hart_config_from_json, load_hart_state)
from varbench.engine.models.hart.sampling import DiffusionSchedule, sample_hart

FIX = Path(__file__).resolve().parents[1] / "fixtures"
GOLDEN = FIX / "hart_golden" / "tiny_hart_golden.pt"
# floats from another CPU may differ by summation order; on the writing CPU the difference is 0
ATOL, RTOL = 1e-4, 1e-4


def read_keys(path: Path) -> dict[str, tuple]:
    out = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith("#"):
            k, shape = line.split("\t")
            out[k] = tuple(ast.literal_eval(shape))
    return out


def test_0p7b_keys_and_shapes_equal_the_released_module_tree():
    want = read_keys(FIX / "keys" / "hart_0p7b.txt")
    sd = build_hart("hart_0p7b", device="meta").state_dict()
    got = {k: tuple(v.shape) for k, v in sd.items()}
    assert set(want) - set(got) == set(HART_IGNORED_KEYS)      # rebuilt at inference, dropped on load
    assert {k: s for k, s in want.items() if k not in HART_IGNORED_KEYS} == got
    n = sum(v.numel() for v in sd.values())
    assert 725e6 < n < 740e6, n                                 # the paper's ~732M parameters


def test_0p7b_tokenizer_quantizer_keys():
    want = read_keys(FIX / "keys" / "hart_0p7b_tokenizer_quantize.txt")
    got = {"quantize." + k: tuple(v.shape) for k, v in build_hart_quantizer("hart_0p7b", "meta").state_dict().items()}
    assert {k: s for k, s in want.items() if k.removeprefix("quantize.") not in QUANT_IGNORED_KEYS} == got


@pytest.fixture(scope="module")
def golden():
    return torch.load(GOLDEN, weights_only=False)


def case_config(golden, case):
    flags = {k: v for k, v in golden["cases"][case].items() if k != "context_norm_scale"}
    return dataclasses.replace(HART_PRESETS["hart_tiny"], **flags)


def test_tiny_preset_is_the_fixture_shape(golden):
    base, vae = golden["base"], golden["vae"]
    tiny = HART_PRESETS["hart_tiny"]
    assert (tiny.depth, tiny.embed_dim, tiny.num_heads, tiny.context_token, tiny.context_dim, tiny.patch_nums,
            tiny.vocab_size, tiny.cvae, tiny.diff_width, tiny.diff_depth) == (
        base["depth"], base["embed_dim"], base["num_heads"], base["context_token"], base["context_dim"],
        tuple(base["patch_nums"]), vae["vocab_size"], vae["Cvae"], base["diff_width"], base["diff_depth"])
    assert dataclasses.replace(tiny) == case_config(golden, "shared_aln")


def test_strict_load_names_missing_and_unexpected_keys(golden):
    cfg = case_config(golden, "shared_aln")
    sd = dict(golden["weights"]["shared_aln"])
    sd.pop("blocks.1.attn.q_bias")
    sd["blocks.1.attn.mat_qkv.weight"] = torch.zeros(3)
    with pytest.raises(CheckpointMismatch) as e:
        load_hart_state(build_hart(cfg), sd, "llm/ema_model.bin")
    msg = str(e.value)
    assert "blocks.1.attn.q_bias" in msg and "blocks.1.attn.mat_qkv.weight" in msg and "llm/ema_model.bin" in msg
    # the other AdaLN variant's weights do not load into this one: named, not silently ignored
    with pytest.raises(CheckpointMismatch, match="scale_shift_table"):
        load_hart_state(build_hart(cfg), golden["weights"]["ada_lin"], "ada_lin weights")


@pytest.mark.parametrize("run_index", range(4))
def test_sampling_equals_released_loop(golden, run_index):
    run = golden["runs"][run_index]
    cfg = case_config(golden, run["case"])
    model, quant = build_hart(cfg).eval(), build_hart_quantizer(cfg).eval()
    load_hart_state(model, golden["weights"][run["case"]], "golden weights")
    load_hart_state(quant, golden["tokenizer_weights"][run["case"]], "golden tokenizer")
    i = golden["inputs"]
    dgen = torch.Generator().manual_seed(golden["seeds"]["diffusion_seed"])
    out = sample_hart(model, quant, i["label"], i["mask"], i["pos"], cfg=run["cfg"], seed=golden["seeds"]["g_seed"],
                      diffusion_generator=dgen, more_smooth=run["more_smooth"])
    assert len(out["tokens"]) == len(run["tokens"]) == len(cfg.patch_nums)
    for si, (a, b) in enumerate(zip(out["tokens"], run["tokens"])):
        assert torch.equal(a, b), f"stage {si} tokens differ"
    for si, (a, b) in enumerate(zip(out["logits"], run["logits"])):
        torch.testing.assert_close(a, b, atol=ATOL, rtol=RTOL, msg=f"stage {si} logits")
    torch.testing.assert_close(out["diffusion"], run["diff"][0], atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(out["f_hat"], run["f_hat"], atol=ATOL, rtol=RTOL)


def test_fixture_runs_discriminate_the_options(golden):
    """The recorded runs differ where the options differ, so ignoring an option fails a parity test."""
    runs = golden["runs"]
    smooth_off, smooth_on, _, cfg0 = runs
    assert not torch.equal(smooth_off["f_hat"], smooth_on["f_hat"])        # more_smooth changes the latent
    assert not all(torch.equal(a, b) for a, b in zip(runs[2]["tokens"], cfg0["tokens"]))   # CFG changes tokens
    assert smooth_off["diff"][0].abs().max() > 0.01                        # the diffusion head is not zeroed


def test_diffusion_schedule_respacing():
    s = DiffusionSchedule("8")
    # space_timesteps(1000, "8"): 8 steps at accumulated stride 999/7, rounded
    assert s.timestep_map == [0, 143, 285, 428, 571, 714, 856, 999]
    assert s.num_steps == 8 and all(s.coef1 > 0)


def test_config_from_json(tmp_path):
    p = HART_PRESETS["hart_0p7b"]
    fields = {f.name: getattr(p, f.name) for f in dataclasses.fields(p)}
    llm = {k: v for k, v in fields.items() if k not in ("vocab_size", "cvae", "share_quant_resi", "quant_resi")}
    llm.update(patch_nums=list(p.patch_nums), attn_type="llama", mlp_type="llama", use_cross_attn=False,
               model_type="hart_transformer_t2i", drop_path_rate=0.1)
    (tmp_path / "llm.json").write_text(json.dumps(llm))
    (tmp_path / "tok.json").write_text(json.dumps({"vocab_size": 4096, "z_channels": 32, "share_quant_resi": 4}))
    assert hart_config_from_json(tmp_path / "llm.json", tmp_path / "tok.json") == p
    llm["attn_type"] = "gpt2"
    (tmp_path / "llm.json").write_text(json.dumps(llm))
    with pytest.raises(ConfigError, match="attn_type"):
        hart_config_from_json(tmp_path / "llm.json", tmp_path / "tok.json")
