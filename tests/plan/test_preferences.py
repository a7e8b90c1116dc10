"""The recipe tie-break: inside the estimator's own error band the recipes' preferences order the layouts,
each rule decides its own pair (so removing or reordering one fails here), outside the band speed decides,
and the plan's reasons name the rule when it changed the order."""

from __future__ import annotations

import math

import pytest

from megapilot.catalog import get_gpu, get_model
from megapilot.estimate import estimate
from megapilot.estimate.coverage import coverage_for
from megapilot.plan import plan
from megapilot.plan.cost import CostModel
from megapilot.plan.planner import UNCHECKED_ERROR_BAND, model_error_band
from megapilot.plan.preferences import (
    LOW_HEADROOM_FRACTION,
    PREFERENCES,
    ErrorBand,
    LayoutContext,
    deciding_rule,
    order_by_recipe,
)
from megapilot.plan.search import Fit
from megapilot.spec import ClusterSpec, EstimateResult, ParallelConfig, TrainingSpec

BAND = ErrorBand(0.07, "test band")
DENSE_ON_H100 = LayoutContext(nvlink_gpus=8, num_experts=None)
MOE_128_ON_H100 = LayoutContext(nvlink_gpus=8, num_experts=128)
MOE_256_ON_NVL72 = LayoutContext(nvlink_gpus=72, num_experts=256)


@pytest.fixture(scope="module")
def template() -> EstimateResult:
    """A real estimate whose throughput the tests overwrite (the rules read only the layout)."""
    model = get_model("llama3.1-8b")
    cluster = ClusterSpec.from_gpu_count(get_gpu("h100"), 8)
    est = CostModel(model, cluster, TrainingSpec(seq_length=4096, global_batch_size=64))(ParallelConfig(dp=8))
    half_full = est.memory_gib.model_copy(update={"total": est.memory_gib.capacity / 2})
    return est.model_copy(update={"memory_gib": half_full})  # every stand-in layout fits


def _fit(template: EstimateResult, parallel: ParallelConfig, speed: float, free_fraction: float = 0.5) -> Fit:
    memory = template.memory_gib.model_copy(update={"total": template.memory_gib.capacity * (1 - free_fraction)})
    return Fit(parallel, template.model_copy(update={"tokens_per_s_per_gpu": speed, "memory_gib": memory}))


def _layout(**fields: object) -> ParallelConfig:
    fields.setdefault("dp", 64 // math.prod(int(fields.get(k, 1)) for k in ("tp", "pp", "cp")))  # type: ignore[call-overload]  # test-only field bag
    fields["sequence_parallel"] = int(fields.get("tp", 1)) > 1  # type: ignore[call-overload]  # test-only field bag
    return ParallelConfig(**fields)  # type: ignore[arg-type]  # test-only field bag


# (rule that must decide, context, the layout the recipes prefer, the one predicted slightly faster, and the share of
# HBM each leaves free)
DECISIONS = [
    ("distributed optimizer", DENSE_ON_H100, _layout(tp=2), _layout(tp=2, fsdp=True), (0.5, 0.5)),
    ("expert parallelism", MOE_128_ON_H100, _layout(ep=8), _layout(ep=2), (0.5, 0.5)),
    ("expert parallelism", MOE_128_ON_H100, _layout(ep=8), _layout(ep=32), (0.5, 0.5)),  # EP beyond NVLink
    ("expert parallelism", MOE_256_ON_NVL72, _layout(ep=64), _layout(ep=8), (0.5, 0.5)),  # NVL72: EP64 fills it
    ("fewer exotic flags", DENSE_ON_H100, _layout(tp=2, pp=2),
     _layout(tp=2, recompute="none", cpu_offloading_num_layers=4), (0.5, 0.5)),
    ("fewer exotic flags", DENSE_ON_H100, _layout(tp=2, pp=4, account_for_loss=True, account_for_embedding=True),
     _layout(tp=2, pp=4, first_stage_layers=7, last_stage_layers=7), (0.5, 0.5)),
    ("lighter recompute", DENSE_ON_H100, _layout(tp=2, pp=2), _layout(tp=2, recompute="full"), (0.5, 0.5)),
    ("fewer parallel dimensions", DENSE_ON_H100, _layout(tp=8), _layout(tp=2, pp=2), (0.5, 0.5)),
    ("context parallelism", DENSE_ON_H100, _layout(tp=2, pp=2), _layout(cp=2, pp=2), (0.5, 0.5)),
    ("memory headroom", DENSE_ON_H100, _layout(tp=4, pp=8), _layout(tp=8, pp=4), (0.2, 0.03)),
]
IDS = [f"{d[0]}-{i}" for i, d in enumerate(DECISIONS)]


@pytest.mark.parametrize(("rule", "context", "preferred", "faster", "free"), DECISIONS, ids=IDS)
def test_each_rule_decides_its_pair_inside_the_band(template, rule, context, preferred, faster, free):
    fits = [_fit(template, faster, 101.0, free[1]), _fit(template, preferred, 100.0, free[0])]  # 1 % apart
    assert [fit.parallel for fit in order_by_recipe(fits, BAND, context)] == [preferred, faster]
    decided_by = deciding_rule(fits[1], fits[0], context)
    assert decided_by is not None and decided_by.name == rule
    without = tuple(r for r in PREFERENCES if r.name != rule)  # the rule removed: speed decides again
    assert order_by_recipe(fits, BAND, context, without)[0].parallel == faster


@pytest.mark.parametrize(("rule", "context", "preferred", "faster", "free"), DECISIONS, ids=IDS)
def test_outside_the_band_the_prediction_decides(template, rule, context, preferred, faster, free):
    fits = [_fit(template, faster, 100.0 * (1 + 2 * BAND.fraction), free[1]), _fit(template, preferred, 100.0, free[0])]
    assert order_by_recipe(fits, BAND, context)[0].parallel == faster


def test_the_rules_apply_in_their_stated_order(template):
    """FSDP loses to a plain layout with one more dimension; a CP layout loses to a deeper TP×PP one with
    the same number of dimensions (CP comes before the group size); a layout with one dimension fewer wins though it
    leaves little memory free (the dimension count comes before the headroom)."""
    first = [_fit(template, _layout(tp=2, fsdp=True), 101.0), _fit(template, _layout(tp=2, pp=2), 100.0)]
    assert order_by_recipe(first, BAND, DENSE_ON_H100)[0].parallel.fsdp is False
    second = [_fit(template, _layout(tp=2, cp=2), 101.0), _fit(template, _layout(tp=2, pp=8), 100.0)]
    assert order_by_recipe(second, BAND, DENSE_ON_H100)[0].parallel.cp == 1
    third = [_fit(template, _layout(tp=2, pp=2), 101.0), _fit(template, _layout(tp=8), 100.0, free_fraction=0.01)]
    assert order_by_recipe(third, BAND, DENSE_ON_H100)[0].parallel.tp == 8


def test_what_the_rules_leave_tied_goes_by_predicted_speed_not_by_a_fixed_tp_or_pp_preference(template):
    """TP 2 × PP 8 against TP 4 × PP 4, both with room: the recipes go both ways, so the prediction orders them,
    whichever way round the speeds lie."""
    for faster, slower in ((_layout(tp=2, pp=8), _layout(tp=4, pp=4)), (_layout(tp=4, pp=4), _layout(tp=2, pp=8))):
        fits = [_fit(template, faster, 101.0), _fit(template, slower, 100.0)]
        assert order_by_recipe(fits, BAND, DENSE_ON_H100)[0].parallel == faster
        assert deciding_rule(fits[1], fits[0], DENSE_ON_H100) is None


def test_the_headroom_line_is_the_estimates_own_low_memory_warning(template):
    """The rule's line is the share below which `estimate` itself warns that allocator spikes may OOM."""
    model = get_model("llama3.1-8b")
    cluster = ClusterSpec.from_gpu_count(get_gpu("h100"), 8)
    training = TrainingSpec(seq_length=4096, global_batch_size=64)
    tight = next(r for r in PREFERENCES if r.name == "memory headroom")
    seen = set()
    for layout in (ParallelConfig(dp=8, recompute="none"), ParallelConfig(tp=2, dp=4, sequence_parallel=True)):
        est = estimate(model, cluster, training, layout)
        assert est.fits
        warned = any("allocator spikes may OOM" in w for w in est.warnings)
        assert tight.penalty(Fit(layout, est), DENSE_ON_H100) == float(warned)
        seen.add(warned)
    assert seen == {True, False}  # the 8B model on one H100 per replica fills it; at TP 2 it has room
    assert LOW_HEADROOM_FRACTION == 0.05


def test_a_dense_job_inside_one_nvlink_domain_takes_fsdp_as_readily_as_the_distributed_optimizer(template):
    """On one 8-GPU node (or one NVL72 rack) FSDP's traffic rides NVLink: a dense model's FSDP layout is not
    penalised there, so speed decides; an MoE model's still is (the recipes shard experts with EP)."""
    node = LayoutContext(nvlink_gpus=8, num_experts=None, one_domain=True)
    fits = [_fit(template, _layout(fsdp=True, dp=8), 101.0), _fit(template, _layout(dp=8), 100.0)]
    assert order_by_recipe(fits, BAND, node)[0].parallel.fsdp is True
    assert order_by_recipe(fits, BAND, DENSE_ON_H100)[0].parallel.fsdp is False  # 64 GPUs: eight nodes
    moe_node = LayoutContext(nvlink_gpus=8, num_experts=128, one_domain=True)
    moe = [_fit(template, _layout(fsdp=True, ep=8, dp=8), 101.0), _fit(template, _layout(ep=8, dp=8), 100.0)]
    assert order_by_recipe(moe, BAND, moe_node)[0].parallel.fsdp is False
    assert LayoutContext.of(get_model("llama3.1-8b"), ClusterSpec.from_gpu_count(get_gpu("h100"), 8)).one_domain
    assert not LayoutContext.of(get_model("llama3.1-8b"), ClusterSpec.from_gpu_count(get_gpu("h100"), 16)).one_domain
    # two H100 nodes of 4 GPUs: 8 GPUs, but NVLink ends at each node, so FSDP's traffic crosses the NICs
    half_nodes = ClusterSpec.from_gpu_count(get_gpu("h100"), 8, gpus_per_node=4)
    assert not LayoutContext.of(get_model("llama3.1-8b"), half_nodes).one_domain


def test_equal_preferences_keep_the_speed_order(template):
    fits = [_fit(template, _layout(tp=2, mbs=2), 101.0), _fit(template, _layout(tp=2, mbs=1), 100.0)]
    assert [fit.parallel.mbs for fit in order_by_recipe(fits, BAND, DENSE_ON_H100)] == [2, 1]
    assert deciding_rule(fits[1], fits[0], DENSE_ON_H100) is None


def test_the_expert_target_is_the_largest_expert_divisor_inside_the_nvlink_domain():
    assert MOE_128_ON_H100.expert_target == 8
    assert MOE_256_ON_NVL72.expert_target == 64
    assert LayoutContext(nvlink_gpus=8, num_experts=6).expert_target == 6
    small_job = LayoutContext.of(get_model("llama3.1-8b"), ClusterSpec.from_gpu_count(get_gpu("gb200"), 4))
    assert small_job.nvlink_gpus == 4  # a job smaller than the domain only has its own GPUs
    moe_on_half_nodes = LayoutContext.of(get_model("mixtral-8x7b"),
                                         ClusterSpec.from_gpu_count(get_gpu("h100"), 16, gpus_per_node=4))
    assert moe_on_half_nodes.nvlink_gpus == 4 and moe_on_half_nodes.expert_target == 4  # NVLink ends at the node


def test_the_band_is_the_calibrated_median_error_of_the_case_and_says_where_from():
    model = get_model("llama3.1-70b")
    cluster = ClusterSpec.from_gpu_count(get_gpu("h100"), 64)
    band = model_error_band(model, cluster, TrainingSpec(seq_length=8192, global_batch_size=512))
    cell = coverage_for(model, cluster.gpu, "bf16").nearest
    assert cell is not None and band.fraction == cell.median_abs_error
    assert f"{cell.runs} published runs" in band.source and "dense" in band.source
    amd = ClusterSpec.from_gpu_count(get_gpu("mi300x"), 8)
    assert coverage_for(model, amd.gpu, "bf16").nearest is None  # no published AMD run is calibrated
    unchecked = model_error_band(model, amd, TrainingSpec(seq_length=4096, global_batch_size=64))
    assert unchecked.fraction == UNCHECKED_ERROR_BAND and "no published run" in unchecked.source


def _tp2_slightly_faster(template: EstimateResult):
    """A stand-in estimator: TP=2 is 2 % faster than TP=1 (inside every calibrated band), all else equal."""
    def estimate(p: ParallelConfig) -> EstimateResult:
        speed = 100.0 * (1.02 if p.tp == 2 else 1.0) * (1.0 - 0.001 * (p.pp + p.cp + p.mbs + p.fsdp))
        return template.model_copy(update={"tokens_per_s_per_gpu": speed})
    return estimate


def test_the_plan_names_the_tie_break_when_it_changed_the_order(template):
    model = get_model("llama3.1-8b")
    cluster = ClusterSpec.from_gpu_count(get_gpu("h100"), 8)
    training = TrainingSpec(seq_length=4096, global_batch_size=64)
    result = plan(model, cluster, training, top=3, estimator=_tp2_slightly_faster(template))
    best = result.best
    assert (best.parallel.tp, best.parallel.pp, best.parallel.cp) == (1, 1, 1)
    tie_break = [r for r in best.reasons if r.startswith("tie-break")]
    assert len(tie_break) == 1
    assert "faster, within the model's" in tie_break[0] and "published runs" in tie_break[0]
    assert "tie-break (fewer parallel dimensions): TP2 " in tie_break[0]
    runner_up = next(line for line in result.summary if "TP2 PP1" in line)
    assert "predicted 2.0 % faster" in runner_up and "recipe tie-break (fewer parallel dimensions" in runner_up


def test_no_tie_break_reason_when_the_fastest_layout_leads(template):
    model = get_model("llama3.1-8b")
    cluster = ClusterSpec.from_gpu_count(get_gpu("h100"), 8)
    training = TrainingSpec(seq_length=4096, global_batch_size=64)

    def plain_is_fastest(p: ParallelConfig) -> EstimateResult:
        speed = 100.0 * (1.0 - 0.01 * (p.tp + p.pp + p.cp + p.mbs + p.fsdp))
        return template.model_copy(update={"tokens_per_s_per_gpu": speed})

    result = plan(model, cluster, training, top=3, estimator=plain_is_fastest)
    assert (result.best.parallel.tp, result.best.parallel.pp, result.best.parallel.cp) == (1, 1, 1)
    assert not any(r.startswith("tie-break") for r in result.best.reasons)


def test_the_plan_says_when_memory_headroom_decided(template):
    """TP 2 predicted 1 % faster but filling HBM to its last 2 %; TP 4 with room: the plan puts TP 4 first and its
    reasons name the headroom rule and why; the runner-up line says the same."""
    model = get_model("llama3.1-8b")
    cluster = ClusterSpec.from_gpu_count(get_gpu("h100"), 8)
    training = TrainingSpec(seq_length=4096, global_batch_size=64)
    capacity = template.memory_gib.capacity

    def estimate_(p: ParallelConfig) -> EstimateResult:
        speed = {2: 101.0, 4: 100.0}.get(p.tp, 50.0) * (1.0 - 0.001 * (p.pp + p.cp + p.mbs + p.fsdp))
        used = capacity * (0.98 if p.tp == 2 else 0.6)
        memory = template.memory_gib.model_copy(update={"total": used})
        return template.model_copy(update={"tokens_per_s_per_gpu": speed, "memory_gib": memory})

    result = plan(model, cluster, training, top=2, estimator=estimate_)
    assert [c.parallel.tp for c in result.candidates] == [4, 2]
    tie_break = [r for r in result.best.reasons if r.startswith("tie-break")]
    assert len(tie_break) == 1 and tie_break[0].startswith("tie-break (memory headroom): TP2 ")
    assert "5 % of HBM left free" in tie_break[0] and "may run out of memory" in tie_break[0]
    assert any("memory headroom" in line for line in result.summary)


def test_the_cp_rule_states_what_it_prefers_when_both_layouts_need_cp(template):
    """A 1M-token sequence needs CP4 or CP8: the rule picks the smaller, and said 'the recipes prefer CP=1', which
    neither layout is."""
    from megapilot.plan.preferences import tie_break_reason

    winner, faster = _fit(template, _layout(tp=2, cp=4), 100.0), _fit(template, _layout(tp=2, cp=8), 101.0)
    reason = tie_break_reason(winner, faster, BAND, DENSE_ON_H100, "the CP8 layout")
    assert reason is not None and reason.startswith("tie-break (context parallelism)")
    assert "prefer CP=1" not in reason and "the smaller CP" in reason
