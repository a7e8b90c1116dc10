"""The CVS cluster file: which hosts a suite runs on, as whom, with which key.

    {
      "username": "{user-id}",
      "priv_key_file": "/home/{user-id}/.ssh/id_rsa",
      "head_node_dict": {"mgmt_ip": "10.0.0.1"},
      "node_dict": {"10.0.0.1": {"bmc_ip": "NA", "vpc_ip": "192.168.0.1"}, "10.0.0.2": {...}},
      "env_vars": {}
    }

`{user-id}` becomes `username` when that is a real name, else the login user running megapilot (as
CVS does). Keys starting with `_` are comments. CVS's own extras (`orchestrator`, a `container`
block) are kept but not used here. megapilot adds two optional keys so a test can reach a loopback
sshd: `ssh_port` (every node) and a per-node `port`.
"""

from __future__ import annotations

import getpass
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from megapilot.errors import MegapilotError
from megapilot.suite.parsing import json_hint, parse_json

USER_PLACEHOLDER = "{user-id}"
# What CVS's templates ship in place of an address: "{xx.xx.xx.xx|hostname-1}".
_UNFILLED_HOST = re.compile(r"\{[^}]*\}|<changeme>", re.IGNORECASE)
_FILL_HOSTS = "replace them with the nodes' IPs or hostnames"


class CvsNodeEntry(BaseModel):
    """One `node_dict` value: the node's BMC and in-cluster (VPC) addresses."""

    model_config = ConfigDict(extra="allow")

    bmc_ip: str = "NA"
    vpc_ip: str | None = None
    port: int | None = Field(default=None, gt=0, lt=65536, description="SSH port of this node (megapilot's).")


class HeadNode(BaseModel):
    model_config = ConfigDict(extra="allow")

    mgmt_ip: str


class ClusterNode(BaseModel):
    """A node as executors reach it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = Field(description="Address megapilot connects to (the node_dict key).")
    user: str
    key_file: str | None = Field(default=None, description="SSH private key path (never its content).")
    port: int = 22
    vpc_ip: str = Field(description="Address the other nodes reach this one at (MASTER_ADDR for node 0).")
    bmc_ip: str = "NA"


class CvsCluster(BaseModel):
    """A CVS cluster file with `{user-id}` resolved."""

    model_config = ConfigDict(extra="allow")

    username: str
    priv_key_file: str | None = None
    head_node_dict: HeadNode
    node_dict: dict[str, CvsNodeEntry] = Field(min_length=1)
    env_vars: dict[str, str] = Field(default_factory=dict)
    ssh_port: int | None = Field(default=None, gt=0, lt=65536, description="SSH port of every node (megapilot's).")
    ssh_options: list[str] = Field(default_factory=list, description="More `ssh -o Key=Value` options for every "
                                                                     "node (megapilot's), e.g. UserKnownHostsFile=...")

    def nodes(self) -> list[ClusterNode]:
        """Every node, in file order, with the head node first: node 0 is the master (NODE_RANK 0)."""
        hosts = list(self.node_dict)
        if self.head_node_dict.mgmt_ip in hosts:
            hosts.remove(self.head_node_dict.mgmt_ip)
            hosts.insert(0, self.head_node_dict.mgmt_ip)
        return [self._node(host) for host in hosts]

    def _node(self, host: str) -> ClusterNode:
        entry = self.node_dict[host]
        return ClusterNode(
            host=host, user=self.username, key_file=self.priv_key_file, port=entry.port or self.ssh_port or 22,
            vpc_ip=entry.vpc_ip or host, bmc_ip=entry.bmc_ip,
        )

    @property
    def node_count(self) -> int:
        return len(self.node_dict)


def resolve_user(username: str | None) -> str:
    """The user `{user-id}` stands for: the file's username when it names one, else the login user."""
    if username and username.strip() and username.strip() != USER_PLACEHOLDER:
        return username.strip()
    return getpass.getuser()


def substitute_user(node: object, user: str) -> object:
    """`{user-id}` replaced by `user` in every string of a JSON-like tree."""
    if isinstance(node, str):
        return node.replace(USER_PLACEHOLDER, user)
    if isinstance(node, list):
        return [substitute_user(item, user) for item in node]
    if isinstance(node, dict):
        return {key: substitute_user(value, user) for key, value in node.items()}
    return node


def strip_comments(node: object) -> object:
    """Drop keys starting with `_` at every level (CVS's `_comment`, `_..._example` keys)."""
    if isinstance(node, dict):
        return {k: strip_comments(v) for k, v in node.items() if not (isinstance(k, str) and k.startswith("_"))}
    if isinstance(node, list):
        return [strip_comments(item) for item in node]
    return node


def load_cluster(path: str | Path) -> CvsCluster:
    """Read a CVS cluster file; one MegapilotError (field `cluster`) naming what is wrong."""
    path = Path(path)
    fix = "pass a CVS cluster file: username, priv_key_file, head_node_dict.mgmt_ip, node_dict"
    duplicates: list[str] = []
    try:
        raw = parse_json(path.read_text(encoding="utf-8"), duplicates=duplicates)
    except OSError as exc:
        raise MegapilotError(f"cannot read {path} ({exc.strerror or exc})", field="cluster", fix=fix) from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise MegapilotError(f"{path} is not JSON ({exc}){json_hint(exc)}", field="cluster", fix=fix) from None
    if not isinstance(raw, dict):
        raise MegapilotError(f"{path} holds a JSON {type(raw).__name__}, not an object", field="cluster", fix=fix)
    unfilled = [key for key in dict.fromkeys(duplicates) if _UNFILLED_HOST.search(key)]
    if unfilled:  # CVS's template repeats one placeholder host per node: unfilled, not a node listed twice
        raise MegapilotError(f"{path}: node addresses still hold template placeholders: {', '.join(unfilled)}",
                             field="cluster", fix=_FILL_HOSTS)
    if duplicates:
        raise MegapilotError(f"{path}: key {duplicates[0]!r} appears more than once in one object; only the last "
                             "one would count (a node listed twice is one node)", field="cluster",
                             fix="keep one entry per key")
    return cluster_from_mapping(raw, source=str(path))


def cluster_from_mapping(raw: dict[str, Any], *, source: str = "cluster file") -> CvsCluster:
    """A cluster from an already-read mapping: comments dropped, `{user-id}` resolved, hosts checked."""
    raw = strip_comments(raw)  # type: ignore[assignment]  # a mapping stays a mapping
    user = resolve_user(raw.get("username") if isinstance(raw.get("username"), str) else None)
    raw = substitute_user(raw, user)  # type: ignore[assignment]  # a mapping stays a mapping
    raw["username"] = user
    try:
        cluster = CvsCluster.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise MegapilotError(f"{source}: {where}: {first['msg']}", field="cluster",
                             fix="fix that field of the cluster file") from None
    _check_hosts_filled(cluster, source)
    return cluster


def _check_hosts_filled(cluster: CvsCluster, source: str) -> None:
    unfilled = [host for host in [cluster.head_node_dict.mgmt_ip, *cluster.node_dict] if _UNFILLED_HOST.search(host)]
    if unfilled:
        raise MegapilotError(f"{source}: node addresses still hold template placeholders: {', '.join(unfilled)}",
                             field="cluster", fix=_FILL_HOSTS)
    if cluster.head_node_dict.mgmt_ip not in cluster.node_dict:
        raise MegapilotError(f"{source}: head_node_dict.mgmt_ip {cluster.head_node_dict.mgmt_ip!r} is not a key "
                             "of node_dict", field="cluster", fix="use one of the node_dict keys as mgmt_ip")


__all__ = ["ClusterNode", "CvsCluster", "CvsNodeEntry", "cluster_from_mapping", "load_cluster", "resolve_user",
           "strip_comments", "substitute_user"]
