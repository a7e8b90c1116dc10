"""render_cell: CVS cells to Megatron-LM / Primus / embedded-trainer launches; failures stay per cell, but for the
release, which is the suite's and refused once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from megapilot.errors import MegapilotError
from megapilot.estimate.memory import shard_params
from megapilot.suite.config import load_suite
from megapilot.suite.render import pipeline_split, render_cell, render_cells
from megapilot.suite.templates import template_path
from megapilot.trainer.config import build_config
from tests.suite.cvs_files import (
    DISTRIBUTED_70B,
    LLAMA_405B,
    MEGATRON_LM_IMAGE,
    PRIMUS_IMAGE,
    SINGLE_8B,
    filled_in,
    raw_cvs,
    write_filled,
    write_suite,
)


def _arg(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def _suite(tmp_path: Path, name: str = SINGLE_8B, edit=None):
    raw = filled_in(raw_cvs(name))
    if edit:
        edit(raw)
    return load_suite(write_suite(tmp_path, raw, name))


def test_cvs_cells_render_megatron_lm_args_per_cell(tmp_path: Path) -> None:
    suite = _suite(tmp_path)
    launches = render_cells(suite, tmp_path / "run")
    by_key = {launch.key: launch for launch in launches}
    fp8 = by_key["MBS=4,GBS=128,PRECISION=FP8"]
    assert fp8.runnable and fp8.backend == "megatron-lm"
    assert "/workspace/Megatron-LM/pretrain_gpt.py" in fp8.command
    args = fp8.megatron_args
    assert (_arg(args, "--micro-batch-size"), _arg(args, "--global-batch-size")) == ("4", "128")
    assert (_arg(args, "--seq-length"), _arg(args, "--train-iters")) == ("8192", "20")
    assert _arg(args, "--tensor-model-parallel-size") == "1" and "--fp8-format" in args
    assert _arg(args, "--tokenizer-model") == "meta-llama/Llama-3.1-8B" and "--mock-data" in args
    assert "--fp8-format" not in by_key["MBS=4,GBS=128,PRECISION=BF16"].megatron_args
    assert by_key["MBS=4,GBS=128,PRECISION=MXFP4"].skipped.startswith("MXFP4 is not supported on MI325X")
    assert by_key["MBS=4,GBS=128,PRECISION=MXFP4"].megatron_args == []
    assert by_key["smoke"].runnable and _arg(by_key["smoke"].megatron_args, "--train-iters") == "10"
    assert fp8.env["NCCL_SOCKET_IFNAME"] == "enp193s0f1np1"  # container.env's interface reaches the launch


def test_distributed_cell_with_recompute_and_checkpoint_dirs(tmp_path: Path) -> None:
    def edit(raw):
        raw["train_params"]["recompute"] = "1"
        raw["megapilot"] = {"nodes": 2}
    suite = _suite(tmp_path, DISTRIBUTED_70B, edit)
    launch = render_cell(suite, suite.cells[1], job_dir=tmp_path / "job", train_iters=7, save_dir="/shared/ckpt",
                         save_interval=5)
    args = launch.megatron_args
    assert launch.runnable and launch.nodes == 2 and launch.plan.parallel.dp == 2
    assert _arg(args, "--recompute-granularity") == "full" and _arg(args, "--train-iters") == "7"
    assert (_arg(args, "--save"), _arg(args, "--save-interval")) == ("/shared/ckpt", "5")
    assert "--nnodes 2" in launch.command


def test_a_layout_that_cannot_fill_the_gpus_fails_only_its_cell(tmp_path: Path) -> None:
    # the config check refuses such a cell (tests/suite/test_config.py); the nodes left by --exclude-failing can
    # still make one, which its render refuses
    suite = _suite(tmp_path)
    cells = [cell.model_copy(update={"layout": cell.layout.model_copy(update={"tp": 3})})
             if cell.key == "MBS=4,GBS=128,PRECISION=BF16" else cell for cell in suite.cells]
    suite = suite.model_copy(update={"cells": cells})
    launches = {launch.key: launch for launch in render_cells(suite, tmp_path / "run")}
    assert "does not divide" in launches["MBS=4,GBS=128,PRECISION=BF16"].error
    assert launches["MBS=4,GBS=128,PRECISION=FP8"].runnable


def test_primus_and_slurm_launchers(tmp_path: Path) -> None:
    suite = _suite(tmp_path, edit=lambda raw: raw["container"].update(image="rocm/primus:v25.9"))
    primus = render_cell(suite, suite.cells[1], job_dir=tmp_path / "p")
    assert primus.runnable and primus.backend == "primus" and "primus-cli" in primus.command
    assert any(path.endswith("primus_experiment.yaml") for path in primus.files)
    suite = _suite(tmp_path, edit=lambda raw: raw.update(megapilot={"executor": "slurm", "partition": "gpu"}))
    slurm = render_cell(suite, suite.cells[1], job_dir=tmp_path / "s")
    assert slurm.runnable and slurm.command.startswith("sbatch ")
    assert "#SBATCH --partition=gpu" in slurm.script_text


def test_tiny_local_renders_trainer_args_the_trainer_accepts(tmp_path: Path) -> None:
    suite = load_suite(template_path("tiny-local"))
    (tmp_path / "job").mkdir()
    launch = render_cell(suite, suite.cells[1], job_dir=tmp_path / "job")
    assert launch.runnable and "-m megapilot.trainer" in launch.command
    config = build_config(launch.megatron_args, gpu_available=False)
    config.check_world_size(2)
    assert (_arg(launch.megatron_args, "--micro-batch-size"), _arg(launch.megatron_args, "--seq-length")) == ("2",
                                                                                                                "128")
    assert "--mock-data" in launch.megatron_args
    assert any("predictions model this machine's CPU" in note for note in launch.notes)


def test_secret_named_container_env_never_reaches_the_launch(tmp_path: Path) -> None:
    suite = _suite(tmp_path, edit=lambda raw: raw["container"]["env"].update(HF_TOKEN="hf_secret"))
    launch = render_cell(suite, suite.cells[1], job_dir=tmp_path / "j")
    assert "HF_TOKEN" not in launch.env
    assert "hf_secret" not in json.dumps(launch.model_dump(mode="json"))


def test_megapilot_keys_give_a_moe_cell_expert_and_context_parallelism(tmp_path: Path) -> None:
    # CVS's schema cannot say EP or CP; megapilot's train_params keys can, per cell too
    def edit(raw):
        raw["megapilot"] = {"nodes": 2, "model": "mixtral-8x7b"}
        raw["train_params"].update(tensor_parallelism="2", expert_parallelism="8")
        raw["sweep"]["combinations"]["MBS=1,GBS=64,PRECISION=FP8"]["context_parallelism"] = "2"
    suite = _suite(tmp_path, DISTRIBUTED_70B, edit)
    by_key = {cell.key: cell for cell in suite.cells}
    fp8, bf16 = by_key["MBS=1,GBS=64,PRECISION=FP8"], by_key["MBS=1,GBS=64,PRECISION=BF16"]
    assert (fp8.layout.tp, fp8.layout.cp, fp8.layout.ep) == (2, 2, 8) and (bf16.layout.cp, bf16.layout.ep) == (1, 8)
    launch = render_cell(suite, bf16, job_dir=tmp_path / "b")
    assert launch.runnable, launch.error
    assert launch.plan is not None and (launch.plan.parallel.ep, launch.plan.parallel.dp) == (8, 8)
    assert _arg(launch.megatron_args, "--expert-model-parallel-size") == "8"
    cp = render_cell(suite, fp8, job_dir=tmp_path / "f")
    assert cp.runnable, cp.error
    assert _arg(cp.megatron_args, "--context-parallel-size") == "2"


def test_expert_parallelism_on_a_dense_model_fails_only_its_cell(tmp_path: Path) -> None:
    def edit(raw):
        raw["megapilot"] = {"nodes": 2}
        raw["sweep"]["combinations"]["MBS=1,GBS=64,PRECISION=FP8"]["expert_parallelism"] = "2"
    suite = _suite(tmp_path, DISTRIBUTED_70B, edit)
    launches = {launch.key: launch for launch in render_cells(suite, tmp_path / "run", with_smoke=False)}
    assert launches["MBS=1,GBS=64,PRECISION=FP8"].error
    assert launches["MBS=1,GBS=64,PRECISION=BF16"].runnable


def test_llama_405b_on_pp4_runs_the_split_megatron_accepts_and_memory_follows_it(tmp_path: Path) -> None:
    # CVS's 405B config: 126 layers, TP 8 x PP 4 on 4 nodes, run by Primus; neither it nor Primus's 405B experiment
    # names a split, and Megatron needs (126 + embedding + loss) divisible by PP: 31 + 32 + 32 + 31
    config, cluster = write_filled(tmp_path, LLAMA_405B, gpu="MI325X", image=PRIMUS_IMAGE, nodes=4)
    suite = load_suite(config, cluster)
    launch = render_cell(suite, suite.cells[0], job_dir=tmp_path / "job")
    assert launch.runnable and launch.backend == "primus", launch.error
    args = launch.megatron_args
    assert "--account-for-embedding-in-pipeline-split" in args and "--account-for-loss-in-pipeline-split" in args
    experiment = next(text for path, text in launch.files.items() if path.endswith("primus_experiment.yaml"))
    assert "account_for_embedding_in_pipeline_split: true" in experiment
    assert "account_for_loss_in_pipeline_split: true" in experiment
    parallel = launch.plan.parallel
    assert parallel.rank_layer_counts(suite.model.num_layers) == (31, 32, 32, 31)
    # the memory model holds each rank's own layers: a middle rank 32, the first 31 (plus the embedding)
    per_layer = [shard_params(suite.model, parallel, stage).dense - shard_params(suite.model, parallel, stage).vocab
                 for stage in range(4)]
    assert per_layer[1] == per_layer[2] and abs(per_layer[0] / per_layer[1] - 31 / 32) < 1e-3
    assert abs(per_layer[3] / per_layer[1] - 31 / 32) < 1e-3
    # the same file on the Megatron-LM image renders the same split
    megatron = load_suite(write_filled(tmp_path / "lm", LLAMA_405B, gpu="MI325X", image=MEGATRON_LM_IMAGE,
                                       nodes=4)[0], cluster)
    lm = render_cell(megatron, megatron.cells[0], job_dir=tmp_path / "lm-job")
    assert lm.runnable and "--account-for-loss-in-pipeline-split" in lm.megatron_args


def test_a_split_no_end_slot_can_fix_falls_back_to_first_and_last_counts(tmp_path: Path) -> None:
    # 126 layers on PP 8: 126 + 2 = 128 slots divide; on PP 5 no end-slot split divides (126..128 % 5), so the
    # planner's first/last counts are taken
    def pp(value):
        def edit(raw):
            raw["train_params"]["pipeline_parallelism"] = str(value)
            raw["train_params"]["tensor_parallelism"] = "1"
        return edit
    for value, expected in ((8, "+E+L"), (5, "first")):
        config, cluster = write_filled(tmp_path / str(value), LLAMA_405B, gpu="MI325X", image=PRIMUS_IMAGE, nodes=5,
                                       edit=pp(value))
        suite = load_suite(config, cluster)
        assert pipeline_split(suite, suite.cells[0]).label().startswith(expected)


def test_a_release_without_a_table_is_refused_naming_what_a_suite_takes(tmp_path: Path) -> None:
    """A suite takes no --megatron-path: the fix names --megatron-version and the config's keys."""
    raw = json.loads(template_path("tiny-local").read_text())
    raw["megapilot"]["megatron_version"] = "0.99"
    (tmp_path / "tiny.json").write_text(json.dumps(raw))
    for path in template_path("tiny-local").parent.glob("tiny-local_threshold*.json"):
        (tmp_path / path.name).write_text(path.read_text())
    suite = load_suite(tmp_path / "tiny.json")
    assert len(suite.cells) > 1
    # the release is the suite's: refused once, not handed back as the error of each of its cells
    with pytest.raises(MegapilotError) as refused:
        render_cells(suite, tmp_path, with_smoke=False)
    assert refused.value.field == "megatron_version" and "no flag table for Megatron-LM 0.99" in refused.value.problem
    assert "--megatron-path" not in str(refused.value)
    assert ("pass one of those to --megatron-version or set megapilot.megatron_version to it, or with backend "
            "megatron-lm, set megapilot.megatron_path to /abs/Megatron-LM") in (refused.value.fix or "")


def test_a_suite_s_checkout_errors_name_its_config_keys_not_the_script_s_options(tmp_path: Path) -> None:
    """A suite takes no --megatron-path or --entrypoint: a broken checkout, a checkout of another release than
    megapilot.megatron_version, and a model the embedded trainer cannot train are refused in the config's keys."""
    from tests.launch.test_versions import _local_checkout

    def errors(megapilot: dict) -> set[str]:
        suite = _suite(tmp_path, edit=lambda raw: raw.__setitem__("megapilot", megapilot))
        try:
            launches = render_cells(suite, tmp_path / "run")
        except MegapilotError as exc:  # the checkout is the suite's: refused once, for every cell
            return {" ".join(str(exc).split())}
        return {launch.error for launch in launches if launch.error}

    broken = tmp_path / "broken"
    (broken / "megatron/training").mkdir(parents=True)
    (broken / "megatron/training/arguments.py").write_text("")  # no megatron/core/package_info.py
    assert errors({"megatron_path": str(broken)}) == {
        f"megatron_path: {broken}/megatron/core/package_info.py does not exist — fix: point megapilot.megatron_path at "
        "the root of a Megatron-LM checkout"}
    checkout = _local_checkout("core_v0.14.0", tmp_path)
    assert errors({"megatron_path": str(checkout), "megatron_version": "0.16"}) == {
        f"megatron_version: megapilot.megatron_version 0.16 but the checkout at {checkout} is 0.14.0 "
        "(megatron/core/package_info.py) — fix: drop megapilot.megatron_version (the checkout decides) or point "
        "megapilot.megatron_path at the right checkout"}
    [refused] = errors({"backend": "megapilot"})  # the FP8 cell
    assert refused.startswith("entrypoint: the embedded trainer does not implement --fp8-format")
    assert refused.endswith("fix: set megapilot.backend to megatron-lm (with megapilot.megatron_path) for this model")
