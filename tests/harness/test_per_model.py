"""Per-model knob values (varbench/harness/per_model.py): one method name works on every model it
applies to, and `method=<any> model=toy` either acts or is refused with its reason (issue 34 item 1)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import varbench.harness  # noqa: F401 - registers the method schemas the presets name
from varbench.core.errors import ConfigError
from varbench.core.hashing import entry_hash, generation_hash
from varbench.harness.build import model_family
from varbench.harness.config import preset_refusal, validate_config
from varbench.harness.job import pin_runtime
from varbench.harness.per_model import (APPLIED, PER_MODEL, apply_model_knobs, block_key, describe, method_for_model,
                                        overridden_knobs)

CONF = Path(__file__).resolve().parents[2] / "varbench" / "conf"
PRESETS = sorted(p.stem for p in (CONF / "method").glob("*.yaml"))
MODELS = sorted(p.stem for p in (CONF / "model").glob("*.yaml"))
#: the aliases that replaced the per-model copies: (alias, its base preset, the model its block is for)
ALIASES = [("nova_toy", "nova", "toy"), ("toprovar_toy", "toprovar", "toy"), ("scalekv_toy", "scalekv", "toy"),
           ("scalekv_8b", "scalekv", "infinity_8b"), ("skipvar_toy", "skipvar", "toy"), ("fastvar_hart", "fastvar", "hart_0p7b"),
           ("nova_scalekv_toy", "nova_scalekv", "toy"), ("nova_scalekv_8b", "nova_scalekv", "infinity_8b"),
           ("fastvar_scalekv_toy", "fastvar_scalekv", "toy"), ("fastvar_scalekv_8b", "fastvar_scalekv", "infinity_8b"),
           ("skipvar_scalekv_toy", "skipvar_scalekv", "toy"), ("skipvar_scalekv_8b", "skipvar_scalekv", "infinity_8b")]


def _compose(*overrides):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def _hashed(cfg) -> dict:
    tree = json.loads(json.dumps(OmegaConf.to_container(cfg, resolve=True)))   # int keys -> str, as hashed
    return pin_runtime(tree, torch.device("cpu"), torch.float32)


# -- the mechanism -------------------------------------------------------------------------------------
def test_the_model_name_wins_over_its_family_and_a_pin_over_both():
    method = OmegaConf.create({"name": "m", "knobs": {"a": 1},
                               PER_MODEL: {"toy": {"a": 2}, "infinity": {"a": 3}, "hart": {"a": 4}}})
    assert block_key(method, {"name": "toy"}) == "toy"                    # family infinity (the default) too
    assert block_key(method, {"name": "infinity_2b"}) == "infinity"
    assert block_key(method, {"name": "hart_tiny", "family": "hart"}) == "hart"
    assert block_key(method, None) is None                                # no model: only a pin applies
    pinned = OmegaConf.merge(method, {APPLIED: "hart"})
    assert block_key(pinned, {"name": "toy"}) == "hart" and block_key(pinned, None) == "hart"
    assert block_key(OmegaConf.merge(method, {APPLIED: "none"}), {"name": "toy"}) is None
    with pytest.raises(ConfigError, match="no per_model block 'tyo'"):
        block_key(OmegaConf.merge(method, {APPLIED: "tyo"}), {"name": "toy"})


def test_a_block_replaces_knobs_whole_and_command_line_knobs_win():
    cfg = OmegaConf.create({"model": {"name": "toy"}, "method": {
        "name": "m", "knobs": {"prune": {32: 0.4, 40: 0.5}, "r": 1, "s": 1},
        PER_MODEL: {"toy": {"prune": {-4: 0.4}, "r": 2, "s": 2, "new": 5}}}})
    OmegaConf.set_struct(cfg, True)   # as Hydra composes it
    assert apply_model_knobs(cfg, ["method.knobs.s=7", "model=toy"]) == "toy"
    # a map is replaced, not merged key by key (its keys are scales of one schedule); s was given on the command line
    assert OmegaConf.to_container(cfg.method) == {"name": "m", "knobs": {"prune": {-4: 0.4}, "r": 2, "s": 1, "new": 5},
                                                  APPLIED: "toy"}
    before = OmegaConf.to_container(cfg)
    assert apply_model_knobs(cfg) == "toy" and OmegaConf.to_container(cfg) == before   # a merged config stays as it is


def test_overridden_knobs_reads_the_command_lines_knob_names():
    assert overridden_knobs(["method=nova", "method.knobs.r_max=0.5", "+method.knobs.trust_decision_models=true",
                             "~method.knobs.q_sub", "method.knobs.policies.0.knobs.t_min_tokens=9", "model=toy"]) == \
        {"r_max", "trust_decision_models", "q_sub", "policies"}
    assert overridden_knobs(["method.knobs={}"]) == {"*"}


def test_a_knob_set_on_the_command_line_wins_over_the_models_block():
    cfg = _compose("model=toy", "method=nova", "method.knobs.t_min_tokens=64")
    assert apply_model_knobs(cfg, ["model=toy", "method=nova", "method.knobs.t_min_tokens=64"]) == "toy"
    assert (cfg.method.knobs.t_min_tokens, cfg.method.knobs.min_tokens_to_prune) == (64, 36)
    off = _compose("model=toy", "method=nova", f"+method.{APPLIED}=none")   # the preset's own values
    validate_config(off)
    assert off.method.knobs.t_min_tokens == 256 and PER_MODEL not in off.method


# -- the aliases: the per-model copies of old, unchanged ---------------------------------------------------
@pytest.mark.parametrize("alias, base, model", ALIASES)
def test_an_alias_and_its_base_on_the_blocks_model_store_the_same_images(alias, base, model):
    """`method=nova model=toy` runs with exactly `nova_toy`'s knobs, so its store key is `nova_toy`'s and the
    images stored under that name are reused; the record's key differs by the label only."""
    a, b = _compose(f"model={model}", f"method={alias}"), _compose(f"model={model}", f"method={base}")
    for cfg in (a, b):
        apply_model_knobs(cfg)
    assert a.method[APPLIED] == b.method[APPLIED] and PER_MODEL not in a.method and PER_MODEL not in b.method
    assert OmegaConf.to_container(a.method.knobs) == OmegaConf.to_container(b.method.knobs)
    assert generation_hash(_hashed(a), {}, "p") == generation_hash(_hashed(b), {}, "p")
    if a.method.label != b.method.label:
        assert entry_hash(_hashed(a), {}, "p") != entry_hash(_hashed(b), {}, "p")


def test_which_block_was_applied_moves_no_hash():
    cfg = _compose("model=toy", "method=nova_toy")
    apply_model_knobs(cfg)
    tree = _hashed(cfg)
    assert tree["method"][APPLIED] == "toy"
    del tree["method"][APPLIED]
    assert (generation_hash(tree, {}, "p"), entry_hash(tree, {}, "p")) == \
        (generation_hash(_hashed(cfg), {}, "p"), entry_hash(_hashed(cfg), {}, "p"))


# -- every preset's table is well formed -----------------------------------------------------------------
def _keys_known() -> set[str]:
    out = set(MODELS)
    for m in MODELS:
        out.add(model_family(_compose(f"model={m}").model))
    return out


def test_every_per_model_and_refuse_key_names_a_model_or_a_family():
    """A misspelt key would never apply: the method would silently keep its own values there."""
    known = _keys_known()
    assert known >= {"toy", "infinity", "hart", "infinity_8b"}
    for preset in PRESETS:
        method = _compose(f"method={preset}").method
        blocks, refuse = set(method.get(PER_MODEL) or {}), set(method.get("refuse") or {})
        assert blocks | refuse <= known, f"{preset}: {sorted((blocks | refuse) - known)} name no model in conf/model"
        pinned = method.get(APPLIED)
        assert pinned is None or pinned in blocks, f"{preset}: pinned to {pinned!r}, which it has no block for"
        used = blocks if pinned is None else {pinned}   # an alias uses its pinned block only
        assert not used & refuse, f"{preset}: {sorted(used & refuse)} both gets a block and is refused"


def test_no_inherited_block_replaces_a_knob_the_presets_own_file_sets():
    """A variant (`defaults: [nova, _self_]`) inherits its base's blocks; a block that replaced the knob the
    variant exists to change would make the variant its base on that model, silently."""
    for preset in PRESETS:
        raw = OmegaConf.to_container(OmegaConf.load(CONF / "method" / f"{preset}.yaml"), resolve=False)
        own_knobs, own_blocks = set(raw.get("knobs") or {}), set(raw.get(PER_MODEL) or {})
        table = _compose(f"method={preset}").method.get(PER_MODEL)
        for key, block in (OmegaConf.to_container(table, resolve=False) if table is not None else {}).items():
            if key not in own_blocks:
                assert not own_knobs & set(block), (f"{preset}: the inherited per_model.{key} block replaces its own "
                                                     f"{sorted(own_knobs & set(block))}")


@pytest.mark.parametrize("alias, base, model", [a for a in ALIASES if a[2] != "toy"])
def test_the_blocks_for_other_models_validate_there(alias, base, model):
    cfg = _compose(f"model={model}", f"method={base}")
    validate_config(cfg)
    assert cfg.method[APPLIED] == ("hart" if model.startswith("hart") else model)


def test_fastvar_is_the_authors_release_on_each_backbone():
    """`method=fastvar`: the Infinity rule on Infinity, the HART port on HART (their per-model block), and
    refused on the toy, whose 16x16 schedule holds none of either rule's widths."""
    hart = _compose("model=hart_0p7b", "method=fastvar")
    validate_config(hart)
    assert (hart.method.knobs.prune, hart.method[APPLIED]) == ({48: 0.5, 64: 0.75}, "hart")
    for preset in ("fastvar", "fastvar_hart"):   # (outside a Hydra app the error names the policy, not the preset)
        with pytest.raises(ConfigError, match="method=fastvar on model=toy: .*use method=fastvar_generalised"):
            validate_config(_compose("model=toy", f"method={preset}"))
    with pytest.raises(ConfigError, match="on Infinity use method=fastvar"):
        validate_config(_compose("model=infinity_2b", "method=fastvar_hart"))


def test_describe_says_which_block_applies_or_why_not():
    toy = OmegaConf.to_container(_compose("model=toy").model)
    assert describe(_compose("method=nova").method, toy) == "per_model.toy (t_min_tokens, min_tokens_to_prune)"
    assert describe(_compose("method=fastvar").method, toy).startswith("refused: FastVAR's released rules")
    assert describe(_compose("method=skip_last_1").method, toy) == ""


def test_method_for_model_merges_a_bare_preset():
    with initialize_config_dir(config_dir=str(CONF / "method"), version_base="1.3"):
        alias, base = compose(config_name="skipvar_toy"), compose(config_name="skipvar")
    assert method_for_model(alias).knobs.decision_models == "toy/weights/skipvar_toy_93"
    assert method_for_model(base, {"name": "toy"}).knobs.decision_models == "toy/weights/skipvar_toy_93"
    assert "skipvar_toy" not in str(method_for_model(base).knobs.decision_models)   # no model: its own value


# -- `method=<any> model=toy` acts or is refused with its reason -------------------------------------------------
@pytest.fixture(scope="module")
def toy_generation():
    """(generate(policy), the baseline's output) on the shipped toy model: one toy prompt (every adaptive
    preset acts on it: checked when this test was written)."""
    from varbench.toy import world
    from varbench.toy.load import TOY_H_DIV_W, TOY_SCHEDULE, load_toy_runtime, toy_sampling

    rt = load_toy_runtime("cpu")
    prompts = [p["prompt"] for p in world.prompt_set(1, seed=0)]

    def generate(policy):
        return rt.generate(prompts, [1000 * i for i in range(len(prompts))], policy, schedule=TOY_SCHEDULE,
                           h_div_w=TOY_H_DIV_W, **toy_sampling())

    return generate, generate(None)


@pytest.mark.integration
@pytest.mark.parametrize("preset", [p for p in PRESETS if p != "baseline"])   # the baseline is the reference
def test_every_preset_on_the_toy_acts_or_is_refused_with_its_reason(preset, toy_generation):
    from varbench.engine.effect import no_effect_reason

    cfg = _compose("model=toy", "benchmark=toy", f"method={preset}")
    try:
        policy = validate_config(cfg)
    except ConfigError as e:
        if preset == "sparvar_scalekv":   # the composition matrix's cell compose refuses, on every model
            assert "sparvar + scalekv is refused" in str(e) and "\n" not in str(e)
            return
        # refused before any compute, by the preset's `refuse:` (or its policy's backbones), in one line
        reason = preset_refusal(cfg.method, "infinity", "toy")
        assert reason, f"{preset} fails on the toy without a refusal: {e}"
        assert str(e).endswith(f" on model=toy: {reason}") and "\n" not in str(e)
        return
    generate, base = toy_generation
    out = generate(policy)
    reasons = [no_effect_reason(policy, tr) for tr in out.image_traces]
    assert any(r is None for r in reasons), f"{preset} changes no plan on the toy: {reasons[0]}"
    changed = (out.flops["total"] != base.flops["total"], out.kv_bytes[-1] != base.kv_bytes[-1],
               not torch.equal(out.images, base.images))
    assert any(changed), f"{preset}: a plan that is not neutral changed neither FLOPs, KV bytes nor bits"


def test_a_job_of_nova_on_the_toy_uses_nova_toys_store_entry_and_records_the_block(tmp_path):
    """prepare_job merges the block before hashing: `method=nova model=toy` names the image store folder
    of `method=nova_toy` (images reused), its record's config says which block was applied, and a knob
    given with the command wins (a different store key)."""
    from varbench.harness.job import prepare_job
    from varbench.testing.jobs import job_config

    common = ("model=toy", "benchmark=toy", "benchmark.limit=1", "runtime.device=cpu")
    nova, alias = (prepare_job(job_config(tmp_path, *common, f"method={m}")) for m in ("nova", "nova_toy"))
    assert nova.store.generation_hash == alias.store.generation_hash
    assert nova.resolved["method"][APPLIED] == "toy" and PER_MODEL not in nova.resolved["method"]
    assert nova.resolved["method"]["knobs"]["t_min_tokens"] == 36
    mine = prepare_job(job_config(tmp_path, *common, "method=nova", "method.knobs.t_min_tokens=64"))
    assert mine.resolved["method"]["knobs"]["t_min_tokens"] == 64
    assert mine.store.generation_hash != nova.store.generation_hash
