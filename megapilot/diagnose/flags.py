"""Megatron-LM flags out of a launch script or a flag string, and the run they describe.

`read_flags(script=..., flags=...)` tokenises with `shlex` (never a shell): line continuations are
joined, comments dropped, and simple shell variables (`TP=8`, `export SEQ=4096`, arrays
`GPT_ARGS=( ... )`, `${VAR:-default}`) substituted, then every `--flag [value]` token of the text is
collected (torchrun's `--nproc-per-node`/`--nnodes` included, for the world size). Which flags are
switches comes from the pinned Megatron-LM parser (`megapilot.launch.megatron_args`); unknown flags
take one value when a non-flag token follows.

`run_config(flags, gpu=, gpus=)` turns them into the typed specs the estimators read.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from megapilot.errors import MegapilotError, from_validation_error
from megapilot.spec import ClusterSpec, GPUSpec, ModelSpec, MoESpec, ParallelConfig, TrainingSpec

_ASSIGNMENT_RE = re.compile(r"^\s*(?:export\s+|local\s+|declare\s+(?:-\w+\s+)?)?([A-Za-z_]\w*)=(.*)$")
_VARIABLE_RE = re.compile(r"\$\{([A-Za-z_]\w*)(?:\[@\]|\[\*\])?(?::?-([^}]*))?\}|\$([A-Za-z_]\w*)")
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

    def has(self, name: str) -> bool:
        return name in self.values

    def get(self, name: str, default: str | None = None) -> str | None:
        value = self.values.get(name, default)
        return default if value is None else value

    def get_int(self, name: str, default: int | None = None) -> int | None:
        raw = self.values.get(name)
        if raw is None:
            return default
        try:
            return int(float(raw))
        except ValueError:
            return default

    def get_float(self, name: str, default: float | None = None) -> float | None:
        raw = self.values.get(name)
        if raw is None:
            return default
        try:
            return float(raw)
        except ValueError:
            return default


def _switch_names() -> frozenset[str]:
    try:
        from megapilot.launch.megatron_args import pinned_flags
    except ImportError:  # the launch package is optional for diagnosis
        return frozenset()
    return frozenset(name for name, spec in pinned_flags().items() if not spec.takes_value)


def _join_continuations(text: str) -> list[str]:
    lines = re.sub(r"\\\r?\n", " ", text).splitlines()
    joined: list[str] = []
    open_array: list[str] | None = None
    for line in lines:
        if open_array is not None:
            open_array.append(line)
            if ")" in line:
                joined.append(" ".join(open_array))
                open_array = None
            continue
        if re.match(r"^\s*(?:export\s+)?[A-Za-z_]\w*=\(", line) and ")" not in line:
            open_array = [line]
            continue
        joined.append(line)
    if open_array:
        joined.append(" ".join(open_array))
    return joined


def _expand(text: str, variables: dict[str, str]) -> str:
    def replace(found: re.Match[str]) -> str:
        name = found.group(1) or found.group(3)
        if name in variables:
            return variables[name]
        if found.group(2) is not None:
            return found.group(2)
        return found.group(0)

    for _ in range(3):  # variables defined from other variables
        expanded = _VARIABLE_RE.sub(replace, text)
        if expanded == text:
            break
        text = expanded
    return text


def _assignment_value(raw: str, variables: dict[str, str]) -> str | None:
    raw = _expand(raw.strip(), variables)
    if raw.startswith("(") and raw.rstrip().endswith(")"):
        raw = raw.strip()[1:-1]
    try:
        tokens = shlex.split(raw, comments=True)
    except ValueError:
        return None
    return " ".join(shlex.quote(t) for t in tokens) if len(tokens) != 1 else tokens[0]


def _tokens(text: str) -> list[str]:
    variables: dict[str, str] = {}
    tokens: list[str] = []
    for line in _join_continuations(text):
        assignment = _ASSIGNMENT_RE.match(line)
        if assignment and not assignment.group(2).startswith(("=", " ")):
            value = _assignment_value(assignment.group(2), variables)
            if value is not None:
                variables[assignment.group(1)] = value
            continue
        try:
            tokens.extend(shlex.split(_expand(line, variables), comments=True))
        except ValueError as exc:
            raise MegapilotError(f"cannot split a line of the script into words ({exc}): {line.strip()[:80]}",
                                 field="script", fix="balance the quotes on that line") from exc
    return tokens


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
        following = tokens[index] if index < len(tokens) else None
        if takes_value and following is not None and not (following.startswith("--") and len(following) > 2
                                                          and not following[2].isdigit()):
            values[name] = following
            index += 1
        else:
            values[name] = None
    return LaunchFlags(values=values, source=source)


def read_flags(*, script: str | Path | None = None, flags: str | None = None) -> LaunchFlags | None:
    """Flags from a launch script, a flag string, or both (the string wins on conflicts); None if neither."""
    collected: dict[str, str | None] = {}
    source = "<flags>"
    if script is not None:
        path = Path(script)
        if not path.is_file():
            raise MegapilotError(f"no such script: {script}", field="script", fix="pass the path of the launch script")
        collected.update(_collect(_tokens(path.read_text(errors="replace")), str(path)).values)
        source = str(path)
    if flags is not None:
        try:
            words = shlex.split(flags)
        except ValueError as exc:
            raise MegapilotError(f"cannot split into words: {exc}", field="flags", fix="balance the quotes") from exc
        collected.update(_collect(words, "<flags>").values)
    if script is None and flags is None:
        return None
    return LaunchFlags(values=collected, source=source)


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
    precision_flag: str  # what the flags ask for: fp32 | fp16 | bf16 | fp8
    notes: list[str] = field(default_factory=list)

    @property
    def cluster(self) -> ClusterSpec | None:
        if self.gpu is None:
            return None
        return ClusterSpec.from_gpu_count(self.gpu, self.world_size)

    @property
    def complete(self) -> bool:
        """Whether the estimators can cost this run."""
        return None not in (self.gpu, self.model, self.training, self.parallel)


def _precision(flags: LaunchFlags) -> str:
    if flags.has("--fp8-format") or flags.has("--fp8"):
        return "fp8"
    if flags.has("--bf16"):
        return "bf16"
    if flags.has("--fp16"):
        return "fp16"
    return "fp32"


def _world_size(flags: LaunchFlags, gpus: int | None) -> int | None:
    if gpus:
        return gpus
    per_node = flags.get_int("--nproc-per-node") or flags.get_int("--nproc_per_node")
    nodes = flags.get_int("--nnodes", 1)
    if per_node:
        return per_node * (nodes or 1)
    return None


def _vocab_size(flags: LaunchFlags, notes: list[str]) -> int:
    if flags.get_int("--vocab-size"):
        return flags.get_int("--vocab-size")  # type: ignore[return-value]
    tokenizer = (flags.get("--tokenizer-model") or "").lower()
    if "llama-3" in tokenizer or "llama3" in tokenizer:
        return 128256
    notes.append("vocab size not in the flags: assumed 32000 (pass --vocab-size to refine)")
    return 32000


def _ffn_hidden_size(flags: LaunchFlags, hidden: int) -> int:
    if flags.get_int("--ffn-hidden-size"):
        return flags.get_int("--ffn-hidden-size")  # type: ignore[return-value]
    if flags.has("--swiglu"):  # Megatron's default for SwiGLU: 2/3 of 4h, rounded down to a multiple of 64
        return int(4 * hidden * 2 / 3 / 64) * 64
    return 4 * hidden


def _model(flags: LaunchFlags, seq_length: int | None, notes: list[str]) -> ModelSpec | None:
    layers, hidden, heads = (flags.get_int(n) for n in ("--num-layers", "--hidden-size", "--num-attention-heads"))
    if not (layers and hidden and heads):
        notes.append("model shape incomplete (need --num-layers, --hidden-size, --num-attention-heads)")
        return None
    moe = None
    experts = flags.get_int("--num-experts")
    ffn = _ffn_hidden_size(flags, hidden)
    if experts and experts > 1:
        moe = MoESpec(
            num_experts=experts, router_topk=flags.get_int("--moe-router-topk", 2) or 2,
            moe_ffn_hidden_size=flags.get_int("--moe-ffn-hidden-size") or ffn,
            shared_expert_ffn_hidden_size=flags.get_int("--moe-shared-expert-intermediate-size", 0) or 0,
            moe_layer_freq=flags.get_int("--moe-layer-freq", 1) or 1,
        )
    return ModelSpec(
        name=Path(flags.source).stem if flags.source != "<flags>" else "from-flags",
        num_layers=layers, hidden_size=hidden, ffn_hidden_size=ffn, num_attention_heads=heads,
        num_query_groups=flags.get_int("--num-query-groups", 1) if flags.has("--group-query-attention") else None,
        kv_channels=flags.get_int("--kv-channels"), vocab_size=_vocab_size(flags, notes),
        max_position_embeddings=flags.get_int("--max-position-embeddings") or seq_length or 4096,
        mlp_activation="swiglu" if flags.has("--swiglu") else "gelu",
        normalization="RMSNorm" if flags.get("--normalization") == "RMSNorm" else "LayerNorm",
        tie_embeddings=not flags.has("--untie-embeddings-and-output-weights"),
        moe=moe, mtp_num_layers=flags.get_int("--mtp-num-layers", 0) or 0,
    )


def _training(flags: LaunchFlags, precision: str, parallel: ParallelConfig | None, notes: list[str]) -> TrainingSpec | None:
    seq = flags.get_int("--seq-length")
    if not seq:
        notes.append("--seq-length not in the flags")
        return None
    gbs = flags.get_int("--global-batch-size")
    if not gbs:
        gbs = (parallel.mbs * parallel.dp) if parallel else 1
        notes.append(f"--global-batch-size not in the flags: assumed MBS x DP = {gbs}")
    train_iters = flags.get_int("--train-iters", 100) or 100
    warmup = flags.get_int("--lr-warmup-iters")
    if warmup is None and flags.get_float("--lr-warmup-fraction"):
        warmup = int(train_iters * (flags.get_float("--lr-warmup-fraction") or 0))
    return TrainingSpec(
        seq_length=seq, global_batch_size=gbs,
        precision=precision if precision in ("bf16", "fp16", "fp8") else "bf16",  # type: ignore[arg-type]
        train_iters=train_iters, lr=flags.get_float("--lr", 3e-4) or 3e-4,
        min_lr=flags.get_float("--min-lr", 0.0) or 0.0, lr_warmup_iters=warmup or 0,
        clip_grad=flags.get_float("--clip-grad", 1.0) if flags.get_float("--clip-grad", 1.0) is not None else 1.0,
        init_method_std=flags.get_float("--init-method-std", 0.02) or 0.02,
    )


def _parallel(flags: LaunchFlags, world: int, num_layers: int | None) -> ParallelConfig:
    tp = flags.get_int("--tensor-model-parallel-size", 1) or 1
    pp = flags.get_int("--pipeline-model-parallel-size", 1) or 1
    vpp = flags.get_int("--num-virtual-stages-per-pipeline-rank") or 1
    per_virtual = flags.get_int("--num-layers-per-virtual-pipeline-stage")
    if per_virtual and num_layers and pp > 1:
        vpp = max(1, num_layers // (pp * per_virtual))
    recompute = flags.get("--recompute-granularity") or ("selective" if flags.has("--recompute-activations") else "none")
    return ParallelConfig.for_world(
        world, tp=tp, pp=pp, vpp=vpp, cp=flags.get_int("--context-parallel-size", 1),
        ep=flags.get_int("--expert-model-parallel-size", 1), etp=flags.get_int("--expert-tensor-parallel-size"),
        mbs=flags.get_int("--micro-batch-size", 1), sequence_parallel=flags.has("--sequence-parallel") and tp > 1,
        recompute=recompute if recompute in ("none", "selective", "full") else "none",
        recompute_method=flags.get("--recompute-method") if recompute == "full" and flags.get("--recompute-method") in ("uniform", "block") else "uniform",
        recompute_num_layers=flags.get_int("--recompute-num-layers") if recompute == "full" else None,
        distributed_optimizer=flags.has("--use-distributed-optimizer"),
    )


def run_config(flags: LaunchFlags, *, gpu: GPUSpec | None = None, gpus: int | None = None) -> RunConfig:
    """The typed run the flags describe (parts left None where the flags are silent)."""
    notes: list[str] = []
    precision = _precision(flags)
    tp = flags.get_int("--tensor-model-parallel-size", 1) or 1
    pp = flags.get_int("--pipeline-model-parallel-size", 1) or 1
    cp = flags.get_int("--context-parallel-size", 1) or 1
    world = _world_size(flags, gpus)
    if world is None:
        world = tp * pp * cp
        notes.append(f"GPU count not given (--gpus, or torchrun --nproc-per-node/--nnodes): assumed TP*PP*CP = {world}")
    try:
        model = _model(flags, flags.get_int("--seq-length"), notes)
        parallel = _parallel(flags, world, model.num_layers if model else flags.get_int("--num-layers"))
        training = _training(flags, precision, parallel, notes)
    except MegapilotError:
        raise  # already names the field
    except ValueError as exc:  # pydantic validation of the specs
        raise from_validation_error(exc, prefix="flags") from exc
    if gpu is None:
        notes.append("GPU type not given (--gpu): no memory or throughput predictions")
    return RunConfig(flags=flags, gpu=gpu, world_size=world, model=model, training=training, parallel=parallel,
                     precision_flag=precision, notes=notes)
