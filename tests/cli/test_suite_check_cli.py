"""`megapilot suite check | templates | init` through main(): exit codes, every problem, --json schema."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.suite.cvs_files import (
    CVS_DIR,
    MEGATRON_LM_IMAGE,
    PRIMUS_IMAGE,
    SINGLE_8B,
    cvs_configs,
    filled_in,
    raw_cvs,
    write_filled,
    write_suite,
)


def thresholds_cells(path: Path) -> set[str]:
    """The cell keys of a CVS threshold file (its `_comment` aside)."""
    return {key for key in json.loads(path.read_text()) if not key.startswith("_")}


def test_check_of_a_real_cvs_config_exits_2_listing_every_placeholder(cli) -> None:
    result = cli("suite", "check", str(CVS_DIR / SINGLE_8B), "--json")
    assert result.exit_code == 2
    payload = json.loads(result.stdout)
    assert payload["ok"] is False and payload["cells"] == [] and payload["backend"] is None
    paths = {p["path"] for p in payload["problems"]}
    assert {"gpu_name", "container.image", "container.env.NCCL_SOCKET_IFNAME",
            "train_params.training_iterations"} <= paths and len(paths) == 8
    assert all(set(p) == {"path", "message", "fix"} for p in payload["problems"])


def test_check_text_output_names_each_problem_without_a_traceback(cli) -> None:
    result = cli("suite", "check", str(CVS_DIR / SINGLE_8B))
    assert result.exit_code == 2 and "Traceback" not in result.stdout + result.stderr
    assert "container.env.NCCL_DEBUG" in result.stdout and "8 problem(s)" in result.stdout


def test_filled_config_checks_clean_with_cells_and_skips(cli, tmp_path: Path) -> None:
    path = write_suite(tmp_path, filled_in(raw_cvs(SINGLE_8B)), SINGLE_8B)
    payload = json.loads(cli("suite", "check", str(path), "--json").stdout)
    assert payload["ok"] is True and (payload["backend"], payload["executor"]) == ("megatron-lm", "local")
    assert payload["cells"][0]["key"] == "smoke"
    skipped = {c["key"] for c in payload["cells"] if c["skipped"]}
    assert skipped == {"MBS=4,GBS=128,PRECISION=MXFP4", "MBS=4,GBS=128,PRECISION=MXFP8"}


def test_mi355x_config_skips_the_cell_its_backend_cannot_run_and_checks_clean(cli, tmp_path: Path) -> None:
    # CVS runs the FP8, BF16 and MXFP8 cells of this file on MI355X; MXFP4 has no Megatron-LM recipe (Primus only)
    path = write_suite(tmp_path, filled_in(raw_cvs(SINGLE_8B), gpu="MI355X"), SINGLE_8B)
    result = cli("suite", "check", str(path), "--json")
    payload = json.loads(result.stdout)
    assert result.exit_code == 0 and payload["ok"] is True and payload["backend"] == "megatron-lm"
    skipped = {c["key"]: c["skipped"] for c in payload["cells"] if c["skipped"]}
    assert list(skipped) == ["MBS=4,GBS=128,PRECISION=MXFP4"]
    assert skipped["MBS=4,GBS=128,PRECISION=MXFP4"].startswith("the megatron-lm backend cannot run it: mxfp4")
    runnable = [c["key"] for c in payload["cells"] if not c["skipped"] and not c.get("error")]
    assert runnable == ["smoke", "MBS=4,GBS=128,PRECISION=FP8", "MBS=4,GBS=128,PRECISION=BF16",
                        "MBS=4,GBS=128,PRECISION=MXFP8"]
    primus = filled_in(raw_cvs(SINGLE_8B), gpu="MI355X")
    primus["container"]["image"] = "rocm/primus:v25.9"  # the Primus backend trains MXFP4: nothing skipped
    payload = json.loads(cli("suite", "check", str(write_suite(tmp_path, primus, SINGLE_8B)), "--json").stdout)
    assert payload["ok"] is True and not any(c["skipped"] for c in payload["cells"])


def test_a_cell_megatron_would_refuse_fails_the_check(cli, tmp_path: Path) -> None:
    raw = filled_in(raw_cvs(SINGLE_8B))
    raw["sweep"]["combinations"]["MBS=4,GBS=128,PRECISION=BF16"]["tensor_parallelism"] = "3"
    result = cli("suite", "check", str(write_suite(tmp_path, raw, SINGLE_8B)), "--json")
    payload = json.loads(result.stdout)
    assert result.exit_code == 2 and payload["ok"] is False
    assert [p["path"] for p in payload["problems"]] == ["cells.MBS=4,GBS=128,PRECISION=BF16"]
    (problem,) = payload["problems"]  # one fix, the cell's own: never the error's and a general one after it
    assert "— fix:" not in problem["message"] and problem["fix"] and "— fix:" not in problem["fix"]
    text = cli("suite", "check", str(tmp_path / "suite.json")).stdout.replace("\n", "")
    assert text.count("— fix:") == 1, text


def test_templates_and_init(cli, tmp_path: Path) -> None:
    listed = json.loads(cli("suite", "templates", "--json").stdout)
    assert {"tiny-local", "llama3.1-8b-single"} <= {t["name"] for t in listed}
    assert all(t["calibrated"] is False and set(t) == {"name", "description", "model", "gpu", "calibrated"}
               for t in listed)
    target = tmp_path / "mine" / "suite.json"
    assert cli("suite", "init", "tiny-local", "-o", str(target)).exit_code == 0
    assert (tmp_path / "mine" / "tiny-local_threshold.json").is_file()
    assert cli("suite", "check", str(target)).exit_code == 0
    refused = cli("suite", "init", "tiny-local", "-o", str(target))
    assert refused.exit_code == 2 and "--force" in refused.stderr
    assert cli("suite", "init", "tiny-local", "-o", str(target), "--force").exit_code == 0
    assert cli("suite", "init", "nope", "-o", str(target)).exit_code == 2


# ---- every CVS Megatron config and threshold file, filled in as CVS's docs say --------------------------------
def _cvs_cases() -> list[tuple[str, str]]:
    """(config, GPU): CVS's `mi3xx_` files name MI300X or MI325X (`_gpu_name_comment`), its `mi355x_` files MI355X."""
    return [(name, gpu) for name in cvs_configs()
            for gpu in (("MI355X",) if name.startswith("mi355x") else ("MI300X", "MI325X"))]


def _nodes(name: str) -> int:
    """CVS's docs: the 405B's TP 8 x PP 4 "requires at least 4 nodes"; the other distributed configs run on 2."""
    return 4 if "405b" in name else 2 if "_distributed" in name else 1


def _image(name: str) -> str:
    """CVS runs Llama 3.1 405B with Primus (its image selects the backend); the others with Megatron-LM."""
    return PRIMUS_IMAGE if "405b" in name else MEGATRON_LM_IMAGE


@pytest.mark.parametrize(("name", "gpu"), _cvs_cases(), ids=lambda v: v.removesuffix(".json"))
def test_every_cvs_config_filled_in_as_documented_checks_clean(cli, tmp_path: Path, name: str, gpu: str) -> None:
    config, cluster = write_filled(tmp_path, name, gpu=gpu, image=_image(name), nodes=_nodes(name))
    result = cli("suite", "check", str(config), "--cluster", str(cluster), "--json")
    payload = json.loads(result.stdout)
    assert result.exit_code == 0 and payload["ok"] is True, payload["problems"]
    assert payload["nodes"] == _nodes(name) and payload["backend"] == ("primus" if "405b" in name else "megatron-lm")
    threshold = Path(payload["threshold_file"])
    assert threshold.name == f"{gpu.lower()}_{name.split('_', 1)[1].removesuffix('.json')}_threshold.json"
    cells = {c["key"]: c for c in payload["cells"]}
    assert set(cells) == {"smoke", *thresholds_cells(threshold)}
    for key, cell in cells.items():
        precision = key.rsplit("=", 1)[-1]
        if precision.startswith("MX") and gpu != "MI355X":  # CDNA3 has no MX formats: skipped, with the reason
            assert cell["skipped"].startswith(f"{precision} is not supported on {gpu}"), cell
        elif precision == "MXFP4":  # MI355X runs it, Megatron-LM has no MXFP4 recipe: skipped, as CVS skips it
            assert cell["skipped"].startswith("the megatron-lm backend cannot run it: mxfp4"), cell
        else:
            assert cell["skipped"] is None and cell["error"] is None and cell["megatron_args"], cell


def test_check_warns_of_a_cell_predicted_over_the_gpus_memory_without_refusing_it(cli, tmp_path: Path) -> None:
    # CVS runs its 405B config as shipped (TP 8 x PP 4, no recompute, 8k tokens on MI325X): a WARN, exit 0
    config, cluster = write_filled(tmp_path, "mi3xx_megatron_llama-3.1-405b_distributed.json", gpu="MI325X",
                                   image=PRIMUS_IMAGE, nodes=4)
    text = cli("suite", "check", str(config), "--cluster", str(cluster))
    assert text.exit_code == 0, text.stdout
    warns = [line for line in text.stdout.splitlines() if line.startswith("WARN cell MBS=1,GBS=64,PRECISION=BF16: ")]
    assert len(warns) == 1 and "MI325X's 256 GiB: stage 0 " in warns[0] and "full recompute (recompute 1)" in warns[0]
    payload = json.loads(cli("suite", "check", str(config), "--cluster", str(cluster), "--json").stdout)
    assert payload["ok"] is True and not payload["problems"]
    assert {line.split(":")[0] for line in payload["memory_warnings"]} >= {
        "WARN cell MBS=1,GBS=64,PRECISION=BF16", "WARN cell MBS=1,GBS=64,PRECISION=FP8"}


def test_check_of_a_cell_that_fits_prints_no_memory_warning(cli, tmp_path: Path) -> None:
    path = write_suite(tmp_path, filled_in(raw_cvs(SINGLE_8B)), SINGLE_8B)
    payload = json.loads(cli("suite", "check", str(path), "--json").stdout)
    assert payload["ok"] is True and payload["memory_warnings"] == []


# ---- typos that would run another suite than the one written --------------------------------------------------
def _tiny(cli, tmp_path: Path) -> tuple[Path, dict, Path, dict]:
    """The packaged tiny-local suite and its threshold file, each with its data to edit."""
    config = tmp_path / "suite.json"
    assert cli("suite", "init", "tiny-local", "-o", str(config)).exit_code == 0
    data = json.loads(config.read_text())
    thresholds = tmp_path / data["threshold_json"]
    return config, data, thresholds, json.loads(thresholds.read_text())


def test_a_layout_typo_fails_the_check_naming_the_key_it_meant(cli, tmp_path: Path) -> None:
    config, data, _, _ = _tiny(cli, tmp_path)
    data["train_params"]["pipline_parallelism"] = "2"
    first = data["sweep"]["runs"][0]
    data["sweep"]["combinations"][first]["tensor_paralellism"] = "2"
    config.write_text(json.dumps(data))
    result = cli("suite", "check", str(config), "--json")
    assert result.exit_code == 2
    problems = {p["path"]: p for p in result.json()["problems"]}
    assert problems["train_params.pipline_parallelism"]["message"] == "unknown key (did you mean pipeline_parallelism?)"
    assert problems[f"sweep.combinations.{first}.tensor_paralellism"]["fix"] == "rename it to tensor_parallelism"


def test_a_threshold_file_that_would_fail_every_run_fails_the_check(cli, tmp_path: Path) -> None:
    config, _, thresholds, table = _tiny(cli, tmp_path)
    cell = next(key for key in table if not key.startswith("_"))
    table[cell]["training.tokens_per_gpuu"] = {"kind": "min", "value": 50}
    table[cell]["training.lm_loss"] = {"kind": "max", "value": 12, "bogus": 1}
    table[cell]["training.tokens_per_gpu"] = {"kind": "min_tok_s", "value": -5}
    thresholds.write_text(json.dumps(table))
    result = cli("suite", "check", str(config), "--json")
    assert result.exit_code == 2
    payload = result.json()
    assert {p["path"] for p in payload["problems"]} == {f"thresholds.{cell}.training.tokens_per_gpuu",
                                                         f"thresholds.{cell}.training.tokens_per_gpu"}
    assert any("'bogus' is not a field" in w for w in payload["warnings"])


def test_a_yaml_boolean_where_a_number_is_required_fails_the_check(cli, tmp_path: Path) -> None:
    import yaml

    _, data, _, _ = _tiny(cli, tmp_path)
    data["megapilot"]["gpus_per_node"] = True
    config = tmp_path / "suite.yaml"
    config.write_text(yaml.safe_dump(data))
    result = cli("suite", "check", str(config), "--json")
    assert result.exit_code == 2
    (problem,) = result.json()["problems"]
    assert problem["path"] == "megapilot.gpus_per_node" and "true/false" in problem["message"]


# ---- the options of `suite run` that change its cells: check builds the cells as that run would ------------------

def _refused(run_stderr: str) -> list[str]:
    """What `suite run` refused, one 'path: message — fix: ...' per error line."""
    return [line.removeprefix("error: ") for line in run_stderr.splitlines() if line.startswith("error: ")]


def _problems(check_json: dict) -> list[str]:
    return [f"{p['path']}: {p['message']}" + (f" — fix: {p['fix']}" if p["fix"] else "")
            for p in check_json["problems"]]


def test_check_with_megatron_version_reports_what_run_with_it_refuses(cli, tmp_path: Path) -> None:
    """A suite launching a Megatron-LM checkout of 0.14 on this machine: fine as it is; for 0.16 `suite run` refuses
    it, once for the suite rather than once per cell, and `suite check` first, in the same words."""
    from tests.launch.test_versions import _local_checkout

    raw = filled_in(raw_cvs(SINGLE_8B))
    raw["megapilot"] = {"megatron_path": str(_local_checkout("core_v0.14.0", tmp_path))}
    config = str(write_suite(tmp_path, raw, SINGLE_8B))
    assert cli("suite", "check", config).exit_code == 0
    check = cli("suite", "check", config, "--json", "--megatron-version", "0.16")
    run = cli("suite", "run", config, "--dry-run", "--out", str(tmp_path / "out"), "--megatron-version", "0.16")
    assert check.exit_code == run.exit_code == 2 and check.json()["ok"] is False
    assert _problems(check.json()) == _refused(run.stderr) and len(_refused(run.stderr)) == 1, run.stderr
    assert _refused(run.stderr)[0].startswith("--megatron-version: --megatron-version 0.16 but the checkout at")
    assert "point megapilot.megatron_path at the right checkout" in run.stderr and check.json()["cells"] == []
    # a release without a flag table, for the checkout in the image (not on this machine: no checkout decides)
    config = str(write_suite(tmp_path, filled_in(raw_cvs(SINGLE_8B)), SINGLE_8B, config_name="image.json"))
    unknown = cli("suite", "check", config, "--json", "--megatron-version", "0.99")
    refused = cli("suite", "run", config, "--dry-run", "--out", str(tmp_path / "out"), "--megatron-version", "0.99")
    assert unknown.exit_code == refused.exit_code == 2 and unknown.json()["cells"] == []
    assert _problems(unknown.json()) == _refused(refused.stderr)
    assert _refused(refused.stderr)[0].startswith("--megatron-version: no flag table for Megatron-LM 0.99")
    assert "--megatron-path" not in refused.stderr and "set megapilot.megatron_path" in _refused(refused.stderr)[0]
    text = cli("suite", "check", config, "--megatron-version", "0.99")  # the problem, and no empty table of cells
    assert "problem --megatron-version: no flag table" in text.stdout and "┃ cell" not in text.stdout


def test_the_config_s_release_is_refused_once_under_its_key(cli, tmp_path: Path) -> None:
    """megapilot.megatron_version without a flag table, or of another release than the checkout on this machine, and a
    megapilot.megatron_path that is no checkout: one problem under the key it came from, not one per cell under a
    bare field; `suite run` refuses it in the same words."""
    from tests.launch.test_versions import _local_checkout

    broken = tmp_path / "broken"
    (broken / "megatron/training").mkdir(parents=True)
    (broken / "megatron/training/arguments.py").write_text("")  # no megatron/core/package_info.py
    checkout = _local_checkout("core_v0.14.0", tmp_path)
    for name, block, expected in (
            ("unknown", {"megatron_version": "0.99"},
             "megapilot.megatron_version: no flag table for Megatron-LM 0.99; megapilot ships "),
            ("other", {"megatron_path": str(checkout), "megatron_version": "0.16"},
             f"megapilot.megatron_version: megapilot.megatron_version 0.16 but the checkout at {checkout} is 0.14.0"),
            ("broken", {"megatron_path": str(broken)},
             f"megapilot.megatron_path: {broken}/megatron/core/package_info.py does not exist — fix: point "
             "megapilot.megatron_path at the root")):
        raw = filled_in(raw_cvs(SINGLE_8B))
        raw["megapilot"] = block
        config = str(write_suite(tmp_path, raw, SINGLE_8B, config_name=f"{name}.json"))
        check = cli("suite", "check", config, "--json")
        run = cli("suite", "run", config, "--dry-run", "--out", str(tmp_path / "out"))
        assert check.exit_code == run.exit_code == 2 and check.json()["cells"] == []
        [problem] = _problems(check.json())
        assert problem.startswith(expected) and _refused(run.stderr) == [problem], run.stderr
        assert "--megatron-path" not in problem
    # the option overrides the key: a config's release without a table is no problem when the option picks another
    config = str(write_suite(tmp_path, filled_in(raw_cvs(SINGLE_8B)) | {"megapilot": {"megatron_version": "0.99"}},
                             SINGLE_8B, config_name="overridden.json"))
    assert cli("suite", "check", config, "--json", "--megatron-version", "0.16").json()["ok"] is True


def test_check_with_exclude_failing_checks_the_cells_on_the_nodes_left(cli, tmp_path: Path) -> None:
    """Three SSH hosts, pipeline parallel 3: with the host an earlier preflight failed left out, two ranks are left
    and no cell can run; `suite check --exclude-failing latest` says so as `suite run` does, and names the node."""
    from tests.suite.test_exclude import _failed_run, _suite

    config = _suite(tmp_path, "ssh", nodes=None)
    raw = json.loads(config.read_text())
    raw["train_params"]["pipeline_parallelism"] = "3"
    config.write_text(json.dumps(raw))
    _failed_run(tmp_path / "runs", failing=1)
    args = ("--cluster", str(tmp_path / "cluster.json"))
    excluding = ("--exclude-failing", "latest", "--out", str(tmp_path / "runs"))
    whole = cli("suite", "check", str(config), *args, "--json")
    assert whole.exit_code == 0 and whole.json()["nodes"] == 3
    check = cli("suite", "check", str(config), *args, *excluding, "--json")
    run = cli("suite", "run", str(config), *args, *excluding, "--dry-run")
    assert check.exit_code == run.exit_code == 2
    assert _problems(check.json()) == _refused(run.stderr) == [
        "cells.default: gpus: TP*PP*CP = 1*3*1 = 3 does not divide 2 GPUs — fix: choose TP, PP and CP whose product "
        "divides the GPU count"]
    assert check.json()["nodes"] == 2 and any(w.startswith("excluded node 10.0.0.2 ") for w in check.json()["warnings"])
    raw["megapilot"]["exclude_failing"] = str(tmp_path / "runs" / "20261205-060000-abcd")  # the config's key, too
    config.write_text(json.dumps(raw))
    assert _problems(cli("suite", "check", str(config), *args, "--json").json()) == _refused(run.stderr)


def test_check_and_run_take_the_options_that_change_the_cells_by_one_name_and_help() -> None:
    import typer.main

    from megapilot.cli.app import app

    suite = typer.main.get_command(app).commands["suite"]  # type: ignore[attr-defined]
    options = {name: {p.name: (tuple(p.opts), p.help) for p in suite.commands[name].params}
               for name in ("check", "run")}
    for name in ("megatron_version", "exclude_failing", "out"):
        assert options["check"][name] == options["run"][name] and options["check"][name][1], name


def _tiny_local(tmp_path: Path) -> Path:
    import shutil

    from megapilot.suite.templates import template_path, threshold_paths

    for path in (template_path("tiny-local"), *threshold_paths("tiny-local")):
        shutil.copy(path, tmp_path / path.name)
    return tmp_path / template_path("tiny-local").name


def test_piped_check_prints_each_launch_whole_on_its_own_line(cli, tmp_path: Path) -> None:
    config = str(_tiny_local(tmp_path))
    commands = {c["key"]: c["command"] for c in cli("suite", "check", config, "--json").json()["cells"]}
    assert min(len(command) for command in commands.values()) > 400  # far past what the table shows
    lines = cli("suite", "check", config).stdout.splitlines()
    assert [line for line in lines if line.startswith("launch ")] == [
        f"launch {key}: {command}" for key, command in commands.items()]


def test_on_a_terminal_the_table_keeps_a_preview_and_says_where_the_whole_launch_is(cli, tmp_path: Path,
                                                                                    monkeypatch) -> None:
    import io

    from megapilot.cli import suite_check_cmd
    from megapilot.cli.common import OutputConsole

    screen = io.StringIO()
    monkeypatch.setattr(suite_check_cmd, "console", OutputConsole(file=screen, force_terminal=True, width=300,
                                                                  color_system=None))
    assert cli("suite", "check", str(_tiny_local(tmp_path))).exit_code == 0
    shown = screen.getvalue()
    assert "\nlaunch smoke: " not in shown and shown.count("ready  │ ") == 3
    assert f"launches cut at {suite_check_cmd.LAUNCH_PREVIEW} characters" in shown
    preview = next(line for line in shown.splitlines() if line.startswith("│ smoke"))
    assert len(preview.split("│")[3].strip()) == suite_check_cmd.LAUNCH_PREVIEW and "…" in preview
