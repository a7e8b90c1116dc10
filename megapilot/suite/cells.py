"""Sweep cells: one (MBS, GBS, precision) point of a suite, its merged training parameters, and why it
would be skipped.

CVS keys a cell `MBS=<mbs>,GBS=<gbs>,PRECISION=<p>`; the body of a combination overlays `train_params`
and wins over it. With no sweep there is one `default` cell built from `train_params` alone. Values in
CVS files are strings ("8192", "0"); numbers and booleans are accepted too.

A precision the GPU cannot run (MXFP4 on MI300X, FP8 on A100, NVFP4 on H100) does not crash the suite
and is never quietly run in BF16: the cell carries a `skip_reason` saying so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from megapilot.spec import ARCH_PRECISIONS, GPUSpec, LayoutPins, ParallelConfig

PRECISION_NAMES: tuple[str, ...] = ("BF16", "FP16", "FP8", "MXFP8", "MXFP4", "NVFP4")
CPU_PRECISIONS = frozenset({"BF16", "FP16"})  # a CPU run computes in fp32; these lose nothing a gate measures
DEFAULT_CELL_KEY = "default"
SMOKE_CELL_KEY = "smoke"
SINGLE_NODE_SMOKE_GBS = 8
MULTI_NODE_SMOKE_GBS = 16
# Bounds a real suite stays far inside; a typo beyond them is refused by `suite check`.
MAX_TRAIN_ITERATIONS = 10_000_000
MAX_SEQUENCE_LENGTH = 1 << 24
MAX_BATCH = 1 << 24
# CVS's parse of a combination key (PR #405).
_SWEEP_KEY = re.compile(r"^MBS=(?P<mbs>[^,]+),GBS=(?P<gbs>[^,]+),PRECISION=(?P<precision>[^,]+)\Z")


# ---- tolerant scalar parsing: CVS writes numbers and switches as strings ----------------------
def _as_int(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError(f"expected a whole number, got {value!r}")
    if isinstance(value, str):
        text = value.strip()
        if not re.fullmatch(r"[+-]?\d+", text):
            raise ValueError(f"expected a whole number, got {value!r}")
        return int(text)
    return value


def _as_bool(value: Any) -> Any:
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off", ""):
            return False
        raise ValueError(f"expected 0/1 or true/false, got {value!r}")
    if isinstance(value, int) and not isinstance(value, bool) and value in (0, 1):
        return bool(value)
    return value


def _as_str(value: Any) -> Any:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return value


# CVS's per-model suites (before its Aug 2026 refactor) named the Transformer Engine recipes TE_FP8 and TE_BF16.
PRECISION_ALIASES = {"TE_FP8": "FP8", "TE_BF16": "BF16"}


def normalise_precision(value: Any) -> str:
    """`fp8`, `Fp8`, `FP8`, `TE_FP8` -> `FP8` (`TE_BF16` -> `BF16`); anything outside CVS's precisions is refused."""
    name = value.strip().upper() if isinstance(value, str) else None
    name = PRECISION_ALIASES.get(name, name) if name is not None else None
    if name not in PRECISION_NAMES:
        raise ValueError(f"unknown precision {value!r}; use one of {', '.join(PRECISION_NAMES)}")
    return name


IntLike = Annotated[int, BeforeValidator(_as_int)]
BoolLike = Annotated[bool, BeforeValidator(_as_bool)]
StrLike = Annotated[str, BeforeValidator(_as_str)]
PrecisionName = Annotated[str, BeforeValidator(normalise_precision)]


class TrainParams(BaseModel):
    """CVS `train_params` (and a sweep overlay merged onto it), typed. Unknown keys are kept as given."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    model_name: StrLike
    tokenizer_model: StrLike = ""
    model_size: StrLike = ""
    sequence_length: IntLike = Field(gt=0, le=MAX_SEQUENCE_LENGTH)
    recompute: BoolLike = False
    fsdp: BoolLike = False
    tensor_parallelism: IntLike = Field(default=1, ge=1)
    pipeline_parallelism: IntLike = Field(default=1, ge=1)
    # megapilot's keys beyond CVS's schema, which has no way to say them: a MoE suite needs EP, a long-context one CP
    context_parallelism: IntLike = Field(default=1, ge=1)
    expert_parallelism: IntLike = Field(default=1, ge=1)
    virtual_pipeline_parallelism: IntLike | None = Field(default=None, ge=2)
    training_iterations: IntLike = Field(gt=0, le=MAX_TRAIN_ITERATIONS)
    micro_batch_size: IntLike | None = Field(default=None, gt=0, le=MAX_BATCH)
    global_batch_size: IntLike | None = Field(default=None, gt=0, le=MAX_BATCH)
    precision: PrecisionName | None = None

    def extras(self) -> dict[str, str]:
        """Keys CVS files carry beyond the known ones (a combination's `name`, ...), as text."""
        return {key: str(value) for key, value in (self.model_extra or {}).items()}


# Other names for keys of train_params: Megatron-LM's arguments and the layout shorthands. A key written so is a slip
# of the suite's key (a problem), not a key of another tool to keep and ignore: the layout it meant would not run.
TRAIN_PARAM_ALIASES = {
    "tp": "tensor_parallelism", "tensor_model_parallel_size": "tensor_parallelism",
    "pp": "pipeline_parallelism", "pipeline_model_parallel_size": "pipeline_parallelism",
    "cp": "context_parallelism", "context_parallel_size": "context_parallelism",
    "ep": "expert_parallelism", "expert_model_parallel_size": "expert_parallelism",
    "vpp": "virtual_pipeline_parallelism", "virtual_pipeline_model_parallel_size": "virtual_pipeline_parallelism",
    "mbs": "micro_batch_size", "gbs": "global_batch_size", "seq_length": "sequence_length",
    "seq_len": "sequence_length", "train_iters": "training_iterations",
}


def cell_key_text(mbs: object, gbs: object, precision: object) -> str:
    """The `MBS=..,GBS=..,PRECISION=..` form of a cell, as CVS writes its keys (not yet parsed or normalised)."""
    return "MBS={},GBS={},PRECISION={}".format(*(str(value).strip() for value in (mbs, gbs, precision)))


@dataclass(frozen=True)
class CellKey:
    """A parsed `MBS=..,GBS=..,PRECISION=..` key."""

    mbs: int
    gbs: int
    precision: str

    @property
    def key(self) -> str:
        """The canonical form threshold files are matched against."""
        return cell_key_text(self.mbs, self.gbs, self.precision)

    @property
    def slug(self) -> str:
        """A directory-safe name: `MBS4_GBS128_FP8`."""
        return f"MBS{self.mbs}_GBS{self.gbs}_{self.precision}"


def parse_cell_key(key: str) -> CellKey:
    """Parse a combination key; ValueError saying what is wrong with it."""
    match = _SWEEP_KEY.match(key.strip())
    if match is None:
        raise ValueError(f"{key!r} is not of the form MBS=<mbs>,GBS=<gbs>,PRECISION=<precision>")
    try:
        mbs, gbs = _as_int(match["mbs"]), _as_int(match["gbs"])
    except ValueError as exc:
        raise ValueError(f"{key!r}: {exc}") from None
    if mbs < 1 or gbs < 1:
        raise ValueError(f"{key!r}: MBS and GBS must be positive")
    return CellKey(mbs, gbs, normalise_precision(match["precision"]))


class SweepCell(BaseModel):
    """One cell of the sweep (or the smoke run), with its parameters merged and typed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: str = Field(description="Threshold cell key: MBS=4,GBS=128,PRECISION=FP8, `default` or `smoke`.")
    slug: str = Field(description="Directory-safe name, e.g. MBS4_GBS128_FP8.")
    gbs: int = Field(gt=0)
    precision: str
    seq_length: int = Field(gt=0)
    layout: LayoutPins = Field(description="What the suite fixes of the layout: TP, PP, CP, EP, VPP (None: no "
                               "interleaving), MBS, recompute (CVS's switch: full or none) and FSDP; the launch "
                               "completes it (suite.render.build_plan).")
    train_iters: int = Field(gt=0)
    model_name: str
    tokenizer_model: str = ""
    model_size: str = ""
    extra: dict[str, str] = Field(default_factory=dict, description="Overlay keys beyond the known ones, kept.")
    skip_reason: str | None = None


# What a combo records of its layout: what the report, the run deck, the history and the budget read of it. The
# rest of the launched layout (recompute, FSDP, the split) is the launch script's and the cell's to say.
RECORDED_LAYOUT_FIELDS = ("tp", "pp", "cp", "ep", "vpp", "mbs")


def recorded_layout(layout: ParallelConfig | LayoutPins, **given: int | None) -> LayoutPins:
    """The part of `layout` a combo records (`RECORDED_LAYOUT_FIELDS`), `given` over it."""
    return LayoutPins(**({name: getattr(layout, name) for name in RECORDED_LAYOUT_FIELDS} | given))


def precision_skip_reason(precision: str, gpu: GPUSpec | None) -> str | None:
    """Why a cell of this precision cannot run on this GPU (None = it can). `gpu` None means CPUs."""
    if gpu is None:
        if precision in CPU_PRECISIONS:
            return None
        return f"{precision} needs GPU tensor cores; a CPU run computes in fp32 and would not measure {precision}"
    if precision.lower() in gpu.precisions:
        return None
    runs = ", ".join(p.upper() for p in sorted(ARCH_PRECISIONS[gpu.architecture]))
    return f"{precision} is not supported on {gpu.name} ({gpu.architecture} runs {runs})"


def sweep_cell(key: CellKey, params: TrainParams, gpu: GPUSpec | None) -> SweepCell:
    """The cell of a combination key, its overlay already merged into `params`."""
    return _cell(key.key, key.slug, key.mbs, key.gbs, key.precision, params, gpu)


def default_cell(params: TrainParams, gpu: GPUSpec | None, nodes: int) -> SweepCell:
    """The one cell of a suite without a sweep: train_params' own MBS/GBS/precision (1 / smoke GBS / BF16)."""
    mbs = params.micro_batch_size or 1
    gbs = params.global_batch_size or _smoke_gbs(nodes)
    return _cell(DEFAULT_CELL_KEY, DEFAULT_CELL_KEY, mbs, gbs, params.precision or "BF16", params, gpu)


def smoke_cell(params: TrainParams, *, iters: int, mbs: int, gbs: int | None, precision: str,
               gpu: GPUSpec | None, nodes: int) -> SweepCell:
    """CVS's fixed small smoke run; an empty GBS is 8 on one node, 16 on several."""
    params = params.model_copy(update={"training_iterations": iters})
    return _cell(SMOKE_CELL_KEY, SMOKE_CELL_KEY, mbs, gbs or _smoke_gbs(nodes), precision, params, gpu)


def _smoke_gbs(nodes: int) -> int:
    return SINGLE_NODE_SMOKE_GBS if nodes <= 1 else MULTI_NODE_SMOKE_GBS


def _cell(key: str, slug: str, mbs: int, gbs: int, precision: str, params: TrainParams,
          gpu: GPUSpec | None) -> SweepCell:
    layout = LayoutPins(tp=params.tensor_parallelism, pp=params.pipeline_parallelism, cp=params.context_parallelism,
                        ep=params.expert_parallelism, vpp=params.virtual_pipeline_parallelism, mbs=mbs,
                        recompute="full" if params.recompute else "none", fsdp=params.fsdp)
    return SweepCell(
        key=key, slug=slug, gbs=gbs, precision=precision, seq_length=params.sequence_length, layout=layout,
        train_iters=params.training_iterations, model_name=params.model_name,
        tokenizer_model=params.tokenizer_model, model_size=params.model_size, extra=params.extras(),
        skip_reason=precision_skip_reason(precision, gpu),
    )


__all__ = [
    "DEFAULT_CELL_KEY",
    "PRECISION_NAMES",
    "SMOKE_CELL_KEY",
    "TRAIN_PARAM_ALIASES",
    "CellKey",
    "SweepCell",
    "TrainParams",
    "default_cell",
    "normalise_precision",
    "parse_cell_key",
    "precision_skip_reason",
    "smoke_cell",
    "sweep_cell",
]
