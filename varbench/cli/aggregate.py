"""``python -m varbench.aggregate PATH [PATH ...] [--out DIR] [--baseline SPEC] [--allow-unpaired] [--no-figures]``
(documented spelling; also ``python -m varbench.cli.aggregate``): the tables and figures of the
finished records under PATH (:func:`varbench.analysis.aggregate.aggregate`), one folder per
(model, resolution) in DIR. Several PATHs (experiments, or whole stores) are compared in one table
per group: choose the reference with ``--baseline EXPERIMENT:METHOD`` or ``--baseline ENTRY``.

First, sharded entries whose shards are all done but whose record is missing (the last shard was
killed after finishing its part) are assembled (:func:`varbench.cli.assemble.assemble_ready_shards`),
so the table holds them: the analysis itself only reads records.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from varbench.analysis.aggregate import aggregate
from varbench.analysis.groups import slug
from varbench.core.errors import FixableError


def default_out(paths: Sequence[str | Path]) -> Path:
    """``results/<name of PATH>`` for one PATH; ``results/compare-<name>-<name>...`` for several
    (each PATH's folder name, in the order given, a repeated name once)."""
    names = list(dict.fromkeys(Path(p).resolve().name for p in paths))
    if len(paths) == 1:
        return Path("results") / names[0]
    return Path("results") / slug("compare-" + "-".join(names))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m varbench.aggregate", description=(
        "Aggregate finished records into paper tables and figures, each row against its baseline: one folder "
        "per (model, resolution), OUT/<model>-<resolution>px/ (table.md, table.tex, table.csv, tidy.csv, "
        "figures), and OUT/tidy.csv with every record. Several PATHs compare experiments (or stores)."))
    ap.add_argument("path", nargs="+", help="folder(s) to search (recursively) for finished entries: store/<experiment>, "
                                            "or a whole store; several are compared in one table per group")
    ap.add_argument("--out", default=None, help="output folder (default: results/<name of PATH>; for several PATHs "
                                                "results/compare-<name>-<name>...)")
    ap.add_argument("--baseline", default="baseline", metavar="METHOD|EXPERIMENT:METHOD|ENTRY", help=(
        "the reference rows: a method name (default: baseline), EXPERIMENT:METHOD (that experiment's records of "
        "METHOD, e.g. nova_sweep:baseline, to compare experiments whose baselines have the same settings), or an "
        "entry id (or a unique prefix of one)"))
    ap.add_argument("--allow-unpaired", action="store_true", help="keep rows without a matching baseline")
    ap.add_argument("--no-figures", action="store_true", help="tables only")
    args = ap.parse_args(argv)
    out = Path(args.out) if args.out else default_out(args.path)
    from varbench.cli.assemble import assemble_ready_shards

    for path in args.path:
        for entry in assemble_ready_shards(path):   # sharded entries whose last shard died after its part
            print(f"assembled the record of sharded entry {entry}")
    try:
        result = aggregate(args.path, out, baseline=args.baseline, allow_unpaired=args.allow_unpaired,
                           figures=not args.no_figures)
    except FixableError as e:  # unpaired rows, a broken or legacy-sealed entry, a garbled file: one message, no traceback
        print(f"error: {e}", file=sys.stderr)
        return 2
    print_result(result, figures=not args.no_figures)
    return 0


def print_result(result, prefix: str = "", figures: bool = True) -> None:
    """Each group's table.md (its notes name unfinished entries), then where every file is."""
    for g in result.groups:
        print(f"{prefix}## {g.name} ({g.folder})")
        print(Path(g.folder, "table.md").read_text(encoding="utf-8"))
    if result.removed:
        print(f"{prefix}removed {len(result.removed)} stale file(s) of an earlier aggregation from {result.out} "
              "(the flat layout, or groups whose records are gone): "
              + ", ".join(str(p.relative_to(result.out)) for p in result.removed[:8])
              + (" ..." if len(result.removed) > 8 else ""))
    names = ", ".join(f"{g.name}/" for g in result.groups)
    print(f"{prefix}wrote {result.out}/tidy.csv ({len(result.paired)} records) and per (model, resolution) "
          f"{names} (table.md, table.tex, table.csv, tidy.csv{', figures' if figures else ''})")
    report = Path(result.out) / "report.html"
    if report.is_file():
        print(f"{prefix}report: {report} (one self-contained page: open it in a browser)")


if __name__ == "__main__":
    sys.exit(main())
