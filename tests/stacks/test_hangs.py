"""Real processes hung the ways RL jobs hang; each process's own stack thread writes its stacks
into the run (no ptrace), and `rltrace stacks`, `watch` and `report` name the blocking edge."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

import pytest

from rltrace import store
from rltrace.cli import main
from rltrace.stacks import edges

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = Path(__file__).with_name("hung.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(run_dir, *args, **env):
    full = {**os.environ, "PYTHONPATH": str(ROOT), "RLTRACE_RUN_DIR": str(run_dir), "RLTRACE_FLUSH_INTERVAL": "0.2",
            **{k: str(v) for k, v in env.items()}}
    full.pop("PYTEST_CURRENT_TEST", None)
    return subprocess.Popen([sys.executable, str(PROGRAM), *args], env=full, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _until(proc, word: str, timeout: float = 60.0) -> str:
    """Read the program's output until a line starting with `word`."""
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            pytest.fail(f"the program ended before {word!r}: {''.join(seen)}")
        seen.append(line)
        if line.startswith(word):
            return line
    pytest.fail(f"no {word!r} within {timeout} s: {''.join(seen)}")


def _edges(run_dir):
    con = store.open(run_dir)
    try:
        return edges(con)
    finally:
        con.close()


@pytest.fixture
def procs():
    started = []
    yield started
    for p in started:
        if isinstance(p, int):
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
            continue
        p.kill()
        p.wait(timeout=10)


def test_a_collective_one_rank_never_entered_then_a_rank_killed_in_it(tmp_path, capsys, procs):
    """gloo on CPU, world 2: rank 1 skips the step-3 all_reduce and waits for a batch; rank 0 blocks
    in it. The stacks name both sides; once rank 1 is killed (its peers' connections held open, as
    when a host vanishes), the edge says it stopped, by its free writer lock."""
    run_dir = tmp_path / "run"
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": _free_port(), "RLTRACE_STACKS_AFTER": 1,
           "TORCH_FR_BUFFER_SIZE": 64}  # torch's Flight Recorder on: the collectives are numbered
    rank0 = _start(run_dir, "collective", "0", **env)
    rank1 = _start(run_dir, "collective", "1", HUNG_HOLD=1, **env)
    procs.extend([rank0, rank1])
    _until(rank0, "HUNG")
    holder = int(_until(rank1, "HOLDER").split()[1])
    procs.append(holder)
    _until(rank1, "HUNG")

    assert main(["stacks", str(run_dir), "--wait", "15"]) == 0
    out = capsys.readouterr().out
    assert "Asked 2 live process(es) for their stacks; 2 answered" in out
    edge = ("trainer0 has been in torch.distributed.all_reduce (weight_sync, step 3) for ")
    assert edge in out
    assert "(collective #4 on process group default_pg); trainer1 never entered it: it is in time.sleep in " \
        "wait_for_batch (train, step 4); its last collective there is #3." in out, out
    assert "distributed_c10d.py" in out and "in all_reduce: work.wait()" in out  # the stack line that proves it
    assert 'hung.py", line' in out and "in wait_for_batch" in out  # every process's stacks, printed

    deadline = time.monotonic() + 10
    while True:  # each process's own thread dumps by itself once its open work passes RLTRACE_STACKS_AFTER
        con = store.open(run_dir)
        try:
            hang_dumps = con.execute("SELECT count(DISTINCT process_id) FROM stacks WHERE trigger = 'hang'").fetchone()[0]
        finally:
            con.close()
        if hang_dumps == 2 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert hang_dumps == 2

    assert main(["watch", str(run_dir), "--once", "--hang-after", "1", "--stacks-wait", "0", "--rules", "hang"]) == 1
    out = capsys.readouterr().out
    alert = next(line for line in out.splitlines() if "weight_sync on trainer0" in line)
    assert edge in alert and "trainer1 never entered it" in alert
    other = next(line for line in out.splitlines() if "train on trainer1" in line)
    assert "trainer1 never entered it" in other  # the rank that never entered is told what waits on it

    rank1.kill()
    rank1.wait(timeout=10)
    deadline = time.monotonic() + 10
    while True:
        found = _edges(run_dir)
        if found and found[0].kind == "dead_rank" or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert found[0].kind == "dead_rank", [e.text for e in found]
    assert found[0].text.startswith(edge[:-len(" for ")])
    assert "trainer1 has stopped while in train, step 4: its writer lock is free (killed?)" in found[0].text
    assert rank0.poll() is None  # still blocked: the collective never fails with the connections held


def test_an_engine_that_accepted_and_never_answers(tmp_path, capsys, procs):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    accepted = []
    threading.Thread(target=lambda: accepted.append(server.accept()), daemon=True).start()
    try:
        proc = _start(tmp_path / "run", "http", f"http://127.0.0.1:{port}/generate")
        procs.append(proc)
        _until(proc, "HUNG")
        deadline = time.monotonic() + 10
        while not accepted and time.monotonic() < deadline:
            time.sleep(0.05)
        bundle = tmp_path / "hang.tar.gz"
        assert main(["stacks", str(tmp_path / "run"), "--wait", "10", "--bundle", str(bundle)]) == 0
        out = capsys.readouterr().out
        assert (f"trainer0's rollout has been blocked " in out and f"reading from 127.0.0.1:{port} (generate, step 0); "
                "no span of another process has ended since it began" in out), out
        assert "the other side accepted and never answered" in out
        assert "socket.py" in out and "readinto" in out
        with tarfile.open(bundle) as tar:  # what a user attaches to a bug report
            files = {m.name.split("/", 1)[1]: tar.extractfile(m).read() for m in tar.getmembers()}
        assert set(files) == {"edges.json", "stacks.json", "open_spans.json", "processes.json", "alerts.json",
                              "crashes.json", "steps.json", "stacks.txt"}
        edge = json.loads(files["edges.json"])[0]
        assert edge["peer"] == f"127.0.0.1:{port}" and edge["phase"] == "rollout"
        assert {o["phase"] for o in json.loads(files["open_spans.json"])} == {"step", "rollout"}
        assert f"reading from 127.0.0.1:{port}" in files["stacks.txt"].decode()
    finally:
        server.close()
        for conn, _ in accepted:
            conn.close()


def test_a_queue_no_one_will_fill(tmp_path, capsys, procs):
    proc = _start(tmp_path / "run", "queue")
    procs.append(proc)
    _until(proc, "HUNG")
    assert main(["stacks", str(tmp_path / "run"), "--wait", "15", "--native"]) == 0
    out = capsys.readouterr().out
    # py-spy's native frames where it may read the process (it runs as the process's child), else why not
    native = out[out.index("native frames (py-spy), innermost first:"):]
    assert "Queue.get (" in native and "acquire" in native or "py-spy" in native
    edge = ("trainer0 has been waiting {} in queue.Queue.get in consume (rollout, step 0); no producer is alive: no "
            "other thread of it has open work and no other process is in the run.")
    before, after = edge.split("{}")
    assert before in out and after in out, out
    assert "queue.py" in out and "in Queue.get" in out

    assert main(["report", str(tmp_path / "run"), "--json"]) == 0  # the report says it too, with the stack lines
    report = json.loads(capsys.readouterr().out)
    assert any(f.startswith("Blocked: " + before) and f.endswith(after) for f in report["findings"]), report["findings"]
    assert report["blocking"][0]["kind"] == "queue" and any("queue.py" in line for line in report["blocking"][0]["proof"])


@pytest.mark.slow  # a local Ray cluster takes 10-40 s to start on 2 cores
def test_a_ray_actor_call_that_never_returns(tmp_path, capsys, procs):
    proc = _start(tmp_path / "run", "ray")
    procs.append(proc)
    try:
        _until(proc, "HUNG", timeout=120)
        assert main(["stacks", str(tmp_path / "run"), "--wait", "10"]) == 0
        out = capsys.readouterr().out
        assert "trainer0 has been waiting " in out and (" in ray.get in ray_actor (rollout, step 0): a Ray task or actor "
                                                       "call it awaits has not returned.") in out, out
        assert "ray/_private/worker.py" in out
    finally:
        proc.terminate()  # the driver's exit takes its local Ray cluster down with it
        proc.wait(timeout=60)
