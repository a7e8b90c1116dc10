"""Records: frozen facts with their evidence; NaN/Inf travel in JSON as strings; derived properties."""

from __future__ import annotations

import dataclasses
import json
import math
import typing

import pytest

from megapilot.logs.records import (
    DIALECTS,
    CheckpointOp,
    Dialect,
    ErrorRecord,
    Evidence,
    IterationRecord,
    MemoryRecord,
)


def _iteration(**fields) -> IterationRecord:
    return IterationRecord(file="train.log", line=7, text="iteration 3/10", dialect="megatron-lm", iteration=3,
                           **fields)


def test_dialect_names_match_the_literal_type():
    assert typing.get_args(Dialect) == DIALECTS


def test_lm_loss_prefers_megatron_lm_loss_then_torchtitan_loss():
    assert _iteration(losses={"lm loss": 2.5, "loss": 9.0}).lm_loss == 2.5
    assert _iteration(losses={"loss": 3.0}).lm_loss == 3.0
    assert _iteration(losses={"mtp_1 loss": 1.0}).lm_loss is None


@pytest.mark.parametrize(("losses", "grad_norm", "expected"), [
    ({"lm loss": 2.0}, 1.0, False),
    ({"lm loss": math.nan}, 1.0, True),
    ({"lm loss": 2.0, "load_balancing_loss": math.inf}, None, True),
    ({"lm loss": 2.0}, -math.inf, True),
    ({}, None, False),
])
def test_has_nonfinite_looks_at_every_loss_and_the_grad_norm(losses, grad_norm, expected):
    assert _iteration(losses=losses, grad_norm=grad_norm).has_nonfinite is expected


def test_non_finite_numbers_become_strings_so_the_json_is_valid():
    data = _iteration(losses={"lm loss": math.nan, "z": math.inf}, grad_norm=-math.inf, lr=1e-4).to_dict()
    assert data["losses"] == {"lm loss": "nan", "z": "inf"} and data["grad_norm"] == "-inf"
    assert data["lm_loss"] == "nan" and data["lr"] == 1e-4
    json.loads(json.dumps(data, allow_nan=False))


def test_iteration_json_carries_evidence_and_the_derived_lm_loss():
    data = _iteration(losses={"loss": 1.5}).to_dict()
    assert (data["file"], data["line"], data["text"], data["iteration"]) == ("train.log", 7, "iteration 3/10", 3)
    assert data["lm_loss"] == 1.5


def test_nested_evidence_renders_as_plain_dicts():
    op = CheckpointOp(kind="save", iteration=100, path="/ckpt", completed=True, duration_s=math.nan,
                      duration_source=None, evidence=[Evidence("a.log", 1, "saving"), Evidence("a.log", 2, "saved")])
    data = op.to_dict()
    assert data["evidence"] == [{"file": "a.log", "line": 1, "text": "saving"}, {"file": "a.log", "line": 2,
                                                                                 "text": "saved"}]
    assert data["duration_s"] == "nan"


def test_peak_is_the_highest_figure_of_the_report_or_none():
    report = MemoryRecord(file="f", line=1, text="t", source="allocator", allocated_gib=10.0, max_allocated_gib=30.0,
                          reserved_gib=20.0, max_reserved_gib=25.0)
    assert report.peak_gib == 30.0
    assert MemoryRecord(file="f", line=1, text="t", source="device", used_gib=61.5, total_gib=80.0).peak_gib == 61.5
    assert MemoryRecord(file="f", line=1, text="t", source="device", total_gib=80.0, usage_pct=50.0).peak_gib is None


def test_records_are_frozen_facts():
    record = ErrorRecord(file="f", line=1, text="t", category="oom", signature="cuda_oom")
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.category = "hang"  # type: ignore[misc]  # writing a frozen field is the test
