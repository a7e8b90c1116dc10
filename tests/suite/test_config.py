"""check_suite / load_suite on real CVS configs and on each class of problem."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from megapilot.errors import MegapilotError
from megapilot.suite.config import check_suite, load_suite
from tests.suite.cvs_files import (
    CVS_DIR,
    DISTRIBUTED_70B,
    MEGATRON_LM_IMAGE,
    SINGLE_8B,
    filled_in,
    raw_cvs,
    write_filled,
    write_suite,
)


def _paths(check) -> set[str]:
    return {p.path for p in check.problems}


def test_real_single_node_config_lists_exactly_its_changeme_paths() -> None:
    check = check_suite(CVS_DIR / SINGLE_8B)
    assert not check.ok
    assert _paths(check) == {
        "gpu_name", "threshold_json", "container.image", "container.env.NCCL_SOCKET_IFNAME",
        "container.env.GLOO_SOCKET_IFNAME", "container.env.NCCL_IB_GID_INDEX", "container.env.NCCL_DEBUG",
        "train_params.training_iterations",
    }
    assert all("<changeme>" in p.message for p in check.problems)


def test_real_distributed_config_exempts_the_unused_checkpoint_dir_and_volume() -> None:
    check = check_suite(CVS_DIR / DISTRIBUTED_70B)
    assert _paths(check) == {
        "gpu_name", "threshold_json", "train_params.training_iterations", "container.image",
        "container.env.MASTER_ADDR", "container.env.NCCL_IB_HCA", "container.env.NCCL_SOCKET_IFNAME",
        "container.env.GLOO_SOCKET_IFNAME", "container.env.NCCL_IB_GID_INDEX", "container.env.NCCL_DEBUG",
    }


def test_enforced_checkpoint_keeps_its_changeme_paths(tmp_path: Path) -> None:
    raw = filled_in(raw_cvs(DISTRIBUTED_70B))
    raw["checkpoint"]["enforce"] = True
    check = check_suite(write_suite(tmp_path, raw, DISTRIBUTED_70B))
    assert _paths(check) == {"checkpoint.checkpoint_dir", "container.runtime.args.volumes[4]"}


def test_filled_in_configs_load(tmp_path: Path) -> None:
    suite = load_suite(write_suite(tmp_path, filled_in(raw_cvs(SINGLE_8B)), SINGLE_8B))
    assert (suite.backend, suite.executor, suite.device) == ("megatron-lm", "local", "gpu")
    assert suite.model.name == "llama3.1-8b" and suite.gpu is not None and suite.gpu.name == "MI325X"
    assert (suite.nodes, suite.gpus_per_node) == (1, 8)
    assert [c.key for c in suite.cells] == ["MBS=4,GBS=128,PRECISION=FP8", "MBS=4,GBS=128,PRECISION=BF16",
                                            "MBS=4,GBS=128,PRECISION=MXFP4", "MBS=4,GBS=128,PRECISION=MXFP8"]
    assert all(c.train_iters == 20 and c.seq_length == 8192 for c in suite.cells)
    assert suite.smoke.gbs == 8 and suite.smoke.train_iters == 10
    assert suite.threshold_path == tmp_path / "t_threshold.json"
    assert set(suite.thresholds) == {c.key for c in suite.cells}


@pytest.mark.parametrize("executor", ["local", "slurm"])
def test_jobs_in_the_container_image_start_the_images_python_not_this_machines(tmp_path: Path, executor: str) -> None:
    # the host's virtual environment is no path inside rocm/megatron-lm: the image's python3 runs the launch
    raw = filled_in(raw_cvs(SINGLE_8B))
    raw["megapilot"] = {"executor": executor}
    suite = load_suite(write_suite(tmp_path, raw, SINGLE_8B))
    assert suite.runs_in_image and suite.python == "python3"
    raw["megapilot"]["python"] = "/opt/venv/bin/python"  # an interpreter named in the config still wins
    assert load_suite(write_suite(tmp_path, raw, SINGLE_8B)).python == "/opt/venv/bin/python"


def test_without_an_image_the_jobs_run_on_the_host_with_this_python(tmp_path: Path) -> None:
    raw = filled_in(raw_cvs(SINGLE_8B))
    raw["container"]["image"] = ""
    raw["megapilot"] = {"backend": "megatron-lm"}
    suite = load_suite(write_suite(tmp_path, raw, SINGLE_8B))
    assert not suite.runs_in_image and suite.python == sys.executable


def test_distributed_overlay_keeps_its_extra_keys(tmp_path: Path) -> None:
    suite = load_suite(write_suite(tmp_path, filled_in(raw_cvs(DISTRIBUTED_70B)), DISTRIBUTED_70B))
    assert suite.config.verify_network_errors is True
    assert suite.cells[0].extra == {"name": "llama3_3_70b_mbs1_gbs64_FP8"}
    assert suite.cells[0].layout.tp == 8 and suite.model.name == "llama3.3-70b"


def test_load_raises_one_error_listing_every_problem() -> None:
    with pytest.raises(MegapilotError) as info:
        load_suite(CVS_DIR / SINGLE_8B)
    assert info.value.field == "config"
    assert "8 problem(s)" in str(info.value)
    assert "container.env.NCCL_DEBUG" in str(info.value) and "\n" not in str(info.value)


def test_a_saved_plan_given_as_the_config_is_one_problem_naming_what_it_is(tmp_path: Path) -> None:
    """Not one 'Field required' per missing suite key (gpu_name, paths, train_params)."""
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"version": 1, "model": {"num_layers": 2}, "cluster": {}, "training": {},
                                "parallel": {}}))
    [problem] = check_suite(plan).problems
    assert problem.path == "config" and "saved plan" in problem.message and "run --plan" in problem.fix


def test_yaml_input_is_the_same_suite(tmp_path: Path) -> None:
    raw = filled_in(raw_cvs(SINGLE_8B))
    json_suite = load_suite(write_suite(tmp_path, raw, SINGLE_8B))
    (tmp_path / "suite.yaml").write_text(yaml.safe_dump(raw))
    yaml_suite = load_suite(tmp_path / "suite.yaml")
    assert yaml_suite.cells == json_suite.cells
    assert yaml_suite.config_hash == json_suite.config_hash


def test_user_id_comes_from_the_cluster_file(tmp_path: Path) -> None:
    cluster = tmp_path / "cluster.json"
    cluster.write_text(json.dumps({"username": "bob", "priv_key_file": "/home/{user-id}/.ssh/id",
                                   "head_node_dict": {"mgmt_ip": "n1"}, "node_dict": {"n1": {}, "n2": {}}}))
    suite = load_suite(write_suite(tmp_path, filled_in(raw_cvs(SINGLE_8B)), SINGLE_8B), cluster)
    assert suite.config.paths.log_dir == "/home/bob/LOGS/megatron"
    assert suite.nodes == 2 and suite.smoke.gbs == 8  # the file's smoke GBS wins over the multi-node default


def _check_with(tmp_path: Path, edit, name: str = SINGLE_8B):
    raw = filled_in(raw_cvs(name))
    edit(raw)
    return check_suite(write_suite(tmp_path, raw, name))


def test_bad_types_are_reported_with_dotted_paths(tmp_path: Path) -> None:
    def edit(raw):
        raw["train_params"]["sequence_length"] = "long"
        raw["smoke"]["iters"] = "ten"
        raw["container"]["lifetime"] = "forever"
    check = _check_with(tmp_path, edit)
    assert _paths(check) == {"train_params.sequence_length", "smoke.iters", "container.lifetime"}


def test_sweep_key_problems(tmp_path: Path) -> None:
    def edit(raw):
        combos = raw["sweep"]["combinations"]
        combos["MBS=4,GBS=big,PRECISION=BF16"] = {}
        combos["MBS=2,GBS=64,PRECISION=FP8"] = {"micro_batch_size": "4", "precision": "bf16"}
        combos["MBS=4,GBS=128,PRECISION=fp8"] = {}
        raw["sweep"]["runs"].append("MBS=8,GBS=128,PRECISION=FP8")
    check = _check_with(tmp_path, edit)
    assert {"sweep.combinations.MBS=4,GBS=big,PRECISION=BF16",
            "sweep.combinations.MBS=2,GBS=64,PRECISION=FP8.micro_batch_size",
            "sweep.combinations.MBS=2,GBS=64,PRECISION=FP8.precision",
            "sweep.combinations.MBS=4,GBS=128,PRECISION=fp8", "sweep.runs[4]"} <= _paths(check)


def test_free_form_combination_ids_take_their_cell_from_the_body(tmp_path: Path) -> None:
    # CVS's mi355x files keep ids such as llama3_1_8b-mi355x-bs128-mbs4-fp8 with MBS, GBS and precision in the body;
    # CVS derived the threshold cell from the body, and so does megapilot
    config, _ = write_filled(tmp_path, "mi355x_megatron_llama-3.1-8b_single.json", gpu="MI355X",
                             image=MEGATRON_LM_IMAGE, nodes=1)
    suite = load_suite(config)
    assert [cell.key for cell in suite.cells] == [f"MBS=4,GBS=128,PRECISION={p}" for p in ("FP8", "BF16", "MXFP4",
                                                                                          "MXFP8")]
    assert suite.cells[0].extra["name"] == "llama3_1_8b_mbs4_gbs128_FP8"
    raw = json.loads(config.read_text())
    del raw["sweep"]["combinations"]["llama3_1_8b-mi355x-bs128-mbs4-fp8"]["precision"]
    config.write_text(json.dumps(raw))
    assert "sweep.combinations.llama3_1_8b-mi355x-bs128-mbs4-fp8" in _paths(check_suite(config))


def test_combinations_without_runs_is_a_problem(tmp_path: Path) -> None:
    check = _check_with(tmp_path, lambda raw: raw["sweep"].update(runs=[]))
    assert "sweep.runs" in _paths(check)


def test_threshold_coverage_is_a_problem_when_enforced_and_a_warning_when_not(tmp_path: Path) -> None:
    def drop_run(raw):
        raw["sweep"]["runs"] = raw["sweep"]["runs"][:2]
    assert _paths(_check_with(tmp_path, drop_run)) == {"thresholds.MBS=4,GBS=128,PRECISION=MXFP4",
                                                       "thresholds.MBS=4,GBS=128,PRECISION=MXFP8"}

    def drop_run_record_only(raw):
        drop_run(raw)
        raw["enforce_thresholds"] = False
    check = _check_with(tmp_path, drop_run_record_only)
    assert check.ok and len(check.warnings) == 2


def test_missing_and_ambiguous_threshold_files(tmp_path: Path) -> None:
    check = _check_with(tmp_path, lambda raw: raw.update(threshold_json="nope_threshold.json"))
    assert _paths(check) == {"threshold_json"}
    (tmp_path / "other_threshold.json").write_text("{}")
    check = _check_with(tmp_path, lambda raw: raw.update(threshold_json=""))
    assert _paths(check) == {"threshold_json"} and "several" in check.problems[0].message


def test_unknown_top_level_keys_warn_and_unknown_gpu_is_a_problem(tmp_path: Path) -> None:
    def edit(raw):
        raw["result_dict"] = {}
        raw["gpu_name"] = "MI999X"
    check = _check_with(tmp_path, edit)
    assert _paths(check) == {"gpu_name"}
    assert any(w.startswith("result_dict:") for w in check.warnings)


def test_megapilot_block_is_strict(tmp_path: Path) -> None:
    check = _check_with(tmp_path, lambda raw: raw.update(megapilot={"executor": "k8s", "gpu_count": 3}))
    assert _paths(check) == {"megapilot.executor", "megapilot.gpu_count"}


def test_a_slip_of_a_top_level_key_is_a_problem_a_foreign_one_a_warning(tmp_path: Path) -> None:
    def edit(raw):
        raw["result_dict"] = {}
        raw["smoek"] = {"enabled": False}  # the smoke stage would run anyway
    check = _check_with(tmp_path, edit)
    assert _paths(check) == {"smoek"} and check.problems[0].fix == "rename it to smoke"
    assert any(w.startswith("result_dict:") for w in check.warnings)


def test_an_unknown_key_in_a_strict_section_names_its_near_match(tmp_path: Path) -> None:
    check = _check_with(tmp_path, lambda raw: raw.update(megapilot={"exectuor": "local"}))
    (problem,) = check.problems
    assert (problem.path, problem.message, problem.fix) == (
        "megapilot.exectuor", "unknown key (did you mean executor?)", "rename it to executor")


def test_layout_typos_in_train_params_and_a_combination_stop_the_suite(tmp_path: Path) -> None:
    def edit(raw):
        raw["train_params"]["pipline_parallelism"] = "2"
        raw["sweep"]["combinations"]["MBS=4,GBS=128,PRECISION=BF16"]["tensor_paralellism"] = "2"
    check = _check_with(tmp_path, edit)
    assert not check.ok and check.suite is None
    assert _paths(check) == {"train_params.pipline_parallelism",
                             "sweep.combinations.MBS=4,GBS=128,PRECISION=BF16.tensor_paralellism"}


def test_backend_rule_and_model_override(tmp_path: Path) -> None:
    def primus(raw):
        raw["container"]["image"] = "rocm/Primus:v25.9"
        raw["megapilot"] = {"model": "llama3.1-70b"}
    check = _check_with(tmp_path, primus)
    assert check.suite.backend == "primus" and check.suite.model.name == "llama3.1-70b"


def test_unmapped_model_name_asks_for_megapilot_model(tmp_path: Path) -> None:
    check = _check_with(tmp_path, lambda raw: raw["train_params"].update(
        model_name="mystery", model_size="3", tokenizer_model="NousResearch/Meta-Llama-3-8B"))  # a tokenizer-only repo
    assert _paths(check) == {"train_params.model_name"} and "megapilot.model" in check.problems[0].fix


def test_config_hash_leaves_the_token_file_out(tmp_path: Path) -> None:
    first = load_suite(write_suite(tmp_path, filled_in(raw_cvs(SINGLE_8B)), SINGLE_8B))
    raw = filled_in(raw_cvs(SINGLE_8B))
    raw["paths"]["hf_token_file"] = "/elsewhere/token"
    second = load_suite(write_suite(tmp_path, raw, SINGLE_8B))
    assert first.config_hash == second.config_hash
    raw["train_params"]["sequence_length"] = "4096"
    assert load_suite(write_suite(tmp_path, raw, SINGLE_8B)).config_hash != first.config_hash


def test_a_replica_larger_than_the_nodes_is_one_problem_naming_the_fields_and_the_nodes_it_needs(
        tmp_path: Path) -> None:
    # CVS's 405B (TP 8 x PP 4) on 2 nodes of 8: one problem at train_params, not one per cell
    config, cluster = write_filled(tmp_path, "mi3xx_megatron_llama-3.1-405b_distributed.json", gpu="MI325X",
                                   image=MEGATRON_LM_IMAGE, nodes=2)
    (problem,) = check_suite(config, cluster).problems
    assert problem.path == "train_params"
    assert problem.message == ("tensor_parallelism 8 x pipeline_parallelism 4 x context_parallelism 1 = 32 GPUs per "
                               "model replica does not divide the suite's 16 GPUs (the cluster file lists 2 node(s) "
                               "x 8 GPUs)")
    assert problem.fix.startswith("list a multiple of 4 nodes in the cluster file, or choose tensor_parallelism")
    (alone,) = check_suite(config).problems
    assert "no cluster file: 1 node(s)" in alone.message and alone.fix.startswith("pass --cluster")


def test_a_combination_whose_own_layout_cannot_fill_the_gpus_is_named_by_its_cell(tmp_path: Path) -> None:
    check = _check_with(tmp_path, lambda raw: raw["sweep"]["combinations"]["MBS=4,GBS=128,PRECISION=BF16"].update(
        tensor_parallelism="3"))
    assert [(p.path, p.message.split(" = ")[0]) for p in check.problems] == [
        ("cells.MBS=4,GBS=128,PRECISION=BF16", "tensor_parallelism 3 x pipeline_parallelism 1 x context_parallelism 1")]


def test_a_setting_weighed_against_another_is_named_with_the_change_that_fixes_it(tmp_path: Path) -> None:
    def edit(raw):
        raw["checkpoint"].update(enforce=True, save_iters=10, resume_iters=5, checkpoint_dir="/shared/ckpt")
        raw["collectives"] = {"min_bytes": 4096, "max_bytes": 1024}
    problems = {p.path: p for p in _check_with(tmp_path, edit).problems}
    resume = problems["checkpoint.resume_iters"]  # the field, not the whole section and its values
    assert resume.message == ("resume_iters (5) must be past save_iters (10): the resumed run has to train beyond "
                              "the checkpoint")
    assert resume.fix == "set resume_iters above 10, or save_iters below 5"
    sizes = problems["collectives.max_bytes"]
    assert "(got" not in sizes.message and sizes.fix == "set max_bytes to 4096 or more, or min_bytes to 1024 or less"


def test_a_path_naming_an_unset_environment_variable_is_a_problem_naming_it(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOT_SET_HERE", raising=False)
    raw = filled_in(raw_cvs(SINGLE_8B))
    raw["paths"]["log_dir"] = "$NOT_SET_HERE/logs"
    check = check_suite(write_suite(tmp_path, raw, SINGLE_8B))
    [problem] = check.problems
    assert problem.path == "paths.log_dir" and "$NOT_SET_HERE is not set" in problem.message
    assert problem.fix.startswith("export NOT_SET_HERE")


def test_megapilot_model_naming_another_model_than_model_name_is_a_warning(tmp_path: Path) -> None:
    # megapilot.model wins (documented); a model_name of another preset left beside it is a copy slip worth saying
    raw = filled_in(raw_cvs(SINGLE_8B))  # model_name llama3.1_8B
    raw["megapilot"] = {"model": "llama3.3-70b"}
    check = check_suite(write_suite(tmp_path, raw, SINGLE_8B))
    assert check.suite is not None and check.suite.model.name == "llama3.3-70b"
    assert any(w.startswith("train_params.model_name: 'llama3.1_8B' names the llama3.1-8b preset, but megapilot.model "
                            "trains llama3.3-70b") for w in check.warnings)
    raw["megapilot"] = {"model": "llama3.1-8b"}  # the same model: nothing to say
    assert not any("model_name" in w for w in check_suite(write_suite(tmp_path, raw, SINGLE_8B)).warnings)


def test_a_runtime_arg_the_container_is_not_started_with_is_a_warning_naming_it(tmp_path: Path) -> None:
    # `gpus: all` and `shm_size` were accepted and passed to nothing: an NVIDIA container started without its GPUs
    raw = filled_in(raw_cvs(SINGLE_8B))
    raw["container"]["runtime"]["args"].update(gpus="all", ulimits=["memlock=-1"], cap_add=["SYS_PTRACE"])
    check = check_suite(write_suite(tmp_path, raw, SINGLE_8B))
    assert check.ok, check.problems
    said = [w for w in check.warnings if w.startswith("container.runtime.args.")]
    assert said == [
        "container.runtime.args.gpus: not passed to `docker run`; ignored — fix: megapilot passes network, ipc, "
        "privileged, volumes, devices, cap_add, security_opt, group_add, ulimit; remove it, or add the flag to the "
        "image or the cluster",
        "container.runtime.args.ulimits: not passed to `docker run`; ignored — fix: rename it to ulimit"]
