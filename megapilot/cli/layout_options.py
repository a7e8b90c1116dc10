"""The layout options — model, hardware, parallel sizes, batch, precision, memory savers, pipeline split —
declared once, as the fields of `LayoutFlags`, for `estimate`, `script` and (the hardware ones) `plan`; and the
run's features — MTP modules, MoE token dropping, the MoE dispatcher, the optimizer — declared once, as the
fields of `FeatureFlags`, for all three (`plan` searches layouts for the run they describe).

Each field's type is a typer option (`Annotated`) and its default is the option's default, so the name, help
and default of an option live in one place: for the layout's own options (ParallelConfig's fields) that place is
the field in megapilot/spec/parallel.py, through the generated `megapilot.cli.layout_fields`. `@layout_options()`
puts `LayoutFlags`'s fields into a command's signature where it takes `layout: LayoutFlags`, `@feature_options()`
`FeatureFlags`'s where it takes `features: FeatureFlags`, and each hands the command one typed object.
`case_flags()` gives the `build_case` keys (`--batch` lines use the same names, with `-` or `_`; their meaning is
`megapilot.estimate.cases`, the pipeline split's `megapilot.spec.pipeline.PipelineSplit`).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from copy import copy
from dataclasses import MISSING, dataclass, field, fields, make_dataclass
from typing import TYPE_CHECKING, Annotated, Any, get_args, get_type_hints

import typer

from megapilot.case_flags import REQUIRED_FLAGS, SPLIT_FIELDS
from megapilot.cli.layout_field import LayoutField
from megapilot.cli.layout_fields import LAYOUT_OPTIONS
from megapilot.errors import MegapilotError

if TYPE_CHECKING:
    from megapilot.estimate import CaseFeatures

MODEL_HELP = ("Model preset (e.g. llama3.1-70b), Hugging Face hub id (meta-llama/Llama-3.1-8B), config.json, "
              "model spec file or saved plan (its model).")

# Texts `plan` shares too, where its options mean the same but default to a value (`--seq-len 4096`).
GBS_HELP = "Global batch size, sequences."
SEQ_LEN_HELP = "Sequence length, tokens."
PRECISION_HELP = "bf16 | fp16 | fp8 | mxfp8 | nvfp4 | mxfp4 (Primus on MI355X)"
FP8_RECIPE_HELP = ("With --precision fp8: delayed | tensorwise | blockwise (--fp8-recipe; default tensorwise, "
                   "blockwise needs Hopper or Blackwell).")

Model = Annotated[str | None, typer.Option(help=MODEL_HELP)]
Gpu = Annotated[str | None, typer.Option("--gpu", help="GPU name or alias, e.g. h100 or mi300x.")]
Gpus = Annotated[int | None, typer.Option("--gpus", help="Total GPUs.")]
GpusPerNode = Annotated[int | None, typer.Option(
    "--gpus-per-node", help="GPUs per node (default 8; 4 on GB200/GB300).")]

# Megatron-LM's own spelling of each option, accepted as well: a user pastes them from a launch script, and the
# refusals' fixes quote them (`--account-for-embedding-in-pipeline-split`, `--expert-tensor-parallel-size`).
MEGATRON_SPELLINGS: dict[str, tuple[str, ...]] = {
    "tp": ("--tensor-model-parallel-size",),
    "pp": ("--pipeline-model-parallel-size",),
    "vpp": ("--num-virtual-stages-per-pipeline-rank",),  # what `script` writes; Megatron derives the VPP size from it
    "cp": ("--context-parallel-size",),
    "ep": ("--expert-model-parallel-size",),
    "etp": ("--expert-tensor-parallel-size",),
    "mbs": ("--micro-batch-size",),
    "gbs": ("--global-batch-size",),
    "seq_len": ("--seq-length",),
    "recompute": ("--recompute-granularity",),
    "fsdp": ("--use-megatron-fsdp",),
    "first_stage_layers": ("--decoder-first-pipeline-num-layers",),
    "last_stage_layers": ("--decoder-last-pipeline-num-layers",),
    "account_for_embedding": ("--account-for-embedding-in-pipeline-split",),
    "account_for_loss": ("--account-for-loss-in-pipeline-split",),
    "pipeline_layout": ("--pipeline-model-parallel-layout",),
    "moe_capacity_factor": ("--moe-expert-capacity-factor",),
    "moe_pad_to_capacity": ("--moe-pad-expert-input-to-capacity",),
    "mtp_repeated_layer": ("--mtp-use-repeated-layer",),
    "moe_flex_dispatcher": ("--moe-flex-dispatcher-backend",),
    "moe_a2a_overlap": ("--overlap-moe-expert-parallel-comm",),
}

# Spellings an option still takes that its help does not list: Megatron-Core's config name for VPP (NeMo's key),
# which `estimate`, `script` and `plan` took for Megatron-LM's flag before they took the flag itself.
UNLISTED_SPELLINGS: dict[str, str] = {"vpp": "--virtual-pipeline-model-parallel-size"}


def unlisted_option(name: str) -> Any:  # typer's OptionInfo, typed Any by typer itself
    """The hidden option of a field's unlisted spelling (`UNLISTED_SPELLINGS`); `one_spelling` merges it."""
    return typer.Option(None, UNLISTED_SPELLINGS[name], hidden=True)


def one_spelling(name: str, listed: Any, unlisted: Any) -> Any:
    """The value of an option given under its listed names or its unlisted one; refused when given under both."""
    if unlisted is None:
        return listed
    if listed is not None:
        raise MegapilotError(f"given twice, as {UNLISTED_SPELLINGS[name]} and --{name.replace('_', '-')}",
                             field=name, fix=f"pass --{name.replace('_', '-')} once")
    return unlisted


def _option(help: str) -> Any:  # typer's OptionInfo, typed Any by typer itself
    """An option named after its field (`seq_len` -> `--seq-len`)."""
    return typer.Option(help=help)


def _switch(help: str) -> Any:  # typer's OptionInfo, typed Any by typer itself
    """An on-only switch named after its field (`moe_a2a_overlap` -> `--moe-a2a-overlap`; no `--no-` form)."""
    return typer.Option(is_flag=True, help=help)


# Where the options declared on LayoutFlags stand among the layout's in --help: the hardware first, the batch and
# precision after --mbs; sequence parallelism is listed with the memory savers, before --distributed-optimizer.
_HARDWARE = ("model", "gpu", "gpus", "gpus_per_node")
_BATCH_AFTER = "mbs"
_LISTED_BEFORE = {"sequence_parallel": "distributed_optimizer"}


def _with_layout_fields(cls: type) -> Any:  # a dataclass made at import, typed Any as make_dataclass types it
    """`cls` with the layout's options (`LAYOUT_OPTIONS`, ParallelConfig's fields) among its own, in --help's
    order, and `cls`'s methods."""
    hints = get_type_hints(cls, include_extras=True)
    own = {item.name: (item.name, hints[item.name], field(default=item.default)) for item in fields(cls)}
    layout = {option.name: (option.name, _layout_annotation(option), field(default=_left_out(option)))
              for option in LAYOUT_OPTIONS}
    names = list(layout)
    for name, before in _LISTED_BEFORE.items():
        names.remove(name)
        names.insert(names.index(before), name)
    at = names.index(_BATCH_AFTER) + 1
    batch = [name for name in own if name not in _HARDWARE]
    order = [*_HARDWARE, *names[:at], *batch, *names[at:]]
    made = make_dataclass(cls.__name__, [(own | layout)[name] for name in order], frozen=True,
                          namespace={name: value for name, value in vars(cls).items()
                                     if name in ("__doc__", "case_flags", "given")})
    made.__module__, made.__qualname__ = cls.__module__, cls.__qualname__
    return made


def _layout_annotation(option: LayoutField) -> Any:  # an Annotated type, made at run time
    """The option's type as typer reads it: a value or an on/off switch (None: not given), or an on-only switch."""
    typer_option = typer.Option(*option.names, help=option.help)
    value_type = {"int": int | None, "str": str | None, "on_off": bool | None, "switch": bool}[option.kind]
    return Annotated[value_type, typer_option]


def _left_out(option: LayoutField) -> bool | None:
    """The value of an option left out: off for an on-only switch, else None (not given)."""
    return False if option.kind == "switch" else None


@_with_layout_fields
@dataclass(frozen=True)
class LayoutFlags:
    """The layout a command was given; None (or the default) = not given, `build_case`'s default applies.

    The options below are the model, the hardware, the batch and the precision; the layout's own, one per field of
    ParallelConfig but DP, by its name, are added from `megapilot.cli.layout_fields` (generated from ParallelConfig's
    fields: the help with the default the estimate takes, the option's names), Megatron's spellings from
    `MEGATRON_SPELLINGS`. tests/test_one_concept.py walks every ParallelConfig field from its option here to the
    estimate's LayoutPins."""

    model: Model = None
    gpu: Gpu = None
    gpus: Gpus = None
    gpus_per_node: GpusPerNode = None
    gbs: Annotated[int | None, _option(GBS_HELP)] = None
    seq_len: Annotated[int | None, _option(SEQ_LEN_HELP)] = None
    precision: Annotated[str | None, _option(f"{PRECISION_HELP} (default bf16).")] = None
    fp8_recipe: Annotated[str | None, _option(FP8_RECIPE_HELP)] = None

    def case_flags(self) -> dict[str, Any]:
        """The `build_case` keys (None: not given; the account-for switches count as given when on)."""
        flags = {item.name: getattr(self, item.name) for item in fields(self)}
        return _switches_given_or_none(flags, ("account_for_embedding", "account_for_loss"))

    def given(self) -> list[str]:
        """The options whose value is not their default, as typed (`--tp`, `--no-distributed-optimizer`)."""
        return _given(self)

    if TYPE_CHECKING:  # the layout's fields are added at import (above): checked as ParallelConfig types them
        def __init__(self, **given: Any) -> None: ...
        def __getattr__(self, name: str) -> Any: ...


@dataclass(frozen=True)
class FeatureFlags:
    """What the run makes of its model beyond the layout: MTP modules, MoE token dropping, the optimizer, the MoE
    dispatcher. None (or the default) = not given: the model's own (no token dropping), Adam, alltoall."""

    mtp_num_layers: Annotated[int | None, _option(
        "Multi-token-prediction modules (--mtp-num-layers; default: the model's own, 0 = none).")] = None
    mtp_repeated_layer: Annotated[bool, _switch(
        "Every MTP depth reuses one module's weights (--mtp-use-repeated-layer; Nemotron 3 Super's recipe runs 2 "
        "depths of its one module).")] = False
    moe_capacity_factor: Annotated[float | None, _option(
        "MoE token dropping: each expert takes at most this times its even share of the tokens "
        "(--moe-expert-capacity-factor; default: dropless).")] = None
    moe_pad_to_capacity: Annotated[bool, _switch(
        "With --moe-capacity-factor: pad every expert's input to its capacity (--moe-pad-expert-input-to-capacity; "
        "static shapes, no dispatcher host sync).")] = False
    optimizer: Annotated[str | None, _option(
        "adam | muon | dist_muon (--optimizer; default adam). Muon keeps one fp32 momentum per 2-D weight and runs "
        "Newton-Schulz on it each step; dist_muon shards that work and state over DP.")] = None
    grad_reduce_in_bf16: Annotated[bool, _switch(
        "Keep and reduce the gradients in bf16 (--grad-reduce-in-bf16, as NeMo's and Megatron-Bridge's performance "
        "recipes run): half the gradient memory and DP traffic; default fp32, Megatron's with --bf16.")] = False
    moe_flex_dispatcher: Annotated[str | None, _option(
        "MoE tokens through Megatron's flex dispatcher: deepep or hybridep (--moe-token-dispatcher-type flex "
        "--moe-flex-dispatcher-backend X; default alltoall).")] = None
    moe_a2a_overlap: Annotated[bool, _switch(
        "Overlap the expert all-to-all with another micro-batch's compute (--overlap-moe-expert-parallel-comm, with "
        "--delay-wgrad-compute) wherever Megatron allows it: EP > 1, no full recompute, VPP when PP > 1.")] = False
    cuda_graph_impl: Annotated[str | None, _option(
        "CUDA graphs: transformer_engine (parts of each layer) or local (Megatron's own; full_iteration) "
        "(--cuda-graph-impl; default: none, every kernel launched eagerly). Captured kernels are priced at a "
        "graph's launch gap.")] = None
    cuda_graph_scope: Annotated[str | None, _option(
        "With --cuda-graph-impl: the captured parts, e.g. 'attn moe_router moe_preprocess' (--cuda-graph-scope: "
        "attn, mlp, moe, moe_router, moe_preprocess, mamba, full_iteration; default: each layer whole).")] = None

    def case_flags(self) -> dict[str, Any]:
        """The `CaseFlags` keys (None: not given; a switch counts as given when on)."""
        flags = {item.name: getattr(self, item.name) for item in fields(self)}
        # every switch here is on-only (`_switch`, default False): off means not given
        return _switches_given_or_none(flags, tuple(item.name for item in fields(self) if item.default is False))

    def case_features(self) -> CaseFeatures:
        """The features alone, checked, as the planner applies them to its model (no layout)."""
        from megapilot.estimate import CaseFeatures

        flags = self.case_flags()
        return CaseFeatures(**{name: flags[name] for name in (item.name for item in fields(CaseFeatures))})

    def given(self) -> list[str]:
        """The options whose value is not their default, as typed (`--moe-capacity-factor`)."""
        return _given(self)

    def model_changes(self) -> list[str]:
        """The given options that change the model or its training (all but the MoE dispatcher and all-to-all
        overlap, launch choices)."""
        return [flag for flag in self.given() if flag not in LAUNCH_CHOICES]


# Feature options a saved plan takes beside it in `script`: they change how it launches, not what it trains.
LAUNCH_CHOICES = ("--moe-flex-dispatcher", "--moe-a2a-overlap", "--cuda-graph-impl", "--cuda-graph-scope")


def _switches_given_or_none(flags: dict[str, Any], switches: tuple[str, ...]) -> dict[str, Any]:
    """`build_case` reads a switch left off as not given (None), so a default of the model's own applies."""
    for switch in switches:
        flags[switch] = True if flags[switch] else None
    return flags


def _given(flags: LayoutFlags | FeatureFlags) -> list[str]:
    return [("--no-" if getattr(flags, item.name) is False else "--") + _option_name(type(flags), item.name)
            for item in fields(flags) if getattr(flags, item.name) != item.default]


def _option_name(cls: type[LayoutFlags | FeatureFlags], name: str) -> str:
    """A field's option as typed, without its dashes: the field's name, or the one its option declares
    (`pipeline_layout` is `--pp-layout`)."""
    option = get_args(get_type_hints(cls, include_extras=True)[name])[1]
    declared = option.default if isinstance(option.default, str) and option.default.startswith("--") else ""
    return declared[2:] if declared and "/" not in declared else name.replace("_", "-")


#: A layout with no option given; the placeholder default of a command's `layout` parameter where one before it
#: has a default (the decorator replaces the parameter, so it is never used as a value).
NOTHING_GIVEN = LayoutFlags()
NO_FEATURES = FeatureFlags()


def split_flags(
    first_stage_layers: int | None, last_stage_layers: int | None, account_for_embedding: bool | None,
    account_for_loss: bool | None, pipeline_layout: str | None,
) -> dict[str, Any]:
    """The split options alone as `build_case` keys, as `LayoutFlags.case_flags` gives them."""
    layout = LayoutFlags(first_stage_layers=first_stage_layers, last_stage_layers=last_stage_layers,
                         account_for_embedding=bool(account_for_embedding), account_for_loss=bool(account_for_loss),
                         pipeline_layout=pipeline_layout)
    flags = layout.case_flags()
    return {name: flags[name] for name in SPLIT_FIELDS}


def layout_options(*, required_note: str = "", notes: Mapping[str, str] | None = None,
                   ) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Replace a command's `layout: LayoutFlags` parameter by the options of `LayoutFlags`, in field order.

    `required_note` starts the help of the fields `build_case` requires (estimate: "Required (unless --batch).");
    `notes` ends the help of the fields it names, for what one command adds (script: where `--gpus` comes from).
    """
    return _flag_options(LayoutFlags, "layout", required_note, notes)


def feature_options() -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Replace a command's `features: FeatureFlags` parameter by the options of `FeatureFlags`, in field order."""
    return _flag_options(FeatureFlags, "features", "", None)


def _flag_options(cls: type[LayoutFlags | FeatureFlags], parameter_name: str, required_note: str,
                  notes: Mapping[str, str] | None) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Replace a command's `parameter_name: cls` parameter by `cls`'s fields as options, and hand the command
    one `cls` built from them."""
    notes = dict(notes or {})
    unknown = set(notes) - {item.name for item in fields(cls)}
    if unknown:
        raise TypeError(f"notes for {sorted(unknown)}: no such layout option")

    def decorate(command: Callable[..., None]) -> Callable[..., None]:
        signature = inspect.signature(command, eval_str=True)
        own = list(signature.parameters.values())
        at = [parameter.name for parameter in own].index(parameter_name)
        options = _option_parameters(cls, required_note, notes)
        names = [parameter.name for parameter in options]
        unlisted = [_unlisted_parameter(option) for option in options if option.name in UNLISTED_SPELLINGS]

        @functools.wraps(command)
        def with_flags(**values: Any) -> None:
            for parameter in unlisted:
                listed = parameter.name.removesuffix(_UNLISTED)
                values[listed] = one_spelling(listed, values[listed], values.pop(parameter.name))
            flags = cls(**{name: values.pop(name) for name in names})
            command(**{parameter_name: flags}, **values)

        parameters = own[:at] + options + unlisted + own[at + 1:]
        # typer reads the options from the signature and the types from the annotations
        with_flags.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]  # read by inspect.signature
        with_flags.__annotations__ = {parameter.name: parameter.annotation for parameter in parameters}
        return with_flags

    return decorate


_UNLISTED = "_unlisted"  # the suffix of an unlisted spelling's parameter: `vpp_unlisted`


def _unlisted_parameter(option: inspect.Parameter) -> inspect.Parameter:
    """The hidden parameter that takes `option`'s unlisted spelling, of its type."""
    return inspect.Parameter(option.name + _UNLISTED, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                             default=unlisted_option(option.name), annotation=get_args(option.annotation)[0])


def _declared_names(option: Any, name: str) -> tuple[str, ...]:
    """The names an option declares beyond its first: under `Annotated` typer reads a first positional name as
    the option's `default`; an option declaring none is named after its parameter."""
    if option.param_decls:
        return tuple(option.param_decls)
    if isinstance(option.default, str) and option.default.startswith("-"):
        return ()
    return (f"--{name.replace('_', '-')}",)


def _option_parameters(cls: type[LayoutFlags | FeatureFlags], required_note: str, notes: Mapping[str, str],
                       ) -> list[inspect.Parameter]:
    """`cls`'s fields as typer parameters, each help with the command's note."""
    hints = get_type_hints(cls, include_extras=True)
    parameters = []
    for item in fields(cls):
        value_type, option = get_args(hints[item.name])
        option = copy(option)
        if required_note and item.name in REQUIRED_FLAGS:
            option.help = f"{required_note} {option.help}"
        if item.name in notes:
            option.help = f"{option.help} {notes[item.name]}"
        if item.name in MEGATRON_SPELLINGS:
            option.param_decls = (*_declared_names(option, item.name), *MEGATRON_SPELLINGS[item.name])
        elif value_type is bool and not option.param_decls:  # an on-only `_switch`: typer would add a `--no-` form
            option.param_decls = _declared_names(option, item.name)
        assert item.default is not MISSING  # every option has a default: left out = not given
        parameters.append(inspect.Parameter(item.name, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                            default=item.default,
                                            annotation=Annotated[value_type, option]))
    return parameters
