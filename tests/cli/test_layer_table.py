"""The per-layer table's column labels: short for any pattern of layer indices."""

from __future__ import annotations

import pytest

from megapilot.cli.layer_table import layer_ranges


@pytest.mark.parametrize(("indices", "label"), [
    ((0, 1, 2), "0-2"),
    ((0, 1, 2, 5), "0-2, 5"),
    ((7,), "7"),
    ((0, 2, 4, 6, 8), "0-8 every 2nd"),  # GPT-OSS's alternating window and full layers
    ((3, 7, 11, 15), "3-15 every 4th"),  # Qwen3-Next's attention layers
    ((1, 4, 7), "1-7 every 3rd"),
    ((0, 1, 3, 4, 6, 7, 9, 10, 12), "0-1, 3-4, 6-7, ... (9 layers)"),  # a hybrid's irregular pattern
    ((0, 2), "0, 2"),  # two layers are no pattern
])
def test_layer_indices_read_as_short_labels(indices, label):
    assert layer_ranges(indices) == label
