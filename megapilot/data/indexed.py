"""Megatron's indexed dataset (`PREFIX.bin` + `PREFIX.idx`), written with the standard library alone.

The format is the one Megatron-Core's `IndexedDatasetBuilder` writes and `IndexedDataset`/`GPTDataset`
read (megatron/core/datasets/indexed_dataset.py, format version 1, not multimodal):

- `.bin`: every document's token ids back to back, in the dataset's dtype (uint16 below 65,500
  distinct ids, as `DType.optimal_dtype` chooses; int32 above), native byte order;
- `.idx`: the header `MMIDIDX\\0\\0`, `<Q` version 1, `<B` dtype code, `<Q` sequence count, `<Q`
  document-index count, then int32 sequence lengths, int64 byte offsets of each sequence, and int64
  document indices (0, then the sequence count after each document).

Writing it here instead of through Megatron-Core keeps `megapilot data prepare` from importing
torch and megatron-core (seconds, for a file of two documents); a test checks byte-for-byte that the
files equal what `IndexedDatasetBuilder` writes.
"""

from __future__ import annotations

import struct
from array import array
from types import TracebackType

INDEX_HEADER = b"MMIDIDX\x00\x00"
INDEX_VERSION = 1
# Megatron's DType codes, and the array typecodes of the same width (array's "H" is 2 bytes, "i" 4).
UINT16_CODE, INT32_CODE = 8, 4
UINT16_LIMIT = 65500  # DType.optimal_dtype: uint16 below this many distinct ids


class IndexedDatasetWriter:
    """Stream documents into `prefix.bin`; `finish()` writes `prefix.idx` (one sequence per document)."""

    def __init__(self, prefix: str, vocab_size: int) -> None:
        self.prefix = prefix
        self._typecode, self._code = ("H", UINT16_CODE) if vocab_size < UINT16_LIMIT else ("i", INT32_CODE)
        self._itemsize = array(self._typecode).itemsize
        self._lengths = array("i")
        self._bin = open(prefix + ".bin", "wb")  # noqa: SIM115 - closed by finish() or __exit__
        self.tokens = 0

    def __enter__(self) -> IndexedDatasetWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self._bin.close()

    @property
    def documents(self) -> int:
        return len(self._lengths)

    def add_document(self, token_ids: list[int]) -> None:
        """Append one document (already ending in its end-of-document id) as one sequence."""
        self._bin.write(array(self._typecode, token_ids).tobytes())
        self._lengths.append(len(token_ids))
        self.tokens += len(token_ids)

    def finish(self) -> None:
        """Close the `.bin` and write the `.idx` that describes it."""
        self._bin.close()
        count = len(self._lengths)
        pointers, offset = array("q"), 0
        for length in self._lengths:
            pointers.append(offset)
            offset += length * self._itemsize
        document_indices = array("q", range(count + 1))  # one sequence per document
        with open(self.prefix + ".idx", "wb") as idx:
            idx.write(INDEX_HEADER)
            idx.write(struct.pack("<Q", INDEX_VERSION))
            idx.write(struct.pack("<B", self._code))
            idx.write(struct.pack("<Q", count))
            idx.write(struct.pack("<Q", len(document_indices)))
            for values in (self._lengths, pointers, document_indices):
                idx.write(values.tobytes())

