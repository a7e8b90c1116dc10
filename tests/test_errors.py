"""errors: the one user-error type, its one-line message, and pydantic errors turned into it."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, Field, ValidationError

from megapilot.errors import MegapilotError, from_validation_error


class _Block(BaseModel):
    class Inner(BaseModel):
        hang_factor: float = Field(gt=1)

    inner: Inner


def test_the_message_names_the_field_the_problem_and_the_fix_on_one_line():
    error = MegapilotError("must be above 1", field="megapilot.hang_factor", fix="use 10")
    assert str(error) == "megapilot.hang_factor: must be above 1 — fix: use 10"
    assert error.to_dict() == {"error": str(error), "field": "megapilot.hang_factor", "fix": "use 10"}
    assert str(MegapilotError("no model named 'x'")) == "no model named 'x'" and error.problem == "must be above 1"
    assert isinstance(error, ValueError)


def test_a_validation_error_becomes_one_naming_the_first_bad_field_with_a_prefix():
    with pytest.raises(ValidationError) as caught:
        _Block.model_validate({"inner": {"hang_factor": 0.5}})
    error = from_validation_error(caught.value, prefix="megapilot")
    assert error.field == "megapilot.inner.hang_factor"
    assert error.problem == "Input should be greater than 1"
    assert from_validation_error(caught.value).field == "inner.hang_factor"


def test_anything_else_keeps_its_words():
    error = from_validation_error(RuntimeError("disk on fire"))
    assert (str(error), error.field) == ("disk on fire", None)
