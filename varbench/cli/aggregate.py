"""``python -m varbench.aggregate PATH [--out DIR] [--baseline NAME] [--allow-unpaired] [--no-figures]``
(documented spelling; also ``python -m varbench.cli.aggregate``): the tables and figures of the
finished records under PATH (:func:`varbench.analysis.aggregate.aggregate`).

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
from varbench.core.errors import FixableError


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m varbench.aggregate", description=(
        "Aggregate finished records into paper tables and figures, each row against its baseline."))
    ap.add_argument("path", help="folder to search (recursively) for finished entries")
    ap.add_argument("--out", default=None, help="output folder (default: results/<name of PATH>)")
    ap.add_argument("--baseline", default="baseline", help="method name of the reference rows")
    ap.add_argument("--allow-unpaired", action="store_true", help="keep rows without a matching baseline")
    ap.add_argument("--no-figures", action="store_true", help="tables only")
    args = ap.parse_args(argv)
    out = Path(args.out) if args.out else Path("results") / Path(args.path).resolve().name
    from varbench.cli.assemble import assemble_ready_shards

    for entry in assemble_ready_shards(args.path):   # sharded entries whose last shard died after its part
        print(f"assembled the record of sharded entry {entry}")
    try:
        paired = aggregate(args.path, out, baseline=args.baseline, allow_unpaired=args.allow_unpaired,
                           figures=not args.no_figures)
    except FixableError as e:  # unpaired rows, a broken or legacy-sealed entry, a garbled file: one message, no traceback
        print(f"error: {e}", file=sys.stderr)
        return 2
    print((out / "table.md").read_text(encoding="utf-8"))   # its notes name unfinished entries
    print(f"wrote {out}/table.md, table.tex, table.csv, tidy.csv ({len(paired)} records)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
