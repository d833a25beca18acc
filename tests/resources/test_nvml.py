"""NVML answers to `resources` rows, and which devices a process samples.

No GPU here: `_FakeNvml` is a stand-in with pynvml's call names and return shapes (utilisation
in %, memory in bytes, power in milliwatts), so only the conversion is tested; the real library
is used by `open_probe()` on a machine with an NVIDIA driver.
"""

from __future__ import annotations

from types import SimpleNamespace as NS

from rltrace.resources import nvml


class _NotSupported(Exception):
    pass


class _FakeNvml:
    """Stand-in for pynvml: two devices; process 4242 runs on device 1; device 0 reports no power."""

    def __init__(self, count=2, fail_init=False):
        self.count, self.fail_init = count, fail_init

    def nvmlInit(self):
        if self.fail_init:
            raise RuntimeError("NVML Shared Library Not Found")

    def nvmlDeviceGetCount(self):
        return self.count

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetName(self, h):
        return b"NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetUUID(self, h):
        return f"GPU-0000000{h}-aaaa"

    def nvmlDeviceGetUtilizationRates(self, h):
        return NS(gpu=[7, 93][h], memory=10)

    def nvmlDeviceGetMemoryInfo(self, h):
        return NS(used=[1 << 30, 40 << 30][h], total=80 << 30, free=0)

    def nvmlDeviceGetPowerUsage(self, h):
        if h == 0:
            raise _NotSupported("Not Supported")
        return 412_345  # mW

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [NS(pid=4242, usedGpuMemory=30 << 30), NS(pid=99, usedGpuMemory=None)] if h == 1 else []

    def nvmlDeviceGetGraphicsRunningProcesses(self, h):
        return []


def test_gpu_row_converts_units():
    row = nvml.gpu_row(3, "NVIDIA H200", NS(gpu=4), NS(used=5 << 30, total=141 << 30), 250_500,
                       [NS(pid=1, usedGpuMemory=2 << 30), NS(pid=2, usedGpuMemory=1 << 30), NS(pid=7, usedGpuMemory=None)],
                       {1, 2, 7})
    assert row == {"kind": "gpu", "device": 3, "device_name": "NVIDIA H200", "util_pct": 4.0, "mem_bytes": 5 << 30,
                   "mem_total_bytes": 141 << 30, "process_mem_bytes": 3 << 30, "power_w": 250.5}


def test_unsupported_queries_become_nulls():
    row = nvml.gpu_row(0, None, None, None, None, None, {1})
    assert row["util_pct"] is None and row["mem_bytes"] is None and row["power_w"] is None
    assert row["process_mem_bytes"] is None


def test_the_probe_samples_only_the_devices_this_process_uses(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    probe, reason = nvml.open_probe(_FakeNvml())
    assert reason is None
    rows = probe.sample({4242})
    assert [r["device"] for r in rows] == [1]
    assert rows[0]["util_pct"] == 93.0 and rows[0]["power_w"] == 412.345 and rows[0]["process_mem_bytes"] == 30 << 30
    assert rows[0]["device_name"] == "NVIDIA H100 80GB HBM3"


def test_before_it_has_a_context_the_visible_devices_are_sampled(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-00000000")
    probe, _ = nvml.open_probe(_FakeNvml())
    rows = probe.sample({1})
    assert [r["device"] for r in rows] == [0] and rows[0]["power_w"] is None and rows[0]["util_pct"] == 7.0
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert nvml.open_probe(_FakeNvml())[0].sample({1}) == []  # nobody here uses a GPU: nothing is ours


def test_visible_devices_reads_indices_and_uuids():
    uuids = ["GPU-aaa", "GPU-bbb", "GPU-ccc"]
    assert nvml.visible_devices("2,0", uuids) == {0, 2}
    assert nvml.visible_devices("GPU-bb", uuids) == {1}
    assert nvml.visible_devices("7", uuids) == set()
    assert nvml.visible_devices(None, uuids) == set()


def test_no_driver_or_no_gpu_gives_a_reason():
    probe, reason = nvml.open_probe(_FakeNvml(fail_init=True))
    assert probe is None and "NVML is not available" in reason and "Shared Library" in reason
    probe, reason = nvml.open_probe(_FakeNvml(count=0))
    assert probe is None and "no NVIDIA GPU" in reason


def test_the_real_library_here():
    """On this machine: a GPU is sampled, or the reason it is not is given (never an exception)."""
    probe, reason = nvml.open_probe()
    assert (probe is None) == (reason is not None)
