"""A small or filling file system under the run directory: a FAIL naming the path, the free space and what was
being written, never `internal error`; no temporary file left behind; nothing printed read as markup.

Uses a real tmpfs (mounting needs root; skipped with the reason otherwise).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults.helpers import fault_env, megapilot_argv, tiny_suite, wait_for_iteration, wait_until_gone
from tests.tmpfs import small_tmpfs


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    with small_tmpfs(tmp_path, "2m") as mount:
        yield mount


def _temporary_files(root: Path) -> list[Path]:
    return [p for p in root.rglob(".*.tmp")]


def test_a_2_mb_output_disk_fails_preflight_and_prints_its_path_literally(tmp_path: Path, small_fs: Path) -> None:
    config = tiny_suite(tmp_path)
    done = subprocess.run(megapilot_argv("suite", "run", str(config), "--out", str(small_fs / "runs"),
                                         "--no-history"), capture_output=True, text=True, timeout=300,
                          env=fault_env(tmp_path), check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 1, output[-3000:]
    assert "internal error" not in output and "MarkupError" not in output
    assert "disk.free_gib" in output and str(small_fs) in output
    (run_dir,) = (small_fs / "runs").iterdir()
    for name in ("suite.json", "megatron_run_deck.json", "junit.xml"):
        assert (run_dir / name).is_file(), name
    # the HTML (plotly inlined, MiBs) may not fit: then the verdict says so, with the free space and the size
    assert (run_dir / "report.html").is_file() or "report not written: no space left" in output
    assert _temporary_files(small_fs) == []


@pytest.mark.slow
def test_a_disk_that_fills_during_smoke_fails_it_with_the_reason(tmp_path: Path) -> None:
    mount = tmp_path / "filling"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mount)], capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or 'mount failed'}): needs root")
    try:
        config = tiny_suite(tmp_path)
        out = mount / "runs"
        head = subprocess.Popen(megapilot_argv("suite", "run", str(config), "--out", str(out), "--stage", "smoke",
                                               "--no-history"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=fault_env(tmp_path))
        deadline = time.monotonic() + 120
        while not list(out.glob("*/smoke/out-node0/training.log")) and time.monotonic() < deadline:
            time.sleep(0.1)
        run_dir = next(out.glob("*"))
        wait_for_iteration(run_dir / "smoke" / "out-node0" / "training.log")
        subprocess.run(["dd", "if=/dev/zero", f"of={mount / 'filler'}", "bs=1M"], capture_output=True, check=False)
        stdout, stderr = head.communicate(timeout=300)
        output = stdout + stderr
        assert head.returncode == 1, output[-3000:]
        assert "internal error" not in output and "Traceback" not in output
        assert "no space left" in output and "free" in output, output[-3000:]
        assert wait_until_gone(run_dir, within_s=15) == []
        assert _temporary_files(mount) == []
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
