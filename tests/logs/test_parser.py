"""Dialects: every shared real excerpt and the synthetic fixtures parse into the right records."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from megapilot.logs import ParseOptions, parse_logs, parse_text
from megapilot.logs.records import MemoryRecord

DATA = Path(__file__).resolve().parents[1] / "data" / "logs"


def parse(name: str, **options: int):
    return parse_logs([DATA / name], options=ParseOptions(**options))


def test_megatron_2019_bert_lines_without_colons_and_old_memory_report():
    log = parse("real/01_iteration_megatron2019_bert.log")
    assert log.dialect == "megatron-lm"
    assert [r.iteration for r in log.iterations] == [100, 200, 300, 400]
    first = log.iterations[0]
    assert first.train_iters == 20000 and first.elapsed_ms == 334.9
    assert first.lr == pytest.approx(1.010e-06)
    assert first.losses == {"lm loss": pytest.approx(10.2002), "nsp loss": pytest.approx(0.5515259)}
    (memory,) = log.memory
    assert memory.after_iterations == 100 and memory.rank is None
    assert memory.max_reserved_gib == pytest.approx(9324.0 / 1024)  # "cached" is the old name of reserved
    assert {t.name for t in log.timers} >= {"forward", "backward", "optimizer", "data loader"}
    assert not log.errors, "the missing-metadata warning of a fresh start is not an error"


def test_megatron_2022_fp16_skipped_iterations_without_loss():
    log = parse("real/03_iteration_megatron2022_fp16_lossscale_skips.log")
    (record,) = log.iterations
    assert record.skipped_iterations == 10 and record.nan_iterations == 0
    assert record.loss_scale == 8388608.0 and record.lm_loss is None and record.lr == 0.0
    assert {t.name for t in log.timers} >= {"forward-compute", "model-and-optimizer-setup"}


def test_megatron_2024_timestamp_throughput_and_num_zeros():
    log = parse("real/04_low_throughput_mixtral_h100_130tflops.log")
    assert [r.tflops_per_gpu for r in log.iterations] == [137.5, 130.1, 128.1]
    assert log.iterations[0].num_zeros == 0.0
    assert log.iterations[1].time_s - log.iterations[0].time_s == pytest.approx(10.0)


def test_tokens_per_gpu_computed_from_gbs_seq_and_world_when_not_printed():
    log = parse("real/04_low_throughput_mixtral_h100_130tflops.log", seq_length=4096, world_size=16)
    record = log.iterations[0]
    assert record.tokens_source == "computed"
    assert record.tokens_per_s_per_gpu == pytest.approx(128 * 4096 / (9.4964 * 16))


def test_megatron_2025_memory_report_per_rank():
    log = parse("real/08_iteration_mcore2025_memory_report_pai.log")
    (memory,) = log.memory
    assert memory.rank == 0 and memory.after_iterations == 1
    assert memory.max_allocated_gib == pytest.approx(63409.05810546875 / 1024)
    assert memory.peak_gib == pytest.approx(64162.0 / 1024)


@pytest.mark.parametrize("engine", [None, "compiled", "python"])
def test_memory_reports_glued_by_interleaved_ranks_are_each_read(tmp_path, engine, monkeypatch):
    # Ranks printing at once with unbuffered stdout write a line and its newline apart, so one rank's report can
    # land on the end of another's line, or of the last rank's iteration line.
    rank = "[Rank {0}] (after 5 iterations) memory (MB) | allocated: {1}.00 | max allocated: {1}.50 | " \
           "reserved: 300.00 | max reserved: 310.00"
    iteration = (" [2026-12-01 22:00:00] iteration        5/      30 | consumed samples:           40 | "
                 "elapsed time per iteration (ms): 120.0 | lm loss: 5.000000E+00 | loss scale: 1.0 | "
                 "number of skipped iterations:   0 | number of nan iterations:   0 |")
    path = tmp_path / "glued.log"
    path.write_text(rank.format(0, 100) + rank.format(1, 200) + "\n" + iteration + rank.format(2, 400) + "\n"
                    + "RuntimeError: boom" + rank.format(3, 800) + "\n\n")
    records: list = []
    if engine is None:  # the line path
        log = parse_logs([path], on_record=records.append)
    else:  # read in bulk, keeping rows (diagnose's way), by either engine
        monkeypatch.setenv("MEGAPILOT_LOG_ENGINE", engine)
        log = parse_logs([path], summary_only=True, on_record=records.append, on_row=lambda row: None)
    memory = [r for r in records if isinstance(r, MemoryRecord)]
    assert [(m.rank, m.allocated_gib * 1024, m.max_allocated_gib * 1024) for m in memory] == [
        (0, 100, 100.5), (1, 200, 200.5), (2, 400, 400.5), (3, 800, 800.5)]
    assert log.summary.iterations_logged == 1 and log.summary.final_loss == 5.0


def test_bridge_2026_mtp_and_sequence_balancing_losses_in_loss_dict():
    log = parse("real/34_iteration_bridge2026_mtp_seq_lb_loss_lora.log")
    losses = log.iterations[0].losses
    assert set(losses) == {"lm loss", "seq_load_balancing_loss", "mtp_1 loss", "mtp_2 loss"}
    assert log.iterations[0].lm_loss == pytest.approx(0.8716962)


def test_primus_torchtitan_step_line_with_device_memory():
    log = parse("real/35_hip_oom_primus_torchtitan_mi350_step_then_crash.log")
    assert log.dialect == "primus-torchtitan"
    (step,) = log.iterations
    assert (step.iteration, step.rank, step.tokens_per_s_per_gpu, step.tflops_per_gpu, step.mfu_pct) == (
        1, 1, 531.0, 30.75, 9.86)
    assert step.memory_used_gib == 240.17 and step.memory_usage_pct == 95.31
    assert log.memory[0].source == "device"


def test_cvs_rocm_fork_mem_usages_field():
    log = parse("cvs/cvs_megatron_lm_rocm_iteration.log")
    assert log.iterations[0].memory_usage_pct == pytest.approx(54.62)
    assert log.memory[0].max_allocated_gib == pytest.approx(136133.79638671875 / 1024)


def test_primus_ansi_prefixed_inst_avg_pairs_and_inner_timestamp():
    log = parse("cvs/cvs_primus_ansi_rank_prefixed.log")
    (record,) = log.iterations
    assert log.dialect == "primus-megatron"
    assert (record.elapsed_ms, record.elapsed_avg_ms) == (654.5, 735.1)
    assert (record.tokens_per_s_per_gpu, record.tokens_avg_per_s_per_gpu) == (25032.8, 22288.1)
    assert record.rank == 7
    assert record.time_s % 60 == pytest.approx(4.269468)  # the inner, microsecond timestamp wins
    assert "\x1b" not in record.text


def test_synthetic_primus_hip_and_rocm_memory_fields_and_old_tokens_key():
    log = parse("synthetic_primus_megatron.log")
    assert log.dialect == "primus-megatron"
    assert log.iterations[0].memory_used_gib == 63.94 and log.iterations[0].memory_usage_pct == 22.20
    assert log.iterations[2].memory_usage_pct == 24.38
    assert log.iterations[2].tokens_per_s_per_gpu == 25032.8
    (save,) = log.checkpoints
    assert save.kind == "save" and save.completed and save.duration_s == pytest.approx(6.5)
    assert log.markers[-1].marker == "training_done"


def test_primus_compute_per_gpu_with_its_running_average():
    # Primus v26.5's training-log patch (print_rank_last_patches.py) renamed the TFLOP field and prints its
    # average in parentheses; tokens/s/GPU follows in the same segment.
    line = ("[20261202 10:11:17][rank-7/8][INFO] [-----------training.py:100] : iteration       10/     100 | "
            "consumed samples:         1280 | elapsed time per iteration (ms): 5100.0/5125.0 | hip mem "
            "usage/free/total/usage_ratio: 150.23GB/105.77GB/256.00GB/58.68% | compute per GPU (TFLOP/s/GPU): 414.2 "
            "(avg 410.4)  | tokens/s/GPU inst/harmonic mean: 12850.0/12790.0 | learning rate: 1.000000E-04 | global "
            "batch size:   128 | lm loss: 7.023456E+00 | loss scale: 1.0 | grad norm: 2.145 |")
    (record,) = parse_text(line).iterations
    assert (record.tflops_per_gpu, record.tflops_avg_per_gpu) == (414.2, 410.4)
    assert (record.tokens_per_s_per_gpu, record.elapsed_avg_ms, record.memory_used_gib) == (12850.0, 5125.0, 150.23)


def test_synthetic_core016_theory_memory_timers_checkpoints_and_moe_fields():
    log = parse("synthetic_megatron_core016_full.log")
    quantities = {r.quantity: r.value for r in log.theoretical_memory}
    assert quantities["total_params_billion"] == 8.03
    assert quantities["total_mib"] == 55040.50 and quantities["activation_mib"] == 20480.50
    assert [m.rank for m in log.memory] == [0, 2]
    assert {t.name: (t.min_ms, t.max_ms) for t in log.timers}["forward-backward"] == (9000.12, 9010.34)
    load, save = log.checkpoints
    assert (load.kind, load.iteration, load.duration_s, load.duration_source) == ("load", 40, 12.1, "timer")
    assert (save.kind, save.iteration, save.duration_s, save.duration_source) == ("save", 44, 30.0, "timestamps")
    last = log.iterations[-1]
    assert last.skipped_samples == 4 and last.num_zeros == 12
    assert last.losses["mtp_1 loss"] == 6.9 and last.losses["load_balancing_loss"] == 1.01
    assert log.iterations[0].time_s % 60 == pytest.approx(20.0)


def test_synthetic_bridge_step_time_fills_missing_fields_and_names_the_dialect():
    log = parse("synthetic_bridge.log")
    assert log.dialect == "megatron-bridge"
    assert [r.tflops_per_gpu for r in log.iterations] == [744.0, 745.6, 744.8]
    assert log.iterations[2].elapsed_ms == pytest.approx(9060.0)  # from `Step Time : 9.06s`
    assert log.iterations[0].extra == {"max attention logit": 12.5}
    assert log.memory[0].max_reserved_gib == 66.25


def test_torchtitan_ansi_colours_and_hip_oom_in_traceback():
    log = parse("synthetic_torchtitan_hip_oom.log")
    assert [r.iteration for r in log.iterations] == [1, 2]
    assert log.iterations[0].losses == {"loss": 12.2674}
    (error,) = log.errors
    assert error.category == "oom" and error.rank == 3 and error.details["tried_to_allocate"] == "2.00 GiB"


def test_crlf_prefixes_non_utf8_and_truncated_last_line():
    log = parse("synthetic_mangled_crlf_truncated.log")
    assert [r.iteration for r in log.iterations] == [1, 2, 3, 4]
    assert [r.line for r in log.iterations] == [1, 2, 3, 5]
    assert log.iterations[2].elapsed_ms is None  # mangled value dropped, rest of the line kept
    assert log.iterations[2].lm_loss == 4.8
    # the last line has no newline: cut mid-write, its trailing number may be shortened (1.0 of 1.05), so not read
    assert log.iterations[3].grad_norm is None and log.iterations[3].lm_loss == pytest.approx(4.7)


def test_nan_and_inf_values_are_kept_as_floats():
    log = parse_text(" iteration 5/10 | elapsed time per iteration (ms): 10.0 | lm loss: nan | grad norm: inf |")
    record = log.iterations[0]
    assert math.isnan(record.lm_loss) and math.isinf(record.grad_norm) and record.has_nonfinite
    assert record.to_dict()["lm_loss"] == "nan"


def test_interleaved_ranks_are_counted_once_in_summary():
    lines = []
    for it in range(1, 21):
        for rank in (0, 7):
            lines.append(f"[rank{rank}]: iteration {it:8d}/ 20 | elapsed time per iteration (ms): {100 + rank}.0 |")
    log = parse_text("\n".join(lines))
    assert len(log.iterations) == 40
    assert log.summary.iterations_counted == 20
    assert log.summary.step_time_mean_ms == pytest.approx(100.0)


def test_megatron_deepspeed_fork_tflops_and_extra_fields():
    log = parse_text(" iteration       10/  500000 | consumed samples:          320 | consumed tokens:       655360 |"
                     " elapsed time per iteration (ms): 2345.6 | learning rate: 1.000E-04 | global batch size:    32 |"
                     " lm loss: 7.512345E+00 | loss scale: 4096.0 | grad norm: 3.210 | actual seqlen:  2048 |"
                     " number of skipped iterations:   0 | number of nan iterations:   0 | samples per second: 13.643 |"
                     " TFLOPs: 120.37 |")
    record = log.iterations[0]
    assert record.tflops_per_gpu == 120.37 and record.extra["samples per second"] == 13.643
    assert record.loss_scale == 4096.0 and record.lm_loss == pytest.approx(7.512345)


# ---- other frameworks' dialects (synthetic fixtures in the formats named in tests/data/logs/INDEX.md) -------------

def test_gpt_neox_lines_with_samples_per_second_first_and_human_readable_flops():
    log = parse("synthetic_gpt_neox_loss_jump_first_update.log")
    assert log.dialect == "gpt-neox" and log.framework == "gpt-neox"
    first = log.iterations[0]
    assert (first.iteration, first.train_iters, first.elapsed_ms, first.tflops_per_gpu) == (1, 143000, 5191.4, 148.2)
    assert first.lm_loss == pytest.approx(10.9812) and first.losses == {"lm_loss": pytest.approx(10.9812)}
    assert first.loss_scale == 65536.0 and first.lr == pytest.approx(6e-6)
    assert len(log.iterations) == 12 and not log.errors


def test_nemo1_lightning_progress_bar_segments():
    log = parse("synthetic_nemo1_lightning_progress.log")
    assert log.dialect == "nemo" and len(log.iterations) == 12 and {r.line for r in log.iterations} == {1}
    last = log.iterations[-1]
    assert (last.iteration, last.train_iters, last.consumed_samples) == (11, 77225, 24600)
    assert last.elapsed_ms == pytest.approx(41320.0) and last.lm_loss == pytest.approx(3.08)


def test_nemo2_progress_printer_lines():
    log = parse("synthetic_nemo2_progress_printer.log")
    assert log.dialect == "nemo" and [r.iteration for r in log.iterations] == list(range(12))
    record = log.iterations[3]
    assert record.elapsed_ms == pytest.approx(2053.0) and record.gbs == 8 and record.consumed_samples == 32
    assert record.lm_loss == pytest.approx(8.24) and record.lr == pytest.approx(3e-5)


def test_deepspeed_pipeline_engine_steps():
    log = parse("synthetic_deepspeed_pipeline_steps.log")
    assert log.dialect == "deepspeed" and [r.iteration for r in log.iterations] == list(range(10, 90, 10))
    assert log.iterations[0].elapsed_ms == pytest.approx(2350.0) and log.iterations[0].lm_loss == pytest.approx(7.05)
    assert log.iterations[0].time_s is not None


def test_megatron_deepspeed_and_megatron_llm_dialects():
    assert parse_text(" iteration 10/ 100 | consumed samples: 320 | elapsed time per iteration (ms): 2345.6 | "
                      "TFLOPs: 120.37 |").dialect == "megatron-deepspeed"
    assert parse("synthetic_megatron_llm_slowdown.log").dialect == "megatron-lm"  # Megatron-LLM keeps the format


def test_traceback_frames_name_the_framework_when_no_iteration_line_does():
    log = parse_text('Traceback (most recent call last):\n  File "/opt/torchtitan/torchtitan/train.py", line 9, in '
                     "train\ntorch.OutOfMemoryError: HIP out of memory.")
    assert log.dialect == "unknown" and log.framework == "torchtitan"


def test_an_error_printed_after_a_progress_bar_on_the_same_line_is_kept():
    log = parse_text("Epoch 0:   6%|█  | 32040/500150 [6:28:43<94:39:17,  1.37it/s, loss=2.6, v_num=95nc, "
                     "reduced_train_loss=2.590, global_step=3.2e+4, consumed_samples=2.56e+7][E "
                     "ProcessGroupNCCL.cpp:458] "
                     "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=96120, OpType=ALLREDUCE, "
                     "Timeout(ms)=1800000) ran for 25624887 milliseconds before timing out.")
    (record,) = log.iterations
    assert record.iteration == 32000 and record.elapsed_ms == pytest.approx(1000 / 1.37)
    (error,) = log.errors
    assert error.category == "nccl_timeout" and error.details["seqnum"] == "96120"


def test_upstream_torchtitan_step_line_with_grouped_thousands():
    log = parse_text("[rank0]:[titan] 2026-02-24 19:46:17,508 - root - INFO - step:  4  loss:  7.62585  grad_norm: "
                     "26.6250  memory: 66.91GiB(37.51%)  tps: 10,050  tflops: 314.71  mfu: 13.99%")
    (step,) = log.iterations
    assert (step.iteration, step.rank, step.tokens_per_s_per_gpu, step.tflops_per_gpu, step.mfu_pct) == (
        4, 0, 10050.0, 314.71, 13.99)
    assert log.framework == "torchtitan" and step.time_s is not None


@pytest.mark.parametrize("name", ["exit_barrier_store_gone.log", "c10d_rendezvous_shutdown_after_training.log"])
def test_a_store_gone_after_a_nodes_workers_finished_is_no_error(name):
    # a healthy two-node job's node 1, node 0 gone first: torchrun exits 0, and so does the verdict
    log = parse_logs([DATA / "node_end" / name])
    assert [e for e in log.errors if e.category == "rendezvous_failure"] == []


def test_the_same_store_error_before_any_worker_finished_is_a_rendezvous_failure():
    lines = (DATA / "node_end" / "exit_barrier_store_gone.log").read_text().splitlines()
    raised = [line for line in lines if "Error waiting on exit barrier" not in line]
    assert {e.category for e in parse_text("\n".join(raised)).errors} == {"rendezvous_failure"}
    # and c10d's shutdown warning stays a warning, but the error it names, raised, is the failure
    raised_error = "torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The connection failed."
    assert {e.category for e in parse_text(raised_error).errors} == {"rendezvous_failure"}
