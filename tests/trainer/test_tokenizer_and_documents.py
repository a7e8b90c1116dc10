"""`megapilot.data`: the byte tokenizer and the jsonl/txt readers (torch-free)."""

from __future__ import annotations

import gzip
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from megapilot.data import ByteTokenizer, read_documents
from megapilot.errors import MegapilotError


@given(st.text())
def test_byte_tokenizer_round_trips_any_text(text):
    tokenizer = ByteTokenizer()
    ids = tokenizer.tokenize(text)
    assert all(0 <= i < 256 for i in ids)
    assert tokenizer.detokenize(ids + [tokenizer.eod]) == text


def test_special_tokens_sit_above_the_bytes():
    tokenizer = ByteTokenizer()
    assert (tokenizer.eod, tokenizer.pad, tokenizer.vocab_size) == (256, 257, 258)


def test_txt_documents_are_blank_line_separated_paragraphs(tmp_path):
    path = tmp_path / "book.txt"
    path.write_text("Genesis 1\nIn the beginning.\n\n\nGenesis 2\nThus the heavens.\n")
    assert list(read_documents(path)) == ["Genesis 1\nIn the beginning.", "Genesis 2\nThus the heavens."]


def test_jsonl_documents_come_from_the_json_key_and_gzip_is_read(tmp_path):
    path = tmp_path / "docs.jsonl.gz"
    with gzip.open(path, "wt") as handle:
        handle.write(json.dumps({"body": "one"}) + "\n\n" + json.dumps({"body": "two"}) + "\n")
    assert list(read_documents(path, json_key="body")) == ["one", "two"]


def test_jsonl_line_without_the_key_names_line_and_field(tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_text('{"text": "ok"}\n{"content": "no"}\n')
    with pytest.raises(MegapilotError, match="line 2") as err:
        list(read_documents(path))
    assert err.value.field == "--json-key"


def test_a_text_field_that_holds_no_string_says_what_it_holds(tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_text('{"text": "ok"}\n{"text": 123}\n')
    with pytest.raises(MegapilotError, match=r"line 2 .* field 'text' holds a number, not text") as err:
        list(read_documents(path))
    assert err.value.field == "INPUT"


@pytest.mark.parametrize("name", ["data.csv", "missing.txt"])
def test_unsupported_or_missing_input_is_a_user_error(tmp_path, name):
    (tmp_path / "data.csv").write_text("a,b\n")
    with pytest.raises(MegapilotError) as err:
        list(read_documents(tmp_path / name))
    assert err.value.field == "INPUT"


def test_a_lone_surrogate_escape_names_its_line_instead_of_an_internal_error(tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_text('{"text": "ok"}\n{"text": "a\\ud800b"}\n')
    with pytest.raises(MegapilotError, match=r"line 2 .* lone surrogate") as err:
        list(read_documents(path))
    assert err.value.field == "INPUT"


@pytest.mark.parametrize("line", ["[1, 2]", '"just text"', "7"])
def test_a_jsonl_line_that_is_no_object_says_so(tmp_path, line):
    path = tmp_path / "docs.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(MegapilotError, match=r"line 1 .* not a JSON object") as err:
        list(read_documents(path))
    assert err.value.field == "INPUT"


@pytest.mark.parametrize("name", ["book.txt", "docs.jsonl", "docs.jsonl.gz"])
def test_a_byte_order_mark_is_not_part_of_the_first_document(tmp_path, name):
    # a .txt kept the mark's three bytes as tokens; a .jsonl was refused as "not JSON"
    path = tmp_path / name
    text = "first\n\nsecond\n" if name.endswith(".txt") else '{"text": "first"}\n{"text": "second"}\n'
    data = "\ufeff".encode() + text.encode()
    path.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    assert list(read_documents(path)) == ["first", "second"]


# a gzip header, then a deflate block of the reserved type 3: zlib refuses it as no .gz truncation does
BROKEN_DEFLATE_GZ = bytes([0x1F, 0x8B, 8, 0, 0, 0, 0, 0, 0, 0xFF]) + b"\x07" + bytes(20)


@pytest.mark.parametrize(("data", "said"), [
    (BROKEN_DEFLATE_GZ, "invalid block type"),  # zlib.error: an internal error of `data prepare`
    (gzip.compress(b'{"text": "whole"}\n' * 50)[:40], "ended before"),  # EOFError: cut short
    (b"\xff\xfe not gzip", "Not a gzipped file"),  # BadGzipFile
], ids=["zlib-error", "cut-short", "not-gzip"])
def test_a_broken_gzip_is_named_as_the_input(tmp_path, data, said):
    path = tmp_path / "docs.jsonl.gz"
    path.write_bytes(data)
    with pytest.raises(MegapilotError, match=said) as err:
        list(read_documents(path))
    assert err.value.field == "INPUT" and ".gz" in (err.value.fix or "")


def test_an_error_of_the_caller_between_documents_is_not_the_inputs(tmp_path):
    # the reader names its own failures only: an OSError of what the caller does with a document stays its own
    path = tmp_path / "docs.txt"
    path.write_text("one\n\ntwo\n")
    with pytest.raises(OSError, match="disk full"):
        for _ in read_documents(path):
            raise OSError(28, "disk full")
