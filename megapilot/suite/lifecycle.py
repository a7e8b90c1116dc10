"""The suite's lifecycle: CVS's pinned stage order, each stage timed, failures isolated.

    prepare     run directory, copies of the inputs, the container where the executor has one
    preflight   every node's GPUs, driver, NIC speed, /dev/shm, memlock, free disk (megapilot.suite.preflight)
    collectives bus bandwidth per collective and message size, gated against the catalog's links; the node a
                short collective is blamed on joins failing_nodes.txt (megapilot.suite.collectives)
    tokenizer   the tokenizer present locally, or downloaded with the token from paths.hf_token_file
    smoke       a short run of the smoke cell: it must reach its last iteration with no error signature
    checkpoint  save at k, resume from k: resumed step == k+1, same-step loss within tolerance (every backend)
    per combo   train → metrics → loss_curve (each combo's verdict right after it ran, not after all ran)
    results     the table of every combo
    teardown    stray processes gone, containers removed

A failed early stage (prepare, preflight, smoke, checkpoint) skips every later stage with that reason,
as CVS does; a failed collectives stage fails the run but not the training after it, which still measures (and
names stragglers). A failed combo is isolated: its rows FAIL, the next combo still runs (CVS's first unified
suite skipped every later cell after one failure). Processes left by a job are killed and checked gone
before the next one starts. `suite.json` is rewritten after every stage, so an interrupted run keeps
everything that finished, and holds the stage or combo that runs as INTERRUPTED until it ends (with the jobs
it submitted), so a run stopped by a signal or killed outright is left saying where it was
(megapilot.suite.interruption); Ctrl-C stops the current job and ends the run as interrupted.
"""

from __future__ import annotations

import platform
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING

from megapilot import __version__ as megapilot_version
from megapilot.errors import MegapilotError
from megapilot.execute.base import Executor, HangPolicy, JobHandle, JobResult, JobSpec, JobState, JobStatus
from megapilot.execute.interrupt import Interrupted, describe_interruption, signal_name, stop_reason
from megapilot.execute.process import free_port
from megapilot.files import DiskFullError, atomic_write_bytes, free_bytes, human_size, is_disk_full
from megapilot.spec import Prediction
from megapilot.suite.budget import project_budget
from megapilot.suite.collectives import run_collectives_stage
from megapilot.suite.config import describe_hang_window
from megapilot.suite.containers import prepare_containers, teardown_containers
from megapilot.suite.continuity import check_continuity, read_checkpoint_run
from megapilot.suite.interpreter import interpreter_rows
from megapilot.suite.interruption import log_tail, running_combo, running_stage, settle
from megapilot.suite.measure import cell_thresholds, measure_and_gate
from megapilot.suite.nodes import close_node_lists, node_env, probe_nodes, write_node_lists
from megapilot.suite.outcome import run_outcome
from megapilot.suite.predicted import predict_combo
from megapilot.suite.render import checkpoint_cell, checkpoint_jobs, checkpoint_save_dir, render_cell
from megapilot.suite.repeats import combine_repeats, repeat_directory
from megapilot.suite.results import (
    SUITE_RESULT_NAME,
    ComboResult,
    Finding,
    JobSummary,
    MetricRow,
    RunCard,
    StageResult,
    SuiteResult,
    Verdict,
    error_findings,
    overall_verdict,
    recorded_layout,
)
from megapilot.suite.secrets import holds_secrets, write_masked_copy
from megapilot.suite.stages import COMBO_STAGES, EARLY_STAGES, NON_BLOCKING_STAGES, STAGES
from megapilot.suite.thresholds import BaselineThreshold
from megapilot.suite.tokenizer import prepare_tokenizer
from megapilot.suite.watch import FatalWatch

if TYPE_CHECKING:
    from megapilot.estimate.history_calibration import MeasuredRun
    from megapilot.suite.baseline import BaselineSource
    from megapilot.suite.cells import SweepCell
    from megapilot.suite.config import LoadedSuite
    from megapilot.suite.gates import BaselineLookup
    from megapilot.suite.render import CellLaunch

POLL_INTERVAL_S = 0.5
STRAY_GRACE_S = 5.0

EventCallback = Callable[[str], None]


@dataclass(frozen=True)
class JobProgress:
    """One poll of a running combo's job, for a live display: which combo, on how many nodes, the log followed."""

    combo: str
    nodes: int
    log: Path | None
    status: JobStatus


ProgressCallback = Callable[[JobProgress], None]


@dataclass(frozen=True)
class RunRequest:
    """What `megapilot suite run` asks for."""

    out_dir: Path
    only_stage: str | None = None
    only_combo: str | None = None
    resume_from: SuiteResult | None = None
    run_id: str | None = None
    baseline: BaselineSource | None = None  # the run history, for `baseline` thresholds
    cluster_name: str | None = None  # recorded under it; None: the cluster file's name
    history_runs: tuple[MeasuredRun, ...] = ()  # this cluster's measured runs: the predictions' calibration
    # How a finished combo of this run becomes a measured run of its cluster (the history's own rule), so that each
    # combo is also calibrated on what this run measured before it; None: only the history's runs calibrate.
    measured_run_of: Callable[[SuiteResult, ComboResult], MeasuredRun | None] | None = None
    calibrate: bool = True
    notes: tuple[str, ...] = ()  # what the run's notes must say from the start (the nodes left out, and why)


@dataclass
class _Context:
    suite: LoadedSuite
    request: RunRequest
    executor: Executor
    result: SuiteResult
    run_dir: Path
    on_event: EventCallback
    on_progress: ProgressCallback | None = None
    steps_done: int = 0  # stages and combos begun, for "N/M"
    failed_stage: str | None = None
    interrupted: bool = False
    handles: list[JobHandle] = field(default_factory=list)
    new_work: int = 0  # stages and combos this process finished (a resume that finished none is undone)
    running: StageResult | ComboResult | None = None  # the row suite.json holds as INTERRUPTED while it runs


def new_run_id() -> str:
    """Sortable and unique: UTC time plus 4 random hex digits."""
    return datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(2)


def run_suite(suite: LoadedSuite, request: RunRequest, executor: Executor,
              on_event: EventCallback | None = None, on_progress: ProgressCallback | None = None) -> SuiteResult:
    """Run every stage in order; return the result (also written to `<run_dir>/suite.json`).

    With `request.resume_from` (an interrupted run), every stage and combo that run finished is kept as it
    was and not re-run; the one it was interrupted in runs again from scratch, in a clean directory. A
    resume that fails before anything new finished leaves the run's suite.json exactly as it was."""
    previous = request.resume_from
    run_id = request.run_id or (previous.run_id if previous else new_run_id())
    run_dir = (request.out_dir / run_id).resolve()
    _make_run_dir(run_dir, private=holds_secrets(suite))
    original = _saved_state(run_dir) if previous is not None else None
    started = datetime.now(timezone.utc)
    card = _run_card(suite).model_copy(update={"cluster_name": cluster_name(suite, request)})
    # INTERRUPTED until the run ends: what a run killed outright leaves in suite.json
    result = SuiteResult(run_id=run_id, run_dir=str(run_dir), verdict=Verdict.INTERRUPTED, card=card,
                         started_at=previous.started_at if previous else started,
                         notes=list(previous.notes) if previous else [],
                         planned_combos=[c.key for c in suite.cells
                                         if not request.only_combo or c.key == request.only_combo])
    ctx = _Context(suite, request, executor, result, run_dir, on_event or (lambda _message: None), on_progress)
    _note_once(result, describe_hang_window(suite.config.megapilot))
    for note in request.notes:
        _note_once(result, note)
    clock = time.monotonic()
    completed = False
    try:
        _run_stages(ctx)
        completed = True
    except KeyboardInterrupt as exc:
        ctx.interrupted = True
        signum = exc.signum if isinstance(exc, Interrupted) else signal.SIGINT
        result.stopped_by = signal_name(signum)
        ctx.on_event(f"{describe_interruption(signum)}: the running job was stopped; finished results are kept")
    except BaseException as exc:
        _stop_all(ctx)
        if original is not None and ctx.new_work == 0:
            _restore_state(run_dir, original)  # a failed resume leaves the run as it was
            raise
        result.stopped_by = f"an error ({' '.join(str(exc).split())[:300]})"
        _close(ctx, clock, completed=False)
        raise
    _stop_all(ctx)
    _close(ctx, clock, completed=completed)
    return result


def _note_once(result: SuiteResult, note: str) -> None:
    if note not in result.notes:
        result.notes.append(note)


def _close(ctx: _Context, clock: float, *, completed: bool) -> None:
    """The run's end: its verdict, and finished only when every stage ran (an interrupted run is resumable)."""
    result = ctx.result
    result.ended_at = datetime.now(timezone.utc)
    previous = ctx.request.resume_from
    result.duration_s = round(time.monotonic() - clock + (previous.duration_s if previous else 0.0), 3)
    result.finished = completed and not ctx.interrupted
    result.recompute_verdict()
    if not result.finished:
        settle(result, ctx.run_dir)  # the stage or combo it stopped in, as its job left it
        result.verdict = Verdict.INTERRUPTED  # whatever finished said: the run did not (the one verdict)
        result.reason = run_outcome(result).summary
    elif result.verdict is Verdict.FAIL:
        result.reason = result.failure_summary()
    # the config's token budget, projected from what was measured
    result.budget = project_budget(ctx.suite.config.budget, ctx.suite.model, ctx.suite.gpu, result)
    _save(ctx)  # on a full disk the caller, writing the report, says what could not be written


def _make_run_dir(run_dir: Path, *, private: bool) -> None:
    """The run directory; only its owner may enter it when the suite holds a secret (its jobs' environment,
    their logs and scripts live there)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    if private:
        run_dir.chmod(0o700)


def _saved_state(run_dir: Path) -> bytes | None:
    path = run_dir / SUITE_RESULT_NAME
    return path.read_bytes() if path.is_file() else None


def _restore_state(run_dir: Path, original: bytes | None) -> None:
    if original is not None:
        atomic_write_bytes(run_dir / SUITE_RESULT_NAME, original)


def cluster_name(suite: LoadedSuite, request: RunRequest) -> str | None:
    """The cluster a run is recorded (and calibrated) under: --cluster-name, else the cluster file's name (its
    stem), else `local` for a suite that runs on this machine without one."""
    if request.cluster_name:
        return request.cluster_name
    if suite.cluster_path is not None:
        return Path(suite.cluster_path).stem
    return "local" if suite.device == "cpu" else None


def _run_stages(ctx: _Context) -> None:
    for name in EARLY_STAGES:
        _stage(ctx, name, _EARLY[name])
    for cell in ctx.suite.cells:
        if ctx.request.only_combo and cell.key != ctx.request.only_combo:
            continue
        _combo(ctx, cell)
    _stage(ctx, "results", _results_stage)
    _stage(ctx, "teardown", _teardown_stage)


# ---- stages ---------------------------------------------------------------------------------------

def _wanted(ctx: _Context, name: str) -> bool:
    only = ctx.request.only_stage
    if only is None or name in ("prepare", "results", "teardown"):
        return True
    if only in COMBO_STAGES:
        return name in COMBO_STAGES
    return name == only


def _stage(ctx: _Context, name: str, body: Callable[[_Context], StageResult]) -> StageResult:
    """Run one stage (or record why it is skipped), time it, and save the result file."""
    step = _step(ctx)
    kept = _kept_stage(ctx, name)
    if kept is not None:
        ctx.result.stages.append(kept)
        if name == "smoke" and (smoke := ctx.request.resume_from.combo("smoke")) is not None:  # type: ignore[union-attr]
            ctx.result.combos.append(smoke)
        if kept.verdict is Verdict.FAIL and name in EARLY_STAGES and name not in NON_BLOCKING_STAGES:
            ctx.failed_stage = name
        ctx.on_event(f"{step} stage {name}: {kept.verdict.value} (kept: finished before the interruption)")
        return kept
    at: int | None = None  # where the stage's row stands in the list while it runs
    if not _wanted(ctx, name):
        stage = StageResult(name=name, verdict=Verdict.SKIPPED,
                            reason=f"not selected (--stage {ctx.request.only_stage})")
    elif ctx.failed_stage is not None and name not in ("results", "teardown"):
        stage = StageResult(name=name, verdict=Verdict.SKIPPED, reason=f"skipped: stage {ctx.failed_stage} failed")
    else:
        ctx.on_event(f"{step} stage {name}")
        started, clock = datetime.now(timezone.utc), time.monotonic()
        at = _begin(ctx, running_stage(name).model_copy(update={"started_at": started}))
        try:
            stage = body(ctx)
        except OSError as exc:
            if not is_disk_full(exc):
                raise
            stage = StageResult(name=name, verdict=Verdict.FAIL, reason=_disk_full_reason(ctx, exc))
        stage.started_at = started
        stage.duration_s = round(time.monotonic() - clock, 3)
        if stage.verdict is Verdict.FAIL and name in EARLY_STAGES and name not in NON_BLOCKING_STAGES:
            ctx.failed_stage = name
    if at is None:
        ctx.result.stages.append(stage)
    else:
        ctx.result.stages[at] = stage
        ctx.running = None
    ctx.new_work += 1
    _save(ctx)
    ctx.on_event(f"{step} stage {name}: {stage.verdict.value}" + (f" ({stage.reason})" if stage.reason else ""))
    return stage


def _kept_stage(ctx: _Context, name: str) -> StageResult | None:
    """The early stage as the resumed run finished it (None: it did not, or this is not a resume).
    results and teardown always run again: they sum up and clean up the whole run."""
    previous = ctx.request.resume_from
    if previous is None or name not in EARLY_STAGES:
        return None
    return next((s for s in previous.stages if s.name == name and s.combo is None
                 and s.verdict is not Verdict.INTERRUPTED), None)  # the stage it was stopped in runs again


def _prepare_stage(ctx: _Context) -> StageResult:
    """Copy the inputs (never the token file; every secret masked) next to the results and prepare containers."""
    inputs = ctx.run_dir / "inputs"
    inputs.mkdir(exist_ok=True)
    suite = ctx.suite
    for source in (suite.config_path, suite.cluster_path, suite.threshold_path):
        if source is not None and Path(source).is_file():
            write_masked_copy(Path(source), inputs / Path(source).name, suite)  # secrets masked
    checks = prepare_containers(suite, ctx.executor)
    verdict = Verdict.FAIL if any(c.verdict is Verdict.FAIL for c in checks) else Verdict.PASS
    reason = "; ".join(c.reason for c in checks if c.verdict is Verdict.FAIL) or f"run directory {ctx.run_dir}"
    return StageResult(name="prepare", verdict=verdict, reason=reason, checks=checks)


def _preflight_stage(ctx: _Context) -> StageResult:
    # The scheduler first: the probes run as jobs of the same request, so where it refuses them (no such partition,
    # its nodes drained) they would fail for the same reason, or wait in the queue until their timeout.
    submission = _submission_rows(ctx)
    if any(r.verdict is Verdict.FAIL for r in submission):
        rows = [MetricRow(name="probe", verdict=Verdict.SKIPPED,
                          reason=f"nodes not probed: the scheduler would not run the probe either ({r.name})")
                for r in submission if r.verdict is Verdict.FAIL][:1]
    else:
        rows = probe_nodes(ctx.suite, ctx.executor, ctx.run_dir)
        rows += interpreter_rows(ctx.suite, ctx.executor)
    rows += submission
    failed = [r for r in rows if r.verdict is Verdict.FAIL]
    reason = "; ".join(f"{r.name}: {r.reason}" for r in failed) or f"{len(rows)} readings, none failed"
    return StageResult(name="preflight", verdict=Verdict.FAIL if failed else Verdict.PASS, reason=reason, checks=rows)


SUBMISSION_FIX = ("ask for what the cluster offers: megapilot.partition, megapilot.account, megapilot.time_limit, "
                  "megapilot.exclusive, megapilot.memory_per_node_gib or megapilot.sbatch_options (--qos=..., "
                  "--reservation=..., --constraint=...)")


def _submission_rows(ctx: _Context) -> list[MetricRow]:
    """Where a scheduler allocates the jobs: what it is asked for, and whether it would accept the first job."""
    suite = ctx.suite
    if not suite.capabilities.allocates_resources:
        return []
    request = ctx.executor.launch_request(gpus=suite.device == "gpu")
    if request.problem is not None:
        return [MetricRow(name="scheduler.resources", verdict=Verdict.FAIL,
                          reason=f"{request.problem}; fix: {request.fix or SUBMISSION_FIX}")]
    cell = suite.smoke if suite.config.smoke.enabled and not suite.smoke.skip_reason else next(
        (c for c in suite.cells if not c.skip_reason), None)
    if cell is None:
        return []
    launch = render_cell(suite, cell, job_dir=ctx.run_dir / "preflight" / "submission", request=request)
    if not launch.runnable:
        return []  # the cell's own stage says why it cannot render
    job = _job_spec(ctx, launch, "preflight-submission", cell.train_iters)
    refused = ctx.executor.check_submission(job)
    if refused is not None:
        fix = "" if "; fix: " in refused else f"; fix: {SUBMISSION_FIX}"  # the executor knew the fix itself
        return [MetricRow(name="scheduler.submission", verdict=Verdict.FAIL,
                          reason=f"{suite.executor} refuses the jobs: {refused}{fix}")]
    return [MetricRow(name="scheduler.submission", verdict=Verdict.PASS,
                      reason=f"the first job would be accepted ({request.note})")]


def _collectives_stage(ctx: _Context) -> StageResult:
    preflight = next((s.checks for s in ctx.result.stages if s.name == "preflight"), [])

    def run_job(job: JobSpec) -> tuple[JobResult, str | None]:
        result, fatal = _run_job(ctx, job)
        return result, fatal.message if fatal else None

    return run_collectives_stage(
        ctx.suite, ctx.executor, ctx.run_dir, run_job=run_job, env=_job_env(ctx), master_port=free_port(),
        write_lists=lambda names, rows: write_node_lists(ctx.run_dir, names, [*preflight, *rows]))


def _tokenizer_stage(ctx: _Context) -> StageResult:
    row = prepare_tokenizer(ctx.suite)
    return StageResult(name="tokenizer", verdict=row.verdict, reason=row.reason, checks=[row])


def _smoke_stage(ctx: _Context) -> StageResult:
    suite = ctx.suite
    smoke = suite.smoke
    if not suite.config.smoke.enabled:
        return StageResult(name="smoke", verdict=Verdict.SKIPPED, reason="smoke.enabled is false")
    if smoke.skip_reason:
        return StageResult(name="smoke", verdict=Verdict.SKIPPED, reason=smoke.skip_reason)
    started, clock = datetime.now(timezone.utc), time.monotonic()
    combo = _run_cell(ctx, smoke, directory="smoke", gates=False, record_speed=True)
    ctx.result.combos.append(combo.model_copy(update={"key": "smoke", "started_at": started,
                                                      "duration_s": round(time.monotonic() - clock, 3)}))
    return StageResult(name="smoke", verdict=Verdict.PASS if combo.verdict is Verdict.PASS else Verdict.FAIL,
                       reason=combo.reason, checks=combo.metrics)


def _checkpoint_stage(ctx: _Context) -> StageResult:
    suite = ctx.suite
    settings = suite.config.checkpoint
    if not settings.enforce:
        return StageResult(name="checkpoint", verdict=Verdict.SKIPPED, reason="checkpoint.enforce is false")
    cell = checkpoint_cell(suite)
    if cell.skip_reason:
        return StageResult(name="checkpoint", verdict=Verdict.SKIPPED, reason="no runnable cell to checkpoint")
    save_dir = _checkpoint_dir(ctx)
    if ctx.request.resume_from is not None:  # the interrupted attempt's checkpoints are not this one's
        for stale in (save_dir, save_dir.with_name(save_dir.name + "-resumed")):
            shutil.rmtree(stale, ignore_errors=True)
    if suite.capabilities.shares_file_system:
        save_dir.parent.mkdir(parents=True, exist_ok=True)
    save, resume = checkpoint_jobs(suite, save_dir)  # the jobs `suite run --dry-run` writes
    saved = _run_cell(ctx, cell, directory=save.directory, gates=False, train_iters=save.train_iters,
                      save_dir=save.save_dir, save_interval=save.save_interval)
    if saved.verdict is not Verdict.PASS:
        return StageResult(name="checkpoint", verdict=Verdict.FAIL, reason=f"save run: {saved.reason}",
                           checks=saved.metrics, jobs=[saved.job] if saved.job else [])
    resumed = _run_cell(ctx, cell, directory=resume.directory, gates=False, train_iters=resume.train_iters,
                        save_dir=resume.save_dir, load_dir=resume.load_dir, load_step=resume.load_step,
                        save_interval=resume.save_interval)
    if resumed.verdict is not Verdict.PASS:
        return StageResult(name="checkpoint", verdict=Verdict.FAIL, reason=f"resume run: {resumed.reason}",
                           checks=resumed.metrics, jobs=[j for j in (saved.job, resumed.job) if j is not None])
    jobs = [combo.job for combo in (saved, resumed) if combo.job is not None]
    rows = check_continuity(read_checkpoint_run(_abs_logs(ctx, saved)), read_checkpoint_run(_abs_logs(ctx, resumed)),
                            checkpoint_dir=save_dir, save_iters=settings.save_iters,
                            save_interval=settings.save_interval, loss_rtol=settings.loss_rtol,
                            resume_from=resume.load_step)
    failed = [r for r in rows if r.verdict is Verdict.FAIL]
    reason = "; ".join(f"{r.name}: {r.reason}" for r in failed) or "; ".join(r.reason for r in rows[:2])
    return StageResult(name="checkpoint", verdict=Verdict.FAIL if failed else Verdict.PASS, reason=reason, checks=rows,
                       jobs=jobs)


def _checkpoint_dir(ctx: _Context) -> Path:
    return checkpoint_save_dir(ctx.suite, ctx.run_dir, ctx.result.run_id)


def _results_stage(ctx: _Context) -> StageResult:
    combos = [c for c in ctx.result.combos if c.key != "smoke"]
    failed = [c.key for c in combos if c.verdict is Verdict.FAIL]
    if all(c.verdict is Verdict.SKIPPED for c in combos):
        return StageResult(name="results", verdict=Verdict.SKIPPED, reason="no combo ran")
    passed = sum(c.verdict is Verdict.PASS for c in combos)
    reason = f"{passed} of {len(combos)} combos PASS" + (f"; FAIL: {', '.join(failed)}" if failed else "")
    nic = _nic_counter_rows(ctx)
    failed += [r.name for r in nic if r.verdict is Verdict.FAIL]
    reason += "".join(f"; {r.name}: {r.reason}" for r in nic if r.verdict is Verdict.FAIL)
    return StageResult(name="results", verdict=Verdict.FAIL if failed else Verdict.PASS, reason=reason, checks=nic)


def _nic_counter_rows(ctx: _Context) -> list[MetricRow]:
    """Each node's NIC fault counters after the last combo against the preflight's snapshot; a node whose counters
    grew, or that a gated straggler row failed, joins failing_nodes.txt."""
    return close_node_lists(ctx.suite, ctx.executor, ctx.run_dir, ctx.result.combos)


def _teardown_stage(ctx: _Context) -> StageResult:
    _stop_all(ctx)
    rows = [_stray_check(ctx)] + teardown_containers(ctx.suite, ctx.executor)
    if ctx.failed_stage is None and ctx.suite.config.checkpoint.enforce:
        shutil.rmtree(ctx.run_dir / "checkpoints", ignore_errors=True)  # kept for a post-mortem when anything failed
    failed = [r for r in rows if r.verdict is Verdict.FAIL]
    return StageResult(name="teardown", verdict=Verdict.FAIL if failed else Verdict.PASS,
                       reason="; ".join(r.reason for r in failed) or "no process left, nothing to remove", checks=rows)


_EARLY: dict[str, Callable[[_Context], StageResult]] = {
    "prepare": _prepare_stage, "preflight": _preflight_stage, "collectives": _collectives_stage,
    "tokenizer": _tokenizer_stage,
    "smoke": _smoke_stage, "checkpoint": _checkpoint_stage,
}


# ---- combos -------------------------------------------------------------------------------------

def _combo(ctx: _Context, cell: SweepCell) -> None:
    """train → metrics → loss_curve of one cell; a finished cell of the resumed run is kept as it was."""
    step = _step(ctx)
    kept = _kept_combo(ctx, cell.key)
    if kept is not None:
        combo, stages = kept
        ctx.result.combos.append(combo)
        ctx.result.stages.extend(stages)
        ctx.on_event(f"{step} combo {cell.key}: {combo.verdict.value} (kept: finished before the interruption)")
        return
    if ctx.failed_stage is not None or not _wanted(ctx, "train"):
        reason = (f"skipped: stage {ctx.failed_stage} failed" if ctx.failed_stage
                  else f"not selected (--stage {ctx.request.only_stage})")
        ctx.result.combos.append(_skipped_combo(cell, reason, ctx.suite.backend))
        for name in COMBO_STAGES:
            ctx.result.stages.append(StageResult(name=name, combo=cell.key, verdict=Verdict.SKIPPED, reason=reason))
        _save(ctx)
        return
    ctx.on_event(f"{step} combo {cell.key}")
    started, clock = datetime.now(timezone.utc), time.monotonic()
    running, rows = running_combo(_skipped_combo(cell, "", ctx.suite.backend).model_copy(
        update={"started_at": started, "nodes": ctx.suite.nodes, "gpus_per_node": ctx.suite.gpus_per_node}))
    combo_at, stages_at = len(ctx.result.combos), len(ctx.result.stages)
    ctx.result.stages.extend(rows)
    _begin(ctx, running)
    combo = _run_repeats(ctx, cell)
    combo.started_at, combo.duration_s = started, round(time.monotonic() - clock, 3)
    ctx.result.combos[combo_at] = combo
    ctx.result.stages[stages_at:stages_at + len(rows)] = _combo_stages(combo, started)
    ctx.running = None
    ctx.new_work += 1
    _save(ctx)
    ctx.on_event(f"{step} combo {cell.key}: {combo.verdict.value}" + (f" ({combo.reason})" if combo.reason else ""))


def _run_repeats(ctx: _Context, cell: SweepCell) -> ComboResult:
    """The cell run `sweep.repeats` times, each in its own directory, and judged on its median run."""
    sweep = ctx.suite.config.sweep
    runs = [_run_cell(ctx, cell, directory=repeat_directory(cell.slug, k), gates=True) for k in range(sweep.repeats)]
    if len(runs) == 1:
        return runs[0]
    return combine_repeats(runs, max_cv_pct=sweep.max_cv_pct, cpu=ctx.suite.device == "cpu")


def _kept_combo(ctx: _Context, key: str) -> tuple[ComboResult, list[StageResult]] | None:
    """The resumed run's finished combo `key` with its stage rows; a key listed twice in sweep.runs is
    matched listing by listing."""
    previous = ctx.request.resume_from
    if previous is None:
        return None
    done_here = sum(c.key == key for c in ctx.result.combos)
    # the combo it was stopped in runs again (its rows come after those of the same key that finished)
    finished = [c for c in previous.combos if c.key == key and c.verdict is not Verdict.INTERRUPTED]
    if len(finished) <= done_here:
        return None
    stages = [s for s in previous.stages if s.combo == key]
    per_combo = len(COMBO_STAGES)
    return finished[done_here], stages[done_here * per_combo:(done_here + 1) * per_combo]


def _combo_stages(combo: ComboResult, started: datetime) -> list[StageResult]:
    """The train / metrics / loss_curve rows of one combo, from what its run measured."""
    if combo.verdict is Verdict.SKIPPED:
        return [StageResult(name=n, combo=combo.key, verdict=Verdict.SKIPPED,
                            reason=combo.reason) for n in COMBO_STAGES]
    job_ok = combo.job is not None and combo.job.state == JobState.COMPLETED.value
    blocking = error_findings(combo.findings)
    train = StageResult(name="train", combo=combo.key, started_at=started,
                        duration_s=combo.job.duration_s if combo.job else 0.0,
                        verdict=Verdict.PASS if job_ok and not blocking else Verdict.FAIL,
                        reason=(combo.job.reason or combo.job.state) if combo.job and not job_ok
                        else "; ".join(f.message for f in blocking[:2]))
    gated = [r for r in combo.metrics if not r.name.startswith("gate.loss_slope")]
    metrics = StageResult(name="metrics", combo=combo.key, checks=gated,
                          verdict=_verdict_of(gated), reason=_fail_reasons(gated))
    slope = [r for r in combo.metrics if r.name.startswith("gate.loss_slope")]
    loss = StageResult(name="loss_curve", combo=combo.key, checks=slope, verdict=_verdict_of(slope),
                       reason=_fail_reasons(slope) or "; ".join(r.reason for r in slope))
    return [train, metrics, loss]


def _verdict_of(rows: list[MetricRow]) -> Verdict:
    return overall_verdict([r.verdict for r in rows]) if rows else Verdict.SKIPPED


def _fail_reasons(rows: list[MetricRow]) -> str:
    return "; ".join(f"{r.name}: {r.reason}" for r in rows if r.verdict is Verdict.FAIL)


def _skipped_combo(cell: SweepCell, reason: str, backend: str) -> ComboResult:
    return ComboResult(key=cell.key, directory=cell.slug, verdict=Verdict.SKIPPED, reason=reason, backend=backend,
                       layout=recorded_layout(cell.layout), gbs=cell.gbs, precision=cell.precision,
                       seq_length=cell.seq_length, train_iters=cell.train_iters)


def _run_cell(ctx: _Context, cell: SweepCell, *, directory: str, gates: bool, train_iters: int | None = None,
              save_dir: str | None = None, load_dir: str | None = None, load_step: int | None = None,
              save_interval: int | None = None, record_speed: bool = False) -> ComboResult:
    """Render, run, watch and measure one cell; never raises for what the cell itself got wrong, nor for a disk
    that fills up while it runs (the cell FAILs saying where, how much was free and what was being written)."""
    try:
        return _run_cell_on_disk(ctx, cell, directory=directory, gates=gates, train_iters=train_iters,
                                 save_dir=save_dir, load_dir=load_dir, load_step=load_step,
                                 save_interval=save_interval, record_speed=record_speed)
    except OSError as exc:
        if not is_disk_full(exc):
            raise
        _stop_all(ctx)
        return _skipped_combo(cell, _disk_full_reason(ctx, exc), ctx.suite.backend).model_copy(
            update={"verdict": Verdict.FAIL, "directory": directory})


def _run_cell_on_disk(ctx: _Context, cell: SweepCell, *, directory: str, gates: bool, train_iters: int | None,
                      save_dir: str | None, load_dir: str | None, load_step: int | None,
                      save_interval: int | None, record_speed: bool) -> ComboResult:
    suite = ctx.suite
    if cell.skip_reason:
        return _skipped_combo(cell, cell.skip_reason, suite.backend)
    job_dir = ctx.run_dir / directory
    if ctx.request.resume_from is not None and job_dir.exists():
        shutil.rmtree(job_dir)  # what the interrupted attempt left: this one starts from scratch
    job_dir.mkdir(parents=True, exist_ok=True)
    request = ctx.executor.launch_request(gpus=suite.device == "gpu")
    # A launch script names its rendezvous port: a fixed one collides with any other job on the same node (CPU jobs
    # are not exclusive; two suites on one machine), so each job gets a port free when it is rendered.
    port = free_port()
    launch = render_cell(suite, cell, job_dir=job_dir, train_iters=train_iters, save_dir=save_dir,
                         save_interval=save_interval, load_dir=load_dir, load_step=load_step, request=request,
                         master_port=port)
    if launch.error or launch.plan is None:
        return _skipped_combo(cell, f"cannot render: {launch.error}", suite.backend).model_copy(
            update={"verdict": Verdict.FAIL, "directory": directory})
    if launch.skipped:
        return _skipped_combo(cell, launch.skipped, suite.backend).model_copy(update={"directory": directory})
    _write_files(launch.files)
    combo = _combo_shell(cell, launch, directory)
    prediction = _predict(ctx, launch)  # before it runs: what megapilot expected of exactly this layout
    job = _job_spec(ctx, launch, directory, train_iters or cell.train_iters)
    try:
        job_result, fatal = _run_job(ctx, job)
    except MegapilotError as exc:  # refused by the scheduler (its words), or by the executor: this combo fails
        return combo.model_copy(update={"verdict": Verdict.FAIL, "reason": f"{exc.problem}; fix: {exc.fix}"})
    return _measured_combo(ctx, combo, cell, launch, job_result, fatal, gates=gates, prediction=prediction,
                           record_speed=record_speed)


def _begin(ctx: _Context, running: StageResult | ComboResult) -> int:
    """suite.json holds the stage or combo as INTERRUPTED before it runs (a combo's rows are already in place), so
    a run killed while it runs is left saying where it was; returns where its row stands."""
    ctx.running = running
    if isinstance(running, StageResult):
        ctx.result.stages.append(running)
        at = len(ctx.result.stages) - 1
    else:
        ctx.result.combos.append(running)
        at = len(ctx.result.combos) - 1
    _save(ctx)
    return at


def _record_job(ctx: _Context, handle: JobHandle, job: JobSpec) -> None:
    """The job just submitted, on the row that runs: its directory and logs, for where a stop leaves it."""
    running = ctx.running
    if running is None:
        return
    summary = JobSummary(executor=ctx.suite.executor, job_id=handle.job_id, state=JobState.RUNNING.value,
                         train_iters=job.train_iters,
                         logs=[_relative(p, ctx.run_dir) for p in ctx.executor.logs(handle)])
    if isinstance(running, StageResult):
        running.jobs.append(summary)
    else:
        running.job = summary
    _save(ctx)


def _save(ctx: _Context) -> None:
    """suite.json after a stage; a full disk is left to the stage that needs the space to say (the run's end
    writes it again)."""
    try:
        ctx.result.write(ctx.run_dir)
    except OSError as exc:
        if not is_disk_full(exc):
            raise
        ctx.on_event(f"cannot save the run state: {exc}")


def _disk_full_reason(ctx: _Context, exc: OSError) -> str:
    """What filled up, how much is free, what was being written; then this run's checkpoints are removed, so
    that the report still fits (a resume writes them again)."""
    reason = str(exc) if isinstance(exc, DiskFullError) else (
        f"no space left on the device of {exc.filename or ctx.run_dir}: "
        f"{free_bytes(Path(exc.filename or ctx.run_dir)) / 2**20:.1f} MiB free ({exc.strerror})")
    freed = 0
    saved = _checkpoint_dir(ctx)
    for directory in (saved, saved.with_name(saved.name + "-resumed"), ctx.run_dir / "checkpoints"):
        if directory.is_dir():
            freed += sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())
            shutil.rmtree(directory, ignore_errors=True)
    return f"disk full: {reason}" + (f"; removed this run's checkpoints ({human_size(freed)}) to write the "
                                     "report" if freed else "")


def _write_files(files: dict[str, str]) -> None:
    """Files the launch reads (a Primus experiment YAML), at the absolute paths it names."""
    for path, text in files.items():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text, encoding="utf-8")


def _combo_shell(cell: SweepCell, launch: CellLaunch, directory: str) -> ComboResult:
    plan = launch.plan
    assert plan is not None  # a rendered launch always has its plan
    return ComboResult(key=cell.key, directory=directory, verdict=Verdict.SKIPPED, backend=launch.backend,
                       layout=recorded_layout(plan.parallel, mbs=cell.layout.mbs), gbs=cell.gbs,
                       precision=cell.precision, seq_length=cell.seq_length, nodes=launch.nodes,
                       gpus_per_node=launch.gpus_per_node, train_iters=plan.training.train_iters,
                       command=launch.command)


def _job_spec(ctx: _Context, launch: CellLaunch, directory: str, train_iters: int | None) -> JobSpec:
    block = ctx.suite.config.megapilot
    hang = HangPolicy(startup_s=block.startup_timeout_s, factor=block.hang_factor,
                      min_window_s=min(block.hang_min_window_s, block.startup_timeout_s))
    return JobSpec(combo=directory, run_dir=ctx.run_dir, script_text=launch.script_text, env=_job_env(ctx),
                   nodes=launch.nodes, gpus_per_node=launch.gpus_per_node, train_iters=train_iters,
                   hang=hang, timeout_s=block.job_timeout_s, blocked_in_queue_s=block.blocked_queue_timeout_s)


def _job_env(ctx: _Context) -> dict[str, str]:
    """The job's extra environment: the cluster file's env_vars, the config's container.env, and the HF
    token (its value is never written anywhere)."""
    env = node_env(ctx.suite)
    if ctx.suite.config.container:
        env.update({k: str(v) for k, v in ctx.suite.config.container.env.items()})
    token = _read_token(ctx.suite)
    if token:
        env["HF_TOKEN"] = token
    return env


def _read_token(suite: LoadedSuite) -> str | None:
    path = suite.hf_token_file
    if path is None or not Path(path).is_file():
        return None
    text = Path(path).read_text(encoding="utf-8", errors="replace").strip()
    return text or None


def _step(ctx: _Context) -> str:
    """'[4/9]': this stage or combo among every early stage, combo and closing stage of the run."""
    ctx.steps_done += 1
    combos = sum(1 for c in ctx.suite.cells if not ctx.request.only_combo or c.key == ctx.request.only_combo)
    return f"[{ctx.steps_done}/{len(EARLY_STAGES) + combos + 2}]"


def _run_job(ctx: _Context, job: JobSpec) -> tuple[JobResult, Finding | None]:
    """Submit, poll, watch every node's log; stop the job at the first fatal error line."""
    executor = ctx.executor
    handle = executor.submit(job)
    ctx.handles.append(handle)
    _record_job(ctx, handle, job)
    watch = FatalWatch()
    fatal: Finding | None = None
    status = JobStatus(state=JobState.PENDING)  # what is known of the job before its first poll
    try:
        while True:
            status = executor.poll(handle)
            logs = executor.logs(handle)
            if ctx.on_progress is not None:
                ctx.on_progress(JobProgress(job.combo, job.nodes, logs[-1] if logs else None, status))
            fatal = watch.scan(logs)
            if fatal is not None:
                ctx.on_event(f"  fatal: {fatal.message}")
                executor.cancel(handle, f"stopped at a fatal error: {fatal.message}")
                break
            if status.state.is_terminal:
                break
            time.sleep(POLL_INTERVAL_S)
    except BaseException as exc:
        executor.cancel(handle, stop_reason(exc, status.iteration, status.train_iters))
        raise
    finally:
        ctx.handles.remove(handle)
    return executor.result(handle), fatal


def _measured_combo(ctx: _Context, combo: ComboResult, cell: SweepCell, launch: CellLaunch, job: JobResult,
                    fatal: Finding | None, *, gates: bool, prediction: Prediction, record_speed: bool) -> ComboResult:
    logs = [Path(p) for p in job.logs]
    summary = JobSummary(executor=job.executor, job_id=job.job_id, state=job.state.value, exit_code=job.exit_code,
                         reason=job.reason, iterations_reached=job.iterations_reached, train_iters=job.train_iters,
                         duration_s=round(job.duration_s, 3),
                         logs=[_relative(p, ctx.run_dir) for p in logs])
    outcome = measure_and_gate(ctx.suite, cell, launch, logs, gates=gates, baseline=_baseline_lookup(ctx, combo),
                               prediction=prediction, record_speed=record_speed)
    findings = merge_findings(fatal, outcome.findings)
    rows = outcome.rows + [_reap_strays(ctx, job.job_dir, job.state)]
    reason = _combo_reason(job, fatal, rows)
    verdict = Verdict.FAIL if (job.state is not JobState.COMPLETED or fatal or
                               any(r.verdict is Verdict.FAIL for r in rows)) else Verdict.PASS
    return combo.model_copy(update={
        "verdict": verdict, "reason": reason, "metrics": rows, "curves": outcome.curves,
        "predicted": prediction, "timers_ms": outcome.timers_ms, "findings": findings, "job": summary,
        "log_tail": log_tail(logs) if verdict is Verdict.FAIL else [],
    })


def _baseline_lookup(ctx: _Context, combo: ComboResult) -> BaselineLookup | None:
    """The history's view for this combo's `baseline` gates (None without a history)."""
    source = ctx.request.baseline
    if source is None:
        return None
    cell = next((c for c in ctx.suite.cells if c.key == combo.key), None)
    specs = cell_thresholds(ctx.suite, cell) if cell is not None else None
    last_n = max((s.last_n for s in (specs or {}).values() if isinstance(s, BaselineThreshold)), default=5)
    return source.lookup_for(ctx.result.card, combo, run_id=ctx.result.run_id, last_n=last_n)


def merge_findings(fatal: Finding | None, analysed: list[Finding]) -> list[Finding]:
    """The combo's findings: the line the watch stopped the job on first, then the rest of the analysis.

    The watch's finding only says why the job was stopped; the analysis's finding for the same line carries its
    fixes, so that one is kept, and the watch's stands alone only where the analysis has none."""
    stopped_on = [f for f in analysed if _same(f, fatal)]
    return (stopped_on or ([fatal] if fatal else [])) + [f for f in analysed if not _same(f, fatal)]


def _same(first: Finding, second: Finding | None) -> bool:
    return second is not None and first.category == second.category and first.evidence[:1] == second.evidence[:1]


def _combo_reason(job: JobResult, fatal: Finding | None, rows: list[MetricRow]) -> str:
    if fatal is not None:
        return f"stopped early: {fatal.message}"
    if job.state is not JobState.COMPLETED:
        return f"{job.state.value}: {job.reason or 'no reason given'}"
    failed = [f"{r.name} {_value_text(r)} (gate {r.threshold or r.kind}): {r.reason}" for r in rows
              if r.verdict is Verdict.FAIL]
    return "; ".join(failed)


def _value_text(row: MetricRow) -> str:
    return "missing" if row.value is None else f"{row.value:g}{(' ' + row.unit) if row.unit else ''}"


def _predict(ctx: _Context, launch: CellLaunch) -> Prediction:
    """The estimator's view of this combo (a CPU suite: on this machine's CPU, measured), calibrated on the
    cluster's runs in the history, to show and gate beside what is measured."""
    if launch.plan is None:
        return Prediction(note="not rendered, not estimated")
    own = () if ctx.request.history_runs else _measured_so_far(ctx)
    prediction = predict_combo(launch.plan, ctx.suite.gpu, ctx.request.history_runs + own,
                               calibrate=ctx.request.calibrate)
    if own and prediction.calibration_runs:
        prediction = prediction.model_copy(update={
            "calibrated_in_run": True, "calibration": f"on this run's own earlier runs: {prediction.calibration}"})
    return prediction


def _measured_so_far(ctx: _Context) -> tuple[MeasuredRun, ...]:
    """This run's finished combos, its smoke run first, as measured runs of its cluster: what calibrates the
    predictions on a cluster the history has no runs of. There the smoke run is the first measurement there is;
    without it every combo of a first run is predicted from the device's rates alone (a CPU's within 1-16 % on a
    2-core machine, `coverage.CPU_FIRST_PREDICTION_ERROR_PCT`: what two ranks lose against one and the GELU's erf
    are not priced). Where the history has runs they calibrate alone: this run's own share whatever slows the
    cluster now, and a prediction made from them could not show it."""
    convert = ctx.request.measured_run_of
    if convert is None or not ctx.request.calibrate:
        return ()
    return measured_so_far(ctx.result, convert)


def measured_so_far(result: SuiteResult, convert: Callable[[SuiteResult, ComboResult], MeasuredRun | None]
                    ) -> tuple[MeasuredRun, ...]:
    """The finished combos of `result` (not failed) that calibrate its next combo, in their order.

    The smoke run calibrates until a combo of its own layout has run; then that combo stands for the layout alone.
    Its few steps are no worse a measurement than a combo's (bench/history_calibration/smoke.md, real CPU suite
    runs: the warm-up rule drops the one start-up step, 1.19x the median, and steps 2-5 are 1.01-1.03x; a run of 5
    steps or fewer missed the other long runs of its layout by 42 % median, one of 12 or more by 45 %: the shared
    host's load sets it, not the steps), and the first combo, calibrated on it, missed by 17.5 % median against the
    model's 90 %. Beside a combo of its layout it is a second copy of one layout: the held-out check then predicts
    each copy from the other, which says how the two agree, not how the fit carries to the next combo's layout, and
    the later combos fell within their band in 6 of 13 runs; calibrated on the combo alone, in 11 of 13, with a
    smaller miss (p90 32 % against 40 %)."""
    finished = [(combo.key, run) for combo in result.combos if combo.verdict is not Verdict.FAIL
                and (run := convert(result, combo)) is not None]
    layouts_run = {run.key for key, run in finished if key != "smoke"}
    return tuple(run for key, run in finished if key != "smoke" or run.key not in layouts_run)


def _relative(path: Path, root: Path) -> str:
    try:
        return str(path.resolve().relative_to(root))
    except ValueError:
        return str(path)


def _abs_logs(ctx: _Context, combo: ComboResult) -> list[Path]:
    return [ctx.run_dir / p for p in combo.job.logs] if combo.job else []


# ---- processes --------------------------------------------------------------------------------

def _stop_all(ctx: _Context) -> None:
    for handle in list(ctx.handles):
        try:
            ctx.executor.cancel(handle)
        except Exception:  # noqa: BLE001 - stopping is best effort; the stray check reports what is left
            pass


def _reap_strays(ctx: _Context, job_dir: Path, state: JobState) -> MetricRow:
    """Between combos: nothing of the job that ended may outlive it (killed by its executor if it does)."""
    name = "gate.processes_left"
    left = ctx.executor.processes_left(job_dir)
    if left.count is None:
        how = "stopped" if state in (JobState.CANCELLED, JobState.HUNG, JobState.TIMEOUT) else "ended"
        return MetricRow(name=name, verdict=Verdict.PASS, reason=f"job {how}: {left.reason}")
    return MetricRow(name=name, value=left.count, threshold="== 0",
                     verdict=Verdict.FAIL if left.count else Verdict.PASS, reason=left.reason)


def _stray_check(ctx: _Context) -> MetricRow:
    """No process of any job of this run is alive: a short grace for those exiting, then the rest are killed."""
    deadline = time.monotonic() + STRAY_GRACE_S
    while True:
        left = ctx.executor.processes_left(ctx.run_dir, inside=True, kill=False)
        if not left.count or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    if left.count:
        left = ctx.executor.processes_left(ctx.run_dir, inside=True)
    if left.count is None:
        return MetricRow(name="processes.left", verdict=Verdict.PASS, reason=left.reason)
    return MetricRow(name="processes.left", value=left.count,
                     verdict=Verdict.FAIL if left.count else Verdict.PASS,
                     reason=f"{left.reason} (still alive {STRAY_GRACE_S:g} s after the jobs ended)" if left.count
                     else f"no process of this run is left ({left.reason})")


# ---- the run card -----------------------------------------------------------------------------

def _precision_ran(suite: LoadedSuite) -> str:
    """What the cells trained in: on CPUs the trainer computes in fp32 whatever the cell names."""
    asked = ",".join(sorted({c.precision for c in suite.cells}))
    return f"FP32 (CPU run; the cells name {asked})" if suite.device == "cpu" else asked


def _device(suite: LoadedSuite) -> str:
    if suite.device == "cpu":
        return "CPU"
    return f"GPU ({suite.gpu.name})" if suite.gpu else "GPU"


def _run_card(suite: LoadedSuite) -> RunCard:
    first = suite.cells[0] if suite.cells else suite.smoke
    world = suite.nodes * suite.gpus_per_node
    tp, pp, cp, ep = (first.layout.tp, first.layout.pp, first.layout.cp, first.layout.ep)
    dp = max(1, world // (tp * pp * cp))
    layout = f"TP={tp},PP={pp},CP={cp},EP={ep},DP={dp}"
    return RunCard(suite_name=Path(suite.config_path).stem, model=suite.model.name, model_family=_family(suite),
                   gpu=suite.gpu.name if suite.gpu else "CPU", nodes=suite.nodes, gpus_per_node=suite.gpus_per_node,
                   executor=suite.executor, backend=suite.backend, layout=layout,
                   precision=_precision_ran(suite), device=_device(suite),
                   megapilot_version=megapilot_version, git_commit=_git_commit(),
                   megatron_version=_package_version("megatron-core") if suite.backend == "megapilot" else None,
                   torch_version=_package_version("torch") if suite.backend == "megapilot" else None,
                   python_version=platform.python_version(), host=socket.gethostname(),
                   config_file=str(suite.config_path),
                   cluster_file=str(suite.cluster_path) if suite.cluster_path else None,
                   threshold_file=str(suite.threshold_path) if suite.threshold_path else None,
                   config_hash=suite.config_hash, enforce_thresholds=suite.config.enforce_thresholds)


def _family(suite: LoadedSuite) -> str:
    return "moe" if suite.model.moe is not None else "dense"


def _package_version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _git_commit() -> str | None:
    """The commit of the megapilot checkout that ran (None when installed from a wheel)."""
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return None
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=5, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


__all__ = ["COMBO_STAGES", "STAGES", "RunRequest", "measured_so_far", "new_run_id", "run_suite"]
