"""CUDA graphs: which parts of a training step Megatron-Core captures and replays, and where it refuses to.

`--cuda-graph-impl transformer_engine` captures parts of each layer with Transformer Engine's
`make_graphed_callables` (`--cuda-graph-scope`: attn, mlp, moe, moe_router, moe_preprocess, mamba; none given =
the whole layer); `--cuda-graph-impl local` captures with Megatron's own CudaGraphManager, per layer or the whole
forward-backward (`full_iteration`). The later Megatron-Bridge performance recipes turn them on (Llama 3
full-iteration; DeepSeek-V3, Qwen3 and GPT-OSS over attn, moe_router and moe_preprocess).

`cuda_graph_refusal` says what Megatron-Core (core_v0.16.0 on, where the scope is a list) asserts, from
`TransformerConfig.__post_init__` and `megatron/training/arguments.py`, so that `estimate` never prices and
`script` never writes a run that stops before its first step. Before core_v0.16.0 the scope is one word (full,
attn, full_iteration) and activation recompute beside graphs is refused more widely: `one_word_scope` says the
word for those releases or why they cannot run the graphs.
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

from megapilot.spec.model import ModelSpec
from megapilot.spec.parallel import ParallelConfig
from megapilot.spec.training import TrainingSpec

CudaGraphImpl = Literal["local", "transformer_engine"]
CudaGraphScope = Literal["attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba", "full_iteration"]
# The parts of a layer a scope names (`moe`: the MoE block beyond its router and preprocess).
LayerPart = Literal["attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba"]
CUDA_GRAPH_IMPLS: tuple[str, ...] = get_args(CudaGraphImpl)
CUDA_GRAPH_SCOPES: tuple[str, ...] = get_args(CudaGraphScope)


class CudaGraphs(BaseModel):
    """Graphs a run captures: the implementation and its scope (empty: every layer whole)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    impl: CudaGraphImpl = Field(description="--cuda-graph-impl: transformer_engine (parts of each layer) or local "
                                            "(Megatron's own; the only one for full_iteration).")
    scope: tuple[CudaGraphScope, ...] = Field(
        default=(), description="--cuda-graph-scope: the captured parts; empty = each layer whole.")

    def captures(self, part: LayerPart) -> bool:
        """Whether `part` of a layer is replayed from a graph: named, inside the whole MoE block (`moe`), or inside
        a whole layer (no scope) or the whole iteration. Megatron's local implementation captures the router and
        the preprocess together, either named."""
        if not self.scope or "full_iteration" in self.scope:
            return True
        if part in self.scope:
            return True
        if part in ("moe_router", "moe_preprocess") and "moe" in self.scope:
            return True
        return self.impl == "local" and part == "moe_preprocess" and "moe_router" in self.scope

    def describe(self) -> str:
        """The flags' words: 'transformer_engine over attn, moe_router'."""
        return f"{self.impl} over {', '.join(self.scope) if self.scope else 'each whole layer'}"


def cuda_graph_refusal(model: ModelSpec, p: ParallelConfig, graphs: CudaGraphs, *, flex_dispatcher: bool,
                       router_padding: bool, a2a_overlap: bool = False) -> str | None:
    """Why Megatron-Core refuses these graphs for this model and layout (its TransformerConfig asserts), or None.
    `flex_dispatcher`: the MoE tokens go through the flex dispatcher; `router_padding`: the router pads each
    expert's tokens for quantised GEMMs (`--moe-router-padding-for-quantization`, which `script` writes for every
    quantised MoE run); `a2a_overlap`: the expert all-to-all overlap (`--overlap-moe-expert-parallel-comm`) runs."""
    scope = set(graphs.scope)
    if a2a_overlap and graphs.impl == "transformer_engine" and scope & {"moe", "mlp"}:
        # TransformerConfig: 'CUDA graph scope on moe and mlp is not supported with overlap_moe_expert_parallel_comm'
        return (f"the {' and '.join(sorted(scope & {'moe', 'mlp'}))} scope is not captured beside the expert "
                "all-to-all overlap (--moe-a2a-overlap)")
    if a2a_overlap and (refusal := _delayed_wgrad_graph_refusal(model, p, scope)) is not None:
        return refusal
    if "full_iteration" in scope and graphs.impl != "local":
        return "full_iteration is captured by --cuda-graph-impl local only"
    if "full_iteration" in scope and len(scope) > 1:
        return "full_iteration captures the whole step: no other scope goes beside it"
    if {"moe", "moe_router"} <= scope:
        return "moe and moe_router cannot both be captured (moe holds the router)"
    if "moe_preprocess" in scope and "moe_router" not in scope and graphs.impl == "transformer_engine":
        return "moe_preprocess is captured only together with moe_router"
    if p.cpu_offloading_num_layers:
        return "CUDA graphs do not run with --cpu-offloading-num-layers"
    if p.recompute == "full" and scope != {"full_iteration"}:
        return "full recompute runs only under a full_iteration graph"
    moe = model.moe
    if moe is None:
        if scope & {"moe", "moe_router", "moe_preprocess"}:
            return f"{model.name} has no experts: the moe scopes are for MoE layers"
    else:
        if "mlp" in scope and not any(model.layer_block(i).mlp == "full" and not model.is_moe_layer(i)
                                      for i in range(model.num_layers)):
            return f"mlp captures dense MLP layers, and every MLP of {model.name} is a MoE layer"
        drop_and_pad = moe.capacity_factor is not None and moe.pad_to_capacity
        if not drop_and_pad and "moe" in scope:
            return ("moe is captured only with token dropping padded to capacity (static shapes: "
                    "--moe-expert-capacity-factor with --moe-pad-expert-input-to-capacity)")
        if not drop_and_pad and not scope:  # Megatron checks the moe scope; a whole layer holds the same block
            return ("a whole MoE layer (no scope given) holds the MoE block, which Megatron captures only with token "
                    "dropping padded to capacity (--moe-expert-capacity-factor with "
                    "--moe-pad-expert-input-to-capacity); name the scopes, e.g. attn moe_router moe_preprocess")
        host_counts = moe.capacity_factor is not None or router_padding
        if not drop_and_pad and not flex_dispatcher and host_counts and "moe_preprocess" in scope:
            why = "token dropping without padding" if moe.capacity_factor is not None else \
                "the router's padding for quantised experts"
            return (f"moe_preprocess is not captured where the alltoall dispatcher copies token counts to the host "
                    f"({why}); use --moe-flex-dispatcher, or leave moe_preprocess out")
        if graphs.impl == "transformer_engine" and "moe" in p.recomputed_modules and "moe_router" in scope:
            return "the moe recompute module does not run with a moe_router graph under transformer_engine"
    if "mamba" in scope and not any(model.layer_kind(i) == "mamba" for i in range(model.num_layers)):
        return f"{model.name} has no Mamba layers for the mamba scope"
    return None


def _delayed_wgrad_graph_refusal(model: ModelSpec, p: ParallelConfig, scope: AbstractSet[str]) -> str | None:
    """The expert all-to-all overlap delays the weight gradients (`--delay-wgrad-compute`, which `script` writes
    beside it and beside `--overlap-grad-reduce`); where a graph then holds a weight-gradient GEMM (the attention
    sublayer's, or the router graph's shared experts), Megatron-LM asserts gradient accumulation fusion, which
    Megatron-FSDP launches run without, and attention without biases (arguments.py, core_v0.17.0 on; it also needs
    Transformer Engine 2.12)."""
    moe = model.moe
    graphed = "attn" in scope or ("moe_router" in scope and moe is not None and moe.shared_expert_ffn_hidden_size > 0)
    if graphed and p.fsdp:
        return ("a graph holding weight gradients the expert all-to-all overlap delays needs gradient accumulation "
                "fusion, which Megatron-FSDP runs without: leave --moe-a2a-overlap or those scopes out")
    if "attn" in scope and (model.add_bias_linear or model.add_qkv_bias):
        return (f"the attn scope beside the expert all-to-all overlap (its delayed weight gradients) does not take "
                f"{model.name}'s attention biases: leave --moe-a2a-overlap or the attn scope out")
    return None


# The words of --cuda-graph-scope before it took a list (core_v0.14-0.15): a whole layer ("full", the default), the
# attention sublayer ("attn", Transformer Engine's graphs only), or the whole iteration (local only).
ONE_WORD_SCOPES: dict[tuple[str, ...], str] = {(): "full", ("attn",): "attn", ("full_iteration",): "full_iteration"}


def one_word_scope(graphs: CudaGraphs, p: ParallelConfig, *, impl_flag: bool) -> tuple[str | None, str | None]:
    """The one --cuda-graph-scope word that says these graphs to a release before core_v0.16.0, or why it cannot
    run them: (word, None) or (None, refusal). `impl_flag`: the release has --cuda-graph-impl (core_v0.15; before
    it --enable-cuda-graph and --external-cuda-graph name the implementation, and check recompute differently).

    core_v0.15's TransformerConfig refuses any activation recompute under graphs but selective recompute of
    modules outside Transformer Engine's attention graph (not core_attn, not mla_up_proj); core_v0.14's refuses
    any recompute under local graphs, and its arguments.py full recompute under Transformer Engine's."""
    word = ONE_WORD_SCOPES.get(graphs.scope)
    if word is None:
        return None, (f"the scopes {', '.join(graphs.scope)} are said as a list from core_v0.16.0; before it "
                      "--cuda-graph-scope takes one word: full (each whole layer), attn or full_iteration")
    if word == "attn" and graphs.impl != "transformer_engine":
        return None, "the attn scope alone is captured by --cuda-graph-impl transformer_engine only"
    if p.recompute == "none":
        return word, None
    if impl_flag:
        attn_only = graphs.impl == "transformer_engine" and word == "attn"
        if p.recompute == "full" or not attn_only:
            return None, (f"{p.recompute} activation recompute does not run with CUDA graphs before core_v0.16.0 "
                          "(but selective recompute beside transformer_engine attn graphs): --recompute none")
        graphed = p.recomputed_modules & {"core_attn", "mla_up_proj"}
        if graphed:
            return None, f"the attn graph does not run with {', '.join(sorted(graphed))} recompute"
        return word, None
    if graphs.impl == "local" or p.recompute == "full":
        return None, (f"core_v0.14 runs local CUDA graphs without activation recompute, and Transformer Engine's "
                      f"without full recompute ({p.recompute} here): --recompute none")
    return word, None


def pads_routing_for_quantization(model: ModelSpec, training: TrainingSpec) -> bool:
    """Whether a Megatron-LM run of this model pads each expert's routed tokens for its quantised GEMMs (the
    router's `--moe-router-padding-for-quantization`, which `script` writes for every quantised MoE run)."""
    return model.moe is not None and training.quant_flavour not in (None, "mxfp4")


__all__ = [
    "CUDA_GRAPH_IMPLS",
    "CUDA_GRAPH_SCOPES",
    "ONE_WORD_SCOPES",
    "CudaGraphImpl",
    "CudaGraphScope",
    "CudaGraphs",
    "LayerPart",
    "cuda_graph_refusal",
    "one_word_scope",
    "pads_routing_for_quantization",
]
