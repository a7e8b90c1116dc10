"""CPU renders (`--cpu`, embedded trainer): every layout the trainer runs on CPU is rendered so that the
trainer's own argument check accepts it; what it refuses on CPU is left out (said in a note) or refused.

The check is `megapilot.trainer.config.build_config(argv, gpu_available=False)`, the function the
trainer runs at start-up before any process group exists: no training, milliseconds.
"""

from __future__ import annotations

import sys

import pytest

from megapilot.catalog import get_model
from megapilot.catalog.gpus import get_gpu
from megapilot.errors import MegapilotError
from megapilot.launch import LaunchOptions, render_launch
from megapilot.spec import ClusterSpec, ModelSpec, MoESpec, ParallelConfig, SavedPlan, TrainingSpec
from megapilot.trainer.config import build_config

TINY = get_model("tiny")
TINY_MOE = ModelSpec(
    name="tiny-moe", num_layers=4, hidden_size=64, ffn_hidden_size=256, num_attention_heads=4, vocab_size=1024,
    max_position_embeddings=128, moe=MoESpec(num_experts=4, router_topk=2, moe_ffn_hidden_size=64),
)
# Plans as the planner writes them: sequence parallel on with TP, selective recompute, bf16.
LAYOUTS = {
    "tp2": (TINY, 2, {"tp": 2, "sequence_parallel": True}),
    "pp2": (TINY, 2, {"pp": 2}),
    "pp2-vpp2": (TINY, 2, {"pp": 2, "vpp": 2}),
    "dp2": (TINY, 2, {}),
    "tp2-pp2": (TINY, 4, {"tp": 2, "pp": 2, "sequence_parallel": True}),
    "moe-ep2": (TINY_MOE, 2, {"ep": 2}),
}
CPU = LaunchOptions(mock_data=True, entrypoint="megapilot", cpu=True, python=sys.executable)


def _plan(model: ModelSpec, world: int, **layout: object) -> SavedPlan:
    return SavedPlan(
        model=model, cluster=ClusterSpec(gpu=get_gpu("h100"), num_nodes=1, gpus_per_node=world),
        training=TrainingSpec(seq_length=64, global_batch_size=8, train_iters=3),
        parallel=ParallelConfig.for_world(world, mbs=1, recompute="selective", **layout),
    )


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_every_cpu_render_of_the_tiny_layouts_is_accepted_by_the_trainer(name: str) -> None:
    model, world, layout = LAYOUTS[name]
    plan = _plan(model, world, **layout)
    launch = render_launch(plan, CPU)

    config = build_config(launch.megatron_args, gpu_available=False)
    config.check_world_size(world)
    assert (config.tensor_model_parallel_size, config.pipeline_model_parallel_size) == (plan.parallel.tp,
                                                                                         plan.parallel.pp)
    assert config.expert_model_parallel_size == plan.parallel.ep
    assert (config.virtual_pipeline_model_parallel_size or 1) == plan.parallel.vpp
    assert config.recompute_granularity == "selective"
    assert "--sequence-parallel" not in launch.megatron_args
    if plan.parallel.sequence_parallel:
        assert any("sequence parallelism left out" in note for note in launch.notes)
    if model.moe is not None:
        assert config.moe_token_dispatcher_type == "allgather"


def test_gpu_render_keeps_sequence_parallel_and_alltoall() -> None:
    gpu = CPU.model_copy(update={"cpu": False})
    args = render_launch(_plan(TINY_MOE, 2, tp=2, sequence_parallel=True, ep=2), gpu).megatron_args
    assert "--sequence-parallel" in args
    assert args[args.index("--moe-token-dispatcher-type") + 1] == "alltoall"


def test_context_parallel_cpu_render_is_refused_naming_cp() -> None:
    with pytest.raises(MegapilotError) as info:
        render_launch(_plan(TINY, 2, cp=2), CPU)
    assert info.value.field == "cp" and "--cp 1" in info.value.fix
    assert "\n" not in str(info.value)


def test_what_the_trainer_refuses_is_refused_at_render_time() -> None:
    """Real data with a Hugging Face tokenizer: the trainer has only its byte tokenizer for --data-path, so
    the render says so instead of writing a script that dies at start-up."""
    options = CPU.model_copy(update={"mock_data": False, "data_path": "/d/x_text_document",
                                     "tokenizer_model": "/t/tokenizer.json", "check_paths_exist": False})
    with pytest.raises(MegapilotError) as info:
        render_launch(_plan(TINY, 1), options)
    assert info.value.field == "--tokenizer-type" and "trainer would refuse" in info.value.problem


def test_dense_first_moe_pattern_reaches_the_trainer_as_a_layer_list() -> None:
    dense_first = TINY_MOE.model_copy(update={"moe": TINY_MOE.moe.model_copy(update={"first_k_dense_layers": 1})})
    launch = render_launch(_plan(dense_first, 2, ep=2), CPU)
    config = build_config(launch.megatron_args, gpu_available=False)
    assert config.moe_layer_freq == (0, 1, 1, 1)
    assert [config.is_moe_layer(i) for i in range(4)] == [False, True, True, True]
