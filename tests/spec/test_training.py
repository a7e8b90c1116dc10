"""spec.training: what is trained, with the combinations Megatron refuses refused here too."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from megapilot.spec import TrainingSpec
from megapilot.spec.training import PRECISIONS, QUANTIZED_PRECISIONS


def test_tokens_per_step_is_sequence_times_batch():
    assert TrainingSpec(seq_length=4096, global_batch_size=512).tokens_per_step == 2_097_152


@pytest.mark.parametrize(("precision", "recipe", "flavour"), [
    ("bf16", "tensorwise", None), ("fp16", "tensorwise", None), ("fp8", "delayed", "fp8-delayed"),
    ("fp8", "blockwise", "fp8-blockwise"), ("mxfp8", "tensorwise", "mxfp8"), ("nvfp4", "tensorwise", "nvfp4"),
    ("mxfp4", "tensorwise", "mxfp4")])
def test_each_quantised_precision_names_one_flavour(precision, recipe, flavour):
    spec = TrainingSpec(seq_length=8, global_batch_size=1, precision=precision, fp8_recipe=recipe)
    assert spec.quant_flavour == flavour
    assert spec.gemm_format == (flavour or precision)  # what calibration coverage keys a format by
    assert (flavour is not None) is (precision in QUANTIZED_PRECISIONS) and precision in PRECISIONS


@pytest.mark.parametrize("precision", ["bf16", "mxfp8", "nvfp4"])
def test_an_fp8_recipe_beside_another_precision_is_refused(precision):
    with pytest.raises(ValidationError, match=f"delayed applies only to precision fp8, not {precision}"):
        TrainingSpec(seq_length=8, global_batch_size=1, precision=precision, fp8_recipe="delayed")


def test_muon_refuses_fp16_like_megatron_and_runs_with_bf16():
    with pytest.raises(ValidationError, match="dist_muon does not run with fp16"):
        TrainingSpec(seq_length=8, global_batch_size=1, precision="fp16", optimizer="dist_muon")
    spec = TrainingSpec(seq_length=8, global_batch_size=1, optimizer="muon")
    assert spec.uses_muon and not TrainingSpec(seq_length=8, global_batch_size=1).uses_muon


@pytest.mark.parametrize("bad", [{"seq_length": 0}, {"global_batch_size": -1}, {"adam_beta2": 1.0},
                                 {"train_iters": 0}, {"unknown_field": 1}])
def test_out_of_range_or_unknown_fields_are_refused(bad):
    with pytest.raises(ValidationError):
        TrainingSpec(**({"seq_length": 8, "global_batch_size": 1} | bad))


def test_a_sequence_far_beyond_any_published_context_is_refused():
    # 10M tokens (Llama 4 Scout's context) is a real length; a billion is a slip of digits
    assert TrainingSpec(seq_length=10_485_760, global_batch_size=1).seq_length == 10_485_760
    with pytest.raises(ValidationError, match="far beyond any published context") as caught:
        TrainingSpec(seq_length=1_000_000_000, global_batch_size=1)
    assert caught.value.errors()[0]["loc"] == ("seq_length",)


def test_a_global_batch_far_beyond_any_published_one_is_refused_in_sequences_and_in_tokens():
    # DeepSeek-V3's 15,360 sequences of 4,096 tokens and a 10M-token context's batch are real; 10^12 is a slip
    assert TrainingSpec(seq_length=4096, global_batch_size=15_360).tokens_per_step == 62_914_560
    assert TrainingSpec(seq_length=10_485_760, global_batch_size=64).global_batch_size == 64
    with pytest.raises(ValidationError, match="far beyond any published global batch") as caught:
        TrainingSpec(seq_length=4096, global_batch_size=10**12)
    assert caught.value.errors()[0]["loc"] == ("global_batch_size",)
    with pytest.raises(ValidationError, match="tokens a step") as caught:  # each in bounds, their product not
        TrainingSpec(seq_length=1_000_000, global_batch_size=1_000_000)
    assert caught.value.errors()[0]["loc"] == ("global_batch_size",)


def test_train_iters_far_beyond_any_published_run_are_refused():
    assert TrainingSpec(seq_length=8, global_batch_size=1, train_iters=1_000_000).train_iters == 1_000_000
    with pytest.raises(ValidationError) as caught:
        TrainingSpec(seq_length=8, global_batch_size=1, train_iters=10**21)
    assert caught.value.errors()[0]["loc"] == ("train_iters",)
