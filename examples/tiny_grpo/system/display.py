"""What the demo prints: one line per step above a progress bar, and what to look at next.

`Display` prints in the process that runs it; `ProgressLog` stands in for it inside the trainer's
Ray actor and keeps the same calls as events, which the driver polls and `Display.replay`s.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class Display:
    def __init__(self, total_steps: int, console: Console | None = None):
        self.console = console or Console(highlight=False)
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            console=self.console,
            transient=True,
        )
        self._task = self.progress.add_task("starting", total=total_steps, info="")
        self.rows: list[dict] = []  # one summary row per finished step (demo_summary.json)

    def __enter__(self) -> Display:
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def status(self, text: str) -> None:
        self.progress.update(self._task, description=text)

    def warmup_done(self, batches: int, loss: float) -> None:
        self.console.print(f"warm-up: {batches} supervised batches, loss {loss:.2f}; GRPO starts")
        self.status("GRPO")

    def replay(self, events: list[tuple]) -> None:
        """Show the events a `ProgressLog` recorded, in order."""
        for name, *args in events:
            getattr(self, name)(*args)

    def step(self, row: dict) -> None:
        self.rows.append(row)
        self.console.print(
            f"step {row['step']:>3}  reward {row['reward_mean']:.3f}±{row['reward_std']:.2f}  "
            f"exact {row['exact_match']:.2f}  len {row['response_len_mean']:4.1f}  "
            f"|Δlogp| {row['train_rollout_logprob_abs_diff']:.1e}  stale {row['staleness_mean']:.1f}  "
            f"{row['seconds']:.2f}s",
            soft_wrap=True,
        )
        self.progress.update(self._task, advance=1, info=f"reward {row['reward_mean']:.3f}")

    def hung(self, message: str, cfg) -> None:
        self.progress.stop()
        self.console.print(f"[bold red]rollout hung:[/] {message}.", soft_wrap=True)
        if cfg.hang_after is not None:
            self.console.print(f"(--hang-after {cfg.hang_after} injected this fault.)")
        self.console.print(
            f"Telemetry is flushed; the open `generate` span shows where it stopped: rltrace info {cfg.out}",
            soft_wrap=True,
        )

    def finished(self, out: Path) -> None:
        history = self.rows
        if not history:
            return
        k = min(5, len(history))
        first = sum(r["reward_mean"] for r in history[:k]) / k
        last = sum(r["reward_mean"] for r in history[-k:]) / k
        total = sum(r["seconds"] for r in history)
        self.console.print(
            f"\n[bold]done:[/] {len(history)} steps in {total:.0f} s; reward {first:.3f} -> {last:.3f} "
            f"(mean of first and last {k} steps)",
            soft_wrap=True,
        )
        for line in (
            "Look next:",
            f"  rltrace info {out}      processes, phases, open spans, drops",
            f"  rltrace report {out}    where the time went: waits, mismatch, staleness",
            f"  python -c \"import rltrace.store as s; print(s.open('{out}').sql('from samples limit 5'))\"",
            "  docs/demo.md  the fault flags (--straggler, --slow-reward, ...) and how each shows up",
        ):
            self.console.print(line, soft_wrap=True)


class ProgressLog:
    """`Display`'s calls, kept as events (name, *args) for another process to poll and replay."""

    def __init__(self):
        self.events: list[tuple] = []  # appended by the training thread, read by the polling one

    def status(self, text: str) -> None:
        self.events.append(("status", text))

    def warmup_done(self, batches: int, loss: float) -> None:
        self.events.append(("warmup_done", batches, loss))

    def step(self, row: dict) -> None:
        self.events.append(("step", row))
