"""Suite templates: CVS-schema Megatron configs (with `<changeme>` where CVS has them) and their threshold
examples, plus `tiny-local`, a suite that really runs on CPUs with the embedded trainer.

Each template is `<name>.json` with its threshold files beside it: `<name>.<gpu>_threshold.json` (one per
GPU, example values marked uncalibrated) or, for tiny-local, `tiny-local_threshold.json`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from megapilot.errors import MegapilotError
from megapilot.execute.registry import capabilities
from megapilot.suite.config import MegapilotBlock


@dataclass(frozen=True)
class SuiteTemplate:
    """One packaged template."""

    name: str
    description: str
    model: str
    gpu: str
    calibrated: bool = False


TEMPLATES: tuple[SuiteTemplate, ...] = (
    SuiteTemplate("llama3.1-8b-single", "Llama 3.1 8B on one node, BF16/FP8/MXFP8 cells", "llama3.1-8b",
                  "H100, H200, B200, MI300X, MI325X, MI355X"),
    SuiteTemplate("llama3.3-70b-distributed", "Llama 3.3 70B across nodes, TP8, BF16/FP8 cells", "llama3.3-70b",
                  "H100, H200, B200, MI300X, MI325X, MI355X"),
    SuiteTemplate("deepseek-v2-lite-single", "DeepSeek-V2-Lite (MoE, MLA) on one node, BF16/FP8 cells",
                  "deepseek-v2-lite", "H100, H200, B200, MI300X, MI325X, MI355X"),
    SuiteTemplate("mixtral-8x7b-distributed", "Mixtral 8x7B (MoE) across nodes, TP8, BF16/FP8 cells",
                  "mixtral-8x7b", "H100, H200, B200, MI300X, MI325X, MI355X"),
    SuiteTemplate("llama3.1-405b-distributed", "Llama 3.1 405B on 9 nodes, TP8 PP9, full recompute",
                  "llama3.1-405b", "H100, H200, B200, MI300X, MI325X, MI355X"),
    SuiteTemplate("tiny-local", "Tiny GPT on 2 CPU processes with the embedded trainer: runs anywhere", "tiny",
                  "CPU"),
)


def list_templates() -> list[SuiteTemplate]:
    """Every packaged template, in a fixed order."""
    return list(TEMPLATES)


def _folder() -> Path:
    return Path(str(resources.files("megapilot.suite.templates")))


def template_path(name: str) -> Path:
    """The packaged config file of template `name`."""
    known = {t.name for t in TEMPLATES}
    if name not in known:
        raise MegapilotError(f"no suite template {name!r}", field="template",
                             fix="use one of: " + ", ".join(t.name for t in TEMPLATES))
    return _folder() / f"{name}.json"


def threshold_paths(name: str) -> list[Path]:
    """The threshold files that come with template `name`."""
    template_path(name)
    return sorted(_folder().glob(f"{name}[._]*threshold.json"))


# The `megapilot:` keys that say where and how jobs run, written (with their defaults and meaning) by
# `suite init --executor`: every executor's, then a scheduler's (SLURM) when the executor allocates resources.
RUN_KEYS = ("executor", "nodes", "gpus_per_node", "python", "startup_timeout_s", "job_timeout_s")
SCHEDULER_KEYS = ("partition", "account", "time_limit", "exclusive", "memory_per_node_gib", "sbatch_options",
                  "job_lease_s")


def for_executor(config: dict[str, Any], executor: str) -> dict[str, Any]:
    """The template's config set to run with `executor`, each setting that concerns it written out at its
    default (or the template's value) with a `_<key>` comment: what it means and its default."""
    able = capabilities(executor)
    block = dict(config.get("megapilot") or {})
    block["executor"] = executor
    keys = RUN_KEYS + (SCHEDULER_KEYS if able.allocates_resources else ())
    commented: dict[str, Any] = {"_executor_comment": f"{executor}: {able.summary}"}
    for key in keys:
        field = MegapilotBlock.model_fields[key]
        default = field.get_default(call_default_factory=True)
        if key != "executor":
            commented[f"_{key}"] = f"{field.description or key} (default: {json.dumps(default)})"
        commented[key] = block.pop(key, default)
    commented.update(block)
    return {**config, "megapilot": commented}


def cluster_file(nodes: list[str], *, user: str | None, port: int | None, key: str | None,
                 options: list[str]) -> dict[str, Any]:
    """A CVS cluster file for these nodes (node 0 first), with comments on each key."""
    hosts = nodes or [CHANGEME_NODE.format(1), CHANGEME_NODE.format(2)]
    data: dict[str, Any] = {
        "_comment": "The nodes the ssh executor runs on, node 0 first (it hosts the rendezvous). Each is reached "
                    "with the system ssh client: your ~/.ssh/config, agent and known_hosts apply.",
        "username": user or "{user-id}",
        "_username": "ssh user; {user-id} = the user running megapilot",
        "priv_key_file": key or "/home/{user-id}/.ssh/id_ed25519",
        "_priv_key_file": "private key ssh uses (-i); its content is never read",
        "head_node_dict": {"mgmt_ip": hosts[0]},
        "node_dict": {host: {"bmc_ip": "NA", "vpc_ip": host} for host in hosts},
        "_node_dict": "host megapilot connects to -> vpc_ip, the address the other nodes reach it at",
        "ssh_port": port or 22,
        "_ssh_port": "ssh port of every node (a node's own `port` in node_dict wins); default 22",
        "ssh_options": [o for o in options if o],
        "_ssh_options": "more `ssh -o` options for every node, e.g. StrictHostKeyChecking=accept-new; they override "
                        "the keepalives megapilot sets (ServerAliveInterval=15, ServerAliveCountMax=4)",
        "env_vars": {},
        "_env_vars": "variables every job gets (values never logged)",
    }
    return data


CHANGEME_NODE = "<changeme: node {}>"


__all__ = ["CHANGEME_NODE", "RUN_KEYS", "SCHEDULER_KEYS", "TEMPLATES", "SuiteTemplate", "cluster_file",
           "for_executor", "list_templates", "template_path", "threshold_paths"]
