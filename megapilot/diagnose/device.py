"""Which device a run trained on, as far as its flags and its log tell: rules that rate a GPU (MFU, FP8, fused
kernels) and optimize's GPU changes do not apply to a CPU run, whatever --gpu says."""

from __future__ import annotations

from megapilot.diagnose.flags import RunConfig
from megapilot.logs import ParsedLog

CPU_RUN_EVIDENCE = "gloo backend"


def trained_on_cpu(config: RunConfig | None, log: ParsedLog | None) -> bool:
    """Whether the run trained on CPU: its flags or its log's arguments block name the gloo backend (NCCL/RCCL
    need a GPU), or the script was written with `megapilot script --cpu`."""
    if config is not None and (config.flags.get("--distributed-backend") or "").lower() == "gloo":
        return True
    arguments = log.arguments if log is not None else None
    return arguments is not None and (arguments.values.get("distributed_backend") or "").lower() == "gloo"
