"""A byte-level tokenizer, implemented here so no vocabulary is downloaded.

Token ids 0–255 are the UTF-8 bytes of the text; 256 is end-of-document (appended to every
document, as Megatron's preprocessing does with `--append-eod`) and 257 is padding. Any text
round-trips exactly. The attribute names (`vocab_size`, `eod`, `pad`) are the ones Megatron-Core's
`GPTDataset` reads from its tokenizer.
"""

from __future__ import annotations

from dataclasses import dataclass

BYTE_VALUES = 256
#: Tokenizer names the embedded trainer reads as this byte tokenizer.
BYTE_TOKENIZER_NAMES = ("ByteTokenizer", "byte")


@dataclass(frozen=True)
class ByteTokenizer:
    """UTF-8 bytes plus two special tokens."""

    eod: int = BYTE_VALUES
    pad: int = BYTE_VALUES + 1
    name: str = "ByteTokenizer"

    @property
    def vocab_size(self) -> int:
        return BYTE_VALUES + 2

    @property
    def special_tokens_dict(self) -> dict[str, int]:
        return {"eod_token": self.eod, "pad_token": self.pad}

    @property
    def unique_identifiers(self) -> dict[str, object]:
        """Megatron hashes this into its dataset cache names."""
        return {"class": self.name, "vocab_size": self.vocab_size}

    def tokenize(self, text: str) -> list[int]:
        """The UTF-8 bytes of `text` as token ids (no end-of-document token)."""
        return list(text.encode("utf-8"))

    def detokenize(self, ids: list[int]) -> str:
        """Back to text; special tokens are dropped."""
        return bytes(i for i in ids if i < BYTE_VALUES).decode("utf-8", errors="replace")


@dataclass(frozen=True)
class VocabOnlyTokenizer:
    """A vocabulary size and an end-of-document id: all that Megatron's mock dataset needs.

    Used with `--mock-data` (like Megatron-LM's NullTokenizer): the last id is end-of-document.
    """

    size: int
    name: str = "NullTokenizer"

    @property
    def vocab_size(self) -> int:
        return self.size

    @property
    def eod(self) -> int:
        return self.size - 1

    @property
    def unique_identifiers(self) -> dict[str, object]:
        return {"class": self.name, "vocab_size": self.vocab_size}


def embedded_trainer_tokenizer(tokenizer_type: str | None, mock_data: bool) -> str:
    """The tokenizer the embedded trainer (`-m megapilot.trainer`) runs for its flags: the one named, else a
    NullTokenizer of --vocab-size with --mock-data, else these bytes (what `megapilot data prepare` writes), so a
    script that names none still says its vocabulary."""
    name = tokenizer_type or ("NullTokenizer" if mock_data else ByteTokenizer.name)
    return ByteTokenizer.name if name in BYTE_TOKENIZER_NAMES else name
