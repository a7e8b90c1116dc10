"""Threshold specs: each kind's required fields and how its gate reads."""

from __future__ import annotations

import pytest

from megapilot.catalog.gpus import get_gpu
from megapilot.suite.results import Verdict
from megapilot.suite.thresholds import (
    SETTLED_FIX,
    THRESHOLD_KINDS,
    GateInput,
    Peak,
    ThresholdSpec,
    parse_threshold,
    peak_issue,
    threshold,
)


@pytest.mark.parametrize(("spec", "text"), [
    ({"kind": "min", "value": 100}, ">= 100"),
    ({"kind": "min_tok_s", "value": 1000}, ">= 1000"),
    ({"kind": "max", "value": 0.85}, "<= 0.85"),
    ({"kind": "max_ms", "value": 500}, "<= 500 ms"),
    ({"kind": "within", "value": 100, "tolerance_pct": 5}, "100 +/-5%"),
    ({"kind": "min_ratio", "value": 0.9, "reference": "training.tokens_per_gpu"}, ">= 0.9 x training.tokens_per_gpu"),
    ({"kind": "info"}, "info"),
    ({"kind": "info", "value": 85.0}, "info (85)"),
    ({"kind": "baseline", "tolerance_pct": 10, "last_n": 3}, "median of last 3 passing runs +/-10%"),
])
def test_each_kind_describes_its_gate(spec, text):
    assert parse_threshold(spec).describe() == text


@pytest.mark.parametrize(("spec", "problem"), [
    ({"kind": "min"}, "needs a numeric 'value'"),
    ({"kind": "within", "value": 1}, "needs 'tolerance_pct'"),
    ({"kind": "baseline"}, "needs 'tolerance_pct'"),
    ({"kind": "min_ratio", "value": 1}, "needs 'reference'"),
    ({"kind": "at_least", "value": 1}, "kind"),
])
def test_a_spec_missing_what_its_kind_needs_is_refused(spec, problem):
    with pytest.raises(ValueError, match=problem):
        parse_threshold(spec)


@pytest.mark.parametrize(("spec", "problem"), [
    ({"value": 1}, "the spec has no 'kind' (use one of min, "),  # was: kind None is not a threshold kind
    (12, "a spec is an object with a kind, not 12"),  # was: ': Input should be a valid dictionary ...'
    ([1, 2], "a spec is an object with a kind, not [1, 2]"),
])
def test_a_spec_without_a_kind_or_not_an_object_says_so(spec, problem):
    with pytest.raises(ValueError) as caught:
        parse_threshold(spec)
    assert str(caught.value).startswith(problem)


def test_cvs_extra_keys_are_kept_and_optional_defaults_off():
    spec = parse_threshold({"kind": "max", "value": 1, "_comment": "from CVS"})
    assert spec.optional is False and spec.model_extra == {"_comment": "from CVS"}


def test_every_kind_is_one_class_that_describes_and_judges_itself():
    from typing import get_args

    from megapilot.suite.results import Verdict
    from megapilot.suite.thresholds import GateInput

    classes = get_args(get_args(ThresholdSpec)[0])
    assert len(classes) == len({c.__name__ for c in classes})
    for kind_class in classes:
        # each class overrides the two methods itself: no shared if-chain over kinds
        assert "describe" in vars(kind_class) and ("judge_value" in vars(kind_class) or "judge" in vars(kind_class))
    assert set(THRESHOLD_KINDS) == {"min", "min_tok_s", "max", "max_ms", "within", "min_ratio", "info", "baseline",
                                    "predicted"}
    gate = GateInput("training.tokens_per_gpu", 90.0, {"training.tokens_per_gpu": 90.0})
    assert threshold(kind="min", value=100).judge(gate).verdict is Verdict.FAIL
    assert threshold(kind="max", value=100).judge(gate).verdict is Verdict.PASS
    assert threshold(kind="within", value=100, tolerance_pct=5).judge(gate).verdict is Verdict.FAIL
    assert threshold(kind="info").judge(gate).verdict is Verdict.RECORD
    assert threshold(kind="baseline", tolerance_pct=5).judge(gate).verdict is Verdict.RECORD  # no history yet


# ---- what `suite check` says of a spec before anything runs --------------------------------------------------
def _issues(metric: str, data: dict) -> list:
    from megapilot.suite.thresholds import spec_issues

    return spec_issues(metric, data, parse_threshold(data))


def test_a_misspelt_metric_blocks_naming_the_measured_one():
    (issue,) = _issues("training.tokens_per_gpuu", {"kind": "min", "value": 50})
    assert issue.blocks and "unknown metric 'training.tokens_per_gpuu'" in issue.message
    assert "did you mean training.tokens_per_gpu" in issue.message and "fails every run" in issue.message
    assert issue.fix == "rename it to training.tokens_per_gpu"


def test_a_name_only_the_history_reads_blocks_naming_the_measured_metric_of_the_same_quantity():
    (issue,) = _issues("training.tflops_per_gpu", {"kind": "min", "value": 100})
    assert issue.blocks and "not measured by the suite" in issue.message
    assert issue.fix == "rename it to training.throughput_per_gpu"


@pytest.mark.parametrize(("spec", "said"), [
    ({"kind": "info", "value": 2500, "optional": True}, "recorded as not measured"),
    ({"kind": "min", "value": 1, "optional": True}, "SKIPPED on every run"),
])
def test_an_unmeasured_metric_that_only_records_or_skips_is_a_warning(spec, said):
    # a name nothing measures (CVS's `time_to_target_seconds` was one until the metric table knew it, below)
    (issue,) = _issues("training.steps_to_targets", spec)
    assert not issue.blocks and said in issue.message and "training.steps_to_target" in issue.message


@pytest.mark.parametrize("spec", [{"kind": "info", "value": 2500, "optional": True},  # as CVS's files gate it
                                  {"kind": "max", "value": 2500}])
def test_cvs_name_of_the_time_to_target_is_the_measured_metric_with_nothing_to_say(spec):
    assert _issues("training.time_to_target_seconds", spec) == []
    floor = _issues("training.time_to_target_seconds", {"kind": "max", "value": -1})  # judged as the measured one
    assert [issue.message for issue in floor] == [
        "a ceiling of -1 fails every run (training.time_to_target_s is never below 0)"]


def test_a_min_ratio_reference_under_cvs_name_is_the_measured_metric():
    spec = parse_threshold({"kind": "min_ratio", "value": 0.5, "reference": "training.time_to_target_seconds"})
    assert spec.reference == "training.time_to_target_s"
    gate = GateInput("training.steps_to_target", 10.0, {"training.time_to_target_s": 4.0})
    assert spec.judge(gate).verdict is Verdict.PASS


def test_a_min_ratio_reference_nobody_measures_blocks():
    (issue,) = _issues("training.throughput_per_gpu",
                       {"kind": "min_ratio", "value": 0.9, "reference": "training.tokens_per_gpus"})
    assert issue.blocks and "unknown reference metric" in issue.message
    assert issue.fix == "rename it to training.tokens_per_gpu"


@pytest.mark.parametrize(("spec", "blocks", "said"), [
    ({"kind": "min", "value": 50, "optinal": True}, True, "unknown field 'optinal' (did you mean optional?)"),
    # (a kind that suits tokens/s: a ceiling on it would be said as well)
    ({"kind": "min_tok_s", "value": 500, "tolerance_pct": 5}, True, "'tolerance_pct' is not read by kind 'min_tok_s'"),
    ({"kind": "min", "value": 50, "tolerence_pct": 5}, True, "tolerance_pct belongs to kind baseline, within"),
    ({"kind": "min", "value": 50, "bogus": 1}, False, "'bogus' is not a field of a threshold spec; ignored"),
])
def test_fields_a_kind_does_not_read_are_said_a_slip_or_another_kinds_blocks(spec, blocks, said):
    (issue,) = _issues("training.tokens_per_gpu", spec)
    assert issue.blocks is blocks and said in issue.message


@pytest.mark.parametrize(("metric", "spec", "said"), [
    # the metric table's range, whatever kind gates it: min_tok_s and max_ms have no rule of their own
    ("training.tokens_per_gpu", {"kind": "min_tok_s", "value": -5},
     "a floor of -5 passes every run (training.tokens_per_gpu is never below 0)"),
    ("training.elapsed_time_per_iteration", {"kind": "max_ms", "value": 0},
     "a ceiling of 0 ms fails every run (training.elapsed_time_per_iteration is always above 0)"),
    ("training.step_time_p50_ms", {"kind": "max", "value": 0},
     "a ceiling of 0 fails every run (training.step_time_p50_ms is always above 0)"),
    ("training.lm_loss", {"kind": "predicted", "min_ratio": 0.9}, "megapilot predicts no training.lm_loss"),
    # CVS's own kinds on the metric's range: `max` on a step time, a memory fraction, a count
    ("training.elapsed_time_per_iteration", {"kind": "max", "value": -5}, "fails every run"),
    ("training.mem_usage", {"kind": "max", "value": -1}, "fails every run"),
    ("training.mem_usage", {"kind": "max", "value": 85}, "passes every run (training.mem_usage is never above 1; "
                                                         "did you mean 0.85?)"),
    ("training.mem_usage", {"kind": "max", "value": 1.5}, "passes every run (training.mem_usage is never above 1)"),
    ("training.mem_usage", {"kind": "min", "value": 1.5}, "fails every run"),
    ("training.mfu_pct", {"kind": "min", "value": 140}, "fails every run"),
    ("training.throughput_per_gpu", {"kind": "min", "value": 0}, "passes every run"),
    ("training.nan_iterations", {"kind": "max", "value": -1}, "fails every run"),
])
def test_a_bound_that_settles_every_verdict_blocks(metric, spec, said):
    (issue,) = _issues(metric, spec)
    assert issue.blocks and said in issue.message


def test_sound_specs_and_comment_fields_say_nothing():
    assert _issues("training.tokens_per_gpu", {"kind": "min_tok_s", "value": 50, "_note": "x"}) == []
    assert _issues("training.elapsed_time_per_iteration", {"kind": "within", "value": 5, "tolerance_pct": 5}) == []
    assert _issues("training.tokens_per_gpu", {"kind": "predicted", "min_ratio": 0.9}) == []
    # bounds a measurement can miss: a count of 0 NaN iterations, the whole GPU, a slope below 0
    assert _issues("training.nan_iterations", {"kind": "max", "value": 0}) == []
    assert _issues("training.mem_usage", {"kind": "max", "value": 1}) == []
    assert _issues("training.loss_slope", {"kind": "max", "value": -0.01}) == []


@pytest.mark.parametrize("metric, spec, said, fix", [
    # CVS's legacy suite gated the step time as higher-is-better: a floor on it passes a slower run
    ("training.elapsed_time_per_iteration", {"kind": "min", "value": 500},
     "a floor (min) on training.elapsed_time_per_iteration, which is better lower",
     "use kind max for a ceiling (max_ms for a time in ms)"),
    ("training.tokens_per_gpu", {"kind": "max", "value": 5000}, "a ceiling (max) on training.tokens_per_gpu, which is "
     "better higher", "use kind min for a floor"),
    ("training.lm_loss", {"kind": "max_ms", "value": 9}, "kind max_ms is for a metric in ms; training.lm_loss is in "
     "no unit", "use kind max"),
    ("training.throughput_per_gpu", {"kind": "min_tok_s", "value": 100}, "kind min_tok_s is for a metric in tok/s/GPU; "
     "training.throughput_per_gpu is in TFLOP/s/GPU", "use kind min"),
])
def test_a_bound_pointing_the_wrong_way_or_named_for_another_unit_is_a_warning(metric, spec, said, fix):
    (issue,) = _issues(metric, spec)
    assert not issue.blocks and issue.message.startswith(said) and issue.fix == fix


def test_no_cvs_threshold_file_has_a_blocking_issue():
    import json
    from pathlib import Path

    from megapilot.suite.thresholds import spec_issues

    files = sorted((Path(__file__).parents[1] / "data" / "cvs").glob("*_threshold.json"))
    assert files
    for path in files:
        for cell, specs in json.loads(path.read_text()).items():
            for metric, data in specs.items() if isinstance(specs, dict) else ():
                if not metric.startswith("_"):
                    blocking = [i for i in spec_issues(metric, data, parse_threshold(data)) if i.blocks]
                    assert blocking == [], (path.name, cell, metric)


# ---- a bound the suite's GPU settles: its dense peak at the cell's precision ---------------------------------
def _peak(gpu: str = "MI300X", precision: str = "FP8") -> Peak | None:
    return Peak.of(get_gpu(gpu), precision)


def test_a_cell_s_peak_is_the_catalog_s_dense_peak_of_its_precision():
    fp8, bf16 = _peak(precision="FP8"), _peak(precision="BF16")
    assert fp8 is not None and bf16 is not None and (fp8.tflops, bf16.tflops) == (2614.9, 1307.4)
    assert str(fp8) == "2614.9 TFLOP/s/GPU, the MI300X dense FP8 peak"
    assert _peak(precision="FP32") is None  # no catalog peak: nothing to hold a gate to


def test_a_throughput_floor_above_the_gpu_s_peak_fails_every_run_naming_the_peak():
    peak = _peak()
    impossible = peak_issue("training.throughput_per_gpu", threshold(kind="min", value=1e9), peak)
    assert impossible is not None and impossible.blocks and impossible.fix == SETTLED_FIX
    assert impossible.message == ("a floor of 1e+09 fails every run (training.throughput_per_gpu is never above "
                                  "2614.9 TFLOP/s/GPU, the MI300X dense FP8 peak)")
    ceiling = peak_issue("training.throughput_per_gpu", threshold(kind="max", value=5000), peak)
    assert ceiling is not None and "passes every run" in ceiling.message
    assert peak_issue("training.throughput_per_gpu", threshold(kind="min", value=2614.9), peak) is None  # reachable
    assert peak_issue("training.tokens_per_gpu", threshold(kind="min", value=1e9), peak) is None  # not a FLOP rate
    # said already without the GPU (spec_issues): not said twice
    assert peak_issue("training.throughput_per_gpu", threshold(kind="min", value=0), peak) is None
    assert threshold(kind="min", value=1e9).settled("training.throughput_per_gpu") is None  # GPU unknown
