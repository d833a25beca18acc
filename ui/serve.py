"""Streamlit's own command line, behind a check of the Host header (`rltrace ui` starts this).

A dashboard on 127.0.0.1 is still reachable from a web page through DNS rebinding: a page at
`evil.example` has that name re-resolve to 127.0.0.1, and the browser then lets it read
`http://evil.example:8501` as its own origin. The request still says `Host: evil.example`, so
a server that answers only the names it is meant to be reached by is out of reach.

    python -m rltrace.ui.serve --hosts localhost,127.0.0.1,[::1] run ui/app.py --server.port 8501 ...

Every HTTP request and websocket whose Host is not listed is refused (403) before Streamlit sees
it; `--hosts '*'` turns the check off (a dashboard bound to every interface, reached by any name).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable

REFUSED = b"rltrace dashboard: this host name is not served here (DNS rebinding guard); open it as localhost or 127.0.0.1"


def host_name(host_header: str) -> str:
    """`localhost` from `localhost:8501`, `[::1]` from `[::1]:8501`, lower case."""
    host = host_header.strip().lower()
    if host.startswith("["):
        return host[: host.find("]") + 1]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


class HostGuard:
    """ASGI middleware: answer only requests (and websockets) whose Host is one of `hosts`."""

    def __init__(self, app, hosts: Iterable[str]):
        self.app = app
        self.hosts = frozenset(h.lower() for h in hosts)

    async def __call__(self, scope, receive, send):
        if scope["type"] in ("http", "websocket"):
            header = next((v for k, v in scope.get("headers", ()) if k == b"host"), b"").decode("latin-1")
            if host_name(header) not in self.hosts:
                if scope["type"] == "websocket":  # closing before accepting: the server answers 403
                    await send({"type": "websocket.close", "code": 1008})
                    return
                await send({"type": "http.response.start", "status": 403,
                            "headers": [(b"content-type", b"text/plain; charset=utf-8")]})
                await send({"type": "http.response.body", "body": REFUSED})
                return
        await self.app(scope, receive, send)


def guard(hosts: list[str]) -> None:
    """Put HostGuard first in the middleware of every Streamlit app this process creates."""
    from starlette.middleware import Middleware
    from streamlit.web.server.starlette import starlette_app

    streamlit_middleware = starlette_app.create_streamlit_middleware

    def with_guard():
        return [Middleware(HostGuard, hosts=hosts), *streamlit_middleware()]

    starlette_app.create_streamlit_middleware = with_guard


def main(argv: list[str]) -> int:
    hosts = "*"
    if len(argv) >= 2 and argv[0] == "--hosts":
        hosts, argv = argv[1], argv[2:]
    if hosts != "*":
        guard([h for h in hosts.split(",") if h])
    from streamlit.web import cli

    sys.argv = ["streamlit", *argv]
    return cli.main()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
