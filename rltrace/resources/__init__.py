"""Utilisation under every phase: a sampler thread per process that records what the hardware did.

Off by default; `rltrace.init(..., resources=True)` or `RLTRACE_RESOURCES=1` turns it on, and
`RLTRACE_RESOURCES_INTERVAL` sets the seconds between samples (default 1). Each sample is one row
per device in the `resources` table: the process's CPU use and resident memory, and for each
NVIDIA GPU the process uses, the device's utilisation, memory and power (NVML). Rows go through
the run's background writer, like metrics. `rltrace.analysis.phase_resources` attributes them to
phases. See docs/store.md.
"""

from rltrace.resources.sampler import Sampler, start

__all__ = ["Sampler", "start"]
