"""Candidates ranked by time to train: each with its whole run, the fastest run first, and the move explained."""

from __future__ import annotations

from megapilot.catalog import get_gpu, get_model
from megapilot.estimate.budget import BudgetRequest, parse_phase
from megapilot.plan import plan
from megapilot.plan.budget import rank_by_time_to_train
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

