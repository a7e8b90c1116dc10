"""Performance flags the published recipes add on top of a correct layout, each where it applies.

Every flag here changes speed or robustness, never the model or its numerics beyond what the
precision already chose. Each one is emitted only when its conditions hold (GPU vendor and
generation, Transformer Engine present, the TP/PP/CP/EP sizes, MoE, precision, launcher) and
comes as its own one-flag section whose title is the reason, so the script says why it is there.
The rules and the recipes they follow are tabled in `megapilot/launch/README.md`.

The predicates (`tp_comm_overlap_applies`, ...) are shared with the environment block and the
checkpoint section, so a flag and the variable or format it needs cannot drift apart.
"""

from __future__ import annotations

import math
import re

from megapilot.errors import MegapilotError
from megapilot.estimate.memory import GIB, PARAM_BYTES, shard_params
from megapilot.estimate.params import count_params
from megapilot.estimate.quantization import keeps_fp8_primary_weights
from megapilot.launch.megatron_args import FlagTable
from megapilot.launch.options import LaunchOptions
from megapilot.launch.sections import ArgSection
from megapilot.spec import (
    ParallelConfig,
    SavedPlan,
    flex_backend_refusal,
    flex_dispatcher_refusal,
    moe_a2a_overlap_refusal,
)
from megapilot.spec.cuda_graphs import CudaGraphs, cuda_graph_refusal, one_word_scope, pads_routing_for_quantization
from megapilot.spec.validate import KEEP_ALLTOALL, tp_comm_overlap_runs

# Megatron's own default for --distributed-timeout-minutes; what one node needs.
BASE_TIMEOUT_MIN = 10
# Nodes per extra minute of timeout: NCCL builds its communicators lazily, at the first collective of
# each group, and the slowest node's start-up lag grows with the node count.
NODES_PER_EXTRA_TIMEOUT_MIN = 16
# Checkpoint bytes per parameter: bf16 weights (2) + fp32 main copy (4) + Adam moments (8).
CHECKPOINT_BYTES_PER_PARAM = 14
# Write bandwidth assumed per node for checkpoints (a shared parallel file system under load). Every
# rank waits in the save barrier while the slowest node writes its share.
CHECKPOINT_WRITE_GBPS_PER_NODE = 0.5
# Iterations between manual garbage collections (Megatron-Bridge's benchmark default; moe/README says 100).
MANUAL_GC_INTERVAL = 100
# Least time kept between Megatron's own exit and the SLURM kill.
MIN_EXIT_MARGIN_MIN = 10


def gpu_kernels_available(options: LaunchOptions) -> bool:
    """Megatron-LM (or Primus) on GPUs with Transformer Engine: the fused kernels these flags select exist.

    The embedded trainer and CPU runs have none of them (local layers, no TE).
    """
    return not options.cpu and options.entrypoint == "megatron"


def tp_comm_overlap_applies(plan: SavedPlan, options: LaunchOptions) -> bool:
    """TE userbuffers overlap of the TP all-gather/reduce-scatter with the GEMMs, where it runs
    (`spec.validate.tp_comm_overlap_runs`) and Transformer Engine is there."""
    return gpu_kernels_available(options) and tp_comm_overlap_runs(plan.cluster.gpu, plan.parallel,
                                                                   plan.training.precision)


# The block-scaled formats whose runs leave the param gather out of the optimizer step: the MXFP8 weights' gather
# reuses the gradient buffer (--reuse-grad-buf-for-mxfp8-param-ag), which Megatron-LM refills with the parameters
# only once the step has zeroed it (training.py, core_v0.16.0), and Megatron-Bridge's performance scripts turn the
# overlap off for fp8_mx and nvfp4 ("causes NaN grad norm for fp8_mx", scripts/performance/utils/overrides.py).
NO_OPTIMIZER_STEP_GATHER = ("mxfp8", "nvfp4")


def param_gather_overlaps_optimizer_step(plan: SavedPlan, options: LaunchOptions) -> bool:
    """--overlap-param-gather-with-optimizer-step: Megatron asserts the distributed optimizer (not FSDP),
    the param-gather overlap, interleaved PP and a non-distributed checkpoint format, so it is used only
    when the run reads and writes no checkpoint (the format is then moot and set to `torch`); never in MXFP8 or
    NVFP4 (`NO_OPTIMIZER_STEP_GATHER`)."""
    p = plan.parallel
    return (gpu_kernels_available(options) and p.distributed_optimizer and not p.fsdp and p.vpp > 1
            and options.save is None and options.load is None
            and plan.training.precision not in NO_OPTIMIZER_STEP_GATHER)


def fp8_param_gather_applies(plan: SavedPlan, options: LaunchOptions) -> bool:
    """Keep the weights in FP8 for the all-gather (half the bytes of bf16): Megatron asserts the
    distributed optimizer or an FSDP; Bridge's fp8_cs and fp8_mx presets switch it on (fp8_sc does not)."""
    p = plan.parallel
    return gpu_kernels_available(options) and keeps_fp8_primary_weights(
        plan.training.precision, plan.cluster.gpu.architecture, sharded_optimizer=p.distributed_optimizer or p.fsdp)


def meta_device_init_needed(plan: SavedPlan) -> bool:
    """Build the model on the meta device when one rank's unsharded bf16 weights exceed half its HBM.

    Without it each rank materialises its whole TP/PP/EP shard of the weights before Megatron-FSDP
    shards them over DP; half the HBM leaves room for FSDP's own sharded buffers being built beside them.
    """
    p = plan.parallel
    if not p.fsdp:
        return False
    held = max((shard_params(plan.model, p, stage) for stage in range(p.pp)),
               key=lambda s: s.dense + s.replicated + s.expert)
    unsharded_gib = (held.dense + held.replicated + held.expert) * PARAM_BYTES / GIB
    return unsharded_gib > plan.cluster.gpu.hbm_gib / 2


def flex_dispatcher_backend(plan: SavedPlan, options: LaunchOptions) -> str | None:
    """The flex dispatcher backend asked for, once it is known to apply; a request that cannot run is refused.

    DeepEP/HybridEP are separate libraries in the image, so they are used only when asked for. Megatron's
    flex dispatcher asserts TP x EP > 1; Bridge gates DeepEP to B200-class Blackwell (not the NVL72
    GB200/GB300, where only HybridEP spans the rack's NVLink domain).
    """
    backend = options.moe_flex_dispatcher
    if backend is None:
        return None
    field = "moe_flex_dispatcher"
    if plan.model.moe is None:
        raise MegapilotError(f"{plan.model.name} has no experts to dispatch", field=field, fix=KEEP_ALLTOALL)
    if not gpu_kernels_available(options):
        raise MegapilotError(f"the {backend} flex dispatcher runs only in Megatron-LM on NVIDIA GPUs", field=field,
                             fix=KEEP_ALLTOALL)
    if (unavailable := flex_backend_refusal(backend, plan.cluster, plan.model)) is not None:
        raise unavailable
    if (refusal := flex_dispatcher_refusal(plan.parallel)) is not None:
        raise MegapilotError(refusal, field=field, fix=KEEP_ALLTOALL)
    return backend


def a2a_overlap_applies(plan: SavedPlan, options: LaunchOptions) -> bool:
    """The expert all-to-all overlap asked for, in Megatron-LM, on a layout Megatron-Core allows it on."""
    return options.moe_a2a_overlap and gpu_kernels_available(options) and \
        moe_a2a_overlap_refusal(plan.model, plan.parallel) is None


def a2a_overlap_note(plan: SavedPlan, options: LaunchOptions) -> str | None:
    """Why an all-to-all overlap asked for is left out of the script (None when it is in, or not asked for)."""
    if not options.moe_a2a_overlap or a2a_overlap_applies(plan, options):
        return None
    refusal = moe_a2a_overlap_refusal(plan.model, plan.parallel) or "the embedded trainer and CPU runs have none"
    return f"--overlap-moe-expert-parallel-comm left out: {refusal}"


# The first release whose --cuda-graph-scope takes a list of scopes (moe_router, moe_preprocess, ...): before it
# a single word (attn, full, full_iteration). core_v0.18.0 renames it --cuda-graph-modules (the old name migrates,
# with a warning) and takes the whole iteration as --cuda-graph-impl full_iteration.
CUDA_GRAPH_LIST_RELEASE = "core_v0.16.0"


def cuda_graph_sections(plan: SavedPlan, options: LaunchOptions, table: FlagTable) -> list[ArgSection]:
    """The CUDA graphs asked for, in `table`'s release's words; refused where Megatron-Core refuses them for this
    model and layout (`cuda_graph_refusal`) or the release cannot say the scope. None on CPUs or in the embedded
    trainer (`cuda_graphs_note` says so)."""
    graphs = options.cuda_graphs
    if graphs is None or not gpu_kernels_available(options):
        return []
    refusal = cuda_graph_refusal(plan.model, plan.parallel, graphs,
                                 flex_dispatcher=flex_dispatcher_backend(plan, options) is not None,
                                 router_padding=pads_routing_for_quantization(plan.model, plan.training),
                                 a2a_overlap=a2a_overlap_applies(plan, options))
    if refusal is not None:
        raise MegapilotError(f"CUDA graphs ({graphs.describe()}): {refusal}", field="cuda_graph_scope",
                             fix="change the scope or the layout as it says, or leave --cuda-graph-impl out")
    return [cuda_graph_section(graphs, plan.parallel, table)]


def cuda_graph_section(graphs: CudaGraphs, parallel: ParallelConfig, table: FlagTable) -> ArgSection:
    """`graphs` in `table`'s release's words, with what Megatron asserts beside them: what `megapilot script` writes,
    and the words diagnose's and optimize's CUDA-graph changes are said in for a log's release. Whether the model
    and layout allow the graphs at all is the caller's (`cuda_graph_refusal`); a release that cannot say them is a
    MegapilotError naming it."""
    scope_flag = table.flags.get("--cuda-graph-scope")
    if "--cuda-graph-modules" not in table.flags and (scope_flag is None or not scope_flag.takes_many):
        return _one_word_cuda_graph_section(parallel, graphs, table)
    section = _cuda_graph_section(graphs)
    whole_iteration = "full_iteration" in graphs.scope
    if whole_iteration and "--cuda-graph-modules" in table.flags:
        section.add("--cuda-graph-impl", "full_iteration")
    else:
        section.add("--cuda-graph-impl", graphs.impl)
        if graphs.scope:
            scope_name = "--cuda-graph-modules" if "--cuda-graph-modules" in table.flags else "--cuda-graph-scope"
            section.add(scope_name, *graphs.scope)
    _add_cuda_graph_companions(section, parallel, graphs, table)
    return section


def _one_word_cuda_graph_section(parallel: ParallelConfig, graphs: CudaGraphs, table: FlagTable) -> ArgSection:
    """The graphs in a release before core_v0.16.0's lists: one scope word, the implementation named by
    --cuda-graph-impl (core_v0.15) or by --enable-cuda-graph / --external-cuda-graph (core_v0.14)."""
    impl_flag = "--cuda-graph-impl" in table.flags
    word, refusal = one_word_scope(graphs, parallel, impl_flag=impl_flag)
    if word is None:
        raise MegapilotError(f"Megatron-LM {table.label()} cannot run these CUDA graphs ({graphs.describe()}): "
                             f"{refusal}", field="megatron_version",
                             fix=f"--megatron-version {CUDA_GRAPH_LIST_RELEASE} (or newer), change the scope or "
                                 "recompute as it says, or leave --cuda-graph-impl out")
    section = _cuda_graph_section(graphs)
    if impl_flag:
        section.add("--cuda-graph-impl", graphs.impl)
    else:
        section.add("--enable-cuda-graph" if graphs.impl == "local" else "--external-cuda-graph")
    if word != "full":  # the flag's default
        section.add("--cuda-graph-scope", word)
    _add_cuda_graph_companions(section, parallel, graphs, table)
    return section


def _cuda_graph_section(graphs: CudaGraphs) -> ArgSection:
    return ArgSection(f"performance: CUDA graphs ({graphs.describe()}) replay the captured kernels without a host "
                      "launch each; Transformer Engine's RNG tracker keeps their dropout streams graph-safe")


def _add_cuda_graph_companions(section: ArgSection, parallel: ParallelConfig, graphs: CudaGraphs,
                               table: FlagTable) -> None:
    """What Megatron asserts beside the graphs, in every release that has the flag."""
    section.add("--te-rng-tracker")
    if "full_iteration" in graphs.scope:  # Megatron asserts it: the check's host sync cannot sit inside the step
        section.add("--no-check-for-nan-in-loss-and-grad")
    pad_flag = "--moe-pad-experts-for-cuda-graph-inference"
    if graphs.impl == "local" and parallel.ep > 1 and pad_flag in table.flags:  # asserted from core_v0.16.0
        section.add(pad_flag)


def cuda_graphs_note(options: LaunchOptions) -> str | None:
    """Why graphs asked for are left out of the script (None when they are in, or not asked for)."""
    if options.cuda_graphs is None or gpu_kernels_available(options):
        return None
    return "--cuda-graph-impl left out: the embedded trainer and CPU runs have no CUDA graphs"


def performance_sections(plan: SavedPlan, options: LaunchOptions) -> list[ArgSection]:
    """The recipe-grade flags that apply to this plan and launch, each in a section titled by its reason."""
    sections: list[ArgSection] = []
    kernels = gpu_kernels_available(options)
    if tp_comm_overlap_applies(plan, options):
        sections.append(_one("performance: overlap TP all-gather/reduce-scatter with the GEMMs "
                             "(TE userbuffers; needs SP)", "--tp-comm-overlap"))
    if param_gather_overlaps_optimizer_step(plan, options):
        sections.append(_one("performance: start the next step's param all-gather during the optimizer step "
                             "(interleaved PP, no checkpoint format constraint: this run saves none)",
                             "--overlap-param-gather-with-optimizer-step"))
    if kernels:
        # Megatron's own fused kernel, not TE's: Megatron-LM disabled TE's "due to stability issues" and asserts
        # it off from core_v0.18.2 on (arguments.py, ModelParallelConfig); its MoE README now names native.
        sections.append(_one("performance: fused vocab-parallel cross entropy (Megatron's native kernel; "
                             "Megatron-LM disabled TE's for stability)",
                             "--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl", "native"))
        sections.append(_one("performance: TE/flash attention builds the causal mask itself; the dataloader "
                             "need not make a seq x seq mask per sample", "--no-create-attention-mask-in-dataloader"))
    if kernels and plan.model.moe is not None and plan.cluster.gpu.vendor == "NVIDIA":
        sections.append(_one("performance: fused token permute/unpermute around the experts (TE >= 2.1)",
                             "--moe-permute-fusion"))
    backend = flex_dispatcher_backend(plan, options)
    if backend is not None:
        sections.append(_one(f"performance: MoE tokens through the flex dispatcher's fused {backend} all-to-all "
                             "(fewer copies than alltoall; needs the library in the image)",
                             "--moe-flex-dispatcher-backend", backend))
    if a2a_overlap_applies(plan, options):
        sections.append(_one("performance: the expert all-to-all of one micro-batch runs under another's compute "
                             "(the weight gradients wait to make room; with --overlap-grad-reduce, TE >= 2.8)",
                             "--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute"))
    if not options.cpu:
        sections.append(_one(f"performance: Python GC only every {MANUAL_GC_INTERVAL} steps, in step with all "
                             "ranks (a rank collecting on its own stalls every collective)",
                             "--manual-gc", "--manual-gc-interval", MANUAL_GC_INTERVAL))
    sections += _runtime_sections(plan, options)
    return sections


def _runtime_sections(plan: SavedPlan, options: LaunchOptions) -> list[ArgSection]:
    sections = []
    cache = data_cache_path(options)
    if cache is not None:
        sections.append(_one("data: index caches written here, not beside a shared (often read-only) dataset",
                             "--data-cache-path", cache))
    if not options.cpu:
        minutes = distributed_timeout_minutes(plan, options)
        sections.append(_one(f"runtime: collective timeout {minutes} min = {BASE_TIMEOUT_MIN} + 1 per "
                             f"{NODES_PER_EXTRA_TIMEOUT_MIN} nodes beyond {NODES_PER_EXTRA_TIMEOUT_MIN} + one "
                             f"checkpoint write at "
                             f"{CHECKPOINT_WRITE_GBPS_PER_NODE} GB/s per node", "--distributed-timeout-minutes",
                             minutes))
    exit_min = exit_duration_minutes(plan, options)
    if exit_min is not None:
        sections.append(_one(f"runtime: save and exit after {exit_min} min, before the SLURM limit "
                             f"{options.time_limit} kills the job", "--exit-duration-in-mins", exit_min))
    return sections


def _one(reason: str, flag: str, *values: object) -> ArgSection:
    section = ArgSection(reason)
    section.add(flag, *values)
    return section


def data_cache_path(options: LaunchOptions) -> str | None:
    """Where Megatron writes its dataset index caches: asked for, else under the checkpoint directory.

    Megatron's default is a `cache/` folder beside the dataset, which fails on a read-only data share
    and races between jobs reading the same data. Mock data builds no cache.
    """
    if options.data_path is None:
        return None
    if options.data_cache_path is not None:
        return options.data_cache_path
    if options.save is not None:
        return options.save.rstrip("/") + "/data-cache"
    return None


def checkpoint_write_minutes(plan: SavedPlan, options: LaunchOptions) -> float:
    """Minutes for the slowest node to write its share of one checkpoint (0 when nothing is saved)."""
    if options.save is None:
        return 0.0
    nodes = options.nodes or plan.cluster.num_nodes
    total_bytes = count_params(plan.model).total * CHECKPOINT_BYTES_PER_PARAM
    return total_bytes / nodes / (CHECKPOINT_WRITE_GBPS_PER_NODE * 1e9) / 60


def distributed_timeout_minutes(plan: SavedPlan, options: LaunchOptions) -> int:
    """Megatron's 10 min, plus a minute per 16 nodes beyond 16, plus one checkpoint write: every rank waits in
    the save's barrier while the slowest node writes, and a timeout there kills a healthy job."""
    nodes = options.nodes or plan.cluster.num_nodes
    extra_for_scale = math.ceil(nodes / NODES_PER_EXTRA_TIMEOUT_MIN) - 1
    return BASE_TIMEOUT_MIN + extra_for_scale + math.ceil(checkpoint_write_minutes(plan, options))


def exit_duration_minutes(plan: SavedPlan, options: LaunchOptions) -> int | None:
    """--exit-duration-in-mins for a SLURM job that saves: the time limit less a margin for the last step
    and the checkpoint write (the larger of 10 min, 5 % of the limit and the write time + 5 min).

    None when it does not apply: not SLURM, nothing saved, the embedded trainer (no such flag), or a
    limit too short to leave the margin.
    """
    if options.launcher != "slurm" or options.save is None or options.entrypoint != "megatron":
        return None
    limit = slurm_time_limit_minutes(options.time_limit)
    if limit is None:  # no limit: nothing to exit before
        return None
    margin = max(MIN_EXIT_MARGIN_MIN, math.ceil(0.05 * limit), math.ceil(checkpoint_write_minutes(plan, options)) + 5)
    return limit - margin if limit - margin >= margin else None


_SLURM_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")
_SLURM_NO_LIMIT = frozenset({"unlimited", "infinite"})  # sbatch(1): either word, or 0, asks for no limit


def slurm_time_limit_minutes(text: str) -> int | None:
    """sbatch --time in minutes; None for no limit (UNLIMITED, INFINITE or 0). Formats (sbatch(1)): M, M:S, H:M:S,
    D-H, D-H:M, D-H:M:S."""
    if text.strip().lower() in _SLURM_NO_LIMIT:
        return None
    match = _SLURM_TIME.match(text.strip())
    if not match:
        raise MegapilotError(f"{text!r} is not a SLURM time limit", field="time_limit",
                             fix="use HH:MM:SS or D-HH:MM:SS, e.g. --time 04:00:00 (or UNLIMITED)")
    days, first, second, third = match.groups()
    if days is not None:  # D-H, D-H:M, D-H:M:S
        hours, minutes, seconds = int(first), int(second or 0), int(third or 0)
    elif third is not None:  # H:M:S
        hours, minutes, seconds = int(first), int(second), int(third)
    else:  # M or M:S
        hours, minutes, seconds = 0, int(first), int(second or 0)
    total = int(days or 0) * 24 * 60 + hours * 60 + minutes + math.ceil(seconds / 60)
    return total or None
