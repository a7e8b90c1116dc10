"""Predicted vs measured: where a measurement departs from its prediction, and the `predicted` threshold kind."""

from __future__ import annotations

import pytest

from megapilot.spec import Prediction
from megapilot.suite.gates import evaluate
from megapilot.suite.predicted import components_ms, departure, judge_predicted
from megapilot.suite.results import Verdict
from megapilot.suite.thresholds import threshold

TERMS_MS = {"compute": 800.0, "recompute": 0.0, "tp_comm": 50.0, "pp_bubble": 0.0, "dp_comm": 100.0,
            "optimizer": 40.0, "fixed": 10.0}


def _prediction(*, calibrated: bool = True) -> Prediction:
    return Prediction(step_time_ms=1000.0, tokens_per_s_per_gpu=4096.0, memory_gib=40.0, components_ms=TERMS_MS,
                      calibration="calibrated on 2 run(s)" if calibrated else "no runs of this cluster yet",
                      calibration_runs=["r1", "r2"] if calibrated else [])


def test_the_step_splits_into_four_components_that_add_up():
    parts = components_ms(_prediction())
    assert parts == {"compute": 800.0, "exposed_comm": 150.0, "pipeline_bubble": 0.0, "fixed_overheads": 50.0}
    assert sum(parts.values()) == pytest.approx(1000.0)


def test_the_timer_furthest_from_its_prediction_is_named():
    found = departure(_prediction(), 1180.0, {"forward-backward": 860.0, "all-grads-sync": 210.0, "optimizer": 45.0})
    assert found is not None and found.step_pct == pytest.approx(18.0)
    assert found.sentence == "step 18 % slower than predicted; the measured data-parallel time is 2.1x its prediction"


def test_the_component_named_is_the_one_that_explains_the_departure_not_the_largest_ratio():
    # a data-path stall inside forward-backward: +2 s there, +10 ms on a 40 ms optimizer step
    found = departure(_prediction(), 3000.0, {"forward-backward": 2850.0, "optimizer": 150.0})
    assert found is not None and found.component == "forward-backward time"
    assert found.sentence.endswith("the measured forward-backward time is 3.4x its prediction")


def test_a_fitted_per_step_overhead_is_not_blamed_on_the_optimizer_timer():
    # a calibration that fitted 500 ms of per-step overhead (a busy host): no timer measures it
    terms = {"compute": 150.0, "optimizer": 1.0, "fixed": 500.0}
    prediction = Prediction(step_time_ms=651.0, components_ms=terms, calibration_runs=["r1"])
    found = departure(prediction, 200.0, {"forward-backward": 160.0, "optimizer": 0.9})
    assert found is not None and found.component is None and "optimizer" not in found.sentence
    assert found.sentence.startswith("step 69 % faster than predicted; every timed component within 25 %")


def test_without_timers_the_total_step_is_all_it_says():
    found = departure(_prediction(), 2000.0, {})
    assert found is not None and found.component is None
    assert found.sentence.startswith("step 100 % slower than predicted; the log has no Megatron timers")
    assert departure(_prediction(), None, {}) is None


def test_a_predicted_gate_fails_a_slow_combo_and_names_the_component():
    spec = threshold(kind="predicted", min_ratio=0.9)
    why = departure(_prediction(), 2500.0, {"forward-backward": 2350.0, "optimizer": 45.0})
    rows = evaluate({"training.tokens_per_gpu": 1640.0, "training.elapsed_time_per_iteration": 2500.0},
                    {}, {"training.tokens_per_gpu": spec, "training.elapsed_time_per_iteration": spec},
                    enforce=True, prediction=_prediction(), departure=why)
    tokens, step = rows[0], rows[1]
    assert tokens.verdict is Verdict.FAIL and step.verdict is Verdict.FAIL
    assert tokens.threshold == ">= 0.9 x predicted" and tokens.kind == "predicted"
    assert "0.40x the calibrated prediction 4096" in tokens.reason
    assert "forward-backward time is 2.8x its prediction" in step.reason
    assert step.margin_pct == pytest.approx((0.4 - 0.9) / 0.9 * 100)


def test_a_predicted_gate_passes_within_its_ratio_and_records_without_a_calibration():
    spec = threshold(kind="predicted", min_ratio=0.9)
    passing = judge_predicted("training.elapsed_time_per_iteration", 1050.0, 0.9, _prediction(), None)
    assert passing.verdict is Verdict.PASS
    first = judge_predicted("training.tokens_per_gpu", 10.0, 0.9, _prediction(calibrated=False), None)
    assert first.verdict is Verdict.RECORD and "not calibrated on this cluster yet" in first.reason
    unknown = judge_predicted("training.lm_loss", 3.0, 0.9, _prediction(), None)
    assert unknown.verdict is Verdict.FAIL and "megapilot predicts no training.lm_loss" in unknown.reason
    assert spec.describe() == ">= 0.9 x predicted"


def test_a_prediction_calibrated_only_on_this_runs_own_runs_records_and_never_gates():
    own = _prediction().model_copy(update={"calibrated_in_run": True})
    judged = judge_predicted("training.tokens_per_gpu", 10.0, 0.9, own, None)  # far below it: would FAIL
    assert judged.verdict is Verdict.RECORD and "only on this run's own earlier runs" in judged.reason


def test_a_predicted_gate_needs_its_ratio():
    with pytest.raises(ValueError, match="needs 'min_ratio'"):
        threshold(kind="predicted")


# ---- the memory WARN of `suite check` / `suite run --dry-run` ----------------------------------------------------

def _cvs_405b_launch(tmp_path, *, edit=None):
    from megapilot.suite.config import load_suite
    from megapilot.suite.render import render_cell
    from tests.suite.cvs_files import LLAMA_405B, PRIMUS_IMAGE, write_filled

    config, cluster = write_filled(tmp_path, LLAMA_405B, gpu="MI325X", image=PRIMUS_IMAGE, nodes=4, edit=edit)
    suite = load_suite(config, cluster)
    cell = next(c for c in suite.cells if c.key.endswith("BF16"))
    return suite, render_cell(suite, cell, job_dir=tmp_path / "job")


def test_a_cell_predicted_over_the_gpus_memory_gets_a_warn_line_naming_stage_capacity_and_fixes(tmp_path):
    from megapilot.estimate.memory import memory_by_stage
    from megapilot.suite.predicted import memory_warning

    # CVS's Llama 3.1 405B: TP 8 x PP 4, no recompute, 8k tokens on MI325X (256 GiB): stage 0 holds 4 micro-batches
    # of 31 layers' activations
    suite, launch = _cvs_405b_launch(tmp_path)
    plan = launch.plan
    by_stage = dict(memory_by_stage(plan.model, plan.training, plan.parallel, architecture="cdna3"))
    assert by_stage[0] > 256 and max(by_stage, key=lambda stage: by_stage[stage]) == 0
    line = memory_warning(launch.key, plan, suite.gpu)
    assert line is not None and line.startswith(f"WARN cell {launch.key}: ")
    assert f"stage 0 {by_stage[0]:.0f} GiB" in line and "MI325X's 256 GiB" in line
    assert "full recompute (recompute 1)" in line and "pipeline_parallelism, now 4" in line
    assert "tensor_parallelism" not in line  # TP 8 already fills the node
    assert "micro_batch_size" not in line  # MBS 1 has nowhere smaller to go


def test_no_warn_when_the_cell_fits_on_a_cpu_suite_or_without_a_plan(tmp_path):
    from megapilot.suite.predicted import memory_warning

    def full_recompute(raw):
        raw["train_params"]["recompute"] = "1"

    suite, launch = _cvs_405b_launch(tmp_path, edit=full_recompute)
    assert launch.plan is not None and launch.plan.parallel.recompute == "full"
    assert memory_warning(launch.key, launch.plan, suite.gpu) is None  # fits: no line
    assert memory_warning(launch.key, launch.plan, None) is None  # a CPU suite: no GPU to exceed
    assert memory_warning(launch.key, None, suite.gpu) is None  # a cell that did not render


def test_a_cpu_cell_predicts_no_mfu_as_its_measurement_has_none():
    """A CPU rank's peak is the one-thread matmul rate the estimate prices with, not a datasheet figure: the
    measured side states no MFU (no GPU), so the prediction states none either; a GPU cell keeps its MFU."""
    from megapilot.catalog.host import host_spec
    from megapilot.estimate import build_case, estimate
    from megapilot.spec import SavedPlan
    from megapilot.suite.predicted import calibrated_prediction

    case = build_case(model="tiny", gpu="h100", gpus=2, seq_len=128, gbs=8, mbs=1)
    plan = SavedPlan(model=case.model, cluster=case.cluster, training=case.training, parallel=case.parallel)
    on_gpu = calibrated_prediction(plan, case.cluster, estimate(case.model, case.cluster, case.training,
                                                                case.parallel), ())
    assert on_gpu.mfu_pct is not None and on_gpu.mfu_pct > 0
    cpu = case.cluster.model_copy(update={"gpu": host_spec({
        "matmul_tflops_one_thread": 0.1, "memory_tbps": 0.02, "ops_per_s": 1e5, "elements_per_s": 1e9,
        "runtime_gib": 0.4}, ranks_per_node=2)})
    on_cpu = calibrated_prediction(plan, cpu, estimate(case.model, cpu, case.training, case.parallel), ())
    assert on_cpu.mfu_pct is None and on_cpu.step_time_ms
