"""The trainer's flag table and its refusals (torch-free, fast)."""

from __future__ import annotations

import pytest

from megapilot.errors import MegapilotError
from megapilot.trainer.args import FLAGS, GPU_ONLY_FLAGS, UNSUPPORTED_FLAGS, flag_names, parse_flags

# The pretrain_gpt.py flags the trainer must accept (issue 6).
REQUIRED_FLAGS = ["--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads", "--num-query-groups",
                  "--group-query-attention", "--swiglu", "--normalization", "--position-embedding-type", "--seq-length",
                  "--max-position-embeddings", "--micro-batch-size", "--global-batch-size", "--train-iters", "--lr",
                  "--min-lr", "--lr-decay-style", "--lr-warmup-iters", "--weight-decay", "--clip-grad", "--adam-beta1",
                  "--adam-beta2", "--init-method-std", "--seed", "--tensor-model-parallel-size",
                  "--pipeline-model-parallel-size", "--num-layers-per-virtual-pipeline-stage",
                  "--context-parallel-size", "--expert-model-parallel-size", "--expert-tensor-parallel-size",
                  "--sequence-parallel", "--use-distributed-optimizer", "--overlap-grad-reduce",
                  "--overlap-param-gather", "--num-experts", "--moe-router-topk", "--moe-ffn-hidden-size",
                  "--moe-router-load-balancing-type", "--moe-aux-loss-coeff", "--moe-token-dispatcher-type",
                  "--recompute-granularity", "--recompute-method", "--recompute-num-layers", "--recompute-activations",
                  "--bf16", "--fp16", "--data-path", "--mock-data", "--split", "--tokenizer-type", "--tokenizer-model",
                  "--vocab-size", "--vocab-file", "--merge-file", "--log-interval", "--log-throughput",
                  "--timing-log-level", "--save", "--load", "--save-interval", "--ckpt-format", "--eval-interval",
                  "--eval-iters", "--make-vocab-size-divisible-by", "--disable-bias-linear",
                  "--untie-embeddings-and-output-weights", "--rotary-base", "--exit-interval", "--distributed-backend"]


def test_flag_table_lists_every_required_megatron_flag():
    missing = sorted(set(REQUIRED_FLAGS) - set(flag_names()))
    assert missing == []


def test_flag_names_are_unique_and_not_also_refused():
    names = flag_names()
    assert len(names) == len(set(names))
    assert not set(names) & (set(GPU_ONLY_FLAGS) | set(UNSUPPORTED_FLAGS))


def test_parses_values_with_megatron_meaning():
    ns = parse_flags(["--num-layers", "4", "--lr", "3e-4", "--swiglu", "--normalization", "RMSNorm",
                      "--split=90,10,0"])
    assert (ns.num_layers, ns.lr, ns.swiglu, ns.normalization, ns.split) == (4, 3e-4, True, "RMSNorm", "90,10,0")
    defaults = {flag.dest: flag.default for flag in FLAGS}
    assert ns.clip_grad == defaults["clip_grad"] == 1.0


def test_unknown_flag_is_named_in_a_one_line_error():
    with pytest.raises(MegapilotError) as err:
        parse_flags(["--num-layers", "2", "--not-a-megatron-flag", "1"])
    assert err.value.field == "--not-a-megatron-flag"
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("flag", ["--fp8-format", "--tp-comm-overlap", "--moe-grouped-gemm"])
def test_gpu_only_flags_are_refused_on_cpu_as_needing_a_gpu(flag):
    with pytest.raises(MegapilotError, match="needs a GPU") as err:
        parse_flags([flag, "hybrid"] if flag == "--fp8-format" else [flag], gpu_available=False)
    assert err.value.field == flag


def test_unimplemented_flag_is_refused_even_with_equals_syntax():
    with pytest.raises(MegapilotError, match="not supported") as err:
        parse_flags(["--rampup-batch-size=16,16,1000"])
    assert err.value.field == "--rampup-batch-size"


def test_bad_value_type_names_the_flag():
    with pytest.raises(MegapilotError) as err:
        parse_flags(["--num-layers", "four"])
    assert err.value.field == "--num-layers"


def test_bad_choice_names_the_flag():
    with pytest.raises(MegapilotError) as err:
        parse_flags(["--lr-decay-style", "sawtooth"])
    assert err.value.field == "--lr-decay-style"


def test_flag_table_config_and_log_formats_load_without_torch():
    """The launch renderer and the CLI read these modules; the core must not pull torch in."""
    import subprocess
    import sys

    code = ("import sys, megapilot.trainer.args, megapilot.trainer.config, megapilot.trainer.logfmt, "
            "megapilot.trainer.flops, megapilot.data; print('torch' in sys.modules or 'megatron' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
