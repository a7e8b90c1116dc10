"""The CVS Megatron suite file's sections (MegatronVariantConfig, Sep 2026) as typed models, with the bounds of what
`suite run` uses. `megapilot.suite.config.SuiteConfig` puts them together with the `megapilot:` block."""

from __future__ import annotations

import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from megapilot.suite.cells import BoolLike, IntLike, PrecisionName, StrLike
from megapilot.suite.config_read import BOOL_FOR_NUMBER, VALIDATOR_FIX


class _Forbid(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_switch_for_a_number(cls, value: Any, info: ValidationInfo) -> Any:
        """pydantic reads true as 1 where a number is wanted, and YAML writes `yes`/`true` as one: `gpus_per_node:
        true` would run one GPU per node without a word. A number field that takes no switch refuses it."""
        if isinstance(value, bool) and info.field_name is not None \
                and _number_not_switch(cls.model_fields[info.field_name].annotation):
            raise PydanticCustomError(BOOL_FOR_NUMBER,
                                      f"a true/false where a number is required (got {str(value).lower()})")
        return value


def _number_not_switch(annotation: Any) -> bool:
    """Whether a field takes an int or a float and no bool (through Optional, unions and Annotated)."""
    leaves: list[Any] = []
    pending = [annotation]
    while pending:
        node = pending.pop()
        if get_origin(node) in (Union, types.UnionType, Annotated):
            pending.extend(get_args(node)[:1] if get_origin(node) is Annotated else get_args(node))
        else:
            leaves.append(node)
    return bool(set(leaves) & {int, float}) and bool not in leaves


# Bounds of what `suite run` uses: generous for any real suite, and a typo (10^30 iterations, a timeout of a
# million years) is refused by `suite check` instead of starting a run that cannot end.
MAX_ITERATIONS = 10_000_000
MAX_TIMEOUT_S = 30 * 24 * 3600.0  # 30 days
MAX_HANG_FACTOR = 1000.0
MAX_NODES = 100_000
MAX_GPUS_PER_NODE = 64


# ---- the CVS schema ---------------------------------------------------------------------------
class SuitePaths(_Forbid):
    hf_token_file: str
    log_dir: str
    scripts_dir: str
    data_cache_dir: str
    rocm_dir: str = ""


class RuntimeArgs(BaseModel):
    """`container.runtime.args`: the docker/podman flags CVS knows, each passed to `run`; another key is accepted (CVS
    files may carry one) but passed to nothing, and `suite check` warns of it."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    network: str | None = None
    ipc: str | None = None
    privileged: BoolLike | None = None
    volumes: list[str] = Field(default_factory=list)
    devices: list[str] = Field(default_factory=list)
    cap_add: list[str] = Field(default_factory=list)
    security_opt: list[str] = Field(default_factory=list)
    group_add: list[str] = Field(default_factory=list)
    ulimit: list[str] | str | None = None


class ContainerRuntime(_Forbid):
    name: Literal["docker", "podman", "enroot"] = "docker"
    args: RuntimeArgs = Field(default_factory=RuntimeArgs)


class ContainerSpec(_Forbid):
    lifetime: Literal["per_run", "persistent", "no_launch"] = "per_run"
    name: str
    image: str
    runtime: ContainerRuntime = Field(default_factory=ContainerRuntime)
    env: dict[str, StrLike] = Field(default_factory=dict)


class SmokeConfig(_Forbid):
    enabled: BoolLike = True
    iters: IntLike = Field(default=10, gt=0, le=MAX_ITERATIONS)
    micro_batch_size: IntLike = Field(default=1, gt=0)
    # None: the smoke default for the node count (cells.smoke_cell); a value must be a positive batch
    global_batch_size: Annotated[Annotated[int, Field(gt=0)] | None,
                                 BeforeValidator(lambda v: None if v in ("", None) else v)] = None
    precision: PrecisionName = "BF16"


class LossCurveConfig(_Forbid):
    sample_every: IntLike = Field(default=10, gt=0, le=MAX_ITERATIONS)
    milestone_steps: list[Annotated[int, Field(gt=0, le=MAX_ITERATIONS)]] = Field(
        default_factory=lambda: [100, 500, 1000, 5000])
    max_slope: float = 0.0
    enforce: BoolLike = True


class ConvergenceConfig(_Forbid):
    target_metric: Literal["auto", "train_loss", "eval_loss"] = "auto"
    target_value: float = 0.0


class CheckpointConfig(_Forbid):
    enforce: BoolLike = False
    save_interval: IntLike = Field(default=20, gt=0, le=MAX_ITERATIONS)
    save_iters: IntLike = Field(default=21, gt=0, le=MAX_ITERATIONS)
    resume_iters: IntLike = Field(default=25, gt=0, le=MAX_ITERATIONS)
    loss_rtol: float = Field(default=0.05, ge=0, le=1, description="Relative: 0.05 is 5 %.")
    checkpoint_dir: str = ""

    @field_validator("resume_iters")
    @classmethod
    def _resume_goes_past_the_save(cls, resume_iters: int, info: ValidationInfo) -> int:
        # a check of the field, not the section: the problem is at checkpoint.resume_iters, the value it names
        save_iters = info.data.get("save_iters")
        if save_iters is not None and resume_iters <= save_iters:
            raise ValueError(f"resume_iters ({resume_iters}) must be past save_iters ({save_iters}): the resumed "
                             f"run has to train beyond the checkpoint{VALIDATOR_FIX}set resume_iters above "
                             f"{save_iters}, or save_iters below {resume_iters}")
        return resume_iters


class ScalingBaseline(_Forbid):
    tokens_per_sec_total: float = Field(default=0.0, ge=0)
    num_nodes: IntLike = Field(default=1, gt=0)


class RegressionsConfig(_Forbid):
    """What a regression against the run history does to the verdict (megapilot.suite.outcome)."""

    enforce: BoolLike = Field(default=False, description="true: a regression beyond its band fails the run "
                                                         "(exit 1); false: it is a WARN.")


class StragglerConfig(_Forbid):
    """The per-node straggler gate of every combo (megapilot.suite.stragglers)."""

    max_ratio: float = Field(default=1.15, gt=1, le=10, description="A node whose compute time is more than this "
                                                                     "times the other nodes' median fails.")
    enforce: BoolLike = True


CollectiveName = Literal["all_reduce", "all_gather", "reduce_scatter", "alltoall"]


class CollectivesConfig(_Forbid):
    """The `collectives` stage: bus bandwidth of each collective over a sweep of message sizes, before training
    (megapilot.suite.collectives). nccl-tests / rccl-tests where the nodes have them, else megapilot's
    torch.distributed probe."""

    enabled: Literal["auto"] | BoolLike = Field(
        default="auto", description="auto: on for a GPU suite (a minute before hours of training), off for a CPU "
                                    "suite (gloo on shared cores says nothing about a machine); false turns it off.")
    ops: list[CollectiveName] = Field(default_factory=lambda: list(get_args(CollectiveName)), min_length=1)
    min_bytes: int = Field(default=1024, ge=64, description="Smallest message, bytes.")
    max_bytes: int | None = Field(default=None, gt=0, description="Largest message, bytes; None = 1 GiB on GPUs, "
                                                                   "4 MiB on CPUs.")
    iters: int = Field(default=20, gt=0, le=10_000, description="Timed calls per message size.")
    min_busbw_gbps: float | None = Field(default=None, gt=0, description="A fixed bus-bandwidth floor, GB/s; None "
                                                                         "= min_fraction of the catalog's links.")
    min_fraction: float = Field(default=0.7, gt=0, le=1, description="Of the bus bandwidth the GPU catalog's links "
                                                                     "give (NVLink/xGMI in a node, the NIC across).")
    enforce: BoolLike = True

    @field_validator("max_bytes")
    @classmethod
    def _sizes_in_order(cls, max_bytes: int | None, info: ValidationInfo) -> int | None:
        min_bytes = info.data.get("min_bytes")
        if max_bytes is not None and min_bytes is not None and max_bytes < min_bytes:
            raise ValueError(f"max_bytes ({max_bytes}) must be at least min_bytes ({min_bytes}){VALIDATOR_FIX}"
                             f"set max_bytes to {min_bytes} or more, or min_bytes to {max_bytes} or less")
        return max_bytes

    def runs_on(self, device: str) -> bool:
        return device == "gpu" if self.enabled == "auto" else bool(self.enabled)

    def largest_bytes(self, device: str) -> int:
        return self.max_bytes or (2**30 if device == "gpu" else 4 * 2**20)


class Sweep(_Forbid):
    """Combination key -> overlay of train_params (checked cell by cell), and the ordered runs."""

    combinations: dict[str, dict[str, Any]] = Field(default_factory=dict)
    runs: list[str] = Field(default_factory=list)
    repeats: int = Field(default=1, ge=1, le=100, description="Run every combo this many times; its gates read the "
                                                              "median run (megapilot.suite.repeats).")
    max_cv_pct: float = Field(default=5.0, gt=0, le=100, description="With repeats: the step time's coefficient of "
                                                                     "variation across them may be at most this (%).")
