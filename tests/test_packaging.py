"""The package as users install it: the Python range and markers it declares, and the core from the wheel.

NGC containers and megatron-core >= 0.17 run Python 3.12+, older clusters 3.10; the core (everything but
`megapilot.trainer`) must install and plan on all of them without torch.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from megapilot.compat import tomllib

ROOT = Path(__file__).resolve().parents[1]
PYTHONS = ("3.10", "3.11", "3.12", "3.13")
# Names the stdlib gained after 3.10; the core reaches them only through megapilot.compat.
NEWER_STDLIB = {
    "tomllib": None, "enum": {"StrEnum", "verify", "member", "nonmember", "global_enum", "ReprEnum"},
    "datetime": {"UTC"}, "typing": {"Self", "Never", "LiteralString", "assert_never", "reveal_type",
                                    "Required", "NotRequired", "Unpack", "TypeVarTuple", "override"},
    "itertools": {"batched"}, "asyncio": {"TaskGroup", "timeout", "Runner"},
}


def _project() -> dict[str, object]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _requirements_on(extra: str, python: str) -> dict[str, Requirement]:
    """The requirements of an extra that apply on one Python version, by package name."""
    environment = {"python_version": python, "python_full_version": f"{python}.0", "extra": extra}
    chosen = {}
    for line in _project()["optional-dependencies"][extra]:  # type: ignore[index]  # TOML is untyped
        requirement = Requirement(line)
        if requirement.marker is None or requirement.marker.evaluate(environment):
            chosen[requirement.name] = requirement
    return chosen


def test_core_declares_python_310_and_newer_without_upper_bound() -> None:
    allowed = SpecifierSet(str(_project()["requires-python"]))
    assert [v for v in ("3.9", *PYTHONS, "3.14") if allowed.contains(f"{v}.0")] == [*PYTHONS, "3.14"]


def test_core_dependencies_apply_on_every_supported_python() -> None:
    for line in _project()["dependencies"]:  # type: ignore[attr-defined]  # TOML is untyped
        requirement = Requirement(line)
        if requirement.name == "tomli":  # tomllib's source, only where the stdlib lacks it
            assert requirement.marker == Marker("python_version < '3.11'")
            continue
        assert requirement.marker is None, line


def test_train_extra_pins_the_tested_line_below_312_and_the_newer_line_above() -> None:
    for python in ("3.10", "3.11"):
        chosen = _requirements_on("train", python)
        assert str(chosen["torch"].specifier) == "==2.13.0"
        assert str(chosen["megatron-core"].specifier) == "==0.16.1"
    for python in ("3.12", "3.13"):
        chosen = _requirements_on("train", python)
        assert chosen["megatron-core"].specifier.contains("0.17.0")
        assert not chosen["megatron-core"].specifier.contains("0.16.1")
        assert chosen["torch"].specifier.contains("2.13.0")


# The trainer needs the `train` extra; compat.py is where the newer names are reached; the flag extractor is a
# maintenance tool run with torch on the Python of the Megatron-LM release it reads (it shims typing.override).
_NOT_CORE = ("compat.py", "extract_megatron_args.py")


def _core_sources() -> list[Path]:
    return [p for p in (ROOT / "megapilot").rglob("*.py")
            if "trainer" not in p.relative_to(ROOT / "megapilot").parts[:1] and p.name not in _NOT_CORE]


def test_core_parses_as_python_310() -> None:
    for path in _core_sources():
        ast.parse(path.read_text(), str(path), feature_version=(3, 10))


def test_core_imports_no_stdlib_name_newer_than_310() -> None:
    found = []
    for path in _core_sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found += [f"{path}: import {a.name}" for a in node.names
                          if a.name in NEWER_STDLIB and NEWER_STDLIB[a.name] is None]
            elif isinstance(node, ast.ImportFrom) and node.module in NEWER_STDLIB:
                newer = NEWER_STDLIB[node.module]
                found += [f"{path}: from {node.module} import {a.name}" for a in node.names
                          if newer is None or a.name in newer]
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                newer = NEWER_STDLIB.get(node.value.id)
                if newer and node.attr in newer:
                    found.append(f"{path}: {node.value.id}.{node.attr}")
    assert found == []


@pytest.mark.slow
def test_core_from_the_wheel_plans_in_a_fresh_venv_without_torch(tmp_path: Path) -> None:
    """Build the wheel, install it alone (no extras) into a new venv, and plan from there.

    Offline-safe: the core's dependencies are lent from the test environment's site-packages through a
    .pth file instead of being downloaded; torch and megatron are blocked, so the plan proves the core
    needs neither.
    """
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(wheels), str(ROOT)], check=True, cwd=tmp_path, capture_output=True)
    wheel = next(wheels.glob("megapilot-*.whl"))
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                    str(wheel)], check=True, capture_output=True)
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               check=True, capture_output=True, text=True).stdout.strip())
    (site / "zz_lent_dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    run_plan = (
        "import sys; sys.modules['torch'] = None; sys.modules['megatron'] = None\n"
        "import megapilot; assert megapilot.__file__.startswith(sys.prefix), megapilot.__file__\n"
        "from megapilot.cli.app import main\n"
        "main(['plan', '--model', 'llama3-8b', '--gpu', 'h100', '--gpus', '16', '--top', '2', '--json'])\n"
    )
    clean_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run([str(python), "-c", run_plan], cwd=tmp_path, capture_output=True, text=True,
                          env=clean_env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert '"tp"' in done.stdout and '"dp"' in done.stdout
