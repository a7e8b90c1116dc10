"""Executors: run a training job somewhere, follow it, stop it cleanly, and say how it ended.

Public API: the protocol and its objects (`megapilot.execute.base`: the job calls, and the capabilities
and per-node calls the suite asks instead of an executor's name), the registry
(`megapilot.execute.registry`: every module of this package that defines a `@register_executor` class
adds an executor), the run-directory layout (`megapilot.execute.rundir`) and the executors, imported
lazily (they pull in psutil and subprocess machinery): `LocalExecutor` (megapilot.execute.local),
`SlurmExecutor` (megapilot.execute.slurm), `SshExecutor` with `SshNode` (megapilot.execute.ssh) and
`ContainerWrapper` (megapilot.execute.container).
"""

import importlib
from typing import Any

from megapilot.execute.base import (
    Executor,
    HangPolicy,
    JobHandle,
    JobResult,
    JobSpec,
    JobState,
    JobStatus,
    ProgressCallback,
    job_spec_or_error,
)

__all__ = [
    "ContainerWrapper", "Executor", "HangPolicy", "JobHandle", "JobResult", "JobSpec", "JobState", "JobStatus",
    "LocalExecutor", "ProgressCallback", "SlurmExecutor", "SshExecutor", "SshNode", "job_spec_or_error",
]

_LAZY = {
    "LocalExecutor": "megapilot.execute.local",
    "SlurmExecutor": "megapilot.execute.slurm",
    "SshExecutor": "megapilot.execute.ssh",
    "SshNode": "megapilot.execute.ssh",
    "ContainerWrapper": "megapilot.execute.container",
}


def __getattr__(name: str) -> Any:  # the lazily imported executor classes (typed where they are defined)
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(name)
