"""Bulk reading of whole logs in summary-only mode: byte blocks through a compiled scanner, not Python per line.

`parse_logs(..., summary_only=True)` without `on_record` reads here, and `RunFollower` follows files through
the same reader. The result is exactly that of the line path (`collect._feed`, every line through
`LineParser.feed`): the same summary, dialect counts, errors, checkpoint operations, lines read, last line and
last timestamp. That holds because a line skips the line parser only where the line parser could not have done
anything with it:

- Canonical Megatron-LM iteration lines (FAST_ITERATION_RE: the fixed field order of `training_log`, printable
  ASCII, no ANSI code, no Primus logger prefix) go straight into the summary, no record is built. A variant the
  matcher does not accept in full (another field order, a Primus `inst/avg` pair, a mangled value) goes to the
  line parser.
- Any other line goes to the line parser if it holds a needle the parser reacts to (`PARSER_NEEDLES`: the
  record needles and the error signatures' triggers, case-insensitive), any control or non-ASCII byte (ANSI
  codes, `\\r` progress lines, undecodable bytes), or while a traceback or an `arguments` block is being read.
  The other lines are skipped.
- Skipped and iteration lines can still move the parser's "latest timestamp" (checkpoint lines without a
  timestamp of their own use it). Those timestamps are parsed lazily: only the last one before a line that goes
  to the parser, and at the end of each block.

Two engines do this, chosen once per reader (`choose_engine`: the compiled one when it is built, else Python;
MEGAPILOT_LOG_ENGINE=python forces the pure-Python engine; `ENGINE` says which readers use):

- compiled (`megapilot/logs/_scan.c`): one C call walks a block line by line. Its matcher reads FAST_ITERATION_RE's
  language by hand and folds each row into the summary's state with the statements of `SummaryBuilder.add_rows`
  (the same doubles: built without -ffast-math and with -ffp-contract=off; reservoir replacements draw from the
  summary's own generator). It also skips needle occurrences that are inert in summary-only mode
  (`SUMMARY_INERT_NEEDLES`: timer lines, `memory (MB)` reports, `iterations` that cannot start a record); a
  reader that wants the timers (`keep_timers`: `megapilot run`'s departure from its prediction) has them parsed.
  Multi-rank noise stays in C too: on NCCL/RCCL chatter (`NCCL INFO` without `fail`, where no error signature
  can match) a needle that is only a signature's trigger is inert (`CHATTER_INERT_TRIGGERS`: `nccl`, `gpu`,
  `socket`, `connect`, ...), and a line cut by `\r` (a progress bar) is skipped when no segment holds a live
  needle, its time read per segment (`line_time`). A filter of the needles' first three bytes, four positions per
  step, keeps the per-byte cost of such lines low; the chatter filter holds only the needles live there.
  Whatever needs Python ends the call at that line: a live needle, a line the matcher is not sure of, a row bound
  for the warm-up head or carrying the run's first timestamp, a count past 64 bits (then Python reads the rest of
  the source). Python handles that line exactly as the Python engine does, then the scan goes on.
- python: one bytes regex per block finds the canonical lines (its groups are the summary's values, handed over
  in batches through `add_rows`), one needle regex per gap finds the next line worth parsing.

A reader that wants some iteration records (`diagnose` keeps a bounded series, `megapilot.diagnose.series`) passes
`on_row`: each canonical line then reaches it as a `RowLine` (iteration, loss, NaN count, time, whether those are the
record's anomaly fields, and the line's text with a copy of the parser's state to build the record on demand),
in log order among the records the sink gets. The compiled engine hands its rows over as a list after each scan
(offsets, values, the prefix's time read in C for the usual ` [YYYY-MM-DD HH:MM:SS.ffffff] ` prefix, the "plain"
test in C) and stops at `memory (MB)` lines too (their records are kept then); the Python engine calls it per row.
A reader that wants only the memory reports passes `keep_memory` (the scan stops at them as with `on_row`), and one
that wants only the first iteration line of a given form passes a `RowProbe` (`logs parse`'s table: the format of
the first dated line tells the release): the rows are tested against its regex, on their bytes, only until one
matches; after that the compiled scan hands over no rows.

Blocks are cut as `LineSplitter` cuts them (`block_end`), with the same chunk size as the line path, so over-long
lines are read the same way: one past MAX_LINE_BYTES (1 MiB) is handed on up to its last `\r` (a progress bar that
writes a whole run as one line of `\r` updates is read to its last update), else cut there; memory stays bounded
by the chunk size plus MAX_LINE_BYTES. The compiled engine reads into one reused buffer (a fresh 1 MiB object per
chunk cost it more in page faults and copies than the scan).

Speed (bench/log_parse, results.json, a synthetic 1 GB Megatron log on a shared 2-core machine): the compiled
engine reads ~1,550 MB per CPU-second, 0.29x `grep -c iteration` in CPU seconds (the median of 5 interleaved
grep/parse pairs, 0.25x to 0.34x; grep: ~5,000 MB per CPU-second, memchr speed), ~25x the Python engine (~53 MB per
CPU-second) and ~100x the line path, at a quiet moment. CPU seconds grow when the two cores are busy with other jobs
(shared caches and execution units): the latest run, at a load of 14 to 21, read ~980 MB per CPU-second, 0.21x
(0.21x to 0.23x), and this round's line pass left the clean log's time as it was. Where its ~0.7 CPU-seconds go: ~0.3 s
in the C matcher (~105 ns per 350-byte iteration line: digit runs, literals, three float conversions), ~0.2 s in
the kernel copying the file in (about grep's whole time), ~0.09 s for Python's start and imports, the rest in the
line parser for the 1,172 checkpoint lines (each now searches only the error signatures whose required literals
it holds, ~57 us instead of ~310 us), the running statistics, the reservoir's draws and the per-block Python.
On the noisy multi-rank log (NCCL INFO every other line, rank and timestamp prefixes; `generate_noisy`) the CLI reads
~880 MB per CPU-second net of its start-up, 0.28x `grep -c` (median of 9 interleaved pairs, 0.19x to 0.31x: one pair
fell in a burst of load 21) with the machine at a load of 14 to 21 (0.21x the round before, 0.127x before that).
What made chatter cheap: one pass from a line's start finds its newline or `it` and notes whether the bytes before
hold a control or non-ASCII byte or an `ai` (`fail`'s pair), 32 bytes a step with AVX2 where the CPU has it
(`line_pass_avx2`, chosen at import; `use_vectors` turns it off for the tests), else 8 (`line_pass_swar`): a chatter
line is then read once more, by the chatter filter, which tests for each live needle its two adjacent 4-byte windows
of least common bytes (`rarest_windows`; `rank`, `init` and `[ran` were the old first windows and hit on most
chatter lines), four windows from two loads per step, a byte per hash in its table, a hit's needles found by binary
search; the matcher of an iteration line stops at its newline itself. In-process, the noisy log's parse went from
~0.24 to ~0.18 CPU-s at the same load; what is left: the iteration matcher (~25 %), the chatter filter (~15 %), the
line pass (~7 %), the kernel's copy (~10 %), Python (~20 %: the line parser on the 132 checkpoint lines, ~110 us
each, most of it the error signatures' substring tests; the reservoir's draws; the per-block bookkeeping).
Tried and dropped: digit runs read eight bytes at a time (slower: the multiplies' latency beats the byte loop's
branches on these short runs), a stricter literal prefilter of the error signatures (their substring tests, not the
regex searches, are the cost).
One process, no multiprocessing: the summary is sequential (Welford, a seeded
reservoir), so splitting the file would change its floats, and CPU seconds would not drop anyway.

Engines measured and rejected before the C scanner: polars' Rust-regex `str.extract_groups` (~4 us per iteration
line, 88 MB per CPU-second, a dependency for under 2x, and not bit-exact), hyperscan (match offsets without
captures), RE2's bindings (the same per-match Python cost).
"""

from __future__ import annotations

import copy
import math
import os
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import BinaryIO, NamedTuple, Protocol

from megapilot.errors import MegapilotError
from megapilot.logs.lines import (
    CHUNK_BYTES,
    MAX_LINE_BYTES,
    BinaryTally,
    BlockSplitter,
    Offsets,
    block_end,
    cut_line,
    decode_log_text,
    split_carriage_returns,
)
from megapilot.logs.parser import (
    DEEPSPEED_FORK_KEYS,
    RECORD_NEEDLES,
    LineParser,
    leading_time,
    prefix_time,
)
from megapilot.logs.records import Evidence, IterationRecord, Record
from megapilot.logs.signatures import TRIGGERS
from megapilot.logs.summary import RESERVOIR_SIZE, WARMUP_CAP, IterationRow, SummaryBuilder

try:
    from megapilot.logs import _scan

    COMPILED_BUILT = True
except ImportError:  # installed without a C compiler: the pure-Python engine reads everything
    COMPILED_BUILT = False

ENGINE_ENV = "MEGAPILOT_LOG_ENGINE"
ENGINES = ("compiled", "python")


def choose_engine(requested: str | None = None) -> str:
    """The engine a reader uses: `requested`, else $MEGAPILOT_LOG_ENGINE, else the compiled one when it is built."""
    value = (requested if requested is not None else os.environ.get(ENGINE_ENV, "")).strip().lower()
    if not value:
        return "compiled" if COMPILED_BUILT else "python"
    if value not in ENGINES:
        raise MegapilotError(f"unknown log engine {value!r}", field=ENGINE_ENV,
                             fix="set it to 'compiled' or 'python', or unset it")
    if value == "compiled" and not COMPILED_BUILT:
        raise MegapilotError("the compiled log scanner (megapilot.logs._scan) is not built", field=ENGINE_ENV,
                             fix="rebuild it with `make setup` (needs a C compiler), or set it to 'python'")
    return value


# The engine readers use unless told otherwise (chosen at import; an invalid setting is reported when reading).
ENGINE = "compiled" if COMPILED_BUILT and os.environ.get(ENGINE_ENV, "").strip().lower() != "python" else "python"


class RecordSink(Protocol):
    """Where a source's records go (`LogCollector` is one): every record, plus the two counters the bulk path
    updates itself for the iteration lines it never turns into records."""

    summary: SummaryBuilder
    dialects: Counter[str]

    def add(self, record: Record) -> None: ...


@dataclass(frozen=True)
class SourceEnd:
    """What one source contributes to its run beyond records: lines read, its last non-empty line, its latest
    timestamp (the same from the line path and the bulk path)."""

    lines_read: int
    last_line: Evidence | None
    last_time_s: float | None
    framework_hints: Counter[str]
    binary: BinaryTally | None = None


class RowLine(NamedTuple):
    """A canonical iteration line read in bulk, for a reader that wants some of their records (`on_row`): a few of
    the row's values, and what builds the line's record on demand (`record`), exactly as `LineParser.feed` built it
    on reaching the line. `plain`: the values are the record's anomaly fields (its `iteration`, its `lm_loss` is
    `loss`, finite or None, `nan_iterations`; no other loss nor the grad norm is NaN/Inf, no memory usage); when
    not, only `record()` tells. `time_s` is the record's always."""

    iteration: int
    loss: float | None
    nan_iterations: int
    time_s: float | None
    line_no: int
    text: bytes
    parser: LineParser  # a copy of the file's parser as it was at this line (its state decides dialect and tokens)
    plain: bool

    def record(self) -> IterationRecord:
        record = self.parser.iteration_record(self.line_no, self.text.decode("ascii"))
        if record is None:  # ITERATION_RE matches every line FAST_ITERATION_RE accepts
            raise AssertionError(f"line {self.line_no} is not an iteration line")
        return record


def _row_is_plain(fields: bytes) -> bool:
    """Whether a row's values are its record's anomaly fields, from the bytes after its loss (`_DOUBT_WORDS`)."""
    low = fields.lower()
    for word in _DOUBT_WORDS:
        if word in low:
            return False
    return _OVERFLOW_RE.search(low) is None and (len(low) < 300 or _DIGIT_RUN_RE.search(low) is None)


RowHook = Callable[[RowLine], None]


class RowProbe:
    """Finds the first iteration line of a run whose text `pattern` matches (from the line's start, as
    `pattern.match(record.text)`), for a reader that needs one such record and none of the others (`logs parse`'s
    table: the format of the iteration lines tells the release). Canonical lines read in bulk are tested on their
    bytes, and only while none is found: then the compiled scan hands over no more rows. Records the sink gets
    are offered by whoever receives them (`offer`), in log order with the rows. One probe serves every file of a
    run: after a find it tests nothing more."""

    def __init__(self, pattern: re.Pattern[str]) -> None:
        self.pattern = pattern
        # The same language on ASCII bytes (canonical lines are printable ASCII); `^` dropped: `match` anchors at its
        # start position, which `^` would not accept inside a block.
        self.row_pattern = re.compile(pattern.pattern.removeprefix("^").encode("ascii"),
                                      pattern.flags & ~re.UNICODE)
        self.found: IterationRecord | None = None
        self.rows_tested = 0  # canonical lines tested (the cost of a run whose lines never match)

    def offer(self, record: IterationRecord) -> None:
        """An iteration record in log order (built by the line parser, not a canonical line read in bulk)."""
        if self.found is None and self.pattern.match(record.text):
            self.found = record
# A row as the compiled scan hands it over: (line start, prefix end, line end, newlines before it in the scan,
# iteration, finite loss or None, plain, NaN count, the prefix's time if read in C, whether it was).
ScannedRow = tuple[int, int, int, int, int, float | None, int, int, float | None, int]

_VALUE = rb"[\x20-\x7b\x7d\x7e]*"  # printable ASCII but `|`
_INT = rb"[0-9]{1,15}"  # short enough that int(float(text)) == int(text), as the line parser computes it
_NUMBER = rb"[0-9]{1,15}(?:\.[0-9]{1,15})?"
_LOSS = rb"[-+]?(?:[0-9]+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?|nan|NaN|NAN|inf|Inf|INF)"
_KEY = rb"[a-z0-9_]+(?: [a-z0-9_]+)*"  # lowercase, no outer space: the line parser's key is the same text
# Keys whose value reaches the summary or the dialect: never accepted among the free fields, so that
# the regex's groups are the values the line parser would keep (it keeps the last of repeated keys).
# Keys that make the line parser name a fork's dialect are excluded the same way.
SUMMARY_KEY_NAMES: tuple[str, ...] = (
    "lm loss", "loss", "tflops", "global batch size", "number of skipped iterations", "number of nan iterations",
    "mem usages", "consumed samples", "skipped samples", *sorted(DEEPSPEED_FORK_KEYS),
)
_SUMMARY_KEYS = rb"(?:" + b"|".join(re.escape(key.encode()) for key in SUMMARY_KEY_NAMES) + rb")"

# The Megatron-LM `training_log` line (2022 to today), from `iteration` to the end of the line.
FAST_ITERATION_RE = re.compile(
    rb"iteration +(" + _INT + rb")/ *(" + _INT + rb") \|"
    rb" consumed samples: +" + _INT + rb" \|"
    rb"(?: skipped samples: +" + _INT + rb" \|)?"
    rb" elapsed time per iteration \(ms\): (" + _NUMBER + rb") \|"
    rb"(?: throughput per GPU \(TFLOP/s/GPU\): (" + _NUMBER + rb") \|)?"
    rb"(?: learning rate:" + _VALUE + rb"\|)?(?: decoupled learning rate:" + _VALUE + rb"\|)?"
    rb" global batch size: +(" + _INT + rb") \|"
    rb"(?: lm loss: +(" + _LOSS + rb") \|)?"
    # the usual fields spelled out (cheaper for the regex engine than the free-field loop), then any other
    rb"(?: loss scale:" + _VALUE + rb"\|)?(?: grad norm:" + _VALUE + rb"\|)?(?: num zeros:" + _VALUE + rb"\|)?"
    rb"(?: params norm:" + _VALUE + rb"\|)?"
    rb"(?: (?!" + _SUMMARY_KEYS + rb":)" + _KEY + rb":" + _VALUE + rb"\|)*"
    rb" number of skipped iterations: +(" + _INT + rb") \|"
    rb" number of nan iterations: +(" + _INT + rb") \| *\n"
)
_WORD_BYTES = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")
# A byte that sends an iteration line's prefix to the line parser (the gap's needle regex sends such lines there too):
# a control byte (an ANSI code, `\r`, a crash's NUL run, which the parser's decoding cuts out and counts) or a
# non-ASCII one. The compiled scanner's prefix test is stricter (a tab too) and hands such a line back here.
_UNPRINTABLE_RE = re.compile(rb"[^\t\x20-\x7e]")
# A row's record can differ from its values in the anomaly fields only through the fields after its loss (before
# them come fixed keys the rules do not read): another loss or the grad norm NaN/Inf, or a float that overflows to
# one (a 3-digit exponent, 300 digits), a memory usage, a loss key `lm_loss` reads first. Doubts only (an `info`
# key, say): the record is then built.
_DOUBT_WORDS = (b"nan", b"inf", b"mem usage", b"lm_loss", b"reduced_train_loss")
_OVERFLOW_RE = re.compile(rb"e[-+]?[0-9_]{3}")
_DIGIT_RUN_RE = re.compile(rb"[0-9_]{300}")
_TIMESTAMP_RE = re.compile(rb"\d{4}-?\d\d-?\d\d[ T_]\d\d:\d\d:\d\d")


def _needle_regex(needles: tuple[str, ...]) -> re.Pattern[bytes]:
    """One regex for "a line the parser must see": the needles grouped by first byte (so the regex
    engine tries one branch per position, not one per needle), or a control or non-ASCII byte."""
    by_first: dict[str, set[str]] = {}
    for needle in needles:
        by_first.setdefault(needle[0], set()).add(needle[1:])
    branches = []
    for first, rests in sorted(by_first.items()):
        tails = "|".join(re.escape(rest) for rest in sorted(rests, key=lambda r: (-len(r), r)))
        branches.append(re.escape(first) + (f"(?:{tails})" if tails else ""))
    branches.append(r"[^\t\n\x20-\x7e]")
    return re.compile("|".join(branches).encode("latin-1"))


# Matched against lowercased bytes: every needle is lowercase, as the parser compares lowercased text
# (a superset where the parser is case-sensitive: more lines parsed, never fewer).
PARSER_NEEDLES: tuple[str, ...] = tuple(sorted(set(RECORD_NEEDLES) | set(TRIGGERS)))
PARSER_NEEDLE_RE = _needle_regex(PARSER_NEEDLES)

# Needle occurrences the compiled engine may skip in summary-only mode, with the rule that makes them harmless
# (keep in step with `LineParser.feed` and `_structured`): on a line without any other needle, `.:` and `time (ms)`
# can only give timer records, which summary-only collection drops (a `save-checkpoint` timer, the one it keeps,
# holds the `checkpoint` needle); `memory (MB)` gives an allocator memory record, dropped too (`memory (GB)` marks
# Megatron-Bridge, so it is parsed); `iteration` counts only where ITERATION_RE can match (`iteration 5/ 10 |`;
# `(after 100 iterations)` cannot). A trigger of the error signatures is never skipped.
SUMMARY_INERT_NEEDLES: dict[str, tuple[str, str]] = {
    ".:": ("always", ""), "time (ms)": ("always", ""), "memory (": ("before suffix", "mb)"),
    "iteration": ("unless iteration record", ""),
}


# Needles that are only an error signature's trigger: on NCCL/RCCL chatter (`NCCL INFO` without `fail`, as
# `signatures.match_line` tells it) no signature matches, so the compiled engine skips them there (`nccl` itself,
# `socket`, `gpu`, `connect`, `timeout`, ... in `NCCL INFO Setting affinity for GPU 3`). `error` stays live: it is
# also `_lone_exception`'s test (`RuntimeError: ` behind any prefix).
CHATTER_INERT_TRIGGERS: frozenset[str] = frozenset(TRIGGERS) - set(RECORD_NEEDLES) - {"error"}


# The needles of timer lines (`forward-backward ....: (9000.12, 9010.34)`, `time (ms) | forward: 132.49`): inert in
# summary-only mode unless a reader keeps the timers (`keeps_timers`).
TIMER_NEEDLES = frozenset({".:", "time (ms)"})


def _new_scanner(keeps_memory: bool = False, keeps_timers: bool = False) -> _scan.Scanner:
    """`keeps_memory`: `memory (MB)` reports stop the scan (their records go to the sink) instead of being inert;
    `keeps_timers`: timer lines do (their `TimerRecord`s go to the sink)."""
    rules = {"always": _scan.INERT_ALWAYS, "before suffix": _scan.INERT_BEFORE_SUFFIX,
             "unless iteration record": _scan.INERT_UNLESS_ITERATION}
    needles = []
    for needle in PARSER_NEEDLES:
        rule, suffix = SUMMARY_INERT_NEEDLES.get(needle, ("never", ""))
        if (keeps_memory and needle == "memory (") or (keeps_timers and needle in TIMER_NEEDLES):
            rule = "never"
        if needle in TRIGGERS:
            inert = _scan.INERT_IN_CHATTER if needle in CHATTER_INERT_TRIGGERS else _scan.INERT_NEVER
        else:
            inert = rules.get(rule, _scan.INERT_NEVER)
        needles.append((needle.encode("latin-1"), inert, suffix.encode("latin-1")))
    keys = tuple(key.encode("latin-1") for key in SUMMARY_KEY_NAMES)
    return _scan.Scanner(tuple(needles), keys, RESERVOIR_SIZE, WARMUP_CAP)


class BulkReader:
    """Reads one binary stream into a sink, with one `LineParser` for the file's state, by the engine chosen
    (`choose_engine`): the compiled scanner, or the pure-Python one it falls back to."""

    def __init__(self, sink: RecordSink, parser: LineParser, engine: str | None = None,
                 on_row: RowHook | None = None, *, keep_timers: bool = False, keep_memory: bool = False,
                 row_probe: RowProbe | None = None) -> None:
        """`on_row`: called with each canonical iteration line's `RowLine`, in log order among the records the
        sink gets (the compiled engine hands its rows over after each scan, before the line it stopped at).
        `keep_timers`: Megatron's timer lines reach the line parser and their `TimerRecord`s the sink, as the line
        path gives them (the pure-Python engine reads them always; the compiled one skips them unless told).
        `keep_memory`: so do the `memory (MB)` reports' `MemoryRecord`s (as with `on_row`). `row_probe`: canonical
        lines are tested against it until it has found one (`RowProbe`)."""
        self.sink = sink
        self.parser = parser
        self.summary = sink.summary
        self.dialects = sink.dialects
        self.engine = choose_engine(engine)
        self._on_row = on_row
        self._probe = row_probe
        self._parser_at_row: LineParser | None = None  # the parser's state for `RowLine`s, copied once per gap
        self._scanner = (_new_scanner(keeps_memory=on_row is not None or keep_memory, keeps_timers=keep_timers)
                         if self.engine == "compiled" else None)
        self.lines_read = 0
        self.binary = BinaryTally()  # binary runs cut out of the lines the line parser reads
        self.last_line: tuple[int, str] | None = None
        # Lazy timestamps of the current block: the parser's latest-time candidates (prefix bytes of
        # iteration lines, or (start, end) of skipped lines) and the prefixes of counted iteration lines.
        self._time_candidates: list[bytes | tuple[int, int]] = []
        self._counted_prefixes: list[bytes] = []
        self._rows: list[IterationRow] = []  # iteration lines not yet handed to the summary (see `_flush_rows`)
        self._block: bytes | bytearray = b""
        self._block_offsets = Offsets(0)  # where the block lies in the file (binary runs are reported there)
        self._line_pos = 0
        self._line_no = 0
        self._lines_done = 0
        self._splitter = BlockSplitter()

    def read(self, stream: BinaryIO, chunk_bytes: int = CHUNK_BYTES) -> SourceEnd:
        readinto: Callable[[memoryview], int | None] | None = getattr(stream, "readinto", None)
        if self._scanner is not None and readinto is not None:
            return self._read_into_buffer(readinto, chunk_bytes)
        while chunk := stream.read(chunk_bytes):
            self.feed(chunk)
        return self.end()

    def _read_into_buffer(self, readinto: Callable[[memoryview], int | None], chunk_bytes: int) -> SourceEnd:
        """`feed` chunk by chunk, but into one reused buffer: a fresh 1 MiB object per chunk costs the compiled
        engine more (page faults, a copy to join the tail) than scanning it. The same blocks as `BlockSplitter`
        (`block_end`): the unfinished line stays at the buffer's start, handed on up to its last `\r` or cut to
        MAX_LINE_BYTES when it grows past that."""
        buffer = bytearray(MAX_LINE_BYTES + chunk_bytes)
        filled = 0
        offsets = Offsets(0)
        with memoryview(buffer) as view:
            while got := readinto(view[filled:filled + chunk_bytes]):
                filled += got
                end, continues = block_end(buffer, filled)
                if end == 0:
                    if filled > MAX_LINE_BYTES:
                        offsets = Offsets(offsets.start, MAX_LINE_BYTES, offsets.dropped + filled - MAX_LINE_BYTES)
                    filled = min(filled, MAX_LINE_BYTES)
                    continue
                self._block_offsets = offsets
                if continues:  # the `\r` the segments end at becomes the block's final newline
                    buffer[end - 1] = 0x0A
                self._read_block(buffer, end, continues)
                tail = min(filled - end, MAX_LINE_BYTES)
                dropped = filled - end - tail
                offsets = Offsets(offsets.at(end), tail if dropped else -1, dropped)
                view[:tail] = view[end:end + tail]
                filled = tail
        if filled:
            self._block_offsets = offsets
            last = cut_line(bytes(buffer[:filled]))
            self._read_block(last + b"\n", len(last) + 1)
        return self._end()

    def feed(self, chunk: bytes) -> None:
        """More bytes of the stream (any size; a line split across chunks is joined). Lets a follower hand over
        only what a file gained since its last poll."""
        block = self._splitter.feed(chunk)
        if block is not None:
            self._block_offsets = self._splitter.offsets
            self._read_block(*block, self._splitter.continues)

    def records_if_ended(self) -> list[Record]:
        """The records the line still waiting for its newline would give if the stream ended here, as `end` would
        read it, the reader left as it is (a copy of the parser reads it): a live reader's verdict on a line that a
        process stopped writing mid-way. None waiting: none."""
        pending = self._splitter.pending
        if not pending:
            return []
        parser = copy.deepcopy(self.parser)  # deep: its traceback frames and block fields change as it reads
        line_no = self._lines_done + 1
        return [record for _, segment in split_carriage_returns([(line_no, decode_log_text(cut_line(pending)))])
                for record in parser.feed(line_no, segment)]

    def end(self) -> SourceEnd:
        """The stream ended: its unterminated last line is read, and what the source contributes is returned."""
        tail = self._splitter.flush()
        if tail is not None:
            self._block_offsets = self._splitter.offsets
            self._read_block(tail + b"\n", len(tail) + 1)
        return self._end()

    # ---- one block of complete lines --------------------------------------------------------------
    def _read_block(self, block: bytes | bytearray, end: int, continues: bool = False) -> None:
        """block[:end] holds the next lines of the file, each ending with a newline; `continues`: the last one
        is an over-long line's segments so far, its final newline a `\r`, and the line goes on in the next block."""
        self._block = block
        self._line_pos, self._line_no = 0, self._lines_done + 1
        if self._scanner is not None:
            self._compiled_range(0, end)
        else:
            self._python_range(0, end)
        self._resolve_times()
        last_line_no = self._line_number_at(end) - 1
        self._lines_done = last_line_no - 1 if continues else last_line_no
        self._note_tail(block, end - 1, last_line_no)

    def _compiled_range(self, start: int, end: int) -> None:
        """block[start:end] by the compiled scanner; each line it hands back goes through `_python_range`."""
        block, pos = self._block, start
        while pos < end:
            if self.parser.reads_every_line:  # a traceback or an `arguments` block: line by line, as Python does
                line_end = block.index(b"\n", pos) + 1
                self._python_range(pos, line_end)
                pos = line_end
                continue
            assert self._scanner is not None
            self._resolve_times()  # rows and times the Python side holds reach the summary first
            first_line_no = self._line_number_at(pos)
            probing = self._probe is not None and self._probe.found is None
            handed: list[ScannedRow] | None = [] if self._on_row is not None or probing else None
            stop, line_start, line_end, newlines, rows = self._scanner.scan(
                block, pos, end, self.summary, self._token_shape(), self.parser.awaits_step_line, handed)
            if handed:
                if probing:
                    self._probe_scanned_rows(handed, first_line_no)
                if self._on_row is not None:
                    self._hand_scanned_rows(handed, first_line_no)
            self._line_no += newlines
            self._line_pos = line_start
            if rows:
                self.dialects["megatron-bridge" if self.parser.bridge_seen else "megatron-lm"] += rows
            self._resolve_scanned_times()
            if stop == _scan.STOP_END:
                return
            if stop == _scan.STOP_FALLBACK:  # a count past 64 bits: Python reads the rest of this source
                self._scanner, self.engine = None, "python"
                self._python_range(pos, end)
                return
            self._python_range(line_start, line_end)
            pos = line_end

    def _probe_scanned_rows(self, rows: list[ScannedRow], first_line_no: int) -> None:
        """The compiled scan's rows tested against the probe until one matches (its record is then built)."""
        probe, block = self._probe, self._block
        assert probe is not None
        match = probe.row_pattern.match
        for tested, (start, _, end, line_offset, *_) in enumerate(rows, 1):
            if match(block, start, end):
                probe.rows_tested += tested
                self._probe_found(first_line_no + line_offset, start, end)
                return
        probe.rows_tested += len(rows)

    def _probe_found(self, line_no: int, start: int, end: int) -> None:
        assert self._probe is not None
        self._probe.found = self.parser.iteration_record(line_no, bytes(self._block[start:end]).decode("ascii"))

    def _hand_scanned_rows(self, rows: list[ScannedRow], first_line_no: int) -> None:
        """The compiled scan's rows to `on_row` (the parser was fed no line during the scan: one state for all)."""
        block, on_row = self._block, self._on_row
        assert on_row is not None
        if self._parser_at_row is None:
            self._parser_at_row = copy.copy(self.parser)
        parser = self._parser_at_row
        for start, prefix_end, end, line_offset, iteration, loss, plain, nan, time_s, timed in rows:
            if not timed:  # not the usual prefix: the parser's own reading
                time_s = prefix_time(bytes(block[start:prefix_end]).decode("ascii"))
            on_row(RowLine(iteration, loss, nan, time_s, first_line_no + line_offset, bytes(block[start:end]), parser,
                           bool(plain)))

    def _token_shape(self) -> tuple[int, int, int] | None:
        """What `LineParser.computed_tokens_per_s` computes from: (seq, world, default GBS; 0 for unknown)."""
        parser = self.parser
        if not parser.computes_tokens:
            return None
        return parser.seq_length or 0, parser.world_size or 0, parser.global_batch_size or 0

    def _resolve_scanned_times(self) -> None:
        """The compiled scan's lazy timestamps: the last line or prefix with a time sets the parser's latest
        time, the last counted prefix with one the summary's."""
        assert self._scanner is not None
        scanner, block = self._scanner, self._block
        read: dict[tuple[int, int], float | None] = {}  # the last row's prefix is usually both kinds' answer
        while (candidate := scanner.pop_time()) is not None:
            kind, start, end = candidate
            text = block[start:end].decode("ascii")
            time_s = read[start, end] = prefix_time(text) if kind == _scan.TIME_PREFIX else line_time(text)
            if time_s is not None:
                self.parser.last_time_s = time_s
                break
        while (span := scanner.pop_counted()) is not None:
            time_s = read[span] if span in read else prefix_time(block[span[0]:span[1]].decode("ascii"))
            if time_s is not None:
                self.summary.note_last_time(time_s)
                break

    def _python_range(self, start: int, end: int) -> None:
        """block[start:end] (whole lines) by the pure-Python engine: one regex search for iteration lines, the
        needle regex for the lines between them."""
        block = self._block
        parser, summary = self.parser, self.summary
        rows_append, time_candidates_append = self._rows.append, self._time_candidates.append
        computes_tokens = parser.computes_tokens
        needs_first_time = not summary.has_first_time
        on_row = self._on_row
        probe = self._probe if self._probe is not None and self._probe.found is None else None
        word_bytes, rfind, unprintable = _WORD_BYTES, block.rfind, _UNPRINTABLE_RE.search
        pos = start
        for found in FAST_ITERATION_RE.finditer(block, start, end):
            match_start = found.start()
            line_start = rfind(b"\n", 0, match_start) + 1
            prefix = bytes(block[line_start:match_start])  # a copy when the block is the reader's reused buffer
            if prefix and (unprintable(prefix) or b"iteration" in prefix or b"[rank-" in prefix
                           or prefix[-1] in word_bytes):
                # stays in the gap: the line parser reads it (ANSI, \r, a crash's NUL run it counts, non-ASCII,
                # Primus prefix, no word boundary)
                continue
            if line_start > pos:
                self._gap(pos, line_start)
                needs_first_time = not summary.has_first_time
                computes_tokens = parser.computes_tokens  # an `arguments` block in the gap gives the shape
            pos = found.end()
            if parser.awaits_step_line:  # a Bridge `Step Time` line is waiting for this line
                self._parse_lines(line_start, pos)
                needs_first_time = not summary.has_first_time
                continue
            iteration, train_iters, elapsed, tflops, gbs, loss, skipped, nan = found.groups()
            elapsed_ms = float(elapsed)
            row = IterationRow(int(iteration), int(train_iters), elapsed_ms,
                               parser.computed_tokens_per_s(int(gbs), elapsed_ms) if computes_tokens else None,
                               None if tflops is None else float(tflops), None if loss is None else float(loss),
                               0 if nan == b"0" else int(nan), 0 if skipped == b"0" else int(skipped), prefix)
            if on_row is not None:
                on_row(self._row_line(row, found, line_start))
            if probe is not None:
                probe.rows_tested += 1
                if probe.row_pattern.match(block, line_start, pos - 1):
                    self._probe_found(self._line_number_at(line_start), line_start, pos - 1)
                    probe = None
            time_candidates_append(prefix)
            if needs_first_time:  # until a counted line has a timestamp, read each one at once
                self._add_with_time(row)
                needs_first_time = not summary.has_first_time
            else:
                rows_append(row)
        if pos < end:
            self._gap(pos, end)

    def _row_line(self, row: IterationRow, found: re.Match[bytes], line_start: int) -> RowLine:
        block = self._block
        if self._parser_at_row is None:
            self._parser_at_row = copy.copy(self.parser)
        after_loss = found.end(6) if found.start(6) >= 0 else found.end(5)
        loss = row.loss
        plain = (loss is None or math.isfinite(loss)) and _row_is_plain(bytes(block[after_loss:found.start(7)]))
        return RowLine(row.iteration, loss, row.nan_iterations or 0, prefix_time(row.time_key.decode("ascii")),
                       self._line_number_at(line_start), bytes(block[line_start:found.end() - 1]), self._parser_at_row,
                       plain)

    def _add_with_time(self, row: IterationRow) -> None:
        self.summary.add_row(row, time_s=prefix_time(row.time_key.decode("ascii")))
        self.dialects["megatron-bridge" if self.parser.bridge_seen else "megatron-lm"] += 1

    def _flush_rows(self) -> None:
        """Hand the iteration lines read so far to the summary (before any line that may touch it)."""
        if self._rows:
            self._counted_prefixes.extend(self.summary.add_rows(self._rows))
            self.dialects["megatron-bridge" if self.parser.bridge_seen else "megatron-lm"] += len(self._rows)
            self._rows.clear()

    def _gap(self, start: int, end: int) -> None:
        """The lines block[start:end] (each ending with a newline) between two fast iteration lines."""
        lowered = self._block[start:end].lower()
        pos, size = 0, end - start
        while pos < size:
            if self.parser.reads_every_line:
                # inside a traceback, a stack dump, a launcher summary or an `arguments` block: every line counts
                line_end = lowered.index(b"\n", pos) + 1
                self._parse_lines(start + pos, start + line_end)
                pos = line_end
                continue
            hit = PARSER_NEEDLE_RE.search(lowered, pos)
            if hit is None:
                self._time_candidates.append((start + pos, end))
                return
            line_start = lowered.rfind(b"\n", pos, hit.start()) + 1 or pos
            line_end = lowered.index(b"\n", hit.end()) + 1
            if line_start > pos:
                self._time_candidates.append((start + pos, start + line_start))
            self._parse_lines(start + line_start, start + line_end)
            pos = line_end

    def _parse_lines(self, start: int, end: int) -> None:
        """Feed block[start:end] (whole lines) to the line parser, exactly as the line path does."""
        self._resolve_times()
        line_no = self._line_number_at(start)
        feed, add = self.parser.feed, self.sink.add
        lines = decode_log_text(self._block[start:end], line_no, self.binary,
                                self._block_offsets.shifted(start)).split("\n")
        lines.pop()  # the empty text after the last newline
        for text in lines:
            segments = text.split("\r") if "\r" in text else (text,)
            for segment in segments:
                if segment or len(segments) == 1:
                    for record in feed(line_no, segment):
                        add(record)
            line_no += 1
        self._parser_at_row = None  # the lines may have changed the parser's state

    def _line_number_at(self, pos: int) -> int:
        self._line_no += self._block.count(b"\n", self._line_pos, pos)
        self._line_pos = pos
        return self._line_no

    # ---- lazy timestamps --------------------------------------------------------------------------
    def _resolve_times(self) -> None:
        """Bring the summary, the parser's latest timestamp and the summary's last one up to date."""
        self._flush_rows()
        if self._time_candidates:
            for candidate in reversed(self._time_candidates):
                if isinstance(candidate, tuple):
                    time_s = self._last_leading_time(*candidate)
                else:
                    time_s = prefix_time(candidate.decode("ascii"))
                if time_s is not None:
                    self.parser.last_time_s = time_s
                    break
            self._time_candidates.clear()
        if self._counted_prefixes:
            for prefix in reversed(self._counted_prefixes):
                time_s = prefix_time(prefix.decode("ascii"))
                if time_s is not None:
                    self.summary.note_last_time(time_s)
                    break
            self._counted_prefixes.clear()

    def _last_leading_time(self, start: int, end: int) -> float | None:
        """The time the last timestamped line of skipped lines block[start:end] sets (ASCII only)."""
        block = self._block
        if not _TIMESTAMP_RE.search(block, start, end):
            return None
        line_end = end - 1  # the newline ending the last line
        while line_end > start:
            line_start = block.rfind(b"\n", start, line_end) + 1 or start
            time_s = leading_time(block[line_start:line_end].decode("ascii"))
            if time_s is not None:
                return time_s
            line_end = line_start - 1
        return None

    # ---- what the line path counts at the end -------------------------------------------------------
    def _note_tail(self, block: bytes | bytearray, end: int, last_line_no: int) -> None:
        lines_read, last_line = _last_line_facts(block, end, last_line_no)
        if lines_read is not None:
            self.lines_read = lines_read
        if last_line is not None:
            self.last_line = last_line

    def _end(self) -> SourceEnd:
        last = self.last_line
        return SourceEnd(self.lines_read, None if last is None else Evidence(self.parser.file, last[0], last[1]),
                         self.parser.last_time_s, self.parser.framework_hints, self.binary)


def line_time(text: str) -> float | None:
    """The time a skipped line sets, as the line path reads it: a line with `\r` is its segments, each a line of
    its own (the last segment with a time sets it)."""
    if "\r" not in text:
        return leading_time(text)
    for segment in reversed(text.split("\r")):
        time_s = leading_time(segment)
        if time_s is not None:
            return time_s
    return None


def _last_line_facts(data: bytes | bytearray, end: int, last_line_no: int) -> tuple[int | None, tuple[int, str] | None]:
    """Within data[:end] (lines without the final newline, the last one numbered `last_line_no`): the number
    of the last line the line path yields (a line of nothing but `\r` yields no segment), and the
    (number, text) of the last non-empty line or `\r` segment. Walks back from the end."""
    lines_read: int | None = None
    last: tuple[int, str] | None = None
    line_no = last_line_no
    while True:
        start = data.rfind(b"\n", 0, end) + 1
        line = decode_log_text(data[start:end])
        if "\r" in line:
            segments = [s for s in line.split("\r") if s]
            if segments:
                lines_read = lines_read or line_no
                last = (line_no, segments[-1])
        else:
            lines_read = lines_read or line_no
            if line:
                last = (line_no, line)
        if last is not None or start == 0:
            return lines_read, last
        end, line_no = start - 1, line_no - 1


def read_bulk(sink: RecordSink, parser: LineParser, stream: BinaryIO, chunk_bytes: int = CHUNK_BYTES,
              engine: str | None = None, on_row: RowHook | None = None, *, keep_timers: bool = False,
              keep_memory: bool = False, row_probe: RowProbe | None = None) -> SourceEnd:
    """Parse a whole binary stream in summary-only mode into `sink` (see the module docstring); `keep_timers`: the
    timer lines' records reach the sink too, `keep_memory`: the `memory (MB)` reports' too; `row_probe`: see
    `RowProbe`."""
    return BulkReader(sink, parser, engine, on_row, keep_timers=keep_timers, keep_memory=keep_memory,
                      row_probe=row_probe).read(stream, chunk_bytes)
