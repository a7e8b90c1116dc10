"""The README's answered examples (a ``` block opening with `$ megapilot ...`) are what the command prints today:
every line the README shows, other than a table's rows and the `...` that marks a cut, is a line of the output
(compared without the indentation a table's centred title takes from the terminal's width)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

README = Path(__file__).parents[1] / "README.md"
TABLE_CHARS = "┏┃┡│└┗━"


def answered_examples() -> list[tuple[list[str], list[str]]]:
    """(the command's arguments after `megapilot`, the output lines the README shows) for each answered example."""
    examples = []
    for block in re.findall(r"```\n(\$ megapilot .*?)```", README.read_text(encoding="utf-8"), flags=re.DOTALL):
        lines = block.splitlines()
        command = lines[0].removeprefix("$ ")
        rest = lines[1:]
        while command.endswith("\\"):  # the command continues on the next line
            command = command[:-1] + " " + rest.pop(0).strip()
        shown = [line.strip() for line in rest
                 if line.strip() and line.strip() != "..." and line.lstrip()[0] not in TABLE_CHARS]
        examples.append((shlex.split(command)[1:], shown))
    return examples


EXAMPLES = answered_examples()


def test_the_readme_has_answered_examples():
    assert len(EXAMPLES) >= 2  # the planner's and the time-to-train's


@pytest.mark.parametrize(("args", "shown"), EXAMPLES, ids=[" ".join(args[:3]) for args, _ in EXAMPLES])
def test_each_line_the_readme_shows_is_printed(cli, args: list[str], shown: list[str]):
    result = cli(*args)
    assert result.exit_code == 0, result.stderr
    printed = {line.strip() for line in (result.stdout + result.stderr).splitlines()}
    missing = [line for line in shown if line not in printed]
    assert not missing, "README lines the command no longer prints (rerun it and paste):\n" + "\n".join(missing)
