"""spec.plan_file: a saved plan reads back as it was written; unknown plan keys are refused, estimate keys kept."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from megapilot.spec import SavedPlan
from megapilot.spec.plan_file import PLAN_FILE_VERSION, EstimateResult
from tests.launch.plans import tiny_two_rank_plan

ESTIMATE = {"params": {"total": 10, "active": 10, "embedding": 2}, "flops_per_step": 1e12,
            "memory_gib": {"weights": 1.0, "gradients": 1.0, "optimizer": 2.0, "activations": 3.0, "overhead": 0.5,
                           "total": 7.5, "capacity": 80.0}, "fits": True, "step_time_s": 0.5,
            "tokens_per_s_per_gpu": 1000.0, "tflops_per_gpu": 300.0, "mfu": 0.4}


def test_a_saved_plan_reads_back_equal_through_json():
    plan = tiny_two_rank_plan(train_iters=7).model_copy(update={"estimate": EstimateResult.model_validate(ESTIMATE),
                                                                "reasons": ["fits on 2 ranks"]})
    text = plan.model_dump_json()
    again = SavedPlan.model_validate_json(text)
    assert again == plan and again.version == PLAN_FILE_VERSION and again.training.train_iters == 7


def test_an_unknown_plan_key_is_refused_but_an_estimate_may_carry_newer_keys():
    raw = json.loads(tiny_two_rank_plan(train_iters=7).model_dump_json())
    with pytest.raises(ValidationError, match="not_a_key"):
        SavedPlan.model_validate(raw | {"not_a_key": 1})
    estimate = EstimateResult.model_validate(ESTIMATE | {"energy_kwh": 3.5})
    assert estimate.model_dump()["energy_kwh"] == 3.5 and estimate.memory_gib.stage is None


def test_a_plan_without_the_flex_dispatcher_is_costed_with_alltoall():
    plan = tiny_two_rank_plan(train_iters=1)
    assert plan.moe_flex_dispatcher is None and plan.moe_a2a_overlap is False
    with pytest.raises(ValidationError):
        plan.model_validate(json.loads(plan.model_dump_json()) | {"moe_flex_dispatcher": "nccl"})
