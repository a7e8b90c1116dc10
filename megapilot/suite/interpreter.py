"""Preflight of the interpreter: the Python the launch scripts start, asked on every node what it can import.

A node whose interpreter lacks torch (or Megatron-Core, or megapilot for the embedded trainer) would start
every job only for it to die on its first line; here it fails preflight instead, naming the node, the
interpreter and the missing module. Inside a container the image brings its own Python: nothing to ask here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from megapilot.suite.results import MetricRow, Verdict

if TYPE_CHECKING:
    from megapilot.execute.base import Executor
    from megapilot.suite.config import LoadedSuite

# `$1` the interpreter, the rest the modules; one `key=value` line per finding (a heredoc: no quoting to get wrong).
INTERPRETER_PROBE = r"""py=$1
shift
if ! command -v "$py" >/dev/null 2>&1; then echo "missing=$py: no such interpreter on $(hostname)"; exit 0; fi
"$py" - "$@" <<'MEGAPILOT_PROBE'
import importlib
import importlib.metadata
import platform
import sys

print(f"python={sys.executable} {platform.python_version()}")
for name in sys.argv[1:]:
    try:
        module = importlib.import_module(name)
    except Exception as exc:  # any import failure is the finding
        print(f"missing={name}: {type(exc).__name__}: {' '.join(str(exc).split())}")
        continue
    version = getattr(module, "__version__", None)
    if version is None:
        try:
            version = importlib.metadata.version(name.replace(".", "-"))
        except importlib.metadata.PackageNotFoundError:
            version = "?"
    print(f"module={name} {version}")
MEGAPILOT_PROBE
"""
FIX = ("set megapilot.python to an interpreter that has them on every node (e.g. a virtual environment with "
       "`pip install 'megapilot[train]'` on the shared file system), or run in a container")


def required_modules(suite: LoadedSuite) -> list[str]:
    """What the launch imports: torch always; the embedded trainer also Megatron-Core and megapilot itself."""
    if suite.backend == "megapilot":
        return ["torch", "megatron.core", "megapilot"]
    return ["torch"]


def interpreter_rows(suite: LoadedSuite, executor: Executor) -> list[MetricRow]:
    """One row per node: the interpreter, its version and each module's, or what it cannot import."""
    if suite.runs_in_image:
        return [MetricRow(name="python", verdict=Verdict.SKIPPED,
                          reason="jobs run in the container image, with its own Python")]
    python = suite.python
    outputs = executor.run_on_nodes(INTERPRETER_PROBE, [python, *required_modules(suite)], suite.nodes)
    rows = []
    for output in outputs:
        name = f"node{output.node}.python" if len(outputs) > 1 else "python"
        rows.append(_row(name, output.node, python, output.text, output.error))
    return rows


def _row(name: str, node: int, python: str, text: str, error: str) -> MetricRow:
    found = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    missing = [line.split("=", 1)[1] for line in text.splitlines() if line.startswith("missing=")]
    if error and not found:
        return MetricRow(name=name, verdict=Verdict.FAIL, reason=f"node {node}: could not run {python}: {error}")
    if missing or "python" not in found:
        what = "; ".join(missing) or "printed nothing"
        return MetricRow(name=name, verdict=Verdict.FAIL,
                         reason=f"node {node}: {python} cannot import what the jobs need ({what}); fix: {FIX}")
    modules = [line.split("=", 1)[1] for line in text.splitlines() if line.startswith("module=")]
    versions = f"; {', '.join(modules)}" if modules else ""
    return MetricRow(name=name, verdict=Verdict.PASS, reason=f"node {node}: {python} is {found['python']}{versions}")


__all__ = ["INTERPRETER_PROBE", "interpreter_rows", "required_modules"]
