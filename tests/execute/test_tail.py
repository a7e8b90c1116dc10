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
