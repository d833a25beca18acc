"""Reading profiles back: the profiles of a run, the one attached to each span, a profile's top
frames, and its file, resolved safely inside the run dir.

All functions take a connection from `rltrace.store.open(run_dir)`; paths stored in the run are
data, never trusted: `artefact_path` refuses any that would leave the run dir.
"""

from __future__ import annotations

from pathlib import Path

import duckdb

from rltrace._config import RltraceError

#: One row per profile with its top frame (most self time; for a dump, the innermost frame outside
#: Python's standard library: where the thread is stuck in your code); join spans on (trace_id, span_id).
PROFILES_FOR_SPANS_SQL = """
SELECT p.trace_id, p.span_id, p.profile_id, p.phase, p.step, p.process_id, p.role, p.rank,
       p.kind, p.trigger, p.status, p.message, p.reason, p.path, p.size_bytes, p.samples, p.inside_share, p.idle_share,
       f.frame AS top_frame, f.file AS top_file, f.line AS top_line, f.self_share AS top_self_share
FROM profiles p
LEFT JOIN (
    SELECT * FROM profile_frames
    QUALIFY row_number() OVER (PARTITION BY profile_id ORDER BY self_share DESC, rank) = 1
) f ON f.profile_id = p.profile_id
ORDER BY p.started_ns, p.profile_id
"""


class ProfileNotFoundError(RltraceError):
    """No profile (or more than one) matches the id given."""


class UnsafePathError(RltraceError):
    """A path stored in the run points outside the run dir."""


def _rows(con: duckdb.DuckDBPyConnection, sql: str, params: list | None = None) -> list[dict]:
    cur = con.execute(sql, params or [])
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row)) for row in cur.fetchall()]


def profiles_for_spans(con: duckdb.DuckDBPyConnection):
    """The profiles attached to spans, for reports: a pandas DataFrame.

    Returns:
        One row per profile: trace_id, span_id (the span it explains), profile_id, phase, step,
        process_id, role, rank, kind (pyspy_record / pyspy_dump / torch), trigger (slow / hang /
        window / manual), status, message, reason, path (relative to the run dir), size_bytes,
        samples, inside_share and idle_share (py-spy: see docs/profiling.md),
        and its top frame: top_frame, top_file, top_line, top_self_share (0..1); for a dump, the
        innermost frame outside Python's standard library (where the thread is stuck in your code).
        A span may have several (a recording and a hang dump).
    """
    return con.execute(PROFILES_FOR_SPANS_SQL).df()


def list_profiles(con: duckdb.DuckDBPyConnection) -> list[dict]:
    """Every profile with its top frame, oldest first (what `rltrace profile list` prints)."""
    return _rows(con, PROFILES_FOR_SPANS_SQL)


def get_profile(con: duckdb.DuckDBPyConnection, profile_id: str) -> dict:
    """The profile whose id is, or starts with, `profile_id` (like a git hash)."""
    if not profile_id:
        raise ProfileNotFoundError("give a profile id (see `rltrace profile list RUN_DIR`)")
    found = _rows(con, "SELECT * FROM profiles WHERE starts_with(profile_id, ?) ORDER BY profile_id", [profile_id])
    if not found:
        raise ProfileNotFoundError(
            f"no profile id starts with {profile_id!r}; `rltrace profile list RUN_DIR` lists them"
        )
    exact = [row for row in found if row["profile_id"] == profile_id]
    if len(found) > 1 and not exact:
        ids = ", ".join(row["profile_id"] for row in found[:5])
        raise ProfileNotFoundError(f"{profile_id!r} matches {len(found)} profiles ({ids}); give more characters")
    return (exact or found)[0]


def top_frames(con: duckdb.DuckDBPyConnection, profile_id: str) -> list[dict]:
    """The stored top frames of one profile, by rank (0 = most self time; a dump: innermost)."""
    return _rows(con, "SELECT * FROM profile_frames WHERE profile_id = ? ORDER BY rank", [profile_id])


def profile_stacks(con: duckdb.DuckDBPyConnection, profile_id: str) -> list[tuple[list[str], int]]:
    """The folded stacks stored with a py-spy recording, [(frames outermost first, samples)], most
    sampled first; [] when none were stored (a dump, torch, or a run recorded before they were)."""
    try:
        found = con.execute("SELECT stacks FROM profiles WHERE profile_id = ? AND stacks IS NOT NULL", [profile_id]).fetchall()
    except duckdb.BinderException:  # no part of this run has the column
        return []
    out = []
    for line in (found[0][0] if found else "").splitlines():
        stack, _, n = line.rpartition(" ")
        if stack and n.isdigit():
            out.append((stack.split(";"), int(n)))
    return out


def artefact_path(run_dir: str | Path, stored: str | None) -> Path | None:
    """The absolute path of a profile file stored as `stored`, checked to stay inside the run dir."""
    if not stored:
        return None
    root = Path(run_dir).resolve()
    relative = Path(stored)
    if relative.is_absolute() or ".." in relative.parts:
        raise UnsafePathError(f"profile path {stored!r} in {root} is not a plain path inside the run dir; refusing it")
    path = (root / relative).resolve()
    if not path.is_relative_to(root):
        raise UnsafePathError(f"profile path {stored!r} leads outside the run dir {root} (a symlink?); refusing it")
    return path


def inside_text(profile: dict) -> str:
    """What of a py-spy recording is the phase's, in words: '96% inside the phase, blocked 91%' ('' for other kinds).

    Blocked: the phase's thread was neither running nor waiting for a CPU (a sleep, a lock, I/O);
    py-spy's own pauses count too, so busy code reads 10-40 %."""
    from rltrace.analysis._format import missing, share_text

    inside, idle = profile.get("inside_share"), profile.get("idle_share")
    parts = [] if missing(inside) else [f"{share_text(inside)} inside the phase"]
    if not missing(idle):
        parts.append(f"blocked {share_text(idle)}")
    return ", ".join(parts)


def how_to_open(kind: str, path: Path) -> str:
    """One line saying which viewer opens this kind of file."""
    if kind == "pyspy_record":
        return (f"Perfetto: open https://ui.perfetto.dev and drop the file (or drop it on https://www.speedscope.app); "
                f"{path.name} is a Chrome trace of every thread")
    if kind == "torch":
        return (
            f"Perfetto: open https://ui.perfetto.dev and drop the file (or chrome://tracing); {path.name} is gzip JSON"
        )
    return f"plain text: `less {path}`"
