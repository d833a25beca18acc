"""The stack thread: each traced process dumps every thread's Python stack into its own run, without
ptrace, when its innermost open work passes the hang limit and whenever `rltrace stacks` asks.

One daemon thread (`rltrace-stacks`) per process wakes every second: it looks at the run's
request record (a stat on disk; a HEAD every few seconds in a bucket) and at the ages of the
open spans it already holds (`LiveSpans`). Nothing runs on the training thread. A dump is
`sys._current_frames()` plus, per thread, its open spans (matched by `thread.id`) and the peer
of a socket it is reading from, written as one `stacks` part (uploaded like any part).
"""

from __future__ import annotations

import json
import linecache
import logging
import os
import socket
import sys
import threading
import time
import uuid
from pathlib import Path

import pyarrow as pa

from rltrace import _names
from rltrace.store.parts import write_part
from rltrace.store.writer import PartNamer, after_fork_in_child

logger = logging.getLogger("rltrace")

TICK_S = 1.0  # how often the thread looks at the open spans and (on disk) the request record
BUCKET_POLL_S = 3.0  # in a bucket: one HEAD of the request record this often
REQUEST_TTL_S = 120.0  # an older request is not answered (a process that starts later has nothing to add)
MAX_FRAMES = 64  # innermost frames kept per thread
MAX_HANG_DUMPS = 20  # hang dumps per process (requests are always answered)
DEFAULT_AFTER_S = 300.0  # as `rltrace watch`'s least hang limit (`analysis.health.HANG_MIN_S`)
NONE_LIVE_S = 3.0  # in a bucket, `ask_and_wait` finding no live process looks again this long before giving up
_PEER_DEPTH = 8  # innermost frames searched for the socket being read


REQUEST = f"{_names.STACK_REQUESTS}/latest.json"  # the run's latest stack request, relative to the run


def frames_of(frame) -> list[list]:
    """[file, line, function, source line] from `frame` outwards, innermost first."""
    out = []
    while frame is not None and len(out) < MAX_FRAMES:
        code = frame.f_code
        line = frame.f_lineno or 0
        out.append([code.co_filename, line, getattr(code, "co_qualname", code.co_name),
                    linecache.getline(code.co_filename, line).strip()[:200]])
        frame = frame.f_back
    return out


def _address(sock) -> str | None:
    try:
        peer = sock.getpeername()
    except (OSError, ValueError, TypeError):
        return None
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return str(peer) if peer else None


def peer_of(frame) -> str | None:
    """host:port of the socket a blocked thread reads from: a `sock` local, or `self._sock` /
    `self.sock` (socket.SocketIO, ssl, httpcore) of one of its innermost frames."""
    for _ in range(_PEER_DEPTH):
        if frame is None:
            return None
        names = frame.f_code.co_varnames
        if "self" in names or "sock" in names:
            local = frame.f_locals
            for candidate in (local.get("sock"), getattr(local.get("self"), "_sock", None),
                              getattr(local.get("self"), "sock", None), local.get("self")):
                if isinstance(candidate, socket.socket):
                    address = _address(candidate)
                    if address:
                        return address
        frame = frame.f_back
    return None


def _span_record(span) -> dict:
    attrs = span.attributes or {}
    return {"span_id": f"{span.context.span_id:016x}", "phase": attrs.get(_names.PHASE) or span.name,
            "step": attrs.get(_names.STEP), "start_ns": span.start_time}


FR_KEPT = 16  # Flight Recorder entries kept per thread, newest


def flight_recorder() -> dict:
    """thread ident -> JSON text of its last collectives as torch's Flight Recorder holds them
    (enabled by TORCH_FR_BUFFER_SIZE); {} when torch.distributed is not in use or it is off."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return {}
    if not any(os.environ.get(v, "0") not in ("", "0") for v in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")):
        return {}
    try:
        from torch._C._distributed_c10d import _dump_fr_trace_json

        trace = json.loads(_dump_fr_trace_json(True, False))
    except Exception as exc:  # an older torch, or a backend without it: the stacks still go out
        logger.debug("rltrace: no Flight Recorder dump: %s", exc)
        return {}
    by_thread: dict = {}
    for e in trace.get("entries") or []:
        try:
            thread = int(e.get("thread_id"))
        except (TypeError, ValueError):
            continue
        group = e.get("process_group") or ["", ""]
        by_thread.setdefault(thread, []).append({
            "seq": e.get("collective_seq_id"), "op": e.get("profiling_name"), "group": group[-1] or group[0],
            "state": e.get("state"), "time_created_ns": e.get("time_created_ns")})
    return {t: json.dumps(entries[-FR_KEPT:]) for t, entries in by_thread.items()}


def native_frames() -> dict:
    """native thread id -> this process's stack of that thread as py-spy reads it with --native
    (`function (file:line)` per line, innermost first); {None: why} when py-spy could not."""
    from rltrace._config import resolve
    from rltrace.profiling import pyspy
    from rltrace.profiling.policy import pyspy_executable

    executable = pyspy_executable(resolve("pyspy"))
    command = pyspy.dump_command(executable, os.getpid(), json_output=True, flags=("native",))
    try:
        code, text = pyspy.run_dump(command)
    except OSError as exc:
        return {None: pyspy.missing_message(executable, exc)[1]}
    try:
        threads = pyspy.dump_threads(text) if code == 0 else None
    except ValueError:
        threads = None
    if threads is None:
        return {None: pyspy.classify(code, text, os.getpid())[1]}
    return {t.get("os_thread_id"): "\n".join(f"{f.get('name') or '?'} ({f.get('filename')}:{f.get('line')})"
                                             for f in t.get("frames") or []) for t in threads}


class StackThread:
    """Dumps this process's stacks for a `Run` (see `rltrace.stacks.start`); `close()` stops it."""

    def __init__(self, run, after_s: float):
        self._run = run
        self.after_s = float(after_s)
        self.dumps = 0
        self._start()
        after_fork_in_child(self._start)

    def _start(self) -> None:
        self._stop = threading.Event()
        self._answered: set[str] = set()
        self._dumped: set[str] = set()  # spans whose hang has been dumped
        self._hang_dumps = 0
        self._seen: tuple | None = None  # (mtime, size) of the request record last read
        self._next_poll = 0.0
        self._bucket = None
        self._namer = PartNamer(self._run.process)
        self._thread = threading.Thread(target=self._loop, name="rltrace-stacks", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(TICK_S):
            try:
                self.tick()
            except Exception:  # never let the thread die; never raise into the program
                logger.exception("rltrace: the stack thread's check failed; it keeps watching")

    def tick(self, now_ns: int | None = None) -> None:
        now_ns = time.time_ns() if now_ns is None else now_ns
        request = self._request(now_ns)
        if request is not None:
            self._answered.add(request["request_id"])
            self.dump("request", request_id=request["request_id"], native=bool(request.get("native")))
        hung = self._hung(now_ns)
        if hung and self._hang_dumps < MAX_HANG_DUMPS:
            self._dumped.update(hung)
            self._hang_dumps += 1
            self.dump("hang")

    # --- what triggers a dump ------------------------------------------------------------------
    def _hung(self, now_ns: int) -> list[str]:
        """The innermost open span of each thread, open past `after_s` and not dumped yet."""
        innermost: dict = {}
        for span in self._run.live_spans.snapshot():
            thread = (span.attributes or {}).get(_names.THREAD_ID)
            if thread is not None and (thread not in innermost or span.start_time > innermost[thread].start_time):
                innermost[thread] = span
        out = []
        for span in innermost.values():
            span_id = f"{span.context.span_id:016x}"
            if (now_ns - span.start_time) / 1e9 >= self.after_s and span_id not in self._dumped:
                out.append(span_id)
        return out

    def _request(self, now_ns: int) -> dict | None:
        """The run's latest request, if it is new to this process and recent."""
        data = self._read_request()
        if not data:
            return None
        try:
            request = json.loads(data)
            request_id, asked_ns = str(request["request_id"]), int(request["time_ns"])
        except (ValueError, KeyError, TypeError):
            return None  # a damaged record: the next request replaces it
        if request_id in self._answered or (now_ns - asked_ns) / 1e9 > REQUEST_TTL_S:
            return None
        return request

    def _read_request(self) -> bytes | None:
        location = self._run.location
        rel = REQUEST
        if isinstance(location, Path):
            path = location / rel
            try:
                st = path.stat()
            except OSError:
                return None
            if self._seen == (st.st_ino, st.st_mtime_ns, st.st_size):
                return None
            self._seen = (st.st_ino, st.st_mtime_ns, st.st_size)
            try:
                return path.read_bytes()
            except OSError:
                return None
        if time.monotonic() < self._next_poll:
            return None
        self._next_poll = time.monotonic() + BUCKET_POLL_S
        from pyarrow import fs

        from rltrace.store import objstore

        try:
            if self._bucket is None:
                self._bucket = objstore.filesystem(attempts=1)
            key = f"{objstore.split(location)}/{rel}"
            info = self._bucket.get_file_info(key)
            if info.type != fs.FileType.File or self._seen == (info.mtime_ns, info.size):
                return None
            self._seen = (info.mtime_ns, info.size)
            with self._bucket.open_input_stream(key) as f:
                return f.read()
        except OSError:
            return None  # unreachable now: asked again next poll

    # --- the dump ------------------------------------------------------------------------------
    def dump(self, trigger: str, *, request_id: str | None = None, native: bool = False) -> Path | None:
        """Every thread's stack now, with its open spans, as one `stacks` part; `native`: with
        py-spy's native frames of each thread too, where py-spy may read this process."""
        native_text = native_frames() if native else {}
        collectives = flight_recorder()
        now_ns = time.time_ns()
        frames = sys._current_frames()
        names = {t.ident: t for t in threading.enumerate()}
        spans: dict = {}
        for span in self._run.live_spans.snapshot():
            spans.setdefault((span.attributes or {}).get(_names.THREAD_ID), []).append(span)
        me = threading.get_ident()
        dump_id = uuid.uuid4().hex[:16]
        process = self._run.process
        rows = []
        for ident, frame in frames.items():
            if ident == me:
                continue
            thread = names.get(ident)
            mine = sorted(spans.get(ident, []), key=lambda s: s.start_time, reverse=True)
            rows.append({
                "process_id": process.process_id, "role": process.role, "rank": process.rank, "host": process.host,
                "pid": process.pid, "dump_id": dump_id, "time_ns": now_ns, "trigger": trigger,
                "request_id": request_id, "thread_id": ident,
                "native_thread_id": getattr(thread, "native_id", None),
                "thread_name": thread.name if thread is not None else None,
                "frames": json.dumps(frames_of(frame)),
                "spans": json.dumps([_span_record(s) for s in mine]),
                "peer": peer_of(frame),
                "native": native_text.get(getattr(thread, "native_id", None), native_text.get(None)),
                "collectives": collectives.get(ident),
            })
        del frames
        table = pa.Table.from_pylist(rows, schema=_names.STACKS_SCHEMA)
        path = write_part(self._run.run_dir / _names.STACKS.folder, self._namer.next(), table, _names.STACKS)
        self.dumps += 1
        return path

    # --- lifecycle (a companion of the run) ----------------------------------------------------
    def flush(self) -> None:
        pass

    def close(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)


def start(run, after_s: float | None = None) -> StackThread:
    """Start the stack thread of `run` (closed with the run). `after_s`: the hang limit
    (RLTRACE_STACKS_AFTER, else RLTRACE_HANG_TIMEOUT, else 300 s)."""
    from rltrace._config import resolve

    if after_s is None:
        after_s = resolve("stacks_after") or resolve("hang_timeout") or DEFAULT_AFTER_S
    thread = StackThread(run, after_s)
    run.add_companion(thread)
    return thread


def ask(location, *, native: bool = False) -> dict:
    """Write a request for every live process's stacks into the run at `location` (a run dir or an
    s3:// address); returns it (`request_id`, `time_ns`)."""
    from rltrace.store import objstore

    request = {"request_id": uuid.uuid4().hex[:16], "time_ns": time.time_ns(), "native": bool(native),
               "by": f"{socket.gethostname()} pid {os.getpid()}"}
    data = json.dumps(request).encode()
    rel = REQUEST
    if objstore.is_uri(location):
        try:
            objstore.put(objstore.filesystem(), f"{objstore.split(location)}/{rel}", data)
        except OSError as exc:
            raise objstore.unreachable(location, exc) from None
        return request
    path = Path(location) / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return request


def answers(location, request_id: str, asked_ns: int) -> tuple[set[str], dict[str, str]]:
    """(processes that answered `request_id`, the processes expected to: process_id -> name), from
    the run's `processes` and `stacks` records only. Expected: every process that had not ended,
    was heard from within `health.STALE_AFTER_S` of the request and (on this host) still holds its
    writer lock."""
    from rltrace import store
    from rltrace.analysis import health
    from rltrace.analysis._format import process_name
    from rltrace.store import objstore

    tables = {t.name: t for t in (_names.PROCESSES, _names.STACKS)}
    local = objstore.mirror(location, tables=tuple(t.folder for t in tables.values())) if objstore.is_uri(location) \
        else Path(location)
    con = store.connect(store.scan(local, tables=tables))
    try:
        procs = con.execute(
            """SELECT process_id, any_value(role), any_value(rank) FROM processes GROUP BY process_id
               HAVING bool_and(ended_ns IS NULL) AND max(heartbeat_ns) >= ?""",
            [asked_ns - int(health.STALE_AFTER_S * 1e9)]).fetchall()
        gone = health.gone(con, [p for p, _, _ in procs])
        expected = {p: process_name(role, rank) for p, role, rank in procs if p not in gone}
        answered = {p for (p,) in con.execute("SELECT DISTINCT process_id FROM stacks WHERE request_id = ?",
                                              [request_id]).fetchall()}
    finally:
        con.close()
    return answered, expected


def ask_and_wait(location, *, timeout: float = 10.0, native: bool = False, poll_s: float = 0.5
                 ) -> tuple[dict, set[str], dict[str, str]]:
    """Ask every live process of the run for its stacks and wait until each has answered (or
    `timeout`); returns (the request, the processes that answered, those expected to)."""
    from rltrace.store import objstore

    request = ask(location, native=native)
    lag = NONE_LIVE_S if objstore.is_uri(location) else 0.0
    started = time.monotonic()
    while True:
        answered, expected = answers(location, request["request_id"], request["time_ns"])
        waited = time.monotonic() - started
        # no live process yet: a bucket shows a process's records a second or two after it writes them
        if (expected and set(expected) <= answered) or waited >= timeout or (not expected and waited >= lag):
            return request, answered, expected
        time.sleep(poll_s)
