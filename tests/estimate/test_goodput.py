"""Goodput under failures: Daly's interval, the elapsed-time model, spares; the default rate against Llama 3."""

from __future__ import annotations

import math

import pytest

from megapilot.catalog import get_model
from megapilot.errors import MegapilotError
from megapilot.estimate.goodput import (
    DEFAULT_CHECKPOINT_GBPS_PER_GPU,
    CheckpointCost,
    FailureModel,
    checkpoint_bytes,
    daly_interval_s,
    estimated_checkpoint,
    expected_interruptions,
    goodput,
)

DAY_S = 86_400.0


def test_daly_interval_starts_from_youngs_and_is_the_minimum_of_the_elapsed_time():
    save_s, mtbf_s = 60.0, 3 * 3600.0
    interval = daly_interval_s(save_s, mtbf_s)
    assert math.sqrt(2 * save_s * mtbf_s) - save_s < interval < math.sqrt(2 * save_s * mtbf_s) * 1.1
    checkpoint = CheckpointCost(1e12, save_s, 30.0, "test")
    failure = FailureModel(failures_per_gpu_hour=1 / (mtbf_s / 3600) / 1024, restart_s=300.0)

    def elapsed(tau: float) -> float:  # the model's own elapsed time at another interval
        per_failure = failure.restart_s + checkpoint.load_s + (tau + save_s) / 2
        return (1 + save_s / tau) / (1 - per_failure / mtbf_s)

    assert elapsed(interval) <= min(elapsed(interval * 0.7), elapsed(interval * 1.4))
    run = goodput(DAY_S, 1024, checkpoint, failure)
    assert run.checkpoint_interval_s == pytest.approx(interval)
    assert run.elapsed_s == pytest.approx(DAY_S * elapsed(interval))


def test_daly_interval_limits():
    assert daly_interval_s(100.0, 40.0) == 40.0  # a save longer than 2M: checkpoint every M
    assert daly_interval_s(10.0, math.inf) == math.inf


def test_llama3_default_rate_gives_its_419_interruptions_in_54_days_and_over_90_percent_effective_time():
    interruptions = expected_interruptions(16_384, 54 * DAY_S)
    assert 419 / 1.5 <= interruptions <= 419 * 1.5
    # The 405B checkpoint (bf16 weights + fp32 Adam state) over the default storage: what goodput that leaves over
    # a 54-day run, and the interval that achieves it.
    checkpoint = estimated_checkpoint(checkpoint_bytes(get_model("llama3.1-405b")),
                                      DEFAULT_CHECKPOINT_GBPS_PER_GPU * 16_384)
    compute_s = 54 * DAY_S * 0.9
    run = goodput(compute_s, 16_384, checkpoint, step_time_s=7.0)
    print(f"\n16,384 GPUs: {run.expected_interruptions:.0f} interruptions over {run.elapsed_s / DAY_S:.1f} days, "
          f"checkpoint every {run.checkpoint_interval_s:.0f} s ({run.checkpoint_interval_iters} steps, "
          f"{checkpoint.save_s:.1f} s save), effective training time {run.effective_training_time_pct:.1f} %")
    assert 90 < run.effective_training_time_pct < 100
    assert run.elapsed_s == pytest.approx(run.compute_s + run.lost_restart_s + run.lost_recompute_s
                                          + run.checkpoint_overhead_s)
    assert run.spares.recommended >= 1 and run.spares.wait_without_s > 0


def test_no_failures_no_loss():
    run = goodput(DAY_S, 64, CheckpointCost(1e9, 1.0, 1.0, "test"), FailureModel(failures_per_gpu_hour=0.0))
    assert run.elapsed_s == DAY_S and run.expected_interruptions == 0 and run.effective_training_time_pct == 100


def test_failures_faster_than_a_restart_are_refused():
    with pytest.raises(MegapilotError, match="never finishes"):
        goodput(DAY_S, 100_000, CheckpointCost(1e12, 600.0, 600.0, "test"),
                FailureModel(failures_per_gpu_hour=1e-3, restart_s=3600.0))


@pytest.mark.parametrize(("checkpoint", "failure", "field"), [
    # 405B's 5.68 TB at 0.5 GB/s (a slip for 0.5 TB/s) on 16,384 GPUs at the default rate: the save is the cause,
    # and the refusal named the rate no one gave
    (estimated_checkpoint(5.68e12, 0.5), FailureModel(), "checkpoint_gbps"),
    # a 5-hour restart against the default rate's 3.1 h between interruptions
    (estimated_checkpoint(5.68e12, 2000.0), FailureModel(restart_s=5 * 3600.0), "restart_min"),
    # a rate given 1,000 times the default: with the default the run finishes
    (estimated_checkpoint(5.68e12, 2000.0), FailureModel(failures_per_gpu_hour=2e-2), "failures_per_gpu_hour"),
])
def test_a_run_that_never_finishes_names_the_input_that_stops_it(checkpoint, failure, field):
    with pytest.raises(MegapilotError, match="never finishes") as info:
        goodput(DAY_S, 16_384, checkpoint, failure)
    assert info.value.field == field
    assert "restart" in info.value.problem and "restore" in info.value.problem


@pytest.mark.parametrize("gbps", [2e12, 2e6, 1e300])
def test_a_bandwidth_beyond_any_storage_is_refused_as_a_slip_of_units(gbps):
    # 2e12 (2 TB/s written in B/s) priced a 0 s save, and 1e300 printed a bandwidth of 301 digits
    with pytest.raises(MegapilotError, match="GB/s") as info:
        estimated_checkpoint(1e12, gbps)
    assert info.value.field == "checkpoint_gbps" and "--checkpoint-gbps" in (info.value.fix or "")


@pytest.mark.parametrize(("gbps", "said"), [(0.9765625, "0.977 GB/s"), (125.0, "125 GB/s"), (2000.0, "2,000 GB/s")])
def test_the_storage_bandwidth_prints_to_three_figures(gbps, said):
    # the pro-rata default for 8 GPUs printed as "0.976562 GB/s"
    assert estimated_checkpoint(1e12, gbps).source.endswith(said)


def test_spares_cover_the_failing_node_too():
    # a small job whose nodes are seldom in repair still waits out every repair without a spare: 0 spares said
    # "0 held back cover the repairs; cheaper: spares"
    checkpoint = CheckpointCost(1e11, 10.0, 10.0, "test")
    small = goodput(30 * DAY_S, 8, checkpoint)
    assert small.spares.hardware_interruptions > 0 and small.spares.recommended == 1
    assert small.spares.cheaper == "waiting"  # one node held back of one costs more than the rare wait
    # 1,024 GPUs, 62 repairs of 24 h in 164 days: 0.38 nodes in repair on average; P(Poisson(0.38) <= 2) = 0.993
    big = goodput(161.8 * DAY_S, 1024, CheckpointCost(9.88e11, 7.9, 7.9, "test"), step_time_s=7.82)
    assert big.spares.recommended == 3
    assert goodput(DAY_S, 8, checkpoint, FailureModel(failures_per_gpu_hour=0.0)).spares.recommended == 0


@pytest.mark.parametrize("optimizer", ["adam", "muon"])
def test_a_checkpoint_holds_the_optimizer_state_the_memory_model_holds(optimizer):
    """One rank holding the whole model unsharded holds what the checkpoint saves: its bf16 weights and the
    optimizer's fp32 state; under Muon the embedding, output layer and norms stay on Adam's 12 bytes (they were
    priced at Muon's 8, about 5 % of an 8B model's checkpoint missing)."""
    from megapilot.estimate.memory import GIB, optimizer_gib, shard_params, weights_gib
    from megapilot.spec.parallel import ParallelConfig

    model = get_model("llama3.1-8b")
    whole = ParallelConfig(distributed_optimizer=False)
    shard = shard_params(model, whole, 0)
    held = (weights_gib(shard, whole) + optimizer_gib(shard, whole, optimizer)) * GIB
    assert checkpoint_bytes(model, optimizer) == pytest.approx(held, rel=1e-3)


def test_the_checkpoint_interval_is_never_longer_than_the_run():
    """A short run (or a tiny failure rate) has a Daly interval beyond its end: it saves once, at the end, and the
    interval says so in the run's own steps, not in more steps than the run has."""
    checkpoint = estimated_checkpoint(1e12, 100.0)
    short = goodput(3_000.0, 64, checkpoint, step_time_s=10.0)
    assert short.checkpoint_interval_s <= 3_000.0 and short.checkpoint_interval_iters == 300
    rare = goodput(86_400.0, 64, checkpoint, FailureModel(failures_per_gpu_hour=1e-300), step_time_s=10.0)
    assert rare.checkpoint_interval_s == pytest.approx(86_400.0) and rare.checkpoint_interval_iters == 8_640
