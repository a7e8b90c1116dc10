"""Bulk reading (summary-only) gives exactly what the line-by-line path gives, on every fixture and on
generated logs full of noise, with both engines (the compiled scanner and the pure-Python one); and it really
skips the line parser for the lines it may skip."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from megapilot.logs import LineParser, ParseOptions, _scan, parse_logs
from megapilot.logs.bulk import (
    CHATTER_INERT_TRIGGERS,
    ENGINES,
    FAST_ITERATION_RE,
    PARSER_NEEDLES,
    SUMMARY_INERT_NEEDLES,
    BulkReader,
    read_bulk,
)
from megapilot.logs.collect import LogCollector, ParsedLog, _feed, _ForwardingSink
from megapilot.logs.lines import BinaryTally, read_lines
from megapilot.logs.records import ErrorRecord, TimerRecord

DATA = Path(__file__).resolve().parents[1] / "data" / "logs"
FIXTURES = sorted(DATA.glob("**/*.log"))
OPTIONS = ParseOptions(seq_length=4096, world_size=8)

CANONICAL = ("iteration {it:8d}/{total:8d} | consumed samples: {cs:12d} | elapsed time per iteration (ms): {ms} | "
             "throughput per GPU (TFLOP/s/GPU): {tf} | learning rate: 1.500000E-04 | global batch size:   128 | "
             "lm loss: {loss} | loss scale: 1.0 | grad norm: 1.234 | number of skipped iterations:   {skipped} | "
             "number of nan iterations:   {nan} |")


def _facts(log: ParsedLog) -> dict:
    """Everything a summary-only parse promises; records are compared whole (file, line, text included)."""
    return {
        "summary": log.summary.to_dict(), "dialect": log.dialect, "dialect_counts": log.dialect_counts,
        "lines_read": log.lines_read, "last_line": log.last_line, "last_time_s": log.last_time_s,
        "errors": log.errors, "errors_dropped": log.errors_dropped, "checkpoints": log.checkpoints,
        "arguments": log.arguments, "binary_skipped": log.binary_skipped,
    }


def _line_path(data: bytes, options: ParseOptions = OPTIONS) -> ParsedLog:
    collector, binary = LogCollector(), BinaryTally()
    _feed(collector, LineParser("f.log", options), read_lines(io.BytesIO(data), chunk_bytes=7, tally=binary), None,
          binary)
    return collector.finish()


def _bulk_path(data: bytes, options: ParseOptions = OPTIONS, chunk_bytes: int = 1 << 20,
               engine: str = "compiled") -> ParsedLog:
    collector = LogCollector(summary_only=True)
    collector.end_source(read_bulk(collector, LineParser("f.log", options), io.BytesIO(data), chunk_bytes=chunk_bytes,
                                   engine=engine))
    return collector.finish()


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name)
def test_bulk_reading_matches_the_line_path_on_every_fixture(path: Path):
    full = parse_logs([path], options=OPTIONS)
    bulk = parse_logs([path], options=OPTIONS, summary_only=True)
    assert _facts(bulk) == _facts(full)
    assert bulk.iterations == [] and bulk.memory == []
    data = path.read_bytes()
    for engine in ENGINES:
        for chunk_bytes in (61, 1 << 20):  # many block boundaries, and one block
            assert _facts(_bulk_path(data, chunk_bytes=chunk_bytes, engine=engine)) == _facts(_line_path(data))


def _bulk_with_timers(data: bytes, options: ParseOptions = OPTIONS, chunk_bytes: int = 1 << 20,
                      engine: str = "compiled") -> tuple[ParsedLog, list[TimerRecord]]:
    collector, timers = LogCollector(summary_only=True), []
    sink = _ForwardingSink(collector, None, timers.append)
    collector.end_source(read_bulk(sink, LineParser("f.log", options), io.BytesIO(data), chunk_bytes=chunk_bytes,
                                   engine=engine, keep_timers=True))
    return collector.finish(), timers


TIMED_FIXTURES = [path for path in FIXTURES if b"...: (" in path.read_bytes() or b"time (ms) |" in path.read_bytes()]


@pytest.mark.parametrize("path", TIMED_FIXTURES, ids=lambda p: p.name)
def test_bulk_reading_that_keeps_timers_gives_the_line_paths_timers_and_summary(path: Path):
    data = path.read_bytes()
    expected = _line_path(data)
    assert expected.timers  # the fixture prints Megatron's timers
    for engine in ENGINES:
        for chunk_bytes in (61, 1 << 20):
            log, timers = _bulk_with_timers(data, chunk_bytes=chunk_bytes, engine=engine)
            assert timers == expected.timers, engine
            assert _facts(log) == _facts(expected), engine


def test_the_compiled_engine_skips_timer_lines_unless_they_are_kept():
    data = "".join(
        f" [2026-01-01 00:00:{it:02d}] " + CANONICAL.format(it=it, total=100, cs=it * 128, ms="9000.5", tf="744.0",
                                                          loss="7.0E+00", skipped=0, nan=0)
        + "\n(min, max) time across ranks (ms):\n    forward-backward ...............................: (9000.12, "
        "9010.34)\n    optimizer ......................................: (40.01, 41.22)\n" for it in range(1, 31)
    ).encode()
    skipped, kept = LogCollector(summary_only=True), []
    read_bulk(_ForwardingSink(skipped, kept.append), LineParser("f.log", OPTIONS), io.BytesIO(data), engine="compiled")
    assert not any(isinstance(record, TimerRecord) for record in kept)  # inert in the summary: not parsed
    log, timers = _bulk_with_timers(data)
    assert len(timers) == 60 and timers == _line_path(data).timers
    assert _facts(log) == _facts(_line_path(data))


def test_bulk_reading_takes_the_shape_from_the_arguments_block():
    path = DATA / "synthetic_megatron_arguments.log"  # SYNTHETIC; its iteration lines print no tokens/s
    bulk = parse_logs([path], summary_only=True)
    assert _facts(bulk) == _facts(parse_logs([path]))
    assert bulk.arguments == parse_logs([path]).arguments and bulk.arguments is not None
    assert bulk.summary.tokens_per_s_per_gpu_mean is not None
    data = path.read_bytes()
    for engine in ENGINES:
        assert _facts(_bulk_path(data, ParseOptions(), 61, engine)) == _facts(_line_path(data, ParseOptions()))


def _iteration(draw, iteration: int) -> str:
    values = {
        "it": iteration, "total": draw(st.sampled_from([100, 10**7])), "cs": iteration * 128,
        "ms": draw(st.sampled_from(["9070.1", "12.0", "9000", "nan", "654.5/735.1"])),
        "tf": draw(st.sampled_from(["744.0", "1.5"])),
        "loss": draw(st.sampled_from(["7.123456E+00", "NAN", "nan", "-inf", "1.2x", "6.5E-01"])),
        "skipped": draw(st.sampled_from(["0", "1"])), "nan": draw(st.sampled_from(["0", "0", "2"])),
    }
    line = CANONICAL.format(**values)
    variant = draw(st.sampled_from(["plain"] * 6 + ["no tflops", "extra loss", "mem usages", "reordered", "tokens",
                                                    "lm loss twice", "trailing", "TFLOPs", "decoupled"]))
    if variant == "no tflops":
        line = line.replace(f"throughput per GPU (TFLOP/s/GPU): {values['tf']} | ", "")
    elif variant == "extra loss":
        line = line.replace("loss scale:", "mtp_1 loss: 2.5E+00 | load_balancing_loss: 1.0E+00 | loss scale:")
    elif variant == "mem usages":
        line = line.replace("learning rate", "mem usages: 0.54 | learning rate")
    elif variant == "reordered":
        line = line.replace(" loss scale: 1.0 |", "").replace("grad norm:", "loss scale: 1.0 | loss: 3.0 | grad norm:")
    elif variant == "tokens":
        line = line.replace("learning rate", "tokens per GPU (tokens/s/GPU): 4000.0 | learning rate")
    elif variant == "lm loss twice":
        line = line.replace("grad norm:", "lm loss: 1.0 | grad norm:")
    elif variant == "trailing":
        line += draw(st.sampled_from(["   ", " lm loss 4.0", "\t", " x"]))
    elif variant == "TFLOPs":
        line = line.replace("learning rate", "TFLOPs: 120.37 | learning rate")
    elif variant == "decoupled":
        line = line.replace("learning rate:", "decoupled learning rate: 1.0E-05 | learning rate:")
    prefix = draw(st.sampled_from([
        "", " ", " [2026-01-01 00:{m:02d}:{s:02d}.{us:06d}] ", "[2026-01-01 00:{m:02d}:{s:02d}] ", "[rank3]: ",
        "[rank-1/8] ", "0: ", "x", "\x1b[32m", "[2026-13-01 00:00:00] ", "INFO 2026-01-01T00:{m:02d}:{s:02d} ",
        "2026-01-01 00:{m:02d}:{s:02d} [2026-01-01 00:{m:02d}:{s:02d}] ", "iteration 1/2 | ",
    ]))
    seconds = iteration * 7
    return prefix.format(m=(seconds // 60) % 60, s=seconds % 60, us=iteration) + line


OTHER_LINES = [
    "", "   ", "[2026-01-01 00:30:00] INFO some chatter", "plain chatter without a time",
    "(min, max) time across ranks (ms):", "    forward-backward ...............................: (9000.12, 9010.34)",
    "    save-checkpoint ................................: (1200.00, 2500.00)",
    "[Rank 0] (after 10 iterations) memory (MB) | allocated: 12345.67 | max allocated: 45678.90 | reserved: 50000.00",
    "[Rank 0] (after 10 iterations) memory (GB) | mem-allocated-gigabytes: 40.12",
    "Step Time : 9.07s GPU utilization: 744.0MODEL_TFLOP/s/GPU",
    "[2026-01-01 00:20:00.000001] saving checkpoint at iteration     100 to /ckpt in torch_dist format",
    "  successfully saved checkpoint from iteration     100 to /ckpt [ t 1/8, p 1/4 ]",
    "  [2026-01-01 00:20:30] successfully saved checkpoint from iteration     100 to /ckpt",
    " loading distributed checkpoint from /ckpt at iteration 40",
    "Traceback (most recent call last):", '  File "megatron/training/checkpointing.py", line 9, in save_checkpoint',
    "    raise RuntimeError('boom')", "RuntimeError: boom",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
               "NCCL INFO Connection closed by localRank 2",
    "[rank3]: NCCL WARN Cuda failure 'unhandled cuda error' failed", "Killed", "[after training is done]",
    "[before the start of training step] datetime: 2026-01-01 00:00:01", "training ...",
    "\x1b[31mERROR\x1b[0m exitcode  : 1", "\x1b[32m[2026-01-01 00:40:00]\x1b[0m INFO coloured",
    "progress  10%\rprogress  50%\rprogress 100%", "\r\r", "abc\r", "caf\xe9 non-ASCII text",
    "iteration count is 5", "step:  3  loss: 12.2674  grad_norm: 3.9375  memory: 240.17GiB(95.31%)  tps: 531",
    "[rank0]:  iteration        2/      10 | elapsed time per iteration (ms): 101.0 | lm loss: 4.9E+00 |",
    # lines the compiled engine skips as inert (timers, allocator memory) next to ones that only look alike
    "[2026-01-01 00:35:00] forward-backward ...............: (9000.12, 9010.34)", "time (ms) | forward: 132.49",
    "time (ms) | save-checkpoint: 1250.0", "[Rank 0] (after 10 iterations) Memory (GB) | allocated: 40.12",
    "  iteration 7/ 10 | not a canonical line", "(after 20 iterations) memory (MB) | max allocated: 45678.90",
    # multi-rank noise: NCCL chatter (skipped by the compiled engine unless it can be more than chatter), Python
    # warnings, progress lines cut by carriage returns (each segment a line of its own for the line path)
    "[2026-01-01 00:36:00,001] [rank7]:node012:4107:4207 [7] NCCL INFO Setting affinity for GPU 7 to ffff,ffff",
    "node012:3:3 [3] NCCL INFO NCCL_SOCKET_IFNAME set by environment to ib0",
    "node012:3:3 [3] NCCL INFO [Service thread] Connection closed by localRank 3",
    "node012:3:3 [3] nccl info Init timings: rank 3 nranks 16 total 0.61 (connect 0.24, rest 0.02) timeout 30",
    "node012:3:3 [3] NCCL INFO Connection failed: timed out after 30 s",
    "node012:3:3 [3] NCCL INFO saving checkpoint at iteration     100 to /ckpt",
    "node012:3:3 [3] NCCL INFO RuntimeError: NCCL INFO is not an error line",
    "node012:3:3 [3] RCCL INFO Channel 00/0 : 3[3] -> 4[4] via P2P/IPC gpu",
    "node012:3:3 [3] NCCL INFO\rnode012:3:3 [3] GPU fault",
    "node012:3:3 [3] NCCL WARN NET/IB : Got completion from peer with error 12",
    # chatter read two bytes at a time: live needles at odd and even offsets and at the very end, in any case
    "node012:3:3 [3] NCCL INFO x error", "node012:3:3 [3] NCCL INFO xx ERROR", "n:3 [3] Nccl Info CheckPoint",
    "n:3 [3] NCCL INFO comm 0x1 rank 3 FAIL", "n:3 [3] NCCL INFO Exception", "n:3 [3] xNCCL INFO iteration 5/ 9 |",
    "n:3 [3] NCCL INFO x [NeMo x", "[2026-01-01 00:41:00] NCCL INFO  step: 4", "NCCL INFO memory (GB)",
    "[2026-01-01 00:42:00] n:3 [3] NCCL INFO Ring 00 : 0 1 2 3", "NCCL INFO Channel 01/0 : 2026-01-01 00:43:00",
    "[rank0]: /usr/lib/python3/dist-packages/torch/autograd/graph.py:825: UserWarning: c10d::allreduce_: an autograd "
    "kernel was not registered", "[rank0]:   return Variable._execution_engine.run_backward(  # Calls into the C++",
    "[2026-01-01 00:37:00] building index  10%\r[2026-01-01 00:38:00] building index 100%",
    "no time\r[2026-01-01 00:39:00] a time in the second segment\r", "x\r\r[2026-01-01 00:39:30] after empties",
]
TRACEBACKS = [  # frames without any needle: only the open traceback sends them to the parser
    ["Traceback (most recent call last):", '  File "megatron/training/arguments.py", line 5, in validate_args',
     "    assert args.hidden_size % args.heads == 0", "AssertionError"],
    ["[rank1]: Traceback (most recent call last):", '[rank1]:   File "megatron/core/datasets/gpt_dataset.py", in x',
     "[rank1]:     return self.index[i]", "[rank1]: IndexOverflowException: past the end"],
    ["Traceback (most recent call last):", '  File "train.py", line 1, in main', "not an exception line",
     '  File "megatron/training/checkpointing.py", line 2, in load_checkpoint', "ValueException: bad shard"],
]
ARGUMENT_BLOCKS = [  # Megatron-LM's start-up block: the shape the parser computes tokens/s from
    ["------------------------ arguments ------------------------",
     "  global_batch_size ............................... 128",
     "  seq_length ...................................... 4096",
     "  world_size ...................................... 8",
     "-------------------- end of arguments ---------------------"],
    ["[rank0]: ------------------------ arguments ------------------------",
     "[rank0]:   seq_length ...................................... 2048", "[rank5]: checkpoint not found, interleaved",
     "[rank0]:   world_size ...................................... 16",
     "[rank0]:   train_iters ..... 7"],  # never closed
]
RAW_LINES = [b"bad bytes \xff\xfe\xc3 in a line", b"[2026-01-01 00:50:00] \xe9t\xe9 latin-1", b"\x00\x01 control",
             b"\x00" * 40 + b" [2026-01-01 00:51:00] " + CANONICAL.format(  # a crash's NUL run, then the next write
                 it=7, total=10**7, cs=896, ms="9000.5", tf="744.0", loss="7.0E+00", skipped=0, nan=0).encode()]


@st.composite
def noisy_logs(draw) -> bytes:
    lines: list[bytes] = []
    iteration = draw(st.integers(0, 5))
    if draw(st.booleans()):  # past the warm-up head (50 rows), where the compiled engine folds rows in C
        lines = [CANONICAL.format(it=it, total=10**7, cs=it * 128, ms=f"{9000 + it % 7}.5", tf="744.0",
                                  loss="7.0E+00", skipped=0, nan=0).encode() for it in range(1, 56)]
        iteration += 55
    for _ in range(draw(st.integers(0, 60))):
        kind = draw(st.sampled_from(["iteration"] * 4 + ["other"] * 3 + ["raw", "resume", "traceback", "arguments"]))
        if kind == "resume":
            iteration = max(0, iteration - draw(st.integers(1, 10)))  # replayed iterations are not counted twice
        elif kind == "iteration":
            iteration += draw(st.integers(0, 2))
            lines.append(_iteration(draw, iteration).encode())
        elif kind == "traceback":
            lines.extend(line.encode() for line in draw(st.sampled_from(TRACEBACKS)))
        elif kind == "arguments":
            lines.extend(line.encode() for line in draw(st.sampled_from(ARGUMENT_BLOCKS)))
        elif kind == "other":
            lines.append(draw(st.sampled_from(OTHER_LINES)).encode("utf-8"))
        else:
            lines.append(draw(st.sampled_from(RAW_LINES)))
    data = b"\n".join(lines)
    ending = draw(st.sampled_from(["newline", "truncated", "none", "crlf"]))
    if ending == "newline":
        data += b"\n"
    elif ending == "truncated" and data:
        data = data[: draw(st.integers(0, len(data)))]  # the last line cut anywhere, no final newline
    elif ending == "crlf":
        data = data.replace(b"\n", b"\r\n") + b"\r\n"
    return data


@settings(max_examples=300, deadline=None)
@given(data=noisy_logs(), chunk_bytes=st.sampled_from([17, 300, 1 << 20]),
       options=st.sampled_from([OPTIONS, ParseOptions()]))
def test_bulk_reading_matches_the_line_path_on_noisy_logs(data: bytes, chunk_bytes: int, options: ParseOptions):
    line_path = _line_path(data, options)
    expected = _facts(line_path)
    for engine in ENGINES:
        assert _facts(_bulk_path(data, options, chunk_bytes, engine)) == expected, engine
        log, timers = _bulk_with_timers(data, options, chunk_bytes, engine)
        assert (_facts(log), timers) == (expected, line_path.timers), engine


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=3000))
def test_bulk_reading_matches_the_line_path_on_random_bytes(data: bytes):
    expected = _facts(_line_path(data))
    for engine in ENGINES:
        assert _facts(_bulk_path(data, chunk_bytes=50, engine=engine)) == expected, engine


@pytest.mark.parametrize("engine", ENGINES)
def test_canonical_iteration_lines_skip_the_line_parser(tmp_path: Path, engine: str, monkeypatch: pytest.MonkeyPatch):
    """The point of bulk reading: a Megatron-LM log's iteration and chatter lines never reach `feed`."""
    lines = []
    for iteration in range(1, 201):
        lines.append(f" [2026-01-01 00:{iteration // 60 % 60:02d}:{iteration % 60:02d}] " + CANONICAL.format(
            it=iteration, total=1000, cs=iteration * 128, ms=f"{9000 + iteration % 7}.0", tf="744.0",
            loss="7.0E+00", skipped=0, nan=0))
        lines.append("[2026-01-01 00:00:00] INFO chatter the parser has nothing to say about")
        if iteration % 50 == 0:
            lines.append(f"[2026-01-01 00:20:00] saving checkpoint at iteration {iteration:7d} to /ckpt")
    log_file = tmp_path / "train.log"
    log_file.write_text("\n".join(lines) + "\n")
    fed: list[int] = []
    original_feed = LineParser.feed

    def counting_feed(self, line_no, text):
        fed.append(line_no)
        return original_feed(self, line_no, text)

    monkeypatch.setenv("MEGAPILOT_LOG_ENGINE", engine)
    monkeypatch.setattr(LineParser, "feed", counting_feed)
    bulk = parse_logs([log_file], summary_only=True)
    monkeypatch.setattr(LineParser, "feed", original_feed)
    assert len(fed) == 4  # the checkpoint lines only
    assert bulk.summary.iterations_counted == 200 and bulk.checkpoints[0].iteration == 50
    assert _facts(bulk) == _facts(parse_logs([log_file]))


def test_fast_iteration_regex_takes_only_whole_canonical_lines():
    line = CANONICAL.format(it=2, total=20, cs=32, ms="658.3", tf="1441.4", loss="1.250274E+01", skipped=0, nan=0)
    found = FAST_ITERATION_RE.search((" [2026-01-01 00:00:01] " + line + "\n").encode())
    assert found is not None and found.groups() == (b"2", b"20", b"658.3", b"1441.4", b"128",
                                                    b"1.250274E+01", b"0", b"0")
    for variant in (line.replace("658.3 |", "654.5/735.1 |"), line.replace("658.3 |", "658.3 | mem usages: 0.54 |"),
                    line.replace("1.250274E+01", "1.2x"), line + " lm loss 3.0", line.replace("grad norm", "lm loss")):
        assert FAST_ITERATION_RE.search((variant + "\n").encode()) is None, variant


@pytest.mark.parametrize("engine", ENGINES)
def test_long_run_with_saves_and_a_resume_gives_the_same_summary(engine: str):
    """Past the warm-up cap (50) and the percentile reservoir (8192): the batched statistics are the same floats."""
    lines = []
    for iteration in [*range(1, 6001), *range(5800, 9501)]:  # a resume replays 200 iterations
        seconds = iteration * 9
        lines.append(f" [2026-01-01 {seconds // 3600 % 24:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}] "
                     + CANONICAL.format(it=iteration, total=10**5, cs=iteration * 128,
                                        ms=f"{9000 + iteration % 97 * 1.7:.1f}",
                                        tf=f"{744 - iteration % 11 * 0.3:.1f}", loss=f"{7 - iteration * 1e-4:.6E}",
                                        skipped=0, nan=int(iteration % 1000 == 0)))
        if iteration % 700 == 0:
            lines.append(f"saving checkpoint at iteration {iteration:7d} to /ckpt")
    data = ("\n".join(lines) + "\n").encode()
    bulk, full = _bulk_path(data, engine=engine), _line_path(data)
    assert _facts(bulk) == _facts(full)
    assert bulk.summary.iterations_counted == 9500 and bulk.summary.checkpoint_dropped > 0


@pytest.mark.parametrize("engine", ENGINES)
def test_a_save_without_timestamp_is_timed_from_the_iteration_line_before_it(engine: str):
    """The earlier summary-only path lost this (duration None, wall time None): iteration lines set the time."""
    line = CANONICAL.format(it=1, total=100, cs=128, ms="900.0", tf="1.5", loss="7.0E+00", skipped=0, nan=0)
    data = "\n".join([f" [2026-01-01 00:00:10] {line}",
                      f" [2026-01-01 00:00:20] {line.replace('       1/', '       2/')}",
                      "saving checkpoint at iteration 2 to /ckpt",
                      " [2026-01-01 00:00:50] successfully saved checkpoint from iteration 2 to /ckpt",
                      "[no time here] " + line.replace("       1/", "       3/")]).encode()
    bulk = _bulk_path(data, engine=engine)
    assert bulk.checkpoints[0].duration_s == 30.0 and bulk.summary.wall_time_s == 10.0
    assert _facts(bulk) == _facts(_line_path(data))


@pytest.mark.parametrize("engine", ENGINES)
def test_multi_rank_noise_skips_the_line_parser(tmp_path: Path, engine: str, monkeypatch: pytest.MonkeyPatch):
    """On a multi-rank log (NCCL chatter every other line, rank and timestamp prefixes, Python warnings, progress
    lines with carriage returns) the compiled engine hands the line parser nothing but the lines that can hold a
    record or a failure: here the checkpoint line and the NCCL line that reports a failure."""
    chatter = ["NCCL INFO Channel 05/0 : 3[3] -> 11[3] [send] via NET/IB/3/GDRDMA",
               "NCCL INFO Setting affinity for GPU 3 to ffff,ffffffff", "NCCL INFO Connected all rings",
               "NCCL INFO NCCL_SOCKET_IFNAME set by environment to ib0",
               "NCCL INFO [Service thread] Connection closed by localRank 3",
               "NCCL INFO Init timings: rank 3 nranks 64 total 0.61 (kernels 0.17, connections 0.24, rest 0.02)"]
    lines = []
    for iteration in range(1, 201):
        stamp = f"2026-01-01 00:{iteration // 60 % 60:02d}:{iteration % 60:02d}"
        lines.append(f"[{stamp},001] [rank{iteration % 64}]:node{iteration % 8:03d}:41{iteration % 8:02d}:42 "
                     f"[{iteration % 8}] {chatter[iteration % len(chatter)]}")
        lines.append(f"[rank63]: [{stamp}] " + CANONICAL.format(
            it=iteration, total=1000, cs=iteration * 128, ms=f"{9000 + iteration % 7}.0", tf="744.0",
            loss="7.0E+00", skipped=0, nan=0))
        if iteration % 40 == 0:
            lines.append(f"[rank{iteration % 64}]: /usr/lib/python3/dist-packages/torch/autograd/graph.py:825: "
                         "UserWarning: an autograd kernel was not registered to the Autograd key(s)")
            lines.append(f"[rank{iteration % 64}]:   return Variable._execution_engine.run_backward(")
            lines.append(f"[{stamp}] building  10%\r[{stamp}] building  60%\r[{stamp}] building 100%")
    lines.insert(300, "[2026-01-01 00:02:30] saving checkpoint at iteration     150 to /ckpt")
    lines.insert(100, "node003:4103:4203 [3] NCCL INFO Call to connect failed: Connection refused")
    log_file = tmp_path / "train.log"
    log_file.write_text("\n".join(lines) + "\n")
    fed: list[str] = []
    original_feed = LineParser.feed

    def counting_feed(self, line_no, text):
        fed.append(text)
        return original_feed(self, line_no, text)

    monkeypatch.setenv("MEGAPILOT_LOG_ENGINE", engine)
    monkeypatch.setattr(LineParser, "feed", counting_feed)
    bulk = parse_logs([log_file], summary_only=True)
    monkeypatch.setattr(LineParser, "feed", original_feed)
    if engine == "compiled":
        assert fed == [lines[100], lines[301]]
    else:  # the Python engine's needle regex sends every chatter line and every `\r` segment to the parser
        assert len(fed) > 200
    assert bulk.summary.iterations_counted == 200
    assert _facts(bulk) == _facts(parse_logs([log_file]))


def _lines_fed(data: bytes, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The lines the compiled engine hands to the line parser (summary-only), in order."""
    fed: list[str] = []
    original_feed = LineParser.feed

    def counting_feed(self, line_no, text):
        fed.append(text)
        return original_feed(self, line_no, text)

    with monkeypatch.context() as patch:
        patch.setattr(LineParser, "feed", counting_feed)
        _bulk_path(data, engine="compiled")
    return fed


def test_every_needle_live_on_chatter_is_found_at_any_offset_and_in_any_case(monkeypatch: pytest.MonkeyPatch):
    """The chatter filter tests two chosen 4-byte windows of each needle at every second position: a needle that can
    make an NCCL INFO line more than chatter reaches the parser wherever it starts, in any case; `fail` (which makes
    the line no chatter, so its trigger words count) too."""
    live = [needle for needle in PARSER_NEEDLES
            if needle not in CHATTER_INERT_TRIGGERS and needle not in SUMMARY_INERT_NEEDLES]
    lines = []
    for needle in live:
        for pad in range(4):
            for text in (needle, needle.upper()):
                lines.append(f"[2026-01-01 00:00:01,001] [rank3]:node003:4103:4203 [3] NCCL INFO {'x' * pad}{text} ok")
    for pad in range(4):
        lines.append(f"node003:4103:4203 [3] NCCL INFO {'x' * pad}FaIl to connect the socket")
    quiet = [f"node003:4103:4203 [3] NCCL INFO {'x' * pad}Connected the socket of rank 3 via NET/IB/0"
             for pad in range(4)]
    data = ("\n".join(lines + quiet) + "\n").encode()
    assert _lines_fed(data, monkeypatch) == lines
    assert _facts(_bulk_path(data)) == _facts(_line_path(data))


@settings(max_examples=150, deadline=None)
@given(data=noisy_logs(), chunk_bytes=st.sampled_from([17, 300, 1 << 20]))
def test_the_portable_line_pass_reads_as_the_vector_one(data: bytes, chunk_bytes: int):
    """The compiled scanner's first pass over a line runs 32 bytes a step where the CPU has AVX2, else 8 bytes a step:
    both give the line path's answer."""
    expected = _facts(_line_path(data))
    was = _scan.use_vectors(False)
    try:
        assert _facts(_bulk_path(data, chunk_bytes=chunk_bytes)) == expected
    finally:
        _scan.use_vectors(was)
    assert _facts(_bulk_path(data, chunk_bytes=chunk_bytes)) == expected


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name)
def test_a_line_waiting_for_its_newline_is_judged_as_the_end_would_read_it(path: Path, engine: str):
    # a live reader (the suite's fatal watch) asks for the records of the unfinished line as if the stream ended
    # there; the answer is the end's, and asking changes nothing of what the reader reads next
    data = path.read_bytes()
    for cut in sorted({len(data) // 3, len(data) // 2, len(data) - 1, len(data) - 2}):
        head = data[:cut]
        collector = LogCollector(summary_only=True)
        reader = BulkReader(collector, LineParser("f.log", OPTIONS), engine)
        reader.feed(head)
        judged = reader.records_if_ended()
        ended = LogCollector(summary_only=True)
        ended.end_source(read_bulk(ended, LineParser("f.log", OPTIONS), io.BytesIO(head), engine=engine))
        assert ended.log.errors[:len(collector.log.errors)] == collector.log.errors
        assert [r for r in judged if isinstance(r, ErrorRecord)] == ended.log.errors[len(collector.log.errors):]
        if head.endswith(b"\n"):
            assert judged == []
        reader.feed(data[cut:])
        collector.end_source(reader.end())
        assert _facts(collector.finish()) == _facts(_bulk_path(data, engine=engine))


@pytest.mark.parametrize("engine", ENGINES)
def test_a_progress_bar_run_on_one_line_is_read_to_its_last_update(tmp_path: Path, engine: str):
    # NeMo 1.x / Lightning's tqdm ends every update with `\r`, never a newline: the whole run is one line of
    # megabytes; its last step, its last finite loss (past the first MiB) and the OOM after it are all read, as the
    # line path reads them
    progress = ("Epoch 0: :    0%|          | {n}/77225 [00:41<878:01:48, 41.36s/it, loss=3.1, v_num=, "
                "reduced_train_loss={loss}, global_step={step}.0, consumed_samples=2.05e+03, "
                "train_step_timing in s=41.21]")
    updates = [progress.format(n=step + 1, step=step, loss="nan" if step >= 15_000 else f"{3.19 - step * 1e-5:.3f}")
               for step in range(20_000)]
    log = tmp_path / "train.log"
    log.write_text("\r".join(updates) + "\nTraceback (most recent call last):\n"
                   "  File \"train.py\", line 9, in <module>\n"
                   "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n")
    data = log.read_bytes()
    assert data.index(b"reduced_train_loss=nan") > 1 << 20
    with open(log, "rb") as stream:  # a file: the compiled engine reads it into its reused buffer
        collector = LogCollector(summary_only=True)
        collector.end_source(read_bulk(collector, LineParser("f.log", OPTIONS), stream, engine=engine))
    parsed = collector.finish()
    assert (parsed.summary.iterations_logged, parsed.summary.last_iteration) == (20_000, 19_999)
    assert parsed.summary.final_loss == 3.04  # step 14,999's, the last before the loss turned NaN
    assert [(error.line, error.signature) for error in parsed.errors] == [(4, "torch_oom")]
    line_path = LogCollector()
    _feed(line_path, LineParser("f.log", OPTIONS), read_lines(io.BytesIO(data)), None)
    assert _facts(parsed) == _facts(line_path.finish()) == _facts(_bulk_path(data, chunk_bytes=300_007, engine=engine))
