"""The console the commands print with: rich's, except that a reader who stops reading (`rltrace
report RUN | head`) ends the command as a closed pipe does, status 141, the same as `--json`
output (rich's own default exits with 1, which reads as a failure)."""

from __future__ import annotations

from rich.console import Console as _RichConsole


class Console(_RichConsole):
    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError  # `rltrace.cli.main` ends the command quietly, status 141
