"""Environment blocks per GPU vendor: each variable with the reason it is set.

NVIDIA runs NCCL; AMD runs RCCL, which reads the same NCCL_* names, plus HSA/HIP runtime settings.
The reasons end up as comments in the rendered scripts.
"""

from __future__ import annotations

from dataclasses import dataclass

from megapilot.launch.options import LaunchOptions
from megapilot.spec import ParallelConfig, SavedPlan


@dataclass(frozen=True)
class EnvVar:
    name: str
    value: str
    why: str


def launch_environment(plan: SavedPlan, options: LaunchOptions) -> list[EnvVar]:
    """The variables a launch exports, common ones first, then the vendor's, then the network's."""
    env = _common(plan.parallel)
    env += _amd(plan) if plan.cluster.gpu.vendor == "AMD" else _nvidia()
    env += _network(options)
    return env


def _common(p: ParallelConfig) -> list[EnvVar]:
    env = [
        EnvVar("OMP_NUM_THREADS", "1",
               "one OpenMP thread per rank: torchrun's default too, stated so the CPU is not oversubscribed"),
        EnvVar("TORCH_NCCL_AVOID_RECORD_STREAMS", "1",
               "free collective buffers on stream sync instead of recordStream: less memory fragmentation"),
        EnvVar("NCCL_DEBUG", "WARN", "NCCL/RCCL warnings reach the log, so a hang or link error leaves evidence"),
    ]
    if not p.fsdp:  # Megatron-FSDP refuses CUDA_DEVICE_MAX_CONNECTIONS=1
        env.append(EnvVar(
            "CUDA_DEVICE_MAX_CONNECTIONS", "1",
            "one hardware queue keeps TP/SP communication kernels in issue order, as Megatron expects for overlap",
        ))
    return env


def _nvidia() -> list[EnvVar]:
    return [
        EnvVar("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True",
               "growable allocator segments: fewer fragmentation OOMs with varying activation sizes"),
    ]


def _amd(plan: SavedPlan) -> list[EnvVar]:
    env = [
        EnvVar("HSA_NO_SCRATCH_RECLAIM", "1",
               "keep kernel scratch memory allocated: reclaiming it between kernels stalls large GEMMs"),
        EnvVar("HSA_ENABLE_SDMA", "0",
               "copy with blit kernels instead of the SDMA engines, the setting RCCL is tuned and tested with"),
        EnvVar("GPU_MAX_HW_QUEUES", "2", "fewer HIP hardware queues lowers launch contention for one rank per GPU"),
        EnvVar("TORCH_NCCL_HIGH_PRIORITY", "1", "RCCL streams at high priority so collectives overlap compute"),
        EnvVar("RCCL_MSCCL_ENABLE", "0", "MSCCL algorithms off: plain RCCL rings/trees are the tested path"),
        EnvVar("PYTORCH_HIP_ALLOC_CONF", "expandable_segments:True",
               "growable allocator segments: fewer fragmentation OOMs"),
    ]
    if plan.cluster.gpu.architecture == "cdna3":
        env.append(EnvVar("NVTE_CK_IS_V3_ATOMIC_FP32", "1",
                          "CK v3 attention backward with fp32 atomics: the setting AMD uses on MI300X/MI325X"))
    return env


def _network(o: LaunchOptions) -> list[EnvVar]:
    env: list[EnvVar] = []
    if o.network_interface:
        env.append(EnvVar("NCCL_SOCKET_IFNAME", o.network_interface,
                          "bootstrap NCCL/RCCL over this interface, not docker0 or lo"))
        env.append(EnvVar("GLOO_SOCKET_IFNAME", o.network_interface, "same interface for Gloo groups"))
    if o.ib_hca:
        env.append(EnvVar("NCCL_IB_HCA", o.ib_hca, "use only these RDMA adapters (the GPU-attached ones)"))
    return env
