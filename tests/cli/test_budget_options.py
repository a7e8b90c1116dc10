"""cli.budget_options: the budget options read into one BudgetRequest, and refused when they contradict; script's
--train-iters and --save-interval from a budget."""

from __future__ import annotations

import pytest

from megapilot.catalog.gpus import get_gpu
from megapilot.cli.budget_options import (
    NO_BUDGET,
    NO_RUN_BUDGET,
    BudgetFlags,
    RunBudgetFlags,
    budget_json,
    schedule_from_budget,
)
from megapilot.errors import MegapilotError
from megapilot.estimate import build_case
from megapilot.estimate.goodput import FailureModel, daly_interval_s
from megapilot.plan.budget import run_budget
from megapilot.spec import SavedPlan


def test_no_option_is_no_budget():
    assert not NO_BUDGET.given and not NO_RUN_BUDGET.given
    assert NO_BUDGET.request() is None and budget_json(None) == {}


def test_tokens_phases_warm_up_price_and_failure_inputs_become_one_request():
    flags = BudgetFlags(tokens="15.6T", phase=["tokens=800B,seq_len=131072,cp=16"], rampup_batch_size=(32, 32, 1000),
                        cost_per_gpu_hour=2.5, failures_per_gpu_hour=1e-5, restart_min=15.0, repair_h=48.0,
                        checkpoint_gbps=500.0)
    request = flags.request()
    assert request is not None and flags.given
    assert request.tokens == pytest.approx(15.6e12) and request.train_iters is None
    [phase] = request.phases
    assert (phase.tokens, phase.seq_len, phase.cp) == (pytest.approx(800e9), 131072, 16)
    assert (request.rampup.start, request.rampup.increment, request.rampup.samples) == (32, 32, 1000)
    assert (request.cost_per_gpu_hour, request.checkpoint_gbps) == (2.5, 500.0)
    failure = request.failure
    assert (failure.failures_per_gpu_hour, failure.restart_s, failure.repair_h) == (1e-5, 900.0, 48.0)
    assert failure.source == "given (--failures-per-gpu-hour)"


def test_the_longest_restart_and_repair_are_taken():
    request = BudgetFlags(tokens="1T", restart_min=7 * 24 * 60, repair_h=365 * 24).request()
    assert request is not None and (request.failure.restart_s, request.failure.repair_h) == (7 * 24 * 3600, 8760)


def test_unset_failure_inputs_keep_the_models_defaults():
    request = BudgetFlags(train_iters=1000).request()
    assert request is not None and request.train_iters == 1000 and request.tokens is None
    assert request.failure == FailureModel()


def test_script_gives_the_steps_itself():
    request = RunBudgetFlags(cost_per_gpu_hour=2.0).request(train_iters=500)
    assert request is not None and request.train_iters == 500


@pytest.mark.parametrize(("flags", "field"), [
    (BudgetFlags(cost_per_gpu_hour=2.0), "tokens"),  # a budget option without a budget
    (BudgetFlags(tokens="1T", train_iters=10), "tokens"),
    (BudgetFlags(tokens="1T", failures_per_gpu_hour=1e-5, failures_from_history=True), "failures_per_gpu_hour"),
    (BudgetFlags(tokens="1T", restart_min=-1.0), "restart_min"),  # the option typed, in its unit
    (BudgetFlags(tokens="1T", restart_min=float("nan")), "restart_min"),
    (BudgetFlags(tokens="1T", repair_h=float("inf")), "repair_h"),
    (BudgetFlags(tokens="many"), "tokens"),
    (BudgetFlags(tokens="1T", restart_min=1e308), "restart_min"),  # overflowed to an error on "restart_s" when x60
    (BudgetFlags(tokens="1T", restart_min=7 * 24 * 60 + 1), "restart_min"),
    (BudgetFlags(tokens="1T", repair_h=1e308), "repair_h"),  # printed a spare-node count of 300 digits
])
def test_contradicting_or_bad_options_name_the_field(flags, field):
    with pytest.raises(MegapilotError) as caught:
        flags.request()
    assert caught.value.field == field


def test_the_history_rate_reads_only_this_gpus_runs(tmp_path, monkeypatch):
    from megapilot.store.history import HISTORY_ENV, open_history
    from tests.report.factory import suite_result

    path = tmp_path / "history.sqlite"
    with open_history(str(path)) as history:
        for index in range(10):  # H100 runs: one failed 2-GPU job of 100,000 s each
            result = suite_result(tmp_path)
            result.run_id = f"run-{index:03d}"
            for combo in result.combos:
                combo.duration_s = 100_000.0
            history.record(result)
    monkeypatch.setenv(HISTORY_ENV, str(path))
    learned = BudgetFlags(tokens="1T", failures_from_history=True).request(gpu=get_gpu("h100"))
    assert learned is not None and "run history" in learned.failure.source
    assert learned.failure.failures_per_gpu_hour == pytest.approx(10 / (10 * 2 * 100_000 * 2 / 3600))
    other = BudgetFlags(tokens="1T", failures_from_history=True).request(gpu=get_gpu("mi300x"))
    assert other is not None and "run history" not in other.failure.source


def test_scripts_save_interval_counts_the_main_phases_steps():
    # the script trains the main phase alone, but its --save-interval was Daly's interval over the whole run's mean
    # step: a 32K-token phase's slower steps made the mean longer, the interval too few steps
    case = build_case(model="llama3.1-8b", gpu="h100", gpus=64, tp=2, seq_len=4096, gbs=256)
    plan = SavedPlan(model=case.model, cluster=case.cluster, training=case.training, parallel=case.parallel)
    flags = RunBudgetFlags(tokens="1T", phase=["tokens=300B,seq_len=32768,cp=4"])
    notes: list[str] = []
    train_iters, save_interval = schedule_from_budget(flags, plan, None, None, notes)
    request = flags.request(gpu=plan.cluster.gpu)
    assert request is not None
    run = run_budget(request, plan.model, plan.cluster, plan.training, plan.parallel)
    main = next(s for s in run.segments if s.name == "main")
    expected = round(daly_interval_s(run.goodput.checkpoint.save_s, run.goodput.mtbf_s) / main.step_time_s)
    assert train_iters == main.iterations and save_interval == expected
    assert run.goodput.checkpoint_interval_iters is not None and expected > run.goodput.checkpoint_interval_iters
    assert any(f"--save-interval {expected:,}" in note and "main phase's" in note for note in notes)


def test_the_budget_printout_names_the_scripts_save_interval_beside_the_runs_mean_step(capsys):
    # estimate printed "every 207 steps" (the run's mean step) where script writes --save-interval 227 (the main
    # phase's): both are said now, each with its step
    from megapilot.cli.budget_options import print_budget

    case = build_case(model="llama3.1-8b", gpu="h100", gpus=64, tp=2, seq_len=4096, gbs=256)
    flags = RunBudgetFlags(tokens="1T", phase=["tokens=300B,seq_len=32768,cp=4"])
    request = flags.request(gpu=case.cluster.gpu)
    assert request is not None
    run = run_budget(request, case.model, case.cluster, case.training, case.parallel)
    main_interval = run.main_save_interval()
    assert main_interval is not None and main_interval != run.goodput.checkpoint_interval_iters
    print_budget(run)
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("checkpoint every"))
    assert f"every {run.goodput.checkpoint_interval_iters:,} steps of the run's mean" in line
    assert f"--save-interval {main_interval:,} in the main phase's" in line
