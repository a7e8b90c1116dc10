"""Predictions come from the estimators; a layout they refuse has none."""

from __future__ import annotations

import sys

import pytest

from megapilot.catalog.gpus import get_gpu
from megapilot.diagnose.predict import predict
from megapilot.spec import ClusterSpec, ModelSpec, ParallelConfig, Prediction, TrainingSpec

MODEL = ModelSpec(name="tiny", num_layers=4, hidden_size=256, num_attention_heads=8, ffn_hidden_size=1024,
                  vocab_size=32000)
TRAINING = TrainingSpec(seq_length=2048, global_batch_size=64)


def _cluster(gpus: int = 8) -> ClusterSpec:
    return ClusterSpec.from_gpu_count(get_gpu("h100"), gpus)


def test_fits_compares_memory_with_capacity_inclusive():
    assert Prediction(memory_gib=80.0, capacity_gib=80.0).fits
    assert not Prediction(memory_gib=80.01, capacity_gib=80.0).fits


def test_a_legal_layout_gets_memory_and_when_available_throughput():
    result = predict(MODEL, _cluster(), TRAINING, ParallelConfig(tp=2, pp=1, dp=4, mbs=1))
    assert result is not None and 0 < result.memory_gib < result.capacity_gib and result.fits
    assert result.capacity_gib <= get_gpu("h100").hbm_gib
    assert result.step_time_s and result.step_time_s > 0
    assert result.tokens_per_s_per_gpu and result.tokens_per_s_per_gpu > 0
    assert result.mfu is not None and 0 < result.mfu < 1


def test_more_tensor_parallel_ranks_predict_less_memory_per_gpu():
    tp1 = predict(MODEL, _cluster(), TRAINING, ParallelConfig(tp=1, dp=8, mbs=4))
    tp4 = predict(MODEL, _cluster(), TRAINING, ParallelConfig(tp=4, dp=2, mbs=4, sequence_parallel=True))
    assert tp1 is not None and tp4 is not None and tp4.memory_gib < tp1.memory_gib


def test_a_layout_the_estimators_refuse_has_no_prediction():
    # 8 heads cannot be split over 16 TP ranks.
    assert predict(MODEL, _cluster(16), TRAINING, ParallelConfig(tp=16, dp=1, mbs=1)) is None


def test_an_estimator_defect_is_not_hidden_as_no_prediction(monkeypatch: pytest.MonkeyPatch) -> None:
    # A stand-in for a bug inside the estimator: only the project's user-error type means "refused".
    def broken_estimate(*args: object, **kwargs: object) -> None:
        raise ZeroDivisionError("division by zero inside the estimator")

    # the package exports the function under the module's name: patch the module itself
    monkeypatch.setattr(sys.modules["megapilot.diagnose.predict"], "estimate", broken_estimate)
    with pytest.raises(ZeroDivisionError):
        predict(MODEL, _cluster(), TRAINING, ParallelConfig(tp=2, pp=1, dp=4, mbs=1))
