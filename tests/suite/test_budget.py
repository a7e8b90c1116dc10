"""A suite config's `budget:`: the run's measured step and checkpoint times projected onto the token budget, in
the result, the run deck and the report page."""

from __future__ import annotations

import json

import pytest

from megapilot.catalog import get_gpu, get_model
from megapilot.report import render_report
from megapilot.suite.budget import BudgetConfig, project_budget
from megapilot.suite.config import check_suite
from megapilot.suite.results import MetricRow, Verdict
from tests.report.factory import PASSING, suite_result, write_run_dir
from tests.suite.cvs_files import SINGLE_8B, filled_in, raw_cvs, write_suite


def _with_checkpoint_times(result, save_s: float = 12.0, load_s: float = 8.0):
    stage = next(s for s in result.stages if s.name == "checkpoint")
    stage.checks = [MetricRow(name="checkpoint.save_s", value=save_s, unit="s", verdict=Verdict.RECORD),
                    MetricRow(name="checkpoint.load_s", value=load_s, unit="s", verdict=Verdict.RECORD)]
    return result


def test_projection_uses_the_measured_step_and_checkpoint_times(tmp_path):
    result = _with_checkpoint_times(suite_result(tmp_path))
    budget = BudgetConfig(tokens="2B", cost_per_gpu_hour=3.0)  # type: ignore[arg-type]  # parsed by the model
    projection = project_budget(budget, get_model("llama3.1-8b"), get_gpu("h100"), result)
    assert projection is not None and projection.combo == PASSING
    # the passing combo: 1.122 s per step of GBS 8 x seq 1024, on 2 GPUs
    steps = 2e9 / (8 * 1024)
    assert projection.step_time_s == pytest.approx(1.122)
    assert projection.checkpoint_save_s == 12.0 and projection.checkpoint_load_s == 8.0
    assert "measured by the checkpoint stage" in projection.checkpoint_source
    assert projection.days is not None and projection.days >= steps * 1.122 / 86400
    assert projection.gpu_hours == pytest.approx(projection.days * 24 * 2)
    assert projection.cost == pytest.approx(projection.gpu_hours * 3.0)
    assert projection.energy_mwh == pytest.approx(projection.gpu_hours * 700 / 1e6)
    assert 0 < projection.effective_training_time_pct <= 100


def test_no_budget_no_projection_and_no_passing_combo_says_so(tmp_path):
    result = suite_result(tmp_path)
    assert project_budget(None, get_model("llama3.1-8b"), None, result) is None
    for combo in result.combos:
        combo.verdict = Verdict.FAIL
    projection = project_budget(BudgetConfig(tokens=1e9), get_model("llama3.1-8b"), None, result)
    assert projection is not None and projection.days is None and "nothing to project" in projection.notes[0]


def test_report_and_run_deck_carry_the_projection(tmp_path):
    result = _with_checkpoint_times(write_run_dir(tmp_path))
    result.budget = project_budget(BudgetConfig(tokens="15.6T"), get_model("llama3.1-8b"),  # type: ignore[arg-type]
                                   get_gpu("h100"), result)
    files = render_report(result, tmp_path)
    html = files.html.read_text(encoding="utf-8")
    assert 'id="budget"' in html and "Effective training time" in html and "Checkpoint interval" in html
    deck = json.loads(files.run_deck.read_text(encoding="utf-8"))
    assert deck["budget"]["tokens"] == pytest.approx(15.6e12)
    assert deck["budget"]["effective_training_time_pct"] == pytest.approx(result.budget.effective_training_time_pct)


def test_suite_config_takes_a_budget_and_names_a_bad_one(tmp_path):
    raw = filled_in(raw_cvs(SINGLE_8B))
    raw["budget"] = {"tokens": "15.6T", "cost_per_gpu_hour": 2}
    check = check_suite(write_suite(tmp_path, raw, SINGLE_8B))
    assert check.ok, check.problems
    assert check.suite is not None and check.suite.config.budget is not None
    assert check.suite.config.budget.tokens == pytest.approx(15.6e12)
    raw["budget"] = {"tokens": "12Q", "flops": 1}
    check = check_suite(write_suite(tmp_path, raw, SINGLE_8B))
    assert {p.path for p in check.problems} >= {"budget.tokens", "budget.flops"}
