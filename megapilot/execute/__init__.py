"""Executors: run a training job somewhere, follow it, stop it cleanly, and say how it ended.

Public API: the protocol and its objects (`megapilot.execute.base`), the run-directory layout
(`megapilot.execute.rundir`) and `LocalExecutor` (`megapilot.execute.local`, imported lazily
because it pulls in psutil).
"""

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
    "Executor", "HangPolicy", "JobHandle", "JobResult", "JobSpec", "JobState", "JobStatus", "LocalExecutor",
    "ProgressCallback", "job_spec_or_error",
]


def __getattr__(name: str):
    if name == "LocalExecutor":
        from megapilot.execute.local import LocalExecutor

        return LocalExecutor
    raise AttributeError(name)
