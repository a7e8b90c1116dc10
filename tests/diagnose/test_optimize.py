"""optimize: FP8 only where the GPU has it, calibration by the measured step, layout diffs as flags."""

from __future__ import annotations

import pytest

from megapilot.catalog.gpus import get_gpu
from megapilot.diagnose import read_flags, run_config
from megapilot.diagnose.optimize import optimize
from megapilot.errors import MegapilotError

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
