"""One sweep cell -> its checked launch: CVS train_params -> megapilot specs -> SavedPlan -> render_launch.

    launch = render_cell(suite, cell, job_dir=run_dir / cell.slug)
    launch.script_text, launch.megatron_args, launch.plan (for the estimator)

Mapping: ModelSpec from the suite; TrainingSpec from seq length, GBS, precision and iterations;
ParallelConfig from TP, PP, recompute (`1` = full recompute, `0` = none), FSDP, and megapilot's own
`context_parallelism` / `expert_parallelism` / `virtual_pipeline_parallelism` keys (CVS's schema has none), with
DP derived from nodes x GPUs per node, and the layer split a PP that does not divide the layers needs
(`pipeline_split`: Llama 3.1 405B's 126 layers on PP 4 run 31 + 32 + 32 + 31). Backend and executor pick the
launch: the embedded trainer (`megapilot`, `--cpu` on a CPU suite, mock data unless `megapilot.data_path`),
Megatron-LM's pretrain_gpt.py under
`megatron_path`, or the Primus launcher; the executor's capabilities say which script (an sbatch script
asking for what its `LaunchRequest` says, or a torchrun script). Paths must exist here only for an
executor whose jobs run here, without a container (anything else runs where those paths live).

A cell that cannot run (precision the GPU lacks) or cannot be rendered (a layout that does not fill the
GPUs, a flag Megatron would refuse) comes back with `skipped` or `error` set; it never raises, so the
other cells still render. The release is the suite's, not a cell's: `render_cells` checks it once before any
cell (`check_release`) and raises, rather than hand back the same error in every cell.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, get_args

from pydantic import BaseModel, ConfigDict, Field

from megapilot.catalog.gpus import get_gpu
from megapilot.errors import MegapilotError
from megapilot.estimate import count_params
from megapilot.execute.base import LaunchRequest
from megapilot.launch import LaunchOptions, render_launch
from megapilot.launch.flags import LauncherCannotRun
from megapilot.launch.megatron_args import ReleaseNames
from megapilot.launch.versions import resolve_flag_table
from megapilot.plan.space import pipeline_splits
from megapilot.spec import ClusterSpec, SavedPlan, TrainingSpec, validate_layout
from megapilot.spec.pipeline import EVEN_SPLIT, PipelineSplit
from megapilot.spec.training import PRECISIONS, Precision
from megapilot.suite.cells import SweepCell
from megapilot.suite.config import Backend, LoadedSuite, is_secret_name

if TYPE_CHECKING:
    from megapilot.execute.base import LaunchRequest
    from megapilot.launch import LaunchOptions

CPU_STAND_IN_GPU = "h100"  # a CPU plan still needs a GPUSpec; its peaks are never used for a CPU run
SCRIPT_NAME = "launch.sh"
PRIMUS_EXPERIMENT_NAME = "primus_experiment.yaml"
CONFIG_VERSION_KEY = "megapilot.megatron_version"
CONFIG_PATH_KEY = "megapilot.megatron_path"


def suite_release_names(version_from: str = CONFIG_VERSION_KEY) -> ReleaseNames:
    """How a suite takes the release (--megatron-version or its config's key; `version_from`: the one this suite's
    came from), the checkout and the entry point (its config's keys alone): never `megapilot script`'s options."""
    return ReleaseNames(
        pick=f"pass one of those to --megatron-version or set {CONFIG_VERSION_KEY} to it",
        checkout=f"with backend megatron-lm, set {CONFIG_PATH_KEY} to /abs/Megatron-LM", version=version_from,
        path=CONFIG_PATH_KEY, no_checkout=f"set {CONFIG_PATH_KEY} to /abs/Megatron-LM (or megapilot.backend megapilot)",
        megatron_entrypoint=f"set megapilot.backend to megatron-lm (with {CONFIG_PATH_KEY})")


SUITE_RELEASE_NAMES = suite_release_names()


class CellLaunch(BaseModel):
    """A cell's launch, or why there is none."""

    model_config = ConfigDict(extra="forbid")

    key: str
    slug: str
    backend: Backend
    skipped: str | None = Field(default=None, description="Why the cell does not run (not a failure).")
    error: str | None = Field(default=None, description="Why the cell cannot be rendered (a config problem).")
    nodes: int
    gpus_per_node: int
    megatron_args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict, description="Variables of the job; no secrets.")
    command: str = Field(default="", description="One-line, shell-quoted summary of what runs.")
    script_text: str = ""
    files: dict[str, str] = Field(default_factory=dict, description="Extra files (Primus experiment YAML).")
    plan: SavedPlan | None = None
    notes: list[str] = Field(default_factory=list)

    @property
    def runnable(self) -> bool:
        return self.skipped is None and self.error is None


def render_cell(suite: LoadedSuite, cell: SweepCell, *, job_dir: Path, train_iters: int | None = None,
                save_dir: str | None = None, save_interval: int | None = None,
                load_dir: str | None = None, load_step: int | None = None,
                request: LaunchRequest | None = None, master_port: int | None = None) -> CellLaunch:
    """Render `cell` for `suite` into a launch whose files go under `job_dir` (the job is named after that
    directory: smoke, checkpoint-save, a combo's slug). `request`: what the executor asks its scheduler for
    (None: what its capabilities imply, GPUs per node for a GPU suite)."""
    base = CellLaunch(key=cell.key, slug=cell.slug, backend=suite.backend, nodes=suite.nodes,
                      gpus_per_node=suite.gpus_per_node)
    if cell.skip_reason:
        return base.model_copy(update={"skipped": cell.skip_reason})
    try:
        plan = build_plan(suite, cell, train_iters=train_iters)
        options = launch_options(suite, cell, job_dir=job_dir, save_dir=save_dir, save_interval=save_interval,
                                 load_dir=load_dir, load_step=load_step, request=request, master_port=master_port)
        resolve_flag_table(options, SUITE_RELEASE_NAMES)  # the release first: one without a table, in the suite's words
        launch = render_launch(plan, options, SUITE_RELEASE_NAMES)
    except LauncherCannotRun as exc:  # this backend cannot train the cell at all: skipped, the others run
        return base.model_copy(update={"skipped": f"the {suite.backend} backend cannot run it: {exc.problem}"})
    except (MegapilotError, ValueError) as exc:  # ValueError: a spec refusing the merged values
        return base.model_copy(update={"error": " ".join(str(exc).split())})
    return base.model_copy(update={
        "megatron_args": launch.megatron_args, "env": _job_env(suite, launch.env), "script_text": launch.script,
        "command": _command(suite, options, launch.megatron_args, job_dir), "files": launch.files, "plan": plan,
        "notes": _notes(suite) + launch.notes,
    })


def check_release(suite: LoadedSuite, names: ReleaseNames = SUITE_RELEASE_NAMES) -> None:
    """The release every cell's launch is checked against, resolved once for the suite (the release and the checkout
    are the suite's, not a cell's): a release without a flag table, a checkout that is none or is of another release
    is refused here, in the words of `names`, rather than once in each cell's render."""
    try:
        options = launch_options(suite, suite.smoke, job_dir=Path(suite.smoke.slug))
    except (MegapilotError, ValueError):  # not about the release: each cell's render reports it
        return
    resolve_flag_table(options, names)


def render_cells(suite: LoadedSuite, run_dir: Path, *, with_smoke: bool = True) -> list[CellLaunch]:
    """The smoke cell (when enabled) and every sweep cell, each under `run_dir/<slug>`.

    Raises MegapilotError, once, for a release without a flag table or a checkout that is none or is of another
    release (`check_release`): every cell would carry it as its error otherwise."""
    check_release(suite)
    cells = ([suite.smoke] if with_smoke and suite.config.smoke.enabled else []) + suite.cells
    return [render_cell(suite, cell, job_dir=run_dir / cell.slug) for cell in cells]


@dataclass(frozen=True)
class CheckpointJob:
    """One of the checkpoint stage's two jobs, as `render_cell` takes it: the save run, or the run resumed from it
    (the real stage and the dry run both render these, so what the dry run shows is what the stage submits)."""

    directory: str  # its job directory and job name: checkpoint-save, checkpoint-resume
    train_iters: int
    save_dir: str
    save_interval: int
    load_dir: str | None = None
    load_step: int | None = None


def checkpoint_cell(suite: LoadedSuite) -> SweepCell:
    """The cell the checkpoint stage trains: the first runnable sweep cell, else the smoke cell."""
    return next((c for c in suite.cells if not c.skip_reason), None) or suite.smoke


def checkpoint_save_dir(suite: LoadedSuite, run_dir: Path, run_id: str) -> Path:
    """Where the save run writes: several nodes need a shared file system, which the config names."""
    configured = suite.config.checkpoint.checkpoint_dir
    if configured and suite.nodes > 1:
        return Path(configured) / run_id
    return run_dir / "checkpoints" / "saved"


def checkpoint_jobs(suite: LoadedSuite, save_dir: Path) -> tuple[CheckpointJob, CheckpointJob]:
    """The save job and the resume job of the checkpoint stage.

    Megatron also saves at the last iteration, so the latest checkpoint is save_iters, a step the save run never
    went past. Resuming from the last interval save (CVS's floor rule) instead lets the resumed run's first step
    be compared with the same step of the save run. The resumed run saves elsewhere, so the saved checkpoint and
    its tracker file stay as the save run left them."""
    settings = suite.config.checkpoint
    resume_from = (settings.save_iters // settings.save_interval) * settings.save_interval or settings.save_iters
    save = CheckpointJob("checkpoint-save", settings.save_iters, str(save_dir), settings.save_interval)
    resumed_dir = save_dir.with_name(save_dir.name + "-resumed")
    resume = CheckpointJob("checkpoint-resume", settings.resume_iters, str(resumed_dir), settings.save_interval,
                           load_dir=str(save_dir), load_step=resume_from)
    return save, resume


# ---- specs ----------------------------------------------------------------------------------------
def build_plan(suite: LoadedSuite, cell: SweepCell, *, train_iters: int | None = None) -> SavedPlan:
    """The cell as a SavedPlan; MegapilotError when the layout cannot work (as `megapilot script` refuses)."""
    gpu = suite.gpu or get_gpu(CPU_STAND_IN_GPU)
    cluster = ClusterSpec(gpu=gpu, num_nodes=suite.nodes, gpus_per_node=suite.gpus_per_node)
    precision = _training_precision(cell.precision) if suite.device == "gpu" else "bf16"
    training = TrainingSpec(seq_length=cell.seq_length, global_batch_size=cell.gbs, precision=precision,
                            train_iters=train_iters or cell.train_iters)
    parallel = cell.layout.config(cluster.world_size, sequence_parallel=cell.layout.tp > 1,
                                  **_split_fields(pipeline_split(suite, cell)))
    validate_layout(suite.model, cluster, training, parallel)
    return SavedPlan(model=suite.model, cluster=cluster, training=training, parallel=parallel)


def pipeline_split(suite: LoadedSuite, cell: SweepCell) -> PipelineSplit:
    """The layer split a cell's PP runs: even where PP x VPP divides the layers, else the first split Megatron
    accepts among those the planner costs (`plan.space.pipeline_splits`).

    A CVS file says only `pipeline_parallelism` and leaves the layout to the trainer: Llama 3.1 405B's 126 layers
    on PP 4 (CVS's distributed 405B config, run by Primus). Primus's own 405B experiments
    (AMD-AGI/Primus examples/megatron/configs/MI3*X/llama3.1_405B-*-pretrain.yaml) set no split, and Primus
    wraps Megatron-LM's validate_args without replacing it: with no first/last counts, Megatron needs
    (num_layers + embedding slot + loss slot) divisible by PP. So the first choice is the embedding and the
    loss each taking a layer slot (--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split,
    what NVIDIA's 405B recipes use): 126 + 2 = 128 slots = 32 per rank, i.e. 31 + 32 + 32 + 31 layers. The
    embedded trainer reads only first/last counts, so there the first uneven split is taken.
    """
    model, pp = suite.model, cell.layout.pp
    vpp = cell.layout.vpp or 1
    if pp == 1 or model.num_layers % (pp * vpp) == 0:
        return EVEN_SPLIT
    candidates = pipeline_splits(model, pp)
    if suite.backend == "megapilot":
        candidates = tuple(s for s in candidates if s.first_stage_layers is not None or s.last_stage_layers is not None)
    for split in candidates:
        try:
            split.resolve(model.num_layers, model.mtp_num_layers, pp, vpp)
        except MegapilotError:
            continue
        return split
    return EVEN_SPLIT  # none fits: validate_layout refuses the cell, naming every legal option


def _split_fields(split: PipelineSplit) -> dict[str, object]:
    return {"first_stage_layers": split.first_stage_layers, "last_stage_layers": split.last_stage_layers,
            "account_for_embedding": split.account_for_embedding, "account_for_loss": split.account_for_loss,
            "pipeline_layout": split.layout}


def _training_precision(cell_precision: str) -> Precision:
    """The training precision of a cell (CVS writes it upper-case); one no trainer runs is refused."""
    precisions: tuple[Precision, ...] = get_args(Precision)  # the Literal's own values
    for precision in precisions:
        if precision == cell_precision.lower():
            return precision
    raise MegapilotError(f"{cell_precision} is not a training precision", field="precision",
                         fix=f"use one of: {', '.join(p.upper() for p in PRECISIONS)}")


def launch_options(suite: LoadedSuite, cell: SweepCell, *, job_dir: Path, save_dir: str | None = None,
                   save_interval: int | None = None, load_dir: str | None = None,
                   load_step: int | None = None, request: LaunchRequest | None = None,
                   master_port: int | None = None) -> LaunchOptions:
    """LaunchOptions for the suite's backend and executor."""
    block = suite.config.megapilot
    container = suite.config.container
    env = container.env if container is not None else {}
    request = request or default_request(suite)
    launcher = "slurm" if request.launcher == "slurm" else "primus" if suite.backend == "primus" else "torchrun"
    job_dir = job_dir.absolute()
    fields: dict[str, object] = dict(
        launcher=launcher, entrypoint="megapilot" if suite.backend == "megapilot" else "megatron",
        python=suite.python, cpu=suite.device == "cpu", log_interval=block.log_interval,
        save=save_dir, save_interval=save_interval, load=load_dir, load_step=load_step,
        script_path=str(job_dir / SCRIPT_NAME), log_dir=str(job_dir), job_name=f"mp-{job_dir.name}",
        network_interface=env.get("NCCL_SOCKET_IFNAME"), ib_hca=env.get("NCCL_IB_HCA"),
        check_paths_exist=suite.capabilities.runs_here and (container is None or not container.image),
        **_data_fields(suite, cell),
    )
    if master_port is not None:
        fields["master_port"] = master_port
    if suite.backend == "megatron-lm":
        fields["megatron_path"] = block.megatron_path
    if block.megatron_version is not None:
        fields["megatron_version"] = block.megatron_version
    if suite.backend == "primus":
        fields.update(primus_path=block.primus_path, primus_config_path=str(job_dir / PRIMUS_EXPERIMENT_NAME))
    if launcher == "slurm":
        fields.update({k: v for k, v in (("partition", block.partition), ("account", block.account),
                                         ("time_limit", block.time_limit)) if v is not None})
        fields.update(gpu_request=request.gpu_request, sbatch_options=tuple(block.sbatch_options),
                      exclusive=block.exclusive if block.exclusive is not None else suite.device == "gpu")
        if suite.device == "cpu":
            fields["cpu_memory_gib"] = block.memory_per_node_gib or cpu_memory_gib(suite)
        if container is not None and container.image:
            fields["container_image"] = container.image
    return LaunchOptions(**fields)  # type: ignore[arg-type]  # LaunchOptions fields by name; pydantic checks them


def default_request(suite: LoadedSuite) -> LaunchRequest:
    """What a launch asks for before the executor has read the cluster (a dry run, `suite check`)."""
    launcher = suite.capabilities.launcher
    return LaunchRequest(launcher=launcher, gpu_request="gpus-per-node" if suite.device == "gpu" else "none")


# What a CPU rank holds beyond the model: the Python interpreter with torch and Megatron-Core imported (measured
# about 0.6 GiB resident), gloo buffers and the data loader; and per parameter: fp32 weights, gradients and
# Adam's two moments.
CPU_RANK_RUNTIME_GIB = 1.0
CPU_BYTES_PER_PARAMETER = 16


def cpu_memory_gib(suite: LoadedSuite) -> float:
    """The memory a CPU suite asks per node: every rank's runtime plus its share of the model's training state."""
    parameters = count_params(suite.model).total
    per_rank = CPU_RANK_RUNTIME_GIB + parameters * CPU_BYTES_PER_PARAMETER / 1024**3
    return round(suite.gpus_per_node * per_rank, 2)


def _data_fields(suite: LoadedSuite, cell: SweepCell) -> dict[str, object]:
    """Mock data unless megapilot.data_path; Megatron-LM and Primus read the cell's tokenizer as CVS does."""
    block = suite.config.megapilot
    fields: dict[str, object] = {"mock_data": block.data_path is None, "data_path": block.data_path}
    if block.tokenizer_type is not None:
        fields["tokenizer_type"] = block.tokenizer_type
    elif suite.backend == "megapilot" and block.data_path is not None:
        fields["tokenizer_type"] = "ByteTokenizer"
    if suite.backend != "megapilot" and cell.tokenizer_model:
        fields["tokenizer_model"] = cell.tokenizer_model
    return fields


# ---- what else a cell launch says ----------------------------------------------------------------------
def _job_env(suite: LoadedSuite, launch_env: dict[str, str]) -> dict[str, str]:
    """The script's exports, plus container.env (passed with `docker run -e`); secret-named variables dropped."""
    container = suite.config.container
    extra = dict(container.env) if container is not None else {}
    merged = {**extra, **launch_env}
    named = set(suite.config.megapilot.secrets)
    return {name: value for name, value in merged.items() if not (name in named or is_secret_name(name))}


def _command(suite: LoadedSuite, options: LaunchOptions, megatron_args: list[str], job_dir: Path) -> str:
    # launch_options names the script; render_launch has refused a Primus or Megatron-LM launch
    # without its config or checkout before any command is written.
    assert options.script_path is not None
    if options.launcher == "slurm":
        return shlex.join(["sbatch", options.script_path])
    if options.launcher == "primus":
        assert options.primus_config_path is not None
        return shlex.join(["bash", "runner/primus-cli", "direct", "--", "train", "pretrain", "--config",
                           options.primus_config_path])
    if options.entrypoint == "megapilot":
        entry = ["-m", "megapilot.trainer"]
    else:
        assert options.megatron_path is not None
        entry = [options.megatron_path.rstrip("/") + "/pretrain_gpt.py"]
    words = [options.python, "-m", "torch.distributed.run", "--nnodes", str(suite.nodes), "--nproc-per-node",
             str(suite.gpus_per_node), *entry, *megatron_args]
    return shlex.join(words)


def _notes(suite: LoadedSuite) -> list[str]:
    notes = []
    if suite.device == "cpu":
        notes.append(f"CPU suite: the plan carries {CPU_STAND_IN_GPU} as a stand-in GPU; predictions model this "
                     "machine's CPU, measured (`megapilot gpus`)")
    if suite.config.megapilot.data_path is None:
        notes.append("mock data (Megatron's synthetic tokens): loss gates are weak evidence")
    return notes


__all__ = ["SUITE_RELEASE_NAMES", "CellLaunch", "build_plan", "check_release", "launch_options", "pipeline_split",
           "render_cell", "render_cells", "suite_release_names"]
