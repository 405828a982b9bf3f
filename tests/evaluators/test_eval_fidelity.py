"""Fidelity evaluator (PSNR/SSIM vs Sample.reference; LPIPS only with local weights), registry and configs."""
import inspect
import math
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from varbench.evaluators import REGISTRY, build_evaluator
from varbench.evaluators.base import Sample

CONF = Path(__file__).resolve().parents[2] / "varbench" / "conf" / "evaluator"


def _img(seed, noise=0):
    rng = np.random.default_rng(seed)
    base = np.tile(np.linspace(0, 255, 32, dtype=np.float32), (32, 1))[..., None].repeat(3, -1)
    return Image.fromarray(np.clip(base + rng.normal(0, noise, base.shape), 0, 255).astype(np.uint8))


def test_psnr_ssim_and_rows(monkeypatch, tmp_path):
    monkeypatch.setattr("torch.hub.get_dir", lambda: str(tmp_path))  # no LPIPS backbone here
    ev = build_evaluator("fidelity", device="cpu")
    assert ev.needs_reference
    ev.setup("cpu")
    ref = _img(0)
    ev.update([Sample(0, 0, "p", ref, reference=ref), Sample(1, 0, "p", _img(1, noise=8), reference=ref)])
    res = ev.compute()
    same, noisy = res.per_sample
    assert math.isinf(same["psnr"]) and same["ssim"] == pytest.approx(1.0)
    # PSNR of the noisy pair from its definition: 10 log10(1 / MSE) on [0, 1] images
    a = np.asarray(_img(1, noise=8), dtype=np.float64) / 255
    mse = ((a - np.asarray(ref, dtype=np.float64) / 255) ** 2).mean()
    assert noisy["psnr"] == pytest.approx(10 * math.log10(1 / mse), abs=1e-3)
    assert noisy["ssim"] < 1
    assert res.metrics["psnr"] == pytest.approx((100.0 + noisy["psnr"]) / 2)  # identical pair capped at 100 dB
    assert "lpips" not in res.metrics and ev.version_info()["lpips"].startswith("skipped")


def test_fidelity_errors(monkeypatch, tmp_path):
    monkeypatch.setattr("torch.hub.get_dir", lambda: str(tmp_path))
    ev = build_evaluator("fidelity")
    ev.setup("cpu")
    with pytest.raises(ValueError, match="no reference"):
        ev.update([Sample(0, 0, "p", _img(0))])
    with pytest.raises(ValueError, match="differ in size"):
        ev.update([Sample(0, 0, "p", _img(0), reference=Image.new("RGB", (8, 8)))])
    with pytest.raises(FileNotFoundError, match="alexnet"):
        build_evaluator("fidelity", lpips=True).setup("cpu")


@pytest.mark.parametrize("name", ["hpsv2", "imagereward", "geneval", "fidelity"])
def test_registered_and_config_keys_match_constructor(name):
    assert name in REGISTRY
    cfg = yaml.safe_load((CONF / f"{name}.yaml").read_text())[name]
    assert cfg.pop("name") == name
    module, cls = REGISTRY[name].split(":")
    import importlib

    params = inspect.signature(getattr(importlib.import_module(module), cls).__init__).parameters
    assert set(cfg) <= set(params), set(cfg) - set(params)
    ev = build_evaluator(name, **{k: v for k, v in cfg.items() if not str(v).startswith("${")})  # cheap: no weights
    assert ev.name == name
