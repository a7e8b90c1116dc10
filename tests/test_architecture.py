"""The code keeps its own structural rules, read from its source with `ast` (nothing is imported).

- Packages import only the packages before them in PACKAGE_ORDER (the order of README's "Layout of
  the code"); `TYPE_CHECKING` imports count too, a type is a dependency.
- No public function or method returns a private (`_`-named) type: a caller could not name what it got.
- No function takes more than MAX_PARAMETERS parameters, except typer commands, whose parameters are
  the command line itself.
- An import inside a function (outside `cli`, whose commands import late on purpose: `--help` loads no
  library module) says why on its line or the comment line above: a cycle it breaks, a heavy or optional
  dependency only that path needs, a measured start-up cost. Any other import stands at the top of its
  module, where the reader (and the layering check) sees the dependency.
"""

from __future__ import annotations

import ast
import io
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE_ROOT = Path(__file__).resolve().parents[1] / "megapilot"
# Left to right: each may import only what stands to its left. `logs` comes before `execute` (the
# executors follow progress through the parser); `trainer` before `launch` (the launcher refuses flags
# the embedded trainer's torch-free flag table lacks); `suite` before `store` (the history keeps suite
# results) and `report` (which renders them); `cli` last.
PACKAGE_ORDER = ("errors", "compat", "files", "limits", "case_flags", "vocabulary", "spec", "catalog", "estimate",
                 "plan", "logs", "execute", "data", "trainer", "launch", "diagnose", "suite", "store", "report", "cli",
                 "__main__")
MAX_PARAMETERS = 12
# Packages whose commands import late on purpose (start-up), and in-function imports still without a stated
# reason per package, which may only shrink.
LATE_IMPORTS_BY_DESIGN = ("cli",)
UNEXPLAINED_LATE_IMPORTS = {"estimate": 12}


@dataclass(frozen=True)
class SourceFile:
    path: Path
    package: str  # first component under megapilot/ (a module's own name for top-level modules)
    tree: ast.Module


def _sources() -> list[SourceFile]:
    found = []
    for path in sorted(PACKAGE_ROOT.rglob("*.py")):
        parts = path.relative_to(PACKAGE_ROOT).parts
        package = parts[0] if len(parts) > 1 else parts[0].removesuffix(".py")
        found.append(SourceFile(path, package, ast.parse(path.read_text(), filename=str(path))))
    return found


SOURCES = _sources()


def _imported_packages(tree: ast.Module) -> Iterator[tuple[str, int]]:
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        for name in names:
            if name.startswith("megapilot."):
                yield name.split(".")[1], node.lineno


def test_every_package_has_a_place_in_the_order():
    assert {source.package for source in SOURCES} - {"__init__"} <= set(PACKAGE_ORDER)


def test_imports_flow_only_left_in_the_package_order():
    upward = []
    for source in SOURCES:
        if source.package == "__init__":
            continue
        rank = PACKAGE_ORDER.index(source.package)
        for imported, line in _imported_packages(source.tree):
            if imported != source.package and PACKAGE_ORDER.index(imported) > rank:
                upward.append(f"{source.path.relative_to(PACKAGE_ROOT)}:{line} imports megapilot.{imported}")
    assert upward == []


Function = ast.FunctionDef | ast.AsyncFunctionDef


def _functions(tree: ast.AST, public_scope: bool = True) -> Iterator[tuple[Function, bool]]:
    """Every function with whether it is reachable by a public name (module level or a public class)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node, public_scope and not node.name.startswith("_")
            yield from ((inner, False) for inner, _ in _functions(node, False))
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, public_scope and not node.name.startswith("_"))
        elif isinstance(node, ast.If | ast.Try | ast.With):
            yield from _functions(node, public_scope)


def _private_names(annotation: ast.expr) -> set[str]:
    """`_Name`s in an annotation, also inside strings (postponed or quoted annotations)."""
    names = set()
    for node in ast.walk(annotation):
        if isinstance(node, ast.Name) and node.id.startswith("_") and not node.id.startswith("__"):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            names.add(node.attr)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            try:
                names |= _private_names(ast.parse(node.value, mode="eval").body)
            except SyntaxError:
                continue
    return names


def test_no_public_function_returns_a_private_type():
    leaks = [
        f"{source.path.relative_to(PACKAGE_ROOT)}:{function.lineno} {function.name} -> {sorted(private)}"
        for source in SOURCES
        for function, public in _functions(source.tree)
        if public and function.returns is not None and (private := _private_names(function.returns))
    ]
    assert leaks == []


def _is_typer_command(function: Function) -> bool:
    """Registered with `@app.command(...)` or `@app.callback(...)`, or declaring typer options."""
    for decorator in function.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if isinstance(target, ast.Attribute) and target.attr in ("command", "callback"):
            return True
    return any("typer." in ast.unparse(arg.annotation) for arg in function.args.args if arg.annotation is not None)


def _parameter_count(function: Function) -> int:
    arguments = function.args
    names = [a.arg for a in arguments.posonlyargs + arguments.args + arguments.kwonlyargs]
    return len([name for name in names if name not in ("self", "cls")])


def test_no_function_takes_more_than_twelve_parameters_outside_typer_commands():
    too_many = [
        f"{source.path.relative_to(PACKAGE_ROOT)}:{function.lineno} {function.name} ({_parameter_count(function)})"
        for source in SOURCES
        for function, _ in _functions(source.tree)
        if _parameter_count(function) > MAX_PARAMETERS and not _is_typer_command(function)
    ]
    assert too_many == []


def _comment_lines(text: str) -> set[int]:
    tokens = tokenize.generate_tokens(io.StringIO(text).readline)
    return {token.start[0] for token in tokens if token.type == tokenize.COMMENT}


def _unexplained_late_imports(tree: ast.AST, text: str) -> list[int]:
    """Lines of the imports inside functions with no comment on their lines or the line above; an import
    right below an explained one (or one blank line below) shares its comment: one reason for a block."""
    late: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if in_function and isinstance(child, ast.Import | ast.ImportFrom):
                late.append(child)
            visit(child, in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef))

    visit(tree, False)
    comments = _comment_lines(text)
    blank = {number for number, line in enumerate(text.splitlines(), 1) if not line.strip()}
    explained_ends: set[int] = set()
    unexplained = []
    for node in sorted(late, key=lambda found: found.lineno):
        end = node.end_lineno or node.lineno
        below_explained = node.lineno - 1 in explained_ends or (
            node.lineno - 1 in blank and node.lineno - 2 in explained_ends)  # isort's blank line between groups
        if set(range(node.lineno - 1, end + 1)) & comments or below_explained:
            explained_ends.add(end)
        else:
            unexplained.append(node.lineno)
    return unexplained


def test_every_import_inside_a_function_says_why():
    unexplained: dict[str, list[str]] = {}
    for source in SOURCES:
        if source.package in LATE_IMPORTS_BY_DESIGN:
            continue
        for line in _unexplained_late_imports(source.tree, source.path.read_text()):
            unexplained.setdefault(source.package, []).append(f"{source.path.relative_to(PACKAGE_ROOT)}:{line}")
    over = {package: found for package, found in unexplained.items()
            if len(found) > UNEXPLAINED_LATE_IMPORTS.get(package, 0)}
    assert over == {}, "move these imports to the top of their module, or say why they must wait"


def test_the_late_import_check_sees_what_it_must():
    code = ("import os\n"
            "def f():\n    import json\n"
            "def g():\n    # cycle: b imports a\n    from b import c\n    import d\n\n    import e\n\n\n    import z\n"
            "def h():\n    import yaml  # start-up: 18 ms\n"
            "class K:\n    def n(self):\n"
            "        from p import (\n            q,  # the reason may sit on any line\n        )\n")
    assert _unexplained_late_imports(ast.parse(code), code) == [3, 12]


@pytest.mark.parametrize(("code", "expected"), [
    ("def f() -> _Cost: ...", {"_Cost"}),
    ("def f() -> list['_Cost']: ...", {"_Cost"}),
    ("def f() -> mod._Private | None: ...", {"_Private"}),
    ("def f() -> Cost: ...", set()),
])
def test_private_names_are_found_in_any_spelling_of_an_annotation(code, expected):
    function = ast.parse(code).body[0]
    assert isinstance(function, ast.FunctionDef) and function.returns is not None
    assert _private_names(function.returns) == expected


def test_the_checks_see_what_they_must():
    tree = ast.parse("class _Hidden:\n    def run(self) -> _X: ...\nclass Open:\n    def run(self) -> _X: ...\n"
                     "def g(a, b, c, d, e, f, g, h, i, j, k, l, m): ...\n")
    publics = {(f.name, f.lineno): public for f, public in _functions(tree)}
    assert publics == {("run", 2): False, ("run", 4): True, ("g", 5): True}
    g = tree.body[-1]
    assert isinstance(g, ast.FunctionDef) and _parameter_count(g) == 13 and not _is_typer_command(g)
