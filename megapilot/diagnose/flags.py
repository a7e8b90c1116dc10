"""Megatron-LM flags out of a launch script or a flag string, and the run they describe.

`read_flags(script=..., flags=...)` reads a script without running it (`shell_words`): `\\`
continuations, comments, variables (`TP=8`, `export SEQ=4096`, `${VAR:-default}`) and bash arrays
spanning lines with comments inside (`MEGATRON_ARGS=( ... )` expanded by `"${MEGATRON_ARGS[@]}"`,
as `megapilot script` writes them). Every `--flag [value]` word is collected, torchrun's
`--nproc-per-node`/`--nnodes` included (for the world size; `#SBATCH --nodes` fills
`$SLURM_NNODES`). A Primus launch is read through its experiment YAML — written by a
here-document in the script, named by it, or given directly as `script=exp.yaml` — whose
`overrides` are Megatron's argument names. Which flags are switches comes from the pinned
Megatron-LM parser (`megapilot.launch.megatron_args`); unknown flags take one value when a non-flag
word follows.

`run_config(flags, gpu=, gpus=)` turns them into the typed specs the estimators read.
"""

from __future__ import annotations

import ast
import itertools
import json
import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any, get_args

from megapilot.catalog.gpus import get_gpu
from megapilot.catalog.hf import layer_blocks_from_block_configs
from megapilot.catalog.hub import looks_like_hub_id
from megapilot.catalog.models import ModelPreset, get_preset, preset_of_hub_repo
from megapilot.data.tokenizer import ByteTokenizer, embedded_trainer_tokenizer
from megapilot.diagnose.findings import Fix
from megapilot.diagnose.shell_words import ScriptWords, script_words
from megapilot.errors import MegapilotError, from_validation_error
from megapilot.estimate import EstimateOptions
from megapilot.launch.flags import quant_flavour_of_flags
from megapilot.launch.hybrid_split import segments_virtual_stages
from megapilot.launch.megatron_args import committed_tables, pinned_flags
from megapilot.launch.torchrun import EMBEDDED_TRAINER_MODULE
from megapilot.logs import ParsedLog
from megapilot.spec import ClusterSpec, GPUSpec, MLASpec, ModelSpec, MoESpec, ParallelConfig, TrainingSpec
from megapilot.spec.cuda_graphs import CUDA_GRAPH_IMPLS, CUDA_GRAPH_SCOPES, CudaGraphs
from megapilot.spec.model import (
    DSASpec,
    GatedDeltaNetSpec,
    LayerBlock,
    Llama3RopeScaling,
    LoadBalancing,
    MambaSpec,
    MlpActivation,
    PositionEmbedding,
    RouterDtype,
    SoftmaxType,
    YarnRopeScaling,
)
from megapilot.spec.parallel import RECOMPUTE_MODULES
from megapilot.spec.pipeline import DECODER, EMBEDDING, LOSS, MTP, compress_layout
from megapilot.spec.training import DEFAULT_FP8_RECIPE, OPTIMIZERS, Fp8Recipe, Optimizer, Precision
from megapilot.spec.validate import most_offloaded_layers
from megapilot.vocabulary import TERMS, default, float_default, int_default, term

# The second line of a script from `megapilot script`: "# torchrun launch: NAME on N node(s) x G GPU-NAME"
_HEADER_GPU_RE = re.compile(r"^# (?:torchrun|SLURM sbatch|AMD Primus) launch: .+ on \d+ node\(s\) x \d+ (\S+)$",
                            re.MULTILINE)
# The same line's model name (also on a CPU launch's header, whose ranks are "G CPU ranks")
_HEADER_MODEL_RE = re.compile(r"^# (?:torchrun|SLURM sbatch|AMD Primus) launch: (\S+) on \d+ node\(s\) x ",
                              re.MULTILINE)
# Primus writes a few keys under the flag's name rather than Megatron's destination.
_PRIMUS_DESTINATION = {"norm_epsilon": "layernorm_epsilon"}
# Flag values the specs accept, by their text (anything else falls back to the stated default).
_LOAD_BALANCING: dict[str, LoadBalancing] = {name: name for name in get_args(LoadBalancing)}
_ROUTER_DTYPES: dict[str, RouterDtype] = {name: name for name in get_args(RouterDtype)}
_POSITION_EMBEDDINGS: dict[str, PositionEmbedding] = {name: name for name in get_args(PositionEmbedding)}
_SOFTMAX_TYPES: dict[str, SoftmaxType] = {name: name for name in get_args(SoftmaxType)}
# Megatron-FSDP's switch; Megatron-LM before core_v0.14 called it --use-custom-fsdp.
FSDP_SWITCHES = ("--use-megatron-fsdp", "--use-custom-fsdp")
# Flags whose several values are read (the others keep their first value): the list of recompute modules.
LIST_FLAGS = frozenset({"--recompute-modules", "--cp-comm-type", "--cuda-graph-scope", "--cuda-graph-modules"})
_TORCHRUN_VALUE_FLAGS = frozenset({"--nproc-per-node", "--nproc_per_node", "--nnodes", "--node-rank", "--node_rank",
                                   "--master-addr", "--master_addr", "--master-port", "--master_port",
                                   "--rdzv-endpoint", "--rdzv_endpoint", "--rdzv-backend", "--rdzv_backend",
                                   "--rdzv-id", "--rdzv_id"})


@dataclass(frozen=True)
class LaunchFlags:
    """The flags of one launch, in order of first appearance; a repeated flag keeps its last value.

    A switch has the value None. `source` is the script path or `<flags>`.
    """

    values: dict[str, str | None]
    source: str = "<flags>"
    sbatch: dict[str, str] = field(default_factory=dict)  # the script's `#SBATCH` options
    gpu_hint: str | None = None  # the GPU named in the header `megapilot script` writes
    model_hint: str | None = None  # the model named in that header (a preset's name for a preset)
    embedded_trainer: bool = False  # the script runs `-m megapilot.trainer`, whose defaults differ from Megatron's

    def has(self, name: str) -> bool:
        return name in self.values

    def get(self, name: str, default: str | None = None) -> str | None:
        value = self.values.get(name, default)
        return default if value is None else value

    def get_int(self, name: str, default: int | None = None, *, minimum: int = 1) -> int | None:
        """A whole-number flag, strictly as Megatron's argparse reads it (`2.5`, `abc` and a value below `minimum`
        are a user error naming the flag, not a default taken in silence); `default` when absent."""
        raw = self._given(name)
        if raw is None:
            return default
        try:
            value = int(raw)
        except ValueError:
            raise self._bad(name, raw, "is not a whole number", f"a whole number of at least {minimum}") from None
        if value < minimum:
            raise self._bad(name, raw, f"is below {minimum}", f"a whole number of at least {minimum}")
        return value

    def get_int_range(self, name: str) -> tuple[int, int] | None:
        """A whole number `N` as (N, N), or torchrun's elastic `MIN:MAX` (`--nnodes 1:4`) as its two bounds, each
        at least 1 and MIN <= MAX as torchrun requires; None when absent."""
        raw = self._given(name)
        if raw is None:
            return None
        parts = raw.split(":")
        wanted = "a whole number of at least 1, or torchrun's elastic MIN:MAX (1 <= MIN <= MAX)"
        if len(parts) > 2 or not all(part.isdigit() for part in parts):
            raise self._bad(name, raw, "is not a whole number or MIN:MAX", wanted, "torchrun")
        low, high = int(parts[0]), int(parts[-1])
        if not 1 <= low <= high:
            raise self._bad(name, raw, "is not 1 <= MIN <= MAX" if len(parts) == 2 else "is below 1", wanted,
                            "torchrun")
        return low, high

    def get_float(self, name: str, default: float | None = None) -> float | None:
        """A number flag, strictly as Megatron's argparse reads it; `default` when absent."""
        raw = self._given(name)
        if raw is None:
            return default
        try:
            return float(raw)
        except ValueError:
            raise self._bad(name, raw, "is not a number", "a number") from None

    @property
    def left_to_the_shell(self) -> list[str]:
        """The flags whose value is a variable the script does not set (`--tensor-model-parallel-size $TP`)."""
        return sorted(name for name, raw in self.values.items() if raw is not None and "$" in raw)

    def _given(self, name: str) -> str | None:
        """The flag's text; None when absent or left to the shell (`$TP` that the script does not set: its value
        comes from the environment it runs in, which a reading of the script cannot know)."""
        raw = self.values.get(name)
        return None if raw is None or "$" in raw else raw

    def _bad(self, name: str, raw: str, problem: str, wanted: str, reader: str = "Megatron-LM") -> MegapilotError:
        where = "" if self.source == "<flags>" else f" (in {self.source})"
        return MegapilotError(f"{raw!r}{where} {problem}", field=name,
                              fix=f"write {name} as {wanted} in the launch script or --flags, as {reader} "
                                  "requires")


def _switch_names() -> frozenset[str]:
    """Switches of every release megapilot has a table for, so a script written for an older release (a switch
    renamed or removed since) reads right too; a name that takes a value in any release is not one."""
    tables = committed_tables()
    valued = {name for table in tables for name, spec in table.flags.items() if spec.takes_value}
    return frozenset(name for table in tables for name, spec in table.flags.items()
                     if not spec.takes_value and name not in valued)


def _script_flags(path: Path) -> LaunchFlags:
    """Flags of a launch script (bash, or a Primus experiment YAML given directly)."""
    text = path.read_text(errors="replace")
    if path.suffix in (".yaml", ".yml"):
        overrides = _primus_overrides(text)
        if overrides is None:
            raise MegapilotError(f"{path} is not a Primus experiment (no modules.<name>.overrides)", field="--script",
                                 fix="pass the launch script, or a Primus experiment YAML")
        return LaunchFlags(values=_flags_from_overrides(overrides), source=str(path))
    read = script_words(text)
    values = dict(_collect(read.words, str(path)).values)
    overrides = _primus_experiment_of(read, path)
    if overrides is not None:  # primus-cli gets the Megatron arguments from the experiment, the world from env
        values.update(_flags_from_overrides(overrides))
        for flag, variable in (("--nnodes", "NNODES"), ("--nproc-per-node", "GPUS_PER_NODE")):
            if flag not in values and read.scalar(variable):
                values[flag] = read.scalar(variable)
    header = _HEADER_GPU_RE.search(text)
    model = _HEADER_MODEL_RE.search(text)
    return LaunchFlags(values=values, source=str(path), sbatch=read.sbatch,
                       gpu_hint=header.group(1).strip() if header else None,
                       model_hint=model.group(1) if model else None,
                       embedded_trainer=EMBEDDED_TRAINER_MODULE in read.words)


def _primus_experiment_of(read: ScriptWords, path: Path) -> dict[str, object] | None:
    """The overrides of the Primus experiment a script writes (here-document) or names (an existing .yaml)."""
    for body in read.heredocs:
        overrides = _primus_overrides(body)
        if overrides is not None:
            return overrides
    for word in read.words:
        if word.endswith((".yaml", ".yml")):
            candidate = Path(word) if Path(word).is_absolute() else path.parent / word
            if candidate.is_file():
                overrides = _primus_overrides(candidate.read_text(errors="replace"))
                if overrides is not None:
                    return overrides
    return None


def _primus_overrides(text: str) -> dict[str, object] | None:
    """`modules.<module>.overrides` of a Primus experiment (the first module that has them)."""
    # start-up: yaml costs 18 ms to import, paid only where YAML is read
    import yaml

    try:
        experiment = yaml.safe_load(text)
    except yaml.YAMLError:
        return None
    modules = experiment.get("modules") if isinstance(experiment, dict) else None
    if not isinstance(modules, dict):
        return None
    for module in modules.values():
        if isinstance(module, dict) and isinstance(module.get("overrides"), dict):
            overrides: dict[str, object] = module["overrides"]  # YAML's Any; its keys are Megatron option names
            return overrides
    return None


def _flags_from_overrides(overrides: dict[str, object]) -> dict[str, str | None]:
    """Primus overrides are keyed by Megatron's argument destinations: back to `--flag [value]`.

    A key whose Megatron flag is a store_false switch (`add_bias_linear: false` is `--disable-bias-linear`)
    becomes that switch; a true/false key of a store_true switch adds it or leaves it out.
    """
    by_dest = _flags_by_destination()
    values: dict[str, str | None] = {}
    for key, value in overrides.items():
        key = _PRIMUS_DESTINATION.get(key, key)
        names = by_dest.get(key, {})
        if isinstance(value, bool):
            wanted = "store_true" if value else "store_false"
            if wanted in names:
                values[names[wanted]] = None
            elif not names and value:
                values["--" + key.replace("_", "-")] = None
            continue
        name = names.get("store") or "--" + key.replace("_", "-")
        text = " ".join(str(v) for v in value) if isinstance(value, list) else str(value)
        values[name] = text
    return values


def cuda_graphs_of(flags: LaunchFlags) -> CudaGraphs | None:
    """The CUDA graphs a launch captures, in every release's words: `--cuda-graph-impl` (core_v0.18.0 on also
    `full_iteration`) with `--cuda-graph-scope` or its later name `--cuda-graph-modules` (`full`: each layer whole),
    or the older switches `--enable-cuda-graph` (local) and `--external-cuda-graph` (transformer_engine). A log's
    arguments block prints the scopes as enums (`[<CudaGraphScope.attn: 1>]`): their lower-case names are read."""
    impl = flags.get("--cuda-graph-impl")
    if impl in (None, "none"):
        impl = ("local" if flags.has("--enable-cuda-graph")
                else "transformer_engine" if flags.has("--external-cuda-graph") else None)
    if impl is None:
        return None
    said = flags.get("--cuda-graph-modules") or flags.get("--cuda-graph-scope") or ""
    scope = [word for word in dict.fromkeys(re.findall(r"\b[a-z_]+\b", said)) if word in CUDA_GRAPH_SCOPES]
    if impl == "full_iteration":
        impl, scope = "local", ["full_iteration"]
    if impl not in CUDA_GRAPH_IMPLS:
        return None
    return CudaGraphs(impl=impl, scope=tuple(scope))  # type: ignore[arg-type]  # both checked against the Literals


def flags_from_log(log: ParsedLog) -> LaunchFlags | None:
    """The launch a log's own `arguments` block describes (Megatron prints every argument at start-up), named by
    the file and line it starts at, as a script is by its path; None without the block."""
    arguments = log.arguments
    if arguments is None or not arguments.values:
        return None
    return flags_from_arguments(arguments.values, f"{arguments.file}:{arguments.line}")


def flags_from_arguments(printed: dict[str, str], source: str) -> LaunchFlags:
    """The launch a Megatron-LM `arguments` block describes (it prints `vars(args)`: every option by destination),
    as flags: `True`/`False` become the switch that sets them, `None` and empty lists are left out."""
    overrides: dict[str, object] = {}
    for dest, text in printed.items():
        text = text.strip()
        if text in ("None", "[]", "") or text.startswith(("{", "(", "<")):
            continue
        if text in ("True", "False"):
            overrides[dest] = text == "True"
        elif text.startswith("[") and text.endswith("]"):
            overrides[dest] = [item.strip(" '\"") for item in text[1:-1].split(",") if item.strip()]
        else:
            overrides[dest] = text
    values = _flags_from_overrides(overrides)
    world = printed.get("world_size", "")
    if world.isdigit():  # the block's own world size, as torchrun gave it
        values["--nproc-per-node"] = world
    return LaunchFlags(values=values, source=source)


def _flags_by_destination() -> dict[str, dict[str, str]]:
    """Megatron destination -> {action: flag name} from the pinned parser."""
    table: dict[str, dict[str, str]] = {}
    for name, spec in pinned_flags().items():
        action = spec.action if spec.action in ("store_true", "store_false") else "store"
        table.setdefault(spec.dest, {}).setdefault(action, name)
    return table


def collect_flags(words: list[str], source: str = "<flags>") -> LaunchFlags:
    """The `--flag [value]` words of an argument list, read as a script's are (switches from the pinned parser)."""
    return _collect(words, source)


def apply_fixes(flags: LaunchFlags, fixes: Iterable[Fix]) -> LaunchFlags:
    """The launch as it reads after its Megatron-flag edits are made (environment and command fixes
    change no flag): what a user who applies a proposal to the script will run."""
    values = dict(flags.values)
    for fix in fixes:
        if fix.kind != "megatron_flag":
            continue
        if fix.action == "remove":
            values.pop(fix.flag, None)
        else:
            values[fix.flag] = fix.value
    return replace(flags, values=values)


@cache
def _megatron_names() -> frozenset[str]:
    """Every flag of every release megapilot has a table for: what tells a launch script from any other text."""
    return frozenset(name for table in committed_tables() for name in table.flags)


def _collect(tokens: list[str], source: str) -> LaunchFlags:
    switches = _switch_names()
    values: dict[str, str | None] = {}
    index = 0
    while index < len(tokens):
        token = tokens[index]
        index += 1
        if not token.startswith("--") or len(token) < 3:
            continue
        name, eq, inline = token.partition("=")
        if eq:
            values[name] = inline
            continue
        takes_value = name in _TORCHRUN_VALUE_FLAGS or name not in switches
        if name in LIST_FLAGS:  # nargs '*': every word up to the next flag, kept space-separated
            listed = list(itertools.takewhile(lambda word: not word.startswith("--"), tokens[index:]))
            values[name] = " ".join(listed) or None
            index += len(listed)
            continue
        following = tokens[index] if index < len(tokens) else None
        if takes_value and following is not None and not (following.startswith("--") and len(following) > 2
                                                          and not following[2].isdigit()):
            values[name] = following
            index += 1
        else:
            values[name] = None
    return LaunchFlags(values=values, source=source)


def read_flags(*, script: str | Path | None = None, flags: str | None = None,
               training_script: bool = False) -> LaunchFlags | None:
    """Flags from a launch script, a flag string, or both (the string wins on conflicts); None if neither.
    `training_script`: a script without one Megatron flag is refused (diagnose and optimize read the training run
    it launches; `megapilot run` launches any program)."""
    collected: dict[str, str | None] = {}
    sbatch: dict[str, str] = {}
    gpu_hint: str | None = None
    model_hint: str | None = None
    embedded_trainer = False
    source = "<flags>"
    if script is not None:
        path = Path(script)
        if not path.is_file():
            raise MegapilotError(f"no such script: {script}", field="--script",
                                 fix="pass the path of the launch script")
        from_script = _script_flags(path)
        if training_script and not any(name in _megatron_names() for name in from_script.values):
            # defaults read from nothing would describe a run nobody launched (TP 1 "in the script")
            raise MegapilotError(f"{script} launches no Megatron-LM training: none of its words is a Megatron flag",
                                 field="--script", fix="pass the launch script that runs pretrain_gpt.py (or the "
                                                       "embedded trainer) with its flags, or the flags with --flags")
        collected.update(from_script.values)
        sbatch, gpu_hint, model_hint = from_script.sbatch, from_script.gpu_hint, from_script.model_hint
        embedded_trainer = from_script.embedded_trainer
        source = str(path)
    if flags is not None:
        try:
            words = shlex.split(flags)
        except ValueError as exc:
            raise MegapilotError(f"cannot split into words: {exc}", field="--flags", fix="balance the quotes") from exc
        collected.update(_collect(words, "<flags>").values)
    if script is None and flags is None:
        return None
    return LaunchFlags(values=collected, source=source, sbatch=sbatch, gpu_hint=gpu_hint, model_hint=model_hint,
                       embedded_trainer=embedded_trainer)


# ---- flags → typed specs ------------------------------------------------------------------------

@dataclass(frozen=True)
class RunConfig:
    """The run a launch describes, as far as its flags say. Parts the flags do not determine are None,
    and every assumption made is listed in `notes`."""

    flags: LaunchFlags
    gpu: GPUSpec | None
    world_size: int
    model: ModelSpec | None
    training: TrainingSpec | None
    parallel: ParallelConfig | None
    precision_flag: str  # what the flags ask for: fp32 | fp16 | bf16 | fp8 | fp4
    notes: list[str] = field(default_factory=list)
    world_size_assumed: bool = False  # neither --gpus nor the launcher said it: TP x PP x CP, or a node's GPUs, taken

    @property
    def options(self) -> EstimateOptions:
        """The run switches the flags turn on, as the estimator prices them: the TP and DP overlaps, the flex
        dispatcher, the expert all-to-all overlap, the legacy grouped GEMM (bf16 gradients are the training's)."""
        flags = self.flags
        return EstimateOptions(
            tp_comm_overlap=flags.has("--tp-comm-overlap"), overlap_grad_reduce=flags.has("--overlap-grad-reduce"),
            overlap_param_gather=flags.has("--overlap-param-gather"),
            moe_flex_dispatcher=flags.get("--moe-token-dispatcher-type") == "flex",
            moe_a2a_overlap=flags.has("--overlap-moe-expert-parallel-comm"),
            moe_legacy_grouped_gemm=flags.has("--moe-use-legacy-grouped-gemm"),
            cuda_graphs=cuda_graphs_of(flags),
        )

    @property
    def cluster(self) -> ClusterSpec | None:
        """The run's GPUs on its nodes: as many per node as the launch's nodes share its ranks (6 for 12 ranks over
        `#SBATCH --nodes=2`), else the GPU type's node."""
        if self.gpu is None:
            return None
        nodes = launch_nodes(self.flags)
        per_node = self.world_size // nodes if nodes > 1 and self.world_size % nodes == 0 else \
            ranks_per_node(self.flags)
        if per_node is None or self.world_size % per_node:
            per_node = None  # the launch does not say: the GPU type's node
        return ClusterSpec.from_gpu_count(self.gpu, self.world_size, per_node)

    @property
    def complete(self) -> bool:
        """Whether the estimators can cost this run."""
        return None not in (self.gpu, self.model, self.training, self.parallel)


def _check_values_given(flags: LaunchFlags) -> None:
    """A Megatron flag that takes a value, given none (`--fp8-recipe --bf16`): Megatron-LM's parser stops on it
    ("expected one argument"), so it is refused by its name here too, not read as if absent or as a switch."""
    parser = pinned_flags()
    for name, value in flags.values.items():
        spec = parser.get(name)
        if value is None and spec is not None and spec.takes_value and spec.nargs not in ("*", "?"):
            raise MegapilotError(f"{name} is given without its value ({flags.source})", field=name,
                                 fix=f"give {name} its value, as Megatron-LM's parser requires")


def _precision(flags: LaunchFlags) -> str:
    if flags.has("--fp4-format"):
        return "fp4"
    if flags.has("--fp8-format") or flags.has("--fp8"):
        return "fp8"
    if flags.has("--bf16"):
        return "bf16"
    if flags.has("--fp16"):
        return "fp16"
    return "fp32"


# torchrun's --nproc-per-node values that leave the count to torchrun on each node: `gpu` starts a rank per GPU,
# `auto` too on a GPU node (a rank per CPU core without one), `cpu` a rank per CPU core.
TORCHRUN_COUNTED_RANKS = ("gpu", "auto", "cpu")
_NPROC_FLAGS = ("--nproc-per-node", "--nproc_per_node")


def torchrun_counted_ranks(flags: LaunchFlags) -> str | None:
    """The word (`gpu`, `auto`, `cpu`) where the script's torchrun counts its ranks per node itself, else None."""
    return next((word for name in _NPROC_FLAGS if (word := flags.get(name)) in TORCHRUN_COUNTED_RANKS), None)


def ranks_per_node(flags: LaunchFlags) -> int | None:
    """The processes per node the script's launcher starts (torchrun's --nproc-per-node), when it says a number;
    None too where torchrun counts them itself (`torchrun_counted_ranks`)."""
    if torchrun_counted_ranks(flags) is not None:
        return None
    return flags.get_int("--nproc-per-node") or flags.get_int("--nproc_per_node")


def _world_size(flags: LaunchFlags, gpus: int | None, gpu: GPUSpec | None,
                notes: list[str]) -> tuple[int | None, bool]:
    """The ranks of the run and whether the number was assumed (said in `notes`); None where nothing says it."""
    if gpus:
        return gpus, False
    per_node = ranks_per_node(flags)
    nodes = launch_nodes(flags, notes)
    if per_node:
        return per_node * nodes, False
    counted = torchrun_counted_ranks(flags)
    if counted is not None:
        return _counted_world(counted, flags, gpu, nodes, notes)
    # srun starting one task per GPU (no torchrun): the allocation's tasks are the ranks
    tasks_per_node = _sbatch_int(flags, "--ntasks-per-node")
    if tasks_per_node and tasks_per_node > 1:
        return tasks_per_node * nodes, False
    return _sbatch_int(flags, "--ntasks", "-n"), False


def _counted_world(word: str, flags: LaunchFlags, gpu: GPUSpec | None, nodes: int,
                   notes: list[str]) -> tuple[int | None, bool]:
    """torchrun's own count of ranks per node: a rank per GPU is the node's GPUs, as many as the GPU type's node
    holds (the catalog's), assumed and said; a rank per CPU core is a count no flag gives (None)."""
    launch = f"torchrun --nproc-per-node {word}"
    if word == "cpu" or (word == "auto" and flags.get("--distributed-backend") == "gloo"):
        notes.append(f"{launch} starts a rank per CPU core of each node, a count the script does not give (pass "
                     "--gpus with the run's ranks)")
        return None, True
    per_node = gpu.gpus_per_node if gpu is not None else GPUSpec.model_fields["gpus_per_node"].default
    node = f"the catalog's {gpu.name} node" if gpu is not None else "the usual node; --gpu names the GPU's own"
    notes.append(f"{launch} starts a rank per GPU of each node: assumed {per_node} GPUs per node ({node}), "
                 f"{nodes} x {per_node} = {nodes * per_node} GPUs (pass --gpus with the run's total if its nodes hold "
                 "another number)")
    return nodes * per_node, True


def launch_nodes(flags: LaunchFlags, notes: list[str] | None = None) -> int:
    """The nodes of a full run: torchrun's --nnodes, else the allocation's `#SBATCH --nodes`, else 1.

    An elastic `--nnodes MIN:MAX` fixes its world at each rendezvous to the nodes that joined it, MIN to MAX: all
    of them when the launch starts every node it names, fewer only after nodes were lost. The run is priced on MAX
    nodes, said in `notes`."""
    given = flags.get_int_range("--nnodes")
    if given is None:
        return _sbatch_int(flags, "--nodes", "-N") or 1
    low, high = given
    if low != high and notes is not None:
        notes.append(f"torchrun --nnodes {low}:{high} is elastic: each rendezvous fixes the world to the nodes that "
                     f"joined, {low} to {high}; priced on {high} nodes, a full run (a restart after losing nodes runs "
                     "on fewer: pass --gpus with its ranks to price that)")
    return high


def _sbatch_int(flags: LaunchFlags, *names: str) -> int | None:
    for name in names:
        value = flags.sbatch.get(name, "")
        head = value.split("-")[0]  # --nodes=2-4: at least 2
        if head.isdigit():
            return int(head)
    return None


# What a launch with no --vocab-size and no tokenizer megapilot can size is priced with.
ASSUMED_VOCAB_SIZE = 32000


def _vocab_size(flags: LaunchFlags, notes: list[str], shape: tuple[int, int, int]) -> int:
    """--vocab-size; else the vocabulary of the catalog model the tokenizer model names, or the script's header
    where the tokenizer model is a path (a HuggingFaceTokenizer's size is its model's, which no flag states); else
    an assumption, said in `notes`.
    `shape`: the flags' layers, hidden size and heads."""
    tokenizer_type = flags.get("--tokenizer-type")
    if flags.embedded_trainer:  # its tokenizer when none is named: bytes, or NullTokenizer with --mock-data
        tokenizer_type = embedded_trainer_tokenizer(tokenizer_type, flags.has("--mock-data"))
    if flags.get_int("--vocab-size"):
        vocab = flags.get_int("--vocab-size") or 0
        # Megatron's NullTokenizer adds an end-of-document id to --vocab-size
        return vocab + 1 if tokenizer_type == "NullTokenizer" else vocab
    if tokenizer_type == ByteTokenizer.name:  # megapilot's byte tokenizer: 256 bytes + EOD + pad
        return ByteTokenizer().vocab_size
    tokenizer = flags.get("--tokenizer-model") or ""
    preset = _tokenizer_preset(tokenizer)
    if preset is not None:
        notes.append(f"vocab size {preset.spec.vocab_size} from the tokenizer {tokenizer} "
                     f"(megapilot's {preset.spec.name})")
        return preset.spec.vocab_size
    # a tokenizer model megapilot cannot name is the one `megapilot script` was given for the header's model;
    # without one (the embedded trainer's bytes, GPT-2 BPE files) the model's vocabulary says nothing
    preset = _header_preset(flags, shape) if tokenizer else None
    if preset is not None:
        notes.append(f"vocab size {preset.spec.vocab_size} from the model the script's header names "
                     f"({preset.spec.name})")
        return preset.spec.vocab_size
    if "llama-3" in tokenizer.lower() or "llama3" in tokenizer.lower():
        return 128256
    notes.append(f"vocab size not in the flags: assumed {ASSUMED_VOCAB_SIZE} (to refine, add it to the flags: "
                 "--flags \"--vocab-size N\" with the tokenizer's size)")
    return ASSUMED_VOCAB_SIZE


def _tokenizer_preset(tokenizer: str) -> ModelPreset | None:
    """The catalog model a --tokenizer-model names: a hub id whose config.json a preset was read from, or a local
    path with a folder named after a preset (`/models/Llama-3.1-70B/tokenizer.model`)."""
    if not tokenizer:
        return None
    if looks_like_hub_id(tokenizer):
        preset = preset_of_hub_repo(tokenizer)
        if preset is not None:
            return preset
    for part in reversed(Path(tokenizer).parts):
        preset = get_preset(part)
        if preset is not None:
            return preset
    return None


def _header_preset(flags: LaunchFlags, shape: tuple[int, int, int]) -> ModelPreset | None:
    """The preset the header of a `megapilot script` script names, when the flags still have its shape (a script
    edited into another model keeps its old header)."""
    preset = get_preset(flags.model_hint) if flags.model_hint else None
    if preset is None:
        return None
    spec = preset.spec
    return preset if (spec.num_layers, spec.hidden_size, spec.num_attention_heads) == shape else None


def _ffn_hidden_size(flags: LaunchFlags, hidden: int) -> int:
    given = flags.get_int("--ffn-hidden-size")
    if given:
        return given
    if flags.has("--swiglu"):  # Megatron's default for SwiGLU: 2/3 of 4h, rounded down to a multiple of 64
        return int(4 * hidden * 2 / 3 / 64) * 64
    return 4 * hidden


def moe_layer_placement(text: str | None) -> tuple[int, int]:
    """(leading dense layers, MoE frequency) from --moe-layer-freq: `2`, `[0,1,1]` or `([0]*1+[1]*26)`.

    A pattern that is not dense-first-then-regular gives its first MoE layer and the first gap.
    """
    if text is None:
        return 0, 1
    text = text.strip()
    if text.isdigit():
        return 0, max(1, int(text))
    bits: list[int] = []
    try:
        for term in text.strip("()").split("+"):
            found = re.fullmatch(r"\s*(\[[\d,\s]*\])\s*(?:\*\s*(\d+))?\s*", term)
            if found is None:
                return 0, 1
            bits += list(ast.literal_eval(found.group(1))) * int(found.group(2) or 1)
    except (ValueError, SyntaxError):
        return 0, 1
    moe_layers = [index for index, bit in enumerate(bits) if bit]
    if not moe_layers:
        return 0, 1
    gaps = {b - a for a, b in itertools.pairwise(moe_layers)}
    return moe_layers[0], min(gaps) if gaps else 1


def _moe(flags: LaunchFlags, ffn: int) -> MoESpec | None:
    experts = flags.get_int("--num-experts")
    if not experts or experts <= 1:
        return None
    first_dense, frequency = moe_layer_placement(flags.get("--moe-layer-freq"))
    balancing = flags.get("--moe-router-load-balancing-type", _str_default("--moe-router-load-balancing-type"))
    router_dtype = flags.get("--moe-router-dtype")
    capacity = _capacity_factor(flags)
    return MoESpec(
        num_experts=experts, router_topk=_megatron_int(flags, "--moe-router-topk"),
        moe_ffn_hidden_size=flags.get_int("--moe-ffn-hidden-size") or ffn,
        latent_size=flags.get_int("--moe-latent-size", minimum=0) or None,
        shared_expert_ffn_hidden_size=flags.get_int("--moe-shared-expert-intermediate-size", 0, minimum=0) or 0,
        first_k_dense_layers=first_dense, moe_layer_freq=frequency,
        shared_expert_gate=flags.has("--moe-shared-expert-gate"),
        router_expert_bias=flags.has("--moe-router-enable-expert-bias"),
        load_balancing_type=_LOAD_BALANCING.get(balancing or "", "aux_loss"),
        aux_loss_coeff=_megatron_float(flags, "--moe-aux-loss-coeff"),
        router_score_function="sigmoid" if flags.get("--moe-router-score-function") == "sigmoid" else "softmax",
        router_pre_softmax=flags.has("--moe-router-pre-softmax"),
        router_topk_scaling_factor=flags.get_float("--moe-router-topk-scaling-factor"),
        router_num_groups=flags.get_int("--moe-router-num-groups"),
        router_group_topk=flags.get_int("--moe-router-group-topk"),
        router_dtype=_ROUTER_DTYPES.get(router_dtype or ""),
        capacity_factor=capacity,
        pad_to_capacity=flags.has("--moe-pad-expert-input-to-capacity") and capacity is not None,
    )


def _capacity_factor(flags: LaunchFlags) -> float | None:
    """--moe-expert-capacity-factor; a negative one means dropless, as Megatron reads it."""
    factor = flags.get_float("--moe-expert-capacity-factor")
    return factor if factor is not None and factor > 0 else None


def _mla(flags: LaunchFlags) -> MLASpec | None:
    if not flags.has("--multi-latent-attention"):
        return None
    return MLASpec(
        q_lora_rank=flags.get_int("--q-lora-rank"), kv_lora_rank=_megatron_int(flags, "--kv-lora-rank"),
        qk_head_dim=_megatron_int(flags, "--qk-head-dim"),
        qk_pos_emb_head_dim=_megatron_int(flags, "--qk-pos-emb-head-dim"),
        v_head_dim=_megatron_int(flags, "--v-head-dim"),
        latent_layernorms=flags.has("--qk-layernorm"),  # under MLA, Megatron's --qk-layernorm builds the latent norms
        dsa=_dsa(flags),
    )


def _dsa(flags: LaunchFlags) -> DSASpec | None:
    """--experimental-attention-variant dsa and its indexer; Megatron has no default for the indexer's shape, so a
    script that leaves one out (it would not start) is read as dense MLA."""
    if flags.get("--experimental-attention-variant") != "dsa":
        return None
    heads, dim, topk = (flags.get_int(name) for name in ("--dsa-indexer-n-heads", "--dsa-indexer-head-dim",
                                                         "--dsa-indexer-topk"))
    if not (heads and dim and topk):
        return None
    return DSASpec(indexer_heads=heads, indexer_head_dim=dim, topk=topk,
                   topk_freq=_int_or(flags, "--dsa-indexer-topk-freq", 1),
                   skip_topk_offset=flags.get_int("--dsa-indexer-skip-topk-offset", 0, minimum=0) or 0,
                   rope_interleaved=_read(flags, "--dsa-indexer-rope-interleaved"),
                   rotate_activation=_read(flags, "--no-dsa-indexer-rotate-activation")
                   and not flags.has("--disable-dsa-indexer-rotate-activation"))  # (Megatron's other spelling)


def _layer_blocks(flags: LaunchFlags, heads: int, hidden: int, ffn: int,
                  notes: list[str]) -> tuple[LayerBlock, ...] | None:
    """A heterogeneous model's per-layer shapes, from the block-config file its flags name (when it is here); a
    block states only what differs from the flags' model-wide KV heads and MLP width."""
    path = flags.get("--heterogeneous-layers-config-path")
    if not path:
        return None
    kv_heads = flags.get_int("--num-query-groups", heads) if flags.has("--group-query-attention") else heads
    try:
        block_configs = json.loads(Path(path).read_text()).get("block_configs")
        return layer_blocks_from_block_configs(block_configs, heads, hidden, kv_heads or heads, ffn)
    except (OSError, ValueError, AttributeError, MegapilotError) as error:
        notes.append(f"--heterogeneous-layers-config-path {path} not read ({error}): layers taken as one shape")
        return None


@dataclass(frozen=True)
class HybridPattern:
    """A hybrid's `--hybrid-layer-pattern` (Megatron-LM >= 0.18; `--hybrid-override-pattern` before) in
    Megatron's unified grammar: the decoder's layers, cut into pipeline segments by '|', then after each '/'
    one MTP depth's pattern (all alike; `hybrid_layer_allocation.parse_hybrid_pattern`)."""

    layers: str
    segment_sizes: tuple[int, ...] = ()
    mtp: str | None = None
    mtp_depths: int = 0

    @property
    def segments(self) -> int:
        return max(1, len(self.segment_sizes))


def _hybrid_pattern(flags: LaunchFlags) -> HybridPattern | None:
    """A Mamba hybrid's layer pattern, with the older flags for its MTP module where the pattern has none."""
    raw = flags.get("--hybrid-override-pattern") or flags.get("--hybrid-layer-pattern")
    if not raw:
        return None
    main, *depths = raw.split("/")
    depths = [depth for depth in depths if depth]
    if any(depth != depths[0] for depth in depths):
        raise MegapilotError(f"the MTP patterns after '/' differ: {'/'.join(depths)}", field="--hybrid-layer-pattern",
                             fix="give every MTP depth the same pattern, as Megatron-LM requires")
    mtp = depths[0] if depths else flags.get("--mtp-hybrid-override-pattern") or None
    return HybridPattern(main.replace("|", ""), tuple(len(part) for part in main.split("|")), mtp, len(depths))


def _mamba(flags: LaunchFlags, pattern: str | None) -> MambaSpec | None:
    """A hybrid's Mamba-2 mixer, Megatron's defaults where unstated; None without Mamba layers in `pattern`."""
    if "M" not in (pattern or ""):
        return None
    defaults = MambaSpec()
    return MambaSpec(
        state_dim=_int_or(flags, "--mamba-state-dim", defaults.state_dim),
        head_dim=_int_or(flags, "--mamba-head-dim", defaults.head_dim),
        num_groups=_int_or(flags, "--mamba-num-groups", defaults.num_groups),
        num_heads=flags.get_int("--mamba-num-heads"),
    )


def _int_or(flags: LaunchFlags, name: str, default: int) -> int:
    """A whole-number flag, or Megatron's default when it is absent, unreadable or 0."""
    return flags.get_int(name, default) or default


def _megatron_int(flags: LaunchFlags, name: str) -> int:
    """A whole-number flag, or its default in the Megatron vocabulary when it is absent, unreadable or 0."""
    return _int_or(flags, name, int_default(name))


def _megatron_float(flags: LaunchFlags, name: str) -> float:
    """A float flag, or its default in the Megatron vocabulary when it is absent, unreadable or 0."""
    return flags.get_float(name, float_default(name)) or float_default(name)


def _str_default(name: str) -> str:
    value = default(name)
    assert isinstance(value, str), name
    return value


def _gated_delta_net(flags: LaunchFlags) -> GatedDeltaNetSpec | None:
    """--experimental-attention-variant gated_delta_net and its shape (core_v0.16.0's defaults where unstated)."""
    if flags.get("--experimental-attention-variant") != "gated_delta_net":
        return None
    defaults = GatedDeltaNetSpec()
    return GatedDeltaNetSpec(
        key_heads=_int_or(flags, "--linear-num-key-heads", defaults.key_heads),
        value_heads=_int_or(flags, "--linear-num-value-heads", defaults.value_heads),
        key_head_dim=_int_or(flags, "--linear-key-head-dim", defaults.key_head_dim),
        value_head_dim=_int_or(flags, "--linear-value-head-dim", defaults.value_head_dim),
        conv_kernel=_int_or(flags, "--linear-conv-kernel-dim", defaults.conv_kernel),
        full_attention_freq=_int_or(flags, "--linear-attention-freq", defaults.full_attention_freq),
    )


# MLATransformerConfig's YaRN original context, which no flag sets: what the model is under `--rope-type yarn`.
_YARN_ORIGINAL_MAX_POSITIONS = 4096


def _rope_scaling(flags: LaunchFlags) -> Llama3RopeScaling | YarnRopeScaling | None:
    """Llama 3 scaling (--use-rope-scaling), YaRN under MLA (--rope-type yarn) or under standard attention
    (--position-embedding-type yarn, core_v0.19.0 on)."""
    if flags.get("--position-embedding-type") == "yarn" and not flags.has("--multi-latent-attention"):
        return YarnRopeScaling(
            factor=_megatron_float(flags, "--rotary-scaling-factor"),
            original_max_position_embeddings=_megatron_int(flags, "--yarn-original-max-position-embeddings"),
            beta_fast=_megatron_float(flags, "--yarn-beta-fast"), beta_slow=_megatron_float(flags, "--yarn-beta-slow"),
            mscale=_megatron_float(flags, "--mscale"), mscale_all_dim=_megatron_float(flags, "--mscale-all-dim"),
            truncate=_read(flags, "--no-yarn-correction-range-round-to-int"))
    if flags.has("--multi-latent-attention"):
        if flags.get("--rope-type") != "yarn":
            return None
        return YarnRopeScaling(factor=_megatron_float(flags, "--rotary-scaling-factor"),
                               original_max_position_embeddings=_YARN_ORIGINAL_MAX_POSITIONS,
                               mscale=_megatron_float(flags, "--mscale"),
                               mscale_all_dim=_megatron_float(flags, "--mscale-all-dim"))
    if not flags.has("--use-rope-scaling"):
        return None
    return Llama3RopeScaling(factor=_megatron_float(flags, "--rope-scaling-factor"))


def _read(flags: LaunchFlags, flag: str, *context: object) -> Any:
    """The field a flag says, read by its vocabulary row (the rule the launch script was written by): a switch by
    whether it is there, a valued flag from its text (None: absent); `context`: the values of the row's
    `context_paths`, read already."""
    row = term(flag)
    if row.kind == "int":
        flags.get_int(flag)  # read strictly first: a derivation would read a bad value as unset, in silence
    return row.read(flags.has(flag) if row.kind == "bool" else flags.get(flag), *context)


def _softmax_type(flags: LaunchFlags) -> SoftmaxType:
    given = flags.get("--softmax-type") or _str_default("--softmax-type")
    return _SOFTMAX_TYPES.get(given, "vanilla")


def _activation(flags: LaunchFlags) -> MlpActivation:
    said = (_read(flags, flag) for flag in ("--swiglu", "--squared-relu", "--quick-geglu"))
    return next((activation for activation in said if activation is not None), "gelu")  # gelu: Megatron's default


def _position_embedding(flags: LaunchFlags) -> PositionEmbedding:
    if flags.has("--use-rotary-position-embeddings"):
        return "rope"
    if flags.has("--no-position-embedding"):
        return "none"
    given = flags.get("--position-embedding-type") or _str_default("--position-embedding-type")
    return _POSITION_EMBEDDINGS.get(given, "rope")


def _model(flags: LaunchFlags, seq_length: int | None, notes: list[str]) -> ModelSpec | None:
    layers, hidden, heads = (flags.get_int(n) for n in ("--num-layers", "--hidden-size", "--num-attention-heads"))
    hybrid = _hybrid_pattern(flags)
    layers = layers or (len(hybrid.layers) if hybrid else None)  # Megatron >= 0.18 counts them from the pattern
    if not (layers and hidden and heads):
        notes.append("model shape incomplete (need --num-layers, --hidden-size, --num-attention-heads)")
        return None
    ffn = _ffn_hidden_size(flags, hidden)
    kv_channels = _read(flags, "--kv-channels", hidden, heads)  # unset where it is Megatron's default, hidden / heads
    pattern = hybrid.layers if hybrid else None
    return ModelSpec(
        name=Path(flags.source).stem if flags.source != "<flags>" else "from-flags",
        num_layers=layers, hidden_size=hidden, ffn_hidden_size=ffn, num_attention_heads=heads,
        num_query_groups=(flags.get_int("--num-query-groups", int_default("--num-query-groups"))
                          if flags.has("--group-query-attention") else None),
        kv_channels=kv_channels, vocab_size=_vocab_size(flags, notes, (layers, hidden, heads)),
        make_vocab_size_divisible_by=_megatron_int(flags, "--make-vocab-size-divisible-by"),
        max_position_embeddings=flags.get_int("--max-position-embeddings") or seq_length or 4096,
        mlp_activation=_activation(flags),
        normalization="RMSNorm" if flags.get("--normalization") == "RMSNorm" else "LayerNorm",
        norm_epsilon=_megatron_float(flags, "--norm-epsilon"),
        position_embedding=_position_embedding(flags),
        rotary_base=_megatron_int(flags, "--rotary-base"),
        rotary_percent=_megatron_float(flags, "--rotary-percent"),
        norm_zero_centered=_read(flags, "--apply-layernorm-1p"),
        attention_output_gate=_read(flags, "--attention-output-gate"), gated_delta_net=_gated_delta_net(flags),
        tie_embeddings=_read(flags, "--untie-embeddings-and-output-weights"),
        add_bias_linear=_read(flags, "--disable-bias-linear"),
        add_qkv_bias=flags.has("--add-qkv-bias"),
        # (Megatron's layer specs build the L2 norm in place of a weighted one when both switches are given)
        qk_layernorm=flags.has("--qk-layernorm") and not flags.has("--multi-latent-attention")
        and not flags.has("--qk-l2-norm"),
        qk_l2_norm=_read(flags, "--qk-l2-norm"),
        rope_scaling=_rope_scaling(flags), sliding_window=_read(flags, "--window-size"),
        sliding_window_skip_freq=_read(flags, "--window-attn-skip-freq") if flags.has("--window-size") else None,
        softmax_type=_softmax_type(flags),
        glu_linear_offset=_megatron_float(flags, "--glu-linear-offset"),
        activation_clamp=_read(flags, "--activation-func-clamp-value"),
        moe=_moe(flags, ffn), mla=_mla(flags),
        mtp_num_layers=flags.get_int("--mtp-num-layers", minimum=0) or (hybrid.mtp_depths if hybrid else 0),
        mtp_loss_scaling_factor=flags.get_float("--mtp-loss-scaling-factor", float_default("--mtp-loss-scaling-factor"))
        or 0.0,
        mtp_repeated_layer=_read(flags, "--mtp-use-repeated-layer"),
        hybrid_override_pattern=pattern, mamba=_mamba(flags, pattern),
        layer_blocks=_layer_blocks(flags, heads, hidden, ffn, notes),
        mtp_hybrid_pattern=hybrid.mtp if hybrid else None,
    )


def _training(flags: LaunchFlags, precision: str, parallel: ParallelConfig | None,
              notes: list[str]) -> TrainingSpec | None:
    seq = flags.get_int("--seq-length")
    if not seq:
        notes.append("--seq-length not in the flags")
        return None
    gbs = flags.get_int("--global-batch-size")
    if not gbs:
        gbs = (parallel.mbs * parallel.dp) if parallel else 1
        notes.append(f"--global-batch-size not in the flags: assumed MBS x DP = {gbs}")
    train_iters = flags.get_int("--train-iters", 100) or 100
    warmup = flags.get_int("--lr-warmup-iters", minimum=0)
    if warmup is None and flags.get_float("--lr-warmup-fraction"):
        warmup = int(train_iters * (flags.get_float("--lr-warmup-fraction") or 0))
    gemm_precision, fp8_recipe = _gemm_precision(flags, precision, notes)
    return TrainingSpec(
        seq_length=seq, global_batch_size=gbs, precision=gemm_precision, fp8_recipe=fp8_recipe,
        train_iters=train_iters, lr=flags.get_float("--lr", 3e-4) or 3e-4,
        min_lr=_megatron_float(flags, "--min-lr"), lr_warmup_iters=warmup or 0,
        clip_grad=flags.get_float("--clip-grad", float_default("--clip-grad")) or 0.0,
        init_method_std=_megatron_float(flags, "--init-method-std"),
        optimizer=_optimizer(flags, notes),
        grad_reduce_in_bf16=flags.has("--grad-reduce-in-bf16") and flags.has("--bf16"),  # Megatron reads it so
    )


def _gemm_precision(flags: LaunchFlags, precision: str, notes: list[str]) -> tuple[Precision, Fp8Recipe]:
    """The GEMM precision and FP8 recipe the flags run (`launch.flags.quant_flavour_of_flags`, Megatron's default
    recipe where a script names the format alone); fp32 runs are priced as bf16, as before."""
    flavour = quant_flavour_of_flags(flags.get("--fp8-format") or ("hybrid" if flags.has("--fp8") else None),
                                     flags.get("--fp8-recipe"), flags.get("--fp4-format"), flags.get("--fp4-recipe"))
    if flavour == "custom":  # a quantisation recipe factory of the user's own: the estimate cannot know its scaling
        notes.append(f"--{precision}-recipe custom is not modelled: priced as "
                     + ("NVFP4" if precision == "fp4" else "FP8 with per-tensor current scaling"))
        flavour = "nvfp4" if precision == "fp4" else "fp8-tensorwise"
    if flavour is None:
        return ("fp16" if precision == "fp16" else "bf16"), DEFAULT_FP8_RECIPE
    if flavour.startswith("fp8-"):
        return "fp8", flavour.removeprefix("fp8-")  # type: ignore[return-value]  # delayed/tensorwise/blockwise
    return flavour, DEFAULT_FP8_RECIPE  # type: ignore[return-value]  # mxfp8 / nvfp4: precisions themselves


def _optimizer(flags: LaunchFlags, notes: list[str]) -> Optimizer:
    """`--optimizer` as priced (Adam, Muon, Muon sharded layer-wise); any other is read as Adam, and said so."""
    name = flags.get("--optimizer") or "adam"
    if name in OPTIMIZERS:
        return name  # type: ignore[return-value]  # one of the Optimizer literals
    notes.append(f"--optimizer {name} is not modelled: its state and step are priced as Adam's")
    return "adam"


def _hybrid_virtual_stages(flags: LaunchFlags, pp: int) -> int:
    """A hybrid pattern's '|' segments are its PP x VPP pipeline stages (Megatron-LM >= 0.17), as the script writes
    them (`launch.hybrid_split.segments_virtual_stages`)."""
    hybrid = _hybrid_pattern(flags)
    return 1 if hybrid is None else segments_virtual_stages(hybrid.segments, pp)


def _hybrid_layout(flags: LaunchFlags, pp: int, mtp_num_layers: int) -> str | None:
    """A hybrid pattern's uneven '|' segments as the layout string of the stages they are (the embedding before the
    first segment's layers, the MTP modules and the loss after the last's, where MambaModel builds them); None for
    a pattern without segments or with equal ones (an even split, interleaved or not)."""
    hybrid = _hybrid_pattern(flags)
    if hybrid is None or len(set(hybrid.segment_sizes)) <= 1 or hybrid.segments % pp:
        return None
    stages = [DECODER * size for size in hybrid.segment_sizes]
    stages[0] = EMBEDDING + stages[0]
    stages[-1] += MTP * mtp_num_layers + LOSS
    return compress_layout(stages)


def _parallel(flags: LaunchFlags, world: int, num_layers: int | None, mtp_num_layers: int = 0) -> ParallelConfig:
    tp = _megatron_int(flags, "--tensor-model-parallel-size")
    pp = _megatron_int(flags, "--pipeline-model-parallel-size")
    vpp = flags.get_int("--num-virtual-stages-per-pipeline-rank") or _hybrid_virtual_stages(flags, pp)
    per_virtual = flags.get_int("--num-layers-per-virtual-pipeline-stage")
    if per_virtual and num_layers and pp > 1:
        accounted = sum(flags.has(name) for name in ("--account-for-embedding-in-pipeline-split",
                                                     "--account-for-loss-in-pipeline-split"))
        vpp = max(1, (num_layers + accounted) // (pp * per_virtual))
    selective = _read(flags, "--recompute-activations") or "none"
    recompute = flags.get("--recompute-granularity") or selective
    method = flags.get("--recompute-method")
    modules = tuple((flags.get("--recompute-modules") or "").split())
    # beyond Megatron's most (none beside PP or recompute) the script never trained with it
    offloaded = flags.get_int("--cpu-offloading-num-layers", minimum=0) or 0
    # one CP exchange for every layer (a per-layer list of one value is the same); any other is not priced: the ring
    comm_types = set((flags.get("--cp-comm-type") or _str_default("--cp-comm-type")).split())
    cp_comm_type = "a2a" if comm_types == {"a2a"} else "p2p"
    if offloaded > most_offloaded_layers(num_layers if num_layers is not None else offloaded + 1, pp, recompute):
        offloaded = 0
    return ParallelConfig.for_world(
        world, tp=tp, pp=pp, vpp=vpp,
        cp=flags.get_int("--context-parallel-size", int_default("--context-parallel-size")),
        cp_comm_type=cp_comm_type,
        ep=flags.get_int("--expert-model-parallel-size", int_default("--expert-model-parallel-size")),
        etp=_read(flags, "--expert-tensor-parallel-size", tp),  # unset where it is TP, as the script was written
        mbs=flags.get_int("--micro-batch-size", int_default("--micro-batch-size")),
        sequence_parallel=flags.has("--sequence-parallel") and tp > 1,
        recompute=recompute if recompute in ("none", "selective", "full") else "none",
        recompute_method=method if recompute == "full" and method in ("uniform", "block") else "uniform",
        recompute_num_layers=flags.get_int("--recompute-num-layers") if recompute == "full" else None,
        recompute_modules=modules if recompute == "selective" and modules and set(modules) <= set(RECOMPUTE_MODULES)
        else None,
        distributed_optimizer=flags.has("--use-distributed-optimizer"),
        fsdp=any(flags.has(name) for name in FSDP_SWITCHES),
        first_stage_layers=flags.get_int("--decoder-first-pipeline-num-layers"),
        last_stage_layers=flags.get_int("--decoder-last-pipeline-num-layers"),
        account_for_embedding=flags.has("--account-for-embedding-in-pipeline-split"),
        account_for_loss=flags.has("--account-for-loss-in-pipeline-split"),
        pipeline_layout=flags.get("--pipeline-model-parallel-layout") or _hybrid_layout(flags, pp, mtp_num_layers),
        cpu_offloading_num_layers=offloaded,
    )


def _gpu_named_in_header(flags: LaunchFlags, notes: list[str]) -> GPUSpec | None:
    """The GPU a script from `megapilot script` names in its header, unless it runs over gloo (a CPU run)."""
    if flags.gpu_hint is None or flags.get("--distributed-backend") == "gloo":
        return None
    try:
        gpu = get_gpu(flags.gpu_hint)
    except MegapilotError:
        return None
    notes.append(f"GPU type {gpu.name} from the script's header (pass --gpu to override)")
    return gpu


def _flag_error(error: MegapilotError, flags: LaunchFlags) -> MegapilotError:
    """A spec's validation error as the Megatron flag that carries the field (`tp` -> --tensor-model-parallel-size),
    or the launch it came from where no one flag does."""
    flag = next((row.flag for row in TERMS if row.field and error.field
                 and row.field.split(".", 1)[1] == error.field and flags.has(row.flag)), None)
    where = flag or ("--flags" if flags.source == "<flags>" else "--script")
    return MegapilotError(error.problem, field=where,
                          fix=f"correct {flag or 'the flags'} in the launch script or --flags, as Megatron-LM requires")


def run_config(flags: LaunchFlags, *, gpu: GPUSpec | None = None, gpus: int | None = None) -> RunConfig:
    """The typed run the flags describe (parts left None where the flags are silent)."""
    notes: list[str] = []
    if unset := flags.left_to_the_shell:  # read as absent: said, since a default now stands in for what ran
        notes.append(f"{', '.join(f'{name} {flags.values[name]}' for name in unset)}: set by the environment the "
                     "script runs in, not in the script; read as not given (pass them with --flags to use them)")
    _check_values_given(flags)
    precision = _precision(flags)
    tp, pp, cp = (_megatron_int(flags, name) for name in ("--tensor-model-parallel-size",
                                                         "--pipeline-model-parallel-size", "--context-parallel-size"))
    header_notes: list[str] = []  # said after the model's, where they always stood
    if gpu is None:
        gpu = _gpu_named_in_header(flags, header_notes)
    world, world_size_assumed = _world_size(flags, gpus, gpu, notes)
    if world is None:
        world, world_size_assumed = tp * pp * cp, True
        notes.append(f"GPU count not given (--gpus, or torchrun --nproc-per-node/--nnodes): assumed TP*PP*CP = {world}")
    try:
        model = _model(flags, flags.get_int("--seq-length"), notes)
        parallel = _parallel(flags, world, model.num_layers if model else flags.get_int("--num-layers"),
                             model.mtp_num_layers if model else 0)
        training = _training(flags, precision, parallel, notes)
    except MegapilotError:
        raise  # already names the field
    except ValueError as exc:  # pydantic validation of the specs
        raise _flag_error(from_validation_error(exc), flags) from exc
    notes += header_notes
    if gpu is None and flags.get("--distributed-backend") != "gloo":  # a gloo run is priced on this machine's CPU
        notes.append("GPU type not given (--gpu): no memory or throughput predictions")
    return RunConfig(flags=flags, gpu=gpu, world_size=world, model=model, training=training, parallel=parallel,
                     precision_flag=precision, notes=notes, world_size_assumed=world_size_assumed)
