"""`python -m varbench [+experiment=NAME] [group=option ...] [key=value ...]` (Hydra): the command itself."""
from __future__ import annotations

import json
import logging
import os
import sys
import traceback

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

import varbench.harness  # noqa: F401 - registers the method schemas the configs name
from varbench.core.resources import CONF_DIR

CONF = str(CONF_DIR)
log = logging.getLogger("varbench")


@hydra.main(version_base="1.3", config_path=CONF, config_name="config")
def main(cfg: DictConfig) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")         # weights come from local paths only
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    logging.getLogger("varbench").setLevel(logging.INFO)
    from varbench.cli.joblog import hydra_log_file, tee_stdout

    with tee_stdout(hydra_log_file()):   # the job's lines also in <output dir>/<job>.log
        _main(cfg)


def _main(cfg: DictConfig) -> None:
    from varbench.cli.callbacks import aggregate_experiment, failures_path
    from varbench.cli.run import run as run_job      # the job, with its observers (W&B, the result line)
    from varbench.core.errors import names_its_fix

    multirun = HydraConfig.get().mode.name == "MULTIRUN"
    if not multirun:
        fixable_exits(run_job, cfg)
        if cfg.get("aggregate", True):
            fixable_exits(aggregate_experiment, cfg)
        return
    # in a sweep, one failing job must not cost the others (or the table): record it and go on
    try:
        run_job(cfg)
    except Exception as e:  # noqa: BLE001 - reported below and again at the end of the sweep
        overrides = list(HydraConfig.get().overrides.task)
        error = f"{type(e).__name__}: {e}"
        path = failures_path(HydraConfig.get().sweep.dir)  # the sweep's folder: the end-of-sweep callback reads it
        earlier = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
        first = next((f for f in earlier if f["error"] == error), None)
        if first is None:
            print(f"[varbench] job failed ({' '.join(overrides)}): {error}")
        else:                         # e.g. a missing weight file fails every job alike: say it once
            print(f"[varbench] job failed ({' '.join(overrides)}): the same {type(e).__name__} as "
                  f"({' '.join(first['overrides'])}); listed again at the end of the sweep")
        logged = not names_its_fix(e)  # a missing file or a bad setting says what to do; anything else gets its traceback
        if logged:
            log.error("job failed:\n%s", traceback.format_exc())
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as f:
            f.write(json.dumps({"overrides": overrides, "error": error, "traceback_logged": logged}) + "\n")


def fixable_exits(fn, *args, **kwargs):
    """``fn(*args, **kwargs)``; an error that names its fix (:class:`varbench.core.errors.FixableError`: a bad
    setting, a missing or garbled file, a read-only store, a held lock, a broken seal) is printed as
    its one message on stderr, without a traceback, and exits 2. Any other error keeps its traceback."""
    from varbench.core.errors import FixableError, report_line

    try:
        return fn(*args, **kwargs)
    except FixableError as e:
        print(report_line(e), file=sys.stderr)
        raise SystemExit(2) from None


def cli() -> None:
    """The ``varbench`` command: :func:`main` with SIGTERM/SIGINT handled for the whole process
    (:class:`varbench.core.interrupt.GracefulStop`), so a signal that lands between two jobs of a sweep,
    or while a job loads its model, also exits 128 + signal after finishing what is in flight,
    instead of killing the process in the middle of a write. Outside a job the stop is only noted
    (``immediate=False``): raised while Hydra composes the next job's config, it would surface as a
    garbled config error with exit code 1. The next job's own block (immediate) raises it on entry,
    and a stop still pending when the sweep ends is raised here."""
    from varbench.cli.overrides import check_overrides
    from varbench.core.interrupt import GracefulStop

    argv = sys.argv[1:]
    if any(a in ("--help", "-h") for a in argv):       # Hydra's own help lists internal *_schema entries
        from varbench.cli.help import print_help

        print_help(argv)
        return
    own = {a for a in argv if a in OWN_FLAGS}
    argv = [a for a in argv if a not in OWN_FLAGS]
    sys.argv[1:] = argv                                # Hydra never sees varbench's own flags
    fixable_exits(check_config, argv)      # a --config-dir file that does not parse: file, line, column; exit 2
    fixable_exits(check_overrides, argv)   # a typo'd option or key: one line naming the closest, exit 2
    if "--dry-run" in own:
        from varbench.cli.dry_run import dry_run

        raise SystemExit(fixable_exits(dry_run, argv))     # Hydra's composition errors translated (hydra_errors.py)
    if "--no-preflight" not in own:
        fixable_exits(preflight, argv)     # every missing file of the sweep in one list, before any job starts
    with GracefulStop(immediate=False):
        main()


#: flags `varbench` reads itself (removed before Hydra parses the command line)
OWN_FLAGS = ("--dry-run", "--no-preflight")


def check_config(argv: list[str]) -> None:
    """The user's ``--config-dir`` folders, read strictly before Hydra composes from them
    (:func:`varbench.cli.hydra_errors.check_config_dirs`); skipped under ``HYDRA_FULL_ERROR=1``."""
    from varbench.cli.hydra_errors import check_config_dirs, full_error
    from varbench.cli.overrides import split_argv

    if not full_error():
        check_config_dirs(split_argv(argv)[1])


def preflight(argv: list[str]) -> None:
    """Compose the command's jobs (:mod:`varbench.cli.sweep_plan`) and raise one error naming every
    file they need and lack (:func:`varbench.harness.preflight.check_files`). A command Hydra must
    plan itself (a glob sweep, ``--cfg``), or one whose config does not compose, is left to Hydra,
    which reports it as before."""
    from varbench.cli.sweep_plan import plan_command
    from varbench.harness.preflight import check_files

    from varbench.core.errors import ConfigError

    from varbench.cli.hydra_errors import full_error, translate

    try:
        plan = plan_command(argv)
    except ConfigError:
        raise                      # ours, naming the fix (e.g. an experiment without a method list for this model)
    except Exception as e:  # noqa: BLE001 - Hydra's composition error, said in one line (exit 2)
        fixable = None if full_error() else translate(e)
        if fixable is None:
            return                 # HYDRA_FULL_ERROR=1, or not an input fault: Hydra reports it with its trace
        raise fixable from None
    if plan is None:
        return
    varying = plan.varying()
    labels = [" ".join(o for o in j.overrides if o.partition("=")[0] in varying) or "the job" for j in plan.jobs]
    check_files([j.cfg for j in plan.jobs], labels)

