"""The run deck: CVS keys where they mean the same, megapilot's additions, and the shipped JSON Schema."""

from __future__ import annotations

import copy
import json

import jsonschema
import pytest

from megapilot.report.render import render_report
from megapilot.report.run_deck import (
    RUN_DECK_NAME,
    build_run_deck,
    run_deck_json_schema,
    schema_file_text,
    shipped_schema_text,
)
from tests.report.factory import (
    FAILING,
    NEVER_STARTED,
    PASSING,
    STOPPED,
    STOPPED_DIR,
    interrupted_result,
    suite_result,
    write_interrupted_run_dir,
)


@pytest.fixture(scope="module")
def schema() -> dict:
    return json.loads(shipped_schema_text())


@pytest.fixture
def deck(rendered) -> dict:
    return json.loads((rendered.run_dir / RUN_DECK_NAME).read_text(encoding="utf-8"))


def _cell(deck: dict, cell_id: str) -> dict:
    return next(cell for cell in deck["cells"] if cell["cell_id"] == cell_id)


def test_shipped_schema_is_the_one_the_models_derive(schema):
    # A changed model without a regenerated file fails here: run megapilot.report.run_deck.write_schema_file().
    assert shipped_schema_text() == schema_file_text()
    assert schema == run_deck_json_schema()


def test_shipped_schema_is_a_valid_draft_2020_12_schema(schema):
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(schema)


def test_every_field_of_the_schema_is_documented(schema):
    undocumented = [f"{name}.{field}" for name, definition in [("RunDeck", schema), *schema["$defs"].items()]
                    for field, spec in definition.get("properties", {}).items() if not spec.get("description")]
    assert undocumented == []


def test_generated_deck_validates_against_the_schema(schema, deck):
    jsonschema.Draft202012Validator(schema).validate(deck)


@pytest.mark.parametrize("breakage", [
    "drop_cells", "unknown_status", "metric_status_word", "extra_key", "curve_point_text", "wrong_version"])
def test_schema_rejects_a_broken_deck(schema, deck, breakage):
    broken = copy.deepcopy(deck)
    if breakage == "drop_cells":
        del broken["cells"]
    elif breakage == "unknown_status":
        broken["overall_status"] = "ok"
    elif breakage == "metric_status_word":
        broken["cells"][0]["metrics"][0]["status"] = "PASSED"
    elif breakage == "extra_key":
        broken["cells"][0]["bar_pct"] = 50
    elif breakage == "curve_point_text":
        broken["cells"][0]["loss_curve"][0] = [1, "ten"]
    elif breakage == "wrong_version":
        broken["schema_version"] = 2
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(schema).validate(broken)


def test_deck_keeps_cvs_keys(deck):
    for key in ("schema_version", "suite_id", "generated_at", "overall_status", "run_card_display", "provenance",
                "lifecycle", "cells", "results_table"):
        assert key in deck
    cell = _cell(deck, PASSING)
    for key in ("cell_id", "mbs", "gbs", "precision", "tp", "pp", "metrics", "actuals", "loss_curve",
                "throughput_curve", "tokens_curve", "learning_rate_curve", "grad_norm_curve", "planned_steps"):
        assert key in cell
    assert set(cell["metrics"][0]) >= {"label", "metric", "actual", "unit", "spec", "status", "margin"}
    assert deck["results_table"]["headers"][0] == "Cell"
    assert [row[0] for row in deck["results_table"]["rows"]] == [PASSING, FAILING]


def test_statuses_use_cvs_words(deck):
    assert deck["overall_status"] == "fail"
    assert _cell(deck, PASSING)["status"] == "pass"
    assert _cell(deck, FAILING)["status"] == "fail"
    statuses = {m["metric"]: m["status"] for m in _cell(deck, PASSING)["metrics"]}
    assert statuses["training.throughput_per_gpu"] == "pass"
    assert statuses["training.lm_loss"] == "record"
    assert statuses["training.grad_norm"] == "skip"
    assert {s["label"]: s["status"] for s in deck["lifecycle_stages"]}["tokenizer"] == "na"


def test_cell_values_come_from_the_result(deck, rendered):
    combo = rendered.result.combo(PASSING)
    cell = _cell(deck, PASSING)
    assert (cell["mbs"], cell["gbs"], cell["precision"], cell["tp"], cell["pp"]) == (1, 8, "BF16", 1, 1)
    assert cell["actuals"]["training.tokens_per_gpu"] == combo.actual("training.tokens_per_gpu")
    assert cell["loss_curve"] == [list(point) for point in combo.curves[0].points]
    assert cell["cell_lifecycle"] == {"train": 61.5}
    assert deck["lifecycle"][f"train [{FAILING}]"] == 40.2
    assert cell["log_files"] == ["logs/MBS=1,GBS=8,PRECISION=BF16/node0.log"]


def test_not_finite_values_become_null_and_curves_drop_them(rendered):
    # the in-memory result (suite.json cannot hold NaN): a NaN loss and a NaN learning rate point
    deck = build_run_deck(rendered.result, {}, report_href="report.html", junit_href="junit.xml")
    cell = next(c for c in deck.cells if c.cell_id == FAILING)
    assert cell.actuals["training.lm_loss"] is None
    assert cell.learning_rate_curve == [(1, 1e-4)]
    def refuse(token: str) -> None:
        raise AssertionError(f"{token} written into the deck")

    json.loads(deck.model_dump_json(), parse_constant=refuse)  # strict JSON: no NaN / Infinity tokens


def test_predicted_against_measured(deck):
    comparisons = {c["quantity"]: c for c in _cell(deck, PASSING)["predicted"]["comparisons"]}
    step = comparisons["step_time_ms"]
    assert (step["predicted"], step["measured"]) == (1050.0, 1122.0)
    assert step["error_pct"] == pytest.approx((1122.0 - 1050.0) / 1050.0 * 100)
    assert comparisons["memory_gib"]["measured"] == 52.5
    failing = {c["quantity"]: c for c in _cell(deck, FAILING)["predicted"]["comparisons"]}
    assert failing["memory_gib"]["measured"] is None and failing["memory_gib"]["error_pct"] is None
    assert set(failing) == {"step_time_ms", "tokens_per_s_per_gpu", "memory_gib"}  # what was predicted, only


def test_predicted_rates_are_per_gpu_in_their_unit(deck):
    """The comparison of tokens/s/GPU said "tokens/s" (a job's rate is the per-GPU one times every GPU): each
    predicted quantity is in the unit the metric table gives the metric measuring it."""
    from megapilot.suite.metric_table import METRICS

    unit_of = {info.quantity: info.unit for info in reversed(METRICS.values()) if info.quantity}
    comparisons = {c["quantity"]: c["unit"] for c in _cell(deck, PASSING)["predicted"]["comparisons"]}
    assert comparisons == {quantity: unit_of[quantity] for quantity in comparisons}
    assert comparisons["tokens_per_s_per_gpu"] == "tok/s/GPU" and comparisons["tflops_per_gpu"] == "TFLOP/s/GPU"


def test_the_headline_metric_is_one_the_run_measured(deck, tmp_path):
    """A CPU run's deck led with training.throughput_per_gpu, which a CPU never measures (its log prints 0.0)."""
    assert deck["report"]["headline_metric"] == "training.throughput_per_gpu"  # a GPU run: CVS's
    result = suite_result(tmp_path)
    for combo in result.combos:  # as a CPU run records it: TFLOP/s not measured, no TFLOP/s curve
        combo.metrics = [row.model_copy(update={"value": None}) if row.name == "training.throughput_per_gpu" else row
                         for row in combo.metrics]
        combo.curves = [curve for curve in combo.curves if curve.name != "tflops_per_gpu"]
    cpu = build_run_deck(result, {}, report_href="r", junit_href="j")
    assert cpu.report.headline_metric == "training.tokens_per_gpu"
    assert any(m.metric == "training.tokens_per_gpu" and m.actual for cell in cpu.cells for m in cell.metrics)
    for combo in result.combos:  # nor tokens/s: the step time is what it measured
        combo.metrics = [row for row in combo.metrics if row.name != "training.tokens_per_gpu"]
        combo.curves = [curve for curve in combo.curves if curve.name != "tokens_per_s_per_gpu"]
    steps = build_run_deck(result, {}, report_href="r", junit_href="j")
    assert steps.report.headline_metric == "training.elapsed_time_per_iteration"


def test_regressions_findings_and_summary(deck):
    assert deck["regressions"][0]["message"] == "tokens/s -8.3 % vs the median of the last 5 runs"
    assert deck["regressions"][0]["cell_id"] == PASSING
    assert [(cell, f["category"], f["rank"]) for cell, found in deck["findings"].items() for f in found] == [
        (FAILING, "oom", 1)]
    assert deck["findings"][FAILING][0]["evidence"][0]["line"] == 412
    assert deck["summary"] == {"mode": "sweep", "total_cells": 2, "passed": 1, "failed": 1, "recorded": 0,
                               "not_run": 0, "interrupted": 0, "not_started": 0}


def test_run_card_display_rows_are_label_value_link(deck):
    rows = {label: (value, is_link) for label, value, is_link in deck["run_card_display"]}
    assert rows["Model"] == ("llama3-tiny (llama)", False)
    assert rows["Parallelism"][0] == "TP=1,PP=1,CP=1,EP=1,DP=2"
    assert rows["Thresholds"][0] == "examples/suites/thresholds.json"
    assert deck["provenance"]["git_commit"] == "0123456789abcdef0123456789abcdef01234567"
    assert deck["provenance"]["report_href"] == "report.html"


def test_a_run_with_nothing_measured_still_makes_a_valid_deck(schema, tmp_path):
    result = suite_result(tmp_path)
    result.combos, result.stages, result.regressions = [], [], []
    result.card.gpu = "no-such-gpu"
    result.recompute_verdict()
    deck = json.loads(build_run_deck(result, {}, report_href="r", junit_href="j").model_dump_json())
    jsonschema.Draft202012Validator(schema).validate(deck)
    assert deck["overall_status"] == "na" and deck["summary"]["mode"] == "single"


def test_an_interrupted_run_is_interrupted_in_its_status_and_keeps_the_cell_it_stopped_in(schema, tmp_path):
    write_interrupted_run_dir(tmp_path)
    deck = json.loads(render_report(interrupted_result(tmp_path), tmp_path).run_deck.read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator(schema).validate(deck)
    assert (deck["overall_status"], deck["verdict"], deck["exit_code"], deck["finished"]) == (
        "interrupted", "INTERRUPTED", 130, False)
    assert deck["overall_reason"].startswith(f"stopped by SIGINT during combo 2 of 3 ({STOPPED}: train, iteration 10")
    stopped = _cell(deck, STOPPED)
    assert (stopped["status"], stopped["reason"]) == ("interrupted", "interrupted at iteration 10 of 80 by SIGINT")
    assert (stopped["job"]["iterations_reached"], stopped["job"]["train_iters"]) == (10, 80)
    assert stopped["log_files"] == [f"logs/{STOPPED_DIR}/node0.log"] and (tmp_path / stopped["log_files"][0]).is_file()
    assert stopped["log_tail"][-1] == "[rank0]: <stopped> by SIGINT"
    assert _cell(deck, PASSING)["status"] == "pass" and deck["not_started"] == [NEVER_STARTED]
    assert (deck["summary"]["interrupted"], deck["summary"]["not_started"], deck["summary"]["total_cells"]) == (1, 1, 2)
    train = next(s for s in deck["lifecycle_stages"] if s["label"] == f"train [{STOPPED}]")
    assert train["status"] == "interrupted"


def test_a_sweep_killed_after_its_first_combo_is_still_a_sweep(schema, tmp_path):
    result = interrupted_result(tmp_path)
    result.combos = result.combos[:1]  # the second combo never written: the run was killed outright
    deck = json.loads(build_run_deck(result, {}, report_href="r", junit_href="j").model_dump_json())
    jsonschema.Draft202012Validator(schema).validate(deck)
    assert deck["summary"]["mode"] == "sweep" and deck["summary"]["total_cells"] == 1
    assert deck["summary"]["not_started"] == 2
