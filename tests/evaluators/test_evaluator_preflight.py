"""`Evaluator.preflight`: what a scorer will need, checked before a job generates anything (cheap:
file existence and prompt metadata; nothing loaded or hashed)."""
import pytest

from varbench.evaluators import build_evaluator
from varbench.evaluators.weights import WeightsNotFoundError

GENEVAL_META = [{"tag": "single_object", "include": [{"class": "cat", "count": 1}]}]


def _touch(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"not loaded by preflight")
    return path


@pytest.mark.parametrize("name, files", [   # (file to add, what the error names while it is missing)
    ("hpsv2", [("HPS_v2.1_compressed.pt", "HPS_v2.1_compressed.pt")]),
    ("imagereward", [("ImageReward.pt", "ImageReward.pt"), ("bert-base-uncased/vocab.txt", "vocab.txt")]),
    ("geneval", [("mask2former_swin-s_coco_instance/config.json", "config.json"),
                 ("mask2former_swin-s_coco_instance/model.safetensors", "no weights"),
                 ("open_clip_vit_l14_openai.bin", "open_clip_vit_l14_openai.bin")]),
])
def test_preflight_names_each_missing_file_then_passes_once_all_are_there(tmp_path, name, files):
    ev = build_evaluator(name, weights_dir=str(tmp_path))
    for f, named in files:
        with pytest.raises(WeightsNotFoundError, match=named.replace(".", r"\.")):
            ev.preflight(GENEVAL_META)
        _touch(tmp_path / f)
    ev.preflight(GENEVAL_META)  # every file there: no error (their contents are setup's business)


def test_geneval_and_toy_geneval_preflight_refuse_prompts_they_cannot_score(tmp_path):
    hps_meta = [{"style": "anime"}]
    with pytest.raises(ValueError, match="benchmark=geneval"):
        build_evaluator("geneval", weights_dir=str(tmp_path)).preflight(hps_meta)
    with pytest.raises(ValueError, match="benchmark=toy"):
        build_evaluator("toy_geneval").preflight(GENEVAL_META)   # COCO classes, not toy-world shapes


def test_fidelity_preflight_needs_lpips_weights_only_when_lpips_is_required(tmp_path, monkeypatch):
    monkeypatch.setattr("torch.hub.get_dir", lambda: str(tmp_path))
    build_evaluator("fidelity", lpips="auto").preflight([])   # auto: runs without LPIPS if absent
    with pytest.raises(WeightsNotFoundError, match="LPIPS"):
        build_evaluator("fidelity", lpips=True).preflight([])
