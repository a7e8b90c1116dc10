"""The suite configuration: CVS Megatron configs (Sep 2026 schema, and schema v1 read into it by schema_v1.py)
accepted as they are, plus megapilot's own optional `megapilot:` block.

    loaded = load_suite("mi3xx_megatron_llama-3.1-8b_single.json", cluster_path="cluster.json")
    check = check_suite(path)          # every problem at once, for `megapilot suite check`

Loading follows CVS's order: read (JSON, or YAML by suffix) -> drop `_` comment keys -> three-pass
placeholder substitution (`{user-id}`; `{x}` inside `paths`; `{paths.x}` elsewhere) -> when
`checkpoint.enforce` is false, drop `checkpoint.checkpoint_dir` and volumes holding `<changeme>` ->
every `<changeme>` left is a problem -> typed validation -> threshold file -> sweep and coverage rules.
Unlike CVS, nothing stops at the first problem: all of them are collected, and `load_suite` raises one
MegapilotError listing every one with its dotted path.

Relative paths in `paths` (megapilot's extension) are taken from the config file's folder.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import ErrorDetails

from megapilot.catalog import ModelPreset
from megapilot.errors import MegapilotError
from megapilot.execute.base import Capabilities
from megapilot.execute.registry import capabilities as executor_capabilities
from megapilot.spec import GPUSpec, ModelSpec
from megapilot.suite.budget import BudgetConfig, budget_problems
from megapilot.suite.cells import (
    DEFAULT_CELL_KEY,
    BoolLike,
    CellKey,
    IntLike,
    PrecisionName,
    StrLike,
    SweepCell,
    TrainParams,
    default_cell,
    normalise_precision,
    parse_cell_key,
    smoke_cell,
    sweep_cell,
)
from megapilot.suite.cluster import CvsCluster, load_cluster, resolve_user, strip_comments, substitute_user
from megapilot.suite.schema_v1 import Upgrade, is_legacy_nested, is_schema_v1, legacy_problem, upgrade_v1
from megapilot.suite.thresholds import ThresholdSpec, ThresholdTable, parse_threshold

CHANGEME = "<changeme>"
V1_READ_NOTE = ("schema v1 (Aug 2026) config: read into the Sep 2026 names (gpu_arch -> gpu_name, config -> paths / "
                "train_params / container.env, model_params -> train_params, combination ids -> "
                "MBS=..,GBS=..,PRECISION=.. keys)")
CPU_GPU_NAME = "CPU"
DEFAULT_MEGATRON_PATH = "/workspace/Megatron-LM"  # where CVS's Megatron-LM images keep the checkout
DEFAULT_PRIMUS_PATH = "/workspace/Primus"
THRESHOLD_SUFFIX = "threshold.json"
Backend = Literal["megatron-lm", "primus", "megapilot"]
ExecutorName = str  # a registered executor (megapilot.execute.registry); checked when the suite is resolved
Device = Literal["auto", "cpu", "gpu"]
# The short names CVS's earlier configs and file names use for the AMD GPUs (mi325, mi35x).
CVS_GPU_NAMES = {"MI300": "MI300X", "MI325": "MI325X", "MI355": "MI355X", "MI35X": "MI355X"}
_PLACEHOLDER = re.compile(r"\{([A-Za-z0-9_.\-]+)\}")


class _Forbid(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


# Bounds of what `suite run` uses: generous for any real suite, and a typo (10^30 iterations, a timeout of a
# million years) is refused by `suite check` instead of starting a run that cannot end.
MAX_ITERATIONS = 10_000_000
MAX_TIMEOUT_S = 30 * 24 * 3600.0  # 30 days
MAX_HANG_FACTOR = 1000.0
MAX_NODES = 100_000
MAX_GPUS_PER_NODE = 64
DEFAULT_HANG_MIN_WINDOW_S = 120.0


# ---- the CVS schema ---------------------------------------------------------------------------
class SuitePaths(_Forbid):
    hf_token_file: str
    log_dir: str
    scripts_dir: str
    data_cache_dir: str
    rocm_dir: str = ""


class RuntimeArgs(BaseModel):
    """`container.runtime.args`: the docker/podman flags CVS knows; other keys are kept for the runtime."""

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
    global_batch_size: Annotated[int | None, BeforeValidator(lambda v: None if v in ("", None) else v)] = None
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

    @model_validator(mode="after")
    def _resume_goes_past_the_save(self) -> CheckpointConfig:
        if self.resume_iters <= self.save_iters:
            raise ValueError(f"resume_iters ({self.resume_iters}) must be past save_iters ({self.save_iters}): "
                             "the resumed run has to train beyond the checkpoint")
        return self


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

    @model_validator(mode="after")
    def _sizes_in_order(self) -> CollectivesConfig:
        if self.max_bytes is not None and self.max_bytes < self.min_bytes:
            raise ValueError(f"max_bytes ({self.max_bytes}) must be at least min_bytes ({self.min_bytes})")
        return self

    def runs_on(self, device: str) -> bool:
        return device == "gpu" if self.enabled == "auto" else bool(self.enabled)

    def largest_bytes(self, device: str) -> int:
        return self.max_bytes or (2**30 if device == "gpu" else 4 * 2**20)


class Sweep(_Forbid):
    """Combination key -> overlay of train_params (checked cell by cell), and the ordered runs."""

    combinations: dict[str, dict[str, Any]] = Field(default_factory=dict)
    runs: list[str] = Field(default_factory=list)


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
    secrets: list[str] = Field(default_factory=list, description="Names of container.env / cluster env_vars "
                                                                 "variables whose values are secrets, beyond those "
                                                                 "whose names say so (TOKEN, KEY, PASSWORD...).")

    @field_validator("job_lease_s")
    @classmethod
    def _lease_long_enough(cls, lease_s: float | None) -> float | None:
        from megapilot.execute.slurm import MIN_LEASE_S

        if lease_s and lease_s < MIN_LEASE_S:
            raise ValueError(f"must be 0 (no lease) or at least {MIN_LEASE_S:g} s, long enough to renew the lease "
                             f"over a shared file system")
        return lease_s

    @field_validator("executor")
    @classmethod
    def _registered_executor(cls, name: str) -> str:
        from megapilot.execute.registry import executor_names

        if name not in executor_names():
            raise ValueError(f"unknown executor {name!r}; use one of: {', '.join(executor_names())}")
        return name


class SuiteConfig(_Forbid):
    """A CVS Megatron suite config (MegatronVariantConfig, Sep 2026) plus the `megapilot:` block."""

    gpu_name: str
    enforce_thresholds: BoolLike = True
    threshold_json: str = ""
    paths: SuitePaths
    container: ContainerSpec | None = None
    train_params: TrainParams
    verify_network_errors: BoolLike = False
    scaling_baseline: ScalingBaseline = Field(default_factory=ScalingBaseline)
    smoke: SmokeConfig = Field(default_factory=SmokeConfig)
    loss_curve: LossCurveConfig = Field(default_factory=LossCurveConfig)
    convergence: ConvergenceConfig = Field(default_factory=ConvergenceConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    sweep: Sweep = Field(default_factory=Sweep)
    regressions: RegressionsConfig = Field(default_factory=RegressionsConfig)
    straggler: StragglerConfig = Field(default_factory=StragglerConfig)
    collectives: CollectivesConfig = Field(default_factory=CollectivesConfig)
    megapilot: MegapilotBlock = Field(default_factory=MegapilotBlock)
    budget: BudgetConfig | None = Field(default=None, description="Token budget: the report projects the run onto "
                                                                  "it (megapilot.suite.budget).")


# ---- what checking and loading return -------------------------------------------------------------
class ConfigProblem(BaseModel):
    """One thing that stops the suite from running, at a dotted path of the config."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str
    message: str
    fix: str = ""


class LoadedSuite(BaseModel):
    """A suite ready to run: the config resolved, its cells built, the threshold table read."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    config: SuiteConfig
    cluster: CvsCluster | None
    config_path: Path
    cluster_path: Path | None
    thresholds: ThresholdTable
    threshold_path: Path | None
    backend: Backend
    executor: ExecutorName
    device: Literal["cpu", "gpu"]
    nodes: int
    gpus_per_node: int
    gpu: GPUSpec | None = Field(description="None for a CPU suite.")
    model: ModelSpec
    cells: list[SweepCell]
    smoke: SweepCell
    config_hash: str = Field(description="sha256 of the resolved config and thresholds, secrets left out.")
    hf_token_file: Path = Field(description="Where the token is read at run time; its content is never loaded.")

    @property
    def capabilities(self) -> Capabilities:
        """What the suite's executor can do (the suite asks this, never the executor's name)."""
        return executor_capabilities(self.executor)

    @property
    def python(self) -> str:
        """The interpreter launch scripts start: the one megapilot runs under where the nodes share this
        machine's files (preflight checks it on every node), else the nodes' python3."""
        if self.config.megapilot.python:
            return self.config.megapilot.python
        return sys.executable if self.capabilities.shares_file_system else "python3"


class SuiteCheck(BaseModel):
    """Everything `suite check` reports: problems (the suite cannot run), warnings, and the suite when it can."""

    model_config = ConfigDict(extra="forbid")

    problems: list[ConfigProblem] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
    suite: LoadedSuite | None = None

    @property
    def ok(self) -> bool:
        return not self.problems and self.suite is not None

    def add(self, path: str, message: str, fix: str = "") -> None:
        self.problems.append(ConfigProblem(path=path, message=message, fix=fix))


def load_suite(config_path: str | Path, cluster_path: str | Path | None = None) -> LoadedSuite:
    """The suite, or one MegapilotError (field `config`) listing every problem with its dotted path."""
    check = check_suite(config_path, cluster_path)
    if not check.ok:
        listed = "; ".join(f"{p.path}: {p.message}" for p in check.problems)
        raise MegapilotError(f"{len(check.problems)} problem(s) in {config_path}: {listed}", field="config",
                             fix="fix each one (`megapilot suite check` lists them with their fixes)")
    assert check.suite is not None
    return check.suite


def check_suite(config_path: str | Path, cluster_path: str | Path | None = None) -> SuiteCheck:
    """Read, resolve and validate a suite config; collect every problem instead of stopping at the first."""
    check = SuiteCheck()
    config_path = Path(config_path)
    cluster = _read_cluster(cluster_path, check)
    raw = _read_config(config_path, check)
    raw, upgrade = _in_current_schema(raw, check) if raw is not None else (None, None)
    if raw is None:
        return check
    _check_current_schema(raw, config_path, cluster, cluster_path, check)
    if upgrade is not None:  # problems name the paths the file has
        check.problems = [p.model_copy(update={"path": upgrade.original_path(p.path)}) for p in check.problems]
    return check


def _in_current_schema(raw: dict[str, Any], check: SuiteCheck) -> tuple[dict[str, Any] | None, Upgrade | None]:
    """The config in the Sep 2026 names: a schema v1 one read into them (schema_v1.py), the legacy nested form
    refused."""
    if is_legacy_nested(raw):
        message, fix = legacy_problem()
        check.add("model_params", message, fix)
        return None, None
    if not is_schema_v1(raw):
        return raw, None
    upgrade = upgrade_v1(raw)
    check.warnings.append(V1_READ_NOTE)
    check.warnings.extend(upgrade.warnings)
    return upgrade.config, upgrade


def _check_current_schema(raw: dict[str, Any], config_path: Path, cluster: CvsCluster | None,
                          cluster_path: str | Path | None, check: SuiteCheck) -> None:
    user = cluster.username if cluster is not None else resolve_user(None)
    raw = resolve_placeholders(raw, user, config_path.parent)
    _exempt_unused_checkpoint(raw)
    changeme = changeme_paths(raw)
    for path in changeme:
        check.add(path, f"still holds the placeholder {CHANGEME}", "replace it with the real value")
    raw = _drop_unknown_top_level(raw, check)
    config = _validate(raw, changeme, check)
    if config is None:
        return
    thresholds, threshold_path = _read_thresholds(config, config_path, changeme, check)
    cells = _build_cells(config, raw, check)
    _check_threshold_coverage(config, cells, thresholds, threshold_path, check)
    suite = _resolve(config, cluster, config_path, cluster_path, thresholds, threshold_path, cells, check)
    for path, message, fix in budget_problems(suite) if suite is not None else []:
        check.add(path, message, fix)
    if not check.problems:
        check.suite = suite


# ---- reading ------------------------------------------------------------------------------------
def _read_cluster(cluster_path: str | Path | None, check: SuiteCheck) -> CvsCluster | None:
    if cluster_path is None:
        return None
    try:
        return load_cluster(cluster_path)
    except MegapilotError as exc:
        check.add("cluster", exc.problem, exc.fix or "")
        return None


def _read_config(path: Path, check: SuiteCheck) -> dict[str, Any] | None:
    fix = "pass a CVS Megatron config (JSON) or the same in YAML"
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        check.add("config", f"cannot read {path} ({getattr(exc, 'strerror', None) or exc})", fix)
        return None
    duplicates: list[str] = []
    from megapilot.suite.parsing import ParseLimitError

    try:
        raw = _parse_text(text, path, duplicates)
    except ParseLimitError as exc:
        if exc.path:  # a value at a path: named like any other bad value
            check.add(exc.path, str(exc), "write a finite number")
        else:
            check.add("config", f"{path} cannot be read safely ({exc})", fix)
        return None
    except ValueError as exc:
        check.add("config", f"{path} is not valid {_format_name(path)} ({' '.join(str(exc).split())})", fix)
        return None
    if not isinstance(raw, dict):
        check.add("config", f"{path} holds a {type(raw).__name__}, not a mapping of settings", fix)
        return None
    for key in duplicates:
        check.add("config", f"key {key!r} appears more than once; only the last one would count",
                  "keep one entry per key")
    return strip_comments(raw)  # type: ignore[return-value]  # a mapping stays a mapping


def _format_name(path: Path) -> str:
    return "YAML" if path.suffix.lower() in (".yaml", ".yml") else "JSON"


def _parse_text(text: str, path: Path, duplicates: list[str]) -> Any:
    from megapilot.suite.parsing import parse_json, parse_yaml

    if _format_name(path) == "YAML":
        return parse_yaml(text)

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        for key, value in items:
            if key in seen:
                duplicates.append(key)
            seen[key] = value
        return seen

    return parse_json(text, object_pairs_hook=pairs)


# ---- substitution -------------------------------------------------------------------------------
def resolve_placeholders(raw: dict[str, Any], user: str, config_dir: Path) -> dict[str, Any]:
    """CVS's three passes: `{user-id}` everywhere; `{x}` inside `paths` from its siblings; `{paths.x}`
    everywhere. Relative `paths` values are then anchored at the config's folder."""
    raw = substitute_user(raw, user)  # type: ignore[assignment]  # a mapping stays a mapping
    paths = raw.get("paths")
    if isinstance(paths, dict):
        raw["paths"] = _anchor_relative(_resolve_within_paths(paths), config_dir)
        flat = {f"paths.{k}": v for k, v in raw["paths"].items() if isinstance(v, (str, int, float))}
        raw = _substitute(raw, {k: str(v) for k, v in flat.items()})
    return raw


def _resolve_within_paths(paths: dict[str, Any]) -> dict[str, Any]:
    for _ in range(len(paths) + 1):  # each pass resolves one more level of reference
        mapping = {k: v for k, v in paths.items() if isinstance(v, str)}
        resolved = {k: _substitute(v, mapping) for k, v in paths.items()}
        if resolved == paths:
            break
        paths = resolved
    return paths


def _substitute(node: Any, mapping: dict[str, str]) -> Any:
    if isinstance(node, str):
        return _PLACEHOLDER.sub(lambda m: mapping.get(m.group(1), m.group(0)), node)
    if isinstance(node, list):
        return [_substitute(item, mapping) for item in node]
    if isinstance(node, dict):
        return {k: _substitute(v, mapping) for k, v in node.items()}
    return node


def _anchor_relative(paths: dict[str, Any], config_dir: Path) -> dict[str, Any]:
    anchored = dict(paths)
    for key, value in paths.items():
        if isinstance(value, str) and value and CHANGEME not in value and not value.startswith(("/", "~", "{")):
            anchored[key] = str((config_dir / value).absolute())
    return anchored


def _exempt_unused_checkpoint(raw: dict[str, Any]) -> None:
    """As CVS: with checkpoint testing off, its shared directory and volume may stay unfilled."""
    checkpoint = raw.get("checkpoint")
    if isinstance(checkpoint, dict) and _as_flag(checkpoint.get("enforce", False)):
        return
    if isinstance(checkpoint, dict):
        checkpoint.pop("checkpoint_dir", None)
    args = _dig(raw, "container", "runtime", "args")
    if isinstance(args, dict) and isinstance(args.get("volumes"), list):
        args["volumes"] = [v for v in args["volumes"] if not (isinstance(v, str) and CHANGEME in v)]


def _as_flag(value: Any) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes", "on")


def _dig(node: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(node, dict):
            return None
        node = node.get(key)
    return node


def changeme_paths(node: Any, path: str = "") -> list[str]:
    """Dotted paths (list items as `[i]`) of every string still holding `<changeme>`."""
    if isinstance(node, dict):
        return [p for k, v in node.items() for p in changeme_paths(v, f"{path}.{k}" if path else str(k))]
    if isinstance(node, list):
        return [p for i, v in enumerate(node) for p in changeme_paths(v, f"{path}[{i}]")]
    if isinstance(node, str) and CHANGEME in node.lower():
        return [path]
    return []


# ---- validation ---------------------------------------------------------------------------------
def _drop_unknown_top_level(raw: dict[str, Any], check: SuiteCheck) -> dict[str, Any]:
    unknown = [k for k in raw if k not in SuiteConfig.model_fields]
    for key in unknown:
        check.warnings.append(f"{key}: not a setting of the Megatron suite; ignored (as CVS does)")
    return {k: v for k, v in raw.items() if k in SuiteConfig.model_fields}


def _validate(raw: dict[str, Any], changeme: list[str], check: SuiteCheck) -> SuiteConfig | None:
    try:
        return SuiteConfig.model_validate(raw)
    except ValidationError as exc:
        for error in exc.errors():
            path = _dotted(error["loc"])
            if any(path == c or path.startswith(c + ".") for c in changeme):
                continue  # already reported as an unfilled placeholder
            check.add(path, _message(error), _fix_of(error, path))
        return None


def _dotted(loc: tuple[Any, ...]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _fix_of(error: ErrorDetails, path: str) -> str:
    """What to do about one validation error: a missing field is added, not respelled."""
    if not path:
        return ""
    if error.get("type") == "missing":
        return f"add `{path.rsplit('.', 1)[-1]}` under `{path.rsplit('.', 1)[0]}`" if "." in path \
            else f"add `{path}` (`megapilot suite init` writes a complete config to start from)"
    return "fix the value's type or spelling"


def _message(error: ErrorDetails) -> str:
    message = str(error.get("msg", "invalid")).removeprefix("Value error, ")
    if error.get("type") == "extra_forbidden":
        return "not a known setting here"
    if "input" in error and error.get("type") != "missing" and "got " not in message:
        return f"{message} (got {_short_repr(error['input'])})"
    return message


def _short_repr(value: Any) -> str:
    """The offending value, cut short: a message names it, it does not reprint a huge one."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# ---- thresholds ---------------------------------------------------------------------------------
def _read_thresholds(config: SuiteConfig, config_path: Path, changeme: list[str],
                     check: SuiteCheck) -> tuple[ThresholdTable, Path | None]:
    if "threshold_json" in changeme:
        return {}, None
    path = _threshold_file(config, config_path, check)
    if path is None:
        return {}, None
    from megapilot.suite.parsing import parse_json

    try:
        raw = parse_json(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        check.add("threshold_json", f"cannot read {path} ({' '.join(str(exc).split())}){_trailing_comma(exc)}",
                  "point threshold_json at a JSON threshold file")
        return {}, path
    if not isinstance(raw, dict):
        check.add("threshold_json", f"{path} does not hold a mapping of cells", "write cell key -> metric -> spec")
        return {}, path
    return _threshold_table(raw, check), path


def _trailing_comma(exc: Exception) -> str:
    """A hint where JSON stopped at a comma before a closing brace or bracket (some CVS threshold files have one)."""
    if not isinstance(exc, json.JSONDecodeError):
        return ""
    before = exc.doc[:exc.pos].rstrip()
    if before.endswith(",") and exc.doc[exc.pos:exc.pos + 1] in "}]":
        line = exc.doc.count("\n", 0, len(before) - 1) + 1
        return f": the comma ending line {line} comes before a closing bracket, which JSON does not allow"
    return ""


def _threshold_file(config: SuiteConfig, config_path: Path, check: SuiteCheck) -> Path | None:
    folder = config_path.parent
    if config.threshold_json:
        path = Path(config.threshold_json).expanduser()
        path = path if path.is_absolute() else folder / path
        if not path.is_file():
            check.add("threshold_json", f"{path} does not exist",
                      "point threshold_json at the threshold file (relative to the config's folder)")
            return None
        return path
    candidates = sorted(folder.glob(f"*{THRESHOLD_SUFFIX}"))
    if len(candidates) > 1:
        names = ", ".join(p.name for p in candidates)
        check.add("threshold_json", f"empty, and several threshold files sit next to the config: {names}",
                  "name the one to use in threshold_json")
        return None
    if not candidates:
        message = "empty, and no *threshold.json sits next to the config"
        if config.enforce_thresholds:
            check.add("threshold_json", message, "add a threshold file, or set enforce_thresholds: false")
        else:
            check.warnings.append(f"threshold_json: {message}; every metric is recorded, none gated")
        return None
    return candidates[0]


def _threshold_table(raw: dict[str, Any], check: SuiteCheck) -> ThresholdTable:
    table: ThresholdTable = {}
    for cell, metrics in raw.items():
        if cell.startswith("_"):
            continue
        if not isinstance(metrics, dict):
            check.add(f"thresholds.{cell}", "a threshold cell must map metric names to specs",
                      '{"training.tokens_per_gpu": {"kind": "min", "value": 1000}}')
            continue
        specs: dict[str, ThresholdSpec] = {}
        for metric, spec in metrics.items():
            if metric.startswith("_"):
                continue
            try:
                specs[metric] = parse_threshold(spec)
            except ValueError as exc:
                check.add(f"thresholds.{cell}.{metric}", str(exc),
                          "use kind min/min_tok_s/max/max_ms/within/min_ratio/info/baseline with its fields")
        table[_canonical_key(cell)] = specs
    return table


def _canonical_key(key: str) -> str:
    try:
        return parse_cell_key(key).key
    except ValueError:
        return key


# ---- cells --------------------------------------------------------------------------------------
_KEY_FIELDS = (("micro_batch_size", "mbs"), ("global_batch_size", "gbs"), ("precision", "precision"))


def _build_cells(config: SuiteConfig, raw: dict[str, Any], check: SuiteCheck) -> list[tuple[str, TrainParams]]:
    """(canonical key, merged params) of every run, in run order; problems for every bad key or overlay."""
    sweep = config.sweep
    if not sweep.combinations and not sweep.runs:
        return [(DEFAULT_CELL_KEY, config.train_params)]
    merged = _combinations(config, check)
    if sweep.combinations and not sweep.runs:
        check.add("sweep.runs", "combinations are given but no runs select them",
                  "list the combination keys to run, in order, under sweep.runs")
    cells: list[tuple[str, TrainParams]] = []
    for index, run in enumerate(sweep.runs):
        if run not in sweep.combinations:
            known = ", ".join(sweep.combinations) or "none"
            check.add(f"sweep.runs[{index}]", f"{run!r} is not a key of sweep.combinations",
                      f"use one of: {known}")
        elif run in merged:
            cells.append(merged[run])
    seen = [key for key, _ in cells]
    for key in sorted({k for k in seen if seen.count(k) > 1}):
        check.warnings.append(f"sweep.runs: {key} is listed more than once; it runs once per listing")
    return cells


def _combinations(config: SuiteConfig, check: SuiteCheck) -> dict[str, tuple[str, TrainParams]]:
    merged: dict[str, tuple[str, TrainParams]] = {}
    canonical_seen: dict[str, str] = {}
    base = config.train_params.model_dump()
    for raw_key, overlay in config.sweep.combinations.items():
        where = f"sweep.combinations.{raw_key}"
        try:
            key = _combination_key(raw_key, overlay)
        except ValueError as exc:
            check.add(where, str(exc), "write the key as MBS=<mbs>,GBS=<gbs>,PRECISION=<precision>, or give "
                                       "the body micro_batch_size, global_batch_size and precision")
            continue
        if key.key in canonical_seen:
            check.add(where, f"the same cell as {canonical_seen[key.key]!r}", "keep one combination per cell")
            continue
        canonical_seen[key.key] = raw_key
        if not _overlay_agrees(key, overlay, where, check):
            continue
        params = _merge(base, overlay, {"micro_batch_size": key.mbs, "global_batch_size": key.gbs,
                                        "precision": key.precision}, where, check)
        if params is not None:
            merged[raw_key] = (key.key, params)
    return merged


def _combination_key(raw_key: str, overlay: dict[str, Any]) -> CellKey:
    """The cell of a combination: its `MBS=..,GBS=..,PRECISION=..` key, or, for a free-form id whose body names all
    three fields, the cell the body names, as CVS's loader derived the threshold key (`MegatronVariantConfig.cell_key()`
    at ROCm/cvs 15ea03dd, the form its mi355x files still use: `"llama3_1_8b-mi355x-bs128-mbs4-fp8": {"name": ..,
    "micro_batch_size": "4", ...}`). ValueError (the key's own) when neither gives one."""
    try:
        return parse_cell_key(raw_key)
    except ValueError:
        values = [overlay.get(field) for field, _ in _KEY_FIELDS]
        if any(value is None for value in values):
            raise
        return parse_cell_key("MBS={},GBS={},PRECISION={}".format(*(str(v).strip() for v in values)))


def _overlay_agrees(key: Any, overlay: dict[str, Any], where: str, check: SuiteCheck) -> bool:
    agrees = True
    for field, attribute in _KEY_FIELDS:
        if field not in overlay:
            continue
        expected = getattr(key, attribute)
        given = str(overlay[field]).strip()
        given = _precision_or_self(given) if field == "precision" else given
        if given != str(expected):
            check.add(f"{where}.{field}", f"{overlay[field]!r} disagrees with the key ({expected})",
                      "make the body match the key, or drop it from the body")
            agrees = False
    return agrees


def _precision_or_self(text: str) -> str:
    """The precision's canonical name (`te_fp8` -> FP8), or the text as given when it names none."""
    try:
        return normalise_precision(text)
    except ValueError:
        return text.upper()


def _merge(base: dict[str, Any], overlay: dict[str, Any], from_key: dict[str, Any], where: str,
           check: SuiteCheck) -> TrainParams | None:
    try:
        return TrainParams.model_validate({**base, **overlay, **from_key})
    except ValidationError as exc:
        for error in exc.errors():
            field = _dotted(error["loc"])
            path = f"{where}.{field}" if field in overlay else f"train_params.{field}"
            check.add(path, _message(error), "fix the value's type")
        return None


def _check_threshold_coverage(config: SuiteConfig, cells: list[tuple[str, TrainParams]],
                              thresholds: ThresholdTable, threshold_path: Path | None, check: SuiteCheck) -> None:
    """CVS's rule: every run cell has a threshold cell and every threshold cell a run (warnings when not
    enforced)."""
    if threshold_path is None:
        return
    run_keys = {key for key, _ in cells}
    name = threshold_path.name
    findings = [(f"thresholds.{key}", f"run cell {key} has no threshold cell in {name}",
                 f"add a {key!r} cell to {name}") for key in sorted(run_keys - set(thresholds))]
    findings += [(f"thresholds.{key}", f"threshold cell {key} in {name} matches no run",
                  "fix the key's spelling, add the cell to sweep.runs, or remove it")
                 for key in sorted(set(thresholds) - run_keys)]
    for path, message, fix in findings:
        if config.enforce_thresholds:
            check.add(path, message, fix)
        else:
            check.warnings.append(f"{path}: {message} (enforce_thresholds false: recorded only)")


# ---- resolution: model, GPU, backend, executor, shape ----------------------------------------------------
def _resolve(config: SuiteConfig, cluster: CvsCluster | None, config_path: Path, cluster_path: str | Path | None,
             thresholds: ThresholdTable, threshold_path: Path | None, cells: list[tuple[str, TrainParams]],
             check: SuiteCheck) -> LoadedSuite | None:
    block = config.megapilot
    gpu, device = _resolve_device(config, check)
    model = _resolve_model(config, config_path.parent, check)
    nodes = _resolve_nodes(block, cluster, check)
    try:
        capabilities = executor_capabilities(block.executor)
    except MegapilotError as exc:
        check.add("megapilot.executor", exc.problem, exc.fix or "")
        return None
    if capabilities.needs_node_list and cluster is None:
        check.add("megapilot.executor", f"the {block.executor} executor needs the nodes of a cluster file",
                  "pass --cluster cluster.json (`megapilot suite init --executor ssh` writes one to fill in)")
    if not capabilities.multi_node and nodes > 1:
        check.warnings.append(f"megapilot.nodes: the {block.executor} executor runs one node, not {nodes}; its jobs "
                              "would be refused (a dry run still shows them)")
    if config.container is not None and "NNODES" in config.container.env:
        check.warnings.append("container.env.NNODES: set from the node count at run time; this value is ignored")
    if model is None or device is None:
        return None
    per_node = block.gpus_per_node or (_default_gpus_per_node(gpu) if gpu is not None else 1)
    built = _sweep_cells(cells, gpu, nodes)
    smoke = config.smoke
    return LoadedSuite(
        config=config, cluster=cluster, config_path=config_path.absolute(),
        cluster_path=Path(cluster_path).absolute() if cluster_path is not None else None,
        thresholds=thresholds, threshold_path=threshold_path, backend=_resolve_backend(config),
        executor=block.executor, device=device, nodes=nodes, gpus_per_node=per_node, gpu=gpu, model=model,
        cells=built,
        smoke=smoke_cell(config.train_params, iters=smoke.iters, mbs=smoke.micro_batch_size,
                         gbs=smoke.global_batch_size, precision=smoke.precision, gpu=gpu, nodes=nodes),
        config_hash=config_hash(config, thresholds), hf_token_file=Path(config.paths.hf_token_file),
    )


def _sweep_cells(cells: list[tuple[str, TrainParams]], gpu: GPUSpec | None, nodes: int) -> list[SweepCell]:
    built = []
    for key, params in cells:
        if key == DEFAULT_CELL_KEY:
            built.append(default_cell(params, gpu, nodes))
        else:
            built.append(sweep_cell(parse_cell_key(key), params, gpu))
    return built


def _resolve_device(config: SuiteConfig, check: SuiteCheck) -> tuple[GPUSpec | None, Literal["cpu", "gpu"] | None]:
    """(GPU or None for CPUs, device). gpu_name CPU means a CPU suite; `auto` follows gpu_name."""
    requested = config.megapilot.device
    if config.gpu_name.strip().upper() == CPU_GPU_NAME:
        if requested == "gpu":
            check.add("megapilot.device", "gpu_name is CPU but the device is gpu",
                      "name the GPU in gpu_name, or set device cpu")
            return None, None
        return None, "cpu"
    from megapilot.catalog.gpus import get_gpu

    name = config.gpu_name.strip().upper()
    try:
        gpu = get_gpu(CVS_GPU_NAMES.get(name, name))
    except MegapilotError as exc:
        check.add("gpu_name", exc.problem, f"{exc.fix}, or CPU with megapilot.device cpu")
        return None, None
    if requested == "cpu":
        return None, "cpu"
    return gpu, "gpu"


def _default_gpus_per_node(gpu: GPUSpec) -> int:
    from megapilot.spec import default_gpus_per_node

    return default_gpus_per_node(gpu)


def _resolve_model(config: SuiteConfig, config_dir: Path, check: SuiteCheck) -> ModelSpec | None:
    from megapilot.catalog import get_model, get_preset

    params = config.train_params
    if config.megapilot.model:
        text = config.megapilot.model
        looks_like_path = "/" in text or text.endswith((".json", ".yaml", ".yml"))
        target = str(config_dir / text) if looks_like_path and not Path(text).expanduser().is_absolute() else text
        try:
            return get_model(target)
        except MegapilotError as exc:
            check.add("megapilot.model", exc.problem, exc.fix or "")
            return None
    for candidate in (params.model_name, f"{params.model_name}-{params.model_size}b"):
        preset = get_preset(candidate)
        if preset is not None:
            return preset.spec
    guessed = _preset_from_names(params.model_name, params.tokenizer_model)
    if guessed is not None:
        check.warnings.append(f"train_params: {params.model_name!r} read as the {guessed.spec.name} preset "
                              f"(tokenizer_model {params.tokenizer_model!r}); set megapilot.model to choose another")
        return guessed.spec
    check.add("train_params.model_name", f"{params.model_name!r} (size {params.model_size or '?'}) names no model "
              "megapilot knows", "set megapilot.model to a preset (`megapilot models`), a Hugging Face config.json "
              "or a ModelSpec file")
    return None


def _preset_from_names(model_name: str | None, tokenizer_model: str | None) -> ModelPreset | None:
    """CVS names models loosely (`qwen3_30B`) but gives the HF repository of the tokenizer, which is the model's
    own for most: the preset read from that repository's config.json, else the one preset the name begins."""
    from megapilot.catalog import preset_by_unique_prefix, preset_of_hub_repo

    if tokenizer_model:
        preset = preset_of_hub_repo(tokenizer_model.strip())
        if preset is not None:
            return preset
    return preset_by_unique_prefix(model_name) if model_name else None


def _resolve_nodes(block: MegapilotBlock, cluster: CvsCluster | None, check: SuiteCheck) -> int:
    if block.nodes is None:
        return cluster.node_count if cluster is not None else 1
    if cluster is not None and cluster.node_count != block.nodes:
        check.warnings.append(f"megapilot.nodes is {block.nodes} but the cluster file lists {cluster.node_count} "
                              f"nodes; {block.nodes} are used")
    return block.nodes


def _resolve_backend(config: SuiteConfig) -> Backend:
    """megapilot.backend, else CVS's rule: an image naming primus runs Primus, any other image Megatron-LM;
    no image with the local executor runs the embedded trainer."""
    if config.megapilot.backend is not None:
        return config.megapilot.backend
    image = config.container.image if config.container is not None else ""
    if "primus" in image.lower():
        return "primus"
    if not image and executor_capabilities(config.megapilot.executor).runs_here:
        return "megapilot"
    return "megatron-lm"


def config_hash(config: SuiteConfig, thresholds: ThresholdTable) -> str:
    """sha256 over the resolved config and thresholds; the token file path and secret-named env left out."""
    data = config.model_dump(mode="json")
    data["paths"].pop("hf_token_file", None)
    if data.get("container"):
        named = set(config.megapilot.secrets)
        data["container"]["env"] = {k: v for k, v in data["container"]["env"].items()
                                    if not (k in named or is_secret_name(k))}
    data["_thresholds"] = {cell: {m: s.model_dump(mode="json") for m, s in specs.items()}
                           for cell, specs in thresholds.items()}
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def describe_hang_window(block: MegapilotBlock) -> str:
    """The hang rule a suite's jobs run under, each number with where it came from (the config or the default)."""
    def origin(name: str) -> str:
        return "config" if name in block.model_fields_set else "default"

    floor_s = min(block.hang_min_window_s, block.startup_timeout_s)
    return (f"hang window: {block.startup_timeout_s:g} s before the first iteration (megapilot.startup_timeout_s, "
            f"{origin('startup_timeout_s')}); then {block.hang_factor:g} x the observed step time "
            f"(megapilot.hang_factor, {origin('hang_factor')}), at least {floor_s:g} s "
            f"(megapilot.hang_min_window_s, {origin('hang_min_window_s')})")


def is_secret_name(name: str) -> bool:
    """Environment names that hold credentials: never rendered, logged or stored (megapilot.suite.secrets)."""
    from megapilot.suite.secrets import is_secret_name as secret_name

    return secret_name(name)


__all__ = [
    "Backend", "CheckpointConfig", "ConfigProblem", "ContainerSpec", "ConvergenceConfig", "LoadedSuite",
    "LossCurveConfig", "MegapilotBlock", "ScalingBaseline", "SmokeConfig", "SuiteCheck", "SuiteConfig",
    "SuitePaths", "Sweep", "changeme_paths", "check_suite", "config_hash", "describe_hang_window", "is_secret_name",
    "load_suite",
    "resolve_placeholders",
]
