"""Spark (local mode, one session for the module) reads runs that real writer processes left and
gets the report's per-phase totals span for span: a run directory written by 8 processes, read
with Spark's own Parquet reader and the query of docs/scale.md, and an `s3://` run on a loopback
S3 server, read through rltrace's Spark data source (a pip-installed Spark has no S3 connector)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from rltrace.cli import main as cli

from ..conftest import REPO, python_env, unavailable


@pytest.fixture(scope="module", autouse=True)
def java():
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        unavailable("Spark needs Java (make test installs default-jre-headless)")
from .test_objstore import s3_run, s3_server  # noqa: E402,F401  (fixtures: the loopback S3 server)

#: rank 0 trains, ranks 1-6 generate on two threads each (requests overlap), rank 7 scores
WRITER = """
import contextvars, sys, threading, time, rltrace
run, rank, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
role = "trainer" if rank == 0 else "reward" if rank == 7 else "rollout"
rltrace.init(run, role=role, rank=rank, flush_interval=0.05)
for step in range(steps):
    if role == "trainer":
        with rltrace.phase("step", step=step):
            with rltrace.phase("train", micro_batches=2):
                for k in range(2):
                    with rltrace.phase("forward", micro_batch=k):
                        time.sleep(0.001)
            with rltrace.phase("weight_sync", bytes=1000, method="nccl"):
                pass
    elif role == "rollout":
        with rltrace.phase("rollout", step=step):
            def generate(t):
                for k in range(3):
                    with rltrace.phase("generate", sample_id=f"{rank}-{t}-{k}"):
                        time.sleep(0.002)
            threads = [threading.Thread(target=contextvars.copy_context().run, args=(generate, t)) for t in range(2)]
            [t.start() for t in threads]
            [t.join() for t in threads]
    else:
        with rltrace.phase("reward", step=step):
            for k in range(4):
                with rltrace.phase("score", sample_id=k):
                    pass
rltrace.shutdown()
"""
STEPS = 3
#: docs/scale.md, "Reading a run with other engines": per step and phase, then per phase
QUERY = """SELECT step, coalesce(phase, name) AS phase, count(*) AS spans, sum(end_ns - start_ns) AS span_ns
           FROM {source} WHERE step IS NOT NULL GROUP BY 1, 2"""


def _write(run: str, ranks, env: dict) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", WRITER, run, str(rank), str(STEPS)], cwd=REPO, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in ranks]


def _wait(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err


@pytest.fixture(scope="module")
def spark(s3_server):
    """One local Spark for the module. Its Python workers inherit the environment it starts with:
    this interpreter, this checkout, and the loopback S3 server's address and keys."""
    from pyspark.sql import SparkSession

    _, url = s3_server
    saved = dict(os.environ)
    os.environ.update(python_env(PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
                                 AWS_ENDPOINT_URL=url, AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test",
                                 AWS_REGION="us-east-1"))
    session = (SparkSession.builder.master("local[2]").appName("rltrace-test")
               .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
               .config("spark.driver.memory", "512m")
               # a short job: the JVM's quick compiler only, and one GC thread (2 shared cores)
               .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC").getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    os.environ.clear()
    os.environ.update(saved)
    yield session
    session.stop()


def _totals(spark, source: str) -> dict:
    per_step = spark.sql(QUERY.format(source=source)).collect()
    out: dict = {}
    for row in per_step:
        spans, ns = out.get(row["phase"], (0, 0))
        out[row["phase"]] = (spans + row["spans"], ns + row["span_ns"])
    return out


def _report(run: str, capsys) -> dict:
    capsys.readouterr()
    assert cli(["report", run, "--json"]) == 0
    return {p["phase"]: (p["spans"], round(p["span_s"] * 1e9)) for p in json.loads(capsys.readouterr().out)["phases"]}


def test_spark_reads_a_run_of_8_processes_with_the_documented_query(spark, run_dir, capsys):
    _wait(_write(str(run_dir), range(8), python_env()))
    got = _totals(spark, f"parquet.`{run_dir}/spans/`")
    want = _report(str(run_dir), capsys)
    assert got == want
    assert got["generate"][0] == 6 * 2 * 3 * STEPS and got["score"][0] == 4 * STEPS
    assert got["forward"][0] == 2 * STEPS and set(got) == {"step", "train", "forward", "weight_sync", "rollout",
                                                            "generate", "reward", "score"}
    # the data source reads the same spans (every part of a run its writers left is in force)
    spark.dataSource.register(__import__("rltrace.store.spark", fromlist=["SpansSource"]).SpansSource)
    spark.read.format("rltrace").load(str(run_dir)).createOrReplaceTempView("local_spans")
    assert _totals(spark, "local_spans") == want


def test_spark_reads_an_s3_run_through_rltraces_data_source(spark, s3_run, capsys):
    from rltrace.store.spark import SpansSource, parts_in_force

    uri, env, _ = s3_run
    _wait(_write(uri, (0, 1, 7), env))  # a trainer, a rollout worker, the reward worker
    spark.dataSource.register(SpansSource)
    frame = spark.read.format("rltrace").load(uri)
    assert frame.rdd.getNumPartitions() == len(parts_in_force(uri)) >= 3  # one Spark partition per part
    frame.createOrReplaceTempView("s3_spans")
    got = _totals(spark, "s3_spans")
    assert got == _report(uri, capsys)
    assert got["generate"][0] == 2 * 3 * STEPS and got["score"][0] == 4 * STEPS
