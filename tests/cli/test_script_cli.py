"""`megapilot script`: plan or layout flags in, checked launch script out; user errors exit 2 on one line."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

from tests.launch.plans import GOLDEN_PLANS

MEGATRON = ["--megatron-path", "/opt/Megatron-LM"]


@pytest.fixture(autouse=True)
def no_user_profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEGAPILOT_PROFILE", str(tmp_path / "no-profile.toml"))


@pytest.fixture
def plan_file(tmp_path: Path) -> Path:
    path = tmp_path / "plan.json"
    path.write_text(GOLDEN_PLANS["llama3.3-70b_8nodes"].model_dump_json())
    return path


def test_json_output_has_the_stable_schema_and_the_exact_arguments(cli, plan_file: Path) -> None:
    result = cli("script", "--plan", str(plan_file), "--launcher", "slurm", "--mock-data", "--save", "/ckpt/a b",
                 "--log-dir", "/logs", *MEGATRON, "--json")
    assert result.exit_code == 0, result.stderr
    data = result.json()
    assert {"script", "launcher", "megatron_args", "env", "nodes", "gpus_per_node"} <= data.keys()
    assert (data["launcher"], data["nodes"], data["gpus_per_node"]) == ("slurm", 8, 8)
    args = data["megatron_args"]
    assert args[args.index("--num-layers") + 1] == "80" and args[args.index("--save") + 1] == "/ckpt/a b"
    quoted = " ".join(shlex.quote(a) for a in args[args.index("--save"):args.index("--save") + 2])
    assert quoted in data["script"].replace("\n  ", " ")
    assert data["env"]["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"


def test_layout_flags_give_the_same_arguments_as_the_equivalent_plan(cli, tmp_path: Path) -> None:
    plan = GOLDEN_PLANS["llama3.3-70b_8nodes"]
    from_plan = tmp_path / "p.json"
    from_plan.write_text(plan.model_dump_json())
    common = ["--mock-data", *MEGATRON, "--json"]
    a = cli("script", "--plan", str(from_plan), *common).json()["megatron_args"]
    b = cli("script", "--model", "llama3.3-70b", "--gpu", "h100", "--gpus", "64", "--tp", "8", "--pp", "2",
            "--gbs", "512", "--seq-len", "8192", "--train-iters", "1000", *common)
    assert b.exit_code == 0, b.stderr
    model_flags = ("--num-layers", "--hidden-size", "--tensor-model-parallel-size", "--pipeline-model-parallel-size",
                   "--global-batch-size", "--seq-length", "--sequence-parallel", "--train-iters")
    def pick(args: list[str]) -> list[tuple[str, str | None]]:
        return [(f, args[args.index(f) + 1] if f in args else None) for f in model_flags]

    assert pick(a) == pick(b.json()["megatron_args"])


def test_output_file_is_written_executable_and_not_overwritten(cli, plan_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "train.sh"
    first = cli("script", "--plan", str(plan_file), "--mock-data", *MEGATRON, "-o", str(out))
    assert first.exit_code == 0, first.stderr
    assert os.access(out, os.X_OK) and out.read_text().startswith("#!/usr/bin/env bash")
    assert "review, then run with `megapilot run" in first.stdout
    assert subprocess.run(["bash", "-n", str(out)]).returncode == 0
    again = cli("script", "--plan", str(plan_file), "--mock-data", *MEGATRON, "-o", str(out))
    assert again.exit_code == 2 and "already exists" in again.stderr and "--force" in again.stderr
    forced = cli("script", "--plan", str(plan_file), "--mock-data", *MEGATRON, "-o", str(out), "--force")
    assert forced.exit_code == 0


def test_primus_writes_its_experiment_next_to_the_script(cli, tmp_path: Path) -> None:
    plan = tmp_path / "p.json"
    plan.write_text(GOLDEN_PLANS["deepseek-v2-lite_mla"].model_dump_json())
    out = tmp_path / "train.sh"
    result = cli("script", "--plan", str(plan), "--launcher", "primus", "--mock-data", "-o", str(out))
    assert result.exit_code == 0, result.stderr
    assert (tmp_path / "train.primus.yaml").read_text().startswith("# Primus experiment for deepseek-v2-lite")


def test_a_tokenizer_that_reads_no_model_takes_none_from_the_profile(cli, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    profile = tmp_path / "profile.toml"
    profile.write_text('tokenizer = "/nonexistent/tokenizer.model"\n')  # a local script checks the paths it names
    monkeypatch.setenv("MEGAPILOT_PROFILE", str(profile))
    for suffix in (".bin", ".idx"):
        (tmp_path / f"docs{suffix}").write_bytes(b"")
    tiny = tmp_path / "tiny.json"
    assert cli("plan", "--model", "tiny", "--gpu", "h100", "--gpus", "2", "--seq-len", "128", "--gbs", "16",
               "--save", str(tiny)).exit_code == 0
    result = cli("script", "--plan", str(tiny), "--cpu", "--entrypoint", "megapilot", "--data-path",
                 str(tmp_path / "docs"), "--tokenizer-type", "ByteTokenizer", "--json")
    assert result.exit_code == 0, result.stderr
    assert "--tokenizer-model" not in result.json()["megatron_args"]


def test_profile_fills_data_tokenizer_and_checkpoints_and_says_so(cli, plan_file: Path, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    profile = tmp_path / "profile.toml"
    profile.write_text('data_path = "/lustre/d_text_document"\ntokenizer = "meta-llama/Llama-3.3-70B"\n'
                       'save_dir = "/lustre/ckpt"\n')
    monkeypatch.setenv("MEGAPILOT_PROFILE", str(profile))
    result = cli("script", "--plan", str(plan_file), "--launcher", "slurm", "--log-dir", "/l", *MEGATRON, "--json")
    assert result.exit_code == 0, result.stderr
    data = result.json()
    args = data["megatron_args"]
    assert args[args.index("--data-path") + 1] == "/lustre/d_text_document"
    assert args[args.index("--tokenizer-model") + 1] == "meta-llama/Llama-3.3-70B"
    assert args[args.index("--save") + 1] == "/lustre/ckpt"
    assert any("data_path=/lustre/d_text_document from profile" in n for n in data["assumed"])
    human = cli("script", "--plan", str(plan_file), "--launcher", "slurm", "--log-dir", "/l", *MEGATRON)
    assumed = [line for line in human.stderr.splitlines() if line.startswith("assumed:")]
    assert len(assumed) == 1 and "save_dir=/lustre/ckpt from profile" in assumed[0]
    assert "note: data_path=" not in human.stderr  # stated once, on the assumed line


@pytest.mark.parametrize(("extra", "field"), [
    (["--data-path", "relative/prefix", "--tokenizer-model", "gpt2"], "data_path"),
    (["--mock-data", "--launcher", "lsf"], "launcher"),
    (["--mock-data", "--save", "/path/to/ckpt"], "save"),
    (["--mock-data", "--nodes", "3"], "nodes"),
    ([], "data_path"),
])
def test_user_errors_exit_2_with_one_line(cli, plan_file: Path, extra: list[str], field: str) -> None:
    result = cli("script", "--plan", str(plan_file), *MEGATRON, *extra)
    assert result.exit_code == 2
    assert result.stderr.strip().count("\n") == 0 and "Traceback" not in result.stderr
    assert f"{field}:" in result.stderr


def test_missing_plan_file_is_a_user_error(cli, tmp_path: Path) -> None:
    result = cli("script", "--plan", str(tmp_path / "nope.json"), "--mock-data")
    assert result.exit_code == 2 and "plan:" in result.stderr


def test_without_output_file_the_script_alone_goes_to_stdout(cli, plan_file: Path, tmp_path: Path) -> None:
    result = cli("script", "--plan", str(plan_file), "--mock-data", *MEGATRON)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("#!/usr/bin/env bash") and result.stdout.endswith('"${MEGATRON_ARGS[@]}"\n')
    assert "review, then run" in result.stderr
    script = tmp_path / "from_stdout.sh"
    script.write_text(result.stdout)
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0


# ---- layout flags resolve as `megapilot estimate` resolves them (build_case) ----------------------
LAYOUT = ["--model", "llama3.1-8b", "--gpu", "h100", "--gpus", "16", "--gbs", "64", "--seq-len", "4096"]


@pytest.mark.parametrize("extra", [
    [], ["--tp", "2"], ["--tp", "4", "--pp", "2", "--no-sequence-parallel"], ["--tp", "2", "--sp"],
    ["--recompute", "full", "--recompute-num-layers", "2"], ["--fsdp", "--recompute", "none"],
    ["--no-distributed-optimizer", "--mbs", "2"],
])
def test_layout_flags_resolve_like_estimate(cli, extra: list[str]) -> None:
    from megapilot.estimate import build_case

    flags = dict(model="llama3.1-8b", gpu="h100", gpus=16, gbs=64, seq_len=4096)
    names = {"--tp": "tp", "--pp": "pp", "--mbs": "mbs", "--recompute": "recompute",
             "--recompute-num-layers": "recompute_num_layers"}
    for index, word in enumerate(extra):
        if word in names:
            value = extra[index + 1]
            flags[names[word]] = int(value) if value.isdigit() else value
    switches = {"--no-sequence-parallel": ("sequence_parallel", False), "--sp": ("sequence_parallel", True),
                "--fsdp": ("fsdp", True), "--no-distributed-optimizer": ("distributed_optimizer", False)}
    flags.update(dict(switches[w] for w in extra if w in switches))
    expected = build_case(**flags).parallel

    result = cli("script", *LAYOUT, *extra, "--mock-data", *MEGATRON, "--json")
    assert result.exit_code == 0, result.stderr
    args = result.json()["megatron_args"]
    def value(flag: str) -> str | None:
        return args[args.index(flag) + 1] if flag in args else None

    assert int(value("--tensor-model-parallel-size")) == expected.tp
    assert int(value("--pipeline-model-parallel-size")) == expected.pp
    assert int(value("--micro-batch-size")) == expected.mbs
    assert ("--sequence-parallel" in args) == expected.sequence_parallel
    # Megatron-FSDP runs with the distributed optimizer (its sharded steps live there)
    assert ("--use-distributed-optimizer" in args) == (expected.distributed_optimizer or expected.fsdp)
    assert ("--use-megatron-fsdp" in args) == expected.fsdp
    assert ("--recompute-activations" in args) == (expected.recompute == "selective")
    assert value("--recompute-num-layers") == (str(expected.recompute_num_layers or 1)
                                               if expected.recompute == "full" else None)


@pytest.mark.parametrize("extra", [
    [],  # no --gbs / --seq-len: both commands require them
    ["--gbs", "64", "--seq-len", "4096", "--tp", "3"],
    ["--gbs", "64", "--seq-len", "4096", "--precision", "fp7"],
    ["--gbs", "64", "--seq-len", "4096", "--recompute", "sometimes"],
    ["--gbs", "64", "--seq-len", "4096", "--tp", "1", "--sequence-parallel"],
    ["--gbs", "64", "--seq-len", "4096", "--gpus-per-node", "3"],
    # the script had written --use-distributed-optimizer beside --use-megatron-fsdp, as estimate refuses to price
    ["--gbs", "64", "--seq-len", "4096", "--fsdp", "--no-distributed-optimizer"],
])
def test_bad_layout_flags_give_the_same_one_line_error_as_estimate(cli, extra: list[str]) -> None:
    base = ["--model", "llama3.1-8b", "--gpu", "h100", "--gpus", "16"]
    from_script = cli("script", *base, *extra, "--mock-data", *MEGATRON)
    from_estimate = cli("estimate", *base, *extra)
    assert from_script.exit_code == from_estimate.exit_code == 2, from_script.stderr
    assert from_script.stderr.strip().count("\n") == 0 and "Traceback" not in from_script.stderr
    assert from_script.stderr == from_estimate.stderr


def test_cpu_render_of_a_context_parallel_layout_is_refused_on_one_line(cli) -> None:
    result = cli("script", "--model", "tiny", "--gpu", "h100", "--gpus", "2", "--gbs", "8", "--seq-len", "64",
                 "--cp", "2", "--cpu", "--entrypoint", "megapilot", "--mock-data")
    assert result.exit_code == 2 and result.stderr.startswith("error: cp:") and "--cp 1" in result.stderr
    assert result.stderr.strip().count("\n") == 0


def test_sbatch_script_is_pointed_at_sbatch_not_the_local_runner(cli, plan_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "train.sbatch"
    result = cli("script", "--plan", str(plan_file), "--mock-data", *MEGATRON, "--launcher", "slurm", "-o", str(out))
    assert result.exit_code == 0, result.stderr
    said = " ".join(result.stdout.split())  # the console may wrap long lines
    assert f"review, then run with `sbatch {out}`" in said
    assert "megapilot run" not in result.stdout


def test_slurm_log_folder_is_created_with_the_script_and_the_notes_say_where_logs_go(
        cli, plan_file: Path, tmp_path: Path) -> None:
    out, logs = tmp_path / "train.sbatch", tmp_path / "job logs"
    result = cli("script", "--plan", str(plan_file), "--mock-data", *MEGATRON, "--launcher", "slurm",
                 "--log-dir", str(tmp_path / "job-logs"), "-o", str(out), "--json")
    assert result.exit_code == 0, result.stderr
    data = result.json()
    assert (tmp_path / "job-logs").is_dir() and data["directories"] == [str(tmp_path / "job-logs")]
    assert f"#SBATCH --output={tmp_path / 'job-logs'}/%x-%j.out" in out.read_text()
    assert any(f"output to {tmp_path / 'job-logs'}/%x-%j.out" in note for note in data["notes"])
    assert any(note == f"created {tmp_path / 'job-logs'} for the job's logs" for note in data["notes"])
    default = cli("script", "--plan", str(plan_file), "--mock-data", *MEGATRON, "--launcher", "slurm",
                  "-o", str(tmp_path / "b.sbatch"), "--json")
    assert default.exit_code == 0 and (tmp_path / "logs").is_dir()  # next to the script by default
    assert not logs.exists()


def test_remote_drafts_check_paths_for_form_only_and_create_nothing_here(
        cli, plan_file: Path, tmp_path: Path) -> None:
    missing = "/nonexistent-cluster-fs/data/corpus_text_document"
    one_node = ["script", "--model", "llama3.1-8b", "--gpu", "h100", "--gpus", "8", "--gbs", "64", "--seq-len", "4096",
                "--data-path", missing, "--tokenizer-model", "/nope/tok.model", *MEGATRON, "--json"]
    here = cli(*one_node)  # a single-node torchrun script is checked as if it runs here
    assert here.exit_code == 2 and "dataset files missing" in here.stderr
    assert cli(*one_node, "--remote").exit_code == 0
    args = ["script", "--plan", str(plan_file), "--data-path", missing, "--tokenizer-model", "/nope/tok.model",
            *MEGATRON, "--launcher", "slurm", "--log-dir", str(tmp_path / "cluster-logs")]
    result = cli(*args, "-o", str(tmp_path / "t.sbatch"), "--remote", "--json")
    assert result.exit_code == 0, result.stderr
    assert not (tmp_path / "cluster-logs").exists()
    notes = " ".join(result.json()["notes"])
    assert "--remote" in notes and "not for existence here" in notes
    assert f"create {tmp_path / 'cluster-logs'} on the cluster before sbatch" in notes
    relative = cli(*args[:4], "data/corpus", *args[5:], "--remote", "--json")
    assert relative.exit_code == 2 and "not an absolute path" in relative.stderr  # the form is still checked


def test_bf16_gradients_travel_from_the_plan_into_the_script_and_cannot_be_added_to_a_saved_plan(
        cli, tmp_path: Path) -> None:
    saved = tmp_path / "bf16-grads.json"
    planned = cli("plan", "--model", "llama3.1-8b", "--gpu", "h100", "--gpus", "16", "--grad-reduce-in-bf16",
                  "--save", str(saved))
    assert planned.exit_code == 0, planned.stderr
    assert "bf16 gradients" in planned.stdout  # the table's title says what it searched for
    args = cli("script", "--plan", str(saved), "--mock-data", *MEGATRON, "--json").json()["megatron_args"]
    assert "--grad-reduce-in-bf16" in args and "--bf16" in args
    layout = ("--model", "llama3.1-8b", "--gpu", "h100", "--gpus", "16", "--gbs", "128", "--seq-len", "8192")
    plain = cli("script", *layout, "--mock-data", *MEGATRON, "--json").json()["megatron_args"]
    assert "--grad-reduce-in-bf16" not in plain  # Megatron's fp32 gradients unless asked
    added = cli("script", "--plan", str(saved), "--grad-reduce-in-bf16", "--mock-data", *MEGATRON)
    assert added.exit_code == 2 and "cannot change a saved plan" in added.stderr


def test_flex_dispatcher_is_asked_for_by_name_and_refused_on_a_dense_model(cli, plan_file: Path) -> None:
    moe = ["script", "--model", "mixtral-8x7b", "--gpu", "h100", "--gpus", "8", "--ep", "8", "--gbs", "64",
           "--seq-len", "4096", "--mock-data", *MEGATRON, "--remote", "--json"]
    args = cli(*moe, "--moe-flex-dispatcher", "deepep").json()["megatron_args"]
    assert args[args.index("--moe-flex-dispatcher-backend") + 1] == "deepep"
    assert args[args.index("--moe-token-dispatcher-type") + 1] == "flex"
    dense = cli("script", "--plan", str(plan_file), "--mock-data", *MEGATRON, "--moe-flex-dispatcher", "deepep")
    assert dense.exit_code == 2 and "has no experts" in dense.stderr
    wrong = cli(*moe, "--moe-flex-dispatcher", "nccl")
    assert wrong.exit_code == 2 and "moe_flex_dispatcher: unknown flex dispatcher backend 'nccl'" in wrong.stderr


def test_notes_name_every_schedule_value_left_at_its_drafting_placeholder(cli, tmp_path: Path) -> None:
    draft = ("script", "--model", "tiny", "--gpu", "h100", "--gpus", "2", "--gbs", "16", "--seq-len", "128", "--cpu",
             "--entrypoint", "megapilot", "--mock-data", "--save", str(tmp_path), "--json")
    notes = [n for n in cli(*draft).json()["notes"] if n.startswith("placeholders")]
    assert len(notes) == 1
    assert "--train-iters 100" in notes[0] and "--lr-warmup-iters 0" in notes[0] and "--save-interval 100" in notes[0]
    chosen = cli(*draft, "--train-iters", "5000", "--save-interval", "500").json()["notes"]
    (note,) = [n for n in chosen if n.startswith("placeholders")]
    assert "--lr-warmup-iters 0" in note and "--train-iters" not in note and "--save-interval" not in note
    no_save = [a for a in draft if a not in ("--save", str(tmp_path))]
    (note,) = [n for n in cli(*no_save).json()["notes"] if n.startswith("placeholders")]
    assert "--save-interval" not in note  # no checkpoints, no interval to set


def test_megatron_version_picks_the_table_and_refuses_what_that_release_lacks(cli, plan_file: Path) -> None:
    nvfp4 = ["--model", "llama3.1-8b", "--gpu", "b200", "--gpus", "8", "--gbs", "64", "--seq-len", "4096",
             "--precision", "nvfp4", "--mock-data", "--remote"]
    old = cli("script", *nvfp4, *MEGATRON, "--megatron-version", "0.14")
    assert old.exit_code == 2 and "added in Megatron-LM core_v0.15.0" in old.stderr and "Traceback" not in old.stderr
    newer = cli("script", *nvfp4, *MEGATRON, "--megatron-version", "0.15", "--json")
    assert newer.exit_code == 0, newer.stderr
    assert newer.json()["megatron_release"] == "core_v0.15.0"
    assert "# Flags checked against Megatron-LM core_v0.15.0." in newer.json()["script"]
    default = cli("script", "--plan", str(plan_file), "--mock-data", *MEGATRON, "--json")
    assert default.json()["megatron_release"] == "core_v0.19.0"
    unknown = cli("script", "--plan", str(plan_file), "--mock-data", *MEGATRON, "--megatron-version", "0.9")
    assert unknown.exit_code == 2 and "core_v0.14.0" in unknown.stderr


@pytest.mark.parametrize("launcher", ["torchrun", "primus"])
def test_deepseek_v4_script_is_refused_in_one_line_naming_the_release_gap(cli, launcher):
    """No Megatron-Core release builds DeepSeek-V4's compressed attention: Megatron-LM dev and Primus v26.5.0 do."""
    result = cli("script", "--model", "deepseek-v4-flash", "--gpu", "b200", "--gpus", "256", "--pp", "8", "--ep",
                 "32", "--pp-layout", "balanced", "--gbs", "2048", "--seq-len", "4096", "--mock-data",
                 "--launcher", launcher, *MEGATRON)
    assert result.exit_code == 2 and "Traceback" not in result.stderr
    line, = result.stderr.strip().splitlines()
    assert "model.mla.csa" in line and "0.19" in line and "dev branch" in line and "Primus v26.5.0" in line


def test_a_cpu_scripts_summary_says_cpu_ranks_not_the_plans_stand_in_gpu(cli, tmp_path: Path) -> None:
    out = tmp_path / "train.sh"
    result = cli("script", "--model", "tiny", "--gpu", "h100", "--gpus", "2", "--gbs", "16", "--seq-len", "128",
                 "--cpu", "--entrypoint", "megapilot", "--mock-data", "-o", str(out))
    assert result.exit_code == 0, result.stderr
    assert "1 node(s) x 2 CPU ranks" in result.stdout and "H100" not in result.stdout


def test_the_plan_may_be_given_as_the_argument(cli, plan_file: Path, tmp_path: Path) -> None:
    """`megapilot script plan.json` as `megapilot run train.sh` takes its script: the same script as --plan gives;
    two different plans are refused, naming both."""
    by_option = cli("script", "--plan", str(plan_file), "--mock-data", *MEGATRON, "--json")
    by_argument = cli("script", str(plan_file), "--mock-data", *MEGATRON, "--json")
    assert by_argument.exit_code == 0, by_argument.stderr
    assert by_argument.json()["megatron_args"] == by_option.json()["megatron_args"]
    other = tmp_path / "other.json"
    other.write_text(plan_file.read_text())
    both = cli("script", str(plan_file), "--plan", str(other), "--mock-data", *MEGATRON)
    assert both.exit_code == 2 and "two plans given" in both.stderr and "Traceback" not in both.stderr
