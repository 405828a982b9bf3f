"""Method names -> methods, the one way every caller does it: the job's own composition, for scripts too.

`resolve_method(name, model=..., config_dirs=...)` turns what a user types after ``method=`` into a
:class:`ResolvedMethod` (registry name, label, knobs, the policy class and a factory) by composing
the job's config with Hydra (``config.yaml`` with ``method=<name>`` and ``model=<model>``), with the
user's own config folders searched after the package's, where ``python -m varbench --config-dir DIR``
puts them. So a preset resolves to exactly the method node a job of that preset records, whoever
asks (``experiments.flops_table``, the GPU dry run, the device bench, the regression gate). A name
that is not a preset (``pkg.module:Class``, or an entry-point method without a YAML file) resolves
to that policy with its constructor's defaults.

`method_set(name, model)` reads an experiment's list of methods on a model,
``conf/method_set/<name>/<model>.yaml`` (the file a sweep's ``method_set: <name>/${model}`` loads),
so a script and a sweep run the same methods.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
from pathlib import Path
from typing import Any, Iterable, Optional

from varbench.core.errors import ConfigError
from varbench.core.registry import is_import_path
from varbench.core.resources import CONF_DIR
from varbench.harness.per_model import apply_model_knobs


@dataclasses.dataclass(frozen=True)
class ResolvedMethod:
    """A method as a job of it would run it: ``name`` is the registry name (or ``module:Class``) the
    policy is built from, ``preset`` what was asked for, ``config`` the composed ``method`` node
    (``name``, ``label``, ``knobs``, and e.g. ``refuse``) as the record stores it."""
    preset: str
    name: str
    label: str
    knobs: dict
    config: dict
    model: Optional[str] = None   # the model it was resolved for (None: the config's default model)

    @property
    def policy_class(self) -> type:
        from varbench.core.registry import resolve
        from varbench.policies import REGISTRY

        return resolve(REGISTRY, self.name, "method")

    @property
    def display_name(self) -> str:
        """What tables and figures call the method: the preset's label, else the policy class's card
        (``card.display_name``, when the class carries one), else its name."""
        if self.config.get("label"):
            return str(self.config["label"])
        card = getattr(self.policy_class, "card", None)
        return str(getattr(card, "display_name", None) or self.name)

    def build(self, **knob_overrides: Any):
        """A fresh policy of these knobs (``knob_overrides`` replace single knobs)."""
        return self.policy_class(**{**copy.deepcopy(self.knobs), **knob_overrides})

    def refusal(self, family: str) -> Optional[str]:
        """Why the method does not run on model family ``family`` (None: it does), as the job refuses
        it: the preset's ``refuse:`` or the classes' ``backbones``, then the built policy's own
        knob-dependent rule (:meth:`~varbench.engine.policy.Policy.backbone_refusal`)."""
        from varbench.harness.config import preset_refusal

        return preset_refusal(self.config, family, self.model) or self.build().backbone_refusal(family)


def resolve_method(name: str, *, model: Optional[str] = None, config_dirs: Iterable[str | Path] = ()) -> ResolvedMethod:
    """The method a job with ``method=<name>`` (and ``model=<model>``; default: the config's default
    model) runs, with ``config_dirs`` searched as ``--config-dir`` is. A ``module:Class`` name or a
    registered method without a preset file gives that policy with its constructor's defaults.
    Raises :class:`ConfigError` (naming the presets closest to ``name``) for a name that is neither."""
    dirs = tuple(str(Path(d).resolve()) for d in config_dirs)
    return copy.deepcopy(_resolve(str(name), model, dirs))


@functools.lru_cache(maxsize=None)
def _resolve(name: str, model: Optional[str], dirs: tuple[str, ...]) -> ResolvedMethod:
    if is_import_path(name):
        return _bare(name, dirs)
    from hydra.errors import MissingConfigException, OverrideParseException

    try:
        node = _compose_method(name, model, dirs)
    except MissingConfigException as e:
        if getattr(e, "missing_cfg_file", None) != f"method/{name}":
            raise                               # the preset exists; something it names does not
        return _bare(name, dirs)                # no preset of that name: a registered method, or an error
    except OverrideParseException:
        return _bare(name, dirs)                # not a preset name at all (e.g. spaces): the error names the fix
    return ResolvedMethod(preset=name, name=str(node["name"]), label=str(node.get("label") or node["name"]),
                          knobs=dict(node.get("knobs") or {}), config=node, model=model)


def _bare(name: str, dirs: tuple[str, ...]) -> ResolvedMethod:
    """A policy named without a preset: ``module:Class`` or a registry (entry-point) name."""
    from varbench.policies import REGISTRY

    if not is_import_path(name) and name not in REGISTRY:
        import difflib

        close = difflib.get_close_matches(name, preset_names(dirs), n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        where = ", ".join([str(CONF_DIR / "method"), *(str(Path(d) / "method") for d in dirs)])
        raise ConfigError(f"method {name!r} is neither a preset (a YAML file in {where}) nor a registered method "
                          f"nor a module:Class name.{hint}")
    config = {"name": name, "knobs": {}}
    resolved = ResolvedMethod(preset=name, name=name, label=name, knobs={}, config=config)
    resolved.policy_class          # an unimportable module:Class fails here, with the registry's message
    label = resolved.display_name
    return dataclasses.replace(resolved, label=label, config={**config, "label": label})


def preset_names(config_dirs: Iterable[str | Path] = ()) -> list[str]:
    """Every method preset (``conf/method/*.yaml`` of the package and of ``config_dirs``)."""
    dirs = [CONF_DIR, *(Path(d) for d in config_dirs)]
    return sorted({p.stem for d in dirs for p in (Path(d) / "method").glob("*.yaml")})


def _compose_method(name: str, model: Optional[str], dirs: tuple[str, ...]) -> dict:
    """The ``method`` node of the job config ``method=<name> [model=<model>]`` composes."""
    from omegaconf import OmegaConf

    overrides = [f"method={name}"] + ([f"model={model}"] if model else [])
    if dirs:
        overrides.append("hydra.searchpath=[" + ",".join(f"'file://{d}'" for d in dirs) + "]")
    cfg = compose_job_config(overrides)
    return OmegaConf.to_container(cfg.method, resolve=True)


def compose_job_config(overrides: list[str]):
    """The job config ``python -m varbench <overrides>`` composes, the model's per-model knob block merged
    (`varbench.harness.per_model`; knobs set in ``overrides`` win), as the job prepares it (no Hydra app
    is needed or disturbed: one already initialised, e.g. a running job's, is set aside and restored)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    import varbench.harness  # noqa: F401 - registers the `<method>_schema` nodes the presets' defaults name

    gh = GlobalHydra.instance()
    saved = gh.hydra if gh.is_initialized() else None
    gh.clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose(config_name="config", overrides=overrides)
        apply_model_knobs(cfg, overrides)   # the model's per-model knob block, merged as a job merges it
        return cfg
    finally:
        if saved is not None:
            GlobalHydra.instance().initialize(saved)


def method_set(name: str, model: str, config_dirs: Iterable[str | Path] = ()) -> list[str]:
    """The method presets of ``conf/method_set/<name>/<model>.yaml`` in their order (a user's
    ``config_dirs`` are searched after the package's, as ``--config-dir`` is). Such a file holds
    ``method: a,b,c`` under ``# @package hydra.sweeper.params``: an experiment's sweep over methods."""
    import yaml

    for d in (CONF_DIR, *(Path(x) for x in config_dirs)):
        path = Path(d) / "method_set" / name / f"{model}.yaml"
        if path.is_file():
            methods = (yaml.safe_load(path.read_text()) or {}).get("method")
            if not isinstance(methods, str) or not methods.strip():
                raise ConfigError(f"{path}: expected `method: a,b,c` (the method presets of the set), got {methods!r}")
            return [m.strip() for m in methods.split(",") if m.strip()]
    have = sorted(p.stem for p in (CONF_DIR / "method_set" / name).glob("*.yaml"))
    raise ConfigError(f"no method set {name}/{model}: add varbench/conf/method_set/{name}/{model}.yaml "
                      f"(a `method: a,b,c` line){'; the set has ' + ', '.join(have) if have else ''}")
