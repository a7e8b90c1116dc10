"""The failure cascade of a run: which error came first, and which errors only followed from it.

When one rank of a 64-node job dies, every other rank then fails too (NCCL timeouts, "connection reset by peer",
launchers reporting their children's exit), so the log lines that name a failure are mostly consequences. The
root cause is chosen by two rules, in this order:

1. How specific the failure is (`cause_rank`): a failure that explains itself (out of memory, a GPU fault, a bad
   argument, a data or checkpoint error, a NaN report) before a rank killed by a signal, before an exception of
   the rank's own, before a communication error, before what follows a lost peer (timeouts, "connection reset by
   peer", a launcher reporting a child's non-zero exit, a hang).
2. Among equally specific ones, the first in time: the line's own timestamp (or torchrun's failure summary's),
   else the order of evidence (file order as given, then line). An inherited timestamp is not used: the line
   before a traceback was printed earlier than the failure, so it would put consequences first.

The other errors are grouped into steps (category and kind, e.g. "lost a peer") told after the root, in time.
An abort that follows an NCCL watchdog timeout in the same file (PyTorch's watchdog takes its own process down:
`terminate called`, SIGABRT, exit code -6) is that timeout's consequence, told after it.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass, replace
from typing import Literal

from megapilot.diagnose.findings import Finding, Fix
from megapilot.diagnose.stopped import megapilot_stop
from megapilot.logs.records import ErrorRecord, Evidence

#: Categories that name their own cause (rule 1, rank 0).
SELF_EXPLAINING: frozenset[str] = frozenset({
    "config_error", "gpu_hw_fault", "oom", "shm_insufficient", "dataloader_error", "checkpoint_load_failure",
    "checkpoint_save_failure", "nan_loss",
})
_SIGNAL_DEATH_RE = re.compile(
    r"exitcode\s*:\s*-\d+|\(exitcode: -\d+\)|Signal \d+ \(SIG\w+\)|killed by signal|Segmentation fault|Segfault|"
    r"SIGSEGV|"
    r"SIGKILL|SIGABRT|SIGBUS|core dumped|Fatal Python error|task \d+: (?:Killed|Segmentation|Aborted)|\bKilled\b|"
    r"oom[_-]kill|terminate called|pure virtual method called|\bAborted\b", re.IGNORECASE)
_PEER_LOSS_RE = re.compile(
    r"Connection (?:reset|closed) by peer|Broken pipe|ncclRemoteError|remote process exited|"
    r"peer (?:\S+ )?(?:closed|died|disconnected)|Connection refused|socket (?:closed|timed out)|"
    r"NCCL communicator was aborted|ProcessGroup\w* (?:is )?(?:aborted|shut ?down)|collective operation timeout|"
    r"watchdog thread terminated", re.IGNORECASE)
# `terminate called after throwing an instance of 'c10::DistBackendError'` says only that a collective failed; the
# `what():` line after it (a watchdog timeout, a lost peer) says why: alone it is a consequence, not a cause.
_BARE_WRAPPER_RE = re.compile(r"instance of 'c10::DistBackendError'|^\s*(?:\S+\.)?DistBackendError\s*$")
_NCCL_CODE_RE = re.compile(r"nccl(?:Internal|System|Invalid|Unhandled)\w*Error|unhandled (?:cuda|hip) error",
                           re.IGNORECASE)
_HOST_OOM_RE = re.compile(r"oom[_-]kill|Out of memory: Killed process|task \d+: Out Of Memory", re.IGNORECASE)
_SIGNAL_NAME_RE = re.compile(r"\b(SIG[A-Z]+)\b|[Ss]ignal (\d+)")  # UCX prints "Caught signal 11 (...)"
# c10's "Segfault encountered" and UCX's "Caught signal 11 (Segmentation fault: ...)" name the signal in words
_SEGFAULT_RE = re.compile(r"segfault|segmentation fault", re.IGNORECASE)
_EXIT_CODE_RE = re.compile(r"exitcode\s*:?\s*(-?\d+)")
# how a process the NCCL watchdog takes down dies: std::terminate -> abort()
_ABORT_RE = re.compile(r"SIGABRT|Signal 6\b|exitcode\s*:?\s*-6\b|terminate called|\bAborted\b", re.IGNORECASE)
WATCHDOG_ABORT = "watchdog_abort"  # ErrorRecord.details key: this death is the watchdog's own abort
_WATCHDOG_WHAT = "taken down by its NCCL watchdog after the timeout"

Kind = Literal["self-explaining", "killed", "exception", "communication", "lost peer", "launcher exit", "hang"]
MAX_EVIDENCE_LINES = 5
_CATEGORY_WORDS = {"oom": "out of memory", "nccl_timeout": "NCCL timeout", "nccl_error": "NCCL error",
                   "gpu_hw_fault": "GPU fault", "nan_loss": "NaN", "shm_insufficient": "shared memory exhausted",
                   "checkpoint_save_failure": "checkpoint save failed",
                   "checkpoint_load_failure": "checkpoint load failed", "dataloader_error": "data loading failed",
                   "config_error": "configuration refused", "process_crash": "crashed"}
_KIND_RANK: dict[Kind, int] = {"self-explaining": 0, "killed": 1, "exception": 2, "communication": 3,
                               "lost peer": 4, "hang": 4, "launcher exit": 5}


def failure_kind(record: ErrorRecord) -> Kind:
    """What role an error line can play in a cascade (see the module docstring)."""
    if record.details.get(WATCHDOG_ABORT):
        return "lost peer"
    if record.category in SELF_EXPLAINING:
        return "self-explaining"
    if record.category == "hang" or record.category == "nccl_timeout":
        return "hang" if record.category == "hang" else "lost peer"
    bare_wrapper = bool(_BARE_WRAPPER_RE.search(record.text)) and not _NCCL_CODE_RE.search(record.text)
    if _PEER_LOSS_RE.search(record.text) or bare_wrapper:
        return "lost peer"
    if record.category == "process_crash":
        if _SIGNAL_DEATH_RE.search(record.text):
            return "killed"
        return "exception" if record.signature.startswith("exception:") else "launcher exit"
    return "communication"


def _watchdog_aborts(errors: list[ErrorRecord]) -> list[ErrorRecord]:
    """The errors, with each abort that follows an NCCL watchdog timeout in the same file marked as the watchdog's
    own: PyTorch's watchdog takes the process down itself ("we are taking the entire process down": SIGABRT,
    `terminate called`, exit code -6), so that death is the timeout's consequence, not a cause."""
    first_timeout: dict[str, int] = {}
    for record in errors:
        if record.category == "nccl_timeout":
            first_timeout[record.file] = min(first_timeout.get(record.file, record.line), record.line)
    marked = []
    for record in errors:
        after = record.file in first_timeout and record.line > first_timeout[record.file]
        if after and failure_kind(record) == "killed" and _ABORT_RE.search(record.text):
            record = replace(record, details={**record.details, WATCHDOG_ABORT: "1"})
        marked.append(record)
    return marked


def cause_rank(record: ErrorRecord) -> int:
    """Rule 1's rank: lower is more likely the root cause."""
    return _KIND_RANK[failure_kind(record)]


@dataclass(frozen=True)
class CascadeStep:
    """Errors of one kind in one category: what happened, on which ranks, in which files, first where."""

    category: str
    kind: Kind
    what: str
    ranks: tuple[int, ...]
    files: tuple[str, ...]
    evidence: tuple[Evidence, ...]
    time_s: float | None
    count: int


@dataclass(frozen=True)
class Cascade:
    """The root cause's step, then the steps that followed it."""

    root: CascadeStep
    consequences: tuple[CascadeStep, ...]

    @property
    def root_is_cause(self) -> bool:
        """Whether the root can cause the rest (not itself a timeout, a lost peer, a launcher's report or a hang)."""
        return _KIND_RANK[self.root.kind] < _KIND_RANK["lost peer"]

    def story(self, label: dict[str, str] | None = None) -> list[str]:
        """The cascade as sentences, root cause first; `label` shortens file paths (e.g. to `out-node1/...`)."""
        names = label or {}
        head = ("first failure" if self.root_is_cause
                else "earliest error (itself a consequence: its cause left no line)")
        lines = [f"{head}: {_describe(self.root, names)}"]
        lines.extend(f"then: {_describe(step, names)}" for step in self.consequences)
        return lines


def build_cascade(errors: list[ErrorRecord], files: list[str]) -> Cascade | None:
    """The cascade of these error lines (None without any)."""
    if not errors:
        return None
    order = {name: index for index, name in enumerate(files)}
    ordered = sorted(_watchdog_aborts(errors), key=lambda r: _when(r, order))
    # a watchdog's abort comes after the timeout that caused it, whatever its line's timestamp says
    root = min(ordered, key=lambda r: (cause_rank(r), WATCHDOG_ABORT in r.details, *_when(r, order)))
    root_group = [r for r in ordered if _same_incident(r, root)]
    rest = [r for r in ordered if not _same_incident(r, root)]
    steps: dict[tuple[str, Kind], list[ErrorRecord]] = {}
    for record in rest:
        steps.setdefault((record.category, failure_kind(record)), []).append(record)
    # what a failure caused before what only reports it (a launcher's summary of its children's exit comes last)
    # (a watchdog's abort after the timeouts it follows, as for the root)
    told = sorted(((any(WATCHDOG_ABORT in r.details for r in group), _step(group)) for group in steps.values()),
                  key=lambda pair: (_KIND_RANK[pair[1].kind], pair[0], pair[1].time_s is None, pair[1].time_s or 0.0))
    return Cascade(_step(root_group, root), tuple(step for _, step in told))


def _when(record: ErrorRecord, order: dict[str, int]) -> tuple[bool, float, int, int]:
    """Time order: timed lines first by their time, then untimed ones in order of evidence."""
    return (record.time_s is None, record.time_s or 0.0, order.get(record.file, len(order)), record.line)


def _same_incident(record: ErrorRecord, root: ErrorRecord) -> bool:
    """Lines that tell of the root failure itself: same file, same kind, the same rank (or none named)."""
    return (record.file == root.file and failure_kind(record) == failure_kind(root)
            and record.category == root.category
            and (record.rank is None or root.rank is None or record.rank == root.rank))


def _step(records: list[ErrorRecord], lead: ErrorRecord | None = None) -> CascadeStep:
    first = lead or records[0]
    ranks = tuple(sorted({r.rank for r in records if r.rank is not None}))
    files = tuple(dict.fromkeys(r.file for r in records))
    lead_first = [first] + [r for r in records if r is not first]
    evidence = tuple(Evidence(r.file, r.line, r.text.strip()) for r in lead_first[:MAX_EVIDENCE_LINES])
    times = [r.time_s for r in records if r.time_s is not None]
    return CascadeStep(first.category, failure_kind(first), _what(first, records), ranks, files, evidence,
                       min(times) if times else None, len(records))


def _killed(records: list[ErrorRecord]) -> str:
    """`killed by SIGKILL (exit code -9)`: the signal named by any line of the incident, else by the exit code."""
    text = " ".join(r.text for r in records)
    if _HOST_OOM_RE.search(text):
        return "killed by the host's OOM killer (CPU memory)"
    named, code = _SIGNAL_NAME_RE.search(text), _EXIT_CODE_RE.search(text)
    name = (named.group(1) or _signal_name(int(named.group(2)))) if named else None
    if name is None and _SEGFAULT_RE.search(text):
        name = "SIGSEGV"
    if name is None and code is not None and int(code.group(1)) < 0:
        name = _signal_name(-int(code.group(1)))
    # SIGKILL and SIGTERM come from outside; a segfault or an abort is the process dying of its own failure
    verb = "killed by" if name in (None, "SIGKILL", "SIGTERM") else "died of"
    return f"{verb} {name or 'a signal'}" + (f" (exit code {code.group(1)})" if code else "")


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


# torchrun's agent after a signal from outside (scancel, a time limit, a preemption, another node's launcher)
_AGENT_SIGNAL_RE = re.compile(r"SignalException: Process \d+ got signal:?\s*(\d+)")


def _what(record: ErrorRecord, records: list[ErrorRecord]) -> str:
    kind = failure_kind(record)
    if (stopped := _AGENT_SIGNAL_RE.search(record.text)) is not None:  # not a crash: the job was stopped
        sent = _signal_name(int(stopped.group(1)))
        if (stop := megapilot_stop(record.file)) is not None:  # by megapilot, as the job's record says
            return f"stopped by megapilot with {sent} ({stop.why}; torchrun's agent received it)"
        return f"stopped by {sent} from outside (torchrun's agent received it)"
    if "save_started" in record.details:  # a crash inside a checkpoint save's time window
        return f"{_killed(records)} during the checkpoint save started at {record.details['save_started']}"
    if kind == "killed":
        return _killed(records)
    if record.details.get(WATCHDOG_ABORT):
        return f"{_WATCHDOG_WHAT}: {_killed(records)}"
    if kind == "lost peer":
        waited = record.category in ("nccl_timeout", "hang")
        return ("timed out waiting in a collective: " if waited else "lost a peer: ") + _short(record.text)
    if kind == "launcher exit":
        code = _EXIT_CODE_RE.search(record.text)
        return "exited" + (f" with code {code.group(1)}" if code else "") + ", as the launcher reported"
    return f"{_CATEGORY_WORDS.get(record.category, record.category.replace('_', ' '))}: " + _short(record.text)


def _short(text: str, limit: int = 140) -> str:
    bare = re.sub(r"^(?:\[[^\]]*\]:?\s*)+", "", text.strip())
    return bare if len(bare) <= limit else bare[: limit - 1] + "…"


def _describe(step: CascadeStep, label: dict[str, str]) -> str:
    who = (f"rank{'s' if len(step.ranks) > 1 else ''} {', '.join(map(str, step.ranks[:16]))}"
           f"{' ...' if len(step.ranks) > 16 else ''} " if step.ranks else "")
    first = step.evidence[0]
    where = f"{label.get(first.file, first.file)}:{first.line}"
    more = f" (+{step.count - 1} more line{'s' if step.count > 2 else ''}" + (
        f" in {len(step.files)} files)" if len(step.files) > 1 else ")") if step.count > 1 else ""
    return f"{who}{step.what} — {where}{more}"


def _signal_cause(what: str) -> str:
    """Where a signal death comes from: SIGKILL and SIGTERM from outside the process, the others from inside."""
    if "OOM killer" in what:
        return ("the node ran out of CPU memory (host RAM, not GPU memory): too many data-loader workers, a large "
                "dataset index or checkpoint loaded in RAM, or another job on the node.")
    if "SIGKILL" in what:
        return ("nothing in its own output says why, so the cause is outside the process: the host's OOM killer (CPU "
                "memory), the scheduler (preemption, time limit, a cancelled job), an operator, or a failing node.")
    if "SIGTERM" in what:
        return ("it was asked to stop: by its launcher after another rank failed, or by the scheduler (time limit, "
                "preemption, scancel).")
    return ("the process crashed itself (a segmentation fault, an abort, a bus error): native code failed — a library "
            "bug or version mismatch, corrupted memory, a full /dev/shm for SIGBUS; the lines just before it (a C++ "
            "'terminate called', a stack dump) say where.")


def lead_with_root(findings: list[Finding], cascade: Cascade | None, label: dict[str, str]) -> list[Finding]:
    """The findings with the root cause's first: its title names the first failure and where, its evidence starts
    with it, and its cause tells the consequences that followed. Other findings keep their order."""
    if cascade is None or not cascade.root_is_cause:
        return findings
    root = cascade.root
    lead = next((f for f in findings if f.category == root.category), None)
    if lead is None:
        return findings
    where = f"{label.get(root.evidence[0].file, root.evidence[0].file)}:{root.evidence[0].line}"
    who = f"rank {', '.join(map(str, root.ranks))} " if root.ranks else ""
    evidence = list(root.evidence[:1]) + [e for e in lead.evidence if e != root.evidence[0]]
    cause = lead.cause
    if root.kind == "killed":
        cause = f"{who.capitalize() or 'A rank '}was {root.what}: " + _signal_cause(root.what)
    if cascade.consequences:
        cause += " What followed are consequences: " + "; ".join(
            _describe(step, label) for step in cascade.consequences[:4]) + "."
    fixes = lead.fixes
    if root.kind == "killed" and not fixes:
        fixes = [Fix("add", "dmesg -T | grep -iE 'killed process|out of memory'", None,
                     "the host OOM killer kills without a Python error", kind="command"),
                 Fix("add", "sacct -j <job id> --format=JobID,State,ExitCode,MaxRSS,NodeList", None,
                     "what the scheduler saw: time limit, preemption, node failure, memory", kind="command")]
    # a crash's own title ("Training process crashed on ranks 0, 1") would hide which rank went first
    title = f"{who}{root.what}" if root.category == "process_crash" else lead.title
    headed = replace(lead, severity="critical", title=f"First failure: {title} ({where})",
                     evidence=evidence[:MAX_EVIDENCE_LINES], cause=cause, fixes=fixes)
    return [headed] + [_as_consequence(f, cascade, root.category) for f in findings if f is not lead]


# What only reports another rank's failure: a timeout in a collective, a stalled run. Told after a root cause that
# explains it, such a finding is its consequence, not a second failure to chase.
_WAITING_KINDS: frozenset[Kind] = frozenset({"lost peer", "hang"})


def _as_consequence(finding: Finding, cascade: Cascade, root_category: str) -> Finding:
    """A finding whose every error line is a waiting consequence of the root cause: a warning whose cause says so
    first (its own fixes kept: they say how to see the next such cascade sooner)."""
    steps = [step for step in cascade.consequences if step.category == finding.category]
    if finding.category == root_category or not steps or any(step.kind not in _WAITING_KINDS for step in steps):
        return finding
    severity = "warning" if finding.severity == "critical" else finding.severity
    root = _CATEGORY_WORDS.get(root_category, root_category)
    return replace(finding, severity=severity, cause=f"A consequence of the first failure above ({root}): the other "
                                                     "ranks waited for the rank that failed. " + finding.cause)

