"""Where an unfinished suite run stopped, told from its run directory.

While a stage or combo runs, suite.json holds it as INTERRUPTED (the lifecycle writes it so before it starts), with
each job it submitted: a run stopped by a signal, and one killed outright (SIGKILL, a lost node, a full machine),
is left saying where it was. `settle` completes that row from what the job left in its directory (job.json: its
state and the last iteration it logged; its node logs: the tail), for the lifecycle when a signal stops the run
and for `megapilot suite report` of a run that was killed. A suite.json written before runs said where they were
is read by the job directory left unaccounted for, so its report shows the combo too.
"""

from __future__ import annotations

import os
import re
from pathlib import Path, PurePosixPath

from megapilot.errors import MegapilotError
from megapilot.execute.rundir import JOB_RECORD_NAME, node_log_path, read_job_record
from megapilot.suite.outcome import progress_words, stopped_by_words
from megapilot.suite.results import (
    NOT_RUN_REASON,
    ComboResult,
    JobSummary,
    StageResult,
    SuiteResult,
    Verdict,
)
from megapilot.suite.stages import COMBO_STAGES, EARLY_STAGES

LOG_TAIL_LINES = 50
_SAID_SIGNAL = re.compile(r"^interrupted by (?:Ctrl-C \()?(SIG[A-Z]+)")
# Job directories of the early stages' own jobs (smoke, checkpoint save and resume, collectives, the preflight's
# submission check): a job left in one of them is that stage's, never a combo's.
_STAGE_JOB_PREFIXES = ("smoke", "checkpoint", "collectives", "preflight")


def running_stage(name: str) -> StageResult:
    """The row a run-wide stage has in suite.json while it runs."""
    return StageResult(name=name, verdict=Verdict.INTERRUPTED, reason="started; the suite stopped before it ended")


def running_combo(combo: ComboResult) -> tuple[ComboResult, list[StageResult]]:
    """The combo (from its cell, nothing measured) and its train / metrics / loss_curve rows while it runs."""
    reason = "started; the suite stopped before it ended"
    running = combo.model_copy(update={"verdict": Verdict.INTERRUPTED, "reason": reason})
    rows = [StageResult(name=name, combo=combo.key, started_at=combo.started_at,
                        verdict=Verdict.INTERRUPTED if name == "train" else Verdict.SKIPPED,
                        reason=reason if name == "train" else NOT_RUN_REASON) for name in COMBO_STAGES]
    return running, rows


def settle(result: SuiteResult, run_dir: Path) -> None:
    """Complete the row the unfinished `result` stopped in from its jobs' directories under `run_dir` (in place;
    nothing is written). A finished run is left as it is."""
    if result.finished:
        return
    run_dir = Path(run_dir)
    if not result.planned_combos and result.interrupted_stage() is None and result.interrupted_combo() is None:
        _from_what_was_left(result, run_dir)
        if result.stopped_by is None and (said := _SAID_SIGNAL.search(result.reason)):
            result.stopped_by = said.group(1)  # then said only in the reason: 'interrupted by Ctrl-C (SIGINT): ...'
    stage = result.interrupted_stage()
    if stage is not None:
        stage.jobs = [_refreshed(job, run_dir) for job in stage.jobs]
        last = stage.jobs[-1] if stage.jobs else None
        where = f" (job {_job_dir_of(last)}, {progress_words(last)})" if last is not None else ""
        stage.reason = f"interrupted{stopped_by_words(result)}{where}"
        if stage.started_at is not None and result.ended_at is not None:
            # how long it ran before the stop (a preflight probe held in the queue for minutes is not 0 s)
            stage.duration_s = round(max((result.ended_at - stage.started_at).total_seconds(), 0.0), 3)
    combo = result.interrupted_combo()
    if combo is not None:
        job = _refreshed(combo.job, run_dir) if combo.job is not None else None
        combo.job = job
        combo.reason = f"interrupted {progress_words(job)}{stopped_by_words(result)}"
        combo.log_tail = log_tail([run_dir / name for name in job.logs]) if job is not None else []
        if job is not None:
            combo.duration_s = job.duration_s
        for row in result.stages:
            if row.combo == combo.key and row.verdict is Verdict.INTERRUPTED:
                row.reason, row.duration_s = combo.reason, combo.duration_s


def job_summary(job_dir: Path, run_dir: Path, *, nodes: int = 1) -> JobSummary | None:
    """The job of `job_dir` as its job.json last said (None without a readable one), its node logs relative to
    `run_dir`."""
    try:
        record = read_job_record(job_dir)
    except (MegapilotError, OSError, ValueError):  # a damaged job.json is a ValueError too
        return None
    status = record.status
    logs = [node_log_path(job_dir, node) for node in range(max(record.nodes, nodes))]
    return JobSummary(executor=record.executor, job_id=record.job_id or "", state=status.state.value,
                      exit_code=status.exit_code, reason=status.reason, iterations_reached=status.iteration,
                      train_iters=status.train_iters, duration_s=round(status.elapsed_s, 3),
                      logs=[_relative(path, run_dir) for path in logs if path.is_file()])


def log_tail(logs: list[Path], lines: int = LOG_TAIL_LINES) -> list[str]:
    """The last lines of the last node's log that has any (Megatron prints iterations from the last rank)."""
    for path in reversed(logs):
        try:
            with path.open("rb") as handle:
                handle.seek(0, os.SEEK_END)
                handle.seek(max(0, handle.tell() - 64 * 1024))
                text = handle.read().decode("utf-8", "replace").splitlines()
        except OSError:
            continue
        if text:
            return text[-lines:]
    return []


def _refreshed(job: JobSummary, run_dir: Path) -> JobSummary:
    """`job` as its job.json says now (the lifecycle records a job as it is submitted, job.json follows it)."""
    if not job.logs:
        return job
    found = job_summary(run_dir / _job_dir_of(job), run_dir, nodes=len(job.logs))
    if found is None:
        return job
    return found.model_copy(update={"job_id": found.job_id or job.job_id, "logs": found.logs or job.logs})


def _job_dir_of(job: JobSummary) -> str:
    """The job's directory relative to the run directory: its logs are `<dir>/out-node<N>/training.log`."""
    return str(PurePosixPath(job.logs[0]).parent.parent) if job.logs else ""


def _from_what_was_left(result: SuiteResult, run_dir: Path) -> None:
    """A suite.json written before runs said where they were: the step it stopped in is the first early stage
    without a row, else the newest job directory no stage or combo accounts for (a combo, named by its
    directory)."""
    names = {s.name for s in result.stages if s.combo is None}
    missing = next((name for name in EARLY_STAGES if name not in names), None)
    known = {c.directory for c in result.combos} | {_job_dir_of(j) for s in result.stages for j in s.jobs}
    left = sorted((p.parent for p in run_dir.glob(f"*/{JOB_RECORD_NAME}") if p.parent.name not in known),
                  key=lambda p: p.joinpath(JOB_RECORD_NAME).stat().st_mtime)
    if missing is not None:
        stage = running_stage(missing)
        jobs = [job for path in left if path.name.startswith(_STAGE_JOB_PREFIXES)
                if (job := job_summary(path, run_dir)) is not None]
        stage.jobs = jobs
        result.stages.append(stage)
        return
    combos = [path for path in left if not path.name.startswith(_STAGE_JOB_PREFIXES)]
    if not combos:
        return
    directory = combos[-1].name
    combo, rows = running_combo(ComboResult(key=directory, directory=directory, verdict=Verdict.INTERRUPTED,
                                            backend=result.card.backend, nodes=result.card.nodes,
                                            gpus_per_node=result.card.gpus_per_node))
    combo.job = job_summary(combos[-1], run_dir)
    combo.train_iters = combo.job.train_iters if combo.job else None
    result.combos.append(combo)
    result.stages.extend(rows)


def _relative(path: Path, root: Path) -> str:
    try:
        return str(path.resolve().relative_to(root.resolve()))
    except ValueError:
        return str(path)


__all__ = ["job_summary", "log_tail", "running_combo", "running_stage", "settle"]
