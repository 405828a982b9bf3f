"""HART in the harness (issue 25): model=hart_0p7b / hart_tiny compose, build and run; each method preset
says whether it applies to HART, and one that does not is refused with its reason before any weight loads;
the released folders are found, named when missing, and loaded strictly; main_table sweeps each model's
own methods and writes a table on hart_tiny."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import varbench.harness  # noqa: F401  (registers the method presets' knob dataclasses)
from varbench.core.errors import ConfigError
from varbench.core.hashing import entry_hash, generation_hash
from varbench.harness.build import build_runtime, generation_resolution, model_weight_files, resolve_dtype
from varbench.harness.config import validate_config
from varbench.testing.jobs import job_config

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "varbench" / "conf"


def _compose(*overrides, hydra=False):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides), return_hydra_config=hydra)


def _methods(exp: str, model: str) -> list[str]:
    cfg = _compose(f"+experiment={exp}", f"model={model}", hydra=True)
    return str(cfg.hydra.sweeper.params.method).split(",")


# -------------------------------------------------------------------------------- methods per backbone
def test_main_table_sweeps_each_models_own_methods():
    infinity = _methods("main_table", "infinity_2b")
    assert infinity == ["baseline", "fastvar", "nova", "toprovar", "skip_last_2", "skipvar_hybrid", "sparvar",
                        "sparsevar"]
    assert _methods("main_table", "infinity_8b") == infinity == _methods("main_table", "tiny")
    # HART: FastVAR's own HART port in place of its Infinity rule, the rest as on Infinity (SparVAR is
    # Infinity-only: its release patches Infinity's attention)
    assert _methods("main_table", "hart_0p7b") == ["baseline", "fastvar_hart", "nova", "toprovar", "skip_last_2",
                                                  "skipvar_hybrid"]
    assert _methods("main_table", "hart_tiny") == ["baseline", "fastvar_hart", "nova_toy", "toprovar_toy",
                                                  "skip_last_2", "skipvar_hybrid"]   # small-schedule thresholds


@pytest.mark.parametrize("model", ["hart_0p7b", "hart_tiny"])
def test_every_main_table_method_validates_on_hart(model):
    for method in _methods("main_table", model):
        validate_config(_compose(f"model={model}", f"method={method}"))


@pytest.mark.parametrize("method,reason", [
    # (`fastvar` applies: on HART its per-model hart block is the port, tests/harness/test_per_model.py)
    ("fastvar_2b_paper", "use method=fastvar_hart"),                 # the Infinity indices: a preset refusal
    ("fastvar_8b_paper_release_blocks", "use method=fastvar_hart"),   # inherited from fastvar_8b_paper
    ("scalekv", "scalekv is written for infinity models, not hart"),     # the class's backbones
    ("skipvar_toy", "skipvar is written for infinity models, not hart"),
    ("nova_scalekv_toy", r"compose.policies\[1\]: scalekv is written for infinity"),   # a member refuses
])
def test_methods_that_do_not_apply_to_hart_are_refused_with_the_reason(method, reason):
    with pytest.raises(ConfigError, match=f"method=.* on model=hart_0p7b: .*{reason}"):
        validate_config(_compose("model=hart_0p7b", f"method={method}"))


def test_nova_per_bit_entropy_variants_are_refused_on_hart_only():
    validate_config(_compose("model=infinity_2b", "method=nova", "method.knobs.entropy_logits=cond"))
    with pytest.raises(ConfigError, match="read Infinity's per-bit logits"):
        validate_config(_compose("model=hart_0p7b", "method=nova", "method.knobs.entropy_logits=cond"))


def test_the_hart_port_preset_is_refused_on_infinity():
    with pytest.raises(ConfigError, match="on Infinity use method=fastvar"):
        validate_config(_compose("model=infinity_2b", "method=fastvar_hart"))


def test_a_refusal_renames_no_record():
    """`method.refuse` is a config check: adding one to a preset changes neither key."""
    base = OmegaConf.to_container(_compose("model=tiny", "method=fastvar"), resolve=True)
    bare = json.loads(json.dumps(base))
    del bare["method"]["refuse"]
    assert entry_hash(base) == entry_hash(bare) and generation_hash(base) == generation_hash(bare)


def test_an_unknown_policy_is_infinity_only_and_says_how_to_declare_hart():
    from varbench.engine.policy import Policy

    class Mine(Policy):
        name = "mine"

        def plan(self, si):
            raise AssertionError

    assert Mine().backbone_refusal("infinity") is None
    assert "backbones = frozenset({'hart', 'infinity'})" in Mine().backbone_refusal("hart")


# -------------------------------------------------------------------------------- HART's own settings
def test_more_smooth_is_a_hart_setting_and_a_pixel_key():
    hart = OmegaConf.to_container(_compose("model=hart_tiny"), resolve=True)
    assert hart["generation"]["more_smooth"] is True               # sample.py's default
    off = json.loads(json.dumps(hart))
    off["generation"]["more_smooth"] = False
    assert generation_hash(off) != generation_hash(hart)
    assert "more_smooth" not in _compose("model=infinity_2b").generation   # Infinity's hashes are unchanged
    with pytest.raises(ConfigError, match="generation.more_smooth is HART's"):
        validate_config(_compose("model=tiny", "+generation.more_smooth=true"))
    with pytest.raises(ConfigError, match="more_smooth must be true or false"):
        validate_config(_compose("model=hart_tiny", "generation.more_smooth=3"))


def test_the_schedule_and_resolution_are_fixed():
    with pytest.raises(ConfigError, match="generates on its own fixed schedule"):
        validate_config(_compose("model=hart_0p7b", "generation.pn=1M"))
    with pytest.raises(ConfigError, match="generates on its own fixed schedule"):
        validate_config(_compose("model=hart_0p7b", "generation.h_div_w=0.5"))


def test_every_backbone_folder_has_a_builder_and_its_presets():
    """A model config's family picks its builder; a backbone folder without one (or a builder without a
    folder) would build nothing, and `preset_family` finds each released preset in its own folder."""
    from varbench.engine.backbones import FAMILIES, preset_family
    from varbench.harness.build import BUILDERS

    assert set(BUILDERS) == set(FAMILIES) == {"infinity", "hart"}
    assert [preset_family(p) for p in ("infinity_2b", "infinity_8b", "tiny", "hart_0p7b", "hart_tiny")] == \
        ["infinity"] * 3 + ["hart"] * 2
    with pytest.raises(KeyError, match="hart_0p7b"):      # an unknown preset names the known ones
        preset_family("hart_7b")


def test_dtype_auto_is_the_releases_per_family():
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert resolve_dtype("auto", cuda, "hart") == torch.float16        # sample.py: fp16 autocast
    assert resolve_dtype("auto", cuda, "infinity") == torch.bfloat16
    assert resolve_dtype("auto", cpu, "hart") == torch.float32
    assert resolve_dtype("fp16", cuda, "hart") == torch.float16
    with pytest.raises(ConfigError, match="use auto, float32, bfloat16"):
        resolve_dtype("float16", cuda, "infinity")


def test_cuda_graphs_are_refused_on_hart():
    from varbench.harness.build import configure_runtime

    cfg = _compose("model=hart_tiny")
    rt = build_runtime(cfg.model, torch.device("cpu"), torch.float32)
    assert configure_runtime(rt, OmegaConf.create({"cuda_graphs": "auto"})).cuda_graphs is False
    with pytest.raises(ConfigError, match="no CUDA-graph path"):
        configure_runtime(rt, OmegaConf.create({"cuda_graphs": "true"}))


# -------------------------------------------------------------------------------- files
def test_the_released_folders_are_named_and_preflighted(tmp_path):
    from varbench.harness.preflight import job_files_missing

    cfg = job_config(tmp_path, "model=hart_0p7b", "evaluator=[]", f"paths.weights_dir={tmp_path}/w")
    assert sorted(model_weight_files(cfg.model)) == ["Qwen2-VL-1.5B-Instruct", "hart-0.7b-1024px/llm",
                                                     "hart-0.7b-1024px/tokenizer"]
    missing = {m.what: m for m in job_files_missing(cfg)}
    assert sorted(missing) == ["model hart_0p7b: weights Qwen2-VL-1.5B-Instruct", "model hart_0p7b: weights hart-0.7b-1024px/llm",
                               "model hart_0p7b: weights hart-0.7b-1024px/tokenizer"]
    assert "huggingface.co/mit-han-lab/hart-0.7b-1024px (folder llm/)" in missing["model hart_0p7b: weights hart-0.7b-1024px/llm"].published
    random = job_config(tmp_path, "model=hart_0p7b", "model.random_weights=true", "model.text_encoder=word")
    assert model_weight_files(random.model) == {}


def _released_tiny_folders(root: Path) -> tuple[Path, Path, dict]:
    """`llm/` and `tokenizer/` laid out as released, for the tiny preset: config.json + safetensors of a
    random tiny HART ('hart_tiny10', released key names) and of the tokenizer parity fixture (tests/fixtures/hart_tokenizer)."""
    import dataclasses

    from safetensors.torch import save_file

    from varbench.engine.backbones.hart.model import HART_PRESETS, build_hart

    cfg = HART_PRESETS["hart_tiny10"]   # model=hart_tiny's
    torch.manual_seed(3)
    model = build_hart(cfg)
    llm = root / "hart-tiny" / "llm"
    llm.mkdir(parents=True)
    fields = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
    conf = {k: v for k, v in fields.items() if k not in ("vocab_size", "cvae", "share_quant_resi", "quant_resi")}
    conf.update(patch_nums=list(cfg.patch_nums), attn_type="llama", mlp_type="llama", use_cross_attn=False)
    (llm / "config.json").write_text(json.dumps(conf))
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    save_file(sd, str(llm / "model.safetensors"))
    parity = torch.load(ROOT / "tests" / "fixtures" / "hart_tokenizer" / "tiny_tokenizer_parity.pt", weights_only=False)
    tok = root / "hart-tiny" / "tokenizer"
    tok.mkdir()
    (tok / "config.json").write_text(parity["config_json"])
    tsd = {k: parity["weights"][k].float() if k in parity["weights"] else torch.zeros(s) for k, s in parity["keys"].items()}
    tsd = {k: (v.long() if k.endswith("num_batches_tracked") else v) for k, v in tsd.items()}
    save_file(tsd, str(tok / "model.safetensors"))
    return llm, tok, sd


def test_released_layout_builds_strictly_from_the_harness(tmp_path):
    from safetensors.torch import save_file

    llm, tok, sd = _released_tiny_folders(tmp_path)
    over = ["model=hart_tiny", "model.random_weights=false", f"model.weights={llm}", f"model.vae={tok}"]
    cfg = _compose(*over)
    rt = build_runtime(cfg.model, torch.device("cpu"), torch.float32)
    assert type(rt).__name__ == "HartRuntime" and rt.vae is not None
    assert all(torch.equal(rt.model.state_dict()[k], v) for k, v in sd.items())     # the file's weights, not an init
    assert generation_resolution(rt, 1.0, "64px") == [64, 64]
    out = rt.generate(["a red circle"], [0], schedule=[tuple(hw) for hw in cfg.model.schedule])   # the yaml's stages
    assert out.images.shape == (1, 64, 64, 3)
    names = model_weight_files(cfg.model)
    assert sorted(names) == ["hart-tiny/llm", "hart-tiny/tokenizer"]                 # word encoder: no folder
    sd.pop("blocks.0.attn.proj.weight")
    sd["blocks.0.attn.out.weight"] = torch.zeros(1)
    save_file(sd, str(llm / "model.safetensors"))
    with pytest.raises(Exception, match=r"(?s)blocks\.0\.attn\.proj\.weight.*blocks\.0\.attn\.out\.weight"):
        build_runtime(cfg.model, torch.device("cpu"), torch.float32)


# -------------------------------------------------------------------------------- end to end
@pytest.mark.integration
def test_main_table_on_hart_tiny_writes_a_table(tmp_path):
    sweep = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "varbench", "+experiment=main_table", "model=hart_tiny", "benchmark.limit=2",
           "timing.repeats=2", "runtime.progress=false", f"paths.output_root={tmp_path}", f"hydra.sweep.dir={sweep}"]
    env = {**os.environ, "VARBENCH_STORE": str(tmp_path / "store")}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    table = (tmp_path / "results" / "main_table" / "hart_tiny-64px" / "table.md").read_text()
    rows = [line.split(" | ")[0].lstrip("| ") for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(rows) == 1 + 6 and rows[1] == "baseline", table          # the header, then one row per method
    assert any(r.startswith("FastVAR (HART port)") and "(no effect)" in r for r in rows), rows   # no 48/64 map
    assert "skip_last_2" in rows and "model=hart_tiny" in table and "64x64" in table


def test_random_weights_need_the_word_encoder_and_say_so_before_building():
    cfg = _compose("model=hart_0p7b", "model.random_weights=true")       # text_encoder still qwen2
    with pytest.raises(ValueError, match="set model.text_encoder=word"):
        build_runtime(cfg.model, torch.device("meta"), torch.float32)
