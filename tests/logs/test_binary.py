"""Logs as crashes leave them: NUL padding and binary garbage between the lines are cut out with a count, the text
around them is read (both reading paths alike); a file with no text at all is still refused."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from megapilot.errors import MegapilotError
from megapilot.logs import parse_logs
from megapilot.logs.bulk import ENGINE_ENV, ENGINES, read_bulk
from megapilot.logs.collect import LogCollector
from megapilot.logs.lines import BinaryTally, LineSplitter, Offsets, decode_log_text
from megapilot.logs.parser import LineParser
from megapilot.logs.sources import expand_log_paths, is_text

DATA = Path(__file__).resolve().parents[1] / "data" / "logs"
CRASH = DATA / "synthetic_crash_nul_padded.log"  # SYNTHETIC: see tests/data/logs/INDEX.md


@pytest.mark.parametrize("summary_only", [False, True])
def test_a_nul_padded_crash_log_gives_its_iterations_and_its_failure(summary_only: bool):
    log = parse_logs(expand_log_paths([str(CRASH)]), summary_only=summary_only)
    assert log.summary is not None and log.summary.iterations_logged == 26  # the torn line 21 included
    assert [(error.category, error.line) for error in log.errors] == [("oom", 28)]
    [skipped] = log.binary_skipped
    assert [run[:2] for run in skipped.runs] == [(21, 21), (27, 27)]
    # the NUL block whole; the 2 KB of garbage but the printable bytes at its very edges
    assert skipped.runs[0][2] == 20480 and 1800 < skipped.runs[1][2] <= 2048
    data = CRASH.read_bytes()
    nul_at, garbage_at = skipped.runs[0][3], skipped.runs[1][3]
    assert nul_at == data.index(b"\0") and data[nul_at:nul_at + 20480] == b"\0" * 20480
    assert data.count(b"\n", 0, garbage_at) == 26 and not 0x20 <= data[garbage_at] <= 0x7e  # on line 27, a bad byte
    assert skipped.describe() == f"skipped 22 KB of binary data on lines 21, 27 at byte offsets {nul_at}, {garbage_at}"
    assert log.to_dict()["binary_skipped"][0]["bytes"] == skipped.bytes_skipped
    assert log.to_dict()["binary_skipped"][0]["runs"][0]["offset"] == nul_at


@pytest.mark.parametrize("summary_only", [False, True])
def test_binary_data_on_stdin_is_told_of_stdin_as_its_error_lines_are(monkeypatch: pytest.MonkeyPatch,
                                                                      summary_only: bool):
    import io
    import sys

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(CRASH.read_bytes())))
    log = parse_logs(["-"], summary_only=summary_only)
    [skipped], [error] = log.binary_skipped, log.errors
    assert skipped.file == error.file == "<stdin>" and log.files == ["-"]
    assert log.to_dict()["binary_skipped"][0]["file"] == "<stdin>"


@pytest.mark.parametrize("chunk_bytes", [97, 4096])
def test_offsets_are_the_files_whatever_the_blocks(chunk_bytes: int):
    """Blocks cut anywhere (both reading paths) report each run at its byte in the file."""
    data = CRASH.read_bytes()
    expected = [run[3] for run in parse_logs([str(CRASH)]).binary_skipped[0].runs]
    collector = LogCollector(summary_only=True)
    with open(CRASH, "rb") as stream:
        end = read_bulk(collector, LineParser(str(CRASH)), stream, chunk_bytes=chunk_bytes, engine="python")
    assert end.binary is not None and [run[3] for run in end.binary.runs] == expected
    tally, splitter = BinaryTally(), LineSplitter()
    splitter.tally = tally
    for start in range(0, len(data), chunk_bytes):
        list(splitter.feed(data[start:start + chunk_bytes]))
    list(splitter.flush())
    assert [run[3] for run in tally.runs] == expected


def test_offsets_past_a_dropped_stretch_count_it():
    """Past the cut of an over-long line (its rest dropped, not kept), a run's offset counts the dropped bytes."""
    tally = BinaryTally()
    decode_log_text(b"head\x00\x00\nmid\ntail\x00\x00\x00\n", 1, tally, Offsets(1000, cut_at=8, dropped=500))
    assert [run[3] for run in tally.runs] == [1004, 1515]


def test_binary_runs_become_segment_breaks_and_a_lone_latin1_byte_stays():
    tally = BinaryTally()
    text = decode_log_text(b"iteration 5 | lm lo\x00\x00\x00\x00[2026-01-01] restart\ncaf\xe9 ok\n", 10, tally)
    assert text == "iteration 5 | lm lo\r[2026-01-01] restart\ncaf\ufffd ok\n"
    assert tally.bytes_skipped == 4 and tally.runs == [(10, 10, 4, 19)]
    garbage = random.Random(1).randbytes(300).replace(b"\n", b"\x01")
    tally = BinaryTally()
    text = decode_log_text(b"before\n" + garbage + b"\nafter\n", 1, tally)
    assert text.startswith("before\n") and text.endswith("\nafter\n") and tally.runs[0][:2] == (2, 2)
    assert tally.bytes_skipped > 200  # all of it but the printable bytes at its very edges


def test_a_file_without_text_is_still_refused(tmp_path: Path):
    nuls, noise = tmp_path / "nuls.log", tmp_path / "noise.log"
    nuls.write_bytes(b"\x00" * 100_000)
    noise.write_bytes(random.Random(2).randbytes(50_000))
    assert is_text(CRASH) and not is_text(nuls) and not is_text(noise)
    for path in (nuls, noise):
        with pytest.raises(MegapilotError, match="not a text file"):
            expand_log_paths([str(path)])
    padded_start = tmp_path / "padded.log"  # the padding fills the start: the text after it is found
    padded_start.write_bytes(b"\x00" * 40_000 + CRASH.read_bytes())
    assert is_text(padded_start)
    assert parse_logs([padded_start]).summary.iterations_logged == 26


def test_diagnose_reads_the_crash_and_says_what_it_skipped(cli):
    result = cli("diagnose", str(CRASH), "--json")
    assert result.exit_code == 0
    data = result.json()
    assert data["findings"][0]["category"] == "oom"
    assert "nan_loss" not in [finding["category"] for finding in data["findings"]]  # a torn line is no NaN
    assert any("skipped 22 KB of binary data on lines 21, 27 at byte offsets 7200, " in note for note in data["notes"])


def test_diagnose_says_a_file_is_not_a_training_log(cli, tmp_path: Path):
    readme = tmp_path / "README.txt"
    readme.write_text("How to run the job\n\nSubmit it with sbatch and wait for the e-mail.\n")
    result = cli("diagnose", str(readme))
    assert result.exit_code == 1
    assert "README.txt: this is not a training log" in result.stderr
    assert "No problem found" not in result.stdout + result.stderr
    assert cli("diagnose", str(readme), "--json").json()["training_log"] is False


def test_a_run_after_an_over_long_line_is_at_its_byte(tmp_path: Path):
    """A line past MAX_LINE_BYTES is cut (its rest dropped): a run after it is still reported at its byte."""
    long_line = b"x" * (3 << 20) + b"\n"
    path = tmp_path / "long.log"
    path.write_bytes(b"start\n" + long_line + b"ok\x00\x00\x00\x00\n")
    for summary_only in (False, True):
        [skipped] = parse_logs([str(path)], summary_only=summary_only).binary_skipped
        assert skipped.runs == [(3, 3, 4, 6 + len(long_line) + 2)]


def _iteration_line(iteration: int) -> bytes:
    return (f" [2026-01-01 00:00:{iteration:02d}] iteration {iteration:8d}/     100 | "
            f"consumed samples: {64 * iteration} | elapsed time per iteration (ms): 1000.0 | learning rate: 1.0E-04 | "
            "global batch size:    64 | lm loss: 5.0E+00 | loss scale: 1.0 | grad norm: 1.0 | "
            "number of skipped iterations:   0 | number of nan iterations:   0 |").encode()


@pytest.mark.parametrize("engine", ["line path", *ENGINES])
@pytest.mark.parametrize("head", [1, 60], ids=["in the warm-up head", "past it"])
def test_a_nul_run_right_before_an_iteration_line_is_counted_by_every_reader(tmp_path: Path, engine: str, head: int):
    """A crash's NUL padding ends where the next write began: the NULs and the iteration line share a line. Each
    reader reads the iteration and says it skipped the NULs, at their line and byte."""
    lines = [_iteration_line(i) for i in range(1, head + 1)]
    torn = b"\x00" * 3000 + _iteration_line(head + 1)
    path = tmp_path / "train.log"
    path.write_bytes(b"\n".join([*lines, torn, _iteration_line(head + 2)]) + b"\n")
    nul_at = path.read_bytes().index(b"\x00")
    if engine == "line path":
        log = parse_logs([str(path)])
    else:
        collector = LogCollector(summary_only=True)
        with open(path, "rb") as stream:
            collector.end_source(read_bulk(collector, LineParser(str(path)), stream, engine=engine))
        log = collector.finish()
    assert log.summary is not None and log.summary.iterations_logged == head + 2
    [skipped] = log.binary_skipped
    assert skipped.runs == [(head + 1, head + 1, 3000, nul_at)]
    assert skipped.describe() == f"skipped 2.9 KB of binary data on line {head + 1} at byte offset {nul_at}"


@pytest.mark.parametrize("engine", ENGINES)
def test_diagnose_notes_a_nul_run_before_an_iteration_line(tmp_path: Path, engine: str,
                                                           monkeypatch: pytest.MonkeyPatch):
    """diagnose reads in bulk with a row hook: its note names the NULs as the line path counts them."""
    from megapilot.diagnose import diagnose

    monkeypatch.setenv(ENGINE_ENV, engine)
    path = tmp_path / "train.log"
    path.write_bytes(_iteration_line(1) + b"\n" + b"\x00" * 4096 + _iteration_line(2) + b"\n" + _iteration_line(3))
    notes = [note.text for note in diagnose([path]).notes]
    assert f"train.log: skipped 4.0 KB of binary data on line 2 at byte offset {len(_iteration_line(1)) + 1}" in notes
