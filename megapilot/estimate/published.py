"""A published run typed into the estimator as a user would type it.

Performance tables print TP, PP, VPP, CP, EP, MBS, GBS, the sequence, the GPU count and FSDP, but not
what Megatron also needs to accept some of them: the pipeline split (126-layer Llama 3.1 405B on PP 8 x
VPP 8, 61-layer DeepSeek-V3 on PP 16) or the expert TP. `enter_published_run` estimates the row as
`megapilot estimate` answers it typed so (`estimate.estimate_case`: an unprinted split that Megatron needs is
the balanced one; a MoE layout's ETP is Megatron-Bridge's 1, `cases.MOE_DEFAULT_ETP`) and, where the
estimator still refuses it, retypes it with the first fix its refusal offers - what a user reading the
message would do - recording each retype. Any other refusal propagates: it names a Megatron rule the row
breaks. Recompute, which no table prints, is the lightest that fits by megapilot's memory model (none,
selective); a row labelled "tokendrop" takes the capacity settings of Megatron-Bridge's token-drop helper
(factor 1.0, padded to capacity).

The model is the catalog preset of the row's shape (layers, width, heads, experts), else the preset its label
names where that preset has the row's width, heads and experts, else one built from the row's own architecture
fields; a row without an architecture takes the preset its label names (`preset_named_like`).
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict

from megapilot.errors import MegapilotError
from megapilot.estimate.cases import Case, CaseFlags
from megapilot.spec.model import ModelSpec, MoESpec
from megapilot.spec.plan_file import EstimateResult
from megapilot.spec.training import Fp8Recipe, Precision

MAX_RETYPES = 3  # at most the split and the expert TP are missing from a table
# A row labelled "tokendrop" ran Megatron-Bridge's `apply_moe_token_drop`, whose defaults its performance recipes keep:
# capacity factor 1.0, each expert's input padded to capacity
# (src/megatron/bridge/training/utils/moe_token_drop.py; scripts/performance/configs/*/ call it without arguments).
TOKEN_DROP_CAPACITY_FACTOR = 1.0
TOKEN_DROP_PAD_TO_CAPACITY = True
# The tables do not print recompute: the lightest that fits by megapilot's memory model, the rule the older
# calibration file's rows follow too.
RECOMPUTE_LADDER = ("none", "selective")
# Rows published from NVIDIA's performance recipes (NeMo, Megatron-Bridge), which keep and reduce gradients in bf16
# (`grad_reduce_in_fp32=False`); the older file's NeMo rows are costed the same way (megapilot.estimate.calibration).
BF16_GRADIENT_PUBLISHERS = ("nemo-", "bridge-")


class PublishedPrecision(NamedTuple):
    """A table's precision label as `--precision` (and `--fp8-recipe`, None for the default or a non-FP8 format)."""

    precision: Precision
    fp8_recipe: Fp8Recipe | None = None


# Label words -> the format they name, first match wins (4-bit before 8-bit: "NVFP4" holds no "fp8", but "MXFP8"
# does). Megatron-Bridge's tables print FP8-CS (per-tensor current scaling), FP8-MX (MXFP8: one E8M0 scale per 32
# values), FP8-SC / FP8-BLK / FP8-DS-style "128x128" (DeepSeek's blockwise sub-channel scaling), FP8-DS (delayed).
_PRECISION_WORDS: tuple[tuple[tuple[str, ...], PublishedPrecision], ...] = (
    (("nvfp4",), PublishedPrecision("nvfp4")),
    (("mxfp4",), PublishedPrecision("mxfp4")),
    (("fp8mx", "mxfp8"), PublishedPrecision("mxfp8")),
    (("fp8sc", "fp8blk", "blockwise", "subchannel", "128x128"), PublishedPrecision("fp8", "blockwise")),
    (("fp8ds", "delayed"), PublishedPrecision("fp8", "delayed")),
    (("fp8cs", "current", "tensorwise"), PublishedPrecision("fp8", "tensorwise")),
    (("fp8",), PublishedPrecision("fp8")),
    (("fp16",), PublishedPrecision("fp16")),
)


def published_precision(label: str | None) -> PublishedPrecision:
    """The format a table's precision label names. Only the label before any parenthesis counts: "FP8-CS (FP8-MX)"
    prints FP8-CS figures with the MXFP8 ones in parentheses, and the calibration files keep their notes there."""
    main = _key((label or "").split("(")[0])
    for words, found in _PRECISION_WORDS:
        if any(word in main for word in words):
            return found
    return PublishedPrecision("bf16")


class PublishedMoE(BaseModel):
    model_config = ConfigDict(extra="ignore")

    experts: int
    topk: int
    moe_ffn_hidden: int


class PublishedLayout(BaseModel):
    """The fields of a published calibration row that describe the model and its layout."""

    model_config = ConfigDict(extra="ignore")

    id: str
    model: str
    layers: int | None = None
    hidden: int | None = None
    ffn_hidden: int | None = None
    heads: int | None = None
    kv_heads: int | None = None
    vocab: int | None = None
    seq_len: int
    moe: PublishedMoE | None = None
    gpu: str
    num_gpus: int
    tp: int | None = None
    pp: int | None = None
    vp: int | None = None
    cp: int | None = None
    ep: int | None = None
    mbs: int | None = None
    gbs: int | None = None
    precision: str | None = None
    fsdp: bool = False
    token_drop: bool = False  # the table labels the run "tokendrop"

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> PublishedLayout:
        derived = row.get("derived") or {}
        token_drop = "tokendrop" in _key(str(row.get("model", "")))
        return cls.model_validate(row | {"fsdp": bool(derived.get("published_fsdp")), "token_drop": token_drop})

    @property
    def gemm_precision(self) -> PublishedPrecision:
        """The GEMM format and FP8 recipe the row names (`published_precision`)."""
        return published_precision(self.precision)

    @property
    def has_layout(self) -> bool:
        """Papers that print only the GPU count give no layout to type."""
        return self.tp is not None and self.pp is not None and self.gbs is not None


@dataclass
class PublishedEntry:
    """The estimate of a published row, and what had to be retyped to get it."""

    model: ModelSpec
    flags: CaseFlags
    result: EstimateResult
    case: Case  # the specs the row resolved to: what a fit re-estimates without re-validating
    retyped: list[str] = field(default_factory=list)


def catalog_model(row: PublishedLayout) -> ModelSpec:
    """The preset of the row's shape, else the preset its name names where that preset has the row's width, heads
    and experts (a table may count a hybrid's layers its own way), else a spec from its fields; a row without an
    architecture takes the preset its name names."""
    from megapilot.catalog.models import load_presets

    presets = [preset.spec for preset in load_presets().values()]
    if row.layers is None or row.hidden is None or row.heads is None:
        named = preset_named_like(row.model)
        if named is None:
            raise MegapilotError(f"{row.id}: no architecture and no preset named like {row.model!r}", field="model",
                                 fix="add the model to the catalog")
        return named
    experts = row.moe.experts if row.moe else None
    for spec in presets:
        if (spec.num_layers, spec.hidden_size, spec.num_attention_heads) == (row.layers, row.hidden, row.heads) \
                and (spec.moe.num_experts if spec.moe else None) == experts \
                and (spec.position_embedding != "learned_absolute" or spec.max_position_embeddings >= row.seq_len):
            return spec
    named = preset_named_like(row.model)
    if named is not None and (named.hidden_size, named.num_attention_heads) == (row.hidden, row.heads) \
            and (named.moe.num_experts if named.moe else None) == experts:
        return named
    return ModelSpec(
        name=row.model, num_layers=row.layers, hidden_size=row.hidden, ffn_hidden_size=row.ffn_hidden or 4 * row.hidden,
        num_attention_heads=row.heads,
        num_query_groups=row.kv_heads if row.kv_heads and row.kv_heads != row.heads else None,
        vocab_size=row.vocab or 32000, max_position_embeddings=max(row.seq_len, 4096),
        moe=MoESpec(num_experts=row.moe.experts, router_topk=row.moe.topk, moe_ffn_hidden_size=row.moe.moe_ffn_hidden)
        if row.moe else None,
    )


# A table's label may shorten a preset's name: it names the preset when it holds this many of the name's first
# characters (`Nemotron3_Nano` for nemotron3-nano-30b-a3b) or is the whole name's start (`Qwen3_235B`).
LABEL_PREFIX_CHARS = 10


def preset_named_like(label: str) -> ModelSpec | None:
    """The preset a table's model label names (NeMo and Megatron-Bridge print `LLAMA3_8B`, `DeepSeekV3_tokendrop_`,
    `LLAMA4-Scout-LLM`): the preset or alias whose whole name the label starts with, the longest such (`DeepSeek-V3.2`
    is deepseek-v3.2, not deepseek-v3); else the one preset the label shortens; None when none or several do."""
    from megapilot.catalog.models import load_presets

    key = _key(label).replace("llm", "")
    whole: list[tuple[int, ModelSpec]] = []
    shortened: dict[str, ModelSpec] = {}
    for preset in load_presets().values():
        for name_key in preset.lookup_keys:  # its name's and aliases' (catalog.models.lookup_key)
            if key.startswith(name_key):
                whole.append((len(name_key), preset.spec))
            elif key.startswith(name_key[:LABEL_PREFIX_CHARS]) or (len(key) >= 2 and name_key.startswith(key)):
                shortened[preset.spec.name] = preset.spec
    if whole:
        return max(whole, key=lambda found: found[0])[1]  # the first of the longest, in catalog order
    return next(iter(shortened.values())) if len(shortened) == 1 else None


def _key(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def published_flags(row: PublishedLayout, model_path: str, model: ModelSpec) -> CaseFlags:
    """The estimate flags the row prints (TP may span nodes on purpose: the tables are what ran)."""
    return CaseFlags.parse({
        "model": model_path, "gpu": row.gpu, "gpus": row.num_gpus, "tp": row.tp, "pp": row.pp,
        "vpp": row.vp if row.vp and row.vp > 1 else None, "cp": row.cp,
        "ep": row.ep if model.moe else None, "mbs": row.mbs, "gbs": row.gbs, "seq_len": row.seq_len,
        "precision": row.gemm_precision.precision, "fp8_recipe": row.gemm_precision.fp8_recipe,
        "fsdp": row.fsdp or None, "distributed_optimizer": None if row.fsdp else True,
        "force_tp_across_nodes": True,  # ETP, which no table prints, is a command's default (cases.MOE_DEFAULT_ETP)
        "grad_reduce_in_bf16": row.id.startswith(BF16_GRADIENT_PUBLISHERS) or None,
    } | _token_drop_flags(row, model))


def _token_drop_flags(row: PublishedLayout, model: ModelSpec) -> dict[str, float | bool]:
    """The capacity settings of a "tokendrop" run (Bridge's defaults); none for a dropless one."""
    if not (row.token_drop and model.moe):
        return {}
    return {"moe_capacity_factor": TOKEN_DROP_CAPACITY_FACTOR, "moe_pad_to_capacity": TOKEN_DROP_PAD_TO_CAPACITY}


# A refusal's fix as `CaseFlags` changes: field name -> new value.
Retype = dict[str, int | bool | str | None]


def retype_from_refusal(refusal: MegapilotError) -> Retype | None:
    """The flags a refusal's first fix supplies (a pipeline split or an expert TP); None if it offers neither. (A
    sink or sliding-window model printed with CP needs none: its CP defaults to the a2a exchange.)"""
    fix = refusal.fix or ""
    if refusal.field == "ep":
        etps = re.search(r"set etp to one of (\d+)", fix)
        return {"etp": int(etps.group(1))} if etps else None
    if refusal.field not in ("pp", "vpp") or "not divisible by pp*vpp" not in refusal.problem:
        return None
    first = fix.split("; or ")[0]
    if first.startswith("account_for"):
        return {"account_for_embedding": "account_for_embedding" in first,
                "account_for_loss": "account_for_loss" in first}
    if first.startswith("first_stage_layers"):
        counts = [int(n) for n in re.findall(r"=(\d+)", first)]
        return {"first_stage_layers": counts[0], "last_stage_layers": counts[1]}
    layout = re.search(r'pipeline_layout "([^"]+)"', first)
    return {"pipeline_layout": layout.group(1), "vpp": None} if layout else None


# Megatron-Bridge's 25.09 tables (and NeMo 25.07's GB200 table, by the same layout of its cells) print beside the
# per-tensor current-scaling figures a second FP8 granularity's in parentheses ("FP8-CS (FP8-MX)"): MXFP8 where the
# tensor cores take MX block scales (Blackwell), blockwise "sub-channel" FP8 (Megatron-Bridge's fp8_sc, 128-value
# blocks) on Hopper, which has none. The parentheses print the layout fields that differ and the throughput.
PARENTHESIZED_PRECISION = {"blackwell": "FP8-MX", "hopper": "FP8-SC"}
PARENTHESIZED_TAG = "[parenthesized"  # a parenthesized run's id: its row's id, the tag and its precision label
_PARENTHESIZED_KEYS = ("alternate_values_in_parentheses", "alternate_config_in_parentheses")
_PARENTHESIZED_LAYOUT = ("tp", "pp", "vp", "cp")


class ParenthesizedRun(NamedTuple):
    """The run a table prints in parentheses beside a row, as a row of its own, and its tokens/s/GPU."""

    row: dict[str, Any]
    tokens_per_s_per_gpu: float
    derived_from_tflops: bool  # the parentheses print TFLOP/s only: tokens/s at the row's own FLOPs per token


def parenthesized_run(raw: dict[str, Any]) -> ParenthesizedRun | None:
    """The parenthesized run beside a published row: the same model, sequence, GPU count and global batch, the
    layout fields the parentheses print (the micro-batch from their gradient accumulation: GBS / (GA x DP)), the
    other FP8 granularity (`PARENTHESIZED_PRECISION`); None when they print no throughput or the GPU has no
    second granularity. Where they print TFLOP/s alone, tokens/s follow from the row's own ratio of the two (the
    FLOPs a token costs depend on the model and sequence, not the layout)."""
    from megapilot.catalog.gpus import get_gpu

    derived = raw.get("derived") or {}
    printed = next((derived[key] for key in _PARENTHESIZED_KEYS if derived.get(key)), None)
    precision = PARENTHESIZED_PRECISION.get(get_gpu(raw["gpu"]).architecture)
    if not printed or precision is None:
        return None
    values = {_key(name): value for name, value in printed.items()}
    measured = raw.get("measured") or {}
    tokens = next((v for k, v in values.items() if "tokens" in k), None)
    tflops = next((v for k, v in values.items() if "tflop" in k), None)
    from_tflops = tokens is None and tflops is not None and bool(measured.get("tflops_per_gpu"))
    if from_tflops:
        tokens = tflops * measured["tokens_per_sec_per_gpu"] / measured["tflops_per_gpu"]
    if tokens is None:
        return None
    row = dict(raw) | {name: values[name] for name in _PARENTHESIZED_LAYOUT if name in values}
    row |= {"id": f"{raw['id']} {PARENTHESIZED_TAG} {precision}]", "precision": precision,
            "derived": derived | {"published_fsdp": values.get("fsdp", derived.get("published_fsdp"))}}
    if "ga" in values:
        dp = row["num_gpus"] // (row["tp"] * row["pp"] * (row.get("cp") or 1))
        row["mbs"] = max(1, row["gbs"] // (values["ga"] * dp))
    return ParenthesizedRun(row, float(tokens), from_tflops)


def parenthesized_twin(row_id: str) -> str | None:
    """The id of the row a parenthesized run was printed beside; None for a row as printed."""
    head, tag, _ = row_id.partition(f" {PARENTHESIZED_TAG}")
    return head if tag else None


def short_id(row_id: str, width: int) -> str:
    """A row's id cut to `width` characters for a report's table, a parenthesized run's tag kept after it."""
    twin = parenthesized_twin(row_id)
    return row_id[:width] if twin is None else f"{twin[:width]}{row_id[len(twin):]}"


def enter_published_run(row: PublishedLayout) -> PublishedEntry:
    """Estimate the row as printed, retyping it with each refusal's first fix (MegapilotError otherwise), with
    the lightest recompute that fits (`RECOMPUTE_LADDER`; the heaviest when none does)."""
    model = catalog_model(row)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "model.json"
        path.write_text(model.model_dump_json())
        flags = published_flags(row, str(path), model)
        retyped: list[str] = []
        for recompute in RECOMPUTE_LADDER:
            entry = _entered(model, flags.changed({"recompute": recompute}), retyped)
            if entry.result.fits:
                break
            flags, retyped = entry.flags, entry.retyped  # what was retyped holds for the next recompute
        return entry


def _entered(model: ModelSpec, flags: CaseFlags, retyped: list[str]) -> PublishedEntry:
    from megapilot.estimate import estimate_case  # the package imports this module; priced as `estimate` prices it

    retyped = list(retyped)
    for _ in range(MAX_RETYPES + 1):
        try:
            case, result = estimate_case(flags)
            return PublishedEntry(model, flags, result, case, retyped)
        except MegapilotError as refusal:
            extra = retype_from_refusal(refusal)
            if extra is None or len(retyped) == MAX_RETYPES:
                raise
            retyped.append(", ".join(f"{name}={value}" for name, value in extra.items() if value is not None))
            flags = flags.changed(extra)
    raise AssertionError("unreachable")  # the loop returns or raises
