"""The word-level text encoder of tiny/toy models: contextual layers start as identities, make a
word's feature depend on its neighbours, ignore padding, behave the same in train and eval mode
(training uses the first, the runtime the second), and survive a save/load and a resume that adds
layers."""
from __future__ import annotations

import pytest
import torch

from varbench.engine.text import WordTextEncoder
from varbench.toy.train import load_text_for_resume

VOCAB = ["a", "photo", "of", "red", "blue", "circle", "square", "left", "right"]
LEFT = "a photo of a red circle left of a blue square"
RIGHT = "a photo of a red circle right of a blue square"


def _encoder(layers, seed=0):
    torch.manual_seed(seed)
    enc = WordTextEncoder(dim=32, vocab=VOCAB, n_hash=4, max_len=16, layers=layers)
    with torch.no_grad():
        for p in enc.parameters():  # zero-init outputs would hide every contextual effect
            p.add_(0.3 * torch.randn_like(p))
    return enc


def test_new_layers_are_identities():
    plain = _encoder(0)
    ctx = WordTextEncoder(dim=32, vocab=VOCAB, n_hash=4, max_len=16, layers=2)
    ctx.load_state_dict(plain.state_dict(), strict=False)
    a, b = plain([LEFT, "a red circle"]), ctx([LEFT, "a red circle"])
    assert torch.equal(a.features, b.features)


def test_context_makes_a_word_depend_on_its_neighbours():
    red = 4  # index of "red" in both captions, which differ only at index 6
    for layers, depends in ((0, False), (2, True)):
        enc = _encoder(layers).eval()
        with torch.no_grad():
            f = enc([LEFT, RIGHT]).features
        assert torch.allclose(f[0, red], f[1, red]) is not depends


def test_padding_is_ignored_and_train_equals_eval():
    enc = _encoder(2)
    with torch.no_grad():
        alone = enc(["a red circle"])
        batched = enc([LEFT, "a red circle"])
        enc.eval()
        batched_eval = enc([LEFT, "a red circle"])
    n = alone.lens[0]
    assert torch.allclose(alone.features[0], batched.features[1, :n], rtol=1e-5, atol=1e-4)
    assert torch.equal(batched.features[1, n:], torch.zeros_like(batched.features[1, n:]))
    assert torch.allclose(batched.features, batched_eval.features, rtol=1e-5, atol=1e-4)


def test_file_round_trip_and_pre_layer_files(tmp_path):
    enc = _encoder(2).eval()
    torch.save({**enc.config(), "state_dict": enc.state_dict()}, tmp_path / "t.pt")
    back = WordTextEncoder.from_file(tmp_path / "t.pt").eval()
    with torch.no_grad():
        assert torch.equal(enc([LEFT]).features, back([LEFT]).features)
    old = _encoder(0)
    cfg = {k: v for k, v in old.config().items() if k not in ("layers", "heads")}  # the format before layers
    torch.save({**cfg, "state_dict": old.state_dict()}, tmp_path / "old.pt")
    assert len(WordTextEncoder.from_file(tmp_path / "old.pt").context) == 0


def test_resume_adds_layers_but_never_drops_them():
    old = _encoder(0)
    saved = {**old.config(), "state_dict": old.state_dict()}
    grown = WordTextEncoder(dim=32, vocab=VOCAB, n_hash=4, max_len=16, layers=2)
    load_text_for_resume(grown, saved)
    assert torch.equal(grown.embed.weight, old.embed.weight)
    with torch.no_grad():
        assert torch.equal(grown([LEFT]).features, old([LEFT]).features)
    two = _encoder(2)
    with pytest.raises(ValueError, match="--text-layers 2"):
        load_text_for_resume(WordTextEncoder(dim=32, vocab=VOCAB, n_hash=4, max_len=16, layers=1),
                             {**two.config(), "state_dict": two.state_dict()})
    with pytest.raises(ValueError, match="does not match"):
        load_text_for_resume(grown, {**saved, "state_dict": {**saved["state_dict"], "extra": torch.zeros(1)}})
