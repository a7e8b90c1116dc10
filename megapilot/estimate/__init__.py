"""Estimators: parameters, FLOPs, memory and step time of one layout. Pure functions, no I/O.

Public API:
- `estimate(model, cluster, training, parallel) -> EstimateResult` — validates the layout first
  (its warnings are carried), then memory + step time; what `megapilot estimate --json` prints.
- `estimate_case(flags) -> (Case, EstimateResult)` — layout flags as a user types them, a layout printed without
  its pipeline split priced with the balanced one: what `megapilot estimate` answers.
- `estimate_fast(model, cluster, training, parallel, options) -> FastEstimate` — the same numbers as
  plain dataclasses, no validation and no pydantic construction: the planner's inner loop.
- building blocks: `flops_per_step`, `flops_per_token`, `memory_per_gpu`, `step_time`, `count_params`,
  `build_case` (layout flags -> specs).

Conventions: FLOPs follow Megatron-LM's `num_floating_point_operations` (causal attention halved,
GEMMs only, no recompute); MFU = model FLOPs / (step time x world x dense peak of the precision);
memory is the most-loaded GPU in GiB (see `memory.py` for what the default mode adds to Megatron's
formula).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from megapilot.case_flags import SPLIT_FIELDS
from megapilot.errors import MegapilotError
from megapilot.estimate.cases import (
    Case,
    CaseFeatures,
    CaseFlags,
    build_case,
    case_from,
    cross_domain_flex_backend,
    run_options,
    with_features,
)
from megapilot.estimate.efficiency import CALIBRATED, EfficiencyParams
from megapilot.estimate.flops import FLOP_CONVENTIONS, FlopConvention, flops_per_step, flops_per_token
from megapilot.estimate.memory import HostOffload, MemoryBreakdown, host_offload, memory_per_gpu
from megapilot.estimate.params import ParamBreakdown, count_params
from megapilot.estimate.step_time import BREAKDOWN_TERMS, EstimateOptions, StepTime, step_time
from megapilot.spec.hardware import ClusterSpec
from megapilot.spec.model import ModelSpec
from megapilot.spec.parallel import ParallelConfig
from megapilot.spec.pipeline import NoPipelineSplit
from megapilot.spec.plan_file import EstimateResult, MemoryGiB, ParamCounts
from megapilot.spec.training import Optimizer, TrainingSpec
from megapilot.spec.validate import bf16_gradients_would_change, most_offloaded_layers, validate_layout

__all__ = [
    "BREAKDOWN_TERMS",
    "CALIBRATED",
    "FLOP_CONVENTIONS",
    "LOW_HEADROOM_FRACTION",
    "Case",
    "CaseFeatures",
    "CaseFlags",
    "EfficiencyParams",
    "EstimateOptions",
    "FastEstimate",
    "FlopConvention",
    "MemoryBreakdown",
    "ParamBreakdown",
    "StepTime",
    "build_case",
    "case_from",
    "count_params",
    "cross_domain_flex_backend",
    "estimate",
    "estimate_case",
    "estimate_fast",
    "flops_per_step",
    "flops_per_token",
    "memory_per_gpu",
    "memory_savers_not_on",
    "run_options",
    "step_time",
    "to_result",
    "with_features",
]


@dataclass(frozen=True)
class FastEstimate:
    """Memory and step time of one layout, as plain dataclasses."""

    memory: MemoryBreakdown
    time: StepTime
    parallel: ParallelConfig  # the layout estimated: the memory advice names what it does not use yet
    convention: FlopConvention = "megatron"
    optimizer: Optimizer = "adam"  # which memory savers the advice may name (Muon refuses two)
    # whether the advice may name bf16 gradients: a bf16-class run on a GPU that keeps them in fp32
    fp32_gradients: bool = False
    host: HostOffload | None = None  # activation offload's host memory, with offload on
    # The widest TP the layout checks allow without --force-tp-across-nodes (the NVLink / xGMI domain or the node):
    # the memory advice offers more TP only up to it. None: no limit known.
    tp_limit: int | None = None

    @property
    def fits(self) -> bool:
        return self.memory.fits and (self.host is None or self.host.fits)


def estimate_fast(
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingSpec,
    parallel: ParallelConfig,
    options: EstimateOptions = EstimateOptions(),
    *,
    convention: FlopConvention = "megatron",
    memory: MemoryBreakdown | None = None,
) -> FastEstimate:
    """Memory + step time without layout validation (the caller guarantees a valid layout).

    `convention` only changes how FLOPs are counted for TFLOP/s and MFU ("megatron_full_attention"
    to compare with publishers of that era); the step time is the same. `memory`: this layout's
    `memory_per_gpu`, when the caller has computed it already (the planner's memory stage).
    """
    if memory is None:
        memory = memory_per_gpu(model, training, parallel, cluster.gpu.hbm_gib,
                                architecture=cluster.gpu.architecture, host_runtime_gib=cluster.gpu.host_runtime_gib)
    time = step_time(model, cluster, training, parallel, options, convention=convention)
    return FastEstimate(memory=memory, time=time, parallel=parallel, convention=convention,
                        optimizer=training.optimizer,
                        fp32_gradients=bf16_gradients_would_change(training, cluster.gpu),
                        host=host_offload(model, training, parallel, cluster.gpu.host_memory_gib),
                        tp_limit=max(cluster.gpus_per_node, cluster.scaleup_domain_gpus))


def estimate(
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingSpec,
    parallel: ParallelConfig,
    options: EstimateOptions = EstimateOptions(),
    *,
    convention: FlopConvention = "megatron",
    allow_tp_across_nodes: bool = False,
) -> EstimateResult:
    """Validate the layout (MegapilotError if Megatron would refuse it), then estimate it.

    `allow_tp_across_nodes` costs a TP group larger than a node instead of refusing it (its
    all-reduces then run at the inter-node bandwidth).
    """
    warnings = validate_layout(model, cluster, training, parallel, allow_tp_across_nodes=allow_tp_across_nodes)
    fast = estimate_fast(model, cluster, training, parallel, options, convention=convention)
    return to_result(model, fast, warnings)


def estimate_case(flags: CaseFlags, convention: str = "megatron") -> tuple[Case, EstimateResult]:
    """Flags as a user types them -> the resolved case and its estimate (MegapilotError on any bad flag or layout
    Megatron refuses), under the case's own options.

    Where the layers do not divide over PP x VPP and no split was given, the balanced split is priced (`--pp-layout
    balanced`; `estimate` says so on its assumed line): a published table prints a layout without the split its
    recipe set. `script`, which writes a command line Megatron must accept, refuses it instead. A layout wrong
    whatever its split is refused for that, not for the split; so is one whose split would leave a stage empty."""
    if convention not in FLOP_CONVENTIONS:
        raise MegapilotError(f"unknown convention {convention!r}", field="flop_convention",
                             fix=f"use one of: {', '.join(FLOP_CONVENTIONS)}")

    def priced(typed: CaseFlags) -> tuple[Case, EstimateResult]:
        case = case_from(typed)
        result = estimate(case.model, case.cluster, case.training, case.parallel, case.options,
                          convention=convention,  # type: ignore[arg-type]  # checked against FLOP_CONVENTIONS
                          allow_tp_across_nodes=case.allow_tp_across_nodes)
        split = case.parallel.pipeline_split
        if not split.is_even:  # say which split was costed (the string a balanced request resolved to)
            result = type(result).model_validate(result.model_dump() | {"pipeline_split": split.label()})
        return case, result

    try:
        return priced(flags)
    except NoPipelineSplit as refused:
        if flags.given() & set(SPLIT_FIELDS):
            raise
        try:
            case, result = priced(flags.changed({"pipeline_layout": "balanced"}))
        except MegapilotError as other:
            # The balanced split's own refusal is the split's: the one asked for is said. Any other is the layout's
            # whatever its split (EP x ETP past a stage's ranks): said first, or the fix of the split leads to it.
            raise (refused if other.field == "pipeline_layout" else other) from None
        if case.parallel.pp * case.parallel.vpp > case.model.num_layers:  # stages left empty: not a recipe's layout
            raise refused from None
        return case, result


@lru_cache(maxsize=256)
def _param_counts(model: ModelSpec) -> ParamCounts:
    counts = count_params(model)
    return ParamCounts(total=counts.total, active=counts.active, embedding=counts.embedding)


def to_result(model: ModelSpec, fast: FastEstimate, warnings: list[str] | None = None) -> EstimateResult:
    """The public `EstimateResult` of a fast estimate (numbers rounded for display stability)."""
    memory, time = fast.memory, fast.time
    all_warnings = [*(warnings or []), *_memory_warnings(memory, model, fast.parallel, fast.optimizer, fast.tp_limit,
                                                                    fp32_gradients=fast.fp32_gradients),
                    *_host_warnings(fast.host), *time.warnings]
    interval = time.tokens_interval()
    return EstimateResult(
        params=_param_counts(model),
        flops_per_step=time.model_flops_per_step,
        memory_gib=MemoryGiB(
            weights=round(memory.weights_gib, 3), gradients=round(memory.gradients_gib, 3),
            optimizer=round(memory.optimizer_gib, 3), activations=round(memory.activations_gib, 3),
            overhead=round(memory.overhead_gib, 3), total=round(memory.total_gib, 3),
            capacity=round(memory.capacity_gib, 3), stage=memory.stage,
        ),
        fits=fast.fits,
        host_offload_gib=None if fast.host is None else round(fast.host.offloaded_gib, 3),
        step_time_s=time.step_time_s,
        tokens_per_s_per_gpu=time.tokens_per_s_per_gpu,
        tflops_per_gpu=time.tflops_per_gpu,
        mfu=time.mfu,
        time_breakdown_s={k: round(v, 6) for k, v in time.breakdown_s.items()},
        warnings=all_warnings,
        bubble_fraction=round(time.bubble_fraction, 4),
        exposed_comm_fraction=round(time.exposed_comm_fraction, 4),
        flop_convention=fast.convention,
        calibration=time.coverage.statement() if time.coverage is not None else None,
        tokens_per_s_per_gpu_p10=None if interval is None else round(interval[0], 1),
        tokens_per_s_per_gpu_p90=None if interval is None else round(interval[1], 1),
        interval_basis=None if time.band is None else time.band.basis,
    )


# Below this share of HBM left free a fitting layout is warned of: the memory estimate has its own error and the
# allocator its spikes (the planner prefers layouts above it among ties: `megapilot.plan.preferences`).
LOW_HEADROOM_FRACTION = 0.05


def _memory_warnings(memory: MemoryBreakdown, model: ModelSpec, parallel: ParallelConfig,
                     optimizer: Optimizer, tp_limit: int | None = None, *, fp32_gradients: bool = False) -> list[str]:
    if memory.fits:
        headroom = memory.capacity_gib - memory.total_gib
        if headroom < LOW_HEADROOM_FRACTION * memory.capacity_gib:
            return [f"only {headroom:.1f} GiB of {memory.capacity_gib:.0f} GiB left: allocator spikes may OOM"]
        return []
    savers = memory_savers_not_on(model, parallel, optimizer, tp_limit, fp32_gradients=fp32_gradients)
    advice = ("not yet used: " + ", ".join(savers)) if savers else \
        "every memory saver is already on: more GPUs, a shorter sequence or a smaller model"
    return [
        f"does not fit: {memory.total_gib:.1f} GiB needed on pipeline rank {memory.stage}, "
        f"{memory.capacity_gib:.0f} GiB available ({advice})"
    ]


def _host_warnings(host: HostOffload | None) -> list[str]:
    if host is None or host.fits or host.host_memory_gib is None:
        return []
    return [f"does not fit in host memory: activation offload parks {host.offloaded_gib:.0f} GiB per GPU in host "
            f"memory, the node has {host.host_memory_gib:.0f} GiB per GPU ({host.usable_gib:.0f} usable beside the "
            "OS, data loaders and checkpoint staging): offload fewer layers, recompute instead, or add pipeline "
            "stages"]


def memory_savers_not_on(model: ModelSpec, p: ParallelConfig, optimizer: Optimizer = "adam",
                         tp_limit: int | None = None, *, fp32_gradients: bool = False) -> list[str]:
    """The memory savers this layout does not use yet, cheapest in throughput first.

    Advice that names a switch already on (the distributed optimizer under Megatron-FSDP, recompute
    when every layer is recomputed) sends the user looking for a change that does not exist, and so does a
    switch Megatron refuses beside Muon (the distributed optimizer, Megatron-FSDP): there it names dist_muon.
    More TP is offered only inside `tp_limit` (the NVLink domain): TP 16 on 8-GPU nodes is refused by the layout
    checks, so naming it sent the user to a layout the next command refuses. With `fp32_gradients` (a bf16 run on
    a GPU, Megatron's default) it names bf16 gradients, as NeMo's and Megatron-Bridge's recipes keep them: no
    throughput lost, but the sum loses fp32's precision, so it is named after the savers that change nothing.
    """
    savers: list[str] = []
    muon = optimizer != "adam"
    if p.dp > 1 and optimizer == "muon":
        savers.append("Muon's state sharded over DP (--optimizer dist_muon)")
    if p.dp > 1 and not muon and not (p.distributed_optimizer or p.fsdp):
        savers.append("the distributed optimizer (--use-distributed-optimizer)")
    if p.tp > 1 and not p.sequence_parallel:
        savers.append("sequence parallelism (--sequence-parallel)")
    if fp32_gradients:
        savers.append("bf16 gradients (--grad-reduce-in-bf16; the sum in bf16)")
    if p.mbs > 1:
        savers.append(f"a smaller micro-batch (now {p.mbs})")
    if p.dp > 1 and not p.fsdp and not muon:
        savers.append("Megatron-FSDP (--use-megatron-fsdp" + (", with PP 1)" if p.pp > 1 else ")"))
    if p.cpu_offloading_num_layers < most_offloaded_layers(model.num_layers, p.pp, p.recompute):
        now = f", now {p.cpu_offloading_num_layers}" if p.cpu_offloading_num_layers else ""
        savers.append(f"activations offloaded to host memory (--cpu-offloading-num-layers{now})")
    if p.recompute != "full":
        savers.append("full activation recompute (--recompute-granularity full)")
    elif p.recompute_method == "uniform" and (p.recompute_num_layers or 1) > 1:
        savers.append(f"recompute every layer (--recompute-num-layers 1, now {p.recompute_num_layers})")
    if not p.fsdp and p.pp * 2 <= model.num_layers:  # megapilot plans and scripts Megatron-FSDP at PP 1 only
        savers.append(f"more pipeline stages (now PP {p.pp})")
    if model.num_attention_heads % (p.tp * 2) == 0 and (tp_limit is None or p.tp * 2 <= tp_limit):
        savers.append(f"more tensor-parallel ranks (now TP {p.tp})")
    return savers
