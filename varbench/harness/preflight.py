"""Every file a sweep needs, checked before any of its jobs starts.

``check_files(cfgs)`` looks, for each job's config, for the model's weight files (transformer, VAE,
text encoder), the files the method declares (`Policy.required_files`: ScaleKV's budget file, SkipVAR's
decision models, a plugin's own), the benchmark's
prompt file(s) and each evaluator's checkpoints (its
:meth:`~varbench.evaluators.base.Evaluator.preflight`, with :func:`varbench.core.missing.collecting`
open so one evaluator names all of its files), and raises one :class:`MissingFilesError` listing
each missing file once: what it is, where it was searched, where it is published, and which jobs
need it when not all do.

"Missing" is said only of what is missing. A file that is there but malformed (a prompt file that is
not UTF-8, a folder where a file belongs), a setting out of range (``benchmark.limit=-1``), a plugin
that does not import, settings that cannot work together (a shard left without prompts): each is
raised as its own error (:class:`~varbench.core.errors.MalformedFileError`, ``BadSettingError``,
``EntryLoadError``, ``IncompatibleSettingsError``), first among the problems, before any job starts
(:func:`check_files`). A job whose config fails in a way this check does not look at is left to
fail on its own (a sweep goes on past one bad job).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Sequence

from omegaconf import DictConfig

from varbench.core.errors import ConfigError, FixableError, IncompatibleSettingsError
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


def is_missing(e: BaseException) -> bool:
    """True for an error that says a file is absent (a ``FileNotFoundError``: the prompts', the
    weights', the evaluators'); anything else (malformed, a bad setting, a plugin that fails to
    import) is not "missing"."""
    return isinstance(e, FileNotFoundError)


@dataclasses.dataclass
class JobInputs:
    """What the preflight found wrong with one job's inputs: files absent, and other problems."""

    missing: list[MissingFile] = dataclasses.field(default_factory=list)
    problems: list[FixableError] = dataclasses.field(default_factory=list)


def prompt_files_missing(cfg: DictConfig, problems: list | None = None) -> list[MissingFile]:
    """The benchmark's prompt file when it is absent; any other fault of the prompt set (malformed, a
    bad setting, a loader that does not import) goes to ``problems`` (or is raised when None)."""
    from varbench.harness.prompts import load_prompt_set

    try:
        load_prompt_set(cfg.benchmark)
    except FixableError as e:
        if is_missing(e):
            return [_from_error(f"benchmark {cfg.benchmark.get('name') or cfg.benchmark.get('loader')}", e)]
        if problems is None:
            raise
        problems.append(e)
    return []


def shard_problem(cfg: DictConfig) -> FixableError | None:
    """An :class:`~varbench.core.errors.IncompatibleSettingsError` when ``shard=i/n`` would leave some
    shard without prompts (:func:`varbench.harness.job.check_shard_fits`); None otherwise."""
    from varbench.harness.job import check_shard_fits
    from varbench.harness.prompts import load_prompt_set
    from varbench.harness.sharding import Shard

    try:
        shard = Shard.parse(cfg.get("shard"))
        if shard.count == 1:
            return None
        check_shard_fits(shard, load_prompt_set(cfg.benchmark), int(cfg.runtime.batch_size))
    except IncompatibleSettingsError as e:
        return e
    except (FixableError, ValueError, TypeError):
        return None                        # a missing or malformed prompt file, a bad shard: named elsewhere
    return None


def evaluator_files_missing(cfg: DictConfig, problems: list | None = None) -> list[MissingFile]:
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
                if is_missing(e) or problems is None:
                    notes.append(_from_error(f"evaluator {name}", e))
                else:
                    problems.append(e)     # a malformed checkpoint, an evaluator that does not import
        out += [m if m.what.startswith("evaluator ") else dataclasses.replace(m, what=f"evaluator {name}: {m.what}")
                for m in notes]
    return out


def method_files_missing(cfg: DictConfig, problems: list | None = None) -> list[MissingFile]:
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
    except FixableError as e:          # a plugin that does not import, or is the wrong kind for its slot
        if problems is not None:
            problems.append(e)
        return []
    except Exception:  # noqa: BLE001 - an unknown or broken method: the job reports it in its own words
        return []
    return [MissingFile(f"method {f.owner or name}: {f.what}", f.path, f.published,
                        f.fix.replace("{setting}", f"method.knobs.{f.knob}"))
            for f in files if not f.is_present()]


def job_files_missing(cfg: DictConfig) -> list[MissingFile]:
    """Every missing file of one job's config (its other problems: :func:`job_inputs`)."""
    return job_inputs(cfg).missing


def job_inputs(cfg: DictConfig) -> JobInputs:
    """Every missing file of one job's config, and its other input problems: a setting out of range
    (:func:`varbench.harness.config.validate_config`'s :class:`~varbench.core.errors.BadSettingError`),
    a malformed prompt file, a plugin that does not import, a shard left without prompts."""
    from varbench.core.errors import BadSettingError
    from varbench.harness.config import validate_config

    problems: list[FixableError] = []
    try:
        validate_config(cfg)
    except BadSettingError as e:
        problems.append(e)             # a value out of range: refused before any job
    except Exception:  # noqa: BLE001 - anything else the job reports in its own words (as before): a method
        pass           # refused on this model stays that job's failure (toy_table lists such methods; the rest run)
    missing = (model_files_missing(cfg) + method_files_missing(cfg, problems) + prompt_files_missing(cfg, problems)
               + evaluator_files_missing(cfg, problems))
    shard = shard_problem(cfg)
    if shard is not None:
        problems.append(shard)
    return JobInputs(missing, problems)


def check_files(cfgs: Sequence[DictConfig], labels: Sequence[str] | None = None) -> None:
    """The preflight: raise the first input problem of the jobs ``cfgs`` (a malformed file, a bad
    setting, an incompatible combination, a plugin that fails to import: :func:`job_inputs`), else one
    :class:`MissingFilesError` naming every file they need and lack (see the module docstring);
    ``labels``: how to name each job (its overrides), for files only some need."""
    labels = list(labels) if labels is not None else [f"job {i}" for i in range(len(cfgs))]
    needed: dict[tuple[str, str], tuple[MissingFile, list[str]]] = {}
    problems: list[FixableError] = []
    for cfg, label in zip(cfgs, labels):
        found = job_inputs(cfg)
        problems += found.problems
        for m in found.missing:
            needed.setdefault((m.what, m.path), (m, []))[1].append(label)
    if problems:            # what the user wrote wrong first: it may be why a file looks missing
        raise problems[0]
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
