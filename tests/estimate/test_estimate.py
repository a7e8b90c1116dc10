"""The public estimate API and the flags -> specs resolution."""

from __future__ import annotations

import pytest

from megapilot.errors import MegapilotError
from megapilot.estimate import build_case, estimate, estimate_fast
from megapilot.spec import EstimateResult

LLAMA_70B_FLAGS = {"model": "llama3.1-70b", "gpu": "h100", "gpus": 64, "tp": 8, "pp": 4, "gbs": 1024, "seq_len": 4096}


def test_build_case_applies_the_documented_defaults():
    case = build_case(**LLAMA_70B_FLAGS)
    p = case.parallel
    assert (p.dp, p.vpp, p.cp, p.ep, p.etp, p.mbs) == (2, 1, 1, 1, None, 1)
    assert p.sequence_parallel and p.distributed_optimizer and not p.fsdp
    assert p.recompute == "none"  # Megatron-LM's and Megatron-Bridge's: no --recompute-granularity
    assert case.training.precision == "bf16"
    assert case.cluster.gpus_per_node == 8 and case.cluster.num_nodes == 8
    assert not build_case(**(LLAMA_70B_FLAGS | {"tp": 1, "pp": 1})).parallel.sequence_parallel


def test_build_case_uses_four_gpu_trays_on_gb200():
    case = build_case(**(LLAMA_70B_FLAGS | {"gpu": "gb200"}))
    assert case.cluster.gpus_per_node == 4


@pytest.mark.parametrize(
    ("flags", "field"),
    [
        ({"tp": 3}, "gpus"),
        ({"bogus": 1}, "bogus"),
        ({"tp": "eight"}, "tp"),
        ({"tp": 0}, "tp"),
        ({"model": None}, "model"),
        ({"tp": 1, "pp": 1, "sequence_parallel": True}, "sequence_parallel"),
        ({"precision": "int3"}, "precision"),
        ({"recompute": "sometimes"}, "recompute"),
        ({"gpu": "tpu-v9"}, "gpu"),
        ({"model": "no-such-model"}, "model"),
    ],
)
def test_build_case_names_the_bad_flag(flags, field):
    with pytest.raises(MegapilotError) as info:
        build_case(**{k: v for k, v in (LLAMA_70B_FLAGS | flags).items() if v is not None})
    assert info.value.field == field


def test_estimate_returns_the_public_result_with_every_documented_field():
    case = build_case(**LLAMA_70B_FLAGS)
    result = estimate(case.model, case.cluster, case.training, case.parallel)
    assert isinstance(result, EstimateResult)
    assert result.params.total == pytest.approx(70.55e9, rel=0.01)
    assert result.fits and result.memory_gib.capacity == 80.0
    assert set(result.time_breakdown_s) >= {"compute", "tp_comm", "cp_comm", "pp_bubble", "dp_comm", "ep_comm",
                                            "recompute"}
    dumped = result.model_dump()
    assert 0 < dumped["bubble_fraction"] < 1 and 0 <= dumped["exposed_comm_fraction"] < 1


def test_estimate_carries_layout_warnings_and_fast_path_gives_the_same_numbers():
    case = build_case(**(LLAMA_70B_FLAGS | {"sequence_parallel": False}))
    result = estimate(case.model, case.cluster, case.training, case.parallel)
    assert any("sequence parallel" in w for w in result.warnings)
    fast = estimate_fast(case.model, case.cluster, case.training, case.parallel)
    assert fast.time.step_time_s == result.step_time_s
    assert round(fast.memory.total_gib, 3) == result.memory_gib.total


def test_estimate_refuses_a_layout_megatron_would_refuse():
    case = build_case(**(LLAMA_70B_FLAGS | {"pp": 4, "vpp": 3}))  # 80 layers over 12 chunks
    with pytest.raises(MegapilotError) as info:
        estimate(case.model, case.cluster, case.training, case.parallel)
    assert info.value.field == "vpp"


def test_estimate_warns_when_the_layout_does_not_fit():
    case = build_case(**(LLAMA_70B_FLAGS | {"tp": 1, "pp": 1, "gbs": 64, "recompute": "none"}))
    result = estimate(case.model, case.cluster, case.training, case.parallel)
    assert not result.fits
    assert any("does not fit" in w for w in result.warnings)


# Layouts of the later-release families that Megatron-Core accepts and the estimate once refused
# (bench/refusals/README.md: the rule, its Megatron-Core source, the sweep's counts).
ACCEPTED_NOW = {
    "tp above the kv heads": {"model": "qwen3-30b-a3b", "gpu": "b200", "gpus": 64, "tp": 8, "ep": 8, "etp": 1,
                              "precision": "mxfp8", "gbs": 512, "seq_len": 4096},
    "tp across nvl72 trays": {"model": "llama3.1-70b", "gpu": "gb200", "gpus": 64, "tp": 8, "pp": 2,
                              "precision": "fp8", "gbs": 256, "seq_len": 8192},
    "hybrid first/last split": {"model": "nemotron-h-56b", "gpu": "gb300", "gpus": 64, "tp": 2, "pp": 4,
                                "first_stage_layers": 29, "last_stage_layers": 29, "precision": "nvfp4",
                                "gbs": 256, "seq_len": 8192},
    "hybrid interleaved": {"model": "nemotron3-nano-30b-a3b", "gpu": "b200", "gpus": 32, "pp": 2, "vpp": 2,
                           "ep": 8, "etp": 1, "precision": "mxfp8", "gbs": 256, "seq_len": 8192},
    "hybrid layout string": {"model": "nemotron3-super-120b-a12b", "gpu": "gb200", "gpus": 64, "pp": 4,
                             "pp_layout": "balanced", "ep": 16, "etp": 1, "precision": "nvfp4", "gbs": 256,
                             "seq_len": 8192},
    "gated deltanet cp": {"model": "qwen3-next-80b-a3b", "gpu": "b200", "gpus": 64, "tp": 2, "cp": 2, "ep": 16,
                          "etp": 1, "precision": "fp8", "fp8_recipe": "blockwise", "gbs": 256, "seq_len": 8192},
}


@pytest.mark.parametrize("flags", ACCEPTED_NOW.values(), ids=ACCEPTED_NOW.keys())
def test_layouts_megatron_core_accepts_are_estimated(flags: dict):
    case = build_case(**flags)
    result = estimate(case.model, case.cluster, case.training, case.parallel)
    assert result.tokens_per_s_per_gpu > 0 and result.memory_gib.total > 0


def test_a_block_scaled_format_hopper_lacks_stays_refused_with_the_recipe_it_has():
    """Transformer Engine's check_mxfp8_support needs compute capability 10.0: Megatron cannot run it on Hopper."""
    flags = ACCEPTED_NOW["tp above the kv heads"] | {"gpu": "h100"}
    with pytest.raises(MegapilotError) as info:
        build_case(**flags)
    assert info.value.field == "precision" and "blockwise" in (info.value.fix or "")


def test_moe_estimate_counts_active_parameters_and_expert_communication():
    case = build_case(model="mixtral-8x7b", gpu="h100", gpus=64, tp=1, ep=8, gbs=256, seq_len=4096)
    result = estimate(case.model, case.cluster, case.training, case.parallel)
    assert result.params.active < result.params.total / 3
    assert result.time_breakdown_s["ep_comm"] > 0


@pytest.mark.parametrize(("layout", "named", "not_named"), [
    ({"tp": 1, "pp": 1, "recompute": "none", "distributed_optimizer": True},
     ["Megatron-FSDP", "full activation recompute", "more pipeline stages", "--grad-reduce-in-bf16"],
     ["distributed optimizer"]),
    ({"tp": 1, "pp": 1, "recompute": "none", "distributed_optimizer": True, "grad_reduce_in_bf16": True},
     ["Megatron-FSDP"], ["bf16 gradients"]),  # on already
    ({"tp": 1, "pp": 1, "recompute": "none", "distributed_optimizer": True, "precision": "fp16"},
     ["Megatron-FSDP"], ["bf16 gradients"]),  # fp16 gradients are 16-bit already
    ({"tp": 1, "pp": 1, "recompute": "full", "fsdp": True, "seq_len": 65536},
     ["more tensor-parallel ranks"], ["distributed optimizer", "Megatron-FSDP", "recompute", "more pipeline stages"]),
    ({"tp": 1, "pp": 1, "recompute": "none", "distributed_optimizer": False},
     ["the distributed optimizer", "Megatron-FSDP"], []),
    ({"tp": 2, "pp": 2, "recompute": "full", "sequence_parallel": False, "distributed_optimizer": True},
     ["sequence parallelism", "Megatron-FSDP (--use-megatron-fsdp, with PP 1)"],
     ["distributed optimizer", "recompute"]),
    # TP already fills the 8-GPU node: TP 16 is refused by the layout checks, so it is not offered
    ({"tp": 8, "pp": 1, "recompute": "none", "seq_len": 32768}, ["more pipeline stages"], ["tensor-parallel"]),
])
def test_memory_advice_names_only_what_is_not_on(layout: dict, named: list[str], not_named: list[str]):
    case = build_case(**(LLAMA_70B_FLAGS | {"gbs": 64} | layout))
    [advice] = [w for w in estimate(case.model, case.cluster, case.training, case.parallel).warnings
                if "does not fit" in w]
    for saver in named:
        assert saver in advice, saver
    for saver in not_named:
        assert saver not in advice, saver
