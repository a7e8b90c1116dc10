"""The failure cascade: the root cause is the most specific failure, first in time; the rest follow it."""

from __future__ import annotations

from pathlib import Path

from megapilot.diagnose.cascade import build_cascade, cause_rank, failure_kind
from megapilot.diagnose.engine import diagnose, diagnose_log
from megapilot.logs import parse_logs, parse_text

# SYNTHETIC lines in the formats PyTorch, NCCL and torchrun print; ranks and times made up.
OOM = "[2026-01-01 12:00:05] [rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
WATCHDOG = ("[2026-01-01 12:10:05] [rank{rank}]:[E ProcessGroupNCCL.cpp:754] [Rank {rank}] Watchdog caught collective "
            "operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran "
            "for 600100 milliseconds before timing out.")
PEER = ("[rank{rank}]: Traceback (most recent call last):\n[rank{rank}]:   File \"train.py\", line 9, in step\n"
        "[rank{rank}]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
        "[10.0.0.2]:4242")


def _write(tmp_path: Path, name: str, lines: list[str]) -> str:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_an_oom_on_one_node_is_the_root_and_the_timeouts_on_the_others_follow(tmp_path: Path):
    # the timeouts are listed first (node 0's file) and the OOM last: time and specificity decide, not file order
    files = [_write(tmp_path, f"out-node{node}/training.log", [WATCHDOG.format(rank=rank) for rank in ranks])
             for node, ranks in ((0, (0, 1)), (1, (2,)))]
    files.append(_write(tmp_path, "out-node2/training.log", [OOM]))
    result = diagnose([str(tmp_path)])
    assert result.story[0].startswith("first failure: rank 3 out of memory")
    assert "out-node2/training.log:1" in result.story[0]
    assert result.story[1].startswith("then: ranks 0, 1, 2 timed out waiting in a collective")
    assert "(+2 more lines in 2 files)" in result.story[1]
    assert [f.category for f in result.findings][:2] == ["oom", "nccl_timeout"]
    assert result.findings[0].title.startswith("First failure: GPU out of memory on rank 3")
    assert result.findings[0].title.endswith("(out-node2/training.log:1)")


def test_a_rank_killed_by_a_signal_comes_before_the_ranks_that_lost_it_even_if_printed_later():
    log = parse_text("\n".join([PEER.format(rank=0), "Root Cause (first observed failure):", "[0]:",
                                "  time      : 2026-01-01_12:00:00", "  host      : gpu-07",
                                "  rank      : 5 (local_rank: 1)", "  exitcode  : -9 (pid: 4242)",
                                "  traceback : Signal 9 (SIGKILL) received by PID 4242", "=" * 40]))
    cascade = build_cascade(log.errors, log.files)
    assert cascade is not None
    assert (cascade.root.kind, cascade.root.ranks) == ("killed", (5,))
    assert cascade.root.what == "killed by SIGKILL (exit code -9)"
    assert [step.kind for step in cascade.consequences] == ["lost peer"]


def test_kinds_rank_self_explaining_failures_first_and_launcher_reports_last():
    records = parse_text("\n".join([
        OOM, "[rank1]: Segmentation fault (core dumped)", PEER.format(rank=2),
        "E0101 12:00:09.000000 42 api.py:1002] failed (exitcode: 1) local_rank: 0 (pid: 7) of binary: python",
    ])).errors
    assert [failure_kind(r) for r in records] == ["self-explaining", "killed", "lost peer", "launcher exit"]
    assert [cause_rank(r) for r in records] == sorted(cause_rank(r) for r in records)


def test_without_timestamps_the_order_of_evidence_decides_between_equals():
    log = parse_text("[rank4]: torch.OutOfMemoryError: CUDA out of memory.\n"
                     "[rank2]: torch.OutOfMemoryError: CUDA out of memory.")
    cascade = build_cascade(log.errors, log.files)
    assert cascade is not None and cascade.root.ranks == (4,) and cascade.consequences[0].ranks == (2,)


def test_a_single_error_has_a_story_of_one_line_and_no_consequences():
    result = diagnose_log(parse_text(OOM), None)
    assert len(result.story) == 1 and result.cascade is not None and not result.cascade.consequences


def test_timeouts_alone_are_not_called_a_first_failure():
    result = diagnose_log(parse_text("\n".join(WATCHDOG.format(rank=rank) for rank in (0, 1))), None)
    assert result.story[0].startswith("earliest error (itself a consequence")
    assert not result.findings[0].title.startswith("First failure")


def test_a_clean_log_has_no_cascade(tmp_path: Path):
    log = parse_logs([_write(tmp_path, "a.log", [" iteration 1/ 10 | elapsed time per iteration (ms): 10.0 |"])])
    assert build_cascade(log.errors, log.files) is None and diagnose_log(log, None).story == []


def test_a_watchdog_timeout_rethrown_as_dist_backend_error_is_still_a_consequence():
    log = parse_text("\n".join([
        "terminate called after throwing an instance of 'c10::DistBackendError'",
        "  what():  [PG 1 Rank 6] Process group watchdog thread terminated with exception: [Rank 6] Watchdog caught "
        "collective operation timeout: WorkNCCL(SeqNum=199, OpType=_REDUCE_SCATTER_BASE, NumelIn=7, NumelOut=4, "
        "Timeout(ms)=600000) ran for 882722 milliseconds before timing out.",
    ]))
    cascade = build_cascade(log.errors, log.files)
    assert cascade is not None and not cascade.root_is_cause


def test_the_abort_the_nccl_watchdog_takes_its_process_down_with_follows_the_timeout():
    """Older PyTorch: the watchdog times out, says it is "taking the entire process down", throws std::runtime_error
    (terminate -> SIGABRT) and torchrun reports exit code -6, with a timestamp the timeout lines lack (the shape of
    Megatron-LM issue #1051's log). The abort is the timeout's consequence; an abort before any timeout stays a
    cause."""
    timeout = ("[E ProcessGroupNCCL.cpp:737] [Rank 7] Watchdog caught collective operation timeout: WorkNCCL(SeqNum="
               "749, OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1800258 milliseconds before timing out.")
    abort = ["terminate called after throwing an instance of 'std::runtime_error'",
             "[2024-08-30 10:00:01,123] torch.distributed.elastic.multiprocessing.api: [ERROR] failed (exitcode: -6) "
             "local_rank: 7 (pid: 1234) of binary: /usr/bin/python"]
    teardown = ("[E ProcessGroupNCCL.cpp:414] Some NCCL operations have failed or timed out. To avoid this "
                "inconsistency, we are taking the entire process down.")
    log = parse_text("\n".join([timeout, teardown, *abort]))
    cascade = build_cascade(log.errors, log.files)
    assert cascade is not None and not cascade.root_is_cause
    assert cascade.root.category == "nccl_timeout"
    assert any(step.what.startswith("taken down by its NCCL watchdog") for step in cascade.consequences)
    first = build_cascade(*(lambda x: (x.errors, x.files))(parse_text("\n".join([*abort, timeout]))))
    assert first is not None and first.root.kind == "killed" and first.root_is_cause


def test_a_slurm_oom_kill_names_host_memory_not_a_signal():
    log = parse_text("slurmstepd: error: Detected 1 oom_kill event in StepId=4242.0. Some of the step tasks have been "
                     "OOM Killed.\nsrun: error: gpu-03: task 7: Killed")
    result = diagnose_log(log, None)
    assert result.story[0].startswith("first failure: killed by the host's OOM killer (CPU memory)")
    assert "CPU memory" in result.findings[0].cause


def test_torchruns_agent_stopped_by_a_signal_is_said_stopped_from_outside_not_crashed():
    """After an scancel the agent prints `SignalException: Process N got signal: 15`, then its exit: the cascade's
    lead said 'crashed: ...SignalException' where the job was stopped from outside."""
    log = parse_text("\n".join([
        "[2026-01-01 12:00:00] torch.distributed.elastic.multiprocessing.api.SignalException: Process 4242 got "
        "signal: 15",
        "E0101 12:00:09.000000 42 api.py:1002] failed (exitcode: 1) local_rank: 0 (pid: 7) of binary: python"]))
    cascade = build_cascade(log.errors, log.files)
    assert cascade is not None
    assert cascade.root.what == "stopped by SIGTERM from outside (torchrun's agent received it)"


def test_timeouts_that_follow_the_root_cause_are_a_warning_that_names_it_not_a_second_critical(tmp_path: Path):
    files = [_write(tmp_path, "out-node0/training.log", [WATCHDOG.format(rank=rank) for rank in (0, 1)]),
             _write(tmp_path, "out-node1/training.log", [OOM])]
    result = diagnose(files)
    oom, timeout = result.findings[:2]
    assert (oom.category, oom.severity) == ("oom", "critical")
    assert (timeout.category, timeout.severity) == ("nccl_timeout", "warning")
    assert timeout.cause.startswith("A consequence of the first failure above (out of memory)")
    alone = diagnose([files[0]])  # without the OOM's log the timeout is all there is: still critical
    assert [(f.category, f.severity) for f in alone.findings][:1] == [("nccl_timeout", "critical")]
