"""``python -m varbench.list [methods|experiments|evaluators] [--config-dir DIR]``: what can be run.

- methods: each ``method=`` option with its label, its family (the policy it configures) and the
  first line of its YAML's comment, then one line per family from the policy's card;
- experiments: each ``+experiment=`` option with the jobs its sweep runs;
- evaluators: each ``evaluator=`` option with the evaluator it builds and the weight file it reads.

Read from the YAML files of the search path (the packaged ``varbench/conf`` and a ``--config-dir``),
without composing a config or loading a model, so it answers in about a second.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Iterable, Optional

from varbench.cli.overrides import option_files
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


def _card_line(family: str) -> str:
    from varbench.policies import REGISTRY

    try:
        cls = REGISTRY.load(family)
    except Exception:  # noqa: BLE001 - a listing names what it cannot read instead of failing
        return "(its policy does not import here)"
    doc = (sys.modules[cls.__module__].__doc__ or cls.__doc__ or "").strip()
    return first_sentence(doc.split("\n\n")[0]) if doc else ""


def list_methods(search: list[Path]) -> list[str]:
    from omegaconf import OmegaConf

    options = _options("method", search)
    rows, families = [], {}
    for name, path in options.items():
        if name.endswith("_schema"):
            continue
        family = method_family(name, options) or "?"
        label = OmegaConf.load(path).get("label") or ""
        rows.append((name, str(label), family, _comment(path)))
        families.setdefault(family, None)
    w = [max(len(r[i]) for r in rows) for i in range(3)]
    out = [f"{'method=':<{w[0]}}  {'label':<{w[1]}}  {'family':<{w[2]}}  description"]
    out += [f"{n:<{w[0]}}  {lab:<{w[1]}}  {fam:<{w[2]}}  {desc}" for n, lab, fam, desc in rows]
    out += ["", "families (the policy's card, varbench/policies/<file>.py):"]
    out += [f"  {fam}: {_card_line(fam)}" for fam in sorted(families)]
    return out


def list_experiments(search: list[Path]) -> list[str]:
    from omegaconf import OmegaConf

    out = []
    for name, path in _options("experiment", search).items():
        node = OmegaConf.load(path)
        params = OmegaConf.select(node, "hydra.sweeper.params") or {}
        sweep = {str(k): [v.strip() for v in str(val).split(",")] for k, val in params.items()}
        n = 1
        for values in sweep.values():
            n *= len(values)
        jobs = "; ".join(f"{k}: {', '.join(v)}" for k, v in sweep.items()) or "one job"
        out.append(f"+experiment={name}  ({n} job{'s' if n != 1 else ''})  {_comment(path)}")
        out.append(f"    {jobs}")
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
