"""A run's spans as a Spark data source, for a Spark without an S3 connector (a `pip install
pyspark` has none: `s3a://` needs the hadoop-aws jar) or a live run whose replaced parts are
still there (docs/scale.md, "Reading a run with other engines").

    from rltrace.store.spark import SpansSource
    spark.dataSource.register(SpansSource)                       # Spark 4.0 or later
    spark.read.format("rltrace").load("s3://bucket/runs/exp1").createOrReplaceTempView("spans")

One Spark partition per span part in force (the footer rule of docs/scale.md: a part another part
replaces is left out), each read with pyarrow where Spark runs it (the executors need rltrace and,
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
    from pyarrow import fs

    filesystem, base = _filesystem(run)
    infos = filesystem.get_file_info(fs.FileSelector(f"{base}/{_names.SPANS.folder}", allow_not_found=True))
    files = sorted(i.path for i in infos if i.type == fs.FileType.File and i.base_name.endswith(".parquet")
                   and not i.base_name.startswith("."))
    replaced = set()
    for path in files:
        with filesystem.open_input_file(path) as f:
            meta = pq.read_metadata(f).metadata or {}
        replaced.update(json.loads(meta.get(_names.META_REPLACES, b"[]")))
    return [p for p in files if p.rsplit("/", 1)[-1] not in replaced]


class _Part(InputPartition):
    def __init__(self, path: str):
        super().__init__(path)
        self.path = path


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
        return [_Part(p) for p in parts_in_force(self.run)]

    def read(self, partition: _Part):
        from rltrace.store.views import upgrade

        filesystem, _ = _filesystem(self.run)
        with filesystem.open_input_file(partition.path) as f:
            table = pq.read_table(f)
        version = int((table.schema.metadata or {}).get(_names.META_VERSION, b"1"))
        yield from upgrade(_names.SPANS, table, version).select(_SCHEMA.names).cast(_SCHEMA).to_batches()
