"""Reasons: the rules of thumb appear when the cost model reproduces them, with its numbers."""

from __future__ import annotations

import re

import pytest

from megapilot import vocabulary
from megapilot.catalog import get_gpu, get_model
from megapilot.plan import Pins, plan, search_layouts
from megapilot.plan.cost import CostModel
from megapilot.plan.reasons import Explainer, component_share, exposed_comm_share, layout_label
from megapilot.spec import ClusterSpec, TrainingSpec


def _plan(model: str, gpu: str, gpus: int, seq: int, gbs: int, pins: Pins = Pins(), top: int = 3):
    return plan(get_model(model), ClusterSpec.from_gpu_count(get_gpu(gpu), gpus),
                TrainingSpec(seq_length=seq, global_batch_size=gbs), pins=pins, top=top)


def _has(reasons: list[str], pattern: str) -> bool:
    return any(re.search(pattern, r) for r in reasons)


@pytest.fixture(scope="module")
def gpt175b_on_64_a100():
    # Without FSDP, 175B parameters cannot sit on one 8-GPU TP group: the cost model must reach for PP.
    return _plan("gpt3-175b", "a100", 64, 2048, 512, Pins(fsdp=False))


def test_tp_within_a_node_is_stated_with_the_cost_of_crossing_it(gpt175b_on_64_a100):
    best = gpt175b_on_64_a100.best
    assert best.parallel.tp == 8
    assert _has(best.reasons, r"TP ≤ GPUs per node \(8\): TP=16 would run TP all-reduces across nodes and would be "
                              r"(\d+(\.\d)? % slower|not fit)")
    assert _has(best.reasons, r"TP=8 exposes \d+(\.\d)? % of step time in TP communication")


def test_tp_beyond_the_node_is_ruled_out_by_the_split_rule_megatron_asserts_not_an_older_one():
    # Llama 3.1 70B: 64 heads, 8 KV groups; Megatron-Core >= 0.16 takes TP 16 (a multiple of the KV groups), so it
    # is costed across nodes. Llama 2 13B's 40 heads do not split over 16: that is what rules it out.
    gqa = _plan("llama3.1-70b", "h100", 64, 4096, 1024, Pins(tp=8), top=1).best
    assert _has(gqa.reasons, r"TP=16 would run TP all-reduces across nodes") and not _has(gqa.reasons, "anyway")
    heads = _plan("llama2-13b", "h100", 64, 4096, 1024, Pins(tp=8), top=1).best
    assert _has(heads.reasons, r"TP=16 is ruled out anyway: tp=16 does not divide .*40")


def test_tp_across_the_trays_of_an_nvl72_rack_states_the_limit_it_keeps_not_the_tray_size():
    # GB200 trays hold 4 GPUs, but the rack's NVLink lets TP 8 span two of them: the reason for stopping at TP 8
    # is the largest calibrated TP, not the node, and TP 16 would still ride NVLink.
    best = _plan("llama3.1-70b", "gb200", 64, 4096, 1024, Pins(tp=8), top=1).best
    assert best.parallel.tp == 8
    assert _has(best.reasons, r"TP ≤ 8 over the 4-GPU nodes of one NVLink domain: TP=16 is past the largest TP a "
                              r"calibration run checks")
    assert not _has(best.reasons, r"GPUs per node \(4\)|across nodes|inter-node")


def test_a_larger_micro_batch_past_the_search_bound_is_said_to_be_outside_it_not_simply_faster():
    # the tiny GPT's GEMMs are far from saturated: MBS 16 costs faster than MBS 8, but the search stops at MAX_MBS
    best = _plan("tiny", "h100", 1, 128, 64, top=1).best
    assert best.parallel.mbs == 8
    assert _has(best.reasons, r"MBS=16 would be \d+(\.\d)? % faster, but the search stops at MBS 8 "
                              r"\(pass --mbs 16 to take it\)")


def test_a_job_of_one_node_is_not_told_that_twice_its_tp_would_cross_nodes():
    # 8 GPUs at TP 8: there is no TP 16 to weigh, and no inter-node network to keep TP off
    best = _plan("llama3.1-8b", "h100", 8, 4096, 64, Pins(tp=8), top=1).best
    assert best.parallel.tp == 8
    assert not _has(best.reasons, r"TP=16|inter-node|across nodes")


def test_pp_for_large_models_emerges_from_memory():
    # 70B on two nodes: one TP=8 stage cannot hold weights+grads+optimizer, so the cost model needs PP=2.
    best = _plan("llama3.1-70b", "h100", 16, 8192, 256, Pins(fsdp=False)).best
    assert best.parallel.pp > 1
    assert _has(best.reasons, rf"PP={best.parallel.pp} because the model is too large for fewer stages: "
                              r"PP=\d+ does not fit even at MBS 1 with full recompute \(\d+\.\d GiB > 80.0 GiB\)")
    assert _has(best.reasons, rf"PP={best.parallel.pp} bubble \d+(\.\d)? % at \d+ micro-batches")


def test_vpp_states_the_bubble_it_removes(gpt175b_on_64_a100):
    interleaved = [c for c in gpt175b_on_64_a100.candidates if c.parallel.vpp > 1]
    assert interleaved, "a 96-layer model on PP>1 should interleave"
    cand = interleaved[0]
    match = next(re.search(r"bubble (\d+(?:\.\d)?) % at .*VPP=\d+ cuts it to (\d+(?:\.\d)?) %", r)
                 for r in cand.reasons if "cuts it to" in r)
    assert float(match.group(2)) < float(match.group(1))


def test_an_interleaved_layout_string_states_the_bubble_its_interleaving_removes():
    """DeepSeek-V3 at PP 8 x VPP 4 runs a layout string, which fixes its own VPP: the bubble it is compared with is
    the planner's layout string at VPP 1, not the same string again."""
    best = _plan("deepseek-v3", "h100", 1024, 4096, 8192, Pins(tp=2, pp=8, vpp=4, ep=64), top=1).best
    assert best.parallel.pipeline_layout is not None
    said = next(r for r in best.reasons if r.startswith("PP=8 bubble"))
    flat, interleaved = (float(x) for x in re.findall(r"([\d.]+) %", said))
    assert flat > interleaved


def test_cp_for_long_sequences_emerges_from_activation_memory():
    result = _plan("llama3.1-8b", "h100", 64, 131072, 64)
    best = result.best
    assert best.parallel.cp > 1
    assert _has(best.reasons, rf"CP={best.parallel.cp} because seq 131,072 × MBS 1 activations need \d+\.\d GiB "
                              r"at CP=1 even with full recompute")


def test_short_sequences_get_no_cp():
    assert _plan("llama3.1-8b", "h100", 16, 4096, 128).best.parallel.cp == 1


def test_ep_divides_the_experts_and_its_memory_saving_is_quantified():
    result = _plan("mixtral-8x7b", "h100", 64, 4096, 1024)
    best = result.best
    ep = best.parallel.ep
    assert 8 % ep == 0
    assert _has(best.reasons, rf"EP={ep}: 8 experts / {ep} = {8 // ep} per rank \(EP divides the expert count\); "
                              r"all-to-all (inside one NVLink domain|across NVLink domains)")
    if ep > 1:
        assert _has(best.reasons, rf"weights\+grads\+optimizer \d+\.\d GiB per GPU at EP=1 vs \d+\.\d GiB at EP={ep}")
    assert _has(best.reasons, r"router: top-2 of 8, load balancing aux_loss, aux-loss coefficient 0.02")


def test_dp_fills_the_rest_with_the_product_written_out(gpt175b_on_64_a100):
    p = gpt175b_on_64_a100.best.parallel
    assert _has(gpt175b_on_64_a100.best.reasons,
                rf"DP={p.dp} fills the rest: 64 GPUs / \(TP {p.tp} × PP {p.pp} × CP {p.cp}\) = {p.dp}")


def test_runners_up_say_why_they_lost(gpt175b_on_64_a100):
    runners_up = len(gpt175b_on_64_a100.candidates) - 1
    summary, ties = gpt175b_on_64_a100.summary[:runners_up], gpt175b_on_64_a100.ties()
    # one line per runner-up; the ties: those inside #1's 80 % interval, with the memory each leaves free
    assert all("80 % interval" in line or "leaves the most memory free" in line for line in ties)
    for line, cand in zip(summary, gpt175b_on_64_a100.candidates[1:], strict=True):
        assert layout_label(cand.parallel) in line
        duration = r"\d[\d,.]* (?:s|ms|µs)"  # format_duration's output: three significant digits and a unit
        assert re.search(rf"(slower: .+ {duration} vs {duration} per step|ties on speed|slower$|"
                         r"faster, within the model's error: ranked lower by the recipe tie-break \(.+\))", line)


def test_shares_are_read_from_the_estimators_breakdown(gpt175b_on_64_a100):
    est = gpt175b_on_64_a100.best.estimate
    assert 0 < component_share(est, "tp") < 1
    assert 0 < exposed_comm_share(est) < 1
    assert component_share(est, "bubble") == pytest.approx(est.time_breakdown_s["pp_bubble"] / est.step_time_s)


def test_uneven_pipeline_split_is_planned_and_explained_for_126_layers():
    # 126 layers divide by no PP from 4 to 64; Llama 3.1 405B on 2,048 GPUs still gets PP16: with the
    # embedding and loss counted as layers (128 slots, NVIDIA's recipe), which also admits interleaving, ahead
    # of 7 layers on the first and last stages (112 = 14 x 8 in the middle); the reasons say why.
    result = _plan("llama3.1-405b", "h100", 2048, 8192, 2048, Pins(tp=8, pp=16), top=5)
    best = result.best
    assert (best.parallel.account_for_embedding, best.parallel.account_for_loss) == (True, True)
    assert best.parallel.vpp > 1 and "PP16(+E+L)" in layout_label(best.parallel)
    assert _has(best.reasons, r"PP=16 with the embedding and loss counted as a layer \(128 slots")
    # The first/last split ties the account-for one on speed and memory at CP1 (one shape, so the plan shows
    # one of them): its reasons are read from the search's own list.
    outcome = search_layouts(result.model, result.cluster, result.training, pins=Pins(tp=8, pp=16))
    uneven = next(fit.parallel for fit in outcome.ranked if fit.parallel.first_stage_layers is not None)
    assert (uneven.first_stage_layers, uneven.last_stage_layers) == (7, 7)
    assert "PP16(7,…,7)" in layout_label(uneven)
    explainer = Explainer(CostModel(result.model, result.cluster, result.training), outcome.best_by)
    reasons = explainer.explain(uneven, explainer.cost(uneven))
    assert _has(reasons, "PP=16 with 7 layers on the first and last stages: 126 layers do not divide by 16; "
                         r"the embedding/output stages get fewer \(8 on each middle stage\)")


def test_a_hybrids_uneven_split_names_the_release_that_reads_its_segments():
    """Nemotron-H 56B at PP 4 (118 layers): the hybrid stack takes the split as | segments of its layer pattern, which
    the reasons say, with the release the vocabulary's row for the flag gives; an even split at VPP 1 needs none."""
    uneven = _plan("nemotron-h-56b", "h100", 32, 8192, 256, Pins(pp=4), top=1).best
    assert not uneven.parallel.pipeline_split.is_even
    since = vocabulary.term("--hybrid-layer-pattern").since
    assert since and _has(uneven.reasons, rf"segments of --hybrid-layer-pattern, .*from {since} on")
    even = _plan("nemotron-h-56b", "h100", 32, 8192, 256, Pins(pp=2, vpp=1), top=1).best
    assert not _has(even.reasons, "segments of")


def test_pp_is_limited_by_num_layers_only_where_no_split_is_legal():
    # 126 layers: every PP up to 64 has an even or an uneven split, so no PP is blocked by the layers.
    best = _plan("llama3.1-405b", "h100", 2048, 8192, 2048, Pins(tp=8)).best
    assert not _has(best.reasons, "PP is limited by num_layers")
    assert best.parallel.pp > 2  # beyond the PP 1-2 of an even-only split of 126 layers
    # 61 layers at PP=32: no even, account-for or first/last split, but a layout string (E, t, m, L over 32
    # stages) is legal - so PP=32 is costed, not blocked; the 32-layer Llama 3.1 8B on 64 GPUs stops at PP=32.
    best = _plan("deepseek-v3", "h100", 2048, 4096, 15360, Pins(tp=2, ep=64)).best
    # not 32 (512 when the winner runs CP 2)
    assert _has(best.reasons, r"PP is limited by num_layers=61: PP=64, 128, 256(, 512)? would divide the GPUs")
    best = _plan("llama3.1-8b", "h100", 64, 4096, 512, Pins(tp=1)).best
    assert _has(best.reasons, r"PP is limited by num_layers=32: PP=64 would divide the GPUs")


def test_an_expert_group_across_gb200_trays_is_inside_the_nvl72_domain():
    """Two 4-GPU GB200 trays share one NVLink domain: EP=8 over them is not "across nodes", and the all-to-all
    warning does not advise keeping it inside the domain it is already in."""
    best = _plan("qwen3-30b-a3b", "gb200", 8, 4096, 512, Pins(tp=1, ep=8, pp=1)).best
    assert _has(best.reasons, r"EP=8: 128 experts / 8 = 16 per rank .*all-to-all inside one NVLink domain")
    assert not any("keep ep*etp inside the NVLink domain" in reason for reason in best.reasons)
    across = _plan("qwen3-30b-a3b", "h100", 16, 4096, 512, Pins(tp=1, ep=16, pp=1)).best
    assert _has(across.reasons, r"EP=16: .*all-to-all across NVLink domains")


def test_an_uneven_split_names_its_end_stages_counts_in_the_order_it_names_the_stages():
    """Llama 3.1 8B on 7 GPUs: PP7 with 4 layers on the first stage and 3 on the last (`PP7(4,…,3)`, the script's
    PP_FIRST_LAYERS=4 PP_LAST_LAYERS=3); the reason says 4 and 3 on the first and last, not the counts sorted."""
    best = _plan("llama3.1-8b", "h100", 7, 4096, 1024, top=1).best
    assert (best.parallel.pp, best.parallel.first_stage_layers, best.parallel.last_stage_layers) == (7, 4, 3)
    assert _has(best.reasons, r"^PP=7 with 4 and 3 layers on the first and last stages: 32 layers do not divide by 7")


def test_one_micro_batch_is_said_in_the_singular():
    best = _plan("llama3.1-8b", "h100", 8, 4096, 3, top=1).best
    assert best.parallel.num_microbatches(3) == 1
    assert _has(best.reasons, rf"^MBS={best.parallel.mbs}: 1 micro-batch per replica")


@pytest.mark.parametrize(("gpu", "gpus", "fabric", "other"), [("mi300x", 8, "xGMI", "NVLink"),
                                                               ("h100", 16, "NVLink", "xGMI")])
def test_the_expert_all_to_all_is_placed_on_the_gpus_own_scale_up_links(gpu, gpus, fabric, other):
    # an MI300X plan read 'all-to-all inside one NVLink domain'; AMD Instinct GPUs talk over xGMI
    result = _plan("mixtral-8x7b", gpu, gpus, 4096, 256, top=1)
    ep_lines = [r for r in result.best.reasons if r.startswith("EP=") and "all-to-all" in r]
    assert ep_lines and all(f"one {fabric} domain" in r and other not in r for r in ep_lines)


def test_a_batch_that_caps_dp_is_named_as_what_chose_the_layout():
    """GBS 1,021 (a prime) on 96 GPUs forces DP=1 and a PP12 x CP8 layout 25 % slower than at GBS 1,024; the reasons
    said only 'DP=1 fills the rest', and '1 layers' on the end stages."""
    prime = _plan("llama3.1-8b", "h100", 96, 4096, 1021, top=1).best.reasons
    capped = [r for r in prime if r.startswith("DP ≤ 1:")]
    assert len(capped) == 1 and "largest common factor is 1" in capped[0] and "e.g. 1,056, DP up to 96" in capped[0]
    assert not any("1 layers" in r for r in prime)
    assert not any(r.startswith("DP ≤") for r in _plan("llama3.1-8b", "h100", 96, 4096, 1024, top=1).best.reasons)
