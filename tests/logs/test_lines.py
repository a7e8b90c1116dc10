"""Reading bytes: chunk boundaries, stdin-like streams, growing files with stop conditions."""

from __future__ import annotations

import io
import threading
import time
from pathlib import Path

from megapilot.logs import follow_log
from megapilot.logs.lines import MAX_LINE_BYTES, BlockSplitter, LineSplitter, LineWindow, follow_lines, read_lines

ITERATION = " iteration {it:8d}/     100 | elapsed time per iteration (ms): {ms:.1f} | lm loss: 5.0E+00 |\n"


def test_lines_split_across_chunks_and_multibyte_characters_survive():
    data = "αβγ line one\nsecond é line\r\nthird\n".encode()
    for chunk in (1, 2, 3, 7):
        assert list(read_lines(io.BytesIO(data), chunk_bytes=chunk)) == [
            (1, "αβγ line one"), (2, "second é line"), (3, "third")]


def test_a_line_window_keeps_its_lines_numbered_as_in_the_file_whatever_the_chunks():
    """One run's part of a file that holds several: the lines before it read as empty lines (their numbers kept),
    the stream ends after its last line; an unterminated last line is kept, a window past the end reads nothing."""
    data = b"one\ntwo\nthree\nfour\nfive"
    for chunk in (1, 2, 3, 5, 64):
        def lines(first: int, last: int | None) -> list[tuple[int, str]]:
            read = read_lines(LineWindow(io.BytesIO(data), first, last), chunk_bytes=chunk)  # noqa: B023
            return [(number, text) for number, text in read if text]

        assert lines(2, 3) == [(2, "two"), (3, "three")], chunk
        assert lines(4, None) == [(4, "four"), (5, "five")], chunk
        assert lines(1, 1) == [(1, "one")], chunk
        assert lines(9, None) == [], chunk


def test_carriage_return_progress_segments_share_a_line_number():
    assert list(read_lines(io.BytesIO(b"a\rb\rc\nd"))) == [(1, "a"), (1, "b"), (1, "c"), (2, "d")]


def test_overlong_line_is_cut_not_kept_whole(monkeypatch):
    import megapilot.logs.lines as lines

    monkeypatch.setattr(lines, "MAX_LINE_BYTES", 10)
    splitter = LineSplitter()
    out = list(splitter.feed(b"x" * 50)) + list(splitter.feed(b"x" * 50 + b"\nok\n"))
    assert out[-1] == (2, "ok") and len(out[0][1]) <= 60


def test_follow_reads_lines_appended_later_and_stops_at_training_done(tmp_path: Path):
    log = tmp_path / "train.log"

    def writer() -> None:
        time.sleep(0.15)  # the file does not exist when following starts
        with open(log, "w") as out:
            for it in range(1, 4):
                out.write(ITERATION.format(it=it, ms=100.0))
                out.flush()
                time.sleep(0.05)
            out.write("[after training is done] datetime: 2026-01-01 00:00:00\n")

    thread = threading.Thread(target=writer)
    thread.start()
    started = time.monotonic()
    parsed = follow_log(log, poll_s=0.02, timeout_s=10)
    thread.join()
    assert [r.iteration for r in parsed.iterations] == [1, 2, 3]
    assert time.monotonic() - started < 5, "stops at the training-done marker, not at the timeout"


def test_follow_stops_on_idle_timeout_and_yields_the_unterminated_line(tmp_path: Path):
    log = tmp_path / "train.log"
    log.write_text("first\npartial")
    assert list(follow_lines(log, poll_s=0.01, idle_timeout_s=0.1)) == [(1, "first"), (2, "partial")]


def test_follow_restarts_when_the_file_is_truncated(tmp_path: Path):
    log = tmp_path / "train.log"
    log.write_text("old line one\nold line two\n")
    seen: list[str] = []

    def rewrite() -> None:
        time.sleep(0.3)
        log.write_text("new\n")

    thread = threading.Thread(target=rewrite)
    thread.start()
    for _, text in follow_lines(log, poll_s=0.01, idle_timeout_s=1.0):
        seen.append(text)
    thread.join()
    assert seen == ["old line one", "old line two", "new"]


PROGRESS = ("Epoch 0: :    0%|          | {n}/77225 [00:41<878:01:48, 41.36s/it, loss=3.1, v_num=, "
            "reduced_train_loss={loss:.3f}, global_step={step}.0, consumed_samples=2.05e+03, "
            "train_step_timing in s=41.21]")


def test_a_progress_bar_run_on_one_line_loses_no_update(tmp_path: Path):
    # NeMo 1.x / Lightning's tqdm ends every update with `\r`, never a newline: a whole run is one line of megabytes,
    # far past MAX_LINE_BYTES; each update is still a segment of line 1, and the failure after it is line 2
    updates = [PROGRESS.format(n=step + 1, loss=3.19 - step * 1e-5, step=step) for step in range(20_000)]
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
    log = tmp_path / "train.log"
    log.write_text("\r".join(updates) + "\n" + oom + "\n")
    assert log.stat().st_size > 3 * MAX_LINE_BYTES
    expected = [(1, update) for update in updates] + [(2, oom)]
    for chunk_bytes in (1 << 20, 300_007):
        with open(log, "rb") as stream:
            assert list(read_lines(stream, chunk_bytes=chunk_bytes)) == expected, chunk_bytes


def test_a_progress_bar_line_is_handed_on_in_blocks_never_held_whole():
    updates = "\r".join(PROGRESS.format(n=step + 1, loss=3.0, step=step) for step in range(20_000)).encode()
    splitter, handed = BlockSplitter(), []
    for start in range(0, len(updates), 65_536):
        block = splitter.feed(updates[start:start + 65_536])
        assert len(splitter.pending) <= MAX_LINE_BYTES
        if block is not None:
            assert splitter.continues  # segments of the one line, which goes on
            handed.append(block[0][:block[1] - 1])
    handed.append(splitter.flush() or b"")
    assert b"\r".join(handed) == updates
