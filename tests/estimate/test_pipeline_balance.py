"""The balanced pipeline layout weighted by the FLOP model or by each item's time on a layout, and the split flags
through build_case."""

from __future__ import annotations

import pytest

from megapilot.errors import MegapilotError
from megapilot.estimate import EstimateOptions, build_case, estimate
from megapilot.estimate.pipeline_balance import balanced_split, stage_weights
from megapilot.estimate.step_time import stage_time_weights
from megapilot.spec.model import ModelSpec, MoESpec
from megapilot.spec.pipeline import parse_layout

CASE = {"model": "llama3.1-405b", "gpu": "h100", "gpus": 1024, "tp": 8, "gbs": 512, "seq_len": 8192}


# Dense-first layers four times lighter than the MoE layers after them (top-2 of width 4 x the dense width).
LIGHT_FIRST = ModelSpec(
    name="light-first", num_layers=20, hidden_size=1024, ffn_hidden_size=1024, num_attention_heads=8,
    vocab_size=32000, mtp_num_layers=1,
    moe=MoESpec(num_experts=8, router_topk=2, moe_ffn_hidden_size=8192, first_k_dense_layers=4),
)


def test_dense_first_layers_of_an_moe_model_weigh_less_than_its_moe_layers():
    weights = stage_weights(LIGHT_FIRST, 4096)
    assert weights.decoder[0] < weights.decoder[4] / 2
    assert weights.mtp > weights.decoder[-1]  # a layer plus its own logits


def test_a_balanced_layout_gives_the_lighter_layers_more_company():
    split = balanced_split(LIGHT_FIRST, 4, 1, stage_weights(LIGHT_FIRST, 4096))
    stages = parse_layout(split.layout or "")
    assert len(stages) == 4
    assert stages[0].count("t") > stages[2].count("t")  # the dense layers share a stage with more of them
    assert "".join(stages).count("t") == 20 and stages[-1].endswith("mL")


DEEPSEEK_GB200 = {"model": "deepseek-v3", "gpu": "gb200", "gpus": 256, "tp": 1, "pp": 4, "vpp": 4, "ep": 64, "etp": 1,
                  "gbs": 2048, "seq_len": 4096, "precision": "fp8", "recompute": "none"}


def test_time_weights_price_an_moe_layer_above_its_flops_share_against_the_loss():
    """An MoE layer spends more time per FLOP (all-to-all, token passes, grouped GEMMs) than the loss's one logits
    GEMM: by time the loss and the MTP module weigh less, in MoE layers, than by FLOPs."""
    case = build_case(**DEEPSEEK_GB200)
    by_time = stage_time_weights(case.model, case.cluster, case.training, case.parallel, EstimateOptions())
    by_flops = stage_weights(case.model, 4096)
    moe_layer = case.model.moe.first_k_dense_layers
    assert by_time.loss / by_time.decoder[moe_layer] < by_flops.loss / by_flops.decoder[moe_layer]
    assert by_time.mtp / by_time.decoder[moe_layer] < by_flops.mtp / by_flops.decoder[moe_layer]
    assert by_time.decoder[0] < by_time.decoder[moe_layer]  # a dense-first layer is still the lighter


def test_the_time_balanced_layout_is_the_faster_one_on_its_own_layout():
    """`--pp-layout balanced` cuts by time on the layout given: DeepSeek-V3's 61 layers + MTP at PP 4 x VPP 4 put a
    decoder layer beside the MTP module and the loss (the FLOP cut gives them a stage alone and another stage five
    MoE layers), and estimate faster than the FLOP cut."""
    case = build_case(**DEEPSEEK_GB200, pipeline_layout="balanced")
    stages = parse_layout(case.parallel.pipeline_layout or "")
    assert stages[-1].endswith("mL") and stages[-1].count("t") >= 1
    by_flops = case.parallel.model_copy(update={
        "pipeline_layout": balanced_split(case.model, 4, 4, stage_weights(case.model, 4096)).layout})
    timed = estimate(case.model, case.cluster, case.training, case.parallel).tokens_per_s_per_gpu
    assert timed > 1.03 * estimate(case.model, case.cluster, case.training, by_flops).tokens_per_s_per_gpu


def test_pipeline_layout_balanced_is_resolved_to_a_string_and_estimated():
    case = build_case(**CASE, pp=16, pipeline_layout="balanced")
    layout = case.parallel.pipeline_layout
    assert layout is not None and layout != "balanced"
    assert sum(case.parallel.rank_layer_counts(126)) == 126
    assert estimate(case.model, case.cluster, case.training, case.parallel).tokens_per_s_per_gpu > 0


def test_account_for_flags_make_126_layers_legal_on_pp8_vpp8():
    case = build_case(**CASE, pp=8, vpp=8, account_for_embedding=True, account_for_loss=True)
    result = estimate(case.model, case.cluster, case.training, case.parallel)
    assert result.tokens_per_s_per_gpu > 0
    assert case.parallel.rank_layer_counts(126) == (15,) + (16,) * 6 + (15,)


def test_with_both_slots_accounted_two_ranks_hold_63_layers_and_the_ends():
    accounted = build_case(**(CASE | {"gpus": 16}), pp=2, account_for_loss=True, account_for_embedding=True)
    stages = accounted.parallel.pipeline_stages(126)
    assert stages.rank_layer_counts() == (63, 63)
    assert stages.chunk(0, 0).startswith("E") and stages.chunk(1, 0).endswith("L")


@pytest.mark.parametrize(("extra", "field"), [
    ({"pp": 16}, "pp"),
    ({"pp": 1, "pipeline_layout": "balanced"}, "pipeline_layout"),
    ({"pp": 2, "pipeline_layout": "Et x|L"}, "pipeline_layout"),
    ({"pp": 4, "first_stage_layers": 30, "account_for_loss": True}, "account_for_embedding"),
])
def test_bad_splits_are_user_errors_naming_the_field(extra, field):
    with pytest.raises(MegapilotError) as err:
        case = build_case(**CASE, **extra)
        estimate(case.model, case.cluster, case.training, case.parallel)
    assert err.value.field == field


def test_a_balanced_layout_packs_no_stage_with_more_layers_than_the_time_bound_needs():
    """A stage's activations go with its layers, not its time: DeepSeek-V3 on 1,024 H100 at PP 8 x VPP 4 (the 25.09
    recipe's layout) had put its three cheap dense-first layers beside the embedding (Et*3|...) and needed 94.7 GiB
    on the first rank; two layers a stage, at the same step time, fit an 80 GiB H100 without recompute."""
    flags = {"model": "deepseek-v3", "gpu": "h100", "gpus": 1024, "tp": 2, "pp": 8, "vpp": 4, "ep": 64, "gbs": 8192,
             "seq_len": 4096, "precision": "fp8", "recompute": "none", "pipeline_layout": "balanced"}
    case = build_case(**flags)
    stages = parse_layout(case.parallel.pipeline_layout or "")
    assert max(stage.count("t") for stage in stages) == 2 and stages[-1].endswith("mL")
    result = estimate(case.model, case.cluster, case.training, case.parallel)
    assert result.fits and result.memory_gib.total < 80
