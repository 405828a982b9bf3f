"""Memory as papers report it (varbench/engine/memory.py `measure_peak`, varbench/engine/nvml.py):
beside CUDA's allocated peak, the allocator's reserved peak and the driver's NVML reading; None on
the CPU. The CUDA branch runs here against stand-ins for torch.cuda's counters and for pynvml (no
GPU needed), and for real under the `gpu` marker."""
from __future__ import annotations

import os
import sys
import types
from unittest import mock

import pytest
import torch

from varbench.engine.memory import PEAK_CUDA, image_memory, measure_peak, memory_summary
from varbench.engine.nvml import nvml_used_bytes


def test_cpu_has_no_reserved_or_nvml_reading():
    with measure_peak("cpu") as peak:
        torch.ones(1000)
    assert peak["bytes"] > 0 and peak["reserved_bytes"] is None and peak["nvml_bytes"] is None
    assert nvml_used_bytes(torch.device("cpu")) == (None, "not a CUDA device (cpu)")


def _fake_pynvml(pid_bytes=None, device_used=7 << 30):
    nv = types.ModuleType("pynvml")
    nv.nvmlInit = lambda: None
    nv.nvmlDeviceGetHandleByPciBusId = lambda bus: ("bus", bus)
    nv.nvmlDeviceGetHandleByIndex = lambda i: ("index", i)
    procs = [] if pid_bytes is None else [types.SimpleNamespace(pid=os.getpid(), usedGpuMemory=pid_bytes)]
    nv.nvmlDeviceGetComputeRunningProcesses = lambda h: procs
    nv.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=device_used)
    return nv


def _fake_cuda_counters():
    props = types.SimpleNamespace(pci_bus_id=0x1b, pci_domain_id=0, pci_device_id=0)
    return [mock.patch.object(torch.cuda, "reset_peak_memory_stats", lambda d=None: None),
            mock.patch.object(torch.cuda, "max_memory_allocated", lambda d=None: 3 << 30),
            mock.patch.object(torch.cuda, "max_memory_reserved", lambda d=None: 4 << 30),
            mock.patch.object(torch.cuda, "get_device_properties", lambda i: props),
            mock.patch.object(torch.cuda, "current_device", lambda: 0)]


@pytest.mark.parametrize("pid_bytes, want", [(5 << 30, (5 << 30, "process")),
                                             (None, (7 << 30, "device: no per-process reading"))])
def test_cuda_peak_records_reserved_and_the_driver_reading(monkeypatch, pid_bytes, want):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(pid_bytes))
    patches = _fake_cuda_counters()
    for p in patches:
        p.start()
    try:
        with measure_peak("cuda:0") as peak:
            pass
    finally:
        for p in patches:
            p.stop()
    assert (peak["bytes"], peak["kind"], peak["reserved_bytes"]) == (3 << 30, PEAK_CUDA, 4 << 30)
    assert (peak["nvml_bytes"], peak["nvml_note"]) == want
    # into the trace row and the record's memory block (the most over the calls)
    row = {"memory": image_memory([], peak), "scales": []}
    mem = memory_summary([row, row], 2, {"transformer": 1}, "bfloat16")
    assert (mem["peak_reserved_bytes"], mem["nvml_bytes"], mem["nvml_note"]) == (4 << 30, want[0], want[1])


def test_no_pynvml_is_none_with_the_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)   # import pynvml raises ImportError
    assert nvml_used_bytes(torch.device("cuda:0")) == (None, "pynvml is not importable (pip install nvidia-ml-py)")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_real_cuda_reserved_covers_allocated():
    with measure_peak("cuda") as peak:
        x = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
        del x
    assert peak["bytes"] >= 64 << 20 and peak["reserved_bytes"] >= peak["bytes"]
    if peak["nvml_bytes"] is not None:   # the driver's reading adds the context: at least the reserved blocks
        assert peak["nvml_bytes"] >= peak["reserved_bytes"] or peak["nvml_note"].startswith("device")
