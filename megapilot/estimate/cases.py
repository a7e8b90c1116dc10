"""Layout flags -> typed specs: the one place `--model --gpu --gpus --tp ...` become objects.

`megapilot estimate`, its `--batch` lines, the planner and the launch-script command accept the same
flags. They arrive as a mapping (`CaseFlags.parse`: names, types and the required ones checked) and cross
into the estimate as a typed `CaseFlags`, which `case_from` resolves (`build_case(**flags)` does both). Flag
names are the long CLI names with `_` (`seq_len`, `gpus_per_node`, `recompute_num_layers`, ...); the layout's
are ParallelConfig's field names, held as one `LayoutPins` (the spec's type of a layout given in part, so a field
added to ParallelConfig is a flag here with no edit). Every bad value raises `MegapilotError` naming the flag.
The run features a model takes beyond the layout (MTP modules, token dropping, the MoE dispatcher) are a
`CaseFeatures` of their own, which the planner gives without a layout.

Defaults: precision bf16, no recompute (`COMMAND_DEFAULT_RECOMPUTE`; selective where recompute modules are named),
sequence parallel on when tp > 1, distributed optimizer on, vpp/cp/ep 1, etp = tp (1 on a MoE layout with ep > 1,
`MOE_DEFAULT_ETP`), GPUs per node 8 (4 on GB200/GB300 trays), an even pipeline split (`first_stage_layers` /
`last_stage_layers` give the end ranks their own layer counts; `account_for_embedding`/`account_for_loss` give the
embedding/loss a layer slot each; `pipeline_layout` (`--pp-layout`, also accepted as `pp_layout`) takes a Megatron
layout string, or `balanced` for the most balanced layout, which is computed here and carried as its string), TP
kept inside a node
(`force_tp_across_nodes` lets the estimate cost a TP group spanning nodes).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, TypeVar, get_args

from pydantic import ValidationError

from megapilot.case_flags import REQUIRED_FLAGS
from megapilot.errors import MegapilotError, from_validation_error
from megapilot.estimate.pipeline_balance import balanced_split
from megapilot.estimate.step_time import EstimateOptions, stage_time_weights
from megapilot.spec.cuda_graphs import (
    CUDA_GRAPH_IMPLS,
    CUDA_GRAPH_SCOPES,
    CudaGraphs,
    cuda_graph_refusal,
    pads_routing_for_quantization,
)
from megapilot.spec.hardware import ClusterSpec
from megapilot.spec.model import ModelSpec, MoESpec
from megapilot.spec.parallel import LAYOUT_FIELDS, RECOMPUTE_MODULES, LayoutPins, ParallelConfig
from megapilot.spec.plan_file import FlexDispatcher
from megapilot.spec.training import (
    FP8_RECIPES,
    MAX_GLOBAL_BATCH,
    MAX_SEQ_LENGTH,
    MAX_TOKENS_PER_STEP,
    OPTIMIZERS,
    PRECISIONS,
    TrainingSpec,
)
from megapilot.spec.validate import (
    KEEP_ALLTOALL,
    check_optimizer,
    cp_comm_type_for,
    flex_backend_refusal,
    flex_dispatcher_refusal,
    moe_a2a_overlap_refusal,
)

# The flags beyond the layout, by type (the layout's types and bounds are ParallelConfig's: LayoutPins checks them).
INT_FLAGS = ("gpus", "gpus_per_node", "gbs", "seq_len", "mtp_num_layers")
INT_MINIMUM = {"mtp_num_layers": 0}  # 0 = none; every other count is >= 1
BOOL_FLAGS = ("force_tp_across_nodes", "moe_pad_to_capacity", "mtp_repeated_layer", "moe_a2a_overlap",
              "grad_reduce_in_bf16")
FLOAT_FLAGS = ("moe_capacity_factor",)
STR_FLAGS = ("model", "gpu", "precision", "fp8_recipe", "moe_flex_dispatcher", "optimizer", "cuda_graph_impl",
             "cuda_graph_scope")
# The command line's shorter name of a layout field, accepted in a mapping as well (`--batch` lines were written
# with it); the field itself has ParallelConfig's name.
CLI_SPELLINGS = {"pp_layout": "pipeline_layout"}
# Megatron's flex MoE dispatcher backends, as `script --moe-flex-dispatcher` writes them; left out = alltoall.
FLEX_DISPATCHER_BACKENDS: tuple[str, ...] = get_args(FlexDispatcher)
KNOWN_FLAGS = frozenset(INT_FLAGS + BOOL_FLAGS + STR_FLAGS + FLOAT_FLAGS + LAYOUT_FIELDS)
T = TypeVar("T")


@dataclass(frozen=True)
class Case:
    """Everything an estimate needs."""

    model: ModelSpec
    cluster: ClusterSpec
    training: TrainingSpec
    parallel: ParallelConfig
    allow_tp_across_nodes: bool = False
    # run features the layout does not say (the MoE dispatcher); the step-time model's defaults otherwise
    options: EstimateOptions = field(default_factory=EstimateOptions)


@dataclass(frozen=True)
class CaseFeatures:
    """What the run makes of its model beyond the layout; None = not given (the model's own, alltoall)."""

    mtp_num_layers: int | None = None
    mtp_repeated_layer: bool | None = None
    moe_capacity_factor: float | None = None
    moe_pad_to_capacity: bool | None = None
    moe_a2a_overlap: bool | None = None
    moe_flex_dispatcher: str | None = None
    cuda_graph_impl: str | None = None  # local, transformer_engine (or none)
    cuda_graph_scope: str | None = None  # scopes as Megatron names them, by spaces or commas; none = each layer whole


@dataclass(frozen=True, kw_only=True)
class CaseFlags(CaseFeatures):
    """One case as the flags give it: the layout, the batch and the run's features (None = not given: `case_from`
    applies the module doc's defaults)."""

    model: str
    gpu: str
    gpus: int
    gbs: int
    seq_len: int
    gpus_per_node: int | None = None
    precision: str | None = None
    fp8_recipe: str | None = None
    optimizer: str | None = None
    grad_reduce_in_bf16: bool | None = None  # None: Megatron's fp32 gradients
    force_tp_across_nodes: bool | None = None
    # the layout's flags, under ParallelConfig's names (`recompute_modules` given as Megatron lists them)
    layout: LayoutPins = field(default_factory=LayoutPins)

    @classmethod
    def parse(cls, raw: Mapping[str, object]) -> CaseFlags:
        """The flags of a mapping (a `--batch` line, the CLI's options): unknown names, missing required ones and
        wrong types are refused by field."""
        given = {name: value for name, value in raw.items() if value is not None}
        for spelling, name in CLI_SPELLINGS.items():
            if spelling in given:
                if name in given:
                    raise MegapilotError(f"{spelling!r} is given twice (as {name!r} too)", field=name,
                                         fix="give each flag once, in either spelling")
                given[name] = given.pop(spelling)
        for listed in ("recompute_modules", "cuda_graph_scope"):  # a --batch line may list them
            names = given.get(listed)
            if isinstance(names, (list, tuple)) and all(isinstance(name, str) for name in names):
                given[listed] = " ".join(names)
        _check_flag_names_and_types(given)
        layout = {name: given.pop(name) for name in LAYOUT_FIELDS if name in given}
        if "recompute_modules" in layout:
            layout["recompute_modules"] = parse_recompute_modules(layout["recompute_modules"])
        return cls(**given, layout=_layout_pins(layout))  # type: ignore[arg-type]  # names and types checked above

    def flags(self) -> dict[str, object]:
        """Every flag by name, the layout's among them (None: not given): the mapping `parse` reads."""
        own = {item.name: getattr(self, item.name) for item in fields(self) if item.name != "layout"}
        return own | dict(self.layout)

    def changed(self, changes: Mapping[str, object]) -> CaseFlags:
        """These flags with some changed (None: no longer given), checked as `parse` checks them."""
        return CaseFlags.parse(self.flags() | dict(changes))

    def given(self) -> frozenset[str]:
        """The flags that were given (not None)."""
        return frozenset(name for name, value in self.flags().items() if value is not None)

    @property
    def features(self) -> CaseFeatures:
        return CaseFeatures(**{item.name: getattr(self, item.name) for item in fields(CaseFeatures)})


def build_case(**raw: object) -> Case:
    """Resolve flags given as keywords (see module doc) into specs; raises MegapilotError on the first bad flag."""
    return case_from(CaseFlags.parse(raw))


def case_from(flags: CaseFlags) -> Case:
    """Resolve checked flags into specs; raises MegapilotError on a value or layout Megatron would refuse."""
    _check_fsdp_keeps_the_distributed_optimizer(flags.layout)
    model = with_features(_resolve_model(flags.model), flags.features)
    cluster = _resolve_cluster(flags.gpu, flags.gpus, flags.gpus_per_node)
    options = run_options(model, flags.features, cluster)
    training = build_training(seq_len=flags.seq_len, gbs=flags.gbs, precision=flags.precision,
                              fp8_recipe=flags.fp8_recipe, optimizer=flags.optimizer,
                              grad_reduce_in_bf16=flags.grad_reduce_in_bf16)
    cluster.gpu.check_precision(training.precision, training.fp8_recipe)  # the format and recipe exist on this GPU
    if flags.layout.pipeline_layout == "balanced":
        balanced = _balanced_layout(model, cluster, training, options, flags)
        flags = replace(flags, layout=flags.layout.model_copy(update={"pipeline_layout": balanced}))
    parallel = _resolve_parallel(flags, cluster.world_size, training, model)
    check_optimizer(training, parallel)  # Muon refuses the distributed optimizer and FSDP, given or not
    if flags.moe_a2a_overlap:
        _check_a2a_overlap(model, parallel)
    if flags.moe_flex_dispatcher and (refusal := flex_dispatcher_refusal(parallel)) is not None:
        raise MegapilotError(refusal, field="moe_flex_dispatcher", fix=f"{KEEP_ALLTOALL}, or use EP > 1")
    if options.cuda_graphs is not None:
        if cluster.gpu.vendor == "CPU":  # a graph is captured on a CUDA stream: a CPU run has none to capture
            raise MegapilotError("CUDA graphs capture GPU kernels: a CPU run has none", field="cuda_graph_impl",
                                 fix="leave --cuda-graph-impl out on a CPU")
        check_cuda_graphs(model, parallel, training, options)
    return Case(model, cluster, training, parallel, allow_tp_across_nodes=bool(flags.force_tp_across_nodes),
                options=options)


def _check_fsdp_keeps_the_distributed_optimizer(layout: LayoutPins) -> None:
    """`--fsdp --no-distributed-optimizer` asks for what no launch writes: Megatron-FSDP steps its sharded state
    through the distributed optimizer (Megatron-LM's FSDP guide lists --use-distributed-optimizer among its
    required flags, and `launch` writes it beside --use-megatron-fsdp whatever was asked). Refused here, where
    `estimate`, its `--batch` lines and `script` all resolve their flags, so none prices or writes another run."""
    if layout.fsdp and layout.distributed_optimizer is False:
        raise MegapilotError("--fsdp needs the distributed optimizer, which --no-distributed-optimizer turns off "
                             "(Megatron-FSDP steps its sharded optimizer state through it; Megatron-LM's FSDP "
                             "guide requires --use-distributed-optimizer)", field="distributed_optimizer",
                             fix="drop --no-distributed-optimizer (under --fsdp the optimizer state is sharded over "
                                 "DP either way), or drop --fsdp")


def with_features(model: ModelSpec, features: CaseFeatures) -> ModelSpec:
    """The model as the run's features make it (MTP modules, MoE token dropping); the planner applies them
    as `case_from` does."""
    _check_types({item.name: getattr(features, item.name) for item in fields(features)})
    return _with_mtp(_with_token_dropping(model, features), features)


def _check_a2a_overlap(model: ModelSpec, parallel: ParallelConfig) -> None:
    """The expert all-to-all overlap asked for on one layout: refused by field where Megatron refuses it."""
    refusal = moe_a2a_overlap_refusal(model, parallel)
    if refusal is not None:
        raise MegapilotError(f"--overlap-moe-expert-parallel-comm: {refusal} (Megatron asserts it)",
                             field="moe_a2a_overlap", fix="drop --moe-a2a-overlap, or change the layout as it says")


def run_options(model: ModelSpec, features: CaseFeatures, cluster: ClusterSpec) -> EstimateOptions:
    """The run features the flags name: the MoE dispatcher and overlap (`_dispatch_options`) and CUDA graphs."""
    return replace(_dispatch_options(model, features, cluster), cuda_graphs=cuda_graphs_from(features))


def cuda_graphs_from(features: CaseFeatures) -> CudaGraphs | None:
    """The CUDA graphs `--cuda-graph-impl` and `--cuda-graph-scope` ask for (None: eager, Megatron's default).
    The scope is Megatron's words, by spaces or commas; `full` (Megatron's older word) is each layer whole."""
    impl, scope = features.cuda_graph_impl, features.cuda_graph_scope
    if impl in (None, "none"):
        if scope:
            raise MegapilotError(f"a scope ({scope}) without an implementation captures nothing",
                                 field="cuda_graph_scope",
                                 fix=f"add --cuda-graph-impl ({' or '.join(CUDA_GRAPH_IMPLS)}), or drop the scope")
        return None
    if impl not in CUDA_GRAPH_IMPLS:
        raise MegapilotError(f"unknown CUDA graph implementation {impl!r}", field="cuda_graph_impl",
                             fix=f"use one of: {', '.join(CUDA_GRAPH_IMPLS)} (or leave it out: no graphs)")
    words = list(dict.fromkeys((scope or "").replace(",", " ").split()))
    if words == ["full"]:
        words = []
    unknown = [word for word in words if word not in CUDA_GRAPH_SCOPES]
    if unknown:
        raise MegapilotError(f"unknown CUDA graph scope {unknown[0]!r}", field="cuda_graph_scope",
                             fix=f"use some of: {', '.join(CUDA_GRAPH_SCOPES)} (none: each layer whole)")
    return CudaGraphs(impl=impl, scope=tuple(words))  # type: ignore[arg-type]  # checked against the Literals


def check_cuda_graphs(model: ModelSpec, parallel: ParallelConfig, training: TrainingSpec,
                      options: EstimateOptions) -> None:
    """The graphs asked for on one layout: refused by field where Megatron-Core asserts against them."""
    graphs = options.cuda_graphs
    if graphs is None:
        return
    refusal = cuda_graph_refusal(model, parallel, graphs, flex_dispatcher=bool(options.moe_flex_dispatcher),
                                 router_padding=pads_routing_for_quantization(model, training),
                                 a2a_overlap=options.moe_a2a_overlap is True)
    if refusal is not None:
        raise MegapilotError(f"CUDA graphs ({graphs.describe()}): {refusal}",
                             field="cuda_graph_scope", fix="change the scope or the layout as it says, or leave "
                             "--cuda-graph-impl out (an eager run)")


def _dispatch_options(model: ModelSpec, features: CaseFeatures, cluster: ClusterSpec) -> EstimateOptions:
    """The flex MoE dispatcher (a token crosses to each remote NVLink domain once, no host sync; refused where its
    backend cannot run, as `script` refuses it) and the expert all-to-all overlap (on every layout Megatron allows
    it on), on a model with experts."""
    if features.moe_a2a_overlap and model.moe is None:
        raise MegapilotError(f"{model.name} has no experts whose all-to-all could overlap", field="moe_a2a_overlap",
                             fix="drop --moe-a2a-overlap for a dense model")
    overlap: bool | None = True if features.moe_a2a_overlap else EstimateOptions().moe_a2a_overlap
    backend = features.moe_flex_dispatcher
    if backend is None:
        return EstimateOptions(moe_a2a_overlap=overlap)
    if backend not in FLEX_DISPATCHER_BACKENDS:
        raise MegapilotError(f"unknown flex dispatcher backend {backend!r}", field="moe_flex_dispatcher",
                             fix=f"use one of: {', '.join(FLEX_DISPATCHER_BACKENDS)} (or leave it out: alltoall)")
    if model.moe is None:
        raise MegapilotError(f"{model.name} has no experts to dispatch tokens to", field="moe_flex_dispatcher",
                             fix="drop --moe-flex-dispatcher for a dense model")
    if (unavailable := flex_backend_refusal(backend, cluster, model)) is not None:
        raise unavailable
    return EstimateOptions(moe_flex_dispatcher=True, moe_a2a_overlap=overlap)


def cross_domain_flex_backend(model: ModelSpec, cluster: ClusterSpec) -> str | None:
    """The flex dispatcher backend the planner costs an expert group that leaves the NVLink domain with: DeepEP
    where it runs, else HybridEP (the NVL72 racks), else None (AMD GPUs, no experts: the alltoall dispatcher).
    Megatron-Core's MoE guide pairs cross-node expert parallelism with these dispatchers: a token crosses to each
    remote domain once and fans out over NVLink there, instead of one copy per remote expert."""
    if model.moe is None:
        return None
    return next((backend for backend in FLEX_DISPATCHER_BACKENDS
                 if flex_backend_refusal(backend, cluster, model) is None), None)


def _check_flag_names_and_types(flags: Mapping[str, object]) -> None:
    unknown = sorted(set(flags) - KNOWN_FLAGS)
    if unknown:
        raise MegapilotError(
            f"unknown flag(s) {', '.join(unknown)}", field=unknown[0],
            fix=f"use only: {', '.join(sorted(KNOWN_FLAGS))}",
        )
    missing = [name for name in REQUIRED_FLAGS if name not in flags]
    if missing:
        missing_flags = [f"--{name.replace('_', '-')}" for name in missing]
        raise missing_inputs_error(missing, fix=f"pass {_and_list(missing_flags)}")
    _check_types(flags)


def missing_inputs_error(missing: list[str], fix: str) -> MegapilotError:
    """All the missing inputs in one error, named by the first: one run of the command shows them all."""
    others = f"; so {'is' if len(missing) == 2 else 'are'} {_and_list(missing[1:])}" if len(missing) > 1 else ""
    return MegapilotError(f"is required{others}", field=missing[0], fix=fix)


def _and_list(words: list[str]) -> str:
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"


def _check_types(flags: Mapping[str, object]) -> None:
    for name in INT_FLAGS:
        value = flags.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise MegapilotError(f"must be an integer, got {value!r}", field=name, fix=f"give {name} as a whole number")
        low = INT_MINIMUM.get(name, 1)
        if value is not None and value < low:
            raise MegapilotError(f"must be >= {low}, got {value}", field=name,
                                 fix=f"give {name} as a positive number" + (" or 0 (none)" if low == 0 else ""))
    for name in BOOL_FLAGS:
        value = flags.get(name)
        if value is not None and not isinstance(value, bool):
            raise MegapilotError(f"must be true or false, got {value!r}", field=name, fix="use a JSON boolean")
    for name in STR_FLAGS:
        value = flags.get(name)
        if value is not None and not isinstance(value, str):
            raise MegapilotError(f"must be a string, got {value!r}", field=name, fix=f"give {name} as text")
    for name in FLOAT_FLAGS:
        value = flags.get(name)
        # `not value > 0` also refuses NaN; infinity is no capacity Megatron can size (int(inf) raises)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not 0 < value < math.inf):
            raise MegapilotError(f"must be a positive finite number, got {value!r}", field=name,
                                 fix=f"give {name} as a number above 0, e.g. 1.0")


def _with_token_dropping(model: ModelSpec, features: CaseFeatures) -> ModelSpec:
    """The model with the token dropping the flags ask for (--moe-capacity-factor, --moe-pad-to-capacity)."""
    factor, pad = features.moe_capacity_factor, bool(features.moe_pad_to_capacity)
    if factor is None and not pad:
        return model
    if model.moe is None:
        raise MegapilotError(f"{model.name} has no experts to drop tokens at", field="moe_capacity_factor",
                             fix="drop --moe-capacity-factor and --moe-pad-to-capacity for a dense model")
    if pad and factor is None and model.moe.capacity_factor is None:
        raise MegapilotError("padding to capacity needs a capacity", field="moe_pad_to_capacity",
                             fix="add --moe-capacity-factor, e.g. 1.0")
    update: dict[str, Any] = {"pad_to_capacity": pad or model.moe.pad_to_capacity}
    if factor is not None:
        update["capacity_factor"] = float(factor)
    try:  # validated, not copied: MoESpec's own rules apply (token dropping needs an aux-loss or no balancing)
        moe = MoESpec.model_validate(model.moe.model_dump() | update)
    except ValidationError as exc:
        raise from_validation_error(exc, prefix="moe") from None
    return model.model_copy(update={"moe": moe})


def _with_mtp(model: ModelSpec, features: CaseFeatures) -> ModelSpec:
    """The model with the multi-token-prediction modules the flags ask for (--mtp-num-layers; 0 = none), e.g. a
    DeepSeek-V3 run without its MTP module, and whether its depths repeat one module (--mtp-use-repeated-layer)."""
    update = {key: getattr(features, key) for key in ("mtp_num_layers", "mtp_repeated_layer")
              if getattr(features, key) is not None}
    if all(getattr(model, key) == value for key, value in update.items()):
        return model
    if update.get("mtp_num_layers") and model.position_embedding not in ("rope", "none"):
        raise MegapilotError(f"multi-token prediction needs rope or no position embedding; {model.name} has "
                             f"{model.position_embedding} (Megatron asserts it)", field="mtp_num_layers",
                             fix="drop --mtp-num-layers")
    try:  # validated: the spec's own rules on MTP apply
        return ModelSpec.model_validate(model.model_dump() | update)
    except ValidationError as exc:
        raise _mtp_refusal(model, update, from_validation_error(exc)) from None


def _mtp_refusal(model: ModelSpec, update: Mapping[str, Any], error: MegapilotError) -> MegapilotError:
    """The spec's refusal of the model with the MTP flags' values, said of the flag that was given (the spec names
    its own field: `mla.csa.compress_ratios` when a DeepSeek-V4 model's ratios do not cover the asked depth), with
    the depths this model does take."""
    if "mtp_num_layers" not in update:  # --mtp-use-repeated-layer alone
        return MegapilotError(f"--mtp-use-repeated-layer: {error.problem}", field="mtp_repeated_layer",
                              fix="drop --mtp-use-repeated-layer")
    asked = update["mtp_num_layers"]
    valid = []
    for depth in dict.fromkeys((model.mtp_num_layers, 0, 1)):
        try:
            ModelSpec.model_validate(model.model_dump() | dict(update) | {"mtp_num_layers": depth})
        except ValidationError:
            continue
        valid.append(f"--mtp-num-layers {depth}" + (" (the model's own)" if depth == model.mtp_num_layers else ""))
    fix = f"use {' or '.join(valid)}" if valid else "drop --mtp-num-layers"
    where = f" ({error.field})" if error.field and error.field != "mtp_num_layers" else ""
    return MegapilotError(f"--mtp-num-layers {asked} does not fit {model.name}{where}: {error.problem}",
                          field="mtp_num_layers", fix=fix)


def _resolve_model(name_or_path: str) -> ModelSpec:
    from megapilot.catalog import get_model

    return get_model(name_or_path)


def _resolve_cluster(gpu_name: str, gpus: int, gpus_per_node: int | None) -> ClusterSpec:
    from megapilot.catalog.gpus import cluster_of

    return cluster_of(gpu_name, gpus, gpus_per_node)


# Recompute left unset: none, as Megatron-LM and Megatron-Bridge both leave it (no --recompute-granularity) and as the
# performance recipes run wherever the layout fits without it. A layout that does not fit says so and names
# recompute among what it has not used.
COMMAND_DEFAULT_RECOMPUTE = "none"
# ETP of a MoE layout with EP > 1 left unset. Megatron-LM's own default is TP, Megatron-Bridge's is 1
# (`_set_moe_expert_tensor_parallel_default`: its MoE models scale the experts by EP, not split them by TP), and every
# Bridge MoE recipe sets 1, as NeMo 2's performance configs did (Mixtral 8x22B: etp_size 1): the published MoE runs
# are typed from tables that print no ETP, and at TP 2 with EP 64 on 64 GPUs Megatron-LM's default has no legal
# layout at all. `script` writes the 1 out, so the launch runs what was priced.
MOE_DEFAULT_ETP = 1


def _resolve_parallel(flags: CaseFlags, world_size: int, training: TrainingSpec, model: ModelSpec) -> ParallelConfig:
    """The layout the flags give, with the module doc's defaults where they differ from ParallelConfig's; CP on a
    model whose attention Transformer Engine runs under CP only by all-to-all (sinks, a sliding window) exchanges
    it so unless told (Megatron's default p2p ring would be refused), as the planner does."""
    defaults: dict[str, object] = {"sequence_parallel": (flags.layout.tp or 1) > 1,
                                   "distributed_optimizer": not training.uses_muon,
                                   # modules named imply selective recompute, as Megatron reads them only then
                                   "recompute": ("selective" if flags.layout.recompute_modules is not None
                                                 else COMMAND_DEFAULT_RECOMPUTE)}
    defaults["cp_comm_type"] = cp_comm_type_for(model, flags.layout.cp or 1)
    if model.moe is not None and (flags.layout.ep or 1) > 1:
        defaults["etp"] = MOE_DEFAULT_ETP
    try:
        parallel = flags.layout.config(world_size, **defaults)
    except MegapilotError:
        raise
    except ValueError as exc:
        raise _layout_error(exc) from None
    # Megatron reads --recompute-method only with full recompute: given beside another, it would be dropped unsaid
    if flags.layout.recompute_method is not None and parallel.recompute != "full":
        raise MegapilotError(f"recompute_method applies only to recompute='full', not {parallel.recompute!r}",
                             field="recompute_method", fix="drop --recompute-method, or use --recompute full")
    return parallel


def _layout_pins(given: dict[str, Any]) -> LayoutPins:
    """The layout flags as pins, each value checked as ParallelConfig checks it; refused by field."""
    try:
        return LayoutPins(**given)
    except ValidationError as exc:
        error = from_validation_error(exc)
        meaning = LayoutPins.model_fields[error.field].description if error.field in LayoutPins.model_fields else ""
        raise MegapilotError(f"{error.problem}, got {given.get(error.field or '')!r}", field=error.field,
                             fix=f"give {error.field} a value the message allows ({(meaning or '').rstrip('.')})"
                             ) from None


def parse_recompute_modules(listed: object) -> tuple[str, ...] | None:
    """`--recompute-modules moe_act,layernorm` (or space-separated) as the names Megatron takes."""
    if listed is None:
        return None
    if not isinstance(listed, str):
        raise MegapilotError(f"must be a string, got {listed!r}", field="recompute_modules",
                             fix="list the modules as --recompute-modules does: moe_act,layernorm")
    names = tuple(dict.fromkeys(listed.replace(",", " ").split()))
    unknown = [name for name in names if name not in RECOMPUTE_MODULES]
    if unknown or not names:
        raise MegapilotError(f"unknown recompute module(s) {', '.join(unknown) or repr(listed)}",
                             field="recompute_modules", fix=f"use some of: {', '.join(RECOMPUTE_MODULES)}")
    return names


def _or(value: T | None, default: T) -> T:
    """A flag's value, or its default when it was not given. (The distributed optimizer is on by default with
    Adam and off with Muon, which Megatron refuses beside it: `check_optimizer`.)"""
    return default if value is None else value


def _balanced_layout(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, options: EstimateOptions,
                     flags: CaseFlags) -> str:
    """`--pp-layout balanced`: the layout string of the split, for this PP x VPP, whose heaviest stage is lightest
    in time on the rest of the layout the flags give (its TP, CP, EP, MBS)."""
    layout = flags.layout
    pp, vpp = _or(layout.pp, 1), _or(layout.vpp, 1)
    if pp == 1:
        raise MegapilotError("a balanced pipeline layout needs pp > 1", field="pipeline_layout",
                             fix="drop --pp-layout or raise --pp")
    unsplit = _resolve_parallel(replace(flags, layout=layout.model_copy(update={"pipeline_layout": None})),
                                cluster.world_size, training, model)
    weights = stage_time_weights(model, cluster, training, unsplit, options)
    balanced = balanced_split(model, pp, vpp, weights).layout
    assert balanced is not None
    return balanced


def _layout_error(exc: ValueError) -> MegapilotError:
    """Name the flag a ParallelConfig rule points at (its messages start with the field's name)."""
    converted = from_validation_error(exc)
    if converted.field is None:
        if "pipeline_layout" in converted.problem or "account-for" in converted.problem:
            return MegapilotError(converted.problem, field="pipeline_layout" if "layout" in converted.problem
                                  else "account_for_embedding")
        for name in sorted(LAYOUT_FIELDS, key=len, reverse=True):  # the longest first: recompute_modules, recompute
            if converted.problem.startswith(name):
                return MegapilotError(converted.problem, field=name, fix=_LAYOUT_FIXES.get(name))
    return converted


_LAYOUT_FIXES = {"sequence_parallel": "drop --sequence-parallel, or raise --tp above 1",
                 "vpp": "drop --vpp, or raise --pp above 1",
                 "recompute_modules": "drop --recompute-modules, or use --recompute selective",
                 "recompute_num_layers": "drop --recompute-num-layers, or use --recompute full",
                 "cpu_offloading_num_layers": "pass --recompute none and --pp 1 with it, or drop "
                                              "--cpu-offloading-num-layers"}


# What to pass when TrainingSpec refuses a batch past its bounds (a slip of digits), by flag.
_BATCH_FIXES = {
    "seq_len": f"pass --seq-len N with N <= {MAX_SEQ_LENGTH:,} tokens",
    "gbs": f"pass --gbs N (sequences a step) with N <= {MAX_GLOBAL_BATCH:,} and N x --seq-len <= "
           f"{MAX_TOKENS_PER_STEP:,} tokens",
}


def _recipe_named(typed: str | None) -> str | None:
    """Megatron's --fp8-recipe word for a recipe typed as the performance tables name it (FP8-CS, fp8_sc, ds,
    current: `published.published_precision`'s vocabulary), or None."""
    from megapilot.estimate.published import published_precision  # published builds on this module

    named = published_precision(f"fp8-{typed}") if typed else None
    return named.fp8_recipe if named is not None and named.precision == "fp8" else None


def build_training(*, seq_len: int, gbs: int, precision: str | None = None, fp8_recipe: str | None = None,
                   optimizer: str | None = None, grad_reduce_in_bf16: bool | None = None) -> TrainingSpec:
    """The run's batch, precision and optimizer as the flags give them (None: the module doc's defaults); a value
    TrainingSpec refuses is a MegapilotError naming the flag by its CaseFlags name, with the fix for that flag."""
    try:
        chosen: dict[str, Any] = {"precision": _or(precision, "bf16"), "optimizer": _or(optimizer, "adam"),
                                  "grad_reduce_in_bf16": bool(grad_reduce_in_bf16)}
        if fp8_recipe is not None:
            chosen["fp8_recipe"] = fp8_recipe
        return TrainingSpec(seq_length=seq_len, global_batch_size=gbs, **chosen)  # TrainingSpec checks them
    except ValueError as exc:
        error = from_validation_error(exc)
        flag = {"seq_length": "seq_len", "global_batch_size": "gbs"}.get(error.field or "", error.field)
        recipe_fix = f"with precision fp8 use one of: {', '.join(FP8_RECIPES)}; otherwise drop it"
        if fp8_recipe in ("mxfp8", "nvfp4"):  # Megatron's --fp8-recipe mxfp8 / --fp4-recipe nvfp4
            recipe_fix = f"use --precision {fp8_recipe} (the block-scaled format is a precision here)"
        elif (meant := _recipe_named(fp8_recipe)) is not None:  # the tables' names: FP8-CS, fp8_sc, current
            recipe_fix = f"use --fp8-recipe {meant} (Megatron's name for {fp8_recipe})"
        fix = {"precision": f"use one of: {', '.join(PRECISIONS)}",
               "fp8_recipe": recipe_fix,
               "optimizer": f"use one of: {', '.join(OPTIMIZERS)}",
               "grad_reduce_in_bf16": "drop --grad-reduce-in-bf16, or train in bf16 (--precision bf16)",
               **_BATCH_FIXES}.get(flag or "", error.fix)
        raise MegapilotError(error.problem, field=flag, fix=fix) from None


if {item.name for item in fields(CaseFlags)} - {"layout"} | set(LAYOUT_FIELDS) != KNOWN_FLAGS:  # one list of flags
    raise TypeError("CaseFlags and the flag type lists disagree")
