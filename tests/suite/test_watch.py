"""FatalWatch reads only what each node log gained, and stops at the first fatal line."""

from __future__ import annotations

from megapilot.suite.watch import FatalWatch

ITERATION = " [2026-12-01 06:00:00] iteration        3/      20 | lm loss: 6.5E+00 |\n"


def test_new_lines_of_every_node_are_scanned_once(tmp_path):
    node0, node1 = tmp_path / "n0.log", tmp_path / "n1.log"
    node0.write_text(ITERATION)
    node1.write_text("NCCL INFO Connection closed by localRank 2\n")
    watch = FatalWatch()
    assert watch.scan([node0, node1]) is None  # INFO chatter is not an error
    with node1.open("a") as handle:
        handle.write("[rank9]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
    finding = watch.scan([node0, node1])
    assert finding is not None and finding.category == "oom" and finding.node == 1
    assert finding.evidence[0].line == 2 and "OutOfMemoryError" in finding.evidence[0].text
    assert watch.scan([node0, node1]) is None  # already read


def test_a_line_split_across_polls_is_read_whole(tmp_path):
    log = tmp_path / "n0.log"
    log.write_text("[rank1]: torch.distributed.DistBackendError: NCCL err")
    watch = FatalWatch()
    assert watch.scan([log]) is None
    with log.open("a") as handle:
        handle.write("or in: ProcessGroupNCCL.cpp:1970, unhandled system error\n")
    finding = watch.scan([log])
    assert finding is not None and finding.category == "nccl_error" and finding.evidence[0].line == 1


def test_a_truncated_log_is_read_again_and_a_missing_one_ignored(tmp_path):
    log = tmp_path / "n0.log"
    log.write_text(ITERATION * 3)
    watch = FatalWatch()
    assert watch.scan([log, tmp_path / "absent.log"]) is None
    log.write_text("NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.\n")
    finding = watch.scan([log])
    assert finding is not None and finding.category == "gpu_hw_fault" and finding.evidence[0].line == 1


def test_non_fatal_categories_do_not_stop_a_job(tmp_path):
    log = tmp_path / "n0.log"
    log.write_text("error: unrecognized arguments: --foo\n")  # a config error ends the job by itself
    assert FatalWatch().scan([log]) is None


def test_c10d_warnings_do_not_stop_a_job_but_its_errors_do(tmp_path):
    log = tmp_path / "n1.log"
    # what node 1 prints when node 0's store goes away at the end of a job, and while it waits for the store at start
    log.write_text(
        "[W1205 07:44:35.403684836 TCPStore.cpp:138] [c10d] recvValueWithTimeout failed on SocketImpl(fd=3, "
        "addr=[::ffff:127.0.0.1]:60786, remote=[::ffff:127.0.0.1]:27235): Failed to recv, got 0 bytes. Connection "
        "was likely closed. Did the remote server shutdown or crash?\n"
        "Exception raised from recvBytes at /pytorch/torch/csrc/distributed/c10d/Utils.hpp:787 (most recent call "
        "first):\n"
        "frame #2: c10::DistNetworkError::DistNetworkError(c10::SourceLocation, std::string) + 0x72 (libc10.so)\n"
        "[default0]:[W1205 07:44:01.1 socket.cpp:752] [c10d] The client socket has failed to connect to "
        "[localhost]:29611 (errno: 111 - Connection refused).\n"
        "W1205 07:44:02.049000 28171 torch/distributed/elastic/rendezvous/api.py:123] rendezvous timed out, retrying\n")
    watch = FatalWatch()
    assert watch.scan([log]) is None
    with log.open("a") as handle:  # the rendezvous really failed: raised, not warned
        handle.write("torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError\n")
    finding = watch.scan([log])
    assert finding is not None and finding.category == "rendezvous_failure" and finding.evidence[0].line == 6


def test_a_store_gone_at_the_exit_barrier_does_not_stop_a_job(tmp_path):
    log = tmp_path / "n1.log"
    # node 1's torchrun after its workers finished, node 0's store already gone: torchrun logs it and exits 0
    prefix = "E1205 09:15:40.230000 31095 torch/distributed/elastic/agent/server/api.py:1008]"
    log.write_text(
        " [default0]:[after training] iteration 15/15\n"
        f"{prefix} Error waiting on exit barrier. Elapsed: 0.0123 seconds\n"
        f"{prefix} Traceback (most recent call last):\n"
        f"{prefix} torch.distributed.DistNetworkError: Failed to recv, got 0 bytes. Connection was likely closed. "
        "Did the remote server shutdown or crash?\n")
    watch = FatalWatch()
    assert watch.scan([log]) is None
    # without the agent's line before it, the same error is a failure
    log.write_text(f"{prefix} torch.distributed.DistNetworkError: Failed to recv, got 0 bytes.\n")
    finding = watch.scan([log])
    assert finding is not None and finding.category == "rendezvous_failure"
