"""Metrics from every node's logs: real excerpts, multi-node logs, computed tokens/s, scaling, NaN
counters, convergence, and a real run of the embedded trainer (slow)."""

from __future__ import annotations

import math
import statistics
from dataclasses import replace

import pytest

from megapilot.catalog.gpus import get_gpu
from megapilot.logs import parse_logs
from megapilot.suite.gates import evaluate
from megapilot.suite.metric_table import MEASURED_METRICS, METRICS
from megapilot.suite.metrics import (
    ConvergenceGate,
    CurveTargets,
    ScalingBaseline,
    measure_combo,
    measure_convergence,
    scaling_efficiency_pct,
)
from megapilot.suite.results import Verdict
from megapilot.suite.thresholds import threshold
from megapilot.trainer import logfmt
from tests.suite.conftest import DATA, Step, falling_steps, iteration_lines

H100 = get_gpu("h100")


def measure_one(path, *, gpu=H100, world_size=16, seq_length=4096, gbs=None, train_iters=None, **kwargs):
    return measure_combo([path], gpu=gpu, world_size=world_size, gpus_per_node=min(world_size, 8),
                         nodes=max(1, world_size // 8), seq_length=seq_length, gbs=gbs, train_iters=train_iters,
                         **kwargs)


def test_real_mixtral_excerpt_steady_state_and_computed_tokens():
    path = DATA / "04_low_throughput_mixtral_h100_130tflops.log"
    m = measure_one(path)
    records = parse_logs([path]).iterations
    steady = records[1:]  # 3 records: the warm-up rule drops max(1, ceil(0.3)) = 1
    mean_ms = statistics.fmean(r.elapsed_ms for r in steady)
    # each step's rate weighted by its time: the run's FLOPs over its time
    assert m.actuals["training.throughput_per_gpu"] == pytest.approx(
        sum(r.tflops_per_gpu * r.elapsed_ms for r in steady) / sum(r.elapsed_ms for r in steady))
    assert m.actuals["training.elapsed_time_per_iteration"] == pytest.approx(mean_ms)
    # not printed by Megatron: GBS (from the lines) x seq / (mean step time x world)
    assert m.actuals["training.tokens_per_gpu"] == pytest.approx(records[0].gbs * 4096 / (mean_ms / 1000 * 16))
    assert m.actuals["training.mfu_pct"] == pytest.approx(
        m.actuals["training.throughput_per_gpu"] / H100.bf16_dense_tflops * 100)
    assert m.actuals["training.lm_loss"] == records[-1].lm_loss
    assert m.actuals["training.lm_loss_first"] == records[0].lm_loss
    assert m.actuals["training.grad_norm"] == records[-1].grad_norm
    assert m.actuals["training.iterations_reached"] == 12
    assert m.actuals["training.step_records"] == len(steady)  # what the step figures are taken over, not 12
    assert m.actuals["training.nan_iterations"] == 0 and m.errors == [] and m.nan_findings == []
    assert m.units["training.elapsed_time_per_iteration"] == "ms"  # not "s" as CVS's table says
    assert set(m.actuals) == set(MEASURED_METRICS) == set(m.units)


def test_fp8_mfu_uses_the_fp8_peak():
    path = DATA / "04_low_throughput_mixtral_h100_130tflops.log"
    bf16, fp8 = measure_one(path), measure_one(path, precision="FP8")
    assert fp8.actuals["training.mfu_pct"] == pytest.approx(
        bf16.actuals["training.mfu_pct"] * H100.bf16_dense_tflops / H100.fp8_dense_tflops)


def test_mfu_from_model_flops_per_token_when_given():
    path = DATA / "04_low_throughput_mixtral_h100_130tflops.log"
    m = measure_one(path, model_flops_per_token=1e11)
    assert m.actuals["training.mfu_pct"] == pytest.approx(
        m.actuals["training.tokens_per_gpu"] * 1e11 / 1e12 / H100.bf16_dense_tflops * 100)


def test_cvs_rocm_line_mem_usages_and_max_allocated():
    m = measure_one(DATA / "cvs_megatron_lm_rocm_iteration.log", world_size=8)
    assert m.actuals["training.mem_usage"] == pytest.approx(0.5462)
    assert m.actuals["training.max_allocated_gib"] == pytest.approx(136133.79638671875 / 1024)


def test_memory_report_divided_by_the_gpus_hbm_when_no_fraction_is_printed():
    m = measure_one(DATA / "08_iteration_mcore2025_memory_report_pai.log", world_size=8)
    assert m.actuals["training.mem_usage"] == pytest.approx(63409.05810546875 / 1024 / H100.hbm_gib)
    unknown_gpu = measure_one(DATA / "08_iteration_mcore2025_memory_report_pai.log", world_size=8, gpu=None)
    assert unknown_gpu.actuals["training.mem_usage"] is None
    assert "capacity unknown" in unknown_gpu.why_missing["training.mem_usage"]
    assert unknown_gpu.actuals["training.mfu_pct"] is None


def test_primus_printed_tokens_are_used_not_computed():
    m = measure_one(DATA / "cvs_primus_iteration_warmup_and_steady.log", world_size=8, gbs=16)
    assert m.actuals["training.tokens_per_gpu"] == pytest.approx(25032.8)  # the steady line's own figure
    assert not any("computed" in note for note in m.notes)


def two_node_logs(log_file, *, with_arguments: bool):
    """Node 0: rank 0's arguments block and an OOM (from a real log); node 1: the last rank's iteration lines."""
    arguments = logfmt.arguments_lines({"seq_length": 2048, "global_batch_size": 32, "world_size": 16,
                                        "micro_batch_size": 1}) if with_arguments else []
    oom = (DATA / "15_oom_nccl_cuda_failure_bridge_llama3_fp8.log").read_text().splitlines()
    node0 = log_file("out-node0/training.log", [*arguments, *oom])
    steps = falling_steps(1, 20, elapsed_ms=500.0)
    node1 = log_file("out-node1/training.log", iteration_lines(steps, train_iters=20, gbs=32))
    return [node0, node1]


def test_two_nodes_iterations_from_the_last_errors_from_every_node(log_file):
    logs = two_node_logs(log_file, with_arguments=True)
    m = measure_combo(logs, gpu=H100, world_size=16, gpus_per_node=8, nodes=2, seq_length=None, gbs=None,
                      train_iters=20)
    assert m.iteration_node == 1
    assert m.actuals["training.iterations_reached"] == 20
    [oom] = m.errors
    assert oom.category == "oom" and oom.node == 0 and "node 0" in oom.message
    assert oom.evidence and all(e.file == str(logs[0]) for e in oom.evidence)
    # tokens/s/GPU from rank 0's arguments block (seq 2048) with the last node's step time
    assert m.actuals["training.tokens_per_gpu"] == pytest.approx(32 * 2048 / (0.5 * 16))
    curve = m.curve("tokens_per_s_per_gpu")
    assert curve is not None and curve.points[0][1] == pytest.approx(32 * 2048 / (0.5 * 16))


def test_tokens_are_missing_with_a_reason_when_no_sequence_length_is_known(log_file):
    logs = two_node_logs(log_file, with_arguments=False)
    m = measure_combo(logs, gpu=H100, world_size=16, gpus_per_node=8, nodes=2, seq_length=None, gbs=None,
                      train_iters=20)
    assert m.actuals["training.tokens_per_gpu"] is None
    assert "sequence length" in m.why_missing["training.tokens_per_gpu"]
    row = next(r for r in evaluate(m.actuals, m.units, {"training.tokens_per_gpu": threshold(kind="min_tok_s",
                                                                                                value=1)},
                                   enforce=True, why_missing=m.why_missing) if r.name == "training.tokens_per_gpu")
    assert row.verdict is Verdict.FAIL and "tokens/s/GPU" in row.reason


def test_a_node_without_a_log_is_an_error_finding(log_file, tmp_path):
    logs = [tmp_path / "out-node0" / "training.log", log_file("out-node1/training.log",
                                                              iteration_lines(falling_steps(1, 4), train_iters=4))]
    m = measure_combo(logs, gpu=None, world_size=2, gpus_per_node=1, nodes=2, seq_length=64, gbs=8, train_iters=4)
    assert [(f.category, f.node) for f in m.errors] == [("missing_log", 0)]
    assert m.actuals["training.iterations_reached"] == 4


def test_scaling_efficiency_is_tokens_total_against_the_baseline_scaled_by_nodes():
    # 2 nodes x 8 GPUs at 1000 tok/s/GPU = 16000 tok/s; a 1-node baseline of 8000 tok/s scales to 16000
    assert scaling_efficiency_pct(1000.0, world_size=16, nodes=2,
                                  baseline=ScalingBaseline(8000.0, 1)) == pytest.approx(100.0)
    # 4 GPUs per node (no 8 assumed): 2 x 4 x 900 = 7200 vs 4000 x 2 = 8000
    assert scaling_efficiency_pct(900.0, world_size=8, nodes=2,
                                  baseline=ScalingBaseline(4000.0, 1)) == pytest.approx(90.0)
    assert scaling_efficiency_pct(900.0, world_size=8, nodes=2, baseline=ScalingBaseline(0.0, 1)) is None
    assert scaling_efficiency_pct(None, world_size=8, nodes=2, baseline=ScalingBaseline(4000.0, 1)) is None


def test_scaling_efficiency_in_a_measurement(log_file):
    logs = two_node_logs(log_file, with_arguments=True)
    tokens_per_gpu = 32 * 2048 / (0.5 * 16)
    reference = ScalingBaseline(tokens_per_sec_total=tokens_per_gpu * 8 * 1.25)
    m = measure_combo(logs, gpu=H100, world_size=16, gpus_per_node=8, nodes=2, seq_length=None, gbs=None,
                      train_iters=20, targets=CurveTargets(scaling_baseline=reference))
    assert m.actuals["training.scaling_efficiency_pct"] == pytest.approx(80.0)
    assert m.units["training.scaling_efficiency_pct"] == "%"
    no_baseline = measure_combo(logs, gpu=H100, world_size=16, gpus_per_node=8, nodes=2, seq_length=None,
                                gbs=None, train_iters=20)
    assert no_baseline.actuals["training.scaling_efficiency_pct"] is None


def test_nan_losses_and_megatron_counters_become_findings(log_file):
    steps = [*falling_steps(1, 4), Step(5, math.nan, nan_iterations=1, grad_norm=math.nan),
             Step(6, 5.5, skipped_iterations=2), Step(7, 5.4)]
    m = measure_one(log_file("training.log", iteration_lines(steps, train_iters=7)), gpu=None, world_size=1,
                    seq_length=64, gbs=8)
    # diagnose's NaN rule, the one the suite reads: one finding for the node, with its lines
    assert [(f.category, f.node) for f in m.nan_findings] == [("nan_loss", 0)]
    assert m.nan_findings[0].evidence and m.nan_findings[0].blocking
    assert m.actuals["training.nan_iterations"] == 1 and m.actuals["training.skipped_iterations"] == 2
    assert m.actuals["training.lm_loss"] == pytest.approx(5.4)
    assert [s for s, _ in m.curve("loss").points] == [1, 2, 3, 4, 6, 7]  # the NaN point left out


def test_curves_count_each_iteration_once_when_ranks_repeat_lines(log_file):
    lines = iteration_lines(falling_steps(1, 5), train_iters=5)
    repeated = [f"[rank{r}]:{line}" for line in lines for r in (0, 1)]
    m = measure_one(log_file("training.log", repeated), gpu=None, world_size=2, seq_length=64, gbs=8)
    for name in ("loss", "step_time_ms", "tokens_per_s_per_gpu", "tflops_per_gpu", "grad_norm", "lr"):
        assert [s for s, _ in m.curve(name).points] == [1, 2, 3, 4, 5], name


def test_loss_slope_actual_uses_the_sampling_rule(log_file):
    steps = [Step(i, 10.0 - 0.01 * i) for i in range(1, 101)]
    m = measure_one(log_file("training.log", iteration_lines(steps, train_iters=100)), gpu=None, world_size=1,
                    seq_length=64, gbs=8, train_iters=100)
    assert m.actuals["training.loss_slope"] == pytest.approx(-0.01)
    assert m.units["training.loss_slope"] == "loss/iteration"


def test_convergence_on_eval_loss_when_the_log_has_validation_lines(log_file):
    lines = iteration_lines(falling_steps(1, 20, start_loss=6.0, per_step=0.1), train_iters=20)
    lines[9:9] = logfmt.validation_lines(10, {"lm loss": 5.2})
    lines += logfmt.validation_lines(20, {"lm loss": 4.1})
    path = log_file("training.log", lines)
    auto = measure_one(path, gpu=None, world_size=1, seq_length=64, gbs=8, train_iters=20,
                       targets=CurveTargets(convergence=ConvergenceGate(target_value=4.5)))
    assert auto.curve("eval_loss").points == [(10, 5.2), (20, 4.1)]
    assert auto.actuals["training.steps_to_target"] == 20  # eval reaches 4.5 at step 20
    assert auto.actuals["training.final_loss_vs_target"] == pytest.approx(4.1 - 4.5)
    train = measure_one(path, gpu=None, world_size=1, seq_length=64, gbs=8, train_iters=20,
                        targets=CurveTargets(convergence=ConvergenceGate(target_value=4.5, target_metric="train_loss")))
    assert train.actuals["training.steps_to_target"] == 15  # 6.0 - 0.1 x 15 = 4.5
    assert train.actuals["training.time_to_target_s"] == pytest.approx(15 * 0.1)


def test_time_to_target_counts_every_iteration_of_a_log_interval():
    step_times = [(5, 100.0), (10, 200.0), (15, 100.0)]  # each line: mean ms of the 5 steps before it
    result = measure_convergence([(5, 3.0), (10, 2.0), (15, 1.0)], [], step_times,
                                 ConvergenceGate(target_value=2.0))
    assert result.steps_to_target == 10 and result.time_to_target_s == pytest.approx((5 * 100 + 5 * 200) / 1000)
    resumed = measure_convergence([(21, 3.0), (22, 2.0)], [], [(21, 100.0), (22, 100.0)],
                                  ConvergenceGate(target_value=2.5))
    assert resumed.time_to_target_s == pytest.approx(0.2)  # a resumed run does not count steps 1..20
    asked_eval = measure_convergence([(1, 3.0)], [], [(1, 100.0)],
                                     ConvergenceGate(target_value=2.5, target_metric="eval_loss"))
    assert asked_eval.series == "loss" and "no validation loss" in asked_eval.note


@pytest.mark.slow
def test_a_real_cpu_run_of_the_embedded_trainer(trainer_runs):
    m = measure_combo([trainer_runs.save_log], gpu=None, world_size=1, gpus_per_node=1, nodes=1, seq_length=None,
                      gbs=None, train_iters=10, targets=CurveTargets(convergence=ConvergenceGate(target_value=5.0)))
    log = parse_logs([trainer_runs.save_log])
    assert m.actuals["training.iterations_reached"] == 10
    assert [s for s, _ in m.curve("loss").points] == list(range(1, 11))
    assert [s for s, _ in m.curve("eval_loss").points] == [5, 10]
    # tokens/s/GPU from the trainer's arguments block: GBS 4 x seq 64 over the mean step time
    mean_ms = m.actuals["training.elapsed_time_per_iteration"]
    assert m.actuals["training.tokens_per_gpu"] == pytest.approx(4 * 64 / (mean_ms / 1000))
    assert m.actuals["training.loss_slope"] < 0
    assert m.actuals["training.lm_loss"] == log.iterations[-1].lm_loss < m.actuals["training.lm_loss_first"]
    assert m.actuals["training.steps_to_target"] is not None
    # on CPU: no MFU, no fraction of GPU memory, the RSS figure recorded only
    assert m.actuals["training.mfu_pct"] is None and m.actuals["training.mem_usage"] is None
    assert "RSS" in m.why_missing["training.mem_usage"]
    assert m.actuals["training.max_allocated_gib"] > 0
    rows = {r.name: r for r in evaluate(m.actuals, m.units, {"training.max_allocated_gib": threshold(
        kind="max", value=0.001)}, enforce=True, record_only=m.record_only, why_missing=m.why_missing)}
    assert rows["training.max_allocated_gib"].verdict is Verdict.RECORD
    # its TFLOP/s/GPU prints 0.0 (one decimal of ~0.03): not measured, no curve of zeros
    assert {r.tflops_per_gpu for r in log.iterations} == {0.0}
    tflops = rows["training.throughput_per_gpu"]
    assert (tflops.value, tflops.verdict) == (None, Verdict.SKIPPED) and "below the one decimal" in tflops.reason
    assert m.curve("tflops_per_gpu") is None
    assert m.errors == [] and m.nan_findings == []


SCALING_OFF = "training.scaling_efficiency_pct"  # no scaling baseline in these measurements: the metric is off


def _printing_tflops(lines: list[str], *values: float) -> list[str]:
    """The lines with TFLOP/s/GPU printed as `values` (cycled), as Megatron prints it: one decimal."""
    return [line.replace("(TFLOP/s/GPU): 2.0", f"(TFLOP/s/GPU): {values[n % len(values)]:.1f}")
            for n, line in enumerate(lines)]


def test_a_printed_tflops_of_zero_is_not_measured_nor_an_mfu_of_zero(log_file):
    """Megatron prints TFLOP/s/GPU with one decimal: a real 0.03 reads 0.0, below the print's resolution."""
    path = log_file("training.log", _printing_tflops(iteration_lines(falling_steps(1, 10), train_iters=10), 0.0))
    m = measure_one(path, world_size=1, seq_length=64)  # an H100 without model FLOPs: MFU from the printed figure
    assert m.actuals["training.throughput_per_gpu"] is None and m.actuals["training.mfu_pct"] is None
    # (and the scaling efficiency: no scaling baseline here, the metric is off)
    assert m.unresolved == {"training.throughput_per_gpu", "training.mfu_pct", SCALING_OFF}
    assert "below the one decimal Megatron prints" in m.why_missing["training.throughput_per_gpu"]
    assert "not measured" in m.why_missing["training.mfu_pct"]
    assert m.curve("tflops_per_gpu") is None and m.curve("loss") is not None


def test_a_metric_a_cpu_run_cannot_have_is_unresolved_only_on_a_cpu_run(log_file):
    """No GPU on a CPU run: the MFU and the memory fraction cannot exist, through no fault of the run's. A GPU run whose
    GPU is unknown misses them as before: a gate on them fails, naming what is missing."""
    path = log_file("training.log", iteration_lines(falling_steps(1, 10), train_iters=10))
    specs = {"training.mfu_pct": threshold(kind="min", value=1.0)}
    for cpu, verdict in ((True, Verdict.SKIPPED), (False, Verdict.FAIL)):
        m = measure_one(path, gpu=None, world_size=1, seq_length=64, cpu=cpu)
        assert m.actuals["training.mfu_pct"] is None and m.actuals["training.mem_usage"] is None
        off = {SCALING_OFF}  # no scaling baseline: the metric is off on any device
        assert m.unresolved == ({"training.mfu_pct", "training.mem_usage"} | off if cpu else off)
        [row] = [r for r in evaluate(m.actuals, m.units, specs, enforce=True, why_missing=m.why_missing,
                                     unresolved=m.unresolved) if r.name == "training.mfu_pct"]
        assert row.verdict is verdict
    assert row.reason.startswith("missing from the log (no GPU (CPU run or GPU not given)")


def test_the_zero_rule_is_the_metric_table_s(log_file, monkeypatch):
    """A row without `zero_unmeasured` takes a printed 0.0 as measured: the suite reads the rule from the table."""
    for name in ("training.throughput_per_gpu", "training.tflops_per_gpu"):
        monkeypatch.setitem(METRICS, name, replace(METRICS[name], zero_unmeasured=False))
    path = log_file("training.log", _printing_tflops(iteration_lines(falling_steps(1, 10), train_iters=10), 0.0))
    m = measure_one(path, world_size=1, seq_length=64)
    assert m.actuals["training.throughput_per_gpu"] == 0.0 and m.unresolved == {SCALING_OFF}
    assert {value for _, value in m.curve("tflops_per_gpu").points} == {0.0}


def test_a_tflops_partly_printed_as_zero_is_measured_and_its_zero_points_left_out(log_file):
    path = log_file("training.log", _printing_tflops(iteration_lines(falling_steps(1, 10), train_iters=10),
                                                     0.0, 0.1))
    m = measure_one(path, world_size=1, seq_length=64)
    assert m.actuals["training.throughput_per_gpu"] > 0 and m.actuals["training.mfu_pct"] > 0
    assert m.unresolved == {SCALING_OFF}
    assert {value for _, value in m.curve("tflops_per_gpu").points} == {0.1}
