"""The planner walks CP on an attention-sink model by a2a (Transformer Engine's only CP for sinks) and keeps
Megatron's p2p ring on every other model; a pinned exchange is walked as given."""

from __future__ import annotations

import pytest

from megapilot.catalog import get_gpu, get_model
from megapilot.errors import MegapilotError
from megapilot.plan import Pins, plan
from megapilot.plan.space import RejectReason
from megapilot.spec import ClusterSpec, TrainingSpec

H100S = ClusterSpec.from_gpu_count(get_gpu("h100"), 64)
LONG = TrainingSpec(seq_length=32768, global_batch_size=64)


def test_gpt_oss_is_planned_with_cp_over_a2a_where_the_heads_split():
    result = plan(get_model("gpt-oss-120b"), H100S, LONG, top=5)
    with_cp = [c for c in result.candidates if c.parallel.cp > 1]
    assert with_cp, "CP is what a 32k sequence of GPT-OSS takes beside TP"
    assert all(c.parallel.cp_comm_type == "a2a" for c in with_cp)
    assert RejectReason.CP_SINK not in result.rejected
    assert RejectReason.CP_A2A_HEADS in result.rejected  # TP 8 leaves one KV head per rank: no CP by a2a
    shown = next(c for c in result.candidates if c.parallel.cp > 1)
    assert any("--cp-comm-type a2a" in reason for reason in shown.reasons)
    assert "CP_COMM_TYPE=a2a" in shown.parallel.shell_block(64)


def test_a_model_without_sinks_keeps_the_ring():
    result = plan(get_model("llama3.1-70b"), H100S, LONG, top=5)
    assert any(c.parallel.cp > 1 for c in result.candidates)
    assert all(c.parallel.cp_comm_type == "p2p" for c in result.candidates)


def test_a_pinned_exchange_is_walked_and_a_pinned_ring_on_sinks_is_refused():
    small = TrainingSpec(seq_length=65536, global_batch_size=8)
    cluster = ClusterSpec.from_gpu_count(get_gpu("h100"), 8)
    pinned = plan(get_model("llama3.1-8b"), cluster, small, top=2, pins=Pins(cp=4, cp_comm_type="a2a"))
    assert all((c.parallel.cp, c.parallel.cp_comm_type) == (4, "a2a") for c in pinned.candidates)
    with pytest.raises(MegapilotError, match="attention sinks") as info:
        plan(get_model("gpt-oss-20b"), cluster, small, top=2, pins=Pins(cp=2, cp_comm_type="p2p"))
    assert info.value.field == "cp_comm_type"


def test_a_sliding_window_model_is_planned_with_cp_over_a2a():
    windowed = get_model("llama3.1-70b").model_copy(update={"sliding_window": 4096})
    result = plan(windowed, H100S, LONG, top=5)
    with_cp = [c for c in result.candidates if c.parallel.cp > 1]
    assert with_cp and all(c.parallel.cp_comm_type == "a2a" for c in with_cp)
    assert RejectReason.CP_WINDOW not in result.rejected
    assert any("(a sliding window runs under CP only so)" in reason for reason in with_cp[0].reasons)
