"""The ops a CPU rank runs in line: the counts agree with the trainer's, and a CPU step pays them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from megapilot.catalog import get_model
from megapilot.catalog.host import host_spec
from megapilot.estimate import build_case, host_ops, step_time
from megapilot.spec.model import ModelSpec

COUNTS = Path(__file__).parents[2] / "bench" / "trainer_cpu" / "op_counts.json"
LAYERS = 4

#: the bench's variants as model features (its flags, `bench/trainer_cpu/op_counts.py` VARIANTS)
FEATURES: dict[str, dict[str, object]] = {
    "gpt": {},
    "rmsnorm": {"normalization": "RMSNorm"},
    "swiglu": {"mlp_activation": "swiglu"},
    "no_bias": {"add_bias_linear": False},
    "rope": {"position_embedding": "rope"},
    "gqa": {"num_query_groups": 2},
}


def _variant(features: dict[str, object]) -> ModelSpec:
    base = get_model("tiny").model_copy(update={"num_layers": LAYERS})
    return ModelSpec.model_validate(base.model_dump() | features)


@pytest.mark.parametrize("variant", FEATURES)
def test_the_counts_are_the_ones_the_trainer_ran(variant):
    """Each feature's ops, as the module counts them, are the ones the bench counted in the trainer (committed in
    op_counts.json): a change to the trainer's layers shows here once the bench is run again."""
    measured = json.loads(COUNTS.read_text())["counts"][variant]
    model = _variant(FEATURES[variant])
    assert host_ops.layer_ops(model, 0) == measured["per_layer_micro_batch"]
    assert host_ops.micro_batch_ops(model) == measured["per_micro_batch"]
    step = measured["per_step"] + measured["per_layer_step"] * LAYERS
    parallel = build_case(model="tiny", gpu="h100", gpus=2, seq_len=128, gbs=8, mbs=1).parallel
    assert host_ops.step_ops(model, parallel) == \
        pytest.approx(step, abs=1.0)  # rope's table: one op a step the per-tensor form leaves out


def test_the_counts_hold_for_the_shape_the_solve_never_saw():
    """The bench solves four shapes exactly; its fifth shape (3 layers, 6 micro-batches) checks the form."""
    for variant, row in json.loads(COUNTS.read_text())["counts"].items():
        assert row["check_shape_predicted"] == row["check_shape_measured"], variant


def _cpu(ops_per_s: float):
    return host_spec({"matmul_tflops_one_thread": 0.1, "memory_tbps": 0.02, "ops_per_s": ops_per_s},
                     ranks_per_node=2)


def test_a_cpu_step_pays_its_ops_at_the_measured_cost():
    """Twice the op cost adds one op cost per op: the tiny GPT on two ranks at MBS 1, GBS 8 runs 4 micro-batches
    of 4 layers a step: 4 x (4 x 165 + 123) ops in them, 25 + 4 x 4 + 13 x 52 tensors' worth once."""
    case = build_case(model="tiny", gpu="h100", gpus=2, seq_len=128, gbs=8, mbs=1, recompute="none")

    def step(ops_per_s: float) -> float:
        cluster = case.cluster.model_copy(update={"gpu": _cpu(ops_per_s)})
        return step_time(case.model, cluster, case.training, case.parallel).step_time_s

    ops = 4 * (4 * 165 + 123) + 25 + 4 * 4 + 13 * 52
    assert step(1e5) - step(2e5) == pytest.approx(ops * 5e-6)


def test_a_gpu_pays_no_host_op():
    """A GPU's host queues ahead of it: its kernels cost the fitted overhead, never a host op."""
    case = build_case(model="tiny", gpu="h100", gpus=2, seq_len=128, gbs=8, mbs=1)
    assert case.cluster.gpu.host_op_s == 0.0
