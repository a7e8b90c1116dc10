"""trainer.collectives: the probe's command line and message sizes (a real multi-rank run of the probe is in
tests/e2e/test_node_stragglers.py)."""

from __future__ import annotations

import argparse

import pytest

from megapilot.trainer.collectives import PROBED, _options, _size, _sizes


@pytest.mark.parametrize(("text", "count"), [("1024", 1024), ("64K", 65536), ("4m", 4 << 20), ("1G", 1 << 30),
                                             ("0.5K", 512)])
def test_sizes_are_read_like_nccl_tests_takes_them(text, count):
    assert _size(text) == count


def test_a_size_that_is_no_size_says_how_to_write_one():
    with pytest.raises(argparse.ArgumentTypeError, match=r"write e\.g\. 1024, 64K, 4M"):
        _size("lots")


def test_every_collective_is_probed_unless_told_otherwise():
    options = _options([])
    assert options.collectives.split(",") == list(PROBED)
    assert (options.min_bytes, options.max_bytes, options.step_factor) == (4096, 4 << 20, 4)


@pytest.mark.parametrize("argv", [["--collectives", "all_reduce,broadcast"], ["-b", "32"], ["-b", "1M", "-e", "1K"],
                                  ["-f", "1"]])
def test_a_probe_that_cannot_run_is_refused_before_any_rank_starts(argv, capsys):
    with pytest.raises(SystemExit) as caught:
        _options(argv)
    assert caught.value.code == 2 and "megapilot.trainer.collectives" in capsys.readouterr().err


def test_each_size_is_a_whole_number_of_floats_per_rank_and_sizes_are_unique():
    options = _options(["-b", "64", "-e", "1K", "-f", "2"])
    assert _sizes(options, ranks=2) == [64, 128, 256, 512, 1024]
    # 3 ranks: 64 B rounds down to 5 floats each (60 B); sizes that round to the same count appear once
    three = _sizes(options, ranks=3)
    assert three == sorted(set(three)) and all(size % (4 * 3) == 0 for size in three) and three[0] == 60
    assert _sizes(_options(["-b", "64", "-e", "64"]), ranks=64) == [256]  # at least one float per rank
