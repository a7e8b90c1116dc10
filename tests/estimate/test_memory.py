"""Per-GPU memory: Megatron's theoretical formula reproduced, and the default mode's terms."""

from __future__ import annotations

import pytest

from megapilot.estimate.memory import (
    GIB,
    fsdp_unsharded_gib,
    host_offload,
    in_flight_microbatches,
    layer_activation_bytes,
    memory_per_gpu,
    offloaded_layer_bytes,
    optimizer_gib,
    shard_params,
    weights_gib,
)
from megapilot.spec import ModelSpec, MoESpec, ParallelConfig, TrainingSpec

LLAMA3_70B = ModelSpec(
    name="llama3-70b", num_layers=80, hidden_size=8192, ffn_hidden_size=28672, num_attention_heads=64,
    num_query_groups=8, vocab_size=128256,
)
GPT_22B = ModelSpec(
    name="gpt-22b", num_layers=48, hidden_size=6144, ffn_hidden_size=4 * 6144, num_attention_heads=64,
    vocab_size=51200, mlp_activation="gelu", normalization="LayerNorm",
)
MIXTRAL = ModelSpec(
    name="mixtral", num_layers=32, hidden_size=4096, ffn_hidden_size=14336, num_attention_heads=32,
    num_query_groups=8, vocab_size=32000, moe=MoESpec(num_experts=8, router_topk=2, moe_ffn_hidden_size=14336),
)
LLAMA3_70B_LAYER_PARAMS = 2 * 8192 * (8192 + 1024) + 3 * 8192 * 28672 + 2 * 8192
SEQ_4K = TrainingSpec(seq_length=4096, global_batch_size=1024)
LLAMA_TP8_PP4_DP2 = ParallelConfig(
    tp=8, pp=4, dp=2, mbs=1, sequence_parallel=True, recompute="selective", distributed_optimizer=True
)


def test_megatron_formula_reproduces_35_40_gib_for_llama3_70b_on_64_h100():
    memory = memory_per_gpu(LLAMA3_70B, SEQ_4K, LLAMA_TP8_PP4_DP2, 80.0, megatron_formula=True)
    assert memory.total_gib == pytest.approx(35.40, rel=0.02)
    assert memory.overhead_gib == 0.0
    # weights + optimizer at 6 + 12/DP = 12 bytes per parameter of the stage-0 shard
    assert memory.weights_gib + memory.gradients_gib + memory.optimizer_gib == pytest.approx(25.39, abs=0.01)
    assert memory.activations_gib == pytest.approx(10.02, abs=0.01)


def test_default_mode_adds_overhead_and_output_stage_terms_on_top_of_megatron():
    megatron = memory_per_gpu(LLAMA3_70B, SEQ_4K, LLAMA_TP8_PP4_DP2, 80.0, megatron_formula=True)
    ours = memory_per_gpu(LLAMA3_70B, SEQ_4K, LLAMA_TP8_PP4_DP2, 80.0)
    assert ours.weights_gib + ours.gradients_gib + ours.optimizer_gib == pytest.approx(25.39, abs=0.05)
    assert ours.overhead_gib > 1.0
    assert megatron.total_gib < ours.total_gib < megatron.total_gib * 1.25
    assert ours.fits and ours.capacity_gib == 80.0


def test_sequence_parallel_layer_matches_korthikanti_34_sbh_over_t_less_the_dropout_masks():
    # Korthikanti's 34 holds two 1-byte dropout masks (sbh each); the launched runs set dropout 0, which draws none
    s, b, h, t = 2048, 1, 6144, 8
    sp = ParallelConfig(tp=t, dp=1, sequence_parallel=True)
    ours = layer_activation_bytes(GPT_22B, 0, sp, s * b)
    assert ours == pytest.approx((34 - 2) * s * b * h / t, rel=0.01)  # + fp32 softmax stats only


def test_without_sequence_parallel_norm_inputs_stay_replicated():
    s, b, h, t = 2048, 1, 6144, 8
    no_sp = ParallelConfig(tp=t, dp=1, sequence_parallel=False)
    ours = layer_activation_bytes(GPT_22B, 0, no_sp, s * b)
    assert ours == pytest.approx(s * b * h * (10 - 2 + 24 / t), rel=0.01)  # no dropout masks (dropout 0)


def test_gqa_keeps_smaller_k_and_v_than_mha():
    mha = LLAMA3_70B.model_copy(update={"num_query_groups": None})
    p = ParallelConfig(tp=8, dp=1, sequence_parallel=True)
    saved = layer_activation_bytes(mha, 0, p, 4096) - layer_activation_bytes(LLAMA3_70B, 0, p, 4096)
    assert saved == pytest.approx(4096 * 4 * (8192 - 1024) / 8)  # K and V, 2 bytes each


def test_tp_above_the_kv_heads_keeps_one_whole_kv_head_per_rank():
    """4 KV heads on TP 8 (Megatron-Core 0.16+): every rank keeps the K and V of one head, not half of one."""
    four_kv = LLAMA3_70B.model_copy(update={"num_query_groups": 4})
    p = ParallelConfig(tp=8, dp=1, sequence_parallel=True)
    kept = layer_activation_bytes(four_kv, 0, p, 4096) - layer_activation_bytes(LLAMA3_70B, 0, p, 4096)
    assert kept == 0.0  # one head per rank either way: 8 heads / 8 ranks, or 4 heads each on 2 ranks
    assert layer_activation_bytes(four_kv, 0, p.model_copy(update={"tp": 4}), 4096) < \
        layer_activation_bytes(LLAMA3_70B, 0, p.model_copy(update={"tp": 4}), 4096)


def test_distributed_optimizer_divides_optimizer_state_by_dp():
    shard = shard_params(LLAMA3_70B, LLAMA_TP8_PP4_DP2, 0)
    plain = LLAMA_TP8_PP4_DP2.model_copy(update={"distributed_optimizer": False})
    assert optimizer_gib(shard, plain) == pytest.approx(2 * optimizer_gib(shard, LLAMA_TP8_PP4_DP2))


def test_fsdp_shards_weights_and_gradients_too():
    p = ParallelConfig(tp=1, pp=1, dp=8, mbs=1)
    fsdp = p.model_copy(update={"fsdp": True})
    plain = memory_per_gpu(LLAMA3_70B, SEQ_4K, p, 80.0)
    sharded = memory_per_gpu(LLAMA3_70B, SEQ_4K, fsdp, 80.0)
    transient = fsdp_unsharded_gib(LLAMA3_70B, fsdp)  # two bf16 layers + one layer of fp32 grads
    assert transient == pytest.approx(LLAMA3_70B_LAYER_PARAMS * 8 / GIB, rel=0.001)
    assert sharded.weights_gib == pytest.approx(plain.weights_gib / 8 + transient)
    assert sharded.gradients_gib == pytest.approx(plain.gradients_gib / 8)


def test_expert_parallel_shards_expert_weights_and_expert_dp_their_optimizer():
    p1 = ParallelConfig(tp=1, dp=8, ep=1, mbs=1)
    p8 = ParallelConfig(tp=1, dp=8, ep=8, mbs=1)
    s1, s8 = shard_params(MIXTRAL, p1, 0), shard_params(MIXTRAL, p8, 0)
    assert s8.expert == pytest.approx(s1.expert / 8)
    assert s8.dense == s1.dense
    # expert-DP is 1 at EP=8 over 8 ranks: expert optimizer state is not divided further
    assert optimizer_gib(s8, p8) * GIB == pytest.approx((s8.dense + s8.replicated) / 8 * 12 + s8.expert * 12)


@pytest.mark.parametrize(("flavour", "architecture", "copy_bytes"), [
    ("fp8-tensorwise", "blackwell", 1.0),  # one FP8 copy serves both layouts
    ("fp8-tensorwise", "hopper", 2.0),  # Hopper's FP8 GEMMs take K-major operands only: a transposed copy too
    ("fp8-delayed", "hopper", 2.0),
    ("fp8-blockwise", "hopper", 2 * (1 + 4 / 128**2)),  # 128 x 128 blocks, fp32 scales, both layouts
    ("mxfp8", "blackwell", 2 * (1 + 1 / 32)),  # a row- and a column-wise MXFP8 copy, an E8M0 scale per 32
    ("nvfp4", "blackwell", 2 * (0.5 + 1 / 256)),  # FP4 elements, an E4M3 scale per 16 x 16 block
])
def test_a_quantised_recipe_keeps_its_own_weight_copies_beside_the_bf16_weights(flavour, architecture, copy_bytes):
    shard = shard_params(LLAMA3_70B, LLAMA_TP8_PP4_DP2, 0)
    bf16 = weights_gib(shard, LLAMA_TP8_PP4_DP2)
    assert weights_gib(shard, LLAMA_TP8_PP4_DP2, flavour, architecture) == pytest.approx(bf16 * (2 + copy_bytes) / 2)
    with pytest.raises(ValueError, match="architecture"):
        weights_gib(shard, LLAMA_TP8_PP4_DP2, flavour)


@pytest.mark.parametrize(("precision", "architecture", "distributed_optimizer", "per_param"), [
    ("fp8", "hopper", True, 2.0),  # FP8 weights and their transpose, no bf16 copy (--fp8-param-gather)
    ("fp8", "blackwell", True, 1.0),  # one per-tensor FP8 copy serves both layouts
    ("mxfp8", "blackwell", True, 2 * (1 + 1 / 32)),  # row- and column-wise MXFP8, the weights themselves
    ("fp8", "hopper", False, 4.0),  # without a sharded optimizer Megatron refuses FP8 params: bf16 + copies
    ("fp8", "cdna3", True, 4.0),  # AMD: Primus keeps the bf16 weights beside its FP8 copies
    ("nvfp4", "blackwell", True, 2 + 2 * (0.5 + 1 / 256)),  # NVFP4 weights are cast per step from bf16
])
def test_fp8_runs_keep_their_weights_only_in_fp8_where_megatron_gathers_them_so(precision, architecture,
                                                                                 distributed_optimizer, per_param):
    layout = LLAMA_TP8_PP4_DP2.model_copy(update={"distributed_optimizer": distributed_optimizer})
    training = SEQ_4K.model_copy(update={"precision": precision})
    memory = memory_per_gpu(LLAMA3_70B, training, layout, 80.0, architecture=architecture)
    bf16 = memory_per_gpu(LLAMA3_70B, SEQ_4K, layout, 80.0)
    assert memory.weights_gib == pytest.approx(bf16.weights_gib * per_param / 2)


def test_saved_gemm_inputs_take_the_recipes_column_wise_bytes():
    """Llama-3-70B layer, TP 8 with SP: each saved GEMM input (QKV and MLP inputs, attention output, the MLP's
    activation output) shrinks from 2 bytes to the recipe's column-wise copy: 1 in FP8, 0.5 + 1/16 in NVFP4."""
    layout = LLAMA_TP8_PP4_DP2
    bf16, fp8, nvfp4 = (layer_activation_bytes(LLAMA3_70B, 0, layout, 4096, flavour)
                        for flavour in (None, "fp8-tensorwise", "nvfp4"))
    assert bf16 > fp8 > nvfp4
    assert (fp8 - nvfp4) / (bf16 - fp8) == pytest.approx((1 - 0.5625) / (2 - 1))


def test_full_recompute_keeps_only_layer_inputs():
    selective = memory_per_gpu(LLAMA3_70B, SEQ_4K, LLAMA_TP8_PP4_DP2, 80.0)
    full = memory_per_gpu(LLAMA3_70B, SEQ_4K, LLAMA_TP8_PP4_DP2.model_copy(update={"recompute": "full"}), 80.0)
    assert full.activations_gib < selective.activations_gib / 4


def test_full_recompute_of_fewer_layers_per_group_keeps_more():
    base = LLAMA_TP8_PP4_DP2.model_copy(update={"recompute": "full", "recompute_num_layers": 1})
    grouped = base.model_copy(update={"recompute_num_layers": 5})
    block = base.model_copy(update={"recompute_method": "block", "recompute_num_layers": 10})
    one = memory_per_gpu(LLAMA3_70B, SEQ_4K, base, 80.0).activations_gib
    five = memory_per_gpu(LLAMA3_70B, SEQ_4K, grouped, 80.0).activations_gib
    half_block = memory_per_gpu(LLAMA3_70B, SEQ_4K, block, 80.0).activations_gib
    selective = memory_per_gpu(LLAMA3_70B, SEQ_4K, LLAMA_TP8_PP4_DP2, 80.0).activations_gib
    assert one < five < selective
    assert one < half_block < selective


def test_block_recompute_reruns_one_layer_at_a_time():
    """Megatron checkpoints each of the block's layers on its own: recomputing every layer of a stage by block
    keeps what uniform recompute of one layer per group keeps, and its backward reruns one layer, not the block."""
    uniform = LLAMA_TP8_PP4_DP2.model_copy(update={"recompute": "full", "recompute_num_layers": 1})
    block = uniform.model_copy(update={"recompute_method": "block", "recompute_num_layers": 80 // 4})
    assert memory_per_gpu(LLAMA3_70B, SEQ_4K, block, 80.0).activations_gib == pytest.approx(
        memory_per_gpu(LLAMA3_70B, SEQ_4K, uniform, 80.0).activations_gib)


def test_interleaving_multiplies_stage0_in_flight_by_megatrons_factor():
    p, v = 4, 5
    interleaved = ParallelConfig(tp=8, pp=p, vpp=v, dp=2, sequence_parallel=True)
    assert in_flight_microbatches(interleaved, 64, 0) == pytest.approx(p * (1 + (p - 1) / (p * v)))
    assert in_flight_microbatches(LLAMA_TP8_PP4_DP2, 64, 0) == p
    assert in_flight_microbatches(LLAMA_TP8_PP4_DP2, 64, p - 1) == 1
    assert in_flight_microbatches(LLAMA_TP8_PP4_DP2, 2, 0) == 2  # fewer micro-batches than stages


def test_context_parallel_splits_the_sequence():
    p1 = ParallelConfig(tp=8, pp=1, dp=8, sequence_parallel=True)
    p2 = ParallelConfig(tp=8, pp=1, cp=2, dp=4, sequence_parallel=True)
    a1 = memory_per_gpu(LLAMA3_70B, SEQ_4K, p1, 80.0).activations_gib
    a2 = memory_per_gpu(LLAMA3_70B, SEQ_4K, p2, 80.0).activations_gib
    assert a2 == pytest.approx(a1 / 2, rel=0.01)


def test_does_not_fit_when_total_exceeds_capacity():
    tiny_gpu = memory_per_gpu(LLAMA3_70B, SEQ_4K, LLAMA_TP8_PP4_DP2, 24.0)
    assert tiny_gpu.total_gib > 24.0 and not tiny_gpu.fits


def test_last_stage_holds_logits_and_can_be_the_most_loaded():
    small_vocab_heavy = ModelSpec(
        name="wide-vocab", num_layers=8, hidden_size=2048, ffn_hidden_size=8192, num_attention_heads=16,
        vocab_size=256000,
    )
    p = ParallelConfig(tp=1, pp=4, dp=2, mbs=4)
    memory = memory_per_gpu(small_vocab_heavy, TrainingSpec(seq_length=8192, global_batch_size=64), p, 80.0)
    assert memory.stage == 3


@pytest.mark.parametrize(
    ("preset", "tp", "pp", "vpp", "ep"),
    [
        ("llama3.1-70b", 1, 1, 1, 1), ("llama3.1-70b", 8, 4, 1, 1), ("llama3.1-70b", 4, 2, 2, 1),
        ("mixtral-8x7b", 2, 2, 1, 1), ("mixtral-8x7b", 8, 4, 1, 8), ("mixtral-8x7b", 4, 2, 2, 2),
        ("deepseek-v3", 1, 1, 1, 1), ("deepseek-v3", 8, 1, 1, 8),
        ("tiny", 2, 2, 1, 1),
    ],
)
def test_shards_add_up_to_the_parameters_megatron_puts_on_each_stage(preset, tp, pp, vpp, ep):
    from megapilot.catalog import get_model
    from megapilot.estimate.params import stage_params

    model = get_model(preset)
    layout = ParallelConfig(tp=tp, pp=pp, vpp=vpp, ep=ep, dp=ep)
    for stage in range(pp):
        shard = shard_params(model, layout, stage)
        ours = shard.dense * tp + shard.replicated + shard.expert * ep * tp
        assert ours == pytest.approx(stage_params(model, pp, vpp, stage, tp=tp), rel=1e-9)


def test_mtp_last_stage_weights_hold_the_input_embedding_copy_megatron_core_builds():
    """DeepSeek-V3-like (MLA, MoE with dense-first layers, one MTP module) cut to 8 layers over pp=2: the last
    rank's weights are its layers, the final norm, the output layer, the MTP module AND a full input
    embedding for the MTP module to read; the first rank is untouched by MTP."""
    from megapilot.catalog import get_model
    from megapilot.estimate.params import embedding_params, layer_params, norm_params

    model = get_model("deepseek-v3").model_copy(update={"num_layers": 8})
    without_mtp = model.model_copy(update={"mtp_num_layers": 0})
    tp, ep, h = 2, 8, model.hidden_size
    layout = ParallelConfig(tp=tp, pp=2, ep=ep, dp=ep, sequence_parallel=True)
    last, no_mtp_last = shard_params(model, layout, 1), shard_params(without_mtp, layout, 1)

    mtp_layer = layer_params(model, model.num_layers - 1)  # the MTP module's layer is of the last layer's kind
    mtp_tp_sharded = mtp_layer.attention + mtp_layer.mlp + mtp_layer.shared_experts + 2 * h * h  # + eh-proj
    embedding_copy = embedding_params(model, padded_vocab=True, tp=tp)
    assert (last.dense - no_mtp_last.dense) * tp == pytest.approx(mtp_tp_sharded + embedding_copy)
    assert last.replicated - no_mtp_last.replicated == mtp_layer.norms + mtp_layer.router + 3 * norm_params(model, h)
    assert (last.expert - no_mtp_last.expert) * ep * tp == pytest.approx(mtp_layer.routed_experts)
    assert shard_params(model, layout, 0) == shard_params(without_mtp, layout, 0)

    copy_gib = embedding_copy / tp * 2 / GIB  # bf16 weights of the copy on one GPU
    weights_delta = weights_gib(last, layout) - weights_gib(no_mtp_last, layout)
    assert weights_delta > copy_gib
    # Without a pipeline the one rank reads the model's own embedding: no copy.
    single = ParallelConfig(tp=tp, pp=1, ep=ep, dp=2 * ep, sequence_parallel=True)
    no_pipeline_delta = shard_params(model, single, 0).dense - shard_params(without_mtp, single, 0).dense
    assert no_pipeline_delta * tp == pytest.approx(mtp_tp_sharded)


def test_megatron_formula_path_b_without_sequence_parallel():
    s, b, h, t, layers, p = 4096, 1, 8192, 8, 80, 4
    no_sp = LLAMA_TP8_PP4_DP2.model_copy(update={"sequence_parallel": False})
    memory = memory_per_gpu(LLAMA3_70B, SEQ_4K, no_sp, 80.0, megatron_formula=True)
    per_layer = s * b * h * (10 + 24 / t)
    expected = (per_layer * layers + 8 * s * b * p + s * b * h * p) * 1.05
    assert memory.activations_gib * GIB == pytest.approx(expected)


def test_megatron_formula_interleaving_factor():
    s, b, h, layers, p, v = 4096, 1, 8192, 80, 4, 5
    interleaved = LLAMA_TP8_PP4_DP2.model_copy(update={"vpp": v})
    memory = memory_per_gpu(LLAMA3_70B, SEQ_4K, interleaved, 80.0, megatron_formula=True)
    path_a = (s * b * h * (18 + 4 * 28672 / h) * layers + 8 * s * b * p + s * b * h * p) / 8
    assert memory.activations_gib * GIB == pytest.approx(path_a * (1 + (p - 1) / (p * v)))


def test_uneven_405b_pp16_peak_memory_is_on_the_first_middle_rank():
    # 126 layers, PP16 with 7 layers on each end rank: ranks 1..14 hold 8 layers. Rank 1 holds 8 layers
    # and 15 in-flight micro-batches; rank 0 holds 7 layers + the 2.1 B embedding and 16 micro-batches.
    model = ModelSpec(name="405b-like", num_layers=126, hidden_size=16384, ffn_hidden_size=53248,
                      num_attention_heads=128, num_query_groups=8, vocab_size=128256)
    layout = ParallelConfig(tp=8, pp=16, dp=16, sequence_parallel=True, recompute="full",
                            first_stage_layers=7, last_stage_layers=7)
    training = TrainingSpec(seq_length=8192, global_batch_size=2048)
    memory = memory_per_gpu(model, training, layout, 141.0)
    layer = 2 * 16384 * (16384 + 1024) + 3 * 16384 * 53248 + 2 * 16384
    embedding = 129024 * 16384  # vocab padded to a multiple of 128 x TP
    by_stage = {stage: shard_params(model, layout, stage) for stage in (0, 1, 15)}
    assert by_stage[1].dense * 8 + by_stage[1].replicated == pytest.approx(8 * layer)
    assert by_stage[0].dense * 8 + by_stage[0].replicated == pytest.approx(7 * layer + embedding)
    assert memory.stage == 1
    assert memory.weights_gib == pytest.approx((8 * layer - 8 * 2 * 16384) / 8 * 2 / GIB + 8 * 2 * 16384 * 2 / GIB)


def test_experts_padded_to_capacity_keep_their_padding_in_memory():
    moe = MoESpec(num_experts=8, router_topk=2, moe_ffn_hidden_size=1024)
    model = ModelSpec(name="m", num_layers=4, hidden_size=1024, ffn_hidden_size=4096, num_attention_heads=8,
                      vocab_size=32000, moe=moe)
    layout = ParallelConfig(tp=1, pp=1, dp=8, ep=8, mbs=1)
    training = TrainingSpec(seq_length=4096, global_batch_size=64)

    def activations(capacity: float | None, pad: bool) -> float:
        dropping = model.model_copy(update={"moe": moe.model_copy(update={"capacity_factor": capacity,
                                                                          "pad_to_capacity": pad})})
        return layer_activation_bytes(dropping, 0, layout, training.seq_length, training.quant_flavour)

    assert activations(2.0, False) == activations(None, False)
    assert activations(2.0, True) > activations(1.0, True) == activations(None, False)


def test_a_latent_moe_keeps_latent_sized_routed_copies_and_a_repeated_mtp_module_one_copy_of_weights():
    """Nemotron 3 Super: a routed copy keeps fc1's input in the latent width (1024, not 4096) and the experts'
    intermediates; the combined output is kept once more, 1024 wide, for fc2_latent_proj's backward. Two MTP depths
    that repeat one module hold its weights once and its activations twice."""
    from megapilot.catalog import get_model
    from megapilot.estimate.memory import routed_copy_bytes
    from megapilot.estimate.params import count_params, mtp_module_params

    model = get_model("nemotron3-super")
    full_width = model.model_copy(update={"moe": model.moe.model_copy(update={"latent_size": None})})
    assert routed_copy_bytes(full_width, 2) - routed_copy_bytes(model, 2) == 2 * (4096 - 1024)
    layout = ParallelConfig(tp=1, ep=8, dp=8)
    difference = layer_activation_bytes(full_width, 1, layout, 1.0) - layer_activation_bytes(model, 1, layout, 1.0)
    assert difference == 22 * 2 * (4096 - 1024) - 2 * 1024  # top-22 copies narrower, one latent output more

    repeated = model.model_copy(update={"mtp_num_layers": 2, "mtp_repeated_layer": True})
    separate = repeated.model_copy(update={"mtp_repeated_layer": False})
    one_module = mtp_module_params(model)
    assert count_params(separate).mtp == 2 * one_module and count_params(repeated).mtp == one_module
    last = ParallelConfig(tp=1, pp=1, ep=8, dp=8)
    assert shard_params(separate, last, 0).expert - shard_params(repeated, last, 0).expert > 0


def test_sparse_attention_keeps_its_indexer_activations_whole_on_every_tp_rank():
    from megapilot.catalog import get_model
    from megapilot.estimate.memory import dsa_indexer_bytes, layer_activation_bytes

    dense, sparse = get_model("deepseek-v3"), get_model("deepseek-v3.2")
    assert dsa_indexer_bytes(sparse, 5) == 2 * 64 * 128 + 2 * 128 + 4 * 64 + 4 * 2048
    assert dsa_indexer_bytes(dense, 5) == 0
    for tp in (1, 4):
        layout = ParallelConfig(tp=tp, pp=1, dp=1, sequence_parallel=tp > 1)
        extra = layer_activation_bytes(sparse, 5, layout, 4096) - layer_activation_bytes(dense, 5, layout, 4096)
        assert extra == pytest.approx(4096 * dsa_indexer_bytes(sparse, 5))


# ---- selective recompute of modules (--recompute-modules) -----------------------------------------------------

def _activations(model: ModelSpec, p: ParallelConfig) -> float:
    return memory_per_gpu(model, SEQ_4K.model_copy(update={"global_batch_size": 8}), p, 80.0).activations_gib


def test_recomputing_the_experts_activation_drops_its_output_for_every_routed_copy():
    """Mixtral on one rank, 4096 tokens, top-2: the SwiGLU output (bf16, 14336 per copy) of two copies per token
    goes; the gate and up outputs it is rerun from stay. The rerun's own output lives again for one layer."""
    kept, dropped = ParallelConfig(dp=1, recompute="none"), ParallelConfig(dp=1, recompute_modules=("moe_act",))
    per_layer = 4096 * 2 * 14336 * 2 / GIB
    assert _activations(MIXTRAL, kept) - _activations(MIXTRAL, dropped) == pytest.approx(31 * per_layer, rel=1e-6)


def test_recomputing_norms_drops_only_those_that_are_modules_of_their_own():
    """Transformer Engine fuses a dense layer's norms into the next linear: nothing to drop on Llama. A MoE layer's
    pre-MLP norm feeds the router on its own: its output (bf16, h per token) goes, split by sequence parallelism."""
    p = ParallelConfig(tp=8, dp=1, sequence_parallel=True, recompute_modules=("layernorm",))
    none = ParallelConfig(tp=8, dp=1, sequence_parallel=True, recompute="none")
    assert _activations(LLAMA3_70B, p) == pytest.approx(_activations(LLAMA3_70B, none))
    per_layer = 4096 * 4096 * 2 / 8 / GIB
    assert _activations(MIXTRAL, none) - _activations(MIXTRAL, p) == pytest.approx(31 * per_layer, rel=1e-6)


def test_recomputing_the_moe_layer_drops_more_than_its_parts_and_a_dense_mlp_drops_its_intermediates():
    whole = ParallelConfig(dp=1, recompute_modules=("moe",))
    parts = ParallelConfig(dp=1, recompute_modules=("moe_act", "layernorm"))
    assert _activations(MIXTRAL, whole) < _activations(MIXTRAL, parts) < _activations(MIXTRAL, ParallelConfig(dp=1))
    mlp = ParallelConfig(tp=8, dp=1, sequence_parallel=True, recompute_modules=("mlp",))
    none = ParallelConfig(tp=8, dp=1, sequence_parallel=True, recompute="none")
    # the fc1 input after the fused norm (bf16 h) and gate, up and activation outputs (3 x 2 bytes x ffn), / TP 8
    per_layer = 4096 * (2 * 8192 + 6 * 28672) / 8 / GIB
    assert _activations(LLAMA3_70B, none) - _activations(LLAMA3_70B, mlp) == pytest.approx(79 * per_layer, rel=1e-6)


def test_offloaded_layers_leave_the_gpu_but_the_one_in_transit():
    """Llama-70B-like on 64 GB200, PP 1, no recompute: each offloaded layer frees its activations, except that one
    layer's stay while it moves; the weights, gradients and optimizer do not change."""
    training = TrainingSpec(seq_length=8192, global_batch_size=256, precision="fp8")

    def memory(offloaded: int):
        layout = ParallelConfig.for_world(64, mbs=2, recompute="none", fsdp=True, cpu_offloading_num_layers=offloaded)
        return memory_per_gpu(LLAMA3_70B, training, layout, 186.0, architecture="blackwell"), layout

    none, _ = memory(0)
    forty, layout = memory(40)
    per_layer = offloaded_layer_bytes(LLAMA3_70B, training, layout)
    assert [index for index, _ in per_layer] == list(range(40))
    assert none.activations_gib - forty.activations_gib == pytest.approx(39 * per_layer[0][1] / GIB)
    assert (forty.weights_gib, forty.gradients_gib, forty.optimizer_gib) == \
        (none.weights_gib, none.gradients_gib, none.optimizer_gib)


def test_offloaded_activations_are_checked_against_the_host_memory_of_their_gpu():
    """What offload parks in host memory is every offloaded layer's activations of the micro-batch in flight; it must
    fit in the GPU's share of its node's DRAM, less what the OS, loaders and checkpoint staging keep."""
    training = TrainingSpec(seq_length=8192, global_batch_size=256, precision="fp8")
    layout = ParallelConfig.for_world(64, mbs=2, recompute="none", fsdp=True, cpu_offloading_num_layers=40)
    parked = sum(stored for _, stored in offloaded_layer_bytes(LLAMA3_70B, training, layout)) / GIB
    assert host_offload(LLAMA3_70B, training, layout.model_copy(update={"cpu_offloading_num_layers": 0}), 223.5) \
        is None
    roomy = host_offload(LLAMA3_70B, training, layout, 2 * parked)
    assert roomy is not None and roomy.offloaded_gib == pytest.approx(parked) and roomy.fits
    short = host_offload(LLAMA3_70B, training, layout, parked)  # the whole share is not usable
    assert short is not None and not short.fits and short.usable_gib == pytest.approx(0.8 * parked)
    unknown = host_offload(LLAMA3_70B, training, layout, None)
    assert unknown is not None and unknown.fits


def _megatron_in_flight(pp: int, vpp: int, rank: int, microbatches: int) -> float:
    """Stage-equivalents rank `rank` holds at its peak, by Megatron-Core's own warm-up count
    (`schedules.get_pp_rank_microbatches`): the warm-up forwards plus the one before the first backward."""
    from megatron.core.pipeline_parallel.schedules import get_pp_rank_microbatches

    class PipelineGroup:  # fake: the rank and size a real process group would report (no distributed run here)
        def size(self) -> int:
            return pp

        def rank(self) -> int:
            return rank

    class Communicator:
        pp_group = PipelineGroup()
        virtual_pipeline_model_parallel_size = vpp if vpp > 1 else None

    total, all_warmup, warmup, _ = get_pp_rank_microbatches(microbatches, vpp, pp, p2p_communicator=Communicator())
    return (total if all_warmup else warmup + 1) / vpp


@pytest.mark.parametrize(("pp", "vpp", "microbatches"), [(16, 2, 16), (16, 2, 64), (4, 5, 64), (8, 1, 4), (8, 1, 32)])
def test_in_flight_microbatches_follow_megatron_cores_schedule(pp: int, vpp: int, microbatches: int):
    # Llama 3.1 405B as trained: PP 16, VPP 2, 16 micro-batches per pipeline; Megatron's warm-up (46 chunk-forwards
    # on rank 0) covers all 32, so ranks 0-7 each hold all 16 micro-batches of both chunks at the peak
    layout = ParallelConfig(tp=8, pp=pp, vpp=vpp, dp=1, sequence_parallel=True)
    for rank in range(pp):
        assert in_flight_microbatches(layout, microbatches, rank) == pytest.approx(
            _megatron_in_flight(pp, vpp, rank, microbatches)), rank


def test_the_embedding_adds_only_its_token_ids_to_the_first_stage():
    # its output is the first layer's input, kept by that layer's norm; with dropout 0 there is no mask
    from megapilot.estimate.memory import _stage_activation_bytes

    training = SEQ_4K
    first = ParallelConfig(tp=8, pp=2, dp=1, sequence_parallel=True)
    kept_first, _, _ = _stage_activation_bytes(LLAMA3_70B, training, first, 0)
    kept_second, _, _ = _stage_activation_bytes(LLAMA3_70B, training, first, 1)
    assert kept_first - kept_second == pytest.approx(8 * training.seq_length)  # int64 ids, per micro-batch


def test_memory_by_stage_lists_each_costed_rank_and_its_heaviest_is_memory_per_gpus():
    from megapilot.estimate.memory import memory_by_stage

    layout = ParallelConfig(tp=8, pp=4, vpp=5, dp=2, sequence_parallel=True)
    by_stage = dict(memory_by_stage(LLAMA3_70B, SEQ_4K, layout))
    heaviest = memory_per_gpu(LLAMA3_70B, SEQ_4K, layout, 80.0)
    assert set(by_stage) == {0, 1, 3}  # the first, the last, and one middle rank for the ranks alike
    assert max(by_stage.values()) == pytest.approx(heaviest.total_gib)
    assert max(by_stage, key=lambda stage: by_stage[stage]) == heaviest.stage


def test_a_mamba_mixer_keeps_what_the_memory_efficient_path_saves_not_the_conv_output():
    """MambaSplitConv1dScanCombinedFn saves its input zxBCdt and the ungated scan output (the conv and the chunk
    states are recomputed in its backward); the group RMSNorm saves its input and an fp32 rstd per group; out_proj
    its input. Nemotron-H 8B: d = 8192, 8 groups x 128 states, 128 heads."""
    from megapilot.catalog import get_model
    from megapilot.estimate.memory import mamba_mixer_inner_bytes

    model = get_model("nemotron-h-8b")
    d, gn, heads, groups = 8192, 8 * 128, 128, 8
    assert mamba_mixer_inner_bytes(model) == 2 * (2 * d + 2 * gn + heads) + 2 * d + 2 * d + 4 * groups
    mamba = model.hybrid_override_pattern.index("M")
    for tp in (1, 2):
        layout = ParallelConfig(tp=tp, dp=8, sequence_parallel=tp > 1)
        norm_and_in_proj_input = (2 * 4096 + 2 * 4096) / tp  # the layer's norm input and in_proj's input
        expected = norm_and_in_proj_input + (mamba_mixer_inner_bytes(model) + 2 * d) / tp  # + out_proj's input
        assert layer_activation_bytes(model, mamba, layout, 1.0) == pytest.approx(expected)


def test_hyper_connections_keep_each_sublayers_residual_streams():
    """DeepSeek-V4's four residual streams: each sublayer keeps the n streams (bf16) beside the one it reads."""
    from megapilot.catalog import get_model
    from megapilot.estimate.memory import layer_activation_bytes
    from megapilot.spec import ParallelConfig
    model = get_model("deepseek-v4-flash")
    plain = model.model_copy(update={"residual_streams": 1})
    p = ParallelConfig(tp=1, ep=8, mbs=1, recompute="none")
    for layer in (0, 2, 3):
        assert layer_activation_bytes(model, layer, p, 4096) - layer_activation_bytes(plain, layer, p, 4096) \
            == 2 * 2 * 4096 * 4 * 4096


def test_deepseek_v4_layers_keep_what_their_attention_kind_computes():
    """A compressing layer keeps its compressor's projections, a ratio-4 layer its indexer's too."""
    from megapilot.catalog import get_model
    from megapilot.estimate.memory import layer_activation_bytes
    from megapilot.spec import ParallelConfig
    model, p = get_model("deepseek-v4-flash"), ParallelConfig(tp=1, ep=8, mbs=1, recompute="none")
    window, csa, hca = (layer_activation_bytes(model, i, p, 1) for i in (0, 2, 3))
    assert hca - window == 2 * 2 * 512  # wkv and wgate outputs, bf16
    assert csa - window == 2 * 2 * 1024 + 4 * 512 + 2 * 64 * 128 + 4 * 64 + 2 * 2 * 256


def test_deepseek_v4s_up_projection_recompute_drops_only_what_its_attention_keeps():
    """mla_up_proj on DeepSeek-V4 reruns q's up-projection and the one K=V head: it drops q (bf16) and that head,
    never more than the layer keeps."""
    from megapilot.catalog import get_model
    from megapilot.estimate.memory import recomputed_bytes_per_token
    v4 = get_model("deepseek-v4-flash")
    dropped = recomputed_bytes_per_token(v4, 0, 1, False, 1, 2.0, frozenset({"mla_up_proj"}))
    assert dropped == 2 * 64 * 512 + 2 * 512


def test_a_cpu_ranks_overhead_is_its_process_runtime_not_a_cuda_context():
    """On a CPU rank there is no CUDA context, NCCL buffer or caching allocator: its overhead is the runtime its
    process holds (measured by the op probe), and the total is what its resident memory is compared with."""
    from megapilot.catalog.host import host_spec
    from megapilot.estimate import build_case, estimate

    case = build_case(model="tiny", gpu="h100", gpus=2, seq_len=128, gbs=8, mbs=1)
    gpu_overhead = estimate(case.model, case.cluster, case.training, case.parallel).memory_gib.overhead
    assert gpu_overhead >= 1.0  # the CUDA context alone
    cpu = host_spec({"matmul_tflops_one_thread": 0.1, "memory_tbps": 0.02, "ops_per_s": 1e5, "elements_per_s": 1e9,
                     "runtime_gib": 0.4}, ranks_per_node=2)
    cluster = case.cluster.model_copy(update={"gpu": cpu})
    memory = estimate(case.model, cluster, case.training, case.parallel).memory_gib
    assert memory.overhead == 0.4
    assert memory.total == pytest.approx(memory.weights + memory.gradients + memory.optimizer + memory.activations
                                         + 0.4, abs=0.01)  # each figure rounded to 0.01 GiB
