"""Every file a sweep needs, checked before any of its jobs starts.

``check_files(cfgs)`` looks, for each job's config, for the model's weight files (transformer, VAE,
text encoder), the files the method declares (`Policy.required_files`: ScaleKV's budget file, SkipVAR's
decision models, a plugin's own), the benchmark's
prompt file(s) and each evaluator's checkpoints (its
:meth:`~varbench.evaluators.base.Evaluator.preflight`, with :func:`varbench.core.missing.collecting`
open so one evaluator names all of its files), and raises one :class:`MissingFilesError` listing
each missing file once: what it is, where it was searched, where it is published, and which jobs
need it when not all do. A job whose config is wrong in another way is left to fail on its own (a
sweep goes on past one bad job); only missing files stop the whole sweep, since each one fails
every job that needs it, and one list beats one round per file.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Sequence

from omegaconf import DictConfig

from varbench.core.errors import ConfigError, FixableError
from varbench.core.missing import MissingFile, MissingFilesError, collecting


def model_files_missing(cfg: DictConfig) -> list[MissingFile]:
    """The model's weight files and folders (``model.weights``, ``model.vae``, the T5 folder) that
    are not there."""
    from varbench.engine.checkpoints import PUBLISHED_AT
    from varbench.harness.build import model_weight_files

    out = []
    for name, path in model_weight_files(cfg.model).items():
        if not Path(path).exists():
            out.append(MissingFile(f"model {cfg.model.name}: weights {name}", str(Path(path).resolve()),
                                   PUBLISHED_AT.get(name, "see docs/running.md, 'Running with the released weights'"),
                                   "put it there, or point paths.weights_dir (env VARBENCH_WEIGHTS) at its folder"))
    return out


def prompt_files_missing(cfg: DictConfig) -> list[MissingFile]:
    """The benchmark's prompt file when it cannot be loaded (missing or garbled), as its error says."""
    from varbench.harness.prompts import load_prompt_set

    try:
        load_prompt_set(cfg.benchmark)
    except ConfigError:
        return []                          # a bad setting: the job reports it
    except FixableError as e:
        return [_from_error(f"benchmark {cfg.benchmark.get('name') or cfg.benchmark.get('loader')}", e)]
    return []


def evaluator_files_missing(cfg: DictConfig) -> list[MissingFile]:
    """Each evaluator's checkpoints and folders that are not there."""
    from varbench.harness.prompts import load_prompt_set
    from varbench.harness.scoring import preflight

    try:
        metadata = [it.metadata for it in load_prompt_set(cfg.benchmark).items]
    except Exception:  # noqa: BLE001 - no prompts (named by prompt_files_missing): check the files alone
        metadata = None
    out = []
    for name, ecfg in (cfg.get("evaluator") or {}).items():
        with collecting() as notes:
            try:
                preflight({name: ecfg}, metadata if metadata is not None else [], "cpu")
            except ConfigError:
                pass                       # e.g. GenEval on other prompts: the job reports it
            except FixableError as e:      # a check that raises instead of noting (an executable, a script)
                notes.append(_from_error(f"evaluator {name}", e))
        out += [m if m.what.startswith("evaluator ") else dataclasses.replace(m, what=f"evaluator {name}: {m.what}")
                for m in notes]
    return out


def method_files_missing(cfg: DictConfig) -> list[MissingFile]:
    """The files the method declares for its knobs (`varbench.engine.policy.Policy.required_files`,
    e.g. ScaleKV's budget file, SkipVAR's decision models; a composed method's members through
    `compose`'s own declaration) that are not there. A packaged method and a plugin are asked alike;
    a method whose class does not resolve is left to its job, which names it."""
    from omegaconf import OmegaConf

    from varbench.policies import REGISTRY

    method = OmegaConf.to_container(cfg.method, resolve=True) if OmegaConf.is_config(cfg.method) else dict(cfg.method)
    name = method.get("name")
    try:
        files = REGISTRY.load(str(name)).required_files(dict(method.get("knobs") or {}))
    except Exception:  # noqa: BLE001 - an unknown or broken method: the job reports it in its own words
        return []
    return [MissingFile(f"method {f.owner or name}: {f.what}", f.path, f.published,
                        f.fix.replace("{setting}", f"method.knobs.{f.knob}"))
            for f in files if not f.is_present()]


def job_files_missing(cfg: DictConfig) -> list[MissingFile]:
    """Every missing file of one job's config."""
    return (model_files_missing(cfg) + method_files_missing(cfg) + prompt_files_missing(cfg)
            + evaluator_files_missing(cfg))


def check_files(cfgs: Sequence[DictConfig], labels: Sequence[str] | None = None) -> None:
    """Raise one :class:`MissingFilesError` naming every file the jobs ``cfgs`` need and lack (see the
    module docstring); ``labels``: how to name each job (its overrides), for files only some need."""
    labels = list(labels) if labels is not None else [f"job {i}" for i in range(len(cfgs))]
    needed: dict[tuple[str, str], tuple[MissingFile, list[str]]] = {}
    for cfg, label in zip(cfgs, labels):
        for m in job_files_missing(cfg):
            needed.setdefault((m.what, m.path), (m, []))[1].append(label)
    if not needed:
        return
    n = len(cfgs)
    lines = [f"{len(needed)} file{'s' if len(needed) != 1 else ''} the "
             f"{'sweep' if n > 1 else 'job'} needs {'are' if len(needed) != 1 else 'is'} missing "
             f"(no job was started{f'; {n} jobs checked' if n > 1 else ''}):"]
    for k, (m, jobs) in enumerate(needed.values(), 1):
        head, *rest = m.lines()
        if n > 1:
            head += " (every job)" if len(jobs) == n else f" ({len(jobs)} of {n} jobs: {'; '.join(jobs[:4])}" + \
                    (" ..." if len(jobs) > 4 else "") + ")"
        lines.append(f"  {k}. {head}")
        lines += [f"       {r}" for r in rest]
    lines.append("Put the files in place (docs/running.md, 'Running with the released weights'), or run with --no-preflight "
                 "to start the jobs anyway (each then fails on its first missing file).")
    raise MissingFilesError("\n".join(lines), [m for m, _ in needed.values()])


def _from_error(where: str, e: BaseException) -> MissingFile:
    """A :class:`MissingFile` from an error's own message (``... not found.\\n  searched: P\\n  published
    at: U\\n  fix: F``, the prompts' and checkpoints' form; anything else as its text)."""
    first, *rest = str(e).split("\n")
    fields = {}
    for line in rest:
        key, sep, value = line.strip().partition(": ")
        if sep and key in ("searched", "published at", "fix"):
            fields[key] = value
    return MissingFile(f"{where}: {first.rstrip('.')}", fields.get("searched", ""), fields.get("published at", ""),
                       fields.get("fix", "").rstrip("."))
