"""The per-layer report groups a model's layers by what they cost, with the step time's own terms."""

from __future__ import annotations

import pytest

from megapilot.catalog.gpus import get_gpu
from megapilot.catalog.models import get_model
from megapilot.estimate.attention_bounds import PassBounds
from megapilot.estimate.cases import Case
from megapilot.estimate.layer_report import layer_groups
from megapilot.estimate.step_time import EstimateOptions, layer_terms
from megapilot.spec import ClusterSpec, ParallelConfig, TrainingSpec


def _case(model: str, gpu: str, gpus: int, parallel: ParallelConfig, seq: int = 4096) -> Case:
    return Case(get_model(model), ClusterSpec.from_gpu_count(get_gpu(gpu), gpus),
                TrainingSpec(seq_length=seq, global_batch_size=256), parallel)


def test_every_layer_is_in_one_group_with_the_step_times_terms():
    case = _case("deepseek-v3", "b200", 256, ParallelConfig(tp=1, pp=16, dp=16, ep=8, recompute="none",
                                                             first_stage_layers=2, last_stage_layers=3))
    groups = layer_groups(case)
    members = [i for group in groups for i in group.layers]
    assert sorted(members) == list(range(61))
    for group in groups:
        for index in (group.layers[0], group.layers[-1]):
            terms = layer_terms(case.model, index, case.cluster, case.training, case.parallel, EstimateOptions(),
                                recomputed=False)
            assert {k: v for k, v in terms.items() if v} == pytest.approx(group.terms_s)
    assert [group.layers for group in groups] == [(0, 1, 2), tuple(range(3, 61))]


@pytest.mark.parametrize(("gpu", "bound"), [
    ("h100", PassBounds(1.0, 1.0, "tensor cores")),
    ("b200", PassBounds(1.0, 1.6, "shared memory")),
])
def test_the_attention_bound_names_what_binds(gpu, bound):
    (group,) = layer_groups(_case("llama3.1-8b", gpu, 8, ParallelConfig(tp=1, pp=1, dp=8, recompute="none")))
    assert group.attention is not None and group.attention.backward_by == bound.backward_by
    assert (group.attention.forward, group.attention.backward) == pytest.approx((bound.forward, bound.backward))


def test_head_dim_64_on_blackwell_waits_on_both():
    groups = layer_groups(_case("gpt-oss-20b", "b200", 8, ParallelConfig(tp=1, pp=1, dp=8, ep=8, recompute="none"),
                                seq=8192))
    full = next(group for group in groups if 1 in group.layers)
    assert full.attention is not None
    assert full.attention.forward == pytest.approx(2.0)  # the exponentials: 512 MMA FLOPs against 256 a score
    assert full.attention.backward == pytest.approx(2.1)  # shared memory: 64 FLOPs a byte against the tile's 30.5
    assert full.attention.backward_by == "shared memory"
