"""What Megatron-Core 0.16.1 (installed here) makes of a hybrid's split as `script` writes it for that release.

The flags `script` renders for core 0.16.1 are read back and handed to core's own code: `TransformerConfig` (which
checks the uneven split), `allocate_layers` (which parses the pattern) and `MambaStack`'s selection of each
pipeline rank's layers, called per rank with a stand-in for the PP process group that answers its rank and size
(a fake only for the group: the layers selected are core's). Each rank must get exactly the pattern's layers of
megapilot's resolved stage. Core 0.16.1 also refuses a `|` segmented pattern, which is why the segments are written
only for core 0.17 on.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import pytest

pytest.importorskip("megatron.core")

import torch
from megatron.core.ssm.mamba_block import MambaStack
from megatron.core.ssm.mamba_hybrid_layer_allocation import allocate_layers
from megatron.core.transformer.transformer_config import TransformerConfig

from megapilot.launch import LaunchOptions, render_megatron_args
from megapilot.spec import SavedPlan
from tests.launch.plans import make_plan
from tests.launch.test_hybrid_split import H8B, TRAIN, UNEVEN

CORE_0_16_1 = LaunchOptions(mock_data=True, megatron_path="/opt/Megatron-LM", megatron_version="0.16.1",
                            check_paths_exist=False)


@dataclass(frozen=True)
class FakePipelineGroup:
    """Stands in for one rank's PP process group: MambaStack asks it only for its rank and size."""

    pp_rank: int
    pp_size: int

    def rank(self) -> int:
        return self.pp_rank

    def size(self) -> int:
        return self.pp_size


def _int_flag(args: list[str], flag: str) -> int | None:
    return int(args[args.index(flag) + 1]) if flag in args else None


def _core_rank_layers(args: list[str]) -> list[str]:
    """Each PP rank's layers as core 0.16.1 selects them from the rendered flags."""
    pp = _int_flag(args, "--pipeline-model-parallel-size") or 1
    num_layers = _int_flag(args, "--num-layers")
    assert num_layers is not None
    config = TransformerConfig(
        num_layers=num_layers, hidden_size=64, num_attention_heads=4, pipeline_model_parallel_size=pp,
        num_layers_in_first_pipeline_stage=_int_flag(args, "--decoder-first-pipeline-num-layers"),
        num_layers_in_last_pipeline_stage=_int_flag(args, "--decoder-last-pipeline-num-layers"),
        pipeline_dtype=torch.float32)
    layer_types = allocate_layers(num_layers, 0.0, 0.0, args[args.index("--hybrid-override-pattern") + 1])
    ranks = []
    for rank in range(pp):
        stack = SimpleNamespace(config=config, pp_group=FakePipelineGroup(rank, pp))
        _, selected = MambaStack._select_layers_for_pipeline_parallel(stack, layer_types)  # type: ignore[arg-type]  # the attributes it reads
        ranks.append("".join(selected))
    return ranks


def _planned_rank_layers(plan: SavedPlan) -> list[str]:
    pattern = plan.model.hybrid_override_pattern
    assert pattern is not None
    stages = plan.parallel.pipeline_stages(plan.model.num_layers, plan.model.mtp_num_layers)
    return [pattern[layers[0]:layers[-1] + 1] for layers in map(stages.decoder_layers, range(plan.parallel.pp))]


@pytest.mark.parametrize("plan", [
    UNEVEN,  # first/last counts as planned: 18/17/17
    make_plan(H8B, "h100", 1, TRAIN, pp=4, pipeline_layout="Et*14|t*12|t*12|t*14L"),  # a layout, as counts
    make_plan(H8B, "h100", 1, TRAIN, pp=4),  # even
], ids=["first-last", "layout", "even"])
def test_core_0_16_1_places_each_ranks_layers_where_the_plan_put_them(plan: SavedPlan) -> None:
    args = render_megatron_args(plan, CORE_0_16_1)
    assert _core_rank_layers(args) == _planned_rank_layers(plan)


def test_core_0_16_1_refuses_a_segmented_pattern() -> None:
    """The | segments written for core 0.17 on are not a layer symbol to 0.16.1's allocate_layers."""
    segmented = render_megatron_args(UNEVEN, CORE_0_16_1.model_copy(update={"megatron_version": "0.17.0"}))
    pattern = segmented[segmented.index("--hybrid-layer-pattern") + 1]
    with pytest.raises(ValueError, match="'\\|' is not one of"):
        allocate_layers(len(pattern), 0.0, 0.0, pattern)
