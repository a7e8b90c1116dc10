"""Typed records a training log is parsed into.

Every record keeps its evidence: the file, the 1-based line number and the (ANSI-stripped) text it
came from, so that a finding can always quote the log. Records are frozen: once parsed they are
facts. Units are in the field names (`_ms`, `_gib`, `_mib`, `_s`).

Dialect names (`Dialect`):
- `megatron-lm`        Megatron-LM / Megatron-Core `training_log` lines, 2019 to today.
- `megatron-bridge`    NeMo Megatron-Bridge (`Step Time : ...` lines, `memory (GB)` reports, `Training ...`).
- `primus-megatron`    AMD Primus Megatron backend (`inst/avg` pairs, `tokens/s/GPU inst/harmonic mean`,
                       `hip mem usage/...` fields, `[rank-r/w]` logger prefix).
- `primus-torchtitan`  torchtitan, upstream or as AMD Primus's backend (`step: N loss: ... tps ... tflops ... mfu`).
- `megatron-deepspeed` Microsoft's Megatron-DeepSpeed fork (`samples per second`, `TFLOPs`, `consumed tokens`).
- `gpt-neox`           EleutherAI GPT-NeoX (`samples/sec: ... | iteration N/M |`, `lm_loss`, `approx flops per GPU`).
- `deepspeed`          DeepSpeed's own engine lines (`[Rank 0] step=N, skipped=..., lr=[...]`, `steps: N loss: ...
                       iter time (s): ... samples/sec: ...`).
- `nemo`               NeMo 1.x/2.x Lightning progress (`Epoch 0: ... N/M [..., reduced_train_loss=..., global_step=...,
                       train_step_timing in s=...]`).
Megatron-LLM (epfLLM) prints Megatron-LM's own `training_log` line, so it reads as `megatron-lm`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, Literal

from megapilot.logs.signatures import Category

Dialect = Literal["megatron-lm", "megatron-bridge", "primus-megatron", "primus-torchtitan", "megatron-deepspeed",
                  "gpt-neox", "deepspeed", "nemo"]
DIALECTS: tuple[str, ...] = ("megatron-lm", "megatron-bridge", "primus-megatron", "primus-torchtitan",
                             "megatron-deepspeed", "gpt-neox", "deepspeed", "nemo")
UNKNOWN_DIALECT = "unknown"


def _json_number(value: Any) -> Any:
    """NaN/Inf are not JSON: they travel as the strings "nan", "inf", "-inf"."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: _json_number(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_number(v) for v in value]
    return value


class _Record:
    """Shared JSON rendering for all record dataclasses."""

    def to_dict(self) -> dict[str, Any]:
        return {k: _json_number(v) for k, v in asdict(self).items()}  # type: ignore[call-overload]  # every subclass is a dataclass


@dataclass(frozen=True, slots=True)
class Evidence(_Record):
    """One log line that supports a record or a finding."""

    __pydantic_config__: ClassVar[dict[str, bool]] = {"use_attribute_docstrings": True}  # schemas that embed it

    file: str
    """The log file."""
    line: int
    """1-based line number in that file."""
    text: str
    """The line as logged."""


@dataclass(frozen=True, slots=True)
class IterationRecord(_Record):
    """One per-iteration (per log interval) metrics line.

    `elapsed_ms` is the instantaneous value (Primus prints `inst/avg`; the running average goes to
    `elapsed_avg_ms`). `tokens_per_s_per_gpu` is printed by Primus/torchtitan, or computed as
    GBS x seq / (step time x world) when the caller gives seq length and world size
    (`tokens_source` says which).
    """

    file: str
    line: int
    text: str
    dialect: str
    iteration: int
    train_iters: int | None = None
    rank: int | None = None
    time_s: float | None = None  # the line's own timestamp, seconds since the epoch (UTC)
    consumed_samples: int | None = None
    skipped_samples: int | None = None
    elapsed_ms: float | None = None
    elapsed_avg_ms: float | None = None
    tflops_per_gpu: float | None = None
    tflops_avg_per_gpu: float | None = None
    tokens_per_s_per_gpu: float | None = None
    tokens_avg_per_s_per_gpu: float | None = None
    tokens_source: Literal["printed", "computed"] | None = None
    mfu_pct: float | None = None
    lr: float | None = None
    gbs: int | None = None
    losses: dict[str, float] = field(default_factory=dict)
    loss_scale: float | None = None
    grad_norm: float | None = None
    num_zeros: float | None = None
    params_norm: float | None = None
    skipped_iterations: int | None = None
    nan_iterations: int | None = None
    memory_used_gib: float | None = None
    memory_usage_pct: float | None = None
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def lm_loss(self) -> float | None:
        """The language-model loss: `lm loss` (Megatron), `lm_loss` (GPT-NeoX), `reduced_train_loss` (NeMo; its
        progress bar's `loss` is a smoothed display value) or `loss` (torchtitan, DeepSpeed)."""
        for key in ("lm loss", "lm_loss", "reduced_train_loss", "loss"):
            if key in self.losses:
                return self.losses[key]
        return None

    @property
    def has_nonfinite(self) -> bool:
        """A NaN/Inf loss or grad norm on this line."""
        values = list(self.losses.values())
        if self.grad_norm is not None:
            values.append(self.grad_norm)
        return any(not math.isfinite(v) for v in values)

    def to_dict(self) -> dict[str, Any]:
        data = _Record.to_dict(self)
        data["lm_loss"] = _json_number(self.lm_loss)
        return data


@dataclass(frozen=True, slots=True)
class MemoryRecord(_Record):
    """A memory report of one rank.

    `source="allocator"`: Megatron's `[Rank r] (after N iterations) memory (MB|GB) | ...` (torch
    allocator counters; Megatron's "MB" is MiB). `source="device"`: device-level usage printed per
    step by Primus (`hip/rocm mem usage/free/total/usage_ratio`) or torchtitan (`memory: X GiB(Y%)`).
    """

    file: str
    line: int
    text: str
    source: Literal["allocator", "device"]
    rank: int | None = None
    after_iterations: int | None = None
    allocated_gib: float | None = None
    max_allocated_gib: float | None = None
    reserved_gib: float | None = None
    max_reserved_gib: float | None = None
    used_gib: float | None = None
    total_gib: float | None = None
    usage_pct: float | None = None

    @property
    def peak_gib(self) -> float | None:
        """The highest figure this report gives for the rank."""
        values = [v for v in (self.max_reserved_gib, self.max_allocated_gib, self.reserved_gib,
                              self.allocated_gib, self.used_gib) if v is not None]
        return max(values) if values else None


@dataclass(frozen=True, slots=True)
class TheoreticalMemoryRecord(_Record):
    """One line of Megatron's theoretical-memory / parameter-count printout."""

    file: str
    line: int
    text: str
    quantity: str  # e.g. "total_params_billion", "weight_and_optimizer_mib", "activation_mib"
    value: float


@dataclass(frozen=True, slots=True)
class TimerRecord(_Record):
    """One timer value (ms), from `(min, max) time across ranks (ms):` blocks or `time (ms) | a: x |` lines."""

    file: str
    line: int
    text: str
    name: str
    max_ms: float
    min_ms: float | None = None


@dataclass(frozen=True, slots=True)
class CheckpointEvent(_Record):
    """One checkpoint line: a save/load starting, finishing, or a load that found nothing."""

    file: str
    line: int
    text: str
    kind: Literal["save", "load"]
    phase: Literal["start", "done", "not_found"]
    iteration: int | None = None
    path: str | None = None
    time_s: float | None = None


@dataclass(frozen=True, slots=True)
class CheckpointOp(_Record):
    """A checkpoint save or load assembled from its start/done lines and timer."""

    kind: Literal["save", "load"]
    iteration: int | None
    path: str | None
    completed: bool
    duration_s: float | None
    duration_source: Literal["timestamps", "timer"] | None
    evidence: list[Evidence]
    started_s: float | None = None  # the start line's timestamp, when it printed one


@dataclass(frozen=True, slots=True)
class ErrorRecord(_Record):
    """A line that matches an error signature of the taxonomy (see `megapilot.logs.signatures`)."""

    file: str
    line: int
    text: str
    category: Category
    signature: str  # the signature's name, e.g. "cuda_oom", "nccl_watchdog"
    rank: int | None = None
    details: dict[str, str] = field(default_factory=dict)
    time_s: float | None = None  # when it happened, if the line (or torchrun's summary) says; never inherited


@dataclass(frozen=True, slots=True)
class ProgressMarker(_Record):
    """A line that says where the run is (startup phases, training done); used for hang evidence."""

    file: str
    line: int
    text: str
    marker: str  # "training_started" | "training_done" | "stall_point:<name>"
    time_s: float | None = None


@dataclass(frozen=True, slots=True)
class ArgumentsRecord(_Record):
    """The `arguments` block Megatron-LM prints at start-up (rank 0, `_print_args`).

    `values` holds every `name .... value` line as printed (value text as Python's `str` gave it); the
    typed fields are the run's shape, None where the block does not print them (or prints `None`).
    `line` is the line of the block's end (or of its last argument when it is cut short). `value_lines` keeps
    each argument's own line (number, text) from the same read, so a finding quotes it without reading the log
    again (stdin cannot be, a `.gz` log only through its opener); it stays out of the JSON, which prints `values`.
    """

    file: str
    line: int
    text: str
    values: dict[str, str] = field(default_factory=dict)
    world_size: int | None = None
    seq_length: int | None = None
    global_batch_size: int | None = None
    micro_batch_size: int | None = None
    tensor_model_parallel_size: int | None = None
    pipeline_model_parallel_size: int | None = None
    context_parallel_size: int | None = None
    expert_model_parallel_size: int | None = None
    data_parallel_size: int | None = None
    num_layers: int | None = None
    hidden_size: int | None = None
    train_iters: int | None = None
    value_lines: dict[str, tuple[int, str]] = field(default_factory=dict, repr=False)

    def to_dict(self) -> dict[str, Any]:
        data = _Record.to_dict(self)
        del data["value_lines"]
        return data

    def evidence(self, name: str) -> Evidence:
        """The block's own line for the argument `name` (`  world_size ........ 8`), or the block's end line."""
        found = self.value_lines.get(name)
        if found is None:
            return Evidence(file=self.file, line=self.line, text=self.text)
        return Evidence(file=self.file, line=found[0], text=found[1])


#: The typed fields of `ArgumentsRecord` (integers read from the block).
ARGUMENT_INT_FIELDS: tuple[str, ...] = (
    "world_size", "seq_length", "global_batch_size", "micro_batch_size", "tensor_model_parallel_size",
    "pipeline_model_parallel_size", "context_parallel_size", "expert_model_parallel_size", "data_parallel_size",
    "num_layers", "hidden_size", "train_iters",
)


class _OneLineRecord(_Record):
    """A record read from one line it keeps as its evidence: it names its file and line as every other record does."""

    evidence: Evidence

    @property
    def file(self) -> str:
        return self.evidence.file

    @property
    def line(self) -> int:
        return self.evidence.line


@dataclass(frozen=True, slots=True)
class RankTimes(_OneLineRecord):
    """One interval's per-rank compute times (ms) before the collectives, from one line (megapilot.logs.stragglers);
    `node_of_rank` is torchrun's node rank of each rank."""

    compute_ms: tuple[float, ...]
    node_of_rank: tuple[int, ...]
    evidence: Evidence


@dataclass(frozen=True, slots=True)
class StragglerReport(_OneLineRecord):
    """One `--log-straggler` report: the extreme ranks of Megatron's StragglerDetector (megapilot.logs.stragglers)."""

    fastest_rank: int
    fastest_ms: float
    slowest_rank: int
    slowest_ms: float
    lowest_throughput_ranks: tuple[int, ...]  # `Bottom N` line, else the MnEtpt rank alone
    evidence: Evidence


Record = (IterationRecord | MemoryRecord | TheoreticalMemoryRecord | TimerRecord | CheckpointEvent
          | ErrorRecord | ProgressMarker | ArgumentsRecord
          | RankTimes | StragglerReport)
