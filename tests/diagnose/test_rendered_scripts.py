"""`read_flags` on the scripts `megapilot script` writes: the run read back is the plan rendered.

Every golden launch (torchrun, SLURM sbatch, Primus) is read as `megapilot diagnose/optimize --script`
reads it; the model, the layout and the GPU count recovered must be the plan's.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from megapilot.diagnose import read_flags, run_config
from megapilot.diagnose.flags import moe_layer_placement
from megapilot.diagnose.predict import predict
from megapilot.estimate import EstimateOptions, estimate
from megapilot.launch import LaunchOptions, render_launch, render_megatron_args
from megapilot.spec import ModelSpec, SavedPlan
from tests.launch.golden_cases import LAUNCHERS, golden_options
from tests.launch.plans import GOLDEN_PLANS
from tests.launch.variants import MEGATRON_MOCK, PAIRED_VARIANTS, VARIANT_PLANS

GOLDEN_DIR = Path(__file__).parents[1] / "launch" / "golden"
CASES = [(case, launcher) for case in GOLDEN_PLANS for launcher in LAUNCHERS]
# What the flags cannot carry: the preset's name, and the vocabulary (behind a tokenizer file).
NOT_IN_FLAGS = {"name", "vocab_size", "hf_architecture"}


def _shape(model: ModelSpec) -> dict:
    dumped = model.model_dump(exclude=NOT_IN_FLAGS)
    dumped["kv_channels"] = model.head_dim if model.mla is None else None
    return dumped


@pytest.mark.parametrize(("case", "launcher"), CASES, ids=[f"{c}-{launcher}" for c, launcher in CASES])
def test_golden_script_reads_back_as_its_plan(case: str, launcher: str) -> None:
    plan = GOLDEN_PLANS[case]
    config = run_config(read_flags(script=GOLDEN_DIR / f"{case}.{launcher}.sh"))

    assert config.world_size == plan.cluster.world_size
    assert not any("GPU count not given" in note for note in config.notes)
    assert config.model is not None, config.notes
    assert _shape(config.model) == _shape(plan.model)
    for field in ("tp", "pp", "vpp", "cp", "ep", "expert_tp", "dp", "mbs", "sequence_parallel", "recompute",
                  "recompute_num_layers", "distributed_optimizer", "first_stage_layers", "last_stage_layers"):
        assert getattr(config.parallel, field) == getattr(plan.parallel, field), field
    training = config.training
    assert (training.seq_length, training.global_batch_size, training.train_iters) == (
        plan.training.seq_length, plan.training.global_batch_size, plan.training.train_iters)
    assert training.lr == plan.training.lr and training.min_lr == plan.training.min_lr


def test_primus_experiment_yaml_is_read_directly_and_through_the_script_that_names_it(tmp_path: Path) -> None:
    case = "mixtral-8x7b_ep8"
    launch = render_launch(GOLDEN_PLANS[case], golden_options(case, "primus"))
    [(_, experiment)] = launch.files.items()
    yaml_path = tmp_path / "exp.yaml"
    yaml_path.write_text(experiment)
    direct = run_config(read_flags(script=yaml_path), gpus=16)
    assert _shape(direct.model) == _shape(GOLDEN_PLANS[case].model) and direct.parallel.ep == 8

    # A hand-written script that only names the experiment file (no here-document).
    script = tmp_path / "run_primus.sh"
    script.write_text("#!/bin/bash\nexport NNODES=2 GPUS_PER_NODE=8\n"
                      "bash runner/primus-cli direct -- train pretrain --config exp.yaml\n")
    named = run_config(read_flags(script=script))
    assert named.world_size == 16 and (named.parallel.tp, named.parallel.ep) == (2, 8)


def test_bash_arrays_with_comments_inside_and_quoted_expansion(tmp_path: Path) -> None:
    script = tmp_path / "train.sh"
    script.write_text(
        "#!/bin/bash\n#SBATCH --nodes=4\nTP=2\n"
        "TORCHRUN_ARGS=(\n  # launcher\n  --nnodes \"$SLURM_NNODES\"\n  --nproc-per-node 8\n)\n"
        "ARGS=(\n  # model (a comment with ) and ( inside)\n  --num-layers 8\n  --hidden-size 512  # trailing\n"
        "  --num-attention-heads 8\n  --tensor-model-parallel-size \"$TP\"\n  --save '/ckpt/a b'\n)\n"
        "ARGS+=( --seq-length 1024 )\n"
        'srun python -m torch.distributed.run "${TORCHRUN_ARGS[@]}" pretrain_gpt.py "${ARGS[@]}"\n')
    flags = read_flags(script=script)
    assert flags.get("--save") == "/ckpt/a b" and flags.get("--seq-length") == "1024"
    config = run_config(flags)
    assert config.world_size == 32 and config.parallel.tp == 2 and config.model.num_layers == 8


def test_srun_one_task_per_gpu_takes_the_world_from_sbatch(tmp_path: Path) -> None:
    script = tmp_path / "train.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH --nodes 2\n#SBATCH --ntasks-per-node=8\n"
                      "srun python pretrain_gpt.py --tensor-model-parallel-size 4 --num-layers 2 --hidden-size 64 "
                      "--num-attention-heads 4\n")
    assert run_config(read_flags(script=script)).world_size == 16


@pytest.mark.parametrize(("text", "placement"), [
    (None, (0, 1)), ("2", (0, 2)), ("([0]*1+[1]*26)", (1, 1)), ("[0,0,1,0,1,0,1]", (2, 2)), ("([0]*3+[1,0]*4)", (3, 2)),
])
def test_moe_layer_freq_forms(text: str | None, placement: tuple[int, int]) -> None:
    assert moe_layer_placement(text) == placement


def test_the_gpu_named_in_the_header_is_used_unless_given_or_a_cpu_run(tmp_path: Path) -> None:
    from megapilot.catalog.gpus import get_gpu

    script = GOLDEN_DIR / "deepseek-v2-lite_mla.slurm.sh"
    config = run_config(read_flags(script=script))
    assert config.gpu == get_gpu("mi300x") and config.complete
    assert any("from the script's header" in note for note in config.notes)
    assert run_config(read_flags(script=script), gpu=get_gpu("h100")).gpu == get_gpu("h100")

    cpu_script = tmp_path / "cpu.sh"
    cpu_script.write_text(script.read_text().replace("--transformer-impl transformer_engine",
                                                     "--transformer-impl local\n  --distributed-backend gloo"))
    assert run_config(read_flags(script=cpu_script)).gpu is None


# SYNTHETIC, in the style of Megatron-LM's examples/*/train_*.sh: positional defaults, arithmetic,
# arrays built with += from quoted multi-word elements, conditionals, a here-string, trailing comments.
EXAMPLE_STYLE = r"""#!/bin/bash
export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-1}
CHECKPOINT_PATH=${1:-"checkpoints/run one"}
GPUS_PER_NODE=8
NUM_NODES=2
WORLD_SIZE=$(($GPUS_PER_NODE*$NUM_NODES))
NUM_LAYERS=16
MOE_LAYERS=$(($NUM_LAYERS-1))
DISTRIBUTED_ARGS=(
    --nproc_per_node $GPUS_PER_NODE
    --nnodes $NUM_NODES
)
GPT_ARGS=(
    --num-layers 16
    --hidden-size 2048 --ffn-hidden-size 10944
    --num-attention-heads 16
    --seq-length 1024 --max-position-embeddings 1024
    --transformer-impl local  # trailing comment (with parentheses)
    # --attention-backend local
)
MOE_ARGS=(
    --num-experts 64
    --moe-layer-freq "([0]+[1]*15)"
    --moe-ffn-hidden-size 1408 --moe-router-topk 6
)
TRAINING_ARGS=(
    --micro-batch-size 1
    --global-batch-size 64
    --bf16
)
DDP_ARGS=(--use-distributed-optimizer --overlap-grad-reduce)
TRAINING_ARGS+=("${DDP_ARGS[@]}")
DTYPE_ARGS=()
if [[ "$DTYPE" == "fp8" ]]; then
    if grep -q "transformer-impl local" <<< "${GPT_ARGS[@]}"; then
        echo "ERROR: it's local"; exit 1
    fi
fi
PARALLEL_ARGS=(
    "--tensor-model-parallel-size 2"
    "--expert-model-parallel-size 8"
)
torchrun ${DISTRIBUTED_ARGS[@]} pretrain_gpt.py \
    ${GPT_ARGS[@]} ${MOE_ARGS[@]} \
    ${TRAINING_ARGS[@]} ${DTYPE_ARGS[@]} ${PARALLEL_ARGS[@]} \
    --save "$CHECKPOINT_PATH"
"""


def test_example_style_script_with_arithmetic_appends_and_multi_word_elements(tmp_path: Path) -> None:
    script = tmp_path / "train.sh"
    script.write_text(EXAMPLE_STYLE)
    flags = read_flags(script=script)
    assert flags.get("--save") == "checkpoints/run one" and flags.get("--transformer-impl") == "local"
    assert flags.has("--use-distributed-optimizer") and flags.has("--overlap-grad-reduce")
    config = run_config(flags)
    assert config.world_size == 16 and (config.parallel.tp, config.parallel.ep, config.parallel.dp) == (2, 8, 8)
    assert config.model.moe.first_k_dense_layers == 1 and config.model.num_moe_layers == 15
    assert config.training.global_batch_size == 64 and config.training.precision == "bf16"


@pytest.mark.parametrize("split", [
    {"pp": 8, "vpp": 8, "account_for_embedding": True, "account_for_loss": True},
    {"pp": 8, "pipeline_layout": "Et*15|(t*16|)*6t*15L"},
    {"pp": 4, "vpp": 2, "pipeline_layout": "Et*15|(t*16|)*6t*15L"},
])
def test_every_pipeline_split_is_rendered_and_read_back(split: dict, tmp_path: Path) -> None:
    """126-layer Llama 3.1 405B on splits Megatron expresses only with the account-for flags or a layout."""
    from megapilot.launch import LaunchOptions
    from megapilot.spec import TrainingSpec
    from megapilot.spec.pipeline import parse_layout
    from tests.launch.plans import LLAMA31_405B, make_plan

    plan = make_plan(LLAMA31_405B, "h100", 16, TrainingSpec(seq_length=8192, global_batch_size=512), tp=8,
                     sequence_parallel=True, **split)
    options = LaunchOptions(mock_data=True, megatron_path="/opt/Megatron-LM", check_paths_exist=False)
    launch = render_launch(plan, options)
    args = launch.megatron_args
    if "pipeline_layout" in split:
        layout = args[args.index("--pipeline-model-parallel-layout") + 1]
        assert len(parse_layout(layout)) == plan.parallel.pp * plan.parallel.vpp
        assert not {"--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank"} & set(args)
    else:
        assert {"--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"} <= set(args)
    script = tmp_path / "run.sh"
    script.write_text(launch.script)
    config = run_config(read_flags(script=script))
    for field in ("pp", "vpp", "account_for_embedding", "account_for_loss", "pipeline_layout"):
        assert getattr(config.parallel, field) == getattr(plan.parallel, field), field
    assert config.parallel.rank_layer_counts(126) == plan.parallel.rank_layer_counts(126)


# Every variant `script` renders (precisions, FSDP, offloading, uneven splits, MoE dispatchers, overlaps, CUDA graphs,
# hybrids, optimizers), with the launch options it was rendered with.
_PRICED = [(name, plan, MEGATRON_MOCK) for name, plan in VARIANT_PLANS.items()] + [
    (f"paired-{i}", plan, options) for i, (plan, options) in enumerate(PAIRED_VARIANTS)]


@pytest.mark.parametrize(("name", "plan", "options"), _PRICED, ids=[case[0] for case in _PRICED])
def test_a_rendered_script_read_back_is_priced_as_its_plan(name: str, plan: SavedPlan, options: LaunchOptions) -> None:
    """`optimize --script` and `diagnose` price a run by what its script says: what they predict for a script
    `megapilot script` wrote must be what `estimate` predicts for its plan with the switches the script writes (an
    MXFP8 launch once read back as FP8 with per-tensor scaling, an NVFP4 one priced with a TP overlap it cannot run)."""
    config = run_config(read_flags(flags=" ".join(render_megatron_args(plan, options))), gpu=plan.cluster.gpu,
                        gpus=plan.cluster.world_size)
    assert config.complete, config.notes
    written = EstimateOptions(moe_flex_dispatcher=options.moe_flex_dispatcher is not None,
                              moe_a2a_overlap=options.moe_a2a_overlap, cuda_graphs=options.cuda_graphs)
    expected = estimate(plan.model, plan.cluster, plan.training, plan.parallel, written)
    read_back = predict(config.model, config.cluster, config.training, config.parallel, config.options)
    assert read_back.tokens_per_s_per_gpu == pytest.approx(expected.tokens_per_s_per_gpu, rel=1e-9)
    assert read_back.memory_gib == pytest.approx(expected.memory_gib.total, abs=0.001)
