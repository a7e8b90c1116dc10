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
import math
import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from megapilot.catalog import ModelPreset, get_model, get_preset, preset_by_unique_prefix, preset_of_hub_repo
from megapilot.catalog.gpus import get_gpu
from megapilot.errors import MegapilotError
from megapilot.execute.base import Capabilities
from megapilot.execute.registry import capabilities as executor_capabilities
from megapilot.spec import GPUSpec, ModelSpec, default_gpus_per_node
from megapilot.spec.plan_file import looks_like_saved_plan
from megapilot.suite.budget import BudgetConfig, budget_problems
from megapilot.suite.cells import (
    BoolLike,
    SweepCell,
    TrainParams,
    smoke_cell,
)
from megapilot.suite.cluster import CvsCluster, resolve_user
from megapilot.suite.config_read import (
    CHANGEME,
    _dotted,
    _exempt_unused_checkpoint,
    _fix_of,
    _message,
    _read_cluster,
    _read_config,
    changeme_paths,
    near_key,
    resolve_placeholders,
    section_keys,
    unknown_key,
    unset_path_variables,
)
from megapilot.suite.config_schema import (
    CheckpointConfig,
    CollectivesConfig,
    ContainerSpec,
    ConvergenceConfig,
    LossCurveConfig,
    RegressionsConfig,
    RuntimeArgs,
    ScalingBaseline,
    SmokeConfig,
    StragglerConfig,
    SuitePaths,
    Sweep,
    _Forbid,
)
from megapilot.suite.config_sweep import (
    _build_cells,
    _check_param_keys,
    _check_threshold_coverage,
    _read_thresholds,
    _sweep_cells,
    check_peak_bounds,
    cpu_gate_warnings,
)
from megapilot.suite.megapilot_block import Backend, ExecutorName, MegapilotBlock, describe_hang_window
from megapilot.suite.schema_v1 import Upgrade, is_legacy_nested, is_schema_v1, legacy_problem, upgrade_v1
from megapilot.suite.secrets import is_secret_name as secret_name
from megapilot.suite.thresholds import ThresholdTable

V1_READ_NOTE = ("schema v1 (Aug 2026) config: read into the Sep 2026 names (gpu_arch -> gpu_name, config -> paths / "
                "train_params / container.env, model_params -> train_params, combination ids -> "
                "MBS=..,GBS=..,PRECISION=.. keys)")
CPU_GPU_NAME = "CPU"
# The short names CVS's earlier configs and file names use for the AMD GPUs (mi325, mi35x).
CVS_GPU_NAMES = {"MI300": "MI300X", "MI325": "MI325X", "MI355": "MI355X", "MI35X": "MI355X"}


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
    def runs_in_image(self) -> bool:
        """Whether the jobs run inside container.image: in a container megapilot starts on each node (not for
        the embedded trainer, which runs in this Python environment), or one the launch script starts (SLURM:
        pyxis/enroot --container-image)."""
        container = self.config.container
        if container is None or not container.image:
            return False
        return self.backend != "megapilot" or not self.capabilities.starts_containers

    @property
    def python(self) -> str:
        """The interpreter launch scripts start: the image's python3 when the jobs run in the container image;
        else the one megapilot runs under where the nodes share this machine's files (preflight checks it on
        every node), else the nodes' python3."""
        if self.config.megapilot.python:
            return self.config.megapilot.python
        if self.runs_in_image:
            return "python3"
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
    if looks_like_saved_plan(raw):  # not a suite's keys at all: one line, not one per missing field
        check.add("config", "this is a saved plan (`megapilot plan --save`), not a suite config",
                  "start a suite with `megapilot suite init`; run the plan itself with `megapilot run --plan FILE`")
        return None, None
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
    for path, variable in unset_path_variables(raw):
        check.add(path, f"{variable} is not set in this environment (megapilot expands ~ and environment variables "
                  "in paths as a shell would)", f"export {variable.strip('${}')} before running megapilot, or write "
                  "the path out")
    _exempt_unused_checkpoint(raw)
    changeme = changeme_paths(raw)
    for path in changeme:
        check.add(path, f"still holds the placeholder {CHANGEME}", "replace it with the real value")
    raw = _drop_unknown_top_level(raw, check)
    _check_param_keys(raw, check)
    config = _validate(raw, changeme, check)
    if config is None:
        return
    _warn_unpassed_runtime_args(config, check)
    thresholds, threshold_path = _read_thresholds(config, config_path, changeme, check)
    cells = _build_cells(config, raw, check)
    _check_threshold_coverage(config, cells, thresholds, threshold_path, check)
    suite = _resolve(config, cluster, config_path, cluster_path, thresholds, threshold_path, cells, check)
    if suite is not None and suite.device == "cpu":
        check.warnings += cpu_gate_warnings(suite.thresholds)
    if suite is not None:
        check_peak_bounds(suite, check)
    for path, message, fix in budget_problems(suite) if suite is not None else []:
        check.add(path, message, fix)
    if not check.problems:
        check.suite = suite


# ---- validation ---------------------------------------------------------------------------------
def _drop_unknown_top_level(raw: dict[str, Any], check: SuiteCheck) -> dict[str, Any]:
    """CVS files carry keys of their own, kept out with a warning; a slip of a known key (`sweeps`, `smoek`) is a
    problem, since its section would silently fall back to the defaults."""
    known = list(SuiteConfig.model_fields)
    for key in (k for k in raw if k not in SuiteConfig.model_fields):
        if near_key(key, known) is not None:
            check.add(key, *unknown_key(key, known))
        else:
            check.warnings.append(f"{key}: not a setting of the Megatron suite; ignored (as CVS does)")
    return {k: v for k, v in raw.items() if k in SuiteConfig.model_fields}


def _warn_unpassed_runtime_args(config: SuiteConfig, check: SuiteCheck) -> None:
    """A `container.runtime.args` key the container is started without (megapilot passes RuntimeArgs' own fields):
    a warning naming it, so `gpus: all` or `shm_size` is not lost without a word."""
    if config.container is None:
        return
    passed = list(RuntimeArgs.model_fields)
    for key in config.container.runtime.args.model_extra or {}:
        near = near_key(key, passed)
        check.warnings.append(
            f"container.runtime.args.{key}: not passed to `{config.container.runtime.name} run`; ignored — fix: "
            + (f"rename it to {near}" if near else f"megapilot passes {', '.join(passed)}; remove it, or add the "
                                                   "flag to the image or the cluster"))


def _validate(raw: dict[str, Any], changeme: list[str], check: SuiteCheck) -> SuiteConfig | None:
    try:
        return SuiteConfig.model_validate(raw)
    except ValidationError as exc:
        for error in exc.errors():
            path = _dotted(error["loc"])
            if any(path == c or path.startswith(c + ".") for c in changeme):
                continue  # already reported as an unfilled placeholder
            known = section_keys(SuiteConfig, error["loc"][:-1]) if error["type"] == "extra_forbidden" else []
            check.add(path, _message(error, known), _fix_of(error, path, known))
        return None


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
    _check_replica_size(config, cells, nodes, per_node, node_source=_node_source(block, cluster),
                        unit="GPUs" if device == "gpu" else "ranks", check=check)
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


def _resolve_device(config: SuiteConfig, check: SuiteCheck) -> tuple[GPUSpec | None, Literal["cpu", "gpu"] | None]:
    """(GPU or None for CPUs, device). gpu_name CPU means a CPU suite; `auto` follows gpu_name."""
    requested = config.megapilot.device
    if config.gpu_name.strip().upper() == CPU_GPU_NAME:
        if requested == "gpu":
            check.add("megapilot.device", "gpu_name is CPU but the device is gpu",
                      "name the GPU in gpu_name, or set device cpu")
            return None, None
        return None, "cpu"
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
    return default_gpus_per_node(gpu)


def _resolve_model(config: SuiteConfig, config_dir: Path, check: SuiteCheck) -> ModelSpec | None:
    params = config.train_params
    if config.megapilot.model:
        text = config.megapilot.model
        looks_like_path = "/" in text or text.endswith((".json", ".yaml", ".yml"))
        target = str(config_dir / text) if looks_like_path and not Path(text).expanduser().is_absolute() else text
        try:
            model = get_model(target)
        except MegapilotError as exc:
            check.add("megapilot.model", exc.problem, exc.fix or "")
            return None
        named = _preset_of_params(params)
        if named is not None and named.spec.name != model.name:
            check.warnings.append(f"train_params.model_name: {params.model_name!r} names the {named.spec.name} preset, "
                                  f"but megapilot.model trains {model.name}; model_name is only a label here — fix: "
                                  "make the two name one model")
        return model
    preset = _preset_of_params(params)
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


def _preset_of_params(params: TrainParams) -> ModelPreset | None:
    """The preset train_params names exactly: model_name, or model_name-<model_size>b."""
    for candidate in (params.model_name, f"{params.model_name}-{params.model_size}b"):
        preset = get_preset(candidate)
        if preset is not None:
            return preset
    return None


def _preset_from_names(model_name: str | None, tokenizer_model: str | None) -> ModelPreset | None:
    """CVS names models loosely (`qwen3_30B`) but gives the HF repository of the tokenizer, which is the model's
    own for most: the preset read from that repository's config.json, else the one preset the name begins."""
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


def _node_source(block: MegapilotBlock, cluster: CvsCluster | None) -> tuple[str, str]:
    """(where the node count comes from, how to change it), as a problem about the count says them."""
    if block.nodes is not None:
        return f"megapilot.nodes is {block.nodes}", "set megapilot.nodes to a multiple of {need}"
    if cluster is not None:
        return f"the cluster file lists {cluster.node_count}", "list a multiple of {need} nodes in the cluster file"
    return "no cluster file: 1", "pass --cluster with a cluster file of a multiple of {need} nodes"


_REPLICA_FIELDS = ("tensor_parallelism", "pipeline_parallelism", "context_parallelism")


def _check_replica_size(config: SuiteConfig, cells: list[tuple[str, TrainParams]], nodes: int, per_node: int, *,
                        node_source: tuple[str, str], unit: str, check: SuiteCheck) -> None:
    """TP x PP x CP of every cell (the smoke run's are train_params') must divide the suite's GPUs: once for
    train_params, once for each combination that sets its own, naming the fields and the node count they came from
    (each cell's launch would refuse it otherwise, as many times as there are cells, without saying why the GPU count
    is what it is)."""
    gpus = nodes * per_node
    said: set[tuple[int, ...]] = set()
    base = tuple(getattr(config.train_params, name) for name in _REPLICA_FIELDS)
    for key, params in [("", config.train_params), *cells]:
        sizes = tuple(getattr(params, name) for name in _REPLICA_FIELDS)
        replica = math.prod(sizes)
        if gpus % replica == 0 or sizes in said:
            continue
        said.add(sizes)
        path = "train_params" if sizes == base else f"cells.{key}"
        factors = " x ".join(f"{name} {size}" for name, size in zip(_REPLICA_FIELDS, sizes, strict=True))
        where, change = node_source
        need = math.lcm(per_node, replica) // per_node
        check.add(path, f"{factors} = {replica} {unit} per model replica does not divide the suite's {gpus} {unit} "
                        f"({where} node(s) x {per_node} {unit})",
                  f"{change.format(need=need)}, or choose {', '.join(_REPLICA_FIELDS)} whose product divides {gpus}")


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


def is_secret_name(name: str) -> bool:
    """Environment names that hold credentials: never rendered, logged or stored (megapilot.suite.secrets)."""
    return secret_name(name)


__all__ = [
    "Backend", "CheckpointConfig", "CollectivesConfig", "ConfigProblem", "ContainerSpec", "ConvergenceConfig",
    "LoadedSuite", "LossCurveConfig", "MegapilotBlock", "ScalingBaseline", "SmokeConfig", "SuiteCheck", "SuiteConfig",
    "SuitePaths", "Sweep", "changeme_paths", "check_suite", "config_hash", "describe_hang_window", "is_secret_name",
    "load_suite", "resolve_placeholders",
]
