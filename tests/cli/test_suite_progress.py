"""`suite run`'s live progress: plain lines when piped, a bar with s/it, loss, ETA and nodes on a terminal.

The display is fed real `JobStatus` polls (what the executors return); the end-to-end run that shows it on the
packaged suite is in tests/e2e/test_suite_local.py (slow)."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console
from rich.progress import Progress, TextColumn

from megapilot.cli.suite_progress import SuiteDisplay, progress_text
from megapilot.execute.base import JobState, JobStatus
from megapilot.suite.lifecycle import JobProgress

LOG = Path("/runs/abc/MBS=1/out-node1/training.log")


def _poll(iteration: int | None, *, combo: str = "MBS=1", total: int = 50) -> JobProgress:
    status = JobStatus(state=JobState.RUNNING, iteration=iteration, train_iters=total,
                       step_time_s=0.4 if iteration else None, loss=None if iteration is None else 6.0 - iteration / 50)
    return JobProgress(combo=combo, nodes=2, log=LOG, status=status)


def test_the_progress_text_has_iterations_speed_loss_eta_and_nodes():
    assert progress_text(_poll(10)) == "iteration 10/50 · 0.40 s/it · loss 5.8 · ETA 16 s · 2 node(s)"
    assert progress_text(_poll(None)) == "iteration 0/50 · 2 node(s)"


def test_piped_output_is_one_line_per_stage_and_every_tenth_of_the_run(capsys):
    display = SuiteDisplay(live=False)
    display.event("[4/9] stage smoke")
    for iteration in [None, *range(1, 51)]:
        display.job(_poll(iteration))
    for iteration in range(1, 51):
        display.job(_poll(iteration, combo="MBS=2"))
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "[4/9] stage smoke"
    assert lines[1] == f"  following {LOG}"
    first = [line for line in lines if line.startswith("  MBS=1: iteration")]
    assert [line.split()[2] for line in first] == [f"{i}/50" for i in (1, 6, 11, 16, 21, 26, 31, 36, 41, 46, 50)]
    assert sum(line.startswith("  MBS=2: iteration") for line in lines) == len(first)  # each combo on its own count
    assert sum("following" in line for line in lines) == 2


def test_on_a_terminal_the_bar_follows_the_running_combo():
    buffer = io.StringIO()
    progress = Progress(TextColumn("{task.description} {task.completed}/{task.total} {task.fields[detail]}"),
                        console=Console(file=buffer, force_terminal=True, width=200), auto_refresh=False)
    display = SuiteDisplay(live=True, progress=progress)
    with progress:
        display.job(_poll(20))
        task = progress.tasks[-1]
        assert (task.description, task.completed, task.total) == ("MBS=1", 20, 50)
        assert "0.40 s/it" in task.fields["detail"] and "loss 5.6" in task.fields["detail"]
        assert "ETA 12 s" in task.fields["detail"] and "2 node(s)" in task.fields["detail"]
        display.job(_poll(3, combo="MBS=2"))
        assert [t.description for t in progress.tasks] == ["MBS=2"]  # one bar: the running combo's
    assert f"following {LOG}" in buffer.getvalue()


def _waiting(reason: str | None, combo: str = "MBS=1") -> JobProgress:
    return JobProgress(combo=combo, nodes=1, log=LOG,
                       status=JobStatus(state=JobState.PENDING, reason=reason, train_iters=50))


def test_a_job_waiting_in_the_queue_says_why_once_per_reason(capsys):
    held = "ReqNodeNotAvail, UnavailableNodes:node1"
    assert progress_text(_waiting(held)) == f"waiting in the queue ({held}) · 1 node(s)"
    display = SuiteDisplay(live=False)
    for reason in (None, held, held, held, "Resources", "Resources"):
        display.job(_waiting(reason))
    display.job(_poll(5))
    lines = capsys.readouterr().err.splitlines()
    assert lines == [f"  following {LOG}", f"  MBS=1: waiting in the queue ({held})",
                     "  MBS=1: waiting in the queue (Resources)",
                     "  MBS=1: iteration 5/50 · 0.40 s/it · loss 5.9 · ETA 18 s · 2 node(s)"]
