"""A frozen batch on disk (`RUN_DIR/batches/<step>-<batch_id>.parquet`) and in memory (`FrozenBatch`).

One part file holds one batch, one row per sample: the batch-level fields of
`rltrace._names.BATCH_COLUMNS` repeated on every row (dictionary-encoded), then the user's
columns encoded by `rltrace.replay.codec`. A part becomes visible whole (temp file + rename),
so a reader never sees half a batch. Every column is described in docs/replay.md.
"""

from __future__ import annotations

import json
import operator
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rltrace import _names
from rltrace.replay import codec
from rltrace.replay.errors import DamagedBatchError, ReplayError
from rltrace.replay.tokenizer import check_tokenizer, tokenizer_identity
from rltrace.store import objstore, scan
from rltrace.store.views import list_parts
from rltrace.store.parts import write_part
from rltrace.store.writer import ProcessInfo

RESERVED = frozenset(_names.BATCH_COLUMNS)
_BATCH_META_COLUMNS = ("weight_version", "train_version", "tokenizer", "tokenizer_name", "tokenizer_hash", "checkpoint", "config")
_JSON_FIELDS = ("config", "batch_meta", "codec")


def part_name(step: int, batch_id: str) -> str:
    return f"{step:010d}-{batch_id}.parquet"


def _step_of(path: Path) -> int | None:
    head = path.name.split("-", 1)[0]
    return int(head) if head.isdigit() else None


# --- writing -----------------------------------------------------------------------------------
def _constant(value: Any, typ: pa.DataType, n: int) -> pa.Array:
    """A column holding one value n times, stored once (dictionary-encoded)."""
    if value is None:
        return pa.nulls(n, typ)
    if pa.types.is_string(typ):
        return pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)), pa.array([value], typ))
    return pa.array(np.full(n, value), typ)


def batch_fields(meta: Mapping[str, Any] | None) -> dict[str, Any]:
    """Split a user's `batch_meta` into the fixed batch columns and the free rest (stored as JSON)."""
    meta = dict(meta or {})
    fields: dict[str, Any] = {}
    version = meta.pop("weight_version", meta.pop("train_version", None))
    fields["train_version"] = None if version is None else int(version)
    tokenizer = meta.pop("tokenizer", None)
    name, digest = meta.pop("tokenizer_name", None), meta.pop("tokenizer_hash", None)
    if tokenizer is not None:
        name, digest = tokenizer_identity(tokenizer)
        if "special_token_ids" not in meta and getattr(tokenizer, "all_special_ids", None) is not None:
            meta["special_token_ids"] = [int(i) for i in tokenizer.all_special_ids]
        if "special_tokens" not in meta and getattr(tokenizer, "all_special_tokens", None) is not None:
            meta["special_tokens"] = [str(t) for t in tokenizer.all_special_tokens]
    fields["tokenizer_name"], fields["tokenizer_hash"] = name, digest
    checkpoint = meta.pop("checkpoint", None)
    fields["checkpoint"] = None if checkpoint is None else str(checkpoint)
    fields["config"] = json.dumps(meta.pop("config", None), default=str)
    fields["batch_meta"] = json.dumps(meta, default=str)
    return fields


def check_columns(names: Sequence[str]) -> None:
    """Column names must be strings (checked on the caller's thread; other clashes are settled by
    `take_reserved` on the writer thread)."""
    bad = [n for n in names if not isinstance(n, str)]
    if bad:
        raise TypeError(f"freeze: column names must be strings, got {bad}")


def _clashes(name: str) -> bool:
    return name in RESERVED or name.startswith(codec.SHAPE_PREFIX)


def _version(value: Any) -> int | None:
    try:
        return None if value is None else operator.index(value.item() if hasattr(value, "item") else value)
    except (TypeError, ValueError):
        raise ValueError(f"holds {value!r}, not an integer version") from None


def take_reserved(form: str, data: Any, meta: dict) -> dict[str, str]:
    """Take the user's columns named like batch columns out of `data` (writer thread; `data` and
    `meta` are the freeze's own copies). A `train_version` column (which `log_samples` asks for)
    holding one version that agrees with `batch_meta` becomes the batch's `train_version`; any
    other clash is dropped. Returns {column: why} for each drop (the caller counts them)."""
    names = [n for n in (dict.fromkeys(k for row in data for k in row) if form == "rows" else data) if _clashes(n)]
    dropped: dict[str, str] = {}
    for name in names:
        if form == "rows":
            values = [row.pop(name, None) for row in data]
        else:
            column = data.pop(name)
            values = column.tolist() if hasattr(column, "tolist") else list(column)
        if name != "train_version":
            dropped[name] = "the name of a column rltrace sets itself (docs/replay.md); rename yours to keep it"
            continue
        given = meta.get("weight_version", meta.get("train_version"))
        try:
            versions = {v for v in map(_version, values) if v is not None} | ({_version(given)} if given is not None else set())
        except ValueError as exc:
            dropped[name] = f"column train_version {exc}"
            continue
        if len(versions) > 1:
            dropped[name] = (f"column train_version holds versions {sorted(versions)[:5]}; a batch has one v_t "
                             "(batch_meta weight_version)")
        elif versions and given is None:
            meta["train_version"] = versions.pop()
    return dropped


def user_columns(form: str, data: Any, n: int) -> tuple[dict[str, pa.Array], dict[str, dict]]:
    """Encode the samples (list of dicts, or dict of columns) into Arrow columns and their specs."""
    arrays: dict[str, pa.Array] = {}
    specs: dict[str, dict] = {}
    if form == "rows":
        names = list(dict.fromkeys(k for sample in data for k in sample))
        columns = {name: [sample.get(name) for sample in data] for name in names}
    else:
        columns = data
    for name, column in columns.items():
        kind = codec.kind_of(column)
        if form == "columns" and kind in codec.ARRAY_KINDS and np.ndim(column) >= 1:
            encoded, spec = codec.encode_batched(name, column, n)
        else:
            encoded, spec = codec.encode_rows(name, column)
        arrays.update(encoded)
        specs[name] = spec
    return arrays, specs


def build_table(
    step: int,
    batch_id: str,
    form: str,
    data: Any,
    n: int,
    *,
    fields: Mapping[str, Any],
    trigger: str,
    reason: str | None,
    frozen_ns: int,
    process: ProcessInfo | None,
) -> pa.Table:
    """The Arrow table of one frozen batch (runs on the writer thread)."""
    arrays, specs = user_columns(form, data, n)
    header = {
        "step": step,
        "batch_id": batch_id,
        "n_samples": n,
        "frozen_ns": frozen_ns,
        "trigger": trigger,
        "reason": reason,
        "codec": json.dumps(specs, separators=(",", ":")),
        "form": form,
        **fields,
    }
    if process is not None:
        header.update(process_id=process.process_id, role=process.role, rank=process.rank, host=process.host, pid=process.pid)
    columns: dict[str, pa.Array] = {}
    for name, typ in _names.BATCH_COLUMNS.items():
        columns[name] = pa.array(np.arange(n, dtype=np.int64)) if name == "sample_index" else _constant(header.get(name), typ, n)
    columns.update(arrays)
    fields_ = [pa.field(name, arr.type, nullable=not name == "sample_index" and _nullable(arr)) for name, arr in columns.items()]
    return pa.Table.from_arrays(list(columns.values()), schema=pa.schema(fields_))


def _nullable(arr: pa.Array) -> bool:
    # a required list column reads twice as fast; a column with nulls must stay optional
    return not (pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type)) or arr.null_count > 0


_PROBE_BYTES = 1 << 18  # how much of an array column is test-compressed to choose its codec


def _array_codec(column: pa.ChunkedArray) -> str:
    """lz4 where it pays (masks, repeated advantages), none for incompressible values (token ids,
    log-probs): compressing those costs time on every write and read and saves nothing."""
    chunk = column.chunk(0) if column.num_chunks else None
    if chunk is None or len(chunk) == 0:
        return "lz4"
    values = chunk.values
    data = values.buffers()[-1]
    width = max(values.type.bit_width // 8, 1) if hasattr(values.type, "bit_width") else 1
    probe = data.slice(values.offset * width, min(_PROBE_BYTES, data.size - values.offset * width))
    if probe.size < 1024:
        return "lz4"
    return "lz4" if pa.compress(probe, codec="lz4", asbytes=False).size < 0.8 * probe.size else "none"


def write_options(table: pa.Table) -> dict:
    """Fast where the bytes are (lz4 only where it compresses, no statistics or dictionary on
    arrays), small elsewhere."""
    lists = {f.name for f in table.schema if pa.types.is_list(f.type) or pa.types.is_large_list(f.type)}
    dictionary = [n for n, t in _names.BATCH_COLUMNS.items() if pa.types.is_string(t)] + ["finish_reason"]
    return {
        # keys are Parquet leaf paths: a list column's values live in `<name>.list.element`
        "compression": {
            (f"{n}.list.element" if n in lists else n): (_array_codec(table.column(n)) if n in lists else "zstd")
            for n in table.column_names
        },
        "use_dictionary": [n for n in dictionary if n in table.column_names],
        "write_statistics": ["step", "sample_index", "train_version"],
        "data_page_version": "2.0",  # repetition levels stay uncompressed: list columns decode faster
    }


def write_batch(run_dir: Path, table: pa.Table, step: int, batch_id: str) -> Path:
    folder = Path(run_dir) / _names.BATCHES.folder
    return write_part(folder, part_name(step, batch_id), table, _names.BATCHES, write_options=write_options(table))


def new_batch_id() -> str:
    return uuid.uuid4().hex[:12]


# --- reading -----------------------------------------------------------------------------------
class StoredColumns:
    """Columns read from one part, decoded lazily (on first access) to the kind they were given in."""

    def __init__(self, table: pa.Table, path: Path):
        self.table = table
        self.path = Path(path)
        fixed = [n for n in (*_names.BATCH_COLUMNS, *_names.REPLAYS_SCHEMA.names) if n != "reward" and n in table.column_names]
        self._header = {n: table.column(n)[0].as_py() for n in fixed} if table.num_rows else {}
        try:
            self.specs: dict[str, dict] = json.loads(self._header.get("codec") or "{}")
        except json.JSONDecodeError:
            raise ReplayError(f"{self.path}: field codec is not valid JSON; the part is damaged") from None
        self._decoded: dict[str, Any] = {}

    @property
    def columns(self) -> list[str]:
        return list(self.specs)

    def __len__(self) -> int:
        return self.table.num_rows

    def __contains__(self, name: object) -> bool:
        return name in self.specs

    def __getitem__(self, name: str) -> Any:
        if name not in self._decoded:
            spec = self.specs.get(name)
            if spec is None:
                raise KeyError(f"{name!r} is not a column of {self.path.name} (columns: {', '.join(self.specs)})")
            if name not in self.table.column_names:
                raise ReplayError(f"{self.path}: field {name} is described in codec but missing from the file")
            shapes = self.table.column(spec["shape_column"]) if spec.get("shape_column") else None
            try:
                self._decoded[name] = codec.decode(self.table.column(name), spec, shapes)
            except (KeyError, ValueError, TypeError, AttributeError, RuntimeError, pa.ArrowException) as exc:
                raise ReplayError(f"{self.path}: field {name} cannot be decoded ({exc})") from None
        return self._decoded[name]

    def get(self, name: str, default: Any = None) -> Any:
        return self[name] if name in self.specs else default

    def sample(self, i: int) -> dict[str, Any]:
        """One sample: every column's value for row `i` (a row of a batched tensor is a view)."""
        return {name: self[name][i] for name in self.specs}

    @property
    def samples(self) -> list[dict[str, Any]]:
        return [self.sample(i) for i in range(len(self))]

    def __iter__(self) -> Iterator[str]:
        return iter(self.specs)


class FrozenBatch(StoredColumns):
    """A frozen batch: `batch["response_tokens"]` is the column as it was given to `freeze`
    (one [B, ...] tensor, or a list with one value per sample), with its original dtype and shape.

    `batch.meta` holds the batch-level fields (train_version, tokenizer_name, tokenizer_hash,
    checkpoint, config, trigger, reason, ...); `batch.original()` the structure given to freeze.
    """

    def __init__(self, table: pa.Table, path: Path):
        super().__init__(table, path)
        self.meta: dict[str, Any] = {k: v for k, v in self._header.items() if k != "codec"}
        for key in ("config", "batch_meta"):
            try:
                self.meta[key] = json.loads(self.meta[key]) if self.meta.get(key) else None
            except json.JSONDecodeError:
                raise ReplayError(f"{self.path}: field {key} is not valid JSON; the part is damaged") from None
        self.step: int = self.meta["step"]
        self.batch_id: str = self.meta["batch_id"]
        self.form: str = self.meta.get("form") or "rows"

    @property
    def extra(self) -> dict[str, Any]:
        """The free `batch_meta` keys given to freeze (max_response_len, special_tokens, ...)."""
        return self.meta.get("batch_meta") or {}

    def original(self) -> list[dict[str, Any]] | dict[str, Any]:
        """The samples in the form given to freeze: a list of dicts (every column in every dict;
        None where a sample had no value), or a dict of columns."""
        if self.form == "columns":
            return {name: self[name] for name in self.specs}
        return self.samples

    def __repr__(self) -> str:
        return f"FrozenBatch(step={self.step}, batch_id={self.batch_id!r}, samples={len(self)}, columns={self.columns})"


def read_part(path: Path) -> pa.Table:
    try:
        with pq.ParquetFile(path) as part:
            return part.read()
    except (OSError, pa.ArrowException) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DamagedBatchError(f"{path}: cannot be read ({reason}); the file is damaged, delete it or freeze again") from None


def batch_parts(run_dir: str | Path, *, skip_corrupt: bool = True, step: int | None = None) -> tuple[list[Path], list[str]]:
    """Readable batch parts of a run (footers checked), and 'path: why' for the unreadable ones
    (without `skip_corrupt`, the first unreadable one is a `CorruptPartError`). With `step`, only
    the parts frozen at that step (by file name: a run may hold thousands of batches)."""
    named = None if step is None else (lambda name: _step_of(Path(name)) == step)
    snap = scan(run_dir, skip_corrupt=skip_corrupt, tables={"batches": _names.BATCHES}, named=named)
    return [p.path for p in snap.parts["batches"]], snap.skipped


def _frozen_steps(run_dir: str | Path) -> list[int]:
    """Steps with a frozen batch, from the part names alone (for an error message)."""
    run_dir = objstore.mirror(run_dir) if objstore.is_uri(run_dir) else run_dir
    return sorted({s for s in (_step_of(p) for p in list_parts(Path(run_dir) / _names.BATCHES.folder)) if s is not None})


def load(run_dir: str | Path, step: int, *, batch_id: str | None = None, tokenizer: Any = None) -> FrozenBatch:
    """The batch frozen at `step` (the latest one if several; pick one with `batch_id`).

    With `tokenizer`, checks that its vocabulary hash equals the batch's `tokenizer_hash`
    (`TokenizerMismatchError` otherwise). Raises `ReplayError`/`StoreError` naming the file.
    """
    parts, skipped = batch_parts(run_dir, step=step)
    candidates = [p for p in parts if _step_of(p) == step and (batch_id is None or p.stem.endswith(batch_id))]
    if not candidates:
        bad = [s for s in skipped if f"{step:010d}-" in s]
        if bad:
            raise ReplayError(bad[0])
        have = _frozen_steps(run_dir)
        which = f"batch {batch_id} at step {step}" if batch_id else f"batch at step {step}"
        raise ReplayError(f"{Path(run_dir) / 'batches'}: no frozen {which}; frozen steps: {have or 'none'}")
    if len(candidates) > 1:
        candidates.sort(key=lambda p: read_part_column(p, "frozen_ns"))
    path = candidates[-1]
    batch = FrozenBatch(read_part(path), path)
    check_tokenizer(tokenizer, batch.meta.get("tokenizer_name"), batch.meta.get("tokenizer_hash"), str(path))
    return batch


def read_part_column(path: Path, name: str) -> Any:
    """The first value of one column of a part (batch-level columns hold one value)."""
    table = pq.read_table(path, columns=[name])
    return table.column(0)[0].as_py() if table.num_rows else None
