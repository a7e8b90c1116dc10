"""The executor a suite runs its jobs with, built from the config's `megapilot.executor` and the cluster file."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from megapilot.errors import MegapilotError
from megapilot.execute.base import Executor

if TYPE_CHECKING:
    from megapilot.execute.ssh import ContainerWrapper, SshNode
    from megapilot.suite.config import LoadedSuite


def make_executor(suite: LoadedSuite) -> Executor:
    if suite.executor == "local":
        from megapilot.execute.local import LocalExecutor

        return LocalExecutor()
    if suite.executor == "slurm":
        from megapilot.execute.slurm import SlurmExecutor

        return SlurmExecutor()
    from megapilot.execute.ssh import SshExecutor

    return SshExecutor(ssh_nodes(suite), container=container_wrapper(suite))


def ssh_nodes(suite: LoadedSuite) -> list[SshNode]:
    """The cluster file's nodes, in file order (node 0 = master), as the ssh executor reaches them."""
    from megapilot.execute.ssh import SshNode

    if suite.cluster is None:
        raise MegapilotError("the ssh executor needs the nodes", field="--cluster",
                             fix="pass the CVS cluster file (username, priv_key_file, node_dict) with --cluster")
    return [SshNode(host=node.host, user=node.user, port=node.port,
                    identity_file=Path(node.key_file) if node.key_file else None,
                    address=node.vpc_ip or node.host, options=tuple(suite.cluster.ssh_options))
            for node in suite.cluster.nodes()][: suite.nodes]


def container_wrapper(suite: LoadedSuite) -> ContainerWrapper | None:
    """Jobs enter the container `prepare` started (`<runtime> exec NAME`), as CVS's jobs do."""
    from megapilot.execute.ssh import ContainerWrapper
    from megapilot.suite.containers import container_runtime, uses_container

    if not uses_container(suite) or suite.config.container is None:
        return None
    runtime = container_runtime(suite)
    if runtime == "enroot":
        return ContainerWrapper(runtime="enroot", mode="start", target=suite.config.container.name)
    return ContainerWrapper(runtime=runtime, mode="exec", target=suite.config.container.name)


__all__ = ["container_wrapper", "make_executor", "ssh_nodes"]
