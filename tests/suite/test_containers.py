"""Container commands rendered from a real CVS container block (no runtime runs here)."""

from __future__ import annotations

import shlex

from megapilot.suite.containers import exec_prefix, prepare_containers, run_argv, uses_container
from megapilot.suite.executors import container_wrapper, make_executor
from megapilot.suite.results import Verdict
from tests.suite.cvs_files import two_host_suite


def test_docker_run_follows_the_cvs_runtime_args_and_names_env_without_values(tmp_path):
    suite = two_host_suite(tmp_path, "ssh")
    assert uses_container(suite)
    argv = run_argv(suite)
    container = suite.config.container
    assert argv[:5] == ["docker", "run", "-d", "--name", container.name]
    assert argv[-3:] == [container.image, "sleep", "infinity"]
    text = shlex.join(argv)
    assert "--network host" in text and "--ipc host" in text and "--privileged" in text
    assert "--device /dev/kfd" in text and "-v /home/" in text
    for name, value in container.env.items():
        assert f"-e {name}" in text and f"{name}={value}" not in text  # values come from the environment
    assert exec_prefix(suite)[:2] == ["docker", "exec"] and exec_prefix(suite)[-1] == container.name


def test_no_container_for_slurm_jobs_said_in_the_prepare_row(tmp_path):
    suite = two_host_suite(tmp_path, "slurm")
    assert not uses_container(suite) and container_wrapper(suite) is None
    [row] = prepare_containers(suite, make_executor(suite))
    assert row.verdict is Verdict.SKIPPED and "pyxis" in row.reason
