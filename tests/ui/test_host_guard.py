"""DNS rebinding guard: the dashboard answers only the host names it is reached by on this machine
(and --host), so a web page whose name re-resolves to 127.0.0.1 cannot read it."""

from __future__ import annotations

import asyncio
import http.client
import subprocess

from rltrace.cli import build_parser
from rltrace.cli import ui as ui_cli
from rltrace.testing import RunBuilder
from rltrace.ui.serve import HostGuard, host_name
from tests.conftest import python_env

from .test_browser import _free_port, _wait_healthy


def test_host_names_lose_their_port():
    assert [host_name(h) for h in ("localhost:8501", "127.0.0.1", "[::1]:8501", "EVIL.example:80", "::1")] == [
        "localhost", "127.0.0.1", "[::1]", "evil.example", "::1"]


def test_the_served_names_follow_the_bind_address():
    served = {h: ui_cli.served_hosts(h) for h in ("127.0.0.1", "10.1.2.3", "::1", "0.0.0.0")}
    assert served["127.0.0.1"] == ["localhost", "127.0.0.1", "[::1]"]
    assert served["10.1.2.3"] == ["localhost", "127.0.0.1", "[::1]", "10.1.2.3"]
    assert served["::1"] == ["localhost", "127.0.0.1", "[::1]"]
    assert served["0.0.0.0"] == ["*"]  # every interface: reached by names this machine cannot know


def _call(guard: HostGuard, kind: str, host: bytes) -> list[dict]:
    sent: list[dict] = []

    async def send(message):
        sent.append(message)

    async def receive():
        return {"type": f"{kind}.disconnect"}

    asyncio.run(guard({"type": kind, "headers": [(b"host", host)]}, receive, send))
    return sent


def test_the_guard_refuses_other_hosts_before_the_app_runs():
    reached = []

    async def app(scope, receive, send):
        reached.append(scope["type"])

    guard = HostGuard(app, ["localhost", "127.0.0.1"])
    assert _call(guard, "http", b"localhost:8501") == [] and reached == ["http"]
    refused = _call(guard, "http", b"evil.example:8501")
    assert refused[0]["status"] == 403 and reached == ["http"]
    assert _call(guard, "websocket", b"evil.example:8501") == [{"type": "websocket.close", "code": 1008}]
    assert reached == ["http"]


def _status(port: int, host: str, path: str = "/_stcore/health", **headers: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    conn.putrequest("GET", path, skip_host=True)
    conn.putheader("Host", host)
    for k, v in headers.items():
        conn.putheader(k.replace("_", "-"), v)
    conn.endheaders()
    status = conn.getresponse().status
    conn.close()
    return status


def test_a_running_dashboard_answers_only_its_own_names(tmp_path):
    b = RunBuilder(tmp_path / "run")
    b.process("trainer").span("train", 0, 1, step=0)
    b.write()
    port = _free_port()
    args = build_parser().parse_args(["ui", str(b.run_dir), "--port", str(port)])
    argv, env = ui_cli.command(args)
    server = subprocess.Popen(argv, env={**env, **python_env()}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_healthy(server, port)
        assert _status(port, f"localhost:{port}") == 200
        assert _status(port, f"127.0.0.1:{port}", "/") == 200
        assert _status(port, f"evil.example:{port}") == 403
        assert _status(port, f"evil.example:{port}", "/") == 403
        upgrade = {"Connection": "Upgrade", "Upgrade": "websocket", "Sec_WebSocket_Version": "13",
                   "Sec_WebSocket_Key": "dGhlIHNhbXBsZSBub25jZQ=="}
        assert _status(port, f"evil.example:{port}", "/_stcore/stream", **upgrade) == 403
    finally:
        server.terminate()
        server.wait(timeout=30)

