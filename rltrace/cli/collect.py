"""`rltrace collect RUN_DIR --listen 127.0.0.1:4318`: receive OTLP/HTTP spans into a run until stopped."""

from __future__ import annotations

import argparse
import ipaddress
import signal
import socket
import sys
import threading

from rltrace._config import RltraceConfigError

DEFAULT_LISTEN = "127.0.0.1:4318"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "collect",
        help="receive OpenTelemetry spans over OTLP/HTTP (vLLM, SGLang, a collector) into a run",
        description="Receive OTLP/HTTP trace exports at /v1/traces (protobuf or JSON, gzip allowed) and "
        "write them into RUN_DIR until interrupted. Listens on loopback unless --listen names another address.",
    )
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("--listen", metavar="HOST:PORT", default=None,
                   help=f"address to listen on (default {DEFAULT_LISTEN}; port 0 picks a free one)")
    p.add_argument("--max-queue-spans", type=int, default=200_000, metavar="N",
                   help="spans held in memory awaiting write; beyond this requests are dropped and counted (default 200000)")
    p.add_argument("--max-queue-mb", type=int, default=256, metavar="MB", help="bytes of requests held awaiting write (default 256)")
    p.add_argument("--max-request-mb", type=int, default=32, metavar="MB", help="largest request body, after gzip (default 32)")
    p.add_argument("--request-timeout", type=float, default=30.0, metavar="S",
                   help="seconds a request may take from its first byte to its last; slower senders are dropped "
                   "with 408 and counted (default 30)")
    p.add_argument("--max-connections", type=int, default=256, metavar="N",
                   help="connections open at once; beyond this new ones are answered 503 (default 256)")
    p.add_argument("--max-client-connections", type=int, default=64, metavar="N",
                   help="connections open at once from one address; beyond this its idle ones are closed, or "
                   "new ones answered 503 (default 64)")
    p.add_argument("--flush-interval", type=float, default=1.0, metavar="S", help="seconds between parts written (default 1)")
    p.add_argument("--backpressure", action="store_true",
                   help="when the queue is full answer 503 so senders retry, instead of dropping and counting")
    p.add_argument("--scrape", nargs="+", metavar="URL", default=[],
                   help="also poll these engines' Prometheus /metrics (vLLM, SGLang) into the run: prefix-cache "
                   "counters, KV cache usage, queues, preemptions, KV transfer")
    p.add_argument("--scrape-every", type=float, default=5.0, metavar="S", help="seconds between scrapes (default 5)")
    p.set_defaults(func=main)


def parse_listen(text: str) -> tuple[str, int]:
    """HOST:PORT (IPv6 as [::1]:4318) → (host, port); a one-line error otherwise."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise RltraceConfigError(f"--listen {text!r}: expected HOST:PORT, e.g. {DEFAULT_LISTEN}")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    return host, int(port)


def is_loopback(host: str) -> bool:
    """True when every address `host` resolves to is a loopback address."""
    try:
        infos = socket.getaddrinfo(host or None, None, proto=socket.IPPROTO_TCP, flags=socket.AI_PASSIVE)
    except socket.gaierror:
        return False
    addresses = {info[4][0].split("%")[0] for info in infos}
    return bool(addresses) and all(ipaddress.ip_address(a).is_loopback for a in addresses)


def main(args: argparse.Namespace) -> int:
    try:
        import opentelemetry.proto.collector.trace.v1.trace_service_pb2  # noqa: F401
    except ImportError:
        raise RltraceConfigError("rltrace collect needs the OTLP message types: pip install 'rltrace[collect]'") from None
    if args.scrape:
        try:
            import prometheus_client  # noqa: F401
        except ImportError:
            raise RltraceConfigError("rltrace collect --scrape needs prometheus_client: pip install 'rltrace[collect]'") from None
    from rltrace.collect import Limits, Receiver

    host, port = parse_listen(args.listen or DEFAULT_LISTEN)
    if not is_loopback(host):
        print(f"rltrace collect: warning: listening on {host or 'all interfaces'}, not loopback: anyone who can "
              "reach this port can write spans into the run (put it behind a firewall or an OTel Collector)", file=sys.stderr)
    for name in ("max_queue_spans", "max_queue_mb", "max_request_mb", "max_connections", "max_client_connections"):
        if getattr(args, name) <= 0:
            raise RltraceConfigError(f"--{name.replace('_', '-')} must be a positive integer")
    for name in ("flush_interval", "request_timeout", "scrape_every"):
        if not getattr(args, name) > 0:
            raise RltraceConfigError(f"--{name.replace('_', '-')} must be positive")
    limits = Limits(max_queue_spans=args.max_queue_spans, max_queue_bytes=args.max_queue_mb * 2**20,
                    max_request_bytes=args.max_request_mb * 2**20, flush_interval=args.flush_interval,
                    request_timeout=args.request_timeout, max_connections=args.max_connections,
                    max_client_connections=args.max_client_connections, backpressure=args.backpressure)
    try:
        receiver = Receiver(args.run_dir, host, port, limits)
    except OSError as exc:
        raise RltraceConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    receiver.start()
    scraper = None
    if args.scrape:
        from rltrace.collect.scrape import Scraper

        scraper = Scraper(receiver.run_dir, receiver.run_id, args.scrape, args.scrape_every)
        scraper.start()
    print(f"rltrace collect: receiving OTLP/HTTP at {receiver.url} into {args.run_dir} (Ctrl-C to stop)", flush=True)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        if scraper is not None:
            scraper.close()
        receiver.close()
    if scraper is not None:
        failed, bad = sum(scraper.failed.values()), sum(scraper.bad_lines.values())
        print(f"rltrace collect: scraped {sum(scraper.scrapes.values())} /metrics pages ({scraper.rows} values) from "
              f"{len(args.scrape)} endpoints" + (f", {failed} scrapes failed" if failed else "")
              + (f", {bad} malformed lines dropped" if bad else ""), flush=True)
    senders = receiver.senders()
    written = sum(s.written for s in senders)
    dropped = sum(s.dropped for s in senders)
    print(f"rltrace collect: stopped; {written} spans written from {len(senders)} senders, {dropped} dropped, "
          f"{receiver.rejected_requests} requests rejected (see rltrace info {args.run_dir})", flush=True)
    return 0
