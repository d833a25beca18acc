"""`Receiver`: spans from remote OpenTelemetry senders into a run, through the store's own writer.

    HTTP handler threads: body read whole on time (collect/server.py) -> ExportTraceServiceRequest
                          (collect/decode.py; a span that does not decode costs itself) -> one
                          queued item per sender (bounded: spans and bytes)
    one BackgroundWriter: item -> RemoteSpan adapters -> rows.spans_table -> one spans part per
                          interval for all senders; then the process rows (the heartbeat)

A sender is one OTel resource (one process of vLLM, SGLang, a reward service, an rltrace process
behind a collector). Each gets its own `processes` row: role from `rl.role` or `service.name`,
rank from `rl.rank` or a numeric `service.instance.id`, host from `host.name` (else the peer
address), pid from `process.pid` (vLLM's `vllm.process_id`); its spans written and dropped, with reasons. The receiver has
a row too (role `collector`): malformed requests, refusals and failed part writes.

When the queue is full a request is dropped and counted (answered 200 with OTLP partial success,
`rejected_spans`), so `rltrace info` shows the exact loss; with `backpressure=True` it is
answered 503 + Retry-After instead (nothing stored, the sender retries; an OTel Collector with
a sending queue is the sender that does this well).
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from rltrace import _names
from rltrace.collect import decode
from rltrace.collect.server import TRACES_PATH, Full, listen
from rltrace.store import layout, objstore, rows
from rltrace._names import safe_name
from rltrace.store.parts import received_from, write_part
from rltrace.store.writer import BackgroundWriter, ProcessInfo

logger = logging.getLogger("rltrace")

_HEARTBEAT_S = 10.0


@dataclass
class Limits:
    """What one receiver holds in memory at most (see docs/collect.md)."""

    max_queue_spans: int = 200_000  # spans decoded and waiting for the writer
    max_queue_bytes: int = 256 * 2**20  # their request bytes
    max_request_bytes: int = 32 * 2**20  # one body, after gzip
    max_inflight: int = 16  # requests decoded at once; bodies being received: max_inflight x max_request_bytes in all
    max_connections: int = 256  # connections open at once (one thread each)
    max_client_connections: int = 64  # of them from one address (a client's idle ones give way to its new ones)
    request_timeout: float = 30.0  # seconds from a request's first byte to its last
    flush_interval: float = 1.0
    backpressure: bool = False  # answer 503 when full instead of dropping and counting


@dataclass
class Sender:
    """One remote process (one OTel resource) and what happened to its spans."""

    process: ProcessInfo
    resource: dict
    started_ns: int = field(default_factory=time.time_ns)
    heartbeat_ns: int = 0
    received: int = 0
    written: int = 0
    dropped: int = 0
    drops: rows.Drops = field(default_factory=rows.Drops)
    written_at: tuple = ()  # the counts last written to its process row


RESENT = "already stored: the same span (trace_id, span_id) arrived again (a sender resent its request)"


class Seen:
    """The identities (trace_id, span_id) of the last `keep` to `2 * keep` spans stored, so a
    request that a sender sends again (after a timeout or a dropped connection, as the OTel SDK and
    Collector do) is stored once. Two generations of hashed ids: memory stays bounded."""

    def __init__(self, keep: int = 250_000):  # at most 2 x keep ids: ~45 MB
        self.keep = keep
        self._now: set[int] = set()
        self._before: set[int] = set()
        self._lock = threading.Lock()

    def add(self, key: int) -> bool:
        """Remember `key`; False if it was seen already."""
        with self._lock:
            if key in self._now or key in self._before:
                return False
            if len(self._now) >= self.keep:
                self._before, self._now = self._now, set()
            self._now.add(key)
            return True

    def seed(self, spans_dir: Path, within_s: float = 600.0) -> None:
        """Remember the spans of the parts written in the last `within_s` seconds (newest first,
        `keep` at most): a sender resending to a receiver started again is still stored once."""
        import pyarrow.parquet as pq

        from rltrace.store.views import list_parts

        now, parts = time.time(), []
        for path in list_parts(Path(spans_dir)):
            try:
                mtime = path.stat().st_mtime
            except OSError:
                continue
            if now - mtime <= within_s:
                parts.append((mtime, path))
        for _, path in sorted(parts, reverse=True):
            if len(self._now) >= self.keep:
                break
            try:
                ids = pq.read_table(path, columns=["trace_id", "span_id"])
            except Exception:  # noqa: BLE001 - an old or damaged part: its spans are not remembered
                continue
            for trace, span in zip(ids.column("trace_id").to_pylist(), ids.column("span_id").to_pylist()):
                if isinstance(trace, bytes) and isinstance(span, int):
                    self.add(identity(trace, span & (2**64 - 1)))


def identity(trace_id: bytes, span_id: int) -> int:
    return hash((trace_id, span_id))


def _int(value) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if rows.fits_int64(value) else None
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return _int(int(value))
    return None


def identify(resource: dict, peer: str, run_id: str) -> ProcessInfo:
    """Who a sender is, from its OTel resource attributes (docs/collect.md, "Who sent it")."""
    service = str(resource.get("service.name") or "unknown_service")
    role = str(resource.get(_names.ROLE) or service)
    rank = _int(resource.get(_names.RANK))
    if rank is None:
        rank = _int(resource.get("service.instance.id"))
    host = str(resource.get("host.name") or peer)
    pid = _int(resource.get("process.pid"))
    if pid is None:
        pid = _int(resource.get("vllm.process_id"))  # vLLM's init_tracer sets its pid under its own name
    # A fresh suffix per receiver session: part and process-row names never collide with an
    # earlier session's for the same sender.
    process_id = f"{safe_name(role)}{'' if rank is None else rank}-{safe_name(host)}-{pid if pid is not None else 'otlp'}-{uuid.uuid4().hex[:6]}"
    return ProcessInfo(run_id=run_id, role=role, rank=rank, service_name=service, host=host, pid=pid, process_id=process_id)


class Receiver:
    """Receives OTLP/HTTP trace exports on `host:port` and writes them into the run at `run_dir`.

    Example:
        with Receiver("runs/exp1", "127.0.0.1", 4318) as r:
            ...  # senders export to http://127.0.0.1:4318/v1/traces
    """

    def __init__(self, run_dir, host: str = "127.0.0.1", port: int = 4318, limits: Limits | None = None):
        self.limits = limits or Limits()
        self.drops = rows.Drops()  # the receiver's own: bad requests, refusals, failed part writes
        self._spool: objstore.Spool | None = None
        if objstore.is_uri(run_dir):  # an s3:// run: parts go through a local spool (docs/store.md)
            manifest = objstore.create_or_join(str(run_dir), run_name=None, config=None)
            self._spool = objstore.Spool(str(run_dir), manifest, drops=self.drops)
            self.run_dir = self._spool.dir
        else:
            self.run_dir = Path(run_dir)
            manifest = layout.create_or_join(self.run_dir, run_name=None, config=None)
        self.run_id = manifest["run_id"]
        self.process = ProcessInfo(run_id=self.run_id, role="collector", rank=None, service_name="rltrace-collect")
        self.started_ns = time.time_ns()
        self.requests = 0
        self.rejected_requests = 0
        self.refused_spans = 0
        self._senders: dict[str, Sender] = {}
        self._lock = threading.Lock()
        self._pending_spans = 0  # accepted and not yet written: queued, or converted and waiting for the part
        self._pending_bytes = 0
        self._converted_spans = 0
        self._converted_bytes = 0
        self._ended_ns: int | None = None
        self._last_full_heartbeat = 0.0
        self.seen = Seen()
        self.seen.seed(self.run_dir / _names.SPANS.folder)
        self._writer = BackgroundWriter(
            self.run_dir,
            self.process,
            interval=self.limits.flush_interval,
            max_pending_rows=2 * self.limits.max_queue_spans + 1,  # our own bound below trips first
            on_tick=self._heartbeat,
            drops=self.drops,
            span_footer=received_from([self.process.process_id]),  # readers fold copies among such parts
        )
        try:
            self.server = listen(self, host, port)
        except OSError:
            self._writer.close()
            if self._spool is not None:
                self._spool.close(timeout=5)
            raise
        self._thread: threading.Thread | None = None
        self._write_process_rows(force=True)

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.server.server_address[:2]
        return host, port

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://{f'[{host}]' if ':' in host else host}:{port}{TRACES_PATH}"

    # --- lifecycle ------------------------------------------------------------------------------
    def start(self) -> "Receiver":
        self._thread = threading.Thread(target=self.server.serve_forever, name="rltrace-collect", daemon=True)
        self._thread.start()
        return self

    def flush(self) -> None:
        """Write everything accepted so far, and the process rows (blocks)."""
        self._writer.flush()
        self._write_process_rows(force=True)
        if self._spool is not None:
            self._spool.flush()

    def close(self) -> None:
        """Stop listening, write what was accepted, and mark every process row as ended."""
        if self._ended_ns is not None:
            return
        if self._thread is not None:
            self.server.shutdown()
        self.server.server_close()
        deadline = time.monotonic() + 10.0  # let requests being decoded reach the queue
        for _ in range(self.limits.max_inflight):
            self.server.decoding.acquire(timeout=max(deadline - time.monotonic(), 0))
        self._writer.close()
        self._ended_ns = time.time_ns()
        self._write_process_rows(force=True)
        if self._spool is not None:
            self._spool.close()

    def __enter__(self) -> "Receiver":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # --- counts -----------------------------------------------------------------------------------
    def senders(self) -> list[Sender]:
        with self._lock:
            return list(self._senders.values())

    def reject(self, reason: str) -> None:
        """Count a request refused as malformed (HTTP 400/413/415)."""
        with self._lock:
            self.rejected_requests += 1
        self.drops.add("requests", 1, reason)

    def _sender(self, resource_spans, peer: str) -> Sender:
        resource = decode.attributes(resource_spans.resource.attributes)
        # Without host.name, senders on different hosts with equal resources stay apart by address.
        key = json.dumps([resource, None if "host.name" in resource else peer], sort_keys=True, default=str)
        with self._lock:
            sender = self._senders.get(key)
            if sender is None:
                sender = Sender(identify(resource, peer, self.run_id), resource)
                self._senders[key] = sender
            return sender

    # --- the write path ---------------------------------------------------------------------------
    def accept(self, request, nbytes: int, peer: str, undecoded: Sequence[decode.Rejected] = ()) -> tuple[int, str]:
        """Queue a decoded request's spans and count its `undecoded` ones; returns (rejected spans,
        message). Raises `Full` in backpressure mode when the queue cannot take the whole request."""
        groups = [(self._sender(rs, peer), rs, decode.count(rs)) for rs in request.resource_spans]
        total = sum(n for _, _, n in groups)
        with self._lock:
            self.requests += 1
            fits = (self._pending_spans + total <= self.limits.max_queue_spans
                    and self._pending_bytes + nbytes <= self.limits.max_queue_bytes)
            if fits:
                self._pending_spans += total
                self._pending_bytes += nbytes
            elif self.limits.backpressure:
                self.refused_spans += total
            for sender, _, n in groups:
                sender.received += n
        if not fits and self.limits.backpressure:
            self.drops.add("refused spans", total, "answered 503 while the receiver queue was full (the sender retries)")
            raise Full(f"receiver queue full ({self.limits.max_queue_spans} spans); retry later")
        bad, bad_message = self._count_undecoded(undecoded, [sender for sender, _, _ in groups])
        if not fits:
            reason = f"receiver queue full ({self.limits.max_queue_spans} spans / {self.limits.max_queue_bytes // 2**20} MiB; raise --max-queue-spans or add receivers)"
            for sender, _, n in groups:
                with self._lock:
                    sender.dropped += n
                sender.drops.add("spans", n, reason)
            return total + bad, "; ".join(filter(None, (reason, bad_message)))
        # Spans with bad ids are dropped (and counted, with the reason) on the writer thread;
        # the sender hears of them now, in the partial success, as OTLP asks.
        whys = [why for _, rs, _ in groups for span, _ in decode.spans_of(rs) if (why := decode.invalid(span))]
        invalid = len(whys)
        share = nbytes // max(len(groups), 1)
        refused = 0
        for i, (sender, rs, n) in enumerate(groups):
            size = nbytes - share * i if i == len(groups) - 1 else share
            if not n:
                self._release(0, size)
            elif not self._writer.submit(_names.SPANS, n, self._thunk(sender, rs, n, size)):
                self._release(n, size)  # the writer is closed: it counted them with the reason
                refused += n
        if refused:
            return refused + bad, "; ".join(filter(None, ("the receiver is shutting down", bad_message)))
        more = len(set(whys)) - 1
        invalid_message = (f"{invalid} spans refused: {whys[0]}" + (f" (and {more} more reason{'s' if more > 1 else ''}: "
                           "rltrace info lists them)" if more else "")) if invalid else ""
        return invalid + bad, "; ".join(filter(None, (invalid_message, bad_message)))

    def _count_undecoded(self, undecoded: Sequence[decode.Rejected], senders: list[Sender]) -> tuple[int, str]:
        """Count spans that did not decode for their sender (for the receiver when the sender is
        unknown); returns how many and the message the sender hears."""
        reasons: dict[str, int] = {}
        for r in undecoded:
            if r.group is None:
                self.drops.add("spans", r.spans, r.reason)
            else:
                sender = senders[r.group]
                with self._lock:
                    sender.received += r.spans
                    sender.dropped += r.spans
                sender.drops.add("spans", r.spans, r.reason)
            reasons[r.reason] = reasons.get(r.reason, 0) + r.spans
        total = sum(reasons.values())
        if not total:
            return 0, ""
        first, others = next(iter(reasons)), len(reasons) - 1
        more = f" (and {others} more reason{'s' if others > 1 else ''}: rltrace info lists them)" if others else ""
        return total, f"{total} spans not stored: {first}{more}"

    def _release(self, nspans: int, nbytes: int) -> None:
        with self._lock:
            self._pending_spans -= nspans
            self._pending_bytes -= nbytes

    def _thunk(self, sender: Sender, resource_spans, n: int, nbytes: int):
        def build():
            try:
                spans, resent = [], 0
                for span, scope in decode.spans_of(resource_spans):
                    why = decode.invalid(span)
                    if why is not None:
                        sender.drops.add("spans", 1, why)
                    elif not self.seen.add(identity(span.trace_id, int.from_bytes(span.span_id, "big"))):
                        resent += 1
                    else:
                        spans.append(decode.RemoteSpan(span, scope))
                sender.drops.add("spans", resent, RESENT)
                table = rows.spans_table(spans, sender.process, sender.process.service_name, drops=sender.drops, local=False)
                kept = 0 if table is None else table.num_rows
                with self._lock:
                    sender.written += kept
                    sender.dropped += n - kept
                return table
            except Exception as exc:  # counted for the sender, then the writer counts it again for the receiver
                with self._lock:
                    sender.dropped += n
                sender.drops.add("spans", n, f"could not be converted ({type(exc).__name__}: {rows.text(str(exc))[:160]})")
                logger.exception("rltrace collect: spans from %s could not be converted", sender.process.process_id)
                return None
            finally:  # held in memory (as Arrow) until the writer has written this cycle's part
                with self._lock:
                    self._converted_spans += n
                    self._converted_bytes += nbytes

        return build

    # --- process rows (the heartbeat) ----------------------------------------------------------------
    def _heartbeat(self) -> None:
        """After each write cycle (on the writer thread): free what was written, then the process rows."""
        with self._lock:
            self._pending_spans -= self._converted_spans
            self._pending_bytes -= self._converted_bytes
            self._converted_spans = self._converted_bytes = 0
        full = time.monotonic() - self._last_full_heartbeat >= _HEARTBEAT_S
        self._write_process_rows(force=full)

    def _write_process_rows(self, force: bool) -> None:
        now = time.time_ns()
        for sender in self.senders():
            with self._lock:
                counts = (sender.received, sender.written, sender.dropped, len(sender.drops.records()))
            if not force and counts == sender.written_at:
                continue
            table = rows.process_table(
                sender.process, run_id=self.run_id, service_name=sender.process.service_name,
                started_ns=sender.started_ns, heartbeat_ns=now, ended_ns=self._ended_ns,
                spans_written=counts[1], spans_dropped=counts[2], drop_reasons=sender.drops.to_json(),
                argv=[], resource=sender.resource,
            )
            if self._write_row(sender.process, table):
                sender.written_at = counts
        own = rows.process_table(
            self.process, run_id=self.run_id, service_name=self.process.service_name,
            started_ns=self.started_ns, heartbeat_ns=now, ended_ns=self._ended_ns,
            spans_dropped=self.drops.total("spans"), drop_reasons=self.drops.to_json(),
            argv=list(sys.argv), resource={"service.name": self.process.service_name, "rltrace.listen": self.url},
        )
        self._write_row(self.process, own)
        if force:
            self._last_full_heartbeat = time.monotonic()

    def _write_row(self, process: ProcessInfo, table) -> bool:
        try:
            write_part(self.run_dir / _names.PROCESSES.folder, f"{process.process_id}.parquet", table, _names.PROCESSES)
            return True
        except Exception as exc:  # the next heartbeat tries again
            logger.warning("rltrace collect: could not write the process row of %s: %s", process.process_id, exc)
            return False
