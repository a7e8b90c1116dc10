"""The compiled scanner (megapilot.logs._scan): built in every dev install, chosen by default, switched off by
MEGAPILOT_LOG_ENGINE=python; the lines it must hand back to Python, and the same floats as the Python engine past
the warm-up head, the percentile reservoir and a count that outgrows 64 bits."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from megapilot.errors import MegapilotError
from megapilot.logs import LineParser, ParseOptions, _scan
from megapilot.logs.bulk import COMPILED_BUILT, ENGINE_ENV, ENGINES, BulkReader, choose_engine
from megapilot.logs.collect import LogCollector, ParsedLog, _feed
from megapilot.logs.follow import RunFollower
from megapilot.logs.lines import read_lines
from megapilot.logs.summary import RESERVOIR_SIZE, WARMUP_CAP

CANONICAL = ("iteration {it:8d}/{total:8d} | consumed samples: {cs:12d} | elapsed time per iteration (ms): {ms} | "
             "throughput per GPU (TFLOP/s/GPU): {tf} | learning rate: 1.500000E-04 | global batch size:   128 | "
             "lm loss: {loss} | loss scale: 1.0 | grad norm: 1.234 | number of skipped iterations:   0 | "
             "number of nan iterations:   {nan} |")


def _line(iteration: int, *, ms: str | None = None, loss: str | None = None, nan: int = 0, prefix: str = "") -> str:
    seconds = iteration * 9
    stamp = f" [2026-01-01 {seconds // 3600 % 24:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}] "
    return (prefix or stamp) + CANONICAL.format(
        it=iteration, total=10**6, cs=iteration * 128, ms=ms or f"{9000 + iteration * 7919 % 1009 / 10:.1f}",
        tf=f"{744 - iteration % 11 * 0.3:.1f}", loss=loss or f"{7 - iteration * 1e-4:.6E}", nan=nan)


def _read(data: bytes, engine: str, options: ParseOptions | None = None) -> tuple[ParsedLog, BulkReader]:
    collector = LogCollector(summary_only=True)
    reader = BulkReader(collector, LineParser("f.log", options), engine)
    collector.end_source(reader.read(io.BytesIO(data), chunk_bytes=1 << 16))
    return collector.finish(), reader


def _line_path(data: bytes, options: ParseOptions | None = None) -> ParsedLog:
    collector = LogCollector()
    _feed(collector, LineParser("f.log", options), read_lines(io.BytesIO(data)), None)
    return collector.finish()


def _facts(log: ParsedLog) -> dict:
    return {"summary": log.summary.to_dict(), "dialects": log.dialect_counts, "lines": log.lines_read,
            "last_line": log.last_line, "last_time_s": log.last_time_s, "errors": log.errors,
            "checkpoints": log.checkpoints}


def test_the_compiled_engine_is_built_and_chosen_by_default(monkeypatch: pytest.MonkeyPatch):
    assert COMPILED_BUILT, "megapilot.logs._scan is not built: run `make setup` (a C compiler and Python headers)"
    monkeypatch.delenv(ENGINE_ENV, raising=False)
    assert choose_engine() == "compiled"
    follower = RunFollower([Path("never-written.log")])
    assert follower._files[0].reader.engine == "compiled"  # following N files uses the same engine


def test_the_environment_forces_the_python_engine_and_bad_values_name_the_fix(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(ENGINE_ENV, "python")
    assert choose_engine() == "python" and BulkReader(LogCollector(), LineParser("f")).engine == "python"
    monkeypatch.setenv(ENGINE_ENV, "fast")
    with pytest.raises(MegapilotError) as caught:
        choose_engine()
    assert caught.value.field == ENGINE_ENV and "'compiled' or 'python'" in str(caught.value)
    child = subprocess.run([sys.executable, "-c", "from megapilot.logs import bulk; print(bulk.ENGINE)"],
                           env={**os.environ, ENGINE_ENV: "python"}, capture_output=True, text=True, check=True)
    assert child.stdout.strip() == "python"


def test_a_bad_engine_setting_is_a_user_error_in_the_cli(tmp_path: Path):
    log = tmp_path / "train.log"
    log.write_text(_line(1) + "\n")
    child = subprocess.run([sys.executable, "-m", "megapilot", "logs", "parse", str(log), "--summary-only"],
                           env={**os.environ, ENGINE_ENV: "turbo"}, capture_output=True, text=True)
    assert child.returncode == 2, child.stderr
    assert ENGINE_ENV in child.stderr and "Traceback" not in child.stderr


@pytest.mark.parametrize("rows", [WARMUP_CAP + 5, RESERVOIR_SIZE + WARMUP_CAP + 3000])
def test_both_engines_give_the_same_floats_across_the_head_and_the_reservoir(rows: int):
    """Past the warm-up head (50) and past the reservoir (8192 steady rows, replacements drawn in C): bit-equal."""
    lines = []
    for iteration in range(1, rows + 1):
        lines.append(_line(iteration, nan=int(iteration % 997 == 0)))
        if iteration % 1500 == 0:
            lines.append(f"[2026-01-02 00:00:00] saving checkpoint at iteration {iteration:7d} to /ckpt")
    data = ("\n".join(lines) + "\n").encode()
    (compiled, compiled_reader), (python, python_reader) = _read(data, "compiled"), _read(data, "python")
    assert _facts(compiled) == _facts(python) == _facts(_line_path(data))
    # the samples kept for the percentiles, slot by slot (the same draws from the same generator)
    assert compiled_reader.summary._after_head._reservoir == python_reader.summary._after_head._reservoir
    assert compiled.summary.steady_iterations > min(rows - WARMUP_CAP - 10, RESERVOIR_SIZE)
    assert compiled.summary.checkpoint_dropped == rows // 1500


FALLBACK_LINES = {  # lines the compiled matcher is not sure of: handed to Python, which reads them as it always did
    "ansi": "\x1b[32m" + _line(3, prefix=" "),
    "primus prefix": _line(3, prefix="[rank-0/8] "),
    "other field order": _line(3).replace(" global batch size:   128 |", "").replace(
        "grad norm:", "global batch size: 128 | grad norm:"),
    "huge iteration": _line(3).replace("       3/", "1234567890123456/"),
    "tab in prefix": _line(3, prefix="\t[2026-01-01 00:00:27] "),
    "mangled number": _line(3, ms="9,070.1"),
    "bridge memory report": "[Rank 0] (after 3 iterations) memory (GB) | allocated: 40.12",
    "error trigger": "[2026-01-01 00:00:30] NCCL WARN Cuda failure 'unhandled cuda error'",
}
C_LINES = {  # variants the matcher reads itself (FAST_ITERATION_RE accepts them too)
    "nan loss": _line(3, loss="nan"), "inf loss": _line(3, loss="-inf"), "no prefix": _line(3, prefix=" "),
    "free fields moved": _line(3).replace(" loss scale: 1.0 |", "").replace("grad norm:",
                                                                          "loss scale: 1.0 | grad norm:"),
    "timer line": "    forward-backward ...............................: (9000.12, 9010.34)",
    "allocator memory report": "[Rank 0] (after 3 iterations) memory (MB) | allocated: 12345.67",
}


@pytest.mark.parametrize(("name", "handed_back"), [*((name, True) for name in FALLBACK_LINES),
                                                   *((name, False) for name in C_LINES)])
def test_the_scanner_hands_back_exactly_the_lines_it_is_not_sure_of(name: str, handed_back: bool):
    collector = LogCollector(summary_only=True)
    reader = BulkReader(collector, LineParser("f.log"), "compiled")
    reader.feed(("\n".join(_line(iteration) for iteration in range(1, WARMUP_CAP + 2)) + "\n").encode())
    assert reader._scanner is not None and collector.summary.has_first_time  # past the head: C folds rows now
    line = (FALLBACK_LINES | C_LINES)[name].replace("       3/", f"{WARMUP_CAP + 2:8d}/").encode() + b"\n"
    stop, line_start, line_end, _, _ = reader._scanner.scan(line, 0, len(line), collector.summary, None, False)
    assert (stop, line_start, line_end) == ((_scan.STOP_LINE, 0, len(line)) if handed_back else
                                            (_scan.STOP_END, len(line), len(line))), name


@pytest.mark.parametrize("name", [*FALLBACK_LINES, *C_LINES])
def test_lines_the_matcher_is_not_sure_of_give_the_line_path_result(name: str):
    head = [_line(iteration) for iteration in range(1, WARMUP_CAP + 2)]
    tail = [_line(iteration) for iteration in range(WARMUP_CAP + 3, WARMUP_CAP + 6)]
    line = (FALLBACK_LINES | C_LINES)[name].replace("       3/", f"{WARMUP_CAP + 2:8d}/")
    data = ("\n".join([*head, line, *tail]) + "\n").encode()
    for engine in ENGINES:
        assert _facts(_read(data, engine)[0]) == _facts(_line_path(data)), engine


def test_a_checkpoint_save_between_rows_drops_the_next_row_in_both_engines():
    lines = [_line(iteration) for iteration in range(1, 200)]
    lines.insert(120, "[2026-01-01 00:18:00] saving checkpoint at iteration     120 to /ckpt in torch_dist format")
    lines.insert(121, "    save-checkpoint ................................: (1200.00, 2500.00)")
    data = ("\n".join(lines) + "\n").encode()
    compiled = _read(data, "compiled")[0]
    assert compiled.summary.checkpoint_dropped == 1 and compiled.checkpoints[0].iteration == 120
    assert _facts(compiled) == _facts(_read(data, "python")[0]) == _facts(_line_path(data))


def test_tokens_are_computed_in_c_as_the_parser_computes_them():
    data = ("\n".join(_line(iteration) for iteration in range(1, 300)) + "\n").encode()
    options = ParseOptions(seq_length=4096, world_size=8)
    compiled = _read(data, "compiled", options)[0]
    assert compiled.summary.tokens_per_s_per_gpu_mean is not None
    assert _facts(compiled) == _facts(_read(data, "python", options)[0]) == _facts(_line_path(data, options))


def test_a_count_past_64_bits_hands_the_source_to_python():
    """15-digit NaN counts sum past 2**63 after ~9,300 rows: C declines, then reads no more of this source."""
    lines = [_line(iteration).replace("nan iterations:   0", "nan iterations:   999999999999999")
             for iteration in range(1, 9400)]
    data = ("\n".join(lines) + "\n").encode()
    compiled, reader = _read(data, "compiled")
    assert compiled.summary.nan_iterations == 999999999999999 * 9399 > 2**63
    assert reader.engine == "python"
    assert _facts(compiled) == _facts(_line_path(data))


@pytest.mark.parametrize("chunk_bytes", [1 << 20, 400_000])
def test_over_long_lines_are_cut_as_the_line_path_cuts_them(chunk_bytes: int):
    """Lines past MAX_LINE_BYTES (1 MiB) keep the bytes the line path keeps, whether read whole or fed in pieces."""
    rows = [_line(iteration) for iteration in range(1, 61)]
    long_line = "y" * (2_600_000 + chunk_bytes // 3) + " Step Time : 9.07s"  # past the cut: never read
    data = ("\n".join([*rows, long_line, *(_line(it) for it in range(61, 70))]) + "\n" + "z" * 1_500_000).encode()
    collector = LogCollector()
    _feed(collector, LineParser("f.log"), read_lines(io.BytesIO(data), chunk_bytes=chunk_bytes), None)
    expected = _facts(collector.finish())
    for engine in ENGINES:
        whole = LogCollector(summary_only=True)
        whole.end_source(BulkReader(whole, LineParser("f.log"), engine).read(io.BytesIO(data), chunk_bytes))
        assert _facts(whole.finish()) == expected, engine
        pieces = LogCollector(summary_only=True)
        reader = BulkReader(pieces, LineParser("f.log"), engine)
        for start in range(0, len(data), chunk_bytes):
            reader.feed(data[start:start + chunk_bytes])
        pieces.end_source(reader.end())
        assert _facts(pieces.finish()) == expected, engine
