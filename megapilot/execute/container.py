"""Running a job's launch script inside a container on its node (docker/podman `exec` or `run`, enroot `start`)."""

from __future__ import annotations

import shlex
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from megapilot.execute.base import ContainerEntry

ContainerRuntime = Literal["docker", "podman", "enroot"]


class ContainerWrapper(BaseModel):
    """Run the launch script inside a container on each node.

    docker/podman `exec` enter a running container (its name in `target`); `run` starts a fresh one
    from an image (`target`), host network and IPC, the job directory mounted at the same path;
    enroot `start` starts a container created with `enroot create` (`target`), job directory mounted.
    Environment variables are passed by name only (`-e NAME`), so their values come from the
    environment of the wrapper, never from its argv. The job directory must exist at the same path
    inside the container (for `exec`, mount it when the container is created).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    runtime: ContainerRuntime
    mode: Literal["exec", "run", "start"]
    target: str = Field(description="Container name (exec, enroot start) or image (run).")
    extra_args: tuple[str, ...] = Field(default=(), description="More runtime options, before the target.")

    @model_validator(mode="after")
    def _mode_fits_runtime(self) -> ContainerWrapper:
        allowed = ("start",) if self.runtime == "enroot" else ("exec", "run")
        if self.mode not in allowed:
            raise ValueError(f"{self.runtime} supports {' or '.join(allowed)}, not {self.mode}")
        if not self.target or self.target.startswith("-"):
            raise ValueError(f"{self.target!r} is not a container or image name")
        return self

    def argv_prefix(self, env_names: list[str], job_directory: str) -> list[str]:
        """The words before `bash launch.sh`."""
        if self.runtime == "enroot":
            words = ["enroot", "start", "--mount", f"{job_directory}:{job_directory}"]
            for name in env_names:
                words += ["--env", name]
            return [*words, *self.extra_args, self.target]
        words = [self.runtime, self.mode]
        if self.mode == "run":
            words += ["--rm", "--network=host", "--ipc=host", "-v", f"{job_directory}:{job_directory}"]
        for name in env_names:
            words += ["-e", name]
        return [*words, *self.extra_args, self.target]

    def render(self, env_names: list[str], job_directory: str) -> str:
        """The prefix as one shell-quoted line (what a user would type)."""
        return shlex.join(self.argv_prefix(env_names, job_directory))

    @classmethod
    def entering(cls, entry: ContainerEntry) -> ContainerWrapper:
        """Jobs enter a container the suite started (`<runtime> exec NAME`, enroot `start NAME`)."""
        mode: Literal["exec", "start"] = "start" if entry.runtime == "enroot" else "exec"
        return cls(runtime=entry.runtime, mode=mode, target=entry.name)


__all__ = ["ContainerRuntime", "ContainerWrapper"]
