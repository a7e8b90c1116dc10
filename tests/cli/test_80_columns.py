"""At 80 columns (COLUMNS=80, TERMINAL_WIDTH=80, as a small terminal sets them) no table cell and no help entry is
cut to `…`: tables fold their cells or turn into one block per row, help tables fold long option names. Every
command's help page and the tables of gpus, models, suite templates and plan are rendered."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from megapilot.cli.help_examples import EXAMPLES

ROOT = Path(__file__).resolve().parents[2]
RENDER = """
import contextlib, io, json, sys
from megapilot.cli.app import main
outputs = {}
for args in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(args)
        except SystemExit:
            pass
    outputs[" ".join(args)] = out.getvalue() + err.getvalue()
print(json.dumps(outputs))
"""
TABLES = [["gpus"], ["models"], ["suite", "templates"],
          ["plan", "--model", "llama3.1-8b", "--gpu", "h100", "--gpus", "8", "--top", "2"]]


def _render(commands: list[list[str]]) -> dict[str, str]:
    env = {**os.environ, "COLUMNS": "80", "TERMINAL_WIDTH": "80", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", RENDER, json.dumps(commands)], capture_output=True, text=True,
                          env=env, cwd=ROOT, check=True, timeout=300)
    return json.loads(done.stdout)


def test_no_cell_is_cut_at_80_columns():
    helps = [[], ["suite"], ["history"], *([*path.split(), "--help"] for path in EXAMPLES)]
    outputs = _render(TABLES + [[*words, "--help"] if words and words[-1] != "--help" else words or ["--help"]
                                for words in helps])
    assert len(outputs) == len(TABLES) + len(helps)
    cut = {command: [line for line in text.splitlines() if "…" in line] for command, text in outputs.items()}
    assert {command: lines for command, lines in cut.items() if lines} == {}
    assert all(text.strip() for text in outputs.values())
    # the names a user types stay whole
    assert "llama3.1-8b-single" in outputs["suite templates"] and "A100-SXM4-80GB" in outputs["gpus"]
    assert "16384" in outputs["models"]
