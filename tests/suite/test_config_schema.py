"""The CVS suite file's sections as typed models: CVS's string forms read, the bounds of what `suite run` uses, and
the rules between fields of one section."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from megapilot.suite.config_schema import (
    MAX_ITERATIONS,
    CheckpointConfig,
    CollectivesConfig,
    ContainerSpec,
    ConvergenceConfig,
    LossCurveConfig,
    RuntimeArgs,
    SmokeConfig,
    StragglerConfig,
    SuitePaths,
    Sweep,
)


def _refused(model: type, data: dict, field: str) -> str:
    with pytest.raises(ValidationError) as info:
        model.model_validate(data)
    locs = [".".join(str(part) for part in error["loc"]) for error in info.value.errors()]
    assert any(loc == field or loc.startswith(f"{field}.") for loc in locs), locs
    return str(info.value)


def test_cvs_string_values_are_read_as_their_types() -> None:
    smoke = SmokeConfig.model_validate({"enabled": "false", "iters": "10", "micro_batch_size": "2",
                                        "global_batch_size": "", "precision": "te_fp8"})
    assert (smoke.enabled, smoke.iters, smoke.micro_batch_size, smoke.global_batch_size, smoke.precision) == \
        (False, 10, 2, None, "FP8")
    assert SmokeConfig.model_validate({"global_batch_size": "64"}).global_batch_size == 64


def test_iteration_and_size_bounds_refuse_a_typo() -> None:
    _refused(SmokeConfig, {"iters": MAX_ITERATIONS + 1}, "iters")
    _refused(SmokeConfig, {"iters": 0}, "iters")
    _refused(SmokeConfig, {"global_batch_size": -1}, "global_batch_size")  # was an internal error at the cell
    _refused(SmokeConfig, {"global_batch_size": "0"}, "global_batch_size")  # was taken as unset
    _refused(LossCurveConfig, {"milestone_steps": [100, 0]}, "milestone_steps")
    _refused(Sweep, {"repeats": 0}, "repeats")
    _refused(StragglerConfig, {"max_ratio": 1.0}, "max_ratio")  # a node equal to the median is no straggler
    assert SmokeConfig.model_validate({"iters": MAX_ITERATIONS}).iters == MAX_ITERATIONS


def test_non_finite_numbers_are_refused() -> None:
    _refused(ConvergenceConfig, {"target_value": math.inf}, "target_value")
    _refused(LossCurveConfig, {"max_slope": math.nan}, "max_slope")


def test_the_resumed_run_must_train_past_the_checkpoint() -> None:
    message = _refused(CheckpointConfig, {"save_iters": 30, "resume_iters": 30}, "resume_iters")
    assert "resume_iters (30) must be past save_iters (30)" in message
    assert CheckpointConfig.model_validate({"save_iters": "30", "resume_iters": "31"}).resume_iters == 31
    _refused(CheckpointConfig, {"loss_rtol": 5}, "loss_rtol")  # relative: 5 would be 500 %


def test_container_sections_forbid_unknown_keys_but_runtime_args_keep_them() -> None:
    args = RuntimeArgs.model_validate({"volumes": ["/a:/a"], "privileged": "true", "shm_size": "64G"})
    assert args.privileged is True and args.model_extra == {"shm_size": "64G"}
    _refused(ContainerSpec, {"name": "c", "image": "i", "imagee": "typo"}, "imagee")
    _refused(ContainerSpec, {"name": "c", "image": "i", "lifetime": "forever"}, "lifetime")
    spec = ContainerSpec.model_validate({"name": "c", "image": "i", "env": {"NCCL_IB_GID_INDEX": 3}})
    assert spec.env == {"NCCL_IB_GID_INDEX": "3"} and spec.runtime.name == "docker"


def test_paths_need_cvs_four_folders() -> None:
    _refused(SuitePaths, {"hf_token_file": "t", "log_dir": "l", "scripts_dir": "s"}, "data_cache_dir")
    assert SuitePaths(hf_token_file="t", log_dir="l", scripts_dir="s", data_cache_dir="d").rocm_dir == ""


def test_collectives_run_on_gpus_by_default_and_size_their_sweep_by_device() -> None:
    auto = CollectivesConfig()
    assert auto.runs_on("gpu") and not auto.runs_on("cpu")
    assert CollectivesConfig(enabled="true").runs_on("cpu") and not CollectivesConfig(enabled=False).runs_on("gpu")
    assert (auto.largest_bytes("gpu"), auto.largest_bytes("cpu")) == (2**30, 4 * 2**20)
    assert CollectivesConfig(max_bytes=2**20).largest_bytes("gpu") == 2**20
    assert auto.ops == ["all_reduce", "all_gather", "reduce_scatter", "alltoall"]


def test_collectives_sizes_in_order_and_known_ops_only() -> None:
    message = _refused(CollectivesConfig, {"min_bytes": 4096, "max_bytes": 1024}, "max_bytes")
    assert "max_bytes (1024) must be at least min_bytes (4096)" in message
    _refused(CollectivesConfig, {"ops": ["broadcast"]}, "ops")
    _refused(CollectivesConfig, {"ops": []}, "ops")


def test_a_true_or_false_where_a_number_is_required_is_refused() -> None:
    # YAML's `gpus_per_node: true` (or `yes`) is a boolean; pydantic alone reads it as 1
    from megapilot.suite.megapilot_block import MegapilotBlock

    message = _refused(MegapilotBlock, {"gpus_per_node": True}, "gpus_per_node")
    assert "a true/false where a number is required (got true)" in message
    _refused(MegapilotBlock, {"nodes": False}, "nodes")
    _refused(CollectivesConfig, {"iters": True}, "iters")
    _refused(LossCurveConfig, {"max_slope": True}, "max_slope")
    _refused(SmokeConfig, {"iters": True}, "iters")
    assert SmokeConfig.model_validate({"enabled": True}).enabled is True  # a switch still takes one
    assert CollectivesConfig.model_validate({"enabled": False}).enabled is False
    assert MegapilotBlock.model_validate({"gpus_per_node": 8}).gpus_per_node == 8
