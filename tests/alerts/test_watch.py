"""Delivery (a loopback HTTP receiver, a command), the `rltrace watch` command, and the quiet cases."""

from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rltrace.alerts import AlertRuleError, Delivery, Settings, Threshold, Watcher, evaluate
from rltrace.cli import main as cli
from rltrace import _names, store
from rltrace.store.parts import write_part
from rltrace.testing import T0_NS, RunBuilder


def _threshold_run(path, *, ended=False):
    b = RunBuilder(path)
    b.process("trainer").span("train", 0, 1, step=0)
    for step, reward in enumerate([0.5, 0.4, 0.1]):
        b.metric(step, "reward_mean", reward)
    b.write()
    return b.run_dir


class _Receiver:
    """A loopback HTTP server that records POSTed bodies; `delay` makes it hang before answering."""

    def __init__(self, delay: float = 0.0, status: int = 200):
        bodies = self.bodies = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                time.sleep(delay)
                self.send_response(status)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_new_alerts_are_posted_to_the_webhook(tmp_path):
    receiver = _Receiver()
    try:
        delivery = Delivery(receiver.url)
        watcher = Watcher(_threshold_run(tmp_path / "run"), Settings(thresholds=(Threshold.parse("reward_mean<0.2"),), rules=("threshold",)), delivery)
        firing, new = watcher.check()
        assert len(firing) == len(new) == 1
        assert delivery.wait(10)
        (body,) = receiver.bodies
        assert body["rule"] == "threshold" and body["metric"] == "reward_mean" and body["step"] == 2
        assert body["message"] == "reward_mean = 0.1 at step 2 crossed reward_mean<0.2 (since step 2, 1 step(s))."
        assert delivery.sent == 1 and delivery.failures == 0
        watcher.check()
        assert delivery.wait(5) and len(receiver.bodies) == 1  # raised once
    finally:
        receiver.close()


def test_a_webhook_that_is_down_never_blocks_the_watcher(tmp_path):
    hanging = _Receiver(delay=3.0)
    failing = _Receiver(status=500)
    try:
        run = _threshold_run(tmp_path / "run")
        settings = Settings(thresholds=(Threshold.parse("reward_mean<0.2"), Threshold.parse("reward_mean<0.3")),
                            rules=("threshold",))
        slow = Delivery(hanging.url, timeout=2.5)  # the receiver answers after 3 s: each post times out at 2.5 s
        assert len(Watcher(run, settings, slow).check()[1]) == 2
        assert (slow.sent, slow.failures) == (0, 0)  # the check returned before either post ended: it did not wait
        assert slow.wait(10) and slow.failures == 2 and slow.sent == 0  # both timed out, counted
        refused = Delivery("http://127.0.0.1:9/nothing-listens", timeout=0.5)
        refused.send({"key": "k", "rule": "hang", "message": "m"})
        assert refused.wait(10) and refused.failures == 1
        error = Delivery(failing.url)
        error.send({"key": "k", "rule": "hang", "message": "m"})
        assert error.wait(10) and error.failures == 1
    finally:
        hanging.close()
        failing.close()


def test_exec_gets_the_alert_on_stdin(tmp_path):
    out = tmp_path / "got.json"
    command = f"{sys.executable} -c \"import sys; open({str(out)!r}, 'w').write(sys.stdin.read())\""
    delivery = Delivery(command=command)
    Watcher(_threshold_run(tmp_path / "run"), Settings(thresholds=(Threshold.parse("reward_mean<0.2"),), rules=("threshold",)), delivery).check()
    assert delivery.wait(30) and delivery.failures == 0
    assert json.loads(out.read_text())["rule"] == "threshold"
    bad = Delivery(command=f"{sys.executable} -c 'raise SystemExit(4)'")
    bad.send({"key": "k"})
    assert bad.wait(30) and bad.failures == 1


def test_watch_once_exits_1_when_an_alert_holds(tmp_path, capsys):
    run = str(_threshold_run(tmp_path / "run"))
    assert cli(["watch", run, "--once", "--rules", "threshold", "--threshold", "reward_mean<0.2"]) == 1
    out = capsys.readouterr().out
    assert "ALERT threshold: reward_mean = 0.1 at step 2 crossed reward_mean<0.2" in out
    assert cli(["watch", run, "--once", "--rules", "threshold", "--threshold", "reward_mean<0.05"]) == 0
    assert store.open(run).execute("SELECT count(*) FROM alerts").fetchone()[0] == 1


@pytest.mark.parametrize(
    "args, message",
    [
        (["--threshold", "reward_mean"], "is not METRIC<VALUE"),
        (["--webhook", "file:///etc/passwd"], "is not an http:// or https:// URL"),
        (["--rules", "hang,nope"], "unknown rule"),
        (["--heartbeat", "0"], "heartbeat_s must be > 0"),
        (["--exec", "'"], "cannot be split"),
    ],
)
def test_bad_settings_are_one_line_errors(tmp_path, capsys, args, message):
    assert cli(["watch", str(_threshold_run(tmp_path / "run")), "--once", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_a_run_that_ended_cleanly_raises_no_time_alerts(tmp_path):
    """Open spans and old heartbeats of a finished run are history, not a hang."""
    b = RunBuilder(tmp_path / "run")
    tr = b.process("trainer")
    for step in range(4):
        tr.span("step", step, step + 1, step=step)
    tr.span("train", 4, None, step=4)
    b.write()
    con = store.open(b.run_dir)
    settings = Settings(stall_min_s=1, heartbeat_s=1, starved_s=1, hang_s=1)
    assert {a.rule for a in evaluate(con, settings)} == {"no_progress", "heartbeat", "hang"}  # killed: no clean end
    (part,) = (b.run_dir / _names.PROCESSES.folder).glob("*.parquet")
    row = pq.read_table(part).to_pylist()[0] | {"ended_ns": T0_NS + 5 * 10**9}  # shutdown() ran
    write_part(part.parent, part.name, pa.Table.from_pylist([row], schema=_names.PROCESSES_SCHEMA), _names.PROCESSES)
    assert evaluate(store.open(b.run_dir), settings) == []


def test_a_wait_whose_upstream_ran_is_not_starved(tmp_path):
    b = RunBuilder(tmp_path / "run")
    tr, ro = b.process("trainer"), b.process("rollout")
    tr.span("wait", 0, None, step=0, waiting_for="generate")
    ro.span("generate", 1, 2, step=0)  # produced after the wait began: the buffer is not empty for lack of work
    tr.span("wait", 0, None, step=0, waiting_for="rollout", name="wait_rollout")
    b.write()
    alerts = evaluate(store.open(b.run_dir), Settings(starved_s=1, rules=("starved",)))
    assert [a.message.split(" while")[0].split("for ")[-1] for a in alerts] == ["rollout at step 0"]


def test_a_hang_dump_surfaces_as_an_alert_with_the_dump_attached(tmp_path):
    """The process's own watchdog (RLTRACE_HANG_TIMEOUT=30) dumped the stacks of an open `generate`."""
    b = RunBuilder(tmp_path / "run")
    ro = b.process("rollout", 1)
    for step in range(6):
        ro.span("generate", step, step + 0.5, step=step)
    hung = ro.span("generate", 6, None, step=6)
    b.write()
    dump = {name: None for name in _names.PROFILES_SCHEMA.names} | {
        "profile_id": "p1", "trace_id": hung.trace_id, "span_id": hung.span_id, "phase": "generate", "step": 6,
        "kind": "pyspy_dump", "trigger": "hang", "elapsed_s": 30.0, "status": "ok", "path": "profiles/files/p1.txt"}
    write_part(b.run_dir / _names.PROFILES.folder, "p1.parquet", pa.Table.from_pylist([dump], schema=_names.PROFILES_SCHEMA),
               _names.PROFILES)
    con = store.open(b.run_dir)
    settings = Settings(rules=("hang",))  # no median-based limit is near: 10x 0.5 s is under the 300 s floor
    assert evaluate(con, settings, now_ns=T0_NS + 20 * 10**9) == []  # open 14 s: under the dump's 30 s
    (alert,) = evaluate(con, settings, now_ns=T0_NS + 40 * 10**9)
    assert (alert.phase, alert.step, alert.rank, alert.span_id) == ("generate", 6, 1, hung.span_id)
    assert (alert.profile_id, alert.profile_path) == ("p1", "profiles/files/p1.txt") and alert.limit_s == 30.0
    assert "RLTRACE_HANG_TIMEOUT" in alert.message and "has been open for 34.0 s" in alert.message


def test_a_nul_in_a_phase_or_role_name_is_delivered_escaped(tmp_path):
    """Names come from the run: a NUL in one cannot go into the command's environment as it is
    ("embedded null byte"); the alert is delivered with it escaped, on stdin, in the environment and
    to the webhook."""
    b = RunBuilder(tmp_path / "run")
    b.process("roll\x00out").span("gen\x00erate", 0, None, step=0)
    b.write()
    out = tmp_path / "got.json"
    script = (f"import json, os, sys; open({str(out)!r}, 'w').write(json.dumps("
              "{'stdin': sys.stdin.read(), 'message': os.environ['RLTRACE_ALERT_MESSAGE'], 'alert': os.environ['RLTRACE_ALERT_JSON']}))")
    receiver = _Receiver()
    try:
        delivery = Delivery(receiver.url, command=f"{sys.executable} -c \"{script}\"")
        (alert,), _ = Watcher(b.run_dir, Settings(hang_s=1, rules=("hang",)), delivery).check()
        assert "\x00" in alert.message
        assert delivery.wait(30) and delivery.failures == 0 and delivery.sent == 2
    finally:
        receiver.close()
    got = json.loads(out.read_text())
    assert json.loads(got["stdin"])["message"] == json.loads(got["alert"])["message"] == alert.message  # JSON: \u0000
    assert "\x00" not in got["message"] and "gen\\x00erate" in got["message"]
    assert receiver.bodies[0]["message"] == alert.message
