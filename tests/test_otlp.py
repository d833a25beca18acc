"""The same spans reach a real OpenTelemetry backend: Arize Phoenix, started on loopback."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

import rltrace
from rltrace import store

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str):
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory):
    if importlib.util.find_spec("phoenix") is None:
        message = "Arize Phoenix is not installed: pip install 'rltrace[dev]'"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    port, grpc_port = _free_port(), _free_port()
    env = dict(
        os.environ,
        PHOENIX_WORKING_DIR=str(tmp_path_factory.mktemp("phoenix")),
        PHOENIX_PORT=str(port),
        PHOENIX_GRPC_PORT=str(grpc_port),
        PHOENIX_HOST="127.0.0.1",
    )
    log = open(tmp_path_factory.mktemp("phoenix-log") / "phoenix.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "phoenix.server.main", "serve"], env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 240
    while True:
        try:
            urllib.request.urlopen(url + "/healthz", timeout=2)
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"Phoenix did not start (see {log.name})")
            time.sleep(1)
    yield url
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


def _phoenix_spans(url: str, trace_ids: set[str], expected: int) -> list[dict]:
    deadline = time.monotonic() + 60
    while True:
        rows = _get(url + "/v1/projects/default/spans?limit=1000")["data"]
        found = [r for r in rows if r["context"]["trace_id"] in trace_ids]
        if len(found) >= expected or time.monotonic() > deadline:
            return found
        time.sleep(1)


@pytest.mark.parametrize("via", ["argument", "environment"])
def test_spans_reach_phoenix_and_the_store_alike(phoenix, run_dir, monkeypatch, via):
    if via == "environment":
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", phoenix)
        rltrace.init(run_dir, role="trainer", rank=0)
    else:
        rltrace.init(run_dir, role="trainer", rank=0, otlp_endpoint=phoenix)
    with rltrace.phase("step", step=4, weight_version=2):
        with rltrace.phase("weight_sync", bytes=4096, method="disk"):
            pass
    rltrace.shutdown()
    stored = store.open(run_dir).execute("SELECT trace_id, span_id, parent_span_id, name FROM spans ORDER BY start_ns").fetchall()
    found = _phoenix_spans(phoenix, {stored[0][0]}, 2)
    got = {(r["context"]["span_id"], r["parent_id"], r["name"]) for r in found}
    assert got == {(s, p, n) for _, s, p, n in stored}
    sync = next(r for r in found if r["name"] == "weight_sync")
    assert sync["attributes"]["rl.step"] == 4 and sync["attributes"]["rl.bytes"] == 4096
    assert sync["attributes"]["rl.method"] == "disk" and sync["attributes"]["rl.phase"] == "weight_sync"
