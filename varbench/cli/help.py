"""``python -m varbench --help``: how to call the command, its config groups with their options
(internal ``*_schema`` entries left out), varbench's own flags and where to read more. Hydra's
full help stays at ``--hydra-help``; ``--cfg job`` prints the composed config."""
from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Sequence

from varbench.cli.overrides import group_options, split_argv
from varbench.core.resources import CONF_DIR

#: the config groups a user picks from, in the order of config.yaml's defaults, with what each chooses
GROUPS: tuple[tuple[str, str], ...] = (
    ("experiment", "a sweep of jobs (+experiment=NAME)"),
    ("model", "model preset and its weight files"),
    ("method", "acceleration policy and its knobs"),
    ("benchmark", "prompt set"),
    ("evaluator", "metrics, several at once: evaluator=[geneval,hpsv2]"),
    ("timing", "the timed pass"),
    ("runtime", "device, dtype, batch size"),
    ("logger", "none | wandb"),
    ("paths", "where weights, data, the store and results live"),
)


def help_text(search: Sequence[Path]) -> str:
    lines = [
        "usage: python -m varbench [+experiment=NAME] [group=option ...] [key=value ...] [flags]",
        "",
        "One job generates a benchmark's images with one (model, method), scores them, times them and",
        "writes a run record under store/<experiment_name>/; a sweep (-m, or an experiment) runs several",
        "and writes the tables under results/<experiment_name>/.",
        "",
        "config groups (group=option):",
    ]
    for group, what in GROUPS:
        options = group_options(group, search) or []
        lines.append(f"  {group}: {what}")
        lines += textwrap.wrap(", ".join(options), 96, initial_indent="      ", subsequent_indent="      ")
    lines += [
        "",
        "flags:",
        "  --dry-run         list the jobs, which are finished, what is missing and the estimated time; run nothing",
        "  --no-preflight    start the jobs even when files they need are missing (each fails on its own)",
        "  -m, --multirun    run a sweep (a,b values); experiments set it themselves",
        "  --config-dir DIR  your own options next to the packaged ones (a method=mine from DIR/method/mine.yaml)",
        "  --cfg job         print the composed config and exit; --hydra-help: Hydra's own help",
        "",
        "more: python -m varbench.list [methods|experiments|evaluators]  (labels, families, descriptions, jobs,",
        "      weight files); README.md and docs/; a knob's meaning: varbench/conf/method/<name>.yaml",
    ]
    return "\n".join(lines)


def print_help(argv: Sequence[str]) -> None:
    _, dirs = split_argv(argv)
    print(help_text([Path(CONF_DIR)] + dirs))
