"""execute.container: the words that put a job's launch script inside a container, environment by name only."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from megapilot.execute.base import ContainerEntry
from megapilot.execute.container import ContainerWrapper


def test_exec_enters_a_running_container_passing_variables_by_name():
    wrapper = ContainerWrapper(runtime="docker", mode="exec", target="mp-train", extra_args=("--workdir", "/w"))
    assert wrapper.argv_prefix(["HF_TOKEN", "NCCL_DEBUG"], "/jobs/a") == [
        "docker", "exec", "-e", "HF_TOKEN", "-e", "NCCL_DEBUG", "--workdir", "/w", "mp-train"]


def test_run_starts_a_fresh_container_on_the_host_network_with_the_job_directory_mounted():
    words = ContainerWrapper(runtime="podman", mode="run", target="nvcr.io/x:1").argv_prefix([], "/jobs/my job")
    assert words == ["podman", "run", "--rm", "--network=host", "--ipc=host", "-v", "/jobs/my job:/jobs/my job",
                     "nvcr.io/x:1"]
    line = ContainerWrapper(runtime="podman", mode="run", target="nvcr.io/x:1").render([], "/jobs/my job")
    assert "'/jobs/my job:/jobs/my job'" in line  # quoted as a user would type it


def test_enroot_starts_a_created_container_with_the_job_directory_mounted():
    words = ContainerWrapper(runtime="enroot", mode="start", target="pytorch").argv_prefix(["TOKEN"], "/j")
    assert words == ["enroot", "start", "--mount", "/j:/j", "--env", "TOKEN", "pytorch"]


@pytest.mark.parametrize(("runtime", "mode", "target", "says"), [
    ("enroot", "exec", "c", "enroot supports start, not exec"),
    ("docker", "start", "c", "docker supports exec or run, not start"),
    ("docker", "exec", "--privileged", "is not a container or image name"),
    ("docker", "exec", "", "is not a container or image name")])
def test_a_mode_the_runtime_lacks_or_an_option_as_target_is_refused(runtime, mode, target, says):
    with pytest.raises(ValidationError, match=says):
        ContainerWrapper(runtime=runtime, mode=mode, target=target)


def test_a_suites_container_is_entered_the_way_its_runtime_enters():
    assert ContainerWrapper.entering(ContainerEntry(runtime="docker", name="mp")).mode == "exec"
    assert ContainerWrapper.entering(ContainerEntry(runtime="enroot", name="mp")).mode == "start"
