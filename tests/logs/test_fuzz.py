"""Fuzz: random bytes and mangled real lines never crash the parser, and summary-only bulk reading of them, by
either engine (the compiled scanner and the pure-Python one), gives what the line path gives."""

from __future__ import annotations

import io
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from megapilot.logs import LineParser
from megapilot.logs.bulk import ENGINES, read_bulk
from megapilot.logs.collect import LogCollector, ParsedLog, _feed
from megapilot.logs.lines import BINARY_RUN_RE, cut_line, read_lines

DATA = Path(__file__).resolve().parents[1] / "data" / "logs"
REAL_LINES = [
    line for path in sorted(DATA.glob("**/*.log")) for line in path.read_text(errors="replace").splitlines() if line
]


def _lines_with_text_or_empty(data: bytes) -> int:
    """Lines as the reader counts them: every `\\n`-terminated line and a truncated last one, except that
    trailing lines made only of `\\r` are empty segments, dropped (lines.py), so they end no count; a binary run
    (NULs, garbage: `BINARY_RUN_RE`) is cut out like a `\\r`."""
    lines = data.split(b"\n")
    if data.endswith(b"\n") or not data:
        lines.pop()
    else:  # a last line no newline ended loses a trailing number the cut may have shortened
        lines[-1] = cut_line(lines[-1])
    while lines and lines[-1] and not BINARY_RUN_RE.sub("\r", lines[-1].decode("utf-8", "surrogateescape")).strip(
            "\r"):
        lines.pop()
    return len(lines)


def _summary_facts(log: ParsedLog) -> tuple:
    return (log.summary.to_dict(), log.dialect_counts, log.lines_read, log.last_line, log.last_time_s, log.errors,
            log.checkpoints, log.arguments)


def _parse_bytes(data: bytes) -> None:
    """Parse without raising, count every line once, and cite only lines that exist; bulk reading agrees."""
    collector = LogCollector()
    _feed(collector, LineParser("fuzz"), read_lines(io.BytesIO(data), chunk_bytes=7), None)
    log = collector.finish()
    log.to_dict()
    assert log.lines_read == _lines_with_text_or_empty(data)
    cited = [record.line for record in (*log.iterations, *log.memory, *log.errors)]
    assert all(1 <= line <= log.lines_read for line in cited)
    for engine in ENGINES:
        bulk = LogCollector(summary_only=True)
        bulk.end_source(read_bulk(bulk, LineParser("fuzz"), io.BytesIO(data), chunk_bytes=23, engine=engine))
        assert _summary_facts(bulk.finish()) == _summary_facts(log), engine


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2000))
def test_random_bytes_never_crash(data: bytes):
    _parse_bytes(data)


def test_a_last_line_of_only_carriage_returns_is_still_counted():
    for data in (b"\r", b"a\n\r", b"a\n\r\r\n", b"\r\n\r"):
        _parse_bytes(data)


@st.composite
def mangled_lines(draw):
    line = draw(st.sampled_from(REAL_LINES))
    cut_a = draw(st.integers(0, len(line)))
    cut_b = draw(st.integers(cut_a, len(line)))
    junk = draw(st.text(alphabet=st.sampled_from("|:/.-0123456789 eE+naifNI\x1b[m\r\t"), max_size=20))
    return line[:cut_a] + junk + line[cut_b:]


@settings(max_examples=400, deadline=None)
@given(st.lists(mangled_lines(), min_size=1, max_size=20))
def test_mangled_real_lines_never_crash(lines: list[str]):
    _parse_bytes("\n".join(lines).encode("utf-8", "surrogatepass"))


def test_numbers_with_doubled_points_do_not_reach_float():
    """A mangled value ('8..03') is read as far as it is a number, never raised as ValueError."""
    from megapilot.logs import parse_text

    parsed = parse_text("Total number of parameters in billions: 8..03\n Step Time : 1..5s\n")
    assert [(r.quantity, r.value) for r in parsed.theoretical_memory] == [("total_params_billion", 8.0)]
