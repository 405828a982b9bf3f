"""The flan-t5-xl loader on a tiny T5 saved as a local Hugging Face folder (same code path)."""
import pytest
import torch


@pytest.fixture(scope="module")
def tiny_t5_folder(tmp_path_factory):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, T5Config, T5EncoderModel

    d = tmp_path_factory.mktemp("flan-t5-tiny")
    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2, "a": 3, "red": 4, "circle": 5, "photo": 6, "of": 7}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>")
    fast.save_pretrained(d)
    torch.manual_seed(0)
    T5EncoderModel(T5Config(vocab_size=8, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_heads=2)).save_pretrained(d)
    return d


def test_t5_folder_encodes_to_compact_per_prompt_features(tiny_t5_folder):
    from varbench.engine.text import T5TextEncoder

    enc = T5TextEncoder(str(tiny_t5_folder), dtype=torch.float32, max_length=12)
    batch = enc(["a photo of a red circle", "a circle"])
    assert batch.lens == [6, 2]                       # tokens per prompt, padding cut off
    assert batch.features.shape == (2, 6, 16) and batch.features.dtype == torch.float32
    assert batch.mask.tolist()[1] == [True, True, False, False, False, False]
    assert torch.all(batch.features[1, 2:] == 0)
    # a prompt's features do not depend on its batch neighbour (the mask hides padding)
    alone = enc(["a circle"])
    torch.testing.assert_close(alone.features[0, :2], batch.features[1, :2], rtol=1e-5, atol=1e-6)


def test_missing_t5_folder_says_where_to_get_it(tmp_path):
    from varbench.engine.checkpoints import WeightsNotFound
    from varbench.engine.text import T5TextEncoder

    with pytest.raises(WeightsNotFound, match="google/flan-t5-xl"):
        T5TextEncoder(str(tmp_path / "flan-t5-xl"))
