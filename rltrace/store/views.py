"""Reading a run: check every part, then give DuckDB views over them.

`open(run_dir)` returns an in-memory DuckDB connection with one view per table (`spans`,
`metrics`, `samples`, `processes`, …) over a snapshot of the parts present when it was called.
Nothing is written and no `.duckdb` file is held, so any number of readers can open a run
while its writers run. Every part's footer is checked first; a bad part is a `StoreError`
naming the file (or, with `skip_corrupt=True`, a warning naming it).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from rltrace import _names
from rltrace.store.layout import StoreError, read_manifest

logger = logging.getLogger("rltrace")


class CorruptPartError(StoreError):
    """A part file cannot be used: truncated, foreign, missing columns or from a newer rltrace."""


@dataclass
class Part:
    path: Path
    rows: int
    size: int
    replaces: tuple[str, ...] = ()


@dataclass
class Snapshot:
    """The readable parts of a run at one moment, table by table."""

    run_dir: Path
    manifest: dict
    parts: dict[str, list[Part]] = field(default_factory=dict)
    replaced: list[Path] = field(default_factory=list)  # parts a compacted part supersedes
    skipped: list[str] = field(default_factory=list)  # "path: why" for parts skipped as corrupt


def _check_part(path: Path, table: _names.Table) -> Part:
    try:
        meta = pq.read_metadata(path)
    except FileNotFoundError:
        raise
    except (OSError, pa.ArrowException) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CorruptPartError(f"{path}: truncated or not a Parquet file ({reason})") from None
    kv = meta.metadata or {}
    found = kv.get(_names.META_TABLE)
    if found is None:
        raise CorruptPartError(f"{path}: not an rltrace part (no rltrace metadata; a foreign Parquet file?)")
    if found.decode() != table.name:
        raise CorruptPartError(f"{path}: holds table {found.decode()!r}, expected {table.name!r} in {table.folder}/")
    try:
        version = int(kv.get(_names.META_VERSION, b"0"))
    except ValueError:
        raise CorruptPartError(f"{path}: unreadable schema version {kv.get(_names.META_VERSION)!r}") from None
    if version > table.version:
        raise CorruptPartError(
            f"{path}: written with {table.name} schema version {version}, newer than this rltrace reads "
            f"({table.version}); upgrade rltrace (pip install -U rltrace)"
        )
    names = set(meta.schema.names)
    missing = [c for c in table.required if c not in names]
    if missing:
        raise CorruptPartError(f"{path}: missing required column(s) {', '.join(missing)} of table {table.name}")
    replaces = tuple(json.loads(kv[_names.META_REPLACES])) if _names.META_REPLACES in kv else ()
    return Part(path=path, rows=meta.num_rows, size=path.stat().st_size, replaces=replaces)


def scan(run_dir: str | Path, *, skip_corrupt: bool = False, tables: dict[str, _names.Table] | None = None) -> Snapshot:
    """Check every part of every table and return the readable ones."""
    run_dir = Path(run_dir)
    snap = Snapshot(run_dir=run_dir, manifest=read_manifest(run_dir))
    for table in (tables or _names.TABLES).values():
        for attempt in range(5):
            try:
                parts, replaced = _scan_table(run_dir / table.folder, table, skip_corrupt, snap.skipped)
                break
            except FileNotFoundError:
                continue  # a compaction removed a part while we read: list again
        else:
            raise StoreError(f"{run_dir / table.folder}: parts keep disappearing while reading; retry")
        snap.parts[table.name] = parts
        snap.replaced.extend(replaced)
    return snap


def _scan_table(folder: Path, table: _names.Table, skip_corrupt: bool, skipped: list[str]):
    if not folder.is_dir():
        return [], []
    parts = []
    for path in sorted(folder.glob("*.parquet")):
        if path.name.startswith("."):
            continue
        try:
            parts.append(_check_part(path, table))
        except CorruptPartError as exc:
            if not skip_corrupt:
                raise
            logger.warning("rltrace: skipping %s", exc)
            skipped.append(str(exc))
    superseded = {name for part in parts for name in part.replaces}
    live = [p for p in parts if p.path.name not in superseded]
    replaced = [p.path for p in parts if p.path.name in superseded]
    return live, replaced


def _sql_list(paths: list[Path]) -> str:
    return "[" + ", ".join("'" + str(p).replace("'", "''") + "'" for p in paths) + "]"


def _source(con: duckdb.DuckDBPyConnection, table: _names.Table, parts: list[Part]) -> str:
    """SQL for all rows of a table: its parts, unioned with an empty table of the full schema so
    that every documented column exists even when no part has it yet."""
    empty = f"_empty_{table.name}"
    con.register("_schema", table.schema.empty_table())
    con.execute(f"CREATE TABLE {empty} AS SELECT * FROM _schema")  # a table, so cursors see it too
    con.unregister("_schema")
    if not parts:
        return f"SELECT * FROM {empty}"
    files = _sql_list([p.path for p in parts])
    return f"SELECT * FROM read_parquet({files}, union_by_name=true) UNION ALL BY NAME SELECT * FROM {empty}"


def connect(snap: Snapshot) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with a view per table of the snapshot."""
    con = duckdb.connect(":memory:")
    con.execute("SET parquet_metadata_cache = true")
    con.execute("""CREATE MACRO attr(attributes, key) AS json_extract_string(attributes, '$."' || key || '"')""")
    done = set()
    if "spans" in snap.parts:
        finished = _source(con, _names.SPANS, snap.parts["spans"])
        still_open = _source(con, _names.OPEN_SPANS, snap.parts.get("open_spans", []))
        con.execute(
            f"""CREATE VIEW spans AS
            SELECT *, (end_ns - start_ns) / 1e9 AS duration_s, false AS is_open FROM ({finished})
            UNION ALL BY NAME
            SELECT *, CAST(NULL AS DOUBLE) AS duration_s, true AS is_open FROM ({still_open})"""
        )
        done.update(("spans", "open_spans"))
    if "samples" in snap.parts:
        con.execute(
            f"CREATE VIEW samples AS SELECT *, train_version - weight_version AS staleness "
            f"FROM ({_source(con, _names.SAMPLES, snap.parts['samples'])})"
        )
        done.add("samples")
    for name, parts in snap.parts.items():
        if name not in done:
            con.execute(f"CREATE VIEW {name} AS {_source(con, _names.TABLES[name], parts)}")
    return con


def open(run_dir: str | Path, *, skip_corrupt: bool = False) -> duckdb.DuckDBPyConnection:  # noqa: A001
    """A read-only DuckDB connection over a snapshot of the run in `run_dir`.

    Views: `spans` (finished and open spans; `duration_s`, `is_open`), `metrics` (long
    format: step, name, value), `samples` (one row per sample; `staleness`), `processes`.
    The macro `attr(attributes, 'rl.bytes')` reads one span attribute. Reopen to see parts
    written since. Raises `StoreError` naming the path when the dir or a part is unusable.
    """
    return connect(scan(run_dir, skip_corrupt=skip_corrupt))
