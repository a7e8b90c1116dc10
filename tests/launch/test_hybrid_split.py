"""A hybrid (Mamba) model's uneven or interleaved pipeline split, written as each Megatron-LM release places it.

From core_v0.17.0 on: `|` segments of --hybrid-layer-pattern, one per PP x VPP stage in layer-id order, with no
split flag beside them; on core_v0.16.1: first/last counts beside the plain pattern; before, and where a release
cannot place the split, a refusal naming the field and the release that can. An even split is written as it
always was. Core 0.16.1's own placement of what is written here: test_hybrid_split_megatron.py.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml

from megapilot.catalog import get_model
from megapilot.diagnose import read_flags, run_config
from megapilot.errors import MegapilotError
from megapilot.launch import LaunchOptions, render_launch, render_megatron_args
from megapilot.spec import SavedPlan, TrainingSpec
from tests.launch.plans import make_plan

NANO = get_model("nemotron3-nano-30b-a3b")  # 52 layers, Mamba-2 + attention + MoE
SUPER = get_model("nemotron3-super-120b-a12b")  # 88 layers and an MTP module ('*E')
H8B = get_model("nemotron-h-8b")  # 52 layers, Mamba-2 + attention + MLP
TRAIN = TrainingSpec(seq_length=4096, global_batch_size=96)
SPLIT_FLAGS = ("--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
               "--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank",
               "--pipeline-model-parallel-layout", "--account-for-embedding-in-pipeline-split",
               "--account-for-loss-in-pipeline-split")
# PP 3 over 52 layers: 18 on the first rank, 17 on each other
UNEVEN = make_plan(NANO, "h100", 3, TRAIN, pp=3, ep=8, first_stage_layers=18, last_stage_layers=17)
INTERLEAVED = make_plan(SUPER, "h100", 8, TRAIN, tp=2, pp=4, vpp=2, ep=8)  # 8 stages of 11 layers, MTP on the last


def _options(version: str | None = None, launcher: str = "torchrun") -> LaunchOptions:
    return LaunchOptions(launcher=launcher, mock_data=True, megatron_path="/opt/Megatron-LM", megatron_version=version,  # type: ignore[arg-type]  # a launcher name
                         script_path="/lustre/jobs/hybrid/train.sh", check_paths_exist=False)


def _value(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def _stage_layer_counts(plan: SavedPlan) -> list[int]:
    stages = plan.parallel.pipeline_stages(plan.model.num_layers, plan.model.mtp_num_layers)
    return [stage.count("t") for stage in stages.stages]


@pytest.mark.parametrize("version", [None, "0.17.0", "0.18.0", "0.19.0"])
@pytest.mark.parametrize("plan", [UNEVEN, INTERLEAVED], ids=["uneven", "interleaved"])
def test_from_core_0_17_the_split_is_the_pattern_cut_into_one_segment_per_stage(plan: SavedPlan,
                                                                               version: str | None) -> None:
    args = render_megatron_args(plan, _options(version))
    segments = _value(args, "--hybrid-layer-pattern").split("|")
    assert [len(segment) for segment in segments] == _stage_layer_counts(plan)
    assert "".join(segments) == plan.model.hybrid_override_pattern
    assert "--hybrid-override-pattern" not in args and not set(SPLIT_FLAGS) & set(args)
    assert _value(args, "--pipeline-model-parallel-size") == str(plan.parallel.pp)
    assert _value(args, "--num-layers") == str(plan.model.num_layers)  # what Megatron counts from the pattern


def test_an_interleaved_hybrid_keeps_its_mtp_module_and_gets_the_overlaps_that_need_vpp() -> None:
    args = render_megatron_args(INTERLEAVED, _options())
    assert len(_value(args, "--hybrid-layer-pattern").split("|")) == 4 * 2
    assert (_value(args, "--mtp-num-layers"), _value(args, "--mtp-hybrid-override-pattern")) == ("1", "*E")
    assert "--overlap-param-gather-with-optimizer-step" in args  # its check sees VPP 2 in the segments


@pytest.mark.parametrize("launcher", ["torchrun", "slurm", "primus"])
def test_every_launcher_carries_the_segmented_pattern(launcher: str) -> None:
    launch = render_launch(UNEVEN, _options(launcher=launcher))
    pattern = _value(launch.megatron_args, "--hybrid-layer-pattern")
    if launcher == "primus":
        experiment = yaml.safe_load(launch.files["/lustre/jobs/hybrid/train.primus.yaml"])
        assert experiment["modules"]["pre_trainer"]["overrides"]["hybrid_layer_pattern"] == pattern
    else:
        assert f"--hybrid-layer-pattern '{pattern}'" in launch.script
    assert any("| segments of --hybrid-layer-pattern" in note and "18/17/17" in note for note in launch.notes)


def test_a_layout_string_or_interleaving_becomes_segments_too() -> None:
    """Whatever vocabulary the plan's split is in, the segments are its resolved stages."""
    layout = make_plan(H8B, "h100", 1, TRAIN, pp=4, pipeline_layout="Et*12|t*14|t*14|t*12L")
    assert _value(render_megatron_args(layout, _options()), "--hybrid-layer-pattern").split("|") == [
        H8B.hybrid_override_pattern[a:b] for a, b in ((0, 12), (12, 26), (26, 40), (40, 52))]
    even_interleaved = make_plan(NANO, "h100", 2, TRAIN, pp=2, vpp=2, ep=8)
    assert [len(s) for s in _value(render_megatron_args(even_interleaved, _options()),
                                   "--hybrid-layer-pattern").split("|")] == [13] * 4


def test_core_0_16_1_takes_first_and_last_counts_beside_the_plain_pattern() -> None:
    args = render_megatron_args(UNEVEN, _options("0.16.1"))
    assert _value(args, "--hybrid-override-pattern") == NANO.hybrid_override_pattern
    assert (_value(args, "--decoder-first-pipeline-num-layers"), _value(args, "--decoder-last-pipeline-num-layers")) \
        == ("18", "17")
    assert "--hybrid-layer-pattern" not in args
    # a layout string whose middle ranks are equal says the same as first/last counts
    layout = make_plan(H8B, "h100", 1, TRAIN, pp=4, pipeline_layout="Et*14|t*12|t*12|t*14L")
    args = render_megatron_args(layout, _options("0.16.1"))
    assert (_value(args, "--decoder-first-pipeline-num-layers"), _value(args, "--decoder-last-pipeline-num-layers")) \
        == ("14", "14")
    assert "--pipeline-model-parallel-layout" not in args  # MambaStack never reads it


@pytest.mark.parametrize(("plan", "version", "field", "names"), [
    (UNEVEN, "0.16.0", "first_stage_layers", "0.16.1"),  # 0.16.0's stack ignores the counts
    (UNEVEN, "0.15.0", "first_stage_layers", "0.16.1"),
    (INTERLEAVED, "0.16.1", "vpp", "0.17"),  # MambaStack asserts no virtual pipeline
    (make_plan(H8B, "h100", 1, TRAIN, pp=4, pipeline_layout="Et*14|t*12|t*13|t*13L"), "0.16.1", "pipeline_layout",
     "0.17.0"),  # unequal middle ranks: no first/last counts say it
], ids=["uneven-0.16.0", "uneven-0.15", "vpp-0.16.1", "layout-0.16.1"])
def test_a_split_the_release_cannot_place_is_refused_naming_the_field_and_the_release_that_can(
        plan: SavedPlan, version: str, field: str, names: str) -> None:
    with pytest.raises(MegapilotError) as refused:
        render_launch(plan, _options(version))
    assert refused.value.field == field
    assert f"--megatron-version {names}" in (refused.value.fix or "") and "\n" not in str(refused.value)


def test_a_layout_that_moves_mtp_off_the_last_stage_is_refused_for_a_hybrid() -> None:
    """Megatron's hybrid builds MTP on the last stage: its segments cannot carry a standalone MTP stage."""
    standalone = make_plan(SUPER, "h100", 4, TRAIN, tp=2, pp=4, ep=8, pipeline_layout="Et*30|t*30|t*28m|L")
    with pytest.raises(MegapilotError, match="off the end stages") as refused:
        render_megatron_args(standalone, _options())
    assert refused.value.field == "pipeline_layout"


def test_an_even_split_is_written_as_before_in_every_release() -> None:
    even = make_plan(H8B, "h100", 1, TRAIN, pp=4)
    for version in ("0.15.0", "0.16.0", "0.17.0", None):
        args = render_megatron_args(even, _options(version))
        assert _value(args, "--hybrid-override-pattern") == H8B.hybrid_override_pattern
        assert "--hybrid-layer-pattern" not in args and not set(SPLIT_FLAGS) & set(args)


def test_a_planned_interleaved_hybrid_round_trips_through_plan_script_and_read_back(cli, tmp_path: Path) -> None:
    """`plan --save` hands its layout to `script --plan`; the script says the planned split, and reading the
    script back (`diagnose`) finds the planned PP x VPP."""
    saved = tmp_path / "plan.json"
    planned = cli("plan", "--model", "nemotron3-nano-30b-a3b", "--gpu", "h100", "--gpus", "16", "--pp", "2",
                  "--vpp", "2", "--seq-len", "4096", "--gbs", "64", "--top", "1", "--save", str(saved))
    assert planned.exit_code == 0, planned.stderr
    plan, read_back = _scripted_and_read_back(cli, saved, tmp_path)
    assert read_back is not None and (read_back.pp, read_back.vpp) == (plan.parallel.pp, plan.parallel.vpp) == (2, 2)


def test_an_uneven_split_the_planner_chose_round_trips_through_plan_script_and_read_back(cli, tmp_path: Path) -> None:
    """Nemotron-H 56B's 118 layers at PP 4: the planner picks the split itself (first/last counts or a layout string,
    at the VPP it finds fastest); `script --plan` writes it as the pattern's segments and reads back as planned."""
    saved = tmp_path / "plan.json"
    planned = cli("plan", "--model", "nemotron-h-56b", "--gpu", "h100", "--gpus", "32", "--pp", "4", "--seq-len",
                  "8192", "--gbs", "256", "--top", "1", "--save", str(saved))
    assert planned.exit_code == 0, planned.stderr
    plan, read_back = _scripted_and_read_back(cli, saved, tmp_path)
    assert not plan.parallel.pipeline_split.is_even
    assert read_back is not None
    layers, mtp = plan.model.num_layers, plan.model.mtp_num_layers
    assert read_back.pipeline_stages(layers, mtp) == plan.parallel.pipeline_stages(layers, mtp)


@pytest.mark.parametrize(("plan", "version"), [(UNEVEN, None), (INTERLEAVED, None), (UNEVEN, "0.16.1")],
                         ids=["uneven-segments", "interleaved-segments", "uneven-first-last"])
def test_the_script_reads_back_as_the_planned_stages(plan: SavedPlan, version: str | None) -> None:
    """`diagnose` reads the flags back into the split they place: segments, or first/last counts."""
    args = render_megatron_args(plan, _options(version))
    read_back = run_config(read_flags(flags=shlex.join(args)), gpus=plan.cluster.world_size)
    assert read_back.model is not None and read_back.parallel is not None
    layers, mtp = plan.model.num_layers, plan.model.mtp_num_layers
    assert read_back.parallel.pipeline_stages(layers, mtp) == plan.parallel.pipeline_stages(layers, mtp)


def test_a_refused_split_exits_2_on_one_line(cli, tmp_path: Path) -> None:
    saved = tmp_path / "plan.json"
    saved.write_text(UNEVEN.model_dump_json())
    result = cli("script", "--plan", str(saved), "--mock-data", "--megatron-path", "/opt/Megatron-LM", "--remote",
                 "--megatron-version", "0.16.0")
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and "first_stage_layers" in result.stderr and "0.16.1" in result.stderr


def _scripted_and_read_back(cli, saved: Path, tmp_path: Path):
    """`script --plan` on a saved hybrid plan: its pattern's segments hold the planned stages' layers; returns the
    plan and the parallel layout `diagnose` reads back from the script."""
    plan = SavedPlan.model_validate_json(saved.read_text())
    script = tmp_path / "train.sh"
    result = cli("script", "--plan", str(saved), "--mock-data", "--megatron-path", "/opt/Megatron-LM", "--remote",
                 "-o", str(script), "--json")
    assert result.exit_code == 0, result.stderr
    args = result.json()["megatron_args"]
    assert [len(s) for s in _value(args, "--hybrid-layer-pattern").split("|")] == _stage_layer_counts(plan)
    return plan, run_config(read_flags(script=script)).parallel
