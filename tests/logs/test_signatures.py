"""Error taxonomy: each line-level category is found (any case, any rank prefix) and look-alikes are not."""

from __future__ import annotations

from pathlib import Path

import pytest

from megapilot.logs import CATEGORIES, parse_logs, parse_text
from megapilot.logs.signatures import EXCEPTION_LINE_RE, SIGNATURES, TRIGGERS, exception_fault, match_line

DATA = Path(__file__).resolve().parents[1] / "data" / "logs"

# SYNTHETIC lines written from the text PyTorch, NCCL/RCCL, the NVIDIA/AMD drivers and Megatron print.
POSITIVE = [
    ("oom",
     "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 has a total capacity of 79.1 GiB"),
    ("oom", "[rank5]: torch.OutOfMemoryError: HIP out of memory. Tried to allocate 4.00 GiB."),
    ("oom", "RuntimeError: CUDA error: out of memory"),
    ("oom", "host:123:456 [3] include/alloc.h:228 NCCL WARN Cuda failure 2 'out of memory'"),
    ("oom", "hipErrorOutOfMemory returned from hipMalloc"),
    ("nccl_error", "node-3:1234:5678 [2] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion from peer "
                   "10.0.0.4<54321> with status=12 opcode=0 len=0 vendor err 129 (Send) hca mlx5_2"),
    ("nccl_error", "RuntimeError: NCCL communicator was aborted on rank 18."),
    ("nccl_error", "node2:77:88 [5] NCCL WARN Net : Connection closed by remote peer 10.0.0.9<41234>"),
    ("rendezvous_failure", "RuntimeError: Timed out initializing process group in store based barrier on rank: 3, for "
                           "key: store_based_barrier_key:1 (world_size=16, worker_count=8, timeout=0:30:00)"),
    ("rendezvous_failure", "RuntimeError: [1] is setting up NCCL communicator and retrieving ncclUniqueId from [0] via "
                           "c10d key-value store by key '0', but store->get('0') got error: Socket Timeout"),
    ("rendezvous_failure", "torch.distributed.DistBackendError: [1] is setting up NCCL communicator and retrieving "
                           "ncclUniqueId from [0] via c10d key-value store by key '0', but store->get('0') got error: "
                           "Socket Timeout"),  # raised as an NCCL backend error, the wait is the rendezvous
    ("rendezvous_failure", "[W socket.cpp:601] [c10d] The client socket has failed to connect to [node-0]:29500 "
                           "(errno: 110 - Connection timed out)."),
    ("nan_loss", "Exception: Gradient norm is NaN on rank 3"),
    ("nan_loss", "ValueError: loss is inf at step 120"),
    ("checkpoint_load_failure", "[rank0]: AssertionError: Checkpoint not found at /ckpt/iter_0001000"),
    ("checkpoint_load_failure", "FileNotFoundError: [Errno 2] No such file or directory: "
                                "'/ckpt/latest_checkpointed_iteration.txt'"),
    ("config_error", "RuntimeError: No CUDA GPUs are available"),
    ("config_error", "RuntimeError: CUDA error: invalid device ordinal"),
    ("config_error", "ninja: build stopped: subcommand failed."),
    ("config_error", "RuntimeError: Error building extension 'fused_mix_prec_layer_norm_cuda'"),
    ("config_error", "hipErrorNoBinaryForGpu: Unable to find code object for all current devices!"),
    ("config_error", "RuntimeError: The NVIDIA driver on your system is too old (found version 11040)."),
    ("config_error", "Indexing.cu:1289: indexSelectLargeIndex: block: [12,0,0], thread: [64,0,0] Assertion "
                     "`srcIndex < srcSelectDimSize` failed."),
    ("nccl_timeout", "[rank0]:[E ProcessGroupNCCL.cpp:754] [Rank 0] Watchdog caught collective operation timeout: "
                     "WorkNCCL(SeqNum=305, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600528 "
                     "milliseconds before timing out."),
    ("nccl_error",
     "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, ncclRemoteError: A call failed "
     "possibly due to a network error"),
    ("nccl_error", "RuntimeError: NCCL Error 3: internal error - ncclInternalError"),
    ("nccl_error", "ncclInvalidUsage: This usually reflects invalid usage of NCCL library."),
    ("nccl_error", "NCCL error: unhandled cuda error (run with NCCL_DEBUG=INFO for details)"),
    ("gpu_hw_fault", "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus."),
    ("gpu_hw_fault",
     "kernel: NVRM: Xid (PCI:0000:18:00): 48, An uncorrectable double bit error (DBE) has been detected"),
    ("gpu_hw_fault", "HW Exception by GPU node-2 (Agent handle: 0x5b4) reason :GPU Hang"),
    ("gpu_hw_fault", "Memory access fault by GPU node-9 (Agent handle: 0x55) on address 0x7f. Reason: Unknown."),
    ("gpu_hw_fault", "RuntimeError: CUDA error: unspecified launch failure"),
    ("gpu_hw_fault", "amdgpu 0000:c1:00.0: amdgpu: GPU reset begin!"),
    ("gpu_hw_fault", "uncorrectable ECC error encountered"),
    ("rendezvous_failure", "torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError"),
    ("rendezvous_failure",
     "torch.distributed.DistNetworkError: The client socket has timed out after 1800s while trying to connect to "
     "(10.0.0.1, 29500)."),
    ("rendezvous_failure",
     "RuntimeError: The server socket has failed to listen on any local network address. port: 29500, useIpv6: 0, "
     "code: -98, name: EADDRINUSE, message: address already in use"),
    ("shm_insufficient",
     "ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared memory (shm)."),
    ("shm_insufficient", "[09677202c889:5283 :0:5704] Caught signal 7 (Bus error: nonexistent physical address)"),
    ("shm_insufficient", "host:1:2 [0] NCCL WARN Error: failed to extend /dev/shm/nccl-abc to 9637892 bytes"),
    ("checkpoint_save_failure", "Failed to save checkpoint at iteration 1000: OSError"),
    ("checkpoint_save_failure", "OSError: [Errno 28] No space left on device"),
    ("checkpoint_load_failure",
     "RuntimeError: Error(s) in loading state_dict for GPTModel: Missing key(s) in state_dict: "
     "\"decoder.layers.0.mlp\""),
    ("checkpoint_load_failure",
     "megatron.core.dist_checkpointing.core.CheckpointingException: Cannot find global shape metadata"),
    ("dataloader_error", "RuntimeError: DataLoader worker (pid 4242) exited unexpectedly with exit code 1."),
    ("dataloader_error", "FileNotFoundError: [Errno 2] No such file or directory: '/data/my-corpus_text_document.bin'"),
    ("config_error", "pretrain_gpt.py: error: unrecognized arguments: --tensor-parallel 8"),
    ("config_error", "AssertionError: num_attention_heads must be divisible by tensor_model_parallel_size"),
    ("config_error", "pretrain_gpt.py: error: argument --micro-batch-size: invalid int value: 'x'"),
    ("config_error",
     "error: --num-attention-heads: hidden size 64 is not divisible by 3 heads — fix: choose a divisor"),
    ("process_crash", "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:"),
    ("process_crash", "  exitcode  : -7 (pid: 5283)"),
    ("process_crash", "Segmentation fault (core dumped)"),
    ("process_crash", "Fatal Python error: Aborted"),
    ("process_crash", "/var/spool/slurmd/job01/slurm_script: line 12: 4242 Killed"),
    ("nccl_error", "node1:6727:7168 [1] RCCL WARN NET/IB : call to ibv_modify_qp failed"),
    # Megatron-Core's RerunStateMachine (text of megatron/core/rerun_state_machine.py, values made up)
    ("nan_loss", "RuntimeError: Rank 3, node gpu-07, device 3, iteration 1200: Unexpected result nan "
                 "(message='found NaN in local grad norm for bucket #0 in backward pass before data-parallel "
                 "communication collective')"),
    ("nan_loss", "[E rerun_state_machine.py:604] Unexpected result tensor(nan, device='cuda:0') on rank 5 at "
                 "iteration #88 invocation #1 (message='loss is NaN')"),
    # checkpoint writers whose error line never says "checkpoint"
    ("checkpoint_save_failure", "RuntimeError: [enforce fail at inline_container.cc:664] . unexpected pos 704 vs 598"),
    ("checkpoint_save_failure", "RuntimeError: [enforce fail at inline_container.cc:778] . PytorchStreamWriter failed "
                                "writing file data/0: file write failed"),
    ("checkpoint_save_failure", "TypeError: _write_item() takes 5 positional arguments but 6 were given"),
    # Megatron-Core's async torch_dist writer (filesystem_async.py) and torch.distributed.checkpoint's FileSystemWriter
    ("checkpoint_save_failure", "[2026-03-02 11:40:09,120] megatron.core.dist_checkpointing.strategies."
                                "filesystem_async ERROR: Local process 1 encountered an error: [Errno 116] Stale "
                                "file handle"),
    ("checkpoint_save_failure", "[rank2]: RuntimeError: Worker failure: [Errno 5] Input/output error"),
    ("checkpoint_save_failure", "[rank5]: RuntimeError: Incomplete worker results (expected 2, got 1. This probably "
                                "indicates a worker failure."),
    ("checkpoint_save_failure", "RuntimeError: An error is caught while a proc 3 is created, error: [Errno 12] "
                                "Cannot allocate memory"),
    ("checkpoint_save_failure", "RuntimeError: Checkpoint already exists and self.overwrite=False."),
    ("checkpoint_save_failure", "[rank0]: OSError: [Errno 30] Read-only file system: '/ckpt/iter_0000500'"),
    # AMD RAS / MCE (dmesg), SLURM's own summaries
    ("gpu_hw_fault", "amdgpu 0000:05:00.0: amdgpu: RAS: uncorrectable error detected in UMC block"),
    ("gpu_hw_fault", "mce: [Hardware Error]: Machine check events logged"),
    ("process_crash",
     "slurmstepd: error: *** JOB 4242 ON gpu-03 CANCELLED AT 2026-01-01T12:00:00 DUE TO TIME LIMIT ***"),
    ("process_crash", "srun: error: gpu-03: task 7: Killed"),
    ("process_crash", "slurmstepd: error: Detected 1 oom_kill event in StepId=4242.0. Some of the step tasks have been "
                      "OOM Killed."),
]

NEGATIVE = [
    "WARNING: could not find the metadata file checkpoints/bert_345m/latest_checkpointed_iteration.txt ",
    "    will not load any checkpoints and will start from random",
    "9aee1c01f3e7:6727:7168 [1] NCCL INFO [Service thread] Connection closed by localRank 2",
    "  exitcode  : 0 (pid: 5283)",
    "[Rank 0] (after 1 iterations) memory (MB) | allocated: 12520.1 | max allocated: 63409.0 | reserved: 64162.0 | max "
    "reserved: 64162.0",
    "Theoretical memory footprints: weight and optimizer=34560.00 MB, activation=20480.50 MB, total=55040.50 MB",
    "    save-checkpoint ................................: (30000.00, 30010.00)",
    "[2026-01-01 00:20:00.000001] saving checkpoint at iteration      50 to /path/to/ckpt in torch_dist format",
    "  successfully loaded checkpoint from /ckpt [ t 1/8, p 1/4 ] at iteration 50",
    "setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to reduce fragmentation",
    "> building train, validation, and test datasets ...",
    "training ...",
    # Megatron's argument dump at start-up (SYNTHETIC values): names that look like errors, are not.
    "  exit_on_missing_checkpoint ...................... False",
    "  exit_signal_handler ............................. False",
    "  check_for_nan_in_loss_and_grad .................. True",
    "  distributed_timeout_minutes ..................... 10",
    "  no_load_optim ................................... None",
    "  async_save ...................................... None",
    "  num_workers ..................................... 2",
    "  data_path ....................................... ['/data/corpus_text_document']",
    "> compiling dataset index builder ...",
    "NCCL version 2.21.5+cuda12.4",
    "[rank0]:[W ProcessGroupNCCL.cpp:4115] Warning: TORCH_NCCL_AVOID_RECORD_STREAMS is the default now",
    "node1:1:2 [0] RCCL INFO [Service thread] Connection closed by localRank 3",
]


@pytest.mark.parametrize(("category", "line"), POSITIVE)
def test_signature_finds_category(category: str, line: str):
    signature = match_line(line)
    assert signature is not None and signature.category == category


@pytest.mark.parametrize(("category", "line"), POSITIVE)
def test_signatures_are_case_insensitive(category: str, line: str):
    assert match_line(line.upper()).category == category
    assert match_line(line.lower()).category == category


@pytest.mark.parametrize("line", NEGATIVE)
def test_benign_lines_are_not_errors(line: str):
    assert match_line(line) is None


def test_every_line_signature_category_is_in_the_taxonomy():
    assert {s.category for s in SIGNATURES} <= set(CATEGORIES)
    assert {c for c, _ in POSITIVE} == {s.category for s in SIGNATURES}


def test_real_nccl_watchdog_excerpt_names_op_seq_and_every_rank():
    log = parse_logs([DATA / "real/09_nccl_watchdog_timeout_allreduce_moe.log"])
    assert [e.category for e in log.errors] == ["nccl_timeout"] * 3
    assert sorted(e.rank for e in log.errors) == [0, 1, 2]
    assert log.errors[0].details == {"seqnum": "305", "optype": "ALLREDUCE", "numelin": "1", "numelout": "1",
                                     "timeout_ms": "600000", "ran_for_ms": "600381"}


def test_real_oom_through_nccl_found_on_every_rank_in_the_excerpt():
    log = parse_logs([DATA / "real/15_oom_nccl_cuda_failure_bridge_llama3_fp8.log"])
    assert {e.category for e in log.errors} == {"oom"}
    # NCCL's `host:pid:tid [dev]` names the host and the CUDA device of the six processes the excerpt shows,
    # not their ranks (device 3 exists on every node)
    assert all(e.rank is None for e in log.errors)
    assert {e.details["host"] for e in log.errors} == {"cw-dfw-h100-001-132-026"}
    assert sorted(int(e.details["cuda_device"]) for e in log.errors) == [0, 1, 3, 4, 6, 7]


def test_real_bus_error_is_shared_memory_not_a_generic_crash():
    log = parse_logs([DATA / "real/30_nccl_bus_error_shm_ncclgroupend.log"])
    assert [(e.category, e.line) for e in log.errors] == [("shm_insufficient", 2)]


def test_assertion_inside_argument_validation_is_a_config_error():
    log = parse_text("\n".join([
        "[rank0]: Traceback (most recent call last):",
        '[rank0]:   File "/workspace/Megatron-LM/pretrain_gpt.py", line 300, in <module>',
        '[rank0]:   File "/workspace/Megatron-LM/megatron/training/arguments.py", line 412, in validate_args',
        "[rank0]:     assert args.num_layers % args.transformer_pipeline_model_parallel_size == 0",
        "[rank0]: AssertionError",
    ]))
    (error,) = log.errors
    assert error.category == "config_error" and error.line == 5 and error.signature == "exception:AssertionError"


def test_exception_raised_in_save_checkpoint_is_a_save_failure():
    log = parse_text("\n".join([
        "Traceback (most recent call last):",
        '  File "/m/megatron/training/checkpointing.py", line 500, in save_checkpoint',
        "    torch.save(state_dict, checkpoint_name)",
        "PermissionError: [Errno 13] Permission denied: '/ckpt/iter_0000100'",
    ]))
    assert [e.category for e in log.errors] == ["checkpoint_save_failure"]


def test_a_failed_async_torch_dist_write_is_a_save_failure_at_its_checkpoint_exception():
    """Megatron-Core finishing an async save raises torch.distributed.checkpoint's CheckpointException, whose text
    holds each failed rank's own traceback; the frames above it say it was a save, not a load."""
    log = parse_text("\n".join([
        "[2026-03-02 11:40:01.000000] saving checkpoint at iteration     500 to /lustre/ckpt in torch_dist format",
        "[rank0]: Traceback (most recent call last):",
        '[rank0]:   File "/workspace/Megatron-LM/megatron/training/training.py", line 1540, in train',
        "[rank0]:     maybe_finalize_async_save(blocking=False)",
        '[rank0]:   File "/usr/local/lib/python3.12/dist-packages/megatron/core/dist_checkpointing/strategies/'
        'state_dict_saver.py", line 258, in save_state_dict_async_finalize',
        '[rank0]:     raise CheckpointException("write", node_failures)',
        "[rank0]: torch.distributed.checkpoint.api.CheckpointException: CheckpointException ranks:dict_keys([3])",
        "[rank0]: Traceback (most recent call last): (RANK 3)",
        '[rank0]:   File "/usr/local/lib/python3.12/dist-packages/megatron/core/dist_checkpointing/strategies/'
        'filesystem_async.py", line 380, in write_preloaded_data',
        "[rank0]: OSError: [Errno 5] Input/output error: '/lustre/ckpt/iter_0000500/__3_0.distcp'",
    ]))
    assert log.errors and {e.category for e in log.errors} == {"checkpoint_save_failure"}
    assert log.errors[0].line == 7


def test_exception_raised_elsewhere_is_a_crash_named_by_its_exception_and_frame():
    log = parse_text("Traceback (most recent call last):\n  File \"x.py\", line 1, in f\nKeyError: 'a'")
    (error,) = log.errors
    assert (error.category, error.signature, error.line) == ("process_crash", "exception:KeyError", 3)
    assert error.details["frame"] == 'File "x.py", line 1, in f'


def test_a_segfault_whose_stack_is_in_the_checkpoint_writer_is_a_failed_save():
    log = parse_text("Fatal Python error: Segmentation fault\n\nThread 0x00007f (most recent call first):\n"
                     '  File "/opt/megatron/core/dist_checkpointing/strategies/filesystem_async.py", line 310 in '
                     "write_preloaded_data\n"
                     '  File "/opt/megatron/training/checkpointing.py", line 402 in save_checkpoint\n')
    assert [(e.category, e.signature, e.line) for e in log.errors] == [
        ("process_crash", "signal", 1), ("checkpoint_save_failure", "crash_in_checkpoint_writer", 4)]


def test_a_segfault_elsewhere_stays_a_crash():
    log = parse_text('Fatal Python error: Segmentation fault\n  File "/opt/megatron/core/models/gpt.py", line 9 in '
                     "forward\n")
    assert [e.category for e in log.errors] == ["process_crash"]


def test_torchrun_root_cause_block_gives_the_failed_rank_to_its_exit_line():
    log = parse_text("Root Cause (first observed failure):\n[0]:\n  time      : 2026-01-01_12:00:00\n"
                     "  host      : gpu-03\n  rank      : 9 (local_rank: 1)\n  exitcode  : -9 (pid: 4242)\n"
                     "  error_file: <N/A>\n  traceback : Signal 9 (SIGKILL) received by PID 4242\n" + "=" * 40)
    assert [(e.line, e.rank) for e in log.errors] == [(6, 9), (8, 9)]
    assert log.errors[0].details["launcher_host"] == "gpu-03"


def test_rerun_state_machine_report_names_rank_and_iteration():
    (error,) = parse_text(next(line for _, line in POSITIVE if "Rank 3, node gpu-07" in line)).errors
    assert (error.signature, error.rank, error.details["iteration"]) == ("rerun_state_machine", 3, "1200")


@pytest.mark.parametrize("signature", SIGNATURES, ids=lambda s: s.name)
def test_every_text_a_signature_matches_holds_a_trigger(signature):
    """`match_line` skips lines without a trigger substring, so every match must contain one."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from megapilot.logs.signatures import TRIGGERS

    @settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.from_regex(signature.pattern))
    def holds_a_trigger(text: str):
        assert any(trigger in text.lower() for trigger in TRIGGERS), text

    holds_a_trigger()


def _first_signature_by_search(text: str):
    """match_line without the needle shortcut: every signature's regex, in order."""
    lowered = text.lower()
    if not any(trigger in lowered for trigger in TRIGGERS):
        return None
    if ("nccl info" in lowered or "rccl info" in lowered) and "fail" not in lowered:
        return None
    return next((s for s in SIGNATURES if s.pattern.search(text)), None)


def _every_fixture_line() -> list[str]:
    root = Path(__file__).resolve().parents[1] / "data" / "logs"
    return [line for path in sorted(root.rglob("*.log"))
            for line in path.read_text(encoding="utf-8", errors="replace").splitlines()]


def test_the_needle_shortcut_never_changes_which_signature_a_line_matches():
    lines = _every_fixture_line() + [line for _, line in POSITIVE] + NEGATIVE
    assert len(lines) > 1000
    matched = 0
    for line in lines:
        expected = _first_signature_by_search(line)
        assert match_line(line) == expected, line
        matched += expected is not None
    assert matched > 50  # the fixtures and samples hold many error lines: the comparison is not vacuous


def test_needles_are_read_off_each_alternative_and_skip_non_ascii_text():
    oom = next(s for s in SIGNATURES if s.name == "nccl_cuda_oom")
    assert oom.needles == (" failure 2 'out of memory'",)
    assert all(s.needles is None or all(s.needles) for s in SIGNATURES)
    # ignoring case, U+017F (long s) matches "s": no needle holds it, so the shortcut must not apply
    assert match_line("error: \u017fegmentation fault") is not None


@pytest.mark.parametrize(("line", "name"), [
    ("RuntimeError: expected scalar type BFloat16 but found Float", "RuntimeError"),
    ("[rank3]: ImportError: cannot import name 'get_cpu_offload_context' from 'transformer_engine'", "ImportError"),
    ("torch.distributed.elastic.multiprocessing.api.SignalException: Process 12345 got signal: 15",
     "SignalException"),
])
def test_an_exception_line_without_its_traceback_is_still_the_crash(line: str, name: str):
    (error,) = parse_text(line).errors
    assert (error.category, error.signature) == ("process_crash", f"exception:{name}")


@pytest.mark.parametrize("line", [
    "loading checkpoint; a RuntimeError: here would be bad",  # not at the start of the line
    "RuntimeError",  # no message: not a line an exception prints alone
    "UserWarning: this API is deprecated",  # a warning, not an exception
    "ErrorHandler: installed",  # the name does not end in Error/Exception
])
def test_lines_that_only_mention_an_exception_are_not_one(line: str):
    assert parse_text(line).errors == []


@pytest.mark.parametrize(("line", "module", "name", "message"), [
    ("torch.OutOfMemoryError: CUDA out of memory.", "torch.", "OutOfMemoryError", "CUDA out of memory."),
    ("binascii.Error: Incorrect padding", "binascii.", "Error", "Incorrect padding"),  # Python's own `Error`s
    ("Exception: raised by the training script", "", "Exception", "raised by the training script"),
    ("AssertionError", "", "AssertionError", None),
    ("StopIteration", "", "StopIteration", None),
    ("KeyboardInterrupt", "", "KeyboardInterrupt", None),
])
def test_the_one_exception_line_pattern_names_module_exception_and_message(line, module, name, message):
    found = EXCEPTION_LINE_RE.match(line)
    assert found is not None and (found["module"], found["name"], found["message"]) == (module, name, message)


@pytest.mark.parametrize("line", [
    "Error: cannot open file",  # any program's message: Python's `Error` classes carry their module
    "ncclInternalError: internal check failed",  # a library's return code, not a Python class (nccl_error reads it)
    "RuntimeError something",  # Python always puts a colon between the name and the message
])
def test_lines_not_shaped_like_a_python_exception_are_not_matched(line: str):
    assert EXCEPTION_LINE_RE.match(line) is None


def test_an_interrupt_or_an_exit_closes_a_traceback_without_being_a_fault():
    traceback = 'Traceback (most recent call last):\n  File "/m/megatron/training.py", line 3, in train\n    step()\n'
    assert parse_text(traceback + "KeyboardInterrupt\n").errors == []
    assert exception_fault("SystemExit: 1") is None and exception_fault("ValueError: x") is not None
