"""Iteration-line parsing, completion and the hang window of ProgressTracker (pure, clock injected)."""

from __future__ import annotations

import pytest

from megapilot.execute.base import HangPolicy
from megapilot.execute.progress import ProgressTracker, parse_iteration_line, position_text

HEAD_LINE = (" [2026-01-01 00:10:00.123456] iteration       10/      50 | consumed samples:         1280 | "
             "elapsed time per iteration (ms): 9070.1 | learning rate: 1.500000E-04 | global batch size:   128 | "
             "lm loss: 7.123456E+00 | loss scale: 1.0 | number of skipped iterations:   0 |")


def line(iteration: int, total: int, step_ms: float = 100.0, prefix: str = "") -> str:
    return (f"{prefix} [2026-01-01 00:00:00] iteration {iteration:8d}/{total:8d} | "
            f"elapsed time per iteration (ms): {step_ms:.1f} |")


def test_parses_megatron_head_iteration_line():
    mark = parse_iteration_line(HEAD_LINE)
    assert (mark.iteration, mark.train_iters, mark.step_time_ms) == (10, 50, 9070.1)


def test_parses_line_behind_torchrun_rank_prefix_and_old_timestamp():
    mark = parse_iteration_line(line(3, 7, prefix="[default1]:"))
    assert (mark.iteration, mark.train_iters) == (3, 7)


def test_ignores_lines_that_only_mention_iterations():
    for other in ("saving checkpoint at iteration      50 to /ckpt in torch_dist format",
                  "[Rank 0] (after 10 iterations) memory (MB) | allocated: 1.00",
                  " loading distributed checkpoint from /ckpt at iteration 50",
                  "    number of skipped iterations:   0 |"):
        assert parse_iteration_line(other) is None


@pytest.mark.parametrize(
    ("before", "final"),
    [
        ((4, 5), (5, 5)),
        ((10, 25), (20, 25)),  # log_interval 10, train_iters 25: Megatron's last line is iteration 20
    ],
    ids=["final-iteration", "last-logged-interval-short-of-train-iters"],
)
def test_completion_needs_the_last_iteration_the_log_can_show(before, final):
    tracker = ProgressTracker(HangPolicy(), started_at_s=0.0)
    tracker.feed(line(*before), 1.0)
    assert not tracker.reached_final_iteration()
    tracker.feed(line(*final), 2.0)
    assert tracker.reached_final_iteration()


def test_job_spec_train_iters_overrides_the_printed_total():
    tracker = ProgressTracker(HangPolicy(), started_at_s=0.0, train_iters=100)
    tracker.feed(line(5, 5), 1.0)
    assert tracker.train_iters == 100 and not tracker.reached_final_iteration()


def test_hang_before_first_iteration_uses_startup_allowance():
    tracker = ProgressTracker(HangPolicy(startup_s=30), started_at_s=100.0)
    assert tracker.hang_reason(129.0) is None
    assert "start-up allowance of 30 s" in tracker.hang_reason(130.5)


def test_hang_window_is_k_times_observed_interval_with_a_floor():
    tracker = ProgressTracker(HangPolicy(factor=5, min_window_s=1, startup_s=100), started_at_s=0.0)
    tracker.feed(line(1, 50), 10.0)
    tracker.feed(line(2, 50), 12.0)  # 2 s between lines; the log claims 0.1 s per iteration
    assert tracker.step_time_s == 0.1  # the trainer's own clock is what is reported
    assert tracker.hang_window_s() == 10.0
    assert tracker.hang_reason(21.9) is None
    reason = tracker.hang_reason(22.5)
    assert "no new iteration for 10.5 s after iteration 2/50" in reason


def test_hang_window_floor_applies_for_fast_steps():
    tracker = ProgressTracker(HangPolicy(factor=5, min_window_s=60), started_at_s=0.0)
    tracker.feed(line(1, 50), 1.0)
    tracker.feed(line(2, 50), 1.1)
    assert tracker.hang_window_s() == 60


def test_fixed_window_replaces_adaptive_rule():
    tracker = ProgressTracker(HangPolicy(fixed_window_s=7), started_at_s=0.0)
    tracker.feed(line(1, 50), 1.0)
    tracker.feed(line(2, 50), 100.0)
    assert tracker.hang_deadline_s() == 107.0


def test_checkpoint_save_extends_the_window_until_next_iteration():
    policy = HangPolicy(factor=2, min_window_s=1, checkpoint_allowance_s=50)
    tracker = ProgressTracker(policy, started_at_s=0.0)
    tracker.feed(line(1, 50), 1.0)
    tracker.feed(line(2, 50), 2.0)
    tracker.feed("saving checkpoint at iteration       2 to /ckpt in torch_dist format", 2.1)
    assert tracker.hang_reason(40.0) is None
    tracker.feed(line(3, 50), 45.0)
    assert tracker.hang_deadline_s() < 45.0 + 100  # back to the adaptive window (2 x 43 s)


def test_repeated_iteration_line_does_not_reset_the_clock():
    tracker = ProgressTracker(HangPolicy(fixed_window_s=5), started_at_s=0.0)
    tracker.feed(line(3, 50, prefix="[default0]:"), 1.0)
    tracker.feed(line(3, 50, prefix="[default1]:"), 4.0)
    assert tracker.hang_deadline_s() == 6.0


def test_lines_read_in_one_batch_fall_back_on_reported_step_time_times_interval():
    tracker = ProgressTracker(HangPolicy(factor=3, min_window_s=1), started_at_s=0.0)
    tracker.feed(line(10, 50, step_ms=1000), 5.0)
    tracker.feed(line(20, 50, step_ms=1000), 5.0)  # both lines read by the same poll
    assert tracker.log_interval == 10
    assert tracker.hang_window_s() == 30.0  # 3 x (1 s x 10 iterations between lines)


def test_where_a_stopped_job_had_got_to_reads_without_a_none():
    assert position_text(None, 200) == "before its first iteration (of 200)"
    assert position_text(None, None) == "before its first iteration"
    assert position_text(7, 200) == "at iteration 7/200"
