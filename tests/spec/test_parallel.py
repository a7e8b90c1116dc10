"""ParallelConfig: the derived sizes, the rules it checks on its own, and the layer split per rank."""

from __future__ import annotations

import pytest
from pydantic import Field, ValidationError

from megapilot.errors import MegapilotError
from megapilot.spec.parallel import LAYOUT_FIELDS, LayoutPins, ParallelConfig, pipeline_rank_layer_counts


def test_world_is_tp_pp_cp_dp_and_experts_are_carved_from_tp_cp_dp():
    p = ParallelConfig(tp=4, pp=2, cp=2, dp=8, ep=8, etp=1)
    assert p.world_size == 128 and p.model_parallel_size == 16
    # ETP x EP x expert-DP = TP x CP x DP = 64, so expert DP = 64 / (8 x 1)
    assert p.expert_tp == 1 and p.expert_dp == 8
    assert ParallelConfig(tp=4, dp=2, ep=2).expert_tp == 4  # unset ETP follows TP
    assert ParallelConfig(tp=4, dp=2, ep=2).expert_dp == 1


def test_microbatches_per_replica_follow_the_global_batch():
    assert ParallelConfig(dp=8, mbs=2).num_microbatches(1024) == 64


def test_for_world_derives_dp_and_refuses_a_product_that_does_not_divide():
    p = ParallelConfig.for_world(64, tp=4, pp=2, cp=None, mbs=2)
    assert (p.tp, p.pp, p.cp, p.dp, p.mbs) == (4, 2, 1, 8, 2)
    with pytest.raises(MegapilotError) as info:
        ParallelConfig.for_world(48, tp=8, pp=4)
    assert info.value.field == "gpus" and "does not divide 48" in str(info.value)


@pytest.mark.parametrize(("fields", "message"), [
    ({"sequence_parallel": True}, "sequence_parallel needs tp > 1"),
    ({"vpp": 2}, "vpp > 1 needs pp > 1"),
    ({"recompute": "selective", "recompute_num_layers": 2}, "applies only to recompute='full'"),
    ({"first_stage_layers": 3}, "need pp > 1"),
    ({"tp": 0}, "greater than or equal to 1"),
    ({"zero_bubble": True}, "Extra inputs are not permitted"),
])
def test_inconsistent_layouts_are_refused_by_name(fields, message):
    with pytest.raises(ValidationError, match=message):
        ParallelConfig(**fields)


def test_layouts_are_frozen_values():
    p = ParallelConfig(tp=2, dp=4)
    with pytest.raises(ValidationError):
        p.tp = 4
    assert p == ParallelConfig(tp=2, dp=4) and hash(p) == hash(ParallelConfig(tp=2, dp=4))


def test_rank_layer_counts_even_and_uneven():
    assert ParallelConfig(pp=4).rank_layer_counts(32) == (8, 8, 8, 8)
    # Megatron-Core's uneven rule: the given end counts, the rest shared equally by the middle ranks.
    uneven = ParallelConfig(pp=4, first_stage_layers=3, last_stage_layers=3)
    assert uneven.uneven_pipeline and uneven.rank_layer_counts(126) == (3, 60, 60, 3)
    assert pipeline_rank_layer_counts(126, 16, 7, 7) == (7,) + (8,) * 14 + (7,)
    assert pipeline_rank_layer_counts(30, 4, None, 6) == (8, 8, 8, 6)
    assert not ParallelConfig(pp=4).uneven_pipeline


def test_account_for_flags_take_a_layer_slot_on_the_end_ranks():
    # 30 layers + embedding + loss = 32 slots over 4 ranks: the first and last ranks give one slot away.
    p = ParallelConfig(pp=4, account_for_embedding=True, account_for_loss=True)
    assert p.rank_layer_counts(30) == (7, 8, 8, 7)
    assert sum(p.rank_layer_counts(30)) == 30


def test_a_layout_string_fixes_vpp_from_its_stage_count():
    p = ParallelConfig(pp=2, pipeline_layout="Ett|tt|tt|ttL")
    assert p.vpp == 2 and p.rank_layer_counts(8) == (4, 4)


def test_shell_block_names_every_dimension_and_the_split():
    p = ParallelConfig(tp=8, pp=16, cp=2, dp=16, vpp=1, mbs=1, first_stage_layers=7, last_stage_layers=7,
                       sequence_parallel=True)
    assert p.shell_block(2048) == ("TP=8 PP=16 VPP=1 CP=2 EP=1 DP=16 MBS=1 GBS=2048 "
                                   "PP_FIRST_LAYERS=7 PP_LAST_LAYERS=7")
    assert ParallelConfig(pp=2, account_for_loss=True).shell_block(8).endswith("PP_ACCOUNT_LOSS=1")


def test_layout_pins_are_parallel_configs_fields_each_optional():
    """The pins' fields are made from ParallelConfig's: same names and order (DP, derived, aside), the same type
    or None, the same bounds and meaning."""
    assert tuple(LayoutPins.model_fields) == LAYOUT_FIELDS == tuple(n for n in ParallelConfig.model_fields if n != "dp")
    for name, pin in LayoutPins.model_fields.items():
        field = ParallelConfig.model_fields[name]
        assert pin.default is None and pin.annotation == field.annotation | None, name
        assert pin.metadata == field.metadata and pin.description == field.description, name


def test_a_field_added_to_the_layout_is_a_pin_by_that_one_edit():
    from pydantic import create_model

    from megapilot.spec.parallel import _optional_fields

    wider = create_model("WiderConfig", __base__=ParallelConfig, zero_bubble=(bool, Field(default=False)))
    made = _optional_fields(wider, (*LAYOUT_FIELDS, "zero_bubble"))
    assert made["zero_bubble"][0] == bool | None and made["zero_bubble"][1].default is None


def test_layout_pins_check_a_given_value_as_parallel_config_does_and_complete_to_one():
    pins = LayoutPins(tp=2, recompute="full", recompute_num_layers=2)
    assert pins.given() == {"tp": 2, "recompute": "full", "recompute_num_layers": 2}
    config = pins.config(16, pp=2, tp=8)  # the pins win over the caller's defaults
    assert (config.tp, config.pp, config.dp, config.recompute) == (2, 2, 4, "full")
    for bad in ({"tp": 0}, {"recompute": "most"}, {"tp": True}, {"mbs": "2"}, {"zero_bubble": True}):
        with pytest.raises(ValidationError) as info:
            LayoutPins(**bad)
        assert info.value.errors()[0]["loc"][0] in bad, bad
