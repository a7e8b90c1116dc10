"""build_case: layout flags become typed specs with the stated defaults, and every bad flag is named."""

from __future__ import annotations

import pytest

from megapilot.errors import MegapilotError
from megapilot.estimate.cases import KNOWN_FLAGS, build_case

BASE = {"model": "llama3.1-8b", "gpu": "h100", "gpus": 16, "gbs": 128, "seq_len": 8192}


def test_defaults_are_the_stated_ones():
    case = build_case(**BASE, tp=2)
    p = case.parallel
    assert (p.tp, p.pp, p.vpp, p.cp, p.ep, p.mbs, p.dp) == (2, 1, 1, 1, 1, 1, 8)
    assert p.sequence_parallel and p.distributed_optimizer and not p.fsdp  # SP on because tp > 1
    assert p.recompute == "none" and p.expert_tp == 2 and p.pipeline_layout is None
    assert case.training.precision == "bf16" and case.training.seq_length == 8192
    assert case.cluster.world_size == 16 and case.cluster.gpus_per_node == 8
    assert case.model.name == "llama3.1-8b" and not case.allow_tp_across_nodes
    assert not build_case(**BASE).parallel.sequence_parallel  # tp = 1: nothing to split


def test_a_moe_layout_with_expert_parallelism_takes_bridges_etp_of_1_and_a_given_one_stands():
    """Qwen3-235B as the 25.09 table prints its GB200 run (TP 2, EP 64, 64 GPUs, no ETP column): Megatron-LM's
    ETP = TP would need 128 expert ranks in a stage of 64 and was refused; Bridge's recipe ran ETP 1."""
    moe = dict(model="qwen3-235b-a22b", gpu="gb200", gpus=64, seq_len=4096, gbs=1024, precision="fp8")
    p = build_case(**moe, tp=2, ep=64).parallel
    assert (p.etp, p.expert_tp, p.ep * p.expert_tp) == (1, 1, 64)
    assert build_case(**moe, tp=2, ep=8, etp=2).parallel.expert_tp == 2  # a given ETP is the user's
    assert build_case(**moe, tp=2).parallel.expert_tp == 2  # no EP: the experts split over TP, as Megatron's
    assert build_case(**BASE, tp=2).parallel.etp is None  # a dense model has no experts to default


def test_none_means_not_given():
    assert build_case(**BASE, tp=None, precision=None) == build_case(**BASE)


def test_the_command_lines_pp_layout_is_the_pipeline_layout_field_under_its_short_name():
    layout = "Et|(tt|)*3tL"
    assert build_case(**BASE, pp=2, pp_layout=layout) == build_case(**BASE, pp=2, pipeline_layout=layout)
    with pytest.raises(MegapilotError, match="given twice") as refused:
        build_case(**BASE, pp=2, pp_layout=layout, pipeline_layout=layout)
    assert refused.value.field == "pipeline_layout"


def test_given_flags_reach_the_specs():
    case = build_case(**BASE, tp=2, pp=2, cp=2, mbs=2, recompute="full", recompute_method="block",
                      recompute_num_layers=4, precision="fp8", gpus_per_node=4, force_tp_across_nodes=True)
    p = case.parallel
    assert (p.tp, p.pp, p.cp, p.dp, p.mbs) == (2, 2, 2, 2, 2)
    assert (p.recompute, p.recompute_method, p.recompute_num_layers) == ("full", "block", 4)
    assert case.training.precision == "fp8" and case.cluster.gpus_per_node == 4 and case.allow_tp_across_nodes


@pytest.mark.parametrize(("flags", "field"), [
    ({"tpp": 2}, "tpp"),  # unknown flag
    ({"tp": "2"}, "tp"),  # not an integer
    ({"tp": True}, "tp"),  # a bool is not an integer here
    ({"pp": 0}, "pp"),
    ({"fsdp": "yes"}, "fsdp"),
    ({"precision": 8}, "precision"),
    ({"precision": "fp6"}, "precision"),
    ({"gbs": 100, "tp": 1}, None),  # checked later by the layout rules, not here: see below
    ({"tp": 3}, "gpus"),  # TP*PP*CP does not divide 16 GPUs
    ({"sequence_parallel": True}, "sequence_parallel"),  # needs tp > 1
    ({"vpp": 2}, "vpp"),  # needs pp > 1
    ({"recompute_num_layers": 2}, "recompute_num_layers"),  # only with full recompute
    ({"recompute_method": "block"}, "recompute_method"),  # likewise: Megatron would drop it unsaid
    ({"pipeline_layout": "balanced"}, "pipeline_layout"),  # needs pp > 1
    ({"moe_capacity_factor": 1.0}, "moe_capacity_factor"),  # a dense model drops no tokens
    ({"moe_capacity_factor": 0, "model": "mixtral-8x7b"}, "moe_capacity_factor"),
    ({"moe_capacity_factor": "1", "model": "mixtral-8x7b"}, "moe_capacity_factor"),
    ({"moe_capacity_factor": float("nan"), "model": "mixtral-8x7b"}, "moe_capacity_factor"),
    ({"moe_capacity_factor": float("inf"), "model": "mixtral-8x7b"}, "moe_capacity_factor"),  # Megatron: int(inf)
    ({"moe_pad_to_capacity": True, "model": "mixtral-8x7b"}, "moe_pad_to_capacity"),  # padding needs a capacity
    ({"mtp_num_layers": -1}, "mtp_num_layers"),
    ({"mtp_num_layers": True}, "mtp_num_layers"),
    # Megatron-FSDP steps through the distributed optimizer: the launch writes it whatever was asked
    ({"fsdp": True, "distributed_optimizer": False}, "distributed_optimizer"),
])
def test_bad_flags_are_refused_naming_the_flag(flags, field):
    if field is None:  # an odd global batch is legal input; whether it divides is the layout check's job
        assert build_case(**{**BASE, **flags}).training.global_batch_size == 100
        return
    with pytest.raises(MegapilotError) as info:
        build_case(**{**BASE, **flags})
    assert info.value.field == field
    assert info.value.fix, "every refusal says what to do"


@pytest.mark.parametrize("missing", ["model", "gpu", "gpus", "gbs", "seq_len"])
def test_each_required_flag_is_named_when_missing(missing):
    flags = {k: v for k, v in BASE.items() if k != missing}
    with pytest.raises(MegapilotError) as info:
        build_case(**flags)
    assert info.value.field == missing and f"--{missing.replace('_', '-')}" in (info.value.fix or "")


def test_every_missing_flag_is_named_in_one_error():
    with pytest.raises(MegapilotError) as info:
        build_case(model=BASE["model"], gpu=BASE["gpu"])
    assert info.value.field == "gpus" and "so are gbs and seq_len" in info.value.problem
    assert info.value.fix == "pass --gpus, --gbs and --seq-len"


def test_the_precision_error_lists_the_precisions():
    with pytest.raises(MegapilotError) as info:
        build_case(**BASE, precision="fp6")
    assert "bf16" in (info.value.fix or "") and "fp8" in (info.value.fix or "")


def test_a_balanced_layout_is_computed_and_carried_as_its_string():
    case = build_case(**BASE, pp=2, pipeline_layout="balanced")
    layout = case.parallel.pipeline_layout
    assert layout is not None and layout != "balanced"
    assert layout.count("|") + 1 == 2  # one stage per PP rank (VPP 1)
    assert sum(case.parallel.rank_layer_counts(case.model.num_layers)) == case.model.num_layers


def test_known_flags_cover_every_documented_flag():
    assert {"seq_len", "gpus_per_node", "recompute_num_layers", "pipeline_layout", "account_for_loss"} <= KNOWN_FLAGS


def test_token_dropping_reaches_the_model_spec():
    case = build_case(**{**BASE, "model": "mixtral-8x7b", "moe_capacity_factor": 1.25, "moe_pad_to_capacity": True})
    assert case.model.moe.capacity_factor == 1.25 and case.model.moe.pad_to_capacity
    assert build_case(**{**BASE, "model": "mixtral-8x7b"}).model.moe.capacity_factor is None  # dropless default


def test_token_dropping_keeps_the_moe_spec_rules(tmp_path):
    from megapilot.catalog import get_model

    mixtral = get_model("mixtral-8x7b")
    sinkhorn = mixtral.model_copy(update={"name": "sinkhorn-moe",
                                          "moe": mixtral.moe.model_copy(update={"load_balancing_type": "sinkhorn"})})
    path = tmp_path / "sinkhorn.json"
    path.write_text(sinkhorn.model_dump_json())
    with pytest.raises(MegapilotError, match="not sinkhorn") as refused:
        build_case(**{**BASE, "model": str(path), "moe_capacity_factor": 1.0})
    assert refused.value.field.startswith("moe")


def test_the_mtp_modules_can_be_set_and_removed():
    """DeepSeek-V3 as published without its MTP module (`--mtp-num-layers 0`), and MTP added to a dense model."""
    from megapilot.estimate import estimate

    flags = {**BASE, "model": "deepseek-v3", "gpus": 1024, "tp": 2, "pp": 8, "ep": 64, "gbs": 8192,
             "pipeline_layout": "balanced", "precision": "fp8"}
    with_mtp, without = build_case(**flags), build_case(**flags, mtp_num_layers=0)
    assert with_mtp.model.mtp_num_layers == 1 and without.model.mtp_num_layers == 0
    assert "m" in (with_mtp.parallel.pipeline_layout or "") and "m" not in (without.parallel.pipeline_layout or "")
    flops = [estimate(c.model, c.cluster, c.training, c.parallel).flops_per_step for c in (with_mtp, without)]
    assert flops[1] < flops[0]
    assert build_case(**BASE, mtp_num_layers=2).model.mtp_num_layers == 2
    with pytest.raises(MegapilotError) as refused:  # arguments.py asserts rope (or none) under MTP
        build_case(**{**BASE, "model": "gpt3-175b", "seq_len": 2048, "mtp_num_layers": 1})
    assert refused.value.field == "mtp_num_layers"


def test_an_mtp_depth_the_model_refuses_is_said_of_the_flag_with_the_depths_it_takes():
    """DeepSeek-V4's compress ratios cover its 43 layers and its one MTP layer: `--mtp-num-layers 3` is refused as
    the flag given (not as `mla.csa.compress_ratios`, which no flag sets), with the depth that works."""
    flags = {**BASE, "model": "deepseek-v4-flash", "gpu": "b200", "gpus": 64, "gbs": 512, "seq_len": 4096}
    with pytest.raises(MegapilotError) as refused:
        build_case(**flags, mtp_num_layers=3)
    assert refused.value.field == "mtp_num_layers" and "--mtp-num-layers 3" in refused.value.problem
    assert refused.value.fix == "use --mtp-num-layers 1 (the model's own)"
    with pytest.raises(MegapilotError) as too_deep:  # the spec's bound, said of the flag with a depth it takes
        build_case(**{**flags, "model": "deepseek-v3"}, mtp_num_layers=5000)
    assert too_deep.value.field == "mtp_num_layers" and "4,096" in too_deep.value.problem
    assert too_deep.value.fix == "use --mtp-num-layers 1 (the model's own) or --mtp-num-layers 0"


def test_mtp_depths_can_repeat_one_module_as_nemotron_3_supers_recipe_runs_it():
    """Two MTP depths of Nemotron 3 Super's one module (`--mtp-num-layers 2 --mtp-use-repeated-layer`): the second
    depth adds work but no weights."""
    from megapilot.estimate import estimate

    flags = {**BASE, "model": "nemotron3-super", "gpu": "gb200", "gpus": 64, "tp": 2, "ep": 64, "etp": 1,
             "seq_len": 8192, "gbs": 512, "recompute": "none"}
    one, repeated = build_case(**flags), build_case(**flags, mtp_num_layers=2, mtp_repeated_layer=True)
    assert (repeated.model.mtp_num_layers, repeated.model.mtp_repeated_layer) == (2, True)
    results = [estimate(c.model, c.cluster, c.training, c.parallel) for c in (one, repeated)]
    assert results[1].flops_per_step > results[0].flops_per_step
    assert results[1].params.total == results[0].params.total


def test_the_flex_dispatcher_is_priced_where_asked_and_refused_where_nothing_is_dispatched():
    """DeepSeek-V3 at EP 64 over eight H100 nodes: `--moe-flex-dispatcher hybridep` (as `script` writes it) sends a
    token to each remote node once, so the exposed all-to-all shrinks; a dense model or another backend is
    refused by field."""
    from megapilot.estimate import estimate

    flags = {**BASE, "model": "deepseek-v3", "gpus": 1024, "tp": 2, "pp": 8, "ep": 64, "gbs": 8192,
             "pipeline_layout": "balanced", "precision": "fp8"}
    alltoall, flex = build_case(**flags), build_case(**flags, moe_flex_dispatcher="hybridep")
    assert not alltoall.options.moe_flex_dispatcher and flex.options.moe_flex_dispatcher
    times = [estimate(c.model, c.cluster, c.training, c.parallel, c.options).step_time_s for c in (alltoall, flex)]
    assert times[1] < times[0]
    for bad, field in (({"moe_flex_dispatcher": "nccl"}, "moe_flex_dispatcher"),
                       ({"model": "llama3.1-8b", "ep": 1, "moe_flex_dispatcher": "deepep"}, "moe_flex_dispatcher"),
                       # Megatron's flex dispatcher asserts TP x EP > 1
                       ({"gpus": 64, "tp": 1, "pp": 8, "ep": 1, "moe_flex_dispatcher": "hybridep"},
                        "moe_flex_dispatcher")):
        with pytest.raises(MegapilotError) as refused:
            build_case(**(flags | bad))
        assert refused.value.field == field


# ---- the expert all-to-all overlap (--overlap-moe-expert-parallel-comm) ----------------------------------------

DSV3_H100 = dict(model="deepseek-v3", gpu="h100", gpus=1024, gbs=8192, seq_len=4096, tp=2, pp=8, vpp=4,
                 pipeline_layout="balanced", ep=64, precision="fp8", mtp_num_layers=1)


def test_the_all_to_all_overlap_hides_the_expert_traffic_where_megatron_allows_it():
    from megapilot.estimate import estimate

    def ep_comm(**extra):
        case = build_case(**(DSV3_H100 | extra))
        return estimate(case.model, case.cluster, case.training, case.parallel, case.options).time_breakdown_s[
            "ep_comm"]

    assert build_case(**DSV3_H100, moe_a2a_overlap=True).options.moe_a2a_overlap is True
    assert ep_comm(moe_a2a_overlap=True) < ep_comm()


@pytest.mark.parametrize(("extra", "words"), [
    ({"recompute": "full"}, "full recompute"),
    ({"vpp": 1, "pipeline_layout": None, "first_stage_layers": 7, "last_stage_layers": 6}, "virtual pipeline stages"),
    ({"ep": 1, "pp": 1, "vpp": 1, "pipeline_layout": None, "gpus": 16, "tp": 8, "gbs": 64, "mtp_num_layers": 0},
     "expert parallelism"),
    ({"mtp_num_layers": 2}, "at most one MTP layer"),
    ({"recompute_modules": "moe_act,moe"}, "moe recompute module"),
])
def test_the_all_to_all_overlap_is_refused_where_megatron_refuses_it(extra, words):
    with pytest.raises(MegapilotError) as refused:
        build_case(**(DSV3_H100 | extra | {"moe_a2a_overlap": True}))
    assert refused.value.field == "moe_a2a_overlap" and words in refused.value.problem


def test_the_all_to_all_overlap_needs_experts():
    with pytest.raises(MegapilotError) as refused:
        build_case(model="llama3.1-8b", gpu="h100", gpus=8, gbs=64, seq_len=4096, moe_a2a_overlap=True)
    assert refused.value.field == "moe_a2a_overlap"


@pytest.mark.parametrize(("gpu", "backend", "problem"), [
    ("mi300x", "deepep", "runs only in Megatron-LM on NVIDIA GPUs"),
    ("gb200", "deepep", "deepep does not run on GB200"),
])
def test_a_flex_dispatcher_backend_the_gpus_cannot_run_is_refused_as_script_refuses_it(gpu, backend, problem):
    with pytest.raises(MegapilotError, match=problem) as info:
        build_case(model="mixtral-8x7b", gpu=gpu, gpus=16, gbs=64, seq_len=4096, ep=8, moe_flex_dispatcher=backend)
    assert info.value.field == "moe_flex_dispatcher"


def test_deepep_with_expert_inputs_padded_to_capacity_is_refused_as_megatron_refuses_it():
    with pytest.raises(MegapilotError, match="does not pad expert inputs to capacity") as info:
        build_case(model="mixtral-8x7b", gpu="h100", gpus=16, gbs=64, seq_len=4096, ep=8, moe_flex_dispatcher="deepep",
                   moe_capacity_factor=1.0, moe_pad_to_capacity=True)
    assert info.value.field == "moe_flex_dispatcher" and "hybridep" in (info.value.fix or "")


# ---- --recompute-modules -----------------------------------------------------------------------------------------

MOE_BASE = {"model": "qwen3-30b-a3b", "gpu": "h100", "gpus": 8, "gbs": 64, "seq_len": 4096, "ep": 8}


@pytest.mark.parametrize("given", ["moe_act,layernorm", "moe_act layernorm", ["moe_act", "layernorm"],
                                   "moe_act, layernorm,moe_act"])
def test_recompute_modules_are_read_as_megatron_lists_them_and_imply_selective_recompute(given):
    p = build_case(**MOE_BASE, recompute_modules=given).parallel
    assert p.recompute == "selective" and p.recompute_modules == ("moe_act", "layernorm")
    assert p.recomputed_modules == {"moe_act", "layernorm"}
    assert build_case(**MOE_BASE, recompute="selective").parallel.recomputed_modules == {"core_attn"}  # Megatron's
    assert build_case(**MOE_BASE).parallel.recomputed_modules == frozenset()  # no recompute unless asked


@pytest.mark.parametrize(("extra", "words"), [
    ({"recompute_modules": "moe_act,attention"}, "unknown recompute module(s) attention"),
    ({"recompute_modules": " , "}, "unknown recompute module"),
    ({"recompute_modules": "moe", "recompute": "full"}, "only to selective recompute"),
    ({"recompute_modules": 3}, "must be a string"),
])
def test_bad_recompute_modules_are_refused_by_field(extra, words):
    with pytest.raises(MegapilotError) as refused:
        build_case(**(MOE_BASE | extra))
    assert refused.value.field == "recompute_modules" and words in refused.value.problem and refused.value.fix


def test_megatrons_mxfp8_recipe_spelling_is_pointed_at_the_precision():
    """Megatron-LM spells MXFP8 --fp8-recipe mxfp8; here it is a precision, and the refusal says so."""
    with pytest.raises(MegapilotError) as refused:
        build_case(model="llama3.1-8b", gpu="b200", gpus=8, gbs=64, seq_len=4096, precision="fp8", fp8_recipe="mxfp8")
    assert refused.value.field == "fp8_recipe" and refused.value.fix == (
        "use --precision mxfp8 (the block-scaled format is a precision here)")



@pytest.mark.parametrize(("typed", "megatron"), [("current", "tensorwise"), ("FP8-CS", "tensorwise"),
                                                 ("fp8_sc", "blockwise"), ("ds", "delayed")])
def test_the_recipes_names_for_an_fp8_recipe_are_pointed_at_megatrons(typed, megatron):
    """The tables and Megatron-Bridge name the FP8 recipes FP8-CS, fp8_sc, FP8-DS, "current scaling"; typed so, the
    refusal listed Megatron's three words without saying which one was meant."""
    with pytest.raises(MegapilotError) as refused:
        build_case(model="llama3.1-8b", gpu="h100", gpus=8, gbs=64, seq_len=4096, precision="fp8", fp8_recipe=typed)
    assert refused.value.field == "fp8_recipe" and refused.value.fix.startswith(f"use --fp8-recipe {megatron} ")


def test_an_fp8_recipe_no_table_names_lists_megatrons_words():
    with pytest.raises(MegapilotError) as refused:
        build_case(model="llama3.1-8b", gpu="h100", gpus=8, gbs=64, seq_len=4096, precision="fp8", fp8_recipe="fast")
    assert refused.value.fix == "with precision fp8 use one of: delayed, tensorwise, blockwise; otherwise drop it"


# ---- CUDA graphs (--cuda-graph-impl, --cuda-graph-scope) ------------------------------------------------------

def test_cuda_graphs_are_read_in_megatrons_words_and_priced_where_megatron_captures_them():
    from megapilot.estimate import estimate
    from megapilot.spec.cuda_graphs import CudaGraphs

    flags = {**BASE, "model": "qwen3-30b-a3b", "gpus": 8, "ep": 8, "gbs": 512, "seq_len": 4096, "precision": "fp8"}
    eager = build_case(**flags)
    graphed = build_case(**flags, cuda_graph_impl="transformer_engine", cuda_graph_scope="attn,moe_router moe_router")
    assert eager.options.cuda_graphs is None
    assert graphed.options.cuda_graphs == CudaGraphs(impl="transformer_engine", scope=("attn", "moe_router"))
    assert build_case(**flags, cuda_graph_impl="none").options.cuda_graphs is None
    listed = build_case(**flags, cuda_graph_impl="transformer_engine", cuda_graph_scope=["attn", "moe_router"])
    assert listed.options.cuda_graphs == graphed.options.cuda_graphs  # as a --batch line may list them
    whole = build_case(**BASE, cuda_graph_impl="transformer_engine", cuda_graph_scope="full")  # Megatron's old word
    assert whole.options.cuda_graphs == CudaGraphs(impl="transformer_engine")
    times = [estimate(c.model, c.cluster, c.training, c.parallel, c.options).step_time_s for c in (eager, graphed)]
    assert times[1] < times[0]


@pytest.mark.parametrize(("bad", "field", "words"), [
    ({"cuda_graph_scope": "attn"}, "cuda_graph_scope", "without an implementation"),
    ({"cuda_graph_impl": "cudnn"}, "cuda_graph_impl", "unknown CUDA graph implementation"),
    ({"cuda_graph_impl": "transformer_engine", "cuda_graph_scope": "attention"}, "cuda_graph_scope", "'attention'"),
    ({"cuda_graph_impl": "transformer_engine", "cuda_graph_scope": "full_iteration"}, "cuda_graph_scope",
     "local only"),
    ({"cuda_graph_impl": "transformer_engine", "cuda_graph_scope": "attn", "recompute": "full"}, "cuda_graph_scope",
     "full_iteration graph"),
])
def test_cuda_graphs_megatron_would_refuse_are_refused_by_field(bad, field, words):
    with pytest.raises(MegapilotError) as refused:
        build_case(**BASE, **bad)
    assert refused.value.field == field and words in refused.value.problem
