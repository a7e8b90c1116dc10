"""ParallelConfig: one parallel layout, in Megatron's terms; LayoutPins: the same layout given in part.

World = TP x PP x CP x DP. Expert parallelism is carved out of the same ranks: Megatron builds the
expert groups so that ETP x EP x expert-DP = TP x CP x DP (= world / PP), hence EP x ETP must divide
TP x CP x DP; EP is not an extra factor of the world size.

The layout's fields are declared once, here, on ParallelConfig. Every place that holds a layout only in part (the
planner's pins, the flags of an estimate, a suite's sweep cell) holds a `LayoutPins`, whose fields are made from
ParallelConfig's at import: a field added to ParallelConfig is a pin, a flag and a cell's field by that one edit.
Each field (but DP) also says how the command line takes it (`CliOption`); the CLI's layout options are generated
from those (megapilot/cli/layout_fields.py), so a field added here is an option of `estimate` and `script` too.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator, model_validator
from pydantic.fields import FieldInfo

from megapilot.case_flags import SPLIT_FIELDS
from megapilot.errors import MegapilotError
from megapilot.spec.pipeline import (
    PipelineSplit,
    PipelineStages,
    parse_layout,
    uneven_rank_layer_counts,
)

Recompute = Literal["none", "selective", "full"]
RecomputeMethod = Literal["uniform", "block"]
# Megatron-LM's `--cp-comm-type` (TransformerConfig.cp_comm_type, core_v0.14 to v0.19; Transformer Engine's
# `attn_forward_func_with_cp`): p2p, the ring, is Megatron's default; a2a is DeepSpeed Ulysses. Its all_gather and
# a2a+p2p (hierarchical) forms and a per-layer list are not priced.
CpCommType = Literal["p2p", "a2a"]
UNPRICED_CP_COMM_TYPES = ("all_gather", "a2a+p2p")
# Megatron-Core's `--recompute-modules` (TransformerConfig.recompute_modules, core_v0.14 to v0.19), with
# `--recompute-granularity selective`: the parts of a layer rerun in the backward instead of kept.
RecomputeModule = Literal["core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts"]
RECOMPUTE_MODULES: tuple[str, ...] = get_args(RecomputeModule)
DEFAULT_RECOMPUTE_MODULES: tuple[RecomputeModule, ...] = ("core_attn",)  # Megatron's default


@dataclass(frozen=True)
class CliOption:
    """How the command line takes a layout field (`estimate`, `script`). Its help is the field's description, which
    says what the field means once for every reader, ended by the default a command takes when the option is left
    out: the field's own, or `default` where a command takes another (sequence parallelism: on when tp > 1) or the
    field's None stands for a value (etp: tp). `names`: the option's names where they are not the field's
    (`--pp-layout`; a switch with an off form, `--sp/--no-sp`). Read by megapilot/cli/gen_layout_fields.py, never
    at run time."""

    default: str | None = None
    names: tuple[str, ...] = ()


def _choices(kind: object) -> str:
    """A Literal's values as the help lists them: `none | selective | full`."""
    return " | ".join(get_args(kind))


class ParallelConfig(BaseModel):
    """A complete parallel layout plus the memory-saving switches that go with it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tp: Annotated[int, CliOption()] = Field(default=1, ge=1, description="Tensor parallel size.")
    pp: Annotated[int, CliOption()] = Field(default=1, ge=1, description="Pipeline parallel size.")
    vpp: Annotated[int, CliOption()] = Field(
        default=1, ge=1, description="Virtual pipeline stages per PP rank (1 = no interleaving).")
    cp: Annotated[int, CliOption()] = Field(default=1, ge=1, description="Context parallel size.")
    cp_comm_type: Annotated[CpCommType, CliOption()] = Field(
        default="p2p", description=f"How CP exchanges attention: {_choices(CpCommType)} (--cp-comm-type). p2p: ring "
        "attention, K and V passed round the CP ranks; a2a: all-to-alls of q, k, v and the output trade the "
        "sequence shard for a share of the heads (Ulysses; each TP rank's heads and KV heads must divide by cp; "
        "the only CP for attention sinks).")
    ep: Annotated[int, CliOption()] = Field(default=1, ge=1, description="Expert parallel size.")
    # None: TP's, as Megatron defaults it (a command's MoE layout with ep > 1 takes Bridge's 1: cases.MOE_DEFAULT_ETP)
    etp: Annotated[int | None, CliOption(
        default="tp; 1 on a MoE layout with ep > 1, as Megatron-Bridge sets it")] = Field(
        default=None, ge=1, description="Expert tensor parallel size.")
    dp: int = Field(default=1, ge=1, description="Data parallel size (derived: world / (tp*pp*cp)).")
    mbs: Annotated[int, CliOption()] = Field(default=1, ge=1, description="Micro-batch size.")
    sequence_parallel: Annotated[bool, CliOption(
        default="on when tp > 1", names=("--sequence-parallel/--no-sequence-parallel", "--sp/--no-sp"))] = Field(
        default=False, description="Megatron sequence parallelism (needs tp > 1).")
    # a command's default is Megatron's none (cases.COMMAND_DEFAULT_RECOMPUTE); the field's serves code that builds one
    recompute: Annotated[Recompute, CliOption(default="none, as Megatron's")] = Field(
        default="selective", description=f"Activation recomputation granularity: {_choices(Recompute)}.")
    recompute_method: Annotated[RecomputeMethod, CliOption()] = Field(
        default="uniform", description=f"With full recompute: {_choices(RecomputeMethod)} (--recompute-method).")
    recompute_num_layers: Annotated[int | None, CliOption()] = Field(
        default=None, ge=1, description="With full recompute: layers per chunk (uniform) or per stage (block).",
    )
    recompute_modules: Annotated[tuple[RecomputeModule, ...] | None, CliOption(  # None: Megatron's default
        default=", ".join(DEFAULT_RECOMPUTE_MODULES))] = Field(
        default=None, min_length=1,
        description="With selective recompute: the modules rerun in the backward, any of "
        f"{', '.join(RECOMPUTE_MODULES)} (--recompute-modules, comma-separated).")
    cpu_offloading_num_layers: Annotated[int, CliOption()] = Field(
        default=0, ge=0,
        description="Activations of the first N transformer layers move to host memory in the forward and back for "
        "the backward (--cpu-offloading-num-layers; Megatron runs it with pp 1 and no recompute).",
    )
    distributed_optimizer: Annotated[bool, CliOption(
        default="on with Adam", names=("--distributed-optimizer/--no-distributed-optimizer",))] = Field(
        default=True, description="Shard optimizer state over DP (ZeRO-1; Megatron refuses it with Muon).")
    fsdp: Annotated[bool, CliOption()] = Field(
        default=False, description="Megatron-FSDP: shard weights, grads and optimizer over DP.")
    first_stage_layers: Annotated[int | None, CliOption(default="even split")] = Field(
        default=None, ge=1,
        description="Decoder layers on the first pipeline rank (--decoder-first-pipeline-num-layers).")
    last_stage_layers: Annotated[int | None, CliOption(default="even split")] = Field(
        default=None, ge=1,
        description="Decoder layers on the last pipeline rank (--decoder-last-pipeline-num-layers).")
    account_for_embedding: Annotated[bool, CliOption()] = Field(
        default=False, description="The embedding takes one layer slot (--account-for-embedding-in-pipeline-split).",
    )
    account_for_loss: Annotated[bool, CliOption()] = Field(
        default=False, description="The loss takes one layer slot (--account-for-loss-in-pipeline-split).",
    )
    pipeline_layout: Annotated[str | None, CliOption(names=("--pp-layout",))] = Field(
        default=None,
        description="Megatron layout string, e.g. 'Et*3|(tt|)*29,m|L' (--pipeline-model-parallel-layout; VPP "
        "follows from it), or 'balanced' for the most balanced one Megatron can express (printed).",
    )

    @field_validator("cp_comm_type", mode="before")
    @classmethod
    def _priced_cp_comm_type(cls, value: object) -> object:
        """Megatron's other CP exchanges are named as such, not as unknown words."""
        if value in UNPRICED_CP_COMM_TYPES:
            raise ValueError(f"--cp-comm-type {value} is a Megatron CP exchange megapilot does not price (only "
                             f"{_choices(CpCommType)}); use p2p (the ring) or a2a")
        return value

    @model_validator(mode="before")
    @classmethod
    def _vpp_from_layout(cls, data: object) -> object:
        """A layout string fixes VPP (its stage count / PP), as Megatron derives it; an unset vpp takes it."""
        if isinstance(data, dict) and isinstance(layout := data.get("pipeline_layout"), str) \
                and layout != "balanced" and data.get("vpp") in (None, 1):
            try:
                stages = len(parse_layout(layout))
            except ValueError:
                return data  # the split's own check names the bad character
            pp = int(data.get("pp") or 1)
            if stages % pp == 0 and stages // pp > 1:
                data = {**data, "vpp": stages // pp}
        return data

    @model_validator(mode="after")
    def _local_consistency(self) -> ParallelConfig:
        if self.sequence_parallel and self.tp == 1:
            raise ValueError("sequence_parallel needs tp > 1; switch it off or raise tp")
        if self.vpp > 1 and self.pp == 1:
            raise ValueError("vpp > 1 needs pp > 1 (interleaving splits pipeline stages)")
        if self.recompute_num_layers is not None and self.recompute != "full":
            raise ValueError("recompute_num_layers applies only to recompute='full'")
        if self.recompute_modules is not None and self.recompute != "selective":
            raise ValueError(f"recompute_modules applies only to selective recompute, not {self.recompute!r} "
                             "(Megatron reads --recompute-modules with --recompute-granularity selective)")
        if self.cpu_offloading_num_layers and self.recompute != "none":
            raise ValueError(f"cpu_offloading_num_layers needs recompute 'none', not {self.recompute!r} (Megatron: "
                             "'CPU offloading does not work when activation recomputation is enabled')")
        if self.cpu_offloading_num_layers and self.pp > 1:
            raise ValueError(f"cpu_offloading_num_layers needs pp 1, not {self.pp} (Megatron: 'Currently there is no "
                             "support for Pipeline parallelism with CPU offloading')")
        if self.uneven_pipeline and self.pp == 1:
            raise ValueError("first_stage_layers/last_stage_layers need pp > 1; drop them or raise pp")
        try:  # building the split refuses mixing its vocabularies (layout + counts, counts + account-for)
            self.pipeline_split  # noqa: B018  (building the split is the check)
        except ValidationError as exc:
            raise ValueError(exc.errors()[0]["msg"].removeprefix("Value error, ")) from None
        return self

    @property
    def recomputed_modules(self) -> frozenset[str]:
        """The modules selective recompute reruns (none without it; the attention core by default)."""
        if self.recompute != "selective":
            return frozenset()
        return frozenset(self.recompute_modules or DEFAULT_RECOMPUTE_MODULES)

    @property
    def pipeline_split(self) -> PipelineSplit:
        """The split in one typed model (even, uneven, account-for, or a layout string)."""
        return _split_of(self.first_stage_layers, self.last_stage_layers, self.account_for_embedding,
                         self.account_for_loss, self.pipeline_layout)

    def pipeline_stages(self, num_layers: int, mtp_num_layers: int = 0) -> PipelineStages:
        """The virtual stages this layout builds (MegapilotError where Megatron would refuse it)."""
        return self.pipeline_split.resolve(num_layers, mtp_num_layers, self.pp, self.vpp)

    @property
    def uneven_pipeline(self) -> bool:
        """The first or the last pipeline rank has its own layer count (Megatron's uneven PP)."""
        return self.first_stage_layers is not None or self.last_stage_layers is not None

    def rank_layer_counts(self, num_layers: int, mtp_num_layers: int = 0) -> tuple[int, ...]:
        """Transformer layers held by each pipeline rank.

        Even: num_layers / pp each. Uneven (Megatron-Core's rule): the first and/or last rank take
        their given counts and the remaining ranks share the rest equally. Account-for flags and
        layouts: what their resolved stages hold. Not validated for the even/uneven forms (see
        `validate.check_pipeline_split`).
        """
        if self.account_for_embedding or self.account_for_loss or self.pipeline_layout is not None:
            return self.pipeline_stages(num_layers, mtp_num_layers).rank_layer_counts()
        return pipeline_rank_layer_counts(num_layers, self.pp, self.first_stage_layers, self.last_stage_layers)

    @property
    def expert_tp(self) -> int:
        return self.etp if self.etp is not None else self.tp

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.cp * self.dp

    @property
    def model_parallel_size(self) -> int:
        return self.tp * self.pp * self.cp

    @property
    def expert_dp(self) -> int:
        """Data-parallel size of the expert weights: (TP x CP x DP) / (EP x ETP)."""
        return (self.tp * self.cp * self.dp) // (self.ep * self.expert_tp)

    def num_microbatches(self, global_batch_size: int) -> int:
        return global_batch_size // (self.mbs * self.dp)

    def shell_block(self, global_batch_size: int) -> str:
        """The seeds' shell variable block, e.g. `TP=4 PP=4 VPP=5 CP=2 EP=1 DP=2 MBS=1 GBS=1024`; an uneven
        split adds its end ranks' layer counts (`PP_FIRST_LAYERS=7 PP_LAST_LAYERS=7`)."""
        block = (
            f"TP={self.tp} PP={self.pp} VPP={self.vpp} CP={self.cp} EP={self.ep} "
            f"DP={self.dp} MBS={self.mbs} GBS={global_batch_size}"
        )
        if self.first_stage_layers is not None:
            block += f" PP_FIRST_LAYERS={self.first_stage_layers}"
        if self.last_stage_layers is not None:
            block += f" PP_LAST_LAYERS={self.last_stage_layers}"
        if self.account_for_embedding:
            block += " PP_ACCOUNT_EMBEDDING=1"
        if self.account_for_loss:
            block += " PP_ACCOUNT_LOSS=1"
        if self.pipeline_layout is not None:
            block += f" PP_LAYOUT='{self.pipeline_layout}'"
        if self.cpu_offloading_num_layers:
            block += f" CPU_OFFLOAD_LAYERS={self.cpu_offloading_num_layers}"
        if self.cp_comm_type != "p2p":
            block += f" CP_COMM_TYPE={self.cp_comm_type}"
        return block

    @classmethod
    def for_world(cls, world_size: int, **layout: object) -> ParallelConfig:
        """Build a layout, deriving DP from the world size (error if TP*PP*CP does not divide it)."""
        tp, pp, cp = (int(layout.get(k) or 1) for k in ("tp", "pp", "cp"))  # type: ignore[call-overload]  # layout values are the flags' ints or None
        if world_size % (tp * pp * cp):
            raise MegapilotError(
                f"TP*PP*CP = {tp}*{pp}*{cp} = {tp * pp * cp} does not divide {world_size} GPUs",
                field="gpus",
                fix="choose TP, PP and CP whose product divides the GPU count",
            )
        layout = {k: v for k, v in layout.items() if v is not None}
        layout["dp"] = world_size // (tp * pp * cp)
        return cls(**layout)  # type: ignore[arg-type]  # keys are ParallelConfig fields; pydantic checks values


# What a layout given in part leaves out: DP follows from the world size (`ParallelConfig.for_world`).
DERIVED_FIELDS = ("dp",)
#: The fields a layout is given by, in ParallelConfig's order.
LAYOUT_FIELDS: tuple[str, ...] = tuple(name for name in ParallelConfig.model_fields if name not in DERIVED_FIELDS)
if not set(SPLIT_FIELDS) <= set(LAYOUT_FIELDS):  # one list of split fields: a renamed one breaks here, not silently
    raise TypeError("case_flags.SPLIT_FIELDS names a field ParallelConfig does not have")


class LayoutPins(BaseModel):
    """A layout given in part: each of ParallelConfig's fields (but DP) fixed to a value, or None = not given.

    The fields are ParallelConfig's own (name, type, bounds, description), made optional at import below; the
    values are checked strictly (a switch is not a size, text is not a number). `config` completes them into a
    ParallelConfig with the defaults the caller names, then ParallelConfig's own.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    def given(self) -> dict[str, Any]:
        """The fields that were given, by name, in ParallelConfig's order."""
        return {name: value for name, value in self if value is not None}

    def config(self, world_size: int, **defaults: object) -> ParallelConfig:
        """The full layout on `world_size` GPUs: these pins over `defaults` over ParallelConfig's defaults (DP from
        the world size; MegapilotError when TP*PP*CP does not divide it, ValueError where ParallelConfig refuses)."""
        return ParallelConfig.for_world(world_size, **(defaults | self.given()))

    if TYPE_CHECKING:  # the fields are ParallelConfig's, made at import: checked as it types them, at run time
        def __init__(self, **given: Any) -> None: ...
        def __getattr__(self, name: str) -> Any: ...


def _optional_fields(model: type[BaseModel], names: tuple[str, ...]) -> dict[str, Any]:
    """`model`'s fields as optional ones (default None) that keep their type, bounds and description."""
    made: dict[str, Any] = {}
    for name in names:
        field = model.model_fields[name]
        assert field.annotation is not None  # every field of a spec is annotated
        optional = FieldInfo(default=None, description=field.description)
        optional.metadata = list(field.metadata)  # the bounds (ge=1, min_length=1) hold for a given value
        made[name] = (field.annotation | None, optional)
    return made


if not TYPE_CHECKING:  # the one definition of the pins' fields: ParallelConfig's, each optional
    LayoutPins = create_model("LayoutPins", __base__=LayoutPins, __module__=__name__, __doc__=LayoutPins.__doc__,
                              **_optional_fields(ParallelConfig, LAYOUT_FIELDS))


@lru_cache(maxsize=1024)
def _split_of(
    first_stage_layers: int | None, last_stage_layers: int | None, account_for_embedding: bool,
    account_for_loss: bool, layout: str | None,
) -> PipelineSplit:
    """One PipelineSplit per distinct set of split fields: the estimator asks for it on every layout it costs
    (cached here, not on the frozen config, so a `model_copy` with new split fields never sees a stale one)."""
    return PipelineSplit(first_stage_layers=first_stage_layers, last_stage_layers=last_stage_layers,
                         account_for_embedding=account_for_embedding, account_for_loss=account_for_loss,
                         layout=layout)


def pipeline_rank_layer_counts(
    num_layers: int, pp: int, first_stage_layers: int | None = None, last_stage_layers: int | None = None
) -> tuple[int, ...]:
    """Layers per pipeline rank: the given first/last counts, the rest split equally over the middle ranks.

    Integer division: a split that does not divide is refused by `validate.check_pipeline_split`.
    """
    return uneven_rank_layer_counts(num_layers, pp, first_stage_layers, last_stage_layers)
