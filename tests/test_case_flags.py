"""The required case flags: one list, known to build_case, importable without loading the specs."""

from __future__ import annotations

import subprocess
import sys

from megapilot.case_flags import REQUIRED_FLAGS
from megapilot.estimate.cases import KNOWN_FLAGS


def test_every_required_flag_is_a_build_case_flag():
    assert REQUIRED_FLAGS and set(REQUIRED_FLAGS) <= KNOWN_FLAGS


def test_importing_it_loads_nothing_else_of_megapilot():
    probe = "import sys, megapilot.case_flags; print(' '.join(m for m in sys.modules if m.startswith('megapilot')))"
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                            timeout=60).stdout.split()
    assert set(loaded) <= {"megapilot", "megapilot.errors", "megapilot.case_flags"}  # the package's own init
