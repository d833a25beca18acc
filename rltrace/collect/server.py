"""The receiver's HTTP front: OTLP/HTTP requests read whole, on time, within bounds, before decoding.

    connection    at most `max_connections` open; past that, 503 at once (no thread is started)
    request       from its first byte to its last within `request_timeout`, however slowly it
                  trickles (each read waits only for what is left); late: 408, dropped, counted
    body          bytes held while bodies arrive are bounded for all connections together
                  (charged as they arrive, so a slow sender holds only what it has sent)
    decode slot   taken only once the body is in: at most `max_inflight` requests decoded at once

A slow sender therefore holds one connection and the few bytes it sent, never a decode slot,
and the senders that send whole requests keep getting answers. What the handler cannot serve
is answered (a status and a reason) and counted on the receiver's row.
"""

from __future__ import annotations

import collections
import contextlib
import http.server
import io
import logging
import socket
import socketserver
import threading
import time
from typing import Any, Protocol

from rltrace.collect import decode
from rltrace.store import rows

logger = logging.getLogger("rltrace")

TRACES_PATH = "/v1/traces"
IDLE_S = 60.0  # a kept-alive connection waiting for its next request is closed after this (sooner when
# the receiver is full and a new connection needs its place: the longest idle one is closed)
HEADER_S = 5.0  # a request's line and headers must arrive within this of its first byte
_WRITE_S = 10.0  # an answer that cannot be written in this long is abandoned
_CHUNK = 64 * 1024
_DECODE_WAIT_S = 5.0
_LINGER_S = 1.0  # a refused connection stays open this long for the sender to read its 503
_INVALID_ARGUMENT, _INTERNAL, _UNAVAILABLE = 3, 13, 14  # gRPC codes in google.rpc.Status bodies
_BUSY = b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


class Full(Exception):
    """The queue cannot take this request (backpressure mode: answered 503)."""


class Sink(Protocol):
    """What the handler hands requests to (`rltrace.collect.Receiver`)."""

    limits: Any
    drops: rows.Drops

    def reject(self, reason: str) -> None: ...
    def accept(self, request, nbytes: int, peer: str, undecoded: list) -> tuple[int, str]: ...


class _Late(Exception):
    """The request was not received whole within the request deadline."""


class _Budget:
    """Bytes held by request bodies being received, all connections together."""

    def __init__(self, limit: int):
        self.limit, self.used = limit, 0
        self._lock = threading.Lock()

    def take(self, n: int) -> bool:
        with self._lock:
            if self.used + n > self.limit:
                return False
            self.used += n
            return True

    def give(self, n: int) -> None:
        with self._lock:
            self.used -= n


class _Reads(io.RawIOBase):
    """A connection's socket reads; once a request has begun, each waits only for what is left of
    its deadline, so trickling a byte at a time cannot stretch it (a per-read timeout would)."""

    def __init__(self, sock: socket.socket, request_timeout: float):
        self.sock, self.request_timeout = sock, request_timeout
        self.deadline: float | None = None
        self.began = 0.0
        self.idle_since = time.monotonic()
        self.in_headers = False
        self.peer = ""

    def readable(self) -> bool:
        return True

    def new_request(self) -> None:
        self.deadline = None  # idle until the next request's first byte
        self.idle_since = time.monotonic()

    def started(self) -> None:
        if self.deadline is None:
            self.began = time.monotonic()
            self.in_headers = True  # the request line and headers: a few seconds (`HEADER_S`), as the OTel Collector allows
            self.deadline = self.began + min(HEADER_S, self.request_timeout)

    def headers_done(self) -> None:
        self.in_headers = False
        if self.deadline is not None:
            self.deadline = self.began + self.request_timeout

    def readinto(self, buffer) -> int:
        if self.deadline is None:
            timeout = IDLE_S
        else:
            timeout = self.deadline - time.monotonic()
            if timeout <= 0:
                raise _Late
        self.sock.settimeout(timeout)
        try:
            n = self.sock.recv_into(buffer)
        except TimeoutError:
            if self.deadline is None:
                raise  # an idle kept-alive connection: closed quietly
            raise _Late from None
        if n:
            self.started()
        return n


class Server(http.server.ThreadingHTTPServer):
    """One thread per connection, at most `max_connections` of them."""

    daemon_threads = True

    def __init__(self, address, sink: Sink):
        self.sink = sink
        self.bodies = _Budget(sink.limits.max_inflight * sink.limits.max_request_bytes)
        self.decoding = threading.BoundedSemaphore(sink.limits.max_inflight)
        self.connections = 0
        self._connections_lock = threading.Lock()
        self._reads: set[_Reads] = set()  # open connections' readers: which are idle, since when
        self._by_peer: dict[str, int] = {}  # connections open per client address
        self._lingering: collections.deque[tuple[float, socket.socket]] = collections.deque()  # refused, closing soon
        super().__init__(address, _Handler)

    def server_bind(self):  # HTTPServer's own looks up the host's FQDN, which can hang offline
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), self.server_address[1]

    def process_request(self, request, client_address):
        limits, peer = self.sink.limits, client_address[0]
        with self._connections_lock:
            open_here, why = self._by_peer.get(peer, 0), None
            # an idle connection gives up its place (the client's own first): idle clients cannot starve a sender
            if open_here >= getattr(limits, "max_client_connections", limits.max_connections):
                if not self._close_idle([r for r in self._reads if r.peer == peer]):
                    why = f"{open_here} connections from {peer} already open (raise --max-client-connections)"
            elif self.connections >= limits.max_connections and not self._close_idle(self._reads):
                why = f"{limits.max_connections} connections already open (raise --max-connections)"
            if why is None:
                self.connections += 1
                self._by_peer[peer] = open_here + 1
        if why is not None:
            self.sink.drops.add("refused requests", 1, f"answered 503: {why}")
            self._refuse(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._closed(peer)
            raise

    def _close_idle(self, reads) -> bool:
        """Close the connection of `reads` idle the longest (waiting for its next request); False if none is idle."""
        idle = [r for r in reads if r.deadline is None]
        if not idle:
            return False
        oldest = min(idle, key=lambda r: r.idle_since)
        self._reads.discard(oldest)
        oldest.deadline = time.monotonic()  # not chosen again; a read it still makes is late
        with contextlib.suppress(OSError):
            oldest.sock.shutdown(socket.SHUT_RDWR)
        return True

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._closed(client_address[0])

    def _closed(self, peer: str) -> None:
        with self._connections_lock:
            self.connections -= 1
            self._by_peer[peer] -= 1
            if not self._by_peer[peer]:
                del self._by_peer[peer]

    def _refuse(self, request: socket.socket) -> None:
        """Answer 503 without a thread, and close a little later: closed at once, the socket would
        reset the connection while the sender is still writing, and it would never see the answer."""
        try:
            request.settimeout(0)  # never block the accepting thread; the answer fits an empty send buffer
            request.send(_BUSY)
            request.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        self._lingering.append((time.monotonic() + _LINGER_S, request))
        while len(self._lingering) > self.sink.limits.max_connections:
            self._lingering.popleft()[1].close()

    def service_actions(self):  # between accepts, on the accepting thread
        now = time.monotonic()
        while self._lingering and self._lingering[0][0] <= now:
            self._lingering.popleft()[1].close()

    def server_close(self):
        super().server_close()
        while self._lingering:
            self._lingering.popleft()[1].close()


class Server6(Server):
    address_family = socket.AF_INET6


def listen(sink: Sink, host: str, port: int) -> Server:
    return (Server6 if ":" in host else Server)((host, port), sink)


class _Handler(http.server.BaseHTTPRequestHandler):
    """POST /v1/traces, as OTLP/HTTP specifies: protobuf or JSON, gzip allowed, errors as google.rpc.Status."""

    protocol_version = "HTTP/1.1"  # keep-alive: SDK exporters reuse their connection
    server_version = "rltrace-collect"
    server: Server

    def setup(self):
        super().setup()
        self.rfile.close()  # the socket's own reader, replaced by one that keeps the request deadline
        self.reads = _Reads(self.connection, self.server.sink.limits.request_timeout)
        self.reads.peer = self.client_address[0]
        self.rfile = io.BufferedReader(self.reads, _CHUNK)
        with self.server._connections_lock:
            self.server._reads.add(self.reads)

    def finish(self):
        with self.server._connections_lock:
            self.server._reads.discard(self.reads)
        super().finish()

    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        logger.debug("rltrace collect: %s - %s", self.address_string(), format % args)

    def handle_one_request(self):
        """http.server's, with the request deadline: a late request is answered 408 and counted."""
        self.reads.new_request()
        try:
            self.raw_requestline = self.rfile.readline(65537)
            if not self.raw_requestline:
                self.close_connection = True
                return
            self.reads.started()
            if len(self.raw_requestline) > 65536:
                self.requestline = self.request_version = self.command = ""
                self.send_error(414)
                return
            if not self.parse_request():
                return
            self.reads.headers_done()
            method = getattr(self, f"do_{self.command}", None)
            if method is None:
                self.send_error(501, f"Unsupported method ({self.command!r})")
                return
            method()
            self.wfile.flush()
        except _Late:
            self.close_connection = True
            timeout = self.server.sink.limits.request_timeout
            if self.reads.in_headers and HEADER_S < timeout:
                reason = f"request line and headers not received within {HEADER_S:g} s of the first byte: a slow sender, dropped"
            else:
                reason = (f"request not received whole within {timeout:g} s of its first byte: a slow sender, dropped "
                          "(raise --request-timeout if the link is this slow)")
            self.server.sink.reject(reason)
            self._error(408, _INVALID_ARGUMENT, reason, self._content_type())
        except TimeoutError:  # no request on a kept-alive connection for IDLE_S
            self.close_connection = True

    def _content_type(self) -> str:
        headers = getattr(self, "headers", None)
        return ((headers.get("Content-Type") if headers else None) or "").split(";")[0].strip().lower()

    def _reply(self, code: int, body: bytes, content_type: str, headers: dict | None = None) -> None:
        try:
            self.connection.settimeout(_WRITE_S)
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            if self.close_connection:
                self.send_header("Connection", "close")
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)
        except OSError:  # the sender is gone; what happened is counted already
            self.close_connection = True

    def _error(self, code: int, grpc_code: int, message: str, content_type: str, headers: dict | None = None) -> None:
        content_type = content_type if content_type in (decode.PROTOBUF, decode.JSON) else decode.PROTOBUF
        self._reply(code, decode.status(content_type, grpc_code, message), content_type, headers)

    def do_GET(self):  # noqa: N802 - http.server's naming
        self._error(405, _INVALID_ARGUMENT, f"POST OTLP trace exports to {TRACES_PATH}", decode.JSON)

    def do_POST(self):  # noqa: N802
        sink, limits = self.server.sink, self.server.sink.limits
        content_type = self._content_type()
        if self.path.split("?")[0] != TRACES_PATH:
            self.close_connection = True
            self._error(404, _INVALID_ARGUMENT, f"no such path {self.path[:80]!r}; send traces to {TRACES_PATH}", content_type)
            return
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            self.close_connection = True
            sink.reject("no Content-Length (chunked bodies are not accepted)")
            self._error(411, _INVALID_ARGUMENT, "Content-Length required", content_type)
            return
        length = int(length)
        if length > limits.max_request_bytes:
            self.close_connection = True  # the body is left unread
            reason = f"body of {length} bytes is over the limit of {limits.max_request_bytes}"
            sink.reject(reason)
            self._error(413, _INVALID_ARGUMENT, reason, content_type)
            return
        held = [0]
        try:
            body = self._read_body(length, held)
            if body is None:
                return
            if not self.server.decoding.acquire(timeout=_DECODE_WAIT_S):
                self._busy(content_type, "too many requests being decoded")
                return
            try:
                self._handle(body, content_type)
            finally:
                self.server.decoding.release()
        finally:
            self.server.bodies.give(held[0])

    def _read_body(self, length: int, held: list[int]) -> bytes | None:
        """The body, read as it arrives and charged to the bodies' budget (None: answered already)."""
        chunks, got = [], 0
        while got < length:
            chunk = self.rfile.read1(min(_CHUNK, length - got))
            if not chunk:
                self.close_connection = True
                self.server.sink.reject(f"connection closed after {got} of {length} body bytes")
                return None
            if not self.server.bodies.take(len(chunk)):  # charged as it arrives: a trickle holds a trickle
                self._busy(self._content_type(), "too many request bodies being received")
                return None
            held[0] += len(chunk)
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def _busy(self, content_type: str, why: str) -> None:
        self.close_connection = True
        self.server.sink.drops.add("refused requests", 1, f"answered 503: {why} (the sender retries)")
        self._error(503, _UNAVAILABLE, f"{why}; retry later", content_type, {"Retry-After": "1"})

    def _handle(self, body: bytes, content_type: str) -> None:
        sink = self.server.sink
        try:
            encoding = (self.headers.get("Content-Encoding") or "identity").strip().lower()
            if encoding == "gzip":
                body = decode.gunzip(body, sink.limits.max_request_bytes)
            elif encoding != "identity":
                raise decode.PayloadError(f"unsupported Content-Encoding {encoding!r} (use gzip or none)")
            request, rejected = decode.parse(body, content_type)
        except decode.PayloadError as exc:
            reason = str(exc)
            sink.reject(reason)
            code = 413 if isinstance(exc, decode.TooLarge) else 415 if reason.startswith("unsupported content type") else 400
            self._error(code, _INVALID_ARGUMENT, reason, content_type)
            return
        except Exception as exc:  # noqa: BLE001 - never an unanswered, uncounted request
            logger.exception("rltrace collect: a request from %s could not be read", self.client_address[0])
            reason = f"the receiver failed on this request ({type(exc).__name__}: {rows.text(str(exc))[:160]})"
            sink.reject(reason)
            self._error(500, _INTERNAL, reason, content_type)
            return
        try:
            n_rejected, message = sink.accept(request, len(body), self.client_address[0], rejected)
        except Full as exc:
            self._error(503, _UNAVAILABLE, str(exc), content_type, {"Retry-After": "1"})
            return
        self._reply(200, decode.response(content_type, n_rejected, message), content_type)
