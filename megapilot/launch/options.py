"""LaunchOptions (what the user adds to a plan to launch it) and LaunchScript (what comes out)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from megapilot.spec.cuda_graphs import CudaGraphs
from megapilot.spec.plan_file import FlexDispatcher

Launcher = Literal["torchrun", "slurm", "primus"]
Entrypoint = Literal["megatron", "megapilot"]
Rendezvous = Literal["static", "c10d"]
TokenizerType = Literal[
    "HuggingFaceTokenizer", "GPTSentencePieceTokenizer", "SentencePieceTokenizer", "Llama2Tokenizer",
    "GPT2BPETokenizer", "TikTokenizer", "NullTokenizer",
    "ByteTokenizer",  # the embedded trainer's byte tokenizer (data from `megapilot data prepare`); not Megatron-LM's
]
# The tokenizers that read no --tokenizer-model: GPT-2 BPE reads its vocab and merge files, the others nothing.
TOKENIZERS_WITHOUT_MODEL: frozenset[str] = frozenset({"GPT2BPETokenizer", "NullTokenizer", "ByteTokenizer"})

DEFAULT_MASTER_PORT = 29611  # not torchrun's 29500, which anything else using torchrun's default takes
DEFAULT_PRIMUS_PATH = "/workspace/Primus"  # where AMD's Primus images keep the checkout


class LaunchOptions(BaseModel):
    """Everything a launch script needs beyond the plan: data, checkpoints, launcher, paths."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    launcher: Launcher = Field(default="torchrun", description="torchrun script, SLURM sbatch script or Primus.")
    nodes: int | None = Field(default=None, gt=0, description="Nodes to launch on; None = the plan's node count.")
    # --- data and tokenizer
    data_path: str | None = Field(default=None, description="Megatron --data-path prefix (absolute).")
    mock_data: bool = Field(default=False, description="Megatron's synthetic data instead of --data-path.")
    split: str = Field(default="99,1,0", description="--split train,valid,test weights with --data-path.")
    data_cache_path: str | None = Field(
        default=None, description="Absolute directory for Megatron's dataset index caches; None = <save>/data-cache.")
    tokenizer_type: TokenizerType | None = Field(
        default=None, description="None = inferred from the files given; ByteTokenizer only with entrypoint megapilot.")
    tokenizer_model: str | None = Field(default=None, description="Absolute path or Hugging Face model id.")
    vocab_file: str | None = Field(default=None, description="GPT-2 BPE vocab (absolute path).")
    merge_file: str | None = Field(default=None, description="GPT-2 BPE merges (absolute path).")
    # --- checkpoints and logging
    save: str | None = Field(default=None, description="Checkpoint directory (absolute), also --load.")
    load: str | None = Field(default=None, description="Resume from here; None = the --save directory.")
    load_step: int | None = Field(default=None, gt=0, description="--ckpt-step: the saved iteration to load; "
                                                                  "None = the latest.")
    save_interval: int | None = Field(default=None, gt=0, description="None = once, at the last iteration.")
    tensorboard_dir: str | None = Field(default=None, description="Absolute; None = <save>/tensorboard.")
    log_interval: int = Field(default=1, gt=0, description="Iterations between iteration log lines.")
    timing_log_level: Literal[0, 1, 2] = Field(default=1, description="Megatron timer detail.")
    # --- what runs
    entrypoint: Entrypoint = Field(default="megatron", description="pretrain_gpt.py or `python -m megapilot.trainer`.")
    megatron_path: str | None = Field(default=None, description="Absolute Megatron-LM checkout (entrypoint megatron).")
    megatron_version: str | None = Field(
        default=None, description="Megatron-LM release the flags are checked against (0.14 ... 0.19, core_v0.16.0); "
                                  "None = the local --megatron-path checkout's own, else the newest table.",
    )
    python: str = Field(default="python3", description="Interpreter that has torch (absolute path or name on PATH).")
    cpu: bool = Field(
        default=False,
        description="Run on CPUs (embedded trainer, tiny models): gloo, local layers, fp32 compute.",
    )
    primus_path: str = Field(default=DEFAULT_PRIMUS_PATH, description="Absolute Primus checkout (launcher primus).")
    primus_config_path: str | None = Field(
        default=None, description="Where the Primus experiment YAML goes; None = next to the script.",
    )
    moe_flex_dispatcher: FlexDispatcher | None = Field(
        default=None,
        description="MoE tokens through Megatron's flex dispatcher with DeepEP or HybridEP (the library must be in "
                    "the image; it cannot be checked from here); None = the alltoall dispatcher.",
    )
    moe_a2a_overlap: bool = Field(
        default=False,
        description="Overlap the expert all-to-all with another micro-batch's compute (--overlap-moe-expert-parallel-"
                    "comm with --delay-wgrad-compute) where Megatron allows it; elsewhere a note says why not.",
    )
    cuda_graphs: CudaGraphs | None = Field(
        default=None,
        description="CUDA graphs (--cuda-graph-impl and its scope) where Megatron-Core allows them for the plan; "
                    "None = every kernel launched eagerly (Megatron's default).",
    )
    # --- multi-node wiring
    rendezvous: Rendezvous = Field(default="static", description="Multi-node torchrun: static ranks or c10d.")
    master_port: int = Field(default=DEFAULT_MASTER_PORT, gt=1024, lt=65536)
    network_interface: str | None = Field(default=None, description="NCCL/GLOO_SOCKET_IFNAME, e.g. ens1f0.")
    ib_hca: str | None = Field(default=None, description="NCCL_IB_HCA, e.g. mlx5_0,mlx5_1.")
    # --- SLURM
    job_name: str = Field(default="megapilot", description="#SBATCH --job-name.")
    time_limit: str = Field(default="04:00:00", description="#SBATCH --time (HH:MM:SS or D-HH:MM:SS).")
    partition: str | None = Field(default=None, description="#SBATCH --partition; None = the cluster default.")
    account: str | None = Field(default=None, description="#SBATCH --account.")
    gpu_request: Literal["gpus-per-node", "gres", "none"] = Field(
        default="gpus-per-node", description="How a GPU job asks SLURM for its GPUs: --gpus-per-node=N (cons_tres) "
                                             "or --gres=gpu:N (older selectors); a CPU launch asks for none.")
    exclusive: bool = Field(default=True, description="#SBATCH --exclusive: the nodes to this job alone.")
    cpu_memory_gib: float | None = Field(default=None, gt=0, description="#SBATCH --mem of a CPU launch (GiB).")
    sbatch_options: tuple[str, ...] = Field(default=(), description="More #SBATCH lines, each one option as sbatch "
                                                                    "takes it (--qos=high, --constraint=a100).")
    log_dir: str | None = Field(default=None, description="Absolute directory for logs; None = next to the script.")
    container_image: str | None = Field(default=None, description="pyxis/enroot image for srun.")
    container_mounts: tuple[str, ...] = Field(default=(), description="SRC:DST pairs, both absolute.")
    # --- where the script will live
    script_path: str | None = Field(default=None, description="Absolute path the script is written to.")
    check_paths_exist: bool | None = Field(
        default=None, description="Require input paths to exist here; None = only for single-node torchrun.",
    )
    remote: bool = Field(
        default=False,
        description="Drafted for another machine: paths are checked for form only (never for existence here) "
                    "and no directory is created here.",
    )


class LaunchScript(BaseModel):
    """A rendered launch: the script text, the exact Megatron arguments, its environment and files."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    script: str
    launcher: Launcher
    megatron_args: list[str] = Field(description="Exactly what the script passes to pretrain_gpt.py.")
    env: dict[str, str] = Field(description="Variables the script exports.")
    nodes: int
    gpus_per_node: int
    files: dict[str, str] = Field(default_factory=dict, description="Extra files (absolute path -> text).")
    directories: list[str] = Field(
        default_factory=list,
        description="Directories that must exist before the launch starts (the SLURM log folder: sbatch opens "
                    "its --output file before the script runs); created when the script is written here.",
    )
    notes: list[str] = Field(default_factory=list, description="Defaults taken and warnings, for the user.")
    megatron_release: str = Field(
        default="",
        description="The Megatron-LM release (or checkout) the flags were checked against, e.g. core_v0.19.0.")

    def to_json(self) -> dict[str, object]:
        """The stable `megapilot script --json` schema."""
        return {
            "script": self.script, "launcher": self.launcher, "megatron_args": self.megatron_args,
            "env": self.env, "nodes": self.nodes, "gpus_per_node": self.gpus_per_node,
            "files": self.files, "directories": self.directories, "notes": self.notes,
            "megatron_release": self.megatron_release,
        }
