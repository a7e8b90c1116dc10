"""Candidates ranked by time to train: each with its whole run, the fastest run first, and the move explained."""

from __future__ import annotations

import pytest

from megapilot.catalog import get_gpu, get_model
from megapilot.errors import MegapilotError
from megapilot.estimate.budget import BatchRampup, BudgetRequest, parse_phase
from megapilot.plan import plan
from megapilot.plan.budget import rank_by_time_to_train
from megapilot.plan.reasons import layout_label
from megapilot.spec import ClusterSpec, TrainingSpec


def _plan():
    cluster = ClusterSpec.from_gpu_count(get_gpu("h100"), 64)
    return plan(get_model("llama3.1-8b"), cluster, TrainingSpec(seq_length=4096, global_batch_size=256), top=3)


def test_runs_are_ordered_by_elapsed_time_and_a_moved_layout_says_why():
    result = _plan()
    # slowest-stepping first (the planner's own order is by speed within its tie-break, not by speed alone)
    slowest_first = sorted(result.candidates, key=lambda c: c.estimate.tokens_per_s_per_gpu)
    reversed_plan = result.model_copy(update={"candidates": slowest_first})
    request = BudgetRequest(tokens=1e12, phases=(parse_phase("tokens=50B,seq_len=16384"),))
    ranked = rank_by_time_to_train(reversed_plan, request)
    elapsed = [run.elapsed_s for run in ranked.runs]
    assert elapsed == sorted(elapsed) and len(ranked.runs) == len(result.candidates)
    assert all(len(run.segments) == 2 for run in ranked.runs)
    # the slowest-stepping layout came first; the fastest run now leads and says why it moved
    assert ranked.plan.candidates[0].parallel != reversed_plan.candidates[0].parallel
    assert ranked.plan.candidates[0].reasons[0].startswith("first by time to train")
    document = ranked.to_json()
    assert document["ranked_by"] == "time_to_train"
    assert [c["budget"]["days"]["value"] for c in document["candidates"]] == sorted(
        c["budget"]["days"]["value"] for c in document["candidates"])


def test_a_candidate_whose_layout_cannot_train_the_warm_up_batch_is_left_out_not_the_whole_plan():
    result = _plan()
    splits = [c.parallel.mbs * c.parallel.dp for c in result.candidates]
    start = min(splits)  # a warm-up batch only the candidates of the smallest MBS x DP divide
    assert any(start % split for split in splits), "the case needs a candidate the warm-up batch does not fit"
    ranked = rank_by_time_to_train(result, BudgetRequest(tokens=1e12, rampup=BatchRampup(start, start, 1000)))
    assert ranked.plan.candidates and all(start % (c.parallel.mbs * c.parallel.dp) == 0
                                          for c in ranked.plan.candidates)
    dropped = [c for c in result.candidates if start % (c.parallel.mbs * c.parallel.dp)]
    for candidate in dropped:
        assert any(r.startswith(f"left out of the budget ranking: {layout_label(candidate.parallel)} "
                                "(rampup_batch_size:") for r in ranked.plan.candidates[0].reasons)
    with pytest.raises(MegapilotError) as none_can:  # no candidate divides it: the refusal itself
        rank_by_time_to_train(result, BudgetRequest(tokens=1e12, rampup=BatchRampup(1, 1, 1000)))
    assert none_can.value.field == "rampup_batch_size"



def test_a_runs_days_span_the_estimates_own_80_percent_interval():
    """The days, GPU-hours and cost carry the interval the estimate states for its tokens/s: the time is tokens over
    throughput, so its ends are the interval's ends turned over. They carried +/- the cell's median |error|
    (days 148-157 beside tokens/s 964-1,689 on Llama 3.1 70B, 64 H100: the truth's 108-189 days)."""
    from megapilot.estimate import estimate
    from megapilot.plan.budget import run_budget
    from megapilot.spec import ParallelConfig

    model, training = get_model("llama3.1-70b"), TrainingSpec(seq_length=8192, global_batch_size=512)
    cluster, parallel = ClusterSpec.from_gpu_count(get_gpu("h100"), 64), ParallelConfig(tp=4, pp=4, dp=4)
    result = estimate(model, cluster, training, parallel)
    assert result.tokens_per_s_per_gpu_p10 is not None and result.tokens_per_s_per_gpu_p90 is not None
    run = run_budget(BudgetRequest(tokens=1e12), model, cluster, training, parallel)
    days = run.days
    assert days.low == pytest.approx(days.value * result.tokens_per_s_per_gpu / result.tokens_per_s_per_gpu_p90,
                                     rel=1e-3)
    assert days.high == pytest.approx(days.value * result.tokens_per_s_per_gpu / result.tokens_per_s_per_gpu_p10,
                                      rel=1e-3)
    assert run.gpu_hours.high / run.gpu_hours.value == pytest.approx(days.high / days.value)
    assert "80 % interval" in run.band.source and result.interval_basis in run.band.source
