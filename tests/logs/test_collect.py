"""Collecting records into one ParsedLog: checkpoint operations, bounded errors, summary-only mode,
several files and stdin, dialect votes, and the wall-clock hang alert while following a log."""

from __future__ import annotations

import io
import sys
from collections import Counter
from pathlib import Path

import pytest

from megapilot.errors import MegapilotError
from megapilot.logs import collect
from megapilot.logs.collect import (
    LogCollector,
    _file_dialect,
    follow_log,
    parse_logs,
    parse_text,
)
from megapilot.logs.records import (
    CheckpointEvent,
    ErrorRecord,
    IterationRecord,
    MemoryRecord,
    TimerRecord,
)

ITERATION = " iteration {it:8d}/     100 | elapsed time per iteration (ms): {ms:.1f} | lm loss: 5.0E+00 |\n"
OOM = "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n"


def _event(kind: str, phase: str, line: int, time_s: float | None = None, iteration: int | None = 100,
           path: str | None = "/ckpt") -> CheckpointEvent:
    return CheckpointEvent(file="f", line=line, text=f"{kind} {phase}", kind=kind,
                           phase=phase,  # type: ignore[arg-type]  # an unknown phase on purpose
                           iteration=iteration, path=path, time_s=time_s)


def _error(line: int) -> ErrorRecord:
    return ErrorRecord(file="f", line=line, text="x", category="oom", signature="cuda_oom")


def test_save_start_and_done_make_one_completed_operation_timed_by_timestamps():
    collector = LogCollector()
    collector.add(_event("save", "start", 1, time_s=1000.0))
    collector.add(_event("save", "done", 2, time_s=1012.5, iteration=None, path=None))
    (op,) = collector.finish().checkpoints
    assert op.completed and op.duration_s == 12.5 and op.duration_source == "timestamps"
    assert (op.iteration, op.path) == (100, "/ckpt")  # taken from the start line
    assert [e.line for e in op.evidence] == [1, 2]


def test_timer_gives_the_duration_when_the_lines_have_no_timestamps():
    collector = LogCollector()
    collector.add(_event("load", "start", 1))
    collector.add(_event("load", "done", 2))
    collector.add(TimerRecord(file="f", line=3, text="load-checkpoint ....: 4500.0", name="load-checkpoint",
                              max_ms=4500.0))
    (op,) = collector.finish().checkpoints
    assert op.duration_s == 4.5 and op.duration_source == "timer" and [e.line for e in op.evidence] == [1, 2, 3]


def test_a_save_that_never_finishes_is_kept_as_incomplete():
    collector = LogCollector()
    collector.add(_event("save", "start", 1))
    collector.add(_event("save", "start", 5, iteration=200))  # the next save starts: the first never ended
    ops = collector.finish().checkpoints
    assert [(op.iteration, op.completed) for op in ops] == [(100, False), (200, False)]


def test_a_load_that_found_nothing_is_no_operation():
    collector = LogCollector()
    collector.add(_event("load", "not_found", 1))
    assert collector.finish().checkpoints == []


def test_errors_are_bounded_and_the_rest_counted(monkeypatch):
    monkeypatch.setattr(collect, "MAX_KEPT_ERRORS", 3)
    collector = LogCollector()
    for line in range(1, 6):
        collector.add(_error(line))
    log = collector.finish()
    assert [e.line for e in log.errors] == [1, 2, 3] and log.errors_dropped == 2


def test_summary_only_keeps_errors_and_the_summary_but_no_per_record_lists():
    collector = LogCollector(summary_only=True)
    for it in (1, 2, 3):
        for record in parse_text(ITERATION.format(it=it, ms=100.0)).iterations:
            collector.add(record)
    collector.add(MemoryRecord(file="f", line=9, text="t", source="device", used_gib=1.0))
    collector.add(_error(10))
    log = collector.finish()
    assert log.iterations == [] and log.memory == [] and len(log.errors) == 1
    assert log.summary is not None and log.summary.last_iteration == 3 and log.dialect == "megatron-lm"


def test_a_dialect_tie_goes_to_the_more_specific_dialect():
    assert _file_dialect(Counter({"megatron-lm": 3, "primus-megatron": 3})) == "primus-megatron"
    assert _file_dialect(Counter({"megatron-lm": 4, "primus-megatron": 3})) == "megatron-lm"
    assert _file_dialect(Counter()) == "unknown"


def test_parse_text_counts_lines_keeps_the_last_non_empty_one_and_splits_carriage_returns():
    log = parse_text(ITERATION.format(it=1, ms=10.0) + "progress 10%\rprogress 20%\n")
    assert log.lines_read == 2
    assert (log.last_line.line, log.last_line.text) == (2, "progress 20%")
    assert log.files == ["<text>"] and [r.iteration for r in log.iterations] == [1]


@pytest.mark.parametrize("text", ["", "one\n", "one\ntwo", "one\n\nthree\n\n"])
def test_parse_text_counts_lines_as_reading_the_same_text_from_a_file_does(tmp_path: Path, text: str):
    path = tmp_path / "train.log"
    path.write_text(text)
    assert parse_text(text).lines_read == parse_logs([path]).lines_read == parse_logs([path],
                                                                                      summary_only=True).lines_read


@pytest.mark.parametrize("summary_only", [False, True])
def test_several_files_make_one_log(tmp_path: Path, summary_only: bool):
    first, second = tmp_path / "node0.log", tmp_path / "node1.log"
    first.write_text(ITERATION.format(it=1, ms=10.0) + ITERATION.format(it=2, ms=10.0))
    second.write_text(ITERATION.format(it=3, ms=10.0) + OOM)
    log = parse_logs([first, second], summary_only=summary_only)
    assert log.files == [str(first), str(second)]
    assert log.summary.last_iteration == 3 and [e.category for e in log.errors] == ["oom"]
    assert len(log.iterations) == (0 if summary_only else 3)


def test_on_record_sees_every_record_in_order(tmp_path: Path):
    path = tmp_path / "train.log"
    path.write_text(ITERATION.format(it=1, ms=10.0) + OOM)
    seen = []
    parse_logs([path], summary_only=True, on_record=seen.append)
    assert [type(r).__name__ for r in seen] == ["IterationRecord", "ErrorRecord"]


def test_dash_reads_stdin(monkeypatch):
    stdin = io.TextIOWrapper(io.BytesIO((ITERATION.format(it=4, ms=10.0) + OOM).encode()))
    monkeypatch.setattr(sys, "stdin", stdin)
    log = parse_logs(["-"])
    assert log.files == ["-"] and log.iterations[0].iteration == 4 and log.errors[0].file == "<stdin>"


@pytest.mark.parametrize("summary_only", [False, True])
def test_missing_file_is_a_user_error(tmp_path: Path, summary_only: bool):
    with pytest.raises(MegapilotError) as info:
        parse_logs([tmp_path / "absent.log"], summary_only=summary_only)
    assert info.value.field == "FILE" and "absent.log" in str(info.value)


def test_json_schema_is_stable():
    data = parse_text(ITERATION.format(it=1, ms=10.0)).to_dict()
    assert list(data) == ["dialect", "framework", "files", "dialect_counts", "lines_read", "iterations", "memory",
                          "theoretical_memory", "timers", "checkpoints", "errors", "markers", "summary", "arguments",
                          "binary_skipped"]
    assert data["dialect_counts"] == {"megatron-lm": 1}


def test_follow_raises_one_hang_alert_from_the_wall_clock(tmp_path: Path):
    log = tmp_path / "train.log"
    log.write_text(ITERATION.format(it=1, ms=10.0) + ITERATION.format(it=2, ms=10.0))
    alerts = []
    parsed = follow_log(log, poll_s=0.01, idle_timeout_s=0.5, hang_factor=5, hang_floor_s=0.1,
                        on_record=lambda r: alerts.append(r) if getattr(r, "category", "") == "hang" else None)
    assert len(alerts) == 1 and alerts[0].details["last_iteration"] == "2"
    assert [e.category for e in parsed.errors] == ["hang"]


def test_follow_raises_no_hang_alert_before_the_first_iteration(tmp_path: Path):
    log = tmp_path / "train.log"
    log.write_text("building the model ...\n")
    parsed = follow_log(log, poll_s=0.01, idle_timeout_s=0.3, hang_floor_s=0.05)
    assert parsed.errors == []


ARGUMENTS_BLOCK = (
    "[rank0]: ------------------------ arguments ------------------------\n"
    "[rank0]:   global_batch_size ............................... 32\n"
    "[rank3]: an interleaved line from another rank\n"
    "[rank0]:   seq_length ...................................... 1024\n"
    "[rank0]:   virtual_pipeline_model_parallel_size ............ None\n"
    "[rank0]:   world_size ...................................... 4\n"
    "[rank0]: -------------------- end of arguments ---------------------\n"
)


def test_arguments_block_is_read_into_a_typed_record_and_gives_tokens_per_s():
    log = parse_text(ARGUMENTS_BLOCK + ITERATION.format(it=1, ms=2000.0))
    assert log.arguments is not None
    assert (log.arguments.global_batch_size, log.arguments.seq_length, log.arguments.world_size) == (32, 1024, 4)
    assert log.arguments.values["virtual_pipeline_model_parallel_size"] == "None"
    assert "an interleaved line from another rank" not in str(log.arguments.values)
    assert log.iterations[0].tokens_per_s_per_gpu == pytest.approx(32 * 1024 / (2.0 * 4))
    assert log.iterations[0].tokens_source == "computed"


def test_explicit_options_win_over_the_arguments_block():
    from megapilot.logs.parser import ParseOptions

    log = parse_text(ARGUMENTS_BLOCK + ITERATION.format(it=1, ms=2000.0),
                     options=ParseOptions(seq_length=2048, world_size=8, global_batch_size=64))
    assert log.iterations[0].tokens_per_s_per_gpu == pytest.approx(64 * 2048 / (2.0 * 8))


def test_arguments_from_rank_zero_file_serve_the_last_rank_file(tmp_path: Path):
    first, last = tmp_path / "rank0.log", tmp_path / "rank3.log"
    first.write_text(ARGUMENTS_BLOCK)
    last.write_text(ITERATION.format(it=1, ms=2000.0))
    for summary_only in (False, True):
        log = parse_logs([first, last], summary_only=summary_only)
        assert log.summary.tokens_per_s_per_gpu_mean == pytest.approx(32 * 1024 / (2.0 * 4))


def test_no_arguments_block_computes_no_tokens_per_s():
    log = parse_text(ITERATION.format(it=1, ms=2000.0))
    assert log.arguments is None and log.iterations[0].tokens_per_s_per_gpu is None


def test_arguments_block_behind_torchrun_local_rank_prefix():
    # torchrun --tee prefixes `[default0]:` with no space; long names (48+ characters) get no dots
    block = ARGUMENTS_BLOCK.replace("[rank0]: ", "[default0]:").replace(
        "[default0]:  world_size", "[default0]:  " + "x" * 48 + "  7\n[default0]:  world_size")
    log = parse_text(block + ITERATION.format(it=1, ms=2000.0))
    assert log.arguments is not None and log.arguments.values["x" * 48] == "7"
    assert (log.arguments.global_batch_size, log.arguments.seq_length, log.arguments.world_size) == (32, 1024, 4)
    assert log.iterations[0].tokens_per_s_per_gpu == pytest.approx(32 * 1024 / (2.0 * 4))


@pytest.mark.parametrize("engine", ["compiled", "python"])
def test_on_timer_gets_every_timer_of_a_summary_only_bulk_read(monkeypatch: pytest.MonkeyPatch, engine: str):
    """Summary-only with `on_timer` still reads in bulk (never line by line), and hands over the timers the full
    parse keeps; with `on_record` too (the line path), both hooks get theirs."""
    path = Path(__file__).resolve().parents[1] / "data" / "logs" / "synthetic_megatron_core016_full.log"
    full = parse_logs([path])
    monkeypatch.setenv("MEGAPILOT_LOG_ENGINE", engine)
    feed = collect._feed
    monkeypatch.setattr(collect, "_feed", lambda *args: pytest.fail("read line by line"))
    timers: list[TimerRecord] = []
    bulk = parse_logs([path], summary_only=True, on_timer=timers.append)
    assert timers == full.timers and len(timers) > 2
    assert bulk.summary is not None and full.summary is not None
    assert bulk.summary.to_dict() == full.summary.to_dict()
    monkeypatch.setattr(collect, "_feed", feed)
    timers, records = [], []
    parse_logs([path], summary_only=True, on_record=records.append, on_timer=timers.append)
    assert timers == full.timers and [r for r in records if isinstance(r, TimerRecord)] == full.timers


def test_a_window_reads_one_run_of_a_file_with_the_files_line_numbers(tmp_path: Path):
    """`windows`: only those lines of the file are read, in bulk or line by line, each keeping its number."""
    log = tmp_path / "job.log"
    log.write_text("".join(ITERATION.format(it=it, ms=100.0) for it in (10, 20, 30, 10, 20)))
    seen: list[tuple[int, int]] = []
    parse_logs([log], summary_only=True, windows={str(log): (4, None)},
               on_record=lambda r: seen.append((r.line, r.iteration)) if isinstance(r, IterationRecord) else None,
               on_row=lambda row: seen.append((row.line_no, row.iteration)))
    assert seen == [(4, 10), (5, 20)]
    parsed = parse_logs([log], windows={str(log): (2, 3)})
    assert [(r.line, r.iteration) for r in parsed.iterations] == [(2, 20), (3, 30)]
