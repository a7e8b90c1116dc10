"""What a diagnosis says: findings with evidence, causes and exact fixes."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from megapilot.logs.records import Evidence

Severity = Literal["critical", "error", "warning", "info"]
SEVERITY_RANK: dict[str, int] = {"critical": 0, "error": 1, "warning": 2, "info": 3}

# Which category is the root cause when several appear: earlier = more likely the cause. A crash or
# a watchdog timeout is usually the consequence of something earlier in this list.
ROOT_CAUSE_ORDER: tuple[str, ...] = (
    "log_mismatch",  # a log of another run says nothing about this launch: first, whatever else it shows
    "config_error", "gpu_hw_fault", "oom", "shm_insufficient", "dataloader_error", "checkpoint_load_failure",
    "checkpoint_save_failure", "rendezvous_failure", "nccl_error", "nan_loss", "loss_divergence", "hang",
    "nccl_timeout", "process_crash", "loss_spike", "low_throughput", "slowdown",
)

FixKind = Literal["megatron_flag", "env", "container", "command", "config"]


@dataclass(frozen=True)
class Fix:
    """One change. `kind` says where it goes: a Megatron-LM flag, an environment variable, a container
    option, a command to run, or a setting of another framework's config (torchtitan, GPT-NeoX, DeepSpeed,
    NeMo). Changes that belong together share `option` (e.g. the three flags of full recompute).
    Predictions, when present, are for the whole option."""

    action: Literal["add", "set", "remove"]
    flag: str
    value: str | None
    reason: str
    kind: FixKind = "megatron_flag"
    option: str | None = None
    predicted_memory_gib: float | None = None
    predicted_tokens_per_s_per_gpu: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: (round(v, 3) if isinstance(v, float) and math.isfinite(v) else v) for k, v in asdict(self).items()}


@dataclass(frozen=True)
class Finding:
    """One diagnosed problem, with the log lines that show it."""

    category: str
    severity: Severity
    title: str
    evidence: list[Evidence]
    cause: str
    fixes: list[Fix] = field(default_factory=list)
    occurrences: int = 1

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
        }


def ranked(findings: list[Finding]) -> list[Finding]:
    """Most severe first; within a severity, root causes before their consequences."""
    return sorted(findings, key=lambda f: f.sort_key)
