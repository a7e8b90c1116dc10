"""Bulk reading with a row hook (`parse_logs(..., on_row=...)`): each canonical iteration line reaches the hook as a
`RowLine` whose values are those of the record the line parser builds, by either engine."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from megapilot.logs import parse_logs
from megapilot.logs.bulk import COMPILED_BUILT, BulkReader, RowLine, ScannedRow
from megapilot.logs.parser import LineParser
from megapilot.logs.records import IterationRecord

ENGINES = ["python", *(["compiled"] if COMPILED_BUILT else [])]
WARMUP = 60  # more than the summary's warm-up head (at most 50 rows)
FIELDS = ("| consumed samples:          128 | elapsed time per iteration (ms): 9070.1 | learning rate: 1.5E-04 | "
          "global batch size:   128 |{loss} loss scale: 1.0 | grad norm: {norm} |{extra} number of skipped "
          "iterations:   0 | number of nan iterations:   {nan} |")
PREFIXES = [
    " [2026-01-01 00:00:09.000001] ", "[2026-03-31 23:59:59] ", " [2024-02-29 12:00:00.5] ",
    "[2026-02-30 01:02:03.123456789] ", "[2000-12-31 00:00:00.1234567891] ", "[1900-03-01 00:00:00,25] ",
    "[0001-01-01 00:00:00] ", "[9999-12-31 23:59:59.9] ",
    "[0000-01-01 00:00:00] ", "[2026-13-01 00:00:00] ", "[2026-01-00 00:00:00] ", "[2026-01-32 00:00:00] ",
    "[2026-01-01 25:61:61] ", "[2026-01-01T00:00:00] ", "2026-01-01 00:00:00 INFO ", "[20260101 12:00:00] ",
    "[2026-01-01 00:00:00][2026-01-01 00:00:07.25] ", "[before] ", "", "   ", "[1969-12-31 23:59:59.75] ",
]


def _rows_and_records(tmp_path: Path, lines: list[str], engine: str,
                      monkeypatch: pytest.MonkeyPatch) -> list[tuple[RowLine, IterationRecord]]:
    """The rows and records of `lines`, read after WARMUP lines: the compiled engine hands the warm-up head's rows
    and the first timed one to Python, it reads the later ones itself (`scanned` counts them)."""
    monkeypatch.setenv("MEGAPILOT_LOG_ENGINE", engine)
    scanned = [0]
    hand_over = BulkReader._hand_scanned_rows

    def counting(reader: BulkReader, rows: list[ScannedRow], first_line_no: int) -> None:
        scanned[0] += len(rows)
        hand_over(reader, rows, first_line_no)

    monkeypatch.setattr(BulkReader, "_hand_scanned_rows", counting)
    lines = [_line(-WARMUP + index, " [2026-01-01 00:00:00] ") for index in range(WARMUP)] + lines
    log = tmp_path / "train.log"
    log.write_text("".join(line + "\n" for line in lines))
    rows: list[RowLine] = []
    parse_logs([log], summary_only=True, on_row=rows.append)
    parser = LineParser(str(log))
    records = [record for number, line in enumerate(lines, 1) for record in parser.feed(number, line)
               if isinstance(record, IterationRecord)]
    assert len(rows) == len(records)
    # the compiled engine reads every line after the warm-up itself (the Python one never calls it)
    assert scanned[0] >= len(rows) - WARMUP if engine == "compiled" else scanned[0] == 0
    return list(zip(rows, records, strict=True))[WARMUP:]


def _line(it: int, prefix: str = "", loss: str = " lm loss: 2.5E+00 |", norm: str = "1.000", extra: str = "",
          nan: int = 0) -> str:
    return f"{prefix}iteration {it + 1000:8d}/   10000 " + FIELDS.format(loss=loss, norm=norm, extra=extra, nan=nan)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_row_has_the_time_line_and_record_the_line_parser_gives(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   engine: str):
    lines = [_line(index + 1, prefix) for index, prefix in enumerate(PREFIXES)]
    pairs = _rows_and_records(tmp_path, lines, engine, monkeypatch)
    assert len(pairs) >= len(PREFIXES) - 2  # a prefix ending in a word byte or with `[rank-` is no canonical line
    for row, record in pairs:
        assert (row.time_s, row.line_no, row.iteration) == (record.time_s, record.line, record.iteration), row.text
        assert row.record().to_dict() == record.to_dict()
    assert any(row.time_s is not None and row.time_s % 1 for row, _ in pairs)  # fractions read, not only seconds


@pytest.mark.parametrize("engine", ENGINES)
def test_a_row_is_plain_only_when_its_values_are_the_records_anomaly_fields(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, engine: str):
    doubtful = [
        _line(1, norm="nan"), _line(2, norm="-Inf"), _line(3, extra=" mtp_1 loss: 1e400 |"),
        _line(4, extra=" z loss: " + "9" * 320 + " |"), _line(5, loss=" lm loss: nan |"),
        _line(6, loss=" lm loss: INF |"),
        _line(7, loss="", extra=" lm_loss: 3.0 |"), _line(8, loss="", extra=" reduced_train_loss: 3.0 |"),
        _line(9, extra=" info tokens: 3 |"), _line(10, loss=" lm loss: 1.0E+400 |"),
    ]
    plain = [_line(20), _line(21, loss=""), _line(22, nan=3), _line(23, extra=" load_balancing_loss: 1.0E-02 |"),
             _line(24, extra=" e_1: 4 |")]
    pairs = _rows_and_records(tmp_path, doubtful + plain, engine, monkeypatch)
    assert [row.plain for row, _ in pairs] == [False] * len(doubtful) + [True] * len(plain)
    for row, record in pairs:
        if row.plain:
            assert (row.loss, row.nan_iterations, record.has_nonfinite, record.memory_usage_pct) == (
                record.lm_loss, record.nan_iterations, False, None)
    assert any(record.has_nonfinite for _, record in pairs[:6])
    assert not math.isfinite(pairs[9][1].lm_loss or 0.0)
