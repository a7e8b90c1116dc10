"""Following many growing logs at once: each poll reads only the new bytes, the result equals a one-shot parse."""

from __future__ import annotations

import os
from pathlib import Path

from megapilot.logs import parse_logs
from megapilot.logs.follow import RunFollower

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
