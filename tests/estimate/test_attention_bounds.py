"""A fused attention core waits on the softmax's exponentials where the special-function unit, not the tensor cores,
is the slower of the two, and its backward on shared memory where that is: properties of the GPU (its MMA FLOPs per
exponential and per shared-memory byte) and of the head dimensions, the same for every model with them."""

from __future__ import annotations

import pytest

from megapilot.catalog.gpus import get_gpu
from megapilot.catalog.models import get_model
from megapilot.estimate.attention_bounds import (
    SOFTMAX_WORK_PER_EXPONENTIAL,
    attention_core_bound,
    backward_smem_bound,
    backward_smem_flops_per_byte,
    softmax_exponential_bound,
    waits_on_exponentials,
)
from megapilot.estimate.coverage import EXPONENTIAL_BOUND, coverage_for
from megapilot.estimate.step_time import EstimateOptions, layer_terms
from megapilot.spec import ClusterSpec, ParallelConfig, TrainingSpec

GPT_OSS = get_model("gpt-oss-20b")  # head dim 64; layer 1 attends globally
LLAMA = get_model("llama3.1-8b")  # head dim 128
DEEPSEEK = get_model("deepseek-v3")  # MLA: q/k 128 + 64 rope, v 128
QWEN3_NEXT = get_model("qwen3-next-80b-a3b")  # Gated DeltaNet on three of every four layers
FULL = 1


def test_the_sfu_rates_are_the_architectures():
    # 16 exponentials a clock per SM beside 2,048 / 4,096 / 8,192 BF16 MMA FLOPs; Blackwell Ultra doubles the SFU
    assert get_gpu("a100").mma_flops_per_exp == 128
    assert get_gpu("h100").mma_flops_per_exp == get_gpu("h200").mma_flops_per_exp == 256
    assert get_gpu("b200").mma_flops_per_exp == get_gpu("gb200").mma_flops_per_exp == 512
    assert get_gpu("b300").mma_flops_per_exp == get_gpu("gb300").mma_flops_per_exp == 256


@pytest.mark.parametrize("gpu", ["a100", "h100", "b200", "gb200", "b300", "gb300", "mi300x", "mi355x"])
def test_head_dim_128_never_waits_on_the_exponentials(gpu):
    # Blackwell's forward sits on the balance point (4 x 128 MMA FLOPs per exponential): the fitted rows' regime
    assert softmax_exponential_bound(LLAMA, 0, get_gpu(gpu)) == 1.0
    assert softmax_exponential_bound(DEEPSEEK, 3, get_gpu(gpu)) == 1.0


def test_head_dim_64_forward_takes_twice_its_mma_time_on_blackwell():
    # forward (a third of the counted core) at 512 / 256 = 2x its MMAs, backward at 512 / 512 = its MMAs
    assert softmax_exponential_bound(GPT_OSS, FULL, get_gpu("b200")) == pytest.approx(1 / 3 * 2 + 2 / 3)
    assert softmax_exponential_bound(GPT_OSS, FULL, get_gpu("gb200")) == pytest.approx(4 / 3)
    for gpu in ("gb300", "b300", "a100"):  # Blackwell Ultra and Ampere balance at head dim 64
        assert softmax_exponential_bound(GPT_OSS, FULL, get_gpu(gpu)) == 1.0


def test_head_dim_64_forward_on_hopper_runs_at_cudnns_measured_rate():
    """cuDNN's H100 forward at head dim 64 runs 413 TFLOP/s against 595 at 128 (FlashAttention-3, Fig. 5): the
    score's softmax work is 595 / 413 exponentials, which a head-dim-64 forward pays and a head-dim-128 one hides."""
    assert SOFTMAX_WORK_PER_EXPONENTIAL["hopper"] == pytest.approx(1.44, abs=0.005)
    for gpu in ("h100", "h200"):
        assert softmax_exponential_bound(GPT_OSS, FULL, get_gpu(gpu)) == pytest.approx(1 / 3 * 595 / 413 + 2 / 3)
        assert softmax_exponential_bound(LLAMA, 0, get_gpu(gpu)) == 1.0


def test_no_softmax_or_no_rate_no_bound():
    gdn_layer = next(i for i in range(QWEN3_NEXT.num_layers) if QWEN3_NEXT.is_linear_attention_layer(i))
    assert softmax_exponential_bound(QWEN3_NEXT, gdn_layer, get_gpu("b200")) == 1.0
    unknown = get_gpu("b200").model_copy(update={"mma_flops_per_exp": None})
    assert softmax_exponential_bound(GPT_OSS, FULL, unknown) == 1.0


def test_the_attention_core_pays_it_and_nothing_else_does():
    training = TrainingSpec(seq_length=8192, global_batch_size=64)
    layout = ParallelConfig(tp=1, pp=1, dp=8, ep=8, mbs=1, recompute="none")

    def terms(gpu):
        return layer_terms(GPT_OSS, FULL, ClusterSpec.from_gpu_count(gpu, 8), training, layout, EstimateOptions(),
                           recomputed=False)

    b200 = get_gpu("b200")
    bound, unbound = terms(b200), terms(b200.model_copy(update={"mma_flops_per_exp": None,
                                                                "mma_flops_per_smem_byte": None}))
    # the full-attention core is compute-bound at 8K, so it grows by the bound exactly: the forward by the
    # exponentials (2x), the backward by its shared memory (64 / 30.5 FLOPs a byte at head dim 64)
    assert bound["mixer_core"] == pytest.approx(unbound["mixer_core"] * attention_core_bound(GPT_OSS, FULL, b200))
    assert attention_core_bound(GPT_OSS, FULL, b200) == pytest.approx(1 / 3 * 2 + 2 / 3 * 64 / (640 / 21))
    assert {k: v for k, v in bound.items() if k != "mixer_core"} == \
        {k: v for k, v in unbound.items() if k != "mixer_core"}


def test_an_estimate_that_waits_on_them_says_no_published_run_did():
    # every calibration row's core sits at or below the balance point, so none checks the bound
    assert waits_on_exponentials(GPT_OSS, get_gpu("b200")) and waits_on_exponentials(GPT_OSS, get_gpu("h100"))
    assert not waits_on_exponentials(GPT_OSS, get_gpu("gb300"))
    assert not waits_on_exponentials(LLAMA, get_gpu("b200"))
    assert EXPONENTIAL_BOUND in coverage_for(GPT_OSS, get_gpu("gb200"), "bf16").unchecked_mechanisms
    assert EXPONENTIAL_BOUND not in coverage_for(GPT_OSS, get_gpu("gb300"), "bf16").unchecked_mechanisms
    assert coverage_for(LLAMA, get_gpu("b200"), "bf16").unchecked_mechanisms == ()


def test_shared_memory_rates_are_the_architectures():
    # 128 bytes a clock per SM beside 2,048 / 4,096 / 8,192 BF16 MMA FLOPs; Blackwell Ultra keeps B200's MMAs
    assert get_gpu("a100").mma_flops_per_smem_byte == 16
    assert get_gpu("h100").mma_flops_per_smem_byte == get_gpu("h200").mma_flops_per_smem_byte == 32
    for gpu in ("b200", "gb200", "b300", "gb300"):
        assert get_gpu(gpu).mma_flops_per_smem_byte == 64
    assert get_gpu("mi300x").mma_flops_per_smem_byte is None  # the LDS rates are not read: not priced


def test_a_backward_tile_moves_a_byte_of_shared_memory_per_40_flops_at_head_dim_128():
    # 2 x 128^2 x 640 FLOPs over 224 KiB of operands, 160 KiB of P and dS, 128 KiB of fp32 dQ
    assert backward_smem_flops_per_byte(128, 128) == pytest.approx(20_971_520 / 524_288)
    assert backward_smem_flops_per_byte(128, 128) == pytest.approx(40.0)
    # a narrower head reads fewer operand bytes but as many score bytes: fewer FLOPs a byte
    assert backward_smem_flops_per_byte(64, 64) < backward_smem_flops_per_byte(128, 128) \
        < backward_smem_flops_per_byte(192, 128)


@pytest.mark.parametrize("gpu", ["b200", "gb200", "b300", "gb300"])
def test_blackwells_backward_waits_on_shared_memory(gpu):
    # 64 FLOPs a byte against the tile's 40: the backward at 1.6x its MMAs, the forward untouched at head dim 128
    assert backward_smem_bound(LLAMA, 0, get_gpu(gpu)) == pytest.approx(1.6)
    assert attention_core_bound(LLAMA, 0, get_gpu(gpu)) == pytest.approx(1 / 3 + 2 / 3 * 1.6)
    assert backward_smem_bound(DEEPSEEK, 3, get_gpu(gpu)) == pytest.approx(64 / 41.6)


@pytest.mark.parametrize("gpu", ["a100", "h100", "h200", "mi300x", "mi355x"])
def test_before_blackwell_the_tensor_cores_bind_the_backward_at_head_dim_128(gpu):
    assert backward_smem_bound(LLAMA, 0, get_gpu(gpu)) == 1.0
    assert backward_smem_bound(DEEPSEEK, 3, get_gpu(gpu)) == 1.0
    assert attention_core_bound(LLAMA, 0, get_gpu(gpu)) == 1.0


def test_no_attention_no_shared_memory_bound():
    gdn_layer = next(i for i in range(QWEN3_NEXT.num_layers) if QWEN3_NEXT.is_linear_attention_layer(i))
    assert backward_smem_bound(QWEN3_NEXT, gdn_layer, get_gpu("b200")) == 1.0
    assert attention_core_bound(QWEN3_NEXT, gdn_layer, get_gpu("b200")) == 1.0
