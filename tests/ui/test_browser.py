"""End to end: `rltrace ui` as a user starts it, driven by headless Chromium through every page.

Screenshots land in test-artifacts/ui/. Outside CI the test is skipped when Chromium or Playwright
is missing; in CI (CI=true) that is a failure, since `make test` installs both.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import REPO, python_env

from .conftest import snapshot

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run"]
ARTIFACTS = REPO / "test-artifacts" / "ui"
START_TIMEOUT_S = 90
PAGE_TIMEOUT_MS = 90_000
#: url path -> (title shown, text the page must show) for the colocated run (named "colocated"),
#: in the order visited: the fresh server's first page is not the Overview (a bookmark, a link)
PAGES = {
    "reward": ("Reward & mismatch", "Samples of colocated"),
    "": ("colocated", "Cost model (median seconds per step)"),
    "timeline": ("Timeline", "Chrome trace (Perfetto)"),
    "waits": ("Waiting stages", "Weight sync: t_W ≈ S_W / B_W + t_0"),
    "profiles": ("Profiles", "pyspy_record of reward"),
    # opens on the run's worst sample; its batch may hold no per-token log-probs (the page then says what to freeze)
    "batches": ("Batches", re.compile("Per-token log-prob difference|to see where the engines disagree")),
    "compare": ("Compare", "Timelines on one time scale"),
    "engine": ("Engine", "No engine requests to show"),
}


def _cannot(what: str, exc: Exception):
    if os.environ.get("CI") == "true":
        pytest.fail(f"the browser test must run in CI, but {what}: {exc}")
    pytest.skip(f"{what}: {exc}")


def _browser(playwright):
    """Chromium, or a skip outside CI when it cannot run here."""
    try:
        if not Path(CHROMIUM).exists():
            raise FileNotFoundError(f"{CHROMIUM} is not installed (apt-get install chromium)")
        return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
    except Exception as exc:
        _cannot("Chromium cannot start", exc)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(server: subprocess.Popen, port: int) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"rltrace ui exited with {server.returncode}: {server.stdout.read()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as r:
                if r.read() == b"ok":
                    return
        except OSError:
            time.sleep(0.2)  # the server is not listening yet: nothing to wait on but the port
    pytest.fail(f"rltrace ui did not answer /_stcore/health within {START_TIMEOUT_S} s")


def _serve(*run_dirs: Path):
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "rltrace", "ui", *map(str, run_dirs), "--port", str(port)],
                              env=python_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_healthy(server, port)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.fixture
def dashboard(colocated_run, async_run):
    yield from _serve(colocated_run, async_run)


#: A training loop that runs until it is killed: one short step every 0.2 s.
LIVE_LOOP = """
import itertools, sys, time, rltrace
rltrace.init(sys.argv[1], role="trainer", flush_interval=0.2)
for step in itertools.count():
    with rltrace.phase("train", step=step):
        time.sleep(0.2)
    rltrace.log_metrics(step, reward_mean=1 - 1 / (step + 1))
"""
#: The step range slider's upper end: the latest step the page shows.
LAST_STEP = "() => Number([...document.querySelectorAll('[data-testid=stSliderThumbValue]')].at(-1)?.innerText ?? -1)"


#: True once the page stopped changing: no running indicator and the same height at every check
#: for the last SETTLED_MS (asked every SETTLED_POLL_MS: it answers soon after the page settles).
SETTLED_MS, SETTLED_POLL_MS = 500, 100
SETTLED = """() => {
    const main = document.querySelector('[data-testid=stMain]');
    const now = performance.now();
    if (!main || document.querySelector('[data-testid=stStatusWidget]')) {
        window.__sameSince = undefined;
        return false;
    }
    if (window.__sameSince === undefined || window.__lastHeight !== main.scrollHeight) {
        window.__lastHeight = main.scrollHeight;
        window.__sameSince = now;
        return false;
    }
    return now - window.__sameSince >= %d;
}""" % SETTLED_MS


def _settle(page) -> None:
    """Wait until the script run finished and the page stopped growing (charts and tables drawn)."""
    page.wait_for_selector("h1", timeout=PAGE_TIMEOUT_MS)
    page.wait_for_function(SETTLED, polling=SETTLED_POLL_MS, timeout=PAGE_TIMEOUT_MS)


def _shoot(page, name: str) -> None:
    height = page.evaluate("() => document.querySelector('[data-testid=stMain]').scrollHeight")
    page.set_viewport_size({"width": 1440, "height": max(900, height + 40)})
    page.wait_for_function(SETTLED, polling=SETTLED_POLL_MS, timeout=PAGE_TIMEOUT_MS)  # relaid out at the new size
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"))
    page.set_viewport_size({"width": 1440, "height": 900})


def _no_exception(page, where: str) -> None:
    shown = [e.inner_text() for e in page.query_selector_all("[data-testid=stException], [data-testid=stAlertContentError]")]
    assert not shown, f"{where}: {shown}"


@pytest.mark.slow
def test_every_page_in_a_real_browser(dashboard, colocated_run, async_run):
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        _cannot("Playwright is not installed (pip install playwright)", exc)
    shutil.rmtree(ARTIFACTS, ignore_errors=True)
    ARTIFACTS.mkdir(parents=True)
    before = {run: snapshot(run) for run in (colocated_run, async_run)}
    errors: list[str] = []
    with sync_playwright() as p:
        browser = _browser(p)
        page = browser.new_page(viewport={"width": 1440, "height": 900})
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        for path, (title, must_show) in PAGES.items():
            page.goto(f"{dashboard}/{path}")
            page.wait_for_selector(f"h1:has-text('{title}')", timeout=PAGE_TIMEOUT_MS)
            _settle(page)
            page.get_by_text(must_show).first.wait_for(timeout=PAGE_TIMEOUT_MS)
            _no_exception(page, path or "overview")
            _shoot(page, f"colocated-{path or 'overview'}")

        page.goto(f"{dashboard}/timeline")  # click a bar of the Gantt: its span opens below
        _settle(page)
        bars = page.locator(".js-plotly-plot .barlayer .point path")
        bars.first.wait_for(state="attached", timeout=PAGE_TIMEOUT_MS)
        widest = max((b.bounding_box() for b in bars.all()), key=lambda box: box["width"] if box else 0)
        page.mouse.click(widest["x"] + widest["width"] / 2, widest["y"] + widest["height"] / 2)
        page.get_by_text("Attributes", exact=True).wait_for(timeout=PAGE_TIMEOUT_MS)
        _settle(page)
        _no_exception(page, "timeline after a click")
        _shoot(page, "colocated-timeline-span")

        page.locator("[data-testid=stSidebar] [data-testid=stSelectbox]").first.click()  # the run picker
        page.get_by_role("option", name="async", exact=True).click()
        page.wait_for_selector("h1:has-text('Timeline')", timeout=PAGE_TIMEOUT_MS)
        _settle(page)
        for link, must_show in (("Overview", "open span"), ("Timeline", "Chrome trace (Perfetto)"),
                                ("Waiting stages", "Who waits for what"), ("Compare", "Phase times")):
            page.locator("[data-testid=stSidebarNav] a", has_text=link).click()  # same session: the run stays picked
            page.wait_for_selector(f"h1:has-text('{'async' if link == 'Overview' else link}')",
                                   timeout=PAGE_TIMEOUT_MS)
            _settle(page)
            page.get_by_text(must_show).first.wait_for(timeout=PAGE_TIMEOUT_MS)
            _no_exception(page, f"async {link}")
            _shoot(page, f"async-{link.lower().replace(' ', '-')}")
        browser.close()
    assert not errors, errors
    assert {run: snapshot(run) for run in (colocated_run, async_run)} == before


@pytest.mark.slow
def test_a_run_being_written_shows_new_steps_by_itself(tmp_path):
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        _cannot("Playwright is not installed (pip install playwright)", exc)
    run_dir = tmp_path / "live"
    loop = subprocess.Popen([sys.executable, "-c", LIVE_LOOP, str(run_dir)], env=python_env())
    try:
        while not (run_dir / "spans").is_dir() or not any((run_dir / "spans").glob("*.parquet")):
            if loop.poll() is not None:
                pytest.fail(f"the training loop exited with {loop.returncode}")
            time.sleep(0.1)  # the loop's first part: nothing to wait on but the file
        with sync_playwright() as p:
            browser = _browser(p)
            page = browser.new_page(viewport={"width": 1440, "height": 900})
            for url in _serve(run_dir):
                page.goto(url)
                _settle(page)
                page.get_by_text("still being written").wait_for(timeout=PAGE_TIMEOUT_MS)
                first = page.evaluate(LAST_STEP)
                page.wait_for_function(f"() => ({LAST_STEP})() > {first}", timeout=PAGE_TIMEOUT_MS)  # no click, no reload
                _no_exception(page, "live overview")
            browser.close()
    finally:
        loop.kill()
        loop.wait(timeout=30)
