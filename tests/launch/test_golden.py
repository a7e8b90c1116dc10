"""Golden launch scripts: five models x torchrun/SLURM/Primus, compared byte for byte.

Regenerate after an intended change with MEGAPILOT_UPDATE_GOLDEN=1 and review the diff.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from megapilot.launch import render_launch
from tests.launch.golden_cases import LAUNCHERS, golden_options
from tests.launch.plans import GOLDEN_PLANS

GOLDEN_DIR = Path(__file__).parent / "golden"
UPDATE = os.environ.get("MEGAPILOT_UPDATE_GOLDEN") == "1"
CASES = [(case, launcher) for case in GOLDEN_PLANS for launcher in LAUNCHERS]


def _render(case: str, launcher: str) -> str:
    return render_launch(GOLDEN_PLANS[case], golden_options(case, launcher)).script


@pytest.mark.parametrize(("case", "launcher"), CASES, ids=[f"{c}-{launcher}" for c, launcher in CASES])
def test_script_matches_golden_file(case: str, launcher: str) -> None:
    golden = GOLDEN_DIR / f"{case}.{launcher}.sh"
    script = _render(case, launcher)
    if UPDATE:
        golden.write_text(script)
    assert golden.is_file(), f"missing {golden}; run with MEGAPILOT_UPDATE_GOLDEN=1"
    assert script == golden.read_text()


def test_every_golden_file_belongs_to_a_case() -> None:
    expected = {f"{case}.{launcher}.sh" for case, launcher in CASES}
    assert {p.name for p in GOLDEN_DIR.glob("*.sh")} == expected


def test_golden_scripts_pass_bash_syntax_check() -> None:
    for path in sorted(GOLDEN_DIR.glob("*.sh")):
        result = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert result.returncode == 0, f"{path.name}: {result.stderr}"


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck not installed (setup.sh installs it)")
def test_golden_scripts_pass_shellcheck() -> None:
    paths = [str(p) for p in sorted(GOLDEN_DIR.glob("*.sh"))]
    result = subprocess.run(["shellcheck", "--severity=style", *paths], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout
