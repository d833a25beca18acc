"""A run's spans as a Spark data source, for a Spark without an S3 connector (a `pip install
pyspark` has none: `s3a://` needs the hadoop-aws jar) or a live run whose replaced parts are
still there (docs/scale.md, "Reading a run with other engines").

    from rltrace.store.spark import SpansSource
    spark.dataSource.register(SpansSource)                       # Spark 4.0 or later
    spark.read.format("rltrace").load("s3://bucket/runs/exp1").createOrReplaceTempView("spans")

One Spark partition per span part in force (the footer rule of docs/scale.md: a part another part
replaces is left out; the parts of two or more receivers, which may hold copies of a span, one
partition that reads each span once), each read with pyarrow where Spark runs it (the executors need rltrace and,
for `s3://`, the AWS variables rltrace's writers use). Columns as stored, `trace_id` as BINARY.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from rltrace import _names

_SCHEMA = _names.SPANS_SCHEMA.set(0, pa.field("trace_id", pa.binary()))  # Spark has no fixed-size binary
_SPARK_TYPES = {pa.int64(): "BIGINT", pa.string(): "STRING", pa.binary(): "BINARY"}


def _filesystem(run: str):
    """(pyarrow filesystem, path of the run in it) for a run directory or an `s3://` run."""
    from pyarrow import fs

    from rltrace.store import objstore

    if objstore.is_uri(run):
        return objstore.filesystem(), objstore.split(run)
    return fs.LocalFileSystem(), str(run)


def parts_in_force(run: str) -> list[str]:
    """Paths of the span parts of `run` in force: every part no other part's footer replaces."""
    return [path for path, _ in _in_force(run)]


def _in_force(run: str) -> list[tuple[str, tuple[str, ...]]]:
    """(path, receiver or import sessions it holds spans of) of each span part in force."""
    from pyarrow import fs

    from rltrace.store.parts import sessions_of

    filesystem, base = _filesystem(run)
    infos = filesystem.get_file_info(fs.FileSelector(f"{base}/{_names.SPANS.folder}", allow_not_found=True))
    files = sorted(i.path for i in infos if i.type == fs.FileType.File and i.base_name.endswith(".parquet")
                   and not i.base_name.startswith("."))
    replaced, sessions = set(), {}
    for path in files:
        with filesystem.open_input_file(path) as f:
            meta = pq.read_metadata(f).metadata or {}
        replaced.update(json.loads(meta.get(_names.META_REPLACES, b"[]")))
        sessions[path] = sessions_of(meta)
    return [(p, sessions[p]) for p in files if p.rsplit("/", 1)[-1] not in replaced]


def partitions(run: str) -> list[tuple[str, ...]]:
    """The parts each Spark partition reads: one part each, but the parts of two or more receiver
    or import sessions (where a resent request's copies can be) are one partition, read with each
    (trace_id, span_id) once, as rltrace's readers do (`views.fold_copies`)."""
    parts = _in_force(run)
    if len({s for _, found in parts for s in found}) < 2:
        return [(path,) for path, _ in parts]
    return [(path,) for path, found in parts if not found] + [tuple(path for path, found in parts if found)]


class _Part(InputPartition):
    def __init__(self, paths: tuple[str, ...]):
        super().__init__(paths)
        self.paths = paths


class SpansSource(DataSource):
    """`spark.read.format("rltrace").load(RUN)`: the finished spans of a run directory or `s3://` run."""

    @classmethod
    def name(cls) -> str:
        return "rltrace"

    def schema(self) -> str:
        return ", ".join(f"{f.name} {_SPARK_TYPES[f.type]}" for f in _SCHEMA)

    def reader(self, schema) -> DataSourceReader:
        return _Reader(self.options["path"])


class _Reader(DataSourceReader):
    def __init__(self, run: str):
        self.run = run

    def partitions(self) -> list[_Part]:
        return [_Part(paths) for paths in partitions(self.run)]

    def read(self, partition: _Part):
        from rltrace.store.rows import first_of_each
        from rltrace.store.views import upgrade

        filesystem, _ = _filesystem(self.run)
        tables = []
        for path in partition.paths:
            with filesystem.open_input_file(path) as f:
                table = pq.read_table(f)
            version = int((table.schema.metadata or {}).get(_names.META_VERSION, b"1"))
            tables.append(upgrade(_names.SPANS, table, version).select(_SCHEMA.names).cast(_SCHEMA))
        table = tables[0] if len(tables) == 1 else first_of_each(pa.concat_tables(tables))
        yield from table.to_batches()
