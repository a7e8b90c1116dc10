"""Diagnose reads canonical iteration lines in bulk and builds records only for what it keeps: the findings, the
story, the summary and every kept record are those of feeding every line to the line parser."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import pytest

from megapilot.diagnose.engine import diagnose_log, parse_for_rules
from megapilot.diagnose.series import RuleRecords
from megapilot.logs import ParsedLog, ParseOptions
from megapilot.logs.bulk import RowLine

DATA = Path(__file__).resolve().parents[1] / "data" / "logs"
FIXTURES = sorted(str(path) for path in DATA.rglob("*") if path.is_file() and path.suffix != ".md")
START_S = 1_767_225_600  # 2026-01-01 00:00:00 UTC


def _facts(log: ParsedLog) -> dict[str, Any]:
    """Everything the parse hands the rules, as JSON values (a NaN loss is "nan" there: NaN != NaN)."""
    return {**log.to_dict(), "lines_read": log.lines_read, "last_line": log.last_line,
            "last_time_s": log.last_time_s, "errors_dropped": log.errors_dropped, "frame_hints": log.frame_hints}


def _assert_same_diagnosis(paths: list[str], options: ParseOptions | None = None) -> ParsedLog:
    reference, bulk = parse_for_rules(paths, options, bulk=False), parse_for_rules(paths, options, bulk=True)
    assert _facts(bulk) == _facts(reference)
    expected, got = diagnose_log(reference, None), diagnose_log(bulk, None)
    assert got.to_dict() == expected.to_dict()  # findings, story, summary, notes
    assert [f.to_dict() for f in got.findings] == [f.to_dict() for f in expected.findings]
    assert [[e.line for e in f.evidence] for f in got.findings] == [[e.line for e in f.evidence]
                                                                    for f in expected.findings]
    assert got.story == expected.story
    return bulk


@pytest.mark.parametrize("path", FIXTURES, ids=lambda path: str(Path(path).relative_to(DATA)))
def test_every_log_fixture_diagnoses_the_same_read_in_bulk(path: str):
    _assert_same_diagnosis([path])


def test_the_log_fixtures_read_as_one_run_diagnose_the_same():
    _assert_same_diagnosis(FIXTURES)


# ---- generated long logs ------------------------------------------------------------------------------------
ARGUMENTS = ("[rank0]: ------------------------ arguments ------------------------\n"
             "[rank0]:   global_batch_size ............................... 128\n"
             "[rank0]:   seq_length ...................................... {seq}\n"
             "[rank0]:   world_size ...................................... 8\n"
             "[rank0]: -------------------- end of arguments ---------------------\n")
TIMERS = ("(min, max) time across ranks (ms):\n"
          "    forward-backward ...............................: (9000.12, 9010.34)\n"
          "[Rank 0] (after {it} iterations) memory (MB) | allocated: 12345.67 | max allocated: {peak:.2f} | "
          "reserved: 50000.00 | max reserved: 52000.00\n")
SAVE = ("{stamp} saving checkpoint at iteration {it:7d} to /ckpt in torch_dist format\n"
        "  {stamp} successfully saved checkpoint from iteration {it:7d} to /ckpt [ t 1/8, p 1/4 ]\n")
FAILURE = ("{stamp} [rank3]:[E ProcessGroupNCCL.cpp:616] [Rank 3] Watchdog caught collective operation timeout: "
           "WorkNCCL(SeqNum=1234, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600041 milliseconds "
           "before timing out.\n"
           "Traceback (most recent call last):\n"
           '  File "/workspace/megatron/training/training.py", line 1200, in train_step\n'
           "torch.distributed.DistBackendError: NCCL communicator was aborted on rank 3.\n")


def _stamp(time_s: float) -> str:
    seconds = int(time_s)
    return (f"[2026-01-{1 + seconds // 86400 % 28:02d} {seconds // 3600 % 24:02d}:{seconds // 60 % 60:02d}:"
            f"{seconds % 60:02d}.{int(time_s * 1e6) % 1_000_000:06d}]")


def _fields(it: int, rng: random.Random) -> tuple[str, str]:
    """The loss and grad norm fields of iteration `it`, with NaNs, spikes and a loss that vanishes mixed in."""
    loss = 7.0 - it * 4e-5 + rng.uniform(-0.02, 0.02)
    if it % 997 == 0:
        loss *= 1.8  # a spike
    elif it % 1499 == 0:
        loss = math.inf
    loss_field = "" if 4200 <= it % 9000 <= 4203 else f" lm loss: {'nan' if it % 2503 == 0 else f'{loss:.6E}'} |"
    grad_norm = "nan" if it % 3001 == 0 else f"{1.0 + rng.random():.3f}"
    return loss_field, f" loss scale: 1.0 | grad norm: {grad_norm} |"


def _iteration_line(it: int, total: int, time_s: float, rng: random.Random) -> str:
    loss_field, norms = _fields(it, rng)
    extra = ""
    if it % 1201 == 0:
        extra = " mtp_1 loss: inf |"  # another loss NaN/Inf: the row cannot tell, the record is built
    elif it % 701 == 0:
        extra = " info tokens: 3 |"  # a doubt (`inf`) that is no anomaly
    elif it % 1777 == 0:
        extra = f" mem usages: {0.9 + rng.random() * 0.09:.4f} |"  # not canonical: the line parser reads it
    nan_count = 1 if it % 4001 == 0 else 0
    stamp = "" if it % 509 == 0 else _stamp(time_s)
    line = (f"{stamp} iteration {it:8d}/{total:8d} | consumed samples: {it * 128:12d} | "
            f"elapsed time per iteration (ms): {9000.0 + rng.random() * 100:.1f} | "
            f"throughput per GPU (TFLOP/s/GPU): {740 + rng.random() * 8:.1f} | learning rate: 1.500000E-04 | "
            f"global batch size:   128 |{loss_field}{norms}{extra} number of skipped iterations:   0 | "
            f"number of nan iterations: {nan_count:3d} |\n")
    if it % 613 == 0:
        line = "\x1b[32m" + line  # ANSI: the line parser reads it
    if it % 887 == 0:
        line = f"{stamp} [rank-7/8] [INFO] [training.py:100] : " + line.removeprefix(stamp).lstrip()
    return line


def _write_log(path: Path, iterations: int, seed: int) -> None:
    rng = random.Random(seed)
    time_s = float(START_S)
    with open(path, "w") as out:
        out.write(ARGUMENTS.format(seq=4096))
        for it in range(1, iterations + 1):
            time_s += 9.0 + rng.random() + (400.0 if it % 3331 == 0 else 0.0)  # a stall now and then
            if it == iterations // 2:
                out.write(ARGUMENTS.format(seq=8192))  # a restart with another shape: tokens/s/GPU changes
            if it == iterations * 3 // 4:
                out.write("Step Time : 9.07s GPU utilization: 744.0MODEL_TFLOP/s/GPU\n")  # Megatron-Bridge from here
            out.write(_iteration_line(it, iterations, time_s, rng))
            if it % 100 == 0:
                out.write(TIMERS.format(it=it, peak=45000.0 + rng.random() * 30000.0))
            if it % 2500 == 0:
                out.write(SAVE.format(stamp=_stamp(time_s), it=it))
        out.write(FAILURE.format(stamp=_stamp(time_s + 600.0)))


@pytest.mark.parametrize(("iterations", "options"), [
    (10_000, None), (10_000, ParseOptions(seq_length=2048, world_size=16, global_batch_size=256)), (60_000, None),
])
def test_a_long_generated_log_diagnoses_the_same_and_builds_few_records(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, iterations: int, options: ParseOptions | None):
    log = tmp_path / "train.log"
    _write_log(log, iterations, seed=iterations)
    rows, built = [0], [0]
    add_row, record = RuleRecords.add_row, RowLine.record

    def counting_add_row(self: RuleRecords, line: RowLine) -> None:
        rows[0] += 1
        add_row(self, line)

    def counting_record(self: RowLine) -> Any:
        built[0] += 1
        return record(self)

    monkeypatch.setattr(RuleRecords, "add_row", counting_add_row)
    monkeypatch.setattr(RowLine, "record", counting_record)
    parsed = _assert_same_diagnosis([str(log)], options)
    categories = {finding.category for finding in diagnose_log(parsed, None).findings}
    assert {"nan_loss", "loss_spike"} <= categories
    assert rows[0] > 0.95 * iterations  # nearly every iteration line was read in bulk ...
    assert built[0] < 0.2 * rows[0] or iterations <= 10_000  # ... and most of them never became a record
