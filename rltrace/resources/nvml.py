"""NVIDIA GPUs through NVML (`nvidia-ml-py`): which devices this process uses and what they do.

The probe takes the NVML module as an argument, so the conversion from NVML's answers to rows is
tested without a GPU (tests/resources/test_nvml.py uses a stand-in module with NVML's call
signatures); on a machine with a driver, `open_probe()` uses the real `pynvml`.
"""

from __future__ import annotations

import os
import time
from typing import Any

_DEVICES_REFRESH_S = 10.0  # how often the set of devices this process uses is looked up again


def open_probe(nvml: Any = None) -> tuple[GpuProbe | None, str | None]:
    """A probe, or None and the reason GPUs cannot be sampled here (stored as a note row)."""
    if nvml is None:
        try:
            import pynvml as nvml
        except ImportError:
            return None, "nvidia-ml-py is not installed (pip install 'rltrace[resources]'): GPUs are not sampled"
    try:
        nvml.nvmlInit()
        count = int(nvml.nvmlDeviceGetCount())
    except Exception as exc:  # NVMLError_LibraryNotFound / DriverNotLoaded on a machine without a GPU
        return None, f"NVML is not available ({type(exc).__name__}: {exc}): no NVIDIA GPU is sampled"
    if count == 0:
        return None, "NVML reports no NVIDIA GPU on this machine"
    return GpuProbe(nvml, count), None


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _call(fn, *args):
    """One NVML query; None when the device does not support it (power on some boards, MIG)."""
    try:
        return fn(*args)
    except Exception:
        return None


def visible_devices(env: str | None, uuids: list[str]) -> set[int]:
    """NVML indices named by CUDA_VISIBLE_DEVICES (indices or GPU UUIDs); empty when unset or unreadable."""
    if not env:
        return set()
    out = set()
    for item in env.split(","):
        item = item.strip()
        if item.isdigit():
            out.add(int(item))
        elif item:
            out.update(i for i, u in enumerate(uuids) if u and (u == item or u.startswith(item)))
    return {i for i in out if i < len(uuids)}


def gpu_row(index: int, name: str | None, util, memory, power_mw, processes, pids: set[int]) -> dict:
    """One `resources` row from NVML's answers for one device.

    `util` is nvmlDeviceGetUtilizationRates (`.gpu` in %), `memory` nvmlDeviceGetMemoryInfo
    (`.used`, `.total` in bytes), `power_mw` nvmlDeviceGetPowerUsage (milliwatts), `processes`
    the compute and graphics processes (`.pid`, `.usedGpuMemory` in bytes or None); any may be None.
    """
    mine = [p for p in processes or () if p.pid in pids]
    used = [p.usedGpuMemory for p in mine if isinstance(getattr(p, "usedGpuMemory", None), int)]
    return {
        "kind": "gpu",
        "device": index,
        "device_name": name,
        "util_pct": None if util is None else float(util.gpu),
        "mem_bytes": None if memory is None else int(memory.used),
        "mem_total_bytes": None if memory is None else int(memory.total),
        "process_mem_bytes": sum(used) if used else None,
        "power_w": None if power_mw is None else power_mw / 1000.0,
    }


class GpuProbe:
    """Samples the devices this process (or a child of it) has a context on; before it has one,
    the devices CUDA_VISIBLE_DEVICES names; otherwise none (a GPU nobody here uses is not ours)."""

    def __init__(self, nvml: Any, count: int):
        self.nvml = nvml
        self.handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        self.names = [_text(n) if (n := _call(nvml.nvmlDeviceGetName, h)) is not None else None for h in self.handles]
        self.uuids = [_text(u) if (u := _call(nvml.nvmlDeviceGetUUID, h)) is not None else "" for h in self.handles]
        self._devices: list[int] = []
        self._checked = -float("inf")

    def _processes(self, handle) -> list:
        out = []
        for fn in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
            found = _call(getattr(self.nvml, fn), handle) if hasattr(self.nvml, fn) else None
            out.extend(found or ())
        return out

    def devices(self, pids: set[int], now: float | None = None) -> list[int]:
        """NVML indices to sample (looked up again every ~10 s)."""
        now = time.monotonic() if now is None else now
        if now - self._checked >= _DEVICES_REFRESH_S:
            used = [i for i, h in enumerate(self.handles) if any(p.pid in pids for p in self._processes(h))]
            self._devices = used or sorted(visible_devices(os.environ.get("CUDA_VISIBLE_DEVICES"), self.uuids))
            self._checked = now
        return self._devices

    def sample(self, pids: set[int]) -> list[dict]:
        rows = []
        for i in self.devices(pids):
            h, nv = self.handles[i], self.nvml
            rows.append(gpu_row(i, self.names[i], _call(nv.nvmlDeviceGetUtilizationRates, h),
                                _call(nv.nvmlDeviceGetMemoryInfo, h), _call(nv.nvmlDeviceGetPowerUsage, h),
                                self._processes(h), pids))
        return rows
