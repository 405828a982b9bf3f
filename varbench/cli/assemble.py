"""``python -m varbench.job assemble <entry folder>`` (documented spelling; also
``python -m varbench.cli.assemble``): assemble the record of a sharded entry whose shards are all done."""
from __future__ import annotations

import argparse
import sys

from varbench.harness.job import assemble_cli


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m varbench.job", description="Job utilities.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("assemble", help="assemble the record of a sharded entry").add_argument("entry")
    args = ap.parse_args(argv)
    return assemble_cli(args.entry)


if __name__ == "__main__":
    sys.exit(main())
