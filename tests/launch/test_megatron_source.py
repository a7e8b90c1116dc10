"""The static reader of a checkout's arguments.py gives the table the extractor committed, without Megatron."""

from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from megapilot.errors import MegapilotError
from megapilot.launch.megatron_args import committed_releases, flag_table
from megapilot.launch.megatron_source import read_checkout_table, read_checkout_version

SOURCES = Path(__file__).parent / "data" / "megatron_sources"


def _checkout(release: str, into: Path) -> Path:
    """The committed source files of `release`, unpacked at their paths in a Megatron-LM checkout."""
    root = into / release
    with tarfile.open(SOURCES / f"{release}.tar.xz") as archive:
        archive.extractall(root, filter="data")
    return root


def test_every_committed_table_has_its_source_files() -> None:
    assert sorted(p.name.removesuffix(".tar.xz") for p in SOURCES.glob("*.tar.xz")) == list(committed_releases())


@pytest.mark.parametrize("release", committed_releases())
def test_static_read_of_a_release_gives_the_table_the_extractor_committed(release: str, tmp_path: Path) -> None:
    read = read_checkout_table(_checkout(release, tmp_path))
    committed = flag_table(release)
    assert read.version[:2] == committed.version[:2]
    assert read.commit is None and read.origin.endswith("megatron/training/arguments.py")
    assert sorted(read.flags) == sorted(committed.flags)
    differing = [name for name in committed.flags if read.flags[name] != committed.flags[name]]
    assert differing == []


def test_reading_a_checkout_imports_neither_megatron_nor_torch(tmp_path: Path) -> None:
    root = _checkout("core_v0.16.0", tmp_path)
    code = (
        "import sys; sys.modules['torch'] = None; sys.modules['megatron'] = None\n"
        "from pathlib import Path\n"
        "from megapilot.launch.megatron_source import read_checkout_table\n"
        f"table = read_checkout_table(Path({str(root)!r}))\n"
        "print(table.release, len(table.flags))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["core_v0.16.0", str(len(flag_table("0.16").flags))]


def test_a_local_patch_to_arguments_py_is_seen(tmp_path: Path) -> None:
    """The point of reading the checkout: its own parser, patches included, not the release's table."""
    root = _checkout("core_v0.15.0", tmp_path)
    arguments = root / "megatron/training/arguments.py"
    text = arguments.read_text()
    anchor = "    group.add_argument('--lr-wsd-decay-style'"
    assert anchor in text
    knob = "    group.add_argument('--site-local-knob', type=int, choices=range(0, 3))\n"
    arguments.write_text(text.replace(anchor, knob + anchor, 1))
    table = read_checkout_table(root)
    assert table.flags["--site-local-knob"].choices == ("0", "1", "2")
    assert "--site-local-knob" not in flag_table("0.15").flags


def test_version_comes_from_package_info(tmp_path: Path) -> None:
    info = tmp_path / "megatron/core/package_info.py"
    info.parent.mkdir(parents=True)
    info.write_text("MAJOR = 0\nMINOR = 17\nPATCH = 2\nPRE_RELEASE = 'rc1'\n")
    assert read_checkout_version(tmp_path) == (0, 17, 2)


def test_a_folder_that_is_not_a_checkout_is_refused(tmp_path: Path) -> None:
    with pytest.raises(MegapilotError, match=r"package_info.py does not exist") as info:
        read_checkout_table(tmp_path)
    assert info.value.field == "megatron_path"
