from __future__ import annotations

from megapilot.execute.tail import LogTail


def test_returns_only_complete_lines_until_the_rest_is_asked_for(tmp_path):
    log = tmp_path / "training.log"
    tail = LogTail(log)
    assert tail.read_new_lines() == []  # not created yet
    log.write_bytes(b"one\ntw")
    assert tail.read_new_lines() == ["one"]
    with open(log, "ab") as handle:
        handle.write(b"o\nthree")
    assert tail.read_new_lines() == ["two"]
    assert tail.read_rest() == ["three"]
    assert tail.read_rest() == []


def test_undecodable_bytes_do_not_stop_the_tail(tmp_path):
    log = tmp_path / "training.log"
    log.write_bytes(b"\xff\xfe bad\r\nok\n")
    assert LogTail(log).read_new_lines() == ["\ufffd\ufffd bad", "ok"]


def test_a_progress_bar_longer_than_the_limit_is_cut_between_its_updates(tmp_path):
    # one line redrawn with carriage returns, 250 KB before its newline, written in pieces that end mid-update
    updates = [f" iteration {i:8d}/ 5000 | elapsed time per iteration (ms): {100 + i % 50}.0 |" for i in range(1, 3501)]
    data = "".join("\r" + update for update in updates).encode()
    log = tmp_path / "training.log"
    tail = LogTail(log)
    seen = []
    for start in range(0, len(data), 7_001):
        with open(log, "ab") as handle:
            handle.write(data[start:start + 7_001])
        seen += tail.read_new_lines()
    assert len(seen) > 1  # handed on before the newline
    seen += tail.read_rest()
    assert [piece for line in seen for piece in line.split("\r") if piece] == updates


def test_bytes_with_no_line_end_at_all_are_handed_on_not_held_without_bound(tmp_path):
    log = tmp_path / "training.log"
    log.write_bytes(b"x" * 200_000)
    lines = LogTail(log).read_new_lines()
    assert lines == ["x" * 200_000]  # one read: handed on whole, nothing held back without bound
