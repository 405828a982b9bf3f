"""HART transformer: released key names/shapes, strict loading, and parity with the released sampling loop.

* tests/fixtures/keys/hart_0p7b.txt (+ _tokenizer_quantize.txt): upstream HARTForT2I's state dict for the
  0.7B flags (how it was written: the file's header and tests/fixtures/keys/README.md).
* tests/fixtures/hart_golden/tiny_hart_golden.pt: what mit-han-lab/hart's `autoregressive_infer_cfg`
  sampled on CPU for tiny random models (tests/fixtures/hart_golden/README.md). Tokens must be equal;
  floats within a tolerance (measured on the writing CPU: 0 without more_smooth, <= 1.7e-5 with it).
* tests/fixtures/hart_golden/tiny_fastvar_hart_golden.pt: the same loop, and FastVAR's HART port (token
  pruning at widths 48 / 64), on one tiny plain model whose grids reach 36, 48 and 64. `load_fastvar_golden`
  builds the model it was recorded with (tests/engine/test_fastvar_hart.py runs the `fastvar` policy on it).
"""
from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path

import pytest
import torch

from varbench.core.errors import ConfigError
from varbench.engine.backbones.hart.model import (HART_IGNORED_KEYS, HART_PRESETS, QUANT_IGNORED_KEYS, build_hart,
                                         build_hart_quantizer, hart_config_from_json, load_hart_state)
from varbench.engine.backbones.hart.sampling import DiffusionSchedule, sample_hart
from varbench.engine.checkpoints import CheckpointMismatch

FIX = Path(__file__).resolve().parents[1] / "fixtures"
GOLDEN = FIX / "hart_golden" / "tiny_hart_golden.pt"
FASTVAR_GOLDEN = FIX / "hart_golden" / "tiny_fastvar_hart_golden.pt"
# floats from another CPU may differ by summation order; on the writing CPU: 0 without more_smooth, up to 1.7e-5
# with it (the codebook mixture differs from upstream's in the last bit, and later stages carry that on)
ATOL, RTOL = 1e-4, 1e-4
# The fastvar fixture's grid reaches 64 x 64; measured on the writing CPU (more_smooth on; off: 0 everywhere):
# logits 2.5e-5, diffusion output 8.8e-4, f_hat 1.2e-3. The diffusion head's first step multiplies its input's
# rounding by sqrt(1/abar - 1) = 2.0e4 (t=999, DiffusionSchedule("8").sqrt_recipm1[-1]) before the clamp, so its
# output and f_hat get a tolerance 4x the measured difference; the logits keep the one above.
FV_FLOAT_ATOL = 5e-3
# (more_smooth, cfg) of the fastvar fixture's runs, in its order
FASTVAR_RUNS = [(False, 4.5), (True, 4.5)]


def read_keys(path: Path) -> dict[str, tuple]:
    out = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith("#"):
            k, shape = line.split("\t")
            out[k] = tuple(ast.literal_eval(shape))
    return out


def test_0p7b_keys_and_shapes_equal_the_released_module_tree():
    want = read_keys(FIX / "keys" / "hart_0p7b.txt")
    # plain blocks (disable_aln=True, shared_aln=False): no per-block AdaLN parameters of either kind
    assert not [k for k in want if k.startswith("blocks.") and ("scale_shift_table" in k or "ada_lin" in k)]
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
    assert tiny == case_config(golden, "plain")                # hart_tiny carries the 0.7B's flags
    p7 = HART_PRESETS["hart_0p7b"]
    assert (p7.disable_aln, p7.shared_aln, p7.use_timestep_embed, p7.use_context_norm, p7.attn_l2_norm) == (
        tiny.disable_aln, tiny.shared_aln, tiny.use_timestep_embed, tiny.use_context_norm, tiny.attn_l2_norm)


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
    # plain weights lack the shared table: a shared_aln model names it missing (a wrong flag is not hidden)
    with pytest.raises(CheckpointMismatch, match="blocks.0.scale_shift_table"):
        load_hart_state(build_hart(cfg), golden["weights"]["plain"], "plain weights")


RUNS = [("shared_aln", False, 4.5), ("shared_aln", True, 4.5), ("ada_lin", False, 4.5), ("ada_lin", False, 0.0),
        ("plain", False, 4.5), ("plain", True, 4.5)]


def find_run(golden, case, more_smooth, cfg):
    (run,) = [r for r in golden["runs"] if (r["case"], r["more_smooth"], r["cfg"]) == (case, more_smooth, cfg)]
    return run


def test_fixture_holds_the_runs_tested(golden):
    assert golden["format_version"] == 2
    assert [(r["case"], r["more_smooth"], r["cfg"]) for r in golden["runs"]] == RUNS


@pytest.mark.runtime
@pytest.mark.parametrize("case,more_smooth,cfg_w", RUNS)
def test_sampling_equals_released_loop(golden, case, more_smooth, cfg_w):
    run = find_run(golden, case, more_smooth, cfg_w)
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
    for case in ("shared_aln", "plain"):
        smooth_off, smooth_on = find_run(golden, case, False, 4.5), find_run(golden, case, True, 4.5)
        assert not torch.equal(smooth_off["f_hat"], smooth_on["f_hat"])    # more_smooth changes the latent
        assert smooth_off["diff"][0].abs().max() > 0.01                    # the diffusion head is not zeroed
    cfg45, cfg0 = find_run(golden, "ada_lin", False, 4.5), find_run(golden, "ada_lin", False, 0.0)
    assert not all(torch.equal(a, b) for a, b in zip(cfg45["tokens"], cfg0["tokens"]))   # CFG changes tokens
    # the plain case really has plain blocks, the shared one a table per block
    assert not any("scale_shift_table" in k or "ada_lin" in k for k in golden["weights"]["plain"] if k.startswith("blocks."))
    assert "blocks.1.scale_shift_table" in golden["weights"]["shared_aln"]


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


# ---------------------------------------------------------------- FastVAR's HART port (tiny_fastvar_hart_golden.pt)

def load_fastvar_golden(path: Path = FASTVAR_GOLDEN):
    """(fixture, cfg, model, quant) for tiny_fastvar_hart_golden.pt: the plain tiny model on the fixture's grids
    (1, 2, 4, 9, 16, 36, 48, 64), weights loaded strictly. Layout: tests/fixtures/hart_golden/README.md
    ("FastVAR golden"); fixture["runs"]["upstream"] is the unpruned release, ["fastvar"] FastVAR's pruning."""
    fx = torch.load(path, weights_only=False)
    b, v = fx["base"], fx["vae"]
    flags = {k: val for k, val in fx["flags"].items() if k != "context_norm_scale"}
    cfg = dataclasses.replace(HART_PRESETS["hart_tiny"], **flags, patch_nums=tuple(b["patch_nums"]), depth=b["depth"],
                              embed_dim=b["embed_dim"], num_heads=b["num_heads"], context_token=b["context_token"],
                              context_dim=b["context_dim"], vocab_size=v["vocab_size"], cvae=v["Cvae"],
                              diff_width=b["diff_width"], diff_depth=b["diff_depth"])
    model, quant = build_hart(cfg).eval(), build_hart_quantizer(cfg).eval()
    load_hart_state(model, fx["weights"], "fastvar golden weights")
    load_hart_state(quant, fx["tokenizer_weights"], "fastvar golden tokenizer")
    return fx, cfg, model, quant


@pytest.fixture(scope="module")
def fastvar_golden():
    return load_fastvar_golden()


def check_against_record(out: dict, run: dict, float_atol: float) -> None:
    """Compare a `sample_hart` result with one recorded run of the fastvar fixture (tokens exactly)."""
    assert len(out["tokens"]) == len(run["tokens"])
    for si, (a, b) in enumerate(zip(out["tokens"], run["tokens"])):
        assert torch.equal(a, b.long()), f"stage {si} tokens differ"
    for si, (lg, lse, pos, at) in enumerate(zip(out["logits"], run["logits_lse"], run["logits_pos"], run["logits_at"])):
        torch.testing.assert_close(lg.logsumexp(-1), lse, atol=ATOL, rtol=RTOL, msg=f"stage {si} logsumexp")
        torch.testing.assert_close(lg[:, pos], at, atol=ATOL, rtol=RTOL, msg=f"stage {si} logit rows")
    n = run["diff_cond_rows"].shape[0]
    torch.testing.assert_close(out["diffusion"][:n], run["diff_cond_rows"], atol=float_atol, rtol=0)
    torch.testing.assert_close(out["f_hat"], run["f_hat"], atol=float_atol, rtol=0)


def test_fastvar_fixture_layout(fastvar_golden):
    fx, cfg, _, _ = fastvar_golden
    assert {36, 48, 64} <= set(cfg.patch_nums) and not cfg.shared_aln and cfg.disable_aln
    assert [(r["more_smooth"], r["cfg"]) for r in fx["runs"]["upstream"]] == FASTVAR_RUNS
    assert [(r["more_smooth"], r["cfg"]) for r in fx["runs"]["fastvar"]] == FASTVAR_RUNS


@pytest.mark.runtime
@pytest.mark.parametrize("run_index", range(len(FASTVAR_RUNS)))
def test_sampling_equals_released_loop_on_fastvar_grids(fastvar_golden, run_index):
    """Our released loop reproduces the unpruned upstream run (a) of the fastvar fixture."""
    fx, cfg, model, quant = fastvar_golden
    run = fx["runs"]["upstream"][run_index]
    i = fx["inputs"]
    dgen = torch.Generator().manual_seed(fx["seeds"]["diffusion_seed"])
    out = sample_hart(model, quant, i["label"], i["mask"], i["pos"], cfg=run["cfg"], seed=fx["seeds"]["g_seed"],
                      diffusion_generator=dgen, more_smooth=run["more_smooth"])
    check_against_record(out, run, FV_FLOAT_ATOL)


def test_fastvar_record_is_the_pruning_rule(fastvar_golden):
    """Run (b) differs from (a) only from the first pruned width on, and its kept indices follow FastVAR's rule
    (L - int(L * ratio) distinct positions per row, ratio 0.5 at width 48 and 0.75 at 64, every block, both sublayers)."""
    fx, cfg, _, _ = fastvar_golden
    ratio = fx["fastvar_rule"]["prune_ratio_by_width"]
    for up, fv in zip(fx["runs"]["upstream"], fx["runs"]["fastvar"]):
        for pn, a, b in zip(cfg.patch_nums, up["tokens"], fv["tokens"]):
            assert torch.equal(a, b) == (pn not in ratio), pn             # same before 48, different from 48 on
        seen = [(k["width"], k["block"], k["sublayer"]) for k in fv["kept"]]
        assert seen == [(w, bl, s) for w in (48, 64) for bl in range(cfg.depth) for s in ("attn", "ffn")]
        for k in fv["kept"]:
            L = k["width"] ** 2
            idx = k["indices"].long()
            assert idx.shape == (4, L - int(L * ratio[k["width"]]))       # 2B rows (cond, uncond): ranked per row
            assert all(len(set(row.tolist())) == idx.shape[1] for row in idx) and 0 <= idx.min() and idx.max() < L
            assert not torch.equal(idx, idx.sort(dim=1).values)           # descending-score order, as released
    checks = fx["checks"]
    for key in ("more_smooth=False", "more_smooth=True"):
        assert checks[key]["no_pruning_vs_upstream"]["tokens_equal"]       # the port = the release without pruning
        assert checks[key]["ascending_kept_order_vs_release"]["tokens_equal"]
        assert not checks[key]["fastvar_vs_upstream"]["tokens_equal"]
