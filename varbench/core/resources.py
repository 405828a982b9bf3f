"""Where varbench's own files live once installed: the Hydra configs and the bundled toy files.

Two roots, never mixed up: the *package directory* (this folder: ``conf/``, the toy model's and the
tiny scorers' weights; read-only, the same in a checkout and after ``pip install``) and the *output
root* (``paths.output_root``, default the launch directory: store, results, Hydra logs, and by
default the folders where released weights and prompt files are looked for).

Configs name package files as ``${vb.package_dir:}/toy/scorers/...``; the resolver is registered
when ``varbench`` is imported, which every entry point does before composing a config.
"""
from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

PACKAGE_DIR = Path(__file__).resolve().parents[1]   # varbench/ (this file is varbench/core/resources.py)
CONF_DIR = PACKAGE_DIR / "conf"
TINY_SCORERS_DIR = PACKAGE_DIR / "toy" / "scorers"


def shard_index(spec) -> int:
    """``${vb.shard_index:${shard}}``: i of a shard spec ``i/n`` (0 without sharding), e.g. to give
    each shard of a sweep its own GPU: ``runtime.device='cuda:${vb.shard_index:${shard}}'``."""
    return 0 if spec in (None, "", "None") else int(str(spec).split("/")[0])


def is_set(value) -> bool:
    """``${vb.is_set:${oc.select:benchmark.rewrite,null}}``: whether a setting holds something (not null or
    empty), e.g. GenEval's recorded ``prompt_rewrite`` follows ``benchmark.rewrite``."""
    return value not in (None, "", "None", "null")


def register_resolvers() -> None:
    """``${vb.package_dir:}`` -> the installed package folder; ``${vb.shard_index:...}``; ``${vb.is_set:...}``
    (idempotent)."""
    if not OmegaConf.has_resolver("vb.package_dir"):
        OmegaConf.register_new_resolver("vb.package_dir", lambda: str(PACKAGE_DIR))
    if not OmegaConf.has_resolver("vb.shard_index"):
        OmegaConf.register_new_resolver("vb.shard_index", shard_index)
    if not OmegaConf.has_resolver("vb.is_set"):
        OmegaConf.register_new_resolver("vb.is_set", is_set)
