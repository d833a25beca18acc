"""Known blocking calls, recognised from a thread's stored frames (innermost first).

A rule names a file (by its path's ending) and the functions in it that block: collectives,
Ray `get`, queue and pipe reads, subprocess waits, HTTP and socket reads, Event/Condition
waits. Rules are tried in this order over the innermost frames (a queue `get` waits in
`threading.Condition.wait`: the queue is the better name). A call made straight into C (a
`time.sleep`, a `lock.acquire()`) leaves no frame of its own: its source line names it. Anything
else is shown as is: the innermost frame of the program's own code.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SEARCHED = 16  # innermost frames a rule looks at

COLLECTIVES = frozenset((
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "reduce", "reduce_scatter",
    "reduce_scatter_tensor", "broadcast", "broadcast_object_list", "barrier", "monitored_barrier", "gather",
    "gather_object", "scatter", "scatter_object_list", "all_to_all", "all_to_all_single", "send", "recv",
    "batch_isend_irecv", "all_reduce_coalesced", "all_gather_coalesced",
))

# (kind, file ending, functions (last part of the qualified name; None: any), label ({f}: the function))
RULES = (
    ("collective", "torch/distributed/distributed_c10d.py", COLLECTIVES, "torch.distributed.{f}"),
    ("ray", "ray/_private/worker.py", frozenset(("get", "wait")), "ray.{f}"),
    ("ray", "ray/_private/client_mode_hook.py", frozenset(("wrapper",)), "ray.get"),
    ("queue", "/queue.py", frozenset(("get", "put", "join")), "queue.Queue.{f}"),
    ("queue", "multiprocessing/queues.py", frozenset(("get", "put", "join")), "multiprocessing.Queue.{f}"),
    ("queue", "multiprocessing/connection.py", frozenset(("recv", "recv_bytes", "poll", "wait")),
     "multiprocessing.Connection.{f}"),
    ("subprocess", "/subprocess.py", frozenset(("wait", "communicate", "run", "check_output", "check_call", "call")),
     "subprocess.{f}"),
    ("http", "/http/client.py", frozenset(("getresponse", "begin", "_read_status", "read", "readline", "_safe_read")),
     "an HTTP response read (http.client)"),
    ("http", "httpcore/_sync/http11.py", None, "an HTTP response read (httpx)"),
    ("http", "urllib3/connectionpool.py", frozenset(("urlopen", "_make_request")), "an HTTP response read (urllib3)"),
    ("socket", "/socket.py", frozenset(("readinto", "recv", "recv_into", "accept", "create_connection")),
     "socket.{f}"),
    ("socket", "/ssl.py", frozenset(("read", "recv", "recv_into")), "ssl.{f}"),
    ("socket", "/selectors.py", frozenset(("select",)), "selectors.select"),
    ("wait", "/threading.py", frozenset(("wait", "join", "acquire", "wait_for")), "threading.{q}"),
    ("wait", "concurrent/futures/_base.py", frozenset(("result", "wait", "as_completed")), "concurrent.futures.{q}"),
)

#: a call straight into C, named by the innermost frame's source line
LINE_RULES = (
    (re.compile(r"\bsleep\("), "sleep", "time.sleep"),
    (re.compile(r"\.acquire\("), "wait", "Lock.acquire"),
    (re.compile(r"\.(recv|recv_into|recvfrom|accept)\("), "socket", "socket.{m}"),
    (re.compile(r"\.wait\("), "wait", "a wait ({m})"),
    (re.compile(r"\.(get|result)\("), "wait", "a blocking {m}"),
)

_LIBRARY = ("/site-packages/", "/dist-packages/", "<frozen ", "/lib/python3", "/rltrace/")


@dataclass(frozen=True)
class Blocked:
    kind: str  # collective / ray / queue / subprocess / http / socket / wait / sleep, or "" when not recognised
    call: str  # e.g. torch.distributed.all_reduce; the innermost own function when not recognised
    where: str  # the program's own function that made the call (innermost frame outside libraries)
    line: str  # file:line of the frame that proves it


def _name(function: str) -> str:
    return function.rsplit(".", 1)[-1]


def own_frame(frames: list) -> list | None:
    """The innermost frame of the program's own code (not the standard library, a package or rltrace)."""
    for f in frames:
        if not any(mark in f[0] for mark in _LIBRARY):
            return f
    return None


def classify(frames: list) -> Blocked:
    """What the thread whose stack is `frames` (innermost first, [file, line, function, source]) is blocked in."""
    mine = own_frame(frames)
    where = mine[2] if mine else (frames[0][2] if frames else "")
    inner = frames[:SEARCHED]
    for kind, ending, functions, label in RULES:
        for f in inner:
            path = f[0].replace("\\", "/")
            if path.endswith(ending) and (functions is None or _name(f[2]) in functions):
                return Blocked(kind, label.format(f=_name(f[2]), q=f[2]), where, f"{f[0]}:{f[1]}")
    if frames:
        top = frames[0]
        for pattern, kind, label in LINE_RULES:
            m = pattern.search(top[3] or "")
            if m:
                return Blocked(kind, label.format(m=m.group(0).strip(".(")), where, f"{top[0]}:{top[1]}")
        return Blocked("", where, where, f"{top[0]}:{top[1]}")
    return Blocked("", "", "", "")
