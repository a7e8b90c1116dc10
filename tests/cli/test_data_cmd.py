"""`megapilot data prepare` through the real CLI entry point."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("megatron.core")


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
