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


@pytest.mark.parametrize(("line", "release", "exact"), [
    ("megatron.core.__version__: 0.16.1", "core_v0.16.0", True),  # `python -c "import megatron.core; print(...)"`
    ("megatron-core==0.14.0", "core_v0.14.0", True),  # pip freeze in a job's preamble
    ("[rank0]: Megatron-Core version: 0.17.0rc0", "core_v0.17.0", True),
    ("Detected Megatron version: 0.15.2", "core_v0.15.0", True),  # a launcher naming the version it found
    ("megatron-core==0.20.1", "core_v0.19.0", False),  # newer than every committed table: the newest below it
])
def test_a_stated_megatron_core_version_names_its_release(line: str, release: str, exact: bool) -> None:
    """A stated version wins over the arguments block and the line format (it says it outright)."""
    log = parse_text(f"{line}\n" + _arguments_block("core_v0.19.0") + f" [2026-01-01 00:10:00] {_ITERATION}\n")
    version = recognise_megatron_version(log)
    assert version is not None and (version.release, version.source, version.exact) == (release, "version line", exact)
    assert "printed at" in version.detail


def test_a_container_not_in_the_table_is_named_but_tells_no_release() -> None:
    """25.02's component table was not found: its name is reported, no release is guessed from it (nor from a
    Megatron-Bridge version that no container ships as such)."""
    banner = ("=====================\n== NeMo Framework ==\n=====================\n\n"
              "NVIDIA Release 25.02 (build 139463421)\n")
    log = parse_text(banner + "megatron_bridge version 0.1.0\nnot a version: nvidia release notes\n")
    assert recognise_megatron_version(log) is None
    from megapilot.diagnose.megatron_version import release_lines

    assert release_lines(log) == ["megatron-bridge 0.1.0", "nemo-container 25.02"]


@pytest.mark.parametrize(("text", "release", "exact"), [
    ("docker run --gpus all nvcr.io/nvidia/nemo:25.09 bash train.sh", "core_v0.14.0", True),
    ("image: nvcr.io/nvidia/nemo:25.11.01", "core_v0.15.0", True),  # a patch tag: its YY.MM release
    ("== NeMo Framework ==\nNVIDIA Release 26.02 (build 1)", "core_v0.16.0", True),  # the container's banner
    ("srun --container-image=nvcr.io/nvidia/nemo:26.04 python pretrain.py", "core_v0.17.0", True),
    ("megatron-bridge==0.2.0", "core_v0.15.0", True),  # the Bridge 25.11 ships
    ("nvcr.io/nvidia/nemo:24.09", "core_v0.14.0", False),  # megatron-core 0.9.0: older than every flag table
])
def test_a_nemo_container_tells_the_core_release_it_ships(text: str, release: str, exact: bool) -> None:
    """A log naming only its container (or Megatron-Bridge version) gets the flag names of the megatron-core that
    container ships; the container wins over the line format, a stated core version or arguments block over it."""
    log = parse_text(f"{text}\n [2026-01-01 00:10:00.123456] {_ITERATION}\n")
    version = recognise_megatron_version(log)
    assert version is not None and (version.release, version.source, version.exact) == (release, "container", exact)
    assert "component table" in version.detail
    stated = recognise_megatron_version(parse_text(f"{text}\nmegatron-core==0.18.0\n"))
    assert stated is not None and (stated.release, stated.source) == ("core_v0.18.0", "version line")
    block = recognise_megatron_version(parse_text(f"{text}\n" + _arguments_block("core_v0.19.0")))
    assert block is not None and (block.release, block.source) == ("core_v0.19.0", "arguments")


def test_an_unknown_container_still_says_so_in_the_diagnosis() -> None:
    from megapilot.diagnose.engine import diagnose_log

    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
    unknown = diagnose_log(parse_text("docker pull nvcr.io/nvidia/nemo:25.04\n" + oom), None)
    assert unknown.to_dict()["megatron_version"] is None
    assert any("it names nemo-container 25.04, not its megatron-core version" in note.text for note in unknown.notes)
    known = diagnose_log(parse_text("docker pull nvcr.io/nvidia/nemo:25.09\n" + oom), None)
    said = [note.text for note in known.notes]
    assert "fixes use the flag names of Megatron-LM core_v0.14.0 (told by the log's container)" in said


def test_the_container_table_is_one_row_per_container_with_versions_that_parse() -> None:
    from megapilot.diagnose.megatron_version import NEMO_CONTAINERS, nemo_container
    from megapilot.launch.megatron_args import parse_version

    tags = [container.tag for container in NEMO_CONTAINERS]
    assert tags == sorted(set(tags))
    for container in NEMO_CONTAINERS:
        assert parse_version(container.megatron_core) and nemo_container(container.tag) == container
    assert nemo_container("25.04") is None and nemo_container("25.091") is None
