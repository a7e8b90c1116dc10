"""Vendor environment blocks: which variables each launch exports, and that each says why."""

from __future__ import annotations

import pytest

from megapilot.launch.environment import EnvVar, launch_environment
from megapilot.launch.options import LaunchOptions
from megapilot.spec import TrainingSpec
from tests.launch.plans import LLAMA31_8B, make_plan

TRAINING = TrainingSpec(seq_length=4096, global_batch_size=64)
COMMON = ["OMP_NUM_THREADS", "TORCH_NCCL_AVOID_RECORD_STREAMS", "NCCL_DEBUG", "CUDA_DEVICE_MAX_CONNECTIONS"]


def _names(env: list[EnvVar]) -> list[str]:
    return [var.name for var in env]


def _env(gpu: str, options: LaunchOptions | None = None, **layout) -> list[EnvVar]:
    return launch_environment(make_plan(LLAMA31_8B, gpu, 1, TRAINING, **layout), options or LaunchOptions())


def test_nvidia_exports_the_common_block_then_the_cuda_allocator():
    assert _names(_env("h100")) == COMMON + ["PYTORCH_CUDA_ALLOC_CONF"]


def test_amd_exports_hsa_hip_and_rccl_settings_instead_of_the_cuda_allocator():
    names = _names(_env("mi355x"))
    assert names[:len(COMMON)] == COMMON
    assert {"HSA_NO_SCRATCH_RECLAIM", "HSA_ENABLE_SDMA", "GPU_MAX_HW_QUEUES", "TORCH_NCCL_HIGH_PRIORITY",
            "RCCL_MSCCL_ENABLE", "PYTORCH_HIP_ALLOC_CONF"} <= set(names)
    assert "PYTORCH_CUDA_ALLOC_CONF" not in names


def test_the_ck_attention_atomics_setting_is_only_for_cdna3():
    assert "NVTE_CK_IS_V3_ATOMIC_FP32" in _names(_env("mi300x"))
    assert "NVTE_CK_IS_V3_ATOMIC_FP32" in _names(_env("mi325x"))
    assert "NVTE_CK_IS_V3_ATOMIC_FP32" not in _names(_env("mi355x"))  # cdna4


def test_megatron_fsdp_drops_cuda_device_max_connections():
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in _names(_env("h100", fsdp=True))


@pytest.mark.parametrize("gpu", ["h100", "b200", "mi300x", "mi355x"])
def test_every_variable_has_a_reason_and_a_name_given_once(gpu):
    env = _env(gpu, LaunchOptions(network_interface="ens1f0", ib_hca="mlx5_0,mlx5_1"))
    assert len(set(_names(env))) == len(env)
    for var in env:
        assert var.name.isupper() and var.value, var
        assert len(var.why) > 20 and "\n" not in var.why, var.name


def test_network_variables_only_when_an_interface_or_hca_is_given():
    assert not {"NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_IB_HCA"} & set(_names(_env("h100")))
    env = {v.name: v.value for v in _env("h100", LaunchOptions(network_interface="ens1f0", ib_hca="mlx5_0"))}
    assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == "ens1f0"
    assert env["NCCL_IB_HCA"] == "mlx5_0"
    only_hca = _names(_env("h100", LaunchOptions(ib_hca="mlx5_0")))
    assert "NCCL_IB_HCA" in only_hca and "NCCL_SOCKET_IFNAME" not in only_hca
    assert _names(_env("h100", LaunchOptions(ib_hca="mlx5_0")))[-1] == "NCCL_IB_HCA"  # the network comes last
