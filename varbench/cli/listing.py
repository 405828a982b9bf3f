"""``python -m varbench.list [methods|experiments|evaluators] [--config-dir DIR]``: what can be run.

- methods: each ``method=`` option with its label, its family (the policy it configures) and the
  first line of its YAML's comment, then per family its card (display name, paper, code:
  `varbench.engine.policy.MethodCard`, packaged and plugin methods alike) and its docstring's first
  sentence;
- experiments: each ``+experiment=`` option with the jobs its sweep runs;
- evaluators: each ``evaluator=`` option with the evaluator it builds and the weight file it reads.

Read from the YAML files of the search path (the packaged ``varbench/conf`` and a ``--config-dir``),
without loading a model. The methods' ``models`` column checks each method's knobs against each
model's schedule (:func:`model_support`: one config per model, ~6 s for 38 methods x 4 models on
2 cores); experiments and evaluators answer in about a second.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Iterable, Optional, Sequence

from varbench.cli.overrides import group_options, option_files
from varbench.core.resources import CONF_DIR


def _options(group: str, search: Iterable[Path]) -> dict[str, Path]:
    return option_files(group, search) or {}


def first_sentence(text: str, width: int = 110) -> str:
    """The first sentence of a paragraph (lines joined), cut to `width` characters."""
    text = " ".join(text.split())
    cut = text.find(". ")
    text = text[: cut + 1] if cut >= 0 else text
    return text if len(text) <= width else text[: width - 1].rstrip() + "…"


def _comment(path: Path) -> str:
    """The first sentence of the YAML's leading comment (its description), without Hydra's
    ``@package`` line."""
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        text = line.strip()
        if not text.startswith("#"):
            break
        if "@package" not in text:
            lines.append(text.lstrip("#").strip())
    return first_sentence(" ".join(lines))


def method_family(option: str, options: dict[str, Path], seen: Optional[set] = None) -> Optional[str]:
    """The policy a ``method=`` option configures: its own ``name``, else the first preset (or
    ``<name>_schema``) in its defaults list, followed down."""
    from omegaconf import OmegaConf

    seen = seen or set()
    if option in seen or option not in options:
        return option[: -len("_schema")] if option.endswith("_schema") else None
    seen.add(option)
    node = OmegaConf.load(options[option])
    if node.get("name"):
        return str(node.name)
    for entry in node.get("defaults") or []:
        if isinstance(entry, str) and entry != "_self_":
            return method_family(entry, options, seen)
    return None


def card_lines(family: str) -> list[str]:
    """A family's lines in the listing: its name, its card's display name, paper and code
    (`varbench.policies.cards.card_for`), then the first sentence of its module's docstring."""
    from varbench.policies.cards import card_for, policy_class

    cls = policy_class(family)
    if cls is None:   # a listing names what it cannot read instead of failing
        return [f"  {family}: (its policy does not import here)"]
    card = card_for(family)
    facts = [f"paper: {card.paper}" if card.paper else "", f"code: {card.code}" if card.code else ""]
    head = f"  {family}: {card.display_name}" + "".join(f"; {f}" for f in facts if f)
    doc = (sys.modules[cls.__module__].__doc__ or cls.__doc__ or "").strip()
    first_paragraph = doc.split("\n\n")[0]
    return [head] + ([f"      {first_sentence(first_paragraph)}"] if doc else [])


def method_node(option: str, options: dict[str, Path]):
    """The ``method`` node an option composes to, merged down its defaults list as Hydra does (a
    ``<name>_schema`` entry is the policy's knob dataclass from Hydra's ConfigStore)."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    import varbench.harness  # noqa: F401 - registers the *_schema nodes

    own = OmegaConf.load(options[option])
    merged = OmegaConf.create({})
    for entry in own.get("defaults") or []:
        if not isinstance(entry, str) or entry == "_self_":
            continue
        if entry in options:
            merged = OmegaConf.merge(merged, method_node(entry, options))
        else:
            merged = OmegaConf.merge(merged, ConfigStore.instance().load(f"method/{entry}.yaml").node)
    return OmegaConf.merge(merged, OmegaConf.masked_copy(own, [k for k in own if k != "defaults"]))


def model_support(search: list[Path], methods: Sequence[str], options: dict[str, Path]) -> dict[str, dict[str, str]]:
    """``{method: {model: ""}}`` for each model option the method's config validates on
    (:func:`varbench.harness.config.validate_config` against that model's schedule), with the
    warning the check logged as the value when there was one (e.g. FastVAR's scale widths that are
    not on a small model's schedule: the method then changes nothing there), or the release file
    it needs and this machine lacks (ScaleKV's budget file: not checked further). Models it fails
    on are left out."""
    import logging

    from omegaconf import OmegaConf

    from varbench.cli.sweep_plan import compose_job
    from varbench.core.errors import ConfigError
    from varbench.harness.build import model_family
    from varbench.harness.config import preset_refusal, validate_config
    from varbench.harness.per_model import apply_model_knobs
    from varbench.harness.preflight import method_files_missing

    class Catch(logging.Handler):
        def __init__(self):
            super().__init__(logging.WARNING)
            self.seen: list[str] = []

        def emit(self, record):
            self.seen.append(record.getMessage())

    bases = {m: OmegaConf.to_container(compose_job(search, [f"model={m}"]), resolve=False)
             for m in group_options("model", search) or []}
    logger = logging.getLogger("varbench")
    out: dict[str, dict[str, str]] = {}
    for name in methods:
        node = OmegaConf.to_container(method_node(name, options), resolve=False)
        out[name] = {}
        for model, base in bases.items():
            cfg = OmegaConf.create({**base, "method": node})
            if preset_refusal(cfg.method, model_family(cfg.model), cfg.model.get("name")):   # before its files: not "absent here"
                continue
            apply_model_knobs(cfg)             # the model's per-model knob block, as the job merges it
            files = method_files_missing(cfg)
            if files:                          # e.g. ScaleKV's released budget file: not "unsupported", only absent here
                out[name][model] = f"needs {files[0].what.split(': ', 1)[-1]}, not found here ({files[0].path})"
                continue
            catch = Catch()
            logger.addHandler(catch)
            propagate, logger.propagate = logger.propagate, False   # the listing prints the warning itself
            try:
                validate_config(cfg)
            except (ConfigError, ValueError, TypeError, KeyError):
                continue
            finally:
                logger.removeHandler(catch)
                logger.propagate = propagate
            out[name][model] = "; ".join(catch.seen)
    return out


def list_methods(search: list[Path]) -> list[str]:
    from omegaconf import OmegaConf

    options = _options("method", search)
    names = [n for n in options if not n.endswith("_schema")]
    support = model_support(search, names, options)
    rows, families, notes = [], {}, {}
    for name in names:
        path = options[name]
        family = method_family(name, options) or "?"
        label = OmegaConf.load(path).get("label") or ""
        models = []
        for model, warning in support.get(name, {}).items():
            if warning:
                mark = notes.setdefault(warning if warning.startswith("needs ") else warning.split(" (")[0],
                                        f"[{len(notes) + 1}]")
                model += mark
            models.append(model)
        rows.append((name, str(label), family, ", ".join(models) or "none", _comment(path)))
        families.setdefault(family, None)
    w = [max(len(r[i]) for r in rows + [("method=", "label", "family", "models")]) for i in range(4)]
    out = [f"{'method=':<{w[0]}}  {'label':<{w[1]}}  {'family':<{w[2]}}  {'models':<{w[3]}}  description"]
    out += [f"{n:<{w[0]}}  {lab:<{w[1]}}  {fam:<{w[2]}}  {mod:<{w[3]}}  {desc}" for n, lab, fam, mod, desc in rows]
    out += ["", "models: the model= options the method's knobs validate on"
            + (" ([k]: with the note below: a warning of the check, where the method may change nothing, or a "
               "release file this machine lacks)" if notes else "")]
    out += [f"  {mark} {text}" for text, mark in notes.items()]
    out += per_model_lines(search, names, options)
    out += ["", "families (the policy's card and docstring, varbench/policies/<file>.py; check your own with "
            "python -m varbench.check_method module:Class):"]
    out += [line for fam in sorted(families) for line in card_lines(fam)]
    return out


def per_model_lines(search: list[Path], methods: Sequence[str], options: dict[str, Path]) -> list[str]:
    """Per method with a ``per_model:`` block or a ``refuse:`` entry: on which models which block applies
    (:mod:`varbench.harness.per_model`) or why it is refused; models with the preset's own values are left out."""
    from omegaconf import OmegaConf

    from varbench.cli.sweep_plan import compose_job
    from varbench.harness.per_model import describe

    models = {m: compose_job(search, [f"model={m}"]).model for m in group_options("model", search) or []}
    out = []
    for name in methods:
        node = method_node(name, options)
        if not (node.get("per_model") or node.get("refuse")):
            continue
        said: dict[str, list[str]] = {}
        for model, cfg in models.items():
            line = describe(node, OmegaConf.to_container(cfg, resolve=False))
            if line:
                said.setdefault(line, []).append(model)
        if said:
            out.append(f"  {name}: " + "; ".join(f"{', '.join(ms)}: {line}" for line, ms in said.items()))
    head = ["", "per model (a preset's per_model block or refuse: entry, varbench/harness/per_model.py):"]
    return head + out if out else []


def list_experiments(search: list[Path]) -> list[str]:
    from omegaconf import OmegaConf

    out = []
    for name, path in _options("experiment", search).items():
        tree = OmegaConf.to_container(OmegaConf.load(path), resolve=False)   # ${...} as written
        params = ((tree.get("hydra") or {}).get("sweeper") or {}).get("params") or {}
        per_model = {str(m): str(v) for m, v in (tree.get(f"{name}_methods") or {}).items()}
        sweep = {str(k): [v.strip() for v in str(val).split(",")] for k, val in params.items()
                 if not str(val).startswith("${")}
        n = 1
        for values in sweep.values():
            n *= len(values)
        jobs = "; ".join(f"{k}: {', '.join(v)}" for k, v in sweep.items())
        if per_model:       # the methods depend on the model (e.g. compose_matrix: its toy presets)
            counts = {len(v.split(",")) for v in per_model.values()}
            n *= counts.pop() if len(counts) == 1 else 1
            jobs = "; ".join([jobs] * bool(jobs) + [f"method for model={m}: {', '.join(x.strip() for x in v.split(','))}"
                                                    for m, v in per_model.items()])
        out.append(f"+experiment={name}  ({n} job{'s' if n != 1 else ''})  {_comment(path)}")
        out.append(f"    {jobs or 'one job'}")
    return out


#: evaluator config keys that name a weight file or folder (under ``paths.weights_dir`` when relative)
WEIGHT_KEYS = ("filename", "checkpoint", "weights", "detector_dir", "clip_weights", "tokenizer_dir", "model_dir")


def list_evaluators(search: list[Path]) -> list[str]:
    from omegaconf import OmegaConf

    out = []
    for name, path in _options("evaluator", search).items():
        tree = OmegaConf.to_container(OmegaConf.load(path), resolve=False)   # ${...} shown as written
        body = tree.get(name) if isinstance(tree.get(name), dict) else tree
        files = [f"{k}: {body[k]}" for k in WEIGHT_KEYS if body.get(k) not in (None, "")]
        out.append(f"evaluator={name}  ({body.get('name', name)})  {_comment(path)}")
        out.append(f"    weights: {', '.join(files) if files else 'none (no file to download)'}")
    return out


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m varbench.list", description=__doc__.split("\n\n")[0])
    ap.add_argument("what", nargs="?", choices=["methods", "experiments", "evaluators"], default=None,
                    help="what to list (default: all three)")
    ap.add_argument("--config-dir", action="append", default=[], help="a folder of your own options (as for the run)")
    args = ap.parse_args(argv)
    search = [Path(CONF_DIR)] + [Path(d) for d in args.config_dir]
    sections = {"methods": list_methods, "experiments": list_experiments, "evaluators": list_evaluators}
    for what, fn in sections.items():
        if args.what in (None, what):
            print(f"== {what}")
            print("\n".join(fn(search)))
            print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
