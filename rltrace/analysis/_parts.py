"""What reports need from every span, computed once per span part and kept on this machine.

A span part never changes once written, so each thing a report would otherwise scan every span
for (per-step counts, engine request fields out of the attribute text) is
kept per part in a sidecar file beside the summary cache (`<run id>.<kind>.parquet`, listing
the parts it covers). A report reads the sidecar for the parts it lists and scans only the
others: on a live run of 100M spans, the last flushes. A sidecar that cannot be read or written
never fails a report; it is computed again.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Callable
from contextvars import ContextVar
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from rltrace import _names
from rltrace._config import resolve
from rltrace.store import views
from rltrace._names import safe_name

logger = logging.getLogger("rltrace")
PARTS_KEY = b"rltrace.span_parts"  # footer of a cache file: JSON [[name, rows, size], ...] of the span parts it covers
_PARTS = "_rltrace_span_parts"  # the connection's span parts: name, rows, size, path (`store.views.connect`)


def has_table(con, name: str) -> bool:
    """Whether the connection has that table or view (a report asks ~20 times: a catalog lookup
    costs a third of a `duckdb_tables()` query)."""
    try:
        con.execute(f'SELECT 1 FROM "{name}" LIMIT 0')
    except duckdb.CatalogException:
        return False
    return True


def meta(con, key: str) -> str | None:
    """A fact about the connection's snapshot (`store.views.connect`): run_id, spans_digest, summary_of."""
    if not has_table(con, "_rltrace_meta"):
        return None
    rows = con.execute("SELECT value FROM _rltrace_meta WHERE key = ?", [key]).fetchall()
    return rows[0][0] if rows else None


STORED = "report_cache"  # a run's folder of what its first report computes, stored by its last writer at exit
_ROOT: ContextVar[Path | None] = ContextVar("rltrace_cache_root", default=None)


@contextlib.contextmanager
def cache_root(folder: Path):
    """Within this block, cache files are read and written in `folder` (`analysis.stored`: the run's own)."""
    token = _ROOT.set(Path(folder))
    try:
        yield
    finally:
        _ROOT.reset(token)


def _file_name(rid: str, kind: str) -> str:
    return f"{safe_name(rid)}{'' if kind == 'summary' else '.' + kind}.parquet"


def cache_file(con, kind: str = "summary") -> Path | None:
    """The run's cache file of that kind (`summary`: per-step summaries; other kinds: per-part
    sidecars), or None when the run has no id."""
    rid = meta(con, "run_id")
    if not rid:
        return None
    root = _ROOT.get() or resolve("summary_cache_dir")
    root = Path(root) if root else Path(os.path.expanduser("~/.cache/rltrace/summaries"))
    return root / _file_name(rid, kind)


def stored_files(con, kind: str = "summary") -> list[Path]:
    """The cache files of that kind stored in the run (`analysis.stored`: a main file and the
    additions a resumed run's store wrote beside it, newest first), read after this machine's own
    files, so a machine that never reported on the run starts from them."""
    rid, run_dir = meta(con, "run_id"), meta(con, "run_dir")
    if not rid or not run_dir or "://" in run_dir:
        return []
    main = Path(run_dir) / STORED / _file_name(rid, kind)
    if main == cache_file(con, kind) or not main.is_file():
        return []
    return [*sorted(main.parent.glob(f"{main.stem}.new-*.parquet"), reverse=True), main]


def write_cache(path: Path, table: Callable[[], pa.Table]) -> bool:
    """Replace a cache file at once (readers see the old file or the new one); a cache that cannot
    be written never fails a report. `table` builds the Arrow table to write."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table(), tmp)
        os.replace(tmp, path)
        return True
    except (OSError, pa.ArrowException) as exc:
        logger.debug("rltrace: could not write the cache file %s: %s", path, exc)
        with contextlib.suppress(OSError):
            tmp.unlink()
        return False


def parts_now(con) -> set[tuple[str, int, int]]:
    return {(n, r, z) for n, r, z in con.execute(f"SELECT name, rows, size FROM {_PARTS}").fetchall()}


def with_parts(table: pa.Table, parts: set[tuple[str, int, int]]) -> pa.Table:
    """`table` with the list of span parts it covers in its footer."""
    meta = dict(table.schema.metadata or {})
    meta[PARTS_KEY] = json.dumps(sorted(parts)).encode()
    return table.replace_schema_metadata(meta)


def listed_parts(schema: pa.Schema) -> set[tuple[str, int, int]]:
    """The span parts a cache file's footer lists (KeyError/ValueError when it lists none)."""
    return {tuple(p) for p in json.loads((schema.metadata or {})[PARTS_KEY])}


ADDITIONS = 16  # cache files of new rows kept beside a main one before they are folded into it


def cache_files(con, kind: str = "summary") -> tuple[Path | None, list[Path]]:
    """(the main cache file of that kind, the additions written beside it, newest first): a
    report that met little that is new writes only that, as an addition."""
    main = cache_file(con, kind)
    if main is None:
        return None, []
    return main, sorted(main.parent.glob(f"{main.stem}.new-*.parquet"), reverse=True)


def table(con, kind: str, schema: pa.Schema, select: str, digests: int = 0, only: str | None = None,
          stored: tuple[str, str] | None = None) -> str:
    """The name of a temporary table holding, for every span part of the connection, the rows
    `select` gives for it; computed once per connection, from the sidecar and the new parts.

    `schema` starts with part, rows, size (the part's name, rows and bytes: a part rewritten under
    the same name is another part). `select` is SQL over `part_spans` (the finished spans of the
    parts to scan, with their file in `filename`) returning `filename` and the other columns: rows
    per span, or sums, minima and maxima per part (a part merged from parts seen before gets their
    rows, unscanned: merging never changes spans).
    With `digests` (a version), a part with a per-part summary of at least that version in force is
    read from it (its rows have the analysis columns, `count` and `total_ns`; a span's own rows get
    count 1 and its duration); 0 reads every part's spans.
    The sidecar is a file per report that met new parts (a live run's report writes only its
    new parts' rows), folded into one file after `ADDITIONS` of them. `only`: SQL over the columns
    of the span-parts table (`store.views.connect`) true for the parts worth scanning; the others
    give no rows (what their writer recorded in the footer says `select` finds nothing there).
    `stored`: (a column of the span-parts table naming a file of the rows `select` gives for the
    part, which its writer stored; the version they must have, in column `<column>_sql`): such
    parts are read from those files, never scanned, and left out of the sidecar (the file is there
    for the next report too).
    """
    name = f"_rltrace_part_{kind}"
    if has_table(con, name):
        return name
    con.register("_rltrace_schema", schema.empty_table())
    con.execute(f"CREATE TEMP TABLE IF NOT EXISTS {name} AS SELECT * FROM _rltrace_schema")
    con.execute(f"CREATE TEMP TABLE IF NOT EXISTS {name}_inputs AS SELECT * FROM _rltrace_schema")
    con.unregister("_rltrace_schema")
    main, additions = cache_files(con, kind)
    files = [] if main is None else [*additions, main, *stored_files(con, kind)]
    now, taken, main_read = parts_now(con), set(), False
    merged = replaced(con)  # a part merged from others holds their rows: theirs, cached, are its
    inputs = {n for p in now if p[0] in merged for n in merged[p[0]]}
    taken_inputs: set[str] = set()
    for path in files:  # newest first; each part's rows from one file
        if not path.is_file():
            continue
        try:
            table = views.read_whole(path)  # one read: a concurrent report may replace the file
            listed = listed_parts(table.schema)
            mine = (listed & now) - taken
            theirs = {p for p in listed if p[0] in inputs and p[0] not in taken_inputs}
            rows_ = table.select(schema.names).cast(schema)
            if mine:
                _insert(con, name, rows_, None if mine == listed else mine)
            if theirs:
                _insert(con, f"{name}_inputs", rows_, theirs)
        except (OSError, KeyError, ValueError, TypeError, pa.ArrowException, duckdb.Error) as exc:
            logger.debug("rltrace: ignoring the cache file %s: %s", path, exc)
            continue
        taken |= mine
        taken_inputs |= {p[0] for p in theirs}
        main_read |= path == main
    new = now - taken
    for part in sorted(new):
        if part[0] in merged and set(merged[part[0]]) <= taken_inputs:
            rest = ", ".join(schema.names[3:])
            con.execute(f"INSERT INTO {name} SELECT ?, ?, ?, {rest} FROM {name}_inputs WHERE list_contains(?, part)",
                        [*part, merged[part[0]]])
            taken.add(part)
    con.execute(f"DROP TABLE {name}_inputs")
    scan = now - taken
    from_writers = _scan(con, name, schema, select, scan, digests, only, stored) if scan else set()
    if new - from_writers and main is not None:
        _save(con, name, schema, main, [f for f in files if f != main], main_read, new - from_writers, now - from_writers)
    return name


def replaced(con) -> dict[str, list[str]]:
    """For each span part of the connection merged from others: the names of the parts it replaces."""
    return {n: list(r) for n, r in con.execute(f"SELECT name, replaces FROM {_PARTS} WHERE len(replaces) > 0").fetchall()}


def _insert(con, name: str, rows: pa.Table, parts: set[tuple[str, int, int]] | None) -> None:
    """Insert the `rows` of these parts (a sidecar file may also hold parts gone since), or all
    of them (`parts` None: every part the file lists is wanted, no join needed)."""
    con.register("_rltrace_known", rows)
    try:
        if parts is None:
            con.execute(f"INSERT INTO {name} SELECT * FROM _rltrace_known")
            return
        con.register("_rltrace_parts", _parts_table(parts))
        try:
            con.execute(f"INSERT INTO {name} SELECT k.* FROM _rltrace_known k SEMI JOIN _rltrace_parts p "
                        "ON k.part = p.part AND k.rows = p.rows AND k.size = p.size")
        finally:
            con.unregister("_rltrace_parts")
    finally:
        con.unregister("_rltrace_known")


def _scan(con, name: str, schema: pa.Schema, select: str, parts: set[tuple[str, int, int]], digests: int,
          only: str | None = None, stored: tuple[str, str] | None = None) -> set[tuple[str, int, int]]:
    """Rows of these parts into the table: from their writers' files (`stored`), their summaries
    (`digests`) or their spans. Returns the parts read from their writers' files."""
    column, version = stored if stored else ("NULL", None)
    con.register("_rltrace_parts", _parts_table(parts))
    try:
        found = con.execute(
            f"SELECT path, rows, size, version, CASE WHEN ? > 0 AND digest_version >= ? THEN digest END, "
            f"CASE WHEN {column + '_sql' if stored else 'NULL'} = ? THEN {column} END, name "
            f"FROM {_PARTS} s SEMI JOIN _rltrace_parts p ON s.name = p.part "
            f"AND s.rows = p.rows AND s.size = p.size WHERE {only or 'true'}", [digests, digests, version]).fetchall()
    finally:
        con.unregister("_rltrace_parts")
    written = [Path(w) for *_, w, _ in found if w]
    from_writers = {(n, r, z) for _, r, z, _, _, w, n in found if w}
    if written:  # named like their span part: filename gives the part's name
        rest = ", ".join(f"f.{c}" for c in schema.names[3:])
        con.execute(f"""INSERT INTO {name} SELECT p.name, p.rows, p.size, {rest}
            FROM read_parquet({views.sql_paths(written)}, filename = true) f
            JOIN {_PARTS} p ON parse_filename(f.filename) = p.name""")
    found = [row[:5] for row in found if not row[5]]
    raw = [views.Part(path=Path(p), rows=r, size=z, version=v) for p, r, z, v, d in found if not d]
    sources = []
    if raw:
        counted = ", CAST(1 AS BIGINT) AS count, end_ns - start_ns AS total_ns" if digests else ""
        sources.append(f"SELECT *{counted} FROM ({views.parts_sql(_names.SPANS, raw, ', filename = true')})")
    summaries = [Path(d) for *_, d in found if d]
    if summaries:  # named like their span part: filename gives the part's name
        sources.append(f"SELECT * FROM read_parquet({views.sql_paths(summaries)}, filename = true, union_by_name = true)")
    if not sources:  # every part given is one `only` leaves out, or whose writer stored its rows
        return from_writers
    rest = ", ".join(f"f.{c}" for c in schema.names[3:])
    con.execute(f"""INSERT INTO {name}
        WITH part_spans AS ({" UNION ALL BY NAME ".join(sources)})
        SELECT p.name, p.rows, p.size, {rest} FROM ({select}) f
        JOIN {_PARTS} p ON parse_filename(f.filename) = p.name""")
    return from_writers


def _save(con, name: str, schema: pa.Schema, main: Path, additions: list[Path], main_read: bool, new: set,
          kept: set) -> None:
    """Write the new parts' rows as an addition to the main file, or the rows of every part `kept`
    into the main file when it could not be read or there are `ADDITIONS` additions (then removed)."""
    def rows_of(parts: set) -> pa.Table:
        con.register("_rltrace_parts", _parts_table(parts))
        try:
            rows = con.sql(f"SELECT t.* FROM {name} t SEMI JOIN _rltrace_parts p ON t.part = p.part "
                           "AND t.rows = p.rows AND t.size = p.size").to_arrow_table().cast(schema)
        finally:
            con.unregister("_rltrace_parts")
        return with_parts(rows, parts)

    additions = [f for f in additions if f.is_file()]
    if main_read and len(additions) < ADDITIONS:
        rows = rows_of(new)
        write_cache(main.with_name(f"{main.stem}.new-{time.time_ns():020d}-{os.getpid()}.parquet"), lambda: rows)
        return
    if write_cache(main, lambda: rows_of(kept)):
        for path in additions:  # folded into the main file
            with contextlib.suppress(OSError):
                path.unlink()


def _parts_table(parts: set[tuple[str, int, int]]) -> pa.Table:
    ordered = sorted(parts)
    return pa.table({"part": pa.array([p[0] for p in ordered], pa.string()),
                     "rows": pa.array([p[1] for p in ordered], pa.int64()),
                     "size": pa.array([p[2] for p in ordered], pa.int64())})
