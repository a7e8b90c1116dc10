"""Layout rules: each broken rule is one MegapilotError naming the field and the fix."""

from __future__ import annotations

import pytest

from megapilot.catalog import get_gpu
from megapilot.errors import MegapilotError
from megapilot.spec import ClusterSpec, ModelSpec, MoESpec, ParallelConfig, TrainingSpec, validate_layout

LLAMA_70B = ModelSpec(
    name="llama-70b-like", num_layers=80, hidden_size=8192, ffn_hidden_size=28672,
    num_attention_heads=64, num_query_groups=8, vocab_size=128256,
)
MOE = ModelSpec(
    name="tiny-moe", num_layers=4, hidden_size=256, ffn_hidden_size=1024, num_attention_heads=8,
    vocab_size=1000, moe=MoESpec(num_experts=8, router_topk=2, moe_ffn_hidden_size=512),
)


def _cluster(gpu: str = "h100", gpus: int = 64) -> ClusterSpec:
    return ClusterSpec.from_gpu_count(get_gpu(gpu), gpus)


def _layout(world: int = 64, **kw) -> ParallelConfig:
    return ParallelConfig.for_world(world, **kw)


def test_valid_llama70b_layout_passes():
    warnings = validate_layout(LLAMA_70B, _cluster(), TrainingSpec(seq_length=4096, global_batch_size=1024),
                               _layout(tp=8, pp=4, sequence_parallel=True))
    assert warnings == []


@pytest.mark.parametrize(
    ("model", "kw", "training", "gpu", "field"),
    [
        (LLAMA_70B, dict(tp=16, pp=4), {}, "h100", "tp"),  # 16 > 8 GPUs per node, 8 KV heads
        (LLAMA_70B, dict(tp=8, pp=3), {}, "h100", "gpus"),  # 3*8 does not divide 64
        (LLAMA_70B, dict(tp=8, pp=8, vpp=3), {}, "h100", "vpp"),  # 80 % 24
        (LLAMA_70B, dict(tp=8, cp=8), dict(seq_length=4100), "h100", "seq_length"),
        (LLAMA_70B, dict(tp=8), dict(global_batch_size=12), "h100", "global_batch_size"),
        (LLAMA_70B, dict(tp=8), dict(precision="fp8"), "a100", "precision"),
        (MOE, dict(ep=3), {}, "h100", "ep"),
        (MOE, dict(tp=8, pp=4, ep=8, dp=2), {}, "h100", "ep"),
    ],
)
def test_broken_rule_names_field_and_fix(model, kw, training, gpu, field):
    spec = TrainingSpec(**({"seq_length": 4096, "global_batch_size": 1024} | training))
    with pytest.raises(MegapilotError) as err:
        validate_layout(model, _cluster(gpu), spec, _layout(**kw))
    assert err.value.field == field
    assert err.value.fix


def test_tp_above_kv_heads_is_refused():
    model = LLAMA_70B.model_copy(update={"num_query_groups": 4})
    with pytest.raises(MegapilotError, match="KV heads"):
        validate_layout(model, _cluster(), TrainingSpec(seq_length=4096, global_batch_size=1024), _layout(tp=8))


def test_world_mismatch_is_refused():
    with pytest.raises(MegapilotError, match="TP\\*PP\\*CP\\*DP"):
        validate_layout(LLAMA_70B, _cluster(), TrainingSpec(seq_length=4096, global_batch_size=1024),
                        ParallelConfig(tp=8, pp=4, dp=1))


def test_dense_model_refuses_expert_parallel():
    with pytest.raises(MegapilotError) as err:
        validate_layout(LLAMA_70B, _cluster(), TrainingSpec(seq_length=4096, global_batch_size=1024),
                        _layout(tp=8, ep=2))
    assert err.value.field == "ep"


def test_pipeline_that_never_fills_warns():
    warnings = validate_layout(LLAMA_70B, _cluster(), TrainingSpec(seq_length=4096, global_batch_size=4),
                               _layout(tp=8, pp=8, sequence_parallel=True))
    assert any("never fills" in w for w in warnings)
