"""Plan + options -> the complete Megatron-LM `pretrain_gpt.py` argument list.

Arguments come in titled sections (model, parallelism, ...) so that a script reads like the plan
it came from; `render_megatron_args` flattens them. Names and choices follow Megatron-LM
core_v0.16.0 (`megatron_args.py` checks them against the pinned parser).
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath

from megapilot import vocabulary
from megapilot.errors import MegapilotError
from megapilot.launch import heterogeneous
from megapilot.launch.hybrid_split import PATTERN_FLAG, HybridSplit, hybrid_split
from megapilot.launch.megatron_args import FlagTable, Version
from megapilot.launch.model_flags import dsa_kernel_args, model_section
from megapilot.launch.options import TOKENIZERS_WITHOUT_MODEL, LaunchOptions
from megapilot.launch.perf_flags import (
    cuda_graph_sections,
    flex_dispatcher_backend,
    fp8_param_gather_applies,
    meta_device_init_needed,
    param_gather_overlaps_optimizer_step,
    performance_sections,
)
from megapilot.launch.sections import ArgSection
from megapilot.launch.versions import resolve_flag_table, target_release
from megapilot.spec import ModelSpec, ParallelConfig, SavedPlan, TrainingSpec
from megapilot.spec.cuda_graphs import pads_routing_for_quantization


def render_megatron_args(plan: SavedPlan, options: LaunchOptions) -> list[str]:
    """The flat argument list the script passes to pretrain_gpt.py."""
    return [token for section in megatron_arg_sections(plan, options) for token in section.args]


def megatron_arg_sections(plan: SavedPlan, options: LaunchOptions, table: FlagTable | None = None) -> list[ArgSection]:
    """All argument sections, in the order a reader looks for them, for `table`'s release (None: the one the
    options name, `versions.resolve_flag_table`)."""
    table = table or resolve_flag_table(options)
    hybrid = _hybrid_split(plan, target_release(options, table))
    model = _with_positions_for(model_section(plan.model, table, cpu=options.cpu), plan.model, plan.training)
    return [
        _with_hybrid_pattern(
            _with_dsa_kernels(_with_layer_blocks(_with_dispatcher(model, flex_dispatcher_backend(plan, options)),
                                                 plan.model, options), plan.model, table), hybrid),
        _parallel_section(plan.model, plan.parallel, plan.training, cpu=options.cpu,
                          dist_muon_overlaps=dist_muon_overlaps(table.version), hybrid=hybrid),
        _fsdp_section(plan),
        _recompute_section(plan.parallel),
        *_offload_sections(plan.parallel),
        _cpu_section() if options.cpu else _precision_section(plan, options, table),
        _training_section(plan),
        _data_section(plan.model, options),
        _logging_section(options),
        _checkpoint_section(plan, options),
        *performance_sections(plan, options),
        *cuda_graph_sections(plan, options, table),
    ]


def argument_notes(plan: SavedPlan, table: FlagTable, release: Version | None = None) -> list[str]:
    """What the user should know about the arguments written for this release (`release`: the one the script runs,
    patch included; None = the table's): an unfused DSA, an overlap left out, positions raised past the model's
    own, how a hybrid's pipeline split is said."""
    notes = []
    hybrid = _hybrid_split(plan, release or table.version)
    if hybrid is not None and hybrid.note is not None:
        notes.append(hybrid.note)
    if plan.model.dsa is not None and not dsa_kernel_args(plan.model, table.flags):
        notes.append(f"Megatron-LM {table.release} runs DeepSeek Sparse Attention unfused (fp32 score matrices of "
                     "every head over the whole sequence): far slower and larger than the estimate, which prices the "
                     "fused kernels of core_v0.19.0 on (--dsa-kernel-backend)")
    if plan.training.optimizer == "dist_muon" and not dist_muon_overlaps(table.version):
        notes.append(f"--overlap-grad-reduce left out: Megatron-LM {table.label()} asserts it off for every Muon "
                     "variant (dist_muon overlaps it from core_v0.17.0 on), so the gradient reduction follows the "
                     "backward")
    raised = positions_raised_to(plan.model, plan.training)
    if raised is not None:
        notes.append(f"--max-position-embeddings {raised}: raised from {plan.model.name}'s "
                     f"{plan.model.max_position_embeddings} to the sequence length, as Megatron asserts; its "
                     f"{plan.model.position_embedding} positions are computed, so no weight changes, but the model "
                     "was trained on shorter sequences (context extension)")
    return notes


def positions_raised_to(model: ModelSpec, training: TrainingSpec) -> int | None:
    """The `--max-position-embeddings` a run longer than the model's context needs, where raising it changes no
    weight: RoPE (or no) positions are computed per token, and Megatron reads the value only to size a learned
    position table (LanguageModelEmbedding) and to assert it is at least --seq-length. None: the model's holds."""
    if training.seq_length <= model.max_position_embeddings or model.position_embedding == "learned_absolute":
        return None
    return training.seq_length


def _with_positions_for(section: ArgSection, model: ModelSpec, training: TrainingSpec) -> ArgSection:
    """The model section with `--max-position-embeddings` raised to a longer run's sequence (context extension):
    a rule of its own beside the flag's row (the row's `own_rule`)."""
    raised = positions_raised_to(model, training)
    if raised is None:
        return section
    args = list(section.args)
    args[args.index("--max-position-embeddings") + 1] = str(raised)
    return ArgSection(section.title, args)


def _with_dsa_kernels(section: ArgSection, model: ModelSpec, table: FlagTable) -> ArgSection:
    """DeepSeek Sparse Attention's fused kernels, where the release the script is for has them."""
    kernels = dsa_kernel_args(model, table.flags) if model.dsa is not None else []
    if kernels:
        section.add(*kernels)
    return section


def _hybrid_split(plan: SavedPlan, release: Version) -> HybridSplit | None:
    """How a hybrid's script says its pipeline split in `release` (None for other models; refused where the
    release cannot place it)."""
    return hybrid_split(plan.model, plan.parallel, release) if plan.model.is_hybrid else None


def _with_hybrid_pattern(section: ArgSection, hybrid: HybridSplit | None) -> ArgSection:
    """The model section with the hybrid's pattern under the flag and in the form its split needs (`|` segments
    from core_v0.17.0 on); the plain pattern model_flags wrote where the split is even."""
    if hybrid is None:
        return section
    args = list(section.args)
    at = args.index(PATTERN_FLAG)
    args[at:at + 2] = [hybrid.pattern_flag, hybrid.pattern]
    return ArgSection(section.title, args)


def _with_layer_blocks(section: ArgSection, model: ModelSpec, options: LaunchOptions) -> ArgSection:
    """A model of per-layer shapes names its block-config file (written by the script, heterogeneous.py)."""
    if model.layer_blocks is not None:
        heterogeneous.check_megatron_rules(model)  # refused by field before a path is asked for
        section.add(heterogeneous.FLAG, heterogeneous.layer_config_path(options.script_path))
    return section


# ---- parallelism ---------------------------------------------------------------------------
# core_v0.16's arguments.py asserts "Muon optimizer does not support overlap grad reduce for now" for every Muon
# variant; from core_v0.17 on only plain `muon` is refused ("Use dist_muon instead").
DIST_MUON_OVERLAP_SINCE = (0, 17, 0)


def dist_muon_overlaps(release: tuple[int, ...]) -> bool:
    """Whether `--optimizer dist_muon` may overlap its gradient reduction in this Megatron-LM release."""
    return release >= DIST_MUON_OVERLAP_SINCE


def _parallel_section(model: ModelSpec, p: ParallelConfig, t: TrainingSpec, *, cpu: bool = False,
                      dist_muon_overlaps: bool = True, hybrid: HybridSplit | None = None) -> ArgSection:
    s = ArgSection(f"parallelism: TP={p.tp} PP={p.pp} VPP={p.vpp} CP={p.cp} EP={p.ep} DP={p.dp}")
    s.add_terms(p, "--tensor-model-parallel-size", "--pipeline-model-parallel-size")
    if hybrid is not None:  # a hybrid's split is in its pattern's | segments, or first/last counts (hybrid_split)
        if hybrid.segments > 1:
            s.title += f"; split by the pattern's {hybrid.segments} segments ({hybrid.pattern_flag}, model section)"
        for flag, value in hybrid.split_args:
            s.add(flag, value)
    else:
        _add_split(s, model, p)
    s.add_terms(p, "--context-parallel-size")
    s.add_terms(p, "--cp-comm-type", left_out_at_default=True)  # Megatron's p2p ring unless the layout says a2a
    if model.moe is not None:
        s.add_terms(p, "--expert-model-parallel-size")
        s.add_terms(p, "--expert-tensor-parallel-size")  # written out where etp is left to TP
    if not cpu:  # torch's norms (no TE/Apex on a CPU) refuse sequence parallelism
        s.add_terms(p, "--sequence-parallel")
    if p.distributed_optimizer or p.fsdp:  # Megatron-FSDP's sharded steps run inside the distributed optimizer
        s.add("--use-distributed-optimizer")  # its own rule, not its row's: the row's `own_rule` says why
    if not t.uses_muon or (t.optimizer == "dist_muon" and dist_muon_overlaps):
        s.add("--overlap-grad-reduce")
    if p.distributed_optimizer or p.fsdp:  # (dist_muon may overlap its gather only from Megatron-LM 0.17 on)
        s.add("--overlap-param-gather")
    return s


def _add_split(s: ArgSection, model: ModelSpec, p: ParallelConfig) -> None:
    """A transformer's pipeline split and interleaving, in the flags pretrain_gpt.py places them by."""
    split = p.pipeline_split
    for flag, value in split.megatron_flags():  # uneven counts, account-for switches or a layout string
        s.add(flag, *(() if value is None else (value,)))
    if split.layout is not None:
        pass  # the layout's stage count is the VPP; Megatron refuses a VPP flag beside it
    elif p.vpp > 1 and not split.is_even:  # Megatron refuses layers-per-virtual-stage with an uneven split
        s.add_terms(p, "--num-virtual-stages-per-pipeline-rank")
    elif p.vpp > 1:
        s.add("--num-layers-per-virtual-pipeline-stage", model.num_layers // (p.pp * p.vpp))


def _with_dispatcher(model: ArgSection, flex_backend: str | None) -> ArgSection:
    """The model section with its MoE dispatcher switched to `flex` when a flex backend applies (its backend
    flag comes in the performance sections); the model's own flags are left as model_flags wrote them."""
    if flex_backend is None or "--moe-token-dispatcher-type" not in model.args:
        return model
    args = list(model.args)
    args[args.index("--moe-token-dispatcher-type") + 1] = "flex"
    return ArgSection(model.title, args)


def _fsdp_section(plan: SavedPlan) -> ArgSection:
    """Megatron-FSDP and the companions its user guide requires or recommends (see launch/README.md).

    `--use-distributed-optimizer` (parallel section) and `--ckpt-format fsdp_dtensor` (checkpoint section)
    come with it; PP > 1 is refused in checks.py (Megatron-FSDP does not support pipelining).
    """
    p = plan.parallel
    if not p.fsdp:
        return ArgSection("Megatron-FSDP: off")
    s = ArgSection("Megatron-FSDP (ZeRO-3): weights, gradients and optimizer state sharded over DP x CP")
    s.add("--use-megatron-fsdp")
    s.add("--data-parallel-sharding-strategy", "optim_grads_params")
    # The user guide lists it as required; Bridge's 405B FSDP recipes turn the fusion off "to avoid
    # functional errors" with TE builds that do not support FSDP + gradient-accumulation fusion.
    s.add("--no-gradient-accumulation-fusion")
    s.add("--fsdp-double-buffer")  # persistent all-gather/reduce-scatter buffers: no allocator churn per layer
    if meta_device_init_needed(plan):
        s.title += "; built on the meta device (one rank's unsharded bf16 weights exceed half its HBM)"
        s.add("--init-model-with-meta-device")
    return s


def _recompute_section(p: ParallelConfig) -> ArgSection:
    s = ArgSection(f"activation recompute: {p.recompute}")
    if p.recompute == "selective" and p.recompute_modules is not None:
        s.title += f" ({', '.join(p.recompute_modules)})"
        s.add_terms(p, "--recompute-granularity")
        s.add("--recompute-modules", *p.recompute_modules)
    elif p.recompute == "selective":
        s.add_terms(p, "--recompute-activations")
    elif p.recompute == "full":
        s.add_terms(p, "--recompute-granularity", "--recompute-method")
        s.add("--recompute-num-layers", p.recompute_num_layers or 1)  # no Megatron default; the row's `own_rule`
    return s


def _offload_sections(p: ParallelConfig) -> list[ArgSection]:
    """Megatron-Core's activation offloading to host memory (the flag from core_v0.16; it turns cpu_offloading on)."""
    if not p.cpu_offloading_num_layers:
        return []
    s = ArgSection(f"activation offloading: the first {p.cpu_offloading_num_layers} layers to host memory")
    s.add_terms(p, "--cpu-offloading-num-layers")
    return [s]


# ---- precision -----------------------------------------------------------------------------
# Megatron-LM's flags per quantised-GEMM flavour (core_v0.16.0 --fp8-recipe / --fp4-recipe choices). Per-tensor
# and blockwise FP8 use the hybrid format (E4M3 forward, E5M2 gradients), as Bridge's fp8_ds / fp8_cs / fp8_sc
# presets do; MXFP8 is E4M3 throughout (Bridge's fp8_mx). MXFP4 has no Megatron-LM flags: Primus only.
# Delayed scaling takes its scale from the largest amax of the last 1024 steps (Bridge's fp8_ds preset, Megatron-LM's
# examples/llama/train_llama3_8b_h100_fp8.sh): Megatron's own default, the last step's amax alone, lets one quiet
# step set a scale that the next step's outliers overflow.
MEGATRON_QUANT_FLAGS: dict[str, tuple[str, ...]] = {
    "fp8-delayed": ("--fp8-format", "hybrid", "--fp8-recipe", "delayed",
                    "--fp8-amax-history-len", "1024", "--fp8-amax-compute-algo", "max"),
    "fp8-tensorwise": ("--fp8-format", "hybrid", "--fp8-recipe", "tensorwise"),
    "fp8-blockwise": ("--fp8-format", "hybrid", "--fp8-recipe", "blockwise"),
    "mxfp8": ("--fp8-format", "e4m3", "--fp8-recipe", "mxfp8"),
    "nvfp4": ("--fp4-format", "e2m1", "--fp4-recipe", "nvfp4"),
}
# Megatron-LM's --fp8-recipe and --fp4-recipe choices, the first of each its default for a format flag given without
# its recipe (TransformerConfig, core_v0.16.0).
MEGATRON_FP8_RECIPES = ("delayed", "tensorwise", "mxfp8", "blockwise", "custom")
MEGATRON_FP4_RECIPES = ("nvfp4", "custom")


def quant_flavour_of_flags(fp8_format: str | None, fp8_recipe: str | None, fp4_format: str | None,
                           fp4_recipe: str | None) -> str | None:
    """The quantised-GEMM flavour a script's --fp8-format / --fp8-recipe / --fp4-format / --fp4-recipe run (the
    inverse of MEGATRON_QUANT_FLAGS, a recipe left out being Megatron's default): fp8-delayed, fp8-tensorwise,
    fp8-blockwise, mxfp8 or nvfp4; `custom` for a recipe of the user's own; None without a format flag. A recipe
    Megatron-LM has no choice of is refused by its flag."""
    if fp4_format is not None:
        return _recipe_choice("--fp4-recipe", fp4_recipe, MEGATRON_FP4_RECIPES)
    if fp8_format is None:
        return None
    recipe = _recipe_choice("--fp8-recipe", fp8_recipe, MEGATRON_FP8_RECIPES)
    return recipe if recipe in ("mxfp8", "custom") else f"fp8-{recipe}"


def _recipe_choice(flag: str, value: str | None, choices: tuple[str, ...]) -> str:
    if value is None:
        return choices[0]
    # a log's arguments block may print Megatron-Core's enum (`Fp8Recipe.delayed`): its member is the choice
    value = value.rsplit(".", 1)[-1] if value.startswith(("Fp8Recipe.", "Fp4Recipe.")) else value
    if value not in choices:
        raise MegapilotError(f"{flag} {value} is not one of Megatron-LM's recipes", field=flag,
                             fix=f"use one of: {', '.join(choices)}")
    return value


# Flavours whose GEMMs on AMD Instinct run only in Primus-Turbo's kernels, not in Transformer Engine on ROCm.
PRIMUS_ONLY_ON_AMD = frozenset({"fp8-blockwise", "mxfp4"})


def _precision_section(plan: SavedPlan, options: LaunchOptions, table: FlagTable) -> ArgSection:
    training, gpu = plan.training, plan.cluster.gpu
    flavour = training.quant_flavour
    gpu.check_precision(training.precision, training.fp8_recipe)
    _check_launcher_runs(flavour, gpu.vendor, options)
    s = ArgSection(f"precision: {training.precision} on {gpu.name}")
    s.add("--fp16" if training.precision == "fp16" else "--bf16")
    s.add_terms(training, "--grad-reduce-in-bf16")  # Megatron keeps the gradients in fp32 under --bf16 unless told
    if flavour in MEGATRON_QUANT_FLAGS:
        s.args.extend(MEGATRON_QUANT_FLAGS[flavour])
        if pads_routing_for_quantization(plan.model, training):  # the rule CUDA graphs' refusals read too
            s.add(_routing_padding_flag(table))
    elif flavour == "mxfp4":
        s.title += " (Primus keys fp4/fp4_recipe in the experiment; the Megatron arguments stay bf16)"
    if fp8_param_gather_applies(plan, options):
        # FP8 weights in the all-gather: half the bytes of bf16 (Bridge's fp8_cs / fp8_mx presets).
        s.add("--fp8-param-gather")
        if training.precision == "mxfp8" and not plan.parallel.fsdp:
            # MXFP8 weights reuse the gradient buffer for their all-gather instead of a second copy.
            s.add("--reuse-grad-buf-for-mxfp8-param-ag")
    # Low-precision GEMMs and grouped expert GEMMs come from Transformer Engine.
    s.add("--transformer-impl", "transformer_engine")
    if plan.model.moe is not None:
        s.add("--moe-grouped-gemm")
    return s


def _routing_padding_flag(table: FlagTable) -> str:
    """Quantised expert GEMMs need each expert's token count a multiple of 16/32: the router pads its routing map
    to it, instead of the grouped MLP padding every expert's tokens in a pass of its own (Megatron-LM's MoE README,
    Bridge's MoE performance recipes). core_v0.16 renamed the flag; the old name stays as an alias there."""
    new_name = "--moe-router-padding-for-quantization"
    return new_name if new_name in table.flags else "--moe-router-padding-for-fp8"


class LauncherCannotRun(MegapilotError):
    """The chosen launcher (backend) has no way to train this precision on this GPU: a suite marks such a cell
    SKIPPED with the reason (as CVS skips MXFP4 on MI300X) while its other cells run."""


def _check_launcher_runs(flavour: str | None, vendor: str, options: LaunchOptions) -> None:
    """MXFP4 exists only in Primus; blockwise FP8 on AMD Instinct only in Primus-Turbo's GEMMs."""
    if flavour == "mxfp4" and options.launcher != "primus":
        raise LauncherCannotRun("mxfp4 has no Megatron-LM recipe (--fp4-recipe takes nvfp4 or custom); AMD Primus "
                             "trains it with fp4_recipe mxfp4", field="precision",
                             fix="launch with --launcher primus, or use precision mxfp8")
    if vendor == "AMD" and flavour in PRIMUS_ONLY_ON_AMD and options.launcher != "primus":
        raise LauncherCannotRun(f"{flavour} on AMD Instinct runs only in Primus-Turbo's GEMMs (use_turbo_gemm), not "
                             "in Transformer Engine on ROCm", field="fp8_recipe",
                             fix="launch with --launcher primus, or use fp8_recipe tensorwise")


def _cpu_section() -> ArgSection:
    # No tensor cores and no Transformer Engine on a CPU: plain fp32 layers over gloo.
    s = ArgSection("precision: fp32 on CPU (gloo, local layers)")
    s.add("--transformer-impl", "local")
    s.add("--distributed-backend", "gloo")
    return s


# ---- training ------------------------------------------------------------------------------
# The training section, in the order it is written: each flag's value is its spec field (the Megatron vocabulary's
# row). All are written, so a script states its schedule whatever the release's defaults, except `--optimizer`,
# left out at Megatron's default (Adam); Muon's embeddings, norms and biases still take the Adam betas.
TRAINING_FLAGS = ("--micro-batch-size", "--global-batch-size", "--seq-length", "--train-iters", "--lr", "--min-lr",
                  "--lr-decay-style", "--lr-warmup-iters", "--weight-decay", "--clip-grad", "--optimizer",
                  "--adam-beta1", "--adam-beta2", "--init-method-std", "--seed")
_LEFT_OUT_AT_DEFAULT = frozenset({"--optimizer"})


def _training_section(plan: SavedPlan) -> ArgSection:
    t = plan.training
    s = ArgSection(f"training: {t.global_batch_size} x {t.seq_length} tokens per step")
    for flag in TRAINING_FLAGS:
        row = vocabulary.term(flag)
        assert row.field is not None, flag
        value = vocabulary.field_value(plan, row.field)
        if flag in _LEFT_OUT_AT_DEFAULT and value == row.default:
            continue
        s.add(flag, value)
    return s


# ---- data ----------------------------------------------------------------------------------
def _data_section(model: ModelSpec, o: LaunchOptions) -> ArgSection:
    s = ArgSection("data and tokenizer")
    if o.mock_data == (o.data_path is not None):
        raise MegapilotError(
            "give exactly one of a data path and mock data", field="data_path",
            fix="pass --data-path /abs/prefix (without .bin/.idx) or --mock-data",
        )
    if o.mock_data:
        s.add("--mock-data")
    else:
        s.add("--data-path", o.data_path)
        s.add("--split", o.split)
    tokenizer = tokenizer_type(o)
    if tokenizer == "ByteTokenizer":
        # The embedded trainer reads --data-path with its byte tokenizer when no --tokenizer-type is
        # given; the name is not one of Megatron-LM's choices, so it is not written.
        s.title = "data and tokenizer: bytes (the embedded trainer's tokenizer for --data-path)"
        return s
    s.add("--tokenizer-type", tokenizer)
    if tokenizer == "NullTokenizer":
        # Synthetic token ids. Megatron's NullTokenizer adds an end-of-document id to --vocab-size,
        # so V-1 gives the model's own vocabulary of V (and the same padded embedding).
        s.add("--vocab-size", model.vocab_size - 1)
    elif tokenizer == "GPT2BPETokenizer":
        s.add("--vocab-file", o.vocab_file)
        s.add("--merge-file", o.merge_file)
    else:
        s.add("--tokenizer-model", o.tokenizer_model)
    return s


def tokenizer_type(o: LaunchOptions) -> str:
    """The tokenizer implied by what was given: BPE files, a SentencePiece model or a HF tokenizer."""
    if (o.vocab_file is None) != (o.merge_file is None):
        raise MegapilotError("a GPT-2 BPE tokenizer needs both files", field="vocab_file",
                             fix="pass both --vocab-file and --merge-file")
    if o.tokenizer_type == "ByteTokenizer":
        if o.entrypoint != "megapilot" or o.mock_data:
            raise MegapilotError("ByteTokenizer is the embedded trainer's tokenizer for --data-path",
                                 field="tokenizer_type",
                                 fix="use it with --entrypoint megapilot and --data-path, or pick a Megatron tokenizer")
        return o.tokenizer_type
    if o.tokenizer_type is not None:
        needs_model = o.tokenizer_type not in TOKENIZERS_WITHOUT_MODEL
        if needs_model and o.tokenizer_model is None:
            raise MegapilotError(f"{o.tokenizer_type} needs a tokenizer model", field="tokenizer_model",
                                 fix="pass --tokenizer-model /abs/path or a Hugging Face model id")
        if o.tokenizer_type == "GPT2BPETokenizer" and o.vocab_file is None:
            raise MegapilotError("GPT2BPETokenizer needs its vocab and merge files", field="vocab_file",
                                 fix="pass --vocab-file and --merge-file")
        if o.tokenizer_type in SENTENCEPIECE_TOKENIZERS and o.tokenizer_model is not None:
            _refuse_tiktoken_ranks(o.tokenizer_model, o.tokenizer_type)
        return o.tokenizer_type
    if o.vocab_file is not None:
        return "GPT2BPETokenizer"
    if o.tokenizer_model is not None:
        if PurePosixPath(o.tokenizer_model).suffix != ".model":
            return "HuggingFaceTokenizer"
        _refuse_tiktoken_ranks(o.tokenizer_model, "GPTSentencePieceTokenizer")
        return "GPTSentencePieceTokenizer"
    if o.mock_data:
        return "NullTokenizer"
    raise MegapilotError("real data needs a tokenizer", field="tokenizer_model",
                         fix="pass --tokenizer-model (or --vocab-file and --merge-file)")


SENTENCEPIECE_TOKENIZERS = frozenset({"GPTSentencePieceTokenizer", "SentencePieceTokenizer", "Llama2Tokenizer"})
# A tiktoken BPE rank file opens with `<base64 token> <rank>` lines; a SentencePiece model is a binary protobuf.
_TIKTOKEN_RANK_LINE = re.compile(rb"[A-Za-z0-9+/]+={0,2} [0-9]+\r?\n")


def _refuse_tiktoken_ranks(tokenizer_model: str, tokenizer: str) -> None:
    """Llama 3's `tokenizer.model` is a tiktoken rank file, not a SentencePiece model: a SentencePiece
    tokenizer fails to parse it when the job starts. Read where the file is on this machine."""
    try:
        with Path(tokenizer_model).open("rb") as handle:
            head = handle.read(256)
    except OSError:
        return  # a Hugging Face id, or a file on the cluster only
    if _TIKTOKEN_RANK_LINE.match(head):
        raise MegapilotError(f"{tokenizer_model} is a tiktoken BPE rank file (as Llama 3's tokenizer.model), "
                             f"which {tokenizer} cannot parse", field="tokenizer_model",
                             fix="pass the model's Hugging Face folder or id as --tokenizer-model "
                                 "(HuggingFaceTokenizer reads its tokenizer.json)")


# ---- logging and checkpoints ---------------------------------------------------------------
def _logging_section(o: LaunchOptions) -> ArgSection:
    s = ArgSection("logging")
    s.add("--log-interval", o.log_interval)
    s.add("--log-throughput")
    s.add("--timing-log-level", o.timing_log_level)
    tensorboard = o.tensorboard_dir or (f"{o.save.rstrip('/')}/tensorboard" if o.save else None)
    if tensorboard:
        s.add("--tensorboard-dir", tensorboard)
        s.add("--log-timers-to-tensorboard")
        s.add("--log-memory-to-tensorboard")
    return s


def _checkpoint_section(plan: SavedPlan, o: LaunchOptions) -> ArgSection:
    t = plan.training
    s = ArgSection("checkpoints")
    if o.save:
        s.add("--save", o.save)
        s.add("--save-interval", o.save_interval or t.train_iters)
    load = o.load or o.save  # resume from our own checkpoints when the job is requeued
    if load:
        s.add("--load", load)
        if o.load_step is not None:
            s.add("--ckpt-step", o.load_step)
    s.add("--ckpt-format", checkpoint_format(plan, o))
    return s


def checkpoint_format(plan: SavedPlan, options: LaunchOptions) -> str:
    """Megatron-FSDP saves only fsdp_dtensor (asserted both ways). A run that saves and loads nothing
    and overlaps the param gather with the optimizer step needs a non-distributed format (asserted), so
    it names `torch`. Everything else uses torch_dist, which reloads under another parallel layout."""
    if plan.parallel.fsdp:
        return "fsdp_dtensor"
    if param_gather_overlaps_optimizer_step(plan, options):
        return "torch"
    return "torch_dist"
