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


@pytest.mark.parametrize("prefix", ["{tmp}/out/", "{tmp}/out", "{tmp}/out/x.bin", "{tmp}/out/x.idx"])
def test_a_prefix_that_names_a_folder_or_one_of_the_files_is_refused(cli, tmp_path, prefix):
    # 'out/' wrote out.bin beside the folder, 'x.bin' wrote x.bin.bin and x.bin.idx
    (tmp_path / "out").mkdir()
    source = tmp_path / "docs.jsonl"
    source.write_text(json.dumps({"text": "hello"}) + "\n")
    result = cli("data", "prepare", str(source), "--output-prefix", prefix.format(tmp=tmp_path))
    assert result.exit_code == 2 and "--output-prefix" in result.stderr and "fix:" in result.stderr
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["docs.jsonl", "out"]


def test_an_existing_dataset_is_kept_unless_forced(cli, tmp_path):
    # a failed second run removed what it had half written: the first run's dataset
    good, bad = tmp_path / "good.jsonl", tmp_path / "bad.jsonl"
    good.write_text(json.dumps({"text": "hello"}) + "\n")
    bad.write_text(json.dumps({"text": "hi"}) + "\n" + json.dumps({"body": "no text key"}) + "\n")
    prefix = str(tmp_path / "ds")
    assert cli("data", "prepare", str(good), "--output-prefix", prefix).exit_code == 0
    before = (tmp_path / "ds.bin").read_bytes()
    again = cli("data", "prepare", str(bad), "--output-prefix", prefix)
    assert again.exit_code == 2 and "--force" in again.stderr
    assert (tmp_path / "ds.bin").read_bytes() == before and (tmp_path / "ds.idx").is_file()
    forced_bad = cli("data", "prepare", str(bad), "--output-prefix", prefix, "--force")  # replaced only when whole
    assert forced_bad.exit_code == 2 and "line 2" in forced_bad.stderr
    assert (tmp_path / "ds.bin").read_bytes() == before and (tmp_path / "ds.idx").is_file()
    forced = cli("data", "prepare", str(good), "--output-prefix", prefix, "--force", "--json")
    assert forced.exit_code == 0 and forced.json()["documents"] == 1


def test_an_unwritable_prefix_is_named_as_the_output_not_the_input(cli, tmp_path):
    source = tmp_path / "docs.jsonl"
    source.write_text(json.dumps({"text": "hello"}) + "\n")
    folder = tmp_path / "ro"
    folder.mkdir()
    (folder / "x.bin").mkdir()  # a folder where the .bin goes: opening it for writing fails on any user
    result = cli("data", "prepare", str(source), "--output-prefix", str(folder / "x"), "--force")
    assert result.exit_code == 2 and "--output-prefix" in result.stderr and "INPUT" not in result.stderr


def test_a_corrupt_gzip_input_is_one_line_naming_input(cli, tmp_path):
    # a deflate stream zlib refuses raised zlib.error: 'internal error ... please report'
    source = tmp_path / "docs.jsonl.gz"
    source.write_bytes(bytes([0x1F, 0x8B, 8, 0, 0, 0, 0, 0, 0, 0xFF]) + b"\x07" + bytes(20))
    result = cli("data", "prepare", str(source), "--output-prefix", str(tmp_path / "ds"))
    assert result.exit_code == 2 and "INPUT" in result.stderr and "gzip" in result.stderr
    assert "internal error" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["docs.jsonl.gz"]
