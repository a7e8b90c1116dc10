"""Start a test's torchrun job and always stop all of it, workers included.

torchrun puts every worker in a session of its own, so killing the launcher's process group leaves
the trainers running when a test fails or times out. `started_tree` marks the job with an
environment variable and stops it with `megapilot.execute.process.ProcessTreeWatch` (session, every
descendant seen, every marked process) in a `finally`.
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from megapilot.execute.process import ProcessTreeWatch

MARKER = "MEGAPILOT_TEST_JOB"


@contextmanager
def started_tree(argv: list[str], *, log_path: Path, cwd: Path, env: dict[str, str]) -> Iterator[subprocess.Popen]:
    """Popen argv (new session, output to log_path); on exit from the block the whole tree is stopped."""
    marker = (MARKER, uuid.uuid4().hex)
    with log_path.open("w") as log_file:
        process = subprocess.Popen(argv, stdout=log_file, stderr=subprocess.STDOUT, cwd=cwd,
                                   env=env | {marker[0]: marker[1]}, start_new_session=True)
    watch = ProcessTreeWatch(process.pid, marker=marker)
    try:
        yield process
    finally:
        watch.snapshot()
        survivors = watch.stop(grace_s=2.0)
        process.wait()
        assert not survivors, f"could not stop: {survivors}"


def run_tree(argv: list[str], *, log_path: Path, cwd: Path, env: dict[str, str], timeout_s: float) -> int:
    """Run argv to completion (or timeout: then -9), the whole tree stopped whatever happens."""
    with started_tree(argv, log_path=log_path, cwd=cwd, env=env) as process:
        try:
            return process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return -9
