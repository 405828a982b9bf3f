"""The console of a submitit sweep (``hydra/launcher=local`` or ``slurm``): the jobs' own lines while
the launching process waits, one job at a time per device on a workstation, and a warning when
timed jobs would share a device.

Without this the launching process says nothing between "#k : overrides" and the table: each job
prints into ``<sweep dir>/.submitit/<job id>/<job id>_0_log.out``. :class:`LogWatcher` (a thread of
the launching process, started and stopped by the end-of-sweep callback) tails those files and
echoes varbench's own lines (``[varbench] ...``: the stored images, the record, the result line,
a failure), each with its job's place in the sweep; submitit's own "requeued" and "job raised"
lines are echoed too. Everything else (tracebacks, progress bars, INFO logging) stays in the files.

Parallelism: submitit's local executor has no queue (``LocalQueueConf`` has no
``array_parallelism``; every job it is given starts at once, all on the same GPUs: it sets
``CUDA_VISIBLE_DEVICES=0..gpus_per_node-1`` for each). The queue is Hydra's basic sweeper:
``hydra.sweeper.max_batch_size=k`` hands the launcher k jobs at a time and waits for them. For
the local launcher, when it is not set, :func:`plan_local_sweep` sets it to one job per device
(see :func:`device_slots`), so timings are not measured under contention by default.
"""
from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

from omegaconf import DictConfig, OmegaConf, open_dict, read_write

LOCAL_LAUNCHER = "hydra_submitit_launcher.submitit_launcher.LocalLauncher"
SUBMITIT_LAUNCHER = "hydra_submitit_launcher.submitit_launcher."
BASIC_SWEEPER = ".BasicSweeper"
PARALLEL_KNOB = "hydra.sweeper.max_batch_size"
POLL_S = 1.0        # how often the watcher reads the logs: a line reaches the console at most this late

_ID_TAGS = ("%j", "%t", "%A", "%a")                     # submitit's placeholders in submitit_folder
_JOB = re.compile(r"^\[varbench\] (job \d+(?:/\d+)?)\b")  # "[varbench] job 3/12 ..." names its job
_SUBMITIT = re.compile(r"^submitit (?:INFO|WARNING|ERROR) \([^)]*\) - (.*)$")
_SUBMITIT_ECHOED = ("Requeued job", "Submitted job triggered an exception", "Job has timed out")


# ------------------------------------------------------------------ the jobs' lines on the console

def job_folders_root(submitit_folder: str | Path) -> Path:
    """The folder holding every job's folder: ``submitit_folder`` up to its first id placeholder
    (``<sweep>/.submitit/%j`` -> ``<sweep>/.submitit``), as submitit itself computes it."""
    parts = Path(submitit_folder).expanduser().absolute().parts
    kept = []
    for p in parts:
        if any(t in p for t in _ID_TAGS):
            break
        kept.append(p)
    return Path(*kept)


@dataclass
class _Tail:
    offset: int = 0
    partial: bytes = b""


@dataclass
class LogWatcher:
    """Tails ``<root>/*/*_log.out`` and ``*_log.err`` (one folder per job, named by its id) and hands
    each new varbench line to ``out``, prefixed with its job ("job 2/6"), which the job's first
    line names (:func:`announce_job`); until then the job is named by its id.
    :meth:`poll` reads once (tests call it directly); :meth:`start`/:meth:`stop` run it in a thread.
    ``literal``: the name submitit's local controller creates, unformatted, next to the job folders
    (``%j``: it makes its folder before it knows its id); removed when found empty."""

    root: Path
    out: Callable[[str], None] = field(default=lambda line: print(line, flush=True))
    interval_s: float = POLL_S
    literal: str | None = None
    _tails: dict[Path, _Tail] = field(default_factory=dict)
    _labels: dict[str, str] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def poll(self) -> list[str]:
        """Read what the logs gained since the last call; echo and return the lines shown."""
        shown = []
        if self.literal:
            try:
                (self.root / self.literal).rmdir()      # only when empty: nothing is ever written there
            except OSError:
                pass
        # stdout first: a job's "started" line (its label) comes before anything it writes to stderr
        for path in sorted(self.root.glob("*/*_log.out")) + sorted(self.root.glob("*/*_log.err")):
            for line in self._new_lines(path):
                text = self._render(path.parent.name, line)
                if text is not None:
                    self.out(text)
                    shown.append(text)
        return shown

    def _new_lines(self, path: Path) -> list[str]:
        tail = self._tails.setdefault(path, _Tail())
        try:
            with open(path, "rb") as f:
                f.seek(tail.offset)
                data = f.read()
        except OSError:         # not there yet, or removed
            return []
        tail.offset += len(data)
        data = tail.partial + data
        *complete, tail.partial = data.split(b"\n")      # the last piece is a line still being written
        # a progress bar rewrites its line with "\r": each piece is a line of its own
        return [piece for line in complete for piece in line.decode("utf-8", "replace").split("\r")]

    def _render(self, job_id: str, line: str) -> str | None:
        line = line.rstrip()
        named = _JOB.match(line)
        if named:
            self._labels[job_id] = named.group(1)
            return line
        label = self._labels.get(job_id, f"job id {job_id}")
        if line.startswith("[varbench] "):
            return f"[varbench] {label} · {line[len('[varbench] '):]}"
        sub = _SUBMITIT.match(line)
        if sub and sub.group(1).startswith(_SUBMITIT_ECHOED):
            return f"[varbench] {label} · submitit: {sub.group(1)} (log: {self.root / job_id})"
        return None

    def start(self) -> "LogWatcher":
        def loop() -> None:
            while not self._stop.wait(self.interval_s):
                self.poll()

        # a daemon: a launching process that stops waiting (Ctrl-C, a crash) is not held by it
        self._thread = threading.Thread(target=loop, name="varbench-log-watcher", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread, then read once more: the last lines of the last job are not lost."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.poll()


# ------------------------------------------------------------------ devices and parallelism

def sweep_overrides(config: DictConfig) -> dict[str, list[str]]:
    """The sweep's swept keys (command line and ``hydra.sweeper.params``) -> their values as written
    (``method=a,b`` -> ``{"method": ["a", "b"]}``); a sweep that cannot be enumerated (``glob``)
    maps to ``["*"]``."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    params = config.hydra.sweeper.get("params") if "sweeper" in config.hydra else None
    params = OmegaConf.to_container(params, resolve=True) if params is not None else {}   # resolved, as Hydra instantiates the sweeper (compose_matrix picks its list by model)
    strings = [f"{k}={v}" for k, v in params.items()] + list(config.hydra.overrides.get("task") or [])
    swept = {}
    for o in OverridesParser.create().parse_overrides(strings):
        if o.is_sweep_override():
            try:
                swept[o.key_or_group.lstrip("+~")] = list(o.sweep_string_iterator())
            except Exception:  # noqa: BLE001 - glob(...) needs the config repository
                swept[o.key_or_group.lstrip("+~")] = ["*"]
    return swept


def timed(config: DictConfig, swept: Mapping[str, Sequence[str]]) -> bool:
    """Whether any job of the sweep runs the timed pass: a swept ``timing`` option other than
    ``none`` or a swept ``timing.enabled`` true, else the sweep's own ``timing.enabled``."""
    if "timing" in swept:
        return any(v != "none" for v in swept["timing"])
    if "timing.enabled" in swept:
        return any(str(v).lower() not in ("false", "0", "no") for v in swept["timing.enabled"])
    return bool(OmegaConf.select(config, "timing.enabled", default=True))


@dataclass(frozen=True)
class Slots:
    """How many jobs can run at once without sharing a device, and why (for the console)."""

    n: int
    what: str


def device_slots(config: DictConfig, swept: Mapping[str, Sequence[str]]) -> Slots:
    """Devices the local launcher's jobs can use without sharing one. ``gpus_per_node: 0``: no GPU
    (submitit sets ``CUDA_VISIBLE_DEVICES`` empty), the CPU is one device. ``gpus_per_node: g``:
    every job sees the same GPUs 0..g-1 (submitit_local does not split them between jobs), so g
    jobs only use g GPUs when each picks its own, by a per-job ``runtime.device`` (an interpolation
    such as ``cuda:${vb.shard_index:${shard}}``, or a swept value); otherwise they all run on the
    same one."""
    g = int(OmegaConf.select(config, "hydra.launcher.gpus_per_node", default=0) or 0)
    if g <= 0:
        return Slots(1, "the CPU, gpus_per_node=0")
    raw = OmegaConf.to_container(config, resolve=False).get("runtime", {}).get("device", "auto") \
        if "runtime" in config else "auto"
    per_job = "runtime.device" in swept or "${" in str(raw)
    if g > 1 and per_job:
        return Slots(g, f"{g} GPUs, gpus_per_node={g} and a runtime.device per job")
    if g > 1:
        return Slots(1, f"one GPU: every job sees the same {g} GPUs and runs on runtime.device={raw}")
    return Slots(1, "the first GPU, or the CPU if there is none; gpus_per_node=1")


@dataclass(frozen=True)
class LocalPlan:
    """What :func:`plan_local_sweep` decided: jobs at a time, the device slots, and the lines to print."""

    parallel: int
    slots: Slots
    lines: tuple[str, ...]


def plan_local_sweep(config: DictConfig, n_jobs: int | None, environ: Mapping[str, str]) -> LocalPlan | None:
    """For a ``hydra/launcher=local`` sweep: set ``hydra.sweeper.max_batch_size`` (jobs at a time)
    to one job per device when the user did not, and say so; warn when timed jobs would share a
    device (their latencies then measure the contention) and when submitit ignores this shell's
    ``CUDA_VISIBLE_DEVICES``. None for other launchers, or a sweeper without batches."""
    if not str(OmegaConf.select(config, "hydra.launcher._target_", default="")).endswith(LOCAL_LAUNCHER):
        return None
    if not str(OmegaConf.select(config, "hydra.sweeper._target_", default="")).endswith(BASIC_SWEEPER):
        return None
    swept = sweep_overrides(config)
    slots = device_slots(config, swept)
    chosen = config.hydra.sweeper.get("max_batch_size")
    if chosen is None:
        with read_write(config.hydra), open_dict(config.hydra.sweeper):
            config.hydra.sweeper.max_batch_size = slots.n
        batch, how = slots.n, f"one per device, the default; raise with {PARALLEL_KNOB}=N"
    else:
        batch, how = int(chosen), f"{PARALLEL_KNOB}={chosen}"
    parallel = min(batch, n_jobs) if n_jobs else batch
    jobs = f"{n_jobs} jobs" if n_jobs else "the jobs"
    lines = [f"[varbench] local launcher: {jobs}, {parallel} at a time ({how}); devices: {slots.what}"]
    if parallel > slots.n and timed(config, swept):
        lines.append(
            f"[varbench] WARNING: {parallel} timed jobs run at once on {slots.n} device{'s' if slots.n > 1 else ''} "
            f"({slots.what}): "
            "they share it, so their latencies and speed-ups measure the contention, not the methods, and "
            f"are not valid. For timings run one job per device ({PARALLEL_KNOB}={slots.n}, the default), "
            "or sweep with timing=none.")
    g = int(OmegaConf.select(config, "hydra.launcher.gpus_per_node", default=0) or 0)
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    given = ",".join(str(k) for k in range(g))
    if g > 0 and visible is not None and visible.replace(" ", "") != given:
        lines.append(
            f"[varbench] note: this shell's CUDA_VISIBLE_DEVICES={visible} does not reach the jobs: submitit's "
            f"local launcher sets CUDA_VISIBLE_DEVICES={given} for each job (the machine's first {g} GPU{'s' if g > 1 else ''}).")
    return LocalPlan(parallel, slots, tuple(lines))


# ------------------------------------------------------------------ the callback's three hooks

_WATCHER: LogWatcher | None = None     # module-level: the callback object is pickled into every job
_WARNINGS: tuple[str, ...] = ()        # said again at the end, next to the table (the first lines have scrolled away)


def sweep_started(config: DictConfig, environ: Mapping[str, str] | None = None) -> None:
    """At the start of a multirun (the launching process, after the jobs were counted into
    ``VARBENCH_SWEEP_JOBS``): plan a local sweep and start echoing the jobs' lines. Nothing for
    Hydra's basic launcher (its jobs print here already)."""
    global _WATCHER, _WARNINGS
    if SUBMITIT_LAUNCHER not in str(OmegaConf.select(config, "hydra.launcher._target_", default="")):
        return
    from varbench.cli.report import ENV_SWEEP_JOBS

    sweep_stopped()                                   # a multirun before this one, in the same process
    environ = os.environ if environ is None else environ
    n_jobs = int(environ[ENV_SWEEP_JOBS]) if environ.get(ENV_SWEEP_JOBS) else None
    plan = plan_local_sweep(config, n_jobs, environ)
    for line in plan.lines if plan else ():
        print(line, flush=True)
    _WARNINGS = tuple(x for x in (plan.lines if plan else ()) if "WARNING" in x)
    folder = str(config.hydra.launcher.submitit_folder)
    root = job_folders_root(folder)
    rest = Path(folder).expanduser().absolute().relative_to(root).parts
    _WATCHER = LogWatcher(root, literal=rest[0] if rest else None).start()


def sweep_stopped() -> None:
    """At the end of the multirun: echo the last lines, stop the watcher, repeat the start's warning."""
    global _WATCHER, _WARNINGS
    if _WATCHER is not None:
        _WATCHER.stop()
        _WATCHER = None
    for line in _WARNINGS:
        print(line, flush=True)
    _WARNINGS = ()


def announce_job(config: DictConfig, environ: Mapping[str, str] | None = None) -> str | None:
    """In a submitit job, before it runs: print ``[varbench] job k/N started ...`` (its log's first
    line, by which :class:`LogWatcher` names the job's later lines). Elsewhere nothing (Hydra's basic
    launcher already prints each job's overrides)."""
    environ = os.environ if environ is None else environ
    if not environ.get("SUBMITIT_EXECUTOR"):
        return None
    from varbench.cli.report import job_position

    num = OmegaConf.select(config, "hydra.job.num", default=None)
    job_id = OmegaConf.select(config, "hydra.job.id", default=None)   # submitit's job id (the plugin sets it)
    gpus = environ.get("CUDA_VISIBLE_DEVICES")
    line = (f"[varbench] {job_position(num)} started (submitit job {job_id}, "
            f"CUDA_VISIBLE_DEVICES={gpus if gpus else 'none'})")
    print(line, flush=True)
    return line

