"""Time to train a budget: token counts, phases, the batch warm-up, and the bands."""

from __future__ import annotations

import pytest

from megapilot.catalog import get_gpu, get_model
from megapilot.errors import MegapilotError
from megapilot.estimate.budget import (
    BatchRampup,
    BudgetRequest,
    Fleet,
    ShapeCost,
    TimeBand,
    layout_step_cost,
    parse_phase,
    parse_tokens,
    steps_to_train,
    time_to_train,
)
from megapilot.estimate.goodput import CheckpointCost, FailureModel, daly_interval_s
from megapilot.spec import ClusterSpec, ParallelConfig, TrainingSpec


def test_token_counts():
    assert parse_tokens("15.6T") == pytest.approx(15.6e12)
    assert parse_tokens("800b") == 800e9 and parse_tokens("4K") == 4000 and parse_tokens(1e6) == 1e6
    for bad in ("15X", "", "-1T", "0"):
        with pytest.raises(MegapilotError):
            parse_tokens(bad)


def test_phase_parsing_names_the_problem():
    phase = parse_phase("seq_len=131072,tokens=800B,cp=16")
    assert (phase.tokens, phase.seq_len, phase.cp, phase.tp) == (800e9, 131072, 16, None)
    for bad, said in (("seq_len=8192", "tokens"), ("tokens=1B,foo=2", "foo"), ("tokens=1B,cp=x", "cp"),
                      ("tokens", "KEY=VALUE"), ("tokens=1B,seq_len=65536,seq_len=4096", "seq_len is given twice")):
        with pytest.raises(MegapilotError, match=said):
            parse_phase(bad)


def _fixed(seconds_per_sample: float):
    # a step costs its batch's samples plus a fixed 1 s (so the warm-up's smaller batches cost more per token)
    return lambda shape: ShapeCost(1.0 + seconds_per_sample * shape.gbs * shape.seq_len / 1024, True)


NO_FAILURES = FailureModel(failures_per_gpu_hour=0.0)
CHECKPOINT = CheckpointCost(1e9, 1.0, 1.0, "test")


def test_phases_come_out_of_the_budget_and_the_warm_up_follows_megatron():
    training = TrainingSpec(seq_length=1024, global_batch_size=64)
    request = BudgetRequest(tokens=1e9, phases=(parse_phase("tokens=100M,seq_len=4096"),),
                            rampup=BatchRampup(16, 16, 48_000), failure=NO_FAILURES)
    run = time_to_train(request, training, Fleet(8, 8, 700.0), _fixed(0.01), checkpoint=CHECKPOINT,
                        band=TimeBand.symmetric(0.1, "test"))
    names = [s.name for s in run.segments]
    assert names == ["batch warm-up 16", "batch warm-up 32", "batch warm-up 48", "main",
                     "phase 1: seq_len 4,096"]
    assert run.tokens == pytest.approx(1e9)
    # 16,000 samples a share at 16, 32, 48 a step; the last step at 48 trains 32 samples past SAMPLES
    assert [s.iterations for s in run.segments[:3]] == [1000, 500, 334]
    assert [s.tokens for s in run.segments[:3]] == pytest.approx([16_000 * 1024, 16_000 * 1024, 16_032 * 1024])
    assert run.segments[-1].shape.seq_len == 4096 and run.segments[-1].iterations == 382  # 1e8 / 4096 / 64 = 381.5
    assert run.compute_s == pytest.approx(sum(s.iterations * s.step_time_s for s in run.segments))
    assert run.days.low == pytest.approx(run.days.value * 0.9) and run.days.high == pytest.approx(run.days.value * 1.1)
    assert run.energy_mwh is not None and run.energy_mwh.value == pytest.approx(run.gpu_hours.value * 700 / 1e6)
    assert run.cost is None


def _megatron_warm_up(start: int, increment: int, samples: int, final_gbs: int) -> list[tuple[int, int]]:
    """(batch, steps) of a warm-up, one step at a time as Megatron-Core's ramp-up calculator sets each step's batch
    from the samples consumed before it: START + INCREMENT x int(consumed / (SAMPLES / increments)), the final batch
    once past SAMPLES."""
    share = samples / ((final_gbs - start) // increment)
    consumed, steps = 0, []
    while (batch := final_gbs if consumed > samples else start + int(consumed / share) * increment) < final_gbs:
        if steps and steps[-1][0] == batch:
            steps[-1][1] += 1
        else:
            steps.append([batch, 1])
        consumed += batch
    return [(batch, count) for batch, count in steps]


@pytest.mark.parametrize(("start", "increment", "samples", "final_gbs"), [
    (3, 2, 20, 9),  # the step out of the first share carries 2 samples into the second, which one step ends
    (16, 16, 48_000, 64),  # shares whole in the first two batches' steps
    (100, 10, 50, 200),  # one step crosses every share: one batch of the ten trains
    (7, 5, 1_001, 42),  # shares of 143 samples, none a whole number of steps
    (64, 64, 1_000_000, 256),
    (256, 256, 2_000_000, 1024),
])
def test_warm_up_steps_follow_megatrons_consumed_samples(start, increment, samples, final_gbs):
    # each batch's steps were rounded up from its share alone, up to one step a batch more than Megatron runs
    # ((3, 2, 20, 9): 3 + 2 + 1 steps for Megatron's 3 + 1 + 1)
    assert BatchRampup(start, increment, samples).levels(final_gbs) == \
        _megatron_warm_up(start, increment, samples, final_gbs)


def test_the_warm_ups_samples_and_time_are_those_of_its_steps():
    # START 3, INCREMENT 2, SAMPLES 20 to GBS 9 at seq 1,024: Megatron trains 3 steps at 3, 1 at 5, 1 at 7 (21
    # samples), then the rest of the budget at 9
    training = TrainingSpec(seq_length=1024, global_batch_size=9)
    request = BudgetRequest(tokens=100 * 9 * 1024, rampup=BatchRampup(3, 2, 20), failure=NO_FAILURES)
    run = time_to_train(request, training, Fleet(8, 8, None), _fixed(0.01), checkpoint=CHECKPOINT,
                        band=TimeBand.symmetric(0.1, "t"))
    assert [(s.shape.gbs, s.iterations) for s in run.segments] == [(3, 3), (5, 1), (7, 1), (9, 98)]
    assert [s.tokens / 1024 for s in run.segments] == [9, 5, 7, 900 - 21]  # 879 samples at 9: 98 steps, the last part
    assert run.iterations == 103 and run.tokens == 100 * 9 * 1024
    assert run.compute_s == pytest.approx(sum(s.iterations * s.step_time_s for s in run.segments))
    # a budget that ends inside the warm-up: the batch it ends in trains the least whole steps to it
    short = time_to_train(BudgetRequest(tokens=12 * 1024, rampup=BatchRampup(3, 2, 20), failure=NO_FAILURES),
                          TrainingSpec(seq_length=1024, global_batch_size=9), Fleet(8, 8, None), _fixed(0.01),
                          checkpoint=CHECKPOINT, band=TimeBand.symmetric(0.1, "t"))
    assert [(s.shape.gbs, s.iterations, s.tokens / 1024) for s in short.segments] == [(3, 3, 9), (5, 1, 3)]


def test_a_warm_up_batch_the_layout_cannot_split_is_refused_naming_the_warm_up_not_a_phase():
    training = TrainingSpec(seq_length=1024, global_batch_size=64)
    cost = layout_step_cost(get_model("tiny").model_copy(update={"max_position_embeddings": 1024}),
                            ClusterSpec.from_gpu_count(get_gpu("h100"), 8), training,
                            ParallelConfig.for_world(8, mbs=1))
    with pytest.raises(MegapilotError, match=r"batch warm-up: .*not divisible") as refused:  # START 4 over DP 8
        time_to_train(BudgetRequest(tokens=1e9, rampup=BatchRampup(4, 4, 1000)), training, Fleet(8, 8, None), cost,
                      checkpoint=CHECKPOINT, band=TimeBand.symmetric(0.1, "t"))
    assert refused.value.field == "rampup_batch_size"


def test_a_warm_up_longer_than_any_budget_is_refused_naming_its_samples():
    """10^20 samples (a slip of digits) would have priced a run that never leaves its warm-up."""
    with pytest.raises(MegapilotError, match="SAMPLES") as refused:
        BatchRampup(16, 16, 10**20).levels(64)
    assert refused.value.field == "rampup_batch_size"
    assert BatchRampup(16, 16, 10**7).levels(64)  # a published warm-up's size stands


def test_bad_budgets_are_refused():
    training = TrainingSpec(seq_length=1024, global_batch_size=64)
    with pytest.raises(MegapilotError, match="leave none"):
        time_to_train(BudgetRequest(tokens=1e6, phases=(parse_phase("tokens=2M"),)), training, Fleet(8, 8, None),
                      _fixed(0.01), checkpoint=CHECKPOINT, band=TimeBand.symmetric(0.1, "t"))
    with pytest.raises(MegapilotError, match="INCREMENT"):
        time_to_train(BudgetRequest(tokens=1e9, rampup=BatchRampup(10, 20, 1000)), training, Fleet(8, 8, None),
                      _fixed(0.01), checkpoint=CHECKPOINT, band=TimeBand.symmetric(0.1, "t"))
    with pytest.raises(MegapilotError, match="one of them"):
        BudgetRequest(tokens=1e9, train_iters=10)


def test_a_batch_warm_up_beside_train_iters_is_refused_as_megatron_refuses_it():
    # Megatron asserts "expected no batch-size rampup for iteration-based training"; --train-iters 10000 with a
    # warm-up printed 18,464 steps, the iterations asked counted as tokens at the full batch
    with pytest.raises(MegapilotError, match="--train-iters") as info:
        BudgetRequest(train_iters=10_000, rampup=BatchRampup(128, 128, 3_000_000))
    assert info.value.field == "rampup_batch_size" and "--tokens" in (info.value.fix or "")


def test_a_budget_or_phase_under_one_step_is_refused_by_name():
    # 10 tokens (a slip for 10T) printed 0 steps, 0.0 days and a checkpoint interval of thousands of steps
    training = TrainingSpec(seq_length=1024, global_batch_size=64)
    with pytest.raises(MegapilotError, match="less than one step") as info:
        time_to_train(BudgetRequest(tokens=10), training, Fleet(8, 8, None), _fixed(0.01), checkpoint=CHECKPOINT,
                      band=TimeBand.symmetric(0.1, "t"))
    assert info.value.field == "tokens" and "65,536" in info.value.fix
    with pytest.raises(MegapilotError, match="phase 1 of 1,000 tokens") as info:
        time_to_train(BudgetRequest(tokens=1e9, phases=(parse_phase("tokens=1K,seq_len=4096"),)), training,
                      Fleet(8, 8, None), _fixed(0.01), checkpoint=CHECKPOINT, band=TimeBand.symmetric(0.1, "t"))
    assert info.value.field == "phase"
    one_step = time_to_train(BudgetRequest(tokens=65_536, failure=NO_FAILURES), training, Fleet(8, 8, None),
                             _fixed(0.01), checkpoint=CHECKPOINT, band=TimeBand.symmetric(0.1, "t"))
    assert one_step.iterations == 1


@pytest.mark.parametrize("text", ["1e400", "1e300T"])
def test_an_overflowing_token_count_is_called_too_large_not_negative(text: str):
    with pytest.raises(MegapilotError, match="too large") as info:
        parse_tokens(text)
    assert info.value.field == "tokens"


@pytest.mark.parametrize("price", [float("inf"), float("nan"), -1.0])
def test_a_price_that_is_no_finite_amount_is_refused(price: float):
    # inf printed "$inf" as the run's cost
    with pytest.raises(MegapilotError, match="finite") as info:
        BudgetRequest(tokens=1e9, cost_per_gpu_hour=price)
    assert info.value.field == "cost_per_gpu_hour"


def test_a_price_beyond_any_currencys_is_refused_before_the_cost_overflows():
    # 1e300 a GPU-hour made the cost inf, which plan --json printed as Infinity: not JSON
    with pytest.raises(MegapilotError, match="beyond any currency") as info:
        BudgetRequest(tokens=1e9, cost_per_gpu_hour=1e300)
    assert info.value.field == "cost_per_gpu_hour"
    assert BudgetRequest(tokens=1e9, cost_per_gpu_hour=5e4).cost_per_gpu_hour == 5e4  # a small currency's price


def test_a_budget_trains_whole_steps_rounded_up():
    # 10.5 steps' tokens counted 10.5 steps (and `script --tokens` wrote 10): the budget is the least to train
    training = TrainingSpec(seq_length=1024, global_batch_size=64)
    run = time_to_train(BudgetRequest(tokens=10.5 * 65_536, failure=NO_FAILURES), training, Fleet(8, 8, None),
                        _fixed(0.01), checkpoint=CHECKPOINT, band=TimeBand.symmetric(0.1, "t"))
    assert run.iterations == run.segments[0].iterations == 11
    assert run.compute_s == pytest.approx(11 * run.segments[0].step_time_s)
    assert run.to_json()["iterations"] == 11 and run.to_json()["segments"][0]["iterations"] == 11
    # a count that is whole in tokens is not pushed up a step by the float it was parsed into (0.27T)
    assert parse_tokens("0.27T") != 270e9 and steps_to_train(parse_tokens("0.27T"), 1024, 1) == 263_671_875
    assert steps_to_train(65_537, 1024, 64) == 2 and steps_to_train(65_536, 1024, 64) == 1


def test_the_checkpoint_interval_counts_steps_of_the_whole_run_when_the_warm_up_takes_the_budget():
    # no main phase: the interval was counted in the last piece's steps (the warm-up's batch of 32, its longest step)
    training = TrainingSpec(seq_length=1024, global_batch_size=64)
    failure = FailureModel(failures_per_gpu_hour=0.05)
    request = BudgetRequest(tokens=30e6, rampup=BatchRampup(16, 16, 48_000), failure=failure)
    run = time_to_train(request, training, Fleet(8, 8, None), _fixed(0.01), checkpoint=CHECKPOINT,
                        band=TimeBand.symmetric(0.1, "t"))
    assert [s.name for s in run.segments] == ["batch warm-up 16", "batch warm-up 32"]
    mean_step_s = run.compute_s / run.iterations
    assert len({s.step_time_s for s in run.segments}) == 2 and mean_step_s != run.segments[-1].step_time_s
    expected = round(daly_interval_s(CHECKPOINT.save_s, run.goodput.mtbf_s) / mean_step_s)
    assert run.goodput.checkpoint_interval_iters == expected
    assert run.goodput.checkpoint_interval_s == pytest.approx(expected * mean_step_s)
    # a run of one shape: the interval in its own steps, as before
    plain = time_to_train(BudgetRequest(tokens=30e6, failure=failure), training, Fleet(8, 8, None), _fixed(0.01),
                          checkpoint=CHECKPOINT, band=TimeBand.symmetric(0.1, "t"))
    step_s = plain.segments[0].step_time_s
    assert plain.goodput.checkpoint_interval_iters == round(daly_interval_s(1.0, plain.goodput.mtbf_s) / step_s)
