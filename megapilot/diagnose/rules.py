"""Rules: parsed log (+ the run's flags and GPU) → findings.

Line rules turn the error records of the taxonomy into one finding per category, quoting up to
`MAX_EVIDENCE` lines from distinct ranks. Metric rules read the iteration series. Every threshold is a
constant below with the reason for its value:

- `nan_loss`: a NaN/Inf loss or grad norm, Megatron's nan-iteration counter rising, or `lm loss`
  vanishing from the line (Megatron drops a loss whose average is not >= 0, which NaN is not) in an
  interval that was not entirely skipped by fp16 loss-scale back-off; or a NaN report of Megatron-Core's
  RerunStateMachine (its NaN check, on unless `--no-check-for-nan-in-loss-and-grad`), which names the rank and
  iteration.
- `loss_spike`: a loss above `SPIKE_FACTOR` x the median of the previous `WINDOW` losses that comes
  back down; `loss_divergence`: the last `WINDOW` losses all stay above that level.
- loss jump after the first update (`loss_spike`, critical; left to `nan_loss`/`loss_divergence` when the run
  then went NaN or diverged): the loss logged right after the first
  optimizer steps is above `FIRST_UPDATE_JUMP_FACTOR` x the first logged loss, by at least
  `FIRST_UPDATE_NOISE_MULTIPLE` x the median move between the losses logged after it (with none after it, by
  `FIRST_UPDATE_ALONE_FACTOR` x): the first update made the model worse, which no window-based rule can see (it has
  no history yet). A log too short for the window whose first losses rose that far but within their own noise gets
  an `info` only.
- `hang`: a gap between two iteration timestamps, or between the last iteration and the last
  timestamp of the log, longer than `HANG_FACTOR` x the median step time (at least `HANG_FLOOR_S`);
  or a log that stops at a known start-up stall point with no error.
- `slowdown`: a trend, not one slow step: the Theil-Sen slope of step time over iteration number (the median
  of all pairwise slopes, robust to outliers such as a save or an evaluation) raises the fitted step time by at
  least `SLOWDOWN_TREND_GROWTH` over the steady iterations, at least `SLOWDOWN_CONSISTENCY` of the pairwise slopes
  are positive (noise gives half), and the median of the last fifth is above the first fifth's; at least
  `SLOWDOWN_MIN_ITERATIONS` steady iterations, or (a sparse log) `SLOWDOWN_SPARSE_MIN_ITERATIONS` whose trend at
  least doubles the step (`SLOWDOWN_SPARSE_GROWTH`) with `SLOWDOWN_SPARSE_CONSISTENCY` of the pairs slower; and at
  least `SLOWDOWN_MIN_SPAN_S` of training between them (a run of seconds follows the host's scheduler).
- `slowdown` from one jump: the step time moved to another level at one point and stayed there
  (`megapilot.diagnose.step_change`: window medians, beyond `JUMP_MIN_FRACTION` and the run's own noise, flat on both
  sides), within a stretch of one global batch size (a batch ramp-up is more work per step, not a slower run) and
  over `SLOWDOWN_MIN_SPAN_S` of training; a warning with the likely causes in order when it rose (the trend rule then
  stays silent: the run did not drift), a note when it fell.
- `low_throughput`: measured MFU (logged TFLOP/s/GPU / the GPU's dense peak for the precision; a log that prints
  no TFLOP/s gets the estimator's model FLOPs per step over its measured median step time) below
  `LOW_MFU_FRACTION` x the estimator's MFU for the layout; without a prediction, below `LOW_MFU_FLOOR` (the GPU
  alone, from `--gpu`, is enough). Without any GPU type, the printed TFLOP/s is rated on every GPU of the catalog it
  is plausible for (`PLAUSIBLE_MIN_MFU`): when it is low on at least `LOW_ON_MOST_GPUS` of them, an `info` finding
  names those (a `warning` if it is low on all).
- `checkpoint_save_failure` from timing: a rank that crashes within `CRASH_AFTER_SAVE_S` of a checkpoint save
  starting, before the save finished, died in the save (a native crash in the writer often prints no frame).
Fixes fit the framework that wrote the log (`megapilot.diagnose.framework_fixes`).
"""

from __future__ import annotations

import math
import re
import statistics
from collections import defaultdict
from itertools import pairwise
from pathlib import Path
from typing import Literal

from megapilot.catalog.gpus import load_gpus
from megapilot.diagnose.cascade import failure_kind
from megapilot.diagnose.findings import Finding, Fix, Severity
from megapilot.diagnose.flags import RunConfig
from megapilot.diagnose.framework_fixes import (
    allocator_fix,
    divergence_fixes,
    memory_fixes,
    synchronous_save_fix,
)
from megapilot.diagnose.options import (
    LayoutOption,
    change,
    combined_memory_option,
    current_prediction,
    memory_options,
    throughput_options,
)
from megapilot.diagnose.refusal import changes_named_in, transformer_engine_needed
from megapilot.diagnose.step_change import JUMP_WINDOW, StepChange, find_step_change
from megapilot.diagnose.stopped import megapilot_stop
from megapilot.estimate.coverage import band_for
from megapilot.logs.collect import HANG_FACTOR, HANG_FLOOR_S, ParsedLog
from megapilot.logs.framework import takes_megatron_flags
from megapilot.logs.health import XID_CODE
from megapilot.logs.parser import strip_prefix
from megapilot.logs.records import CheckpointOp, ErrorRecord, Evidence, IterationRecord, ProgressMarker
from megapilot.logs.signatures import EXTENSION_LOADER_FRAMES
from megapilot.spec import GPUSpec, Prediction
from megapilot.spec.training import Precision
from megapilot.vocabulary import float_default

CRASH_DURING_SAVE = "crash_during_save"  # the signature of a crash found inside a save's time window

MAX_EVIDENCE = 5
WINDOW = 8  # losses of the last 8 log intervals: enough to smooth one noisy batch, short enough to follow the run
SPIKE_FACTOR = 1.3  # a healthy LM loss moves by a few % between intervals; 30 % up is a spike, not noise
# The loss right after the first updates is expected to drop (a fresh model starts at ln(vocab)); 10 % higher is
# beyond the batch-to-batch noise of a first step (a few %) and means the update itself hurt.
FIRST_UPDATE_JUMP_FACTOR = 1.1
FIRST_UPDATE_MAX_ITERATION = 10  # the first logged line must be one of the first updates for the rule to apply
# ... and the jump must stand out of the loss's own noise: at least this many times the median move between the
# losses logged after it (a fine-tune's loss of 0.2 moves by 0.03 or 0.5 from one batch to the next: 12 % is noise
# there, while a fresh model's 11 -> 14 is ten times its later moves). 3x the median absolute move is ~3 sigma.
FIRST_UPDATE_NOISE_MULTIPLE = 3.0
# With no loss logged after the jump, the noise is unknown: only a jump no batch-to-batch spread makes counts.
FIRST_UPDATE_ALONE_FACTOR = 1.5
# Slowdown trend: +20 % over the run is beyond clock and network jitter of a healthy run (CV of a few %), yet
# catches a slow leak (fragmentation, a growing data queue) long before it doubles the step.
SLOWDOWN_TREND_GROWTH = 0.2
SLOWDOWN_CONSISTENCY = 0.65  # share of positive pairwise slopes; pure noise gives 0.5, a real drift well above
SLOWDOWN_MIN_ITERATIONS = 20  # fewer steady points and a shared machine's noise can fake a trend
# ... unless the trend is too strong for noise: a sparse log (a large --log-interval, or the excerpt a user pasted)
# still shows a slowdown when its few points double the step and nearly every pair of them got slower. With 8 points
# of pure noise, >= 80 % positive pairwise slopes (Kendall's tau >= 0.6) happens about 2 % of the time, and noise
# does not double the step on top of that.
SLOWDOWN_SPARSE_MIN_ITERATIONS = 8
SLOWDOWN_SPARSE_GROWTH = 1.0
SLOWDOWN_SPARSE_CONSISTENCY = 0.8
# ... and over at least this much training time: the mechanisms a trend points at (throttling, fragmentation, GC, a
# data queue or filesystem falling behind) build up over minutes; a run of a few seconds (a smoke test, a CPU run of
# 20 ms steps on a host busy with other work) rises and falls with the host's scheduler, not with any of them.
SLOWDOWN_MIN_SPAN_S = 10.0
SLOWDOWN_MAX_POINTS = 400  # Theil-Sen is O(n^2) pairs: a longer run is sampled evenly down to this many points
LOW_MFU_FRACTION = 0.6  # 60 % of the estimator's MFU: the estimator is within ~20-30 % on published runs
# Well-tuned Megatron runs reach 35-55 % MFU on A100/H100/MI300X for dense models and 25-40 % for MoE (NeMo and
# Megatron-Bridge performance tables); below 25 % something is wrong whatever the model.
LOW_MFU_FLOOR = 0.25
# Without --gpu a printed TFLOP/s is rated on each GPU it could have run on: below 2 % MFU it is not a training run of
# that GPU (a CPU test run, another device, a toy model), so that GPU is not rated at all.
PLAUSIBLE_MIN_MFU = 0.02
# ... and it is a finding only when it is low on at least three quarters of those GPUs (the catalog spans three
# generations, so: fine at most on the oldest ones). A rate low only on the newer parts (316 TFLOP/s is 32 % of an
# H100 but 24 % of an MI300X and 14 % of a B200) needs --gpu to be judged.
LOW_ON_MOST_GPUS = 0.75
NEAR_FULL_PCT = 95.0  # the allocator needs a few % of headroom for the next larger block
CRASH_AFTER_SAVE_S = 300.0  # a torch_dist save of a large model takes minutes; a crash within 5 min is during it


def _evidence(records: list[ErrorRecord]) -> list[Evidence]:
    """Up to MAX_EVIDENCE lines, one per rank first, then in log order."""
    picked: list[ErrorRecord] = []
    seen_ranks: set[object] = set()
    for record in records:
        if record.rank not in seen_ranks:
            seen_ranks.add(record.rank)
            picked.append(record)
    for record in records:
        if len(picked) >= MAX_EVIDENCE:
            break
        if record not in picked:
            picked.append(record)
    picked = sorted(picked[:MAX_EVIDENCE], key=lambda r: (r.file, r.line))
    return [Evidence(r.file, r.line, r.text.strip()) for r in picked]


def _ev(record: IterationRecord) -> Evidence:
    return Evidence(record.file, record.line, record.text.strip())


def _ranks(records: list[ErrorRecord]) -> str:
    ranks = sorted({r.rank for r in records if r.rank is not None})
    if not ranks:
        return ""
    shown = ", ".join(str(r) for r in ranks[:16]) + (" ..." if len(ranks) > 16 else "")
    return f" on rank{'s' if len(ranks) > 1 else ''} {shown}"


# ---- line rules ------------------------------------------------------------------------------------

def line_findings(log: ParsedLog, config: RunConfig | None) -> list[Finding]:
    by_category: dict[str, list[ErrorRecord]] = defaultdict(list)
    for error in log.errors + crashes_during_save(log):
        by_category[error.category].append(error)
    findings = []
    for category, records in by_category.items():
        builder = LINE_RULES.get(category)
        if builder is not None:
            findings.append(builder(records, log, config))
    return findings


def crashes_during_save(log: ParsedLog) -> list[ErrorRecord]:
    """Ranks that died while a checkpoint save was running: a crash (signal or exception) within
    `CRASH_AFTER_SAVE_S` after a save started and before it finished, by timestamps; without them, a crash later in
    the same file as a save that never finished. Each becomes a `checkpoint_save_failure` line record."""
    saves = [op for op in log.checkpoints if op.kind == "save" and op.evidence]
    found: list[ErrorRecord] = []
    for crash in log.errors:
        if crash.category != "process_crash" or failure_kind(crash) not in ("killed", "exception"):
            continue
        save = next((op for op in saves if _during(crash, op)), None)
        if save is not None:
            start = save.evidence[0]
            found.append(ErrorRecord(
                file=crash.file, line=crash.line, text=crash.text, category="checkpoint_save_failure",
                signature=CRASH_DURING_SAVE, rank=crash.rank, time_s=crash.time_s,
                details={"save_started": f"{start.file}:{start.line}", "save_iteration": str(save.iteration)}))
    return found


def cascade_errors(log: ParsedLog) -> list[ErrorRecord]:
    """The error lines a cascade is built from: a crash found inside a save's window stands as the failed save; an
    NCCL warning that training outlived is no failure."""
    during_save = crashes_during_save(log)
    replaced = {(r.file, r.line) for r in during_save}
    return [r for r in log.errors if (r.file, r.line) not in replaced and not _outlived_warning(r, log)] + during_save


# NCCL prints `NCCL WARN` for what it recovers from too (an InfiniBand port that flaps, `Got async event : port
# error` then `port active`); a collective that failed stops the step. Iterations the run logged after the line, in
# the same file (the order of lines is the order of events there), say training outlived it. Two of them, not one:
# the iteration in progress when a rank's transport failed can still be logged by a rank the failure did not reach.
_NCCL_WARN_RE = re.compile(r"\b[NR]CCL WARN\b")
OUTLIVED_ITERATIONS = 2


def _outlived_warning(record: ErrorRecord, log: ParsedLog) -> bool:
    if record.category != "nccl_error" or not _NCCL_WARN_RE.search(record.text):
        return False
    after = {r.iteration for r in log.iterations if r.file == record.file and r.line > record.line}
    return len(after) >= OUTLIVED_ITERATIONS


def _during(crash: ErrorRecord, save: CheckpointOp) -> bool:
    start = save.evidence[0]
    if crash.time_s is not None and save.started_s is not None:
        finished_s = save.started_s + save.duration_s if save.completed and save.duration_s is not None else None
        return 0.0 <= crash.time_s - save.started_s <= CRASH_AFTER_SAVE_S and (
            finished_s is None or crash.time_s <= finished_s)
    return not save.completed and crash.file == start.file and crash.line > start.line


def _rerun_nan(records: list[ErrorRecord], log: ParsedLog, config: RunConfig | None) -> Finding:
    if all(r.signature != "rerun_state_machine" for r in records):
        return _reported_nan(records, log, config)
    first = records[0]
    iteration = first.details.get("iteration")
    what = "found NaN/Inf" if "found" in first.text.lower() else "an unexpected (NaN/Inf) result"
    title = (f"NaN reported by Megatron's RerunStateMachine{_ranks(records)}"
             + (f" at iteration {iteration}" if iteration else ""))
    cause = (f"Megatron-Core's result validation ({what}) stopped or flagged the step. A NaN in one rank's grad norm "
             "before the data-parallel reduction points at that rank: if a rerun on the same GPU reproduces it "
             "('Correct result (but possible Application error)'), it is the numerics (learning rate, init, fp16); "
             "if not ('Possible persistent error'), suspect that GPU (silent data corruption).")
    fixes = _divergence_fixes(config, log) + [
        Fix("add", "nvidia-smi -q -d ECC,PAGE_RETIREMENT  (AMD: amd-smi metric --ecc)", None,
            "rule out a faulty GPU on the reporting rank's node", kind="command")]
    return Finding("nan_loss", "critical", title, _evidence(records), cause, fixes, occurrences=len(records))


def _reported_nan(records: list[ErrorRecord], log: ParsedLog, config: RunConfig | None) -> Finding:
    """A NaN/Inf loss or gradient norm said in a line of its own (a trainer's check, not Megatron's validation)."""
    cause = ("The run stopped on a NaN/Inf loss or gradient norm: the numerics diverged (learning rate or warm-up, "
             "initialisation, fp16 without loss scaling, a bad batch), or a faulty GPU corrupted a value. "
             "Megatron-Core's NaN check (on unless --no-check-for-nan-in-loss-and-grad) with --rerun-mode "
             "validate_results (the default since core_v0.14.0) reruns the step and tells the two apart.")
    fixes = _divergence_fixes(config, log) + [
        Fix("add", "nvidia-smi -q -d ECC,PAGE_RETIREMENT  (AMD: amd-smi metric --ecc)", None,
            "rule out a faulty GPU on the reporting rank's node", kind="command")]
    return Finding("nan_loss", "critical", f"NaN/Inf loss or gradient norm{_ranks(records)}", _evidence(records),
                   cause, fixes, occurrences=len(records))


_SIZE_UNITS_GIB = {"b": 2**-30, "kb": 2**-20, "kib": 2**-20, "mb": 2**-10, "mib": 2**-10, "gb": 1.0, "gib": 1.0,
                   "tb": 2**10, "tib": 2**10}
# PyTorch's OOM message: `(GPU 3; 79.21 GiB total capacity; ...` (before 2.1), `GPU 0 has a total capacity of 79.15 GiB`
_TOTAL_CAPACITY_RE = re.compile(r"([\d.]+) ?GiB total capacity|total capac\w* of ([\d.]+) ?GiB")


def _gib(size: str) -> float | None:
    """`37631.79 GiB`, `296.00 MiB` -> GiB."""
    found = re.fullmatch(r"([\d.]+) ?([KMGT]?i?B)", size.strip(), re.IGNORECASE)
    return float(found.group(1)) * _SIZE_UNITS_GIB[found.group(2).lower()] if found else None


def _gpu_capacity_gib(records: list[ErrorRecord], config: RunConfig | None) -> float | None:
    """The GPU's memory as the OOM message states it, else the configured GPU's."""
    for record in records:
        if found := _TOTAL_CAPACITY_RE.search(record.text):
            return float(found.group(1) or found.group(2))
    return config.cluster.gpu.hbm_gib if config is not None and config.cluster is not None else None


def _oversized_allocation(records: list[ErrorRecord], log: ParsedLog, asked: str, capacity: float) -> Finding:
    """One allocation larger than the whole GPU: no layout change fits it, a tensor's shape is wrong."""
    cause = (f"One allocation of {asked} is larger than the whole GPU ({capacity:.0f} GiB): no recompute, micro-batch "
             "or parallel layout fits it. A tensor's shape is wrong: a sequence length, vocabulary or batch far larger "
             "than meant, or an s x s attention mask built in the data loader (get_ltor_masks_and_position_ids) for a "
             "long sequence.")
    fixes = [Fix("set", "--seq-length / --micro-batch-size / --vocab-size", "<the sizes meant>",
                 "the tensor's size follows from them: one of them is not what was meant")]
    if takes_megatron_flags(log.framework):
        fixes.append(Fix("add", "--no-create-attention-mask-in-dataloader", None,
                         "causal attention needs no s x s mask from the data loader (fused attention builds its own)"))
    return Finding("oom", "critical", f"GPU out of memory{_ranks(records)}: one allocation of {asked}, larger than "
                   "the GPU", _evidence(records), cause, fixes, occurrences=len(records))


def _oom(records: list[ErrorRecord], log: ParsedLog, config: RunConfig | None) -> Finding:
    via_nccl = any(r.signature == "nccl_cuda_oom" for r in records)
    asked = next((r.details["tried_to_allocate"] for r in records if "tried_to_allocate" in r.details), None)
    capacity = _gpu_capacity_gib(records, config)
    asked_gib = _gib(asked) if asked else None
    if asked and asked_gib is not None and capacity is not None and asked_gib > capacity:
        return _oversized_allocation(records, log, asked, capacity)
    title = f"GPU out of memory{_ranks(records)}" + (f" (tried to allocate {asked})" if asked else "")
    cause = ("The most-loaded GPU ran out of memory: weights + gradients + optimizer states + activations of the "
             "in-flight micro-batches exceed the HBM.")
    if via_nccl:
        cause += (" NCCL could not allocate its buffers ('Cuda failure 2'), so memory was already exhausted when it "
                  "initialised.")
    fixes, note = _memory_fixes(config, log)
    return Finding("oom", "critical", title, _evidence(records), cause + note, fixes, occurrences=len(records))


def _memory_fixes(config: RunConfig | None, log: ParsedLog) -> tuple[list[Fix], str]:
    own = memory_fixes(log.framework)
    if own is not None:
        return own + [allocator_fix(log)], f" (Settings of {log.framework}, which wrote this log.)"
    generic = [
        Fix("add", "--recompute-granularity", "selective", "recompute the attention core instead of storing it",
            option="selective recompute"),
        Fix("add", "--use-distributed-optimizer", None, "shard the optimizer states over the DP ranks",
            option="distributed optimizer"),
        Fix("set", "--micro-batch-size", "1", "fewest activations per micro-batch", option="micro-batch 1"),
        allocator_fix(log),
    ]
    if config is None or not (config.model and config.training and config.parallel):
        return generic, " (No complete flags given: fixes are generic, without predicted memory.)"
    options = memory_options(config)
    current = current_prediction(config)
    fitting = [o for o in options if o.prediction is None or o.prediction.fits]
    ordered = fitting + [o for o in options if o not in fitting]
    if current is not None and not fitting:
        combined = combined_memory_option(config)
        if combined is not None:
            ordered.insert(0, combined)
    fixes = [fix for option in ordered for fix in option.fixes()]
    fixes.append(generic[-1])
    note = ""
    if current is not None:
        note = (f" Predicted for the current layout: {current.memory_gib:.1f} GiB of {current.capacity_gib:.0f} GiB "
                f"per GPU; each option below carries its own prediction.")
    return fixes, note


def _nccl_timeout(records: list[ErrorRecord], log: ParsedLog, config: RunConfig | None) -> Finding:
    first = records[0].details
    op, seq = first.get("optype"), first.get("seqnum")
    timeout_ms = first.get("timeout_ms")
    what = f" in {op}" + (f" (SeqNum {seq})" if seq else "") if op else ""
    title = f"NCCL watchdog timeout{what}{_ranks(records)}"
    reporting = {r.rank for r in records if r.rank is not None}
    cause = ("A collective did not complete within the timeout"
             + (f" ({int(timeout_ms) // 1000} s)" if timeout_ms and timeout_ms.isdigit() else "")
             + ". Every rank waits for the slowest: one rank is stuck elsewhere (data loading, a checkpoint, a "
             "different collective, a dead process) or the network between ranks failed.")
    if config is not None and reporting and config.world_size > len(reporting):
        silent = sorted(set(range(config.world_size)) - reporting)
        cause += (f" Ranks that did NOT report the timeout are the likely culprits: "
                  f"{', '.join(map(str, silent[:16]))}{' ...' if len(silent) > 16 else ''}.")
    elif op and seq and len({r.details.get('seqnum') for r in records}) == 1:
        cause += (f" All reporting ranks stopped at the same SeqNum {seq}: they agree on the op, so look for the rank "
                  "that is missing.")
    flags = config.flags if config else None
    fixes = [
        Fix("set", "NCCL_DEBUG", "INFO", "log NCCL's init and errors (which transport, which peer)", kind="env"),
        Fix("set", "TORCH_NCCL_TRACE_BUFFER_SIZE", "2000",
            "keep the flight recorder so the dump names the stuck op per rank",
            kind="env"),
        Fix("set", "TORCH_NCCL_DUMP_ON_TIMEOUT", "1", "dump the flight recorder when the watchdog fires", kind="env"),
        Fix("set", "NCCL_IB_HCA / NCCL_SOCKET_IFNAME", "<your IB devices / interface>",
            "pin NCCL to the right NICs (a wrong interface hangs the first inter-node collective)", kind="env"),
    ]
    if takes_megatron_flags(log.framework):
        fixes.append(change(flags, "--distributed-timeout-minutes", "30", "only if the slow step is legitimate (e.g. a "
                            "long save)") if flags else Fix("add", "--distributed-timeout-minutes", "30",
                                                            "only if the slow step is legitimate"))
    return Finding("nccl_timeout", "critical", title, _evidence(records), cause, fixes, occurrences=len(records))


# NCCL prints the ibv_wc status as `with status=12 opcode=...` or (older releases) `with error 12, opcode 0`
_IB_COMPLETION_STATUS = re.compile(r"net/ib.*completion.*(?:status=|with error )(\d+)")
# ibv_wc_status values NCCL's IB transport prints (verbs.h, rdma-core)
_IB_STATUS_MEANING = {
    5: "work request flushed: the queue pair had already failed",
    10: "remote access error",
    12: "transport retry counter exceeded: the peer stopped acknowledging (link down, peer dead, fabric congestion)",
    13: "receiver-not-ready retry exceeded: the peer could not take the data",
}


def _nccl_error(records: list[ErrorRecord], log: ParsedLog, config: RunConfig | None) -> Finding:
    if all(_outlived_warning(r, log) for r in records):
        return _outlived_nccl_warning(records)
    text = " ".join(r.text for r in records).lower()
    if "ncclremoteerror" in text or "network error" in text:
        cause = "A peer failed or the network between ranks did (ncclRemoteError): check the NICs and the remote node."
    elif (ib_status := _IB_COMPLETION_STATUS.search(text)) is not None:
        status = int(ib_status.group(1))
        meaning = _IB_STATUS_MEANING.get(status, "an InfiniBand work-completion error")
        cause = (f"An InfiniBand transfer failed (work completion status {status}: {meaning}): the link, the switch "
                 "path or the peer node dropped out; the other ranks' NCCL aborts follow from it. Check the ports "
                 "and error counters of both named hosts and the fabric between them.")
    elif "invalidusage" in text or "invalidargument" in text:
        cause = ("Ranks called different collectives or with different sizes (ncclInvalidUsage): a code/config "
                 "mismatch between ranks.")
    elif "unhandled cuda error" in text or "unhandled hip error" in text:
        cause = "A CUDA/HIP error inside NCCL: look for an OOM or a GPU fault just before it."
    else:
        cause = "NCCL reported an internal or system error: run with NCCL_DEBUG=INFO to see the failing transport."
    fixes = [
        Fix("set", "NCCL_DEBUG", "INFO", "log which transport and peer failed", kind="env"),
        Fix("set", "NCCL_DEBUG_SUBSYS", "INIT,NET", "focus the log on init and network", kind="env"),
        Fix("add", "ibstat / ibv_devinfo", None, "check that every IB port is Active on every node", kind="command"),
    ]
    return Finding("nccl_error", "critical", f"NCCL error{_ranks(records)}", _evidence(records), cause, fixes,
                   occurrences=len(records))


def _outlived_nccl_warning(records: list[ErrorRecord]) -> Finding:
    """NCCL warnings after which the run went on training: nothing failed, but the link or peer they name may."""
    cause = ("NCCL warned (a network event it recovered from, such as an InfiniBand port that went down and came "
             "back) and training went on: no collective failed. The same link failing for good stops the run, so "
             "if the warnings repeat, check the port and cable they name.")
    fixes = [Fix("add", "ibstat / ibv_devinfo", None, "check that every IB port is Active on every node",
                 kind="command"),
             Fix("add", "perfquery  (RoCE: ethtool -S <interface>)", None,
                 "read the port's error counters (symbol errors, link downed)", kind="command")]
    return Finding("nccl_error", "warning", f"NCCL warning{_ranks(records)}; training went on after it",
                   _evidence(records), cause, fixes, occurrences=len(records))


# What an NVIDIA Xid code says (NVIDIA's Xid catalog): who is likely at fault. The application's codes come from a
# kernel's own illegal access; the hardware's call for draining the node.
XID_MEANING: dict[int, tuple[str, str]] = {
    13: ("graphics engine exception", "application"), 31: ("GPU memory page fault", "application"),
    43: ("GPU stopped processing", "application"), 45: ("preemptive cleanup after an earlier error", "follow-up"),
    48: ("double-bit ECC error", "hardware"), 63: ("ECC page retirement / row remapping event", "hardware"),
    64: ("ECC page retirement / row remapping failure", "hardware"), 74: ("NVLink error", "hardware"),
    79: ("GPU has fallen off the bus", "hardware"), 92: ("high single-bit ECC error rate", "hardware"),
    94: ("contained ECC error", "hardware"), 95: ("uncontained ECC error", "hardware"),
    119: ("GSP RPC timeout", "driver/firmware"), 120: ("GSP error", "driver/firmware"),
}


def _xid_codes(records: list[ErrorRecord]) -> list[int]:
    codes = (int(found.group(1)) for r in records if (found := XID_CODE.search(r.text)) is not None)
    return list(dict.fromkeys(codes))


def _xid_note(codes: list[int]) -> str:
    """The Xid codes the lines name and what they mean; a fault of the application's own when every known code is."""
    if not codes:
        return ""
    named = [f"Xid {code} ({XID_MEANING[code][0]})" if code in XID_MEANING else f"Xid {code}" for code in codes]
    owners = {XID_MEANING[code][1] for code in codes if code in XID_MEANING} - {"follow-up"}
    note = f" The driver reported {', '.join(named)}."
    if owners == {"application"}:
        note += (" These codes usually come from the application (a kernel's illegal memory access, a bad library "
                 "build), not from the GPU: check whether it repeats on other nodes before draining this one.")
    return note


def _gpu_fault(records: list[ErrorRecord], log: ParsedLog, config: RunConfig | None) -> Finding:
    if all(record.signature == "illegal_access" for record in records):
        return _kernel_fault(records, config)
    cause = ("The GPU or its driver reported a hardware-level fault (Xid, ECC, GPU hang/reset, memory access fault, "
             "launch failure). Training cannot continue on that GPU; a software bug can also show as an illegal "
             "memory access, so check whether it repeats on other nodes.") + _xid_note(_xid_codes(records))
    fixes = [
        Fix("add", "nvidia-smi -q -d ECC,PAGE_RETIREMENT  (AMD: amd-smi metric --ecc)", None,
            "read the error counters of the node", kind="command"),
        Fix("add", "drain the node in the scheduler (scontrol update nodename=<node> state=drain reason=gpu_fault)",
            None, "keep the job off the faulty GPU until it is reset or replaced", kind="advice"),
        Fix("add", "dmesg -T | grep -iE 'xid|amdgpu'", None, "find the Xid code and the PCI address", kind="command"),
    ]
    return Finding("gpu_hw_fault", "critical", f"GPU hardware fault{_ranks(records)}", _evidence(records), cause, fixes,
                   occurrences=len(records))


# Code a kernel fault's traceback can name, and the Megatron-LM switch that runs the same step without that kernel:
# an opt-in fusion is removed, RoPE's (on by default) switched off.
_FUSED_PATHS: tuple[tuple[tuple[str, ...], Literal["add", "remove"], str, str], ...] = (
    (("grouped_gemm", "gmm(", "GroupedMLP", "grouped_linear", "GroupedLinear"), "remove", "--moe-grouped-gemm",
     "the experts one GEMM at a time: slower, but it shows whether the grouped GEMM faults"),
    (("permute", "moe_utils"), "remove", "--moe-permute-fusion", "token permutation in plain PyTorch"),
    (("cross_entropy",), "remove", "--cross-entropy-loss-fusion", "the unfused cross entropy"),
    (("rotary", "rope"), "add", "--no-rope-fusion", "the unfused rotary embedding"),
)


def _kernel_fault(records: list[ErrorRecord], config: RunConfig | None) -> Finding:
    """An illegal or misaligned memory access with no hardware error beside it: a kernel first, the GPU second."""
    frames = " ".join(record.details.get("frames", "") for record in records)
    where = next((record.details["frames"].split(" | ")[-1] for record in records if record.details.get("frames")),
                 "")
    cause = ("A GPU kernel read or wrote outside its memory" + (f", reported in `{where}`" if where else "") + ". With "
             "no Xid, ECC or RAS error in the log this is most often a software fault (a fused or custom kernel, an "
             "index computed on the GPU), not the hardware; CUDA reports it asynchronously, so the frame is where it "
             "surfaced, not necessarily the kernel that faulted. If it follows one node across runs, treat the GPU as "
             "faulty.")
    fixes = [Fix("set", "CUDA_LAUNCH_BLOCKING", "1", "one diagnostic rerun: the traceback then names the kernel that "
                                                     "faulted (slow; not for training; AMD: AMD_SERIALIZE_KERNEL=3)",
                 kind="env"),
             Fix("add", "dmesg -T | grep -iE 'xid|amdgpu'", None, "Xid 13/31/43 point at the kernel, Xid 48/63/64/74/"
                 "79/94/95 at the GPU or its links", kind="command")]
    for needles, action, flag, reason in _FUSED_PATHS:
        in_use = config is None or config.flags.has(flag) == (action == "remove")
        if any(needle in frames for needle in needles) and in_use:
            fixes.append(Fix(action, flag, None, f"to confirm: {reason}"))
    return Finding("gpu_hw_fault", "critical", f"GPU kernel fault: illegal memory access{_ranks(records)}",
                   _evidence(records), cause, fixes, occurrences=len(records))


def _rendezvous(records: list[ErrorRecord], log: ParsedLog, config: RunConfig | None) -> Finding:
    fixes = [
        Fix("add", "check MASTER_ADDR:MASTER_PORT is reachable from every node (nc -zv $MASTER_ADDR $MASTER_PORT)",
            None,
            "the store must be reachable", kind="advice"),
        Fix("set", "MASTER_PORT", "<a free port>", "'address already in use' means an old job holds the port",
            kind="env"),
        Fix("add", "start every node with the same --rdzv-id and --nnodes", None,
            "mismatched rendezvous never completes",
            kind="advice"),
    ]
    return Finding("rendezvous_failure", "critical", f"Rendezvous failed{_ranks(records)}", _evidence(records),
                   "The processes could not meet at the rendezvous store: a node did not start, the address/port is "
                   "wrong or taken, or a firewall blocks it.", fixes, occurrences=len(records))


def _shm(records: list[ErrorRecord], log: ParsedLog, config: RunConfig | None) -> Finding:
    fixes = [
        Fix("add", "--shm-size", "64g", "give the container a larger /dev/shm (NCCL and DataLoader workers use it)",
            kind="container", option="container shm"),
        Fix("add", "--ipc", "host", "or share the host's IPC namespace", kind="container", option="container shm"),
        Fix("add", "--ulimit", "memlock=-1", "let NCCL pin memory", kind="container", option="container shm"),
    ]
    if config is not None and (config.flags.get_int("--num-workers", 2, minimum=0) or 0) > 2:
        fixes.append(change(config.flags, "--num-workers", "2", "fewer DataLoader workers use less shared memory"))
    return Finding("shm_insufficient", "critical", f"Shared memory exhausted (bus error){_ranks(records)}",
                   _evidence(records),
                   "A process touched shared memory that /dev/shm could not back (SIGBUS). Docker's "
                   "default /dev/shm is 64 MB, far too small for NCCL and DataLoader workers.", fixes,
                   occurrences=len(records))


def _checkpoint_save(records: list[ErrorRecord], log: ParsedLog, config: RunConfig | None) -> Finding:
    path = config.flags.get("--save") if config else None
    fixes = [Fix("add", f"df -h {path or '<save dir>'}", None, "check free space and quota of the save directory",
                 kind="command"),
             Fix("add", f"touch {path or '<save dir>'}/.write_test", None, "check that every rank can write there",
                 kind="command")]
    cause, writer_fixes = _checkpoint_writer_cause(records, config, log)
    return Finding("checkpoint_save_failure", "critical", f"Checkpoint save failed{_ranks(records)}",
                   _evidence(records),
                   cause, writer_fixes + fixes, occurrences=len(records))


def _checkpoint_writer_cause(records: list[ErrorRecord], config: RunConfig | None,
                             log: ParsedLog) -> tuple[str, list[Fix]]:
    """What the failing writer says about the cause: a short write, a version mismatch, a native crash."""
    text = " ".join(r.text + " " + r.details.get("frame", "") for r in records)
    signatures = {r.signature for r in records}
    if "_write_item" in text or "filesystem_async" in text:
        fixes = [Fix("add", "pip list | grep -iE '^(torch|megatron-core) '", None, "the async writer overrides a "
                     "torch.distributed.checkpoint method whose signature changed between releases", kind="command")]
        fixes += _synchronous_save(log, "save synchronously until the versions match")
        return ("Megatron-Core's asynchronous filesystem writer (torch_dist format) failed inside torch.distributed"
                ".checkpoint: a TypeError from `_write_item()` is a Megatron-Core / PyTorch version mismatch, not "
                "a disk problem."), fixes
    if "crash_in_checkpoint_writer" in signatures:
        fixes = [Fix("add", "dmesg -T | tail -50", None, "a native crash in the writer: look for the kernel's view "
                     "(OOM killer, NFS/Lustre errors, GPU Xid)", kind="command")]
        fixes += _synchronous_save(log, ASYNC_WRITER_CRASH)
        return ("A rank died while the checkpoint was being written (its stack is in the checkpoint writer: CRC32 of "
                "a record, PytorchStreamWriter, the torch_dist writer): the save crashed the process, and every "
                "other rank's error follows from it."), fixes
    if CRASH_DURING_SAVE in signatures:
        saves = sorted({r.details["save_started"] for r in records if "save_started" in r.details})
        return (f"A rank died while a checkpoint save was running (the save started at {', '.join(saves)}, the crash "
                f"came within {CRASH_AFTER_SAVE_S:.0f} s and before the save finished): a native crash or a kill in "
                "the writer (its memory, the filesystem client) often prints no frame of its own. Every other rank's "
                "error follows from it."), [
            Fix("add", "dmesg -T | tail -50", None, "the kernel's view of the crash (OOM killer, NFS/Lustre errors, "
                "GPU Xid)", kind="command"), *_synchronous_save(log, ASYNC_WRITER_CRASH)]
    said = _zip_writer_said(records)
    if said or "pytorchstreamwriter" in text.lower():
        return ("PyTorch's zip writer (PytorchStreamWriter, inside torch.save) could not write the checkpoint file"
                + (f" (it says {said})" if said else "") + ": the filesystem refused or cut the write short — disk "
                "full, over quota, or a network filesystem that dropped it."), []
    return "Writing the checkpoint failed: disk full or over quota, no permission, or a filesystem error.", []


# What PyTorch's zip writer says when a write fails, without c10's `[enforce fail at inline_container.cc:N] . ` before
# it: what it failed writing (a record, the central directory) and why, or a file position other than it expected.
_ZIP_WRITER_SAID_RE = re.compile(r"PytorchStreamWriter (failed .*?)\s*$|(unexpected pos \d+ vs \d+)")
MAX_WRITER_QUOTES = 2


def _zip_writer_said(records: list[ErrorRecord]) -> str:
    """The zip writer's own words in the records, each quoted once, in log order ('' when it said none)."""
    said: list[str] = []
    for record in records:
        found = _ZIP_WRITER_SAID_RE.search(record.text)
        words = found.group(found.lastindex or 0) if found is not None else None
        if words and words not in said:
            said.append(words)
    quoted = [f"'{words}'" for words in said[:MAX_WRITER_QUOTES]]
    more = len(said) - len(quoted)
    return ", then ".join(quoted) + (f" (and {more} more)" if more else "")


ASYNC_WRITER_CRASH = "the async writer's worker process is where such crashes happen; a synchronous save isolates it"


def _synchronous_save(log: ParsedLog, reason: str) -> list[Fix]:
    fix = synchronous_save_fix(log.framework, reason)
    return [] if fix is None else [fix]


def _checkpoint_load(records: list[ErrorRecord], log: ParsedLog, config: RunConfig | None) -> Finding:
    flags = config.flags if config else None
    fixes = [Fix("add", "compare the model flags with the checkpoint's run_config / args", None,
                 "missing/unexpected keys or size mismatches mean the model shape differs", kind="advice")]
    if flags is not None:
        fixes.append(change(flags, "--ckpt-format", "torch_dist",
                            "distributed checkpoints reshard across TP/PP changes"))
        fixes.append(change(flags, "--no-load-optim", None, "if only the optimizer state does not match (fine-tuning)"))
    return Finding("checkpoint_load_failure", "critical", f"Checkpoint load failed{_ranks(records)}",
                   _evidence(records),
                   "The checkpoint could not be loaded into this model/layout: shape or key mismatch, a missing or "
                   "corrupt file, or a format this layout cannot reshard.", fixes, occurrences=len(records))


def _dataloader(records: list[ErrorRecord], log: ParsedLog, config: RunConfig | None) -> Finding:
    data_path = config.flags.get("--data-path") if config else None
    fixes = [Fix("add", f"ls -l {data_path or '<data prefix>'}.bin {data_path or '<data prefix>'}.idx", None,
                 "--data-path takes the prefix without .bin/.idx; both files must exist on every node", kind="command")]
    raised = next((r for r in records if r.signature.startswith("exception:")), None)
    named = f": {raised.signature.removeprefix('exception:')}{_where_bare(raised)}" \
        if raised is not None and _where_bare(raised) else ""
    return Finding("dataloader_error", "critical", f"Data loading failed{_ranks(records)}{named}", _evidence(records),
                   "The dataset could not be opened or a DataLoader worker died.", fixes, occurrences=len(records))


def _config(records: list[ErrorRecord], log: ParsedLog, config: RunConfig | None) -> Finding:
    by_signature = {r.signature for r in records}
    if "token_out_of_vocab" in by_signature:
        return Finding("config_error", "critical", "A token id is past the embedding table", _evidence(records),
                       "An embedding lookup read a token id at or beyond the vocabulary size (the device-side assert "
                       "`srcIndex < srcSelectDimSize`): the data was tokenized with another tokenizer or vocabulary "
                       "than the model's (--tokenizer-model / --vocab-size, or a padded vocabulary cut too small).",
                       [Fix("add", "python -c 'import numpy as np; print(np.memmap(\"<prefix>.bin\", "
                                   "dtype=np.int32).max())'", None, "the largest token id in the data (its dtype is "
                                   "in the .idx header) must be below the model's vocabulary size", kind="command")],
                       occurrences=len(records))
    built = [r for r in records if r.signature == "extension_build_mismatch"
             or any(frame in r.details.get("raised_at", "") + r.details.get("frame", "")
                    for frame in EXTENSION_LOADER_FRAMES)]
    if built:
        return Finding("config_error", "critical", "A compiled extension is missing or built for another torch/CUDA",
                       _evidence(built),
                       "A compiled extension (Megatron's fused kernels, Apex, Transformer Engine, flash-attention) was "
                       "built against another torch or CUDA than the one installed: its shared object asks for a "
                       "symbol the installed torch does not export. This is no crash of the training code and no "
                       "configuration error: rebuild (or reinstall) the extension for the installed torch.",
                       _rebuild_fixes(built), occurrences=len(built))
    if "environment" in by_signature:
        return Finding("config_error", "critical", "The software stack does not fit the GPUs", _evidence(records),
                       "The job could not use the GPUs it was given: no GPU visible to the process (or a rank asking "
                       "for a GPU index the node does not have: more processes per node than visible GPUs), a driver "
                       "older than the CUDA/ROCm build needs, kernels built for another GPU architecture (or a "
                       "precision the GPU does not have), or a kernel extension that does not compile against the "
                       "installed CUDA/ROCm and torch. Nothing in the training configuration is at fault.",
                       [Fix("add", "nvidia-smi (or rocm-smi) && python -c 'import torch; print(torch.version.cuda, "
                                   "torch.version.hip, torch.cuda.is_available())'", None,
                            "compare the driver and the build on the failing node", kind="command"),
                        Fix("set", "CUDA_VISIBLE_DEVICES", "<the GPUs SLURM/torchrun assigned>", "a rank that sees no "
                            "GPU was started outside its allocation", kind="env")],
                       occurrences=len(records))
    fixes = _refusal_fixes(records)
    if not fixes:
        fixes.append(Fix("add", "megapilot script --check", None, "re-check the flags against Megatron's rules",
                         kind="command"))
    te_version = next((v for r in records if (v := transformer_engine_needed(r.text)) is not None), None)
    if te_version is not None:
        return Finding("config_error", "critical", f"Megatron needs Transformer Engine {te_version} or newer for "
                       "these flags", _evidence(records),
                       "A feature the flags turn on needs a newer Transformer Engine than the one the ranks' image "
                       "has: run a newer image, or turn that feature off.", fixes, occurrences=len(records))
    return Finding("config_error", "critical", "Megatron refused the configuration", _evidence(records),
                   "Argument parsing or validation failed before training started; the quoted line names the rule.",
                   fixes, occurrences=len(records))


# Extension (by a word of its shared object's path or its frames) → how to rebuild it for the installed torch.
_REBUILDS: tuple[tuple[tuple[str, ...], str, str], ...] = (
    (("fused_kernels", "scaled_upper_triang", "scaled_masked_softmax", "scaled_softmax", "fused_mix_prec"),
     "rm -rf <Megatron-LM>/megatron/legacy/fused_kernels/build",
     "Megatron builds its fused kernels again at the next start, against the installed torch"),
    (("transformer_engine",), "pip install --no-build-isolation --force-reinstall --no-cache-dir "
     "'transformer_engine[pytorch]'", "Transformer Engine rebuilt for the installed torch and CUDA"),
    (("flash_attn",), "pip install --no-build-isolation --force-reinstall --no-cache-dir flash-attn",
     "flash-attention rebuilt for the installed torch and CUDA"),
    (("apex", "amp_c", "fused_layer_norm_cuda", "fused_adam"),
     "pip install -v --no-build-isolation --no-cache-dir --config-settings '--build-option=--cpp_ext' "
     "--config-settings '--build-option=--cuda_ext' git+https://github.com/NVIDIA/apex",
     "Apex rebuilt from source against the installed torch"),
)


def _rebuild_fixes(records: list[ErrorRecord]) -> list[Fix]:
    said = " ".join(f"{r.text} {r.details.get('frames', '')} {r.details.get('frame', '')} "
                    f"{r.details.get('raised_at', '')}" for r in records).lower()
    fixes = [Fix("add", command, None, reason, kind="command")
             for words, command, reason in _REBUILDS if any(word in said for word in words)]
    fixes.append(Fix("add", "python -c 'import torch; print(torch.__version__, torch.version.cuda)'", None,
                     "the torch and CUDA the extension must be built against", kind="command"))
    return fixes


def _refusal_fixes(records: list[ErrorRecord]) -> list[Fix]:
    """The changes the refusal's own words name. Kept even where the given launch flags seem to have made them
    already: the log shows what the run was given, and a refusal that fired says it lacked them."""
    changes = [change for record in records for change in changes_named_in(record.text)]
    ways = len({change.alternative for change in changes})
    return [Fix(change.action, change.flag, change.value, change.reason, kind=change.kind,
                option=f"way {change.alternative + 1} of {ways}" if ways > 1 else None) for change in changes]


def _crash(records: list[ErrorRecord], log: ParsedLog, config: RunConfig | None) -> Finding:
    # only a failure that explains itself can be the crash's cause; a timeout or a lost peer is another consequence
    others = {e.category for e in cascade_errors(log) if failure_kind(e) == "self-explaining"} - {"process_crash"}
    severity: Severity = "warning" if others else "error"
    raised = next((r for r in records if r.signature.startswith("exception:")), None)
    if others:
        cause = (f"A training process exited abnormally. It follows the {', '.join(sorted(others))} above, which is "
                 "the likely cause.")
        return Finding("process_crash", severity, f"Training process crashed{_ranks(records)}", _evidence(records),
                       cause, [], occurrences=len(records))
    if raised is not None:
        return _exception_crash(records, raised, severity)
    reported = next((r for r in records if r.details.get("launcher_exitcode", "-")[:1].isdigit()), None)
    if reported is not None:
        return _launcher_reported_exit(records, reported, severity)
    cancelled = next((r for r in records if _SLURM_CANCELLED.search(r.text)), None)
    if cancelled is not None:
        return _slurm_cancelled(records, cancelled, severity, log)
    cause = ("A training process exited abnormally (non-zero exit code, signal, or abort). No other error line was "
             "found: look at the lines just before it, dmesg (OOM killer), and the node.")
    fixes = [Fix("add", "dmesg -T | grep -iE 'killed process|oom'", None,
                 "the host OOM killer (CPU RAM) kills without a Python error", kind="command")]
    return Finding("process_crash", severity, f"Training process crashed{_ranks(records)}", _evidence(records), cause,
                   fixes, occurrences=len(records))


_SLURM_CANCELLED = re.compile(r"\*\*\* (?:JOB|STEP) (\S+) ON (\S+) CANCELLED AT \S+(?: DUE TO ([A-Z ]+?))? \*\*\*")


def _slurm_cancelled(records: list[ErrorRecord], cancelled: ErrorRecord, severity: Severity,
                     log: ParsedLog) -> Finding:
    """SLURM ended the job (slurmstepd's `*** JOB n ON node CANCELLED AT t [DUE TO reason] ***`): the processes did
    not crash, they were stopped, and the reason decides what to change."""
    found = _SLURM_CANCELLED.search(cancelled.text)
    assert found is not None
    job, node, reason = found.group(1), found.group(2), (found.group(3) or "").strip()
    history = Fix("add", f"sacct -j {job.split('.')[0]} -o JobID,State,ExitCode,Elapsed,Timelimit,NodeList", None,
                  "SLURM's own record of how the job ended", kind="command")
    done = _training_done_before(log, cancelled)
    if reason == "TIME LIMIT" and done is not None:
        return _hung_at_exit(records, cancelled, done, severity, job, node, history)
    if reason == "TIME LIMIT":
        cause = (f"SLURM stopped job {job} on {node} at its time limit: the run was not finished (or hung until the "
                 "limit: look for a stall before this line). Whatever was not checkpointed is lost.")
        fixes = [Fix("set", "--exit-duration-in-mins", "<the limit in minutes - the save time - a margin>",
                     "Megatron saves a checkpoint and exits cleanly before SLURM kills it")
                 ] if takes_megatron_flags(log.framework) else []
        fixes += [Fix("set", "#SBATCH --time", "<longer, within the partition's MaxTime>", "more time per job",
                      kind="command"), history]
    elif reason == "PREEMPTION":
        cause = (f"SLURM preempted job {job} on {node} for a job of higher priority: nothing failed. The run resumes "
                 "from its last checkpoint when requeued.")
        fixes = [Fix("set", "#SBATCH --requeue", None, "let SLURM put the job back in the queue", kind="command"),
                 Fix("set", "--save-interval", "<fewer iterations>", "lose less work at each preemption"), history]
    elif reason == "NODE FAILURE":
        cause = (f"SLURM ended job {job} because a node failed ({node} reported it): a hardware or node-health "
                 "problem, not the training.")
        fixes = [Fix("add", f"scontrol show node {node}", None, "the node's state and reason", kind="command"),
                 Fix("set", "#SBATCH --exclude", node, "keep the next run off that node", kind="command"), history]
    elif not reason and (stop := megapilot_stop(cancelled.file)) is not None:  # megapilot's own scancel
        cause = (f"megapilot cancelled job {job} itself ({stop.why}); {node} reported it, not a failure of its own. "
                 f"{stop.advice}")
        fixes = [*(_hang_fixes() if stop.state == "HUNG" else []), history]
        return Finding("process_crash", severity, f"megapilot cancelled the job: {stop.why}", _evidence(records),
                       cause, fixes, occurrences=len(records))
    else:
        cause = (f"Job {job} was cancelled on {node}{f' due to {reason.lower()}' if reason else ''}: by scancel (a "
                 "user, an administrator or a workflow tool), not by a failure of the training.")
        fixes = [history]
    return Finding("process_crash", severity, f"SLURM cancelled the job{f' ({reason.lower()})' if reason else ''}",
                   _evidence(records), cause, fixes, occurrences=len(records))


def _training_done_before(log: ParsedLog, cancelled: ErrorRecord) -> ProgressMarker | None:
    """Megatron's `[after training is done]` printed before the cancellation (same file: an earlier line; another
    file: an earlier time when both are known), else None."""
    for marker in log.markers:
        if marker.marker != "training_done":
            continue
        if marker.file == cancelled.file and marker.line < cancelled.line:
            return marker
        if marker.time_s is not None and cancelled.time_s is not None and marker.time_s < cancelled.time_s:
            return marker
    return None


def _hung_at_exit(records: list[ErrorRecord], cancelled: ErrorRecord, done: ProgressMarker, severity: Severity,
                  job: str, node: str, history: Fix) -> Finding:
    """Training finished, then the job sat until SLURM's time limit: the processes did not exit. More time would
    not help; what runs after training (a profiler's shutdown, a final save, process-group teardown) hangs."""
    waited = (f" {_duration(cancelled.time_s - done.time_s)} later" if done.time_s is not None
              and cancelled.time_s is not None and cancelled.time_s > done.time_s else "")
    cause = (f"Training had finished (`[after training is done]`, {Path(done.file).name}:{done.line}) but the "
             f"processes did not exit: SLURM stopped job {job} on {node} at its time limit{waited}. The iterations "
             "are complete; what runs after training hung: a profiler's shutdown (nsys), a final or asynchronous "
             "checkpoint save, dataloader workers or the process-group teardown. A longer time limit only waits "
             "longer.")
    fixes = [Fix("add", f"py-spy dump --pid <a rank's pid> (on {node}, while it hangs)", None,
                 "the Python stack shows what the process waits for after training", kind="command"),
             Fix("add", "timeout --signal=TERM <minutes> around the launch, or scancel once `[after training is done]` "
                 "is logged", None, "free the nodes instead of holding them until the limit", kind="advice"),
             history]
    evidence = [Evidence(done.file, done.line, done.text.strip()), *_evidence(records)]
    return Finding("process_crash", severity, "Job hung after training finished until the SLURM time limit",
                   evidence, cause, fixes, occurrences=len(records))


def _duration(seconds: float) -> str:
    minutes = seconds / 60
    return f"{minutes:.0f} min" if minutes >= 1 else f"{seconds:.0f} s"


def _launcher_reported_exit(records: list[ErrorRecord], reported: ErrorRecord, severity: Severity) -> Finding:
    """Only torchrun's failure summary, with a positive exit code: the rank ended itself (an exception, sys.exit),
    it was not killed, and its traceback is in its own output, which the summary does not carry."""
    rank = reported.rank if reported.rank is not None else "?"
    host = reported.details.get("launcher_host") or "its node"
    code = reported.details["launcher_exitcode"].split(" ")[0]
    cause = (f"torchrun reports that rank {rank} on {host} exited with code {code}: the rank ended itself (a Python "
             "exception or sys.exit), it was not killed by a signal. The launcher's summary carries no traceback "
             "(`error_file: <N/A>` unless the entry point is decorated with torch.distributed.elastic's `@record`): "
             "the rank's own stderr holds the cause.")
    fixes = [Fix("add", f"grep -n -A30 Traceback <the stderr or log of rank {rank} on {host}>", None,
                 "the rank's own traceback names the failure", kind="command")]
    return Finding("process_crash", severity, f"Training process crashed{_ranks(records)}", _evidence(records), cause,
                   fixes, occurrences=len(records))


# The exceptions Megatron's own configuration checks raise: their messages are read for the changes they name.
_CHECK_EXCEPTIONS = ("AssertionError", "ValueError")

# What a Python exception that ended a rank asks for, when no signature of the taxonomy claimed it.
_EXCEPTION_FIXES: dict[str, Fix] = {
    "ModuleNotFoundError": Fix("add", "python -c 'import <module>' in the job's image or venv", None,
                               "a package the code imports is missing where the ranks run (the container image, "
                               "the venv on the compute nodes)", kind="command"),
    "ImportError": Fix("add", "pip list | grep -iE 'torch|megatron|transformer.engine|apex'", None,
                       "a name moved between releases: the installed versions do not match the code", kind="command"),
    "FileNotFoundError": Fix("add", "ls -l <the path in the message>", None,
                             "the file must exist on every node (a shared filesystem or a copy per node)",
                             kind="command"),
    "PermissionError": Fix("add", "ls -ld <the path in the message>", None,
                           "the job's user must be able to write there", kind="command"),
}


def _exception_crash(records: list[ErrorRecord], raised: ErrorRecord, severity: Severity) -> Finding:
    """A rank ended by a Python exception: the exception and its last frame are the cause."""
    name = raised.signature.removeprefix("exception:")
    if name == "SignalException":
        return _stopped_by_signal(records, raised, severity)
    frame = raised.details.get("frame", "")
    cause = (f"A rank raised {name}" + (f" in {frame}" if frame else "") + ": the traceback's last frames say where; "
             "the other ranks' errors, if any, followed it.")
    # an assertion or value check whose message names its own way out (Megatron-Core's model-building checks,
    # raised after the arguments were validated), or any exception that asks for a newer Transformer Engine: the
    # refusal's fixes, as for a refused configuration
    named = _refusal_fixes([raised]) if name in _CHECK_EXCEPTIONS or transformer_engine_needed(raised.text) else []
    fixes = named or ([_EXCEPTION_FIXES[name]] if name in _EXCEPTION_FIXES else [
        Fix("add", "read the traceback above the exception line", None, "the last frames inside the training code "
            "name the failing call and its arguments", kind="advice")])
    return Finding("process_crash", severity, f"{name}{_where_bare(raised)} ended the run{_ranks(records)}",
                   _evidence(records), cause, fixes, occurrences=len(records))


def _where_bare(raised: ErrorRecord | None) -> str:
    """` in file.py:260 in function (code)` for an exception that prints no message (a bare `AssertionError`,
    `StopIteration`): the frames above it name it; empty for one that says what went wrong itself."""
    if raised is None or not raised.details.get("raised_at"):
        return ""
    name = raised.signature.removeprefix("exception:")
    message = strip_prefix(raised.text).strip().removeprefix(name).lstrip(":").strip()
    return "" if message else f" in {raised.details['raised_at']}"


_GOT_SIGNAL = re.compile(r"got signal:?\s*(\d+)")
_SIGNAL_NAMES = {1: "SIGHUP", 2: "SIGINT", 9: "SIGKILL", 15: "SIGTERM"}


def _stopped_by_signal(records: list[ErrorRecord], raised: ErrorRecord, severity: Severity) -> Finding:
    """torchrun's agent got a signal (`SignalException: Process N got signal: 15`) and stopped its workers: the job
    was stopped from outside, which this line does not explain."""
    found = _GOT_SIGNAL.search(raised.text)
    number = int(found.group(1)) if found else None
    signal = _SIGNAL_NAMES.get(number, f"signal {number}") if number is not None else "a signal"
    stop = megapilot_stop(raised.file)
    if stop is not None:  # megapilot sent it: the job's record says so, and why
        cause = (f"megapilot stopped this job itself ({stop.why}): it sent {signal} to the job's processes and "
                 f"torchrun's agent stopped its training processes; nothing on this node failed on its own. "
                 f"{stop.advice}")
        fixes = _hang_fixes() if stop.state == "HUNG" else []
        return Finding("process_crash", "warning" if severity == "error" else severity,
                       f"Stopped by megapilot with {signal}{_ranks(records)}: {stop.why}", _evidence(records), cause,
                       fixes, occurrences=len(records))
    cause = (f"torchrun's agent received {signal} and stopped its training processes: the job was ended from "
             "outside, not by a failure on this node. SLURM sends SIGTERM at scancel, a time limit or a preemption; "
             "a multi-node launcher stops the other nodes the same way once one node's rank failed. The first error "
             "of the run, on another node or earlier in time, is the cause.")
    fixes = [Fix("add", "sacct -j <job id> -o JobID,State,ExitCode,Elapsed,Timelimit,NodeList", None,
                 "whether SLURM cancelled the job (State CANCELLED, TIMEOUT, PREEMPTED)", kind="command"),
             Fix("add", "megapilot diagnose <every node's log>", None,
                 "the first failing rank across the nodes, which this node's stop followed", kind="command")]
    return Finding("process_crash", "warning" if severity == "error" else severity,
                   f"Stopped by {signal} from outside{_ranks(records)}", _evidence(records), cause, fixes,
                   occurrences=len(records))


def _wall_clock_hang(records: list[ErrorRecord], log: ParsedLog, config: RunConfig | None) -> Finding:
    dumps = [r for r in records if r.signature == "stack_dump"]
    if dumps:
        return _stuck_stack(dumps, log)
    details = records[0].details
    return Finding("hang", "critical",
                   f"No progress for {details.get('silent_s', '?')} s after iteration "
                   f"{details.get('last_iteration', '?')}",
                   _evidence(records),
                   "No iteration line arrived for many times the usual step time while following the log.",
                   _hang_fixes(), occurrences=len(records))


def _stuck_stack(dumps: list[ErrorRecord], log: ParsedLog) -> Finding:
    """A stack dump of a stuck process (py-spy dump, faulthandler): its main thread's innermost frame is where it
    waits; a wait inside a collective or a CUDA synchronisation is a rank waiting for the others."""
    where = dumps[0].details.get("waits_in", "?")
    collective = any(word in where.lower() for word in ("synchronize", "all_reduce", "allreduce", "barrier", "wait",
                                                         "all_gather", "reduce_scatter", "broadcast", "recv"))
    cause = (f"The process was stuck when its stack was dumped: its main thread waits in {where}. "
             + ("A rank waiting in a collective or a device synchronisation waits for the other ranks: the rank "
                "that is not there (dead, slower, or in another collective) is the cause; dump every rank's stack."
                if collective else "That call did not return: the frames under it say what it waits for."))
    fixes = [Fix("add", "py-spy dump --native --pid <pid of each rank>", None,
                 "the same dump on every rank shows which one is elsewhere", kind="command"), *_hang_fixes()]
    return Finding("hang", "critical", f"Hang: the main thread waits in {where}{_ranks(dumps)}",
                   [Evidence(r.file, r.line, r.text.strip()) for r in dumps[:MAX_EVIDENCE]]
                   + [Evidence(dumps[0].file, dumps[0].line + 1, where)], cause, fixes, occurrences=len(dumps))


LINE_RULES = {  # category -> its rule; a test checks every line signature's category has one
    "oom": _oom, "nccl_timeout": _nccl_timeout, "nccl_error": _nccl_error, "gpu_hw_fault": _gpu_fault,
    "rendezvous_failure": _rendezvous, "shm_insufficient": _shm, "checkpoint_save_failure": _checkpoint_save,
    "checkpoint_load_failure": _checkpoint_load, "dataloader_error": _dataloader, "config_error": _config,
    "process_crash": _crash, "hang": _wall_clock_hang, "nan_loss": _rerun_nan,
}


# ---- metric rules ------------------------------------------------------------------------------------

def _divergence_fixes(config: RunConfig | None, log: ParsedLog) -> list[Fix]:
    own = divergence_fixes(log.framework)
    if own is not None:
        return own
    flags = config.flags if config else None
    printed = log.arguments.values if log.arguments is not None else {}
    fixes: list[Fix] = []
    if all(flags.has(name) if flags else printed.get(name[2:].replace("-", "_")) == "True"
           for name in _GATHER_IN_THE_STEP):
        # the one NaN cause a launch's own switches name: before the remedies of numerics in general
        fixes.append(Fix("remove", "--overlap-param-gather-with-optimizer-step", None,
                         "the MXFP8 weights' all-gather reuses the gradient buffer (--reuse-grad-buf-for-mxfp8-param-"
                         "ag), which Megatron refills with them only after the step zeroes it; gathered during the "
                         "optimizer step, the grad norm goes NaN (Megatron-Bridge's recipes turn this overlap off for "
                         "MXFP8 and NVFP4)"))
    peak = (flags.get_float("--lr") if flags else None) or _printed_float(printed, "lr")
    logged = [(r.iteration, r.lr) for r in _unique(log.iterations) if r.lr]
    # a logged LR that is still rising is inside the warm-up: the peak the schedule climbs to is above it
    warming = len(logged) >= 2 and all(b >= a for (_, a), (_, b) in pairwise(logged)) and logged[-1][1] > logged[0][1]

    def fix(name: str, value: str | None, reason: str) -> Fix:
        return change(flags, name, value, reason) if flags else Fix("add", name, value, reason)

    if peak:
        fixes.append(fix("--lr", f"{peak / 2:.2e}", f"halve the peak learning rate ({peak:.2e})"))
    elif warming:
        iteration, lr = logged[-1]
        fixes.append(fix("--lr", "<half the configured peak>", f"the logged learning rate is still warming up "
                         f"({lr:.2e} at iteration {iteration}), so the peak is above it: halve the peak"))
    elif logged:
        highest = max(lr for _, lr in logged)
        fixes.append(fix("--lr", f"{highest / 2:.2e}", f"halve the learning rate ({highest:.2e}, the highest the "
                                                       "log shows)"))
    train_iters = (config.training.train_iters if config and config.training else None) or \
        (flags.get_int("--train-iters") if flags else None) or \
        next((r.train_iters for r in log.iterations if r.train_iters), None)
    said = [flags.get_float("--" + name.replace("_", "-")) if flags else None for name in _WARMUP_ARGUMENTS]
    said += [_printed_float(printed, name) for name in _WARMUP_ARGUMENTS]
    # Megatron's scheduler asserts the warm-up shorter than the decay (--lr-decay-iters, else --train-iters): a
    # warm-up of 1% of training (at least 100 iterations) is kept within a tenth of the decay
    decay = (flags.get_int("--lr-decay-iters") if flags else None) or _printed_float(printed, "lr_decay_iters") \
        or train_iters
    if not any((value or 0) > 0 for value in said) and not warming and (decay is None or decay > 1):
        suggested = max(100, int(0.01 * train_iters)) if train_iters else 2000
        if decay is not None:
            suggested = min(suggested, max(1, int(decay) // 10))
        fixes.append(fix("--lr-warmup-iters", str(suggested),
                         "warm the learning rate up instead of starting at the peak"))
    # Megatron clips at 1.0 unless told otherwise: a script without the flag, or a log that does not say, ran with
    # that, so advising it would change nothing; only a clip the run set off (0) or above 1.0 is worth changing
    clip = flags.get_float("--clip-grad", float_default("--clip-grad")) if flags else _printed_float(printed,
                                                                                                   "clip_grad")
    if clip is not None and (clip == 0 or clip > 1.0):
        fixes.append(fix("--clip-grad", "1.0", f"clip the global grad norm at 1.0 (the run clips at {clip:g}"
                                               + (", off)" if clip == 0 else ")")))
    hidden = config.model.hidden_size if config and config.model else None
    # the init is drawn only for a model built from scratch: weights the run loaded (a fine-tune, a resume) have none
    loaded = any(op.kind == "load" and op.completed for op in log.checkpoints) or bool(
        flags and flags.has("--pretrained-checkpoint"))
    if hidden and not loaded:
        std = math.sqrt(2 / (5 * hidden))  # "small init" (Nguyen & Salazar 2019): sqrt(2 / (5 h))
        current = flags.get_float("--init-method-std", 0.02) if flags else 0.02
        if current and current > std * 1.25:
            fixes.append(fix("--init-method-std", f"{std:.4f}", f"smaller init for hidden size {hidden}: sqrt(2/(5h))"))
    if config is not None and config.precision_flag == "fp16":
        fixes.append(Fix("remove", "--fp16", None, "fp16's narrow range overflows; bf16 does not need loss scaling"))
        fixes.append(fix("--bf16", None, "bf16 has fp32's exponent range"))
    return fixes


# Two switches that together give NaN grad norms (`launch.perf_flags.NO_OPTIMIZER_STEP_GATHER`: `script` never writes
# the second beside MXFP8); the arguments block prints them by destination, True when on.
_GATHER_IN_THE_STEP = ("--reuse-grad-buf-for-mxfp8-param-ag", "--overlap-param-gather-with-optimizer-step")

# Megatron-LM's warm-up arguments (as the arguments block prints them; `--lr-warmup-iters` ... as flags): any of
# them above 0 means the LR warms up.
_WARMUP_ARGUMENTS = ("lr_warmup_iters", "lr_warmup_fraction", "lr_warmup_samples")


def _printed_float(printed: dict[str, str], name: str) -> float | None:
    """A number the log's arguments block printed (`None` and text that is no number: None)."""
    try:
        return float(printed[name])
    except (KeyError, ValueError):
        return None


def _nan_finding(log: ParsedLog, config: RunConfig | None) -> Finding | None:
    if any(error.category == "nan_loss" for error in log.errors):
        return None  # the RerunStateMachine's report names rank and iteration: that finding says more
    bad: list[IterationRecord] = []
    previous: IterationRecord | None = None
    had_loss = had_counters = False
    for record in log.iterations:
        interval = record.iteration - previous.iteration if previous else None
        # A line cut short lacks its closing counters too: a crash tore the write, or another rank's output broke
        # into it (the rest of the line follows on the next one). Megatron drops the loss of a NaN step but still
        # prints the counters, so a line without them, in a run whose lines carry them, says nothing of a NaN.
        torn = had_counters and record.nan_iterations is None
        vanished = (had_loss and record.lm_loss is None and interval is not None and interval > 0
                    and (record.skipped_iterations or 0) < interval and not record.losses and not torn)
        counted = bool(record.nan_iterations)
        if record.has_nonfinite or counted or vanished:
            bad.append(record)
        had_loss = had_loss or record.lm_loss is not None
        had_counters = had_counters or record.nan_iterations is not None
        previous = record
    if not bad:
        return None
    first = bad[0]
    how = ("NaN/Inf in the loss or grad norm" if first.has_nonfinite else
           "Megatron counted NaN iterations" if first.nan_iterations else "the loss disappeared from the log line")
    return Finding("nan_loss", "critical", f"NaN loss from iteration {first.iteration} ({how})",
                   [_ev(r) for r in bad[:MAX_EVIDENCE]],
                   "The loss or gradients became NaN/Inf: the learning rate is too high for this stage of training, "
                   "the initialisation too large, fp16 overflowed, or a bad batch. Megatron's 'number of nan "
                   "iterations' can stay 0 while the loss vanishes from the line, so that is checked too.",
                   _divergence_fixes(config, log), occurrences=len(bad))


def _loss_findings(log: ParsedLog, config: RunConfig | None) -> list[Finding]:
    series = [(r, r.lm_loss) for r in _unique(log.iterations) if r.lm_loss is not None and math.isfinite(r.lm_loss)]
    if len(series) < WINDOW + 2:
        return []
    spikes: list[IterationRecord] = []
    diverged_from: tuple[IterationRecord, float] | None = None
    for index in range(WINDOW, len(series)):
        baseline = statistics.median(loss for _, loss in series[index - WINDOW:index])
        record, loss = series[index]
        if loss > SPIKE_FACTOR * baseline:
            rest = [later for _, later in series[index:]]
            if len(rest) >= WINDOW // 2 and all(later > SPIKE_FACTOR * baseline for later in rest[-(WINDOW // 2):]):
                diverged_from = (record, baseline)
                break
            spikes.append(record)
    findings = []
    if diverged_from is not None:
        record, baseline = diverged_from
        last = series[-1][0]
        findings.append(Finding(
            "loss_divergence", "critical",
            f"Loss diverged from iteration {record.iteration}: {baseline:.3f} → {last.lm_loss:.3f}",
            [_ev(record), _ev(last)],
            "The loss rose and stayed up: training is diverging (learning rate too high, bad initialisation or "
            "numerics).", _divergence_fixes(config, log)))
    if spikes:
        findings.append(Finding(
            "loss_spike", "warning", f"{len(spikes)} loss spike(s), first at iteration {spikes[0].iteration}",
            [_ev(r) for r in spikes[:MAX_EVIDENCE]],
            f"The loss jumped above {SPIKE_FACTOR}x its recent median and came back: often a bad batch or an LR "
            "too close to the edge of stability.", _divergence_fixes(config, log), occurrences=len(spikes)))
    return findings


def _unique(records: list[IterationRecord]) -> list[IterationRecord]:
    """One record per iteration number, in order (other ranks' copies dropped)."""
    out: list[IterationRecord] = []
    highest = -1
    for record in records:
        if record.iteration > highest:
            out.append(record)
            highest = record.iteration
    return out


def _hang_fixes() -> list[Fix]:
    return [
        Fix("add", "py-spy dump --pid <pid of each rank>", None, "see where every rank is stuck", kind="command"),
        Fix("set", "TORCH_NCCL_DUMP_ON_TIMEOUT", "1", "dump NCCL's flight recorder when the watchdog fires",
            kind="env"),
    ]


def restarts(log: ParsedLog) -> list[tuple[IterationRecord, IterationRecord]]:
    """(the last iteration logged before, the first logged after) wherever one source's iteration numbers go back:
    the run restarted in the same log and resumed from an earlier checkpoint, replaying what it had done since."""
    found: list[tuple[IterationRecord, IterationRecord]] = []
    highest: dict[tuple[str, int | None], IterationRecord] = {}
    for record in log.iterations:
        source = (record.file, record.rank)  # one file (and rank) at a time: other files' copies are not a replay
        top = highest.get(source)
        if top is not None and record.iteration < top.iteration and (not found or found[-1][0] is not top):
            found.append((top, record))
        if top is None or record.iteration > top.iteration:
            highest[source] = record
    return found


def _started_up_between(log: ParsedLog, before: IterationRecord, after: IterationRecord) -> bool:
    """Whether the run started up again between the two iterations (a job that ended and one that resumed from its
    checkpoint): in one file, a start-up line between them; in two, the later file's first iteration logged after
    `before` (another rank's file of the same run logs the same iterations at the same times, so it began earlier)."""
    if before.file == after.file:
        return any(marker.file == after.file and before.line < marker.line < after.line
                   and marker.marker.startswith(("training_started", "stall_point:")) for marker in log.markers)
    first_s = min((r.time_s for r in log.iterations if r.file == after.file and r.time_s is not None), default=None)
    return first_s is not None and before.time_s is not None and first_s > before.time_s


def _hang_findings(log: ParsedLog, config: RunConfig | None) -> list[Finding]:
    findings = []
    timed = [r for r in _unique(log.iterations) if r.time_s is not None]
    steps = [r.elapsed_ms for r in timed if r.elapsed_ms]
    typical_s = statistics.median(steps) / 1000.0 if steps else None
    restarted = {(before.file, before.iteration) for before, _ in restarts(log)}
    if len(timed) >= 2 and typical_s:
        limit = max(HANG_FLOOR_S, HANG_FACTOR * typical_s)
        for before, after in pairwise(timed):
            gap = after.time_s - before.time_s  # type: ignore[operator]  # timed: time_s is set
            interval = max(1, after.iteration - before.iteration)
            if (before.file, before.iteration) in restarted or _started_up_between(log, before, after):
                continue  # a crash and a resume, not a stall: the crash is its own finding, the resume a note
            if gap - interval * typical_s > limit:
                findings.append(Finding(
                    "hang", "warning",
                    f"Stalled {gap:.0f} s between iterations {before.iteration} and {after.iteration}",
                    [_ev(before), _ev(after)],
                    f"No progress for {gap:.0f} s where {interval} iteration(s) take about "
                    f"{interval * typical_s:.0f} s; "
                    "training resumed afterwards (a slow save, evaluation, a straggler or a transient network stall).",
                    _hang_fixes()))
                break
    done = any(m.marker == "training_done" for m in log.markers)
    if timed and typical_s and log.last_time_s and not done and not log.errors:
        # the iteration logged last, not the highest: a resume that replays earlier iterations is progress
        last = max((r for r in log.iterations if r.time_s is not None), key=lambda r: r.time_s or 0.0)
        silent = log.last_time_s - (last.time_s or log.last_time_s)
        limit = max(HANG_FLOOR_S, HANG_FACTOR * typical_s)
        if silent > limit:
            evidence = [_ev(last)] + ([log.last_line] if log.last_line else [])
            findings.append(Finding(
                "hang", "critical", f"No progress for {silent:.0f} s after iteration {last.iteration}", evidence,
                f"The log goes on for {silent:.0f} s (>{HANG_FACTOR:.0f}x the {typical_s:.1f} s step) without another "
                "iteration and without an error.", _hang_fixes()))
    findings.extend(_startup_stall(log))
    return findings


_STALL_CAUSES = {
    "stall_point:fused_kernel_build": (
        "The log stops while building Megatron's fused kernels. A previous, interrupted build left torch's "
        "cpp_extension lock file behind (or ranks build concurrently), so every rank waits on the lock forever.",
        [Fix("add", "rm -rf megatron/fused_kernels/build", None,
             "remove the stale build directory (and its lock) and relaunch", kind="command")]),
    "stall_point:distributed_init": (
        "The log stops while initialising torch.distributed: some rank never joined (wrong MASTER_ADDR, blocked "
        "port, a node that did not start).", [Fix("set", "NCCL_DEBUG", "INFO", "see which rank is missing",
                                                  kind="env")]),
    "stall_point:dataset_build": (
        "The log stops while building the dataset indices: rank 0 builds them while the others wait; on a slow or "
        "shared filesystem this can take very long or deadlock.",
        [Fix("add", "build the dataset cache once before the run (or point --data-cache-path at fast local disk)",
             None, "avoid building indices inside the job", kind="advice")]),
}


def _startup_stall(log: ParsedLog) -> list[Finding]:
    progress = [marker for marker in log.markers if not marker.marker.startswith("release:")]  # not a start-up step
    if log.iterations or log.errors or not progress or log.last_line is None:
        return []
    last_marker = progress[-1]
    if last_marker.marker == "training_started":
        return [_no_first_iteration(last_marker)]
    if not last_marker.marker.startswith("stall_point:") or log.last_line.line - last_marker.line > 3:
        return []
    cause, fixes = _STALL_CAUSES.get(last_marker.marker, (
        "The log stops during start-up without an error.", _hang_fixes()))
    evidence = [Evidence(last_marker.file, last_marker.line, last_marker.text.strip())]
    return [Finding("hang", "critical", f"Start-up hang at {last_marker.marker.split(':', 1)[1].replace('_', ' ')}",
                    evidence, cause, fixes)]


def _no_first_iteration(started: ProgressMarker) -> Finding:
    """Training started (`training ...`) and the log holds no iteration after it, nor an error, nor its end."""
    return Finding(
        "hang", "warning", "Training started but never logged an iteration",
        [Evidence(started.file, started.line, started.text.strip())],
        "The log reaches the start of training and no iteration line follows, no error and no end of training: the "
        "first steps hang (a collective some rank never joins, a data loader that never yields, a kernel build or "
        "compile that never ends), or the log was read before the first --log-interval iterations ended. With "
        "pipeline parallelism only the last stage prints iterations: read that rank's log too.",
        [*_hang_fixes(), Fix("set", "--log-interval", "1", "print every iteration, so the log shows whether the "
                                                          "first step ends")])


def _steady_steps(log: ParsedLog) -> list[IterationRecord]:
    """The timed iterations after the summary's warm-up, one per iteration number: what the step-time rules read."""
    records = [r for r in _unique(log.iterations) if r.elapsed_ms]
    return records[log.summary.warmup_dropped if log.summary else 0:]


def _slowdown(log: ParsedLog, config: RunConfig | None) -> Finding | None:
    steady = _steady_steps(log)
    # a batch ramp-up (--rampup-batch-size; Megatron logs the global batch size on every line) makes each step more
    # work: the trend is read at the last batch size only, or a ramp from 32 to 256 reads as a run 4x slower
    changed = [i for i, (a, b) in enumerate(pairwise(steady), start=1) if a.gbs != b.gbs]
    steady = steady[changed[-1]:] if changed else steady
    sparse = len(steady) < SLOWDOWN_MIN_ITERATIONS
    if len(steady) < SLOWDOWN_SPARSE_MIN_ITERATIONS or _trained_s(steady) < SLOWDOWN_MIN_SPAN_S:
        return None
    if (jump := _lasting_change(steady)) is not None and jump[1].rose:
        return None  # one jump that stayed, told by `_step_time_change`: read as a trend it would be a drift it is not
    trend = step_time_trend(steady)
    if trend is None:
        return None
    slope_ms, start_ms, end_ms, consistency = trend
    growth, needed_consistency = ((SLOWDOWN_SPARSE_GROWTH, SLOWDOWN_SPARSE_CONSISTENCY) if sparse
                                  else (SLOWDOWN_TREND_GROWTH, SLOWDOWN_CONSISTENCY))
    fifth = max(2, len(steady) // 5)
    early = statistics.median(r.elapsed_ms or 0.0 for r in steady[:fifth])
    late = statistics.median(r.elapsed_ms or 0.0 for r in steady[-fifth:])
    if start_ms <= 0 or end_ms < (1 + growth) * start_ms or consistency < needed_consistency or late <= early:
        return None
    fixes = [Fix("add", "nvidia-smi -q -d CLOCK,PERFORMANCE  (AMD: amd-smi metric --clock)", None,
                 "check for thermal or power throttling", kind="command"),
             Fix("add", "py-spy dump --pid <pid of a rank>", None, "see where a slow step spends its time (GC, data "
                 "loading, a collective)", kind="command")]
    # nodes reads this module's Xid table: imported here, where the cycle is closed
    from megapilot.diagnose.nodes import stragglers_from_reports

    # the run logged `--log-straggler` reports: they name the slow rank, where the fix would ask for them
    verdict = stragglers_from_reports(log.straggler_reports)
    if takes_megatron_flags(log.framework):
        flags = config.flags if config else None
        fixes[:0] = [
            change(flags, "--manual-gc", None, "run Python's GC at fixed intervals on all ranks at once") if flags
            else Fix("add", "--manual-gc", None, "run Python's GC at fixed intervals on all ranks at once"),
            *([] if verdict is not None else [
                change(flags, "--log-straggler", None, "log which rank is slow") if flags
                else Fix("add", "--log-straggler", None, "log which rank is slow")]),
        ]
    span = steady[-1].iteration - steady[0].iteration
    evidence = [_ev(steady[0]), _ev(steady[len(steady) // 2]), _ev(steady[-1])]
    said = ""
    if verdict is not None:
        [slow] = verdict.ranks
        times = sum(report.slowest_rank == slow.index for report in log.straggler_reports)
        said = (f" Megatron's --log-straggler reports name {slow.name.replace('rank', 'rank ')} the slowest in {times}"
                f" of the last {len(log.straggler_reports)}, its GEMMs taking {slow.ratio:.2f}x the fastest rank's: "
                + ("look at that rank's GPU and node first (clocks, temperature, neighbours)."
                   if slow.ratio > verdict.max_ratio else
                   "no rank stands out, so the whole job slowed, not one GPU."))
        evidence += list(slow.evidence[-1:])
    return Finding("slowdown", "warning",
                   # the trend's ends are fitted, not logged: the logged times beside them, as the log prints them
                   f"Step time rose {end_ms / start_ms:.1f}x over {span} iterations: "
                   f"{start_ms:,.0f} → {end_ms:,.0f} ms on the fitted trend "
                   f"(+{slope_ms:,.1f} ms per iteration); logged {steady[0].elapsed_ms:.1f} ms at iteration "
                   f"{steady[0].iteration}, {steady[-1].elapsed_ms:.1f} ms at {steady[-1].iteration}",
                   evidence,
                   f"A steady trend, not one slow step: the robust (Theil-Sen) slope of step time over the run is "
                   f"+{slope_ms:,.2f} ms per iteration and {consistency:.0%} of the step pairs got slower. "
                   "Throttling, a "
                   "straggler rank, memory fragmentation, Python GC, a data pipeline falling behind, or a filesystem "
                   "getting slower." + said, fixes)


def _lasting_change(steady: list[IterationRecord]) -> tuple[list[IterationRecord], StepChange] | None:
    """The largest lasting change of step time (`megapilot.diagnose.step_change`) within a stretch of one global batch
    size: a batch ramp-up (`--rampup-batch-size`; Megatron logs the global batch size on every line) raises the step
    with the work per step, which is no change of speed, so no change is looked for across a batch size change."""
    stretches: list[list[IterationRecord]] = []
    for record in steady:
        if stretches and stretches[-1][-1].gbs == record.gbs:
            stretches[-1].append(record)
        else:
            stretches.append([record])
    found = [(stretch, change) for stretch in stretches
             if (change := find_step_change([r.elapsed_ms or 0.0 for r in stretch])) is not None]
    return max(found, key=lambda pair: abs(pair[1].fraction), default=None)


def _step_time_change(log: ParsedLog, config: RunConfig | None) -> Finding | None:
    """Step time that moved to another level at one point and stayed there: a warning when it rose, a note when it
    fell (a throttled GPU that recovered, another job that ended)."""
    steady = _steady_steps(log)
    if _trained_s(steady) < SLOWDOWN_MIN_SPAN_S or (lasting := _lasting_change(steady)) is None:
        return None
    stretch, jump = lasting
    before, first = stretch[jump.index - 1], stretch[jump.index]
    last = stretch[-1]
    where = (f"at iteration {first.iteration}" if first.iteration - before.iteration == 1
             else f"between iterations {before.iteration} and {first.iteration}")
    evidence = [_ev(r) for r in stretch[max(0, jump.index - 2):jump.index + 2]]
    if last not in stretch[jump.index - 2:jump.index + 2]:
        evidence.append(_ev(last))
    levels = (f"from {jump.before_ms:,.0f} ms to {jump.after_ms:,.0f} ms {where} ({jump.fraction:+.0%}) and stayed "
              f"there to iteration {last.iteration}")
    measured = (f"Medians of the {JUMP_WINDOW} logged steps before and from iteration {first.iteration}; the run's "
                f"step-to-step noise is {jump.noise_ms:,.0f} ms, so this is no jitter, and no trend: the level is flat "
                "on both sides.")
    if not jump.rose:
        return Finding(
            "slowdown", "info", f"Step time fell {levels}", evidence,
            f"{measured} The run got faster at that point and stayed faster: what slowed it before ended (a "
            "throttled GPU or a straggler that recovered, another job on the nodes that finished, checkpoint saves or "
            "evaluations that stopped, input that caught up), or the steps before it were slow for a reason of "
            "their own (the first iterations after a resume, a cold filesystem cache). Nothing to change; if the "
            "earlier level is what the run usually gets, look at what changed then.")
    restarted = _started_up_between(log, before, first)
    saves = [op for op in log.checkpoints if op.kind == "save" and op.iteration is not None
             and before.iteration <= op.iteration < first.iteration]
    stragglers, straggler_evidence = _stragglers_around(log, first)
    evidence += straggler_evidence
    causes = [
        *(["the run restarted between them and resumed on this allocation: other nodes, or other settings, than "
           "before"] if restarted else []),
        "a GPU or node that began to throttle (power, temperature, clocks), or a straggler rank that appeared: in "
        "synchronous data parallelism every rank waits for the slowest" + stragglers,
        (f"a checkpoint save at iteration {saves[0].iteration}, just before the change: an asynchronous save's "
         "writer or the memory a save left behind slows the steps after it (Megatron keeps the save itself out of "
         "the step time)" if saves else
         "checkpoint saves or evaluations that started at that point (--save-interval, --eval-interval, "
         "--start-eval-at-iter): their background writer or the memory they leave behind"),
        "another job or process that started on the same nodes or GPUs, or on the network they share",
        "the data loader or the filesystem: a slower part of the dataset blend, or storage that got busier",
        ("a change in the work per step: the global batch size stayed "
         f"{first.gbs} across it, but a longer sequence length (--seq-length after a resume) also raises it"
         if first.gbs is not None else
         "a change in the work per step: a batch ramp-up (--rampup-batch-size) or a longer sequence length"),
    ]
    fixes = [Fix("add", "nvidia-smi -q -d CLOCK,PERFORMANCE on each node  (AMD: amd-smi metric --clock)", None,
                  "throttle reasons and clocks: a GPU that slowed shows here", kind="command"),
             Fix("add", "nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv on each node", None,
                 "a process that is not this job's on its GPUs", kind="command")]
    if takes_megatron_flags(log.framework):
        flags = config.flags if config else None
        wanted: list[tuple[str, str | None, str]] = [
            ("--timing-log-level", "2", "Megatron's timers say which part of the step grew: forward-backward, the "
             "optimizer, the gradient all-reduce or batch-generator (the data loader)")]
        if not log.straggler_reports:
            wanted.append(("--log-straggler", None, "log which rank is slowest, with its GEMM throughput"))
        fixes += [change(flags, name, value, reason) if flags else Fix("add", name, value, reason)
                  for name, value, reason in wanted]
    return Finding(
        "slowdown", "warning", f"Step time rose {levels}", evidence[:MAX_EVIDENCE + 1],
        f"{measured} A one-time change, not a drift. Likely causes, most likely first: " + "; ".join(
            f"({number}) {cause}" for number, cause in enumerate(causes, start=1)) + ".", fixes)


def _stragglers_around(log: ParsedLog, first: IterationRecord) -> tuple[str, list[Evidence]]:
    """What Megatron's `--log-straggler` reports say about the ranks after the change (those of its file logged
    after it; a report in another file has no place in time beside it, so then every report), with a report line."""
    # nodes reads this module's Xid table: imported here, where the cycle is closed
    from megapilot.diagnose.nodes import stragglers_from_reports

    reports = log.straggler_reports
    if not reports:
        return (": the log holds no per-rank timings (--log-straggler) to say which", [])
    same_file = [r for r in reports if r.evidence.file == first.file]
    after = [r for r in same_file if r.evidence.line > first.line] if same_file else reports
    earlier = [r for r in same_file if r.evidence.line < first.line]
    which = "--log-straggler reports after the change" if same_file else "latest --log-straggler reports"
    verdict = stragglers_from_reports(after)
    if verdict is None:
        return (": the log's --log-straggler reports all come before the change", [])
    [slow] = verdict.ranks
    rank = slow.name.replace("rank", "rank ")
    was = stragglers_from_reports(earlier) if earlier else None
    then = (f" (before the change the slowest was {was.ranks[0].name.replace('rank', 'rank ')} at "
            f"{was.ranks[0].ratio:.2f}x)" if was is not None else "")
    if slow.ratio > verdict.max_ratio:
        times = sum(report.slowest_rank == slow.index for report in after)
        return (f". Megatron's {which} name {rank} the slowest in {times} of "
                f"{len(after)}, its GEMMs taking {slow.ratio:.2f}x the fastest rank's{then}: look at that rank's GPU "
                "and node first", list(slow.evidence[-1:]))
    return (f". Megatron's {which} show no rank standing out (the slowest GEMMs "
            f"{slow.ratio:.2f}x the fastest){then}: the whole job slowed, not one GPU, so the causes below come first",
            list(slow.evidence[-1:]))


def _trained_s(records: list[IterationRecord]) -> float:
    """Seconds of training between the first and the last record: each logged step time (an average over its log
    interval) times the iterations it covers."""
    return sum((later.elapsed_ms or 0.0) * (later.iteration - earlier.iteration)
               for earlier, later in pairwise(records)) / 1000


def step_time_trend(records: list[IterationRecord]) -> tuple[float, float, float, float] | None:
    """Theil-Sen fit of step time (ms) over iteration number: (slope in ms per iteration, fitted step time at the
    first and at the last iteration, share of pairwise slopes that are positive). None for fewer than 3 points."""
    points = [(float(r.iteration), r.elapsed_ms) for r in records if r.elapsed_ms is not None]
    if len(points) > SLOWDOWN_MAX_POINTS:
        stride = len(points) / SLOWDOWN_MAX_POINTS
        points = [points[int(i * stride)] for i in range(SLOWDOWN_MAX_POINTS)]
    slopes = [(y2 - y1) / (x2 - x1) for i, (x1, y1) in enumerate(points) for x2, y2 in points[i + 1:] if x2 != x1]
    if len(points) < 3 or not slopes:
        return None
    slope = statistics.median(slopes)
    intercept = statistics.median(y - slope * x for x, y in points)
    first_x, last_x = points[0][0], points[-1][0]
    positive = sum(1 for value in slopes if value > 0) / len(slopes)
    return slope, intercept + slope * first_x, intercept + slope * last_x, positive


def _first_update_jump(log: ParsedLog, config: RunConfig | None) -> Finding | None:
    """The loss logged right after the first updates is well above the first logged loss."""
    series = [r for r in _unique(log.iterations) if r.lm_loss is not None and math.isfinite(r.lm_loss)]
    if len(series) < 2 or series[0].iteration > FIRST_UPDATE_MAX_ITERATION:
        return None
    first, second = series[0], series[1]
    assert first.lm_loss is not None and second.lm_loss is not None
    if first.lm_loss <= 0:
        return None
    after = [r.lm_loss for r in series[1:1 + WINDOW] if r.lm_loss is not None]
    moves = [abs(later - earlier) for earlier, later in pairwise(after)]
    jumped = second.lm_loss > FIRST_UPDATE_JUMP_FACTOR * first.lm_loss and (
        second.lm_loss - first.lm_loss >= FIRST_UPDATE_NOISE_MULTIPLE * statistics.median(moves) if moves
        else second.lm_loss >= FIRST_UPDATE_ALONE_FACTOR * first.lm_loss)
    if not jumped:  # within the loss's own noise: at most a note, while too few points for the window rule
        return _early_rise(series)
    when = "after the first update" if first.iteration <= 1 else "in the first updates"
    return Finding(
        "loss_spike", "critical",
        f"Loss jumped {when}: {first.lm_loss:.3f} at iteration {first.iteration} → "
        f"{second.lm_loss:.3f} at iteration {second.iteration}", [_ev(first), _ev(second)],
        "The first optimizer steps made the model worse instead of better: the learning rate at the start is too "
        "high for this initialisation (no or too short warm-up), the loss scale or gradients overflowed, or the "
        "checkpoint loaded does not match the model (a fine-tune starting from the wrong weights).",
        _divergence_fixes(config, log))


def _early_rise(series: list[IterationRecord]) -> Finding | None:
    """A log too short for the window rule whose first losses rose well above the first (no batch-to-batch spread
    makes `FIRST_UPDATE_ALONE_FACTOR`), but not by a jump out of their own noise: an `info`, never critical, and so
    no flag change: the evidence that would justify one (a rise the window rule sees) is not in the log yet; its
    one step is to let the run log more and read it again."""
    if len(series) >= WINDOW + 2:
        return None
    first = series[0]
    highest = max(series[1:1 + WINDOW], key=lambda r: r.lm_loss or 0.0)
    assert first.lm_loss is not None and highest.lm_loss is not None
    if highest.lm_loss < FIRST_UPDATE_ALONE_FACTOR * first.lm_loss:
        return None
    return Finding(
        "loss_spike", "info",
        f"Loss rose over the first logged updates: {first.lm_loss:.3f} at iteration {first.iteration} → "
        f"{highest.lm_loss:.3f} at iteration {highest.iteration} ({len(series)} points: too few to tell a spike from "
        "this run's batch-to-batch noise)", [_ev(first), _ev(highest)],
        "With this few points a rise of this size cannot be told from the batch-to-batch spread of the loss (a "
        "fine-tune's small loss varies a lot between batches), and no single update stands out of it as having "
        "hurt: watch the next logged steps.",
        [Fix("add", f"diagnose the log again once it holds {WINDOW + 2} or more logged iterations", None,
             "a loss that keeps climbing then is named as a spike or divergence, with its learning-rate fix; one "
             "that falls back was this run's noise and needs no change", kind="advice")])


def _memory_near_full(log: ParsedLog, config: RunConfig | None) -> Finding | None:
    if any(e.category == "oom" for e in log.errors):
        return None
    full = [r for r in log.iterations if r.memory_usage_pct and r.memory_usage_pct >= NEAR_FULL_PCT]
    cause = ("Memory is within a few percent of capacity: the next larger allocation (a longer batch, evaluation, "
             "a checkpoint) will run out of memory.")
    fixes, note = _memory_fixes(config, log)
    if full:
        first = full[0]
        return Finding("oom", "warning",
                       f"Device memory at {first.memory_usage_pct:.1f}% at iteration {first.iteration}",
                       [_ev(first)], cause + note, fixes)
    capacity = config.gpu.hbm_gib if config is not None and config.gpu is not None else None
    reports = [m for m in log.memory if capacity and m.peak_gib and m.peak_gib >= NEAR_FULL_PCT / 100 * capacity]
    if not reports:
        return None
    worst = max(reports, key=lambda m: m.peak_gib or 0.0)
    return Finding("oom", "warning",
                   f"Rank {worst.rank} reserved {worst.peak_gib:.1f} GiB of {capacity:.0f} GiB "
                   f"({(worst.peak_gib or 0) / capacity:.0%})",  # type: ignore[operator]  # reports imply capacity
                   [Evidence(worst.file, worst.line, worst.text.strip())], cause + note, fixes)


def _low_throughput(log: ParsedLog, config: RunConfig | None, gpu: GPUSpec | None = None) -> Finding | None:
    gpu = config.gpu if config is not None and config.gpu is not None else gpu
    if not log.summary:
        return None
    precision = _precision(config)
    if gpu is None:
        return _throughput_on_unknown_gpu(log, precision)
    peak = gpu.peak_tflops(precision)
    predicted = current_prediction(config) if config is not None and config.complete else None
    measured_tflops, source = _measured_tflops(log, predicted, peak)
    if measured_tflops is None:
        return None
    measured_mfu = measured_tflops / peak
    expected = predicted.mfu if predicted and predicted.mfu else None
    threshold = LOW_MFU_FRACTION * expected if expected else LOW_MFU_FLOOR
    if measured_mfu >= threshold:
        return None
    basis = (f"the estimator predicts {expected:.0%} MFU for this layout" if expected
             else f"no prediction (no complete flags): a tuned run reaches well over the {LOW_MFU_FLOOR:.0%} floor")
    options = throughput_options(config) if config is not None and takes_megatron_flags(log.framework) else []
    fixes = [fix for option in sorted(options, key=_gain, reverse=True) for fix in option.fixes()]
    if not fixes:
        fixes = [Fix("add", "profile one step (torch.profiler or nsys/rocprof)", None, "find whether the time goes to "
                     "communication, idle bubbles or small kernels", kind="advice")]
    evidence = [_ev(r) for r in _unique(log.iterations)[-2:]]
    return Finding("low_throughput", "warning",
                   f"Low throughput: {measured_tflops:.0f} TFLOP/s/GPU = {measured_mfu:.1%} MFU on "
                   f"{gpu.alias} ({precision} peak {peak:.0f})", evidence,
                   f"Measured MFU is far below what this GPU should reach ({basis}; {source}).", fixes)


# Why a run is slower than the estimator says with no error line: the causes the estimator does not model, each with
# what shows it. Kept short: the finding's explanation lists them, the fixes are the checks.
SLOWER_CAUSES = (
    "a slow or degraded link (a NIC at lower speed, a failed NVLink, collectives over TCP instead of RDMA)",
    "one slow node holding every step back (thermal or power throttling, another job on it)",
    "input waiting (the data loader, a slow filesystem) or a save in every few steps",
)


def slower_than_predicted(log: ParsedLog, config: RunConfig | None) -> Finding | None:
    """A run whose measured steady-state step is slower than the estimator's prediction for its layout by more
    than the slow end of the estimate's stated 80 % interval (`band_for`: the held-out errors of its calibration
    cell, widened outside it), with no error line to say why: a step inside the interval is what the estimate
    itself allows, and the median |error| alone would flag about half of the runs it was calibrated on. Never on a
    CPU run (the estimator predicts GPUs), nor without a prediction."""
    summary = log.summary
    if config is None or not config.complete or summary is None or not summary.step_time_p50_ms or log.errors:
        return None
    predicted = current_prediction(config)
    if predicted is None or not predicted.step_time_s:
        return None
    assert config.model is not None and config.cluster is not None and config.training is not None
    interval = band_for(config.model, config.cluster.gpu, config.training.gemm_format)
    if interval is None:  # a CPU's estimate states no interval
        return None
    slow_end = max(interval.p90_error, 0.0)  # error = predicted / true throughput - 1: its p90 is the slow end
    measured_s = summary.step_time_p50_ms / 1000.0
    slowest_predicted_s = predicted.step_time_s * (1.0 + slow_end)
    if measured_s <= slowest_predicted_s:
        return None
    over = measured_s / predicted.step_time_s - 1.0
    evidence = [_ev(r) for r in _unique(log.iterations)[-2:]]
    causes = "; ".join(SLOWER_CAUSES)
    fixes = [
        Fix("add", "megapilot suite run (its collectives stage and straggler rows)", None,
            "measure each node's bus bandwidth and each rank's compute time: a slow link or node shows there",
            kind="command"),
        Fix("add", "nvidia-smi -q -d PERFORMANCE,CLOCK (on each node)", None,
            "throttle reasons (power, thermal) and clocks below the GPU's", kind="command"),
        Fix("add", "profile one step (torch.profiler or nsys/rocprof)", None,
            "find whether the time goes to communication, idle bubbles, input waits or small kernels", kind="advice"),
    ]
    return Finding(
        "low_throughput", "warning",
        f"Slower than predicted: {measured_s:.3g} s per step measured, {predicted.step_time_s:.3g} s predicted "
        f"(+{over:.0%}, beyond the slow end of the estimate's 80 % interval, +{slow_end:.0%})", evidence,
        f"The median steady-state step ({summary.iterations_counted} iterations) is slower than the estimator's "
        f"prediction for this layout on {config.cluster.world_size} x {config.cluster.gpu.alias} even at the "
        f"slow end of its 80 % interval ({interval.basis}), and no error line says why. Likely causes: {causes}."
        + (f" The prediction assumed: {'; '.join(config.notes)}." if config.notes else ""), fixes)


def _precision(config: RunConfig | None) -> Precision:
    return (config.training.precision if config is not None and config.training else
            "fp8" if config is not None and config.precision_flag == "fp8" else "bf16")


def _throughput_on_unknown_gpu(log: ParsedLog, precision: Precision) -> Finding | None:
    """Without --gpu, the TFLOP/s the log printed rated on every GPU of the catalog it is plausible for: an `info`
    finding naming those it would be low on (below `LOW_MFU_FLOOR`) and those it would not."""
    measured = log.summary.tflops_per_gpu_mean if log.summary else None
    if not measured:
        return None
    mfu = {gpu.alias: measured / gpu.peak_tflops(precision) for gpu in load_gpus().values()}
    plausible = {alias: value for alias, value in mfu.items() if PLAUSIBLE_MIN_MFU <= value <= 1.0}
    low = sorted((alias for alias, value in plausible.items() if value < LOW_MFU_FLOOR), key=plausible.__getitem__,
                 reverse=True)
    if not low or len(low) < len(plausible) * LOW_ON_MOST_GPUS:
        return None  # low only on the newest GPUs: nothing to say without knowing which one ran it
    fine = sorted(alias for alias in plausible if alias not in low)
    shown = ", ".join(f"{plausible[alias]:.1%} on {alias.upper()}" for alias in low[:4])
    unless = f" unless it ran on {'/'.join(a.upper() for a in fine)}" if fine else ""
    return Finding(
        "low_throughput", "info" if fine else "warning",
        f"Low throughput{unless}: {measured:.0f} TFLOP/s/GPU = {shown} ({precision} peaks)",
        [_ev(r) for r in _unique(log.iterations)[-2:]],
        f"The log prints {measured:.0f} TFLOP/s/GPU, below the {LOW_MFU_FLOOR:.0%} MFU a tuned run reaches on "
        f"{', '.join(a.upper() for a in low)}. The GPU type is not known (pass --gpu, e.g. --gpu {low[0]}, to rate "
        "it on one GPU and get layout options).",
        [Fix("add", "profile one step (torch.profiler or nsys/rocprof)", None, "find whether the time goes to "
             "communication, idle bubbles or small kernels", kind="advice")])


def _measured_tflops(log: ParsedLog, predicted: Prediction | None, peak: float) -> tuple[float | None, str]:
    """TFLOP/s/GPU as the log printed it; else the estimator's model FLOPs per step over the measured step time
    (its MFU scaled by predicted / measured step time: the same FLOPs convention, only the time differs)."""
    summary = log.summary
    if summary is not None and summary.tflops_per_gpu_mean:
        return summary.tflops_per_gpu_mean, "TFLOP/s/GPU as the log printed it"
    measured_ms = summary.step_time_p50_ms if summary is not None else None
    if predicted is None or not predicted.mfu or not predicted.step_time_s or not measured_ms:
        return None, ""
    mfu = predicted.mfu * predicted.step_time_s / (measured_ms / 1000.0)
    return mfu * peak, "the model's FLOPs per step from the estimator over the measured median step time"


def _gain(option: LayoutOption) -> float:
    if option.prediction is None or option.prediction.tokens_per_s_per_gpu is None or not option.modelled:
        return 0.0
    return option.prediction.tokens_per_s_per_gpu if option.prediction.fits else -1.0


def metric_findings(log: ParsedLog, config: RunConfig | None, gpu: GPUSpec | None = None) -> list[Finding]:
    """Findings from the iteration series; `gpu` (from --gpu) rates throughput when no flags were given."""
    findings: list[Finding] = []
    for rule in (_nan_finding, _slowdown, _step_time_change, _memory_near_full):
        finding = rule(log, config)
        if finding is not None:
            findings.append(finding)
    loss_findings = _loss_findings(log, config)
    jump = _first_update_jump(log, config)
    # a first-update jump that then went NaN or diverged is told by that finding, with the same fixes
    if jump is not None and not any(f.category in ("nan_loss", "loss_divergence") for f in findings + loss_findings):
        findings.append(jump)
    throughput = _low_throughput(log, config, gpu) or slower_than_predicted(log, config)
    if throughput is not None:
        findings.append(throughput)
    findings.extend(loss_findings)
    findings.extend(_hang_findings(log, config))
    return findings
