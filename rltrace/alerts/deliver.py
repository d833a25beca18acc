"""Sending alerts to a webhook (HTTP POST of JSON) or a command, on a thread of their own.

The watcher only puts an alert in a bounded queue, so a webhook that is down or slow never
holds up the rules. Every failure (refused, timed out, non-2xx, a command exiting non-zero, the
queue full) is counted in `failures` and logged; nothing is retried.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import shlex
import subprocess
import threading
import urllib.error
import urllib.parse
import urllib.request

from rltrace.alerts.rules import AlertRuleError
from rltrace.analysis._format import shown

logger = logging.getLogger("rltrace")

MAX_QUEUE = 256


def check_webhook(url: str) -> str:
    """The URL, or a one-line error for one that is not http(s)://host/..."""
    parts = urllib.parse.urlsplit(url or "")
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise AlertRuleError(f"--webhook {url!r} is not an http:// or https:// URL")
    return url


def check_command(command: str) -> list[str]:
    try:
        argv = shlex.split(command or "")
    except ValueError as exc:
        raise AlertRuleError(f"--exec {command!r} cannot be split into a command line: {exc}") from None
    if not argv:
        raise AlertRuleError("--exec needs a command, e.g. --exec 'notify-send rltrace'")
    return argv


class Delivery:
    """Posts each alert (a JSON object) to `webhook` and/or pipes it to `command`'s stdin.

    The command runs without a shell, with the alert also in RLTRACE_ALERT_RULE,
    RLTRACE_ALERT_MESSAGE (control characters written as escapes: `\x00`) and RLTRACE_ALERT_JSON.
    """

    def __init__(self, webhook: str | None = None, command: str | None = None, *, timeout: float = 5.0):
        self.webhook = check_webhook(webhook) if webhook else None
        self.argv = check_command(command) if command else None
        self.timeout = timeout
        self.sent = 0
        self.failures = 0
        self._queue: queue.Queue = queue.Queue(MAX_QUEUE)
        self._thread = threading.Thread(target=self._loop, name="rltrace-alerts", daemon=True)
        self._thread.start()

    @property
    def enabled(self) -> bool:
        return bool(self.webhook or self.argv)

    def send(self, alert: dict) -> None:
        """Queue an alert for delivery; never blocks."""
        if not self.enabled:
            return
        try:
            self._queue.put_nowait(alert)
        except queue.Full:
            self.failures += 1
            logger.warning("rltrace watch: alert queue full; dropped alert %s", alert.get("key"))

    def _loop(self) -> None:
        while True:
            alert = self._queue.get()
            try:
                if self.webhook:
                    self._attempt(self._post, alert)
                if self.argv:
                    self._attempt(self._run, alert)
            finally:
                self._queue.task_done()

    def _attempt(self, fn, alert: dict) -> None:
        try:
            fn(json.dumps(alert, default=str))
            self.sent += 1
        except Exception as exc:
            self.failures += 1
            logger.warning("rltrace watch: could not deliver alert %s: %s", alert.get("key"), exc)

    def _post(self, body: str) -> None:
        request = urllib.request.Request(self.webhook, data=body.encode(), method="POST",
                                         headers={"Content-Type": "application/json", "User-Agent": "rltrace-watch"})
        with urllib.request.urlopen(request, timeout=self.timeout) as response:  # noqa: S310 (http(s) only, checked)
            if not 200 <= response.status < 300:
                raise OSError(f"webhook answered HTTP {response.status}")

    def _run(self, body: str) -> None:
        alert = json.loads(body)
        # names come from the run: control characters (a NUL cannot be in an environment at all) are escaped
        env = {**os.environ, "RLTRACE_ALERT_RULE": shown(alert.get("rule")), "RLTRACE_ALERT_MESSAGE": shown(alert.get("message")),
               "RLTRACE_ALERT_JSON": body}
        done = subprocess.run(self.argv, input=body, text=True, env=env, timeout=max(self.timeout, 30.0),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        if done.returncode != 0:
            raise OSError(f"{self.argv[0]} exited with status {done.returncode}: {done.stderr.strip()[:200]}")

    def wait(self, timeout: float) -> bool:
        """Give queued alerts up to `timeout` seconds to go out (for --once); True when all went."""
        finished = threading.Event()
        threading.Thread(target=lambda: (self._queue.join(), finished.set()), daemon=True).start()
        return finished.wait(timeout)
