"""The Megatron-LM release a log was written by: from its arguments block, else from its line format."""

from __future__ import annotations

import pytest

from megapilot.diagnose.megatron_version import recognise_megatron_version
from megapilot.launch.megatron_args import committed_releases, flag_table
from megapilot.logs.collect import parse_text

# What validate_args adds to the namespace before `_print_args` (not parser options).
_DERIVED = ("world_size", "data_parallel_size", "padded_vocab_size", "params_dtype", "rank")
_ITERATION = ("iteration       10/      50 | consumed samples:         1280 | "
              "elapsed time per iteration (ms): 9070.1 | "
              "learning rate: 1.500000E-04 | global batch size:   128 | lm loss: 7.123456E+00 | loss scale: 1.0 | "
              "grad norm: 2.345 | number of skipped iterations:   0 | number of nan iterations:   0 |")


def _arguments_block(release: str, *, drop: int = 0) -> str:
    """The block Megatron-LM's `_print_args` prints at start-up: every destination of the release's parser."""
    names = sorted({f.dest for f in flag_table(release).flags.values()} | set(_DERIVED), key=str.lower)
    names = names[drop:]
    lines = ["------------------------ arguments ------------------------"]
    lines += [f"  {name} {'.' * max(48 - len(name), 0)} None" for name in names]
    lines.append("-------------------- end of arguments ---------------------")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("release", committed_releases())
def test_the_arguments_block_tells_its_release_exactly(release: str) -> None:
    log = parse_text(_arguments_block(release) + f" [2026-01-01 00:10:00] {_ITERATION}\n")
    version = recognise_megatron_version(log)
    assert version is not None and (version.release, version.source, version.exact) == (release, "arguments", True)


def test_a_block_cut_short_still_names_the_closest_release_but_not_exactly() -> None:
    version = recognise_megatron_version(parse_text(_arguments_block("core_v0.15.0", drop=40)))
    assert version is not None and version.release == "core_v0.15.0" and not version.exact
    assert "40 of core_v0.15.0's options not printed" in version.detail


@pytest.mark.parametrize(("stamp", "release"), [("2026-01-01 00:10:00.123456", "core_v0.19.0"),
                                                 ("2026-01-01 00:10:00", "core_v0.15.0")])
def test_without_a_block_the_timestamp_format_tells_the_era(stamp: str, release: str) -> None:
    version = recognise_megatron_version(parse_text(f" [{stamp}] {_ITERATION}\n"))
    assert version is not None and (version.release, version.source) == (release, "format")


def test_a_log_with_neither_recognises_nothing() -> None:
    assert recognise_megatron_version(parse_text("step 10 loss 2.3\n")) is None
