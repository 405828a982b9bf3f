"""Per-model knob values: one method name that works on every model it applies to.

A knob value tuned for one model can be meaningless on another (NOVA's 256-token thresholds never
act on the toy's 16x16-token schedule; ScaleKV's 2B budget has 32 blocks, the 8B 40). A preset in
``conf/method/`` therefore carries, next to its knobs, the values they take on particular models,
and says where it does not apply:

.. code-block:: yaml

    per_model:                 # model name (model.name) or family (model.family) -> knob values there
      toy: {t_min_tokens: 36, min_tokens_to_prune: 36}
    refuse:                    # model name or family -> why the preset does not apply there
      hart: "..."

:func:`apply_model_knobs` merges the chosen block into ``method.knobs`` once, before the config is
validated, hashed or built (``prepare_job``; ``validate_config`` and the command's sweep plan call it
too, a second call changes nothing), so the store key is computed from the knobs actually used:
``method=nova model=toy`` generates with exactly the knobs of ``method=nova_toy`` and reuses its
stored images.

- Which block: the one keyed by the model's name, else by its family (``model.family``, default
  ``infinity``). A preset may pin one (``per_model_applied: toy``): that block on every model; the
  per-model presets of old (``nova_toy``, ``scalekv_8b``, ...) are such aliases, so their configs and
  store keys are unchanged. ``+method.per_model_applied=none`` applies none (the preset's own values).
- How: each knob of the block replaces the preset's value whole (a map such as FastVAR's ``prune``
  is replaced, not merged key by key: its keys mean scales of one schedule), except knobs set on the
  command line (``method.knobs.X=...``), which win over the block.
- Overrides: the command line's come from Hydra (``prepare_job``) or the sweep plan. A config composed
  with Hydra's compose API keeps no record of its overrides: call ``apply_model_knobs(cfg, overrides)``
  with them right after composing (as :func:`varbench.testing.jobs.job_config` does), or a knob
  that a block also sets takes the block's value.
- After: ``method.per_model`` is dropped and ``method.per_model_applied`` names the block used (the
  record's config shows it). Neither is in a hash (``ENTRY_EXCLUDE``); the merged knobs are.

A variant preset (``defaults: [nova, _self_]``) inherits its base's blocks; a variant whose own knob
a block would replace states its own block or a refusal (tests/harness/test_per_model.py checks
that no block silently replaces a knob its preset's file sets).
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional

from omegaconf import DictConfig, OmegaConf, open_dict

from varbench.core.errors import ConfigError

#: the preset's table of blocks, and the key naming the block applied (or pinned by an alias)
PER_MODEL, APPLIED = "per_model", "per_model_applied"
#: ``per_model_applied`` value that applies no block
NONE = "none"


def _get(node: Any, key: str, default: Any = None) -> Any:
    if node is None:
        return default
    return node.get(key, default) if hasattr(node, "get") else getattr(node, key, default)


def model_keys(model: Any) -> list[str]:
    """The keys a model is looked up by, most specific first: its name, then its family."""
    from varbench.harness.build import model_family

    if model is None:
        return []
    keys = [str(_get(model, "name"))] if _get(model, "name") else []
    return keys + [model_family(model)]


def block_key(method: Any, model: Any = None) -> Optional[str]:
    """The key of the per-model block that applies to ``method`` on ``model`` (None: none). A pinned
    preset (``per_model_applied``) names its own; without a model only a pinned block applies."""
    table = _get(method, PER_MODEL) or {}
    pinned = _get(method, APPLIED)
    if pinned is not None:
        pinned = str(pinned)
        if pinned != NONE and table and pinned not in table:   # an already merged config has no table
            raise ConfigError(f"method.{APPLIED}={pinned!r}: the preset has no per_model block {pinned!r} "
                              f"(its blocks: {', '.join(map(str, table)) or 'none'})")
        return None if pinned == NONE else pinned
    return next((k for k in model_keys(model) if k in table), None)


def overridden_knobs(overrides: Iterable[str]) -> set[str]:
    """The top-level knob names that command-line overrides set (``method.knobs.r_max=0.5``,
    ``+method.knobs.x=1``, ``~method.knobs.x``): they win over a per-model block. ``method.knobs=...``
    (the whole mapping) is ``{"*"}``: no block is merged."""
    out = set()
    for o in overrides:
        key = str(o).lstrip("+~").split("=", 1)[0].strip()
        if key == "method.knobs":
            out.add("*")
        elif key.startswith("method.knobs."):
            out.add(key[len("method.knobs."):].split(".", 1)[0].split("[", 1)[0])
    return out


def _merge(method: DictConfig, key: Optional[str], keep: set[str]) -> None:
    """In place on a method node: block ``key``'s knobs over ``method.knobs`` (except ``keep``), then
    the table dropped and the block named. Values are copied as written (interpolations unresolved)."""
    table = _get(method, PER_MODEL)
    block = OmegaConf.to_container(table[key], resolve=False) if key is not None and table is not None else None
    with open_dict(method):
        if block is not None and "*" not in keep:
            if not isinstance(block, dict):
                raise ConfigError(f"method.{PER_MODEL}.{key} must be a mapping of knob values, got {block!r}")
            if method.get("knobs") is None:
                method.knobs = {}
            for knob, value in block.items():
                if knob not in keep:
                    method.knobs[knob] = value
        if PER_MODEL in method:
            del method[PER_MODEL]
        if key is not None:
            method[APPLIED] = key


def apply_model_knobs(cfg: DictConfig, overrides: Iterable[str] = ()) -> Optional[str]:
    """Merge the per-model block for ``cfg.model`` into ``cfg.method.knobs`` (in place) and return its
    key (None: no block). ``overrides``: the command line's overrides (their ``method.knobs.*`` win).
    Idempotent: a merged config has no table left, so a later call changes nothing."""
    method = cfg.get("method") if hasattr(cfg, "get") else None
    if not isinstance(method, DictConfig) or (PER_MODEL not in method and APPLIED not in method):
        return None
    key = block_key(method, cfg.get("model"))
    _merge(method, key, overridden_knobs(overrides))
    return key


def method_for_model(method: Any, model: Any = None, overrides: Iterable[str] = ()) -> DictConfig:
    """A merged copy of a bare ``method`` node (a preset composed alone, e.g.
    ``compose(config_name="nova_toy")`` over conf/method): its pinned block, or the block for
    ``model`` when given. For the scripts that build a policy from a preset without a job config."""
    node = OmegaConf.create(OmegaConf.to_container(method, resolve=False) if OmegaConf.is_config(method) else method)
    _merge(node, block_key(node, model), overridden_knobs(overrides))
    return node


def preset_refusal(method: Any, family: str, model_name: Optional[str] = None) -> str | None:
    """Why a method config does not apply to a model (its ``family``, and its ``model_name`` when
    given), read without building the policy (no release file is opened): the preset's ``refuse:``
    entry for the model's name, else for its family, else the policy classes' ``backbones`` (a
    ``compose``'s members' too). Knob-dependent refusals (NOVA's per-bit entropies) need the built
    policy: :meth:`~varbench.engine.policy.Policy.backbone_refusal`."""
    from varbench.core.registry import resolve
    from varbench.policies import REGISTRY

    refuse = _get(method, "refuse") or {}
    for key in ([str(model_name)] if model_name else []) + [family]:
        if refuse.get(key) is not None:
            return str(refuse[key])
    members = [(None, _get(method, "name"))]
    if members[0][1] == "compose":
        members = [(i, _get(m, "name")) for i, m in enumerate(_get(_get(method, "knobs") or {}, "policies") or [])]
    for i, name in members:
        try:
            cls = resolve(REGISTRY, str(name), "method")
        except KeyError:
            continue                            # named by validate_config
        backbones = getattr(cls, "backbones", frozenset({"infinity"}))
        if family not in backbones:
            head = "" if i is None else f"compose.policies[{i}]: "
            return f"{head}{name} is written for {', '.join(sorted(backbones))} models, not {family}"
    return None


def describe(method: Any, model: Any) -> str:
    """One line for listings: which block applies to ``method`` on ``model``, or why it is refused
    (``""``: neither; the preset's own values)."""
    from varbench.harness.build import model_family

    refused = preset_refusal(method, model_family(model), _get(model, "name"))
    if refused:
        return f"refused: {refused}"
    key = block_key(method, model)
    if key is None:
        return ""
    block = (_get(method, PER_MODEL) or {}).get(key)
    knobs = ", ".join(map(str, block)) if isinstance(block, Mapping) else ""
    return f"per_model.{key}" + (f" ({knobs})" if knobs else "")
