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
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, TypeVar

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from rltrace import _names
from rltrace.store import layout
from rltrace.store.layout import StoreError

logger = logging.getLogger("rltrace")
T = TypeVar("T")


class CorruptPartError(StoreError):
    """A part file cannot be used: truncated, foreign, missing columns or from a newer rltrace."""


def read_whole(path: str | Path, **kwargs) -> pa.Table:
    """A Parquet file read through one open file handle, so a file that its writer replaces
    (`os.replace`) meanwhile is read as its old or its new version whole. `pq.read_table(path)`
    opens the path more than once and can mix the two ("Column cannot have more than one
    dictionary"). Keyword arguments go to `pq.read_table`."""
    with pa.OSFile(str(path)) as handle:
        return pq.read_table(handle, **kwargs)


@dataclass
class Part:
    path: Path
    rows: int
    size: int
    replaces: tuple[str, ...] = ()
    summary_of: str | None = None  # step_summary parts: digest of the span parts they were computed from
    version: int = 1  # the schema version of its table that the part was written with
    digest_of: tuple[str, int] | None = None  # span_digest/span_requests parts: (name, rows) of their span part
    engine_rows: bool | None = None  # spans parts: whether a span may be an engine request (None: not recorded)
    requests_sql: str | None = None  # span_requests parts: the version of the SQL that found them
    mismatch_missing: bool | None = None  # spans parts: whether a span may mark mismatch not recorded
    received_from: tuple[str, ...] = ()  # spans parts: the receiver or import sessions whose spans it holds


@dataclass
class Snapshot:
    """The readable parts of a run at one moment, table by table."""

    run_dir: Path
    manifest: dict
    parts: dict[str, list[Part]] = field(default_factory=dict)
    replaced: list[Path] = field(default_factory=list)  # parts a compacted part supersedes
    skipped: list[str] = field(default_factory=list)  # "path: why" for parts skipped as corrupt
    skip_corrupt: bool = False  # a part found unreadable later (when read at open) is skipped too


#: Tables whose parts rltrace writes with a fixed schema: a documented column of another type is refused.
_TYPED = ("spans", "open_spans", "metrics", "samples", "processes", "step_summary")


def _kind(typ: pa.DataType) -> str:
    if pa.types.is_dictionary(typ):
        typ = typ.value_type
    for name, test in (
        ("null", pa.types.is_null), ("bool", pa.types.is_boolean), ("int", pa.types.is_integer),
        ("float", pa.types.is_floating), ("text", lambda t: pa.types.is_string(t) or pa.types.is_large_string(t)),
        ("list", lambda t: pa.types.is_list(t) or pa.types.is_large_list(t)),
    ):
        if test(typ):
            return name
    return str(typ)


#: Columns whose type changed with a table's schema version: (table, column) -> the kind parts of
#: older versions hold (span parts of version 1: ids as hex text; read converted, `rltrace.store.ids`).
_OLDER = {("spans", "trace_id"): "text", ("spans", "span_id"): "text", ("spans", "parent_span_id"): "text",
          ("open_spans", "trace_id"): "text", ("open_spans", "span_id"): "text", ("open_spans", "parent_span_id"): "text"}


def _check_types(path: Path, table: _names.Table, schema: pa.Schema, version: int) -> None:
    """A documented column must hold its documented kind of value (ids: text or integers)."""
    if table.name not in _TYPED:
        return
    for field in schema:
        if field.name not in table.schema.names:
            continue
        found, wanted = _kind(field.type), _kind(table.schema.field(field.name).type)
        ok = {wanted, "null"}
        if field.name in _names.ID_COLUMNS and table.name == "samples":
            ok.add("int")  # parts written before ids were text
        if version < table.version and (table.name, field.name) in _OLDER:
            ok = {_OLDER[(table.name, field.name)], "null"}
        if found not in ok:
            raise CorruptPartError(
                f"{path}: column {field.name!r} holds {field.type}, but {table.name}.{field.name} is {table.schema.field(field.name).type}"
                " (a file written by another tool?)"
            )


def _check_part(path: Path, table: _names.Table, run_id: str | None = None) -> Part:
    try:
        meta = pq.read_metadata(path)
        schema = meta.schema.to_arrow_schema()
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
    owner = kv.get(_names.META_RUN_ID)
    if run_id is not None and owner is not None and owner.decode("utf-8", "replace") != run_id:
        raise CorruptPartError(
            f"{path}: belongs to run {owner.decode('utf-8', 'replace')}, not to this run ({run_id}); "
            "a part copied or linked in from another run"
        )
    _check_types(path, table, schema, version)
    replaces = ()
    if _names.META_REPLACES in kv:
        try:
            replaces = json.loads(kv[_names.META_REPLACES])
        except ValueError:
            replaces = None
        if not isinstance(replaces, list) or not all(isinstance(n, str) for n in replaces):
            raise CorruptPartError(f"{path}: unreadable {_names.META_REPLACES.decode()} footer key (not a JSON list of part names)")
        replaces = tuple(replaces)
    summary_of = kv.get(_names.META_SUMMARY_OF)
    digest_of = None
    if _names.META_DIGEST_OF in kv:
        try:
            name, rows = json.loads(kv[_names.META_DIGEST_OF])
            digest_of = (str(name), int(rows))
        except (ValueError, TypeError):
            raise CorruptPartError(f"{path}: unreadable {_names.META_DIGEST_OF.decode()} footer key") from None
    engine_rows = kv.get(_names.META_ENGINE_ROWS)
    requests_sql = kv.get(_names.META_REQUESTS_SQL)
    no_mismatch = kv.get(_names.META_MISMATCH_MISSING)
    from rltrace.store.parts import sessions_of

    return Part(path=path, rows=meta.num_rows, size=path.stat().st_size, replaces=replaces,
                summary_of=summary_of.decode("utf-8", "replace") if summary_of else None, version=version,
                digest_of=digest_of, engine_rows=None if engine_rows is None else engine_rows != b"0",
                requests_sql=requests_sql.decode("ascii", "replace") if requests_sql else None,
                mismatch_missing=None if no_mismatch is None else no_mismatch != b"0", received_from=sessions_of(kv))


def spans_digest(snap: Snapshot) -> str:
    """A digest of the finished-span parts of a snapshot (names, rows, sizes): equal digests, equal spans."""
    import hashlib

    listing = sorted((p.path.name, p.rows, p.size) for p in snap.parts.get("spans", []))
    return hashlib.sha256(json.dumps(listing).encode()).hexdigest()[:32]


def read_manifest(run_dir: str | Path) -> dict:
    """The manifest of a run on this machine or at an `s3://` address, or a `StoreError` saying
    why it is not a readable run."""
    from rltrace.store import objstore

    return objstore.read_manifest(run_dir) if objstore.is_uri(run_dir) else layout.read_manifest(Path(run_dir))


def scan(run_dir: str | Path, *, skip_corrupt: bool = False, tables: dict[str, _names.Table] | None = None,
         fold: bool = True, named: Callable[[str], bool] | None = None) -> Snapshot:
    """Check every part of every table and return the readable ones (an `s3://` run: of the
    local copy that `objstore.mirror` brings up to date first), with copies of a span folded
    (`fold_copies`; `compact` folds them itself, `fold=False`). `named`: check only the parts whose
    file name it accepts (a table whose parts are never merged, read by name: one frozen batch)."""
    from rltrace.store import objstore

    run_dir = objstore.mirror(run_dir) if objstore.is_uri(run_dir) else Path(run_dir)
    snap = Snapshot(run_dir=run_dir, manifest=layout.read_manifest(run_dir), skip_corrupt=skip_corrupt)
    for table in (tables or _names.TABLES).values():
        for attempt in range(SCANS):
            try:
                parts, replaced = _scan_table(run_dir / table.folder, table, skip_corrupt, snap.skipped, snap.manifest["run_id"],
                                              named)
                break
            except FileNotFoundError:  # a merge or a compaction removed a part while we read: list again, after a while
                time.sleep(backoff(attempt))
        else:
            raise StoreError(f"{run_dir / table.folder}: parts kept disappearing on {SCANS} listings over "
                             f"{sum(map(backoff, range(SCANS))):.0f} s (writers merging, or a compaction with a short "
                             "--grace); read again once they are done")
        snap.parts[table.name] = parts
        snap.replaced.extend(replaced)
    live = {(p.path.name, p.rows) for p in snap.parts.get("spans", [])}
    for sidecar in _names.SPAN_SIDECARS:  # a file beside a span part is in force while its span part is
        if sidecar.name in snap.parts:
            found = snap.parts[sidecar.name]
            snap.parts[sidecar.name] = [d for d in found if d.digest_of in live]
            snap.replaced.extend(d.path for d in found if d.digest_of not in live)
    if fold and snap.parts.get("spans"):
        fold_copies(snap)
    return snap


def fold_copies(snap: Snapshot) -> None:
    """Read each span (trace_id, span_id) once where copies can exist: in the span parts of two
    or more receiver or import sessions (`Part.received_from`; a resent OTLP request taken by two
    receivers, or by one started again after it forgot). The parts among them that hold a span
    another holds are replaced in this snapshot by one part of their rows, each identity once (what
    `rltrace compact` writes), kept in the local cache (`RLTRACE_CACHE_DIR`) for the next reader
    of the same parts. A process's own parts are never read for this: its writer stores a span once."""
    received = [p for p in snap.parts["spans"] if p.received_from]
    if len({s for p in received for s in p.received_from}) < 2:
        return
    import hashlib

    listing = sorted((p.path.name, p.rows, p.size) for p in received)
    key = hashlib.sha256(json.dumps(listing).encode()).hexdigest()[:24]
    folder = _folded_dir(snap)
    holding = _holding(received, folder / f"holding-{key}.json")
    if not holding:
        return
    parts = sorted((p for p in received if p.path.name in holding), key=lambda p: p.path.name)
    name = hashlib.sha256(json.dumps(sorted((p.path.name, p.rows, p.size) for p in parts)).encode()).hexdigest()[:24]
    path = folder / f"f-{name}.parquet"
    if not path.exists():
        _write_folded(parts, path)
    folded = _check_part(path, _names.SPANS)
    folded.received_from = tuple(sorted({s for p in parts for s in p.received_from}))
    snap.parts["spans"] = [p for p in snap.parts["spans"] if p.path.name not in holding] + [folded]
    for sidecar in _names.SPAN_SIDECARS:  # theirs describe rows with copies: the folded part is summarised anew
        if sidecar.name in snap.parts:
            snap.parts[sidecar.name] = [d for d in snap.parts[sidecar.name] if d.digest_of[0] not in holding]


def _folded_dir(snap: Snapshot) -> Path:
    from rltrace._config import resolve
    from rltrace._names import safe_name

    root = resolve("cache_dir")
    root = Path(root) if root else Path.home() / ".cache" / "rltrace" / "runs"
    folder = root / ".folded" / safe_name(snap.manifest.get("run_id") or "run")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        return folder
    except OSError:  # no cache here (a read-only home): this process's temp folder
        import tempfile

        folder = Path(tempfile.gettempdir()) / f"rltrace-folded-{os.getuid()}" / folder.name
        folder.mkdir(parents=True, exist_ok=True)
        return folder


def holding_copies(parts: list[Part]) -> set[Path]:
    """The span parts that hold a span (trace_id, span_id) also held by another of `parts`, or twice
    (left by a resent export, or by an older rltrace): `compact` merges them into one part."""
    from rltrace.store import ids

    if not parts:
        return set()
    con = duckdb.connect(":memory:")
    try:
        for macro in ids.SQL_MACROS:
            con.execute(macro)
        con.execute(f"CREATE TEMP VIEW s AS {parts_sql(_names.SPANS, parts, ', filename=true')}")
        found = con.execute("""SELECT DISTINCT filename FROM s JOIN (SELECT trace_id, span_id FROM s GROUP BY ALL
                               HAVING count(*) > 1) USING (trace_id, span_id)""").fetchall()
    finally:
        con.close()
    return {Path(f) for (f,) in found}


def _holding(received: list[Part], remembered: Path) -> set[str]:
    """Names of the parts among `received` holding a span another (or the same) part holds: one
    GROUP BY over their ids (`holding_copies`), remembered for this listing."""
    try:
        return set(json.loads(remembered.read_text()))
    except (OSError, ValueError):
        pass
    found = sorted(p.name for p in holding_copies(received))
    try:
        tmp = remembered.with_name(f".{remembered.name}.{os.getpid()}")
        tmp.write_text(json.dumps(found))
        os.replace(tmp, remembered)
    except OSError:
        pass
    return set(found)


def _write_folded(parts: list[Part], path: Path) -> None:
    """The rows of `parts` with each identity once (its first copy, `rows.first_of_each`), as
    a part of the current schema, written whole (temp name, then `os.replace`)."""
    import pyarrow.compute as pc

    from rltrace.store import rows

    tables = [upgrade(_names.SPANS, read_whole(p.path), p.version) for p in parts]
    merged = rows.concat(tables)
    keys = _names.COMPACTABLE[_names.SPANS.name]
    merged = rows.first_of_each(merged.take(pc.sort_indices(merged, sort_keys=[(k, "ascending") for k in keys])))
    meta = {_names.META_TABLE: _names.SPANS.name.encode(), _names.META_VERSION: str(_names.SPANS.version).encode()}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        pq.write_table(merged.replace_schema_metadata(meta), tmp, compression="zstd")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


SCANS = 10  # listings of a table whose parts vanish under the reader, ~6 s in all (`backoff`)


def backoff(attempt: int) -> float:
    """Seconds to wait before read `attempt + 2` of parts that vanished: 0.02 s doubling, at most 2 s."""
    return min(0.02 * 2 ** attempt, 2.0)


def vanished(exc: BaseException) -> bool:
    """Whether a read failed because a part it listed is gone: its writer merged it into a larger
    part (deleted after `RLTRACE_MERGE_GRACE`), or a compaction replaced it, while it read."""
    text = str(exc)
    return isinstance(exc, (duckdb.IOException, FileNotFoundError)) and (
        "No files found" in text or "No such file" in text)


def reading(read: Callable[[], T], tries: int = SCANS) -> T:
    """`read()` (which opens the run and queries it), again on the run as it is then while a part
    it listed vanished under it, waiting longer each time (`backoff`), at most `tries` reads: a
    view reads its parts when a query runs, so a query on a busy run may meet one merged away."""
    for attempt in range(tries):
        try:
            return read()
        except Exception as exc:
            if not vanished(exc) or attempt == tries - 1:
                raise
        time.sleep(backoff(attempt))
    raise AssertionError("unreachable")


def list_parts(folder: Path, skipped: list[str] | None = None) -> list[Path]:
    """The part files of a table folder, listed here (never by a glob): regular files (or links
    to them) named `*.parquet`, not hidden. Anything else named like a part (a FIFO, a folder)
    is ignored and noted in `skipped`, so it can neither hang nor confuse a reader."""
    import os
    import stat

    found = []
    try:
        entries = list(os.scandir(folder))
    except (FileNotFoundError, NotADirectoryError):
        return []
    for entry in entries:
        if not entry.name.endswith(".parquet") or entry.name.startswith("."):
            continue
        try:
            mode = os.stat(entry.path).st_mode  # follows links: a link to a regular file is a part
        except OSError:
            continue
        if not stat.S_ISREG(mode):
            if skipped is not None:
                skipped.append(f"{entry.path}: not a regular file, ignored")
            continue
        found.append(Path(entry.path))
    return sorted(found)


def _scan_table(folder: Path, table: _names.Table, skip_corrupt: bool, skipped: list[str], run_id: str | None = None,
                named: Callable[[str], bool] | None = None):
    if not folder.is_dir():
        return [], []
    parts = []
    for path in list_parts(folder, skipped):
        if named is not None and not named(path.name):
            continue
        why = _DAMAGED.get(path.resolve()) if _DAMAGED else None
        if why is not None:
            if not skip_corrupt:
                raise CorruptPartError(f"{path}: {why}")
            skipped.append(_skipping(f"{path}: {why}"))
            continue
        try:
            parts.append(_check_part(path, table, run_id))
        except CorruptPartError as exc:
            if not skip_corrupt:
                raise
            skipped.append(_skipping(str(exc)))
    superseded = {name for part in parts for name in part.replaces}
    live = [p for p in parts if p.path.name not in superseded]
    replaced = [p.path for p in parts if p.path.name in superseded]
    rivals = covered(live)
    if rivals:
        _skipping(f"{folder}: {', '.join(sorted(p.name for p in rivals))} hold(s) only spans other parts hold "
                  "(two merges of the same parts); read once, removed by `rltrace compact`")
        live = [p for p in live if p.path not in rivals]
        replaced += sorted(rivals)
    return live, replaced


def covered(parts: list[Part]) -> set[Path]:
    """Merged parts whose every input another part in force also replaced (a compaction and a writer
    that both merged the same parts: a writer paused past its heartbeat on an `s3://` run): their
    rows are all in those parts, so they are left out, and each span is read once. A merged part's
    rows are its inputs' rows, so hiding it loses nothing; compaction's parts are left out first."""
    by_name: dict[str, list[Part]] = {}
    for p in parts:
        for name in p.replaces:
            by_name.setdefault(name, []).append(p)
    if all(len(found) == 1 for found in by_name.values()):
        return set()
    hidden: set[Path] = set()
    shared = {id(p): p for found in by_name.values() if len(found) > 1 for p in found}.values()
    for p in sorted(shared, key=lambda p: (not p.path.name.startswith("c-"), p.rows, p.path.name)):
        if all(any(q is not p and q.path not in hidden for q in by_name[name]) for name in p.replaces):
            hidden.add(p.path)
    return hidden


_WARNED: set[str] = set()  # "path: why" of every part this process has said it skips


def _skipping(why: str) -> str:
    """Say once per process that a part is skipped ("path: why"); returns `why` for the snapshot's list."""
    if why not in _WARNED:
        _WARNED.add(why)
        logger.warning("rltrace: skipping %s", why)
    return why


_GLOB = frozenset("*?[]{}")


def exact_path(path: Path | str) -> str:
    """`path` for DuckDB's file functions, matching that one file only: DuckDB expands glob
    characters even in a list of paths, so each one is written as a one-character class."""
    return "".join(f"[{c}]" if c in _GLOB else c for c in str(path))


def sql_paths(paths: list[Path]) -> str:
    """A SQL list literal of exact paths (quoted, glob characters neutralised)."""
    return "[" + ", ".join("'" + exact_path(p).replace("'", "''") + "'" for p in paths) + "]"


_sql_list = sql_paths

#: Parts found damaged past their footer in this process, by resolved path (see `find_damaged`):
#: skipped by `scan(..., skip_corrupt=True)`.
_DAMAGED: dict[Path, str] = {}


def _read_every_page(con: duckdb.DuckDBPyConnection, paths: list[Path]) -> None:
    """Decode every value of every column of these parts (a hash of each whole row), without
    holding them: what the widest query would read."""
    con.execute(f"SELECT bit_xor(hash(t)) FROM read_parquet({sql_paths(paths)}, union_by_name=true) t").fetchall()


def _damaged(snap: Snapshot) -> list[tuple[Part, str]]:
    """The parts of the snapshot whose data pages cannot be read, each with why; remembered in
    `_DAMAGED` so that later scans with `skip_corrupt=True` leave them out."""
    out = []
    con = duckdb.connect(":memory:")
    try:
        for parts in snap.parts.values():
            if not parts:
                continue
            try:
                _read_every_page(con, [p.path for p in parts])  # one pass per table; part by part only on failure
                continue
            except duckdb.Error:
                pass
            for part in parts:
                try:
                    _read_every_page(con, [part.path])
                except duckdb.IOException as exc:
                    if not part.path.exists():
                        continue  # removed by a compaction since the scan: not damaged
                    out.append((part, _why(exc)))
                except duckdb.Error as exc:
                    out.append((part, _why(exc)))
    finally:
        con.close()
    for part, why in out:
        _DAMAGED[part.path.resolve()] = why
    return out


def _why(exc: Exception) -> str:
    return "damaged data pages (" + (str(exc).splitlines()[0] if str(exc) else type(exc).__name__)[:160] + ")"


def find_damaged(run_dir: str | Path) -> list[str]:
    """Read every part of a run in full and return "path: why" for those that cannot be read.

    Called when a query fails on data pages (a footer can be intact while pages are damaged),
    so the error can name the file; damaged parts are remembered and skipped by later scans
    with `skip_corrupt=True`. Parts of the run found damaged before are named too.
    """
    snap = scan(run_dir, skip_corrupt=True)
    root = snap.run_dir.resolve()
    known = [f"{path}: {why}" for path, why in _DAMAGED.items() if root in path.parents and path.exists()]
    return known + [f"{part.path}: {why}" for part, why in _damaged(snap)]


def check_pages(snap: Snapshot) -> None:
    """Read every data page of every part of the snapshot, as the widest query (a report) would:
    a part damaged behind a sound footer is a `CorruptPartError` naming it, or, when the snapshot
    skips corrupt parts, left out of it and listed in `skipped`. So a command that reads only a
    few columns (`rltrace info`) finds the same damage as one that reads them all."""
    damaged = _damaged(snap)
    if not damaged:
        return
    if not snap.skip_corrupt:
        raise CorruptPartError("; ".join(f"{part.path}: {why}" for part, why in damaged))
    bad = {part.path for part, _ in damaged}
    for name, parts in snap.parts.items():
        snap.parts[name] = [p for p in parts if p.path not in bad]
    for part, why in damaged:
        snap.skipped.append(_skipping(f"{part.path}: {why}"))


def skipping_damaged(run_dir: str | Path, skip_corrupt: bool, read: Callable[[], T], reread: Callable[[], T] | None = None) -> T:
    """`read()`; when DuckDB fails on a run's data pages, the damaged parts are found and either
    named (`CorruptPartError`) or, with `skip_corrupt`, left out of a second read: `reread()`, or
    `read()` again (either must scan the run again). Any other failure is raised as it is."""
    try:
        return read()
    except duckdb.Error:
        damaged = find_damaged(run_dir)
        if not damaged:
            raise
    if not skip_corrupt:
        raise CorruptPartError("; ".join(damaged)) from None
    return (reread or read)()  # its scan names each part it skips


#: How rows of an older version's parts read as the current version (SQL over the part's columns).
_UPGRADE = {
    ("spans", 1): "* REPLACE (trace_bytes(trace_id) AS trace_id, span_int(span_id) AS span_id, "
                  "span_int(parent_span_id) AS parent_span_id)",
}


def parts_sql(table: _names.Table, parts: list[Part], options: str = "") -> str:
    """SQL reading the rows of `parts` (any schema version, as the current one: an older part's
    columns converted) with `read_parquet(..., union_by_name=true{options})`; '' when none."""
    selects = []
    for version in sorted({p.version for p in parts}, reverse=True):
        files = _sql_list([p.path for p in parts if p.version == version])
        upgrade = _UPGRADE.get((table.name, version), "*") if version < table.version else "*"
        selects.append(f"SELECT {upgrade} FROM read_parquet({files}, union_by_name=true{options})")
    return " UNION ALL BY NAME ".join(selects)


#: table name -> its columns as DuckDB declares them, learnt from the Arrow schema once a process
_COLUMNS: dict[str, str] = {}


def _columns(con: duckdb.DuckDBPyConnection, table: _names.Table) -> str:
    """`"name" TYPE, ...` of a table's full schema, as DuckDB reads the Arrow schema: declaring the
    empty table with them costs a third of registering an Arrow table for it on every connection."""
    if table.name not in _COLUMNS:
        con.register("_schema", table.schema.empty_table())
        try:
            described = con.execute("DESCRIBE SELECT * FROM _schema").fetchall()
        finally:
            con.unregister("_schema")
        _COLUMNS[table.name] = ", ".join('"{}" {}'.format(name.replace('"', '""'), kind)
                                         for name, kind, *_ in described)
    return _COLUMNS[table.name]


def _source(con: duckdb.DuckDBPyConnection, table: _names.Table, parts: list[Part]) -> str:
    """SQL for all rows of a table: its parts, unioned with an empty table of the full schema so
    that every documented column exists even when no part has it yet."""
    empty = f"_empty_{table.name}"
    con.execute(f"CREATE TABLE {empty} ({_columns(con, table)})")  # a table, so cursors see it too
    if not parts:
        return f"SELECT * FROM {empty}"
    return f"{parts_sql(table, parts)} UNION ALL BY NAME SELECT * FROM {empty}"


#: Tables whose parts their writers replace in place while the run goes on (a process's open spans,
#: its process record, a profile's record from "running" to done). They are small, so they are read
#: whole when the connection is made: a query later in a report never meets a file that changed
#: under DuckDB's cached footer (which fails or mixes two versions).
_READ_AT_OPEN = frozenset({"open_spans", "processes", "profiles"})


def _read_now(con: duckdb.DuckDBPyConnection, table: _names.Table, parts: list[Part], snap: Snapshot) -> str:
    """SQL for all rows of a table whose parts are rewritten in place: read now into a table.
    A part whose footer was sound but whose data is not is a `CorruptPartError`, or, when the
    snapshot skips corrupt parts (the live watcher's), skipped with a warning like any other."""
    empty_sql = _source(con, table, [])
    tables = []
    for part in parts:
        try:
            tables.append(upgrade(table, read_whole(part.path), part.version))
        except FileNotFoundError:
            continue  # removed since the scan: its writer finished (open spans all ended)
        except (OSError, pa.ArrowException) as exc:
            why = f"{part.path}: unreadable ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})"
            if not snap.skip_corrupt:
                raise CorruptPartError(why) from None
            snap.skipped.append(_skipping(why))
    name = f"_read_{table.name}"
    if not tables:
        return empty_sql
    rows_read = pa.concat_tables(tables, promote_options="permissive")
    if table is _names.OPEN_SPANS:
        rows_read = not_finished(rows_read, parts, snap.parts.get("spans", []))
    con.register("_parts_read", rows_read)
    try:
        con.execute(f"CREATE TABLE {name} AS SELECT * FROM _parts_read UNION ALL BY NAME {empty_sql}")
    finally:
        con.unregister("_parts_read")
    return f"SELECT * FROM {name}"


def not_finished(open_rows: pa.Table, open_parts: list[Part], span_parts: list[Part]) -> pa.Table:
    """Open-span rows less those whose span is also finished: a process killed between writing a
    part of finished spans and rewriting its open-spans file leaves them in both. Only the parts
    of that process written since its open-spans file can hold them (a few, read for their ids)."""
    import pyarrow.compute as pc

    since = {}
    for part in open_parts:
        try:
            since[part.path.stem] = part.path.stat().st_mtime_ns
        except OSError:
            continue
    ids = []
    for part in span_parts:
        owner = _names.process_of(part.path.name)
        if owner not in since or not _names.is_flush_part(part.path.name):  # a writer merges only after it rewrote its open spans
            continue
        try:
            if part.path.stat().st_mtime_ns < since[owner]:
                continue
            got = upgrade(_names.SPANS, read_whole(part.path, columns=["trace_id", "span_id"]), part.version)
        except (OSError, pa.ArrowException):
            continue
        ids.append(got)
    if not ids or not open_rows.num_rows or "span_id" not in open_rows.column_names:
        return open_rows
    done = pa.concat_tables(ids)
    keep = pc.invert(pc.is_in(open_rows.column("span_id"), value_set=done.column("span_id").combine_chunks()))
    return open_rows.filter(keep)


def upgrade(table: _names.Table, rows: pa.Table, version: int) -> pa.Table:
    """Rows of a part of an older schema version as the current version (span ids from hex text)."""
    if version >= table.version or table.schema is not _names.SPANS_SCHEMA:
        return rows
    from rltrace.store import ids

    for name, convert in (("trace_id", ids.trace_column), ("span_id", ids.span_ints), ("parent_span_id", ids.span_ints)):
        if name in rows.column_names:
            rows = rows.set_column(rows.column_names.index(name), name, convert(rows.column(name)))
    return rows


def connect(snap: Snapshot) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with a view per table of the snapshot.

    `spans` shows span and trace ids as hex text (as OTel tools print them, computed only for the
    rows a query reads); `_spans` is the same rows with the ids as stored (int64 and 16 bytes),
    for analyses that join or group on ids."""
    from rltrace.store import ids

    con = duckdb.connect(":memory:")
    con.execute("SET parquet_metadata_cache = true")
    # DuckDB draws its own progress bar on stdout for long queries: it would land inside
    # `rltrace report --json` output and break the terminal report
    con.execute("SET enable_progress_bar = false")
    con.execute("""CREATE MACRO attr(attributes, key) AS json_extract_string(attributes, '$."' || key || '"')""")
    for macro in ids.SQL_MACROS:
        con.execute(macro)
    done = set()
    if "spans" in snap.parts:
        finished = _source(con, _names.SPANS, snap.parts["spans"])
        still_open = _read_now(con, _names.OPEN_SPANS, snap.parts.get("open_spans", []), snap)
        con.execute(
            f"""CREATE VIEW _spans AS
            SELECT *, (end_ns - start_ns) / 1e9 AS duration_s, false AS is_open FROM ({finished})
            UNION ALL BY NAME
            SELECT *, CAST(NULL AS DOUBLE) AS duration_s, true AS is_open FROM ({still_open})"""
        )
        con.execute(
            """CREATE VIEW spans AS SELECT * REPLACE (trace_hex(trace_id) AS trace_id, span_hex(span_id) AS span_id,
                                                      span_hex(parent_span_id) AS parent_span_id) FROM _spans"""
        )
        at_exit = _names.UNFINISHED_AT_EXIT.replace("'", "''")
        con.execute(  # what `rltrace info` lists as open: never ended, or ended by rltrace as the process exited
            f"""CREATE VIEW open_spans AS SELECT *, NOT is_open AS ended_at_exit FROM spans
            WHERE is_open OR (status = 'ERROR' AND status_message = '{at_exit}')"""
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
            table = _names.TABLES[name]
            source = _read_now(con, table, parts, snap) if name in _READ_AT_OPEN else _source(con, table, parts)
            con.execute(f"CREATE VIEW {name} AS {source}")
    summary_of = [p.summary_of for p in snap.parts.get("step_summary", [])]
    con.execute("CREATE TABLE _rltrace_meta (key VARCHAR, value VARCHAR)")
    con.execute(
        "INSERT INTO _rltrace_meta VALUES ('spans_digest', ?), ('summary_of', ?), ('run_id', ?), ('run_dir', ?)",
        [spans_digest(snap), summary_of[0] if len(summary_of) == 1 else None, snap.manifest.get("run_id"),
         str(snap.run_dir)],
    )
    # the span parts read (what the per-step summary cache compares against, `analysis.summary`),
    # and each one's per-part summary in force, if any (`rltrace.store.digest`)
    parts = snap.parts.get("spans", [])
    digest_of = {d.digest_of[0]: d for d in snap.parts.get(_names.SPAN_DIGEST.name, [])}
    requests_of = {d.digest_of[0]: d for d in snap.parts.get(_names.SPAN_REQUESTS.name, [])}
    con.register("_parts", pa.table({
        "name": pa.array([p.path.name for p in parts], pa.string()),
        "rows": pa.array([p.rows for p in parts], pa.int64()),
        "size": pa.array([p.size for p in parts], pa.int64()),
        "path": pa.array([str(p.path) for p in parts], pa.string()),
        "version": pa.array([p.version for p in parts], pa.int64()),
        "digest": pa.array([str(digest_of[p.path.name].path) if p.path.name in digest_of else None for p in parts],
                           pa.string()),
        "digest_version": pa.array([digest_of[p.path.name].version if p.path.name in digest_of else None
                                    for p in parts], pa.int64()),
        "replaces": pa.array([list(p.replaces) for p in parts], pa.list_(pa.string())),
        # the engine request rows its writer stored, and the version of the SQL that found them
        "requests": pa.array([str(requests_of[p.path.name].path) if p.path.name in requests_of else None
                              for p in parts], pa.string()),
        "requests_sql": pa.array([requests_of[p.path.name].requests_sql if p.path.name in requests_of else None
                                  for p in parts], pa.string()),
        "engine_rows": pa.array([p.engine_rows for p in parts], pa.bool_()),
        "mismatch_missing": pa.array([p.mismatch_missing for p in parts], pa.bool_()),
    }))
    con.execute("CREATE TABLE _rltrace_span_parts AS SELECT * FROM _parts")
    con.unregister("_parts")
    return con


def open(run_dir: str | Path, *, skip_corrupt: bool = False) -> duckdb.DuckDBPyConnection:  # noqa: A001
    """A read-only DuckDB connection over a snapshot of the run in `run_dir`.

    Views: `spans` (finished and open spans; `duration_s`, `is_open`), `open_spans` (those that
    never ended, and those rltrace ended because their process exited with them open:
    `ended_at_exit`), `metrics` (long format: step, name, value), `samples` (one row per sample;
    `staleness`), `processes`, `crashes`.
    The macro `attr(attributes, 'rl.bytes')` reads one span attribute. Reopen to see parts
    written since. Raises `StoreError` naming the path when the dir or a part is unusable.
    """
    return connect(scan(run_dir, skip_corrupt=skip_corrupt))
