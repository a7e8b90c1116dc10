"""The trainer's own MLA core attention against a plain causal attention written out in torch, on CPU."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("megatron.core")

import torch
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.transformer_config import TransformerConfig

from megapilot.trainer.mla_attention import LocalMLACoreAttention, with_local_mla_attention

SEQ, BATCH, HEADS, QK_DIM, V_DIM = 5, 2, 3, 6, 4  # q/k and v head dims differ, as in MLA


def _config(**overrides: object) -> TransformerConfig:
    options: dict = {"num_layers": 1, "hidden_size": 12, "num_attention_heads": HEADS, "attention_dropout": 0.0}
    return TransformerConfig(**(options | overrides))


def _attention(config: TransformerConfig | None = None, softmax_scale: float | None = None) -> LocalMLACoreAttention:
    return LocalMLACoreAttention(config or _config(), layer_number=1, attn_mask_type=AttnMaskType.causal,
                                 attention_type="self", softmax_scale=softmax_scale, k_channels=QK_DIM,
                                 v_channels=V_DIM)


def _reference(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float) -> torch.Tensor:
    """softmax(q·kᵀ·scale + causal mask)·v, one (batch, head) at a time, heads concatenated per token."""
    seq, batch, heads, _ = query.shape
    out = torch.empty(seq, batch, heads * value.shape[-1], dtype=query.dtype)
    future = torch.triu(torch.ones(seq, seq, dtype=torch.bool), diagonal=1)
    for b in range(batch):
        for h in range(heads):
            scores = (query[:, b, h] @ key[:, b, h].T) * scale
            weights = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
            out[:, b, h * value.shape[-1]:(h + 1) * value.shape[-1]] = weights @ value[:, b, h]
    return out


def _inputs(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(SEQ, BATCH, HEADS, QK_DIM, generator=generator, dtype=torch.float64) for _ in range(2))
    return q, k, torch.randn(SEQ, BATCH, HEADS, V_DIM, generator=generator, dtype=torch.float64)


def test_default_scale_matches_the_reference_with_two_head_dims():
    q, k, v = _inputs()
    out = _attention()(q, k, v, attention_mask=None)
    assert out.shape == (SEQ, BATCH, HEADS * V_DIM)
    torch.testing.assert_close(out, _reference(q, k, v, 1 / math.sqrt(QK_DIM)))


def test_a_given_softmax_scale_is_used():
    q, k, v = _inputs(1)
    out = _attention(softmax_scale=0.05)(q, k, v, attention_mask=None)
    torch.testing.assert_close(out, _reference(q, k, v, 0.05))
    assert not torch.allclose(out, _reference(q, k, v, 1 / math.sqrt(QK_DIM)))


def test_a_token_never_sees_a_later_one():
    q, k, v = _inputs(2)
    changed_k, changed_v = k.clone(), v.clone()
    changed_k[-1], changed_v[-1] = 100.0, -100.0  # only the last position changes
    attention = _attention()
    before, after = attention(q, k, v, None), attention(q, changed_k, changed_v, None)
    torch.testing.assert_close(before[:-1], after[:-1])
    assert not torch.allclose(before[-1], after[-1])


def test_dropout_applies_in_training_only():
    q, k, v = _inputs(3)
    attention = _attention(_config(attention_dropout=0.5))
    attention.eval()
    torch.testing.assert_close(attention(q, k, v, None), _reference(q, k, v, 1 / math.sqrt(QK_DIM)))
    attention.train()
    torch.manual_seed(0)
    assert not torch.allclose(attention(q, k, v, None), _reference(q, k, v, 1 / math.sqrt(QK_DIM)))


def test_tensor_parallel_and_packed_sequences_are_refused():
    with pytest.raises(ValueError, match="TP=1 and CP=1"):
        _attention(_config(context_parallel_size=2))
    q, k, v = _inputs()
    with pytest.raises(ValueError, match="packed sequences"):
        _attention()(q, k, v, None, packed_seq_params=object())


def test_the_spec_swaps_only_the_core_attention_of_each_layer():
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules

    layer = get_gpt_layer_local_spec(multi_latent_attention=True)
    megatron_core_attention = layer.submodules.self_attention.submodules.core_attention
    swapped = with_local_mla_attention(layer)
    attention = swapped.submodules.self_attention
    assert attention.submodules.core_attention.module is LocalMLACoreAttention
    assert layer.submodules.self_attention.submodules.core_attention is megatron_core_attention  # a copy was changed
    assert attention.module is layer.submodules.self_attention.module  # the MLA layer itself is kept
    assert attention.submodules.linear_proj == layer.submodules.self_attention.submodules.linear_proj
    block = with_local_mla_attention(TransformerBlockSubmodules(layer_specs=[layer, layer]))
    assert [spec.submodules.self_attention.submodules.core_attention.module for spec in block.layer_specs] == \
        [LocalMLACoreAttention] * 2
