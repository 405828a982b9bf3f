"""Strict loading of the released checkpoint layouts, proven on tiny models built in code."""
import json

import pytest
import torch
from safetensors.torch import save_file

from varbench.engine.backbones.infinity.checkpoints import load_infinity_weights
from varbench.engine.backbones.infinity.model import build_infinity
from varbench.engine.checkpoints import CheckpointMismatch, WeightsNotFound, read_state_dict


def _tiny_sd(seed=0):
    torch.manual_seed(seed)
    return build_infinity("tiny").state_dict()


def _assert_same(model, sd):
    for k, v in model.state_dict().items():
        assert torch.equal(v, sd[k]), k


def test_flat_pth_like_infinity_2b_reg(tmp_path):
    sd = _tiny_sd(1)
    torch.save(sd, tmp_path / "infinity_2b_reg.pth")
    m = build_infinity("tiny")
    load_infinity_weights(m, tmp_path / "infinity_2b_reg.pth")
    _assert_same(m, sd)


def test_a_legacy_format_pth_loads_without_the_memory_map(tmp_path):
    """Zip-format files are memory-mapped; a file saved in torch's legacy format cannot be and is
    read whole instead, with the same result."""
    sd = _tiny_sd(4)
    torch.save(sd, tmp_path / "infinity_2b_reg.pth", _use_new_zipfile_serialization=False)
    m = build_infinity("tiny")
    load_infinity_weights(m, tmp_path / "infinity_2b_reg.pth")
    _assert_same(m, sd)


def test_training_checkpoint_nested_under_trainer_gpt_fsdp(tmp_path):
    sd = _tiny_sd(2)
    torch.save({"trainer": {"gpt_fsdp": sd, "optimizer": {"step": torch.tensor(3)}}, "args": {"lr": torch.tensor(1.0)}},
               tmp_path / "ar-ckpt-giter001K-ep0-iter1000-last.pth")
    m = build_infinity("tiny")
    load_infinity_weights(m, tmp_path / "ar-ckpt-giter001K-ep0-iter1000-last.pth")
    _assert_same(m, sd)


def test_sharded_safetensors_folder_with_index_like_8b(tmp_path, capsys):
    sd = {k: v.contiguous() for k, v in _tiny_sd(3).items()}
    keys = sorted(sd)
    half = len(keys) // 2
    shards = {"model-00001-of-00002.safetensors": keys[:half], "model-00002-of-00002.safetensors": keys[half:]}
    folder = tmp_path / "infinity_8b_weights"
    folder.mkdir()
    weight_map = {}
    for name, ks in shards.items():
        save_file({k: sd[k] for k in ks}, str(folder / name))
        weight_map.update({k: name for k in ks})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    m = build_infinity("tiny")
    load_infinity_weights(m, folder)
    _assert_same(m, sd)
    size = sum(f.stat().st_size for f in folder.iterdir()) / 2**30      # a minute-long load says what it reads
    assert f"[varbench] loading Infinity weights infinity_8b_weights ({size:.1f} GiB)" in capsys.readouterr().out
    # a shard listed in the index but absent names itself
    (folder / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(WeightsNotFound, match="model-00002-of-00002.safetensors"):
        read_state_dict(folder)


def test_mismatch_names_every_missing_unexpected_and_misshaped_key(tmp_path):
    sd = _tiny_sd(4)
    del sd["head.weight"], sd["block_chunks.1.module.0.ffn.fc1.bias"]
    sd["extra.thing"] = torch.zeros(3)
    sd["word_embed.weight"] = torch.zeros(5, 5)
    torch.save(sd, tmp_path / "bad.pth")
    with pytest.raises(CheckpointMismatch) as e:
        load_infinity_weights(build_infinity("tiny"), tmp_path / "bad.pth")
    msg = str(e.value)
    for needle in ("head.weight", "block_chunks.1.module.0.ffn.fc1.bias", "extra.thing", "word_embed.weight", "2 missing",
                   "1 unexpected", "1 wrong shape", str(tmp_path / "bad.pth")):
        assert needle in msg


def test_missing_file_names_file_path_and_source(tmp_path):
    with pytest.raises(WeightsNotFound) as e:
        load_infinity_weights(build_infinity("tiny"), tmp_path / "infinity_2b_reg.pth")
    msg = str(e.value)
    assert "infinity_2b_reg.pth" in msg and str(tmp_path) in msg and "huggingface.co/FoundationVision/Infinity" in msg
    assert "VARBENCH_WEIGHTS" in msg


def test_released_key_names_and_shapes_for_2b_and_8b():
    """Our modules on the meta device have exactly the keys and shapes of the released files
    (fixtures derived from the upstream module tree; see their headers)."""
    from pathlib import Path

    for name in ("infinity_2b", "infinity_8b"):
        fix = Path(__file__).resolve().parents[1] / "fixtures" / "keys" / f"{name}.txt"
        expected = [tuple(line.rstrip("\n").split("\t")) for line in fix.read_text().splitlines()
                    if line and not line.startswith("#")]
        ours = [(k, str(tuple(v.shape))) for k, v in build_infinity(name, "meta").state_dict().items()]
        assert sorted(ours) == sorted(expected), name


class NotATensor:
    """Stands in for an arbitrary pickled object inside a checkpoint."""


def test_weights_only_load_refuses_pickled_objects(tmp_path):
    torch.save({"model": NotATensor()}, tmp_path / "evil.pth")
    with pytest.raises(Exception, match="[Ww]eights only load failed|weights_only"):
        read_state_dict(tmp_path / "evil.pth")
