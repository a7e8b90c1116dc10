"""optimize: FP8 only where the GPU has it, calibration by the measured step, layout diffs as flags."""

from __future__ import annotations

from pathlib import Path

import pytest

from megapilot.catalog import get_model
from megapilot.catalog.gpus import get_gpu
from megapilot.diagnose import read_flags, run_config
from megapilot.diagnose.flags import apply_fixes
from megapilot.diagnose.optimize import optimize
from megapilot.errors import MegapilotError
from megapilot.estimate import estimate
from megapilot.launch import render_launch
from megapilot.launch.megatron_args import committed_tables
from megapilot.launch.options import LaunchOptions
from megapilot.plan import plan
from megapilot.spec import TrainingSpec
from tests.launch.plans import make_plan

FLAGS = ("--num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 "
         "--group-query-attention --num-query-groups 8 --seq-length 4096 --global-batch-size 128 "
         "--micro-batch-size 1 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --sequence-parallel "
         "--use-distributed-optimizer --recompute-granularity full --recompute-method uniform --recompute-num-layers 1 "
         "--bf16 --swiglu --vocab-size 128256")


def config_for(gpu: str):
    return run_config(read_flags(flags=FLAGS), gpu=get_gpu(gpu), gpus=8)


def _labels(report) -> set[str]:
    return {c.label for c in report.changes}


def test_fp8_offered_on_hopper_not_on_ampere():
    assert "FP8 GEMMs" in _labels(optimize(config_for("h100")))
    assert "FP8 GEMMs" not in _labels(optimize(config_for("a100")))


def test_every_change_is_exact_flags_with_predicted_memory():
    report = optimize(config_for("h100"))
    assert report.current_memory_gib and report.current_memory_gib > 0
    for item in report.changes:
        assert item.fixes
        assert all(f.flag.startswith("--") for f in item.fixes if f.kind == "megatron_flag")
        assert all(f.flag.isupper() for f in item.fixes if f.kind == "env")
        assert item.predicted_memory_gib is not None
    labels = _labels(report)
    assert {"micro-batch 2", "tensor parallel 1", "interleaved pipeline (VPP 2)", "selective instead of full recompute",
            "TP communication overlap"} <= labels


def test_bf16_gradients_are_offered_by_their_flag_where_a_bf16_run_reduces_fp32_gradients():
    report = optimize(config_for("h100"))  # DP 2, the reduction not overlapped
    [change] = [c for c in report.changes if c.label == "bf16 gradients"]
    assert [f.flag for f in change.fixes] == ["--grad-reduce-in-bf16"]
    assert change.predicted_memory_gib < report.current_memory_gib and change.gain_pct > 0
    already = run_config(read_flags(flags=FLAGS + " --grad-reduce-in-bf16"), gpu=get_gpu("h100"), gpus=8)
    assert "bf16 gradients" not in _labels(optimize(already))


def test_optimize_needs_gpu_and_complete_flags():
    with pytest.raises(MegapilotError, match="gpu"):
        optimize(run_config(read_flags(flags=FLAGS), gpus=8))
    with pytest.raises(MegapilotError, match="flags"):
        optimize(run_config(read_flags(flags="--tensor-model-parallel-size 2"), gpu=get_gpu("h100"), gpus=8))


def test_measured_step_time_calibrates_every_prediction():
    plain = optimize(config_for("h100"))
    assert plain.current_tokens_per_s_per_gpu
    predicted_step_s = 128 * 4096 / (plain.current_tokens_per_s_per_gpu * 8)
    slower = optimize(config_for("h100"), measured_step_time_s=predicted_step_s * 2)
    assert slower.calibration_scale == pytest.approx(2.0, rel=1e-3)
    assert slower.current_tokens_per_s_per_gpu == pytest.approx(plain.current_tokens_per_s_per_gpu / 2, rel=1e-3)
    gains = [c.gain_pct for c in slower.changes if c.gain_pct is not None and c.fits]
    assert gains == sorted(gains, reverse=True)


def _llama70b_script(tmp_path: Path) -> Path:
    """The issue's run: Llama 3.1 70B, TP4 PP4 CP2 VPP5 on 16 nodes x 8 H100, as `megapilot script` writes it."""
    plan = make_plan(get_model("llama3.1-70b"), "h100", 16, TrainingSpec(seq_length=8192, global_batch_size=512),
                     tp=4, pp=4, vpp=5, cp=2, sequence_parallel=True, recompute="selective")
    launch = render_launch(plan, LaunchOptions(mock_data=True, megatron_path="/opt/Megatron-LM",
                                               check_paths_exist=False))
    path = tmp_path / "train.sh"
    path.write_text(launch.script)
    return path


def test_the_planners_layout_is_proposed_with_every_flag_it_needs_and_its_own_memory(tmp_path: Path):
    config = run_config(read_flags(script=_llama70b_script(tmp_path)))
    report = optimize(config)
    [planner] = [c for c in report.changes if c.source == "planner"]
    best = plan(config.model, config.cluster, config.training, top=1).best.parallel
    proposed = run_config(apply_fixes(config.flags, planner.fixes), gpu=config.gpu, gpus=config.world_size)
    for field in ("tp", "pp", "vpp", "cp", "dp", "mbs", "sequence_parallel", "recompute", "fsdp"):
        assert getattr(proposed.parallel, field) == getattr(best, field), field
    if best.fsdp:  # the FSDP layout is proposed with Megatron-FSDP switched on, not just its memory
        assert proposed.flags.has("--use-megatron-fsdp") and proposed.flags.has("--use-distributed-optimizer")
        assert proposed.flags.get("--ckpt-format") == "fsdp_dtensor"
    exact = estimate(proposed.model, proposed.cluster, proposed.training, proposed.parallel)
    assert planner.predicted_memory_gib == exact.memory_gib.total
    assert planner.fits == exact.fits


def test_when_the_current_layout_does_not_fit_a_layout_that_fits_is_proposed_even_if_slower():
    """MBS 4 without recompute or a sharded optimizer needs far more than 80 GiB: every throughput change still
    overflows, and the planner's best layout, the one that fits, is kept though its tokens/s are below those the
    run would make if it did not stop at its first step. Changes that do not fit come last, best gain first."""
    flags = FLAGS.replace("--micro-batch-size 1", "--micro-batch-size 4").replace(
        "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --sequence-parallel "
        "--use-distributed-optimizer --recompute-granularity full --recompute-method uniform --recompute-num-layers 1 ",
        "--tensor-model-parallel-size 1 ")
    report = optimize(run_config(read_flags(flags=flags), gpu=get_gpu("h100"), gpus=8))
    assert report.current_memory_gib is not None and report.current_memory_gib > 80
    fitting = [c for c in report.changes if c.fits]
    assert any(c.source == "planner" for c in fitting)
    overflowing = [c.gain_pct for c in report.changes if c.fits is False and c.gain_pct is not None]
    assert overflowing == sorted(overflowing, reverse=True)


def test_changes_are_written_for_the_release_that_wrote_the_log():
    """A core_v0.14.0 run (its arguments block) was told `--cuda-graph-impl local`, a flag that release's parser does
    not know (it has --enable-cuda-graph): the job would stop before its first step. diagnose writes its fixes for
    the log's release; optimize now does too, and says which release and what needs an upgrade."""
    from megapilot.diagnose.engine import parse_for_rules
    from megapilot.diagnose.flags import flags_from_log

    log_path = str(Path(__file__).resolve().parents[1] / "data" / "logs" / "synthetic_megatron_arguments.log")
    parsed = parse_for_rules([log_path], None)
    launch = flags_from_log(parsed)
    assert launch is not None
    report = optimize(run_config(launch, gpu=get_gpu("h100")), log=parsed)
    assert any("flag names of Megatron-LM core_v0.14.0" in note for note in report.notes), report.notes
    [graphs] = [c for c in report.changes if c.label.startswith("CUDA graphs")]
    # core_v0.14 names the implementation by a switch: the change is said so, as `megapilot script` writes it for
    # that release (it was marked as needing an upgrade, with no word of v0.14's own spelling)
    flags = [fix for fix in graphs.fixes if fix.kind == "megatron_flag"]
    assert [(fix.flag, fix.value) for fix in flags] == [
        ("--enable-cuda-graph", None), ("--cuda-graph-scope", "full_iteration"), ("--te-rng-tracker", None),
        ("--no-check-for-nan-in-loss-and-grad", None)]
    assert [(fix.kind, fix.flag, fix.value) for fix in graphs.fixes if fix not in flags] == [
        ("env", "NCCL_GRAPH_REGISTER", "0")]
    v014 = next(table for table in committed_tables() if table.release == "core_v0.14.0")
    assert all(fix.flag in v014.flags for fix in flags)  # every one a flag its parser knows
    assert not any("needs Megatron-LM" in note for note in report.notes), report.notes
    assert ("CUDA graphs --cuda-graph-impl local --cuda-graph-scope full_iteration are said --enable-cuda-graph "
            "--cuda-graph-scope full_iteration in Megatron-LM core_v0.14.0, the log's release") in report.notes


def test_the_planners_layout_is_proposed_with_the_dispatcher_it_was_priced_with(tmp_path: Path):
    """DeepSeek-V3 on 1,024 H100 as the 25.09 recipe lays it out, alltoall: the planner costs an expert group that
    leaves the 8-GPU node with the flex dispatcher, so its layout comes with that dispatcher's flags and is
    predicted as the planner ranked it (without them it was priced with alltoall, 31 % below)."""
    plan_ = make_plan(get_model("deepseek-v3"), "h100", 128,
                      TrainingSpec(seq_length=4096, global_batch_size=8192, precision="fp8", fp8_recipe="tensorwise",
                                   grad_reduce_in_bf16=True),
                      tp=2, pp=8, vpp=4, ep=64, etp=1, sequence_parallel=True, pipeline_layout="Et*2|(t*2|)*29t|mL")
    launch = render_launch(plan_, LaunchOptions(mock_data=True, megatron_path="/opt/Megatron-LM",
                                                check_paths_exist=False))
    script = tmp_path / "train.sh"
    script.write_text(launch.script)
    config = run_config(read_flags(script=script))
    best = plan(config.model, config.cluster, config.training, top=1).best
    assert best.moe_flex_dispatcher == "deepep" and best.parallel.ep * best.parallel.expert_tp > 8
    report = optimize(config)
    [planner] = [c for c in report.changes if c.source == "planner"]
    assert {(f.flag, f.value) for f in planner.fixes} >= {("--moe-token-dispatcher-type", "flex"),
                                                         ("--moe-flex-dispatcher-backend", "deepep")}
    assert report.best_tokens_per_s_per_gpu == pytest.approx(best.estimate.tokens_per_s_per_gpu, rel=1e-6)
    assert "flex token dispatcher (deepep)" in _labels(report)  # the current layout's own switch, beside it
