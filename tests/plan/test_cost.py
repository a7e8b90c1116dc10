"""The planner's two-stage cost model must agree with the estimator it wraps."""

from __future__ import annotations

import itertools

import pytest

from megapilot.catalog import get_gpu, get_model
from megapilot.errors import MegapilotError
from megapilot.plan.cost import CostModel
from megapilot.spec import ClusterSpec, ParallelConfig, TrainingSpec, validate_layout


def test_memory_stage_agrees_with_the_full_estimate():
    """A layout the memory stage drops must be one the full estimate would call too big, and vice versa."""
    model = get_model("mixtral-8x7b")
    cluster = ClusterSpec.from_gpu_count(get_gpu("h100"), 64)
    training = TrainingSpec(seq_length=4096, global_batch_size=512)
    cost = CostModel(model, cluster, training)
    verdicts = set()
    for tp, pp, ep, mbs, recompute, fsdp in itertools.product((1, 2, 8), (1, 4), (1, 8), (1, 4), ("none", "full"),
                                                              (False, True)):
        dp = 64 // (tp * pp)
        p = ParallelConfig(tp=tp, pp=pp, dp=dp, ep=ep, mbs=mbs, sequence_parallel=tp > 1, recompute=recompute,
                           fsdp=fsdp)
        try:
            validate_layout(model, cluster, training, p)
        except MegapilotError:
            continue
        memory = cost.memory(p)
        est = cost(p)
        assert memory.fits == est.fits, p
        assert abs(memory.total_gib - est.memory_gib.total) < 1e-3  # the estimate rounds to 3 decimals
        verdicts.add(memory.fits)
    assert verdicts == {True, False}  # the sample covers both sides of the capacity line


def test_results_are_memoised_per_layout():
    model = get_model("llama3.1-8b")
    cluster = ClusterSpec.from_gpu_count(get_gpu("h100"), 8)
    cost = CostModel(model, cluster, TrainingSpec(seq_length=4096, global_batch_size=64))
    p = ParallelConfig(tp=2, dp=4, sequence_parallel=True)
    assert cost(p) is cost(ParallelConfig(tp=2, dp=4, sequence_parallel=True))
    assert cost.calls == 1


def test_an_injected_estimator_also_serves_the_memory_stage():
    model = get_model("llama3.1-8b")
    cluster = ClusterSpec.from_gpu_count(get_gpu("h100"), 8)
    training = TrainingSpec(seq_length=4096, global_batch_size=64)
    real = CostModel(model, cluster, training)
    seen = []

    def spy(parallel):
        seen.append(parallel)
        return real(parallel)

    injected = CostModel(model, cluster, training, estimator=spy)
    p = ParallelConfig(dp=8)
    assert injected.memory(p).total_gib == real(p).memory_gib.total
    assert seen == [p] and injected.memory_calls == 0


def test_a_headroom_shrinks_what_the_planner_may_fill():
    from megapilot.catalog import get_model as model_named
    from megapilot.plan import plan

    model = model_named("llama3.1-70b")
    cluster = ClusterSpec.from_gpu_count(get_gpu("h100"), 64)
    training = TrainingSpec(seq_length=8192, global_batch_size=512)
    roomy = plan(model, cluster, training, top=1, headroom_fraction=0.25).best.estimate
    assert roomy.memory_gib.total <= 0.75 * roomy.memory_gib.capacity
    p = ParallelConfig(tp=8, pp=1, dp=8, sequence_parallel=True, recompute="selective")
    tight = CostModel(model, cluster, training, headroom_fraction=0.5)
    est = tight(p)
    assert tight.memory(p).fits == tight.fits(est) == (est.memory_gib.total <= 0.5 * est.memory_gib.capacity)
    with pytest.raises(MegapilotError, match="headroom"):
        plan(model, cluster, training, headroom_fraction=1.0)
