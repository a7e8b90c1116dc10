"""Following every log of a run on a clock: the stop rules and the wall-clock hang watch of `follow_run`."""

from __future__ import annotations

import time
from pathlib import Path

from megapilot.logs.follow_run import follow_run


def _iteration_line(iteration: int) -> str:
    return (f" iteration {iteration:8d}/      10 | consumed samples: {iteration * 8:12d} | elapsed time per iteration "
            "(ms): 10.0 | global batch size:     8 | lm loss: 5.0E+00 | loss scale: 1.0 | "
            "number of skipped iterations:   0 | number of nan iterations:   0 |\n")


def test_follow_run_reports_a_wall_clock_hang_once_then_stops_when_idle(tmp_path: Path):
    paths = [tmp_path / "node0.log", tmp_path / "node1.log"]
    for path in paths:
        path.write_text(_iteration_line(1) + _iteration_line(2))
    hangs: list[tuple[float, int]] = []
    started = time.monotonic()
    logs = follow_run(paths, poll_s=0.05, idle_timeout_s=1.0, hang_floor_s=0.3,
                      on_hang=lambda silent_s, last: hangs.append((silent_s, last.iteration)))
    assert 1.0 <= time.monotonic() - started < 10  # stopped by the idle timeout
    assert len(hangs) == 1 and hangs[0][0] >= 0.3 and hangs[0][1] == 2  # once, naming the last iteration
    assert [log.summary.last_iteration for log in logs] == [2, 2]


def test_follow_run_stops_when_every_file_logged_the_end_of_training(tmp_path: Path):
    paths = [tmp_path / "node0.log", tmp_path / "node1.log"]
    for path in paths:
        path.write_text(_iteration_line(10) + "[after training is done] datetime: 2026-01-01 00:00:00\n")
    started = time.monotonic()
    follow_run(paths, poll_s=0.05, idle_timeout_s=60.0)
    assert time.monotonic() - started < 10
