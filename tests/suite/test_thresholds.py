"""Threshold specs: each kind's required fields and how its gate reads."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from megapilot.suite.thresholds import ThresholdSpec


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
    assert ThresholdSpec.model_validate(spec).describe() == text


@pytest.mark.parametrize(("spec", "problem"), [
    ({"kind": "min"}, "needs a numeric 'value'"),
    ({"kind": "within", "value": 1}, "needs 'tolerance_pct'"),
    ({"kind": "baseline"}, "needs 'tolerance_pct'"),
    ({"kind": "min_ratio", "value": 1}, "needs 'reference'"),
    ({"kind": "at_least", "value": 1}, "kind"),
])
def test_a_spec_missing_what_its_kind_needs_is_refused(spec, problem):
    with pytest.raises(ValidationError, match=problem):
        ThresholdSpec.model_validate(spec)


def test_cvs_extra_keys_are_kept_and_optional_defaults_off():
    spec = ThresholdSpec.model_validate({"kind": "max", "value": 1, "_comment": "from CVS"})
    assert spec.optional is False and spec.model_extra == {"_comment": "from CVS"}
