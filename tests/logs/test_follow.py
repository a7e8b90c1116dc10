"""Following many growing logs at once: each poll reads only the new bytes, the result equals a one-shot parse."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from megapilot.logs import parse_logs
from megapilot.logs.follow import RunFollower
from megapilot.logs.records import IterationRecord, Record

DATA = Path(__file__).resolve().parents[1] / "data" / "logs"
FIXTURES = ["synthetic_megatron_core016_full.log", "synthetic_primus_megatron.log", "synthetic_bridge.log",
            "synthetic_megatron_llm_slowdown.log", "real/09_nccl_watchdog_timeout_allreduce_moe.log"]


def _facts(log):
    return (log.summary.to_dict(), log.dialect_counts, log.lines_read, log.last_line, log.last_time_s, log.errors,
            log.checkpoints)


def test_growing_files_polled_in_odd_pieces_give_the_one_shot_parse(tmp_path: Path):
    sources = [(DATA / name).read_bytes() for name in FIXTURES]
    targets = [tmp_path / f"node{i}.log" for i in range(len(sources))]
    follower = RunFollower(targets, chunk_bytes=97)
    assert follower.poll() == 0  # nothing exists yet: waited for
    written = [0] * len(sources)
    step = 0
    while any(done < len(data) for done, data in zip(written, sources, strict=True)):
        step += 1
        for index, (target, data) in enumerate(zip(targets, sources, strict=True)):
            piece = data[written[index]:written[index] + 311 + 53 * index + step % 7]
            with open(target, "ab") as out:
                out.write(piece)
            written[index] += len(piece)
        before = follower.bytes_read
        assert follower.poll() == sum(written) - before  # exactly the bytes written since the last poll
    assert follower.poll() == 0  # idle: nothing read
    assert follower.bytes_read == sum(len(d) for d in sources)
    followed = follower.finish()
    assert [_facts(log) for log in followed] == [_facts(parse_logs([target], summary_only=True)) for target in targets]


def test_a_truncated_file_is_read_again_from_its_start(tmp_path: Path):
    log = tmp_path / "a.log"
    log.write_text(" iteration        1/      10 | elapsed time per iteration (ms): 10.0 |\n")
    follower = RunFollower([log])
    follower.poll()
    os.truncate(log, 0)
    log.write_text(" iteration 2/ 10 | elapsed time per iteration (ms): 3.0 |\n")  # shorter than what was read
    follower.poll()
    assert follower.summaries()[str(log)].last_iteration == 2


def test_read_line_by_line_every_record_arrives_and_the_result_is_the_one_shot_parse(tmp_path: Path):
    sources = [(DATA / name).read_bytes() for name in FIXTURES[:3]]
    targets = [tmp_path / f"node{i}.log" for i in range(len(sources))]
    seen: list[Record] = []
    follower = RunFollower(targets, chunk_bytes=89, on_record=seen.append)
    for cut in range(0, max(len(d) for d in sources), 401):
        for target, data in zip(targets, sources, strict=True):
            with open(target, "ab") as out:
                out.write(data[cut:cut + 401])
        follower.poll()
    followed = follower.finish()
    assert [_facts(log) for log in followed] == [_facts(parse_logs([target], summary_only=True)) for target in targets]
    for target in targets:  # every iteration line of every file was handed over, in order, naming its file
        expected = [r.iteration for r in parse_logs([target]).iterations]
        assert [r.iteration for r in seen if isinstance(r, IterationRecord) and r.file == str(target)] == expected


# A real process appending Megatron-LM iteration lines to two files in turn, with pauses between writes.
WRITER = """
import sys, time
paths = sys.argv[1:]
for it in range(1, 6):
    for node, path in enumerate(paths):
        with open(path, "a") as out:
            out.write(f" iteration {it:8d}/      10 | consumed samples: {it * 8:12d} | "
                      f"elapsed time per iteration (ms): {100 + node}.0 | global batch size:     8 | "
                      "lm loss: 5.0E+00 | loss scale: 1.0 | "
                      "number of skipped iterations:   0 | number of nan iterations:   0 |\\n")
    time.sleep(0.05)
"""


def test_two_files_grown_by_a_real_process_are_both_read_and_an_idle_poll_reads_nothing(tmp_path: Path):
    paths = [tmp_path / "out-node0" / "training.log", tmp_path / "out-node1" / "training.log"]
    for path in paths:
        path.parent.mkdir()
    seen: list[IterationRecord] = []
    follower = RunFollower(paths, on_record=lambda r: seen.append(r) if isinstance(r, IterationRecord) else None)
    writer = subprocess.Popen([sys.executable, "-c", WRITER, *map(str, paths)])
    polls_with_bytes = 0
    while writer.poll() is None:
        polls_with_bytes += follower.poll() > 0
        time.sleep(0.02)
    assert writer.returncode == 0
    follower.poll()
    assert follower.poll() == 0  # idle: one stat per file, no byte read
    assert follower.bytes_read == sum(path.stat().st_size for path in paths)
    assert polls_with_bytes >= 2  # read while the process was still writing, not only at the end
    by_file = {str(path): [r.iteration for r in seen if r.file == str(path)] for path in paths}
    assert by_file == {str(path): [1, 2, 3, 4, 5] for path in paths}
    assert {r.elapsed_ms for r in seen if r.file == str(paths[1])} == {101.0}
