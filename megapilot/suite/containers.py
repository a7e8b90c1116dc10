"""Containers for the suite's jobs: started before the first job, removed at teardown.

Follows CVS's `container` block (`lifetime` per_run | persistent | no_launch, `runtime.name` docker |
podman, `runtime.args`, `env`): a per_run container is (re)created on every node with
`<runtime> run -d --name NAME ... IMAGE sleep infinity` and jobs run inside it with `<runtime> exec`;
persistent attaches to a running one; no_launch only checks it runs. Every word is shell-quoted (the
command goes through ssh to a remote shell). Environment *values* are not put on the command line
(`ps` would show them): the variables are named with `-e NAME` and their values come from the job's
environment. SLURM jobs use pyxis/enroot through the launch script instead (`--container-image`).
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING, Any

from megapilot.suite.nodes import run_on_nodes
from megapilot.suite.results import MetricRow, Verdict

if TYPE_CHECKING:
    from megapilot.execute.base import Executor
    from megapilot.execute.container import ContainerRuntime
    from megapilot.suite.config import LoadedSuite



def container_runtime(suite: LoadedSuite) -> ContainerRuntime:
    return suite.config.container.runtime.name if suite.config.container else "docker"


def uses_container(suite: LoadedSuite) -> bool:
    return suite.runs_in_image and suite.capabilities.starts_containers


def run_argv(suite: LoadedSuite) -> list[str]:
    """`docker run -d ...` for the suite's container, from CVS's runtime.args."""
    container = suite.config.container
    assert container is not None
    args = _runtime_args(suite)
    argv = [container_runtime(suite), "run", "-d", "--name", container.name]
    if args.get("network"):
        argv += ["--network", str(args["network"])]
    if args.get("ipc"):
        argv += ["--ipc", str(args["ipc"])]
    if args.get("privileged"):
        argv.append("--privileged")
    for volume in args.get("volumes") or []:
        argv += ["-v", str(volume)]
    for device in args.get("devices") or []:
        argv += ["--device", str(device)]
    for key, flag in (("cap_add", "--cap-add"), ("security_opt", "--security-opt"), ("group_add", "--group-add")):
        values = args.get(key) or []
        for value in [values] if isinstance(values, str) else values:
            argv += [flag, str(value)]
    ulimit = args.get("ulimit")
    for value in [ulimit] if isinstance(ulimit, str) else (ulimit or []):
        argv += ["--ulimit", str(value)]
    for name in sorted(container.env):
        argv += ["-e", name]  # the value comes from the environment, never from the command line
    argv += [container.image, "sleep", "infinity"]
    return argv


def exec_prefix(suite: LoadedSuite) -> list[str]:
    """What a job's command is wrapped in to run inside the container."""
    container = suite.config.container
    assert container is not None
    return [container_runtime(suite), "exec", *[w for name in sorted(container.env) for w in ("-e", name)],
            container.name]


def _runtime_args(suite: LoadedSuite) -> dict[str, Any]:
    container = suite.config.container
    return container.runtime.args.model_dump(exclude_none=True) if container else {}


def prepare_containers(suite: LoadedSuite, executor: Executor) -> list[MetricRow]:
    if not uses_container(suite):
        return [MetricRow(name="container", verdict=Verdict.SKIPPED, reason=_why_no_container(suite))]
    container = suite.config.container
    assert container is not None
    runtime = container_runtime(suite)
    name = shlex.quote(container.name)
    lifetime = container.lifetime
    running = f"[ \"$({runtime} inspect -f '{{{{.State.Running}}}}' {name} 2>/dev/null)\" = true ]"
    if lifetime == "per_run":
        script = (f"{runtime} rm -f {name} >/dev/null 2>&1 || true\n"
                  f"{shlex.join(run_argv(suite))} >/dev/null && {running} && echo running")
    else:
        script = f"{running} && echo running || echo 'not running'"
    rows = []
    for output in run_on_nodes(suite, executor, script, []):
        ok = "running" in output.text.split() and "not running" not in output.text and not output.error
        rows.append(MetricRow(name=f"container.node{output.node}", verdict=Verdict.PASS if ok else Verdict.FAIL,
                              reason=f"{container.name} ({lifetime}) on node {output.node}: "
                                     + ("running" if ok else output.error or output.text.strip() or "not running")))
    return rows


def teardown_containers(suite: LoadedSuite, executor: Executor) -> list[MetricRow]:
    container = suite.config.container
    if not uses_container(suite) or container is None or container.lifetime != "per_run":
        return []
    script = f"{container_runtime(suite)} rm -f {shlex.quote(container.name)} >/dev/null 2>&1; echo removed"
    return [MetricRow(name=f"container.removed.node{o.node}", verdict=Verdict.PASS if not o.error else Verdict.FAIL,
                      reason=o.error or f"{container.name} removed on node {o.node}")
            for o in run_on_nodes(suite, executor, script, [])]


def _why_no_container(suite: LoadedSuite) -> str:
    if suite.backend == "megapilot":
        return "the embedded trainer runs in this Python environment, no container"
    if not (suite.config.container and suite.config.container.image):
        return "no container.image in the config: jobs run on the host"
    return (f"the {suite.executor} executor's launch script starts the container itself (SLURM: pyxis/enroot "
            "--container-image)")


__all__ = ["container_runtime", "exec_prefix", "prepare_containers", "run_argv", "teardown_containers",
           "uses_container"]
