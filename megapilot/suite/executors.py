"""The executor a suite runs its jobs with: the one `megapilot.executor` names (megapilot.execute.registry),
built from the cluster file's nodes, the container the suite starts, and the scheduler options of the config."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from megapilot.execute.base import ContainerEntry, Executor, ExecutorSettings, NodeAddress
from megapilot.execute.container import ContainerWrapper
from megapilot.execute.registry import make_executor as make_registered
from megapilot.execute.ssh import SshNode
from megapilot.suite.containers import container_runtime, uses_container

if TYPE_CHECKING:
    from megapilot.execute.ssh import ContainerWrapper, SshNode
    from megapilot.suite.config import LoadedSuite


def make_executor(suite: LoadedSuite) -> Executor:
    return make_registered(suite.executor, executor_settings(suite))


def executor_settings(suite: LoadedSuite) -> ExecutorSettings:
    """Everything an executor may need from the suite; each executor reads its own part."""
    return ExecutorSettings(nodes=tuple(node_addresses(suite)), container=container_entry(suite),
                            scheduler_options=tuple(scheduler_options(suite)),
                            job_lease_s=suite.config.megapilot.job_lease_s)


def node_addresses(suite: LoadedSuite) -> list[NodeAddress]:
    """The cluster file's nodes, in file order (node 0 = master), as many as the suite runs on."""
    if suite.cluster is None:
        return []
    return [NodeAddress(host=node.host, user=node.user, port=node.port,
                        identity_file=Path(node.key_file) if node.key_file else None,
                        address=node.vpc_ip or node.host, options=tuple(suite.cluster.ssh_options))
            for node in suite.cluster.nodes()][: suite.nodes]


def scheduler_options(suite: LoadedSuite) -> list[str]:
    """Where a scheduler places the jobs (and the preflight probe): partition, account, then sbatch_options."""
    block = suite.config.megapilot
    words = [f"--partition={block.partition}"] if block.partition else []
    words += [f"--account={block.account}"] if block.account else []
    return words + list(block.sbatch_options)


def container_entry(suite: LoadedSuite) -> ContainerEntry | None:
    """Jobs enter the container `prepare` started (`<runtime> exec NAME`), as CVS's jobs do."""
    if not uses_container(suite) or suite.config.container is None:
        return None
    return ContainerEntry(runtime=container_runtime(suite), name=suite.config.container.name)


def ssh_nodes(suite: LoadedSuite) -> list[SshNode]:
    """The cluster file's nodes as the ssh client reaches them."""
    return [SshNode.of(node) for node in node_addresses(suite)]


def container_wrapper(suite: LoadedSuite) -> ContainerWrapper | None:
    entry = container_entry(suite)
    return ContainerWrapper.entering(entry) if entry is not None else None


__all__ = ["container_entry", "container_wrapper", "executor_settings", "make_executor", "node_addresses",
           "scheduler_options", "ssh_nodes"]
