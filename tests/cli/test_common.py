"""The consoles off a terminal: a pipe, a file or a CI log gets every character and no colour codes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from megapilot.cli.common import PIPED_WIDTH, OutputConsole


def _piped(*args: str) -> str:
    """`megapilot ARGS | cat`: the installed command with stdout a pipe, in a clean environment."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "FORCE_COLOR", "TTY_COMPATIBLE")}
    result = subprocess.run([sys.executable, "-m", "megapilot", *args], capture_output=True, text=True, env=env,
                            timeout=60, check=True)
    return result.stdout


@pytest.mark.parametrize("args", [("gpus",), ("suite", "templates")])
def test_piped_tables_are_not_cut_and_carry_no_colour(args):
    out = _piped(*args)
    assert "…" not in out and "\x1b[" not in out
    if args == ("gpus",):
        assert "hopper" in out and "H100-SXM5-80GB" in out  # cut to "hopp…" and "H100…" at 80 columns
        widest = max(len(line) for line in out.splitlines())
        assert 80 < widest < PIPED_WIDTH  # as wide as the table, not padded to the console width


def test_a_terminal_keeps_its_width_and_columns_wins(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    assert OutputConsole(force_terminal=True, width=100).width == 100
    assert OutputConsole(force_terminal=False).width == PIPED_WIDTH
    monkeypatch.setenv("COLUMNS", "90")
    assert OutputConsole(force_terminal=False).width == 90
