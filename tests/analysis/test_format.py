"""Times and rates in sentences and tables read as a person writes them."""

import pytest

from rltrace.analysis._format import number_text, rate_text, seconds_text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.000231, "231 µs"),
        (6.58e-05, "65.8 µs"),
        (0.0124, "12.4 ms"),
        (1.234, "1.23 s"),
        (4.0, "4.00 s"),
        (0.9996, "1.00 s"),  # the unit is chosen after rounding
        (59.96, "1 min 00 s"),
        (245.2, "4 min 05 s"),
        (7385, "2 h 03 min"),
        (0.0, "0 s"),
        (3e-9, "3.00 ns"),
        (-0.5, "-500 ms"),
        (None, "-"),
        (float("nan"), "-"),
    ],
)
def test_seconds(seconds, text):
    assert seconds_text(seconds) == text


def test_rates_and_numbers():
    assert [rate_text(x) for x in (850, 1e6, 24.8e6, 2.36e9, 999.6, None)] == [
        "850 B/s", "1.00 MB/s", "24.8 MB/s", "2.36 GB/s", "1.00 kB/s", "-"
    ]
    assert [number_text(x) for x in (1.123456e-07, 0.0827, None)] == ["1.12e-07", "0.0827", "-"]


def test_sizes_shares_and_process_names():
    from rltrace.analysis._format import size_text, process_name, share_text

    assert [size_text(x) for x in (0, 850, 999.6, 1234, 1_500_000, 2.36e9, 4.2e12, None)] == [
        "0 B", "850 B", "1.00 kB", "1.23 kB", "1.50 MB", "2.36 GB", "4.20 TB", "-"]
    assert [share_text(x) for x in (0.42, 0.035, 0.0007, 0, None)] == ["42%", "3.5%", "0.07%", "0%", "-"]
    assert [process_name(*x) for x in (("trainer", 0), ("rollout", 3.0), ("reward", None), (None, 1))] == [
        "trainer0", "rollout3", "reward", "?"]


def test_stored_text_is_inert_on_terminals_and_pages():
    from markdown_it import MarkdownIt

    from rltrace.analysis._format import md, shown, term

    hostile = "\x1b[2J\x1b]0;t\x07[link=http://e]x[/link]![i](http://h/p.png)\u202e\ud800"
    assert shown(hostile) == "\\x1b[2J\\x1b]0;t\\x07[link=http://e]x[/link]![i](http://h/p.png)\\u202e\\ud800"
    assert term("[link=http://e]x[/link]") == "\\[link=http://e]x\\[/link]"
    html = MarkdownIt("commonmark").render(md(hostile))
    assert "<img" not in html and "<a " not in html and "\x1b" not in html
    assert md(":red[x] :material/home: $x$") == "\\:red\\[x\\] \\:material\\/home\\: \\$x\\$"


def test_one_formatter_serves_the_cli_the_report_and_the_dashboard():
    """Each unit and name is written by one function: the CLI, the report and the dashboard use the same objects."""
    import importlib
    import re
    from pathlib import Path

    from rltrace.analysis import _format
    from rltrace.cli import info, profile
    from rltrace.report import findings
    from rltrace.ui import charts, gantt, style

    render = importlib.import_module("rltrace.report.render")
    waits = importlib.import_module("rltrace.analysis.waits")
    assert render.sec is findings.sec is _format.seconds_text and waits.seconds_text is _format.seconds_text
    assert render._who is findings._who is waits.process_name is charts.fmt.process_name is _format.process_name
    assert profile.size_text is _format.size_text and render._pct is profile.share_text is _format.share_text
    assert charts.fmt is gantt.fmt is _format and info.term is _format.term
    assert not {"seconds", "nbytes", "share", "who", "wait_text", "process_names"} & set(vars(style))
    root = Path(__file__).parents[2]
    pattern = re.compile(r'"KB"|/ 1024\b|def (_who|who)\(role|def (_size|nbytes|_pct|seconds|wait_text)\(')
    offenders = [str(p.relative_to(root)) for folder in ("rltrace", "replay", "profiling", "ui")
                 for p in (root / folder).rglob("*.py") if not p.is_symlink() and pattern.search(p.read_text())]
    assert offenders == []


def test_time_deltas_read_in_the_units_of_times():
    from rltrace.analysis._format import delta_seconds_text

    assert [delta_seconds_text(x) for x in (0.00231, 12.8, -0.5, 0.0, None)] == [
        "+2.31 ms", "+12.8 s", "-500 ms", "0 s", "-"]
