"""Shared fixtures of the W&B tests."""
from __future__ import annotations

import pytest


@pytest.fixture
def offline_wandb(monkeypatch, tmp_path):
    """Offline W&B into tmp_path, nothing from the user's machine: W&B's cache and config under
    tmp_path, its own data folder (its default staging place) at ``tmp_path/wbdata``. Returns tmp_path."""
    for var in ("WANDB_DIR", "WANDB_RUN_ID", "WANDB_RESUME", "WANDB_API_KEY", "WANDB_BASE_URL", "NETRC"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wbcache"))
    monkeypatch.setenv("WANDB_DATA_DIR", str(tmp_path / "wbdata"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wbconfig"))
    return tmp_path
