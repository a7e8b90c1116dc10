"""`suite run --exclude-failing [RUN]`: the next run re-formed on the nodes an earlier run's preflight passed.

Every run writes `failing_nodes.txt` (one node a line, what `srun --exclude=$(paste -sd, failing_nodes.txt)` takes)
and `failing_nodes.json` (each node with the checks it failed). Excluding them:
- under a scheduler that allocates the nodes (SLURM): `--exclude=a,b` joins the sbatch options of every job and of
  the preflight probe's `srun`, so the scheduler picks the others;
- where the suite reaches each node of the cluster file itself (SSH): those hosts leave the node list, and the
  job runs on the first `megapilot.nodes` of the rest (on all of the rest where that key is unset).
Too few nodes left for the suite's `nodes` is a user error (exit 2), said before anything runs, naming where the run
was named: the option, or the config's `megapilot.exclude_failing` and its file. The run's notes (in the report and
the run deck) name each excluded node, the run it came from and the checks it failed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from megapilot.errors import MegapilotError

if TYPE_CHECKING:
    from megapilot.suite.config import LoadedSuite

FAILING_NODES = "failing_nodes.txt"
FAILING_REASONS = "failing_nodes.json"
LATEST = "latest"
FIELD = "--exclude-failing"
CONFIG_KEY = "megapilot.exclude_failing"


@dataclass(frozen=True)
class ExcludeOrigin:
    """Where the run to exclude was named, for the errors: `--exclude-failing`, or the config's key in
    `config_path`."""

    config_path: Path | None = None

    @property
    def field(self) -> str:
        return FIELD if self.config_path is None else CONFIG_KEY

    def name(self, what: str) -> str:
        """The fix that names another run: 'pass --exclude-failing WHAT', or 'set the key in its file to WHAT'."""
        if self.config_path is None:
            return f"pass {FIELD} {what}"
        return f"set {CONFIG_KEY} in {self.config_path} to {what}"

    @property
    def named_by(self) -> str:
        """', named by megapilot.exclude_failing in FILE' after the list a problem names; nothing for the option."""
        return "" if self.config_path is None else f", named by {CONFIG_KEY} in {self.config_path}"

    @property
    def drop(self) -> str:
        """The fix that excludes nothing."""
        return f"run without {FIELD}" if self.config_path is None else f"remove {CONFIG_KEY} from {self.config_path}"


FROM_OPTION = ExcludeOrigin()


@dataclass(frozen=True)
class ExcludedNodes:
    """The nodes a run leaves out, the run directory whose preflight failed them, and why."""

    source: Path
    reasons: dict[str, list[str]] = field(default_factory=dict)  # node name -> the checks it failed

    @property
    def names(self) -> list[str]:
        return list(self.reasons)

    def notes(self) -> list[str]:
        """One line per node for the report and run deck; one line saying none when the list was empty."""
        if not self.reasons:
            return [f"excluded nodes: none ({FAILING_NODES} of run {self.source.name} lists no node)"]
        return [f"excluded node {name} (failed preflight in run {self.source.name}: "
                f"{'; '.join(why) if why else 'listed in ' + FAILING_NODES})" for name, why in self.reasons.items()]


def failing_run_dir(run: str, out_dir: Path, origin: ExcludeOrigin = FROM_OPTION) -> Path:
    """The run directory to read: `latest` (the newest run under `out_dir` with a failing-node list), a run
    directory, or a run id under `out_dir`."""
    if run == LATEST:
        found = sorted((p.parent for p in Path(out_dir).glob(f"*/{FAILING_NODES}")), key=lambda p: p.name)
        if not found:
            raise MegapilotError(f"no run under {out_dir} wrote {FAILING_NODES}", field=origin.field,
                                 fix="pass the --out of the run whose preflight failed nodes, or "
                                     + origin.name("its run directory"))
        return found[-1]
    for candidate in (Path(run), Path(out_dir) / run):
        if (candidate / FAILING_NODES).is_file():
            return candidate
    raise MegapilotError(f"no {FAILING_NODES} in {run!r} (nor under {out_dir})", field=origin.field,
                         fix=origin.name("'latest', a run directory or a run id whose preflight stage ran"))


def read_failing(run_dir: Path) -> ExcludedNodes:
    """The nodes of `failing_nodes.txt` (as a user may have edited it), with their reasons where the run wrote them."""
    names = [line.strip() for line in (run_dir / FAILING_NODES).read_text(encoding="utf-8").splitlines()
             if line.strip() and not line.lstrip().startswith("#")]
    reasons: dict[str, list[str]] = {}
    sidecar = run_dir / FAILING_REASONS
    if sidecar.is_file():
        try:
            loaded = json.loads(sidecar.read_text(encoding="utf-8"))
            reasons = {str(k): [str(r) for r in v] for k, v in loaded.items()} if isinstance(loaded, dict) else {}
        except (ValueError, AttributeError, TypeError):
            reasons = {}  # the reasons are a courtesy; the node list is what excludes
    return ExcludedNodes(run_dir, {name: reasons.get(name, []) for name in names})


def exclude_nodes(suite: LoadedSuite, excluded: ExcludedNodes, origin: ExcludeOrigin = FROM_OPTION) -> LoadedSuite:
    """The suite without the excluded nodes (a scheduler's `--exclude`, or the cluster file's host list); an error
    names `origin`, where the run was named."""
    if not excluded.names:
        return suite
    capabilities = suite.capabilities
    if capabilities.allocates_resources:
        block = suite.config.megapilot
        options = [*block.sbatch_options, f"--exclude={','.join(excluded.names)}"]
        config = suite.config.model_copy(update={"megapilot": block.model_copy(update={"sbatch_options": options})})
        return suite.model_copy(update={"config": config})
    if not capabilities.needs_node_list or suite.cluster is None:
        raise MegapilotError(f"executor {suite.executor!r} runs on this machine only: nodes "
                             f"{', '.join(excluded.names)} cannot be left out", field=origin.field,
                             fix=f"use it with the ssh or slurm executor, or {origin.drop}")
    cluster = suite.cluster
    hosts = [node.host for node in cluster.nodes()]
    unknown = [name for name in excluded.names if name not in hosts]
    if unknown:
        raise MegapilotError(f"{', '.join(unknown)} in {excluded.source / FAILING_NODES} is no host of the cluster "
                             "file", field=origin.field,
                             fix=origin.name("the run made with this cluster file") + ", or edit the list")
    left = [host for host in hosts if host not in excluded.reasons]
    # Without megapilot.nodes the job spans the cluster file's nodes: now those left.
    nodes = suite.nodes if suite.config.megapilot.nodes is not None else min(suite.nodes, len(left))
    if len(left) < nodes or not left:
        raise MegapilotError(
            f"{len(left)} node(s) left of {len(hosts)} after excluding {', '.join(excluded.names)} (from "
            f"{excluded.source / FAILING_NODES}{origin.named_by}), the suite needs {max(nodes, 1)}", field=origin.field,
            fix="add healthy nodes to the cluster file, lower megapilot.nodes, or repair the failing nodes")
    kept = {host: entry for host, entry in cluster.node_dict.items() if host not in excluded.reasons}
    head = cluster.head_node_dict
    if head.mgmt_ip in excluded.reasons:  # the master moves to the first healthy node
        head = head.model_copy(update={"mgmt_ip": left[0]})
    trimmed = cluster.model_copy(update={"node_dict": kept, "head_node_dict": head})
    return suite.model_copy(update={"cluster": trimmed, "nodes": nodes})


__all__ = ["CONFIG_KEY", "FAILING_NODES", "FAILING_REASONS", "FROM_OPTION", "ExcludeOrigin", "ExcludedNodes",
           "exclude_nodes", "failing_run_dir", "read_failing"]
