"""A real OTLP backend for tests: Arize Phoenix on loopback, started once per test session."""

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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def phoenix(tmp_path_factory):
    """Base URL of a running `phoenix serve` (OTLP/HTTP at /v1/traces, REST API at /v1/...)."""
    if importlib.util.find_spec("phoenix") is None:
        message = "Arize Phoenix is not installed: pip install 'rltrace[dev]'"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    port, grpc_port = free_port(), free_port()
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
    try:
        while True:
            try:
                urllib.request.urlopen(url + "/healthz", timeout=2)
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"Phoenix did not start (see {log.name})")
                time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def phoenix_spans(url: str, trace_ids: set[str], expected: int, timeout_s: float = 60) -> list[dict]:
    """The spans of these traces that Phoenix holds, once it has `expected` of them (it ingests
    in the background, so there is nothing to wait on but its API)."""
    deadline = time.monotonic() + timeout_s
    while True:
        with urllib.request.urlopen(url + "/v1/projects/default/spans?limit=1000", timeout=10) as resp:
            rows = json.loads(resp.read())["data"]
        found = [r for r in rows if r["context"]["trace_id"] in trace_ids]
        if len(found) >= expected or time.monotonic() > deadline:
            return found
        time.sleep(0.5)
