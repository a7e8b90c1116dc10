"""FatalWatch reads only what each node log gained, through the log parser, and stops at its first fatal record:
the same verdict as the analysis after the run, on every fixture log fed in random-size chunks."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from megapilot.diagnose import diagnose
from megapilot.diagnose.findings import Finding
from megapilot.logs import CATEGORIES, parse_logs
from megapilot.logs.bulk import ENGINES
from megapilot.suite.watch import FATAL_CATEGORIES, QUIET_S, FatalWatch, is_fatal

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


# ---- one engine: the watch's records are the log analysis's ---------------------------------------------------

DATA = Path(__file__).resolve().parents[1] / "data"
FIXTURE_LOGS = sorted(p for p in (DATA / "logs").rglob("*") if p.is_file() and p.suffix not in (".md", ".sh"))
NODE_END_LOGS = sorted((DATA / "logs" / "node_end").glob("*.log"))


class _Clock:
    """A clock the test moves (the watch's quiet time is wall-clock time)."""

    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def _grow(source: Path, log: Path, watch: FatalWatch, seed: int, clock: _Clock | None = None) -> list[Finding]:
    """Append `source` to `log` in random-size chunks (lines cut anywhere), scanning after each, and with a clock
    now and then again once the file was quiet (a line cut mid-way judged as it stands); at the end, the file quiet,
    once more. Every finding the watch gave, in order."""
    data = source.read_bytes()
    chance = random.Random(seed)
    found, pos = [], 0
    log.write_bytes(b"")
    while pos < len(data):
        size = chance.choice((1, 7, 64, 512, 4096))
        with log.open("ab") as handle:
            handle.write(data[pos:pos + size])
        pos += size
        if (finding := watch.scan([log])) is not None:
            found.append(finding)
        if clock is not None and chance.random() < 0.25:
            clock.now_s += QUIET_S
            if (finding := watch.scan([log])) is not None:
                found.append(finding)
    if clock is not None:
        clock.now_s += QUIET_S
    if (finding := watch.scan([log])) is not None:
        found.append(finding)
    return found


def _first_fatal(path: Path) -> tuple[int, str] | None:
    """The after-run analysis's verdict: the first error record of a fatal category `parse_logs` gives (the line
    path, every line through the parser)."""
    fatal = [e for e in parse_logs([path]).errors if is_fatal(e)]
    return (fatal[0].line, fatal[0].category) if fatal else None


def test_there_are_fixture_logs_of_both_verdicts():
    verdicts = [_first_fatal(path) for path in FIXTURE_LOGS]
    assert len(FIXTURE_LOGS) >= 50
    assert sum(v is not None for v in verdicts) >= 10 and sum(v is None for v in verdicts) >= 30
    assert {v[1] for v in verdicts if v} >= {"oom", "nccl_timeout", "gpu_hw_fault", "checkpoint_save_failure"}


@pytest.mark.parametrize("fixture", FIXTURE_LOGS, ids=lambda p: str(p.relative_to(DATA / "logs")))
def test_the_live_watch_and_the_analysis_afterwards_give_the_same_verdict(fixture, tmp_path):
    # the log as written, and as a process that died before its last newline leaves it
    cut = tmp_path / "cut" / fixture.name
    cut.parent.mkdir()
    cut.write_bytes(fixture.read_bytes().removesuffix(b"\n"))
    for path in (fixture, cut):
        expected = _first_fatal(path)
        for engine in ENGINES:
            clock = _Clock()
            found = _grow(path, tmp_path / path.name, FatalWatch(clock=clock, engine=engine), seed=len(path.name),
                          clock=clock)
            assert [(f.evidence[0].line, f.category) for f in found[:1]] == ([expected] if expected else []), engine
            if found:  # it said what it stopped on: the category and the line, as diagnose quotes it
                stopped = found[0]
                assert stopped.title.startswith(f"{stopped.category} ({path.name} line {stopped.evidence[0].line}): ")
                assert stopped.node == 0 and stopped.evidence[0].file == str(tmp_path / path.name)
        # diagnose, which the suite's measure step runs on each node's log, fails the run on that category too
        blocking = {f.category for f in diagnose([path]).findings if f.category in FATAL_CATEGORIES and f.blocking}
        assert expected[1] in blocking if expected else not blocking


@pytest.mark.parametrize("path", NODE_END_LOGS, ids=lambda p: p.name)
def test_what_a_node_prints_after_its_workers_finished_never_stops_a_job(path, tmp_path):
    # c10d's shutdown warnings and a store gone at the exit barrier: torchrun still exits 0
    assert _grow(path, tmp_path / path.name, FatalWatch(), seed=3) == []


def test_a_traceback_stops_the_job_on_its_last_line(tmp_path):
    # a TypeError says nothing of checkpoints: the frames above it make it a failed save, so the record (and the
    # stop) comes with the exception line, the traceback's last
    log = tmp_path / "n0.log"
    lines = [
        "[rank0]: Traceback (most recent call last):\n",
        '[rank0]:   File "/opt/megatron/core/dist_checkpointing/strategies/filesystem_async.py", line 260, in '
        "write_preloaded_data\n",
        "[rank0]:     local_results.append(_write_item(*transform_list, stream, data, write_item, storage_key))\n",
        "[rank0]: TypeError: _write_item() takes 4 positional arguments but 6 were given\n",
        " [2026-12-01 06:00:09] iteration        4/      20 | lm loss: 6.4E+00 |\n",
    ]
    watch = FatalWatch()
    for line in lines[:3]:
        with log.open("a") as handle:
            handle.write(line)
        assert watch.scan([log]) is None
    with log.open("a") as handle:
        handle.write(lines[3])
    finding = watch.scan([log])
    assert finding is not None and finding.category == "checkpoint_save_failure" and finding.rank == 0
    assert finding.evidence[0].line == 4 and "TypeError: _write_item()" in finding.title


def test_a_line_left_unfinished_is_judged_once_its_file_is_quiet(tmp_path):
    log = tmp_path / "n0.log"
    log.write_text(ITERATION + "[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
    clock = _Clock()
    watch = FatalWatch(clock=clock)
    assert watch.scan([log]) is None  # the line may go on
    clock.now_s += QUIET_S / 2
    assert watch.scan([log]) is None
    clock.now_s += QUIET_S / 2  # quiet long enough: the writer died or hangs mid-line
    finding = watch.scan([log])
    assert finding is not None and finding.category == "oom" and finding.evidence[0].line == 2
    assert finding.rank == 3
    with log.open("a") as handle:  # the line ends after all: read once, reported once
        handle.write(". GPU 0 has a total capacity of 79.11 GiB\n" + ITERATION)
    assert watch.scan([log]) is None
    clock.now_s += QUIET_S
    assert watch.scan([log]) is None


def test_a_crash_in_the_checkpoint_writer_stops_on_the_writer_frame(tmp_path):
    # the segfault alone is the executor's to report (process_crash); a frame of the writer under it names the save
    log = tmp_path / "n0.log"
    log.write_text("[rank5]: !!!!!!! Segfault encountered !!!!!!!\n"
                   "[rank5]:   File \"/usr/lib/python3/threading.py\", line 1012 in run\n")
    watch = FatalWatch()
    assert watch.scan([log]) is None
    with log.open("a") as handle:
        handle.write("[rank5]: frame #3: caffe2::serialize::PyTorchStreamWriter::writeRecord(std::string const&, "
                     "void const*, unsigned long, bool) + 0x1f2 (libtorch_cpu.so)\n")
    finding = watch.scan([log])
    assert finding is not None and finding.category == "checkpoint_save_failure" and finding.evidence[0].line == 3


def test_every_fatal_category_is_one_that_diagnose_has_a_line_rule_for():
    from megapilot.diagnose.rules import LINE_RULES

    assert FATAL_CATEGORIES.issubset(CATEGORIES)
    assert FATAL_CATEGORIES.issubset(LINE_RULES)
