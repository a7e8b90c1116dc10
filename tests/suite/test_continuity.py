"""Checkpoint save → resume: same-step two-sided loss comparison, resume step, tracker file, durations;
synthetic Megatron-format logs and a real save/resume pair of the embedded trainer (slow)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from megapilot.suite.continuity import (
    CheckpointRun,
    check_continuity,
    last_saved_iteration,
    read_checkpoint_run,
)
from megapilot.suite.results import MetricRow, Verdict
from megapilot.trainer import logfmt
from tests.suite.conftest import START, Step, falling_steps, iteration_lines


def save_run_lines(ckpt: str, *, last: int = 21, save_at: int = 20, loss_at: dict[int, float] | None = None,
                   every: int = 1) -> list[str]:
    steps = [Step(s.iteration, (loss_at or {}).get(s.iteration, s.loss)) for s in falling_steps(1, last, every=every)]
    lines = iteration_lines([s for s in steps if s.iteration <= save_at], train_iters=last)
    lines += [logfmt.saving_checkpoint_line(save_at, ckpt, START + timedelta(seconds=100)),
              logfmt.saved_checkpoint_line(save_at, ckpt, 0, 1, 0, 1, START + timedelta(seconds=102.5))]
    return lines + iteration_lines([s for s in steps if s.iteration > save_at], train_iters=last)


def resume_run_lines(ckpt: str, *, loaded: int = 20, first: int = 21, last: int = 25,
                     loss_at: dict[int, float] | None = None, every: int = 1) -> list[str]:
    steps = [Step(s.iteration, (loss_at or {}).get(s.iteration, s.loss))
             for s in falling_steps(first, last, every=every)]
    lines = [logfmt.loading_checkpoint_line(ckpt, loaded), logfmt.loaded_checkpoint_line(ckpt, loaded, 0, 1, 0, 1)]
    lines += logfmt.timers_lines("(min, max) time across ranks (ms):", {"load-checkpoint": (800.0, 1250.0)})
    return lines + iteration_lines(steps, train_iters=last)


def rows(save, resume, **kwargs) -> dict[str, MetricRow]:
    kwargs.setdefault("save_iters", 21)
    kwargs.setdefault("save_interval", 20)
    return {row.name: row for row in check_continuity(save, resume, **kwargs)}


@pytest.fixture
def ckpt(tmp_path):
    directory = tmp_path / "ckpt"
    directory.mkdir()
    (directory / "latest_checkpointed_iteration.txt").write_text("20\n")
    return directory


def runs(log_file, ckpt, *, save_kwargs=None, resume_kwargs=None) -> tuple[CheckpointRun, CheckpointRun]:
    save = read_checkpoint_run([log_file("save/training.log", save_run_lines(str(ckpt), **(save_kwargs or {})))])
    resume = read_checkpoint_run([log_file("resume/training.log",
                                           resume_run_lines(str(ckpt), **(resume_kwargs or {})))])
    return save, resume


def test_a_clean_resume_passes_comparing_the_same_step(log_file, ckpt):
    # save run: step 20 loss 5.0, step 21 loss 4.95; the resume reproduces step 21 exactly.
    save, resume = runs(log_file, ckpt)
    assert save.saved_iterations == (20,) and save.losses[21] == pytest.approx(4.95)
    result = rows(save, resume)
    assert {name: row.verdict for name, row in result.items()} == {
        "checkpoint.resume_step": Verdict.PASS, "checkpoint.loss_continuity": Verdict.PASS,
        "checkpoint.tracker": Verdict.PASS, "checkpoint.save_s": Verdict.RECORD, "checkpoint.load_s": Verdict.RECORD}
    assert result["checkpoint.loss_continuity"].value == 0.0  # CVS would compare with step 20 (5.0)
    assert "step 21" in result["checkpoint.loss_continuity"].reason
    assert result["checkpoint.save_s"].value == pytest.approx(2.5)
    assert result["checkpoint.load_s"].value == pytest.approx(1.25)


def test_loss_continuity_is_two_sided_at_the_tolerance(log_file, ckpt):
    save_loss = 6.0 - 0.05 * 21
    save, resume = runs(log_file, ckpt, resume_kwargs={"loss_at": {21: save_loss * 1.04}})
    up = rows(save, resume)["checkpoint.loss_continuity"]
    assert up.verdict is Verdict.PASS and up.value == pytest.approx(0.04) and up.margin_pct == pytest.approx(20.0)
    save, resume = runs(log_file, ckpt, resume_kwargs={"loss_at": {21: save_loss * 0.90}})
    down = rows(save, resume)["checkpoint.loss_continuity"]
    assert down.verdict is Verdict.FAIL and down.value == pytest.approx(0.10) and down.margin_pct < 0  # a drop fails
    save, resume = runs(log_file, ckpt, resume_kwargs={"loss_at": {21: save_loss * 1.06}})
    assert rows(save, resume)["checkpoint.loss_continuity"].verdict is Verdict.FAIL


def test_resume_at_the_wrong_step_fails(log_file, ckpt):
    save, fresh_start = runs(log_file, ckpt, resume_kwargs={"first": 1, "loaded": 20})
    row = rows(save, fresh_start)["checkpoint.resume_step"]
    assert row.verdict is Verdict.FAIL and row.value == 1 and "expected 21" in row.reason
    save, wrong_load = runs(log_file, ckpt, resume_kwargs={"first": 21, "loaded": 10})
    row = rows(save, wrong_load)["checkpoint.resume_step"]
    assert row.verdict is Verdict.FAIL and "loaded iteration 10" in row.reason


def test_a_save_run_that_stopped_at_its_checkpoint_falls_back_to_the_saved_step(log_file, ckpt):
    save, resume = runs(log_file, ckpt, save_kwargs={"last": 20})
    row = rows(save, resume, save_iters=20)["checkpoint.loss_continuity"]
    assert row.verdict is Verdict.PASS  # 4.95 vs 5.0 is 1 %
    assert row.value == pytest.approx(0.05 / 5.0) and "different steps" in row.reason


def test_log_interval_moves_the_expected_first_step(log_file, ckpt):
    save, resume = runs(log_file, ckpt, save_kwargs={"last": 30, "every": 5},
                        resume_kwargs={"first": 21, "last": 30, "every": 5})
    result = rows(save, resume, save_iters=30)
    assert result["checkpoint.resume_step"].verdict is Verdict.PASS and result["checkpoint.resume_step"].value == 25
    assert result["checkpoint.loss_continuity"].verdict is Verdict.PASS and "step 25" in \
        result["checkpoint.loss_continuity"].reason


def test_tracker_must_name_the_last_save(log_file, ckpt):
    save, resume = runs(log_file, ckpt)
    (ckpt / "latest_checkpointed_iteration.txt").write_text("15\n")
    assert rows(save, resume)["checkpoint.tracker"].verdict is Verdict.FAIL
    (ckpt / "latest_checkpointed_iteration.txt").unlink()
    missing = rows(save, resume)["checkpoint.tracker"]
    assert missing.verdict is Verdict.FAIL and "not written" in missing.reason
    elsewhere = ckpt.parent / "other"
    elsewhere.mkdir()
    (elsewhere / "latest_checkpointed_iteration.txt").write_text("20")
    assert rows(save, resume, checkpoint_dir=elsewhere)["checkpoint.tracker"].verdict is Verdict.PASS


def test_last_saved_from_checkpoint_lines_else_the_cvs_formula():
    assert last_saved_iteration(CheckpointRun(losses={}, saved_iterations=(20, 21)), save_iters=21,
                                save_interval=20)[0] == 21
    assert last_saved_iteration(CheckpointRun(losses={}), save_iters=21, save_interval=20)[0] == 20
    assert last_saved_iteration(CheckpointRun(losses={}), save_iters=45, save_interval=20)[0] == 40


def test_no_durations_no_tracker_directory_and_no_resumed_loss():
    save = CheckpointRun(losses={20: 5.0}, iterations=(20,))
    resume = CheckpointRun(losses={}, iterations=())
    result = rows(save, resume)
    assert result["checkpoint.save_s"].verdict is Verdict.SKIPPED
    assert result["checkpoint.load_s"].verdict is Verdict.SKIPPED
    assert result["checkpoint.tracker"].verdict is Verdict.SKIPPED
    assert result["checkpoint.resume_step"].verdict is Verdict.FAIL
    assert result["checkpoint.loss_continuity"].verdict is Verdict.FAIL


@pytest.mark.slow
def test_real_trainer_resume_from_iteration_4_matches_the_save_run_at_step_5(trainer_runs):
    save = read_checkpoint_run([trainer_runs.save_log])
    resume = read_checkpoint_run([trainer_runs.resume_log])
    assert save.saved_iterations == (4, 8, 10)  # every 4, and at the end
    result = rows(save, resume, save_iters=10, save_interval=4, loss_rtol=1e-4, resume_from=4)
    assert {name: row.verdict for name, row in result.items()} == {
        "checkpoint.resume_step": Verdict.PASS, "checkpoint.loss_continuity": Verdict.PASS,
        "checkpoint.tracker": Verdict.PASS, "checkpoint.save_s": Verdict.RECORD, "checkpoint.load_s": Verdict.RECORD}
    assert result["checkpoint.resume_step"].value == 5
    assert "step 5" in result["checkpoint.loss_continuity"].reason and "different" not in \
        result["checkpoint.loss_continuity"].reason
    assert result["checkpoint.tracker"].value == 10
    assert result["checkpoint.save_s"].value > 0
    # Resuming from the latest checkpoint (10) while the resume run loaded 4 is caught.
    assert rows(save, resume, save_iters=10, save_interval=4)["checkpoint.resume_step"].verdict is Verdict.FAIL
