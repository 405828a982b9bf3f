"""Check a composed job config before any compute (no weights loaded, no images generated).

`validate_config(cfg)` raises :class:`ConfigError` naming the setting (``runtime.batch_size``,
``method.knobs.q_sub``, ...) for anything the config alone decides: types and ranges of the
runtime / timing / generation / benchmark fields, the method name (with the registry's closest
names), each knob against its method's knob dataclass (the policy's ``Knobs``, checked by
:mod:`varbench.policies.knobs`: known name, type, range or choices, scale indices against the
generation's schedule; a method without one: the policy constructor's signature and annotations),
the knobs' cross-checks (the constructor runs), and the policy's own check of the generation's
schedule (``Policy.check_schedule``, e.g. FastVAR's scale indices).
"""
from __future__ import annotations

import inspect
import logging
import typing
from typing import Any, Mapping

log = logging.getLogger("varbench")


from varbench.core.errors import BadSettingError, ConfigError, IncompatibleSettingsError
from varbench.harness.build import model_family
from varbench.harness.per_model import apply_model_knobs, preset_refusal  # noqa: F401 - preset_refusal: its old import path
from varbench.policies.knobs import check_knobs as check_schema_knobs, describe_type, type_matches


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _get(node: Any, key: str, default: Any = None) -> Any:
    if node is None:
        return default
    if isinstance(node, Mapping):
        return node.get(key, default)
    return node.get(key, default) if hasattr(node, "get") else getattr(node, key, default)


def _int(section: str, node: Any, key: str, lo: int | None = None, *, required: bool = True, null: bool = False) -> None:
    v = _get(node, key)
    if v is None and (null or not required):
        return
    if not _is_int(v):
        raise BadSettingError(f"{section}.{key} must be an integer{' or null' if null else ''}, got {v!r}")
    if lo is not None and v < lo:
        raise BadSettingError(f"{section}.{key} must be >= {lo}, got {v}")


def _bool(section: str, node: Any, key: str) -> None:
    v = _get(node, key)
    if v is not None and not isinstance(v, bool):
        raise BadSettingError(f"{section}.{key} must be true or false, got {v!r}")


def _num_or_list(section: str, node: Any, key: str, lo: float | None = None) -> None:
    v = _get(node, key)
    vals = list(v) if isinstance(v, (list, tuple)) else [v]
    if not vals or not all(_is_num(x) for x in vals):
        raise BadSettingError(f"{section}.{key} must be a number or a list of numbers, got {v!r}")
    if lo is not None and any(x < lo for x in vals):
        raise BadSettingError(f"{section}.{key} must be >= {lo}, got {v!r}")


def _check_runtime(rt: Any) -> None:
    _int("runtime", rt, "batch_size", 1)
    dev = _get(rt, "device", "auto")
    if not isinstance(dev, str) or not (dev in ("auto", "cpu", "cuda") or dev.startswith("cuda:")):
        raise BadSettingError(f"runtime.device must be auto, cpu, cuda or cuda:N, got {dev!r}")
    dtype = _get(rt, "dtype", "auto")
    if dtype not in ("auto", "float32", "fp32", "bfloat16", "bf16"):
        raise BadSettingError(f"runtime.dtype must be auto, float32 or bfloat16, got {dtype!r}")
    graphs = _get(rt, "cuda_graphs", "auto")
    if str(graphs).lower() not in ("auto", "true", "false"):
        raise BadSettingError(f"runtime.cuda_graphs must be auto, true or false, got {graphs!r}")
    for key in ("fused_entropy", "force", "save_images", "progress"):
        _bool("runtime", rt, key)
    adaptive = _get(rt, "adaptive_batch", "pad")
    if adaptive not in ("pad", "split"):
        raise BadSettingError(f"runtime.adaptive_batch must be pad or split, got {adaptive!r}; pad runs per-image plans "
                              "of different shapes as one padded step, split as sub-batches")
    wait = _get(rt, "lock_wait_s")
    if wait is not None and (not _is_num(wait) or (wait < 0 and wait != -1)):
        raise BadSettingError(f"runtime.lock_wait_s must be a number of seconds >= 0 (or -1: wait forever), got {wait!r}")
    _check_systems_knobs(rt)


def _check_systems_knobs(rt: Any) -> None:
    """runtime.compile / compile_fullgraph (varbench.engine.backbones.infinity.compiled): values, and
    the one combination that would fight (inductor's own CUDA graphs inside ours)."""
    from varbench.engine.backbones.infinity.compiled import COMPILE_MODES, MODES_WITH_OWN_CUDA_GRAPHS

    mode = _get(rt, "compile", "off")
    if mode is False or mode is None:   # YAML's bare `off` reads as false
        mode = "off"
    if mode not in COMPILE_MODES:
        raise BadSettingError(f"runtime.compile must be one of {', '.join(COMPILE_MODES)}, got {mode!r}")
    _bool("runtime", rt, "compile_fullgraph")
    if mode in MODES_WITH_OWN_CUDA_GRAPHS and str(_get(rt, "cuda_graphs", "auto")).lower() == "true":
        raise IncompatibleSettingsError(
            f"runtime.compile={mode} brings inductor's own CUDA graphs, which would be captured inside "
            f"runtime.cuda_graphs=true's; use runtime.cuda_graphs=auto (theirs replace ours) or runtime.compile=default")
    _check_quant(rt)
    _check_attn_backend(rt)


def _device_type(rt: Any) -> str:
    """runtime.device as the job will resolve it (auto: cuda when a GPU is visible)."""
    dev = str(_get(rt, "device", "auto"))
    if dev == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return dev.split(":", 1)[0]


def _check_quant(rt: Any) -> None:
    """runtime.quant (varbench.engine.backbones.infinity.quant): value, torchao importable, fp8's GPU."""
    from varbench.engine.backbones.infinity.quant import QUANT_MODES, fp8_refusal, torchao_missing

    quant = _get(rt, "quant", "none")
    if quant is None:
        quant = "none"
    if quant not in QUANT_MODES:
        raise BadSettingError(f"runtime.quant must be one of {', '.join(QUANT_MODES)}, got {quant!r}")
    if quant == "none":
        return
    if quant == "fp8_dynamic":
        refused = fp8_refusal(_device_type(rt))
        if refused:
            raise BadSettingError(refused)
    missing = torchao_missing()
    if missing:
        raise BadSettingError(missing)


def _check_attn_backend(rt: Any) -> None:
    """runtime.attn_backend (varbench.engine.attn_backend): value, a kernel on this device, flash-attn installed."""
    from varbench.engine.attn_backend import check_backend

    refused = check_backend(str(_get(rt, "attn_backend", "auto")), _device_type(rt))
    if refused:
        raise BadSettingError(refused)


def _check_systems_family(rt: Any, family: str, model_name: Any) -> None:
    """The systems knobs act on Infinity's block functions; HART's loop has none of them."""
    if family == "hart" and str(_get(rt, "compile", "off")) not in ("off", "False"):
        raise IncompatibleSettingsError(f"runtime.compile: model={model_name} (HART) runs its own eager loop, "
                                        f"which has no compiled path; use runtime.compile=off")
    if family == "hart" and str(_get(rt, "quant", "none")) not in ("none", "None"):
        raise IncompatibleSettingsError(f"runtime.quant: model={model_name} (HART) has no quantised block path; "
                                        f"use runtime.quant=none")


def _check_timing(tm: Any) -> None:
    _bool("timing", tm, "enabled")
    _bool("timing", tm, "paired_baseline")
    on = bool(_get(tm, "enabled", True))
    _int("timing", tm, "warmup", 0)
    _int("timing", tm, "repeats", 1 if on else 0)
    if _get(tm, "prompt_index") is not None:
        raise ConfigError("timing.prompt_index is gone: the pass times a sample of prompts; set timing.prompts "
                          "(adaptive methods) and timing.prompts_static (others), e.g. timing.prompts=1")
    for key in ("prompts", "prompts_static"):
        _int("timing", tm, key, 1, required=False)
    for key in ("prompt_seed", "bootstrap_seed", "retime_unreliable"):
        _int("timing", tm, key, 0, required=False)
    _int("timing", tm, "bootstrap_resamples", 1, required=False)
    wpp = _get(tm, "warmup_per_prompt")
    if wpp is not None and wpp != "auto" and not (_is_int(wpp) and wpp >= 0):
        raise BadSettingError(f"timing.warmup_per_prompt must be an integer >= 0 or auto, got {wpp!r}")
    bs = _get(tm, "batch_sizes", [])
    if not isinstance(bs, (list, tuple)) or not all(_is_int(b) and b >= 1 for b in bs):
        raise BadSettingError(f"timing.batch_sizes must be a list of integers >= 1, got {bs!r}")
    if on and not bs:
        raise ConfigError("timing.batch_sizes is empty but timing.enabled=true; give e.g. [1] (or timing=none)")


def _schedule(model: Any, gen: Any) -> list[tuple[int, int]] | None:
    from varbench.engine.backbones.infinity.schedules import RESOLUTION_PRESETS, scale_schedule

    sched = _get(model, "schedule")
    pn, hw = _get(gen, "pn"), _get(gen, "h_div_w")
    if sched is not None:
        try:
            sched = [(int(h), int(w)) for h, w in sched]
        except (TypeError, ValueError):
            raise BadSettingError(f"model.schedule must be a list of [h, w] integer pairs, got {sched!r}") from None
        # a fixed schedule decides the resolution: a pn or aspect ratio set for this run would be
        # recorded (and hashed) but not used, so two entries would hold the same images
        (h, w), model_pn = sched[-1], _get(model, "pn")
        if pn != model_pn or not _is_num(hw) or abs(float(hw) - h / w) > 1e-6:
            raise ConfigError(
                f"model={_get(model, 'name')} generates on its own fixed schedule (model.schedule, last grid {h}x{w}): "
                f"generation.pn={pn!r} and generation.h_div_w={hw!r} cannot change it; leave them at the model's "
                f"(pn {model_pn}, h_div_w {h / w:g}), or set model.schedule=null to use the released tables")
        return sched
    if pn not in RESOLUTION_PRESETS:
        raise BadSettingError(f"generation.pn must be one of {list(RESOLUTION_PRESETS)}, got {pn!r}")
    return scale_schedule(float(hw), str(pn))


def _check_generation(gen: Any) -> None:
    seed = _get(gen, "seed")
    if not _is_int(seed) or seed < 0:
        raise BadSettingError(f"generation.seed must be one non-negative integer (a sweep of seeds is "
                          f"-m generation.seed=0,1), got {seed!r}")
    hw = _get(gen, "h_div_w")
    if not _is_num(hw) or hw <= 0:
        raise BadSettingError(f"generation.h_div_w must be a positive number, got {hw!r}")
    _num_or_list("generation", gen, "cfg")
    _num_or_list("generation", gen, "tau", 0)
    if any(x == 0 for x in (_get(gen, "tau") if isinstance(_get(gen, "tau"), (list, tuple)) else [_get(gen, "tau")])):
        raise BadSettingError(f"generation.tau must be > 0 (it divides the logits), got {_get(gen, 'tau')!r}")
    _int("generation", gen, "top_k", 0)
    top_p = _get(gen, "top_p")
    if not _is_num(top_p) or not 0 <= top_p <= 1:
        raise BadSettingError(f"generation.top_p must be a number in [0, 1] (0 = off), got {top_p!r}")
    if _get(gen, "more_smooth") is not None:
        _bool("generation", gen, "more_smooth")
    neg = _get(gen, "negative_prompt")
    if neg is not None and not isinstance(neg, str):
        raise BadSettingError(f"generation.negative_prompt must be text or null, got {neg!r}")


def _check_benchmark(b: Any) -> None:
    from varbench.harness.prompts import LOADERS

    loader = _get(b, "loader")
    if loader not in LOADERS:
        import difflib

        close = difflib.get_close_matches(str(loader), LOADERS, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"benchmark.loader {loader!r} is unknown.{hint} Available: {sorted(LOADERS)}")
    _int("benchmark", b, "limit", 1, null=True)
    _int("benchmark", b, "limit_per_tag", 1, null=True)
    _int("benchmark", b, "samples_per_prompt", 1, required=False)


def _check_shard(spec: Any) -> None:
    from varbench.harness.sharding import Shard

    try:
        Shard.parse(spec)
    except ValueError as e:
        raise BadSettingError(str(e)) from None


# -- knobs against the constructor's annotations ---------------------------------------------------
def check_knobs(name: str, cls: type, knobs: Mapping[str, Any]) -> None:
    """Each knob is a parameter of `cls.__init__` and fits its annotation (methods without a dataclass
    in varbench.policies.knobs)."""
    sig = inspect.signature(cls.__init__)
    params = {k: p for k, p in sig.parameters.items() if k != "self"}
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return
    try:
        hints = typing.get_type_hints(cls.__init__)
    except Exception:  # noqa: BLE001 - unresolvable annotations: name checks only
        hints = {}
    for key, value in knobs.items():
        if key not in params:
            import difflib

            close = difflib.get_close_matches(key, params, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"method.knobs.{key}: {name} has no knob {key!r}.{hint} Knobs: {', '.join(params)}")
        tp = hints.get(key, params[key].annotation)
        if not type_matches(value, tp):
            raise ConfigError(f"method.knobs.{key}={value!r} does not fit {name}'s {key}: {describe_type(tp)}")


def validate_config(cfg: Any):
    """Raise ConfigError for anything wrong that the config alone decides; return the built policy.
    The model's per-model knob block is merged into ``cfg.method`` first, in place (a no-op when
    ``prepare_job`` or the sweep plan already did, with the command line's knob overrides kept):
    the config checked is the config hashed and run (:mod:`varbench.harness.per_model`)."""
    from omegaconf import OmegaConf

    from varbench.core.registry import resolve
    from varbench.policies import REGISTRY

    try:
        for section in ("runtime", "timing", "generation", "benchmark", "method"):
            if section not in cfg:
                raise ConfigError(f"the config has no {section!r} section")
        apply_model_knobs(cfg)
        sec = {k: OmegaConf.to_container(cfg[k], resolve=True) if OmegaConf.is_config(cfg[k]) else cfg[k]
               for k in ("runtime", "timing", "generation", "benchmark")}
        _check_runtime(sec["runtime"])
        _check_timing(sec["timing"])
        _check_generation(sec["generation"])
        _check_benchmark(sec["benchmark"])
        _check_shard(cfg.get("shard"))
        model = cfg.get("model")
        model = OmegaConf.to_container(model, resolve=True) if OmegaConf.is_config(model) else (model or {})
        sched = _schedule(model, sec["generation"])
        _check_systems_family(sec["runtime"], model_family(model), _get(model, "name"))
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - e.g. a missing interpolation
        raise ConfigError(f"config: {type(e).__name__}: {e}") from e

    name = cfg.method.get("name")
    if not isinstance(name, str):
        raise BadSettingError(f"method.name must be a method name, got {name!r}")
    if cfg.method.get("label") in (None, ""):  # every preset names itself; the knob schemas do not
        raise ConfigError(f"method.label is not set: method={name}_schema (or a preset without a label) is the "
                          f"knob schema behind {name}'s presets, not one of them; use method={name} or another "
                          f"preset in conf/method/, or set method.label")
    try:
        cls = resolve(REGISTRY, name, "method")
    except KeyError as e:
        raise ConfigError(f"method.name: {e.args[0]}") from None
    # a method that does not apply to the model's family says so before its knobs are checked against the schedule
    refused = preset_refusal(cfg.method, model_family(model), _get(model, "name"))
    if refused:
        raise IncompatibleSettingsError(f"{_where(cfg, model)}: {refused}")
    knobs = cfg.method.get("knobs")
    knobs = OmegaConf.to_container(knobs, resolve=True) if knobs is not None else {}
    if not isinstance(knobs, dict):
        raise BadSettingError(f"method.knobs must be a mapping, got {knobs!r}")
    if getattr(cls, "Knobs", None) is not None:
        check_schema_knobs(name, knobs, len(sched) if sched is not None else None)
    else:
        check_knobs(name, cls, knobs)
    try:
        policy = cls(**knobs)
    except (ValueError, TypeError, KeyError) as e:
        msg = e.args[0] if e.args else str(e)
        raise ConfigError(f"method={name} knobs: {msg}") from e
    policy.check_schedule(sched, "method.knobs")
    check_backbone(cfg, policy, model)
    return policy


def check_backbone(cfg: Any, policy, model: Mapping[str, Any]) -> None:
    """The built policy applies to the model's family (``model.family``) by its own rule
    (:meth:`~varbench.engine.policy.Policy.backbone_refusal`: what depends on its knobs, e.g. NOVA's
    per-bit entropies; the preset's ``refuse:`` and the classes' ``backbones`` were checked before the
    knobs, :func:`preset_refusal`); and HART's settings are not set on other models."""
    family = model_family(model)
    reason = policy.backbone_refusal(family)
    if reason:
        raise IncompatibleSettingsError(f"{_where(cfg, model)}: {reason}")
    if family != "hart" and _get(cfg.generation, "more_smooth") is not None:
        raise IncompatibleSettingsError(f"generation.more_smooth is HART's codebook mixing; model={_get(model, 'name')} has none "
                          "(remove the setting)")


def _where(cfg: Any, model: Mapping[str, Any]) -> str:
    return f"method={cfg.method.get('preset') or _choice('method') or cfg.method.get('name')} on model={_get(model, 'name')}"


def _choice(group: str) -> str | None:
    """The option chosen for ``group`` in the running Hydra app (None outside one)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return HydraConfig.get().runtime.choices.get(group)
    except Exception:  # noqa: BLE001 - outside a Hydra app (tests, scripts)
        return None
