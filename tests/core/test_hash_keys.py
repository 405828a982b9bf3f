"""Issue #12 items 6 and 10: which config keys move the image store's key (generation hash) and
the run record's key (entry hash), checked by toggling every leaf of composed configs."""
from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from varbench.core.hashing import (ENTRY_EXCLUDE, GENERATION_KEYS, PATH_KEYS, entry_hash, generation_hash, generation_key,
                                   pair_key)
from varbench.harness.build import model_weight_files, model_weight_hashes
from varbench.harness.job import pin_runtime

CONF = Path(__file__).resolve().parents[2] / "varbench" / "conf"

EXPERIMENTS = {
    "smoke": ["+experiment=smoke"],
    "toy": ["model=toy", "benchmark=toy", "method=nova_toy", "evaluator=[toy_geneval]"],
    "infinity_2b": ["model=infinity_2b", "method=fastvar", "benchmark=geneval", "evaluator=[hpsv2]"],
    "hart_tiny": ["model=hart_tiny", "method=fastvar_hart"],   # generation.more_smooth, method.refuse
}

WEIGHTS = {"w.pth": "0" * 64}


def _resolved(overrides) -> dict:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    tree = json.loads(json.dumps(OmegaConf.to_container(cfg, resolve=True)))  # int keys -> str, as hashed
    return pin_runtime(tree, torch.device("cpu"), torch.float32)


def _leaves(tree, prefix=""):
    """Dotted paths of every leaf (scalars, lists and empty mappings are leaves)."""
    if isinstance(tree, dict) and tree:
        for k, v in tree.items():
            yield from _leaves(v, f"{prefix}{k}.")
    else:
        yield prefix[:-1]


def _get(tree, dotted):
    for p in dotted.split("."):
        tree = tree[p]
    return tree


def _flipped(value):
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, str):
        return {"cpu": "cuda", "float32": "bfloat16"}.get(value, value + "_changed")
    if value is None:
        return "set"
    if isinstance(value, list):
        return value + [value[-1]] if value else [1]
    if isinstance(value, dict):
        return {"added": 1}
    raise TypeError(type(value))


def _with(tree, dotted, value):
    out = copy.deepcopy(tree)
    *parts, last = dotted.split(".")
    node = out
    for p in parts:
        node = node[p]
    node[last] = value
    return out


def _under(path: str, keys) -> bool:
    return any(path == k or path.startswith(k + ".") for k in keys)


def _toggle(tree):
    """{leaf: (moves generation hash, moves entry hash)} for every leaf of ``tree``."""
    g0, e0 = generation_hash(tree, WEIGHTS, "p"), entry_hash(tree, WEIGHTS, "p")
    out = {}
    for leaf in _leaves(tree):
        other = _with(tree, leaf, _flipped(_get(tree, leaf)))
        out[leaf] = (generation_hash(other, WEIGHTS, "p") != g0, entry_hash(other, WEIGHTS, "p") != e0)
    return out


@pytest.mark.parametrize("name", sorted(EXPERIMENTS))
def test_toggling_every_key_moves_exactly_the_pixel_keys(name):
    tree = _resolved(EXPERIMENTS[name])
    moved = _toggle(tree)
    gen = sorted(k for k, (g, _) in moved.items() if g)
    expected = sorted(k for k in moved if _under(k, GENERATION_KEYS))
    assert gen == expected
    entry = sorted(k for k, (_, e) in moved.items() if e)
    assert entry == sorted(k for k in moved if not _under(k, ENTRY_EXCLUDE))
    assert set(gen) <= set(entry)  # a new image set always makes a new record
    # what moves the entry hash but never regenerates an image
    entry_only = set(entry) - set(gen)
    assert "runtime.batch_size" in gen      # batch companions change bits (varbench/harness/sharding.py)
    for key in ("method.label", "runtime.cuda_graphs", "timing.repeats",
                "experiment_name", "benchmark.limit", "benchmark.samples_per_prompt"):
        assert key in entry_only, key
    # what moves neither (issue #12 item 10: each of these used to regenerate every image)
    for key in ("runtime.progress", "runtime.save_images", "runtime.force", "aggregate", "paths.store_dir"):
        assert moved[key] == (False, False), key
    assert moved["runtime.fused_entropy"] == (True, True)   # changes pixels on CUDA: kept in
    for key in PATH_KEYS:                                   # paths never move a hash: their sha256 do
        if key in moved:
            assert moved[key] == (False, False), key


def test_every_listed_key_exists_in_some_composed_config():
    leaves = set()
    for overrides in EXPERIMENTS.values():
        leaves |= set(_leaves(_resolved(overrides)))
    for key in GENERATION_KEYS + tuple(k for k in ENTRY_EXCLUDE if k != "hydra"):
        assert any(_under(leaf, [key]) for leaf in leaves), f"{key} names no key of the composed configs"


def test_device_auto_hashes_as_the_resolved_device():
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        auto = OmegaConf.to_container(compose(config_name="config", overrides=["model=tiny"]), resolve=True)
        explicit = OmegaConf.to_container(compose(config_name="config", overrides=[
            "model=tiny", "runtime.device=cpu", "runtime.dtype=float32"]), resolve=True)
    assert auto["runtime"]["device"] == "auto"
    cpu, f32 = torch.device("cpu"), torch.float32
    a, e = pin_runtime(copy.deepcopy(auto), cpu, f32), pin_runtime(explicit, cpu, f32)
    assert generation_hash(a) == generation_hash(e) and entry_hash(a) == entry_hash(e)
    cuda = pin_runtime(copy.deepcopy(auto), torch.device("cuda"), torch.bfloat16)
    assert generation_hash(cuda) != generation_hash(a)
    # cuda:0 and cuda make the same pixels
    c1 = _with(cuda, "runtime.device", "cuda:1")
    assert generation_hash(c1) == generation_hash(cuda)
    # ... and one record: the shards of a job on cuda:0..3 (runtime.device='cuda:${vb.shard_index:${shard}}')
    shard1 = _with(_with(c1, "shard", "1/4"), "runtime.device", "cuda:1")
    shard0 = _with(_with(cuda, "shard", "0/4"), "runtime.device", "cuda:0")
    assert entry_hash(shard0) == entry_hash(shard1) == entry_hash(cuda)
    assert entry_hash(cuda) != entry_hash(a)                         # a GPU record is not a CPU record


def test_pair_key_is_the_generation_key_minus_the_method():
    tree = _resolved(EXPERIMENTS["toy"])
    rec = {"config": tree, "model": {"weights": WEIGHTS}, "benchmark": {"sha256": "p"}}
    for leaf in _leaves(tree):
        other = {**rec, "config": _with(tree, leaf, _flipped(_get(tree, leaf)))}
        moves = pair_key(other) != pair_key(rec)
        assert moves == (_under(leaf, GENERATION_KEYS) and not leaf.startswith("method.")), leaf
    assert pair_key({**rec, "model": {"weights": {"w.pth": "1" * 64}}}) != pair_key(rec)
    assert generation_key(tree, WEIGHTS, "p")["weights"] == WEIGHTS


def test_toy_weights_are_hashed_and_retrained_weights_change_the_keys(tmp_path, monkeypatch):
    import varbench.toy.load as toy_load

    model = OmegaConf.create({"preset": "toy", "random_weights": False, "weights": None, "vae": None,
                              "text_encoder": "word"})
    files = model_weight_files(model)
    assert sorted(files) == sorted(toy_load.FILES.values())
    shipped = model_weight_hashes(model)
    assert set(shipped) == set(toy_load.FILES.values()) and all(len(v) == 64 for v in shipped.values())
    assert shipped == {n: toy_load.read_manifest()["files"][n]["sha256"] for n in shipped}
    # "retrain": a copy of the weights with one file changed
    d = tmp_path / "weights"
    shutil.copytree(toy_load.WEIGHTS_DIR, d, ignore=shutil.ignore_patterns("skipvar_*"))
    (d / toy_load.FILES["infinity"]).write_bytes(b"retrained")
    monkeypatch.setattr(toy_load, "WEIGHTS_DIR", d)
    retrained = model_weight_hashes(model)
    assert retrained[toy_load.FILES["vae"]] == shipped[toy_load.FILES["vae"]]
    assert retrained[toy_load.FILES["infinity"]] != shipped[toy_load.FILES["infinity"]]
    tree = _resolved(EXPERIMENTS["toy"])
    assert generation_hash(tree, shipped) != generation_hash(tree, retrained)
    assert entry_hash(tree, shipped) != entry_hash(tree, retrained)
    # random init: no files; released presets: weights, VAE and (t5) the text encoder folder, by name
    assert model_weight_files(OmegaConf.create({"preset": "tiny", "random_weights": True})) == {}
    released = model_weight_files(OmegaConf.create({"preset": "infinity_2b", "random_weights": False,
                                               "weights": "/x/infinity_2b_reg.pth", "vae": "/x/vae.pth",
                                               "text_encoder": "t5", "text_encoder_path": "/x/flan-t5-xl"}))
    assert sorted(released) == ["flan-t5-xl", "infinity_2b_reg.pth", "vae.pth"]


def test_systems_knobs_at_their_defaults_leave_every_key_as_before():
    from varbench.core.hashing import NEUTRAL_DEFAULTS

    tree = _resolved(EXPERIMENTS["toy"])
    assert {k: _get(tree, k) for k in NEUTRAL_DEFAULTS} == NEUTRAL_DEFAULTS   # conf/runtime/default.yaml
    before = copy.deepcopy(tree)   # a config written before the knobs existed
    for k in NEUTRAL_DEFAULTS:
        del before["runtime"][k.split(".", 1)[1]]
    rec = {"model": {"weights": WEIGHTS}, "benchmark": {"sha256": "p"}}
    assert generation_hash(tree, WEIGHTS, "p") == generation_hash(before, WEIGHTS, "p")
    assert entry_hash(tree, WEIGHTS, "p") == entry_hash(before, WEIGHTS, "p")
    assert pair_key({**rec, "config": tree}) == pair_key({**rec, "config": before})
    # any other value can change pixels: a new image set and a new record
    for k, v in {"runtime.compile": "default", "runtime.quant": "int8_weight_only",
                 "runtime.attn_backend": "math", "runtime.compile_fullgraph": True}.items():
        other = _with(tree, k, v)
        assert generation_hash(other, WEIGHTS, "p") != generation_hash(tree, WEIGHTS, "p"), k
        assert entry_hash(other, WEIGHTS, "p") != entry_hash(tree, WEIGHTS, "p"), k
