"""`--cp-comm-type a2a` in every launcher, read back by diagnose, and left out for Megatron's default p2p ring."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from megapilot.catalog import get_model
from megapilot.diagnose.flags import read_flags, run_config
from megapilot.launch import LaunchOptions, render_launch
from megapilot.launch.checks import check_megatron_args
from megapilot.spec import SavedPlan, TrainingSpec
from tests.launch.plans import GOLDEN_PLANS, make_plan

# GPT-OSS-120B at its original context: pretrain_gpt.py builds YaRN only for MLA (model.rope_scaling's refusal)
GPT_OSS = get_model("gpt-oss-120b").model_copy(update={"rope_scaling": None})
TRAINING = TrainingSpec(seq_length=32768, global_batch_size=64)
OPTIONS = LaunchOptions(mock_data=True, megatron_path="/opt/Megatron-LM", check_paths_exist=False,
                        primus_config_path="/exp/run.yaml")


def _a2a_plan(gpu: str = "h100") -> SavedPlan:
    return make_plan(GPT_OSS, gpu, 8, TRAINING, tp=2, cp=2, cp_comm_type="a2a", ep=8, etp=1, fsdp=True,
                     sequence_parallel=True)


@pytest.mark.parametrize("launcher", ["torchrun", "slurm"])
def test_an_a2a_layout_writes_the_flag_and_the_script_reads_back_to_it(launcher: str, tmp_path: Path) -> None:
    launch = render_launch(_a2a_plan(), OPTIONS.model_copy(update={"launcher": launcher, "log_dir": "/tmp/logs"}))
    args = launch.megatron_args
    assert args[args.index("--cp-comm-type") + 1] == "a2a"
    check_megatron_args(args, _a2a_plan().cluster.gpu)  # TE's sink rule passes with a2a
    script = tmp_path / "train.sh"
    script.write_text(launch.script)
    flags = read_flags(script=script)
    assert flags is not None
    config = run_config(flags, gpus=64)
    assert config.parallel is not None and (config.parallel.cp, config.parallel.cp_comm_type) == (2, "a2a")


def test_primus_experiment_carries_cp_comm_type_as_megatrons_list() -> None:
    launch = render_launch(_a2a_plan("mi300x"), OPTIONS.model_copy(update={"launcher": "primus"}))
    overrides = yaml.safe_load(launch.files["/exp/run.yaml"])["modules"]["pre_trainer"]["overrides"]
    assert overrides["cp_comm_type"] == ["a2a"]  # argparse's nargs '+' list, as Megatron parses the flag


def test_the_p2p_ring_writes_no_flag_and_reads_back_as_p2p() -> None:
    for plan in GOLDEN_PLANS.values():
        assert "--cp-comm-type" not in render_launch(plan, OPTIONS).megatron_args
    for written, read in (("a2a a2a", "a2a"), ("p2p", "p2p"), ("a2a p2p", "p2p"), ("all_gather", "p2p")):
        flags = read_flags(flags=f"--context-parallel-size 2 --cp-comm-type {written} --seq-length 4096")
        config = run_config(flags, gpus=8)  # type: ignore[arg-type]  # flags were given
        assert config.parallel is not None and config.parallel.cp_comm_type == read, written
