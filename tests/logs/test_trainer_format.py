"""Contract with the embedded trainer: the lines `megapilot.trainer.logfmt` prints parse completely."""

from __future__ import annotations

import math
from datetime import datetime

from megapilot.logs import parse_text
from megapilot.trainer import logfmt


def _stats(iteration: int, loss: float, elapsed_ms: float) -> logfmt.IterationStats:
    return logfmt.IterationStats(
        iteration=iteration, train_iters=20, consumed_samples=iteration * 8, elapsed_ms_per_iteration=elapsed_ms,
        throughput_tflops_per_gpu=0.5, learning_rate=1e-4, global_batch_size=8, losses={"lm loss": loss},
        loss_scale=1.0, grad_norm=1.25, skipped_iterations=0, nan_iterations=0)


def test_trainer_lines_parse_into_every_record_kind():
    now = datetime(2026, 1, 1, 0, 0, 0, 123456)
    lines = (
        logfmt.no_checkpoint_lines("/ckpt")
        + [logfmt.parameter_count_line(0, 0, 1234), logfmt.datetime_line("before the start of training step", now)]
        + [logfmt.iteration_line(_stats(i, 5.0 - i * 0.1, 100.0 + i), now) for i in range(1, 6)]
        + [logfmt.memory_line(0, 5, 10.0, 20.0, 30.0, 40.0)]
        + logfmt.timers_lines("(min, max) time across ranks (ms):", {"forward-backward": (90.0, 95.5)})
        + logfmt.validation_lines(5, {"lm loss": 4.5})
        + [logfmt.saving_checkpoint_line(5, "/ckpt", now), logfmt.saved_checkpoint_line(5, "/ckpt", 0, 1, 0, 1, now)]
        + [logfmt.iteration_line(_stats(6, float("nan"), 100.0), now), logfmt.datetime_line("after training is done",
                                                                                            now)]
    )
    log = parse_text("\n".join(lines))
    assert log.dialect == "megatron-lm" and log.errors == []
    assert [r.iteration for r in log.iterations] == [1, 2, 3, 4, 5, 6]
    assert abs(log.iterations[0].time_s % 1 - 0.123456) < 1e-6
    assert log.iterations[2].lm_loss == 4.7 and log.iterations[2].tflops_per_gpu == 0.5
    assert math.isnan(log.iterations[-1].lm_loss)
    assert log.memory[0].max_reserved_gib == 40.0 / 1024
    assert log.timers[0].name == "forward-backward" and log.timers[0].max_ms == 95.5
    assert log.checkpoints[0].kind == "save" and log.checkpoints[0].completed
    assert {m.marker for m in log.markers} == {"training_started", "training_done"}
