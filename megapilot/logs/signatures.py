"""Error signatures: which log lines name which failure.

Each signature is a case-insensitive regex over one line (any rank, any node: logger prefixes are
not anchored), with the category of the taxonomy it belongs to. Signatures are tried in order and
the first hit wins, so specific text comes before generic text (an NCCL "Cuda failure 2 'out of
memory'" is an `oom`, not an `nccl_error`; a DataLoader worker killed by a bus error is
`shm_insufficient`, not `dataloader_error`).

Wordings found on real failure text (tests/data/logs/real): c10's `!!!!!!! Segfault encountered !!!!!!!` (no
"segmentation fault"), a driver that prints `NVRM: fallen off the bus` without an Xid (over three lines: the
third one matches), amdgpu's `uncorrectable hardware error(...)`.

Categories decided from metrics rather than single lines (`nan_loss`, `loss_spike`,
`loss_divergence`, `hang`, `low_throughput`, `slowdown`) live in `megapilot.diagnose.rules`.

Deliberately NOT matched (false positives seen in other tools):
- Megatron's `WARNING: could not find the metadata file .../latest_checkpointed_iteration.txt` and
  `will not load any checkpoints and will start from random`: a normal fresh start.
- `NCCL INFO` / `RCCL INFO` lines (including `Connection closed by localRank`), which are chatter.
- `exitcode: 0`, `nan` inside ordinary words, `error` in flag names (`--no-error-...`), `0 errors`.
- `PYTORCH_CUDA_ALLOC_CONF`/`expandable_segments` advice text without an actual OOM.
"""

from __future__ import annotations

import importlib
import re
import sys
from dataclasses import dataclass
from typing import Literal, get_args

# The standard library's regex parser (`re._parser` since 3.11, `sre_parse` before; neither is typed).
_regex_parser = importlib.import_module("re._parser" if sys.version_info >= (3, 11) else "sre_parse")
_regex_constants = importlib.import_module("re._constants" if sys.version_info >= (3, 11) else "sre_constants")
_BRANCH = _regex_constants.BRANCH
_LITERAL = _regex_constants.LITERAL

# The taxonomy: every category a finding can have, line-based and metric-based, plus the three the run
# itself raises (a log of another run; a node that wrote no log; logs of several runs given as one). One list:
# `megapilot.diagnose` holds a rule and an explanation for each (a test checks that none is missing).
Category = Literal[
    "oom", "nccl_timeout", "nccl_error", "gpu_hw_fault", "nan_loss", "loss_spike", "loss_divergence",
    "hang", "rendezvous_failure", "shm_insufficient", "checkpoint_save_failure", "checkpoint_load_failure",
    "dataloader_error", "process_crash", "config_error", "low_throughput", "slowdown", "log_mismatch", "missing_log",
    "mixed_runs",
]
CATEGORIES: tuple[str, ...] = get_args(Category)


@dataclass(frozen=True)
class Signature:
    """One named pattern of one category. `needles`: lowercase texts of which any match holds at least one (read off
    the pattern by `required_needles`), or None where the pattern has a branch without a literal."""

    name: str
    category: Category
    pattern: re.Pattern[str]
    needles: tuple[str, ...] | None = None


def _sig(name: str, category: Category, regex: str) -> Signature:
    pattern = re.compile(regex, re.IGNORECASE)
    return Signature(name, category, pattern, required_needles(pattern))


def required_needles(pattern: re.Pattern[str]) -> tuple[str, ...] | None:
    """For each top-level alternative of `pattern`, its longest run of ASCII literals outside any group or
    repetition: every match contains one of them (lowercased, as the pattern ignores case). None where an
    alternative has no such literal. A substring test per needle costs ~50 ns; a case-insensitive search of a
    signature ~10-40 us on a 100-character line, so lines that hold none of a signature's needles skip its search."""
    try:
        items = list(_regex_parser.parse(pattern.pattern, pattern.flags))
    except Exception:  # noqa: BLE001 - a parser that changed shape costs only the shortcut, never a match
        return None
    one_branch = len(items) == 1 and items[0][0] is _BRANCH
    alternatives = [list(branch) for branch in items[0][1][1]] if one_branch else [items]
    needles = tuple(_longest_literal_run(alternative) for alternative in alternatives)
    return None if not all(needles) else needles


def _longest_literal_run(items: list[tuple[object, object]]) -> str:
    best, run = "", ""
    for op, value in items:
        if op is _LITERAL and isinstance(value, int) and value < 128:
            run += chr(value).lower()
        else:
            best, run = max(best, run, key=len), ""
    return max(best, run, key=len)


# Order matters: first hit wins.
SIGNATURES: tuple[Signature, ...] = (
    # --- shared memory first: bus errors kill DataLoader workers and NCCL alike -------------------
    _sig("shm_insufficient", "shm_insufficient",
         r"insufficient shared memory|shared memory \(shm\)|failed to extend /dev/shm|"
         r"no space left on device.*/dev/shm|/dev/shm.*no space left"),
    _sig("bus_error", "shm_insufficient", r"\bbus error\b|caught signal 7\b|signal 7 \(sigbus\)|\bSIGBUS\b"),
    # --- out of memory ---------------------------------------------------------------------------
    _sig("nccl_cuda_oom", "oom", r"(?:cuda|hip) failure 2 'out of memory'"),
    _sig("torch_oom", "oom",
         r"OutOfMemoryError|(?:cuda|hip|rocm) (?:error: )?out of memory|tried to allocate [\d.]+ ?[kmgt]i?b|"
         r"hipErrorOutOfMemory|cudaErrorMemoryAllocation|CUBLAS_STATUS_ALLOC_FAILED|"
         r"RuntimeError: out of memory|\bfailed to allocate\b.*\bmemory\b"),
    # --- NaN reports of Megatron's RerunStateMachine (result validation, `--rerun-mode`) -----
    _sig("rerun_state_machine", "nan_loss",
         r"Unexpected result [-+]?(?:nan|inf|tensor\(\s*[-+]?(?:nan|inf))|"
         r"found (?:NaN|Inf) in local (?:grad norm|forward loss)|\bloss is NaN\b|Possible persistent error|"
         r"Correct result \(but possible Application error\)"),
    # --- a NaN/Inf loss or gradient norm that a trainer's own check reports (not the RerunStateMachine) ----------
    _sig("nan_value", "nan_loss", r"\b(?:grad(?:ient)?[ _]norm|loss) is (?:NaN|Inf)\b"),
    # --- checkpoint writers that fail without saying "checkpoint" -------------------------------------
    # Megatron-Core's async torch_dist writer (dist_checkpointing/strategies/filesystem_async.py) reports a worker's
    # error as `Local process N encountered an error: ...`, then raises `Worker failure: ...`, `Incomplete worker
    # results (expected N, got M. ...` or `An error is caught while a proc N is created`; torch.distributed.checkpoint's
    # FileSystemWriter refuses an existing one (`Checkpoint already exists and self.overwrite=False.`). A read-only
    # file system only refuses writes.
    _sig("checkpoint_writer", "checkpoint_save_failure",
         r"PytorchStreamWriter failed|unexpected pos \d+ vs \d+|_write_item\(\) (?:takes|got|missing)|"
         r"FileSystemWriterAsync.*(?:fail|error)|Local process \d+ encountered an error|\bWorker failure: |"
         r"Incomplete worker results \(expected|An error is caught while a proc \d+ is created|"
         r"Checkpoint already exists and self\.overwrite|Read-only file system"),
    # --- GPU hardware ----------------------------------------------------------------------------
    _sig("xid", "gpu_hw_fault", r"\bNVRM: Xid\b|\bXid \(PCI:|\bXid\s+\d+\b"),
    _sig("amd_ras", "gpu_hw_fault",
         r"\bRAS\b.*(?:uncorrect|poison|fatal|error)|\[Hardware Error\]|poison consumption|"
         r"amdgpu.*(?:ring \w+ timeout|GPU reset|ras)"),
    _sig("ecc", "gpu_hw_fault", r"uncorrectable (?:ecc |hardware )?error|\bECC error\b|double bit ecc|\bDBE\b.*ecc"),
    _sig("gpu_exception", "gpu_hw_fault",
         r"HW Exception by GPU|\bGPU Hang\b|memory access fault by GPU|Memory access fault|"
         r"fallen off the bus|GPU reset|unspecified launch failure|"
         r"hipErrorLaunchFailure|cudaErrorLaunchFailure|"
         r"amdgpu: .*(?:fatal|hang)|GPU is lost"),
    # a kernel that read or wrote outside its memory: a faulty GPU can do it, a faulty kernel far more often
    _sig("illegal_access", "gpu_hw_fault",
         r"an illegal memory access was encountered|misaligned address|cudaErrorIllegalAddress|"
         r"hipErrorIllegalAddress|cudaErrorMisalignedAddress"),
    # --- NCCL / RCCL -----------------------------------------------------------------------------
    # a rank waiting in the c10d store for the NCCL id or a barrier: the rendezvous, though raised as an NCCL error
    _sig("store_wait", "rendezvous_failure",
         r"store based barrier|retrieving ncclUniqueId from .* via c10d key-value store"),
    _sig("nccl_watchdog", "nccl_timeout",
         r"watchdog caught collective operation timeout|ran for \d+ milliseconds before timing out|"
         r"\bNCCL timeout\b|ProcessGroupNCCL.*(?:timed out|timeout)|heartbeat monitor.*(?:timed out|timeout)|"
         r"collective operation timeout"),
    _sig("nccl_error", "nccl_error",
         r"\bnccl(?:InternalError|RemoteError|InvalidUsage|InvalidArgument|SystemError|UnhandledCudaError)\b|"
         r"unhandled (?:cuda|hip) error|\b[NR]CCL error\b|\b[NR]CCL WARN\b.*(?:fail|error|abort)|"
         # an InfiniBand work completion with an error status (ibv_wc_status: 12 = transport retry counter
         # exceeded, 13 = RNR retry exceeded, ...): NCCL's IB transport prints it without the word "error"
         r"\b[NR]CCL WARN\b.*NET/IB.*completion.*status=[1-9]|\b[NR]CCL WARN\b.*connection closed by remote peer|"
         r"DistBackendError|[NR]CCL communicator was aborted"),
    # --- rendezvous / launch ---------------------------------------------------------------------
    _sig("rendezvous", "rendezvous_failure",
         r"Rendezvous(?:Timeout|Connection|Closed|State)Error|rendezvous.*(?:timed out|failed|timeout)|"
         r"DistNetworkError|DistStoreError|client socket has (?:timed out|failed to connect)|"
         r"TCPStore.*(?:fail|timeout|timed out)|"
         r"address already in use|EADDRINUSE|connect\(\) to .* failed|Connection refused.*(?:store|c10d|rdzv)"),
    # --- checkpoints -----------------------------------------------------------------------------
    _sig("checkpoint_save", "checkpoint_save_failure",
         r"(?:fail|error|exception|unable)\w*[^|]{0,80}\bsav(?:e|ing)\b[^|]{0,40}checkpoint|"
         r"checkpoint[^|]{0,40}\bsav(?:e|ing)\b[^|]{0,40}(?:fail|error)|no space left on device|"
         r"disk quota exceeded"),
    _sig("checkpoint_load", "checkpoint_load_failure",
         r"(?:fail|error|exception|unable)\w*[^|]{0,80}\bload(?:ing)?\b[^|]{0,40}checkpoint|"
         r"checkpoint[^|]{0,40}\bload(?:ing)?\b[^|]{0,40}(?:fail|error)|"
         r"(?:missing|unexpected) key\(s\) in state_dict|size mismatch for [\w.]+: copying a param|"
         r"CheckpointingException|checkpoint not found at|No such file or directory:? '?[^']*"
         r"latest_checkpointed_iteration\.txt"),
    # --- data --------------------------------------------------------------------------------------
    _sig("dataloader_worker", "dataloader_error",
         r"DataLoader worker \(pid[^)]*\) (?:exited unexpectedly|is killed)|"
         r"error building (?:indexed )?dataset|No such file or directory:? '?[^']*\.(?:bin|idx)\b|"
         r"(?:\.bin|\.idx)'? (?:does not exist|not found)|could not find data file|"
         r"exhausted the dataset|index out of range.*dataset|dataset.*index out of range"),
    # --- configuration -----------------------------------------------------------------------------
    _sig("argparse", "config_error",
         r"error: unrecognized arguments|error: argument --|error: the following arguments are required|"
         r"usage: (?:pretrain_\w+|train|torchrun)\S* \[|is not divisible by|must be divisible by|"
         r"should be divisible by|^\s*(?:\S+: )?error: --[\w-]+: "),
    # --- a compiled extension built for another torch/CUDA (fused kernels, Apex, Transformer Engine, flash-attn):
    # its shared object asks the installed torch for a symbol it no longer has, or names another ABI -----------
    _sig("extension_build_mismatch", "config_error",
         r"\.so\S*: undefined symbol: \w+|undefined symbol: _ZN\w+|"
         r"was compiled against (?:a different|an incompatible) (?:version of )?(?:torch|pytorch|cuda)|"
         r"compiled (?:with|for) (?:CUDA|PyTorch|torch) [\d.]+ but .* (?:is|has) (?:CUDA|PyTorch|torch) [\d.]+|"
         r"CUDA version mismatch|version of Transformer Engine .* does not match"),
    # --- the software stack does not fit the GPUs (driver, build, visibility) --------------------------
    _sig("environment", "config_error",
         r"no CUDA GPUs are available|NVIDIA driver on your system is too old|hipErrorNoBinaryForGpu|"
         r"no kernel image is available for execution on the device|requires compute capability|"
         r"CUDA driver version is insufficient|found no NVIDIA driver on your system|invalid device ordinal|"
         # a kernel extension compiled at start-up (Megatron's fused kernels, Apex, a JIT op) that does not build
         r"ninja: build stopped|Error building extension '\w+'|error: command '[^']*nvcc' failed"),
    # --- a token id past the embedding table: the data's tokenizer is not the model's vocabulary -------
    _sig("token_out_of_vocab", "config_error", r"srcIndex < srcSelectDimSize"),
    # --- process crashes ---------------------------------------------------------------------------
    _sig("slurm", "process_crash",
         r"\*\*\* (?:JOB|STEP) \S+ ON \S+ CANCELLED AT|srun: error: .*task \d+: (?:Killed|Exited with exit code|"
         r"Segmentation|Aborted|Bus error)|Detected \d+ oom[_-]kill event"),
    _sig("child_failed", "process_crash",
         r"ChildFailedError|torch\.distributed\.elastic\.multiprocessing\.errors|"
         r"exitcode\s*:\s*-?[1-9]\d*|exit(?:ed)? (?:with )?(?:code|status) -?[1-9]\d*|"
         r"primus launcher exited with code [1-9]"),
    _sig("signal", "process_crash",
         r"segmentation fault|\bsegfault\b|\bSIGSEGV\b|caught signal 11\b|\bSIGKILL\b|\bSIGABRT\b|killed by signal|"
         r"core dumped|Fatal Python error|terminate called (?:after throwing|without an active exception)|"
         r"pure virtual method called|\b\d+ Killed\b|^\s*Killed\s*$|"
         r"oom-kill|Out of memory: Killed process"),
)

# Crash lines after which the process dumps its stack (faulthandler, c10, glibc): the parser reads the dump's frames.
CRASH_DUMP_SIGNATURES = frozenset({"signal", "bus_error"})

# Cheap lowercase substrings: a line containing none of them cannot match any signature.
# (Keeps the per-line cost of the error scan to one `any(...)` for the usual INFO line.) As narrow as the
# patterns allow: a line that passes costs a search of every signature (~150 us on a 140-character line),
# so Megatron's per-rank `memory (MB) | allocated: ...` reports must not pass on "memory" or "allocate".
TRIGGERS: tuple[str, ...] = (
    "unexpected result", "found nan", "found inf", "loss is nan", "loss is inf", "norm is nan", "norm is inf",
    "persistent error", "application error",
    "pytorchstreamwriter", "unexpected pos", "_write_item", "filesystemwriterasync", "ras", "hardware error",
    "worker failure", "incomplete worker results", "read-only file system",
    "poison", "cancelled", "fallen off the bus", "segfault",
    "shm", "bus error", "signal", "sigbus", "shared memory", "out of memory", "memory access", "to allocate",
    "alloc_failed", "xid", "ecc", "gpu", "misaligned",
    "launch failure", "illegal", "amdgpu", "timeout", "timed out", "timing out", "nccl", "rccl", "unhandled",
    "distbackend", "rendezvous", "distnetwork", "diststore", "socket", "tcpstore", "address already",
    "eaddrinuse", "connect", "checkpoint", "no space", "quota", "state_dict", "size mismatch",
    "dataloader", "dataset", "no such file", ".bin", ".idx", "data file", "error", "usage:", "divisible",
    "no cuda gpus", "driver", "kernel image", "compute capability", "srcselectdimsize", "store based barrier",
    "device ordinal", "ninja", "building extension", "nvcc", "undefined symbol", "compiled against", "compiled with",
    "compiled for", "version mismatch", "does not match",
    "nccluniqueid",
    "childfailed", "exitcode", "exit", "segmentation", "sigsegv", "sigkill", "sigabrt", "core dumped",
    "fatal", "terminate", "pure virtual", "killed", "oom",
)

# Frames (Python, c10 or native) that only a checkpoint save runs: Megatron's `save_checkpoint`, the torch_dist
# async filesystem writer, torch's zip writer (`PytorchStreamWriter::writeRecord`, its `crc32`).
CHECKPOINT_WRITER_FRAMES: tuple[str, ...] = (
    "save_checkpoint", "filesystem_async", "_write_item", "write_preloaded_data", "FileSystemWriterAsync",
    "writeRecord", "PytorchStreamWriter", "write_record", "mz_zip_writer", "crc32", "async_save",
    "dist_checkpointing/strategies/torch", "_save_zero_checkpoint",
    # Megatron-Core finishing an async save (`save_state_dict_async_finalize` raises torch.distributed.checkpoint's
    # `CheckpointException("write", ...)`), torch.distributed.checkpoint's own saver
    "save_state_dict_async_finalize", "finalize_async_save", "state_dict_saver", "_save_state_dict",
)

# Frames of a compiled extension's loader: an exception there is a missing or mismatched build.
EXTENSION_LOADER_FRAMES: tuple[str, ...] = ("transformer_engine/common/__init__", "_load_library",
                                           "fused_kernels/__init__", "flash_attn_2_cuda", "amp_C")

#: A Python exception line, the last line of a traceback or a rank's echo of it: `[package.module.]Name[: message]`,
#: the name ending in Error, Exception, Interrupt or Exit (or StopIteration). The one pattern for it in megapilot:
#: the log parser, the executors' failure reason and diagnose all read exceptions through it. A bare `Error:` is any
#: program's message; Python's own `Error` classes are printed with their module (`binascii.Error: ...`).
EXCEPTION_LINE_RE = re.compile(
    r"^(?P<module>(?:[A-Za-z_]\w*\.)*)"
    r"(?P<name>[A-Z]\w*(?:Error|Exception|Interrupt|Exit)|Exception|(?<=\.)Error|StopIteration|StopAsyncIteration)"
    r"(?::\s*(?P<message>.*))?$")
# KeyboardInterrupt, SystemExit: how a process was stopped, not a fault of the run.
_STOP_EXCEPTION_SUFFIXES = ("Interrupt", "Exit")


def exception_fault(line: str) -> re.Match[str] | None:
    """The exception a (prefix-stripped) line names when it is a fault: not an interrupt or an exit."""
    found = EXCEPTION_LINE_RE.match(line.strip())
    return None if found is None or found["name"].endswith(_STOP_EXCEPTION_SUFFIXES) else found


# Exceptions at the end of a Python traceback, classified by the frames above them.
_FRAME_CATEGORY: tuple[tuple[str, Category], ...] = (
    # a compiled library's loader (Transformer Engine looks for its .so): the install, not the training code
    *((needle, "config_error") for needle in EXTENSION_LOADER_FRAMES),
    ("validate_args", "config_error"),
    ("arguments.py", "config_error"),
    *((needle, "checkpoint_save_failure") for needle in CHECKPOINT_WRITER_FRAMES),
    ("load_checkpoint", "checkpoint_load_failure"),
    ("build_train_valid_test", "dataloader_error"),
    ("data_iterator", "dataloader_error"),
    ("indexed_dataset", "dataloader_error"),
    ("gpt_dataset", "dataloader_error"),
    ("blended", "dataloader_error"),
)


def match_line(text: str) -> Signature | None:
    """The first signature the line matches, or None. `text` is the ANSI-free line."""
    lowered = text.lower()
    if not any(trigger in lowered for trigger in TRIGGERS):
        return None
    if ("nccl info" in lowered or "rccl info" in lowered) and "fail" not in lowered:
        return None  # NCCL/RCCL INFO chatter ("Connection closed by localRank 2") is not an error
    # The needle shortcut holds for ASCII text only: ignoring case, `\u017f` matches "s" and `\u212a` matches "k".
    ascii_text = text.isascii()
    for signature in SIGNATURES:
        needles = signature.needles
        if ascii_text and needles is not None and not any(needle in lowered for needle in needles):
            continue
        if signature.pattern.search(text):
            return signature
    return None


def classify_exception(exception_line: str, frames: list[str]) -> tuple[Category, str] | None:
    """(category, exception name) for the last line of a traceback, judged by the frames above it.

    Exceptions raised inside argument validation, checkpointing or the data pipeline get that category;
    any other exception is a `process_crash` named by its exception (what a rank's stderr shows when no line
    signature names the cause); None only for a line that is not an exception.
    """
    found = exception_fault(exception_line)
    if not found:
        return None
    exception_name = found["name"]
    for frame in reversed(frames):
        for needle, category in _FRAME_CATEGORY:
            if needle in frame:
                return category, exception_name
    if exception_name == "AssertionError" and any("megatron" in f and "initialize" in f for f in frames):
        return "config_error", exception_name
    return "process_crash", exception_name


def is_checkpoint_writer_frame(text: str) -> bool:
    """Whether a stack line (Python, c10 `frame #N:` or glibc `#N 0x...`) is inside a checkpoint writer."""
    return any(needle in text for needle in CHECKPOINT_WRITER_FRAMES)


def is_exception_line(text: str) -> bool:
    """Whether a (prefix-stripped) line looks like `SomeError: message` closing a traceback."""
    return exception_fault(text) is not None and not text.startswith((" ", "\t"))
