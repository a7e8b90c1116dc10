"""The trainer's log lines have Megatron-LM's layout and the project's log parser reads them back."""

from __future__ import annotations

import re
from datetime import datetime

from megapilot.trainer import logfmt

NOW = datetime(2026, 1, 1, 0, 10, 0, 123456)

STATS = logfmt.IterationStats(
    iteration=10, train_iters=50, consumed_samples=1280, elapsed_ms_per_iteration=9070.1,
    throughput_tflops_per_gpu=744.0, learning_rate=1.5e-4, global_batch_size=128, losses={"lm loss": 7.123456},
    loss_scale=1.0, grad_norm=2.345, skipped_iterations=0, nan_iterations=0)


def test_iteration_line_matches_the_reference_example_exactly():
    # The reference's example line (megatron_log_format.md §1, HEAD formatting).
    expected = (" [2026-01-01 00:10:00.123456] iteration       10/      50 | consumed samples:         1280 | "
                "elapsed time per iteration (ms): 9070.1 | throughput per GPU (TFLOP/s/GPU): 744.0 | "
                "learning rate: 1.500000E-04 | global batch size:   128 | lm loss: 7.123456E+00 | loss scale: 1.0 | "
                "grad norm: 2.345 | number of skipped iterations:   0 | number of nan iterations:   0 |")
    assert logfmt.iteration_line(STATS, NOW) == expected


def test_moe_metrics_follow_the_losses_with_two_decimals():
    from dataclasses import replace

    line = logfmt.iteration_line(replace(STATS, moe_metrics={"load_balancing_loss": 1.0234}), NOW)
    assert "| lm loss: 7.123456E+00 | load_balancing_loss: 1.02 | loss scale: 1.0 |" in line


def test_memory_and_checkpoint_lines_match_the_reference_layout():
    assert logfmt.memory_line(0, 10, 12345.67, 45678.9, 50000, 52000) == (
        "[Rank 0] (after 10 iterations) memory (MB) | allocated: 12345.67 | max allocated: 45678.90 | "
        "reserved: 50000.00 | max reserved: 52000.00")
    assert logfmt.saving_checkpoint_line(50, "/path/to/ckpt", NOW) == (
        "[2026-01-01 00:10:00.123456] saving checkpoint at iteration      50 to /path/to/ckpt in torch_dist format")
    assert logfmt.saved_checkpoint_line(50, "/p", 0, 8, 3, 4, NOW) == (
        "  [2026-01-01 00:10:00.123456] successfully saved checkpoint from iteration      50 to /p [ t 1/8, p 4/4 ]")
    assert logfmt.loaded_checkpoint_line("/p", 50, 1, 2, 0, 1) == (
        "  successfully loaded checkpoint from /p [ t 2/2, p 1/1 ] at iteration 50")


def test_timer_names_are_padded_with_dots_to_48_characters():
    line = logfmt.timers_lines("(min, max) time across ranks (ms):", {"save-checkpoint": (1.0, 2.5)})[1]
    assert line == "    save-checkpoint ................................: (1.00, 2.50)"
    assert re.match(r"^    [\w-]+ \.+: ", line) and len(line.split(":")[0]) == 4 + 48


def test_project_log_parser_reads_every_kind_of_line():
    from megapilot.logs import parse_text

    text = "\n".join([
        logfmt.saving_checkpoint_line(10, "/ck", NOW),
        logfmt.saved_checkpoint_line(10, "/ck", 0, 1, 0, 1, NOW),
        logfmt.iteration_line(STATS, NOW),
        logfmt.memory_line(0, 10, 300.0, 310.0, 300.0, 310.0),
        *logfmt.timers_lines("(min, max) time across ranks (ms):", {"forward-backward": (9000.12, 9010.34)}),
    ]) + "\n"
    parsed = parse_text(text)
    assert parsed.dialect == "megatron-lm"
    [record] = parsed.iterations
    assert (record.iteration, record.train_iters, record.lm_loss, record.grad_norm) == (10, 50, 7.123456, 2.345)
    assert record.tflops_per_gpu == 744.0 and record.gbs == 128
    assert parsed.memory[0].after_iterations == 10
    assert parsed.checkpoints[0].kind == "save" and parsed.checkpoints[0].iteration == 10
    assert parsed.timers and parsed.timers[0].name == "forward-backward"


def test_the_version_line_tells_diagnose_the_release_the_partial_arguments_block_cannot():
    # the trainer prints only its own flags in the arguments block: matched against the release tables, a run of
    # megatron-core 0.16.1 read as core_v0.14.0
    from megapilot.diagnose.megatron_version import recognise_megatron_version
    from megapilot.logs import parse_text

    text = "\n".join([logfmt.version_line("0.16.1", "2.13.0+cpu"),
                      *logfmt.arguments_lines({"world_size": 2, "seq_length": 128}),
                      logfmt.iteration_line(STATS, NOW)]) + "\n"
    recognised = recognise_megatron_version(parse_text(text))
    assert recognised is not None and (recognised.release, recognised.source, recognised.exact) == (
        "core_v0.16.0", "version line", True)


def test_arguments_block_has_megatron_layout():
    lines = logfmt.arguments_lines({"world_size": 64, "seq_length": 4096, "Zeta": None,
                                    "accumulate_allreduce_grads_in_fp32": False})
    assert lines[0] == "------------------------ arguments ------------------------"
    assert lines[-1] == "-------------------- end of arguments ---------------------"
    # names and dots fill 48 characters; sorted case-insensitively as `_print_args` sorts
    assert lines[1:-1] == [
        "  accumulate_allreduce_grads_in_fp32 .............. False",
        "  seq_length ...................................... 4096",
        "  world_size ...................................... 64",
        "  Zeta ............................................ None",
    ]


def test_trainer_arguments_block_parses_back_to_its_flags():
    from megapilot.logs import parse_text
    from megapilot.trainer.config import build_config

    config = build_config(["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4",
                           "--seq-length", "128", "--max-position-embeddings", "128", "--micro-batch-size", "2",
                           "--global-batch-size", "16", "--train-iters", "7", "--lr", "1e-3", "--mock-data",
                           "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
                           "--vocab-size", "128", "--tokenizer-type", "NullTokenizer"])
    printed = config.printed_arguments(world_size=8)
    parsed = parse_text("\n".join(f"[rank0]: {line}" for line in logfmt.arguments_lines(printed))).arguments
    assert parsed is not None
    assert parsed.values == {name: str(value) for name, value in printed.items()}
    assert (parsed.world_size, parsed.seq_length, parsed.global_batch_size, parsed.micro_batch_size) == (8, 128, 16, 2)
    assert (parsed.tensor_model_parallel_size, parsed.pipeline_model_parallel_size, parsed.context_parallel_size,
            parsed.expert_model_parallel_size, parsed.data_parallel_size) == (2, 2, 1, 1, 2)
    assert (parsed.num_layers, parsed.hidden_size, parsed.train_iters) == (4, 64, 7)
