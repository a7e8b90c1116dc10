"""`megapilot suite run` without training: the dry run of real CVS files, and what it refuses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from megapilot.suite.results import Verdict
from tests.suite.cvs_files import (
    DISTRIBUTED_70B,
    LLAMA_405B,
    PRIMUS_IMAGE,
    SINGLE_8B,
    filled_in,
    raw_cvs,
    write_filled,
    write_suite,
)


def test_dry_run_of_a_real_cvs_config_gives_megatron_args_per_combo(cli, tmp_path: Path) -> None:
    config = write_suite(tmp_path, filled_in(raw_cvs(SINGLE_8B)), SINGLE_8B)
    result = cli("suite", "run", str(config), "--dry-run", "--json", "--out", str(tmp_path / "out"))
    assert result.exit_code == 0, result.stderr
    plan = result.json()
    cvs_runs = raw_cvs(SINGLE_8B)["sweep"]["runs"]
    assert [c["key"] for c in plan["combos"]] == cvs_runs
    names = [s["name"] for s in plan["stages"]]
    assert names[:6] == ["prepare", "preflight", "collectives", "tokenizer", "smoke", "checkpoint"]
    assert names[-2:] == ["results", "teardown"]
    runnable = [c for c in plan["combos"] if c["skipped"] is None]
    assert runnable, plan["combos"]
    for combo in runnable:
        args = combo["megatron_args"]
        mbs, gbs = (int(part.split("=")[1]) for part in combo["key"].split(",")[:2])
        assert args[args.index("--micro-batch-size") + 1] == str(mbs)
        assert args[args.index("--global-batch-size") + 1] == str(gbs)
        assert args[args.index("--train-iters") + 1] == "20"  # the sweep overlay wins over train_params
        assert args[args.index("--seq-length") + 1] == raw_cvs(SINGLE_8B)["train_params"]["sequence_length"]
        assert combo["backend"] == "megatron-lm" and "pretrain_gpt.py" in combo["command"]
        assert combo["env"]["NCCL_SOCKET_IFNAME"] == "enp193s0f1np1"  # container.env, placeholders filled
    fp8 = next(c for c in plan["combos"] if c["key"].endswith("PRECISION=FP8"))
    assert "--fp8-format" in fp8["megatron_args"]
    skipped = [c for c in plan["combos"] if c["skipped"]]
    assert all("MXFP4" in c["key"] or "MXFP8" in c["key"] for c in skipped)  # MI325X lacks them, said so


def test_the_dry_run_prints_the_smoke_jobs_launch_like_every_combos(cli, tmp_path: Path) -> None:
    config = write_suite(tmp_path, filled_in(raw_cvs(SINGLE_8B)), SINGLE_8B)
    out = str(tmp_path / "out")
    plan = cli("suite", "run", str(config), "--dry-run", "--json", "--out", out).json()
    smoke = plan["smoke"]
    assert smoke["key"] == "smoke" and smoke["skipped"] is None and "pretrain_gpt.py" in smoke["command"]
    text = cli("suite", "run", str(config), "--dry-run", "--out", out)
    assert text.exit_code == 0, text.stderr
    blocks = text.stdout.split("\n\n")
    launch = next(block for block in blocks if block.startswith("smoke backend=megatron-lm"))
    assert launch.splitlines()[1].strip() == smoke["command"]  # the whole launch, as a combo's is printed
    first_combo = next(index for index, block in enumerate(blocks) if block.startswith(plan["combos"][0]["key"]))
    assert blocks.index(launch) < first_combo  # in the order the run launches them


def test_dry_run_of_the_distributed_config_uses_the_cluster_nodes(cli, tmp_path: Path) -> None:
    raw = filled_in(raw_cvs(DISTRIBUTED_70B))
    config = write_suite(tmp_path, raw, DISTRIBUTED_70B)
    cluster = tmp_path / "cluster.json"
    cluster.write_text(json.dumps({"username": "me", "priv_key_file": "/home/me/.ssh/id_rsa",
                                   "head_node_dict": {"mgmt_ip": "10.0.0.1"},
                                   "node_dict": {f"10.0.0.{i}": {"bmc_ip": "NA", "vpc_ip": f"10.0.0.{i}"}
                                                 for i in (1, 2)}}))
    result = cli("suite", "run", str(config), "--cluster", str(cluster), "--dry-run", "--json",
                 "--out", str(tmp_path / "out"))
    assert result.exit_code == 0, result.stderr
    combos = [c for c in result.json()["combos"] if c["skipped"] is None]
    assert combos and all(c["nodes"] == 2 for c in combos)


def test_an_unknown_stage_or_combo_is_a_user_error(cli, tmp_path: Path) -> None:
    config = write_suite(tmp_path, filled_in(raw_cvs(SINGLE_8B)), SINGLE_8B)
    bad_stage = cli("suite", "run", str(config), "--stage", "warmup", "--dry-run")
    assert bad_stage.exit_code == 2 and "--stage" in bad_stage.stderr and "preflight" in bad_stage.stderr
    bad_combo = cli("suite", "run", str(config), "--combo", "MBS=9,GBS=9,PRECISION=BF16", "--dry-run")
    assert bad_combo.exit_code == 2 and "--combo" in bad_combo.stderr and "MBS=4,GBS=128" in bad_combo.stderr


@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_a_combo_written_in_another_case_is_the_cell_its_key_names(cli, tmp_path: Path, json_flag: list[str]) -> None:
    # the threshold file reads PRECISION=fp8 as the FP8 cell: --combo does too, and so runs (and resumes) that cell
    config = write_suite(tmp_path, filled_in(raw_cvs(SINGLE_8B)), SINGLE_8B)
    done = cli("suite", "run", str(config), "--combo", "MBS=4,GBS=128,PRECISION=fp8", "--dry-run", *json_flag,
               "--out", str(tmp_path / "out"))
    assert done.exit_code == 0, done.stderr
    assert "MBS=4,GBS=128,PRECISION=FP8" in done.stdout and "MBS=4,GBS=128,PRECISION=BF16" not in done.stdout


@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_a_dry_run_refuses_an_unknown_calibration_as_the_run_would(cli, tmp_path: Path, json_flag: list[str]) -> None:
    # the dry run passed with --calibration histroy, and the run it vouched for was then refused
    config = write_suite(tmp_path, filled_in(raw_cvs(SINGLE_8B)), SINGLE_8B)
    done = cli("suite", "run", str(config), "--calibration", "histroy", "--dry-run", *json_flag,
               "--out", str(tmp_path / "out"))
    assert done.exit_code == 2 and "--calibration" in done.stderr and "history or none" in done.stderr


def test_a_dry_run_of_a_resume_is_refused_not_shown_as_the_whole_suite(cli, tmp_path: Path) -> None:
    config = write_suite(tmp_path, filled_in(raw_cvs(SINGLE_8B)), SINGLE_8B)
    done = cli("suite", "run", str(config), "--resume", "latest", "--dry-run", "--out", str(tmp_path / "out"))
    assert done.exit_code == 2 and done.stderr.startswith("error: --resume:") and "drop --dry-run" in done.stderr


def test_an_out_that_cannot_hold_run_directories_is_refused_naming_out(cli, tmp_path: Path) -> None:
    config = write_suite(tmp_path, filled_in(raw_cvs(SINGLE_8B)), SINGLE_8B)
    (tmp_path / "afile").write_text("")
    done = cli("suite", "run", str(config), "--out", str(tmp_path / "afile" / "runs"), "--dry-run")
    assert done.exit_code == 2 and len(done.stderr.strip().splitlines()) == 1
    assert done.stderr.startswith("error: --out:") and "is a file, not a folder" in done.stderr
    assert not (tmp_path / "afile").is_dir()


def test_a_config_with_placeholders_left_is_refused_before_anything_runs(cli, tmp_path: Path) -> None:
    config = write_suite(tmp_path, raw_cvs(SINGLE_8B), SINGLE_8B)
    result = cli("suite", "run", str(config), "--out", str(tmp_path / "out"))
    assert result.exit_code == 2 and "<changeme>" in result.stderr and "gpu_name" in result.stderr
    assert not (tmp_path / "out").exists()


def test_what_check_refuses_stops_the_run_before_anything_runs_or_is_recorded(cli, tmp_path: Path) -> None:
    import shutil

    from megapilot.suite.templates import template_path, threshold_paths

    data = json.loads(template_path("tiny-local").read_text())
    for path in threshold_paths("tiny-local"):
        shutil.copy(path, tmp_path / path.name)
    data["train_params"]["tensor_parallelism"] = "3"  # divides none of the 2 ranks: no cell can run
    config = tmp_path / "suite.json"
    config.write_text(json.dumps(data))
    out, db = tmp_path / "out", tmp_path / "history.sqlite"
    check = cli("suite", "check", str(config))
    run = cli("suite", "run", str(config), "--out", str(out), "--db", str(db))
    assert check.exit_code == run.exit_code == 2
    # once, at the setting every cell takes it from, not once per cell
    assert run.stderr.count("error: ") == 1 and "error: train_params: tensor_parallelism 3 x" in run.stderr
    assert "does not divide the suite's 2 ranks" in run.stderr and "preflight" not in run.stdout + run.stderr
    assert not out.exists() and not db.exists()  # no run directory, no history row
    data["train_params"].update(tensor_parallelism="1", pipline_parallelism="2")  # a config problem, too
    config.write_text(json.dumps(data))
    dry = cli("suite", "run", str(config), "--out", str(out), "--dry-run")
    assert dry.exit_code == 2 and "error: train_params.pipline_parallelism: unknown key" in dry.stderr
    assert not out.exists()


def test_a_json_dry_run_of_a_config_check_refuses_prints_check_s_json_document(cli, tmp_path: Path) -> None:
    # stdout is one JSON document, as with `suite check --json`, and the exit code is check's
    raw = filled_in(raw_cvs(SINGLE_8B))
    raw["train_params"]["pipline_parallelism"] = "2"  # a config problem
    config = write_suite(tmp_path, raw, SINGLE_8B)
    out = tmp_path / "out"
    check = cli("suite", "check", str(config), "--json")
    dry = cli("suite", "run", str(config), "--dry-run", "--json", "--out", str(out))
    assert dry.exit_code == check.exit_code == 2 and dry.stderr == ""
    assert dry.json() == check.json() and dry.json()["ok"] is False
    assert [p["path"] for p in dry.json()["problems"]] == ["train_params.pipline_parallelism"]
    raw["train_params"].pop("pipline_parallelism")
    config.write_text(json.dumps(raw))
    unknown = cli("suite", "run", str(config), "--dry-run", "--json", "--out", str(out), "--megatron-version", "0.99")
    assert unknown.exit_code == 2 and unknown.json()["problems"][0]["path"] == "--megatron-version"
    combo = cli("suite", "run", str(config), "--dry-run", "--json", "--out", str(out), "--combo", "MBS=9,GBS=9")
    assert combo.exit_code == 2 and combo.json()["problems"][0]["path"] == "--combo"
    assert not out.exists()


def test_a_json_run_of_a_config_check_refuses_prints_check_s_json_document_too(cli, tmp_path: Path) -> None:
    # not only the dry run: a real run with --json refused by the check prints the same one JSON document
    raw = filled_in(raw_cvs(SINGLE_8B))
    raw["train_params"]["pipline_parallelism"] = "2"  # a config problem
    config = write_suite(tmp_path, raw, SINGLE_8B)
    out, db = tmp_path / "out", tmp_path / "history.sqlite"
    check = cli("suite", "check", str(config), "--json")
    run = cli("suite", "run", str(config), "--json", "--out", str(out), "--db", str(db))
    assert run.exit_code == check.exit_code == 2 and run.stderr == ""
    assert run.json() == check.json() and run.json()["ok"] is False
    raw["train_params"].pop("pipline_parallelism")
    config.write_text(json.dumps(raw))
    combo = cli("suite", "run", str(config), "--json", "--out", str(out), "--db", str(db), "--combo", "MBS=9,GBS=9")
    assert combo.exit_code == 2 and combo.stderr == "" and combo.json()["problems"][0]["path"] == "--combo"
    assert not out.exists() and not db.exists()


def test_megatron_version_reaches_every_combo_and_an_unknown_one_is_refused(cli, tmp_path: Path) -> None:
    config = write_suite(tmp_path, filled_in(raw_cvs(SINGLE_8B)), SINGLE_8B)
    out = str(tmp_path / "out")
    old = cli("suite", "run", str(config), "--dry-run", "--json", "--out", out, "--megatron-version", "0.14")
    assert old.exit_code == 0, old.stderr
    runnable = [c for c in old.json()["combos"] if c["skipped"] is None]
    assert runnable and all("--eval-interval" not in c["megatron_args"] for c in runnable)  # 0.14's default is 1000
    new = cli("suite", "run", str(config), "--dry-run", "--json", "--out", out)
    assert all("--eval-interval" in c["megatron_args"] for c in new.json()["combos"] if c["skipped"] is None)
    unknown = cli("suite", "run", str(config), "--dry-run", "--out", out, "--megatron-version", "0.99")
    assert unknown.exit_code == 2 and "no flag table for Megatron-LM 0.99" in unknown.stderr


def test_dry_run_of_the_405b_config_on_primus_renders_its_uneven_pipeline_split(cli, tmp_path: Path) -> None:
    config, cluster = write_filled(tmp_path, LLAMA_405B, gpu="MI325X", image=PRIMUS_IMAGE, nodes=4)
    result = cli("suite", "run", str(config), "--cluster", str(cluster), "--dry-run", "--json",
                 "--out", str(tmp_path / "out"))
    assert result.exit_code == 0, result.stderr
    combos = result.json()["combos"]
    assert [c["key"] for c in combos] == ["MBS=1,GBS=64,PRECISION=FP8", "MBS=1,GBS=64,PRECISION=BF16"]
    for combo in combos:
        args = combo["megatron_args"]
        assert combo["skipped"] is None and combo["backend"] == "primus" and combo["nodes"] == 4
        assert args[args.index("--pipeline-model-parallel-size") + 1] == "4"
        assert {"--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"} <= set(args)


def test_dry_run_warns_of_a_combo_predicted_over_the_gpus_memory_and_still_shows_its_launch(cli, tmp_path: Path
                                                                                            ) -> None:
    # CVS's 405B runs TP 8 x PP 4 with no recompute on 4 MI325X nodes: predicted above 256 GiB on stage 0; CVS runs it
    # as shipped, so the dry run warns and keeps the launch
    config, cluster = write_filled(tmp_path, LLAMA_405B, gpu="MI325X", image=PRIMUS_IMAGE, nodes=4)
    text = cli("suite", "run", str(config), "--cluster", str(cluster), "--dry-run", "--out", str(tmp_path / "out"))
    assert text.exit_code == 0, text.stderr
    warns = [line.strip() for line in text.stdout.splitlines() if line.strip().startswith("WARN cell")]
    assert len(warns) == 3 and all("MI325X's 256 GiB: stage 0 " in line for line in warns), text.stdout
    assert warns[0].startswith("WARN cell smoke: ")  # the smoke job too, as `suite check` warns of it
    payload = cli("suite", "run", str(config), "--cluster", str(cluster), "--dry-run", "--json",
                  "--out", str(tmp_path / "out-json")).json()
    for combo in payload["combos"]:
        assert combo["memory_warning"].startswith(f"WARN cell {combo['key']}: ") and combo["script"]


def test_dry_run_of_a_combo_that_fits_has_no_memory_warning(cli, tmp_path: Path) -> None:
    config, cluster = write_filled(tmp_path, DISTRIBUTED_70B, gpu="MI325X", image="rocm/megatron-lm:v25.9", nodes=2)
    result = cli("suite", "run", str(config), "--cluster", str(cluster), "--dry-run", "--json",
                 "--out", str(tmp_path / "out"))
    assert result.exit_code == 0, result.stderr
    assert all(combo["memory_warning"] is None for combo in result.json()["combos"])


def test_the_dry_run_lists_the_checkpoint_jobs_it_writes(cli, tmp_path: Path) -> None:
    import shutil

    from megapilot.suite.templates import template_path, threshold_paths

    shutil.copy(template_path("tiny-local"), tmp_path / "suite.json")
    for path in threshold_paths("tiny-local"):
        shutil.copy(path, tmp_path / path.name)
    out = tmp_path / "out"
    result = cli("suite", "run", str(tmp_path / "suite.json"), "--dry-run", "--out", str(out))
    assert result.exit_code == 0, result.stderr
    for job in ("checkpoint-save", "checkpoint-resume"):
        script = out / "dry-run" / job / "launch.sh"
        assert f"\n{job} backend=megapilot" in result.stdout and str(script) in result.stdout
        assert script.is_file()
    document = cli("suite", "run", str(tmp_path / "suite.json"), "--dry-run", "--json", "--out", str(out)).json()
    assert [job["key"] for job in document["checkpoint"]] == ["checkpoint-save", "checkpoint-resume"]


def test_a_budget_warm_up_the_sweep_cannot_run_is_exit_2_naming_the_field_and_the_fix(cli, tmp_path: Path) -> None:
    import shutil

    from megapilot.suite.templates import template_path, threshold_paths

    data = json.loads(template_path("tiny-local").read_text())
    data["budget"] = {"tokens": "10M", "rampup_batch_size": [6, 4, 64]}  # GBS 8 - 6 is no step of 4
    (tmp_path / "suite.json").write_text(json.dumps(data))
    for path in threshold_paths("tiny-local"):
        shutil.copy(path, tmp_path / path.name)
    result = cli("suite", "run", str(tmp_path / "suite.json"), "--dry-run", "--out", str(tmp_path / "out"))
    assert result.exit_code == 2 and "Traceback" not in result.stderr
    assert "budget.rampup_batch_size" in result.stderr.replace("\n", ""), repr(result.stderr)
    check = cli("suite", "check", str(tmp_path / "suite.json"))  # lists each problem with its own fix
    assert check.exit_code == 2 and "divisible by INCREMENT" in check.stdout + check.stderr


def _finished_run(tmp_path: Path, config_hash: str, **stored: object) -> Path:
    """A finished run under tmp_path/runs as `suite run` leaves it (the report factory's two-combo FAIL, unless
    `stored` says otherwise), started with the config of hash `config_hash`."""
    from megapilot.suite.results import read_suite_result
    from tests.report.factory import write_run_dir

    run_dir = tmp_path / "runs" / "20260302-090000-llama-tiny"
    write_run_dir(run_dir)
    result = read_suite_result(run_dir)
    result.card = result.card.model_copy(update={"config_hash": config_hash})
    for name, value in stored.items():
        setattr(result, name, value)
    result.write(run_dir)
    return run_dir


@pytest.mark.parametrize(("stored", "verdict", "exit_code"), [
    ({}, "FAIL", 1),
    ({"verdict": Verdict.PASS, "reason": "", "regressions": []}, "PASS", 0),
    # the policy the run ended with, not the one a resume passes: a regression it enforced still fails it
    ({"verdict": Verdict.PASS, "reason": "", "regressions_enforced": True}, "FAIL", 1),
    ({"verdict": Verdict.PASS, "reason": ""}, "WARN", 0),  # regressed, not enforced
])
def test_resuming_a_finished_run_exits_with_its_verdict_and_prints_its_results(
        cli, tmp_path: Path, stored: dict[str, object], verdict: str, exit_code: int) -> None:
    """A CI retry that resumes a run which had in fact finished (FAIL) must not turn it green."""
    from megapilot.suite.config import load_suite
    from megapilot.suite.results import read_suite_result
    from megapilot.suite.summary import result_json

    config = write_suite(tmp_path, filled_in(raw_cvs(SINGLE_8B)), SINGLE_8B)
    run_dir = _finished_run(tmp_path, load_suite(config).config_hash, **stored)
    before = (run_dir / "suite.json").read_bytes(), sorted(run_dir.rglob("*"))
    resume = ("suite", "run", str(config), "--out", str(tmp_path / "runs"), "--no-history", "--resume", "latest")

    text = cli(*resume)
    assert text.exit_code == exit_code, text.stderr
    assert f"finished ({verdict}): nothing to do" in text.stderr and f"\n{verdict} — " in text.stdout
    as_json = cli(*resume, "--json", "--warn-regressions")
    assert as_json.exit_code == exit_code, as_json.stderr
    assert as_json.json() == result_json(read_suite_result(run_dir))  # the document the run itself printed
    assert as_json.json()["verdict"] == verdict and as_json.json()["exit_code"] == exit_code
    assert ((run_dir / "suite.json").read_bytes(), sorted(run_dir.rglob("*"))) == before  # no report rewritten


def test_a_run_slower_than_the_one_before_is_stored_and_listed_as_warn_or_fail(cli, tmp_path: Path) -> None:
    """Two runs of one cell through what `suite run` does once they end (regressions, suite.json, report, history
    row), the second the first as stored with its tokens/s 30 % down: its gates pass, and suite.json, the history
    list and the run deck all say what the run said, WARN (FAIL when enforced), never the gates' PASS."""
    from megapilot.cli.suite_run_cmd import _after_run
    from megapilot.store.history import open_history
    from megapilot.suite.results import read_suite_result
    from tests.store.test_history import TOKENS, make_suite_result

    db = str(tmp_path / "history.sqlite")
    with open_history(db) as history:
        first, _ = _after_run(make_suite_result("run-1", run_dir=str(tmp_path / "run-1")), history)
        stored = read_suite_result(tmp_path / "run-1")
        for number, enforced in ((2, False), (3, True)):
            combo = stored.combos[0]
            slower = [row.model_copy(update={"value": row.value * 0.7}) if row.name == TOKENS else row
                      for row in combo.metrics]
            later = stored.model_copy(update={
                "run_id": f"run-{number}", "run_dir": str(tmp_path / f"run-{number}"),
                "started_at": stored.started_at.replace(hour=stored.started_at.hour + number),
                "combos": [combo.model_copy(update={"metrics": slower})], "regressions_enforced": enforced})
            _after_run(later, history)
    rows = cli("history", "list", "--json", "--db", db).json()
    assert [(r["run_id"], r["verdict"]) for r in rows] == [("run-3", "FAIL"), ("run-2", "WARN"), ("run-1", "PASS")]
    assert "tokens/s/GPU" in rows[1]["reason"] and "not enforced" in rows[1]["reason"]
    assert first.verdict is Verdict.PASS and rows[0]["failed_combos"] == 0  # the gates passed: no combo failed
    assert "WARN" in cli("history", "list", "--db", db).stdout
    for number, verdict in ((2, "WARN"), (3, "FAIL")):
        suite_json = json.loads((tmp_path / f"run-{number}" / "suite.json").read_text())
        deck = json.loads((tmp_path / f"run-{number}" / "megatron_run_deck.json").read_text())
        assert (suite_json["verdict"], suite_json["gates_verdict"], deck["verdict"]) == (verdict, "PASS", verdict)


def test_resuming_a_finished_run_with_another_config_is_refused(cli, tmp_path: Path) -> None:
    """Finished or not, a run is continued only with the config it started with: "nothing to do" with another
    config would pass the old run's verdict off as this config's."""
    config = write_suite(tmp_path, filled_in(raw_cvs(SINGLE_8B)), SINGLE_8B)
    run_dir = _finished_run(tmp_path, "cd" * 32, verdict=Verdict.PASS, reason="", regressions=[])
    before = (run_dir / "suite.json").read_bytes()
    done = cli("suite", "run", str(config), "--out", str(tmp_path / "runs"), "--no-history", "--resume", "latest")
    assert done.exit_code == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stderr.startswith("error: --resume:") and "started with another config" in done.stderr
    assert done.stdout == "" and (run_dir / "suite.json").read_bytes() == before


def test_the_stage_help_lists_every_stage_the_option_takes(cli):
    from megapilot.suite.stages import STAGES

    help_text = " ".join(cli("suite", "run", "--help").stdout.replace("│", " ").split())
    assert all(stage in help_text for stage in STAGES)
