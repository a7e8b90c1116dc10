"""trainer.train: the loss it reports and how it prints (whole runs of the trainer are in tests/trainer and
tests/e2e, on real Megatron-Core)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

from megapilot.trainer.train import _loss_func, emit, log  # noqa: E402


def test_the_loss_is_summed_over_unmasked_tokens_and_reported_with_their_count():
    per_token = torch.tensor([[2.0, 4.0, 100.0], [6.0, 8.0, 100.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    loss, tokens, report = _loss_func(mask, per_token)
    assert loss.item() == 20.0 and tokens.item() == 4 and tokens.dtype == torch.int
    assert report["lm loss"].tolist() == [20.0, 4.0]  # the log divides: 5.0 per token, padding left out
    loss.div_(4)  # the schedule scales the loss in place; the report must not move with it
    assert report["lm loss"].tolist() == [20.0, 4.0]


def test_without_a_process_group_every_filter_prints_as_the_only_rank(capsys):
    log("a", rank_zero_only=True)
    log("b", last_rank_only=True)
    emit("c")
    assert capsys.readouterr().out == "a\nb\nc\n"
