"""Node scripts run with the jobs' environment: what the jobs' PATH finds is what preflight reads."""

from __future__ import annotations

import subprocess
from pathlib import Path

from megapilot.suite.nodes import env_exports
from megapilot.suite.preflight import PROBE_SCRIPT, parse_probe

DATA = Path(__file__).resolve().parents[1] / "data" / "nodes"


def test_the_probe_runs_the_dmesg_the_jobs_path_finds(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "dmesg").write_text(f"#!/bin/sh\ncat {DATA / 'fake_dmesg_xid79.txt'}\n")  # a named fake
    (bin_dir / "dmesg").chmod(0o755)
    exports = env_exports({"PATH": f"{bin_dir}:/usr/bin:/bin", "QUOTED": "a 'b' $(touch pwned)", "bad-name": "x"})
    assert "bad-name" not in exports
    out = subprocess.run(["bash", "-s"], input=exports + 'printf "quoted=%s\\n" "$QUOTED"\n' + PROBE_SCRIPT,
                         text=True, capture_output=True, check=True, cwd=tmp_path,
                         env={"PATH": "/usr/bin:/bin"}).stdout
    assert "quoted=a 'b' $(touch pwned)" in out and not (tmp_path / "pwned").exists()  # values arrive, unexpanded
    probe = parse_probe(1, out)
    assert probe.kernel_readable and any("Xid" in line and "79" in line for line in probe.kernel_lines)
