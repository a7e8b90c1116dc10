"""Tests mirror the code: every module `megapilot/<package>/<module>.py` has `tests/<package>/test_<module>.py`
(or `test_<module>_<aspect>.py`; a command module `cli/<name>_cmd.py` may also be `tests/cli/test_<name>_cli.py`).

Read from the file tree alone (nothing is imported). The exceptions are listed below, each with its reason; a
module added without a test file fails here.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Modules with no behaviour of their own to test.
NO_TEST_NEEDED = {
    "__main__.py": "`python -m megapilot` calls the CLI app; tests/cli/test_common.py runs it that way",
    "compat.py": "the standard library's own StrEnum and tomllib on the Python the tests run on (3.10 stand-ins)",
    "cli/suite_cmd.py": "only groups the `suite` commands; each is tested beside its own module",
    "suite/baseline.py": "a Protocol without behaviour; the history implements it (tests/store/test_history.py)",
    "estimate/passes.py": "constants only (a micro-batch's passes, activation bytes) step_time and moe_terms read",
}
# Modules whose tests live under another name, and where.
TESTED_ELSEWHERE = {
    # tests/data holds fixture files, so megapilot.data is tested beside the trainer that reads what it writes
    "data/documents.py": "tests/trainer/test_tokenizer_and_documents.py",
    "data/tokenizer.py": "tests/trainer/test_tokenizer_and_documents.py",
    "data/indexed.py": "tests/trainer/test_indexed_dataset.py",
    # launch/data is the launcher's data folder (flag tables); the script that extracts them is tested with it
    "launch/data/extract_megatron_args.py": "tests/launch/test_extract_megatron_args.py",
}
# Tested only through their callers so far; this list may only shrink (an entry that gets its file fails below).
NOT_MIRRORED_YET: dict[str, str] = {}


def _modules(root: Path = ROOT) -> list[str]:
    return sorted(str(path.relative_to(root / "megapilot")) for path in (root / "megapilot").rglob("*.py")
                  if path.name != "__init__.py")


def _mirrors(module: str, root: Path = ROOT) -> list[Path]:
    """The test files that count as `module`'s own."""
    path = Path(module)
    folder = root / "tests" / path.parent
    stems = {path.stem} | ({path.stem.removesuffix("_cmd") + "_cli"} if path.stem.endswith("_cmd") else set())
    return [test for stem in sorted(stems) for pattern in (f"test_{stem}.py", f"test_{stem}_*.py")
            for test in sorted(folder.glob(pattern))]


def test_every_module_has_its_own_test_file():
    listed = NO_TEST_NEEDED.keys() | TESTED_ELSEWHERE.keys() | NOT_MIRRORED_YET.keys()
    missing = [module for module in _modules() if module not in listed and not _mirrors(module)]
    assert missing == [], ("modules without tests/<package>/test_<module>.py (write one, or list it in this file "
                           f"with the reason): {missing}")


def test_every_exception_names_a_module_that_exists_and_still_needs_it():
    modules = set(_modules())
    listed = NO_TEST_NEEDED.keys() | TESTED_ELSEWHERE.keys() | NOT_MIRRORED_YET.keys()
    assert sorted(listed - modules) == [], "listed modules that no longer exist"
    assert [module for module in NOT_MIRRORED_YET if _mirrors(module)] == [], "mirrored now: take it off the list"
    assert all(reason for reason in (*NO_TEST_NEEDED.values(), *NOT_MIRRORED_YET.values()))


def test_tests_kept_elsewhere_exist():
    assert [test for test in TESTED_ELSEWHERE.values() if not (ROOT / test).is_file()] == []


def test_the_rule_sees_a_module_without_a_test_file(tmp_path):
    (tmp_path / "megapilot" / "pkg").mkdir(parents=True)
    (tmp_path / "tests" / "pkg").mkdir(parents=True)
    for name in ("covered.py", "bare.py", "plan_cmd.py", "run_cmd.py", "__init__.py"):
        (tmp_path / "megapilot" / "pkg" / name).write_text("")
    for name in ("test_covered_edges.py", "test_plan_cli.py", "test_bare.txt"):
        (tmp_path / "tests" / "pkg" / name).write_text("")
    assert [m for m in _modules(tmp_path) if not _mirrors(m, tmp_path)] == ["pkg/bare.py", "pkg/run_cmd.py"]
