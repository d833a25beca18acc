"""Runs in object storage, against a real S3-compatible server (moto's standalone server) on loopback.

Writers are real separate processes; the server is stopped with SIGSTOP (it then accepts
connections but answers nothing, as an unreachable store does) and resumed with SIGCONT.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pyarrow.parquet as pq
import pytest

pytest.importorskip("moto.server")

from rltrace import store  # noqa: E402
from rltrace.cli import main  # noqa: E402
from rltrace.store import objstore  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]

WRITER = """
import sys, time, rltrace
uri, rank, steps, pause = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
rltrace.init(uri, role="rollout", rank=rank, flush_interval=0.2)
i = 0
while steps < 0 or i < steps:
    with rltrace.phase("step", step=i):
        with rltrace.phase("rollout"):
            pass
        with rltrace.phase("train"):
            pass
    rltrace.log_metrics(i, loss=float(i))
    print("step", i, flush=True)
    i += 1
    time.sleep(pause)
t0 = time.monotonic()
rltrace.shutdown()
print("done in %.1f s" % (time.monotonic() - t0), flush=True)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def s3_server():
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(url + "/", timeout=1).read()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail("moto server did not start")
            time.sleep(0.2)
    yield proc, url
    os.kill(proc.pid, signal.SIGCONT)
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture
def s3_run(s3_server, tmp_path, monkeypatch):
    """A fresh bucket on the loopback server and the env that points rltrace at it."""
    proc, url = s3_server
    env = {"AWS_ENDPOINT_URL": url, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
           "AWS_REGION": "us-east-1", "RLTRACE_SPOOL_DIR": str(tmp_path / "spool"),
           "RLTRACE_CACHE_DIR": str(tmp_path / "cache")}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    bucket = "b" + uuid.uuid4().hex[:12]
    from pyarrow import fs

    fs.S3FileSystem(endpoint_override=url.split("//")[1], scheme="http", region="us-east-1",
                    allow_bucket_creation=True).create_dir(bucket)
    return f"s3://{bucket}/runs/exp1", {**os.environ, **env, "PYTHONPATH": str(ROOT)}, proc


def _writer(uri: str, env: dict, rank: int, steps: int, pause: float = 0.0) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", WRITER, uri, str(rank), str(steps), str(pause)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _cli_json(capsys, *argv: str) -> dict:
    capsys.readouterr()
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _objects(uri: str, folder: str) -> dict[str, int]:
    from pyarrow import fs

    s3 = objstore.filesystem()
    try:
        infos = s3.get_file_info(fs.FileSelector(f"{objstore.split(uri)}/{folder}"))
    except FileNotFoundError:
        return {}
    return {i.base_name: i.size for i in infos if i.type == fs.FileType.File}


def test_three_processes_write_one_run_and_info_report_read_it(s3_run, capsys, tmp_path):
    uri, env, _ = s3_run
    writers = [_writer(uri, env, rank, 40) for rank in range(3)]
    for w in writers:
        out, err = w.communicate(timeout=60)
        assert w.returncode == 0, err
    info = _cli_json(capsys, "info", uri)
    assert info["run_dir"] == uri
    assert info["rows"]["spans"] == 3 * 40 * 3
    assert info["rows"]["metrics"] == 3 * 40
    assert info["rows"]["processes"] == 3
    assert info["spans"]["steps"] == 40 and info["spans"]["open"] == 0
    assert {p["rank"] for p in info["processes"]} == {0, 1, 2}
    assert all(p["state"] == "ended" and p["spans_dropped"] == 0 for p in info["processes"])
    report = _cli_json(capsys, "report", uri)
    assert report["run"]["run_id"] == info["run_id"] and report["run"]["run_dir"] == uri
    con = store.open(uri)
    assert con.execute("SELECT count(*) FROM spans").fetchone() == (360,)  # parts of another run would be refused by scan
    assert not any((tmp_path / "spool").rglob("*.parquet"))  # everything went up, spools removed


def test_sigkill_keeps_every_uploaded_part_and_the_next_process_uploads_the_rest(s3_run, tmp_path):
    uri, env, _ = s3_run
    w = _writer(uri, env, 0, -1, 0.01)
    deadline = time.monotonic() + 30
    while len(_objects(uri, "spans")) < 3:
        assert time.monotonic() < deadline and w.poll() is None, w.stderr.read() if w.poll() is not None else ""
        time.sleep(0.2)
    uploaded = _objects(uri, "spans")
    w.send_signal(signal.SIGKILL)
    w.wait(timeout=10)
    after = _objects(uri, "spans")
    assert {k: after.get(k) for k in uploaded} == uploaded  # every part it had uploaded is there, whole
    snap = store.scan(uri)  # and readable: no part is corrupt
    uploaded_rows = sum(p.rows for p in snap.parts["spans"])
    spooled = [p for p in (tmp_path / "spool").rglob("spans/*.parquet")]
    spooled_rows = sum(pq.read_metadata(p).num_rows for p in spooled if p.name not in after)
    assert uploaded_rows >= 3 * len(uploaded) and uploaded_rows % 3 == 0  # whole steps of 3 spans per part
    # the next process of the run on this host uploads what the killed one left in its spool
    w2 = _writer(uri, env, 1, 1)
    _, err = w2.communicate(timeout=60)
    assert w2.returncode == 0, err
    con = store.open(uri)
    assert con.execute("SELECT count(*) FROM spans WHERE rank = 0 AND NOT is_open").fetchone()[0] == uploaded_rows + spooled_rows
    assert con.execute("SELECT count(*) FROM spans WHERE rank = 1").fetchone()[0] == 3
    assert not any((tmp_path / "spool").rglob("*.parquet"))


@pytest.mark.slow  # about 25 s: a 15 s run with a 10 s outage in it
def test_server_unreachable_for_10s_loses_no_row(s3_run, capsys, tmp_path):
    uri, env, moto = s3_run
    steps = 300
    w = _writer(uri, env, 0, steps, 0.05)  # about 15 s: the outage falls in the middle
    assert w.stdout.readline().startswith("step")
    time.sleep(1.0)
    os.kill(moto.pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        seen = 0
        while time.monotonic() - t0 < 10:
            line = w.stdout.readline()
            if line.startswith("step"):
                seen += 1
        assert seen > 20  # the training loop kept going while the store was unreachable
        assert any((tmp_path / "spool").rglob("spans/*.parquet"))  # parts waited in the spool
    finally:
        os.kill(moto.pid, signal.SIGCONT)
    out, err = w.communicate(timeout=90)
    assert w.returncode == 0, err
    assert "done" in out, err
    info = _cli_json(capsys, "info", uri)
    assert info["rows"]["spans"] == 3 * steps
    assert info["rows"]["metrics"] == steps
    assert info["processes"][0]["spans_dropped"] == 0 and info["processes"][0]["rows_dropped"] == 0
    assert not any((tmp_path / "spool").rglob("*.parquet"))


def test_missing_run_and_unreachable_store_are_one_line_errors(s3_run, monkeypatch, capsys):
    uri, _, _ = s3_run
    assert main(["info", uri + "-nothing"]) != 0
    assert "is not an rltrace run" in capsys.readouterr().err
    missing = "s3://no-such-bucket-" + uuid.uuid4().hex[:8] + "/runs/exp1"  # not "has no run.json": no bucket at all
    assert main(["info", missing]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the bucket 'no-such-bucket-" in err and "does not exist" in err and "run.json" not in err
    with pytest.raises(store.StoreError, match="does not exist"):  # a writer is told the same
        objstore.create_or_join(missing, run_name=None, config=None)
    with pytest.raises(store.StoreError, match="not reachable"):
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{_free_port()}")
        store.open(uri)
    with pytest.raises(store.StoreError, match="not reachable"):
        store.compact(uri)


def test_writers_merge_their_parts_in_the_bucket_and_compact_merges_the_rest(s3_run, capsys):
    """Writers merge their own parts (the replaced ones leave the bucket); `rltrace compact` merges
    what writers that do not merge left (here: merging turned off), and readers see every row once."""
    uri, env, _ = s3_run
    merging = _writer(uri, env, 0, 60, 0.01)  # ~60 flush parts of 0.2 s: merged at exit at the latest
    plain = _writer(uri, {**env, "RLTRACE_MERGE_PARTS": "0"}, 1, 30, 0.05)  # ~1.5 s: several 0.2 s flushes
    for w in (merging, plain):
        _, err = w.communicate(timeout=90)
        assert w.returncode == 0, err
    spans = _objects(uri, "spans")
    mine = [n for n in spans if n.startswith("rollout0-")]
    assert len(mine) == 1 and "-m" in mine[0]  # one merged part, its inputs gone from the bucket
    assert sum(1 for n in spans if n.startswith("rollout1-")) > 1  # left as written (a merging writer leaves one part)
    con = store.open(uri)
    assert con.execute("SELECT count(*), count(DISTINCT span_id) FROM spans").fetchone() == (270, 270)
    assert main(["compact", uri, "--grace", "0"]) == 0
    spans = _objects(uri, "spans")
    assert not any(n.startswith("rollout1-") for n in spans) and sum(1 for n in spans if n.startswith("c-")) == 1
    assert "summary" in {i.split("/")[0] for i in _all_objects(uri)}  # the stored summaries went up too
    con = store.open(uri)
    assert con.execute("SELECT count(*), count(DISTINCT span_id) FROM spans").fetchone() == (270, 270)
    assert con.execute("SELECT count(*) FROM metrics").fetchone() == (90,)


def _all_objects(uri: str) -> list[str]:
    from pyarrow import fs

    base = objstore.split(uri)
    infos = objstore.filesystem().get_file_info(fs.FileSelector(base, recursive=True))
    return [i.path[len(base) + 1:] for i in infos if i.type == fs.FileType.File]


def test_export_replay_and_dashboard_accept_the_uri(s3_run, capsys, tmp_path):
    uri, env, _ = s3_run
    w = _writer(uri, env, 0, 5)
    _, err = w.communicate(timeout=60)
    assert w.returncode == 0, err
    out = tmp_path / "trace.json"
    assert main(["export", uri, "--format", "chrome", "--out", str(out)]) == 0
    events = json.loads(out.read_text())
    assert sum(1 for e in (events["traceEvents"] if isinstance(events, dict) else events) if e.get("ph") == "X") == 15
    listed = _cli_json(capsys, "replay", "list", uri)
    assert listed == {"batches": [], "skipped": []}  # read from the local copy; this run froze no batch
    assert main(["replay", "request", uri]) != 0  # it writes into the run: refused for s3:// runs
    assert "run directories on disk" in capsys.readouterr().err
    from rltrace.cli import build_parser
    from rltrace.cli import ui as ui_cli

    _, ui_env = ui_cli.command(build_parser().parse_args(["ui", uri]))
    assert uri in ui_env["RLTRACE_UI_RUNS"]
    from ui import runs

    before = runs.fingerprint(uri)
    w = _writer(uri, env, 1, 2)
    w.communicate(timeout=60)
    assert runs.fingerprint(uri) != before  # the dashboard sees new parts of the live run


FORKING = """
import os, sys, rltrace
rltrace.init(sys.argv[1], role="rollout", flush_interval=0.2)
pid = os.fork()
for i in range(20):
    with rltrace.phase("step", step=i):
        pass
rltrace.shutdown()
if pid:
    os.waitpid(pid, 0)
"""


def test_a_forked_child_shares_the_spool_and_loses_nothing(s3_run, tmp_path):
    uri, env, _ = s3_run
    proc = subprocess.run([sys.executable, "-c", FORKING, uri], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    con = store.open(uri)
    assert con.execute("SELECT count(*), count(DISTINCT process_id) FROM spans").fetchone() == (40, 2)
    assert con.execute("SELECT count(*) FROM processes WHERE ended_ns IS NOT NULL").fetchone() == (2,)
    assert not any((tmp_path / "spool").rglob("*.parquet"))


def test_a_full_spool_drops_the_oldest_parts_counted_and_uploads_the_rest(s3_run, monkeypatch):
    import pyarrow as pa

    from rltrace import _names
    from rltrace.store import rows
    from rltrace.store.parts import write_part

    uri, _, _ = s3_run
    manifest = objstore.create_or_join(uri, run_name=None, config=None)
    live = os.environ["AWS_ENDPOINT_URL"]
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{_free_port()}")  # nothing listens there
    drops = rows.Drops()
    spool = objstore.Spool(uri, manifest, drops=drops, interval=3600)  # uploads only when called here
    table = pa.table({"step": pa.array(range(1000), pa.int64()), "name": ["loss"] * 1000,
                      "value": pa.array([float(i) for i in range(1000)])})
    for i in range(6):
        write_part(spool.dir / "metrics", f"p-{i:08d}.parquet", table, _names.METRICS_TABLE)
        os.utime(spool.dir / "metrics" / f"p-{i:08d}.parquet", ns=(i * 10**9, i * 10**9))  # oldest first
    part = (spool.dir / "metrics" / "p-00000000.parquet").stat().st_size
    spool.max_bytes = int(part * 2.5)
    assert spool.upload_once() is False  # unreachable: kept, and trimmed to the limit
    left = sorted(p.name for p in (spool.dir / "metrics").iterdir())
    assert left == ["p-00000004.parquet", "p-00000005.parquet"]  # the oldest went first
    assert spool.rows_dropped == 4000
    assert drops.records() == [{"table": "metrics", "column": None, "count": 4000,
                                "reason": "object store unreachable and the local spool is full (raise RLTRACE_SPOOL_MAX_MB)"}]
    monkeypatch.setenv("AWS_ENDPOINT_URL", live)
    spool._s3 = objstore.filesystem(attempts=1)  # the store is back
    spool.close(timeout=30)
    assert store.open(uri).execute("SELECT count(*) FROM metrics").fetchone() == (2000,)
    assert not spool.dir.exists()


def test_a_full_spool_leaves_out_a_span_parts_summary_first_and_counts_no_row_lost(s3_run, monkeypatch, tmp_path, capsys):
    """A per-part summary is derived from its span part: when the spool must shrink, it goes before
    any part holding rows (even an older one), no row is counted as dropped, and the report reads
    the span part alone."""
    import shutil

    import pyarrow as pa

    import rltrace
    from rltrace import _names
    from rltrace.store import rows
    from rltrace.store.parts import write_part

    from rltrace.store import merge

    monkeypatch.setattr(merge, "SUMMARISE_ROWS", 0)  # a summary for this small part too
    uri, _, _ = s3_run
    manifest = objstore.create_or_join(uri, run_name=None, config=None)
    local = tmp_path / "local"  # the same run, written to a folder: a merged span part and its summary
    local.mkdir()
    (local / _names.RUN_MANIFEST).write_text(json.dumps(manifest))
    rltrace.init(local, role="trainer", flush_interval=0.01)
    for step in range(3):
        with rltrace.phase("train", step=step):
            for _ in range(20):
                with rltrace.phase("forward"):
                    pass
        rltrace.flush()
    rltrace.shutdown()  # merges its parts into one, with its summary beside it
    (span_part,) = (local / "spans").glob("*.parquet")
    assert (local / "span_digests" / span_part.name).is_file()
    live = os.environ["AWS_ENDPOINT_URL"]
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{_free_port()}")  # nothing listens there
    drops = rows.Drops()
    spool = objstore.Spool(uri, manifest, drops=drops, interval=3600)  # uploads only when called here
    table = pa.table({"step": pa.array(range(100), pa.int64()), "name": ["loss"] * 100,
                      "value": pa.array([float(i) for i in range(100)])})
    write_part(spool.dir / "metrics", "p-00000000.parquet", table, _names.METRICS_TABLE)
    os.utime(spool.dir / "metrics" / "p-00000000.parquet", ns=(10**9, 10**9))  # the oldest file
    for folder in ("spans", "span_digests"):
        (spool.dir / folder).mkdir()
        shutil.copy(local / folder / span_part.name, spool.dir / folder / span_part.name)
    files = [p for p in spool.dir.rglob("*.parquet")]
    spool.max_bytes = sum(p.stat().st_size for p in files) - 1  # one file must go
    # as after a merge: what the part and its summary replace leaves the bucket once they are up
    spool._retire_after[f"spans/{span_part.name}"] = ["spans/old.parquet"]
    spool._retire_after[f"span_digests/{span_part.name}"] = ["span_digests/old.parquet"]
    assert spool.upload_once() is False  # unreachable: kept, and trimmed to the limit
    assert not (spool.dir / "span_digests" / span_part.name).exists()  # the summary went, though newer
    # the summaries it replaced now leave the bucket with the span part's upload, not never
    assert spool._retire_after == {f"spans/{span_part.name}": ["spans/old.parquet", "span_digests/old.parquet"]}
    assert (spool.dir / "spans" / span_part.name).is_file() and (spool.dir / "metrics" / "p-00000000.parquet").is_file()
    assert (spool.rows_dropped, spool.spans_dropped, drops.records()) == (0, 0, [])
    monkeypatch.setenv("AWS_ENDPOINT_URL", live)
    spool._s3 = objstore.filesystem(attempts=1)  # the store is back
    spool.close(timeout=30)
    con = store.open(uri)
    assert con.execute("SELECT count(*) FROM spans").fetchone() == (63,)
    assert con.execute("SELECT count(*) FROM _rltrace_span_parts WHERE digest IS NOT NULL").fetchone() == (0,)
    steps = _cli_json(capsys, "report", uri)["steps"]
    assert [s["step"] for s in steps] == [0, 1, 2]


def test_collect_receives_otlp_into_an_s3_run(s3_run, capsys):
    from rltrace.collect.receiver import Limits, Receiver
    from tests.collect.test_receiver import JS, otlp_json, post

    uri, _, _ = s3_run
    r = Receiver(uri, "127.0.0.1", 0, Limits(flush_interval=0.2)).start()
    try:
        status, _, _ = post(r.url, json.dumps(otlp_json(7)).encode(), JS)
        assert status == 200
    finally:
        r.close()
    info = _cli_json(capsys, "info", uri)
    assert info["rows"]["spans"] == 7
    assert {p["role"] for p in info["processes"]} >= {"reward-svc"}


def test_rltrace_run_passes_the_uri_through():
    from rltrace.cli.run import environment

    assert environment("s3://bucket/runs/exp1", {})["RLTRACE_RUN_DIR"] == "s3://bucket/runs/exp1"


def test_commands_that_need_a_folder_on_disk_refuse_the_uri_instead_of_writing_locally(tmp_path, monkeypatch):
    from rltrace.store import layout

    monkeypatch.chdir(tmp_path)
    with pytest.raises(store.StoreError, match="object-store runs"):
        layout.create_or_join(Path("s3://bucket/runs/exp1"), run_name=None, config=None)
    assert not list(tmp_path.iterdir())  # no local folder named "s3:" was made


FREEZING = """
import sys, rltrace
from rltrace import replay
rltrace.init(sys.argv[1], role="trainer", flush_interval=0.2)
assert replay.freeze(3, [{"prompt_tokens": [1, 2], "response_tokens": [3], "reward": 1.0},
                         {"prompt_tokens": [4], "response_tokens": [5, 6], "reward": 0.0}])
rltrace.shutdown()
"""


def test_a_frozen_batch_reaches_the_bucket_and_replay_reads_it(s3_run, capsys):
    uri, env, _ = s3_run
    proc = subprocess.run([sys.executable, "-c", FREEZING, uri], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    listed = _cli_json(capsys, "replay", "list", uri)
    assert [b["step"] for b in listed["batches"]] == [3], listed
    shown = _cli_json(capsys, "replay", "show", uri, "--step", "3")
    assert len(shown["samples"]) == 2


class _SlowListing:
    """The bucket as a slow store lists it: every full listing takes minutes (here: the clock of
    `rltrace.store.compact` moves on 400 s), as ~400 small objects did on a real bucket."""

    def __init__(self, s3, clock):
        self._s3, self._clock = s3, clock

    def get_file_info(self, what):
        from pyarrow import fs

        if isinstance(what, fs.FileSelector):
            self._clock[0] += 400 * 10**9
        return self._s3.get_file_info(what)

    def __getattr__(self, name):
        return getattr(self._s3, name)


def test_compaction_on_a_slow_bucket_leaves_a_live_writers_parts_to_it(s3_run, monkeypatch):
    """A writer is running (merging its own parts, and everything at exit) while `rltrace compact`
    runs on a bucket whose listing takes minutes: the writer is judged alive from its heartbeat as
    of the listing, its parts are left to it, and after it exits every span is there once."""
    import types

    import importlib

    compacting = importlib.import_module("rltrace.store.compact")

    uri, env, _ = s3_run
    writer = _writer(uri, env, 0, 60, 0.05)  # ~3 s of steps; a flush part every 0.2 s
    for _ in range(20):  # its first parts are up
        assert writer.stdout.readline().startswith("step")
    time.sleep(1.0)
    assert any(n.startswith("rollout0-") for n in _objects(uri, "spans"))
    clock, real = [0], objstore.filesystem
    monkeypatch.setattr(objstore, "filesystem", lambda *a, **k: _SlowListing(real(*a, **k), clock))
    monkeypatch.setattr(compacting, "time", types.SimpleNamespace(
        time_ns=lambda: time.time_ns() + clock[0], time=lambda: time.time() + clock[0] / 1e9, sleep=time.sleep))
    store.compact(uri, grace_s=0)
    assert clock[0] >= 400 * 10**9  # the listing took "minutes"
    monkeypatch.setattr(objstore, "filesystem", real)
    assert not any(n.startswith("c-") for n in _objects(uri, "spans"))  # nothing of the live writer's was taken
    _, err = writer.communicate(timeout=90)
    assert writer.returncode == 0, err
    con = store.open(uri)
    assert con.execute("SELECT count(*), count(DISTINCT span_id) FROM spans").fetchone() == (180, 180)


def test_a_writer_paused_past_its_heartbeat_and_a_compaction_still_count_each_span_once(s3_run, monkeypatch):
    """The case of a writer stopped (SIGSTOP) for longer than compaction's liveness window while
    `rltrace compact` runs: its parts are merged on their own (not with a finished writer's), so
    when it resumes and merges them itself, readers read the compaction's part not at all."""
    import importlib
    import types

    compacting = importlib.import_module("rltrace.store.compact")
    uri, env, _ = s3_run
    done = _writer(uri, env, 1, 30, 0.0)  # a writer that finishes: one small merged part of its own
    assert done.wait(timeout=90) == 0
    paused = _writer(uri, env, 0, 60, 0.05)
    for _ in range(20):
        assert paused.stdout.readline().startswith("step")
    time.sleep(1.0)  # its first flush parts are up
    os.kill(paused.pid, signal.SIGSTOP)
    try:
        late = compacting.LIVE_S + 100  # compaction runs as if the writer had been silent this long
        monkeypatch.setattr(compacting, "time", types.SimpleNamespace(
            time_ns=lambda: time.time_ns() + int(late * 1e9), time=lambda: time.time() + late, sleep=time.sleep))
        store.compact(uri, grace_s=0)
        assert any(n.startswith("c-") for n in _objects(uri, "spans"))  # it took the silent writer's parts
    finally:
        os.kill(paused.pid, signal.SIGCONT)
    _, err = paused.communicate(timeout=90)
    assert paused.returncode == 0, err
    con = store.open(uri)
    assert con.execute("SELECT count(*), count(DISTINCT span_id) FROM spans").fetchone() == (270, 270)


class _Flaky:
    """The writer's S3 client with chosen deletes refused (the store timing out)."""

    def __init__(self, real):
        self.real, self.refuse = real, set()

    def __getattr__(self, name):
        return getattr(self.real, name)

    def delete_file(self, key):
        if key.rsplit("/", 1)[-1] in self.refuse:
            raise OSError("When deleting key: AWS Error NETWORK_CONNECTION during DeleteObject operation: timed out")
        return self.real.delete_file(key)


def test_parts_left_in_the_bucket_by_an_outage_are_read_once(s3_run, monkeypatch, capsys):
    """What an outage leaves behind, made to happen at chosen moments (no timing, no load): a merged
    part merged again before it was ever uploaded (its inputs were already up), deletes of replaced
    parts that fail, and a PUT the store took whose answer never came. Every reader counts each span
    once at every moment, and what stays in the bucket is deleted once the store works again."""
    import rltrace
    from rltrace.store import merge

    uri, _, _ = s3_run
    monkeypatch.setenv("RLTRACE_MERGE_GRACE", "0")
    monkeypatch.setattr(merge, "FLUSH_PARTS", 10**6)  # merges happen only when asked for here
    monkeypatch.setattr(merge, "MAX_AGE_S", 1e9)
    run = rltrace.init(uri, role="rollout", flush_interval=3600)
    spool = run._spool
    spool._stop.set()
    spool._wake.set()
    spool._thread.join()  # uploads happen only when asked for here
    s3 = spool._s3 = _Flaky(spool._s3)
    lose_answer = set()
    real_put = objstore.put

    def put(client, key, data):  # the store takes the object, the answer is lost (a client timeout)
        real_put(client, key, data)
        if key.rsplit("/", 1)[-1] in lose_answer:
            lose_answer.discard(key.rsplit("/", 1)[-1])
            raise OSError("AWS Error NETWORK_CONNECTION during PutObject operation: curlCode: 28, Timeout was reached")

    monkeypatch.setattr(objstore, "put", put)
    steps = [0]

    def record() -> str:
        """One span, flushed into the spool (not uploaded); the name of its part."""
        before = set(os.listdir(spool.dir / "spans")) if (spool.dir / "spans").is_dir() else set()
        with rltrace.phase("step", step=steps[0]):
            pass
        steps[0] += 1
        run.tracer_provider.force_flush()
        (name,) = set(os.listdir(spool.dir / "spans")) - before
        return name

    def counts() -> tuple[int, int]:
        con = store.open(uri)
        return con.execute("SELECT count(*), count(DISTINCT (trace_id, span_id)) FROM spans WHERE NOT is_open").fetchone()

    # 1. flush parts uploaded, merged into a part that is merged again before it is ever uploaded
    record(), record()
    assert spool.upload_once()
    run.merger.tick(final=True)  # m1 waits in the spool (the store is away); it is to delete the two
    record()
    run.merger.tick(final=True)  # m2 = m1 + the third part: m1 never goes up
    assert spool.upload_once()
    assert counts() == (3, 3)
    assert len(_objects(uri, "spans")) == 1  # the two flush parts left the bucket once m2 was up
    # 2. the deletes of what a merged part replaces fail; that part is merged again and deleted
    (m2,) = _objects(uri, "spans")
    f4 = record()
    assert spool.upload_once()
    run.merger.tick(final=True)  # m3 = m2 + f4
    s3.refuse |= {m2, f4}
    assert spool.upload_once()  # m3 up; m2 and f4 stay in the bucket, hidden by m3
    assert set(_objects(uri, "spans")) >= {m2, f4} and counts() == (4, 4)
    record()
    run.merger.tick(final=True)  # m4 = m3 + f5; m3's delete works, m2's and f4's still fail
    assert spool.upload_once()
    assert set(_objects(uri, "spans")) >= {m2, f4} and counts() == (5, 5)
    # 3. a PUT the store took but whose answer was lost; the part is merged before it goes up again
    f6 = record()
    lose_answer.add(f6)
    assert not spool.upload_once()  # "failed": f6 is in the bucket all the same
    assert f6 in _objects(uri, "spans") and counts() == (6, 6)
    run.merger.tick(final=True)  # m5 = m4 + f6
    assert spool.upload_once() and counts() == (6, 6)
    record()
    run.merger.tick(final=True)  # m6 = m5 + f7; m5 leaves the bucket
    assert spool.upload_once() and counts() == (7, 7)
    info = _cli_json(capsys, "info", uri)
    assert info["rows"]["spans"] == 7
    # the store works again: what stayed is deleted (at exit at the latest), and nothing counts twice
    s3.refuse.clear()
    rltrace.shutdown()
    assert len(_objects(uri, "spans")) == 1 and counts() == (7, 7)
    assert main(["compact", uri, "--grace", "0"]) == 0
    assert counts() == (7, 7)
