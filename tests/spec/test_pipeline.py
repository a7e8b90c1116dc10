"""The pipeline split vocabulary against Megatron-Core's own layout parser and layer placement (core 0.16.1 on CPU)."""

from __future__ import annotations

import random
import re
import warnings
from itertools import combinations_with_replacement, pairwise

import pytest

from megapilot.errors import MegapilotError
from megapilot.spec.parallel import ParallelConfig
from megapilot.spec.pipeline import (
    EVEN_SPLIT,
    NoPipelineSplit,
    PipelineSplit,
    _bisected_bound,
    _linear_partition,
    _replayed_bound,
    balanced_stages,
    compress_layout,
    parse_layout,
    resolve_split,
)

# Layouts published by Megatron-LM's docs, Megatron-Bridge and Primus recipes (reference: megatron_recipes.md §1.4).
PUBLISHED_LAYOUTS = [  # (layout, num_layers, mtp, pp)
    ("Et*3|(tt|)*29,m|L", 61, 1, 16),
    ("Et|(tt|)*30mL", 61, 1, 8),
    ("Et*4|(t*4|)*14tmL", 61, 1, 2),
    ("Et*16|t*16|t*16|t*13mL", 61, 1, 4),
    ("Et*8|(t*8|)*6t*5mL", 61, 1, 8),
    ("Et*4|(t*4|)*14tmL", 61, 1, 16),
    ("Et*2|(t*2|)*34,t*3|(t*2|)*3,tL", 80, 0, 8),
    ("Et*5|" + "t*6|" * 14 + "t*5,L", 94, 0, 4),
]


def _megatron():
    pytest.importorskip("megatron.core")
    warnings.filterwarnings("ignore", category=UserWarning)
    from megatron.core.transformer.enums import LayerType
    from megatron.core.transformer.pipeline_parallel_layer_layout import (
        PipelineParallelLayerLayout,
    )

    return LayerType, PipelineParallelLayerLayout


def _as_chars(megatron_stages: list) -> tuple[str, ...]:
    letters = {"embedding": "E", "decoder": "t", "mtp": "m", "loss": "L"}
    return tuple("".join(letters[layer.name] for layer in stage) for stage in megatron_stages)


@pytest.mark.parametrize(("layout", "layers", "mtp", "pp"), PUBLISHED_LAYOUTS)
def test_published_layouts_parse_and_place_layers_as_megatron_does(layout, layers, mtp, pp):
    layer_type, megatron_layout = _megatron()
    assert parse_layout(layout) == _as_chars(megatron_layout.parse_str_to_list(layout))
    theirs = megatron_layout(layout, pp)
    standalone = theirs.validate_layer_layout(layers, mtp)
    ours = PipelineSplit(layout=layout).resolve(layers, mtp, pp)
    assert ours.vpp == theirs.virtual_pipeline_model_parallel_size
    assert ours.mtp_standalone == standalone
    from megatron.core import parallel_state

    parallel_state.set_virtual_pipeline_model_parallel_world_size(ours.vpp if ours.vpp > 1 else None)
    try:
        for rank in range(pp):
            expected = [i for v in range(ours.vpp)
                        for i in theirs.get_layer_id_list(layer_type.decoder, vp_stage=v, pp_rank=rank)]
            assert list(ours.decoder_layers(rank)) == expected, (layout, rank)
    finally:
        parallel_state.set_virtual_pipeline_model_parallel_world_size(None)


@pytest.mark.parametrize(("layers", "pp", "vpp", "embedding", "loss"), [
    (126, 8, 8, True, True), (126, 16, 1, True, True), (94, 16, 1, True, True), (94, 8, 4, True, True),
    (63, 8, 1, True, False), (15, 4, 1, False, True), (8, 2, 2, False, False),
])
def test_account_for_splits_build_the_layers_megatron_builds(layers, pp, vpp, embedding, loss):
    _megatron()
    import torch
    from megatron.core.transformer.transformer_block import get_num_layers_to_build
    from megatron.core.transformer.transformer_config import TransformerConfig
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    config = TransformerConfig(
        num_layers=layers, hidden_size=8, num_attention_heads=2, pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=vpp if vpp > 1 else None, pipeline_dtype=torch.float32,
        account_for_embedding_in_pipeline_split=embedding, account_for_loss_in_pipeline_split=loss)
    ours = PipelineSplit(account_for_embedding=embedding, account_for_loss=loss).resolve(layers, 0, pp, vpp)
    for rank in range(pp):
        for v in range(vpp):
            vp_stage = v if vpp > 1 else None
            count = get_num_layers_to_build(config, vp_stage=vp_stage, pp_rank=rank)
            offset = get_transformer_layer_offset(config, vp_stage=vp_stage, pp_rank=rank)
            chunk = ours.chunk(rank, v)
            assert chunk.count("t") == count, (rank, v)
            held = ours.decoder_layers(rank)
            before = sum(ours.chunk(rank, u).count("t") for u in range(v))
            if count:
                assert held[before] == offset, (rank, v)


def test_405b_on_pp8_vpp8_holds_the_embedding_and_loss_in_a_slot_each():
    stages = PipelineSplit(account_for_embedding=True, account_for_loss=True).resolve(126, 0, 8, 8)
    assert stages.chunk(0, 0) == "Et" and stages.chunk(7, 7) == "tL"
    assert stages.rank_layer_counts() == (15,) + (16,) * 6 + (15,)
    assert ParallelConfig(tp=8, pp=8, vpp=8, account_for_embedding=True, account_for_loss=True) \
        .rank_layer_counts(126) == (15,) + (16,) * 6 + (15,)


def test_a_layout_sets_vpp_and_an_explicit_conflicting_vpp_is_refused():
    assert ParallelConfig(pp=16, pipeline_layout="Et*3|(tt|)*29,m|L").vpp == 2
    with pytest.raises(MegapilotError, match="conflicts") as err:
        PipelineSplit(layout="Et*3|(tt|)*29,m|L").resolve(61, 1, 16, 4)
    assert err.value.field == "vpp"


@pytest.mark.parametrize(("layout", "layers", "mtp", "pp", "words"), [
    ("tE|L", 1, 0, 2, "start with the embedding"),
    ("Et|tL|L", 2, 0, 3, "exactly once"),
    ("Et|t", 2, 0, 2, "end with the loss"),
    ("Et|tL", 3, 0, 2, "3"),
    ("Et|mtL", 2, 1, 2, "before MTP"),
    ("Et|m|tL|L", 2, 1, 2, ""),
    ("Et t|L", 2, 0, 2, "invalid layer character ' '"),
    ("Et|t|L", 2, 0, 2, "not divisible by pp=2"),
    ("Emt|t|tL|", 2, 1, 2, ""),
    ("Et|tm||L", 2, 1, 2, "last virtual stage"),
])
def test_layouts_megatron_refuses_are_refused_naming_the_rule(layout, layers, mtp, pp, words):
    with pytest.raises(MegapilotError) as err:
        PipelineSplit(layout=layout).resolve(layers, mtp, pp)
    assert err.value.field in ("pipeline_layout", "vpp")
    assert words in str(err.value)


def test_the_layout_cannot_be_mixed_with_the_other_vocabularies():
    with pytest.raises(ValueError, match="cannot be set with"):
        PipelineSplit(layout="Et|tL", first_stage_layers=1)
    with pytest.raises(ValueError, match="cannot be combined"):
        ParallelConfig(pp=4, first_stage_layers=3, account_for_loss=True)


def test_a_split_that_does_not_divide_lists_every_legal_option_and_each_works():
    with pytest.raises(NoPipelineSplit) as err:  # the refusal a balanced split answers, by type (estimate reads it)
        EVEN_SPLIT.resolve(126, 0, 16, 1)
    assert err.value.field == "pp"
    fix = err.value.fix or ""
    assert "account_for_embedding and account_for_loss" in fix
    assert "first_stage_layers=7 and last_stage_layers=7" in fix
    layout = re.search(r'pipeline_layout "([^"]+)"', fix)
    assert layout is not None
    for split in (PipelineSplit(account_for_embedding=True, account_for_loss=True),
                  PipelineSplit(first_stage_layers=7, last_stage_layers=7), PipelineSplit(layout=layout.group(1))):
        assert sum(split.resolve(126, 0, 16).rank_layer_counts()) == 126


@pytest.mark.parametrize(("layers", "mtp", "pp", "vpp"), [
    (126, 0, 16, 1), (126, 0, 8, 8), (61, 1, 16, 2), (61, 1, 8, 4), (94, 0, 16, 1), (80, 0, 8, 5), (3, 0, 4, 2),
])
def test_balanced_layouts_are_legal_for_megatron_and_as_even_as_the_items_allow(layers, mtp, pp, vpp):
    _, megatron_layout = _megatron()
    stages = balanced_stages(layers, mtp, pp, vpp)
    text = stages.layout_string()
    assert parse_layout(text) == stages.stages  # the printed string means what was computed
    theirs = megatron_layout(text, pp)
    theirs.validate_layer_layout(layers, mtp)
    assert theirs.virtual_pipeline_model_parallel_size == vpp
    # Unit cost per layer, loss ~ 1 layer, MTP ~ 2: no virtual stage above the ceiling of the mean.
    total = layers + 1 + 2 * mtp
    heaviest = max(s.count("t") + s.count("L") + 2 * s.count("m") for s in stages.stages)
    assert heaviest <= -(-total // (pp * vpp)) + (2 if mtp else 0)


def test_compressed_strings_round_trip_through_megatrons_parser():
    _, megatron_layout = _megatron()
    for stages in (("Et", "t", "t", "tL"), ("E", "", "", "t", "t", "L"), ("Ett", "tt", "tt", "mL")):
        text = compress_layout(stages)
        assert _as_chars(megatron_layout.parse_str_to_list(text)) == stages


def test_the_uneven_split_resolves_to_megatrons_rank_counts():
    stages = resolve_split(PipelineSplit(first_stage_layers=7, last_stage_layers=7), 126, 0, 16, 1)
    assert stages.rank_layer_counts() == (7,) + (8,) * 14 + (7,)
    assert stages.chunk(0, 0).startswith("E") and stages.chunk(15, 0).endswith("L")


def test_flags_and_labels_name_each_vocabulary():
    assert PipelineSplit(account_for_embedding=True, account_for_loss=True).megatron_flags() == [
        ("--account-for-embedding-in-pipeline-split", None), ("--account-for-loss-in-pipeline-split", None)]
    assert PipelineSplit(layout="Et|tL").megatron_flags() == [("--pipeline-model-parallel-layout", "Et|tL")]
    assert PipelineSplit(first_stage_layers=7).label() == "first 7"
    assert EVEN_SPLIT.label() == "even"


def _random_costs(rng: random.Random, n: int) -> list[float]:
    """Weights like the planner's (a free embedding, a heavier loss) plus the awkward ones: ties, zeros, floats."""
    kind = rng.randrange(4)
    if kind == 0:
        return [rng.random() for _ in range(n)]
    if kind == 1:
        return [float(rng.randint(0, 3)) for _ in range(n)]
    if kind == 2:
        return [0.0] + [1.0] * (n - 2) + [2.5] if n > 2 else [1.0] * n
    return [rng.choice([0.1, 0.2, 0.3, 0.7, 1.3]) for _ in range(n)]


def _brute_force_bottleneck(costs: list[float], parts: int) -> float:
    """The least largest-group sum over every way to cut `costs` into `parts` contiguous (possibly empty) groups."""
    n = len(costs)
    return min(max(sum(costs[a:b]) for a, b in pairwise((0, *inner, n)))
               for inner in combinations_with_replacement(range(n + 1), parts - 1))


def test_the_linear_partition_reaches_the_brute_force_minimum_on_small_random_inputs():
    rng = random.Random(31)
    for _ in range(400):
        n, parts = rng.randint(1, 9), rng.randint(1, 5)
        costs = _random_costs(rng, n)
        cuts = _linear_partition(costs, parts)
        assert len(cuts) == parts + 1 and cuts[0] == 0 and cuts[-1] == n and cuts == sorted(cuts)
        largest = max(sum(costs[a:b]) for a, b in pairwise(cuts))
        assert largest == pytest.approx(_brute_force_bottleneck(costs, parts), rel=1e-9, abs=1e-12), (costs, parts)


def test_the_replayed_bisection_lands_on_the_same_float_as_sixty_fills():
    rng = random.Random(8192)
    for _ in range(300):
        n, parts = rng.randint(1, 130), rng.randint(1, 96)
        costs = _random_costs(rng, n)
        assert _replayed_bound(costs, parts) == _bisected_bound(costs, parts), (costs, parts)


@pytest.mark.parametrize("layout", ["Et*999999999999|t*20|t*20|t*20L", "(t|)*99999999999", "E" + "t" * 70000 + "L"])
def test_a_layout_repeated_past_any_model_is_refused_before_it_is_built(layout):
    with pytest.raises(MegapilotError) as caught:
        parse_layout(layout)
    assert caught.value.field == "pipeline_layout" and "symbols" in caught.value.problem
