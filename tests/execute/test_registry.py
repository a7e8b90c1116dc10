"""Executors as plug-ins: one new module registers an executor that the suite and the CLI then use, and no
code outside megapilot/execute compares an executor's name."""

from __future__ import annotations

import ast
import json
import textwrap
from pathlib import Path

import pytest

import megapilot.execute as execute_package
from megapilot.errors import MegapilotError
from megapilot.execute import registry
from megapilot.execute.base import Capabilities, Executor

PACKAGE_ROOT = Path(__file__).resolve().parents[2] / "megapilot"

# One file, as a user or a future contributor would write it: a sandboxed variant of the local executor that
# says its jobs run elsewhere (so the suite neither checks paths here nor downloads a tokenizer here).
SANDBOX_MODULE = textwrap.dedent('''
    from typing import ClassVar

    from megapilot.execute.base import Capabilities
    from megapilot.execute.local import LocalExecutor
    from megapilot.execute.registry import register_executor


    @register_executor
    class SandboxExecutor(LocalExecutor):
        name: ClassVar[str] = "sandbox"
        capabilities: ClassVar[Capabilities] = Capabilities(
            launcher="torchrun", runs_here=False, shares_file_system=True, needs_node_list=False, multi_node=False,
            starts_containers=False, allocates_resources=False, summary="torchrun in a sandbox")
''')


@pytest.fixture
def sandbox_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The one file, in a folder the executor package also searches; the registry as it was afterwards."""
    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / "sandbox_executor.py").write_text(SANDBOX_MODULE)
    monkeypatch.setattr(execute_package, "__path__", [*execute_package.__path__, str(folder)])
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    registry.rediscover()
    yield "sandbox"
    monkeypatch.undo()
    registry.rediscover()


def test_the_built_in_executors_register_with_their_capabilities() -> None:
    assert {"local", "slurm", "ssh"} <= set(registry.executor_names())
    for name in registry.executor_names():
        cls = registry.executor_class(name)
        assert cls.name == name and isinstance(cls.capabilities, Capabilities)
    assert registry.capabilities("slurm").allocates_resources and registry.capabilities("slurm").launcher == "slurm"
    assert registry.capabilities("ssh").needs_node_list and not registry.capabilities("ssh").runs_here
    assert registry.capabilities("local").runs_here and not registry.capabilities("local").multi_node


def test_an_unknown_executor_is_a_user_error_listing_the_known_ones() -> None:
    with pytest.raises(MegapilotError) as caught:
        registry.executor_class("kubernetes")
    assert caught.value.field == "executor" and "local" in (caught.value.fix or "")


def test_a_new_executor_registers_from_one_file_and_the_suite_and_cli_use_it(sandbox_module: str, tmp_path: Path,
                                                                            cli) -> None:
    from megapilot.suite.config import check_suite
    from megapilot.suite.executors import make_executor
    from megapilot.suite.render import render_cells
    from megapilot.suite.templates import template_path

    assert sandbox_module in registry.executor_names()
    executor = registry.make_executor(sandbox_module)
    assert isinstance(executor, Executor) and executor.name == "sandbox"

    config = json.loads(template_path("tiny-local").read_text())
    config["megapilot"]["executor"] = "sandbox"
    config["threshold_json"] = str(template_path("tiny-local").with_name("tiny-local_threshold.json"))
    (tmp_path / "suite.json").write_text(json.dumps(config))
    check = check_suite(tmp_path / "suite.json")
    assert check.ok, check.problems
    suite = check.suite
    assert suite is not None and suite.capabilities.summary == "torchrun in a sandbox"
    assert make_executor(suite).name == "sandbox"
    launches = render_cells(suite, tmp_path / "rendered")
    assert launches and all(launch.runnable and "torch.distributed.run" in launch.script_text for launch in launches)

    script = tmp_path / "hello.sh"
    script.write_text("echo 'iteration        1/       1 |'\n")
    done = cli("run", str(script), "--executor", "sandbox", "--run-dir", str(tmp_path / "runs"), "--json")
    assert done.exit_code == 0, done.stderr
    assert done.json()["executor"] == "sandbox" and done.json()["state"] == "COMPLETED"


def _executor_name_comparisons(root: Path, names: set[str]) -> list[str]:
    """`x.executor == "slurm"`, `executor in ("ssh", "local")` and the like, anywhere outside root/execute."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.relative_to(root).parts[0] == "execute":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            text = " ".join(ast.unparse(side) for side in sides)
            constants = {c.value for side in sides for c in ast.walk(side) if isinstance(c, ast.Constant)}
            if "executor" in text.lower() and constants & names:
                found.append(f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_executor_name_is_compared_outside_the_execute_package() -> None:
    assert _executor_name_comparisons(PACKAGE_ROOT, set(registry.executor_names())) == []


def test_the_name_check_finds_the_comparisons_the_suite_used_to_make(tmp_path: Path) -> None:
    (tmp_path / "suite").mkdir()
    (tmp_path / "execute").mkdir()
    (tmp_path / "suite" / "render.py").write_text('launcher = "slurm" if suite.executor == "slurm" else "torchrun"\n'
                                                  'ok = suite.executor in ("ssh", "local")\n')
    (tmp_path / "execute" / "slurm.py").write_text('same = handle.executor == "slurm"\n')
    found = _executor_name_comparisons(tmp_path, {"local", "slurm", "ssh"})
    assert sorted(tuple(line.split(":")[:2]) for line in found) == [("suite/render.py", "1"), ("suite/render.py", "2")]
