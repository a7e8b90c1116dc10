"""Diagnosis rules: every category found from the shared excerpts and synthetic fixtures, with fixes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from megapilot.catalog.gpus import get_gpu
from megapilot.diagnose import diagnose, read_flags, run_config
from megapilot.diagnose.engine import diagnose_log
from megapilot.logs import parse_logs, parse_text
from tests.diagnose.timed_logs import timed_log

DATA = Path(__file__).resolve().parents[1] / "data" / "logs"

LLAMA3_8B = ("--num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 "
             "--group-query-attention --num-query-groups 8 --seq-length 8192 --global-batch-size 128 "
             "--micro-batch-size 2 --bf16 --swiglu --vocab-size 128256 --untie-embeddings-and-output-weights "
             "--normalization RMSNorm")


def megatron_lm_oom(tmp_path: Path) -> Path:
    """The NCCL OOM lines of real/15 as Megatron-LM prints them around them: its `training ...` (real/15's own
    `Training ...` is Megatron-Bridge's, whose fixes are recipe overrides, not flags with predicted memory)."""
    text = (DATA / "real/15_oom_nccl_cuda_failure_bridge_llama3_fp8.log").read_text()
    path = tmp_path / "megatron_lm_oom.log"
    path.write_text(text.replace("\nTraining ...\n", "\ntraining ...\n"))
    return path


def categories(name: str, **kwargs) -> list[str]:
    return [f.category for f in diagnose([DATA / name], **kwargs).findings]


@pytest.mark.parametrize(("name", "expected"), [
    ("real/09_nccl_watchdog_timeout_allreduce_moe.log", ["nccl_timeout"]),
    ("real/15_oom_nccl_cuda_failure_bridge_llama3_fp8.log", ["oom"]),
    ("real/20_hang_fused_kernel_compile_stuck.log", ["hang"]),
    ("real/30_nccl_bus_error_shm_ncclgroupend.log", ["shm_insufficient"]),
    ("real/35_hip_oom_primus_torchtitan_mi350_step_then_crash.log", ["oom"]),
    ("synthetic_torchtitan_hip_oom.log", ["oom"]),
    ("synthetic_nan_loss_vanishes.log", ["nan_loss"]),
    ("synthetic_loss_spike.log", ["loss_spike"]),
    ("synthetic_loss_divergence.log", ["loss_divergence"]),
    ("synthetic_slowdown.log", ["slowdown"]),
    # 40 TFLOP/s/GPU is below 25 % MFU on every GPU of the catalog: low throughput whatever GPU ran it
    ("synthetic_hang_after_iteration.log", ["hang", "low_throughput"]),
    ("synthetic_stall_between_iterations.log", ["hang", "low_throughput"]),
])
def test_each_fixture_gives_its_category(name: str, expected: list[str]):
    assert categories(name) == expected


@pytest.mark.parametrize("name", [
    "real/01_iteration_megatron2019_bert.log", "real/03_iteration_megatron2022_fp16_lossscale_skips.log",
    "real/08_iteration_mcore2025_memory_report_pai.log", "real/34_iteration_bridge2026_mtp_seq_lb_loss_lora.log",
    "synthetic_megatron_core016_full.log", "synthetic_bridge.log", "synthetic_primus_megatron.log",
])
def test_healthy_logs_have_no_findings(name: str):
    assert categories(name) == []


def test_nccl_timeout_names_collective_sequence_and_ranks():
    (finding,) = diagnose([DATA / "real/09_nccl_watchdog_timeout_allreduce_moe.log"]).findings
    assert "ALLREDUCE" in finding.title and "SeqNum 305" in finding.title and "ranks 0, 1, 2" in finding.title
    assert {f.flag for f in finding.fixes} >= {"NCCL_DEBUG", "--distributed-timeout-minutes"}
    assert sorted(e.line for e in finding.evidence) == [1, 5, 9]


def test_nccl_timeout_with_world_size_names_the_silent_ranks():
    (finding,) = diagnose([DATA / "real/09_nccl_watchdog_timeout_allreduce_moe.log"],
                          flags="--tensor-model-parallel-size 1", gpus=4).findings
    assert "likely culprits: 3" in finding.cause


def test_oom_fixes_carry_predicted_memory_and_a_combination_that_fits(tmp_path: Path):
    (finding,) = diagnose([megatron_lm_oom(tmp_path)], flags=LLAMA3_8B,
                          gpu=get_gpu("h100"), gpus=8).findings
    options = {f.option: f.predicted_memory_gib for f in finding.fixes if f.kind == "megatron_flag"}
    assert {"distributed optimizer", "micro-batch 1", "full recompute", "pipeline parallel 2",
            "tensor parallel 2"} <= set(options)
    assert all(value is not None and value > 0 for value in options.values())
    first = finding.fixes[0]
    assert first.option.startswith("combined") and first.predicted_memory_gib <= 80
    full = [f for f in finding.fixes if f.option == "full recompute"]
    assert [(f.flag, f.value) for f in full] == [("--recompute-granularity", "full"), ("--recompute-method", "uniform"),
                                                 ("--recompute-num-layers", "1")]


def test_oom_without_flags_gives_generic_fixes_without_predictions(tmp_path: Path):
    (finding,) = diagnose([megatron_lm_oom(tmp_path)]).findings
    assert all(f.predicted_memory_gib is None for f in finding.fixes)
    assert "--recompute-granularity" in {f.flag for f in finding.fixes}


def test_divergence_fixes_are_exact_flags_for_the_model():
    flags = "--lr 6e-4 --fp16 --hidden-size 8192 --num-layers 4 --num-attention-heads 64 --seq-length 2048"
    finding = diagnose([DATA / "synthetic_loss_divergence.log"], flags=flags).findings[0]
    fixes = {f.flag: (f.action, f.value) for f in finding.fixes}
    assert fixes["--lr"] == ("set", "3.00e-04")
    assert fixes["--lr-warmup-iters"] == ("add", "10")  # a tenth of its 100 iterations: Megatron asserts < decay
    assert "--clip-grad" not in fixes  # left out, Megatron clips at 1.0 already
    assert fixes["--init-method-std"] == ("add", "0.0070")  # sqrt(2 / (5 * 8192))
    assert fixes["--fp16"] == ("remove", None) and fixes["--bf16"] == ("add", None)


@pytest.mark.parametrize(("flags", "expected"), [
    (None, None),  # nothing says the run clipped otherwise than Megatron's default 1.0
    ("--lr 6e-4", None),
    ("--lr 6e-4 --clip-grad 1.0", None),
    ("--lr 6e-4 --clip-grad 0", ("set", "1.0", "clip the global grad norm at 1.0 (the run clips at 0, off)")),
    ("--lr 6e-4 --clip-grad 5", ("set", "1.0", "clip the global grad norm at 1.0 (the run clips at 5)")),
])
def test_clipping_is_advised_only_where_the_run_clips_otherwise_than_at_1(flags, expected):
    finding = diagnose([DATA / "synthetic_loss_divergence.log"], flags=flags).findings[0]
    clip = [(f.action, f.value, f.reason) for f in finding.fixes if f.flag == "--clip-grad"]
    assert clip == ([] if expected is None else [expected])


def test_clipping_the_arguments_block_printed_is_the_runs():
    lines = DATA.joinpath("synthetic_loss_divergence.log").read_text().splitlines()
    block = ["------------------------ arguments ------------------------", "  clip_grad ....................... 0.0",
             "-------------------- end of arguments ---------------------"]
    finding = diagnose_log(parse_text("\n".join(block + lines)), None).findings[0]
    assert [(f.flag, f.value) for f in finding.fixes if f.flag == "--clip-grad"] == [("--clip-grad", "1.0")]


def test_loss_vanishing_without_nan_counter_is_nan_loss_but_fp16_skips_are_not():
    vanished = parse_text("\n".join(
        [f" iteration {i:8d}/ 100 | elapsed time per iteration (ms): 100.0 | lm loss: 5.0E+00 | grad norm: 1.0 |"
         f" number of skipped iterations:   0 | number of nan iterations:   0 |" for i in range(1, 4)]
        + [" iteration        4/ 100 | elapsed time per iteration (ms): 100.0 | grad norm: 1.0 |"
           " number of skipped iterations:   0 | number of nan iterations:   0 |"]))
    assert [f.category for f in diagnose_log(vanished, None).findings] == ["nan_loss"]


def test_lines_another_rank_broke_into_are_not_a_nan_loss():
    def line(i: int) -> str:
        return (f" iteration {i:8d}/ 100 | elapsed time per iteration (ms): 100.0 | lm loss: 5.0E+00 | grad norm: 1.0 |"
                f" number of skipped iterations:   0 | number of nan iterations:   0 |")

    def broken(i: int) -> str:  # another rank's text cuts in; the rest of the line follows on the next one
        head, tail = line(i).split(" | lm loss")
        return f"{head} [default3]:NCCL INFO Channel 00/0 : 3[3] -> 4[4] via P2P/CUMEM\n | lm loss{tail}"

    text = "\n".join([line(i) for i in range(1, 10)] + [broken(10), broken(11)] + [line(i) for i in range(12, 20)])
    assert "nan_loss" not in [f.category for f in diagnose_log(parse_text(text), None).findings]


def test_low_throughput_on_h100_from_real_mixtral_log():
    findings = diagnose([DATA / "real/04_low_throughput_mixtral_h100_130tflops.log"], gpu=get_gpu("h100"),
                        flags="--tensor-model-parallel-size 1").findings
    (finding,) = [f for f in findings if f.category == "low_throughput"]
    assert "13.0% MFU" in finding.title or "13.1% MFU" in finding.title


def test_without_the_gpu_type_low_throughput_is_an_info_naming_where_it_would_be_low():
    findings = diagnose([DATA / "real/04_low_throughput_mixtral_h100_130tflops.log"]).findings
    (finding,) = [f for f in findings if f.category == "low_throughput"]
    assert finding.severity == "info" and "unless it ran on A100" in finding.title
    assert "13.0% on H100" in finding.title and "--gpu h100" in finding.cause


def test_without_the_gpu_type_a_rate_low_only_on_the_newest_gpus_is_no_finding():
    # 316 TFLOP/s/GPU: 32 % MFU on an H100, only low on MI300X and the Blackwell parts
    assert categories("synthetic_slowdown.log") == ["slowdown"]


def test_low_throughput_from_the_gpu_alone_without_flags():
    findings = diagnose([DATA / "real/04_low_throughput_mixtral_h100_130tflops.log"], gpu=get_gpu("h100")).findings
    (finding,) = [f for f in findings if f.category == "low_throughput"]
    assert "13.0% MFU" in finding.title and "bf16 peak 989" in finding.title
    assert "no prediction" in finding.cause
    # the loss rising from the first logged steps (0.209 → 0.235 → 0.724) is a finding of its own
    assert "loss_spike" in [f.category for f in findings]


# ---- issue 13: classes a public-log review found missed ------------------------------------------------

def test_a_zip_writer_failure_quotes_what_the_writer_said_in_log_order_without_cs_prefix():
    (finding,) = diagnose([DATA / "synthetic_ckpt_stream_writer_unexpected_pos.log"]).findings
    assert ("(it says 'failed writing file data/118: file write failed', then 'unexpected pos 3112028608 vs "
            "3112028496'): the filesystem refused") in finding.cause
    ranks = "\n".join(f"[rank{rank}]: RuntimeError: [enforce fail at inline_container.cc:471] . PytorchStreamWriter "
                      f"failed writing file data/{rank}: file write failed" for rank in range(4))
    (many,) = diagnose_log(parse_text(ranks), None).findings
    assert "'failed writing file data/0: file write failed', then 'failed writing file data/1: file write failed' " \
           "(and 2 more)" in many.cause


@pytest.mark.parametrize(("name", "signature_word"), [
    ("synthetic_ckpt_stream_writer_unexpected_pos.log", "zip writer"),
    ("synthetic_ckpt_async_write_item_typeerror.log", "version mismatch"),
    ("synthetic_ckpt_segfault_in_writer.log", "checkpoint writer"),
    ("synthetic_crash_during_save", "save was running"),
])
def test_checkpoint_writer_failures_are_found_without_the_word_checkpoint(name: str, signature_word: str):
    findings = diagnose([DATA / name]).findings
    assert findings[0].category == "checkpoint_save_failure", [f.title for f in findings]
    assert signature_word in findings[0].cause


def test_async_writer_type_error_points_at_versions_not_the_disk():
    (finding,) = diagnose([DATA / "synthetic_ckpt_async_write_item_typeerror.log"]).findings
    assert [f.flag for f in finding.fixes][:2] == ["pip list | grep -iE '^(torch|megatron-core) '", "--async-save"]
    assert finding.evidence[0].line == 10 and "rank 3" in finding.title


def test_a_rank_dying_seconds_after_a_save_started_on_another_node_is_a_failed_save():
    result = diagnose([DATA / "synthetic_crash_during_save"])
    assert result.story[0].startswith("first failure: rank 11 died of SIGSEGV (exit code -11) during the checkpoint "
                                      "save started at")
    assert [f.category for f in result.findings] == ["checkpoint_save_failure", "nccl_timeout", "process_crash"]
    assert "checkpoint_save_failure" in result.findings[-1].cause  # the crash follows the save, not the timeout


def test_a_crash_long_after_a_finished_save_is_not_blamed_on_it():
    log = parse_text("\n".join([
        "[2026-01-01 10:00:00] saving checkpoint at iteration     100 to /ckpt in torch_dist format",
        "[2026-01-01 10:00:30] successfully saved checkpoint from iteration     100 to /ckpt",
        "[2026-01-01 11:00:00] [rank1]: Segmentation fault (core dumped)",
    ]))
    assert [f.category for f in diagnose_log(log, None).findings] == ["process_crash"]


def test_rerun_state_machine_nan_report_names_rank_and_iteration():
    (finding,) = diagnose([DATA / "synthetic_rerun_state_machine_nan.log"]).findings
    assert finding.category == "nan_loss" and "rank 5 at iteration 4120" in finding.title
    assert "silent data corruption" in finding.cause


def test_megatron_llm_progressive_slowdown_is_a_trend():
    (finding,) = diagnose([DATA / "synthetic_megatron_llm_slowdown.log"]).findings
    assert finding.category == "slowdown" and "Theil-Sen" in finding.cause
    assert finding.title.startswith("Step time rose 6.")


def test_noisy_flat_step_times_with_periodic_slow_steps_are_no_slowdown():
    assert categories("synthetic_megatron_llm_flat_noisy.log") == []


def test_gpt_neox_loss_jump_after_the_first_update():
    findings = diagnose([DATA / "synthetic_gpt_neox_loss_jump_first_update.log"]).findings
    assert [f.category for f in findings] == ["loss_spike", "low_throughput"]  # 148 TFLOP/s/GPU, no --gpu: an info
    finding = findings[0]
    assert finding.category == "loss_spike" and finding.severity == "critical"
    assert "10.981 at iteration 1 → 14.203 at iteration 2" in finding.title
    # GPT-NeoX takes its settings from its YAML config, not Megatron-LM flags
    assert {f.kind for f in finding.fixes} == {"config"} and "gradient_clipping" in {f.flag for f in finding.fixes}


def test_torchtitan_hip_oom_gets_torchtitan_settings_and_the_hip_allocator():
    result = diagnose([DATA / "synthetic_torchtitan_hip_oom.log"])
    (finding,) = result.findings
    assert result.log.framework == "torchtitan"
    flags = [f.flag for f in finding.fixes]
    assert "--activation_checkpoint.mode" in flags and "PYTORCH_HIP_ALLOC_CONF" in flags
    assert not any(flag.startswith("--recompute") or flag == "PYTORCH_CUDA_ALLOC_CONF" for flag in flags)


def test_a_cuda_oom_keeps_the_cuda_allocator():
    (finding,) = diagnose([DATA / "real/15_oom_nccl_cuda_failure_bridge_llama3_fp8.log"]).findings
    flags = [f.flag for f in finding.fixes]
    assert "PYTORCH_CUDA_ALLOC_CONF" in flags and "PYTORCH_HIP_ALLOC_CONF" not in flags


def test_root_cause_ranks_above_its_consequences():
    log = parse_text("\n".join([
        "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
        "[rank0]:[E ProcessGroupNCCL.cpp:754] [Rank 0] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=9, OpType=ALLGATHER, NumelIn=1, NumelOut=8, Timeout(ms)=600000) ran for 600100 milliseconds "
        "before timing out.",
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
    ]))
    findings = diagnose_log(log, None).findings
    assert [f.category for f in findings] == ["oom", "nccl_timeout", "process_crash"]
    assert findings[-1].severity == "warning" and "oom" in findings[-1].cause


@pytest.mark.parametrize("line", [
    # PyTorch before 2.1 (the shape of a Megatron-DeepSpeed data-loader OOM: an s x s mask of a huge sequence)
    "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 37631.79 GiB (GPU 3; 79.21 GiB total "
    "capacity; 50.52 GiB already allocated; 24.67 GiB free; 52.32 GiB reserved in total by PyTorch)",
    # PyTorch 2.1 on
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 TiB. GPU 0 has a total capacity of 79.15 GiB "
    "of which 161.62 MiB is free.",
])
def test_an_allocation_larger_than_the_gpu_is_a_wrong_shape_not_a_layout_to_shrink(line: str):
    finding = diagnose_log(parse_text(line), None).findings[0]
    assert finding.category == "oom" and "larger than the GPU" in finding.title
    assert "--recompute-granularity" not in {fix.flag for fix in finding.fixes}
    assert any("--seq-length" in fix.flag for fix in finding.fixes)
    ordinary = diagnose_log(parse_text("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 "
                                       "has a total capacity of 79.15 GiB of which 1.2 GiB is free."), None)
    assert "larger than the GPU" not in ordinary.findings[0].title


# SYNTHETIC one-line logs for the categories the shared excerpts do not cover.
LINE_CASES = [
    ("gpu_hw_fault", "[Mon Jan  1 00:00:00 2026] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.",
     "drain"),
    ("rendezvous_failure", "torch.distributed.DistNetworkError: The client socket has timed out after 1800s",
     "MASTER_PORT"),
    ("checkpoint_save_failure", "OSError: [Errno 28] No space left on device: '/ckpt/iter_0000100'", "df -h"),
    ("checkpoint_load_failure",
     "RuntimeError: Error(s) in loading state_dict for GPTModel: Unexpected key(s) in state_dict: \"x\"",
     "--ckpt-format"),
    ("dataloader_error", "FileNotFoundError: [Errno 2] No such file or directory: '/data/corpus_text_document.idx'",
     "ls -l"),
    ("config_error", "pretrain_gpt.py: error: unrecognized arguments: --tensor-parallel 8", "--tensor-parallel"),
    ("nccl_error",
     "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, ncclRemoteError: A call failed",
     "NCCL_DEBUG"),
    ("process_crash", "Segmentation fault (core dumped)", "dmesg"),
]


@pytest.mark.parametrize(("category", "line", "fix_text"), LINE_CASES)
def test_line_categories_become_findings_with_fixes(category: str, line: str, fix_text: str):
    flags = "--save /ckpt --data-path /data/corpus_text_document --tensor-model-parallel-size 1"
    from megapilot.diagnose import read_flags, run_config

    (finding,) = diagnose_log(parse_text(line, file="train.log"), run_config(read_flags(flags=flags), gpus=1)).findings
    assert finding.category == category and finding.evidence[0].line == 1
    assert any(fix_text in f"{f.flag} {f.value}" for f in finding.fixes)


def test_allocator_memory_near_gpu_capacity_is_an_oom_warning():
    line = ("[Rank 0] (after 1 iterations) memory (MB) | allocated: 12520.1 | max allocated: 63409.0 | "
            "reserved: 77000.0 | max reserved: 78500.0")
    from megapilot.diagnose import read_flags, run_config

    config = run_config(read_flags(flags="--tensor-model-parallel-size 1"), gpu=get_gpu("h100"), gpus=1)
    (finding,) = diagnose_log(parse_text(line), config).findings
    assert finding.category == "oom" and finding.severity == "warning" and "Rank 0" in finding.title
    assert diagnose_log(parse_text(line), config.__class__(**{**config.__dict__,
                                                              "gpu": get_gpu("h200")})).findings == []


def test_noisy_short_steps_are_not_a_slowdown():
    times = [40.0, 41.0, 39.0, 40.0, 55.0, 38.0, 41.0, 40.0, 52.0, 39.0, 48.0, 40.0, 53.0, 39.0]
    log = parse_text("\n".join(f" iteration {i:8d}/ 100 | elapsed time per iteration (ms): {ms} | lm loss: 5.0 |"
                               for i, ms in enumerate(times * 2, start=1)))
    assert diagnose_log(log, None).findings == []


@pytest.mark.parametrize(("scale", "found"), [(1.0, False), (100.0, True)])
def test_a_trend_over_a_second_of_training_is_the_hosts_scheduler_not_a_slowdown(scale: float, found: bool):
    # the steps of a healthy 12-iteration CPU run on a host busy with other work: from 27 to 380 ms in under a
    # second; the same shape over a minute and a half of training is a trend worth a warning
    times = [26.8, 24.1, 29.0, 33.5, 30.2, 31.6, 45.0, 61.3, 88.0, 379.9]
    log = parse_text("\n".join(f" iteration {i:8d}/ 12 | elapsed time per iteration (ms): {ms * scale:.1f} | "
                               "lm loss: 5.0 |" for i, ms in enumerate(times, start=3)))
    assert [f.category for f in diagnose_log(log, None).findings] == (["slowdown"] if found else [])


def test_a_rank_ended_by_a_python_exception_is_told_by_its_exception_not_by_the_oom_killer():
    log = parse_text("[rank0]: Traceback (most recent call last):\n"
                     '[rank0]:   File "/opt/megatron/core/fusions/fused_layer_norm.py", line 12, in <module>\n'
                     "[rank0]: ModuleNotFoundError: No module named 'transformer_engine'")
    (finding,) = diagnose_log(log, None).findings
    assert finding.category == "process_crash" and "ModuleNotFoundError" in finding.title
    assert "fused_layer_norm.py" in finding.cause and "dmesg" not in " ".join(f.flag for f in finding.fixes)
    assert "image or venv" in finding.fixes[0].flag


def test_low_throughput_from_the_estimator_when_the_log_prints_no_tflops():
    # Llama-3-8B on 8 H100: GBS 128 x 8192 tokens takes ~10 s at a healthy MFU; 60 s per step is ~6x too slow
    lines = [f" [2026-01-01 00:{i:02d}:00] iteration {i:8d}/     100 | consumed samples: {128 * i:8d} | elapsed time "
             f"per iteration (ms): 60000.0 | learning rate: 1.0E-04 | global batch size:   128 | lm loss: 5.0E+00 | "
             "loss scale: 1.0 | grad norm: 1.0 | number of skipped iterations:   0 | number of nan iterations:   0 |"
             for i in range(1, 12)]
    log = parse_text("\n".join(lines))
    from megapilot.diagnose.flags import read_flags, run_config

    config = run_config(read_flags(flags=LLAMA3_8B), gpu=get_gpu("h100"), gpus=8)
    (finding,) = [f for f in diagnose_log(log, config).findings if f.category == "low_throughput"]
    assert "estimator over the measured median step time" in finding.cause
    assert "MFU on h100" in finding.title
    healthy = parse_text("\n".join(line.replace("60000.0", "9000.0") for line in lines))
    assert "low_throughput" not in [f.category for f in diagnose_log(healthy, config).findings]


IB_RETRY_EXCEEDED = [
    "node-3:1234:5678 [2] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion from peer 10.0.0.4<54321> with "
    "status=12 opcode=0 len=0 vendor err 129 (Send) localGid ::ffff:10.0.0.3 remoteGids::ffff:10.0.0.4 hca mlx5_2",
    "node-3:1234:5678 [2] NCCL INFO transport/net.cc:1134 -> 6",
    "RuntimeError: NCCL communicator was aborted on rank 18.",
]


@pytest.mark.parametrize("status", ["status=12 opcode=0 len=0", "error 12, opcode 0, len 0,"])  # both NCCL forms
def test_an_infiniband_completion_error_is_the_cause_and_names_its_status(status: str):
    lines = [IB_RETRY_EXCEEDED[0].replace("status=12 opcode=0 len=0", status), *IB_RETRY_EXCEEDED[1:]]
    (finding,) = diagnose_log(parse_text("\n".join(lines)), None).findings
    assert finding.category == "nccl_error"
    assert "status 12: transport retry counter exceeded" in finding.cause
    assert [e.line for e in finding.evidence][:2] == [1, 3]



def test_an_embedding_index_assert_is_the_data_tokenizer_against_the_vocabulary():
    text = ("/pytorch/aten/src/ATen/native/cuda/Indexing.cu:1289: indexSelectLargeIndex: block: [12,0,0], thread: "
            "[64,0,0] Assertion `srcIndex < srcSelectDimSize` failed.\n"
            "RuntimeError: CUDA error: device-side assert triggered")
    first = diagnose_log(parse_text(text), None).findings[0]
    assert (first.category, first.title) == ("config_error", "First failure: A token id is past the embedding table "
                                                             "(<text>:1)")
    assert "--vocab-size" in first.cause


def test_no_visible_gpu_is_the_environment_not_the_configuration():
    (finding,) = diagnose_log(parse_text("RuntimeError: No CUDA GPUs are available"), None).findings
    assert finding.title.startswith("First failure: The software stack does not fit the GPUs")
    assert any(fix.flag == "CUDA_VISIBLE_DEVICES" for fix in finding.fixes)



@pytest.mark.parametrize(("reason", "title", "fix"), [
    (" DUE TO TIME LIMIT", "SLURM cancelled the job (time limit)", "--exit-duration-in-mins"),
    (" DUE TO PREEMPTION", "SLURM cancelled the job (preemption)", "#SBATCH --requeue"),
    (" DUE TO NODE FAILURE", "SLURM cancelled the job (node failure)", "#SBATCH --exclude"),
    ("", "SLURM cancelled the job", "sacct -j 4242 -o JobID,State,ExitCode,Elapsed,Timelimit,NodeList"),
])
def test_a_slurm_cancellation_says_why_slurm_stopped_the_job(reason: str, title: str, fix: str):
    line = f"slurmstepd: error: *** JOB 4242 ON gpu-07 CANCELLED AT 2026-01-01T00:00:00{reason} ***"
    (finding,) = diagnose_log(parse_text(line), None).findings
    assert finding.title.endswith(title + " (<text>:1)") or finding.title == title
    assert fix in [f.flag for f in finding.fixes]


def test_a_nan_said_by_a_trainer_check_is_divergence_or_a_faulty_gpu_not_the_rerun_machinery():
    (finding,) = diagnose_log(parse_text("Exception: Gradient norm is NaN on rank 3\n"), None).findings
    assert finding.category == "nan_loss" and "NaN/Inf loss or gradient norm" in finding.title
    assert "RerunStateMachine" not in finding.title and any("ECC" in fix.flag for fix in finding.fixes)


def test_torchrun_stopped_by_sigterm_is_an_outside_stop_that_points_at_the_first_error_elsewhere():
    log = parse_text("torch.distributed.elastic.multiprocessing.api.SignalException: Process 12345 got signal: 15\n")
    (finding,) = diagnose_log(log, None).findings
    assert finding.category == "process_crash" and "received SIGTERM" in finding.cause
    assert "not by a failure on this node" in finding.cause
    assert any(fix.flag.startswith("sacct -j") for fix in finding.fixes)


def test_a_refusal_gets_the_changes_its_message_names_as_ways_out():
    log = parse_text("Traceback (most recent call last):\n"
                     '  File "/opt/Megatron-LM/megatron/training/arguments.py", line 1643, in validate_args\n'
                     "AssertionError: Transformer Engine cross entropy loss fusion is disabled due to stability "
                     "issues. Use --cross-entropy-fusion-impl native, or omit --cross-entropy-loss-fusion.")
    (finding,) = diagnose_log(log, None).findings
    assert finding.category == "config_error"
    assert [(f.action, f.flag, f.value, f.option) for f in finding.fixes] == [
        ("set", "--cross-entropy-fusion-impl", "native", "way 1 of 2"),
        ("remove", "--cross-entropy-loss-fusion", None, "way 2 of 2")]


def test_a_transformer_engine_older_than_the_flags_need_is_said_so_by_validate_args_or_any_exception():
    refused = diagnose_log(parse_text(
        "Traceback (most recent call last):\n"
        '  File "/opt/Megatron-LM/megatron/training/arguments.py", line 1837, in validate_args\n'
        "AssertionError: CUDA graph with delay_wgrad_compute requires TE version >= 2.12.0."), None).findings[0]
    assert refused.category == "config_error" and "Transformer Engine 2.12.0 or newer" in refused.title
    raised = diagnose_log(parse_text(
        "Traceback (most recent call last):\n"
        '  File "/opt/Megatron-LM/megatron/core/tensor_parallel/random.py", line 250, in manual_seed\n'
        "RuntimeError: use_te_rng_tracker requires TransformerEngine version >= 1.5"), None).findings[0]
    assert [f.kind for f in raised.fixes] == ["advice", "command"] and "1.5 or newer" in raised.fixes[0].flag


def test_a_refusal_that_names_no_flag_sends_the_user_to_the_flag_check():
    (finding,) = diagnose_log(parse_text("AssertionError: num_layers (80) must be divisible by "
                                         "pipeline_model_parallel_size (3)"), None).findings
    assert finding.category == "config_error" and finding.fixes[0].flag == "megapilot script --check"


ILLEGAL_ACCESS_IN_THE_EXPERTS = (
    "Traceback (most recent call last):\n"
    '  File "/megatron/core/pipeline_parallel/schedules.py", line 219, in forward_step\n'
    "    output_tensor, loss_func = forward_step_func(data_iterator, model)\n"
    '  File "/megatron/core/transformer/moe/experts.py", line 210, in forward\n'
    "    fc1_output = gg.ops.gmm(\n"
    "RuntimeError: CUDA error: an illegal memory access was encountered\n")


def test_an_illegal_memory_access_alone_is_a_kernel_fault_with_the_fused_path_to_confirm_it():
    from megapilot.diagnose import read_flags, run_config

    config = run_config(read_flags(flags="--moe-grouped-gemm --tensor-model-parallel-size 1"), gpus=1)
    (finding,) = diagnose_log(parse_text(ILLEGAL_ACCESS_IN_THE_EXPERTS), config).findings
    assert "GPU kernel fault" in finding.title and "gg.ops.gmm(" in finding.cause
    assert ("set", "CUDA_LAUNCH_BLOCKING", "1") in [(f.action, f.flag, f.value) for f in finding.fixes]
    assert ("remove", "--moe-grouped-gemm") in [(f.action, f.flag) for f in finding.fixes]
    assert not any("drain" in f.flag for f in finding.fixes)


def test_an_illegal_memory_access_beside_an_xid_stays_a_hardware_fault():
    log = parse_text(ILLEGAL_ACCESS_IN_THE_EXPERTS + "NVRM: Xid (PCI:0000:1b:00): 48, pid=1234, An uncorrectable "
                                                     "double bit error (DBE) has been detected on GPU\n")
    (finding,) = diagnose_log(log, None).findings
    assert "GPU hardware fault" in finding.title and any("drain" in f.flag for f in finding.fixes)


def test_a_kernel_fault_in_the_rotary_embedding_switches_its_default_fusion_off():
    log = parse_text("Traceback (most recent call last):\n"
                     '  File "/megatron/core/models/common/embeddings/rope_utils.py", line 80, in apply_rope\n'
                     "    return fused_apply_rotary_pos_emb(t, freqs)\n"
                     "RuntimeError: CUDA error: misaligned address\n")
    (finding,) = diagnose_log(log, None).findings
    assert ("add", "--no-rope-fusion") in [(f.action, f.flag) for f in finding.fixes]


# ---- a run slower than its prediction, with no error line ---------------------------------------------------------
SLOW_ARGUMENTS = [
    "------------------------ arguments ------------------------",
    *(f"  {name} {'.' * (48 - len(name))} {value}" for name, value in (
        ("bf16", "True"), ("context_parallel_size", "1"), ("ffn_hidden_size", "14336"), ("global_batch_size", "128"),
        ("group_query_attention", "True"), ("hidden_size", "4096"), ("micro_batch_size", "1"),
        ("num_attention_heads", "32"), ("num_layers", "32"), ("num_query_groups", "8"),
        ("pipeline_model_parallel_size", "2"), ("seq_length", "4096"), ("swiglu", "True"),
        ("tensor_model_parallel_size", "2"), ("use_distributed_optimizer", "True"), ("vocab_size", "128256"),
        ("world_size", "8"))),
    "-------------------- end of arguments ---------------------",
]


def _slow_log(tmp_path: Path, step_ms: float, name: str) -> Path:
    lines = list(SLOW_ARGUMENTS)
    for it in range(1, 41):  # no TFLOP/s printed: the step time alone says how fast it ran
        lines.append(f" [2026-01-01 00:{it // 6:02d}:{it * 10 % 60:02d}] iteration {it:8d}/      40 | "
                     f"consumed samples: {it * 128:12d} | elapsed time per iteration (ms): {step_ms:.1f} | "
                     "learning rate: 1.5E-04 | "
                     f"global batch size:   128 | lm loss: {7.0 - it * 0.01:.6E} | loss scale: 1.0 | grad norm: 1.0 | "
                     "number of skipped iterations:   0 | number of nan iterations:   0 |")
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


def _predicted_step_ms(path: Path) -> float:
    from megapilot.diagnose.flags import flags_from_arguments, run_config
    from megapilot.diagnose.options import current_prediction

    log = parse_logs([str(path)])
    config = run_config(flags_from_arguments(log.arguments.values, "log"), gpu=get_gpu("h100"))
    assert config.complete, config.notes
    predicted = current_prediction(config)
    assert predicted is not None and predicted.step_time_s
    return predicted.step_time_s * 1000


def test_a_run_slower_than_its_prediction_without_an_error_line_is_flagged(tmp_path: Path):
    """The prediction is for the run the log's own arguments block describes, on --gpu; beyond the slow end of the
    estimate's 80 % interval a finding names both step times and the likely causes; within it, nothing."""
    predicted_ms = _predicted_step_ms(_slow_log(tmp_path, 1000.0, "probe.log"))
    slow = diagnose([_slow_log(tmp_path, predicted_ms * 1.6, "slow.log")], gpu=get_gpu("h100"))
    [finding] = [f for f in slow.findings if f.category == "low_throughput"]
    assert finding.title.startswith("Slower than predicted:") and "+60%" in finding.title
    assert "80 % interval" in finding.title and "held-out errors" in finding.cause
    assert "no error line" in finding.cause and "slow node" in finding.cause
    assert finding.evidence and "iteration" in finding.evidence[-1].text
    on_time = diagnose([_slow_log(tmp_path, predicted_ms * 1.05, "on_time.log")], gpu=get_gpu("h100"))
    assert not [f for f in on_time.findings if f.category == "low_throughput"]
    unknown_gpu = diagnose([_slow_log(tmp_path, predicted_ms * 1.6, "no_gpu.log")])  # no GPU: no prediction
    assert not [f for f in unknown_gpu.findings if f.title.startswith("Slower than predicted")]


def test_early_loss_noise_of_a_fine_tune_is_no_critical_spike_and_throughput_leads():
    """The real Mixtral fine-tune: 0.209 -> 0.235 nine updates in is a 12 % move of a small loss that then moves by
    0.49 to the next interval: its own noise, not an update that hurt."""
    findings = diagnose([DATA / "real/04_low_throughput_mixtral_h100_130tflops.log"], gpu=get_gpu("h100")).findings
    assert [(f.category, f.severity) for f in findings] == [("low_throughput", "warning"), ("loss_spike", "info")]
    assert "too few to tell" in findings[1].title  # the rise to 0.724 is said, as what three points can say
    # its first two lines alone: 12 % with nothing after it to measure the noise by is no spike either
    two = parse_text("".join((DATA / "real/04_low_throughput_mixtral_h100_130tflops.log").read_text()
                             .splitlines(keepends=True)[:2]))
    assert "loss_spike" not in [f.category for f in diagnose_log(two, None).findings]


def test_an_early_rise_too_short_to_judge_is_watched_not_answered_with_a_learning_rate_change(tmp_path: Path):
    """The note on three logged losses says the rise cannot be told from noise and to watch the next steps: it
    proposes no flag change (halving the learning rate would contradict it), only to read the log again when it
    holds enough iterations to judge; with the whole flag set known it still changes none."""
    log = tmp_path / "mixtral.log"
    log.write_text((DATA / "real/04_low_throughput_mixtral_h100_130tflops.log").read_text())
    for flags in (None, "--lr 1e-5 --lr-warmup-iters 100 --train-iters 500000"):
        kwargs = {} if flags is None else {"flags": flags}
        [rise] = [f for f in diagnose([log], **kwargs).findings if f.category == "loss_spike"]
        assert rise.severity == "info" and "watch the next logged steps" in rise.cause
        assert rise.fixes and all(fix.kind == "advice" for fix in rise.fixes), [fix.text for fix in rise.fixes]
        assert "--lr" not in " ".join(fix.text for fix in rise.fixes)
        assert "diagnose the log again" in rise.fixes[0].flag


def _first_update_jump_log(lr: str = "{i}.0E-05") -> str:
    losses = (10.98, 14.2, 13.9, 13.0, 12.4, 12.0, 11.5)  # a jump ten times the later moves
    return "\n".join(f" iteration {i:8d}/ 1000 | elapsed time per iteration (ms): 100.0 | learning rate: "
                     f"{lr.format(i=i)} | lm loss: {loss:E} | grad norm: 1.0 | number of skipped iterations:   0 | "
                     "number of nan iterations:   0 |" for i, loss in enumerate(losses, start=1))


def test_a_jump_in_the_warm_up_asks_to_halve_the_configured_peak_not_the_logged_lr():
    log = parse_text(_first_update_jump_log())
    [finding] = [f for f in diagnose_log(log, None).findings if f.category == "loss_spike"]
    assert finding.severity == "critical"
    fixes = {f.flag: f for f in finding.fixes}
    assert fixes["--lr"].value == "<half the configured peak>" and "still warming up (7.00e-05" in fixes["--lr"].reason
    assert "--lr-warmup-iters" not in fixes  # the log shows the warm-up
    configured = diagnose_log(log, run_config(read_flags(flags="--lr 3e-4")))
    [spike] = [f for f in configured.findings if f.category == "loss_spike"]
    assert {f.flag: f.value for f in spike.fixes}["--lr"] == "1.50e-04"  # half the configured peak
    flat = parse_text(_first_update_jump_log(lr="6.0E-05"))  # no warm-up: the LR is the peak from the start
    [spike] = [f for f in diagnose_log(flat, None).findings if f.category == "loss_spike"]
    fixes = {f.flag: f.value for f in spike.fixes}
    assert (fixes["--lr"], fixes["--lr-warmup-iters"]) == ("3.00e-05", "100")


STARTED_THEN_SILENT = (
    "using world size: 8, data-parallel size: 8, context-parallel size: 1, tensor-model-parallel size: 1\n"
    "> building GPT model ...\n"
    "[after dataloaders are built] datetime: 2026-01-01 00:01:00\n"
    "done with setup ...\n"
    "training ...\n"
    "[before the start of training step] datetime: 2026-01-01 00:01:05\n")


def test_a_log_that_stops_after_training_started_says_no_iteration_was_logged():
    result = diagnose_log(parse_text(STARTED_THEN_SILENT), None)
    [finding] = result.findings
    assert finding.category == "hang" and finding.title == "Training started but never logged an iteration"
    assert "only error lines" not in " ".join(map(str, result.notes))
    # the same start-up with its end: a run (or a PP rank-0 log) that finished is no hang
    done = parse_text(STARTED_THEN_SILENT + "[after training is done] datetime: 2026-01-01 02:00:00\n")
    assert diagnose_log(done, None).findings == []


def test_a_crash_and_a_resume_in_one_log_is_a_restart_not_a_stall():
    def line(i: int, clock_s: int) -> str:
        stamp = f"2026-03-01 {clock_s // 3600:02d}:{clock_s // 60 % 60:02d}:{clock_s % 60:02d}"
        return (f" [{stamp}] iteration {i:8d}/ 300 | elapsed time per iteration (ms): 5000.0 | lm loss: 3.0E+00 |"
                " number of skipped iterations:   0 | number of nan iterations:   0 |")

    first = [line(i, 5 * i) for i in range(1, 101)]
    crash = ["[rank0]: RuntimeError: CUDA error: an illegal memory access was encountered"]
    resumed = [line(i, 900 + 5 * i) for i in range(81, 201)]  # from the checkpoint at 80, 15 minutes later
    result = diagnose_log(parse_text("\n".join(first + crash + resumed)), None)
    assert "hang" not in [f.category for f in result.findings]
    assert any("restarted after iteration 100 and resumed at iteration 81" in note.text for note in result.notes)


@pytest.mark.parametrize(("flags", "warmup"), [
    ("--lr 6e-4", "10"),  # the log's 100 iterations: the decay runs over them
    ("--lr 6e-4 --train-iters 100", "10"),
    ("--lr 6e-4 --train-iters 500000", "5000"),  # 1% of training
    ("--lr 6e-4 --train-iters 500000 --lr-decay-iters 3000", "300"),  # within the decay Megatron asserts it below
    ("--lr 6e-4 --train-iters 1", None),  # no warm-up shorter than one iteration
])
def test_the_warm_up_advised_is_shorter_than_the_decay_as_megatron_asserts(flags: str, warmup: str | None):
    finding = diagnose([DATA / "synthetic_loss_divergence.log"], flags=flags).findings[0]
    assert {f.flag: f.value for f in finding.fixes}.get("--lr-warmup-iters") == warmup


def test_a_run_that_loaded_its_weights_is_not_told_to_change_their_init():
    """--init-method-std draws a model built from scratch; a run that loaded a checkpoint (a fine-tune, a resume)
    diverging is not helped by it. The same divergence from scratch still gets it."""
    flags = "--lr 6e-4 --hidden-size 8192 --num-layers 4 --num-attention-heads 64 --seq-length 2048"
    scratch = (DATA / "synthetic_loss_divergence.log").read_text()
    loaded = (" loading distributed checkpoint from /ckpt/llama at iteration 0\n"
              "  successfully loaded checkpoint from /ckpt/llama [ t 1/1, p 1/1 ] at iteration 0\n") + scratch
    config = run_config(read_flags(flags=flags))
    advised = [{f.flag for f in diagnose_log(parse_text(text), config).findings[0].fixes} for text in (scratch, loaded)]
    assert "--init-method-std" in advised[0] and "--init-method-std" not in advised[1]
    assert "--lr" in advised[1]
    pretrained = run_config(read_flags(flags=flags + " --pretrained-checkpoint /ckpt/base"))
    assert "--init-method-std" not in {f.flag for f in diagnose_log(parse_text(scratch), pretrained).findings[0].fixes}


def test_a_job_that_resumed_from_a_checkpoint_is_no_stall_and_its_replay_is_progress(tmp_path: Path):
    """A job logged 10-60 and ended; the next job, two hours later, resumed from the checkpoint of iteration 50 and
    logged 60-90. The two hours between the jobs read as 'Stalled 6836 s between iterations 60 and 70', the resume
    as a slow save or a network stall; in one file the same. A job that resumed further back (the checkpoint of 20)
    and is still replaying (30-50) read as 'No progress for ... s after iteration 60' (critical), the highest
    iteration taken for the last one logged. A stall inside one job is still told."""
    first = timed_log(range(10, 61, 10), "00", loaded=0, train_iters=200)
    (tmp_path / "job1.log").write_text(first)
    (tmp_path / "job2.log").write_text(timed_log(range(60, 91, 10), "02", loaded=50, train_iters=200))
    (tmp_path / "jobs.log").write_text(first + timed_log(range(60, 91, 10), "02", loaded=50, train_iters=200))
    (tmp_path / "replay.log").write_text(first + timed_log(range(30, 51, 10), "02", loaded=20, train_iters=200))
    for paths in ([tmp_path / "job1.log", tmp_path / "job2.log"], [tmp_path / "jobs.log"], [tmp_path / "replay.log"]):
        assert "hang" not in [f.category for f in diagnose(paths).findings], paths
    stalled = first.replace("[2026-01-01 00:09:06] iteration       60/", "[2026-01-01 02:09:06] iteration       60/")
    (tmp_path / "stalled.log").write_text(stalled)
    [hang] = [f for f in diagnose([tmp_path / "stalled.log"]).findings if f.category == "hang"]
    assert hang.title.startswith("Stalled") and "between iterations 50 and 60" in hang.title


def test_a_nan_a_trainer_reported_names_megatrons_nan_check_by_flags_that_exist():
    """The cause named `--check-for-nan-in-loss-and-grad`, a flag no Megatron-LM release has: the check is on by
    default and `--no-check-for-nan-in-loss-and-grad` turns it off; what reruns the step is `--rerun-mode
    validate_results` (the default from core_v0.14.0, `disabled` before)."""
    [finding] = diagnose_log(parse_text("step 120: grad norm is NaN, stopping\n"), None, None).findings
    assert finding.category == "nan_loss"
    named = re.findall(r"--[a-z][a-z-]+", finding.cause)
    assert named == ["--no-check-for-nan-in-loss-and-grad", "--rerun-mode"], finding.cause
    assert "--rerun-mode validate_results" in finding.cause


def _iteration_line(number: int) -> str:
    return (f"[rank15]: [2026-03-01 10:{number // 10:02d}:00] iteration {number:8d}/     300 | consumed samples: "
            f"{number * 256:12d} | elapsed time per iteration (ms): 6000.0 | learning rate: 1.500000E-04 | global "
            f"batch size:   256 | lm loss: 6.900000E+00 | loss scale: 1.0 | grad norm: 2.345 | number of skipped "
            "iterations:   0 | number of nan iterations:   0 |\n")


def test_an_nccl_warning_that_training_outlived_is_no_first_failure():
    """An InfiniBand port that flapped (`NCCL WARN NET/IB : Got async event : port error`, then `port active`) and a
    run that trained on for 30 iterations read as 'CRITICAL nccl_error: First failure: NCCL error on rank 9', the
    story naming it the first failure. Training went on: a warning, no failure. The same line with one iteration
    logged after it (the one in progress when the link failed) and a watchdog timeout is still the root cause."""
    warned = ("[rank9]:node1:12399:12500 [1] NCCL WARN NET/IB : Got async event : port error\n"
              "[rank9]:node1:12399:12500 [1] NCCL WARN NET/IB : Got async event : port active\n")
    log = parse_text(_iteration_line(10) + warned + "".join(_iteration_line(n) for n in range(20, 301, 10)))
    diagnosis = diagnose_log(log, None, None)
    [finding] = [f for f in diagnosis.findings if f.category == "nccl_error"]
    assert finding.severity == "warning" and not finding.title.startswith("First failure"), finding.title
    assert "training went on" in finding.title and finding.evidence[0].line == 2
    assert diagnosis.story == []

    timeout = ("[rank9]:[E ProcessGroupNCCL.cpp:754] [Rank 9] Watchdog caught collective operation timeout: "
               "WorkNCCL(SeqNum=305, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600381 "
               "milliseconds before timing out.\n")
    failed = diagnose_log(parse_text(_iteration_line(10) + warned + _iteration_line(20) + timeout), None, None)
    first = failed.findings[0]
    assert first.category == "nccl_error" and first.severity == "critical", first.title
    assert first.title.startswith("First failure: NCCL error on rank 9"), first.title


def _slowing_log(report_rank: int | None, slowest_ms: float = 0.0) -> str:
    """60 log intervals whose step time rises 2 % an interval; after each, with `report_rank`, Megatron's
    `--log-straggler` report (StragglerDetector.report's format) naming that rank the slowest."""
    lines = ["training ...\n"]
    clock_s = 0.0
    for k in range(1, 61):
        step_ms = 9500.0 * (1 + 0.02 * k)
        clock_s += step_ms * 10 / 1000
        stamp = f"2026-03-01 {10 + int(clock_s) // 3600:02d}:{int(clock_s) % 3600 // 60:02d}:{int(clock_s) % 60:02d}"
        lines.append(f" [{stamp}] iteration {k * 10:8d}/     600 | consumed samples: {k * 2560:12d} | elapsed time "
                     f"per iteration (ms): {step_ms:.1f} | learning rate: 1.500000E-04 | global batch size:   256 | "
                     "lm loss: 6.900000E+00 | loss scale: 1.0 | grad norm: 2.345 | number of skipped iterations:   0 "
                     "| number of nan iterations:   0 |\n")
        if report_rank is not None:
            slowest = f"{slowest_ms or step_ms:.2f}ms/{report_rank}"
            lines.append(f"[{stamp}] | MnRtt/Rnk: 8900.00ms/3 | MxRtt/Rnk: {slowest} | "
                         "MnPwr/Rnk: 600W/1 | MxPwr/Rnk: 700W/2 | MnTmp/Rnk: 60C/1 | MxTmp/Rnk: 88C/11 | MnUtl/Rnk: "
                         "99%/1 | MxUtl/Rnk: 100%/2 | MnClk/Rnk: 1400MHz/11 | MxClk/Rnk: 1980MHz/2 | MnDRtt/Rnk: "
                         "1.00ms/3 | MxDRtt/Rnk: 2.00ms/4 | MnEtpt/Rnk: 300.00TF/11 | MxEtpt/Rnk: 402.00TF/3\n")
    return "".join(lines)


def test_a_slowdown_in_a_run_that_logs_straggler_reports_names_the_slow_rank(tmp_path: Path):
    """A run with --log-straggler on slows down, its reports naming rank 11 the slowest every interval: the finding
    said 'add --log-straggler: log which rank is slow' (diagnose kept none of the reports it parsed) and named no
    rank. It now names rank 11 from the reports, with a report line as evidence, and asks for no flag the run has.
    Reports where the slowest rank is as fast as the others say no rank stands out. Without reports, the flag."""
    (tmp_path / "straggler.log").write_text(_slowing_log(11))
    [slow] = [f for f in diagnose([tmp_path / "straggler.log"]).findings if f.category == "slowdown"]
    assert "name rank 11 the slowest in 60 of the last 60" in slow.cause, slow.cause
    assert "look at that rank's GPU" in slow.cause
    assert "--log-straggler" not in [fix.flag for fix in slow.fixes]
    assert "MxRtt/Rnk" in slow.evidence[-1].text
    (tmp_path / "even.log").write_text(_slowing_log(5, slowest_ms=9000.0))
    [even] = [f for f in diagnose([tmp_path / "even.log"]).findings if f.category == "slowdown"]
    assert "no rank stands out" in even.cause, even.cause
    (tmp_path / "plain.log").write_text(_slowing_log(None))
    [plain] = [f for f in diagnose([tmp_path / "plain.log"]).findings if f.category == "slowdown"]
    assert "--log-straggler" in [fix.flag for fix in plain.fixes] and "name rank" not in plain.cause


def test_a_nan_under_mxfp8_with_the_weight_gather_in_the_optimizer_step_names_that_switch_first():
    """The MXFP8 weights' gather reuses the gradient buffer; gathered during the optimizer step, the grad norm goes
    NaN. Said by the script's flags or by the log's own arguments block; without the pair, the general remedies."""
    nan = [f" iteration {i:8d}/ 100 | elapsed time per iteration (ms): 100.0 | lm loss: 5.0E+00 | grad norm: "
           f"{'nan' if i == 3 else '1.0'} | number of skipped iterations:   0 | number of nan iterations:   "
           f"{int(i == 3)} |" for i in range(1, 4)]
    pair = "--reuse-grad-buf-for-mxfp8-param-ag --overlap-param-gather-with-optimizer-step"
    config = run_config(read_flags(flags=f"--fp8-format e4m3 --fp8-recipe mxfp8 --fp8-param-gather {pair}"))
    [finding] = diagnose_log(parse_text("\n".join(nan)), config).findings
    assert finding.category == "nan_loss"
    assert (finding.fixes[0].action, finding.fixes[0].flag) == ("remove", "--overlap-param-gather-with-optimizer-step")
    block = ["------------------------ arguments ------------------------",
             "  overlap_param_gather_with_optimizer_step ........ True",
             "  reuse_grad_buf_for_mxfp8_param_ag ............... True",
             "-------------------- end of arguments ---------------------"]
    [printed] = diagnose_log(parse_text("\n".join(block + nan)), None).findings
    assert printed.fixes[0].flag == "--overlap-param-gather-with-optimizer-step"
    plain = run_config(read_flags(flags="--fp8-format e4m3 --fp8-recipe mxfp8 "
                                        "--overlap-param-gather-with-optimizer-step"))
    [general] = diagnose_log(parse_text("\n".join(nan)), plain).findings
    assert all(fix.flag != "--overlap-param-gather-with-optimizer-step" for fix in general.fixes)


def test_an_assertion_raised_while_the_model_is_built_gives_the_way_out_its_message_names():
    """Megatron-Core checks the attention backend's variables while it builds the model, after the arguments passed:
    the rank dies of an AssertionError whose message says what to unset, which is the fix (not "read the
    traceback"). An exception that names nothing keeps the traceback advice."""
    lines = ['[rank0]: Traceback (most recent call last):',
             '[rank0]:   File "/opt/Megatron-LM/megatron/core/models/common/language_module/language_module.py", '
             'line 118, in check_and_set_env_variable',
             "[rank0]: AssertionError: NVTE_FLASH_ATTN set to 1, but expected 0 for attention backend type flash. "
             "unset NVTE_FLASH_ATTN, NVTE_FUSED_ATTN and NVTE_UNFUSED_ATTN. Use the --attention-backend argument if "
             "you want to choose between (flash/fused/unfused/auto/local). Default is auto."]
    [finding] = diagnose_log(parse_text("\n".join(lines)), None).findings
    assert finding.category == "process_crash"
    assert {(fix.action, fix.flag) for fix in finding.fixes if fix.kind == "env"} == {
        ("remove", "NVTE_FLASH_ATTN"), ("remove", "NVTE_FUSED_ATTN"), ("remove", "NVTE_UNFUSED_ATTN")}
    bare = [*lines[:2], "[rank0]: AssertionError: the expert counts do not add up"]
    [plain] = diagnose_log(parse_text("\n".join(bare)), None).findings
    assert [fix.kind for fix in plain.fixes] == ["advice"]
