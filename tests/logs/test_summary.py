"""The steady-state rule: warm-up and checkpoint intervals dropped, streaming stats equal exact ones."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from megapilot.logs import ParseOptions, parse_logs, parse_text
from megapilot.logs.records import IterationRecord
from megapilot.logs.summary import RESERVOIR_SIZE, WARMUP_CAP, SummaryBuilder


def _line(it: int, ms: float, loss: float = 3.0) -> str:
    return f" iteration {it:8d}/ 1000 | elapsed time per iteration (ms): {ms:.1f} | lm loss: {loss:.6E} |"


def test_first_ten_percent_are_warmup_and_stats_match_exact_values():
    times = [5000.0, 3000.0] + [1000.0 + (i % 7) * 10 for i in range(18)]
    log = parse_text("\n".join(_line(i + 1, ms) for i, ms in enumerate(times)))
    summary = log.summary
    assert summary.warmup_dropped == 2
    kept = times[2:]
    assert summary.step_time_mean_ms == pytest.approx(statistics.fmean(kept))
    assert summary.step_time_p50_ms == pytest.approx(statistics.median(kept))
    assert summary.step_time_cv == pytest.approx(statistics.pstdev(kept) / statistics.fmean(kept))
    assert summary.step_time_p95_ms == pytest.approx(statistics.quantiles(kept, n=20, method="inclusive")[-1])


def test_interval_with_checkpoint_save_is_excluded():
    lines = [_line(i, 1000.0) for i in range(1, 11)]
    lines.insert(5, "saving checkpoint at iteration       5 to /ckpt in torch_dist format")
    lines[6] = _line(6, 40000.0)
    summary = parse_text("\n".join(lines)).summary
    assert summary.checkpoint_dropped == 1 and summary.step_time_max_ms == 1000.0


def test_warmup_is_capped_so_memory_stays_bounded():
    builder = SummaryBuilder()
    for it in range(1, 2001):
        builder.add(IterationRecord(file="f", line=it, text="", dialect="megatron-lm", iteration=it,
                                    elapsed_ms=float(it)))
    summary = builder.result()
    assert summary.warmup_dropped == WARMUP_CAP
    assert summary.steady_iterations == 2000 - WARMUP_CAP
    assert summary.step_time_mean_ms == pytest.approx(statistics.fmean(range(WARMUP_CAP + 1, 2001)))
    assert len(builder._after_head._reservoir) <= RESERVOIR_SIZE


def test_single_iteration_log_still_reports_its_step_time():
    summary = parse_text(_line(1, 1234.0)).summary
    assert summary.warmup_dropped == 0 and summary.step_time_mean_ms == 1234.0


def test_losses_final_min_first():
    log = parse_text("\n".join(_line(i, 100.0, loss) for i, loss in enumerate([9.0, 7.0, 8.0, 7.5], start=1)))
    assert (log.summary.first_loss, log.summary.min_loss, log.summary.final_loss) == (9.0, 7.0, 7.5)


def test_reservoir_percentiles_stay_close_beyond_its_size():
    import random

    from megapilot.logs.summary import _Running

    rng = random.Random(5)
    data = [rng.uniform(0, 1000) for _ in range(100_000)]
    running = _Running()
    for value in data:
        running.add(value)
    assert len(running._reservoir) == RESERVOIR_SIZE
    assert running.percentile(0.5) == pytest.approx(statistics.median(data), rel=0.02)
    assert running.percentile(0.95) == pytest.approx(statistics.quantiles(data, n=20)[-1], rel=0.02)
    assert running.mean == pytest.approx(statistics.fmean(data))


@pytest.mark.parametrize("n", [RESERVOIR_SIZE, 1, 7, 1000, 2**40 + 3])
def test_the_reservoir_index_draw_is_the_one_randrange_makes(n: int):
    """`_below` spells out randrange's draw so the compiled scanner can make it in C: the summary's percentiles did
    not change with it (the same generator state, the same indexes, seed for seed)."""
    import random

    from megapilot.logs.summary import _Running

    for seed in range(3):
        running, reference = _Running(seed), random.Random(seed)
        assert [running._below(n) for _ in range(300)] == [reference.randrange(n) for _ in range(300)]
        assert running._random.random() == reference.random()


@pytest.mark.parametrize("summary_only", [False, True], ids=["line path", "bulk path"])
def test_the_mean_rate_of_a_slowing_run_is_its_tokens_over_its_time(summary_only: bool, tmp_path: Path):
    gbs, seq, world = 64, 2048, 16
    times = [1000.0] * 20 + [1000.0 * (1 + i / 10) for i in range(180)]  # the step time grows to 19x
    lines = [f" iteration {i + 1:8d}/ 1000 | elapsed time per iteration (ms): {ms:.1f} | global batch size: {gbs:5d} |"
             f" lm loss: 3.0E+00 |" for i, ms in enumerate(times)]
    path = tmp_path / "slowing.log"
    path.write_text("\n".join(lines) + "\n")
    summary = parse_logs([path], options=ParseOptions(seq_length=seq, world_size=world),
                         summary_only=summary_only).summary
    kept = times[summary.warmup_dropped:]
    assert summary.tokens_per_s_per_gpu_mean == pytest.approx(gbs * seq / (statistics.fmean(kept) / 1000 * world))
    # the plain mean of per-step rates is far above what the run did
    plain = statistics.fmean(gbs * seq / (ms / 1000 * world) for ms in kept)
    assert plain > 1.5 * summary.tokens_per_s_per_gpu_mean


@pytest.mark.parametrize("summary_only", [False, True], ids=["line path", "bulk path"])
def test_a_last_line_cut_inside_a_number_is_not_read_as_that_number(summary_only: bool, tmp_path: Path):
    """A crash (or a copy of a live log) cut the last iteration line inside its step time: 520 of 5200 ms."""
    lines = [_line(i, 5200.0) for i in range(1, 51)]
    path = tmp_path / "cut.log"
    path.write_text("\n".join(lines[:-1] + [lines[-1].split("5200")[0] + "520"]))  # no newline after it
    summary = parse_logs([path], summary_only=summary_only).summary
    assert summary.last_iteration == 50 and summary.step_time_min_ms == summary.step_time_max_ms == 5200.0
