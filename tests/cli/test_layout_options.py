"""The shared split options parse the same way wherever a command declares them."""

from __future__ import annotations

import json
from dataclasses import fields

import pytest
import typer
from typer.testing import CliRunner

from megapilot.case_flags import REQUIRED_FLAGS
from megapilot.cli.layout_options import (
    NOTHING_GIVEN,
    LayoutFlags,
    layout_options,
    split_flags,
)
from megapilot.estimate import build_case
from megapilot.estimate.cases import KNOWN_FLAGS


def _app(seen: list) -> typer.Typer:
    app = typer.Typer()

    @app.command()
    @layout_options()
    def command(layout: LayoutFlags) -> None:
        seen.append((split_flags(layout.first_stage_layers, layout.last_stage_layers, layout.account_for_embedding,
                                 layout.account_for_loss, layout.pipeline_layout), layout.sequence_parallel))

    return app


def test_the_options_become_build_case_keys_that_build_the_split():
    seen: list = []
    result = CliRunner().invoke(_app(seen), ["--account-for-embedding", "--account-for-loss", "--sp"])
    assert result.exit_code == 0, result.output
    flags, sequence_parallel = seen[0]
    assert sequence_parallel is True
    case = build_case(model="llama3.1-405b", gpu="h100", gpus=512, tp=8, pp=8, vpp=8, gbs=512, seq_len=8192,
                      **flags)
    assert case.parallel.rank_layer_counts(126) == (15,) + (16,) * 6 + (15,)


def test_a_layout_string_and_the_no_sp_spelling_pass_through():
    seen: list = []
    CliRunner().invoke(_app(seen), ["--pp-layout", "Et*3|(tt|)*29,m|L", "--no-sp"])
    flags, sequence_parallel = seen[0]
    assert flags["pipeline_layout"] == "Et*3|(tt|)*29,m|L" and flags["account_for_loss"] is None
    assert sequence_parallel is False


LLAMA_405B = ("--model", "llama3.1-405b", "--gpu", "h100", "--gpus", "1024", "--tp", "8", "--gbs", "512",
              "--seq-len", "8192", "--recompute", "full")


def test_estimate_prints_the_balanced_layout_it_computed(cli):
    result = cli("estimate", *LLAMA_405B, "--pp", "16", "--pp-layout", "balanced")
    assert result.exit_code == 0, result.stderr
    assert "pipeline split: Et*" in result.stdout
    doc = json.loads(cli("estimate", *LLAMA_405B, "--pp", "16", "--pp-layout", "balanced", "--json").stdout)
    assert doc["pipeline_split"].startswith("Et*") and doc["pipeline_split"].endswith("L")


def test_a_split_that_does_not_divide_is_one_line_naming_the_legal_options(cli):
    # script writes the command line, so it asks for the split (estimate prices the balanced one and says so)
    result = cli("script", *LLAMA_405B, "--pp", "16", "--mock-data", "--megatron-path", "/opt/Megatron-LM", "--remote")
    assert result.exit_code == 2
    assert "account_for_embedding and account_for_loss" in result.stderr and "\n" not in result.stderr.strip()


def test_script_writes_the_account_for_switches(cli, tmp_path):
    out = tmp_path / "run.sh"
    result = cli("script", *LLAMA_405B, "--pp", "8", "--vpp", "8", "--account-for-embedding", "--account-for-loss",
                 "--mock-data", "--megatron-path", "/opt/Megatron-LM", "--output", str(out))
    assert result.exit_code == 0, result.stderr
    text = out.read_text()
    assert "--account-for-embedding-in-pipeline-split" in text and "--num-virtual-stages-per-pipeline-rank 8" in text


def test_plan_leaves_the_headroom_asked_for(cli):
    args = ("plan", "--model", "llama3.1-70b", "--gpu", "h100", "--gpus", "64", "--seq-len", "8192", "--gbs", "512",
            "--top", "1", "--json")
    memory = json.loads(cli(*args, "--headroom", "0.3").stdout)["candidates"][0]["estimate"]["memory_gib"]
    assert memory["total"] <= 0.7 * memory["capacity"]


# ---- LayoutFlags: the one declaration estimate, script and plan read their layout options from ----------------


def test_the_required_fields_and_every_field_are_build_case_flags():
    assert set(REQUIRED_FLAGS) <= {item.name for item in fields(LayoutFlags)} <= KNOWN_FLAGS


def test_nothing_given_is_none_for_build_case_and_an_empty_given_list():
    layout = LayoutFlags()
    assert layout.given() == []
    flags = layout.case_flags()
    # the one default that is not None is the switch build_case reads as such (the distributed optimizer's
    # default depends on the optimizer: on with Adam, off with Muon)
    assert {name: value for name, value in flags.items() if value is not None} == {"fsdp": False}


def test_given_names_each_option_as_it_was_typed():
    layout = LayoutFlags(tp=4, distributed_optimizer=False, account_for_loss=True, seq_len=8192)
    assert layout.given() == ["--tp", "--seq-len", "--no-distributed-optimizer", "--account-for-loss"]


def _decorated_app(seen: list, **decorator_args) -> typer.Typer:
    app = typer.Typer()

    @app.command()
    @layout_options(**decorator_args)
    def command(before: int = 0, layout: LayoutFlags = NOTHING_GIVEN, after: str = "x") -> None:
        """A command."""
        seen.append((before, layout, after))

    return app


def test_the_decorator_hands_the_command_one_typed_layout_and_its_own_options():
    seen: list = []
    result = CliRunner().invoke(_decorated_app(seen), ["--before", "3", "--model", "m", "--tp", "2", "--no-sp",
                                                       "--fsdp", "--after", "y"])
    assert result.exit_code == 0, result.output
    assert seen == [(3, LayoutFlags(model="m", tp=2, sequence_parallel=False, fsdp=True), "y")]


def test_the_decorator_adds_the_required_and_per_command_notes_to_the_shared_help():
    seen: list = []
    app = _decorated_app(seen, required_note="Needed here.", notes={"gpus": "Or ask."})
    help_text = " ".join(CliRunner().invoke(app, ["--help"], env={"COLUMNS": "300"}).output.split())
    assert "Needed here. Sequence length, tokens." in help_text
    assert "Total GPUs. Or ask." in help_text
    assert "Needed here. Tensor parallel" not in help_text  # tp is not required


def test_a_note_for_an_unknown_option_is_refused_when_the_command_is_declared():

    with pytest.raises(TypeError, match="no such layout option"):
        layout_options(notes={"gpu_count": "typo"})


def _option_help(command: str) -> dict[str, str]:
    """`--flag` -> the help text the command's `--help` prints for it."""
    from megapilot.cli.app import app

    group = typer.main.get_command(app)
    options = group.commands[command].params  # type: ignore[attr-defined]
    return {name: option.help for option in options for name in option.opts}


def test_estimate_script_and_plan_show_one_text_for_each_shared_option():
    estimate, script, plan = (_option_help(name) for name in ("estimate", "script", "plan"))
    shared = ("--tp", "--pp", "--vpp", "--etp", "--mbs", "--precision", "--recompute", "--gpus-per-node",
              "--pp-layout", "--fsdp", "--first-stage-layers")
    for flag in shared:
        assert estimate[flag] == script[flag], flag
    assert estimate["--gpu"] == "Required (unless --batch). " + script["--gpu"] == "Required (unless --batch). " + \
        plan["--gpu"]
    assert plan["--gpus-per-node"] == script["--gpus-per-node"]
    assert script["--gpus"].startswith(plan["--gpus"]) and "--nodes" in script["--gpus"]


def test_plans_pins_say_what_the_field_means_as_estimate_does_and_that_the_search_fills_them():
    """A pin's help is the layout field's description (ParallelConfig's), as `estimate`'s option is, with the
    planner's default (searched) where `estimate` states its own."""
    estimate, plan = _option_help("estimate"), _option_help("plan")
    for flag in ("--tp", "--pp", "--vpp", "--cp", "--ep", "--etp", "--mbs", "--recompute", "--recompute-modules",
                 "--fsdp"):
        stem = plan[flag].removesuffix("default: searched).")
        assert stem != plan[flag] and estimate[flag].startswith(stem.removesuffix(" (")), flag
    assert plan["--tp"] == "Tensor parallel size (default: searched)."


def test_the_run_features_are_one_declaration_in_estimate_plan_and_script():
    """MTP, token dropping and the dispatcher: the same options, the same text, in all three commands (the
    flex dispatcher was declared twice, and plan had none of them)."""
    from megapilot.cli.layout_options import FeatureFlags

    helps = [_option_help(name) for name in ("estimate", "script", "plan")]
    for item in fields(FeatureFlags):
        flag = "--" + item.name.replace("_", "-")
        assert helps[0][flag] == helps[1][flag] == helps[2][flag], flag
    assert {item.name for item in fields(FeatureFlags)} <= KNOWN_FLAGS
    assert helps[2]["--tensor-model-parallel-size"] == helps[2]["--tp"]  # plan's pins take Megatron's spellings


def test_a_script_with_the_flex_dispatcher_does_not_say_it_assumed_alltoall(cli):
    args = ("script", "--model", "mixtral-8x7b", "--gpu", "h100", "--gpus", "8", "--ep", "8", "--gbs", "64",
            "--seq-len", "4096", "--mock-data", "--megatron-path", "/opt/Megatron-LM", "--remote", "--json")
    assert any("alltoall MoE dispatcher" in line for line in cli(*args).json()["assumed"])
    flex = cli(*args, "--moe-flex-dispatcher", "deepep").json()["assumed"]
    assert not any("dispatcher" in line for line in flex)


def test_a_saved_plan_keeps_its_model_and_the_script_refuses_to_change_it(cli, tmp_path):
    target = tmp_path / "plan.json"
    assert cli("plan", "--model", "mixtral-8x7b", "--gpu", "h100", "--gpus", "16", "--gbs", "64", "--top", "1",
               "--save", str(target)).exit_code == 0
    changed = cli("script", "--plan", str(target), "--mock-data", "--megatron-path", "/opt/Megatron-LM", "--remote",
                  "--moe-capacity-factor", "1.0")
    assert changed.exit_code == 2 and "--moe-capacity-factor cannot change a saved plan" in changed.stderr


LLAMA_70B_PP4 = ("--model", "llama3.1-70b", "--gpu", "h100", "--gpus", "64", "--tp", "8", "--pp", "4", "--gbs", "64",
                 "--seq-len", "4096")


@pytest.mark.parametrize("spelling", ["--vpp", "--num-virtual-stages-per-pipeline-rank",
                                      "--virtual-pipeline-model-parallel-size"])
def test_vpp_is_taken_under_its_name_megatrons_flag_and_the_config_name_it_was_first_taken_by(cli, spelling):
    interleaved = json.loads(cli("estimate", *LLAMA_70B_PP4, spelling, "2", "--json").stdout)
    assert interleaved == json.loads(cli("estimate", *LLAMA_70B_PP4, "--vpp", "2", "--json").stdout)
    assert interleaved["bubble_fraction"] < json.loads(cli("estimate", *LLAMA_70B_PP4, "--json").stdout)[
        "bubble_fraction"]
    plan = json.loads(cli("plan", *LLAMA_70B_PP4[:6], "--pp", "4", spelling, "4", "--top", "1", "--json").stdout)
    assert plan["candidates"][0]["parallel"]["vpp"] == 4


def test_the_help_lists_vpp_as_megatron_spells_its_flag_and_no_other_long_name():
    """Megatron-LM's flag is --num-virtual-stages-per-pipeline-rank (what `script` writes); the config name the
    options took at first still parses, unlisted."""
    for command in ("estimate", "script", "plan"):
        helps = _option_help(command)
        assert helps["--num-virtual-stages-per-pipeline-rank"] == helps["--vpp"], command
        assert _hidden(command, "--virtual-pipeline-model-parallel-size"), command
        assert not _hidden(command, "--vpp"), command


def _hidden(command: str, flag: str) -> bool:
    from megapilot.cli.app import app

    options = typer.main.get_command(app).commands[command].params  # type: ignore[attr-defined]
    return next(option for option in options if flag in option.opts).hidden


def test_vpp_given_under_two_spellings_is_refused_on_one_line(cli):
    for command, args in (("estimate", LLAMA_70B_PP4), ("plan", LLAMA_70B_PP4[:6])):
        result = cli(command, *args, "--vpp", "2", "--virtual-pipeline-model-parallel-size", "2")
        assert result.exit_code == 2
        assert "vpp: given twice" in result.stderr and "\n" not in result.stderr.strip()


@pytest.mark.parametrize("command", ["estimate", "plan", "script"])
def test_an_on_only_switch_has_no_off_form(cli, command):
    """A switch that only turns a feature on (`--grad-reduce-in-bf16`, `--moe-a2a-overlap`) offers no `--no-` form:
    the off form would read as given and mean Megatron's default. The tri-state ones keep theirs."""
    shown = cli(command, "--help").stdout
    assert "--grad-reduce-in-bf16" in shown and "--no-grad-reduce-in-bf16" not in shown
    assert "--moe-a2a-overlap" in shown and "--no-moe-a2a-overlap" not in shown
