"""Stored text is inert on a terminal: escape sequences, OSC titles and rich markup that a program
wrote into a role, a phase name, a reason or a finish reason are shown, never obeyed."""

from __future__ import annotations

import pyarrow as pa
import pytest
import torch

import rltrace
import rltrace.replay
from rltrace import _names
from rltrace.cli import main
from rltrace.store.parts import write_part
from rltrace.testing import RunBuilder

CLEAR = "\x1b[2J"  # clears the screen
TITLE = "\x1b]0;pwned\x07"  # OSC 0: retitles the terminal window
LINK = "[link=http://evil.example]click[/link]"  # rich markup: a clickable hyperlink on a TTY
HOSTILE = f"x{CLEAR}{TITLE}{LINK}"
SHOWN = "x\\x1b[2J\\x1b]0;pwned\\x07" + LINK  # what a person should read instead


@pytest.fixture(params=["pipe", "tty"])
def terminal(request, monkeypatch):
    """Output captured as through a pipe, and as rich writes it for a colour terminal (FORCE_COLOR)."""
    monkeypatch.setenv("COLUMNS", "400")
    if request.param == "tty":
        monkeypatch.setenv("FORCE_COLOR", "1")
    else:
        monkeypatch.delenv("FORCE_COLOR", raising=False)
    return request.param


@pytest.fixture
def hostile_run(tmp_path):
    """A run whose roles, phase names, thread work, profile and frozen batch all carry HOSTILE text."""
    b = RunBuilder(tmp_path / "run", name=HOSTILE)
    trainer, worker = b.process("trainer"), b.process("rollout")
    trainer.role = HOSTILE  # the part file names stay plain; the stored role is hostile
    trainer.span("train", 0, 1, step=1)
    trainer.span("wait", 1, 3, step=1, waiting_for=HOSTILE)
    worker.span(HOSTILE, 1, 3, step=1)
    trainer.span(HOSTILE, 3, None, step=2)  # open: shown under open spans and in a finding
    b.write()
    row = {f.name: None for f in _names.PROFILES_SCHEMA}
    row.update(profile_id="p1", trace_id="t", span_id="s", phase=HOSTILE, step=1, kind="pyspy_record", trigger=HOSTILE,
               status=HOSTILE, reason=HOSTILE, message=HOSTILE, process_id=trainer.process_id, role=HOSTILE, rank=0,
               size_bytes=1_500_000, started_ns=b.t0_ns, ended_ns=b.t0_ns + 10**9)
    write_part(b.run_dir / _names.PROFILES.folder, "p1.parquet", pa.Table.from_pylist([row], schema=_names.PROFILES_SCHEMA),
               _names.PROFILES)
    frame = {"profile_id": "p1", "rank": 0, "frame": HOSTILE, "file": HOSTILE, "line": 1, "self_share": 1.0,
             "total_share": 1.0, "samples": 3, "thread": HOSTILE}
    write_part(b.run_dir / _names.PROFILE_FRAMES.folder, "p1.parquet",
               pa.Table.from_pylist([frame], schema=_names.PROFILE_FRAMES_SCHEMA), _names.PROFILE_FRAMES)
    rltrace.init(b.run_dir, role="trainer")
    rltrace.replay.freeze(3, [{"response_tokens": torch.tensor([1, 2]), "finish_reason": HOSTILE, "response_text": "ok"}],
                          reason=HOSTILE)
    rltrace.replay.flush()
    rltrace.shutdown()
    return b.run_dir


def _out(capsys, *args) -> str:
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out + err


COMMANDS = {
    "info": ("info", "{run}"),
    "report": ("report", "{run}"),
    "profile list": ("profile", "list", "{run}"),
    "profile show": ("profile", "show", "{run}", "p1"),
    "replay list": ("replay", "list", "{run}"),
    "replay show": ("replay", "show", "{run}", "--step", "3"),
    "replay show --sample": ("replay", "show", "{run}", "--step", "3", "--sample", "0"),
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_stored_text_is_shown_not_obeyed(capsys, hostile_run, terminal, command):
    out = _out(capsys, *(a.format(run=hostile_run) for a in COMMANDS[command]))
    assert CLEAR not in out and "\x1b]" not in out and "\x07" not in out  # no screen clear, no OSC (title, hyperlink)
    if terminal == "pipe":
        assert "\x1b" not in out
        assert SHOWN in out or "\\x1b[2J" in out  # shown as escapes (a narrow cell may fold the rest)
        assert "[link=http://evil.example]" in out or "[link=" in out  # the markup is printed, not applied


def test_one_escaping_function_serves_every_command():
    import importlib

    from rltrace.analysis import _format
    from rltrace.cli import info, profile, replay_render

    render = importlib.import_module("rltrace.report.render")
    assert info.term is profile.term is replay_render.term is render.term is _format.term
    assert replay_render.HIDDEN is _format.HIDDEN


def test_an_error_quoting_stored_text_stays_one_inert_line(capsys, monkeypatch, tmp_path):
    """Errors may quote a file's contents (a field name, a path): they print escaped, on one line."""
    from rltrace.cli import info
    from rltrace.replay.errors import ReplayError

    def fail(*_args, **_kwargs):
        raise ReplayError(f"dump holds field {HOSTILE}\nsecond line")

    monkeypatch.setattr(info, "collect", fail)
    assert main(["info", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\x07" not in err and err.count("\n") == 1 and "\\x1b[2J" in err
