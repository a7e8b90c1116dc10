"""megapilot's own `megapilot:` block of a suite config: executor, backend, device, shape, hang rule, SLURM
settings, secrets; every setting optional, with the default CVS's behaviour implies."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, ValidationInfo, field_validator

from megapilot.execute.base import DEFAULT_BLOCKED_IN_QUEUE_S
from megapilot.execute.registry import executor_names
from megapilot.execute.slurm import MIN_LEASE_S
from megapilot.limits import MAX_GPUS
from megapilot.suite.config_schema import (
    MAX_GPUS_PER_NODE,
    MAX_HANG_FACTOR,
    MAX_ITERATIONS,
    MAX_NODES,
    MAX_TIMEOUT_S,
    _Forbid,
)

DEFAULT_MEGATRON_PATH = "/workspace/Megatron-LM"  # where CVS's Megatron-LM images keep the checkout
DEFAULT_PRIMUS_PATH = "/workspace/Primus"
Backend = Literal["megatron-lm", "primus", "megapilot"]
ExecutorName = str  # a registered executor (megapilot.execute.registry); checked when the suite is resolved
Device = Literal["auto", "cpu", "gpu"]
DEFAULT_HANG_MIN_WINDOW_S = 120.0


class MegapilotBlock(_Forbid):
    """megapilot's own settings; every one optional, with the default CVS's behaviour implies."""

    model: str | None = Field(default=None, description="Preset, HF config.json (or folder) or ModelSpec file; "
                                                        "None = from train_params.model_name/model_size.")
    executor: ExecutorName = "local"
    backend: Backend | None = Field(default=None, description="None = CVS's rule: image with 'primus' -> primus, "
                                                              "else megatron-lm; no image + local -> megapilot.")
    device: Device = "auto"
    nodes: int | None = Field(default=None, gt=0, le=MAX_NODES, description="None = cluster file node count, else 1.")
    gpus_per_node: int | None = Field(default=None, gt=0, le=MAX_GPUS_PER_NODE,
                                      description="None = the GPU catalog's default (8).")
    data_path: str | None = Field(default=None, description="Megatron data prefix; None = mock data.")
    tokenizer_type: str | None = None
    megatron_path: str = DEFAULT_MEGATRON_PATH
    megatron_version: str | None = Field(
        default=None, description="Megatron-LM release the launches are checked against (0.14 ... 0.19); None = "
                                  "megatron_path's own arguments.py when it is on this machine, else the newest table.")
    primus_path: str = DEFAULT_PRIMUS_PATH
    python: str | None = Field(default=None, description="None = the interpreter megapilot runs under, where the "
                                                         "nodes share this machine's file system; else python3.")
    startup_timeout_s: float = Field(default=900.0, gt=0, le=MAX_TIMEOUT_S,
                                     description="Seconds a job may take to its first iteration line before it "
                                                 "counts as hung.")
    hang_factor: float = Field(default=10.0, gt=1, le=MAX_HANG_FACTOR,
                               description="Hung after this many times the observed step time (> 1).")
    hang_min_window_s: float = Field(default=DEFAULT_HANG_MIN_WINDOW_S, gt=0, le=MAX_TIMEOUT_S,
                                     description="The shortest hang window after the first iteration, whatever "
                                                 "hang_factor x step time gives (never longer than "
                                                 "startup_timeout_s).")
    job_timeout_s: float | None = Field(default=None, gt=0, le=MAX_TIMEOUT_S,
                                        description="Wall-clock limit of each job in seconds; None = none (SLURM "
                                                    "time_limit still holds).")
    blocked_queue_timeout_s: float | None = Field(
        default=DEFAULT_BLOCKED_IN_QUEUE_S, gt=0, le=MAX_TIMEOUT_S,
        description="SLURM: a job still queued this long on nodes out of service (drained or down since the "
                    "preflight) is cancelled and its combo failed, naming the nodes; None = it waits until they "
                    "come back. A queue that is only busy is waited on.")
    job_lease_s: float | None = Field(
        default=None, ge=0, le=MAX_TIMEOUT_S,
        description="SLURM: a job scancels itself once megapilot has not renewed its lease for this long "
                    "(megapilot was killed); None = 120 s, 0 = no lease (the job keeps running when megapilot "
                    "is gone).")
    expected_nic_gbps: float | None = Field(default=None, gt=0, le=100_000)
    log_interval: int = Field(default=1, gt=0, le=MAX_ITERATIONS)
    partition: str | None = Field(default=None, description="SLURM partition; None = the cluster's default.")
    account: str | None = Field(default=None, description="SLURM account; None = the user's default.")
    time_limit: str | None = Field(default=None, description="SLURM --time; None = 04:00:00.")
    exclusive: bool | None = Field(default=None, description="SLURM --exclusive; None = for a GPU suite, not for a "
                                                             "CPU one.")
    memory_per_node_gib: float | None = Field(default=None, gt=0, description="SLURM --mem of a CPU suite; None = "
                                                                             "from the model and ranks per node.")
    sbatch_options: list[str] = Field(default_factory=list, description="More sbatch options, one per item, as "
                                                                        "sbatch takes them: --qos=high, "
                                                                        "--reservation=r1, --constraint=a100.")
    exclude_failing: str | None = Field(default=None, description="Leave out the nodes in failing_nodes.txt of this "
                                                                  "run ('latest' under --out, a run directory or id), "
                                                                  "as `suite run --exclude-failing` does.")
    secrets: list[str] = Field(default_factory=list, description="Names of container.env / cluster env_vars "
                                                                 "variables whose values are secrets, beyond those "
                                                                 "whose names say so (TOKEN, KEY, PASSWORD...).")

    @field_validator("job_lease_s")
    @classmethod
    def _lease_long_enough(cls, lease_s: float | None) -> float | None:
        if lease_s and lease_s < MIN_LEASE_S:
            raise ValueError(f"must be 0 (no lease) or at least {MIN_LEASE_S:g} s, long enough to renew the lease "
                             f"over a shared file system")
        return lease_s

    @field_validator("gpus_per_node")
    @classmethod
    def _cluster_within_reason(cls, per_node: int | None, info: ValidationInfo) -> int | None:
        nodes = info.data.get("nodes")
        if per_node and nodes and nodes * per_node > MAX_GPUS:  # each within its bound, their product not
            raise ValueError(f"{nodes:,} nodes x {per_node} GPUs is {nodes * per_node:,} GPUs, above the "
                             f"{MAX_GPUS:,} a plan may have; check nodes and gpus_per_node for extra digits")
        return per_node

    @field_validator("executor")
    @classmethod
    def _registered_executor(cls, name: str) -> str:
        if name not in executor_names():
            raise ValueError(f"unknown executor {name!r}; use one of: {', '.join(executor_names())}")
        return name


def describe_hang_window(block: MegapilotBlock) -> str:
    """The hang rule a suite's jobs run under, each number with where it came from (the config or the default)."""
    def origin(name: str) -> str:
        return "config" if name in block.model_fields_set else "default"

    floor_s = min(block.hang_min_window_s, block.startup_timeout_s)
    return (f"hang window: {block.startup_timeout_s:g} s before the first iteration (megapilot.startup_timeout_s, "
            f"{origin('startup_timeout_s')}); then {block.hang_factor:g} x the observed step time "
            f"(megapilot.hang_factor, {origin('hang_factor')}), at least {floor_s:g} s "
            f"(megapilot.hang_min_window_s, {origin('hang_min_window_s')})")
