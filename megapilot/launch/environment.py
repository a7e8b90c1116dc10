"""Environment blocks per GPU vendor: each variable with the reason it is set.

NVIDIA runs NCCL; AMD runs RCCL, which reads the same NCCL_* names, plus HSA/HIP runtime settings.
The reasons end up as comments in the rendered scripts. Values follow Megatron-LM's own assertions
(CUDA_DEVICE_MAX_CONNECTIONS), Megatron-Bridge's performance environment and Primus's base_env.sh;
the table in launch/README.md names the source of each.
"""

from __future__ import annotations

from dataclasses import dataclass

from megapilot.launch.options import LaunchOptions
from megapilot.launch.perf_flags import flex_dispatcher_backend, gpu_kernels_available, tp_comm_overlap_applies
from megapilot.spec import SavedPlan

# SMs kept free of TE's norm kernels for the userbuffers communication (Megatron-Bridge v0.3.1's
# PerfEnvPlugin: 16, or 20 with DeepEP/HybridEP).
LAYERNORM_SM_MARGIN = 16
LAYERNORM_SM_MARGIN_WITH_FLEX = 20  # the DeepEP/HybridEP kernels take SMs of their own


@dataclass(frozen=True)
class EnvVar:
    """One variable the script sets (or, with unset, removes from what the image or cluster exported)."""

    name: str
    value: str
    why: str
    unset: bool = False


# What a launch that captures CUDA graphs exports beside the allocator's expandable segments (which every NVIDIA launch
# sets): also what `optimize` adds with the graphs it offers.
GRAPH_REGISTRATION_OFF = EnvVar(
    "NCCL_GRAPH_REGISTER", "0", "no NCCL buffer registration inside CUDA graphs: beside expandable_segments:True it "
    "makes illegal memory accesses, and Megatron-LM asserts it off for captured graphs (core_v0.16.0 on)")


def launch_environment(plan: SavedPlan, options: LaunchOptions) -> list[EnvVar]:
    """The variables a launch exports, common ones first, then the vendor's, then the network's."""
    env = _common()
    env.append(_device_connections(plan, options))
    env += _amd(plan) if plan.cluster.gpu.vendor == "AMD" else _nvidia(plan, options)
    env += _network(options)
    return env


def _common() -> list[EnvVar]:
    return [
        EnvVar("OMP_NUM_THREADS", "1",
               "one OpenMP thread per rank: torchrun's default too, stated so the CPU is not oversubscribed"),
        EnvVar("TORCH_NCCL_AVOID_RECORD_STREAMS", "1",
               "free collective buffers on stream sync instead of recordStream: less memory fragmentation"),
        EnvVar("NCCL_DEBUG", "WARN", "NCCL/RCCL warnings reach the log, so a hang or link error leaves evidence"),
        EnvVar("TORCH_NCCL_HIGH_PRIORITY", "1",
               "collectives on high-priority streams, so overlapped communication is not starved by compute"),
    ]


def _device_connections(plan: SavedPlan, options: LaunchOptions) -> EnvVar:
    """CUDA_DEVICE_MAX_CONNECTIONS as Megatron-LM asserts it, else Megatron-Bridge's value."""
    p, gpu = plan.parallel, plan.cluster.gpu
    name = "CUDA_DEVICE_MAX_CONNECTIONS"
    if p.fsdp:
        return EnvVar(name, "", "Megatron-FSDP asserts it is not 1 (images often export 1): unset, so FSDP's "
                                "gather, compute and reduce streams run concurrently", unset=True)
    if gpu.vendor == "AMD":
        return EnvVar(name, "1", "one hardware queue keeps TP/CP communication kernels in issue order "
                                 "(Megatron asserts 1 with TP/CP > 1 before arch 10; Primus sets 1)")
    if gpu.architecture == "blackwell":
        return EnvVar(name, "32", "Blackwell has no single-queue requirement; 32 queues let communication "
                                  "and compute kernels run concurrently (Megatron-Bridge's B200/GB200 value)")
    if p.tp > 1 or p.cp > 1:
        return EnvVar(name, "1", "one hardware queue keeps TP/CP communication kernels in issue order, "
                                 "as Megatron asserts with TP or CP > 1 before Blackwell")
    if flex_dispatcher_backend(plan, options) is not None:
        return EnvVar(name, "32", "no TP/CP ordering to keep: 32 queues let the DeepEP/HybridEP kernels run beside "
                                  "compute (Megatron-Bridge's value with a flex backend)")
    return EnvVar(name, "8", "no TP/CP ordering to keep: 8 queues let the DP overlap run beside compute "
                             "(Megatron-Bridge's default)")


def _nvidia(plan: SavedPlan, options: LaunchOptions) -> list[EnvVar]:
    env = [
        EnvVar("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True",
               "growable allocator segments: fewer fragmentation OOMs with varying activation sizes"),
    ]
    flex = flex_dispatcher_backend(plan, options)
    if tp_comm_overlap_applies(plan, options):
        margin = LAYERNORM_SM_MARGIN_WITH_FLEX if flex else LAYERNORM_SM_MARGIN
        for direction in ("FWD", "BWD"):
            env.append(EnvVar(f"NVTE_{direction}_LAYERNORM_SM_MARGIN", str(margin),
                              f"keep {margin} SMs free of the {direction.lower()} norm kernels for "
                              "the overlapped TP communication (--tp-comm-overlap)"))
    if options.cuda_graphs is not None and gpu_kernels_available(options):
        env.append(GRAPH_REGISTRATION_OFF)
    if plan.training.precision == "nvfp4":
        env.append(EnvVar("NVTE_USE_FAST_MATH", "1", "Transformer Engine's fast-math NVFP4 casts: the Hadamard-"
                          "transformed quantisation takes an approximate reciprocal (Megatron-Bridge's NVFP4 recipes "
                          "set it)"))
    if flex == "hybridep":
        env += _hybridep(plan)
    nodes = options.nodes or plan.cluster.num_nodes
    if plan.parallel.pp > 1 and nodes > 1:
        env.append(EnvVar("NCCL_P2P_NET_CHUNKSIZE", "2097152",
                          "2 MiB chunks for pipeline send/recv over the network (Megatron-Bridge, Llama 70B/405B "
                          "with PP > 1): fewer, larger transfers"))
    return env


def _hybridep(plan: SavedPlan) -> list[EnvVar]:
    """HybridEP's NVLink domain: 8 GPUs on an HGX node, the whole rack over multi-node NVLink (GB200 NVL72)."""
    # the cluster's domain: an HGX baseboard's NVLink ends at the node when nodes hold fewer of its GPUs
    ep, domain = plan.parallel.ep, plan.cluster.scaleup_domain_gpus
    mnnvl = domain > plan.cluster.gpus_per_node
    domain = domain if mnnvl else plan.cluster.gpus_per_node
    return [
        EnvVar("NVLINK_DOMAIN_SIZE", str(domain), "GPUs HybridEP reaches over NVLink without the network"),
        EnvVar("USE_MNNVL", "1" if mnnvl else "0", "multi-node NVLink (NVL72 racks) or not"),
        EnvVar("NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN", str(min(ep, domain)),
               "expert-parallel ranks that share one NVLink domain (Megatron-Bridge: min(EP, domain))"),
    ]


def _amd(plan: SavedPlan) -> list[EnvVar]:
    env = [
        EnvVar("HSA_NO_SCRATCH_RECLAIM", "1",
               "keep kernel scratch memory allocated: reclaiming it between kernels stalls large GEMMs"),
        EnvVar("HSA_ENABLE_SDMA", "1",
               "host/device copies on the SDMA engines, not compute units (Primus base_env.sh default)"),
        EnvVar("GPU_MAX_HW_QUEUES", "2", "fewer HIP hardware queues lowers launch contention for one rank per GPU"),
        EnvVar("RCCL_MSCCL_ENABLE", "0", "MSCCL algorithms off: plain RCCL rings/trees are the tested path"),
        EnvVar("NCCL_CHECKS_DISABLE", "1", "skip RCCL's per-call argument checks (Primus base_env.sh)"),
        EnvVar("NCCL_PXN_DISABLE", "1", "no PXN relays through peer GPUs: they cost GPU memory (Primus default)"),
        EnvVar("NCCL_P2P_NET_CHUNKSIZE", "524288", "512 KiB network chunks for send/recv (Primus base_env.sh)"),
        EnvVar("PYTORCH_HIP_ALLOC_CONF", "expandable_segments:True",
               "growable allocator segments: fewer fragmentation OOMs"),
    ]
    if plan.cluster.gpu.architecture == "cdna3":
        env.append(EnvVar("NVTE_CK_IS_V3_ATOMIC_FP32", "1",
                          "CK v3 attention backward with fp32 atomics: the setting AMD uses on MI300X/MI325X"))
    if plan.training.quant_flavour == "mxfp8":
        env.append(EnvVar("NVTE_ROCM_ENABLE_MXFP8", "1",
                          "ROCm Transformer Engine's MXFP8 GEMMs are off unless asked for (Primus refuses mxfp8 "
                          "without it)"))
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
