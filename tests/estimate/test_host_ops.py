"""The ops a CPU rank runs in line: the counts agree with the trainer's, and a CPU step pays them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from megapilot.catalog import get_model
from megapilot.catalog.host import host_spec
from megapilot.estimate import build_case, count_params, host_ops, step_time
from megapilot.estimate.params import layer_params
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


#: the bench's shape variants as model dimensions (`bench/trainer_cpu/op_counts.py` HIDDEN, FFN, HEADS, SEQ and the
#: variants doubling one of them); the trainer's byte vocabulary (258, padded to 384)
SHAPES: dict[str, dict[str, int]] = {
    "gpt": {}, "hidden": {"hidden_size": 128}, "ffn": {"ffn_hidden_size": 512}, "seq": {"seq_length": 128},
    "heads": {"num_attention_heads": 8},
}


def _bench_model(dims: dict[str, int], features: dict[str, object]) -> tuple[ModelSpec, int]:
    shape = {"hidden_size": 64, "ffn_hidden_size": 256, "num_attention_heads": 4, "seq_length": 64} | dims
    seq = shape.pop("seq_length")
    base = get_model("tiny").model_dump() | {"num_layers": LAYERS, "vocab_size": 258, "num_query_groups": None,
                                             "max_position_embeddings": seq, "kv_channels": None} | shape
    return ModelSpec.model_validate(base | features), seq


@pytest.mark.parametrize("variant", [*FEATURES, *SHAPES])
def test_the_element_counts_are_the_ones_the_trainer_wrote(variant):
    """A layer's and a micro-batch's element-wise elements, as the module's form gives them, are within 2 % of what
    the bench counted in the trainer at every variant: each feature alone, and each dimension doubled alone (the
    form was solved from the shape variants; the features' deltas each from their own row)."""
    measured = json.loads(COUNTS.read_text())["counts"][variant]["elements"]
    model, seq = _bench_model(SHAPES.get(variant, {}), FEATURES.get(variant, {}))
    parallel = build_case(model="tiny", gpu="h100", gpus=1, seq_len=128, gbs=1, mbs=1).parallel
    assert host_ops.layer_elements(model, 0, parallel, seq) == pytest.approx(measured["per_layer_micro_batch"],
                                                                            rel=0.02)
    assert host_ops.micro_batch_elements(model, parallel, seq) == pytest.approx(measured["per_micro_batch"],
                                                                               rel=0.02)


def test_a_step_writes_eleven_elements_a_parameter():
    """The optimizer's update, the clipping and the buffers' zeroing: 11 elements a parameter at every variant."""
    for variant, row in json.loads(COUNTS.read_text())["counts"].items():
        model, _ = _bench_model(SHAPES.get(variant, {}), FEATURES.get(variant, {}))
        layer = row["elements"]["per_layer_step"] / host_ops.STEP_ELEMENTS_PER_PARAMETER
        assert layer == pytest.approx(layer_params(model, 0).total, rel=0.01), variant


def _cpu(ops_per_s: float, elements_per_s: float = 1e9):
    return host_spec({"matmul_tflops_one_thread": 0.1, "memory_tbps": 0.02, "ops_per_s": ops_per_s,
                      "elements_per_s": elements_per_s, "runtime_gib": 0.4}, ranks_per_node=2)


def test_a_cpu_step_pays_its_elements_at_the_measured_rate():
    """Half the element rate adds each element's cost once more: the layers', the micro-batches' and the step's."""
    case = build_case(model="tiny", gpu="h100", gpus=2, seq_len=128, gbs=8, mbs=1, recompute="none")

    def step(elements_per_s: float) -> float:
        cluster = case.cluster.model_copy(update={"gpu": _cpu(1e5, elements_per_s)})
        return step_time(case.model, cluster, case.training, case.parallel).step_time_s

    model, p = case.model, case.parallel
    micro_batches = 4
    elements = micro_batches * (model.num_layers * host_ops.layer_elements(model, 0, p, 128)
                                + host_ops.micro_batch_elements(model, p, 128))
    # the step's: each rank updates its half of the parameters (the distributed optimizer over DP 2)
    assert p.distributed_optimizer and p.dp == 2
    elements += host_ops.step_elements(count_params(model, padded_vocab=True).total / 2)
    assert step(1e9) - step(2e9) == pytest.approx(elements * 0.5e-9)


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
