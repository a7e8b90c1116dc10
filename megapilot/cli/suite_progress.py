"""What `megapilot suite run` shows while it trains, on stderr so stdout stays clean.

On a terminal: each stage's line ('[4/9] stage smoke') above a live bar for the running combo: iterations
done of planned, s/it, loss, ETA, node count; the log being followed is named when a combo starts. Piped or in
CI (not a terminal): the same stage lines, and one plain line per combo every `every` iterations (a tenth of the
run by default), so a CI log shows the run moving without a line per poll. `--quiet`: nothing until the summary.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from megapilot.cli.common import err_console
from megapilot.execute.base import JobState, JobStatus

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

    from megapilot.suite.lifecycle import JobProgress

PLAIN_LINES_PER_COMBO = 10  # piped: about this many progress lines per combo


def progress_text(update: JobProgress) -> str:
    """'iteration 12/50 · 0.41 s/it · loss 5.123 · ETA 16 s · 2 node(s)': what the bar and a plain line say; for a
    job not started yet, that it waits in the queue and the scheduler's reason (a drained node, other jobs)."""
    status = update.status
    if status.state is JobState.PENDING:
        return " · ".join([waiting_text(status), f"{update.nodes} node(s)"])
    parts = [f"iteration {status.iteration or 0}/{status.train_iters or '?'}"]
    if status.step_time_s:
        parts.append(f"{status.step_time_s:.2f} s/it")
    if status.loss is not None:
        parts.append(f"loss {status.loss:.4g}")
    if status.step_time_s and status.train_iters and status.iteration is not None:
        parts.append(f"ETA {max(status.train_iters - status.iteration, 0) * status.step_time_s:.0f} s")
    parts.append(f"{update.nodes} node(s)")
    return " · ".join(parts)


def waiting_text(status: JobStatus) -> str:
    return "waiting in the queue" + (f" ({status.reason})" if status.reason else "")


@dataclass
class SuiteDisplay:
    """Callbacks for run_suite: `event` for stage lines, `job` for each poll of a running combo."""

    live: bool
    progress: Progress | None = None
    every: int | None = None  # piped: a line every this many iterations (None: a tenth of the run)
    _task: TaskID | None = None
    _combo: str | None = None
    _last_line_at: dict[str, int] = field(default_factory=dict)
    _waiting: dict[str, str] = field(default_factory=dict)  # combo -> the queue reason last shown

    def event(self, message: str) -> None:
        if self.progress is not None:
            self.progress.console.print(f"[dim]{message}[/]", highlight=False, soft_wrap=True)
        else:
            err_console.print(message, highlight=False, markup=False, soft_wrap=True)

    def job(self, update: JobProgress) -> None:
        if update.combo != self._combo:
            self._combo = update.combo
            self.event(f"  following {update.log}" if update.log else f"  {update.combo}: waiting for its log")
            self._new_bar(update)
        if self.progress is not None and self._task is not None:
            status = update.status
            self.progress.update(self._task, total=status.train_iters, completed=status.iteration or 0,
                                 detail=progress_text(update))
            return
        self._plain_line(update)

    def _new_bar(self, update: JobProgress) -> None:
        if self.progress is None:
            return
        if self._task is not None:
            self.progress.remove_task(self._task)
        self._task = self.progress.add_task(update.combo, total=update.status.train_iters, detail="starting")

    def _plain_line(self, update: JobProgress) -> None:
        if update.status.state is JobState.PENDING:
            # once per reason: a job held for a drained node says so instead of leaving the log silent (a job
            # just submitted has no reason yet, and most start before they get one)
            said = waiting_text(update.status)
            if update.status.reason and self._waiting.get(update.combo) != said:
                self._waiting[update.combo] = said
                self.event(f"  {update.combo}: {said}")
            return
        iteration, total = update.status.iteration, update.status.train_iters
        if iteration is None:
            return
        every = self.every or max(1, (total or 0) // PLAIN_LINES_PER_COMBO)
        last = self._last_line_at.get(update.combo)
        if last is None or iteration >= last + every or (total is not None and iteration >= total > last):
            self._last_line_at[update.combo] = iteration
            self.event(f"  {update.combo}: {progress_text(update)}")


@contextmanager
def suite_display(*, quiet: bool, every: int | None = None) -> Iterator[SuiteDisplay | None]:
    """The display for a run: a live one on a terminal, plain lines otherwise, None when quiet."""
    if quiet:
        yield None
        return
    if not err_console.is_terminal:
        yield SuiteDisplay(live=False, every=every)
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("{task.fields[detail]}"), TimeElapsedColumn(), console=err_console,
                        transient=True)
    with progress:
        yield SuiteDisplay(live=True, progress=progress, every=every)


def print_paths(report: Path, run_deck: Path, junit: Path) -> None:
    """Where the results are, last, so the user can open them."""
    for label, path in (("report", report), ("run deck", run_deck), ("JUnit", junit)):
        err_console.print(f"{label}: {path}", highlight=False, soft_wrap=True, markup=False)


__all__ = ["PLAIN_LINES_PER_COMBO", "SuiteDisplay", "print_paths", "progress_text", "suite_display"]
