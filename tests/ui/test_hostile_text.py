"""Stored text is inert on a dashboard page: a role, phase name, `waiting_for`, run name or profile
reason written as markdown (an image that the browser would fetch, a link, a colour directive)
is shown as the characters it is, on every page."""

from __future__ import annotations

import pyarrow as pa
import pytest
from markdown_it import MarkdownIt

from rltrace import _names
from rltrace.analysis import _format as fmt
from rltrace.store.parts import write_part
from rltrace.testing import RunBuilder

from .conftest import no_exceptions
from .test_pages import PAGES

LEAK = "![x](http://host/leak.png)"  # a remote image: the browser fetches it when the page renders
HOSTILE = f"{LEAK}<img src='http://host/leak2.png'><a href='http://host/b'>b</a>[a](http://host/a):red[c]:material/home:$x^2$\x1b[2J"
KINDS = ("title", "header", "subheader", "markdown", "caption", "info", "warning", "error", "success")


@pytest.fixture
def hostile_run(tmp_path):
    b = RunBuilder(tmp_path / "run", name=HOSTILE)
    trainer, worker = b.process("trainer"), b.process("rollout")
    trainer.role = worker.role = HOSTILE  # part file names stay plain; the stored roles are hostile
    for step in (1, 2):
        t = step * 10
        trainer.span("train", t, t + 1, step=step)
        trainer.span("wait", t + 1, t + 3, step=step, waiting_for=HOSTILE)
        worker.span(HOSTILE, t + 1, t + 3, step=step)
        worker.span("rollout", t, t + 1, step=step)
    hung = trainer.span(HOSTILE, 25, None, step=2)  # open: in the findings, Overview's table and the Timeline
    b.metric(1, "reward_mean", 0.5)
    b.metric(2, "reward_mean", 0.6)
    b.write()
    row = {f.name: None for f in _names.PROFILES_SCHEMA}
    row.update(profile_id="p1", trace_id=hung.trace_id, span_id=hung.span_id, phase=HOSTILE, step=2, kind="pyspy_dump",
               trigger=HOSTILE, status="ok", reason=HOSTILE, message=HOSTILE, process_id=trainer.process_id,
               role=HOSTILE, rank=0)
    write_part(b.run_dir / _names.PROFILES.folder, "p1.parquet", pa.Table.from_pylist([row], schema=_names.PROFILES_SCHEMA),
               _names.PROFILES)
    return b.run_dir, hung.span_id


def _page_markdown(at) -> list[str]:
    """Every markdown body the page hands the browser (main area and sidebar)."""
    out = [str(e.value) for kind in KINDS for e in getattr(at, kind)]
    out += [str(e.value) for kind in KINDS for e in getattr(at.sidebar, kind)]
    return out


def _assert_inert(bodies: list[str], where: str) -> None:
    md = MarkdownIt("commonmark")
    for body in bodies:
        html = md.render(body)
        assert "<img" not in html and "<a " not in html, f"{where}: {body!r} renders as {html!r}"
        assert LEAK not in body and ":red[c]" not in body and "\x1b" not in body, f"{where}: raw stored text {body!r}"


def test_stored_markdown_is_shown_literally_on_every_page(hostile_run, app):
    run_dir, hung = hostile_run
    at = app(run_dir)
    no_exceptions(at)
    seen = 0
    for name in PAGES:
        at.switch_page(f"views/{name}.py").run()
        no_exceptions(at)
        bodies = _page_markdown(at)
        _assert_inert(bodies, name)
        seen += sum(fmt.md(HOSTILE) in b for b in bodies)
    at.session_state["timeline_step"], at.session_state["timeline_span"] = 2, hung  # the hung span's details
    at.switch_page("views/timeline.py").run()
    no_exceptions(at)
    _assert_inert(_page_markdown(at), "timeline (span picked)")
    assert any(f"#### {fmt.md(HOSTILE)}" == b for b in _page_markdown(at))
    assert seen >= 5  # the text is shown (escaped), not dropped: titles, waits, findings, profiles


def test_waits_read_as_the_report_says_them(hostile_run, app):
    """The dashboard shows `top_waits`' own sentences (one builder for report and page)."""
    from rltrace import analysis, store

    run_dir, _ = hostile_run
    sentences = analysis.top_waits(store.open(run_dir), (1, 2))["text"].tolist()
    at = app(run_dir)
    at.session_state["timeline_step"] = 1
    at.switch_page("views/timeline.py").run()
    no_exceptions(at)
    shown = "\n".join(_page_markdown(at))
    step1 = analysis.top_waits(store.open(run_dir), (1, 1))["text"].tolist()
    assert step1 and all(fmt.md(s) in shown for s in step1)
    assert set(step1) <= set(sentences)


def test_chart_labels_show_stored_text_as_text(hostile_run, app):
    """Plotly draws a subset of HTML in names, ticks and hover text: stored `<a href>` stays text there too."""
    import json

    from rltrace.ui import charts

    run_dir, _ = hostile_run
    at = app(run_dir)
    at.session_state["timeline_step"] = 1
    for name in ("timeline", "waits"):
        at.switch_page(f"views/{name}.py").run()
        no_exceptions(at)
        for chart in at.get("plotly_chart"):
            spec = json.dumps(json.loads(chart.proto.spec)["data"])
            assert "<img" not in spec and "<a href" not in spec and "\\u001b" not in spec
    assert charts.label("<a href='http://x'>y</a> & \x1b") == "&lt;a href='http://x'&gt;y&lt;/a&gt; &amp; \\x1b"
