"""One part file: a table of the store written whole, so a reader never sees half a file (a
hidden temp name in the same folder, then `os.replace`), tagged with its table, schema version
and run in the Parquet footer (what `rltrace.store.views` checks)."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rltrace import _names
from rltrace.store import layout

MARK_ROWS = 20_000  # span parts this large get the engine mark: merged parts, not a writer's frequent small flushes (cheap to scan)


def write_part(
    folder: Path,
    name: str,
    table: pa.Table,
    spec: _names.Table,
    extra_metadata: dict | None = None,
    write_options: dict | None = None,
) -> Path:
    """Write `table` as `folder/name` atomically, tagged with the table's name and schema version.

    `write_options` go to `pyarrow.parquet.write_table` (e.g. per-column compression); zstd by default.
    """
    tmp = stage_part(folder, name, table, spec, extra_metadata, write_options)
    final = folder / name
    try:
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    return final


def stage_part(
    folder: Path,
    name: str,
    table: pa.Table,
    spec: _names.Table,
    extra_metadata: dict | None = None,
    write_options: dict | None = None,
) -> Path:
    """Write `table` under a hidden temp name beside `folder/name` (readers skip it) and return
    that path: `os.replace` it onto `folder/name` to make the part visible whole (an import makes
    several parts visible together this way).

    Parts of the tables with a fixed schema of plain types (`_LEAN`) get a smaller footer: no copy of
    the Arrow schema (their types read back the same without it) and min/max statistics only for the
    columns readers skip row groups by; a small part is mostly its footer.
    """
    folder.mkdir(parents=True, exist_ok=True)
    metadata = dict(table.schema.metadata or {})
    metadata[_names.META_TABLE] = spec.name.encode()
    metadata[_names.META_VERSION] = str(spec.version).encode()
    run_id = layout.run_id_of(folder.parent)
    if run_id is not None:
        metadata[_names.META_RUN_ID] = run_id.encode()
    if spec.name == _names.SPANS.name and table.num_rows >= MARK_ROWS:
        metadata[_names.META_ENGINE_ROWS] = b"1" if may_hold_engine_rows(table) else b"0"
        metadata[_names.META_MISMATCH_MISSING] = b"1" if _any_text(table, "attributes", _names.MISMATCH_MISSING) else b"0"
    metadata.update(extra_metadata or {})
    table = table.replace_schema_metadata(metadata)
    tmp = folder / f".{name}.{uuid.uuid4().hex[:8]}.tmp"
    options = {"compression": "zstd", **(write_options or {})}
    try:
        if spec.name in _LEAN:
            row_group_size = options.pop("row_group_size", None)
            with pq.ParquetWriter(tmp, table.schema, store_schema=False,
                                  write_statistics=[c for c in _PRUNED_BY if c in table.column_names], **options) as out:
                out.write_table(table, row_group_size=row_group_size)
                out.add_key_value_metadata(metadata)  # the Arrow schema is left out, and its metadata with it
        else:
            pq.write_table(table, tmp, **options)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def received_from(sessions) -> dict[bytes, bytes]:
    """The footer of a span part holding spans of these receiver or import sessions (`views.fold_copies`:
    only such parts can hold copies of a span, and only when they come from two or more sessions)."""
    import json

    return {_names.META_RECEIVED: json.dumps(sorted(set(sessions))).encode()}


def sessions_of(metadata: dict | None) -> tuple[str, ...]:
    """The receiver or import sessions a span part's footer names (`received_from`); () for a process's own."""
    import json

    raw = (metadata or {}).get(_names.META_RECEIVED)
    if raw is None:
        return ()
    try:
        found = json.loads(raw)
    except ValueError:
        return ("?",)  # unreadable: treated as a session of its own, so the part is checked
    return tuple(str(s) for s in found) if isinstance(found, list) else ("?",)


def _any_text(spans: pa.Table, column: str, text: str) -> bool:
    """Whether a value of a text column holds `text` (a dictionary column: any value it may hold)."""
    if column not in spans.column_names:
        return False
    for chunk in spans[column].chunks:
        values = chunk.dictionary if pa.types.is_dictionary(chunk.type) else chunk
        if len(values) and pc.any(pc.match_substring(values.cast(pa.string()), text)).as_py():
            return True
    return False


def may_hold_engine_rows(spans: pa.Table) -> bool:
    """Whether a span of `spans` could be an engine request row: its attribute text holds one of
    `_names.ENGINE_ATTR_MARKS`, or its name or phase is slime's PD, SGLang's thread span or a KV transfer (a superset of
    what the serving sidecar selects, so a part answered False has no row there)."""
    def any_of(column: str, test) -> bool:
        if column not in spans.column_names:
            return False
        for chunk in spans[column].chunks:
            values = chunk.dictionary if pa.types.is_dictionary(chunk.type) else chunk  # every value it may hold
            if len(values) and pc.any(test(values.cast(pa.string()))).as_py():
                return True
        return False

    return (any(any_of("attributes", lambda v, m=mark: pc.match_substring(v, m)) for mark in _names.ENGINE_ATTR_MARKS)
            or any_of("name", lambda v: pc.starts_with(v, _names.PD_NAME_PREFIX))
            or any_of("name", lambda v: pc.match_substring(v, _names.ENGINE_THREAD_MARK))
            or any(any_of(c, lambda v: pc.equal(v, _names.KV_TRANSFER)) for c in ("name", "phase")))


_LEAN = frozenset(("spans", "open_spans", "processes", "span_digest", "span_requests"))
_PRUNED_BY = ("step", "start_ns", "end_ns", "status")  # what readers filter parts and row groups by (status: spans that failed)
