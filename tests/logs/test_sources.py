"""Which files make up a run: directories, patterns and plain paths become one list of text logs."""

from __future__ import annotations

import bz2
import contextlib
import gzip
import io
import lzma
import os
import random
import sys
import threading
from pathlib import Path

import pytest

from megapilot.errors import MegapilotError
from megapilot.logs import parse_logs
from megapilot.logs.sources import (
    expand_log_paths,
    is_text,
    logs_in_directory,
    source_labels,
    stdin_read_again,
)


def _run_dir(root: Path) -> Path:
    for node in (0, 1, 10):
        (root / f"out-node{node}" / "ranks" / "attempt_0" / "0").mkdir(parents=True)
        (root / f"out-node{node}" / "training.log").write_text(f"node {node}\n")
        (root / f"out-node{node}" / "ranks" / "attempt_0" / "0" / "stdout.log").write_text("mirror\n")
    (root / "slurm-4242.out").write_text("srun: error: gpu-03: task 7: Killed\n")
    (root / "dmesg.txt").write_text("NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.\n")
    (root / "job.json").write_text("{}")
    (root / "corpus" / "cache").mkdir(parents=True)
    (root / "corpus" / "cache" / "index-description.txt").write_text("not a log either")
    (root / "description.txt").write_text('{"class": "GPTDataset"}')
    (root / "model.log").write_bytes(b"\x00\x01binary")
    return root


def test_a_run_directory_gives_every_node_log_in_natural_order_and_skips_mirrors_caches_and_data(tmp_path: Path):
    names = [str(p.relative_to(tmp_path)) for p in logs_in_directory(_run_dir(tmp_path))]
    assert names == ["dmesg.txt", "out-node0/training.log", "out-node1/training.log", "out-node10/training.log",
                     "slurm-4242.out"]


def test_patterns_paths_and_directories_are_expanded_once_each(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    _run_dir(tmp_path)
    _stdin(monkeypatch, LINES.encode())  # `-` is judged as a file is: its first bytes are read
    pattern = str(tmp_path / "out-node*" / "training.log")
    node0 = str(tmp_path / "out-node0" / "training.log")
    files = expand_log_paths([node0, pattern, "-"])
    assert files == [node0, str(tmp_path / "out-node1" / "training.log"), str(tmp_path / "out-node10" / "training.log"),
                     "-"]


@pytest.mark.parametrize(("name", "message"), [("missing.log", "no such log file"), ("model.log", "not a text file"),
                                               ("empty-dir", "holds no log file"), ("nothing-*.log", "no file matches"),
                                               ("mode*.log", "no text file matches")])
def test_what_is_not_a_log_is_a_user_error_naming_the_field(tmp_path: Path, name: str, message: str):
    _run_dir(tmp_path)
    (tmp_path / "empty-dir").mkdir()
    with pytest.raises(MegapilotError) as info:
        expand_log_paths([str(tmp_path / name)], flag="--log")
    assert info.value.field == "--log" and message in str(info.value)


def test_text_sniffing_accepts_ansi_and_a_few_bad_bytes_but_not_binary(tmp_path: Path):
    coloured = tmp_path / "a.log"
    coloured.write_bytes(b"\x1b[31mstep: 1\x1b[0m loss: 2.0\n" + b"\xff" * 2 + b"ok\n" * 50)
    binary = tmp_path / "b.log"
    binary.write_bytes(bytes(range(1, 32)) * 40)
    assert is_text(coloured) and not is_text(binary)


def test_labels_are_paths_below_the_common_directory(tmp_path: Path):
    files = [str(tmp_path / "out-node0" / "training.log"), str(tmp_path / "out-node1" / "training.log")]
    assert list(source_labels(files).values()) == ["out-node0/training.log", "out-node1/training.log"]
    assert source_labels(files[:1]) == {files[0]: "training.log"}


def test_follow_paths_keep_a_file_not_written_yet_and_expand_directories_and_globs(tmp_path: Path):
    from megapilot.logs.sources import expand_follow_paths

    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "node0.log").write_text("x\n")
    later = tmp_path / "node1" / "training.log"  # the node has not started: its log is waited for
    assert expand_follow_paths([str(tmp_path / "run"), str(later), str(tmp_path / "run" / "*.log")]) == [
        str(tmp_path / "run" / "node0.log"), str(later)]
    with pytest.raises(MegapilotError, match="standard input cannot be followed"):
        expand_follow_paths(["-"])
    with pytest.raises(MegapilotError, match="no file matches"):
        expand_follow_paths([str(tmp_path / "nothing*.log")])


LINES = "".join(f" iteration {i:8d}/ 100 | elapsed time per iteration (ms): 100.0 | lm loss: 5.0E+00 |\n"
                for i in range(1, 21))


@pytest.mark.parametrize("summary_only", [False, True], ids=["line path", "bulk path"])
def test_a_gzip_log_is_read_decompressed_and_found_in_a_directory(tmp_path: Path, summary_only: bool):
    (tmp_path / "node0").mkdir()
    with gzip.open(tmp_path / "node0" / "training.log.gz", "wt") as stream:
        stream.write(LINES)
    files = expand_log_paths([str(tmp_path)])
    assert [Path(name).name for name in files] == ["training.log.gz"]
    assert parse_logs(files, summary_only=summary_only).summary.iterations_counted == 20


def test_a_pipe_is_read_once_judged_on_what_its_reading_takes_first(tmp_path: Path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_text(LINES))
    writer.start()
    try:
        files = expand_log_paths([str(fifo)])  # what `<(zcat run.log.gz)` passes: a pipe, read once
        assert files == [str(fifo)]
        assert parse_logs(files).summary.iterations_counted == 20
    finally:
        writer.join(timeout=10)
    binary = tmp_path / "binary-pipe"
    os.mkfifo(binary)

    def write_noise() -> None:
        with contextlib.suppress(BrokenPipeError):  # the reader stops at the refusal
            binary.write_bytes(random.Random(5).randbytes(50_000))

    writer = threading.Thread(target=write_noise)
    writer.start()
    try:
        with pytest.raises(MegapilotError, match="binary-pipe is not a text file"):
            parse_logs(expand_log_paths([str(binary)]))
    finally:
        writer.join(timeout=10)


def _stdin(monkeypatch: pytest.MonkeyPatch, data: bytes) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))


def test_binary_on_stdin_is_refused_as_the_same_bytes_in_a_file_are(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    noise = random.Random(3).randbytes(50_000)
    (tmp_path / "noise.bin").write_bytes(noise)
    for flag in ("FILE", "--log"):
        with pytest.raises(MegapilotError) as as_file:
            expand_log_paths([str(tmp_path / "noise.bin")], flag=flag)
        _stdin(monkeypatch, noise)
        with pytest.raises(MegapilotError) as as_stdin:
            expand_log_paths(["-"], flag=flag)
        assert (as_stdin.value.field, as_stdin.value.fix) == (as_file.value.field, as_file.value.fix) == (
            flag, "pass a log (text a job printed), not a checkpoint or other binary file")
        assert as_stdin.value.problem == "<stdin> is not a text file"
    _stdin(monkeypatch, noise)  # the library reads stdin without expanding first: refused all the same
    with pytest.raises(MegapilotError, match="<stdin> is not a text file"):
        parse_logs(["-"], summary_only=True)


@pytest.mark.parametrize("summary_only", [False, True])
def test_text_on_stdin_is_read_whole_after_the_sniff(monkeypatch: pytest.MonkeyPatch, summary_only: bool):
    """The sniff's bytes are handed back: a log longer than the sniff, or behind NUL padding, reads as from a file."""
    long = "".join(f" iteration {i:8d}/ 1000 | elapsed time per iteration (ms): 100.0 | lm loss: 5.0E+00 |\n"
                   for i in range(1, 1001)).encode()  # ~90 KB, ten sniffs' worth
    for data, iterations in ((long, 1000), (b"\x00" * 40_000 + LINES.encode(), 20)):
        _stdin(monkeypatch, data)
        assert expand_log_paths(["-"]) == ["-"]
        assert parse_logs(["-"], summary_only=summary_only).summary.iterations_logged == iterations


def test_stdin_is_read_once_and_each_reading_inside_stdin_read_again_gets_all_of_it(monkeypatch: pytest.MonkeyPatch):
    """A reader that reads the logs twice (diagnose with flags of another run) gets the whole input both times."""
    data = "".join(f" iteration {i:8d}/ 1000 | elapsed time per iteration (ms): 100.0 | lm loss: 5.0E+00 |\n"
                   for i in range(1, 301)).encode()  # a few sniffs' worth
    _stdin(monkeypatch, data)
    with stdin_read_again():
        first = parse_logs(["-"], summary_only=True)
        with stdin_read_again():  # nested: the outer copy serves
            again = parse_logs(["-"])  # the line path, a reader of its own
        third = parse_logs(["-"], summary_only=True)
    assert [log.summary.iterations_logged for log in (first, again, third)] == [300, 300, 300]
    assert first.summary.to_dict() == again.summary.to_dict() == third.summary.to_dict()
    assert sys.stdin.buffer.read() == b""  # standard input itself was read once
    assert parse_logs(["-"], summary_only=True).lines_read == 0  # outside it, nothing is left to read


def test_no_room_for_the_copy_of_stdin_is_a_clear_error_naming_tmpdir(monkeypatch: pytest.MonkeyPatch):
    import errno
    import tempfile

    class Full(io.BytesIO):
        def write(self, data: object) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tempfile, "TemporaryFile", lambda *args, **kwargs: Full())
    _stdin(monkeypatch, LINES.encode())
    with pytest.raises(MegapilotError, match="no room to keep a copy of standard input") as caught, \
            stdin_read_again():
        parse_logs(["-"])
    assert caught.value.fix is not None and "TMPDIR" in caught.value.fix


def test_a_first_reading_that_stops_early_still_leaves_the_whole_input_for_the_next(monkeypatch: pytest.MonkeyPatch):
    from megapilot.logs.sources import open_log

    data = b"".join(b"line %d of a log that goes on\n" % i for i in range(5000))
    _stdin(monkeypatch, data)
    with stdin_read_again():
        with open_log("-") as stream:
            assert stream.read(100) == data[:100]
        with open_log("-") as stream:
            assert stream.read() == data


@pytest.mark.parametrize(("suffix", "compress"), [(".xz", lzma.compress), (".bz2", bz2.compress)])
def test_an_xz_or_bzip2_log_is_read_decompressed_and_found_in_a_directory(tmp_path: Path, suffix: str,
                                                                          compress: object):
    """What log rotation and archiving leave besides gzip: read as the log they hold, on both reading paths."""
    assert callable(compress)
    (tmp_path / "node0").mkdir()
    (tmp_path / "node0" / f"training.log{suffix}").write_bytes(compress(LINES.encode()))
    files = expand_log_paths([str(tmp_path)])
    assert [Path(name).name for name in files] == [f"training.log{suffix}"]
    for summary_only in (False, True):
        assert parse_logs(files, summary_only=summary_only).summary.iterations_counted == 20


def test_a_zstd_log_is_refused_naming_its_format_and_how_to_unpack_it(tmp_path: Path):
    packed = tmp_path / "training.log.zst"
    packed.write_bytes(b"\x28\xb5\x2f\xfd" + bytes(range(256)) * 4)  # a zstd frame's magic, then its data
    with pytest.raises(MegapilotError, match="zstd-compressed") as refused:
        expand_log_paths([str(packed)], flag="--log")
    assert refused.value.field == "--log" and "zstd -dc" in (refused.value.fix or "")


@pytest.mark.parametrize("compress", [gzip.compress, lzma.compress, bz2.compress], ids=["gzip", "xz", "bzip2"])
def test_a_compressed_log_on_stdin_is_read_as_the_same_file_is(monkeypatch: pytest.MonkeyPatch, compress: object):
    """`cat run.log.gz | megapilot diagnose -` (or over ssh): judged and read on what it holds, twice if asked."""
    assert callable(compress)
    _stdin(monkeypatch, compress(LINES.encode()))
    assert expand_log_paths(["-"], flag="--log") == ["-"]
    with stdin_read_again():
        first = parse_logs(["-"], summary_only=True)
        again = parse_logs(["-"])
    assert first.summary.iterations_counted == again.summary.iterations_counted == 20


def test_zstd_on_stdin_is_refused_naming_its_format(monkeypatch: pytest.MonkeyPatch):
    _stdin(monkeypatch, b"\x28\xb5\x2f\xfd" + bytes(range(256)) * 4)
    with pytest.raises(MegapilotError, match="<stdin> is zstd-compressed") as refused:
        expand_log_paths(["-"], flag="--log")
    assert refused.value.field == "--log" and "zstd -dc" in (refused.value.fix or "")
