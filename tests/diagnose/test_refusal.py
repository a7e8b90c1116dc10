"""Reading the way out of a refusal's own words: messages quoted from Megatron-LM (core_v0.19.0
megatron/training/arguments.py and ModelParallelConfig), argparse and Primus's ROCm argument check."""

from __future__ import annotations

import pytest

from megapilot.diagnose.refusal import changes_named_in


def _changes(message: str) -> list[tuple[int, str, str, str | None]]:
    return [(c.alternative, c.action, c.flag, c.value) for c in changes_named_in(message)]


@pytest.mark.parametrize(("message", "expected"), [
    ("Transformer Engine cross entropy loss fusion is disabled due to stability issues. Use "
     "--cross-entropy-fusion-impl native, or omit --cross-entropy-loss-fusion.",
     [(0, "set", "--cross-entropy-fusion-impl", "native"), (1, "remove", "--cross-entropy-loss-fusion", None)]),
    ("--enable-cuda-graph is deprecated, use --cuda-graph-impl=local instead.",
     [(0, "remove", "--enable-cuda-graph", None), (0, "set", "--cuda-graph-impl", "local")]),
    ("--hybrid-override-pattern is deprecated; use --hybrid-layer-pattern instead.",
     [(0, "remove", "--hybrid-override-pattern", None), (0, "add", "--hybrid-layer-pattern", None)]),
    ("Do not use --enable-cuda-graph or --external-cuda-graph with --cuda-graph-impl.",
     [(0, "remove", "--enable-cuda-graph", None), (0, "remove", "--external-cuda-graph", None)]),
    ("--pipeline-model-parallel-layout should not be used with --hybrid-layer-pattern.",
     [(0, "remove", "--pipeline-model-parallel-layout", None)]),
    ("Must use --overlap-param-gather with --overlap-grad-reduce", [(0, "add", "--overlap-param-gather", None)]),
    ("--use-checkpoint-args requires --load or --pretrained-checkpoint argument",
     [(0, "add", "--load", None), (1, "add", "--pretrained-checkpoint", None)]),
    ("--use-torch-fsdp2 requires --ckpt-format torch_dist or torch_dcp", [(0, "set", "--ckpt-format", "torch_dist")]),
    ("--fp4-param-gather must be used together with --fp4-format.", [(0, "add", "--fp4-format", None)]),
    ("--logits-save-top-k is required when --logits-save-dir is set.", [(0, "add", "--logits-save-top-k", None)]),
    ("--mrope-section should be set when using --position-embedding-type mrope.",
     [(0, "add", "--mrope-section", None)]),
    ("Muon optimizer does not support overlap grad reduce for now. Use --optimizer muon "
     "--use-distributed-optimizer instead.",
     [(0, "set", "--optimizer", "muon"), (0, "add", "--use-distributed-optimizer", None)]),
    ("The optimizer cpu offload must be used in conjunction with `--use-precision-aware-optimizer`, as the hybrid "
     "device optimizer reuses the code path of this flag.", [(0, "add", "--use-precision-aware-optimizer", None)]),
    ("pretrain_gpt.py: error: the following arguments are required: --num-layers, --hidden-size",
     [(0, "add", "--num-layers", None), (0, "add", "--hidden-size", None)]),
    ("pretrain_gpt.py: error: unrecognized arguments: --foo-bar 3 --baz",
     [(0, "remove", "--foo-bar", None), (0, "remove", "--baz", None)]),
    ("pretrain_gpt.py: error: argument --fp8-recipe: invalid choice: 'foo' (choose from 'tensorwise', 'delayed')",
     [(0, "set", "--fp8-recipe", None)]),
    # environment variables the message asks for
    ("Please set `NVTE_ROCM_ENABLE_MXFP8=1` to enable `mxfp8` recipe.", [(0, "set", "NVTE_ROCM_ENABLE_MXFP8", "1")]),
    ("Using tensor model parallelism or context parallelism require setting the environment variable "
     "CUDA_DEVICE_MAX_CONNECTIONS to 1", [(0, "set", "CUDA_DEVICE_MAX_CONNECTIONS", "1")]),
    # the variable first (core_v0.19.0 validate_args, fine-grained activation offloading with TE 2.10+)
    ("For fine-grained activation offloading with TE >= 2.10.0, NVTE_CPU_OFFLOAD_V1 should be set to 1 to avoid "
     "offloading weights.", [(0, "set", "NVTE_CPU_OFFLOAD_V1", "1")]),
    # Megatron-LM's CUDA-graph assertion opens its sentence with the verb
    ("Setting NCCL_GRAPH_REGISTER=0 to avoid illegal memory access when using CUDA Graph with "
     "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.", [(0, "set", "NCCL_GRAPH_REGISTER", "0")]),
    # a switch's state after it is the action; "to use --x" is a condition, not an instruction
    ("GTP requires --ddp-average-in-collective off (the default)",
     [(0, "remove", "--ddp-average-in-collective", None)]),
    ("To use --rl-offload-inference-model-weights-when-idle without UVM, set --rl-inference-tensor-parallel-size",
     [(0, "add", "--rl-inference-tensor-parallel-size", None)]),
    # the flag a condition is said of ("only supported with", "not supported with", "must be empty"), "disable --x",
    # and a variable a rule "requires": Megatron-LM core_v0.19.0's validate_args words
    ("--overlap-param-gather-with-optimizer-step only supported with interleaved pipeline parallelism",
     [(0, "remove", "--overlap-param-gather-with-optimizer-step", None)]),
    ("--use-torch-fsdp2 not supported with fp16 yet", [(0, "remove", "--use-torch-fsdp2", None)]),
    ("--cuda-graph-modules must be empty when --cuda-graph-impl=full_iteration.",
     [(0, "remove", "--cuda-graph-modules", None)]),
    ("GTP does not support the distributed-optimizer fully-reshardable + mem-efficient checkpoint mode. Disable "
     "--distrib-optim-fully-reshardable-mem-efficient",
     [(0, "remove", "--distrib-optim-fully-reshardable-mem-efficient", None)]),
    ("GTP requires CUDA_GRAPHS_USE_NODE_PRIORITY=1 to make sure fine-grained GTP comms can be well overlapped",
     [(0, "set", "CUDA_GRAPHS_USE_NODE_PRIORITY", "1")]),
    # variables to unset, listed (Megatron-Core's attention-backend check), beside the flag it names
    ("NVTE_FLASH_ATTN set to 1, but expected 0 for attention backend type flash. unset NVTE_FLASH_ATTN, "
     "NVTE_FUSED_ATTN and NVTE_UNFUSED_ATTN. Use the --attention-backend argument if you want to choose",
     [(0, "add", "--attention-backend", None), (0, "remove", "NVTE_FLASH_ATTN", None),
      (0, "remove", "NVTE_FUSED_ATTN", None), (0, "remove", "NVTE_UNFUSED_ATTN", None)]),
    # an argument named as the code holds it, where it is the subject of a removal or a request (core_v0.19.0's
    # validate_args and TransformerConfig); not elsewhere in the sentence, nor a list's entry, nor an inverted switch
    ("check_weight_hash_across_dp_replicas_interval is not supported with optim_grads_params",
     [(0, "remove", "--check-weight-hash-across-dp-replicas-interval", None)]),
    ("overlap_moe_expert_parallel_comm must be enabled when enabling delay_wgrad_compute",
     [(0, "add", "--overlap-moe-expert-parallel-comm", None)]),
    ("When using group limited routing, moe_router_num_groups must be specified.",
     [(0, "add", "--moe-router-num-groups", None)]),
    ("TransformerEngine only support gelu, geglu, silu, swiglu, relu, reglu. If you don't want to use "
     "TransformerEngine activation function, set use_te_activation_func to False", []),
    ("moe_act in recompute_modules is only supported with moe_grouped_gemm.", []),
    # a rule that names no flag: nothing to read
    ("num_layers (80) must be divisible by pipeline_model_parallel_size (3)", []),
])
def test_the_changes_a_refusal_names(message: str, expected: list[tuple[int, str, str, str | None]]) -> None:
    assert _changes(message) == expected


def test_an_environment_change_is_marked_as_one() -> None:
    (change,) = changes_named_in("Please set `NVTE_ROCM_ENABLE_MXFP8=1` to enable `mxfp8` recipe.")
    assert change.kind == "env"


TE_CHECK = "python -c 'import transformer_engine as te; print(te.__version__)'"


@pytest.mark.parametrize(("message", "version", "ways"), [
    ("CUDA graph with delay_wgrad_compute requires TE version >= 2.12.0.", "2.12.0", []),
    ("TE version >= 2.10.0 is required for delay_wgrad_compute with partial cuda graph", "2.10.0", []),
    ("Only TE >= 2.3.0 supports interleaved fused RoPE.", "2.3.0", []),
    ("fused_permute is not available. Please install TE >= 2.1.0.", "2.1.0", []),
    ("use_te_rng_tracker requires TransformerEngine version >= 1.5", "1.5", []),
    ("Transformer Engine >= 2.0 is required for dequantizing parameters.", "2.0", []),
    # the feature's own flag is the other way out
    ("overlap_grad_reduce is only supported with TE >= 2.8.0 when enabling delay_wgrad_compute", "2.8.0",
     [(0, "remove", "--overlap-grad-reduce", None)]),
    ("--qk-clip is only supported with TE >= 2.9.0.", "2.9.0", [(0, "remove", "--qk-clip", None)]),
])
def test_a_transformer_engine_too_old_is_named_with_its_version_and_the_check(
        message: str, version: str, ways: list[tuple[int, str, str, str | None]]) -> None:
    """Megatron-Core's is_te_min_version checks: the ranks' image has an older Transformer Engine than a feature the
    flags turn on needs; a newer image is a way out beside turning the feature off."""
    upgrade = len(ways)
    assert _changes(message) == [*ways, (upgrade, "add", f"run Transformer Engine {version} or newer (a newer "
                                          "container image)", None), (upgrade, "add", TE_CHECK, None)]
    assert [c.kind for c in changes_named_in(message)][-2:] == ["advice", "command"]


def test_a_transformer_engine_release_said_as_a_condition_is_not_asked_for() -> None:
    """core_v0.19.0 validate_args: with TE 2.10 or newer a variable must be set; a newer image is no way out."""
    assert not any(c.kind in ("advice", "command") for c in changes_named_in(
        "For fine-grained activation offloading with TE >= 2.10.0, NVTE_CPU_OFFLOAD_V1 should be set to 1 to avoid "
        "offloading weights."))
