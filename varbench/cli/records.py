"""``python -m varbench.cli.records {verify,reseal} PATH...``: check finished entries against their
``DONE`` seal, or upgrade ``DONE`` files written by older code (:meth:`varbench.harness.records.RunEntry.reseal`:
record.json is checked against the old hash, then every file is sealed as it is now)."""
from __future__ import annotations

import argparse
import sys
from typing import Iterable

from varbench.harness.records import RunEntry, SealError, find_entries


def main(argv: Iterable[str] | None = None) -> int:
    """Check finished entries against DONE, or upgrade DONE files written by older code; 1 if any failed."""
    ap = argparse.ArgumentParser(prog="python -m varbench.cli.records", description=main.__doc__)
    ap.add_argument("command", choices=["verify", "reseal"])
    ap.add_argument("paths", nargs="+", help="entry folders, or folders to search for them")
    args = ap.parse_args(None if argv is None else list(argv))
    bad = 0
    for d in [e for p in args.paths for e in find_entries(p)]:
        entry = RunEntry.from_dir(d)
        try:
            entry.reseal() if args.command == "reseal" else entry.verify()
            print(f"ok: {d}")
        except SealError as e:
            bad += 1
            print(f"error: {e}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
