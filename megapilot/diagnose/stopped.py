"""Who stopped a job: megapilot itself, where the job's record says it did.

A job megapilot stops (its hang window, its wall-clock limit, a cancel, Ctrl-C or a signal to megapilot itself) gets
SIGTERM from it, or an scancel under SLURM. The log then shows only the receiving end: torchrun's agent prints
`SignalException: Process N got signal: 15`, slurmstepd `*** JOB n ON node CANCELLED AT t ***`, lines that alone
read as a stop from outside. The executor records its own stops in the job's job.json (`stop_sent_at`, the state and
the reason: `megapilot.execute.rundir.JobRecord`), and a node log in the run directory's layout
(`<job_dir>/out-node<N>/training.log`) is read beside it. A log elsewhere, or a job.json that cannot be read, tells
nothing: the stop is then told as one from outside, as before.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from megapilot.errors import MegapilotError

_NODE_DIR = re.compile(r"out-node\d+\Z")


@dataclass(frozen=True)
class MegapilotStop:
    """megapilot's own stop of a job: its state (HUNG, TIMEOUT, CANCELLED) and why, as its record says."""

    state: str
    reason: str | None

    @property
    def why(self) -> str:
        """`hung: no new iteration for 4.0 s after iteration 5/100`, or the state where no reason was recorded."""
        return self.reason or self.state.lower()

    @property
    def advice(self) -> str:
        """What the stop means for the run, by its state."""
        if self.state == "HUNG":
            return ("The job hung: no new iteration line came within megapilot's hang window (the suite's hang "
                    "settings, or --hang-timeout-s / --hang-factor of `megapilot run`). The last lines before the "
                    "stop say where it stalled.")
        if self.state == "TIMEOUT":
            return ("The job ran into its wall-clock limit (the suite's timeout, or --timeout-s of `megapilot run`) "
                    "before its final iteration: raise the limit or train fewer iterations, or look for a run slower "
                    "than expected.")
        return "The job was cancelled through megapilot, not by a failure of the training."


def megapilot_stop(log_file: str) -> MegapilotStop | None:
    """megapilot's stop of the job this node log belongs to, or None (not in a run directory, no stop recorded)."""
    folder = Path(log_file).parent
    if not _NODE_DIR.match(folder.name):
        return None
    # the executors' module, read only here: a diagnosis of a log outside any run directory never loads it
    from megapilot.execute.rundir import job_record_path, read_job_record

    if not job_record_path(folder.parent).is_file():
        return None
    try:
        record = read_job_record(folder.parent)
    except (OSError, ValueError, MegapilotError):  # unreadable, half a file, another version's: no clue, no failure
        return None
    if record.stop_sent_at is None:
        return None
    return MegapilotStop(str(record.status.state), record.status.reason)


__all__ = ["MegapilotStop", "megapilot_stop"]
