"""A suite config's `budget:`: the run's measured step and checkpoint times projected onto the token budget, in
the result, the run deck and the report page."""

from __future__ import annotations

import json
import math

import jsonschema
import pytest

from megapilot.catalog import get_gpu, get_model
from megapilot.errors import MegapilotError
from megapilot.report import render_report
from megapilot.report.run_deck import run_deck_json_schema
from megapilot.suite.budget import BudgetConfig, project_budget
from megapilot.suite.config import check_suite
from megapilot.suite.results import MetricRow, Verdict, read_suite_result
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


def test_phases_and_a_batch_warm_up_scale_the_measured_step_by_the_estimators_ratio(tmp_path):
    from megapilot.estimate.budget import Shape, layout_step_cost
    from megapilot.spec import ClusterSpec, ParallelConfig
    from megapilot.spec.training import TrainingSpec

    result = _with_checkpoint_times(write_run_dir(tmp_path))
    model, h100 = get_model("llama3.1-8b"), get_gpu("h100")
    budget = BudgetConfig(tokens="2B", phases=[{"tokens": "200M", "seq_len": 4096}],  # type: ignore[arg-type]
                          rampup_batch_size=[4, 2, 8000])  # type: ignore[arg-type]  # parsed by the model
    projection = project_budget(budget, model, h100, result)
    plain = project_budget(BudgetConfig(tokens="2B"), model, h100, result)  # type: ignore[arg-type]
    assert projection is not None and plain is not None and projection.days is not None
    names = [s.name for s in projection.segments]
    assert names == ["batch warm-up 4", "batch warm-up 6", "main", "phase 1: seq_len 4,096"]
    warm_4, warm_6, main, phase = projection.segments
    assert main.step_time_s == pytest.approx(1.122) and projection.step_time_s == pytest.approx(1.122)
    assert sum(s.tokens for s in projection.segments) == pytest.approx(2e9)
    # SAMPLES in shares of 4,000 at seq 1,024: 1,000 steps of 4, then 667 of 6, the last 2 samples past SAMPLES
    assert (warm_4.tokens, warm_6.tokens) == (4000 * 1024, 4002 * 1024)
    assert (warm_4.iterations, warm_6.iterations) == (1000, 667)
    assert phase.tokens == pytest.approx(200e6) and phase.iterations == 6104  # 6,103.5 steps' tokens: whole steps
    # another shape: the measured step x the estimator's ratio for the combo's layout (1 node x 2 GPUs, TP 1)
    estimated = layout_step_cost(model, ClusterSpec(gpu=h100, num_nodes=1, gpus_per_node=2),
                                 TrainingSpec(seq_length=1024, global_batch_size=8),
                                 ParallelConfig.for_world(2, tp=1, pp=1, mbs=1))
    measured = estimated(Shape(1024, 8)).step_time_s
    for piece, shape in ((warm_4, Shape(1024, 4)), (phase, Shape(4096, 8))):
        assert piece.step_time_s == pytest.approx(1.122 * estimated(shape).step_time_s / measured, rel=1e-6)
    assert warm_4.step_time_s < warm_6.step_time_s < main.step_time_s < phase.step_time_s
    # the pieces' failure-free days are within the run's; without phases or warm-up, one piece at the measured step
    assert sum(s.days for s in projection.segments) <= projection.days
    assert projection.days != pytest.approx(plain.days, rel=1e-4) and len(plain.segments) == 1
    assert plain.segments[0].days == pytest.approx(244_141 * 1.122 / 86400)  # 2e9 / (8 x 1024), a whole step up
    assert any("phase 1: seq_len 4,096: does not fit" in note for note in projection.notes)  # as the estimate says
    assert any("estimator's ratio" in note for note in projection.notes)
    result.budget = projection
    files = render_report(result, tmp_path)
    assert "phase 1: seq_len 4,096" in files.html.read_text(encoding="utf-8")
    deck = json.loads(files.run_deck.read_text(encoding="utf-8"))
    assert [s["name"] for s in deck["budget"]["segments"]] == names


def test_a_piece_s_iterations_are_described_as_they_are_counted(tmp_path):
    """Its steps are tokens / (seq_len x gbs) rounded up (steps_to_train), in the run deck's schema too."""
    from megapilot.suite.budget import BudgetSegment

    description = BudgetSegment.model_fields["iterations"].description
    assert description is not None and description.startswith("Its steps: tokens / (seq_len x gbs), rounded up")
    assert run_deck_json_schema()["$defs"]["BudgetSegment"]["properties"]["iterations"]["description"] == description
    budget = BudgetConfig(tokens="2B", phases=[{"tokens": "200M", "seq_len": 4096}])  # type: ignore[arg-type]
    projection = project_budget(budget, get_model("llama3.1-8b"), get_gpu("h100"),
                                _with_checkpoint_times(write_run_dir(tmp_path)))
    assert projection is not None
    for piece in projection.segments:
        assert piece.iterations == math.ceil(piece.tokens / (piece.seq_len * piece.gbs))


def test_a_piece_s_steps_are_a_whole_number_in_suite_json_the_run_deck_and_its_schema(tmp_path):
    # typed float, a piece's steps were written 244141.0 and the schema said any number
    assert run_deck_json_schema()["$defs"]["BudgetSegment"]["properties"]["iterations"]["type"] == "integer"
    result = _with_checkpoint_times(write_run_dir(tmp_path / "run"))
    result.budget = project_budget(BudgetConfig(tokens="2B", rampup_batch_size=[4, 2, 8000]),  # type: ignore[arg-type]
                                   get_model("llama3.1-8b"), get_gpu("h100"), result)
    assert result.budget is not None and [type(s.iterations) for s in result.budget.segments] == [int] * 3
    result.write(tmp_path / "run")
    stored = json.loads((tmp_path / "run" / "suite.json").read_text(encoding="utf-8"))["budget"]["segments"]
    assert [s["iterations"] for s in stored] == [1000, 667, 243_141]  # (2e9 / 1,024 - 8,002) / 8 = 243,140.4
    assert all(type(s["iterations"]) is int for s in stored)
    deck = json.loads(render_report(read_suite_result(tmp_path / "run"), tmp_path / "run").run_deck.read_text())
    assert [s["iterations"] for s in deck["budget"]["segments"]] == [1000, 667, 243_141]
    assert all(type(s["iterations"]) is int for s in deck["budget"]["segments"])


@pytest.mark.parametrize(("stored", "read"), [(244_141.0, 244_141), (244_140.625, 244_141), (1000, 1000)])
def test_a_piece_s_steps_in_an_earlier_suite_json_read_as_whole_steps(tmp_path, stored, read):
    # an earlier suite.json wrote a piece's steps as a float, and before whole steps as the fraction of its tokens
    # (2e9 / 8,192 = 244,140.625): `suite report` and `suite run --resume` still read it, the part step rounded up
    result = _with_checkpoint_times(write_run_dir(tmp_path / "run"))
    result.budget = project_budget(BudgetConfig(tokens="2B"), get_model("llama3.1-8b"),  # type: ignore[arg-type]
                                   get_gpu("h100"), result)
    path = result.write(tmp_path / "run")
    raw = json.loads(path.read_text(encoding="utf-8"))
    raw["budget"]["segments"][0]["iterations"] = stored
    path.write_text(json.dumps(raw), encoding="utf-8")
    again = read_suite_result(tmp_path / "run")
    assert again.budget is not None and again.budget.segments[0].iterations == read
    deck = json.loads(render_report(again, tmp_path / "run").run_deck.read_text())
    jsonschema.Draft202012Validator(run_deck_json_schema()).validate(deck)
    assert deck["budget"]["segments"][0]["iterations"] == read
    # a count that is no number of steps at all is still refused by its field
    raw["budget"]["segments"][0]["iterations"] = "many"
    path.write_text(json.dumps(raw), encoding="utf-8")
    with pytest.raises(MegapilotError) as refused:
        read_suite_result(tmp_path / "run")
    assert refused.value.field == "run_dir"


def test_phases_and_warm_up_are_read_as_the_cli_reads_them():
    written = BudgetConfig(tokens="2B", phases=["tokens=200M,seq_len=4096,cp=2"],  # type: ignore[arg-type]
                           rampup_batch_size="4 2 8000")  # type: ignore[arg-type]
    mapped = BudgetConfig(tokens="2B", phases=[{"tokens": 2e8, "seq_len": 4096, "cp": 2, "tp": None}],  # type: ignore[arg-type]
                          rampup_batch_size=[4, 2, 8000])  # type: ignore[arg-type]
    assert written == mapped and written.rampup is not None and written.rampup.levels(8) == [(4, 1000), (6, 667)]
    assert BudgetConfig.model_validate(written.model_dump()) == written  # a dumped config reads back


@pytest.mark.parametrize(("budget", "path", "words", "fix"), [
    ({"phases": [{"tokens": "1B", "flops": 2}]}, "budget.phases", "unknown key 'flops'", "keys: tokens, seq_len"),
    ({"phases": [{"seq_len": 4096}]}, "budget.phases", "needs its tokens", "write each phase as"),
    ({"phases": ["tokens=1B,seq_len=big"]}, "budget.phases", "not a whole number", "write each phase as"),
    ({"phases": {"tokens": "1B"}}, "budget.phases", "not a list of phases", "write each phase as"),
    ({"phases": [{"tokens": "20T"}]}, "budget", "leave none of the budget", "give fewer, or a larger budget"),
    ({"rampup_batch_size": [16, 16]}, "budget.rampup_batch_size", "three whole numbers", "e.g. [256, 256"),
    ({"rampup_batch_size": [0, 16, 1000]}, "budget.rampup_batch_size", "must be > 0", "e.g. [256, 256"),
    # against the sweep's cells (GBS 128, MBS 4 on 8 GPUs), by the code that cuts the projected run
    ({"rampup_batch_size": [128, 16, 1000]}, "budget.rampup_batch_size", "(combo MBS=4,GBS=128",
     "START < GBS"),
    ({"rampup_batch_size": [32, 36, 1000]}, "budget.rampup_batch_size", "not a positive multiple of INCREMENT 36",
     "divisible by INCREMENT"),
    ({"rampup_batch_size": [32, 24, 1000]}, "budget.rampup_batch_size", "GBS 56", "multiple of 32"),
    ({"phases": [{"tokens": "1T", "tp": 3}]}, "budget.phases", "does not divide 8 GPUs", "product divides"),
])
def test_a_bad_phase_or_warm_up_is_named_with_its_fix(tmp_path, budget, path, words, fix):
    raw = filled_in(raw_cvs(SINGLE_8B))
    raw["budget"] = {"tokens": "15.6T", **budget}
    check = check_suite(write_suite(tmp_path, raw, SINGLE_8B))
    problems = [p for p in check.problems if p.path == path]
    assert len(problems) == 1 and len(check.problems) == 1, check.problems
    assert words in problems[0].message and fix in problems[0].message + problems[0].fix


def test_the_suite_config_takes_phases_and_a_warm_up_that_fit_its_cells(tmp_path):
    raw = filled_in(raw_cvs(SINGLE_8B))
    raw["budget"] = {"tokens": "15.6T", "phases": [{"tokens": "800B", "seq_len": 131072, "cp": 8}],
                     "rampup_batch_size": [32, 32, 1000000]}
    check = check_suite(write_suite(tmp_path, raw, SINGLE_8B))
    assert check.ok, check.problems
    assert check.suite is not None and check.suite.config.budget is not None
    assert check.suite.config.budget.phases[0].cp == 8
