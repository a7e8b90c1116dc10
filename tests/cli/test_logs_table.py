"""`megapilot logs parse`'s table: read in bulk (`megapilot.cli.logs_table`), the same table a full parse printed."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest

from megapilot.cli import logs_cmd
from megapilot.cli.logs_table import read_table_log
from megapilot.diagnose.megatron_version import recognise_megatron_version
from megapilot.logs import ParseOptions, parse_logs
from megapilot.logs.bulk import ENGINES
from megapilot.logs.sources import expand_log_paths

DATA = Path(__file__).resolve().parents[1] / "data" / "logs"
FIXTURES = sorted(str(path.relative_to(DATA)) for path in DATA.rglob("*.log"))
RUNS = ["synthetic_crash_during_save", "real", "cpu_tour", "node_end", "fake"]  # directories read as one run

# SYNTHETIC: a dated Megatron-LM iteration line (whole seconds: core_v0.15.0 or older) and a memory report
DATED = (" [2026-01-01 00:{m:02d}:{s:02d}] iteration {it:8d}/ 1000000 | consumed samples: {cs:12d} | elapsed time per "
         "iteration (ms): {ms:.1f} | learning rate: 1.500000E-04 | global batch size:   128 | lm loss: 7.000000E+00 | "
         "loss scale: 1.0 | grad norm: 1.000 | number of skipped iterations:   0 | number of nan iterations:   0 |\n")
MEMORY = ("[Rank 0] (after {it} iterations) memory (MB) | allocated: 12345.67 | max allocated: 45678.90 | "
          "reserved: 50000.00 | max reserved: 52000.00\n")


def _full_parse_table(capsys: pytest.CaptureFixture[str], files: list[str], options: ParseOptions) -> tuple[str, str]:
    """The table as `logs parse` printed it before: a full parse (a record per line), then the same printer."""
    capsys.readouterr()
    log = parse_logs(expand_log_paths(files), options=options)
    logs_cmd._print_log(log, memory_reports=len(log.memory), version=recognise_megatron_version(log))
    out = capsys.readouterr()
    return out.out, out.err


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("target", FIXTURES + RUNS)
def test_table_is_what_the_full_parse_printed(cli, capsys, monkeypatch, target, engine):
    monkeypatch.setenv("MEGAPILOT_LOG_ENGINE", engine)
    files = [str(DATA / target)]
    try:
        expected = _full_parse_table(capsys, files, ParseOptions())
    except Exception:  # noqa: BLE001 - refused (empty, not text): the CLI's refusal is tested elsewhere
        pytest.skip(f"{target}: no table")
    result = cli("logs", "parse", *files)
    assert result.exit_code == 0, result.stderr
    assert (result.stdout, result.stderr) == expected


def _dated_log(path: Path, iterations: int, *, prefix: str = "", head: str = "") -> Path:
    with path.open("w") as out:
        out.write(head)
        for it in range(1, iterations + 1):
            out.write(prefix + DATED.format(m=(it * 9 // 60) % 60, s=it * 9 % 60, it=it, cs=it * 128,
                                            ms=9070.0 + it % 13))
            if it % 100 == 0:
                out.write(MEMORY.format(it=it))
    return path


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(("prefix", "head"), [
    ("", ""),  # the first iteration line tells the format
    ("[rank7]:", ""),  # no iteration line does (the format regex wants the timestamp first): none
    ("[rank7]:", "megatron-core==0.16.1\n"),  # a release line tells the release
])
def test_table_of_a_long_log_is_the_full_parse_table(cli, capsys, monkeypatch, tmp_path, prefix, head, engine):
    monkeypatch.setenv("MEGAPILOT_LOG_ENGINE", engine)
    log = str(_dated_log(tmp_path / "train.log", 3000, prefix=prefix, head=head))
    expected = _full_parse_table(capsys, [log], ParseOptions())
    result = cli("logs", "parse", log)
    assert (result.stdout, result.stderr) == expected
    assert "memory reports / checkpoints / errors │ 30 /" in " ".join(result.stdout.split())


def test_table_does_not_parse_every_record(cli, monkeypatch, tmp_path):
    """The table reads the log in bulk: no `parse_logs` with a record per line (47 s on a 435 MB log)."""
    log = str(_dated_log(tmp_path / "train.log", 500))

    def refused(*_args: object, **kwargs: object) -> object:
        raise AssertionError(f"parse_logs({kwargs}) called for the table")

    monkeypatch.setattr("megapilot.logs.parse_logs", refused)
    monkeypatch.setattr("megapilot.logs.collect.parse_logs", refused)
    result = cli("logs", "parse", log)
    assert result.exit_code == 0, result.stderr
    assert "500 / 500" in result.stdout


def _peak_bytes(path: Path) -> tuple[int, int]:
    tracemalloc.start()
    try:
        table = read_table_log([str(path)])
        return tracemalloc.get_traced_memory()[1], table.rows_tested
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("prefix", ["", "[rank7]:"])
def test_table_reading_memory_does_not_grow_with_the_log(tmp_path, prefix):
    """Ten times the iteration lines, about the same peak: no record kept per line (a full parse keeps ~2 KB each)."""
    read_table_log([str(_dated_log(tmp_path / "warm.log", 10))])  # imports, compiled regexes
    small, _ = _peak_bytes(_dated_log(tmp_path / "small.log", 1000, prefix=prefix))
    big, tested = _peak_bytes(_dated_log(tmp_path / "big.log", 10000, prefix=prefix))
    assert big - small < 1_000_000, (small, big)
    # the format probe stops at the first line that tells the format; without one it tests each line, keeping none
    assert tested == (1 if not prefix else 10000)
    assert read_table_log([str(tmp_path / "big.log")]).log.iterations == []


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("target", FIXTURES + RUNS)
def test_table_reading_keeps_what_the_full_parse_tells(monkeypatch, target, engine):
    """Beyond the printed table: the memory count, the markers and the first dated iteration record are the full
    parse's (the probe tests canonical lines in bulk, records as they come, in log order)."""
    from megapilot.diagnose.megatron_version import ITERATION_FORMAT_RE

    monkeypatch.setenv("MEGAPILOT_LOG_ENGINE", engine)
    paths = expand_log_paths([str(DATA / target)])
    full = parse_logs(paths)
    table = read_table_log(paths)
    assert table.memory_reports == len(full.memory)
    assert table.log.markers == full.markers
    assert table.format_record == next((r for r in full.iterations if ITERATION_FORMAT_RE.match(r.text)), None)
    assert table.log.summary == full.summary and table.log.errors == full.errors
