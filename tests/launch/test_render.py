"""render_launch: quoting, launch wiring, environment blocks, entry points and the JSON schema."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from megapilot.errors import MegapilotError
from megapilot.launch import LaunchOptions, render_launch
from megapilot.launch.megatron_args import SCRIPT_RELEASE_NAMES
from tests.launch.plans import GOLDEN_PLANS

PLAN_8B = GOLDEN_PLANS["llama3.1-8b_1node"]
PLAN_70B = GOLDEN_PLANS["llama3.3-70b_8nodes"]
PLAN_DEEPSEEK = GOLDEN_PLANS["deepseek-v2-lite_mla"]
NASTY = "/tmp/my runs/$HOME `id` 'q' \"d\"; rm -rf x"


def _options(**update: object) -> LaunchOptions:
    base = LaunchOptions(mock_data=True, megatron_path="/opt/Megatron-LM", check_paths_exist=False)
    return base.model_copy(update=update)


def _args_as_bash_sees_them(script: str, tmp_path: Path) -> list[str]:
    """Run the script up to its launch line and print MEGATRON_ARGS one per line."""
    body = script.rsplit("\n", 2)[0]  # drop the final exec/srun line
    body = body.replace('MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)', "MASTER_ADDR=x")
    probe = tmp_path / "probe.sh"
    probe.write_text(body + '\nprintf "%s\\n" "${MEGATRON_ARGS[@]}"\n')
    env = {"PATH": "/usr/bin:/bin", "NODE_RANK": "0", "MASTER_ADDR": "h", "SLURM_NNODES": "8",
           "SLURM_JOB_ID": "1", "HOME": "/root"}
    result = subprocess.run(["bash", str(probe)], capture_output=True, text=True, env=env, check=True)
    return result.stdout.splitlines()


@pytest.mark.parametrize("launcher", ["torchrun", "slurm"])
def test_paths_with_spaces_and_dollar_reach_megatron_literally(launcher: str, tmp_path: Path) -> None:
    launch = render_launch(PLAN_70B, _options(launcher=launcher, save=NASTY, log_dir="/tmp/logs"))
    assert NASTY in launch.megatron_args
    assert _args_as_bash_sees_them(launch.script, tmp_path) == launch.megatron_args


def test_primus_yaml_keeps_hostile_path_literal(tmp_path: Path) -> None:
    config = tmp_path / "exp.yaml"
    launch = render_launch(PLAN_DEEPSEEK, _options(launcher="primus", save=NASTY, primus_config_path=str(config)))
    body = launch.script.split("\ncd ", 1)[0]  # everything up to entering the Primus checkout
    subprocess.run(["bash", "-c", body], check=True, env={"PATH": "/usr/bin:/bin"})
    import yaml

    written = yaml.safe_load(config.read_text())
    assert written == yaml.safe_load(launch.files[str(config)])
    assert written["modules"]["pre_trainer"]["overrides"]["save"] == NASTY


def test_sbatch_header_refuses_values_it_cannot_quote() -> None:
    with pytest.raises(MegapilotError, match="#SBATCH") as info:
        render_launch(PLAN_70B, _options(launcher="slurm", job_name="my job", log_dir="/tmp/logs"))
    assert info.value.field == "job_name"


@pytest.mark.parametrize("limit", ["abc", "4h", "1:2:3:4", "-1"])
def test_sbatch_refuses_a_malformed_time_limit_before_writing_it(limit: str) -> None:
    # without --save no exit duration is computed from it, and sbatch would only refuse it at submission
    with pytest.raises(MegapilotError, match="not a SLURM time limit") as info:
        render_launch(PLAN_70B, _options(launcher="slurm", time_limit=limit, log_dir="/tmp/logs"))
    assert info.value.field == "time_limit"


@pytest.mark.parametrize("limit", ["UNLIMITED", "infinite", "0"])
def test_sbatch_takes_no_time_limit_and_then_writes_no_exit_duration(limit: str) -> None:
    launch = render_launch(PLAN_70B, _options(launcher="slurm", time_limit=limit, log_dir="/tmp/logs", save="/ckpt"))
    assert f"#SBATCH --time={limit}" in launch.script.splitlines()
    assert "--exit-duration-in-mins" not in launch.megatron_args


def test_sbatch_refuses_a_default_log_dir_it_cannot_write_on_its_output_line() -> None:
    # with no --log-dir the output goes next to the script; a space there would split the #SBATCH line
    with pytest.raises(MegapilotError, match="#SBATCH") as info:
        render_launch(PLAN_70B, _options(launcher="slurm", script_path="/tmp/my runs/train.sbatch"))
    assert info.value.field == "log_dir" and "--log-dir" in (info.value.fix or "")
    launch = render_launch(PLAN_70B, _options(launcher="slurm", script_path="/tmp/runs/train.sbatch"))
    assert "#SBATCH --output=/tmp/runs/logs/%x-%j.out" in launch.script.splitlines()


def test_sbatch_needs_somewhere_to_write_output() -> None:
    with pytest.raises(MegapilotError, match="output") as info:
        render_launch(PLAN_70B, _options(launcher="slurm"))
    assert info.value.field == "log_dir"


def test_sbatch_script_wires_slurm_and_containers() -> None:
    script = render_launch(PLAN_70B, _options(
        launcher="slurm", log_dir="/shared/logs", container_image="nvcr.io/nvidia/pytorch:25.09-py3",
        container_mounts=("/shared:/shared", "/data:/data:ro"), partition="gpu", account="llm",
    )).script
    for line in ("#SBATCH --nodes=8", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=8",
                 "#SBATCH --exclusive", "#SBATCH --time=04:00:00", "#SBATCH --output=/shared/logs/%x-%j.out",
                 "#SBATCH --partition=gpu", "#SBATCH --account=llm",
                 'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
                 "  --container-image=nvcr.io/nvidia/pytorch:25.09-py3",
                 "  '--container-mounts=/shared:/shared,/data:/data:ro'"):
        assert line in script.splitlines()
    assert script.splitlines()[-1].startswith('srun "${SRUN_ARGS[@]}" python3 -m torch.distributed.run')


def test_container_mounts_must_be_absolute_pairs() -> None:
    with pytest.raises(MegapilotError, match="SRC:DST"):
        render_launch(PLAN_70B, _options(launcher="slurm", log_dir="/l", container_image="img",
                                         container_mounts=("/only-one",)))
    with pytest.raises(MegapilotError, match="absolute"):
        render_launch(PLAN_70B, _options(launcher="slurm", log_dir="/l", container_image="img",
                                         container_mounts=("data:/data",)))
    with pytest.raises(MegapilotError, match="image"):
        render_launch(PLAN_70B, _options(launcher="slurm", log_dir="/l", container_mounts=("/a:/a",)))


def test_torchrun_single_node_is_standalone_and_multi_node_static_or_c10d() -> None:
    single = render_launch(PLAN_8B, _options()).script
    assert "  --standalone" in single and "NODE_RANK" not in single
    static = render_launch(PLAN_70B, _options()).script
    assert '  --node-rank "$NODE_RANK"' in static and ': "${NODE_RANK:?' in static
    c10d = render_launch(PLAN_70B, _options(rendezvous="c10d", master_port=31000)).script
    assert '  --rdzv-endpoint "$MASTER_ADDR:31000"' in c10d and "NODE_RANK" not in c10d


def test_environment_blocks_differ_by_vendor_and_explain_each_variable() -> None:
    nvidia = render_launch(PLAN_8B, _options())
    amd = render_launch(PLAN_DEEPSEEK, _options())
    assert "PYTORCH_CUDA_ALLOC_CONF" in nvidia.env and "HSA_NO_SCRATCH_RECLAIM" not in nvidia.env
    assert {"HSA_NO_SCRATCH_RECLAIM", "RCCL_MSCCL_ENABLE", "NVTE_CK_IS_V3_ATOMIC_FP32"} <= amd.env.keys()
    lines = amd.script.splitlines()
    for name in amd.env:
        at = next(i for i, line in enumerate(lines) if line.startswith(f"export {name}="))
        reason = lines[at - 1]
        assert reason.startswith("# ") and not reason.startswith("# ----") and len(reason) > 20, name


def test_network_options_set_socket_interface_and_hcas() -> None:
    env = render_launch(PLAN_70B, _options(network_interface="ens1f0", ib_hca="mlx5_0,mlx5_1")).env
    assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == "ens1f0"
    assert env["NCCL_IB_HCA"] == "mlx5_0,mlx5_1"


def test_fsdp_layout_drops_max_connections_and_uses_fsdp_checkpoints() -> None:
    from tests.launch.variants import VARIANT_PLANS

    launch = render_launch(VARIANT_PLANS["fsdp"], _options())
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in launch.env
    assert launch.megatron_args[launch.megatron_args.index("--ckpt-format") + 1] == "fsdp_dtensor"


def test_megatron_entrypoint_needs_the_checkout() -> None:
    with pytest.raises(MegapilotError, match="Megatron-LM checkout") as info:
        render_launch(PLAN_8B, _options(megatron_path=None))
    assert info.value.field == "megatron_path"


def test_embedded_trainer_refuses_what_it_does_not_implement() -> None:
    with pytest.raises(MegapilotError, match="--fp8-format") as info:  # the 8B golden plan trains in FP8
        render_launch(PLAN_8B, _options(entrypoint="megapilot", megatron_path=None))
    assert info.value.field == "entrypoint"


def test_the_fixes_about_the_checkout_and_the_entry_point_are_worded_by_the_command() -> None:
    """`megapilot script` names its options; a command that takes them otherwise (a suite's config) passes its words."""
    names = replace(SCRIPT_RELEASE_NAMES, no_checkout="set tool.checkout", megatron_entrypoint="set tool.backend")
    for given, fix in ((SCRIPT_RELEASE_NAMES, "pass --megatron-path /abs/Megatron-LM (or --entrypoint megapilot)"),
                       (names, "set tool.checkout")):
        with pytest.raises(MegapilotError) as info:
            render_launch(PLAN_8B, _options(megatron_path=None), given)
        assert info.value.fix == fix
    for given, fix in ((SCRIPT_RELEASE_NAMES, "use --entrypoint megatron with --megatron-path for this model"),
                       (names, "set tool.backend for this model")):
        with pytest.raises(MegapilotError) as info:
            render_launch(PLAN_8B, _options(entrypoint="megapilot", megatron_path=None), given)
        assert info.value.fix == fix


def test_embedded_trainer_takes_mla_with_yarn_and_its_router() -> None:
    args = render_launch(PLAN_DEEPSEEK, _options(entrypoint="megapilot", megatron_path=None)).megatron_args
    assert {"--multi-latent-attention", "--qk-layernorm", "--moe-router-pre-softmax"} <= set(args)
    assert args[args.index("--rope-type") + 1] == "yarn"


def test_embedded_trainer_entrypoint_runs_the_module() -> None:
    plan = GOLDEN_PLANS["llama3.3-70b_8nodes"]
    script = render_launch(plan, _options(entrypoint="megapilot", megatron_path=None)).script
    assert script.splitlines()[-1].endswith('-m megapilot.trainer "${MEGATRON_ARGS[@]}"')


def test_cpu_runs_are_fp32_over_gloo_and_not_for_primus() -> None:
    launch = render_launch(PLAN_8B, _options(cpu=True, entrypoint="megapilot", megatron_path=None))
    args = launch.megatron_args
    assert "--bf16" not in args and "--fp8-format" not in args
    assert args[args.index("--distributed-backend") + 1] == "gloo"
    assert any("CPU run" in note for note in launch.notes)
    with pytest.raises(MegapilotError, match="AMD GPUs only"):
        render_launch(PLAN_8B, _options(cpu=True, launcher="primus", primus_config_path="/e.yaml"))


def test_save_doubles_as_load_and_tensorboard_home() -> None:
    launch = render_launch(PLAN_8B, _options(save="/ckpt/run"))
    args = launch.megatron_args
    assert args[args.index("--load") + 1] == "/ckpt/run"
    assert args[args.index("--tensorboard-dir") + 1] == "/ckpt/run/tensorboard"
    assert any("--load defaults" in note for note in launch.notes)


def test_primus_needs_a_place_for_its_experiment_file() -> None:
    with pytest.raises(MegapilotError, match="Primus experiment file") as info:
        render_launch(PLAN_DEEPSEEK, _options(launcher="primus"))
    assert info.value.field == "primus_config_path"


def test_json_schema_is_stable() -> None:
    data = render_launch(PLAN_70B, _options()).to_json()
    assert list(data) == ["script", "launcher", "megatron_args", "env", "nodes", "gpus_per_node", "files",
                          "directories",
                          "notes", "megatron_release"]
    assert (data["nodes"], data["gpus_per_node"], data["launcher"]) == (8, 8, "torchrun")


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck not installed (setup.sh installs it)")
def test_scripts_with_hostile_paths_pass_shellcheck(tmp_path: Path) -> None:
    for launcher in ("torchrun", "slurm", "primus"):
        launch = render_launch(PLAN_70B, _options(launcher=launcher, save=NASTY, log_dir="/tmp/logs",
                                                  primus_config_path="/tmp/exp.yaml"))
        path = tmp_path / f"{launcher}.sh"
        path.write_text(launch.script)
        result = subprocess.run(["shellcheck", str(path)], capture_output=True, text=True)
        assert result.returncode == 0, result.stdout


def test_an_sbatch_launch_names_its_log_folder_as_a_directory_to_create_and_says_where_logs_go() -> None:
    launch = render_launch(PLAN_70B, _options(launcher="slurm", log_dir="/shared/logs/"))
    assert launch.directories == ["/shared/logs"]
    assert "#SBATCH --output=/shared/logs/%x-%j.out" in launch.script
    assert any("output to /shared/logs/%x-%j.out" in note and "must exist before sbatch" in note
               for note in launch.notes)
    assert render_launch(PLAN_70B, _options()).directories == []  # torchrun writes its own output


def test_remote_skips_existence_checks_even_for_a_local_looking_launch(tmp_path: Path) -> None:
    plan = GOLDEN_PLANS["llama3.1-8b_1node"]
    missing = str(tmp_path / "absent" / "corpus_text_document")
    options = LaunchOptions(data_path=missing, tokenizer_model="/absent/tok.model", megatron_path="/absent/mlm",
                            check_paths_exist=True)
    with pytest.raises(MegapilotError, match="dataset files missing"):
        render_launch(plan, options)
    launch = render_launch(plan, options.model_copy(update={"remote": True}))
    assert any("--remote" in note and "not for existence here" in note for note in launch.notes)
    with pytest.raises(MegapilotError, match="not an absolute path"):  # the form is still checked
        render_launch(plan, options.model_copy(update={"remote": True, "data_path": "relative/corpus"}))
    remote_slurm = render_launch(PLAN_70B, _options(launcher="slurm", log_dir="/cluster/logs", remote=True))
    assert any("create /cluster/logs on the cluster before sbatch" in note for note in remote_slurm.notes)


def test_sparse_attention_gets_fused_kernels_where_the_release_has_them_and_a_note_where_not() -> None:
    from megapilot.catalog import get_model

    plan = PLAN_DEEPSEEK.model_copy(update={"model": get_model("deepseek-v3.2").model_copy(update={"num_layers": 4})})
    newest = render_launch(plan, _options())
    kernel = newest.megatron_args.index("--dsa-kernel-backend")
    assert newest.megatron_args[kernel + 1] == "cudnn" and not any("unfused" in n for n in newest.notes)
    older = render_launch(plan, _options(megatron_version="0.16.0"))
    assert "--dsa-kernel-backend" not in older.megatron_args and "--experimental-attention-variant" in \
        older.megatron_args
    assert any("runs DeepSeek Sparse Attention unfused" in n for n in older.notes)


def test_a_sequence_longer_than_a_rope_models_context_raises_its_positions_with_a_note() -> None:
    """Megatron asserts max_position_embeddings >= seq_length; a RoPE model reads the value for nothing else, so a
    context-extension run gets the sequence length, said in a note; a run within the context keeps the model's."""
    longer = PLAN_8B.model_copy(update={"training": PLAN_8B.training.model_copy(update={"seq_length": 262144})})
    launch = render_launch(longer, _options())
    flat = launch.megatron_args
    assert flat[flat.index("--max-position-embeddings") + 1] == "262144"
    assert any("--max-position-embeddings 262144: raised from" in note for note in launch.notes)
    own = render_launch(PLAN_8B, _options())
    assert own.megatron_args[own.megatron_args.index("--max-position-embeddings") + 1] == str(
        PLAN_8B.model.max_position_embeddings)
    assert not any("raised from" in note for note in own.notes)


def test_dist_muon_overlaps_its_gradient_reduction_only_where_megatron_allows_it() -> None:
    """core_v0.16's arguments.py asserts no --overlap-grad-reduce for every Muon variant; core_v0.17 on refuses it
    only for plain muon. The script for 0.16 leaves it out and says so."""
    muon = PLAN_8B.model_copy(update={
        "training": PLAN_8B.training.model_copy(update={"optimizer": "dist_muon"}),
        "parallel": PLAN_8B.parallel.model_copy(update={"distributed_optimizer": False})})
    older = render_launch(muon, _options(megatron_version="core_v0.16.0"))
    newer = render_launch(muon, _options(megatron_version="core_v0.19.0"))
    assert "--overlap-grad-reduce" not in older.megatron_args
    assert any("--overlap-grad-reduce left out" in note for note in older.notes)
    assert "--overlap-grad-reduce" in newer.megatron_args
    assert not any("--overlap-grad-reduce left out" in note for note in newer.notes)


def test_activation_offloading_is_written_for_the_releases_that_take_it() -> None:
    """--cpu-offloading-num-layers turns Megatron-Core's cpu_offloading on from core_v0.16; core_v0.15 had no flag for
    it, so its script is refused naming the release that has one."""
    from tests.launch.variants import VARIANT_PLANS

    plan = VARIANT_PLANS["offload_activations"]
    args = render_launch(plan, _options()).megatron_args
    assert args[args.index("--cpu-offloading-num-layers") + 1] == "8"
    assert not {"--recompute-activations", "--recompute-granularity"} & set(args)
    with pytest.raises(MegapilotError, match=r"added in Megatron-LM core_v0\.16\.0") as old:
        render_launch(plan, _options(megatron_version="0.15"))
    assert old.value.field == "megatron_version"
