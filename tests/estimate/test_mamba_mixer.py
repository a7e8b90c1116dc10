"""The Mamba-2 mixer's kernels (conv1d, the chunked SSD scan, the group RMSNorm): their bytes and FLOPs follow the
tensors mamba_ssm's kernels read and write, and the step time prices them on their roofline."""

from __future__ import annotations

import pytest

from megapilot.catalog import get_model
from megapilot.catalog.gpus import get_gpu
from megapilot.estimate.efficiency import CALIBRATED, attention_time_s, elementwise_time_s
from megapilot.estimate.latency import layer_kernels
from megapilot.estimate.mamba_mixer import MIXER_KERNELS, SSD_CHUNK_SIZE, mixer_kernels, mixer_shape
from megapilot.estimate.memory import layer_activation_bytes, mamba_mixer_inner_bytes
from megapilot.estimate.step_time import EstimateOptions, layer_terms
from megapilot.spec import ClusterSpec, ParallelConfig, TrainingSpec
from megapilot.spec.model import MambaSpec

H100 = get_gpu("h100")
SEQ_8K = TrainingSpec(seq_length=8192, global_batch_size=256)
NEMOTRON_H_8B = get_model("nemotron-h-8b")
SMS = 132


def _moved(model, tp=1, cp=1, mbs=1, seq=8192) -> float:
    return sum(k.moved_bytes for k in mixer_kernels(model, tp, cp, mbs, seq, SMS))


def _with_state(model, state_dim: int):
    return model.model_copy(update={"mamba": model.mamba.model_copy(update={"state_dim": state_dim})})


def _mamba_terms(model, tp=1, cp=1, mbs=1, recompute="none", modules=None) -> dict[str, float]:
    layout = ParallelConfig(tp=tp, cp=cp, mbs=mbs, dp=64 // (tp * cp), sequence_parallel=tp > 1, recompute=recompute,
                            recompute_modules=modules)
    cluster = ClusterSpec.from_gpu_count(H100, 64)
    return layer_terms(model, model.hybrid_override_pattern.index("M"), cluster, SEQ_8K, layout, EstimateOptions(),
                       recomputed=False)


def test_the_chunk_states_are_fp32_heads_x_headdim_x_dstate_per_chunk_written_and_read_back():
    """`_chunk_state_fwd` writes (chunks, heads, headdim, d_state) in fp32, `_state_passing_fwd` reads them and
    writes the passed states in 16 bits: per token d N / Q values, 4 + 4 + 2 bytes each."""
    d, n = 8192, 128
    kernels = {k.name: k for k in mixer_kernels(NEMOTRON_H_8B, 1, 1, 1, 8192, SMS)}
    assert kernels["_state_passing_fwd"].read_bytes == 4 * d * n / SSD_CHUNK_SIZE
    assert kernels["_state_passing_fwd"].written_bytes == 2 * d * n / SSD_CHUNK_SIZE
    assert kernels["_chunk_state_fwd"].written_bytes == 4 * d * n / SSD_CHUNK_SIZE
    assert kernels["_chunk_state_fwd"].flops == 2 * d * n
    # the conv reads and writes x, B and C (d + 2 G N channels) in bf16, forward
    assert kernels["causal_conv1d_fwd (+ SiLU)"].moved_bytes == 2 * 2 * (d + 2 * 8 * n)


def test_the_scans_bytes_grow_with_d_state_and_shrink_with_tp():
    small, large = _moved(_with_state(NEMOTRON_H_8B, 64)), _moved(NEMOTRON_H_8B)
    assert large > small
    # each TP rank holds 1/TP of the heads and groups: its bytes per token halve (the same number of partial splits)
    splits = {mixer_shape(NEMOTRON_H_8B, tp, 1, 1, 8192, SMS).splits for tp in (1, 2)}
    assert splits == {1}
    assert _moved(NEMOTRON_H_8B, tp=2) == pytest.approx(_moved(NEMOTRON_H_8B) / 2)


def test_context_parallel_repeats_b_and_c_when_a_rank_holds_less_than_a_group():
    """MambaContextParallel: CP larger than the TP rank's groups repeats each group's B and C over CP ranks."""
    four_groups = NEMOTRON_H_8B.model_copy(update={"mamba": NEMOTRON_H_8B.mamba.model_copy(update={"num_groups": 4})})
    assert mixer_shape(four_groups, 1, 4, 1, 8192, SMS).group_state == 4 * 128  # one group per rank: no repeat
    assert mixer_shape(four_groups, 1, 8, 1, 8192, SMS).group_state == 8 * 128  # half a group: repeated twice
    assert mixer_shape(four_groups, 1, 2, 1, 8192, SMS).inner == mixer_shape(four_groups, 1, 1, 1, 8192, SMS).inner


def test_a_multi_sequence_micro_batch_adds_megatrons_layout_copies():
    one, two = mixer_kernels(NEMOTRON_H_8B, 1, 1, 1, 8192, SMS), mixer_kernels(NEMOTRON_H_8B, 1, 1, 2, 8192, SMS)
    assert len(two) == len(one) + 2 and len(one) == MIXER_KERNELS


def test_every_mixer_kernel_is_memory_bound_at_d_state_128_on_an_h100():
    for kernel in mixer_kernels(NEMOTRON_H_8B, 1, 1, 1, 8192, SMS):
        assert attention_time_s(kernel.flops, H100) <= H100.hbm_time_s(kernel.moved_bytes), kernel.name


def test_the_mixer_costs_more_than_its_flops_at_the_attention_rate_and_more_with_a_larger_state():
    terms = _mamba_terms(NEMOTRON_H_8B, tp=2)
    tokens, d, n = 8192, 8192 / 2, 128
    flop_only = attention_time_s(7 * d * n * tokens, H100, CALIBRATED)  # the price before the kernels
    assert terms["mixer_core"] > 5 * flop_only
    assert _mamba_terms(_with_state(NEMOTRON_H_8B, 256), tp=2)["mixer_core"] > terms["mixer_core"]
    assert _mamba_terms(NEMOTRON_H_8B, tp=4)["mixer_core"] == pytest.approx(terms["mixer_core"] / 2)


def test_the_glue_leaves_the_mixers_inner_tensors_to_its_kernels_and_keeps_every_other_layer_whole():
    layout = ParallelConfig(tp=2, dp=32, sequence_parallel=True)
    tokens = 8192
    mamba = NEMOTRON_H_8B.hybrid_override_pattern.index("M")
    stored = layer_activation_bytes(NEMOTRON_H_8B, mamba, layout, tokens)
    inner = mamba_mixer_inner_bytes(NEMOTRON_H_8B) / 2 * tokens
    assert _mamba_terms(NEMOTRON_H_8B, tp=2)["glue"] == pytest.approx(elementwise_time_s(stored - inner, H100))
    mlp = NEMOTRON_H_8B.hybrid_override_pattern.index("-")
    cluster = ClusterSpec.from_gpu_count(H100, 64)
    mlp_terms = layer_terms(NEMOTRON_H_8B, mlp, cluster, SEQ_8K, layout, EstimateOptions(), recomputed=False)
    assert mlp_terms["glue"] == elementwise_time_s(layer_activation_bytes(NEMOTRON_H_8B, mlp, layout, tokens), H100)


def test_a_dense_models_layer_has_no_mixer_kernels_and_its_whole_glue():
    dense = get_model("llama3.1-8b")
    layout = ParallelConfig(tp=2, dp=32, sequence_parallel=True)
    cluster = ClusterSpec.from_gpu_count(H100, 64)
    terms = layer_terms(dense, 0, cluster, SEQ_8K, layout, EstimateOptions(), recomputed=False)
    assert terms["glue"] == elementwise_time_s(layer_activation_bytes(dense, 0, layout, 8192), H100)
    assert layer_kernels(dense, 0, 1, eight_bit=False, per_expert_gemms=True) < MIXER_KERNELS


def test_the_kernel_overhead_counts_every_mixer_kernel():
    mamba = NEMOTRON_H_8B.hybrid_override_pattern.index("M")
    count = layer_kernels(NEMOTRON_H_8B, mamba, 1, eight_bit=False, per_expert_gemms=True)
    assert count == 4 + MIXER_KERNELS + 2 * 3  # norm and residual, the mixer's kernels, in_proj and out_proj


def test_selective_recompute_reruns_no_mamba_kernel():
    """Megatron-Core's MambaMixer checkpoints nothing of its own: core_attn recompute touches attention only."""
    assert _mamba_terms(NEMOTRON_H_8B, recompute="selective", modules=["core_attn"])["recompute"] == 0.0


def test_a_small_mamba_spec_prices_every_kernel_nonnegative():
    tiny = NEMOTRON_H_8B.model_copy(update={"mamba": MambaSpec(state_dim=16, head_dim=8, num_groups=2, num_heads=4)})
    kernels = mixer_kernels(tiny, 1, 1, 1, 100, SMS)
    assert all(k.read_bytes >= 0 and k.written_bytes >= 0 and k.flops >= 0 for k in kernels)


def test_context_parallel_trades_a_mamba_layers_sequence_for_heads_by_all_to_alls_and_leaves_mlp_layers_alone():
    """MambaContextParallel: z, x, B, C, dt all-to-all'd before the conv, the scan's output after it, forward and
    backward; a hybrid's MLP layer has no attention to ring, its attention layer still rings K and V."""
    from megapilot.estimate import comm
    from megapilot.estimate.mamba_mixer import context_parallel_all_to_all_bytes
    from megapilot.estimate.step_time import _cp_comm_exposed_s

    layout = ParallelConfig(tp=2, cp=2, dp=16, sequence_parallel=True)
    cluster = ClusterSpec.from_gpu_count(H100, 64)
    tokens = 8192 / 2
    d, gn, heads = 8192 / 2, 8 / 2 * 128, 128 / 2
    assert context_parallel_all_to_all_bytes(NEMOTRON_H_8B, 2, 2) == 2 * (2 * d + 2 * gn + heads + d)
    assert context_parallel_all_to_all_bytes(NEMOTRON_H_8B, 2, 1) == 0.0
    sent = context_parallel_all_to_all_bytes(NEMOTRON_H_8B, 2, 2) * tokens
    expected = 2 * comm.all_to_all_s(sent, 2, comm.group_bandwidth_bytes_per_s(cluster, 2, stride=2))

    def terms(kind: str) -> dict[str, float]:
        index = NEMOTRON_H_8B.hybrid_override_pattern.index(kind)
        return layer_terms(NEMOTRON_H_8B, index, cluster, SEQ_8K, layout, EstimateOptions(), recomputed=False)

    assert terms("M")["cp_comm"] == pytest.approx(expected) and expected > 0
    assert terms("-")["cp_comm"] == 0.0
    attention = terms("*")
    ring = _cp_comm_exposed_s(NEMOTRON_H_8B, cluster, layout, tokens, attention["mixer_core"], 8)
    assert attention["cp_comm"] == ring
    # the rearrangements around the all-to-alls are HBM passes of the mixer's own
    assert len(mixer_kernels(NEMOTRON_H_8B, 2, 2, 1, 8192, SMS)) == MIXER_KERNELS + 10
