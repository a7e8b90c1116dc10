"""Every command's help ends with real examples that parse against that command, and shows flags as flags."""

from __future__ import annotations

import re
import shlex

import pytest
import typer
from typer.testing import CliRunner

from megapilot.cli.app import app
from megapilot.cli.help_examples import EXAMPLES


def _commands() -> dict[str, object]:
    """Every leaf command of the app by its path below `megapilot` ("estimate", "suite run", ...)."""
    import typer.main

    found: dict[str, object] = {}

    def walk(command: object, path: tuple[str, ...]) -> None:
        children = getattr(command, "commands", None)
        if children:
            for name, child in children.items():
                walk(child, (*path, name))
        else:
            found[" ".join(path)] = command

    walk(typer.main.get_command(app), ())
    return found


def test_every_command_has_one_to_three_examples_and_no_example_is_orphaned():
    commands = _commands()
    assert set(EXAMPLES) == set(commands)
    assert all(1 <= len(examples) <= 3 for examples in EXAMPLES.values())


@pytest.mark.parametrize(("path", "example"), [(path, ex) for path, examples in EXAMPLES.items() for ex in examples])
def test_each_example_parses_against_its_command(path, example):
    """The example's words after `megapilot <path>` are parsed by the command itself: an example naming a flag
    the command does not have, or leaving out a required one, fails here."""
    words = shlex.split(example.replace("\\\n", " "))  # a `\` continuation joins its lines, as in a shell
    assert words[: 1 + len(path.split())] == ["megapilot", *path.split()]
    command = _commands()[path]
    context = command.make_context(path, words[1 + len(path.split()):])  # raises a usage error on a bad example
    assert context.params is not None


@pytest.mark.parametrize("path", ["estimate", "plan", "suite run", "data prepare"])
def test_help_ends_with_the_examples(cli, path):
    result = cli(*path.split(), "--help")
    assert result.exit_code == 0
    flat = " ".join(result.stdout.split())  # help wraps long lines at the terminal's width
    assert "Examples:" in flat
    for example in EXAMPLES[path]:
        assert " ".join(example.replace("\\\n", " ").split()) in flat.replace("\\ ", "")


def test_flags_are_shown_without_a_value_type_and_required_options_are_marked(cli):
    plan_help = cli("plan", "--help").stdout
    json_line = next(line for line in plan_help.splitlines() if "--json" in line)
    assert "<bool>" not in json_line  # `--json` is a flag, not `--json <bool>`
    assert "<int>" in next(line for line in plan_help.splitlines() if "--gpus " in line)
    assert "[required]" in plan_help and "[default: 4096]" in plan_help
    estimate_help = " ".join(cli("estimate", "--help").stdout.split())
    for flag in ("--model", "--gpu", "--gpus", "--gbs", "--seq-len"):
        assert re.search(rf"{flag}(,--[\w-]+)* <\w+> Required \(unless --batch\)", estimate_help), flag
    assert not re.search(r"--tp <\w+> Required", estimate_help)


def test_json_is_a_plain_flag_that_takes_no_value(cli):
    assert cli("gpus", "--json").exit_code == 0
    refused = cli("gpus", "--json", "true")
    assert refused.exit_code == 2  # an extra argument, as for any flag



def test_multi_line_examples_keep_their_indentation_and_brackets(monkeypatch):
    """Each example line keeps its own indentation under the heading, continuation lines included, and `[...]`
    prints as typed rather than being read as rich markup."""
    import megapilot.cli.help_examples as help_examples

    written = ("megapilot demo --mount /data:/data \\\n    --name [job] \\\n        --deep", "megapilot demo")
    monkeypatch.setitem(help_examples.EXAMPLES, "demo", written)
    app = typer.Typer()

    @app.command("demo", epilog=help_examples.epilog("demo"))
    def demo(mount: str = "", name: str = "", deep: bool = False) -> None:
        """A command."""

    result = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    lines = [line.rstrip() for line in result.output.splitlines()]
    heading = next(i for i, line in enumerate(lines) if line.strip() == "Examples:")
    margin = lines[heading].index("Examples:")
    shown = [line[margin:] for line in lines[heading + 1: heading + 5]]
    assert shown == ["  megapilot demo --mount /data:/data \\", "      --name [job] \\", "          --deep",
                     "  megapilot demo"]


# Examples that need no file of the user's and run in about a second: they must run, not only parse.
RUNNABLE = ("gpus", "models", "estimate", "plan")


@pytest.mark.parametrize("example", [ex for path in RUNNABLE for ex in EXAMPLES[path]
                                     if "--batch" not in ex and "--measure-host" not in ex])
def test_each_self_contained_example_runs(example, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # where `--save plan.json` lands
    words = shlex.split(example.replace("\\\n", " "))
    result = CliRunner().invoke(app, words[1:])
    assert result.exit_code == 0, result.output
