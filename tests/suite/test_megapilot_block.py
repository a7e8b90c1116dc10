"""megapilot's own `megapilot:` block: every setting optional, its bounds and cross-checks, and the hang rule as the
run states it."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from megapilot.execute.registry import executor_names
from megapilot.execute.slurm import MIN_LEASE_S
from megapilot.suite.megapilot_block import (
    DEFAULT_HANG_MIN_WINDOW_S,
    DEFAULT_MEGATRON_PATH,
    MegapilotBlock,
    describe_hang_window,
)


def _error(data: dict) -> str:
    with pytest.raises(ValidationError) as info:
        MegapilotBlock.model_validate(data)
    return str(info.value)


def test_an_empty_block_is_cvs_behaviour() -> None:
    block = MegapilotBlock()
    assert (block.executor, block.backend, block.device, block.nodes, block.gpus_per_node) == \
        ("local", None, "auto", None, None)
    assert block.megatron_path == DEFAULT_MEGATRON_PATH and block.hang_min_window_s == DEFAULT_HANG_MIN_WINDOW_S
    assert block.model_fields_set == set()


def test_the_executor_must_be_a_registered_one() -> None:
    assert {"local", "slurm", "ssh"} <= set(executor_names())
    assert MegapilotBlock(executor="slurm").executor == "slurm"
    message = _error({"executor": "k8s"})
    assert "unknown executor 'k8s'; use one of:" in message and "slurm" in message


def test_the_lease_is_off_or_long_enough_to_renew() -> None:
    assert MegapilotBlock(job_lease_s=0).job_lease_s == 0  # no lease
    assert MegapilotBlock(job_lease_s=MIN_LEASE_S).job_lease_s == MIN_LEASE_S
    assert f"at least {MIN_LEASE_S:g} s" in _error({"job_lease_s": MIN_LEASE_S / 2})
    _error({"job_lease_s": -1})


def test_a_job_blocked_on_nodes_out_of_service_gives_up_after_ten_minutes_unless_told_to_wait() -> None:
    assert MegapilotBlock().blocked_queue_timeout_s == 600.0
    assert MegapilotBlock.model_validate({"blocked_queue_timeout_s": None}).blocked_queue_timeout_s is None
    _error({"blocked_queue_timeout_s": 0})


def test_bounds_and_unknown_keys() -> None:
    for bad in ({"hang_factor": 1.0}, {"nodes": 0}, {"gpus_per_node": 65}, {"startup_timeout_s": 0},
                {"backend": "nemo"}, {"device": "tpu"}, {"gpu_count": 3}):
        _error(bad)
    assert MegapilotBlock(nodes=2, gpus_per_node=64, hang_factor=1.5).gpus_per_node == 64
    _error({"nodes": 20_000, "gpus_per_node": 64})  # each in bounds, 1,280,000 GPUs together: more than a plan has
    assert MegapilotBlock(nodes=16_384, gpus_per_node=64).nodes == 16_384  # 1,048,576 GPUs


def test_the_hang_window_names_each_number_and_where_it_came_from() -> None:
    default = describe_hang_window(MegapilotBlock())
    assert default == ("hang window: 900 s before the first iteration (megapilot.startup_timeout_s, default); then "
                       "10 x the observed step time (megapilot.hang_factor, default), at least 120 s "
                       "(megapilot.hang_min_window_s, default)")
    tuned = describe_hang_window(MegapilotBlock(startup_timeout_s=60, hang_factor=20))
    assert "60 s before the first iteration (megapilot.startup_timeout_s, config)" in tuned
    assert "20 x the observed step time (megapilot.hang_factor, config)" in tuned
    assert "at least 60 s (megapilot.hang_min_window_s, default)" in tuned  # never longer than the startup timeout
