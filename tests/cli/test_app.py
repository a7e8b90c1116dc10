"""The entry point's last line of defence: a bug prints one line and exits 1; --debug shows the traceback."""

from __future__ import annotations

import pytest


@pytest.fixture
def broken_catalog(monkeypatch):
    """`megapilot gpus` with a library bug inside it."""
    import megapilot.catalog

    def load_gpus():
        raise RuntimeError("catalog\nexploded")

    monkeypatch.setattr(megapilot.catalog, "load_gpus", load_gpus)
    monkeypatch.delenv("MEGAPILOT_DEBUG", raising=False)


def test_an_internal_error_is_one_line_and_exit_code_1(cli, broken_catalog):
    result = cli("gpus")
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines() == [
        "internal error: RuntimeError: catalog exploded; please report with --debug output"]
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("how", ["flag", "env"])
def test_debug_shows_the_traceback_of_an_internal_error(cli, broken_catalog, monkeypatch, how):
    if how == "env":
        monkeypatch.setenv("MEGAPILOT_DEBUG", "1")
    result = cli("--debug", "gpus") if how == "flag" else cli("gpus")
    assert result.exit_code == 1
    assert "Traceback (most recent call last)" in result.stderr
    assert "RuntimeError: catalog" in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("internal error: RuntimeError")


def test_a_user_error_stays_exit_code_2_without_traceback(cli, monkeypatch):
    monkeypatch.setenv("MEGAPILOT_DEBUG", "1")
    result = cli("models", "no-such-model")
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines()[0].startswith("error: model: unknown model")
    assert "Traceback" not in result.stderr


def test_an_unreadable_file_that_escapes_a_command_is_a_user_error(cli, monkeypatch):
    import megapilot.catalog

    def load_gpus():
        open("/nonexistent-dir/gpus.yaml").read()  # noqa: SIM115 - the OSError is the point

    monkeypatch.setattr(megapilot.catalog, "load_gpus", load_gpus)
    result = cli("gpus")
    assert result.exit_code == 2
    assert result.stderr.strip() == ("error: path: /nonexistent-dir/gpus.yaml: No such file or directory — fix: "
                                     "check the path: an existing, readable file in an existing directory")


def test_an_output_path_that_cannot_be_made_says_what_is_in_the_way(cli, tmp_path):
    (tmp_path / "afile").write_text("")
    result = cli("suite", "init", "tiny-local", "-o", str(tmp_path / "afile" / "suite.json"))
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "afile" in result.stderr and "a file is in the way of a folder to create" in result.stderr


@pytest.mark.parametrize("group", ["logs", "history", "suite", "profile", "data"])
def test_a_group_without_its_command_says_which_is_missing(cli, group):
    result = cli(group)
    assert result.exit_code == 2
    assert f"error: missing command: name one of those above — see megapilot {group} --help" in result.stderr
