"""In a real browser (headless Chromium): a page of the dashboard asks nothing of any address but
the dashboard's own (an air-gapped cluster has no font host), and stored text that looks like a
URL or an e-mail address is shown as text, never as a link."""

from __future__ import annotations

import time
from urllib.parse import urlsplit

import pytest

from rltrace.testing import RunBuilder

from .test_browser import PAGE_TIMEOUT_MS, PAGES, _browser, _cannot, _serve, _settle

LINKISH = "see https://example.com/x, www.example.org or ops@example.net"


@pytest.fixture(scope="module")
def linkish_run(tmp_path_factory):
    """A run whose name, roles, phases, waits and attributes hold URLs and an e-mail address."""
    b = RunBuilder(tmp_path_factory.mktemp("offline") / "run", name=f"run {LINKISH}")
    trainer, worker = b.process(f"trainer {LINKISH}"), b.process("rollout")
    for step in (1, 2):
        t = step * 10
        trainer.span(f"train {LINKISH}", t, t + 1, step=step, note=LINKISH)
        trainer.span("wait", t + 1, t + 3, step=step, waiting_for=f"generate {LINKISH}")
        worker.span(f"generate {LINKISH}", t + 1, t + 3, step=step)
    b.metric(1, "reward_mean", 0.5)
    b.metric(2, "reward_mean", 0.6)
    b.write()
    return b.run_dir


@pytest.fixture(scope="module")
def dashboard(linkish_run):
    yield from _serve(linkish_run)


@pytest.fixture(scope="module")
def page_loads(dashboard):
    """Every page loaded once in Chromium: (every URL requested, every link on each page)."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        _cannot("Playwright is not installed (pip install playwright)", exc)
    requested, links, texts = [], {}, {}
    with sync_playwright() as p:
        browser = _browser(p)
        page = browser.new_page(viewport={"width": 1440, "height": 900})
        page.on("request", lambda request: requested.append(request.url))
        for path in PAGES:
            page.goto(f"{dashboard}/{path}")
            _settle(page)
            time.sleep(1.0)  # late requests (the favicon, fonts) come after the page settles
            links[path or "overview"] = page.evaluate(
                "() => [...document.querySelectorAll('[data-testid=stMain] a, [data-testid=stSidebarUserContent] a')]"
                ".map(a => [a.getAttribute('href') || '', a.innerText])")
            texts[path or "overview"] = page.evaluate("() => document.querySelector('[data-testid=stMain]').innerText")
        browser.close()
    return dashboard, requested, links, texts


@pytest.mark.slow
def test_a_page_load_requests_nothing_but_the_dashboard(page_loads):
    dashboard, requested, _, _ = page_loads
    assert len(requested) > len(PAGES)
    own = urlsplit(dashboard).netloc
    elsewhere = sorted({url for url in requested
                        if urlsplit(url).scheme not in ("data", "blob") and urlsplit(url).netloc != own})
    assert not elsewhere, elsewhere
    assert {urlsplit(url).hostname for url in requested if urlsplit(url).netloc} <= {"127.0.0.1", "localhost"}


@pytest.mark.slow
def test_urls_in_stored_text_are_text_not_links(page_loads):
    dashboard, _, links, texts = page_loads
    for page, found in links.items():
        outside = [(href, text) for href, text in found if not href.startswith(("#", "/", dashboard))]
        assert not outside, f"{page}: {outside}"
    shown = texts["overview"].replace("\u2060", "")  # the text is there, as the characters it is
    assert "https://example.com/x" in shown and "www.example.org" in shown and "ops@example.net" in shown
