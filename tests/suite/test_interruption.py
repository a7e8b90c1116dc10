"""suite.interruption: the rows a stage or combo has while it runs, and `settle` completing the one an unfinished
run stopped in from what its job left (job.json, the node log), run directories fabricated as the executors and
the lifecycle write them; a suite.json written before runs said where they were is read by what was left."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

from megapilot.execute.base import JobState, JobStatus
from megapilot.execute.rundir import JobRecord, node_log_path, write_job_record
from megapilot.suite.interruption import job_summary, log_tail, running_combo, running_stage, settle
from megapilot.suite.results import (
    NOT_RUN_REASON,
    ComboResult,
    JobSummary,
    RunCard,
    StageResult,
    SuiteResult,
    Verdict,
)

NOW = datetime(2026, 12, 6, 3, 52, tzinfo=timezone.utc)
CARD = RunCard(suite_name="s", model="tiny", gpu="CPU", nodes=1, gpus_per_node=2, executor="local", backend="megapilot")
KEY, SLUG = "MBS=1,GBS=8,PRECISION=BF16", "MBS1_GBS8_BF16"
EARLY = ("prepare", "preflight", "collectives", "tokenizer", "smoke", "checkpoint")


def _job_dir(run_dir: Path, name: str, *, iteration: int | None, state: JobState = JobState.RUNNING,
             lines: int | None = None) -> Path:
    directory = run_dir / name
    log = node_log_path(directory, 0)
    log.parent.mkdir(parents=True)
    log.write_text("".join(f"iteration {i}/80 | lm loss: 6.0\n" for i in range(1, (lines or iteration or 0) + 1)))
    write_job_record(directory, JobRecord(
        combo=name, executor="local", job_id="1545", command=["bash", "launch.sh"], cwd=str(run_dir), nodes=1,
        gpus_per_node=2, submitted_at=NOW, status=JobStatus(state=state, iteration=iteration, train_iters=80,
                                                            elapsed_s=7.7)))
    return directory


def _result(run_dir: Path, **fields) -> SuiteResult:
    stages = [StageResult(name=name, verdict=Verdict.PASS if name == "prepare" else Verdict.SKIPPED)
              for name in EARLY]
    return SuiteResult(run_id="r", run_dir=str(run_dir), verdict=Verdict.INTERRUPTED, card=CARD, started_at=NOW,
                       stages=fields.pop("stages", stages), **fields)


def _running(run_dir: Path) -> SuiteResult:
    """suite.json as the lifecycle leaves it while the first of two combos trains: its job just submitted."""
    combo, rows = running_combo(ComboResult(key=KEY, directory=SLUG, verdict=Verdict.SKIPPED, backend="megapilot"))
    combo.job = JobSummary(executor="local", job_id="1545", state="RUNNING", train_iters=80,
                           logs=[f"{SLUG}/out-node0/training.log"])
    result = _result(run_dir, planned_combos=[KEY, "MBS=2,GBS=8,PRECISION=BF16"], combos=[combo])
    result.stages += rows
    return result


def test_a_running_combo_is_interrupted_with_its_train_row_and_the_rest_not_run():
    combo, rows = running_combo(ComboResult(key=KEY, directory=SLUG, verdict=Verdict.SKIPPED, backend="megapilot",
                                            started_at=NOW))
    assert combo.verdict is Verdict.INTERRUPTED and combo.directory == SLUG
    assert [(r.name, r.combo, r.verdict, r.started_at) for r in rows] == [
        ("train", KEY, Verdict.INTERRUPTED, NOW), ("metrics", KEY, Verdict.SKIPPED, NOW),
        ("loss_curve", KEY, Verdict.SKIPPED, NOW)]
    assert rows[1].reason == rows[2].reason == NOT_RUN_REASON
    assert running_stage("smoke").verdict is Verdict.INTERRUPTED


def test_settle_reads_the_iteration_and_the_log_tail_the_killed_job_left(tmp_path):
    _job_dir(tmp_path, SLUG, iteration=11)
    result = _running(tmp_path)
    settle(result, tmp_path)
    combo = result.interrupted_combo()
    assert combo is not None and combo.job is not None
    assert (combo.job.iterations_reached, combo.job.train_iters, combo.job.state) == (11, 80, "RUNNING")
    assert combo.job.logs == [f"{SLUG}/out-node0/training.log"] and combo.job.duration_s == 7.7
    assert combo.reason == "interrupted at iteration 11 of 80 (no signal seen: killed outright, or still running)"
    assert combo.log_tail[-1] == "iteration 11/80 | lm loss: 6.0"
    train = next(s for s in result.stages if s.combo == KEY and s.name == "train")
    assert (train.reason, train.duration_s) == (combo.reason, 7.7)


def test_settle_names_the_signal_and_keeps_the_summary_when_job_json_cannot_be_read(tmp_path):
    result = _running(tmp_path)
    result.stopped_by = "SIGTERM"
    (tmp_path / SLUG).mkdir()
    (tmp_path / SLUG / "job.json").write_text("{half a file")
    settle(result, tmp_path)
    combo = result.interrupted_combo()
    assert combo is not None and combo.job is not None and combo.job.state == "RUNNING"
    assert combo.reason == "interrupted before its first iteration by SIGTERM" and combo.log_tail == []


def test_a_combo_stopped_before_its_job_started_says_so(tmp_path):
    result = _running(tmp_path)
    result.combos[0].job = None
    settle(result, tmp_path)
    assert result.combos[0].reason.startswith("interrupted before its job started")


def test_a_stage_stopped_in_its_second_job_is_told_by_that_job(tmp_path):
    _job_dir(tmp_path, "checkpoint-save", iteration=11, state=JobState.COMPLETED)
    _job_dir(tmp_path, "checkpoint-resume", iteration=13, state=JobState.CANCELLED)
    stage = running_stage("checkpoint").model_copy(update={"started_at": NOW})
    stage.jobs = [JobSummary(executor="local", job_id=str(n), state="RUNNING",
                             logs=[f"{name}/out-node0/training.log"])
                  for n, name in enumerate(("checkpoint-save", "checkpoint-resume"))]
    result = _result(tmp_path, stopped_by="SIGINT", stages=[StageResult(name="prepare", verdict=Verdict.PASS), stage],
                     ended_at=NOW + timedelta(seconds=312.5))
    settle(result, tmp_path)
    assert [j.state for j in stage.jobs] == ["COMPLETED", "CANCELLED"]
    assert stage.reason == "interrupted by SIGINT (job checkpoint-resume, at iteration 13 of 80)"
    assert stage.duration_s == 312.5  # from its start to the stop, not 0


def test_a_finished_run_is_left_as_it_is(tmp_path):
    result = _running(tmp_path)
    result.finished = True
    before = result.model_dump()
    settle(result, tmp_path)
    assert result.model_dump() == before


def test_a_suite_json_written_before_is_read_by_the_job_directory_left_unaccounted_for(tmp_path):
    """Stopped in its first combo: suite.json had the early stages only; the combo is named by its directory."""
    _job_dir(tmp_path, SLUG, iteration=11)
    result = _result(tmp_path, reason="interrupted by SIGTERM: the running job was stopped; finished results are kept")
    settle(result, tmp_path)
    combo = result.interrupted_combo()
    assert combo is not None and (combo.key, combo.directory, combo.train_iters) == (SLUG, SLUG, 80)
    assert result.stopped_by == "SIGTERM"  # said then in the reason alone
    assert combo.job is not None and combo.job.iterations_reached == 11 and combo.log_tail
    assert [(s.name, s.verdict) for s in result.stages if s.combo == SLUG] == [
        ("train", Verdict.INTERRUPTED), ("metrics", Verdict.SKIPPED), ("loss_curve", Verdict.SKIPPED)]


def test_a_suite_json_written_before_that_stopped_in_smoke_is_that_stage_with_its_job(tmp_path):
    _job_dir(tmp_path, "smoke", iteration=3)
    result = _result(tmp_path, stages=[StageResult(name=name, verdict=Verdict.PASS) for name in EARLY[:4]])
    settle(result, tmp_path)
    stage = result.interrupted_stage()
    assert stage is not None and stage.name == "smoke" and stage.jobs[0].iterations_reached == 3
    assert result.interrupted_combo() is None


def test_job_summary_and_log_tail_of_what_is_there(tmp_path):
    directory = _job_dir(tmp_path, SLUG, iteration=None, lines=80)
    summary = job_summary(directory, tmp_path, nodes=2)
    assert summary is not None and summary.iterations_reached is None
    assert summary.logs == [f"{SLUG}/out-node0/training.log"]  # node 1 left no log
    assert job_summary(tmp_path / "nowhere", tmp_path) is None
    assert log_tail([node_log_path(directory, 0)], lines=2) == ["iteration 79/80 | lm loss: 6.0",
                                                                "iteration 80/80 | lm loss: 6.0"]
    assert log_tail([tmp_path / "missing.log"]) == []
