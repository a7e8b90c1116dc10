"""`megapilot plan` and `megapilot profile`: output, JSON schema, saved plan, profile defaults, errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import get_args

import pytest

from megapilot.catalog.gpus import get_gpu
from megapilot.errors import MegapilotError
from megapilot.plan import Pins
from megapilot.spec import SavedPlan
from megapilot.spec.parallel import Recompute
from megapilot.spec.validate import FP32_GRADIENTS_ASSUMED, overlaps_assumed

SMALL = ("plan", "--model", "llama3.1-8b", "--gpu", "h100", "--gpus", "16", "--seq-len", "4096", "--gbs", "128")


@pytest.fixture(autouse=True)
def _no_user_profile(tmp_path, monkeypatch):
    """Never read or write the real user's profile."""
    monkeypatch.setenv("MEGAPILOT_PROFILE", str(tmp_path / "profile.toml"))


def test_plan_json_has_the_stable_schema(cli):
    result = cli(*SMALL, "--top", "3", "--json")
    assert result.exit_code == 0, result.stderr
    doc = result.json()
    assert set(doc) >= {"candidates", "rejected", "shell", "product_check", "summary", "defaults"}
    assert 1 <= len(doc["candidates"]) <= 3
    first = doc["candidates"][0]
    assert set(first) == {"parallel", "estimate", "reasons", "moe_flex_dispatcher"}
    p = first["parallel"]
    assert p["tp"] * p["pp"] * p["cp"] * p["dp"] == 16
    assert doc["shell"].startswith(f"TP={p['tp']} PP={p['pp']} VPP={p['vpp']} CP={p['cp']} EP={p['ep']}")
    assert doc["shell"].endswith("GBS=128")
    assert all(isinstance(v, int) and v > 0 for v in doc["rejected"].values())


def test_plan_table_shows_ranked_layouts_shell_block_and_product(cli):
    result = cli(*SMALL)
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    for heading in ("layout", "memory", "GiB / cap", "step", "tokens/s", "/GPU", "MFU", "bubble", "exposed", "comm %"):
        assert heading in out
    assert "Why #1:" in out and "DP=" in out
    assert "calibration: " in out and "median |error|" in out  # the published runs behind #1's numbers
    assert "TP×PP×CP×DP = " in out and "= 16 GPUs" in out
    assert "GBS=128" in out


def test_a_plan_outside_every_calibrated_cell_says_so_once(cli):
    """The top pick's reasons carry the out-of-coverage warning as a note; the calibration line is not repeated."""
    result = cli("plan", "--model", "gpt-oss-20b", "--gpu", "h100", "--gpus", "16", "--gbs", "64", "--seq-len", "8192",
                 "--top", "2")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.count("no published run has attention sinks") == 1


def test_plan_save_writes_a_plan_the_launcher_reads(cli, tmp_path):
    target = tmp_path / "plan.json"
    result = cli(*SMALL, "--save", str(target), "--json")
    assert result.exit_code == 0, result.stderr
    saved = SavedPlan.model_validate_json(target.read_text())
    assert saved.parallel.model_dump() == result.json()["candidates"][0]["parallel"]
    assert saved.training.global_batch_size == 128 and saved.cluster.world_size == 16
    assert saved.reasons


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--model", "llama3.1-70b", "--gpu", "h100", "--gpus", "64", "--tp", "16"),
         "tp: tp=16 exceeds 8 GPUs per node"),
        (("--model", "mixtral-8x7b", "--gpu", "h100", "--gpus", "64", "--ep", "3"), "ep: ep=3 does not divide"),
        (("--model", "llama3.1-8b", "--gpu", "h100", "--gpus", "64", "--seq-len", "4100", "--cp", "4"),
         "not divisible by 2*cp=8"),
        (("--model", "llama3.1-8b", "--gpu", "a100", "--gpus", "8", "--precision", "fp8"), "precision: fp8"),
        (("--model", "llama3.1-405b", "--gpu", "h100", "--gpus", "8", "--gbs", "64"), "no layout fits"),
        (("--model", "no-such-model", "--gpu", "h100", "--gpus", "8"), "model"),
        (("--model", "llama3.1-8b", "--gpu", "h100", "--gpus", "8", "--recompute", "half"), "recompute"),
        (("--model", "llama3.1-8b", "--gpu", "h100", "--gpus", "8", "--top", "0"), "top: must be at least 1"),
        (("--model", "llama3.1-8b", "--gpu", "h100", "--gpus", "12"), "gpus: 12 GPUs do not fill whole nodes"),
    ],
)
def test_impossible_asks_end_in_one_line_exit_2(cli, args, needle):
    result = cli("plan", *args)
    assert result.exit_code == 2
    assert needle in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.stderr


def test_an_unknown_recompute_is_refused_by_the_layout_fields_own_choices(cli):
    """`--recompute` takes ParallelConfig.recompute's values (spec.parallel.Recompute), refused as its pin refuses
    them: no list of its own in the command, and before any other input is resolved."""
    result = cli("plan", "--model", "no-such-model", "--gpus", "8", "--recompute", "half")
    assert result.exit_code == 2
    with pytest.raises(MegapilotError) as pinned:
        Pins(recompute="half")
    assert result.stderr == f"error: {pinned.value}\n"
    assert all(f"'{choice}'" in result.stderr for choice in get_args(Recompute)) and "got 'half'" in result.stderr


def test_missing_gpu_without_profile_says_how_to_set_it(cli):
    result = cli("plan", "--model", "llama3.1-8b", "--gpus", "8")
    assert result.exit_code == 2
    assert "gpu" in result.stderr and "profile set" in result.stderr


def test_profile_set_show_and_plan_defaults(cli, tmp_path):
    profile = tmp_path / "mine.toml"
    result = cli("profile", "set", "--gpu", "H100", "--gpus", "16", "--gpus-per-node", "8",
                 "--data-path", "/data/c4", "--tokenizer", "gpt2", "--profile", str(profile), "--json")
    assert result.exit_code == 0, result.stderr
    assert result.json()["profile"]["gpu"] == "h100"
    shown = cli("profile", "show", "--profile", str(profile), "--json").json()
    assert shown == {"path": str(profile), "exists": True,
                     "profile": {"gpu": "h100", "gpus": 16, "gpus_per_node": 8, "data_path": "/data/c4",
                                 "tokenizer": "gpt2"}}
    planned = cli("plan", "--model", "llama3.1-8b", "--gbs", "128", "--profile", str(profile), "--json")
    assert planned.exit_code == 0, planned.stderr
    assert f"gpu=h100 from profile {profile}" in planned.json()["defaults"]
    human = cli("plan", "--model", "llama3.1-8b", "--gbs", "128", "--profile", str(profile))
    assert f"gpus=16 from profile {profile}" in human.stderr


def test_profile_from_environment_is_used(cli, tmp_path, monkeypatch):
    env_profile = tmp_path / "env.toml"
    monkeypatch.setenv("MEGAPILOT_PROFILE", str(env_profile))
    assert cli("profile", "set", "--gpu", "a100").exit_code == 0
    assert json.loads(cli("profile", "show", "--json").stdout)["profile"] == {"gpu": "a100"}


def test_profile_refuses_an_unknown_gpu(cli, tmp_path):
    result = cli("profile", "set", "--gpu", "z9000", "--profile", str(tmp_path / "p.toml"))
    assert result.exit_code == 2 and "unknown GPU" in result.stderr


def test_tiny_model_step_times_are_shown_in_a_unit_that_keeps_their_digits(cli):
    args = ("plan", "--model", "tiny", "--gpu", "h100", "--gpus", "2", "--seq-len", "128", "--gbs", "16")
    out = cli(*args).stdout
    best = cli(*args, "--json").json()["candidates"][0]["estimate"]
    from megapilot.estimate.units import format_duration

    assert best["step_time_s"] < 1e-3
    assert format_duration(best["step_time_s"]) in out
    assert "0.00 s" not in out and "µs" in out


def test_plan_states_the_defaults_it_assumed_on_one_line(cli):
    """seq-len, GBS and precision left out are defaults the search depends on: the output names them."""
    assumed = cli("plan", "--model", "llama3.1-8b", "--gpu", "h100", "--gpus", "8", "--top", "1")
    lines = [line for line in assumed.stderr.splitlines() if line.startswith("assumed:")]
    assert assumed.exit_code == 0 and len(lines) == 1
    assert "seq-len 4096 (default)" in lines[0] and "GBS 1024 (default)" in lines[0] and "bf16" in lines[0]
    given = ("plan", "--model", "llama3.1-8b", "--gpu", "h100", "--gpus", "8", "--top", "1", "--seq-len", "4096",
             "--gbs", "1024", "--precision", "bf16", "--json")
    # all given: what is left is what no flag of plan sets, the overlaps the layouts are priced with
    overlaps = overlaps_assumed(get_gpu("h100"), "bf16")
    assert cli(*given, "--grad-reduce-in-bf16").json()["defaults"] == [overlaps]
    # the gradients' precision left out is Megatron's fp32, said as estimate says it
    assert cli(*given).json()["defaults"] == [FP32_GRADIENTS_ASSUMED, overlaps]


def test_plan_says_fp32_gradients_only_where_the_flag_would_change_the_run(cli):
    cpu = cli("plan", "--model", "tiny", "--gpu", "cpu", "--gpus", "2", "--seq-len", "128", "--gbs", "16", "--json")
    fp16 = cli("plan", "--model", "llama3.1-8b", "--gpu", "h100", "--gpus", "8", "--precision", "fp16", "--json")
    for planned in (cpu, fp16):  # a CPU trains in fp32 and refuses the flag; fp16 keeps fp16 gradients
        assert planned.exit_code == 0, planned.stderr
        assert FP32_GRADIENTS_ASSUMED not in planned.json()["defaults"]


def test_an_error_about_a_default_value_says_it_was_the_default(cli):
    defaulted = cli("plan", "--model", "tiny", "--gpu", "h100", "--gpus", "2")  # seq-len 4096 > tiny's 128 positions
    assert defaulted.exit_code == 2 and "(from seq-len 4096 (default))" in defaulted.stderr
    typed = cli("plan", "--model", "tiny", "--gpu", "h100", "--gpus", "2", "--seq-len", "4096")
    assert typed.exit_code == 2 and "default" not in typed.stderr


# ---- the run's features: the search costs the run they describe, and the saved plan carries them -------------

QWEN = ("plan", "--model", "qwen3-30b-a3b", "--gpu", "gb200", "--gpus", "8", "--gbs", "512", "--precision", "fp8",
        "--ep", "8", "--top", "1", "--json")


def _best(cli, *args) -> dict:
    result = cli(*args)
    assert result.exit_code == 0, result.stderr
    return result.json()["candidates"][0]["estimate"]


def test_token_dropping_padded_to_capacity_is_the_model_the_search_costs(cli):
    """Padded to capacity, the alltoall dispatcher has static split sizes: no host sync per MoE layer, so the same
    pinned layout is predicted faster than dropless."""
    dropless = _best(cli, *QWEN, "--mbs", "1", "--tp", "1")
    padded = _best(cli, *QWEN, "--mbs", "1", "--tp", "1", "--moe-expert-capacity-factor", "1.0",
                   "--moe-pad-expert-input-to-capacity")
    assert padded["tokens_per_s_per_gpu"] > dropless["tokens_per_s_per_gpu"]


def test_mtp_modules_are_searched_for_as_asked(cli):
    args = ("plan", "--model", "deepseek-v3", "--gpu", "h100", "--gpus", "1024", "--gbs", "8192", "--tp", "2",
            "--pp", "8", "--ep", "64", "--top", "1", "--json")
    with_mtp, without = _best(cli, *args), _best(cli, *args, "--mtp-num-layers", "0")
    assert without["params"]["total"] < with_mtp["params"]["total"]


def test_the_flex_dispatcher_is_costed_saved_and_written_by_script(cli, tmp_path):
    args = ("plan", "--model", "deepseek-v3", "--gpu", "h100", "--gpus", "1024", "--gbs", "8192", "--tp", "2",
            "--pp", "8", "--vpp", "4", "--ep", "64", "--mbs", "1", "--top", "1")
    default = cli(*args, "--json")  # EP 64 leaves the node: the planner costs it with DeepEP unasked
    assert any("flex beyond it" in line for line in default.json()["defaults"])
    assert default.json()["candidates"][0]["moe_flex_dispatcher"] == "deepep"
    assert default.json()["shell"].endswith("MOE_DISPATCHER=flex MOE_FLEX_BACKEND=deepep")
    shown = cli(*args).stdout  # the table says it too: `estimate` reproduces the numbers only when told
    assert "ETP" in shown and "flex:deepep" in shown
    target = tmp_path / "plan.json"
    flex = cli(*args, "--moe-flex-dispatcher", "deepep", "--save", str(target), "--json")
    assert flex.exit_code == 0, flex.stderr
    assert not any("dispatcher" in line for line in flex.json()["defaults"])
    speed = [doc.json()["candidates"][0]["estimate"]["tokens_per_s_per_gpu"] for doc in (default, flex)]
    assert speed[1] == pytest.approx(speed[0])  # the same dispatcher, asked for or chosen
    assert SavedPlan.model_validate_json(target.read_text()).moe_flex_dispatcher == "deepep"
    script = cli("script", "--plan", str(target), "--mock-data", "--megatron-path", "/opt/Megatron-LM", "--remote",
                 "--json")
    assert script.exit_code == 0, script.stderr
    megatron_args = script.json()["megatron_args"]
    assert megatron_args[megatron_args.index("--moe-flex-dispatcher-backend") + 1] == "deepep"


@pytest.mark.parametrize(("flag", "value", "field"), [
    ("--moe-flex-dispatcher", "deepep", "moe_flex_dispatcher"),
    ("--moe-capacity-factor", "1.0", "moe_capacity_factor"),
    ("--mtp-num-layers", "-1", "mtp_num_layers"),
])
def test_a_feature_the_model_cannot_take_is_one_line_naming_it(cli, flag, value, field):
    result = cli(*SMALL, flag, value)
    assert result.exit_code == 2 and f"{field}:" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_pins_take_megatron_spellings(cli):
    doc = cli(*SMALL, "--tensor-model-parallel-size", "2", "--micro-batch-size", "1", "--top", "1", "--json").json()
    assert (doc["candidates"][0]["parallel"]["tp"], doc["candidates"][0]["parallel"]["mbs"]) == (2, 1)


def test_a_muon_run_is_planned_without_the_distributed_optimizer_and_scripted_as_megatron_takes_it(cli, tmp_path):
    target = tmp_path / "plan.json"
    args = ("plan", "--model", "llama3.1-8b", "--gpu", "h100", "--gpus", "64", "--gbs", "512", "--seq-len", "8192",
            "--optimizer", "dist_muon", "--top", "3", "--save", str(target), "--json")
    doc = cli(*args).json()
    layouts = [candidate["parallel"] for candidate in doc["candidates"]]
    assert layouts and not any(p["distributed_optimizer"] or p["fsdp"] for p in layouts)
    assert any(r.startswith("optimizer dist_muon: its step, Newton-Schulz dealt out over DP=")
               for r in doc["candidates"][0]["reasons"])
    assert SavedPlan.model_validate_json(target.read_text()).training.optimizer == "dist_muon"
    script = cli("script", "--plan", str(target), "--mock-data", "--megatron-path", "/opt/Megatron-LM", "--remote",
                 "--json").json()
    megatron_args = script["megatron_args"]
    assert megatron_args[megatron_args.index("--optimizer") + 1] == "dist_muon"
    assert "--use-distributed-optimizer" not in megatron_args and "--overlap-param-gather" not in megatron_args
    assert any("emerging_optimizers" in note for note in script["notes"])
    plain = cli("script", "--model", "llama3.1-8b", "--gpu", "h100", "--gpus", "8", "--gbs", "64", "--seq-len",
                "8192", "--optimizer", "muon", "--mock-data", "--megatron-path", "/opt/Megatron-LM", "--remote",
                "--json").json()["megatron_args"]
    assert "--overlap-grad-reduce" not in plain  # "Muon optimizer does not support overlap grad reduce"
    old = cli("script", "--plan", str(target), "--mock-data", "--megatron-path", "/opt/Megatron-LM", "--remote",
              "--megatron-version", "0.15")
    assert old.exit_code == 2 and "added in Megatron-LM core_v0.16.0" in old.stderr


def test_the_all_to_all_overlap_is_planned_saved_and_scripted_where_megatron_allows_it(cli, tmp_path):
    target = tmp_path / "plan.json"
    args = ("plan", "--model", "deepseek-v3", "--gpu", "h100", "--gpus", "1024", "--gbs", "8192", "--tp", "2",
            "--pp", "8", "--vpp", "4", "--ep", "64", "--mbs", "1", "--top", "1", "--precision", "fp8",
            "--moe-flex-dispatcher", "deepep", "--json")
    plain = cli(*args).json()["candidates"][0]["estimate"]
    overlapped = cli(*args, "--overlap-moe-expert-parallel-comm", "--save", str(target)).json()
    assert overlapped["candidates"][0]["estimate"]["time_breakdown_s"]["ep_comm"] < plain["time_breakdown_s"]["ep_comm"]
    assert SavedPlan.model_validate_json(target.read_text()).moe_a2a_overlap
    script = cli("script", "--plan", str(target), "--mock-data", "--megatron-path", "/opt/Megatron-LM", "--remote",
                 "--json").json()["megatron_args"]
    assert "--overlap-moe-expert-parallel-comm" in script and "--delay-wgrad-compute" in script
    # asked for on a layout Megatron refuses it on: one line naming the rule
    full = cli("script", "--model", "mixtral-8x7b", "--gpu", "h100", "--gpus", "16", "--ep", "8", "--gbs", "64",
               "--seq-len", "4096", "--recompute", "full", "--mock-data", "--megatron-path", "/opt/Megatron-LM",
               "--remote", "--moe-a2a-overlap")
    assert full.exit_code == 2 and "moe_a2a_overlap: --overlap-moe-expert-parallel-comm: it does not run with full" \
        in full.stderr


def test_deepseek_v4_config_is_planned_at_tp_1(cli):
    from pathlib import Path
    config = Path(__file__).parents[1] / "data" / "hf_configs" / "DeepSeek-V4-Flash.json"
    result = cli("plan", "--model", str(config), "--gpu", "b200", "--gpus", "256", "--gbs", "2048", "--seq-len",
                 "4096", "--json")
    assert result.exit_code == 0, result.stderr
    doc = result.json()
    assert doc["candidates"] and all(c["parallel"]["tp"] == 1 for c in doc["candidates"])
    assert doc["rejected"]["tp above 1 on DeepSeek-V4's compressed attention"] > 0


def test_plan_layers_break_down_the_top_layout(cli):
    """`--layers` shows the top layout's layer terms: the same groups `estimate --layers` shows for that layout."""
    result = cli(*SMALL, "--top", "2", "--layers", "--json")
    assert result.exit_code == 0, result.stderr
    data = result.json()
    (group,) = data["layers"]
    assert group["layers"] == list(range(32)) and group["attention_bound"]["backward_by"] == "tensor cores"
    top = data["candidates"][0]["parallel"]
    same = cli("estimate", "--model", "llama3.1-8b", "--gpu", "h100", "--gpus", "16", "--seq-len", "4096", "--gbs",
               "128", "--tp", str(top["tp"]), "--pp", str(top["pp"]), "--cp", str(top["cp"]), "--mbs", str(top["mbs"]),
               "--recompute", top["recompute"], *(("--fsdp",) if top["fsdp"] else ()), "--layers", "--json")
    assert same.exit_code == 0, same.stderr
    assert same.json()["layers"][0]["terms_ms"] == pytest.approx(group["terms_ms"])
    table = cli(*SMALL, "--top", "2", "--layers")
    assert "one micro-batch per layer" in table.stdout and "layers 0-31" in table.stdout
    assert "layers" not in cli(*SMALL, "--top", "2", "--json").json()


def test_plan_cluster_names_the_calibration_its_figures_use_once(cli, tmp_path):
    """#1's calibration line is the cluster's once its runs calibrate the figures; the closing line had said it a
    second time in other words, and the published runs' line had stood above it as if it were in force."""
    db = str(tmp_path / "history.sqlite")
    rows = Path(__file__).resolve().parents[1] / "data" / "history_import" / "published_rows.jsonl"
    assert cli("history", "import", str(rows), "--db", db).exit_code == 0
    case = ("plan", "--model", "llama3.1-8b", "--gpu", "gb200", "--gpus", "16", "--seq-len", "8192", "--gbs", "256",
            "--precision", "fp8", "--top", "2", "--db", db, "--cluster", "nvidia-dgx-gb200")
    lines = cli(*case).stdout.splitlines()
    [calibration] = [line for line in lines if line.startswith("calibration:")]
    assert calibration.startswith("calibration: figures calibrated on cluster nvidia-dgx-gb200 (4 run(s)")
    assert sum("held out: median" in line for line in lines) == 1  # the closing line had said it again
    assert lines[-1] == ("the figures are calibrated on cluster nvidia-dgx-gb200 (the calibration line above); the "
                         "ranking is the planner's, by the uncalibrated figures")
    best = cli(*case, "--json").json()["candidates"][0]
    assert best["estimate"]["calibration"] in lines
    assert best["calibration_from_history"]["uncalibrated"]["calibration"].startswith("calibration: dense on GB200")


def test_plan_cluster_judges_the_ties_by_the_calibrated_interval_it_shows(cli, tmp_path):
    """Calibrated on the cluster's runs, #1's interval line moves to the calibration's (33,423-36,567 tokens/s/GPU
    here); the ties line had kept the published runs' 26,336-32,621 and called #4 (32,508 calibrated) a tie."""
    db = str(tmp_path / "history.sqlite")
    rows = Path(__file__).resolve().parents[1] / "data" / "history_import" / "published_rows.jsonl"
    assert cli("history", "import", str(rows), "--db", db).exit_code == 0
    case = ("plan", "--model", "llama3.1-8b", "--gpu", "gb200", "--gpus", "16", "--seq-len", "8192", "--gbs", "256",
            "--precision", "fp8", "--top", "4", "--db", db, "--cluster", "nvidia-dgx-gb200")
    result = cli(*case)
    assert result.exit_code == 0, result.stderr
    [interval] = [line for line in result.stdout.splitlines() if line.startswith("80 % interval of #1: ")]
    low_high = interval.removeprefix("80 % interval of #1: ").split(" tokens/s/GPU")[0]
    assert "calibrated on cluster nvidia-dgx-gb200" in interval
    [ties] = [line for line in result.stdout.splitlines() if "a tie by the model's error" in line]
    assert f"inside #1's 80 % interval ({low_high} tokens/s/GPU)" in ties
    document = cli(*case, "--json").json()
    assert ties.removeprefix("  • ") in document["summary"]
    tokens = [c["estimate"]["tokens_per_s_per_gpu"] for c in document["candidates"]]
    best = document["candidates"][0]["estimate"]
    low, high = best["tokens_per_s_per_gpu_p10"], best["tokens_per_s_per_gpu_p90"]
    tied = [rank for rank, value in enumerate(tokens[1:], start=2) if low <= value <= high]
    assert [rank for rank in range(2, len(tokens) + 1) if f"#{rank} (" in ties] == tied and len(tied) < 3


def test_cuda_graphs_are_planned_saved_and_scripted_and_never_beside_a_recompute_megatron_refuses(cli, tmp_path):
    target = tmp_path / "plan.json"
    # 70B on 32 H100s: memory binds, and without graphs two of the top 5 recompute everything
    args = ("plan", "--model", "llama3.1-70b", "--gpu", "h100", "--gpus", "32", "--gbs", "256", "--seq-len", "8192",
            "--top", "5", "--json")
    assert any(c["parallel"]["recompute"] == "full" for c in cli(*args).json()["candidates"])
    graphed = cli(*args, "--cuda-graph-impl", "transformer_engine", "--cuda-graph-scope", "attn mlp", "--save",
                  str(target))
    assert graphed.exit_code == 0, graphed.stderr
    assert all(c["parallel"]["recompute"] != "full" and not c["parallel"]["cpu_offloading_num_layers"]
               for c in graphed.json()["candidates"])
    assert SavedPlan.model_validate_json(target.read_text()).cuda_graphs is not None
    script = cli("script", "--plan", str(target), "--mock-data", "--megatron-path", "/opt/Megatron-LM", "--remote",
                 "--json").json()["megatron_args"]
    assert script[script.index("--cuda-graph-impl") + 1] == "transformer_engine"
    half = cli(*[("16" if word == "32" else word) for word in args if word != "--json"], "--cuda-graph-impl",
               "transformer_engine", "--cuda-graph-scope", "attn mlp")  # fits only by recomputing everything
    assert half.exit_code == 2 and "no layout recomputes fully" in half.stderr and "full_iteration" in half.stderr
    refused = cli("plan", "--model", "llama3.1-8b", "--gpu", "h100", "--gpus", "8", "--cuda-graph-impl",
                  "transformer_engine", "--cuda-graph-scope", "moe_router")
    assert refused.exit_code == 2 and "has no experts" in refused.stderr


def test_a_plan_no_rule_cut_says_none_not_an_empty_list(cli):
    # TP, PP and CP pinned on 8 GPUs: nothing is cut by a rule, and the summary ended 'cut by rule: ' with nothing
    result = cli("plan", "--model", "llama3.1-8b", "--gpu", "h100", "--gpus", "8", "--gbs", "4", "--tp", "2", "--pp",
                 "1", "--cp", "1", "--top", "1")
    assert result.exit_code == 0, result.stderr
    summary = next(line for line in result.stdout.splitlines() if "layouts estimated" in line)
    assert summary.rstrip().endswith("cut by rule: none")
