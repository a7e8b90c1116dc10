"""What diagnose keeps of a log: everything while the log is short, a bounded series with every anomaly when long."""

from __future__ import annotations

import math
from itertools import pairwise
from pathlib import Path

import pytest

from megapilot.diagnose import diagnose
from megapilot.diagnose.engine import diagnose_log, parse_for_rules
from megapilot.diagnose.series import HEAD, TAIL, RuleRecords
from megapilot.logs import parse_logs
from megapilot.logs.records import IterationRecord

DATA = Path(__file__).resolve().parents[1] / "data" / "logs"
SHORT_LOGS = ["synthetic_loss_spike.log", "synthetic_slowdown.log", "synthetic_nan_loss_vanishes.log",
              "synthetic_stall_between_iterations.log", "synthetic_megatron_core016_full.log",
              "real/04_low_throughput_mixtral_h100_130tflops.log",
              "real/35_hip_oom_primus_torchtitan_mi350_step_then_crash.log"]


@pytest.mark.parametrize("name", SHORT_LOGS)
def test_a_log_within_the_capacity_keeps_every_record_the_rules_read(name: str):
    full, kept = parse_logs([DATA / name]), parse_for_rules([str(DATA / name)], None)
    def facts(log):  # as dicts: a NaN loss is "nan" there (NaN != NaN would fail a plain comparison)
        return [[r.to_dict() for r in records] for records in (log.iterations, log.memory, log.markers, log.errors)]

    assert facts(kept) == facts(full) and kept.summary.to_dict() == full.summary.to_dict()
    assert [f.to_dict() for f in diagnose_log(kept, None).findings] == [
        f.to_dict() for f in diagnose_log(full, None).findings]


def _record(iteration: int, *, step_ms: float = 1000.0, loss: float | None = 3.0, time_s: float | None = None,
            nan_iterations: int = 0) -> IterationRecord:
    losses = {} if loss is None else {"lm loss": loss}
    return IterationRecord(file="train.log", line=iteration, text=f" iteration {iteration}", dialect="megatron-lm",
                           iteration=iteration, elapsed_ms=step_ms, losses=losses,
                           time_s=float(iteration) if time_s is None else time_s, nan_iterations=nan_iterations)


def test_a_long_series_is_bounded_evenly_decimated_and_keeps_head_tail_and_every_anomaly():
    kept = RuleRecords(capacity=512)
    anomalies = {30_000: {"loss": math.nan}, 50_000: {"loss": 30.0}, 70_000: {"loss": None},
                 80_000: {}, 90_000: {"nan_iterations": 1}}  # 80 000: logged 900 s late (a stall)
    for iteration in range(1, 100_001):
        stalled_s = 900.0 if iteration >= 80_000 else 0.0
        kept.add(_record(iteration, time_s=iteration + stalled_s, **anomalies.get(iteration, {})))
        assert len(kept._kept) <= 512 + 1
    iterations = [r.iteration for r in kept.fill(parse_logs([])).iterations]
    assert iterations == sorted(set(iterations)) and len(iterations) <= 512 + TAIL + 1
    assert iterations[:HEAD] == list(range(1, HEAD + 1))
    assert iterations[-TAIL:] == list(range(100_001 - TAIL, 100_001))
    for iteration in anomalies:  # each anomaly with the record before it (an exact interval for the rules)
        assert iteration in iterations and iteration - 1 in iterations
    ordinary = [i for i in iterations
                if HEAD < i < 100_001 - TAIL and i not in anomalies and i + 1 not in anomalies]
    assert len({b - a for a, b in pairwise(ordinary)}) == 1  # one stride: evenly spaced


def test_findings_of_a_long_log_match_the_full_parse(tmp_path: Path):
    """50 000 iterations (beyond the capacity), a NaN in the middle and a slow drift: the same categories and the
    same NaN evidence from the bounded parse as from keeping every record."""
    line = (" [2026-01-01 {h:02d}:{m:02d}:{s:02d}] iteration {it:8d}/   50000 | consumed samples: {cs:12d} | "
            "elapsed time per iteration (ms): {ms:.1f} | learning rate: 1.0E-04 | global batch size:   128 | "
            "lm loss: {loss} | loss scale: 1.0 | grad norm: 1.000 | number of skipped iterations:   0 | "
            "number of nan iterations:   0 |\n")
    log = tmp_path / "long.log"
    with open(log, "w") as out:
        for it in range(1, 50_001):
            seconds = it // 2
            out.write(line.format(h=(seconds // 3600) % 24, m=(seconds // 60) % 60, s=seconds % 60, it=it,
                                  cs=it * 128, ms=400.0 + it * 0.01 + (it % 7),
                                  loss="nan" if it == 31_337 else f"{5.0 - it * 1e-5:.6E}"))
    full = diagnose_log(parse_logs([log]), None).findings
    bounded = diagnose([log])
    assert len(bounded.log.iterations) < 5_000
    assert [f.category for f in bounded.findings] == [f.category for f in full] == ["nan_loss", "slowdown"]
    assert bounded.findings[0].evidence == full[0].evidence and "31337" in bounded.findings[0].title
