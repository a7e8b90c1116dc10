"""The CLI as a shell meets it: --version, examples on every group's help, one-line usage errors with exit 2, and
a closed pipe (`megapilot plan | head`) ending quietly with exit 0."""

from __future__ import annotations

import subprocess
import sys

import pytest

from megapilot import __version__


def test_version(cli):
    result = cli("--version")
    assert result.exit_code == 0 and result.stdout.strip() == f"megapilot {__version__}"


@pytest.mark.parametrize(("group", "example"), [
    ((), "megapilot plan --model llama3.1-70b --gpu h100 --gpus 64"),
    (("suite",), "megapilot suite init tiny-local -o suite.json"),
    (("history",), "megapilot history show RUN_ID"),
])
def test_group_help_pages_show_examples(cli, group: tuple[str, ...], example: str):
    result = cli(*group, "--help")
    assert result.exit_code == 0
    flat = " ".join(result.stdout.split())
    assert "Examples:" in flat and example in flat


@pytest.mark.parametrize(("args", "message"), [
    (("plna",), "error: No such command 'plna'. Did you mean 'plan'? — see megapilot --help"),
    (("estimate", "--gpus", "x"), "error: Invalid value for '--gpus'"),
])
def test_usage_errors_are_one_line_with_exit_2(cli, args: tuple[str, ...], message: str):
    result = cli(*args)
    assert result.exit_code == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(message)
    assert "╭" not in result.stderr and "Usage:" not in result.stderr


@pytest.mark.parametrize("extra", [(), ("--json",)])
def test_a_closed_pipe_ends_quietly_with_exit_0(extra: tuple[str, ...]):
    command = [sys.executable, "-m", "megapilot", "plan", "--model", "llama3.1-70b", "--gpu", "h100", "--gpus", "64",
               *extra]
    plan = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert plan.stdout is not None
    plan.stdout.readline()
    plan.stdout.close()  # `| head -1`
    assert plan.wait(timeout=120) == 0
    assert plan.stderr is not None and b"Error" not in plan.stderr.read()


def test_a_missing_suite_field_says_which_and_how_to_add_it(cli, tmp_path):
    config = tmp_path / "suite.json"
    config.write_text('{"name": "x"}')
    result = cli("suite", "check", str(config))
    assert result.exit_code != 0
    text = result.stdout + result.stderr
    assert "gpu_name: Field required — fix: add `gpu_name`" in text
    assert "type or spelling" not in text
