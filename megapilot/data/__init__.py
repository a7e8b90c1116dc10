"""Text → token documents for the trainer: the byte tokenizer and the readers of user files (torch-free)."""

from megapilot.data.documents import read_documents
from megapilot.data.tokenizer import ByteTokenizer, VocabOnlyTokenizer

__all__ = ["ByteTokenizer", "VocabOnlyTokenizer", "read_documents"]
