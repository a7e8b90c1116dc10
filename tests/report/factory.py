"""A realistic two-combo suite result, and a run directory holding it, for the report tests.

Combo 0 (MBS=1,GBS=8,BF16) passed: curves, a prediction, metrics that PASS and RECORD and one optional
metric SKIPPED. Combo 1 (MBS=2,GBS=16,FP8) ran out of memory at iteration 7: a FAIL metric, an OOM
finding with evidence, and a log tail that holds hostile text (`<script>`, `</td>`, an ANSI colour
code), as a real log may. Lifecycle stages of every verdict, a regression, notes.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone
from pathlib import Path

from megapilot.logs.records import Evidence
from megapilot.spec import LayoutPins, Prediction
from megapilot.suite.results import (
    NOT_RUN_REASON,
    ComboResult,
    Curve,
    Finding,
    JobSummary,
    MetricRow,
    Regression,
    RunCard,
    StageResult,
    SuiteResult,
    Verdict,
)

PASSING = "MBS=1,GBS=8,PRECISION=BF16"
FAILING = "MBS=2,GBS=16,PRECISION=FP8"
HOSTILE_LINE = "[rank0]: <script>window.__xss = 1; document.title = 'pwned'</script></td></tr></table> oops"
ANSI_LINE = "\x1b[31mERROR\x1b[0m torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
START = datetime(2026, 3, 2, 9, 0, 0, tzinfo=timezone.utc)


def _at(seconds: float) -> datetime:
    return START + timedelta(seconds=seconds)


def _iteration_line(step: int, total: int, step_ms: float, loss: float, tokens: float) -> str:
    return (f" [2026-03-02 09:01:{step:02d}] iteration {step:8d}/{total:8d} | consumed samples: {step * 8:10d} | "
            f"elapsed time per iteration (ms): {step_ms:.1f} | throughput per GPU (TFLOP/s/GPU): 41.2 | "
            f"tokens/s/GPU: {tokens:.0f} | learning rate: 1.000000E-04 | global batch size:     8 | "
            f"lm loss: {loss:.6E} | loss scale: 1.0 | grad norm: 1.234 | number of skipped iterations:   0 | "
            f"number of nan iterations:   0 |")


def _curves(iterations: int, *, base_ms: float, tokens: float) -> list[Curve]:
    steps = range(1, iterations + 1)
    loss = [(i, 10.8 - 2.5 * math.log1p(i) / math.log1p(20)) for i in steps]
    step_ms = [(i, base_ms * (3.0 if i == 1 else 1.0 + 0.01 * (i % 3))) for i in steps]
    tokens_curve = [(i, tokens * ms_first / ms) for (i, ms), ms_first in zip(step_ms, [base_ms] * iterations,
                                                                             strict=False)]
    return [Curve(name="loss", points=loss), Curve(name="step_time_ms", unit="ms", points=step_ms),
            Curve(name="tokens_per_s_per_gpu", unit="tokens/s", points=tokens_curve),
            Curve(name="tflops_per_gpu", unit="TFLOP/s", points=[(i, 41.2) for i in steps])]


def passing_combo() -> ComboResult:
    return ComboResult(
        key=PASSING, directory="MBS=1,GBS=8,PRECISION=BF16", verdict=Verdict.PASS, backend="megapilot",
        layout=LayoutPins(tp=1, pp=1, cp=1, ep=1, mbs=1), gbs=8, precision="BF16", seq_length=1024, nodes=1,
        gpus_per_node=2, train_iters=20,
        command="torchrun --nproc-per-node 2 -m megapilot.trainer --micro-batch-size 1 --global-batch-size 8",
        metrics=[
            MetricRow(name="training.throughput_per_gpu", value=41.2, unit="TFLOP/s", threshold=">= 35", kind="min",
                      verdict=Verdict.PASS, margin_pct=17.7),
            MetricRow(name="training.tokens_per_gpu", value=3650.0, unit="tokens/s", threshold=">= 3000",
                      kind="min_tok_s", verdict=Verdict.PASS, margin_pct=21.7),
            MetricRow(name="training.elapsed_time_per_iteration", value=1122.0, unit="ms", threshold="<= 1500 ms",
                      kind="max_ms", verdict=Verdict.PASS, margin_pct=25.2),
            MetricRow(name="training.memory_gib", value=52.5, unit="GiB", verdict=Verdict.RECORD,
                      reason="not gated"),
            MetricRow(name="training.lm_loss", value=8.31, unit="", threshold="info", kind="info",
                      verdict=Verdict.RECORD, reason="info: recorded, never gated"),
            MetricRow(name="training.grad_norm", value=None, unit="", threshold="<= 5", kind="max",
                      verdict=Verdict.SKIPPED, reason="optional metric missing from the log"),
        ],
        curves=_curves(20, base_ms=1100.0, tokens=3700.0),
        predicted=Prediction(step_time_ms=1050.0, tokens_per_s_per_gpu=3900.0, tflops_per_gpu=44.0, mfu_pct=44.5,
                             memory_gib=49.0, note="estimator: Megatron FLOPs convention, H100 SXM dense BF16 peak"),
        job=JobSummary(executor="local", job_id="4711", state="COMPLETED", exit_code=0, iterations_reached=20,
                       train_iters=20, duration_s=61.5, logs=["MBS=1,GBS=8,PRECISION=BF16/out-node0/training.log"]),
        started_at=_at(30), duration_s=61.5)


def failing_combo() -> ComboResult:
    oom_line = 412
    return ComboResult(
        key=FAILING, directory="MBS=2,GBS=16,PRECISION=FP8", verdict=Verdict.FAIL,
        reason="training job FAILED at iteration 7/20: CUDA out of memory on node 0, rank 1", backend="megapilot",
        layout=LayoutPins(tp=1, pp=1, cp=1, ep=1, mbs=2), gbs=16, precision="FP8", seq_length=1024, nodes=1,
        gpus_per_node=2, train_iters=20,
        metrics=[
            MetricRow(name="training.throughput_per_gpu", value=22.0, unit="TFLOP/s", threshold=">= 35", kind="min",
                      verdict=Verdict.FAIL, reason="22 TFLOP/s below the gate of 35", margin_pct=-37.1),
            MetricRow(name="training.tokens_per_gpu", value=None, unit="tokens/s", threshold=">= 3000",
                      kind="min_tok_s", verdict=Verdict.FAIL, reason="missing: the job died before steady state"),
            MetricRow(name="training.lm_loss", value=float("nan"), unit="", threshold="info", kind="info",
                      verdict=Verdict.RECORD, reason="loss was NaN at the last logged iteration"),
        ],
        curves=_curves(6, base_ms=2050.0, tokens=1900.0) + [Curve(name="lr", points=[(1, 1e-4), (2, float("nan"))])],
        predicted=Prediction(step_time_ms=1900.0, tokens_per_s_per_gpu=4300.0, memory_gib=78.0,
                             note="predicted to fit with 2 GiB to spare"),
        findings=[Finding(category="oom", severity="critical", title="CUDA out of memory while allocating 2.00 GiB",
                          cause="a GPU ran out of memory", node=0, rank=1,
                          evidence=[Evidence(file="MBS=2,GBS=16,PRECISION=FP8/out-node0/training.log",
                                                 line=oom_line, text=ANSI_LINE),
                                    Evidence(file="MBS=2,GBS=16,PRECISION=FP8/out-node0/training.log",
                                                 line=oom_line + 1, text=HOSTILE_LINE)])],
        job=JobSummary(executor="local", job_id="4712", state="FAILED", exit_code=1, reason="rank 1 exited with 1",
                       iterations_reached=6, train_iters=20, duration_s=40.2,
                       logs=["MBS=2,GBS=16,PRECISION=FP8/out-node0/training.log"]),
        log_tail=[_iteration_line(6, 20, 2071.0, 9.7, 1880.0), ANSI_LINE, HOSTILE_LINE,
                  "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: rank 1 (pid 5123) exited"],
        started_at=_at(100), duration_s=40.2)


def stages() -> list[StageResult]:
    return [
        StageResult(name="prepare", verdict=Verdict.PASS, started_at=_at(0), duration_s=2.1),
        StageResult(name="preflight", verdict=Verdict.PASS, started_at=_at(2.1), duration_s=4.0, checks=[
            MetricRow(name="preflight.free_disk_gib", value=812.0, unit="GiB", threshold=">= 50", kind="min",
                      verdict=Verdict.PASS, margin_pct=1524.0),
            MetricRow(name="preflight.gpu_clock_mhz", value=1980.0, unit="MHz", verdict=Verdict.RECORD)]),
        StageResult(name="tokenizer", verdict=Verdict.SKIPPED, reason="mock data: no tokenizer needed",
                    started_at=_at(6.1), duration_s=0.0),
        StageResult(name="smoke", verdict=Verdict.PASS, started_at=_at(6.1), duration_s=22.0),
        StageResult(name="train", combo=PASSING, verdict=Verdict.PASS, started_at=_at(30), duration_s=61.5),
        StageResult(name="train", combo=FAILING, verdict=Verdict.FAIL, reason="CUDA out of memory at iteration 7",
                    started_at=_at(100), duration_s=40.2),
        StageResult(name="checkpoint", verdict=Verdict.RECORD, reason="save/load timings recorded, not gated",
                    started_at=_at(141), duration_s=12.5),
    ]


def suite_result(run_dir: Path) -> SuiteResult:
    """The two-combo result, its run_dir set to `run_dir`."""
    result = SuiteResult(
        run_id="20260302-090000-llama-tiny", run_dir=str(run_dir), verdict=Verdict.FAIL,
        reason="1 of 2 combos failed: MBS=2,GBS=16,PRECISION=FP8 (CUDA out of memory)",
        card=RunCard(suite_name="megatron-single-node", model="llama3-tiny", model_family="llama", gpu="H100",
                     nodes=1, gpus_per_node=2, executor="local", backend="megapilot", layout="TP=1,PP=1,CP=1,EP=1,DP=2",
                     precision="BF16", device="GPU (H100)",
                     megapilot_version="0.1.0", git_commit="0123456789abcdef0123456789abcdef01234567",
                     megatron_version="0.16.1", torch_version="2.13.0", python_version="3.11.9", host="node-a",
                     config_file="examples/suites/single_node.json", cluster_file="examples/clusters/local.json",
                     threshold_file="examples/suites/thresholds.json", config_hash="ab" * 32),
        started_at=START, ended_at=_at(160), duration_s=160.0, finished=True, stages=stages(),
        combos=[passing_combo(), failing_combo()],
        regressions=[Regression(combo=PASSING, metric="training.tokens_per_gpu", value=3650.0, baseline_median=3980.0,
                                change_pct=-8.3, runs_compared=5, worse=True,
                                message="tokens/s -8.3 % vs the median of the last 5 runs")],
        notes=["thresholds from examples/suites/thresholds.json", "mock data: loss gates are weak evidence"])
    return result


def write_run_dir(run_dir: Path) -> SuiteResult:
    """Write suite.json and each combo's node log (the failing one ending in its tail) into run_dir."""
    result = suite_result(run_dir)
    for combo in result.combos:
        log = run_dir / combo.directory / "out-node0" / "training.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        steps = combo.job.iterations_reached if combo.job else 0
        lines = [_iteration_line(i, 20, 1100.0, 10.0 - i * 0.1, 3700.0) for i in range(1, (steps or 0) + 1)]
        log.write_text("\n".join(lines + combo.log_tail) + "\n", encoding="utf-8")
    # suite.json cannot hold NaN (pydantic writes null and the float field refuses it); the stored copy drops them
    stored = result.model_copy(deep=True)
    for combo in stored.combos:
        for row in combo.metrics:
            if row.value is not None and not math.isfinite(row.value):
                row.value = None
        for series in combo.curves:
            series.points = [(step, value) for step, value in series.points if math.isfinite(value)]
    stored.write(run_dir)
    return result


def with_stragglers(result: SuiteResult) -> SuiteResult:
    """The run with its passing combo measured on three nodes, node2 31 % slower than the others' median (its gate
    1.15), and node3 with no measurement (no cell is drawn for it)."""
    rows = [MetricRow(name=f"straggler.node{k}", value=ratio, unit="x", threshold="<= 1.15", verdict=verdict,
                      reason=f"{ratio}x the other nodes' median compute time" if ratio else "no timing")
            for k, ratio, verdict in ((0, 0.99, Verdict.PASS), (1, 1.01, Verdict.PASS), (2, 1.31, Verdict.FAIL))]
    rows.append(MetricRow(name="straggler.node3", verdict=Verdict.SKIPPED, reason="no timing of node3"))
    combos = [c.model_copy(update={"metrics": c.metrics + rows}) if c.key == PASSING else c for c in result.combos]
    return result.model_copy(update={"combos": combos})


STOPPED = "MBS=4,GBS=16,PRECISION=BF16"
NEVER_STARTED = "MBS=8,GBS=16,PRECISION=BF16"
STOPPED_DIR = "MBS4_GBS16_BF16"


def interrupted_result(run_dir: Path) -> SuiteResult:
    """The run stopped by Ctrl-C at iteration 10 of 80 of its second combo (the first PASSed, every finished stage
    PASSed or was skipped), its third combo never started: as the lifecycle leaves it."""
    passing = passing_combo()
    reason = "interrupted at iteration 10 of 80 by SIGINT"
    stopped = ComboResult(
        key=STOPPED, directory=STOPPED_DIR, verdict=Verdict.INTERRUPTED, reason=reason, backend="megapilot",
        layout=LayoutPins(tp=1, pp=1, cp=1, ep=1, mbs=4), gbs=16, precision="BF16", seq_length=1024, nodes=1,
        gpus_per_node=2, train_iters=80,
        job=JobSummary(executor="local", job_id="4713", state="CANCELLED", reason="cancelled", iterations_reached=10,
                       train_iters=80, duration_s=12.0, logs=[f"{STOPPED_DIR}/out-node0/training.log"]),
        log_tail=[_iteration_line(10, 80, 1100.0, 9.0, 3700.0), "[rank0]: <stopped> by SIGINT"],
        started_at=_at(100), duration_s=12.0)
    rows = [s for s in stages() if s.verdict in (Verdict.PASS, Verdict.SKIPPED) and s.combo != FAILING] + [
        StageResult(name="train", combo=STOPPED, verdict=Verdict.INTERRUPTED, reason=reason, started_at=_at(100),
                    duration_s=12.0),
        StageResult(name="metrics", combo=STOPPED, verdict=Verdict.SKIPPED, reason=NOT_RUN_REASON),
        StageResult(name="loss_curve", combo=STOPPED, verdict=Verdict.SKIPPED, reason=NOT_RUN_REASON)]
    result = suite_result(run_dir)
    return result.model_copy(update={
        "verdict": Verdict.INTERRUPTED, "finished": False, "ended_at": _at(112), "duration_s": 112.0,
        "stopped_by": "SIGINT", "stages": rows, "combos": [passing, stopped], "regressions": [],
        "planned_combos": [PASSING, STOPPED, NEVER_STARTED],
        "reason": "stopped by SIGINT during combo 2 of 3"})


def write_interrupted_run_dir(run_dir: Path) -> SuiteResult:
    """The interrupted run's suite.json and the logs its two combos left (the stopped one's partial)."""
    result = interrupted_result(run_dir)
    for combo, steps in ((result.combos[0], 20), (result.combos[1], 10)):
        log = run_dir / combo.directory / "out-node0" / "training.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("\n".join(_iteration_line(i, combo.train_iters or 20, 1100.0, 10.0 - i * 0.1, 3700.0)
                                 for i in range(1, steps + 1)) + "\n", encoding="utf-8")
    result.write(run_dir)
    return result
