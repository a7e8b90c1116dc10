"""Vendor environment blocks: which variables each launch exports, when, and that each says why."""

from __future__ import annotations

import pytest

from megapilot.catalog import get_gpu, get_model
from megapilot.launch.environment import LAYERNORM_SM_MARGIN, EnvVar, launch_environment
from megapilot.launch.options import LaunchOptions
from megapilot.spec import ClusterSpec, ParallelConfig, SavedPlan, TrainingSpec
from megapilot.spec.cuda_graphs import CudaGraphs
from tests.launch.plans import LLAMA31_8B, make_plan

TRAINING = TrainingSpec(seq_length=4096, global_batch_size=64)
COMMON = ["OMP_NUM_THREADS", "TORCH_NCCL_AVOID_RECORD_STREAMS", "NCCL_DEBUG", "TORCH_NCCL_HIGH_PRIORITY",
          "CUDA_DEVICE_MAX_CONNECTIONS"]
MEGATRON = LaunchOptions(mock_data=True, megatron_path="/opt/Megatron-LM")


def _names(env: list[EnvVar]) -> list[str]:
    return [var.name for var in env]


def _values(env: list[EnvVar]) -> dict[str, str | None]:
    return {var.name: None if var.unset else var.value for var in env}


def _env(gpu: str, options: LaunchOptions | None = None, nodes: int = 1, **layout: object) -> list[EnvVar]:
    plan = make_plan(LLAMA31_8B, gpu, nodes, TRAINING, **layout)
    return launch_environment(plan, options or LaunchOptions())


def test_nvidia_exports_the_common_block_then_the_cuda_allocator() -> None:
    assert _names(_env("h100")) == COMMON + ["PYTORCH_CUDA_ALLOC_CONF"]
    assert _values(_env("h100"))["TORCH_NCCL_HIGH_PRIORITY"] == "1"


def test_amd_exports_primus_hsa_hip_and_rccl_settings_instead_of_the_cuda_allocator() -> None:
    env = _values(_env("mi355x"))
    assert list(env)[:len(COMMON)] == COMMON
    assert {"HSA_NO_SCRATCH_RECLAIM", "HSA_ENABLE_SDMA", "GPU_MAX_HW_QUEUES", "RCCL_MSCCL_ENABLE",
            "NCCL_CHECKS_DISABLE", "NCCL_PXN_DISABLE", "PYTORCH_HIP_ALLOC_CONF"} <= set(env)
    assert env["HSA_ENABLE_SDMA"] == "1"  # Primus base_env.sh: copies on the SDMA engines
    assert env["NCCL_P2P_NET_CHUNKSIZE"] == "524288" and env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    assert "PYTORCH_CUDA_ALLOC_CONF" not in env


def test_the_ck_attention_atomics_setting_is_only_for_cdna3() -> None:
    assert "NVTE_CK_IS_V3_ATOMIC_FP32" in _names(_env("mi300x"))
    assert "NVTE_CK_IS_V3_ATOMIC_FP32" in _names(_env("mi325x"))
    assert "NVTE_CK_IS_V3_ATOMIC_FP32" not in _names(_env("mi355x"))  # cdna4


def test_mxfp8_on_amd_unlocks_rocm_transformer_engines_mxfp8_gemms() -> None:
    mxfp8 = make_plan(LLAMA31_8B, "mi355x", 1, TRAINING.model_copy(update={"precision": "mxfp8"}))
    assert _values(launch_environment(mxfp8, LaunchOptions()))["NVTE_ROCM_ENABLE_MXFP8"] == "1"
    assert "NVTE_ROCM_ENABLE_MXFP8" not in _names(_env("mi355x"))  # bf16: left to the image


def test_nvfp4_takes_transformer_engines_fast_math_casts_as_the_recipes_do() -> None:
    nvfp4 = make_plan(LLAMA31_8B, "b200", 1, TRAINING.model_copy(update={"precision": "nvfp4"}))
    assert _values(launch_environment(nvfp4, LaunchOptions()))["NVTE_USE_FAST_MATH"] == "1"
    mxfp8 = make_plan(LLAMA31_8B, "b200", 1, TRAINING.model_copy(update={"precision": "mxfp8"}))
    assert "NVTE_USE_FAST_MATH" not in _names(launch_environment(mxfp8, LaunchOptions()))


def test_cuda_graphs_come_with_nccls_graph_registration_off_as_megatron_asserts() -> None:
    """Megatron-LM (core_v0.16.0 on) asserts NCCL_GRAPH_REGISTER=0 for captured graphs when the allocator has
    expandable segments, which every NVIDIA launch sets: without it the launch stops in argument validation."""
    graphs = MEGATRON.model_copy(update={"cuda_graphs": CudaGraphs(impl="transformer_engine", scope=("attn",))})
    env = _values(_env("h100", graphs, tp=2))
    assert env["NCCL_GRAPH_REGISTER"] == "0" and "expandable_segments:True" in (env["PYTORCH_CUDA_ALLOC_CONF"] or "")
    assert "NCCL_GRAPH_REGISTER" not in _names(_env("h100", MEGATRON, tp=2))  # eager: NCCL's default
    cpu = LaunchOptions(mock_data=True, entrypoint="megapilot", cpu=True, cuda_graphs=CudaGraphs(impl="local"))
    assert "NCCL_GRAPH_REGISTER" not in _names(_env("h100", cpu))  # no graph runs in the embedded trainer


def test_megatron_fsdp_unsets_cuda_device_max_connections() -> None:
    var = next(v for v in _env("h100", fsdp=True) if v.name == "CUDA_DEVICE_MAX_CONNECTIONS")
    assert var.unset and "FSDP" in var.why


@pytest.mark.parametrize(("gpu", "layout", "connections"), [
    ("h100", {"tp": 2}, "1"),   # Megatron asserts 1 with TP > 1 before Blackwell
    ("a100", {"cp": 2}, "1"),   # and with CP > 1
    ("h100", {}, "8"),          # no TP/CP: Megatron-Bridge's default
    ("b200", {"tp": 2}, "32"),  # Blackwell: no constraint, Bridge uses 32
])
def test_cuda_device_max_connections_follows_megatrons_rule(gpu: str, layout: dict[str, int],
                                                            connections: str) -> None:
    assert _values(_env(gpu, **layout))["CUDA_DEVICE_MAX_CONNECTIONS"] == connections


def test_layernorm_sm_margins_come_with_tp_communication_overlap_only() -> None:
    margins = {"NVTE_FWD_LAYERNORM_SM_MARGIN", "NVTE_BWD_LAYERNORM_SM_MARGIN"}
    with_overlap = _values(_env("h100", MEGATRON, tp=2, sequence_parallel=True))
    assert {name: with_overlap[name] for name in margins} == dict.fromkeys(margins, str(LAYERNORM_SM_MARGIN))
    assert not margins & set(_names(_env("h100", MEGATRON, tp=2)))  # no SP: no TP overlap
    assert not margins & set(_names(_env("h100", MEGATRON)))  # TP 1
    embedded = LaunchOptions(mock_data=True, entrypoint="megapilot")
    assert not margins & set(_names(_env("h100", embedded, tp=2, sequence_parallel=True)))  # no TE kernels there


def test_p2p_network_chunks_only_when_pipeline_stages_cross_nodes() -> None:
    assert _values(_env("h100", nodes=2, pp=2))["NCCL_P2P_NET_CHUNKSIZE"] == "2097152"
    assert "NCCL_P2P_NET_CHUNKSIZE" not in _names(_env("h100", nodes=2))  # PP 1
    assert "NCCL_P2P_NET_CHUNKSIZE" not in _names(_env("h100", pp=2))  # one node: NVLink, no network


@pytest.mark.parametrize("gpu", ["h100", "b200", "mi300x", "mi355x"])
def test_every_variable_has_a_reason_and_a_name_given_once(gpu: str) -> None:
    env = _env(gpu, LaunchOptions(network_interface="ens1f0", ib_hca="mlx5_0,mlx5_1"), tp=2, sequence_parallel=True)
    assert len(set(_names(env))) == len(env)
    for var in env:
        assert var.name.isupper() and (var.value or var.unset), var
        assert len(var.why) > 20 and "\n" not in var.why, var.name


def test_network_variables_only_when_an_interface_or_hca_is_given() -> None:
    assert not {"NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_IB_HCA"} & set(_names(_env("h100")))
    env = {v.name: v.value for v in _env("h100", LaunchOptions(network_interface="ens1f0", ib_hca="mlx5_0"))}
    assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == "ens1f0"
    assert env["NCCL_IB_HCA"] == "mlx5_0"
    only_hca = _names(_env("h100", LaunchOptions(ib_hca="mlx5_0")))
    assert "NCCL_IB_HCA" in only_hca and "NCCL_SOCKET_IFNAME" not in only_hca
    assert _names(_env("h100", LaunchOptions(ib_hca="mlx5_0")))[-1] == "NCCL_IB_HCA"  # the network comes last


def test_hybridep_on_nodes_smaller_than_the_baseboard_keeps_to_the_node() -> None:
    """B200 nodes of 4 GPUs: NVLink ends at the node, so HybridEP's domain is the node and no multi-node NVLink is
    claimed (that is an NVL72 rack's, GB200)."""
    cluster = ClusterSpec(gpu=get_gpu("b200"), num_nodes=4, gpus_per_node=4)
    plan = SavedPlan(model=get_model("mixtral-8x7b"), cluster=cluster, training=TRAINING,
                     parallel=ParallelConfig.for_world(cluster.world_size, ep=8, etp=1))
    env = _values(launch_environment(plan, MEGATRON.model_copy(update={"moe_flex_dispatcher": "hybridep"})))
    assert (env["USE_MNNVL"], env["NVLINK_DOMAIN_SIZE"], env["NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN"]) == \
        ("0", "4", "4")

