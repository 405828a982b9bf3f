"""The helpers that are the one implementation of something several modules need (issue #12 item 16):
strict state-dict loading, bits -> codes, GenEval's overall score and position rule, lazy registries."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn as nn

from varbench.engine.checkpoints import CheckpointMismatch, load_state_dict_strict


class _Two(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(2, 3)
        self.b = nn.Linear(3, 1)


def test_strict_loader_names_file_missing_unexpected_and_misshaped_keys():
    m = _Two()
    sd = dict(m.state_dict())
    del sd["b.bias"]
    sd["c.weight"] = torch.zeros(1)
    sd["a.weight"] = torch.zeros(4, 4)
    with pytest.raises(CheckpointMismatch) as e:
        load_state_dict_strict(m, sd, source="/weights/two.pt")
    msg = str(e.value)
    for needle in ("/weights/two.pt", "_Two", "1 missing", "1 unexpected", "1 wrong shape", "b.bias", "c.weight",
                   "a.weight: checkpoint (4, 4) vs model (3, 2)", "fix:"):
        assert needle in msg
    assert torch.count_nonzero(m.a.weight) > 0  # nothing was loaded


def test_strict_loader_error_class_and_allowed_missing_keys():
    m, src = _Two(), _Two()
    sd = {k: v for k, v in src.state_dict().items() if k != "b.bias"}
    with pytest.raises(ValueError, match="b.bias"):
        load_state_dict_strict(m, sd, source="x", error=ValueError)
    before = m.b.bias.clone()
    load_state_dict_strict(m, sd, source="x", may_miss=lambda k: k.startswith("b.bias"))
    assert torch.equal(m.a.weight, src.a.weight) and torch.equal(m.b.bias, before)
    with pytest.raises(CheckpointMismatch, match="unexpected keys"):  # may_miss never excuses an extra key
        load_state_dict_strict(m, {**sd, "z": torch.zeros(1)}, source="x", may_miss=lambda k: True)


def test_bits_to_codes_is_plus_minus_one_over_sqrt_d_normalised():
    from varbench.engine.backbones.infinity.bsq_vae import BSQVAE, bits_to_codes

    bits = torch.tensor([[1, 0, 0, 1], [0, 0, 0, 0]])
    codes = bits_to_codes(bits)
    assert codes.dtype == torch.float32
    assert torch.allclose(codes[0], torch.tensor([0.5, -0.5, -0.5, 0.5])) and torch.allclose(codes[1], torch.full((4,), -0.5))
    vae = BSQVAE("toy")
    b = torch.randint(0, 2, (2, 3, 5, vae.codebook_dim), generator=torch.Generator().manual_seed(0))
    assert torch.equal(vae.lfq.bits_to_codes(b), bits_to_codes(b))
    assert torch.equal(vae.bits_to_codes(b), bits_to_codes(b).permute(0, 3, 1, 2))
    assert math.isclose(float(bits_to_codes(b).norm(dim=-1).max()), 1.0, rel_tol=1e-6)


def test_geneval_overall_is_the_unweighted_mean_of_tag_means():
    from varbench.evaluators.geneval import rules as R
    # 3 counting images (1 right) and 1 colours image (right): mean of tag means 2/3, not image mean 1/2
    pairs = [("counting", 1.0), ("counting", 0.0), ("counting", 0.0), ("colors", 1.0)]
    means = R.tag_means(pairs)
    assert list(means) == ["counting", "colors"] and means["counting"] == pytest.approx(1 / 3)
    assert R.geneval_overall(means) == pytest.approx(2 / 3) == R.geneval_overall(means.values())
    assert R.overall_of_groups([pairs[:2], pairs[2:]]) == R.geneval_overall(means)
    assert math.isnan(R.geneval_overall({}))
    rows = [{"prompt_index": i, "tag": t, "correct": bool(v)} for i, (t, v) in enumerate(pairs)]
    assert R.summarize(rows)["overall"] == R.geneval_overall(means)


def test_position_rule_scores_and_relations_agree_with_the_toy_world():
    from varbench.evaluators.geneval import rules as R
    from varbench.toy import world

    def obj(*box):
        return (np.array(box, dtype=float),)

    dx, dy = R.position_scores(obj(0, 0, 10, 10), obj(20, 0, 30, 10))
    assert dx == pytest.approx(-18 / 20) and dy == 0  # 0.1 x (10 + 10) dead zone off a 20 offset
    assert R.relative_position(obj(0, 0, 10, 10), obj(20, 0, 30, 10)) == {"left of"}
    assert R.position_scores(obj(0, 0, 10, 10), obj(1, 0, 11, 10)) is None
    assert world._clear_relation((0, 0, 0.2, 0.2), (0.5, 0.05, 0.7, 0.25), "left of")
    assert not world._clear_relation((0, 0, 0.2, 0.2), (0.5, 0.05, 0.7, 0.25), "right of")
    assert not world._clear_relation((0, 0, 0.2, 0.2), (0.5, 0.5, 0.7, 0.7), "left of")  # diagonal: not clear


def test_lazy_registry_imports_on_first_load_and_lists_known_names_for_an_unknown_one():
    from varbench import evaluators, policies
    from varbench.core.registry import LazyRegistry, UnknownName, resolve
    from varbench.harness import prompts

    reg = LazyRegistry("widget", {"ordered_dict": "collections:OrderedDict", "plain": dict})
    reg.register("counter", "collections:Counter")
    assert reg["counter"] == "collections:Counter"  # reading gives what was registered
    import collections

    assert reg.load("counter") is collections.Counter and reg.load("plain") is dict
    with pytest.raises(UnknownName) as e:
        reg.load("countr")
    msg = str(e.value)
    assert msg.startswith("Unknown widget 'countr'.") and "Did you mean counter?" in msg
    assert "Known: counter, ordered_dict, plain." in msg
    with pytest.raises(KeyError, match="Unknown gadget 'x'"):
        resolve(reg, "x", "gadget")
    del reg["plain"]
    assert sorted(reg) == ["counter", "ordered_dict"]
    for r in (policies.REGISTRY, evaluators.REGISTRY, prompts.LOADERS):
        assert isinstance(r, LazyRegistry)
    assert evaluators.REGISTRY.load("fidelity").__name__ == "FidelityEvaluator"
