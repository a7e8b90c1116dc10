"""`megapilot data prepare` through the real CLI entry point."""

from __future__ import annotations

import json

import pytest


def test_prepare_jsonl_reports_documents_and_tokens_as_json(cli, tmp_path):
    source = tmp_path / "docs.jsonl"
    source.write_text(json.dumps({"text": "hello"}) + "\n" + json.dumps({"text": "wörld"}) + "\n")
    result = cli("data", "prepare", str(source), "--output-prefix", str(tmp_path / "ds"), "--json")
    assert result.exit_code == 0, result.stderr
    payload = result.json()
    assert payload["documents"] == 2
    assert payload["tokens"] == len(b"hello") + 1 + len("wörld".encode()) + 1
    assert payload["prefix"] == str(tmp_path / "ds")
    assert (tmp_path / "ds.bin").is_file() and (tmp_path / "ds.idx").is_file()


def test_prepare_prints_a_table_for_humans(cli, tmp_path):
    source = tmp_path / "book.txt"
    source.write_text("one\n\ntwo\n")
    result = cli("data", "prepare", str(source), "--output-prefix", str(tmp_path / "book"))
    assert result.exit_code == 0
    assert "--data-path" in result.stdout and "documents" in result.stdout


@pytest.mark.parametrize(("args", "field"), [
    (["--output-prefix", "relative/x"], "--output-prefix"),
    (["--output-prefix", "{tmp}/x", "--tokenizer", "gpt2"], "--tokenizer"),
    (["--output-prefix", "{tmp}/x", "--json-key", "body"], "--json-key"),
])
def test_user_errors_exit_2_on_one_line_naming_the_field(cli, tmp_path, args, field):
    source = tmp_path / "docs.jsonl"
    source.write_text(json.dumps({"text": "hello"}) + "\n")
    result = cli("data", "prepare", str(source), *(arg.format(tmp=tmp_path) for arg in args))
    assert result.exit_code == 2
    assert field in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_large_input_gets_a_progress_bar_on_stderr(cli, tmp_path, monkeypatch):
    import megapilot.cli.common as common
    import megapilot.cli.data_cmd as data_cmd
    from megapilot.cli.common import OutputConsole

    monkeypatch.setattr(data_cmd, "PROGRESS_FROM_BYTES", 1000)  # "large" scaled down to a test file
    monkeypatch.setattr(common, "err_console", OutputConsole(stderr=True, force_terminal=True, width=100))
    source = tmp_path / "docs.txt"
    source.write_text("\n\n".join(f"paragraph {i} " * 20 for i in range(400)) + "\n")
    result = cli("data", "prepare", str(source), "--output-prefix", str(tmp_path / "ds"))
    assert result.exit_code == 0, result.stderr
    assert "tokenizing" in result.stderr and "━" in result.stderr  # the bar, drawn on the terminal
    assert "400" in result.stdout and "tokenizing" not in result.stdout  # stdout: the table alone
    small = cli("data", "prepare", str(source), "--output-prefix", str(tmp_path / "ds2"), "--json")
    assert "tokenizing" not in small.stderr  # --json: no bar
