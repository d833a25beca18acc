"""The progress shown while a command analyses a run: a spinner, and a bar with steps and time left
while per-step summaries are computed from spans (most of a first report on a big run)."""

from __future__ import annotations

import contextlib

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeRemainingColumn

from rltrace.analysis import summary


@contextlib.contextmanager
def analysing(console: Console, label: str):
    """Show `label` with a spinner; when summaries are computed, how many steps are done."""
    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeRemainingColumn())
    with Progress(*columns, console=console, transient=True, disable=not console.is_terminal) as bar:
        task = bar.add_task(label, total=None)

        def tell(done: int, total: int) -> None:
            bar.update(task, description="summarising steps from spans", completed=done,
                       total=total)

        with summary.progress(tell):
            yield
