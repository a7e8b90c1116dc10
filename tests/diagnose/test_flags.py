"""Reading Megatron flags out of launch scripts and flag strings, and the typed run they describe."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from megapilot.catalog.gpus import get_gpu
from megapilot.diagnose import read_flags, run_config
from megapilot.errors import MegapilotError
from megapilot.spec import ModelSpec, TrainingSpec

SCRIPT = r"""#!/bin/bash
# SYNTHETIC launch script in the style of Megatron-LM's examples/llama/train_llama3_8b.sh
export CUDA_DEVICE_MAX_CONNECTIONS=1
GPUS_PER_NODE=8
NUM_NODES=2
TP=${TP:-2}
SEQ=8192
DISTRIBUTED_ARGS=(
    --nproc_per_node $GPUS_PER_NODE
    --nnodes $NUM_NODES
)
MODEL_ARGS=(
    --num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336
    --num-attention-heads 32 --group-query-attention --num-query-groups 8
    --seq-length ${SEQ} --max-position-embeddings ${SEQ} --swiglu
    --untie-embeddings-and-output-weights --normalization RMSNorm
)
torchrun ${DISTRIBUTED_ARGS[@]} pretrain_gpt.py \
    ${MODEL_ARGS[@]} \
    --tensor-model-parallel-size $TP --pipeline-model-parallel-size 2 \
    --sequence-parallel --use-distributed-optimizer \
    --micro-batch-size 1 --global-batch-size 128 --bf16 \
    --lr 3e-4 --clip-grad=1.0 \
    --tokenizer-model /models/Llama-3-8B/tokenizer.model \
    --save "/ckpt/llama 8b" # trailing comment
"""


def test_script_variables_arrays_continuations_and_equals_form(tmp_path: Path):
    script = tmp_path / "train.sh"
    script.write_text(SCRIPT)
    flags = read_flags(script=script)
    assert flags.get("--tensor-model-parallel-size") == "2"  # ${TP:-2}
    assert flags.get("--seq-length") == "8192" and flags.get("--clip-grad") == "1.0"
    assert flags.has("--sequence-parallel") and flags.get("--sequence-parallel") is None
    assert flags.get("--save") == "/ckpt/llama 8b"
    assert flags.get_int("--nproc_per_node") == 8 and flags.get_int("--nnodes") == 2


def test_run_config_from_script_builds_typed_specs(tmp_path: Path):
    script = tmp_path / "train.sh"
    script.write_text(SCRIPT)
    config = run_config(read_flags(script=script), gpu=get_gpu("h100"))
    assert config.world_size == 16
    assert (config.parallel.tp, config.parallel.pp, config.parallel.dp) == (2, 2, 4)
    assert config.parallel.sequence_parallel and config.parallel.distributed_optimizer
    assert config.model.num_query_groups == 8 and config.model.vocab_size == 128256  # from the Llama-3 tokenizer path
    assert config.training.seq_length == 8192 and config.training.precision == "bf16"
    assert config.complete and config.cluster.num_nodes == 2


def test_the_cluster_has_as_many_gpus_per_node_as_the_launch_gives_its_nodes(tmp_path: Path):
    """12 ranks over `#SBATCH --nodes=2` (torchrun --nproc-per-node 6): nodes of 6, not the H100's usual 8, which
    12 GPUs do not fill; optimize refused the script naming a --gpus-per-node it does not take."""
    script = tmp_path / "train.sbatch"
    script.write_text(SCRIPT.replace("GPUS_PER_NODE=8", "GPUS_PER_NODE=6"))
    config = run_config(read_flags(script=script), gpu=get_gpu("h100"))
    assert config.world_size == 12 and config.cluster is not None
    assert (config.cluster.num_nodes, config.cluster.gpus_per_node) == (2, 6)
    alone = run_config(read_flags(flags="--tensor-model-parallel-size 2"), gpu=get_gpu("h100"), gpus=16)
    assert alone.cluster is not None and alone.cluster.gpus_per_node == 8  # nothing says: the GPU type's node


def test_flag_string_overrides_script_and_switches_take_no_value(tmp_path: Path):
    script = tmp_path / "train.sh"
    script.write_text(SCRIPT)
    flags = read_flags(script=script, flags="--micro-batch-size 4 --bf16 --tensor-model-parallel-size 4")
    assert flags.get("--micro-batch-size") == "4" and flags.get("--tensor-model-parallel-size") == "4"


def test_incomplete_flags_leave_specs_empty_with_notes():
    config = run_config(read_flags(flags="--tensor-model-parallel-size 8 --micro-batch-size 2"))
    assert config.model is None and config.training is None and not config.complete
    assert any("model shape incomplete" in note for note in config.notes)
    assert config.world_size == 8


def test_layout_that_does_not_divide_the_gpus_is_a_user_error():
    with pytest.raises(MegapilotError, match="does not divide"):
        run_config(read_flags(flags="--tensor-model-parallel-size 3 --num-layers 2 --hidden-size 64 "
                                    "--num-attention-heads 4"), gpus=8)


def test_missing_script_and_bad_quotes_are_user_errors(tmp_path: Path):
    with pytest.raises(MegapilotError, match="script"):
        read_flags(script=tmp_path / "nope.sh")
    with pytest.raises(MegapilotError, match="flags"):
        read_flags(flags='--save "/unterminated')


def test_token_dropping_flags_read_back_into_the_moe_spec():
    moe = ("--num-layers 4 --hidden-size 512 --num-attention-heads 8 --seq-length 1024 --num-experts 8 "
           "--moe-router-topk 2 --moe-ffn-hidden-size 256")
    padded = run_config(read_flags(flags=moe + " --moe-expert-capacity-factor 1.25 --moe-pad-expert-input-to-capacity"))
    assert padded.model.moe.capacity_factor == 1.25 and padded.model.moe.pad_to_capacity
    dropless = run_config(read_flags(flags=moe + " --moe-expert-capacity-factor -1"))  # negative: Megatron's dropless
    assert dropless.model.moe.capacity_factor is None and not dropless.model.moe.pad_to_capacity


@pytest.mark.parametrize("variant", ["HYBRID_MAMBA", "LATENT_HYBRID"])
def test_a_hybrids_pattern_mixer_latent_moe_and_mtp_module_read_back_from_its_flags(variant: str):
    """The flags `script` writes for a Mamba hybrid (pretrain_mamba.py), one with Nemotron 3 Super's latent MoE and
    a repeated attention + MoE MTP module among them, read back as the same model."""
    import shlex

    from megapilot.launch import render_megatron_args
    from tests.launch import variants

    model = getattr(variants, variant)
    plan = next(plan for plan, _ in variants.PAIRED_VARIANTS if plan.model is model)
    args = render_megatron_args(plan, variants.PAIRED_VARIANTS[0][1])
    config = run_config(read_flags(flags=shlex.join(args)), gpus=plan.cluster.world_size)
    assert config.model is not None, config.notes
    ignored = {"name", "vocab_size", "hf_architecture", "kv_channels"}
    assert config.model.model_dump(exclude=ignored) == model.model_dump(exclude=ignored)


def test_a_heterogeneous_models_blocks_read_back_from_the_file_its_flags_name(tmp_path: Path):
    """A Llama-Nemotron-style model's script names its block-config file; diagnose reads the per-layer shapes
    from it, and says so when the file is not here."""
    from megapilot.launch import render_launch
    from tests.launch.test_heterogeneous import OPTIONS, _plan, _tiny

    model = _tiny()
    script = tmp_path / "train.sh"
    launch = render_launch(_plan(model), OPTIONS.model_copy(update={"script_path": str(script)}))
    script.write_text(launch.script)
    for path, text in launch.files.items():
        Path(path).write_text(text)
    config = run_config(read_flags(script=script), gpus=1)

    def shapes(spec: ModelSpec) -> list[tuple[object, ...]]:
        return [(spec.layer_block(i).attention, spec.layer_kv_heads(i), spec.layer_block(i).mlp,
                 spec.layer_ffn_hidden_size(i)) for i in range(spec.num_layers)]

    assert config.model is not None and config.model.layer_blocks is not None
    assert shapes(config.model) == shapes(model)
    for path in launch.files:
        Path(path).unlink()
    missing = run_config(read_flags(script=script), gpus=1)
    assert missing.model is not None and missing.model.layer_blocks is None
    assert any("--heterogeneous-layers-config-path" in note for note in missing.notes)


def test_the_optimizer_reads_back_and_an_unmodelled_one_is_said():
    dense = "--num-layers 4 --hidden-size 512 --num-attention-heads 8 --seq-length 1024 --global-batch-size 8"
    muon = run_config(read_flags(flags=dense + " --optimizer dist_muon"))
    assert muon.training.optimizer == "dist_muon"
    assert run_config(read_flags(flags=dense)).training.optimizer == "adam"
    lion = run_config(read_flags(flags=dense + " --optimizer lion"))
    assert lion.training.optimizer == "adam" and any("--optimizer lion is not modelled" in n for n in lion.notes)


def test_the_gemm_precision_reads_back_with_megatrons_default_recipe_and_a_custom_one_is_said():
    dense = ("--num-layers 4 --hidden-size 512 --num-attention-heads 8 --seq-length 1024 --global-batch-size 8 "
             "--bf16")
    read = {extra: run_config(read_flags(flags=f"{dense} {extra}")) for extra in (
        "", "--fp8-format hybrid", "--fp8-format e4m3 --fp8-recipe mxfp8", "--fp4-format e2m1",
        "--fp8-format hybrid --fp8-recipe custom")}
    assert {extra: (c.training.precision, c.training.fp8_recipe) for extra, c in read.items()} == {
        "": ("bf16", "tensorwise"), "--fp8-format hybrid": ("fp8", "delayed"),
        "--fp8-format e4m3 --fp8-recipe mxfp8": ("mxfp8", "tensorwise"), "--fp4-format e2m1": ("nvfp4", "tensorwise"),
        "--fp8-format hybrid --fp8-recipe custom": ("fp8", "tensorwise")}
    custom = read["--fp8-format hybrid --fp8-recipe custom"]
    assert any("--fp8-recipe custom is not modelled" in note for note in custom.notes)
    assert read["--fp4-format e2m1"].precision_flag == "fp4"


def test_bf16_gradients_read_back_only_under_bf16_as_megatron_reads_them():
    dense = "--num-layers 4 --hidden-size 512 --num-attention-heads 8 --seq-length 1024 --global-batch-size 8"
    assert run_config(read_flags(flags=dense + " --bf16 --grad-reduce-in-bf16")).training.grad_reduce_in_bf16
    assert not run_config(read_flags(flags=dense + " --bf16")).training.grad_reduce_in_bf16
    fp16 = run_config(read_flags(flags=dense + " --fp16 --grad-reduce-in-bf16")).training
    assert not fp16.grad_reduce_in_bf16 and fp16.main_grad_bytes == 2  # fp16 keeps 16-bit gradients anyway


@pytest.mark.parametrize(("pattern", "pp", "vpp", "layout"), [
    ("M-M*|M-ME/*E/*E", 2, 1, None),  # Megatron-LM >= 0.18: '|' pipeline segments, '/' one MTP depth each
    ("M-|M*|M-|ME/*E/*E", 2, 2, None),  # four segments on two ranks: two virtual stages each
    ("M-M*M|-ME/*E/*E", 2, 1, "Et*5|t*3m*2L"),  # uneven segments: the stages they are, as a layout string
    ("M-|M*M|-|ME/*E/*E", 2, 2, "Et*2|t*3|t|t*2m*2L"),
])
def test_the_unified_hybrid_pattern_reads_its_layers_stages_and_mtp_depths(pattern: str, pp: int, vpp: int,
                                                                          layout: str | None):
    hybrid = ("--hidden-size 1024 --ffn-hidden-size 2048 --num-attention-heads 8 --seq-length 1024 "
              "--global-batch-size 8 --mamba-num-heads 32 --num-experts 8 --moe-router-topk 2 "
              f"--moe-ffn-hidden-size 512 --pipeline-model-parallel-size {pp} --hybrid-layer-pattern '{pattern}'")
    config = run_config(read_flags(flags=hybrid), gpus=pp)
    assert config.model.num_layers == 8 and config.model.hybrid_override_pattern == "M-M*M-ME"  # no --num-layers
    assert (config.model.mtp_hybrid_pattern, config.model.mtp_num_layers) == ("*E", 2)
    assert (config.parallel.pp, config.parallel.vpp) == (pp, vpp)
    assert config.parallel.pipeline_layout == layout
    with pytest.raises(MegapilotError, match="MTP patterns after '/' differ"):
        run_config(read_flags(flags=hybrid.replace("/*E/*E", "/*E/*-")), gpus=pp)


def test_the_recompute_modules_of_a_script_are_read_as_its_list():
    flags = read_flags(flags="--recompute-granularity selective --recompute-modules mla_up_proj moe_act --bf16 "
                             "--num-layers 4")
    assert flags.get("--recompute-modules") == "mla_up_proj moe_act" and flags.has("--bf16")
    config = run_config(flags, gpu=get_gpu("h100"), gpus=8)
    assert config.parallel.recompute_modules == ("mla_up_proj", "moe_act")
    bare = run_config(read_flags(flags="--recompute-activations --num-layers 4"), gpu=get_gpu("h100"), gpus=8)
    assert bare.parallel.recompute == "selective" and bare.parallel.recompute_modules is None


def test_a_scripts_activation_offloading_is_read_where_megatron_runs_it():
    shape = "--num-layers 8 --hidden-size 512 --num-attention-heads 8 --seq-length 1024 --max-position-embeddings 1024"
    offloaded = run_config(read_flags(flags=f"{shape} --cpu-offloading-num-layers 4 --micro-batch-size 1"))
    assert offloaded.parallel.cpu_offloading_num_layers == 4
    # beside recompute Megatron refuses it, so such a script never trained with it
    beside = run_config(read_flags(flags=f"{shape} --cpu-offloading-num-layers 4 --recompute-activations"))
    assert beside.parallel.cpu_offloading_num_layers == 0 and beside.parallel.recompute == "selective"


DEEPSEEK_V3_SHAPE = "--num-layers 61 --hidden-size 7168 --num-attention-heads 128 --seq-length 4096"


def test_a_hugging_face_tokenizer_megapilot_knows_gives_its_models_vocabulary():
    """A HuggingFaceTokenizer's size is its model's, which no flag states: a hub id (or a folder) named after a
    preset gives the preset's vocabulary, not an assumed 32000."""
    for tokenizer in ("deepseek-ai/DeepSeek-V3", "/models/DeepSeek-V3"):
        config = run_config(read_flags(flags=f"{DEEPSEEK_V3_SHAPE} --tokenizer-type HuggingFaceTokenizer "
                                             f"--tokenizer-model {tokenizer}"))
        assert config.model.vocab_size == 129280, tokenizer
        assert not any("assumed 32000" in note for note in config.notes)


def test_the_model_a_rendered_scripts_header_names_gives_the_vocabulary_while_the_flags_keep_its_shape(
        tmp_path: Path):
    header = "#!/usr/bin/env bash\n# torchrun launch: deepseek-v3 on 32 node(s) x 8 H100-SXM5-80GB\n"
    script = tmp_path / "train.sh"
    script.write_text(header + f"torchrun pretrain_gpt.py {DEEPSEEK_V3_SHAPE} --tokenizer-model /models/tok\n")
    assert run_config(read_flags(script=script)).model.vocab_size == 129280
    # edited into another model: the header no longer says what the flags are
    script.write_text(header + "torchrun pretrain_gpt.py --num-layers 4 --hidden-size 512 --num-attention-heads 8 "
                               "--tokenizer-model /models/tok\n")
    assert run_config(read_flags(script=script)).model.vocab_size == 32000


def test_an_assumed_vocabulary_says_how_to_pass_it():
    config = run_config(read_flags(flags="--num-layers 4 --hidden-size 512 --num-attention-heads 8"))
    [note] = [note for note in config.notes if "vocab size" in note]
    assert "assumed 32000" in note and '--flags "--vocab-size N"' in note


SHAPE = "--num-layers 4 --hidden-size 512 --num-attention-heads 8 --seq-length 1024"


@pytest.mark.parametrize(("flag", "value"), [
    ("--tensor-model-parallel-size", "abc"), ("--tensor-model-parallel-size", "0"),
    ("--tensor-model-parallel-size", "-8"), ("--pipeline-model-parallel-size", "2.5"), ("--seq-length", "foo"),
    ("--micro-batch-size", "1e3"), ("--expert-tensor-parallel-size", "x"), ("--kv-channels", "0"), ("--lr", "fast"),
])
def test_a_bad_number_in_a_flag_is_an_error_naming_that_flag_and_its_value(flag: str, value: str):
    """Megatron's argparse refuses these; read as a default they would price a run that never launches."""
    with pytest.raises(MegapilotError) as info:
        run_config(read_flags(flags=f"{SHAPE} {flag} {value}"), gpus=8)
    assert info.value.field == flag and repr(value) in info.value.problem and flag in (info.value.fix or "")


@pytest.mark.parametrize("flag", ["--fp8-recipe", "--micro-batch-size", "--tokenizer-type"])
def test_a_flag_given_without_its_value_is_refused_by_its_name(flag: str):
    """`--fp8-recipe --bf16`: Megatron's parser stops on it ("expected one argument"); read as absent it was priced
    as another run, and one rule indexed its missing value (an internal error)."""
    with pytest.raises(MegapilotError) as info:
        run_config(read_flags(flags=f"{SHAPE} --fp8-format hybrid {flag} --bf16"), gpus=8)
    assert info.value.field == flag and "without its value" in info.value.problem
    with pytest.raises(MegapilotError, match="--recompute-modules is given without"):  # nargs '+': at least one
        run_config(read_flags(flags=f"{SHAPE} --recompute-granularity selective --recompute-modules"), gpus=8)


def test_a_flag_that_may_be_zero_reads_zero_and_a_variable_the_script_leaves_to_its_environment_is_unknown():
    config = run_config(read_flags(flags=f"{SHAPE} --lr-warmup-iters 0 --cpu-offloading-num-layers 0"), gpus=8)
    assert config.training.lr_warmup_iters == 0 and config.parallel.cpu_offloading_num_layers == 0
    with pytest.raises(MegapilotError, match="--lr-warmup-iters"):
        run_config(read_flags(flags=f"{SHAPE} --lr-warmup-iters -1"), gpus=8)
    assert run_config(read_flags(flags=f"{SHAPE} --tensor-model-parallel-size '$TP'"), gpus=8).parallel.tp == 1


def test_a_spec_the_flags_make_invalid_names_the_flag_with_a_fix():
    with pytest.raises(MegapilotError) as info:
        run_config(read_flags(flags=f"{SHAPE} --group-query-attention --num-query-groups 3"), gpus=8)
    assert info.value.field == "--flags" and "num_query_groups=3" in info.value.problem and info.value.fix


def test_a_file_with_no_megatron_flag_is_not_read_as_a_launch_of_megatrons_defaults(tmp_path: Path):
    log = tmp_path / "train.sh"
    log.write_text(" [2026-01-01 00:00:00] iteration 10/100 | elapsed time per iteration (ms): 900.0 | "
                   "lm loss: 2.0 |\ntorchrun --nproc-per-node 8 train.py\n")
    with pytest.raises(MegapilotError, match="no Megatron-LM training") as info:
        read_flags(script=log, training_script=True)
    assert info.value.field == "--script"
    assert read_flags(script=log).values == {"--nproc-per-node": "8"}  # any program's launch (megapilot run)


def test_a_flag_the_script_leaves_to_the_environment_is_read_as_absent_and_said_so(tmp_path):
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/bash\ntorchrun --nproc-per-node 8 pretrain_gpt.py --tensor-model-parallel-size $TP "
                      "--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --seq-length 4096 "
                      "--micro-batch-size 1 --global-batch-size 64 --bf16\n")
    flags = read_flags(script=script)
    assert flags.left_to_the_shell == ["--tensor-model-parallel-size"]
    config = run_config(flags)
    assert config.parallel is not None and config.parallel.tp == 1
    assert any("--tensor-model-parallel-size $TP: set by the environment" in note for note in config.notes)


COUNTED_LAUNCH = ("#!/bin/bash\ntorchrun --nproc-per-node {word} --nnodes 2 pretrain_gpt.py "
                  "--tensor-model-parallel-size 2 --num-layers 4 --hidden-size 512 --num-attention-heads 8 "
                  "--seq-length 1024 --max-position-embeddings 1024 --micro-batch-size 1 --global-batch-size 64 "
                  "--bf16 --vocab-size 32000\n")


@pytest.mark.parametrize("word", ["gpu", "auto"])
@pytest.mark.parametrize(("gpu", "per_node"), [("h100", 8), ("gb200", 4), (None, 8)])
def test_a_torchrun_that_counts_a_rank_per_gpu_runs_as_many_as_the_nodes_gpus(tmp_path: Path, word: str,
                                                                             gpu: str | None, per_node: int):
    """torchrun's `--nproc-per-node gpu` (or `auto`) is a valid launch, not a bad number: its ranks per node are
    the node's GPUs, which the GPU type's node gives (else the usual 8), said as an assumption."""
    script = tmp_path / "train.sh"
    script.write_text(COUNTED_LAUNCH.format(word=word))
    flags = read_flags(script=script, training_script=True)
    assert flags is not None
    from megapilot.diagnose.flags import ranks_per_node

    assert ranks_per_node(flags) is None  # no number to record
    config = run_config(flags, gpu=get_gpu(gpu) if gpu else None)
    assert config.world_size == 2 * per_node and config.world_size_assumed
    assert config.parallel is not None and config.parallel.dp == per_node  # 2 x per_node GPUs at TP 2
    [note] = [note for note in config.notes if note.startswith(f"torchrun --nproc-per-node {word} ")]
    assert f"assumed {per_node} GPUs per node" in note and f"2 x {per_node} = {2 * per_node} GPUs" in note
    assert "--gpus" in note
    assert run_config(flags, gpus=4).world_size == 4  # --gpus, when given, is the run's total


def test_a_torchrun_that_counts_a_rank_per_cpu_core_leaves_the_world_to_be_assumed(tmp_path: Path):
    script = tmp_path / "train.sh"
    script.write_text(COUNTED_LAUNCH.format(word="cpu"))
    config = run_config(read_flags(script=script, training_script=True))
    assert config.world_size == 2 and config.world_size_assumed  # TP*PP*CP, as with no count at all
    assert any(note.startswith("torchrun --nproc-per-node cpu starts a rank per CPU core") for note in config.notes)


def test_a_word_torchrun_does_not_take_is_still_a_bad_number(tmp_path: Path):
    script = tmp_path / "train.sh"
    script.write_text(COUNTED_LAUNCH.format(word="eight"))
    with pytest.raises(MegapilotError, match=r"'eight'.*is not a whole number") as info:
        run_config(read_flags(script=script, training_script=True))
    assert info.value.field == "--nproc-per-node"


ELASTIC_LAUNCH = ("#!/bin/bash\ntorchrun --nproc-per-node 8 {nnodes} pretrain_gpt.py "
                  "--tensor-model-parallel-size 2 --num-layers 4 --hidden-size 512 --num-attention-heads 8 "
                  "--seq-length 1024 --max-position-embeddings 1024 --micro-batch-size 1 --global-batch-size 64 "
                  "--bf16 --vocab-size 32000\n")


@pytest.mark.parametrize("nnodes", ["--nnodes 1:4", "--nnodes=1:4"])
def test_an_elastic_torchrun_nnodes_is_priced_on_its_max_nodes_and_says_so(tmp_path: Path, nnodes: str):
    """torchrun's `--nnodes MIN:MAX` is elastic, not a bad number: each rendezvous fixes the world to the nodes that
    joined, all MAX of them in a full run."""
    script = tmp_path / "train.sh"
    script.write_text(ELASTIC_LAUNCH.format(nnodes=nnodes))
    flags = read_flags(script=script, training_script=True)
    assert flags is not None
    from megapilot.diagnose.flags import launch_nodes

    assert launch_nodes(flags) == 4
    config = run_config(flags, gpu=get_gpu("h100"))
    assert config.world_size == 32 and not config.world_size_assumed
    assert config.parallel is not None and config.parallel.dp == 16
    [note] = [note for note in config.notes if note.startswith("torchrun --nnodes 1:4 is elastic")]
    assert "priced on 4 nodes" in note and "--gpus" in note


def test_a_torchrun_nnodes_of_one_size_says_nothing_of_elasticity(tmp_path: Path):
    script = tmp_path / "train.sh"
    script.write_text(ELASTIC_LAUNCH.format(nnodes="--nnodes 2:2"))
    config = run_config(read_flags(script=script, training_script=True))
    assert config.world_size == 16 and not any("elastic" in note for note in config.notes)


@pytest.mark.parametrize(("nnodes", "problem"), [("1:x", "is not a whole number or MIN:MAX"),
                                                 ("1:2:3", "is not a whole number or MIN:MAX"),
                                                 ("4:1", "is not 1 <= MIN <= MAX"), ("0:2", "is not 1 <= MIN <= MAX"),
                                                 ("0", "is below 1")])
def test_a_nnodes_torchrun_does_not_take_names_the_flag_and_its_two_forms(tmp_path: Path, nnodes: str, problem: str):
    script = tmp_path / "train.sh"
    script.write_text(ELASTIC_LAUNCH.format(nnodes=f"--nnodes {nnodes}"))
    with pytest.raises(MegapilotError, match=re.escape(problem)) as info:
        run_config(read_flags(script=script, training_script=True))
    assert info.value.field == "--nnodes"
    assert "MIN:MAX" in (info.value.fix or "") and "torchrun requires" in (info.value.fix or "")


def test_qk_l2_norm_reads_back_and_takes_the_place_of_a_weighted_qk_norm_as_megatron_builds_it():
    shape = "--num-layers 4 --hidden-size 256 --num-attention-heads 8 --seq-length 128 "
    model = run_config(read_flags(flags=shape + "--qk-l2-norm")).model
    assert model is not None and model.qk_l2_norm and not model.qk_layernorm
    both = run_config(read_flags(flags=shape + "--qk-l2-norm --qk-layernorm")).model  # the layer spec builds L2Norm
    assert both is not None and both.qk_l2_norm and not both.qk_layernorm
    assert not run_config(read_flags(flags=shape)).model.qk_l2_norm


def test_a_gloo_run_without_a_gpu_is_not_said_to_get_no_predictions():
    # `run` prices a gloo script on this machine's CPU: "no memory or throughput predictions" contradicted it
    shape = ("--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 64 --max-position-embeddings 64 "
             "--micro-batch-size 1 --global-batch-size 4 --vocab-size 1024")
    cpu = run_config(read_flags(flags=shape + " --distributed-backend gloo"), gpus=2)
    gpu = run_config(read_flags(flags=shape), gpus=2)
    assert not any("GPU type not given" in note for note in cpu.notes)
    assert any("GPU type not given" in note for note in gpu.notes)


# ---- CUDA graphs -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("values", "impl", "scope"), [
    ({"--cuda-graph-impl": "transformer_engine", "--cuda-graph-scope": "attn moe_router moe_preprocess"},
     "transformer_engine", ("attn", "moe_router", "moe_preprocess")),
    ({"--cuda-graph-impl": "transformer_engine", "--cuda-graph-modules": "attn"}, "transformer_engine", ("attn",)),
    ({"--cuda-graph-impl": "local", "--cuda-graph-scope": "full_iteration"}, "local", ("full_iteration",)),
    ({"--cuda-graph-impl": "full_iteration"}, "local", ("full_iteration",)),  # core_v0.18.0's spelling
    ({"--cuda-graph-impl": "transformer_engine", "--cuda-graph-scope": "full"}, "transformer_engine", ()),
    ({"--enable-cuda-graph": None}, "local", ()),  # the switches before --cuda-graph-impl
    ({"--external-cuda-graph": None, "--cuda-graph-scope": "attn"}, "transformer_engine", ("attn",)),
])
def test_cuda_graphs_are_read_in_every_releases_words(values, impl, scope):
    from megapilot.diagnose.flags import LaunchFlags, cuda_graphs_of

    graphs = cuda_graphs_of(LaunchFlags(values=values))
    assert graphs is not None and (graphs.impl, graphs.scope) == (impl, scope)
    assert cuda_graphs_of(LaunchFlags(values={"--cuda-graph-impl": "none"})) is None


def test_a_logs_arguments_block_says_its_cuda_graph_scopes_as_enums():
    from megapilot.diagnose.flags import cuda_graphs_of, flags_from_arguments

    printed = {"cuda_graph_impl": "transformer_engine",
               "cuda_graph_scope": "[<CudaGraphScope.attn: 1>, <CudaGraphScope.moe_router: 4>]"}
    graphs = cuda_graphs_of(flags_from_arguments(printed, "train.log:12"))
    assert graphs is not None and graphs.scope == ("attn", "moe_router")


def test_a_script_with_cuda_graphs_is_priced_with_them(tmp_path):
    from megapilot.launch import LaunchOptions, render_launch
    from megapilot.spec.cuda_graphs import CudaGraphs
    from tests.launch.plans import MIXTRAL_8X7B, make_plan

    plan = make_plan(MIXTRAL_8X7B, "h100", 1, TrainingSpec(seq_length=4096, global_batch_size=64), ep=8)
    graphs = CudaGraphs(impl="transformer_engine", scope=("attn", "moe_router", "moe_preprocess"))
    options = LaunchOptions(mock_data=True, megatron_path="/opt/Megatron-LM", check_paths_exist=False,
                            cuda_graphs=graphs)
    script = tmp_path / "train.sh"
    script.write_text(render_launch(plan, options).script)
    config = run_config(read_flags(script=script))
    assert config.options.cuda_graphs == graphs
