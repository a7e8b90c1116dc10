"""What a diagnosis says: findings with evidence, causes and exact fixes."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, Literal

from pydantic import ConfigDict

from megapilot.logs.records import Evidence
from megapilot.logs.signatures import Category

Severity = Literal["critical", "error", "warning", "info"]
SEVERITY_RANK: dict[str, int] = {"critical": 0, "error": 1, "warning": 2, "info": 3}

# Which category is the root cause when several appear: earlier = more likely the cause. A crash or
# a watchdog timeout is usually the consequence of something earlier in this list.
ROOT_CAUSE_ORDER: tuple[str, ...] = (
    "log_mismatch",  # a log of another run says nothing about this launch: first, whatever else it shows
    "mixed_runs",  # logs of several runs given as one: said before what each run's own logs show
    "config_error", "gpu_hw_fault", "oom", "shm_insufficient", "dataloader_error", "checkpoint_load_failure",
    "checkpoint_save_failure", "rendezvous_failure", "nccl_error", "nan_loss", "loss_divergence", "hang",
    "nccl_timeout", "process_crash", "loss_spike", "low_throughput", "slowdown",
)

# What each category means, for a person: shown beside findings and checked complete by the tests.
EXPLANATIONS: dict[str, str] = {
    "oom": "a GPU (or host) ran out of memory",
    "nccl_timeout": "a collective waited past NCCL's watchdog timeout: a rank stopped or the network stalled",
    "nccl_error": "NCCL reported an error (network, topology or a peer that went away)",
    "gpu_hw_fault": "the GPU or its driver reported a hardware fault (Xid, ECC, illegal memory access)",
    "nan_loss": "the loss or the gradient norm became NaN/Inf",
    "loss_spike": "the loss jumped far above its recent level and came back",
    "loss_divergence": "the loss rose and did not come back",
    "hang": "no progress for many times the usual step time",
    "rendezvous_failure": "the ranks could not find each other at start-up",
    "shm_insufficient": "shared memory (/dev/shm) ran out",
    "checkpoint_save_failure": "a checkpoint could not be written",
    "checkpoint_load_failure": "a checkpoint could not be read back",
    "dataloader_error": "the data pipeline failed (missing files, bad index, worker crash)",
    "process_crash": "a training process ended before training finished",
    "config_error": "the framework refused the configuration",
    "low_throughput": "throughput well below what the GPU and layout should give",
    "slowdown": "step time grew during the run (or fell and stayed lower: a note)",
    "log_mismatch": "the log is of another run than the launch script describes",
    "missing_log": "a node wrote no training log",
    "mixed_runs": "the logs given as one run are of several runs",
}

FixKind = Literal["megatron_flag", "env", "container", "command", "config", "advice"]


@dataclass(frozen=True)
class Fix:
    """One change. `kind` says where it goes: a Megatron-LM flag, an environment variable, a container
    option, a command to run, a setting of another framework's config (torchtitan, GPT-NeoX, DeepSpeed,
    NeMo), or advice: a step said in words (`flag` holds the sentence). Changes that belong together share
    `option` (e.g. the three flags of full recompute).
    Predictions, when present, are for the whole option."""

    __pydantic_config__: ClassVar[ConfigDict] = ConfigDict(use_attribute_docstrings=True)  # the run deck's schema

    action: Literal["add", "set", "remove"]
    """Add, set or remove the flag (or setting)."""
    flag: str
    """The flag, variable, option or command."""
    value: str | None
    """Its new value; null for a switch or a removal."""
    reason: str
    """Why this change helps."""
    kind: FixKind = "megatron_flag"
    """Where the change goes: megatron_flag, env, container, command, config or advice (a step in words)."""
    option: str | None = None
    """Changes sharing an option belong together."""
    predicted_memory_gib: float | None = None
    """Predicted memory of the most-loaded GPU with the option applied, GiB."""
    predicted_tokens_per_s_per_gpu: float | None = None
    """Predicted tokens/s/GPU with the option applied."""

    @property
    def text(self) -> str:
        """The change as a person makes it: a flag or setting edit (`add --lr 1.20e-06`), an export, a command to
        run, a container option or the advice itself; a command or a sentence never reads as a flag to add."""
        value = "" if self.value is None else f" {self.value}"
        if self.kind == "env":
            return f"unset {self.flag}" if self.action == "remove" else f"export {self.flag}={self.value or ''}"
        if self.kind == "command" and not self.flag.startswith("#"):  # an `#SBATCH` line is an edit of the script
            return f"run: {self.flag}{value}"
        if self.kind == "advice":
            return f"{self.flag}{value}"
        if self.kind == "container":
            return f"{self.action} container option {self.flag}{value}"
        return f"{self.action} {self.flag}{value}"

    def to_dict(self) -> dict[str, Any]:
        return {k: (round(v, 3) if isinstance(v, float) and math.isfinite(v) else v) for k, v in asdict(self).items()}


@dataclass(frozen=True)
class Finding:
    """One diagnosed problem, with the log lines that show it."""

    __pydantic_config__: ClassVar[ConfigDict] = ConfigDict(use_attribute_docstrings=True)  # the run deck's schema

    category: Category
    """oom, nccl_timeout, nan_loss, hang, process_crash, ... (one of the failure categories)."""
    severity: Severity
    """critical, error, warning or info; critical and error fail a run."""
    title: str
    """What was found, for a person."""
    evidence: list[Evidence]
    """The log lines that show it."""
    cause: str
    """The likely cause."""
    fixes: list[Fix] = field(default_factory=list)
    """Exact changes that address it."""
    occurrences: int = 1
    """How many log lines or records show it."""
    node: int | None = None
    """The node whose log shows it, when a run has several (the suite names it)."""
    rank: int | None = None
    """The first global rank that shows it, when known."""

    @property
    def blocking(self) -> bool:
        """A finding a run cannot pass with (critical or error); warnings and notes only inform."""
        return self.severity in ("critical", "error")

    @property
    def message(self) -> str:
        """The title, with the node named when the finding is one node's."""
        return self.title if self.node is None else f"{self.title} (node {self.node})"

    @property
    def explanation(self) -> str:
        return EXPLANATIONS[self.category]

    @property
    def sort_key(self) -> tuple[int, int, int]:
        first_line = min((e.line for e in self.evidence), default=0)
        order = ROOT_CAUSE_ORDER.index(self.category) if self.category in ROOT_CAUSE_ORDER else len(ROOT_CAUSE_ORDER)
        return SEVERITY_RANK[self.severity], order, first_line

    def to_dict(self) -> dict[str, Any]:
        return {
            "category": self.category,
            "severity": self.severity,
            "title": self.title,
            "occurrences": self.occurrences,
            "evidence": [{"file": e.file, "line": e.line, "text": e.text} for e in self.evidence],
            "cause": self.cause,
            "fixes": [f.to_dict() for f in self.fixes],
            **({"node": self.node} if self.node is not None else {}),
            **({"rank": self.rank} if self.rank is not None else {}),
        }


def ranked(findings: list[Finding]) -> list[Finding]:
    """Most severe first; within a severity, root causes before their consequences."""
    return sorted(findings, key=lambda f: f.sort_key)
