"""Line parser: one log line in, typed records out, dialect detected per line.

`LineParser` is stateful per source file (it remembers a pending Megatron-Bridge `Step Time` line,
the frames of a Python traceback being printed, and the latest timestamp seen) but holds only O(1)
state. The hot path is the iteration line: a substring test, one compiled regex, then a split on
`|`, so a plain INFO line costs a few substring tests.

Tolerated noise: ANSI colour codes, logger prefixes (`[rank3]:`, `0: `, ISO/bracketed timestamps,
`INFO:megatron...:`, Primus `[rank-7/8][INFO]`), interleaved ranks, mangled values (a field whose
value does not parse is dropped, the rest of the line is kept).
"""

from __future__ import annotations

import calendar
import math
import re
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, Literal, get_args, get_type_hints

from megapilot.logs.records import (
    ARGUMENT_INT_FIELDS,
    ArgumentsRecord,
    CheckpointEvent,
    ErrorRecord,
    IterationRecord,
    MemoryRecord,
    ProgressMarker,
    RankTimes,
    Record,
    StragglerReport,
    TheoreticalMemoryRecord,
    TimerRecord,
)
from megapilot.logs.signatures import (
    CRASH_DUMP_SIGNATURES,
    Signature,
    classify_exception,
    exception_fault,
    is_checkpoint_writer_frame,
    is_exception_line,
    match_line,
)
from megapilot.logs.stragglers import NEEDLES as STRAGGLER_NEEDLES
from megapilot.logs.stragglers import amended_report, rank_times_line, straggler_report_line

_NO_RECORDS: tuple[Record, ...] = ()

ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Za-z0-9]|\x1b")
# ` iteration      10/      50 |` (also Primus, 2019 Megatron, no leading space).
ITERATION_RE = re.compile(r"\biteration\s+(\d+)\s*/\s*(\d+)\s*\|(.*)")
# Primus torchtitan: `step:  1  loss: 12.2674  grad_norm: 3.9375  memory: 240.17GiB(95.31%)  tps: 531 ...`
TITAN_STEP_RE = re.compile(r"\bstep:\s*(\d+)\s+(loss:.*)")
TITAN_FIELD_RE = re.compile(r"([a-z_]+):\s*([^\s]+)")
# DeepSpeed's pipeline engine: `steps: 10 loss: 10.8734 iter time (s): 2.345 samples/sec: 27.296`
DEEPSPEED_STEPS_RE = re.compile(
    r"\bsteps:\s*(\d+)\s+loss:\s*(\S+)\s+iter time \(s\):\s*(\S+)(?:\s+samples/sec:\s*(\S+))?")
# NeMo 1.x (Lightning's progress bar): `Epoch 0:   1%|  | 795/77225 [9:07:58<878:01:48, 41.36s/it, loss=3.1,
# v_num=, reduced_train_loss=3.090, global_step=794.0, consumed_samples=1.63e+6]`
LIGHTNING_PROGRESS_RE = re.compile(r"(\d+)/(\d+) \[[^\],]*,\s*(?:(\d+(?:\.\d+)?)(s/it|it/s))?")
LIGHTNING_FIELD_RE = re.compile(r"([A-Za-z_][\w ]*?)=\s*([-+\w.]+)")
# A decimal number captured whole: "8..03" must not reach float() (mangled lines).
NUMBER = r"(\d+(?:\.\d+)?|\.\d+)"
BRIDGE_STEP_TIME_RE = re.compile(r"Step Time\s*:\s*" + NUMBER + r"\s*s\b(?:.*?GPU utilization:\s*" + NUMBER + r")?")
# A report's head; its `| key: value` fields run to the next head or the line's end (ranks printing at once glue
# their reports onto one line when their writes interleave, e.g. under PYTHONUNBUFFERED).
MEMORY_RE = re.compile(r"(?:\[Rank (\d+)\]\s*)?\(?after (\d+) iterations\)?\s*memory \((MB|GB)\)\s*\|", re.IGNORECASE)
# `2026-01-01 12:00:00.123`, ISO `T`, torchrun's failure summary `2026-01-01_12:00:00`, Primus `20260101 12:00:00`.
TIMESTAMP_RE = re.compile(r"(\d{4})-?(\d\d)-?(\d\d)[ T_](\d\d):(\d\d):(\d\d)(?:[.,](\d{1,9}))?")
# glog (torch's C++ and torchrun's own lines): `E1201 08:39:32.049000 28171 torch/...`: no year printed.
GLOG_TIME_RE = re.compile(r"^\s*[IWEF](\d\d)(\d\d) (\d\d):(\d\d):(\d\d)\.(\d{1,9})\s")
# A glog *warning* (torchrun's `W1201 08:39:32.049 ...`, c10's `[W1201 08:39:32.049 TCPStore.cpp:138] ...`), after any
# rank prefix torchrun's tee adds (`[default0]:`): c10d prints these while it retries a store that is not up yet and
# when a node's store goes away at the end of a job, so they are never fatal on their own; nor are the C++ backtrace
# lines c10 prints under them (`Exception raised from ...`, `frame #2: c10::DistNetworkError::...`).
GLOG_WARNING_RE = re.compile(
    r"^\s*(?:\[\w+\]:)?\s*(?:\[?W\d{4} \d\d:\d\d:\d\d\.\d+\s|frame #\d+: |Exception raised from )")
# torchrun's agent says its node's workers finished (`... worker group successfully finished. Waiting 300 seconds for
# other agents to finish`, `Done waiting for other agents`), or that the exit barrier after them failed. Past it the
# agent only waits for the other nodes, and a store gone there (the node that hosted it left first) is logged as an
# error with a `DistNetworkError` traceback that torchrun ignores (it still exits 0): not a failure of the job.
WORKERS_DONE_RE = re.compile(r"Error waiting on exit barrier|for other agents")
WORKERS_DONE_NEEDLES = ("exit barrier", "other agents")
RANK_RE = re.compile(r"\[rank(\d+)\]|\[Rank (\d+)\]|\[rank-(\d+)/\d+\]|^(\d+): |^\([\w.\- ]*,? ?rank=(\d+)")
# NCCL's own prefix `host:pid:tid [dev]`: the bracket is the process's CUDA device (its local index on the host),
# not a rank: device 3 exists on every node.
NCCL_PREFIX_RE = re.compile(r"([\w.\-]+):(\d+):\d+ \[(\d+)\] (?=\S)")
TIMER_RE = re.compile(r"([A-Za-z][\w\-/]*(?: [\w\-/]+)*) \.*: \(?\s*" + NUMBER + r"(?:,\s*" + NUMBER + r"\))?")
SAVE_START_RE = re.compile(r"saving checkpoint at iteration\s+(\d+) to (\S+)", re.IGNORECASE)
SAVE_DONE_RE = re.compile(r"successfully saved checkpoint (?:from|at) iteration\s+(\d+) to (\S+)", re.IGNORECASE)
LOAD_START_RE = re.compile(r"\bloading (?:release )?(?:distributed )?checkpoint from (\S+)(?: at iteration (\d+))?",
                           re.IGNORECASE)
LOAD_DONE_RE = re.compile(r"successfully loaded checkpoint from (\S+)(?:.*?at iteration (\d+))?", re.IGNORECASE)
NOT_FOUND_RE = re.compile(r"could not find the metadata file (\S+)", re.IGNORECASE)
THEORY_PARAMS_RE = re.compile(r"((?:Total n|N)umber of [\w ]+?) in billions:\s*" + NUMBER)
THEORY_FOOTPRINT_RE = re.compile(r"Theoretical memory footprints: (.*)")
THEORY_PART_RE = re.compile(r"([\w ]+?)=\s*" + NUMBER + r" MB")
ACTIVATION_PER_LAYER_RE = re.compile(r"Activation memory footprint per transformer layer[^:]*:\s*" + NUMBER + r" MB")
# `  seq_length ...................................... 4096` inside Megatron-LM's `arguments` block
# (`_print_args`: two spaces, the name, a space, 48 - len(name) dots, a space, the value), after any
# prefix (`[rank0]: `, torchrun's `[default0]:`); a name of 48 characters or more gets no dots.
ARGUMENT_RE = re.compile(r"(?:^|[\s:\]])([A-Za-z_]\w*) (?:\.+ |(?<=\w{48} ) )(.*)")
ARGUMENTS_NEEDLE = "arguments --"  # in both `---- arguments ----` and `---- end of arguments ----`
MAX_ARGUMENT_BLOCK_LINES = 5000  # Megatron-LM prints ~600; a block never closed ends here
PREFIX_RE = re.compile(
    # Ray's worker prefix `(RayTrainWorker pid=48213, ip=10.0.3.17)` / `(worker, rank=0, pid=7)` first
    r"^(?:\s*(?:\([\w.\-]+(?:,? (?:rank|pid|ip|node_id|local_rank|world_rank)=[\w.:\-]+)+\)|"
    r"\[rank\d+\]:|\d+:(?=\s)|\[?\d{4}-?\d\d-?\d\d[ T][\d:.,]+Z?\]?|\[rank-\d+/\d+\]|"
    r"\[(?:INFO|WARNING|WARN|ERROR|DEBUG|CRITICAL)\s*\]|(?:INFO|WARNING|ERROR|DEBUG|CRITICAL):[\w.]+:))+\s?"
)

# Progress markers: start/end of training, and the start-up steps a silent hang is known to stop at.
_MARKERS: tuple[tuple[str, str], ...] = (
    ("[before the start of training step]", "training_started"),
    ("[after training is done]", "training_done"),
    ("torchrun finished successfully", "training_done"),
    ("Emitting ninja build file", "stall_point:fused_kernel_build"),
    ("compiling and loading fused kernels", "stall_point:fused_kernel_build"),
    ("initializing torch distributed", "stall_point:distributed_init"),
    ("> initializing torch distributed", "stall_point:distributed_init"),
    ("building GPT model", "stall_point:model_build"),
    ("> building train, validation, and test datasets", "stall_point:dataset_build"),
    ("compiling dataset index builder", "stall_point:dataset_index_build"),
)

# Lines that say which release runs (`release:<what>` markers; `megapilot.diagnose.megatron_version` reads them): a
# megatron-core version as pip, `megatron.core.__version__` or a launcher prints it, a Megatron-Bridge version, an NGC
# NeMo container (its image tag, or its banner's `NVIDIA Release YY.MM` line after `== NeMo Framework ==`).
RELEASE_NEEDLES: tuple[str, ...] = ("megatron-core", "megatron_core", "megatron core", "megatron.core",
                                    "megatron-bridge", "megatron_bridge", "megatron.bridge", "megatron version",
                                    "nvidia release", "nvidia/nemo:", "nemo framework")
RELEASE_LINE_RE = re.compile(
    r"(?P<what>megatron[-_. ]core|megatron[-_. ]bridge|megatron)(?:\.__version__|\s+version|\s*==|:)\s*[:=]?\s*"
    r"v?(?P<version>\d+\.\d+(?:\.\d+)?(?:rc\d+)?)\b|"
    r"nvcr\.io/nvidia/(?P<image>nemo):(?P<tag>\d\d\.\d\d(?:\.\d+)?)|"
    r"NVIDIA Release (?P<release>\d\d\.\d\d(?:\.\d+)?)", re.IGNORECASE)

# Lowercase substrings without which `LineParser.feed` finds no record on a line and changes no state
# but the latest timestamp (bulk reading skips such lines; keep in step with `feed` and `_structured`).
RECORD_NEEDLES: tuple[str, ...] = (
    "iteration", "step:", "steps:", "_train_loss=", "train_step_timing in s=",
    "root cause (first observed failure)", "traceback (most recent call last)", "memory (", "checkpoint", ".:",
    "time (ms)",
    "in billions", "emory footprint", "step time", "training ...", ARGUMENTS_NEEDLE,
    "[nemo ",  # NeMo's logger prefix names the framework (`LineParser.feed`)
    "mainthread", "current thread 0x",  # the head of a stuck process's stack dump (`STACK_DUMP_HEAD_RE`)
    "exception",  # `SomeException: ...` alone (`LineParser._lone_exception`); `...Error:` holds the trigger "error"
    *STRAGGLER_NEEDLES,  # per-rank compute times and `--log-straggler` reports (`LineParser._straggler`)
    *(needle.lower() for needle, _ in _MARKERS),
    *RELEASE_NEEDLES,
    *WORKERS_DONE_NEEDLES,  # a node's workers done: a store gone after it is no failure (`LineParser._error`)
)

# Iteration-line field keys (lowercase) → the `IterationRecord` field they fill, or a raw slot (`_RAW_SLOTS`).
_FIELD_SLOTS: dict[str, str] = {
    "consumed samples": "consumed_samples",
    "skipped samples": "skipped_samples",
    "elapsed time per iteration (ms)": "elapsed_ms",
    "throughput per gpu (tflop/s/gpu)": "tflops_per_gpu",
    "compute per gpu (tflop/s/gpu)": "tflops_per_gpu",  # Primus from mid-2026: `412.3 (avg 410.0)`
    "tflops": "tflops_per_gpu",  # the Megatron-DeepSpeed fork: `TFLOPs: 120.37` (per GPU)
    "approx flops per gpu": "tflops_per_gpu",  # GPT-NeoX: `approx flops per GPU: 51.5TFLOPS`
    "tokens/s/gpu inst/harmonic mean": "tokens_per_s_per_gpu",
    "tokens per gpu (tokens/s/gpu)": "tokens_per_s_per_gpu",
    "learning rate": "lr",
    "global batch size": "gbs",
    "loss scale": "loss_scale",
    "grad norm": "grad_norm",
    "num zeros": "num_zeros",
    "params norm": "params_norm",
    "number of skipped iterations": "skipped_iterations",
    "number of nan iterations": "nan_iterations",
    "mem usages": "memory_usage_ratio",
    "consumed_samples": "consumed_samples",  # NeMo 2's progress printer
    "global_batch_size": "gbs",
    "lr": "lr",
    "train_step_timing in s": "step_time_s",
    "hip mem usage/free/total/usage_ratio": "device_memory",
    "rocm mem usage/free/total/usage_ratio": "device_memory",
}
# Fields printed as `inst/avg` by Primus: the attribute the second value goes to.
_AVERAGE_SLOTS: dict[str, str] = {
    "elapsed_ms": "elapsed_avg_ms", "tflops_per_gpu": "tflops_avg_per_gpu",
    "tokens_per_s_per_gpu": "tokens_avg_per_s_per_gpu",
}
# Printed forms the record does not keep as such: a step time in seconds (becomes `elapsed_ms`), Primus's
# `used/free/total/ratio` text and the ROCm fork's usage ratio (both become `memory_used_gib`/`memory_usage_pct`).
_RAW_SLOTS = frozenset({"step_time_s", "device_memory", "memory_usage_ratio"})
# `IterationRecord` is the one definition of an iteration's fields and their types: the slots are checked
# against it here, and those it types as integers are read as integers.
_RECORD_TYPES = get_type_hints(IterationRecord)
_UNKNOWN_SLOTS = (set(_FIELD_SLOTS.values()) | set(_AVERAGE_SLOTS.values())) - _RAW_SLOTS - set(_RECORD_TYPES)
if _UNKNOWN_SLOTS:
    raise TypeError(f"iteration slots {sorted(_UNKNOWN_SLOTS)} are no IterationRecord fields")
_INT_SLOTS = frozenset(slot for slot in _FIELD_SLOTS.values() if int in get_args(_RECORD_TYPES.get(slot)))
# Keys only a fork of Megatron-LM prints on its iteration line: they name the dialect.
DEEPSPEED_FORK_KEYS = frozenset({"samples per second", "tflops", "consumed tokens", "tokens per gpu per second (tgs)",
                                 "actual seqlen"})
NEOX_KEYS = frozenset({"approx flops per gpu", "lm_loss", "samples/sec"})
NEMO_KEYS = frozenset({"reduced_train_loss", "train_step_timing in s", "global_step"})


@dataclass(slots=True)
class IterationFields:
    """What one iteration line printed. `values` holds `IterationRecord` fields by name, converted to the record's
    types by `set` (a value that does not parse is dropped, the rest of the line is kept); the raw slots wait here
    until the record is built."""

    values: dict[str, Any] = field(default_factory=dict)
    device_memory: str | None = None  # Primus `63.94GB/224.04GB/287.98GB/22.20%`
    memory_usage_ratio: float | None = None  # the ROCm fork's `mem usages: 0.55`
    losses: dict[str, float] = field(default_factory=dict)
    extra: dict[str, float] = field(default_factory=dict)
    dialect: str = "megatron-lm"  # what the keys alone say; a Bridge `Step Time` line before may change it

    def set(self, slot: str, raw: str) -> None:
        """Fill `slot` from its printed text (`inst/avg` pairs split, integers kept whole)."""
        if slot == "tflops_per_gpu" and raw.endswith("FLOPS"):  # GPT-NeoX: `51.5TFLOPS`, `980.2GFLOPS`
            self.values[slot] = _scaled_flops(raw)
        elif slot == "step_time_s":
            seconds = _to_float(raw)
            self.values["elapsed_ms"] = None if seconds is None else seconds * 1000.0
        elif slot in _AVERAGE_SLOTS:
            inst, avg = _pair(raw)
            if avg is not None or slot == "tokens_per_s_per_gpu":
                self.dialect = "primus-megatron"
            self.values[slot] = inst
            self.values[_AVERAGE_SLOTS[slot]] = avg
        elif slot == "device_memory":
            self.dialect = "primus-megatron"
            self.device_memory = raw
        elif slot == "memory_usage_ratio":
            self.memory_usage_ratio = _to_float(raw)
        elif slot in _INT_SLOTS:
            number = _to_float(raw)
            if number is not None and math.isfinite(number):
                self.values[slot] = int(number)
        else:
            self.values[slot] = _to_float(raw)

    def device_usage(self) -> tuple[float | None, float | None]:
        """(used GiB, usage %) from Primus `hip mem usage/free/total/usage_ratio` or the ROCm fork's ratio."""
        if self.device_memory is not None:
            parts = [p.strip().rstrip("%").removesuffix("GB").removesuffix("GiB")
                     for p in self.device_memory.split("/")]
            numbers = [_to_float(p) for p in parts]
            if len(numbers) == 4:
                return numbers[0], numbers[3]
        if self.memory_usage_ratio is not None:
            return None, self.memory_usage_ratio * 100.0
        return None, None


@dataclass(frozen=True)
class ParseOptions:
    """What a log does not print but a metric needs.

    `seq_length` and `world_size` let tokens/s/GPU be computed as GBS x seq / (step time x world)
    when the line does not print it; `global_batch_size` is used when the line lacks `global batch size`.
    Each one not given here is taken from the log's Megatron-LM `arguments` block, if it has one.
    """

    seq_length: int | None = None
    world_size: int | None = None
    global_batch_size: int | None = None


def parse_timestamp(text: str, *, last: bool = False) -> float | None:
    """Seconds since the epoch (UTC) of the first (or last) timestamp in `text`, or None."""
    if last:
        return last_timestamp(text)
    found = TIMESTAMP_RE.search(text)
    return _timestamp_from_match(found) if found else None


def last_timestamp(text: str, end: int | None = None) -> float | None:
    """The last timestamp in `text[:end]`, or None: the one helper for "the most precise stamp before the
    message" (Primus prints an outer and an inner timestamp; the inner one, last, has the microseconds)."""
    final = None
    for final in TIMESTAMP_RE.finditer(text, 0, len(text) if end is None else end):  # noqa: B007 - keep the last
        pass
    return _timestamp_from_match(final) if final is not None else None


def _timestamp_from_match(found: re.Match[str]) -> float | None:
    year, month, day, hour, minute, second, fraction = found.groups()
    try:
        whole = calendar.timegm((int(year), int(month), int(day), int(hour), int(minute), int(second), 0, 0, 0))
    except (ValueError, OverflowError):
        return None
    if not (1 <= int(month) <= 12 and 1 <= int(day) <= 31):
        return None
    return whole + (int(fraction) / 10 ** len(fraction) if fraction else 0.0)


def prefix_time(prefix: str) -> float | None:
    """The timestamp of an iteration line: the last one in its prefix (Primus has an outer and an inner)."""
    if not prefix or not any(ch.isdigit() for ch in prefix):
        return None
    return last_timestamp(prefix)


def leading_time(text: str) -> float | None:
    """The time any other line sets: the first timestamp in its first 96 characters (digits in the first 40)."""
    head = text[:96]
    if not any(ch.isdigit() for ch in head[:40]):
        return None
    found = TIMESTAMP_RE.search(head)
    return _timestamp_from_match(found) if found else None


def _to_float(value: str) -> float | None:
    try:
        return float(value)
    except ValueError:
        return None


_FLOPS_SCALE_TO_T = {"": 1e-12, "K": 1e-9, "M": 1e-6, "G": 1e-3, "T": 1.0, "P": 1e3, "E": 1e6}


def _scaled_flops(raw: str) -> float | None:
    """`51.5TFLOPS` → 51.5, `980.2GFLOPS` → 0.9802 (TFLOP/s): GPT-NeoX prints human-readable FLOP/s."""
    number = raw.removesuffix("FLOPS").strip()
    unit = number[-1:] if number[-1:].isalpha() else ""
    value = _to_float(number[: len(number) - len(unit)])
    scale = _FLOPS_SCALE_TO_T.get(unit.upper())
    return None if value is None or scale is None else value * scale


def _pair(value: str) -> tuple[float | None, float | None]:
    """`654.5/735.1` → (654.5, 735.1); `412.3 (avg 410.0)` → (412.3, 410.0); `658.3` → (658.3, None)."""
    if value.endswith(")") and "(avg " in value:
        first, _, second = value[:-1].partition("(avg ")
        return _to_float(first.strip()), _to_float(second.strip())
    if "/" in value:
        first, _, second = value.partition("/")
        return _to_float(first.strip()), _to_float(second.strip())
    return _to_float(value), None


def rank_of(text: str) -> int | None:
    """The rank a line names in its prefix (`[rank3]:`, `[Rank 3]`, `[rank-3/8]`, `3: `); NCCL's `host:pid:tid [3]`
    names a device, not a rank (`_details` keeps it)."""
    found = RANK_RE.search(text)
    if not found:
        return None
    return int(next(group for group in found.groups() if group is not None))


def strip_prefix(text: str) -> str:
    """The line without logger prefixes (ranks, timestamps, log levels)."""
    found = PREFIX_RE.match(text)
    return text[found.end():] if found else text
# Lines of a traceback kept with the error a signature matched inside it (its innermost frames and their code).
TRACEBACK_FRAMES_KEPT = 6


class LineParser:
    """Parses the lines of one source (file name kept for evidence)."""

    def __init__(self, file: str, options: ParseOptions | None = None,
                 arguments: ArgumentsRecord | None = None) -> None:
        """`arguments`: a block already read from another file of the same run (rank 0's log)."""
        self.file = file
        self.options = options or ParseOptions()
        self.arguments: ArgumentsRecord | None = None  # the latest `arguments` block read
        self._argument_values: dict[str, str] | None = None  # while inside a block: the values so far
        self._argument_lines: dict[str, tuple[int, str]] = {}  # and each one's own line, for evidence
        self._arguments_start_line = 0
        self._use_shape(arguments)
        self.last_time_s: float | None = None
        self.bridge_seen = False
        self._pending_step_time_s: float | None = None
        self._pending_bridge_tflops: float | None = None
        self._traceback_frames: deque[str] | None = None
        self.framework_hints: Counter[str] = Counter()  # frameworks named by traceback frames' paths or own lines
        self._nemo_banner = False  # NeMo's container banner seen: its `NVIDIA Release` line names the container
        self._crash_lines_left = 0  # lines after a segfault/abort still read as its stack dump
        self._crash_in_writer_reported = False
        self._launcher_summary: dict[str, str] | None = None  # inside torchrun's failure summary: its fields so far
        self._stack_dump: ErrorRecord | None = None  # a stuck process's stack dump head, waiting for its first frame
        self._straggler_report: StragglerReport | None = None  # the last `--log-straggler` report, for its `Bottom N`
        self._workers_done = False  # torchrun said this node's workers finished (`WORKERS_DONE_RE`)

    # ---- entry point ----------------------------------------------------------------------------
    def feed(self, line_no: int, text: str) -> tuple[Record, ...]:
        """Records found on one line (usually none)."""
        if "\x1b" in text:
            text = ANSI_RE.sub("", text)
        if "iteration" in text:
            found = ITERATION_RE.search(text)
            if found:
                iteration = self._iteration(line_no, text, found)
                return (iteration, *self._memory_reports(line_no, text))  # another rank's report glued on
        if "step:" in text:
            found = TITAN_STEP_RE.search(text)
            if found:
                return self._titan_step(line_no, text, found)
        if "steps:" in text:
            found = DEEPSPEED_STEPS_RE.search(text)
            if found:
                return (self._deepspeed_steps(line_no, text, found),)
        if "_train_loss=" in text or "train_step_timing in s=" in text:
            record = self._lightning_progress(line_no, text)
            if record is not None:
                # a progress bar has no newline: the next message (an NCCL timeout, say) lands after its `]`
                after_bar = text[text.find("]", text.find("_train_loss=")) + 1:] if "]" in text else ""
                error = self._error(line_no, after_bar) if after_bar.strip() else None
                return (record,) if error is None else (record, error)
        self._note_time(text)
        if self._argument_values is not None:
            handled = self._argument_line(line_no, text)
            if handled is not None:
                return handled
        if text.startswith(NEMO_LOGGER_PREFIX):
            # NeMo's logger prefixes every message. Counted here, past the iteration dialects, on lines that both
            # reading paths hand to the parser (the prefix is one of its needles), so the hint is the same either way.
            self.framework_hints["nemo"] += 1
        return self._error_or_structured(line_no, text)

    def _error_or_structured(self, line_no: int, text: str) -> tuple[Record, ...]:
        error = self._error(line_no, text)
        if error is not None:
            return (error, *self._memory_reports(line_no, text))
        return self._structured(line_no, text)

    @property
    def computes_tokens(self) -> bool:
        """Whether tokens/s/GPU can be computed for lines that do not print it (a sequence length is known)."""
        return bool(self.seq_length)

    def _use_shape(self, arguments: ArgumentsRecord | None) -> None:
        """The run's shape for computed tokens/s/GPU: the options first, then the `arguments` block."""
        options = self.options
        self.seq_length = options.seq_length or (arguments.seq_length if arguments else None)
        self.world_size = options.world_size or (arguments.world_size if arguments else None)
        self.global_batch_size = options.global_batch_size or (arguments.global_batch_size if arguments else None)

    # ---- iteration lines --------------------------------------------------------------------------
    def _iteration(self, line_no: int, text: str, found: re.Match[str]) -> IterationRecord:
        record = self._iteration_record(line_no, text, found)
        self._workers_done = False  # training again (a restart in the same log)
        if self._pending_step_time_s is not None:  # the Bridge `Step Time` line is used up by this line
            self._pending_step_time_s = self._pending_bridge_tflops = None
        if record.time_s is not None:
            self.last_time_s = record.time_s
        return record

    def iteration_record(self, line_no: int, text: str) -> IterationRecord | None:
        """The record `feed` builds from an iteration line (None if `text` is not one), without `feed`'s effects on
        the parser (its latest timestamp, a Bridge `Step Time` used up): for a reader that already accounted for the
        line's effects (bulk reading) and builds records only for some lines. ANSI-free text only."""
        if "iteration" not in text:
            return None
        found = ITERATION_RE.search(text)
        if found is None:
            return None
        return self._iteration_record(line_no, text, found)

    def _iteration_record(self, line_no: int, text: str, found: re.Match[str]) -> IterationRecord:
        prefix = text[: found.start()]
        fields = IterationFields()
        if "[rank-" in prefix:
            fields.dialect = "primus-megatron"
        elif "samples/sec" in prefix:
            fields.dialect = "gpt-neox"
        for part in found.group(3).split("|"):
            key, sep, raw = part.partition(":")
            if not sep:  # 2019 format: `learning rate 1.010E-06`, `lm loss 1.020020E+01`
                key, _, raw = part.strip().rpartition(" ")
            key = key.strip().lower()
            raw = raw.strip()
            if key and raw:
                self._iteration_field(fields, key, raw)
        return self._build_iteration(line_no, text, found, prefix_time(prefix), fields)

    @staticmethod
    def _iteration_field(fields: IterationFields, key: str, raw: str) -> None:
        if key in NEOX_KEYS:
            fields.dialect = "gpt-neox"
        elif key in NEMO_KEYS:
            fields.dialect = "nemo"
        elif key in DEEPSPEED_FORK_KEYS and fields.dialect == "megatron-lm":
            fields.dialect = "megatron-deepspeed"
        slot = _FIELD_SLOTS.get(key)
        if slot is not None:
            fields.set(slot, raw)
            return
        number = _to_float(raw)
        if number is None:
            return
        if "loss" in key:
            fields.losses[key] = number
        else:
            fields.extra[key] = number

    def _build_iteration(self, line_no: int, text: str, found: re.Match[str], time_s: float | None,
                         fields: IterationFields) -> IterationRecord:
        """The record of an iteration line, the parser left as it is (`_iteration` applies the line's effects)."""
        values = fields.values
        if self._pending_step_time_s is not None:  # Megatron-Bridge prints `Step Time` just before
            if values.get("elapsed_ms") is None:
                values["elapsed_ms"] = self._pending_step_time_s * 1000.0
            if values.get("tflops_per_gpu") is None:
                values["tflops_per_gpu"] = self._pending_bridge_tflops
        if values.get("tokens_per_s_per_gpu") is not None:
            values["tokens_source"] = "printed"
        else:
            tokens = self.computed_tokens_per_s(values.get("gbs"), values.get("elapsed_ms"))
            values["tokens_per_s_per_gpu"] = tokens
            values["tokens_source"] = "computed" if tokens is not None else None
        values["memory_used_gib"], values["memory_usage_pct"] = fields.device_usage()
        dialect = "megatron-bridge" if fields.dialect == "megatron-lm" and self.bridge_seen else fields.dialect
        return IterationRecord(
            file=self.file, line=line_no, text=text, dialect=dialect,
            iteration=int(found.group(1)), train_iters=int(found.group(2)), rank=rank_of(text[: found.start()]),
            time_s=time_s, losses=fields.losses, extra=fields.extra, **values,
        )

    def computed_tokens_per_s(self, gbs: int | None, elapsed_ms: float | None) -> float | None:
        """GBS x seq / (step time x world) when the run's shape is known (else None)."""
        gbs = gbs or self.global_batch_size
        seq, world = self.seq_length, self.world_size
        if not (gbs and seq and world and elapsed_ms and elapsed_ms > 0):
            return None
        return gbs * seq / (elapsed_ms / 1000.0 * world)

    def _time_in_prefix(self, prefix: str) -> float | None:
        time_s = prefix_time(prefix)
        if time_s is not None:
            self.last_time_s = time_s
        return time_s

    # ---- Primus torchtitan -----------------------------------------------------------------------------
    def _titan_step(self, line_no: int, text: str, found: re.Match[str]) -> tuple[Record, ...]:
        # upstream torchtitan groups thousands (`tps: 10,050`); Primus prints them plain
        fields = {key: value.replace(",", "") for key, value in TITAN_FIELD_RE.findall(found.group(2))}
        losses: dict[str, float] = {}
        loss = _to_float(fields.get("loss", ""))
        if loss is not None:
            losses["loss"] = loss
        used_gib = usage_pct = None
        memory = fields.get("memory", "")
        if "GiB" in memory:
            used_text, _, pct_text = memory.partition("GiB")
            used_gib = _to_float(used_text)
            usage_pct = _to_float(pct_text.strip("()%"))
        time_s = self._time_in_prefix(text[: found.start()])
        rank = rank_of(text[: found.start()])
        step = IterationRecord(
            file=self.file, line=line_no, text=text, dialect="primus-torchtitan", iteration=int(found.group(1)),
            rank=rank, time_s=time_s, losses=losses, grad_norm=_to_float(fields.get("grad_norm", "")),
            tflops_per_gpu=_to_float(fields.get("tflops", "")),
            tokens_per_s_per_gpu=_to_float(fields.get("tps", "")),
            tokens_source="printed" if "tps" in fields else None,
            mfu_pct=_to_float(fields.get("mfu", "").rstrip("%")),
            memory_used_gib=used_gib, memory_usage_pct=usage_pct,
        )
        if used_gib is None:
            return (step,)
        memory_record = MemoryRecord(file=self.file, line=line_no, text=text, source="device", rank=rank,
                                     after_iterations=step.iteration, used_gib=used_gib, usage_pct=usage_pct)
        return step, memory_record

    # ---- DeepSpeed and NeMo (Lightning) --------------------------------------------------------------
    def _deepspeed_steps(self, line_no: int, text: str, found: re.Match[str]) -> IterationRecord:
        loss, seconds = _to_float(found.group(2)), _to_float(found.group(3))
        samples = _to_float(found.group(4) or "")
        return IterationRecord(
            file=self.file, line=line_no, text=text, dialect="deepspeed", iteration=int(found.group(1)),
            rank=rank_of(text[: found.start()]), time_s=self._time_in_prefix(text[: found.start()]),
            elapsed_ms=None if seconds is None else seconds * 1000.0,
            losses={} if loss is None else {"loss": loss},
            extra={} if samples is None else {"samples/sec": samples},
        )

    def _lightning_progress(self, line_no: int, text: str) -> IterationRecord | None:
        """A NeMo 1.x progress-bar segment; the iteration is `global_step` (optimizer steps done), else the bar's
        position; the step time is `train_step_timing in s`, else the bar's s/it rate."""
        bar = LIGHTNING_PROGRESS_RE.search(text)
        if bar is None:
            return None
        fields = dict(LIGHTNING_FIELD_RE.findall(text[bar.end():]))
        step = _to_float(fields.get("global_step", ""))
        timing = _to_float(fields.get("train_step_timing in s", ""))
        if timing is None and bar.group(3):
            rate = float(bar.group(3))
            timing = rate if bar.group(4) == "s/it" else (1.0 / rate if rate else None)
        losses = {key: value for key, value in ((k, _to_float(v)) for k, v in fields.items() if "loss" in k)
                  if value is not None}
        consumed = _to_float(fields.get("consumed_samples", ""))
        return IterationRecord(
            file=self.file, line=line_no, text=text, dialect="nemo",
            iteration=int(step) if step is not None and math.isfinite(step) else int(bar.group(1)),
            train_iters=int(bar.group(2)), time_s=self.last_time_s,
            elapsed_ms=None if timing is None else timing * 1000.0, losses=losses,
            consumed_samples=int(consumed) if consumed is not None and math.isfinite(consumed) else None,
            lr=_to_float(fields.get("lr", "")),
        )

    # ---- errors and tracebacks -----------------------------------------------------------------------
    @property
    def reads_every_line(self) -> bool:
        """Whether the next line must reach `feed` whatever it says: inside a traceback, a crash's stack dump,
        a launcher's failure summary or an `arguments` block (bulk reading otherwise skips needle-free lines)."""
        return (self._traceback_frames is not None or self._argument_values is not None
                or self._crash_lines_left > 0 or self._launcher_summary is not None or self._stack_dump is not None)

    @property
    def awaits_step_line(self) -> bool:
        """Whether a Megatron-Bridge `Step Time` line is waiting for the iteration line it belongs to."""
        return self._pending_step_time_s is not None

    def _error(self, line_no: int, text: str) -> ErrorRecord | None:
        if any(needle in text for needle in WORKERS_DONE_NEEDLES) and WORKERS_DONE_RE.search(text):
            self._workers_done = True
            return None
        error = self._error_of(line_no, text)
        if error is not None and error.category == "rendezvous_failure" and (
                self._workers_done or GLOG_WARNING_RE.match(text)):
            # a store gone after this node's workers finished (torchrun ignores it too), or c10d's warning while it
            # retries a store or shuts a rendezvous down: a rendezvous that really fails raises, and that line counts
            return None
        return error

    def _error_of(self, line_no: int, text: str) -> ErrorRecord | None:
        if self._stack_dump is not None:
            return self._stack_dump_frame(text)
        if ("MainThread" in text or "Current thread" in text) and STACK_DUMP_HEAD_RE.match(strip_prefix(text)):
            self._stack_dump = ErrorRecord(file=self.file, line=line_no, text=text, category="hang",
                                           signature="stack_dump", rank=rank_of(text), details={},
                                           time_s=self._own_time(text))
            return None
        if self._launcher_summary is not None:
            self._launcher_summary_line(text)
        elif LAUNCHER_SUMMARY_NEEDLE in text:
            self._launcher_summary = {}
        signature = match_line(text)
        if signature is not None:
            return self._signature_error(line_no, text, signature)
        if "Traceback (most recent call last)" in text:
            self._traceback_frames = deque(maxlen=40)
            return None
        if self._crash_lines_left > 0:
            in_writer = self._crash_stack_line(line_no, text)
            if in_writer is not None:
                return in_writer
        if self._traceback_frames is None:
            return self._lone_exception(line_no, text)
        bare = strip_prefix(text)
        if bare.lstrip().startswith("File ") or bare.startswith((" ", "\t")):
            self._traceback_frames.append(bare)
            self._note_framework(bare)
            return None
        if is_exception_line(bare):
            return self._exception(line_no, text, bare)
        return None

    def _stack_dump_frame(self, text: str) -> ErrorRecord | None:
        """The innermost frame under a stuck thread's head (py-spy `wait (threading.py:320)`, faulthandler
        `  File "threading.py", line 320 in wait`): where the process waits."""
        head, self._stack_dump = self._stack_dump, None
        assert head is not None
        frame = strip_prefix(text).strip()
        if not frame:
            return None
        return ErrorRecord(file=head.file, line=head.line, text=head.text, category="hang", signature="stack_dump",
                           rank=head.rank, details={"waits_in": frame}, time_s=head.time_s)

    def _lone_exception(self, line_no: int, text: str) -> ErrorRecord | None:
        """`RuntimeError: ...` with no traceback above it (an excerpt, a launcher's echo, a rank that printed only
        the message): still the exception that ended the process, named by itself. Only a line that starts with the
        exception's name and carries a message counts, so a log message that mentions an error does not."""
        if "Error: " not in text and "Exception: " not in text:  # every line reaches here: a substring test first
            return None
        bare = strip_prefix(text)
        found = exception_fault(bare)
        if found is None or not found["message"]:
            return None
        category, exception_name = classify_exception(bare, []) or ("process_crash", found["name"])
        return ErrorRecord(file=self.file, line=line_no, text=text, category=category,
                           signature=f"exception:{exception_name}", rank=rank_of(text), details={"frame": ""},
                           time_s=self._own_time(text))

    def _note_framework(self, frame: str) -> None:
        if PRIMUS_FRAME_NEEDLE in frame.lower():  # a platform, not a framework: Primus runs on ROCm
            self.framework_hints[PRIMUS_HINT] += 1
        for needle, framework in FRAMEWORK_FRAME_NEEDLES:
            if needle in frame:
                self.framework_hints[framework] += 1
                return

    def _signature_error(self, line_no: int, text: str, signature: Signature) -> ErrorRecord:
        frames = self._traceback_frames
        if signature.category != "oom":  # an OOM line may sit inside a traceback; anything else ends it
            self._traceback_frames = None
        if signature.name in CRASH_DUMP_SIGNATURES:
            self._crash_lines_left, self._crash_in_writer_reported = CRASH_STACK_LINES, False
        rank, details = rank_of(text), _details(text)
        if frames:  # the code the error was raised in: its last frames, innermost last
            details["frames"] = " | ".join(frame.strip() for frame in list(frames)[-TRACEBACK_FRAMES_KEPT:])
        if self._launcher_summary and signature.category == "process_crash":
            rank = _int_or_none(self._launcher_summary.get("rank")) if rank is None else rank
            details.update({f"launcher_{key}": value for key, value in self._launcher_summary.items()})
        if signature.name == "rerun_state_machine":
            rank = rank if rank is not None else _rerun_rank(text)
        return ErrorRecord(file=self.file, line=line_no, text=text, category=signature.category,
                           signature=signature.name, rank=rank, details=details, time_s=self._own_time(text))

    def _exception(self, line_no: int, text: str, bare: str) -> ErrorRecord | None:
        """The last line of a traceback: classified by its frames; an exception raised elsewhere is still a crash
        (what a rank's stderr shows when nothing else names the cause)."""
        frames = list(self._traceback_frames or ())
        self._traceback_frames = None
        classified = classify_exception(bare, frames)
        if classified is None:
            return None
        category, exception_name = classified
        details = {"frame": frames[-1].strip() if frames else ""}
        raised_at = _raised_at(frames)
        if raised_at:
            details["raised_at"] = raised_at
        return ErrorRecord(file=self.file, line=line_no, text=text, category=category,
                           signature=f"exception:{exception_name}", rank=rank_of(text),
                           details=details, time_s=self._own_time(text))

    def _crash_stack_line(self, line_no: int, text: str) -> ErrorRecord | None:
        """A line of the stack a segfault/abort dumps (faulthandler, c10 or glibc backtrace): a frame inside the
        checkpoint writer makes the crash a failed checkpoint save, whatever the crash line said."""
        self._crash_lines_left -= 1
        if self._crash_in_writer_reported or not is_checkpoint_writer_frame(text):
            return None
        self._crash_in_writer_reported = True
        return ErrorRecord(file=self.file, line=line_no, text=text, category="checkpoint_save_failure",
                           signature="crash_in_checkpoint_writer", rank=rank_of(text),
                           details={"frame": strip_prefix(text).strip()}, time_s=self._own_time(text))

    def _own_time(self, text: str) -> float | None:
        """When an error line says it happened: its own timestamp (a glog stamp takes the year of the latest full
        timestamp, else the current one), or the `time` of the torchrun failure summary it sits in; None when it
        prints none (the latest timestamp before it is only a lower bound, too early to order failures by)."""
        own = leading_time(text)
        if own is not None:
            return own
        glog = GLOG_TIME_RE.match(text)
        if glog is not None:
            year = time.gmtime(self.last_time_s).tm_year if self.last_time_s is not None else time.gmtime().tm_year
            month, day, hour, minute, second, fraction = glog.groups()
            return parse_timestamp(f"{year}-{month}-{day} {hour}:{minute}:{second}.{fraction}")
        summary_time = (self._launcher_summary or {}).get("time")
        return parse_timestamp(summary_time) if summary_time else None

    def _launcher_summary_line(self, text: str) -> None:
        """torchrun's `Root Cause (first observed failure)` block: its rank/host/time fields name the failed
        rank, which the block's `exitcode` and `Signal 9 (SIGKILL)` lines do not print themselves."""
        assert self._launcher_summary is not None
        found = LAUNCHER_FIELD_RE.match(strip_prefix(text))
        if found is not None:
            self._launcher_summary[found.group(1)] = found.group(2).split(" ")[0] if found.group(1) == "rank" \
                else found.group(2)
        elif text.strip().startswith("=====") and self._launcher_summary:
            self._launcher_summary = None

    # ---- the `arguments` block ----------------------------------------------------------------------
    def _argument_line(self, line_no: int, text: str) -> tuple[Record, ...] | None:
        """A line inside an `arguments` block: () for an argument, the record at the end, None for a line
        that is neither (another rank's output, parsed as usual)."""
        assert self._argument_values is not None
        if ARGUMENTS_NEEDLE in text and "end of arguments" in text:
            return (self._finish_arguments(line_no, text),)
        if line_no - self._arguments_start_line > MAX_ARGUMENT_BLOCK_LINES:
            return (self._finish_arguments(line_no, text), *self._error_or_structured(line_no, text))
        found = ARGUMENT_RE.search(text)
        if found is None:
            return None
        self._argument_values[found.group(1)] = found.group(2).rstrip()
        self._argument_lines[found.group(1)] = (line_no, text)
        return _NO_RECORDS

    def _finish_arguments(self, line_no: int, text: str) -> ArgumentsRecord:
        values, self._argument_values = self._argument_values or {}, None
        lines, self._argument_lines = self._argument_lines, {}
        typed = {name: _int_or_none(values.get(name)) for name in ARGUMENT_INT_FIELDS}
        record = ArgumentsRecord(file=self.file, line=line_no, text=text, values=values, value_lines=lines, **typed)
        self.arguments = record
        self._use_shape(record)
        return record

    # ---- everything else -------------------------------------------------------------------------------
    def _note_time(self, text: str) -> None:
        time_s = leading_time(text)
        if time_s is not None:
            self.last_time_s = time_s

    def _structured(self, line_no: int, text: str) -> tuple[Record, ...]:
        reports = self._memory_reports(line_no, text)
        if reports:
            return reports
        if "checkpoint" in text:
            event = self._checkpoint(line_no, text)
            if event is not None:
                return (event,)
        if ".:" in text or "time (ms)" in text:
            timers = self._timers(line_no, text)
            if timers:
                return timers
        if "in billions" in text or "emory footprint" in text:
            return self._theoretical(line_no, text)
        if "Step Time" in text:
            found = BRIDGE_STEP_TIME_RE.search(text)
            if found:
                self.bridge_seen = True
                self._pending_step_time_s = float(found.group(1))
                self._pending_bridge_tflops = _to_float(found.group(2)) if found.group(2) else None
                return _NO_RECORDS
        if "-- arguments --" in text:  # the block's first line (`---- end of arguments ----` ends it)
            self._argument_values = {}
            self._argument_lines = {}
            self._arguments_start_line = line_no
            return _NO_RECORDS
        release = self._release(text)
        if release is not None:
            return (ProgressMarker(file=self.file, line=line_no, text=text, marker=release, time_s=self.last_time_s),)
        if "[rank@node]" in text or "Rtt/Rnk" in text or "^^^^ Bottom" in text:
            straggler = self._straggler(line_no, text)
            if straggler is not None:
                return (straggler,)
        for needle, marker in _MARKERS:
            if needle in text:
                return (ProgressMarker(file=self.file, line=line_no, text=text, marker=marker,
                                       time_s=self.last_time_s),)
        if text.strip().lower() in ("training ...", "training ...\x00"):
            if text.lstrip().startswith(BRIDGE_TRAINING_LINE):
                # Megatron-LM prints `training ...` in every release; Megatron-Bridge printed `Training ...` (until
                # its `Step Time` lines came) before the same Megatron-style iteration lines
                self.bridge_seen = True
                self.framework_hints["megatron-bridge"] += 1
            return (ProgressMarker(file=self.file, line=line_no, text=text, marker="training_started",
                                   time_s=self.last_time_s),)
        return _NO_RECORDS

    def _release(self, text: str) -> str | None:
        """`release:megatron-core=0.16.1`, `release:megatron-bridge=0.2.0`, `release:nemo-container=25.02` for a line
        that names the release running (RELEASE_LINE_RE), else None."""
        lowered = text.lower()
        if "nemo framework" in lowered and "==" in text:  # the NGC banner's head: its `NVIDIA Release` line follows
            self._nemo_banner = True
            return None
        if not any(needle in lowered for needle in RELEASE_NEEDLES):
            return None
        found = RELEASE_LINE_RE.search(text)
        if found is None:
            return None
        if found.group("version"):
            what = found.group("what").lower().replace("_", "-").replace(".", "-").replace(" ", "-")
            return f"release:{'megatron-core' if what == 'megatron' else what}={found.group('version')}"
        if found.group("tag"):
            return f"release:nemo-container={found.group('tag')}"
        if self._nemo_banner:
            return f"release:nemo-container={found.group('release')}"
        return None

    def _straggler(self, line_no: int, text: str) -> RankTimes | StragglerReport | None:
        """A per-rank timing line; a `Bottom N` line gives the report before it again, amended (same evidence)."""
        if (times := rank_times_line(self.file, line_no, text)) is not None:
            return times
        if (report := straggler_report_line(self.file, line_no, text)) is not None:
            self._straggler_report = report
            return report
        if self._straggler_report is not None and (amended := amended_report(self._straggler_report, text)):
            self._straggler_report = amended
            return amended
        return None

    def _memory_reports(self, line_no: int, text: str) -> tuple[MemoryRecord, ...]:
        """Every memory report on the line, each with the fields up to the next report's head (ranks printing at once
        glue their reports onto one line, or onto an iteration or error line)."""
        if "memory (" not in text:
            return ()
        heads = list(MEMORY_RE.finditer(text))
        ends = [head.start() for head in heads[1:]] + [len(text)]  # one more end than heads only when there are none
        return tuple(self._memory(line_no, text, head, text[head.end():end])
                     for head, end in zip(heads, ends, strict=False))

    def _memory(self, line_no: int, text: str, found: re.Match[str], fields: str) -> MemoryRecord:
        to_gib = 1 / 1024.0 if found.group(3).upper() == "MB" else 1.0  # Megatron's "MB" is MiB; Bridge's GB is GiB
        if found.group(3).upper() == "GB":
            self.bridge_seen = True
        slots: dict[str, float] = {}
        for part in fields.split("|"):
            key, sep, raw = part.partition(":")
            number = _to_float(raw.strip()) if sep else None
            if number is None:
                continue
            key = key.strip().lower()
            peak = "max" in key
            if "alloc" in key:
                slots["max_allocated_gib" if peak else "allocated_gib"] = number * to_gib
            elif "reserved" in key or "cached" in key:
                slots["max_reserved_gib" if peak else "reserved_gib"] = number * to_gib
            elif "total device memory used" in key or "used" in key:
                slots["used_gib"] = number * to_gib
        return MemoryRecord(
            file=self.file, line=line_no, text=text, source="allocator",
            rank=int(found.group(1)) if found.group(1) else None, after_iterations=int(found.group(2)), **slots,
        )

    def _checkpoint(self, line_no: int, text: str) -> CheckpointEvent | None:
        time_s = self._event_time(text)

        def event(kind: Literal["save", "load"], phase: Literal["start", "done", "not_found"], iteration: str | None,
                  path: str) -> CheckpointEvent:
            return CheckpointEvent(file=self.file, line=line_no, text=text, kind=kind, phase=phase,
                                   iteration=int(iteration) if iteration else None, path=path, time_s=time_s)

        if found := SAVE_DONE_RE.search(text):
            return event("save", "done", found.group(1), found.group(2))
        if found := SAVE_START_RE.search(text):
            return event("save", "start", found.group(1), found.group(2))
        if found := LOAD_DONE_RE.search(text):
            return event("load", "done", found.group(2), found.group(1))
        if found := LOAD_START_RE.search(text):
            return event("load", "start", found.group(2), found.group(1))
        if found := NOT_FOUND_RE.search(text):
            return event("load", "not_found", None, found.group(1))
        return None

    def _event_time(self, text: str) -> float | None:
        """The most precise timestamp before the message: the last one in the first 160 characters."""
        time_s = last_timestamp(text, 160)
        return time_s if time_s is not None else self.last_time_s

    def _timers(self, line_no: int, text: str) -> tuple[TimerRecord, ...]:
        if "time (ms) |" in text:  # older inline form: `time (ms) | forward: 132.49 | backward: 182.57`
            timers = []
            for part in text.split("time (ms) |", 1)[1].split("|"):
                name, sep, raw = part.partition(":")
                value = _to_float(raw.strip()) if sep else None
                if value is not None and name.strip():
                    timers.append(TimerRecord(file=self.file, line=line_no, text=text, name=name.strip(),
                                              max_ms=value))
            return tuple(timers)
        found = TIMER_RE.search(text)
        if not found or " ." not in text:
            return ()
        first, second = _to_float(found.group(2)), _to_float(found.group(3)) if found.group(3) else None
        if first is None:
            return ()
        if second is None:
            return (TimerRecord(file=self.file, line=line_no, text=text, name=found.group(1), max_ms=first),)
        return (TimerRecord(file=self.file, line=line_no, text=text, name=found.group(1), min_ms=first,
                            max_ms=second),)

    def _theoretical(self, line_no: int, text: str) -> tuple[Record, ...]:
        records: list[Record] = []
        if found := THEORY_PARAMS_RE.search(text):
            words = found.group(1).lower().replace("number of ", "").replace("parameters", "params")
            quantity = "_".join(w for w in words.split() if w != "in") + "_billion"
            records.append(TheoreticalMemoryRecord(file=self.file, line=line_no, text=text, quantity=quantity,
                                                   value=float(found.group(2))))
        elif found := THEORY_FOOTPRINT_RE.search(text):
            for name, value in THEORY_PART_RE.findall(found.group(1)):
                quantity = "_".join(name.strip().lower().split()) + "_mib"
                records.append(TheoreticalMemoryRecord(file=self.file, line=line_no, text=text, quantity=quantity,
                                                       value=float(value)))
        elif found := ACTIVATION_PER_LAYER_RE.search(text):
            records.append(TheoreticalMemoryRecord(file=self.file, line=line_no, text=text,
                                                   quantity="activation_per_layer_mib", value=float(found.group(1))))
        return tuple(records)


# A traceback frame's path names the framework that raised (first match wins: Primus wraps torchtitan and Megatron,
# NeMo and Megatron-Bridge wrap Megatron-Core, so the outer framework's path is tried first).
FRAMEWORK_FRAME_NEEDLES: tuple[tuple[str, str], ...] = (
    ("/torchtitan/", "torchtitan"), ("/nemo/", "nemo"), ("/megatron/bridge/", "megatron-bridge"),
    ("/megatron_llm/", "megatron-lm"), ("/megatron/neox/", "gpt-neox"), ("/gpt-neox/", "gpt-neox"),
    ("/deepspeed/", "deepspeed"), ("/megatron/", "megatron-lm"),
)
#: The head of a stuck process's stack dump, the main thread's (its first frame is where it waits): py-spy dump's
#: `Thread 1853 (idle): "MainThread"`, faulthandler's `Current thread 0x00007f... (most recent call first):` (what
#: `faulthandler.dump_traceback_later` or SIGUSR1 with `faulthandler.register` print for a hung rank).
STACK_DUMP_HEAD_RE = re.compile(r'^(?:Thread \d+ \((?:idle|active|active\+gil|gil)\): "MainThread"|'
                                r"Current thread 0x[0-9a-f]+ \(most recent call first\):)")
#: AMD's Primus wraps Megatron-LM and torchtitan (`/workspace/Primus/primus/...` frames); its runs are on ROCm.
PRIMUS_FRAME_NEEDLE = "/primus/"
PRIMUS_HINT = "primus"
#: Megatron-Bridge's start-of-training line (`print_rank_0("Training ...")` in its pretrain loop, mid-2025 releases);
#: Megatron-LM's own is lower-case `training ...`, in every release since 2020.
BRIDGE_TRAINING_LINE = "Training ..."
#: NeMo's logger: `[NeMo I 2025-10-08 23:27:54 nemo_logging:393] ...` (I/W/E/D for the level).
NEMO_LOGGER_PREFIX = "[NeMo "
CRASH_STACK_LINES = 200  # a faulthandler dump of all threads of a rank is ~100 lines; a c10 backtrace ~40
LAUNCHER_SUMMARY_NEEDLE = "Root Cause (first observed failure)"
LAUNCHER_FIELD_RE = re.compile(r"^\s*(time|host|rank|exitcode)\s*:\s*(.*?)\s*$")
_RERUN_RANK_RE = re.compile(r"\b(?:Rank (\d+), node|on rank (\d+) at iteration)")
_NCCL_DETAIL_RE = re.compile(r"(SeqNum|OpType|NumelIn|NumelOut|Timeout\(ms\))=([\w.]+)")
_ALLOC_RE = re.compile(r"[Tt]ried to allocate ([\d.]+ ?[KMGT]i?B)")
_RAN_FOR_RE = re.compile(r"ran for (\d+) milliseconds")
_LOCAL_RANK_RE = re.compile(r"\blocal_rank:\s*(\d+)")  # torchrun: `failed (exitcode: -9) local_rank: 1 (pid: 7)`
_AT_ITERATION_RE = re.compile(r"\biteration #?(\d+)\b")  # RerunStateMachine: `at iteration #120`


_FRAME_RE = re.compile(r'^\s*File "([^"]+)", line (\d+), in (\S+)')


def _raised_at(frames: list[str]) -> str:
    """Where a traceback's exception was raised, from its innermost frame: `file.py:260 in function (code)`; what
    names a bare exception (`AssertionError`, `StopIteration`) that prints no message of its own."""
    for index in range(len(frames) - 1, -1, -1):
        found = _FRAME_RE.match(frames[index])
        if found is None:
            continue
        path, line, function = found.groups()
        code = frames[index + 1].strip() if index + 1 < len(frames) and not _FRAME_RE.match(frames[index + 1]) else ""
        where = f"{'/'.join(path.split('/')[-2:])}:{line} in {function}"
        return f"{where} ({code})" if code else where
    return ""


def _int_or_none(value: str | None) -> int | None:
    """An argument's integer value; None for `None`, a float, a list or no value."""
    return int(value) if value is not None and value.isdigit() else None


def _rerun_rank(text: str) -> int | None:
    """The rank Megatron's RerunStateMachine names in its message (`Rank 3, node ...` or `on rank 3 at ...`)."""
    found = _RERUN_RANK_RE.search(text)
    return None if found is None else int(found.group(1) or found.group(2))


def _details(text: str) -> dict[str, str]:
    """Facts worth lifting out of an error line: NCCL op and sequence number, allocation size."""
    details: dict[str, str] = {}
    if "=" in text:
        for key, value in _NCCL_DETAIL_RE.findall(text):
            details[key.replace("(ms)", "_ms").lower()] = value
    if found := _ALLOC_RE.search(text):
        details["tried_to_allocate"] = found.group(1)
    if found := _RAN_FOR_RE.search(text):
        details["ran_for_ms"] = found.group(1)
    if found := _LOCAL_RANK_RE.search(text):
        details["local_rank"] = found.group(1)
    if "NCCL" in text and (found := NCCL_PREFIX_RE.search(text)):
        details.update(host=found.group(1), pid=found.group(2), cuda_device=found.group(3))
    if found := _AT_ITERATION_RE.search(text):
        details["iteration"] = found.group(1)
    return details
