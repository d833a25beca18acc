"""Profiles attached to slow stages: py-spy and torch.profiler captures tied to the spans they explain.

Turn it on without code changes (`RLTRACE_PROFILE_SLOW=3`, `RLTRACE_HANG_TIMEOUT=300`, ...) or:

    rltrace.init("runs/exp1", profile={"slow": 3, "hang_timeout": 300, "torch": ["train:5-7"]})

then `rltrace profile list runs/exp1`. See docs/profiling.md. `rltrace.init` imports this
package only when a profiling setting is given.
"""

from __future__ import annotations

import weakref
from typing import Any, Mapping

from opentelemetry.trace import get_current_span

from rltrace.profiling.policy import ProfilePolicy, TorchWindow, resolve_policy
from rltrace.profiling.query import (
    PROFILES_FOR_SPANS_SQL,
    ProfileNotFoundError,
    UnsafePathError,
    artefact_path,
    get_profile,
    list_profiles,
    profile_stacks,
    profiles_for_spans,
    top_frames,
)
from rltrace.profiling.watchdog import Watchdog


__all__ = [
    "ProfilePolicy",
    "TorchWindow",
    "resolve_policy",
    "arm",
    "dump_stacks",
    "watchdog_of",
    "profiles_for_spans",
    "PROFILES_FOR_SPANS_SQL",
    "list_profiles",
    "get_profile",
    "profile_stacks",
    "top_frames",
    "artefact_path",
    "ProfileNotFoundError",
    "UnsafePathError",
]

_armed: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # run -> its watchdog


def arm(
    run, profile: ProfilePolicy | Mapping[str, Any] | bool | None = None, *, force: bool = False
) -> Watchdog | None:
    """Watch `run`'s phases by `profile` (resolved against the environment). Returns the watchdog,
    or None when the policy has nothing to trigger (unless `force`). Arming a run twice returns
    the first watchdog."""
    if run in _armed:
        return _armed[run]
    policy = resolve_policy(profile)
    if not policy.armed and not force:
        return None
    watchdog = Watchdog(run.run_dir, run.process, run.rank, policy)
    run.add_span_processor(watchdog)
    if watchdog.has_windows:  # a window stops inside its phase; without windows the hot path has no hook
        run.ending_hooks.append(watchdog.before_end)
    _armed[run] = watchdog
    return watchdog


def watchdog_of(run) -> Watchdog | None:
    """The watchdog armed on `run` (None if profiling is not armed there)."""
    return _armed.get(run) if run is not None else None


def dump_stacks(reason: str = "asked for by rltrace.profiling.dump_stacks()") -> str | None:
    """Dump every thread's stack now (py-spy dump, in the background), attached to the running phase.

    Returns the profile id, or None when no phase is running or the process took its maximum
    of profiles. Arms profiling (with the environment's policy) if `init` did not.
    """
    from rltrace.api import recording_run

    run, span = recording_run(), get_current_span()
    if run is None or not span.is_recording():
        return None
    return arm(run, force=True).dump_now(span, reason)
