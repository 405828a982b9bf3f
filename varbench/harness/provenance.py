"""Provenance: tie every number in a record to the code, packages and machine that produced it.

Usage::

    from varbench.harness.provenance import collect_provenance
    from varbench.core.filehash import sha256_file, weight_hashes
    prov = collect_provenance()          # JSON-able dict; never raises for a missing tool
    prov["git"]["sha"], prov["git"]["dirty"], prov["packages"]["torch"]
    sha256_file("weights/infinity_2b_reg.pth")   # hex digest, streamed in 4 MiB chunks
    weight_hashes({"infinity_8b_weights": "weights/infinity_8b_weights"})  # {"<name>/<file>": sha256}

Everything here degrades gracefully: not a git checkout -> ``git.sha = None``; a package that
is not installed -> ``null`` version; no ``nvidia-smi`` -> ``driver = None``. A record should
always be writable, and a missing fact is recorded as ``null`` rather than guessed.

The dict (``schema``: the ``provenance`` field of record.json, schema_version 1)::

    {
      "git": {"sha": str|None, "dirty": bool|None, "diff_sha256": str|None, "root": str|None},
      "packages": {"torch": "2.4.1", "varbench": "0.1.0", ..., "<missing>": None},
      "python": "3.11.9", "platform": "Linux-...", "hostname": str, "cpu_count": int,
      "cpu_model": str|None,                 # /proc/cpuinfo's model name (or the OS's equivalent)
      "device": str,                         # device_label(device): what the timing block and the tables name
      "torch": {"version": str, "cuda": str|None, "cudnn": int|None,
                "device_name": str|None, "device_count": int,
                "driver": str|None,                       # from nvidia-smi, if present
                "sdpa": {"flash": bool, "mem_efficient": bool, "math": bool, "cudnn": bool}|None,
                "cudnn_benchmark": bool, "allow_tf32_matmul": bool, "allow_tf32_cudnn": bool}
               | None                                     # torch not importable
    }
"""
from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any, Mapping

from varbench.core.filehash import sha256_bytes

#: Distributions whose versions are recorded (PyPI names; importlib.metadata resolves them).
PACKAGES = (
    "torch", "varbench", "hydra-core", "omegaconf", "transformers", "open_clip_torch",
    "torchmetrics", "pandas", "wandb", "numpy", "torchvision", "safetensors", "pillow",
)


def package_versions(names=PACKAGES) -> dict[str, str | None]:
    """Installed version per distribution name, ``None`` when it is not installed."""
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            # open_clip's distribution is "open_clip_torch" on PyPI but some installs normalise it.
            alt = name.replace("_", "-")
            try:
                out[name] = metadata.version(alt) if alt != name else None
            except metadata.PackageNotFoundError:
                out[name] = None
    return out


def _run(cmd: list[str], cwd: str | None = None, timeout: float = 10.0) -> str | None:
    """stdout of ``cmd`` or None on any failure (tool missing, non-zero exit, timeout)."""
    try:
        res = subprocess.run(cmd, cwd=cwd, capture_output=True, timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    if res.returncode != 0:
        return None
    return res.stdout.decode("utf-8", "replace")


def git_info(path: str | os.PathLike | None = None) -> dict[str, Any]:
    """sha / dirty flag / sha256 of ``git diff HEAD`` for the checkout holding ``path``.

    ``path`` defaults to this package's folder, so the answer describes the code that ran, not
    the caller's working directory. Untracked files count as dirty (they may be imported).
    """
    where = str(Path(path) if path is not None else Path(__file__).resolve().parent)
    root = _run(["git", "rev-parse", "--show-toplevel"], cwd=where)
    if root is None:
        return {"sha": None, "dirty": None, "diff_sha256": None, "root": None}
    root = root.strip()
    sha = _run(["git", "rev-parse", "HEAD"], cwd=root)
    status = _run(["git", "status", "--porcelain"], cwd=root)
    diff = _run(["git", "diff", "HEAD"], cwd=root)
    return {
        "sha": sha.strip() if sha else None,
        "dirty": bool(status.strip()) if status is not None else None,
        "diff_sha256": sha256_bytes(diff.encode()) if diff else None,
        "root": root,
    }


def _nvidia_driver() -> str | None:
    if "driver" not in _DRIVER:   # nvidia-smi takes ~0.1 s; asked once per process
        out = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
        _DRIVER["driver"] = out.strip().splitlines()[0].strip() if out and out.strip() else None
    return _DRIVER["driver"]


_DRIVER: dict = {}


def torch_info(device: str | None = None) -> dict[str, Any] | None:
    """Torch / CUDA facts, or None if torch cannot be imported."""
    try:
        import torch
    except Exception:  # noqa: BLE001 - any import failure means "no torch facts"
        return None
    cuda = torch.cuda.is_available()
    info: dict[str, Any] = {
        "version": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "device_count": torch.cuda.device_count() if cuda else 0,
        "device_name": None,
        "driver": None,
        "sdpa": None,
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
        "allow_tf32_matmul": bool(torch.backends.cuda.matmul.allow_tf32),
        "allow_tf32_cudnn": bool(torch.backends.cudnn.allow_tf32),
    }
    if cuda:
        try:
            dev = torch.device(device) if device and str(device).startswith("cuda") else torch.device("cuda")
            info["device_name"] = torch.cuda.get_device_name(dev)
        except Exception:  # noqa: BLE001
            pass
        info["driver"] = _nvidia_driver()
        sdpa = {}
        for key, fn in (("flash", "flash_sdp_enabled"), ("mem_efficient", "mem_efficient_sdp_enabled"),
                        ("math", "math_sdp_enabled"), ("cudnn", "cudnn_sdp_enabled")):
            f = getattr(torch.backends.cuda, fn, None)
            sdpa[key] = bool(f()) if f is not None else None
        info["sdpa"] = sdpa
    else:
        info["device_name"] = platform.processor() or platform.machine()
    return info


_CPU_MODEL: list = []


def cpu_model() -> str | None:
    """The CPU's model name (``AMD EPYC 9654 96-Core Processor``): ``/proc/cpuinfo``'s ``model name``
    (ARM: ``Hardware``/``Processor``/``CPU part``), macOS's ``machdep.cpu.brand_string``, else
    ``platform.processor()`` when it says more than the architecture; None when nothing does.
    Two machines of one architecture are different devices for timing, so tables must tell them apart."""
    if _CPU_MODEL:
        return _CPU_MODEL[0]
    try:
        name = parse_cpuinfo(Path("/proc/cpuinfo").read_text(errors="replace"))
    except OSError:
        name = None
    if name is None and sys.platform == "darwin":
        out = _run(["sysctl", "-n", "machdep.cpu.brand_string"])
        name = out.strip() if out and out.strip() else None
    if name is None:
        proc = platform.processor()
        name = proc if proc and proc not in (platform.machine(), "x86_64", "i386", "arm", "aarch64") else None
    _CPU_MODEL.append(" ".join(name.split()) if name else None)
    return _CPU_MODEL[0]


def parse_cpuinfo(text: str) -> str | None:
    """The CPU model in a ``/proc/cpuinfo`` text: the first ``model name`` (x86), else ``Hardware``,
    ``Processor`` or ``cpu model`` (ARM, MIPS), else ``CPU implementer/CPU part`` (ARM ids); None."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        k, sep, v = line.partition(":")
        if sep and v.strip():
            fields.setdefault(k.strip(), v.strip())
    name = next((fields[k] for k in ("model name", "Hardware", "Processor", "cpu model") if k in fields), None)
    if name is None and "CPU part" in fields:
        name = f"ARM implementer {fields.get('CPU implementer', '?')} part {fields['CPU part']}"
    return " ".join(name.split()) if name else None


def device_label(device: str | None = None) -> str:
    """The machine the numbers were measured on, as records, pairing and tables name it.

    CPU: ``cpu (<CPU model>, <arch>, <threads> threads)``. CUDA: ``<GPU name> (driver <v>, torch <v>,
    CUDA <v>, cuDNN <v>; host <CPU model>)``: the host CPU launches every kernel, so it matters on a
    GPU too. ``unknown CPU`` / ``?`` where a fact cannot be read. Rows whose labels differ are never
    paired (:mod:`varbench.analysis.aggregate`)."""
    import torch

    cpu = cpu_model() or "unknown CPU"
    if device is not None and str(device).startswith("cuda") and torch.cuda.is_available():
        dev = torch.device(device)
        cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        return (f"{torch.cuda.get_device_name(dev)} (driver {_nvidia_driver() or '?'}, torch {torch.__version__}, "
                f"CUDA {torch.version.cuda or '?'}, cuDNN {cudnn or '?'}; host {cpu})")
    return f"cpu ({cpu}, {platform.machine() or platform.processor() or '?'}, {torch.get_num_threads()} threads)"


def collect_provenance(device: str | None = None) -> dict[str, Any]:
    """The ``provenance`` block of a record (see module docstring). Never raises."""
    try:
        label = device_label(device)
    except Exception:  # noqa: BLE001 - a record is always writable; a missing fact is recorded as null
        label = None
    return {
        "git": git_info(),
        "packages": package_versions(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "hostname": socket.gethostname(),
        "cpu_count": os.cpu_count(),
        "cpu_model": cpu_model(),
        "device": label,
        "torch": torch_info(device),
    }


# -- read back from a record -------------------------------------------------------------------
def recorded_git(rec: Mapping) -> Mapping:
    """A record's ``provenance.git`` block ({} when it has none)."""
    git = (rec.get("provenance") or {}).get("git") if isinstance(rec.get("provenance"), Mapping) else None
    return git if isinstance(git, Mapping) else {}


def code_version(rec_or_row: Mapping) -> str:
    """``<12-digit sha>`` of the commit that wrote a record (or a frame row), ``+dirty`` when its
    checkout had uncommitted changes; ``unknown commit`` outside a git checkout."""
    if "git_sha" in rec_or_row:
        sha, dirty = rec_or_row.get("git_sha"), rec_or_row.get("git_dirty")
    else:
        sha, dirty = recorded_git(rec_or_row).get("sha"), recorded_git(rec_or_row).get("dirty")
    if not isinstance(sha, str) or not sha:
        return "unknown commit"
    return sha[:12] + ("+dirty" if str(dirty).lower() == "true" else "")   # numpy/pandas booleans too
