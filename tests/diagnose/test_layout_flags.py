"""Flag edits from the launch package's rendering: companions come with a switch, leave with it, re-parse exactly."""

from __future__ import annotations

import pytest

from megapilot.catalog.gpus import get_gpu
from megapilot.diagnose.flags import RunConfig, apply_fixes, read_flags, run_config
from megapilot.diagnose.layout_flags import layout_flag_changes, rendered_launch
from megapilot.errors import MegapilotError
from megapilot.launch.checks import check_megatron_args
from megapilot.spec import ParallelConfig

# Llama-3-8B shape on 8 GPUs: TP 2 with SP, selective recompute, the distributed optimizer.
BASE = ("--num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 --group-query-attention "
        "--num-query-groups 8 --swiglu --normalization RMSNorm --seq-length 8192 --global-batch-size 128 "
        "--micro-batch-size 1 --bf16 --vocab-size 128256 --tensor-model-parallel-size 2 --sequence-parallel "
        "--use-distributed-optimizer --recompute-activations")


def _config(flags: str = BASE, gpu: str | None = "h100", gpus: int = 8) -> RunConfig:
    return run_config(read_flags(flags=flags), gpu=get_gpu(gpu) if gpu else None, gpus=gpus)


def _applied(config: RunConfig, target: ParallelConfig) -> RunConfig:
    fixes = layout_flag_changes(config, target, label="test")
    return run_config(apply_fixes(config.flags, fixes), gpu=config.gpu, gpus=config.world_size)


def _target(config: RunConfig, **update: object) -> ParallelConfig:
    assert config.parallel is not None
    return config.parallel.model_copy(update=update)


def test_switching_to_megatron_fsdp_brings_every_flag_the_launch_writes_for_it() -> None:
    config = _config()
    target = _target(config, fsdp=True)
    fixes = layout_flag_changes(config, target, label="Megatron-FSDP")
    applied = apply_fixes(config.flags, fixes)
    assert config.parallel is not None and config.training is not None
    fsdp_launch = rendered_launch(config, target, config.training)
    plain_launch = rendered_launch(config, config.parallel, config.training)
    for name, value in fsdp_launch.flags.items():  # everything the FSDP script has and the plain one lacks
        if plain_launch.flags.get(name, "<absent>") != value:
            assert applied.has(name) and applied.values[name] == value, name
    for name in set(plain_launch.flags) - set(fsdp_launch.flags):
        assert not applied.has(name), name
    assert applied.has("--use-megatron-fsdp") and applied.has("--use-distributed-optimizer")
    assert applied.get("--ckpt-format") == "fsdp_dtensor"
    env = {(f.action, f.flag) for f in fixes if f.kind == "env"}
    assert ("remove", "CUDA_DEVICE_MAX_CONNECTIONS") in env  # Megatron-FSDP refuses it set to 1


def test_switching_fsdp_off_removes_its_flags() -> None:
    fsdp = _config()
    fsdp_flags = apply_fixes(fsdp.flags, layout_flag_changes(fsdp, _target(fsdp, fsdp=True), label="on"))
    config = run_config(fsdp_flags, gpu=get_gpu("h100"), gpus=8)
    assert config.parallel is not None and config.parallel.fsdp
    back = _applied(config, _target(config, fsdp=False))
    assert back.parallel is not None and not back.parallel.fsdp and back.parallel.distributed_optimizer
    assert not back.flags.has("--use-megatron-fsdp") and not back.flags.has("--data-parallel-sharding-strategy")
    assert back.flags.get("--ckpt-format") == "torch_dist"


@pytest.mark.parametrize("update", [
    {"tp": 1, "dp": 8, "sequence_parallel": False},
    {"tp": 4, "dp": 2},
    {"pp": 2, "dp": 2, "vpp": 2},
    {"recompute": "full", "recompute_method": "uniform", "recompute_num_layers": 1},
    {"recompute": "none"},
    {"mbs": 2},
    {"fsdp": True},
    {"distributed_optimizer": False},
])
def test_the_edits_reparse_into_the_layout_they_were_made_for(update: dict[str, object]) -> None:
    config = _config()
    target = _target(config, **update)
    assert _applied(config, target).parallel == target


def test_a_twin_spelling_in_the_script_is_replaced_not_doubled() -> None:
    spelled = _config(BASE.replace("--recompute-activations", "--recompute-granularity selective"))
    full = _target(spelled, recompute="full", recompute_method="uniform", recompute_num_layers=1)
    edits = {(f.action, f.flag, f.value) for f in layout_flag_changes(spelled, full, label="full")}
    assert ("set", "--recompute-granularity", "full") in edits
    assert not any(flag == "--recompute-activations" for _, flag, _ in edits)
    none = layout_flag_changes(spelled, _target(spelled, recompute="none"), label="none")
    assert ("remove", "--recompute-granularity") in {(f.action, f.flag) for f in none}

    interleaved = _config(BASE + " --pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 2")
    assert interleaved.parallel is not None and interleaved.parallel.vpp == 2
    flat = _applied(interleaved, _target(interleaved, vpp=1))
    assert flat.parallel is not None and flat.parallel.vpp == 1
    assert not flat.flags.has("--num-virtual-stages-per-pipeline-rank")


def test_an_unchanged_layout_needs_no_edit() -> None:
    config = _config()
    assert config.parallel is not None
    assert layout_flag_changes(config, config.parallel, label="same") == []


def test_without_a_gpu_only_the_layout_sections_are_rendered() -> None:
    config = _config(gpu=None)
    assert config.parallel is not None and config.training is not None
    launch = rendered_launch(config, config.parallel, config.training)
    assert launch.env == {} and "--bf16" not in launch.flags and "--tensor-model-parallel-size" in launch.flags
    fixes = layout_flag_changes(config, _target(config, tp=4, dp=2), label="tp4")
    assert [(f.action, f.flag, f.value) for f in fixes if f.kind == "env"] == []
    assert ("set", "--tensor-model-parallel-size", "4") in {(f.action, f.flag, f.value) for f in fixes}


@pytest.mark.parametrize("precision", ["--fp8-format e4m3 --fp8-recipe mxfp8", "--fp4-format e2m1 --fp4-recipe nvfp4",
                                       "--fp8-format e4m3 --fp8-recipe blockwise"])
def test_without_a_gpu_a_block_scaled_launch_still_gets_its_layout_edits(precision: str) -> None:
    """The layout sections are rendered on a stand-in GPU that runs the launch's precision: on an H100 an MXFP8 or
    NVFP4 launch was refused, and `diagnose` on its OOM offered no memory fix at all."""
    config = _config(f"{BASE} {precision}", gpu=None)
    fixes = layout_flag_changes(config, _target(config, tp=4, dp=2), label="tp4")
    assert ("set", "--tensor-model-parallel-size", "4") in {(f.action, f.flag, f.value) for f in fixes}


def test_a_layout_the_launch_refuses_raises_the_user_error() -> None:
    config = _config(BASE + " --pipeline-model-parallel-size 2")
    with pytest.raises(MegapilotError):  # Megatron-FSDP with pipeline parallelism
        layout_flag_changes(config, _target(config, fsdp=True), label="fsdp")


@pytest.mark.parametrize("checkpoints", ["--save /ckpt/run", "--load /ckpt/run"])
def test_a_run_that_saves_or_loads_keeps_its_checkpoint_format_under_interleaving(checkpoints: str) -> None:
    """Megatron refuses --overlap-param-gather-with-optimizer-step beside a distributed checkpoint format: a run
    with checkpoints is not moved to the legacy `torch` format to get it."""
    flags = BASE.replace("--tensor-model-parallel-size 2", "--tensor-model-parallel-size 2 "
                         "--pipeline-model-parallel-size 2") + " " + checkpoints
    config = _config(flags)
    fixes = layout_flag_changes(config, _target(config, vpp=2), label="interleaved pipeline")
    edited = {fix.flag for fix in fixes}
    assert "--num-layers-per-virtual-pipeline-stage" in edited
    assert "--ckpt-format" not in edited and "--overlap-param-gather-with-optimizer-step" not in edited


def test_a_companion_the_users_flags_lack_comes_with_the_flag_that_needs_it() -> None:
    """Both renderings write --overlap-param-gather, so the difference of the two lacks it; a launch without it
    that is moved to an interleaved pipeline (and saves nothing) gets the optimizer-step overlap with the param
    gather and the gradient overlap that Megatron requires beside it."""
    flags = (BASE.replace("--tensor-model-parallel-size 2", "--tensor-model-parallel-size 2 "
                          "--pipeline-model-parallel-size 2"))
    config = _config(flags)
    fixes = layout_flag_changes(config, _target(config, vpp=2), label="interleaved pipeline")
    applied = apply_fixes(config.flags, fixes)
    assert applied.has("--overlap-param-gather-with-optimizer-step")
    assert applied.has("--overlap-param-gather") and applied.has("--overlap-grad-reduce")
    words = [word for name, value in applied.values.items() for word in (name, *(value.split() if value else ()))]
    check_megatron_args([*words, "--mock-data"], get_gpu("h100"))


def test_without_a_gpu_the_megatron_fsdp_proposal_still_switches_fsdp_on() -> None:
    config = _config(gpu=None)
    target = _target(config, fsdp=True)
    applied = _applied(config, target)
    assert applied.flags.has("--use-megatron-fsdp") and applied.flags.get("--ckpt-format") == "fsdp_dtensor"
    assert applied.parallel == target
