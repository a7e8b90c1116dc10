"""plan(): the top layouts of distinct shapes with reasons, or — when nothing fits — what bites and
the smallest change that fits."""

from __future__ import annotations

import pytest

from megapilot.catalog import get_gpu, get_model
from megapilot.errors import MegapilotError
from megapilot.plan import Pins, plan
from megapilot.plan.planner import distinct_shapes
from megapilot.plan.reasons import layout_label
from megapilot.spec import ClusterSpec, ParallelConfig, TrainingSpec


def _inputs(model: str, gpus: int, seq: int, gbs: int, gpu: str = "h100"):
    return get_model(model), ClusterSpec.from_gpu_count(get_gpu(gpu), gpus), TrainingSpec(
        seq_length=seq, global_batch_size=gbs)


@pytest.fixture(scope="module")
def llama8b_plan():
    return plan(*_inputs("llama3.1-8b", 16, 4096, 256), top=4)


def test_distinct_shapes_keeps_the_best_of_each_shape_in_rank_order():
    ranked = [(ParallelConfig(tp=2, dp=4, mbs=1), "a"), (ParallelConfig(tp=2, dp=4, mbs=2), "b"),
              (ParallelConfig(tp=1, dp=8, mbs=1), "c"), (ParallelConfig(tp=2, dp=2, pp=2, mbs=1), "d"),
              (ParallelConfig(tp=1, dp=8, mbs=4), "e")]
    assert [est for _, est in distinct_shapes(ranked, 5)] == ["a", "c", "d"]  # type: ignore[arg-type]  # stand-in estimates
    assert [est for _, est in distinct_shapes(ranked, 2)] == ["a", "c"]  # type: ignore[arg-type]  # stand-in estimates
    assert distinct_shapes([], 3) == []


def test_candidates_are_distinct_shapes_at_most_top_each_with_reasons(llama8b_plan):
    candidates = llama8b_plan.candidates
    shapes = {(c.parallel.tp, c.parallel.pp, c.parallel.cp, c.parallel.ep, c.parallel.fsdp)
              for c in candidates}
    assert 1 <= len(candidates) <= 4 and len(shapes) == len(candidates)
    assert all(c.reasons for c in candidates)


def test_rejections_are_listed_most_frequent_first(llama8b_plan):
    counts = list(llama8b_plan.rejected.values())
    assert counts == sorted(counts, reverse=True)


def test_the_counters_say_how_much_was_costed(llama8b_plan):
    assert llama8b_plan.layouts_costed >= len(llama8b_plan.candidates)
    assert llama8b_plan.layouts_fitting >= len(llama8b_plan.candidates)


def test_top_below_one_is_refused_by_name():
    with pytest.raises(MegapilotError) as info:
        plan(*_inputs("llama3.1-8b", 8, 4096, 128), top=0)
    assert info.value.field == "top"


def test_a_pin_is_honoured_by_every_candidate():
    result = plan(*_inputs("llama3.1-8b", 8, 4096, 128), top=3, pins=Pins(tp=4))
    assert {c.parallel.tp for c in result.candidates} == {4}


def test_nothing_fits_names_memory_and_the_smallest_change_that_fits():
    with pytest.raises(MegapilotError) as info:
        plan(*_inputs("llama3.1-405b", 8, 8192, 64))
    message = str(info.value)
    assert info.value.field == "memory"
    assert "no layout fits" in message and "GiB" in message
    assert "GPUs (" in info.value.fix  # e.g. "use 64 GPUs (8× more)"


def test_nothing_fits_names_memory_even_when_a_layout_rule_cut_more_layouts():
    """DeepSeek-V3 on one A100 node: most EP x ETP candidates break Megatron's group rule, but every legal one
    overflows HBM, so memory is what the user must change (the rule's count stays as a detail)."""
    with pytest.raises(MegapilotError) as info:
        plan(*_inputs("deepseek-v3", 8, 4096, 8, gpu="a100"))
    assert info.value.field == "memory"
    assert "no layout fits: the smallest footprint found" in str(info.value)


def test_a_pinned_mbs_that_does_not_divide_the_global_batch_is_said_so_not_memory():
    with pytest.raises(MegapilotError) as info:
        plan(*_inputs("llama3.1-70b", 64, 4096, 1024), pins=Pins(mbs=3))
    assert info.value.field == "mbs" and "does not divide the global batch (1024)" in str(info.value)
    assert "1, 2, 4, 8, 16" in info.value.fix


def test_a_gpu_count_the_global_batch_cannot_split_over_is_named():
    with pytest.raises(MegapilotError) as info:  # 100,000 = 2^5 x 5^5 GPUs; DP must divide 1,024
        plan(*_inputs("llama3.1-8b", 100_000, 4096, 1024))
    assert "DP dividing the global batch (1,024)" in str(info.value)
    assert "a divisor of 1,024" in info.value.fix and "larger GPU" not in info.value.fix


def test_activation_bound_ask_is_told_apart_and_offered_a_shorter_sequence():
    with pytest.raises(MegapilotError) as info:
        plan(*_inputs("llama3.1-8b", 8, 1048576, 8))
    message = str(info.value)
    assert "activations exceed HBM even at the smallest MBS with full recompute" in message
    assert "--seq-len 262144" in info.value.fix or "--seq-len 524288" in info.value.fix


def test_more_gpus_keep_the_global_batch_when_cp_takes_them():
    """A batch of 8 on 32 GPUs needs only DP to divide 8 (CP and TP take the rest): the advice said
    'use 32 GPUs (4× more) (and --gbs 32)', a batch change the plan on 32 GPUs does not need."""
    with pytest.raises(MegapilotError) as info:
        plan(*_inputs("llama3.1-8b", 8, 1048576, 8))
    assert "use 32 GPUs (4× more)" in info.value.fix and "--gbs" not in info.value.fix
    assert plan(*_inputs("llama3.1-8b", 32, 1048576, 8), top=1).candidates  # the advice holds as given


def test_beyond_every_relaxation_the_fix_names_what_the_footprint_is_made_of_not_a_larger_gpu():
    """It read 'use a larger GPU or a smaller model' for a 1T model needing 2,118 GiB per H100 (no GPU holds it) and
    for a 16M-token sequence (a smaller model barely helps)."""
    with pytest.raises(MegapilotError) as info:
        plan(*_inputs("gpt-1t", 8, 4096, 1024))
    fix = info.value.fix or ""
    assert "16× the GPUs (128)" in fix and "a smaller model (weights" in fix
    assert "larger GPU" not in fix and "GiB or more" not in fix and "--seq-len" not in fix
    with pytest.raises(MegapilotError) as info:
        plan(*_inputs("llama3.1-8b", 8, 16_777_216, 8))
    fix = info.value.fix or ""
    assert "a much shorter --seq-len (activations" in fix and "smaller model" not in fix


def test_beyond_every_relaxation_a_gpu_large_enough_for_the_footprint_is_named():
    pins = Pins(tp=1, pp=1, cp=1)
    with pytest.raises(MegapilotError) as info:
        plan(*_inputs("llama3.1-8b", 1, 98_304, 1), pins=pins)
    assert info.value.problem.startswith("no layout fits: 1 layout cut by")
    assert "GiB or more (mi325x, b300, gb300, mi355x)" in (info.value.fix or "")
    assert plan(*_inputs("llama3.1-8b", 1, 98_304, 1, gpu="mi355x"), top=1, pins=pins).candidates  # and it fits


def test_a_headroom_that_leaves_no_room_is_named_as_the_fix():
    """--headroom 0.99 leaves 0.8 GiB of an H100: the fix read 'use a larger GPU or a smaller model'."""
    with pytest.raises(MegapilotError) as info:
        plan(*_inputs("llama3.1-8b", 8, 4096, 64), headroom_fraction=0.99)
    assert (info.value.fix or "").startswith("use a smaller --headroom (layouts fit without the 99 % of HBM")


def test_beyond_every_relaxation_a_larger_gpu_is_sized_for_the_headroom_too():
    # 254 GiB fits an MI355X's 288 GiB, but not the 230 GiB a 20 % headroom leaves of it
    pins = Pins(tp=1, pp=1, cp=1)
    with pytest.raises(MegapilotError) as info:
        plan(*_inputs("llama3.1-8b", 1, 98_304, 1), pins=pins, headroom_fraction=0.2)
    fix = info.value.fix or ""
    assert "this GPU's memory left by --headroom" in fix and "mi355x" not in fix and "GiB or more" not in fix


def test_runners_up_inside_the_top_picks_interval_are_called_ties_with_the_memory_they_leave():
    from megapilot.plan.search import Candidate

    result = plan(*_inputs("llama3.1-70b", 64, 8192, 512), top=4)
    best = result.best.estimate
    assert best.tokens_per_s_per_gpu_p10 < best.tokens_per_s_per_gpu < best.tokens_per_s_per_gpu_p90
    # a runner-up moved to the middle of #1's interval is a tie; one far below it is not
    runner = result.candidates[1]
    inside = runner.estimate.model_copy(update={"tokens_per_s_per_gpu": best.tokens_per_s_per_gpu * 0.999})
    outside = runner.estimate.model_copy(update={"tokens_per_s_per_gpu": best.tokens_per_s_per_gpu_p10 * 0.5})

    def ties(estimate):
        return result.model_copy(update={"candidates": [
            result.candidates[0], Candidate(parallel=runner.parallel, estimate=estimate, reasons=["x"])]}).ties()

    tied = ties(inside)
    assert len(tied) >= 1 and "#2 (" in tied[0] and "GiB free" in tied[0]
    assert ties(outside) == []


def test_an_expert_group_beyond_the_nvlink_domain_is_planned_with_the_flex_dispatcher_and_says_so():
    model, cluster, training = _inputs("qwen3-30b-a3b", 32, 4096, 512)
    result = plan(model, cluster, training, top=3, pins=Pins(ep=16))
    assert result.candidates
    for candidate in result.candidates:  # EP 16 over 8-GPU nodes: DeepEP runs on H100
        assert candidate.moe_flex_dispatcher == "deepep"
        assert any("leaves the NVLink domain" in reason for reason in candidate.reasons)
    assert result.to_saved_plan().moe_flex_dispatcher == "deepep"
    inside = plan(model, cluster, training, top=1, pins=Pins(ep=8))
    assert inside.best.moe_flex_dispatcher is None


def test_no_flex_dispatcher_is_planned_where_no_backend_runs():
    model, cluster, training = _inputs("qwen3-30b-a3b", 32, 4096, 512, gpu="mi300x")
    planned = plan(model, cluster, training, top=2, pins=Pins(ep=16))
    assert all(c.moe_flex_dispatcher is None for c in planned.candidates)


def test_the_plan_says_which_candidates_are_one_layout_with_and_without_fsdp():
    """Llama 3.1 8B on one 8-GPU H100 node: FSDP and the distributed optimizer are both in the top 3 for the same
    TP/PP/CP/EP; the summary names the pair so they are not read as two layouts."""
    result = plan(get_model("llama3.1-8b"), ClusterSpec.from_gpu_count(get_gpu("h100"), 8),
                  TrainingSpec(seq_length=8192, global_batch_size=128, precision="fp8"), top=3)
    shapes = [(c.parallel.tp, c.parallel.pp, c.parallel.cp, c.parallel.ep) for c in result.candidates]
    twins = [line for line in result.summary if "Megatron-FSDP: the same layout" in line]
    assert len(twins) == len(shapes) - len(set(shapes))
    assert twins, "the case no longer has an FSDP twin in its top 3: pick another"


def test_a_layout_shown_by_a_plainer_variant_says_which_faster_one_it_set_aside_and_why():
    """Llama 4 Scout on 64 GB200s (bf16 gradients, as the recipe; twice its global batch): TP 1 x EP 16 is shown at
    MBS 1 without offload; its reasons name the MBS 2 variant with activation offload, 0.1 % faster inside the
    model's band."""
    result = plan(get_model("llama4-scout-17b-16e"), ClusterSpec.from_gpu_count(get_gpu("gb200"), 64),
                  TrainingSpec(seq_length=8192, global_batch_size=2048, precision="fp8", grad_reduce_in_bf16=True),
                  top=3)
    top = result.candidates[0]
    assert (top.parallel.tp, top.parallel.ep, top.parallel.cpu_offloading_num_layers) == (1, 16, 0)
    variant = [reason for reason in top.reasons if reason.startswith("variant:")]
    assert len(variant) == 1 and "--cpu-offloading-num-layers" in variant[0] and "MBS2" in variant[0]


def test_deepseek_v4_plans_at_tp_1_with_its_hash_layers_beside_the_embedding():
    """Megatron-LM dev runs DeepSeek-V4's attention at TP 1 and keeps its three hash-routed layers in the embedding's
    (virtual) pipeline stage: the planner searches only such layouts, and says it cut the others by those rules."""
    from megapilot.estimate.params import stage_layer_indices
    from megapilot.plan.space import RejectReason

    v4 = get_model("deepseek-v4-flash")
    result = plan(v4, ClusterSpec.from_gpu_count(get_gpu("b200"), 256),
                  TrainingSpec(seq_length=4096, global_batch_size=2048), top=5)
    assert result.candidates
    for candidate in result.candidates:
        p = candidate.parallel
        assert p.tp == 1
        first_chunk = len(stage_layer_indices(v4, p.pp, p.vpp, 0, split=p.pipeline_split)) // p.vpp
        assert first_chunk >= 3 or p.pp == 1
    assert result.rejected.get(RejectReason.PP_HASH_LAYERS.value, 0) > 0
    assert result.rejected.get(RejectReason.TP_COMPRESSED_ATTENTION.value, 0) > 0


def test_the_best_layout_a_reason_names_for_a_shape_is_the_one_the_table_shows_for_it():
    """Llama 3.1 70B on 64 H100s: TP4 x PP8 is shown at MBS 1; its MBS 2 variant, estimated faster but filling HBM,
    is set aside. `PP=4: the best PP=8 layout (...)` names the MBS 1 row the table shows, with its figure, not the
    variant the table does not show."""
    result = plan(*_inputs("llama3.1-70b", 64, 4096, 1024), top=10)
    label = "TP4 PP8 VPP10 CP1 DP2 MBS1 none"
    row = next(c.estimate for c in result.candidates if layout_label(c.parallel) == label)
    slower = 1 - row.tokens_per_s_per_gpu / result.best.estimate.tokens_per_s_per_gpu
    said = [reason for reason in result.best.reasons if reason.startswith("PP=4: the best PP=8 layout")]
    assert len(said) == 1 and said[0].startswith(f"PP=4: the best PP=8 layout ({label}) is {100 * slower:.1f} % slower")
