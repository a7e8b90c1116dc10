"""CUDA graphs: which layer parts a scope captures, and where Megatron-Core refuses them, checked against
Megatron-Core 0.16.1's own TransformerConfig (the assertions the refusals name)."""

from __future__ import annotations

import pytest

from megapilot.catalog import get_model
from megapilot.spec import ModelSpec, ParallelConfig
from megapilot.spec.cuda_graphs import CudaGraphs, cuda_graph_refusal

DENSE = get_model("llama3.1-8b")
MOE = get_model("mixtral-8x7b")  # every layer MoE
FIRST_DENSE = get_model("deepseek-v2-lite")  # its first layer keeps a dense MLP
HYBRID = get_model("nemotron-h-8b")
LAYOUT = ParallelConfig.for_world(8, ep=1)


def graphs(impl: str, *scope: str) -> CudaGraphs:
    return CudaGraphs(impl=impl, scope=scope)  # type: ignore[arg-type]  # the Literals' words


def test_a_named_scope_captures_its_part_and_no_scope_or_the_whole_iteration_captures_every_part():
    attn_router = graphs("transformer_engine", "attn", "moe_router", "moe_preprocess")
    assert [attn_router.captures(part) for part in ("attn", "mlp", "moe", "moe_router", "moe_preprocess")] == [
        True, False, False, True, True]
    assert graphs("transformer_engine", "moe").captures("moe_router")  # the moe scope holds the router
    assert all(graphs("transformer_engine").captures(part) for part in ("attn", "mlp", "moe", "mamba"))
    assert all(graphs("local", "full_iteration").captures(part) for part in ("attn", "moe", "moe_preprocess"))
    assert graphs("local", "moe_router").captures("moe_preprocess")  # local captures both, either named
    assert not graphs("transformer_engine", "moe_router").captures("moe_preprocess")


def _with_capacity(model: ModelSpec, factor: float | None, pad: bool) -> ModelSpec:
    assert model.moe is not None
    return model.model_copy(update={"moe": model.moe.model_copy(update={"capacity_factor": factor,
                                                                        "pad_to_capacity": pad})})


# (model, layout, graphs, flex dispatcher, router padding) -> the words of the refusal, or None where it runs
CASES = [
    (DENSE, LAYOUT, graphs("transformer_engine", "attn", "mlp"), False, False, None),
    (DENSE, LAYOUT, graphs("transformer_engine", "full_iteration"), False, False, "local only"),
    (DENSE, LAYOUT, graphs("local", "full_iteration"), False, False, None),
    (DENSE, LAYOUT, graphs("transformer_engine", "moe_router"), False, False, "no experts"),
    (MOE, LAYOUT, graphs("transformer_engine", "moe"), False, False, "padded to capacity"),
    (_with_capacity(MOE, 1.0, True), LAYOUT, graphs("transformer_engine", "moe"), False, False, None),
    (MOE, LAYOUT, graphs("transformer_engine", "moe", "moe_router"), False, False, "cannot both"),
    (MOE, LAYOUT, graphs("transformer_engine", "moe_preprocess"), False, False, "together with moe_router"),
    (MOE, LAYOUT, graphs("transformer_engine", "attn", "moe_router", "moe_preprocess"), False, False, None),
    (_with_capacity(MOE, 1.0, False), LAYOUT, graphs("transformer_engine", "moe_router", "moe_preprocess"), False,
     False, "copies token counts"),
    (_with_capacity(MOE, 1.0, False), LAYOUT, graphs("transformer_engine", "moe_router", "moe_preprocess"), True,
     False, None),
    # quantised experts: the router pads their token counts, which the alltoall dispatcher reads on the host
    (MOE, LAYOUT, graphs("transformer_engine", "moe_router", "moe_preprocess"), False, True, "quantised experts"),
    (MOE, LAYOUT, graphs("transformer_engine", "moe_router", "moe_preprocess"), True, True, None),
    (MOE, LAYOUT, graphs("transformer_engine", "attn", "moe_router"), False, True, None),
    (MOE, LAYOUT, graphs("transformer_engine", "mlp"), False, False, "every MLP"),
    (FIRST_DENSE, LAYOUT, graphs("transformer_engine", "mlp"), False, False, None),
    (DENSE, ParallelConfig.for_world(8, recompute="full"), graphs("transformer_engine", "attn"), False, False,
     "full_iteration graph"),
    (DENSE, ParallelConfig.for_world(8, recompute="full"), graphs("local", "full_iteration"), False, False, None),
    (DENSE, ParallelConfig.for_world(8, recompute="none", cpu_offloading_num_layers=2),
     graphs("transformer_engine", "attn"), False, False, "offloading"),
    (MOE, ParallelConfig.for_world(8, recompute="selective", recompute_modules=("moe",)),
     graphs("transformer_engine", "moe_router"), False, False, "moe recompute module"),
    (MOE, LAYOUT, graphs("transformer_engine"), False, False, "whole MoE layer"),  # ours: the block inside the layer
    (DENSE, LAYOUT, graphs("transformer_engine", "mamba"), False, False, "no Mamba layers"),
    (HYBRID, LAYOUT, graphs("transformer_engine", "mamba", "attn"), False, False, None),
]


@pytest.mark.parametrize(("model", "layout", "graphs_asked", "flex", "padding", "refused"), CASES)
def test_graphs_are_refused_where_megatron_refuses_them(model, layout, graphs_asked, flex, padding, refused):
    said = cuda_graph_refusal(model, layout, graphs_asked, flex_dispatcher=flex, router_padding=padding)
    assert (said is None) == (refused is None), said
    assert refused is None or refused in said


# The refusals that are Megatron-Core's own assertions (the others: offloading raises in TransformerConfig too, but
# needs its own fields; the whole-layer MoE and the missing Mamba layers are this module's reading of them; the
# router's padding needs FP8, which needs Transformer Engine, not installed here: its assertion is read from
# TransformerConfig.__post_init__).
MEGATRON_CHECKED = [case for case in CASES if case[5] not in ("whole MoE layer", "no Mamba layers", "offloading")
                    and case[0] is not HYBRID and not case[4]]


@pytest.mark.parametrize(("model", "layout", "graphs_asked", "flex", "padding", "refused"), MEGATRON_CHECKED)
def test_megatron_core_itself_refuses_exactly_these(model, layout, graphs_asked, flex, padding, refused):
    config = pytest.importorskip("megatron.core.transformer.transformer_config")
    moe = model.moe
    fields = dict(num_layers=2, hidden_size=64, num_attention_heads=4, use_cpu_initialization=True,
                  cuda_graph_impl=graphs_asked.impl, cuda_graph_scope=list(graphs_asked.scope),
                  attention_dropout=0.0, hidden_dropout=0.0)  # as `script` writes them (pretraining, no dropout)
    if moe is not None:
        fields |= dict(num_moe_experts=moe.num_experts, moe_router_topk=moe.router_topk,
                       moe_layer_freq=[0, 1] if moe.first_k_dense_layers else 1,
                       moe_expert_capacity_factor=moe.capacity_factor,
                       moe_pad_expert_input_to_capacity=moe.pad_to_capacity,
                       moe_token_dispatcher_type="flex" if flex else "alltoall")
        if flex:
            fields["moe_flex_dispatcher_backend"] = "deepep"
    if layout.recompute == "full":
        fields |= dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    elif layout.recompute == "selective":
        fields |= dict(recompute_granularity="selective", recompute_modules=list(layout.recomputed_modules))
    try:
        config.TransformerConfig(**fields)
        megatron_refuses = False
    except (AssertionError, ValueError):
        megatron_refuses = True
    assert megatron_refuses == (refused is not None)


GPT_OSS = get_model("gpt-oss-20b")  # biases on its attention's linear layers


@pytest.mark.parametrize(("model", "layout", "graphs_asked", "refused"), [
    (MOE, LAYOUT, graphs("transformer_engine", "attn", "moe_router", "moe_preprocess"), None),
    (GPT_OSS, LAYOUT, graphs("transformer_engine", "attn", "moe_router"), "attention biases"),
    (GPT_OSS, LAYOUT, graphs("transformer_engine", "moe_router", "moe_preprocess"), None),  # no wgrad in the graph
    (MOE, ParallelConfig.for_world(8, fsdp=True), graphs("transformer_engine", "attn"), "gradient accumulation"),
    (get_model("qwen3-30b-a3b"), ParallelConfig.for_world(8, fsdp=True), graphs("transformer_engine", "moe_router"),
     None),  # no shared experts: the router graph holds no weight gradient
    (FIRST_DENSE, ParallelConfig.for_world(8, fsdp=True), graphs("transformer_engine", "moe_router"),
     "gradient accumulation"),  # DeepSeek's shared experts run in the router's graph
])
def test_graphs_holding_weight_gradients_the_all_to_all_overlap_delays_are_refused_as_megatron_asserts(
        model, layout, graphs_asked, refused):
    """--delay-wgrad-compute (written with the expert all-to-all overlap) beside --overlap-grad-reduce: where a graph
    holds a weight-gradient GEMM, Megatron-LM (arguments.py, core_v0.17.0 on) asserts gradient accumulation fusion
    (Megatron-FSDP launches run without it) and, for the attention graph, no attention biases."""
    said = cuda_graph_refusal(model, layout, graphs_asked, flex_dispatcher=True, router_padding=False,
                              a2a_overlap=True)
    assert (said is None) == (refused is None), said
    assert refused is None or refused in said
    assert cuda_graph_refusal(model, layout, graphs_asked, flex_dispatcher=True, router_padding=False) is None
