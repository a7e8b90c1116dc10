"""Core attention for multi-latent attention without Transformer Engine (the embedded trainer on CPU).

Megatron-Core 0.16.1 builds MLA's core attention with `k_channels` (q/k head dim = nope + rope dims) and
`v_channels` (the value head dim), which only Transformer Engine's attention accepts: its local
`DotProductAttention` assumes one head dim and refuses those arguments. This module is that core
attention written with torch's scaled_dot_product_attention, for one tensor-parallel rank and no context
parallelism (what a CPU run has): causal softmax(q·kᵀ·scale)·v over [seq, batch, heads, dim] inputs.
"""

from __future__ import annotations

import importlib.util
from dataclasses import replace
from typing import Any

import torch
import torch.nn.functional as F
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_config import TransformerConfig


class LocalMLACoreAttention(MegatronModule):
    """Causal attention with separate q/k and v head dims (the local stand-in for TE's MLA attention)."""

    def __init__(self, config: TransformerConfig, layer_number: int, attn_mask_type: Any, attention_type: str,
                 softmax_scale: float | None = None, k_channels: int | None = None,
                 v_channels: int | None = None, **_unused: Any) -> None:
        super().__init__(config=config)
        if config.tensor_model_parallel_size != 1 or config.context_parallel_size != 1:
            raise ValueError("LocalMLACoreAttention runs with TP=1 and CP=1 (Transformer Engine does the rest)")
        self.softmax_scale = softmax_scale
        self.dropout = config.attention_dropout

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: torch.Tensor | None, attn_mask_type: Any = None,
                attention_bias: torch.Tensor | None = None, packed_seq_params: Any = None,
                **_unused: Any) -> torch.Tensor:
        """[s, b, n, d] inputs -> [s, b, n·dv]; the causal mask is built here, as TE's causal type does."""
        if packed_seq_params is not None:
            raise ValueError("packed sequences need Transformer Engine's attention")
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, n, s, d]
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.softmax_scale,
                                             dropout_p=self.dropout if self.training else 0.0)
        seq, batch = query.shape[0], query.shape[1]
        return out.permute(2, 0, 1, 3).reshape(seq, batch, -1)


def _mla_module_without_transformer_engine() -> None:
    """Megatron-Core 0.16.1's multi_latent_attention sets HAVE_TE from an import that succeeds without
    Transformer Engine (TELinear is then None), and `isinstance(linear_proj, None)` fails when the layer
    is built. Without TE installed, the module's flag is set to what it means."""
    # the module whose flag is corrected, imported only to correct it
    from megatron.core.transformer import multi_latent_attention

    if importlib.util.find_spec("transformer_engine") is None:
        multi_latent_attention.HAVE_TE = False


def with_local_mla_attention(spec: Any) -> Any:
    """The same layer/block spec with MLA's core attention replaced by `LocalMLACoreAttention`."""
    _mla_module_without_transformer_engine()
    if hasattr(spec, "layer_specs"):
        return replace(spec, layer_specs=[with_local_mla_attention(layer) for layer in spec.layer_specs])
    attention = spec.submodules.self_attention
    new_attention = replace(attention, submodules=replace(attention.submodules,
                                                          core_attention=ModuleSpec(module=LocalMLACoreAttention)))
    return replace(spec, submodules=replace(spec.submodules, self_attention=new_attention))
