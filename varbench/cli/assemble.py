"""``python -m varbench.job assemble <entry folder>`` (documented spelling; also
``python -m varbench.cli.assemble``): assemble the record of a sharded entry whose shards are all
done, e.g. when the last shard was killed after finishing its part.

The library side is the harness's (:func:`varbench.harness.job.job_from_shards`,
:func:`varbench.harness.job.assemble_shards`, :func:`varbench.harness.job.ready_sharded_entries`);
this command adds what a command does: the exit status, the error line, and the observers the
entry's config names (``logger=wandb`` publishes the assembled record: ``record_assembled``).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from varbench.harness.job import assemble_shards, job_from_shards, ready_sharded_entries


def assemble_entry(entry_dir: str | Path) -> int:
    """Assemble one sharded entry's record; 0 when assembled (or already), 1 while some shard is
    not done, 2 when the entry cannot be rebuilt (said on stderr)."""
    from varbench.cli.run import logger_observers

    from varbench.core.errors import FixableError

    try:
        job = job_from_shards(entry_dir)
        if not assemble_shards(job):     # checks every part belongs to the entry before it writes
            return 1
    except FixableError as e:            # a part of another job, a garbled job.json, a bad setting in it
        print(f"error: {e}", file=sys.stderr)
        return 2
    job.observers = logger_observers(job.cfg)
    job.notify("record_assembled", job.entry.read())
    return 0


def assemble_ready_shards(path: str | Path) -> list[Path]:
    """Assemble every sharded entry under ``path`` whose shards are all done but whose record is
    missing (:func:`varbench.harness.job.ready_sharded_entries`); returns the entries assembled.
    ``python -m varbench.aggregate`` calls this first."""
    return [entry for entry in ready_sharded_entries(path) if assemble_entry(entry) == 0]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m varbench.job", description="Job utilities.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("assemble", help="assemble the record of a sharded entry").add_argument("entry")
    args = ap.parse_args(argv)
    return assemble_entry(args.entry)


if __name__ == "__main__":
    sys.exit(main())
