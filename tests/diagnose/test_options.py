"""Layout options: exact flag edits, each re-validated, DP re-derived, with the estimators' prediction."""

from __future__ import annotations

from megapilot.catalog.gpus import get_gpu
from megapilot.diagnose.flags import read_flags, run_config
from megapilot.diagnose.options import (
    change, combined_memory_option, current_prediction, memory_options, remove, throughput_options,
)
from megapilot.spec import validate_layout

# Llama-3-8B shape, TP 2 without SP, MBS 2, no recompute, no distributed optimizer.
LLAMA3_8B = ("--num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 "
             "--group-query-attention --num-query-groups 8 --seq-length 8192 --global-batch-size 128 "
             "--micro-batch-size 2 --bf16 --swiglu --vocab-size 128256 --tensor-model-parallel-size 2")


def _config(flags: str = LLAMA3_8B, gpus: int = 8, gpu: str | None = "h100"):
    return run_config(read_flags(flags=flags), gpu=get_gpu(gpu) if gpu else None, gpus=gpus)


def test_change_sets_a_flag_the_launch_has_and_adds_one_it_lacks():
    flags = read_flags(flags="--micro-batch-size 2")
    assert change(flags, "--micro-batch-size", "1", "r").action == "set"
    assert change(flags, "--sequence-parallel", None, "r").action == "add"
    assert remove("--recompute-method", "r").action == "remove" and remove("--recompute-method", "r").value is None


def test_memory_options_cover_every_saver_the_layout_still_lacks():
    labels = [o.label for o in memory_options(_config(gpu=None))]  # no GPU: nothing predicted, nothing filtered
    assert labels == ["selective recompute", "distributed optimizer", "Megatron-FSDP", "sequence parallel",
                      "micro-batch 1", "full recompute", "pipeline parallel 2", "tensor parallel 4"]


def test_every_option_is_a_legal_layout_that_fills_the_world():
    config = _config()
    for option in memory_options(config) + throughput_options(config):
        p = option.parallel
        assert p.tp * p.pp * p.cp * p.dp == config.world_size, option.label
        validate_layout(config.model, config.cluster, option.training, p)


def test_a_layout_that_does_not_divide_the_world_is_not_offered():
    labels = {o.label for o in memory_options(_config(LLAMA3_8B.replace("128", "120", 1), gpus=6))}
    assert "distributed optimizer" in labels  # the world of 6 is 2 x 3: neither TP 4 nor PP 2 x TP 2 divides it
    assert "tensor parallel 4" not in labels and "pipeline parallel 2" not in labels


def test_every_memory_option_predicts_less_memory_than_now():
    config = _config()
    now = current_prediction(config)
    assert now is not None
    options = memory_options(config)
    assert {"distributed optimizer", "sequence parallel", "micro-batch 1", "full recompute"} <= {o.label for o in options}
    for option in options:
        assert option.prediction is not None and option.prediction.memory_gib < now.memory_gib, option.label


def test_selective_recompute_is_not_offered_when_predicted_to_save_nothing():
    # The estimator assumes fused attention, whose scores are never stored: selective recompute saves 0 GiB.
    assert "selective recompute" not in {o.label for o in memory_options(_config())}


def test_fixes_carry_the_option_label_and_prediction_but_unmodelled_switches_no_throughput():
    options = {o.label: o for o in throughput_options(_config(LLAMA3_8B + " --sequence-parallel"))}
    (larger_batch,) = options["micro-batch 4"].fixes()
    assert larger_batch.option == "micro-batch 4" and larger_batch.flag == "--micro-batch-size"
    assert larger_batch.predicted_memory_gib == options["micro-batch 4"].prediction.memory_gib
    overlap = options["TP communication overlap"]
    assert not overlap.modelled and all(f.predicted_tokens_per_s_per_gpu is None for f in overlap.fixes())


def test_fp8_is_offered_only_on_a_gpu_that_has_it():
    assert "FP8 GEMMs" in {o.label for o in throughput_options(_config())}
    assert "FP8 GEMMs" not in {o.label for o in throughput_options(_config(gpu="a100"))}


def test_without_a_model_shape_there_are_no_options_and_no_prediction():
    config = _config("--tensor-model-parallel-size 2 --micro-batch-size 2")
    assert memory_options(config) == [] and throughput_options(config) == []
    assert current_prediction(config) is None and combined_memory_option(config) is None


def test_combined_option_fits_and_names_each_flag_once():
    config = _config(LLAMA3_8B.replace("--tensor-model-parallel-size 2", "--tensor-model-parallel-size 1"))
    now = current_prediction(config)
    assert now is not None and not now.fits
    combined = combined_memory_option(config)
    assert combined is not None and combined.prediction is not None and combined.prediction.fits
    flags = [f.flag for f in combined.changes]
    assert len(flags) == len(set(flags)) and combined.label.startswith("combined: ")


def test_combined_option_needs_the_gpu_to_predict():
    assert combined_memory_option(_config(gpu=None)) is None
