"""Threshold specs: each kind's required fields and how its gate reads."""

from __future__ import annotations

import pytest

from megapilot.suite.thresholds import THRESHOLD_KINDS, ThresholdSpec, parse_threshold, threshold


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
