"""launch.flags: the argument sections of pretrain_gpt.py, the tokenizer the options imply, the checkpoint format
and the notes on what a release changes."""

from __future__ import annotations

import sys

import pytest

from megapilot.catalog import get_model
from megapilot.errors import MegapilotError
from megapilot.launch import LaunchOptions
from megapilot.launch.flags import (
    checkpoint_format,
    megatron_arg_sections,
    positions_raised_to,
    render_megatron_args,
    tokenizer_type,
)
from megapilot.spec import TrainingSpec
from tests.launch.plans import tiny_two_rank_plan


def _options(**fields: object) -> LaunchOptions:
    base: dict[str, object] = dict(launcher="torchrun", entrypoint="megapilot", mock_data=True, python=sys.executable,
                                   check_paths_exist=False, cpu=True)
    return LaunchOptions(**(base | fields))  # type: ignore[arg-type]


def test_the_flat_list_is_the_sections_in_reading_order():
    plan, options = tiny_two_rank_plan(train_iters=5), _options(save="/ckpt", save_interval=2)
    sections = megatron_arg_sections(plan, options)
    titles = [section.title.split(":")[0] for section in sections]
    assert titles[:6] == ["model", "parallelism", "Megatron-FSDP", "activation recompute", "precision", "training"]
    assert titles.index("logging") + 1 == titles.index("checkpoints")
    assert render_megatron_args(plan, options) == [word for s in sections for word in s.args]
    checkpoints = next(s.args for s in sections if s.title == "checkpoints")
    assert checkpoints == ["--save", "/ckpt", "--save-interval", "2", "--load", "/ckpt", "--ckpt-format", "torch_dist"]


@pytest.mark.parametrize(("fields", "expected"), [
    ({}, "NullTokenizer"),
    ({"mock_data": False, "data_path": "/d/x", "tokenizer_model": "/t/tok.model"}, "GPTSentencePieceTokenizer"),
    ({"mock_data": False, "data_path": "/d/x", "tokenizer_model": "meta-llama/Llama-3.1-8B"}, "HuggingFaceTokenizer"),
    ({"vocab_file": "/t/vocab.json", "merge_file": "/t/merges.txt"}, "GPT2BPETokenizer"),
])
def test_the_tokenizer_follows_from_what_was_given(fields, expected):
    assert tokenizer_type(_options(**fields)) == expected


@pytest.mark.parametrize(("fields", "field"), [
    ({"vocab_file": "/t/vocab.json"}, "vocab_file"),
    ({"tokenizer_type": "HuggingFaceTokenizer"}, "tokenizer_model"),
    ({"tokenizer_type": "ByteTokenizer"}, "tokenizer_type"),  # only the embedded trainer on real data reads bytes
    ({"mock_data": False, "data_path": "/d/x"}, "tokenizer_model"),
])
def test_a_tokenizer_that_cannot_be_built_is_refused_naming_the_field(fields, field):
    with pytest.raises(MegapilotError) as caught:
        tokenizer_type(_options(**fields))
    assert caught.value.field == field


def test_positions_are_raised_only_for_computed_positions_past_the_models_context():
    llama = get_model("llama3.1-8b")  # RoPE: positions computed per token
    assert positions_raised_to(llama, TrainingSpec(seq_length=llama.max_position_embeddings, global_batch_size=1)) \
        is None
    longer = TrainingSpec(seq_length=llama.max_position_embeddings * 2, global_batch_size=1)
    assert positions_raised_to(llama, longer) == llama.max_position_embeddings * 2
    tiny = get_model("tiny")  # learned positions: a longer run needs new weights, never a raised flag
    assert tiny.position_embedding == "learned_absolute"
    assert positions_raised_to(tiny, TrainingSpec(seq_length=4096, global_batch_size=1)) is None


def test_fsdp_saves_its_own_format():
    plan = tiny_two_rank_plan(train_iters=5)
    fsdp = plan.model_copy(update={"parallel": plan.parallel.model_copy(update={"fsdp": True})})
    assert checkpoint_format(fsdp, _options()) == "fsdp_dtensor"
    assert checkpoint_format(plan, _options()) == "torch_dist"


@pytest.mark.parametrize("tokenizer", [None, "GPTSentencePieceTokenizer", "SentencePieceTokenizer", "Llama2Tokenizer"])
def test_a_tiktoken_rank_file_is_not_read_as_a_sentencepiece_model(tmp_path, tokenizer):
    # Llama 3's original tokenizer.model is a tiktoken BPE rank file (base64 token, rank per line), not a
    # SentencePiece protobuf: Megatron's SentencePiece tokenizers fail to parse it when the job starts.
    tiktoken = tmp_path / "tokenizer.model"
    tiktoken.write_text("IQ== 0\nIg== 1\nIw== 2\n")
    with pytest.raises(MegapilotError) as caught:
        tokenizer_type(_options(mock_data=False, data_path="/d/x", tokenizer_model=str(tiktoken),
                                tokenizer_type=tokenizer))
    assert caught.value.field == "tokenizer_model" and "HuggingFaceTokenizer" in (caught.value.fix or "")
    sentencepiece = tmp_path / "sp.model"
    sentencepiece.write_bytes(b"\n\x0e\n\x05<unk>\x15\x00\x00\x00\x00\x18\x02")  # a ModelProto's first piece
    assert tokenizer_type(_options(mock_data=False, data_path="/d/x", tokenizer_model=str(sentencepiece),
                                   tokenizer_type=tokenizer)) == (tokenizer or "GPTSentencePieceTokenizer")
