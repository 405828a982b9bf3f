"""The driver's reading of GPU memory (NVML), as papers that quote `nvidia-smi` report it.

    used, note = nvml_used_bytes(torch.device("cuda:0"))

`torch.cuda.max_memory_allocated` counts the tensors torch's caching allocator handed out;
`max_memory_reserved` the blocks it took from the driver (allocated + cached free blocks); the
driver's reading (what nvidia-smi shows) adds the CUDA context, cuBLAS/cuDNN workspaces and other
libraries' memory. NVML has no peak: the reading is taken when asked (after a generation call,
when the allocator still holds its reserved blocks, so it is close to the call's reserved peak plus
the context). This process's own use when NVML lists it (`nvmlDeviceGetComputeRunningProcesses`),
else the whole device's used memory (note says which).

Never raises: (None, why) where there is no reading (not CUDA, pynvml not installed, NVML failed).
"""
from __future__ import annotations

import os
from typing import Optional

import torch

_INSTALL = "pynvml is not importable (pip install nvidia-ml-py)"


def _handle(pynvml, device: torch.device):
    """The NVML handle of `device`, by PCI bus id (CUDA_VISIBLE_DEVICES renumbers torch's indices,
    not NVML's), else by index."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    bus = getattr(props, "pci_bus_id", None)
    if bus is not None:
        domain, dev = getattr(props, "pci_domain_id", 0), getattr(props, "pci_device_id", 0)
        try:
            return pynvml.nvmlDeviceGetHandleByPciBusId(f"{domain:08x}:{bus:02x}:{dev:02x}.0")
        except Exception:  # noqa: BLE001 - an NVML that does not know the id: the index below
            pass
    return pynvml.nvmlDeviceGetHandleByIndex(index)


def nvml_used_bytes(device: torch.device | str) -> tuple[Optional[int], Optional[str]]:
    """(bytes, note): this process's GPU memory as the driver reports it ("process"), or the
    device's used memory ("device: no per-process reading"), or (None, the reason there is none)."""
    device = torch.device(device)
    if device.type != "cuda":
        return None, f"not a CUDA device ({device.type})"
    try:
        import pynvml
    except ImportError:
        return None, _INSTALL
    try:
        pynvml.nvmlInit()
        handle = _handle(pynvml, device)
        try:
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if proc.pid == os.getpid() and proc.usedGpuMemory is not None:
                    return int(proc.usedGpuMemory), "process"
        except Exception:  # noqa: BLE001 - containers often hide other pids: the device reading below
            pass
        return int(pynvml.nvmlDeviceGetMemoryInfo(handle).used), "device: no per-process reading"
    except Exception as e:  # noqa: BLE001 - driver/NVML mismatch: no reading, and why
        return None, f"NVML failed ({type(e).__name__}: {str(e)[:200]})"
