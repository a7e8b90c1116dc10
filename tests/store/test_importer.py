"""`megapilot history import` from the CLI: JSON Lines of published rows, megapilot's run deck and CVS's run deck;
then `estimate --cluster` calibrated on what was imported, and `history calibration` showing the fit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from megapilot.report import render_report
from megapilot.store.history import open_history
from tests.report.factory import suite_result

DATA = Path(__file__).resolve().parents[1] / "data" / "history_import"
CLUSTER = "nvidia-dgx-gb200"


@pytest.fixture
def history(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "history.sqlite"
    monkeypatch.setenv("MEGAPILOT_HISTORY", str(path))
    return path


def test_a_jsonl_of_published_rows_is_imported_and_a_bad_record_refused_alone(cli, history):
    result = cli("history", "import", str(DATA / "published_rows.jsonl"), "--json")
    assert result.exit_code == 0, result.stderr
    answer = result.json()
    assert [row["id"] for row in answer["imported"]] == [
        "nemo-25.04-DGX-GB200-LLAMA3-8B", "nemo-25.07-DGX-GB200-LLAMA3-8B", "nemo-25.04-DGX-GB200-LLAMA3-70B",
        "nemo-25.07-DGX-GB200-LLAMA3-70B"]
    assert all(row["cluster"] == CLUSTER and row["predicted_step_time_s"] > 0 for row in answer["imported"])
    # 128 x 8192 tokens per step over 8 GPUs at 33099 tokens/s/GPU
    assert answer["imported"][0]["measured_step_time_s"] == pytest.approx(128 * 8192 / (8 * 33099))
    [refused] = answer["refused"]
    assert (refused["record"], refused["field"]) == ("published_rows.jsonl:5", "measured.tokens_per_second")
    assert refused["problem"].startswith("unknown key 'tokens_per_second' (use tokens_per_s_per_gpu")
    assert "refused published_rows.jsonl:5: measured.tokens_per_second" in result.stderr

    # the cluster's runs now calibrate an estimate of another layout of the same model
    estimate = cli("estimate", "--model", "llama3.1-8b", "--gpu", "gb200", "--gpus", "16", "--mbs", "2", "--gbs",
                   "256", "--seq-len", "8192", "--precision", "fp8", "--cluster", CLUSTER, "--json").json()
    about = estimate["calibration_from_history"]
    assert about["applied"] and about["cluster"] == CLUSTER
    assert {run["id"] for run in about["runs_used"]} >= {"nemo-25.04-DGX-GB200-LLAMA3-8B"}
    assert about["band_pct"] is not None and about["held_out_median_pct"] <= about["uncalibrated_held_out_median_pct"]
    assert estimate["tokens_per_s_per_gpu"] != pytest.approx(about["uncalibrated"]["tokens_per_s_per_gpu"])
    # measured 31.7-33.1k tokens/s/GPU on 8 GPUs: the calibrated figure is within 10 % of them, the plain one is not
    assert estimate["tokens_per_s_per_gpu"] == pytest.approx(32400, rel=0.1)
    # a token budget on that layout is priced with the calibrated step and carries the calibration's band
    budgeted = cli("estimate", "--model", "llama3.1-8b", "--gpu", "gb200", "--gpus", "16", "--mbs", "2", "--gbs",
                   "256", "--seq-len", "8192", "--precision", "fp8", "--cluster", CLUSTER, "--tokens", "1T",
                   "--json").json()["budget"]
    # the days span the calibrated tokens/s interval turned over: tokens within a factor 1 + band either way
    assert budgeted["band_high_pct"] == pytest.approx(about["band_pct"], abs=0.01)
    assert budgeted["band_low_pct"] == pytest.approx(100 * (1 / (1 + about["band_pct"] / 100) - 1), abs=0.01)
    assert budgeted["band_source"].startswith(f"calibrated on cluster {CLUSTER}")
    assert budgeted["segments"][0]["step_time_s"] == pytest.approx(estimate["step_time_s"], rel=1e-3)
    off = cli("estimate", "--model", "llama3.1-8b", "--gpu", "gb200", "--gpus", "16", "--mbs", "2", "--gbs", "256",
              "--seq-len", "8192", "--precision", "fp8", "--cluster", CLUSTER, "--calibration", "none", "--json")
    assert "calibration_from_history" not in off.json()

    fits = cli("history", "calibration", "--cluster", CLUSTER, "--json").json()
    group = fits["groups"][0]
    assert (group["gpu"], group["precision"], group["family"], group["runs"]) == ("GB200", "fp8", "dense", 4)
    assert group["held_out_median_pct"] < group["uncalibrated_median_pct"]


def test_a_second_record_with_an_id_already_in_the_import_is_refused_alone(cli, history, tmp_path):
    """Two records of one import with the same id: the first is kept and the second refused by its id. The second
    used to fail the whole write on the history's unique id, refusing every good record with a database error."""
    record = {"model": "llama3.1-8b", "gpu": "h100", "gpus": 8, "gbs": 128, "seq_len": 8192, "precision": "fp8",
              "cluster": "c1", "measured": {"tokens_per_s_per_gpu": 14000}}
    rows = [record | {"id": "a"}, record | {"id": "b"}, record | {"id": "a", "mbs": 2}]
    path = tmp_path / "runs.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    result = cli("history", "import", str(path), "--json")
    assert result.exit_code == 0, result.stderr
    answer = result.json()
    assert [row["id"] for row in answer["imported"]] == ["a", "b"]
    [refused] = answer["refused"]
    assert (refused["record"], refused["field"]) == ("runs.jsonl:3", "id")
    assert "'a' is already the id of runs.jsonl:1 in this import" in refused["problem"]
    listed = cli("history", "calibration", "--cluster", "c1", "--json").json()
    assert listed["groups"][0]["runs"] == 2


def test_a_calibrated_estimate_carries_the_calibrations_interval_around_its_own_figure(cli, history):
    """An estimate calibrated on the cluster's runs states its 80 % interval around the calibrated tokens/s, from
    the calibration's band: the published runs' interval of the uncalibrated figure had left the calibrated point
    outside its own ends (13,955 tokens/s with 11,088-13,887)."""
    assert cli("history", "import", str(DATA / "published_rows.jsonl")).exit_code == 0
    flags = ("estimate", "--model", "llama3.1-8b", "--gpu", "gb200", "--gpus", "16", "--mbs", "2", "--gbs", "256",
             "--seq-len", "8192", "--precision", "fp8", "--cluster", CLUSTER, "--json")
    answer = cli(*flags).json()
    band = answer["calibration_from_history"]["band_pct"] / 100
    tokens = answer["tokens_per_s_per_gpu"]
    assert answer["tokens_per_s_per_gpu_p10"] == pytest.approx(tokens / (1 + band), rel=1e-4)
    assert answer["tokens_per_s_per_gpu_p90"] == pytest.approx(tokens * (1 + band), rel=1e-4)
    assert answer["tokens_per_s_per_gpu_p10"] < tokens < answer["tokens_per_s_per_gpu_p90"]
    assert answer["interval_basis"].startswith(f"calibrated on cluster {CLUSTER}: ")
    plain = cli(*flags, "--calibration", "none").json()  # uncalibrated: the published runs' interval, unchanged
    assert plain["tokens_per_s_per_gpu_p10"] < plain["tokens_per_s_per_gpu"] < plain["tokens_per_s_per_gpu_p90"]
    assert plain["tokens_per_s_per_gpu_p10"] != pytest.approx(answer["tokens_per_s_per_gpu_p10"])


def test_a_batch_line_names_its_cluster_and_an_unknown_cluster_is_refused(cli, history, tmp_path):
    assert cli("history", "import", str(DATA / "published_rows.jsonl")).exit_code == 0
    batch = tmp_path / "cases.jsonl"
    batch.write_text(json.dumps({"model": "llama3.1-8b", "gpu": "gb200", "gpus": 8, "gbs": 128, "mbs": 2,
                                 "seq_len": 8192, "precision": "fp8", "cluster": CLUSTER}) + "\n"
                     + json.dumps({"model": "llama3.1-8b", "gpu": "gb200", "gpus": 8, "gbs": 128, "seq_len": 8192,
                                   "cluster": "nowhere"}) + "\n")
    result = cli("estimate", "--batch", str(batch), "--json")
    first, second = result.json()
    assert first["calibration_from_history"]["applied"]
    assert second["field"] == "cluster" and "nowhere" in second["error"]
    assert result.exit_code == 1


def test_a_megapilot_run_deck_is_imported(cli, history, tmp_path):
    result = suite_result(tmp_path)
    result.card = result.card.model_copy(update={"model": "llama3.1-8b"})
    files = render_report(result, tmp_path)
    deck = files.run_deck
    answer = cli("history", "import", str(deck), "--cluster", "lab-h100", "--json")
    assert answer.exit_code == 0, answer.stderr
    imported = answer.json()["imported"]
    assert [row["cluster"] for row in imported] == ["lab-h100"]  # the passing cell; the failed one is refused
    assert imported[0]["measured_step_time_s"] == pytest.approx(1.122)
    refused = answer.json()["refused"]
    assert len(refused) == 1 and refused[0]["field"] == "status"


def test_a_cvs_run_deck_is_imported(cli, history, tmp_path):
    # CVS's Megatron Run Deck payload (cvs/lib/report/profiles/megatron.json): nodes on the run card, no sequence
    # length in a cell, elapsed time per iteration in ms
    deck = {"schema_version": 1, "suite_id": "megatron", "cvs_version": "1.4.0", "overall_status": "pass",
            "run_card_display": [["Model", "llama3.1-8b", False], ["GPU", "MI300X", False], ["Nodes", "1", False]],
            "cells": [{"model": "llama3.1-8b", "gpu": "MI300X", "policy": "thresholds", "host": "cluster",
                       "cell_id": "MBS=2,GBS=128,PRECISION=BF16", "label": "MBS=2,GBS=128,PRECISION=BF16",
                       "mbs": 2, "gbs": 128, "precision": "BF16", "tp": 1, "pp": 1, "status": "pass",
                       "actuals": {"training.throughput_per_gpu": 420.5, "training.tokens_per_gpu": 9100.0,
                                   "training.elapsed_time_per_iteration": 14400.0}}]}
    path = tmp_path / "megatron_run_deck.json"
    path.write_text(json.dumps(deck))
    missing = cli("history", "import", str(path), "--cluster", "mi300x-lab", "--json")
    assert missing.exit_code == 2 and missing.json()["refused"][0]["field"] == "seq_len"
    # a wrong --seq-len is the flag's error, said once (it was refused per record as the records' 'seq_len')
    for wrong in ("0", "-5"):
        refused = cli("history", "import", str(path), "--cluster", "mi300x-lab", "--seq-len", wrong)
        assert refused.exit_code == 2 and refused.stdout == ""
        assert refused.stderr.strip() == f"error: --seq-len: must be positive, got {wrong} — fix: pass --seq-len " \
                                         "with a value > 0"
    answer = cli("history", "import", str(path), "--cluster", "mi300x-lab", "--seq-len", "8192", "--json")
    assert answer.exit_code == 0, answer.stderr
    [row] = answer.json()["imported"]
    assert row["gpu"] == "MI300X" and row["measured_step_time_s"] == pytest.approx(14.4)


def test_plan_shows_each_layout_calibrated_on_the_cluster(cli, history):
    assert cli("history", "import", str(DATA / "published_rows.jsonl")).exit_code == 0
    args = ("plan", "--model", "llama3.1-8b", "--gpu", "gb200", "--gpus", "16", "--seq-len", "8192", "--gbs", "256",
            "--precision", "fp8", "--top", "2", "--json")
    plain = cli(*args).json()
    calibrated = cli(*args, "--cluster", CLUSTER).json()
    assert [c["parallel"] for c in calibrated["candidates"]] == [c["parallel"] for c in plain["candidates"]]
    for before, after in zip(plain["candidates"], calibrated["candidates"], strict=True):
        about = after["calibration_from_history"]
        assert about["applied"]
        plain_tokens = before["estimate"]["tokens_per_s_per_gpu"]
        assert about["uncalibrated"]["tokens_per_s_per_gpu"] == pytest.approx(plain_tokens)
        assert after["estimate"]["tokens_per_s_per_gpu"] > plain_tokens  # the cluster ran faster than predicted


def test_estimate_and_plan_read_the_history_named_by_db_as_import_writes_it(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("MEGAPILOT_HISTORY", str(tmp_path / "elsewhere.sqlite"))  # --db wins, as in `history`
    db = str(tmp_path / "team.sqlite")
    assert cli("history", "import", str(DATA / "published_rows.jsonl"), "--db", db).exit_code == 0
    case = ("--model", "llama3.1-8b", "--gpu", "gb200", "--gpus", "16", "--mbs", "2", "--gbs", "256", "--seq-len",
            "8192", "--precision", "fp8", "--cluster", CLUSTER)
    estimate = cli("estimate", *case, "--db", db, "--json")
    assert estimate.exit_code == 0, estimate.stderr
    assert estimate.json()["calibration_from_history"]["applied"]
    planned = cli("plan", *case, "--db", db, "--top", "1", "--json")
    assert planned.exit_code == 0, planned.stderr
    unknown = cli("estimate", *case, "--json")  # the environment's history has no such cluster
    assert unknown.exit_code == 2 and "elsewhere.sqlite" in unknown.stderr


def test_an_id_of_another_clusters_run_is_refused_and_that_run_stays_in_its_cluster(cli, history, tmp_path):
    """A record whose id is already a run of another cluster is refused by its id; it used to replace that run,
    moving it out of its cluster without a word. The same file imported again replaces its own rows and says so."""
    assert cli("history", "import", str(DATA / "published_rows.jsonl")).exit_code == 0
    again = cli("history", "import", str(DATA / "published_rows.jsonl"))
    assert again.exit_code == 0 and "imported 4 into nvidia-dgx-gb200 (4 recorded before: replaced; 1 refused)" \
        in again.stdout
    first = json.loads((DATA / "published_rows.jsonl").read_text().splitlines()[0])
    path = tmp_path / "other.jsonl"
    path.write_text(json.dumps(first | {"cluster": "other"}) + "\n" + json.dumps(first | {"cluster": "other",
                                                                                          "id": "own"}) + "\n")
    result = cli("history", "import", str(path), "--json")
    assert result.exit_code == 0, result.stderr
    answer = result.json()
    assert [row["id"] for row in answer["imported"]] == ["own"]
    [refused] = answer["refused"]
    assert (refused["record"], refused["field"]) == ("other.jsonl:1", "id")
    assert refused["problem"] == (f"'{first['id']}' is already the id of an imported run of cluster '{CLUSTER}' in "
                                  "the history (give the record its own id)")
    assert cli("history", "calibration", "--cluster", CLUSTER, "--json").json()["groups"][0]["runs"] == 4
    alone = tmp_path / "alone.jsonl"
    alone.write_text(json.dumps(first | {"cluster": "other"}) + "\n")
    refused_all = cli("history", "import", str(alone))
    assert refused_all.exit_code == 2 and "refused alone.jsonl" in refused_all.stderr


@pytest.mark.parametrize(("name", "text", "problem"), [
    ("runs.csv", "model,gpu,gpus\nllama3.1-8b,h100,8\n",
     "runs.csv is not JSON, JSON Lines or a run deck (line 1: Expecting value: line 1 column 1 (char 0))"),
    ("empty.jsonl", "\n", "empty.jsonl is empty: it holds no record"),
    ("none.json", "[]", "none.json holds an empty list: no record"),
    ("number.json", "42", "number.json holds a JSON int"),
], ids=["csv", "empty", "empty-list", "number"])
def test_a_file_of_another_format_is_refused_once_with_its_fix(cli, history, tmp_path, name, text, problem):
    """A CSV was refused line by line, each 'not JSON' (10,000 lines, 10,000 refusals); an empty file imported
    nothing and exited 0; a refusal of the whole file lost its fix."""
    path = tmp_path / name
    path.write_text(text)
    result = cli("history", "import", str(path), "--json")
    assert result.exit_code == 2
    [refused] = result.json()["refused"]
    assert refused == {"record": str(path), "field": "FILE", "problem": f"{tmp_path}/{problem} (give a JSON list "
                       "of records, JSON Lines (one record per line), or a run deck)"}


def test_a_suite_result_given_to_import_says_to_record_it(cli, history, tmp_path):
    """A suite.json was read as one record and refused as 'measured: no measurement'."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "suite.json").write_text(suite_result(run_dir).model_dump_json())
    result = cli("history", "import", str(run_dir / "suite.json"))
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1
    assert (f"FILE: {run_dir}/suite.json is a suite run's result, not measured runs to import (record it with "
            f"`megapilot history record {run_dir}`)") in " ".join(result.stderr.split())


def test_a_suite_run_s_directory_given_to_import_names_its_run_deck_or_says_to_record_it(cli, history, tmp_path):
    """A run directory was refused as 'is not a file (pass JSON, JSON Lines or run deck files)', though the deck to
    pass is in it (or, before `suite report`, the run is one to record)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "suite.json").write_text(suite_result(run_dir).model_dump_json())
    result = cli("history", "import", str(run_dir), "--json")
    assert result.exit_code == 2
    assert result.json()["refused"] == [{"record": str(run_dir), "field": "FILE", "problem": (
        f"{run_dir} is a suite run's directory, not measured runs to import (record it with `megapilot history "
        f"record {run_dir}`)")}]
    from megapilot.report.run_deck import RUN_DECK_NAME  # the name the report writes the deck under

    (run_dir / RUN_DECK_NAME).write_text("{}")
    result = cli("history", "import", str(run_dir), "--json")
    assert result.json()["refused"][0]["problem"] == (f"{run_dir} is a directory (pass its run deck, "
                                                       f"{run_dir / RUN_DECK_NAME})")


def test_the_run_decks_of_two_runs_are_two_runs_and_one_imported_again_replaces_itself(cli, history, tmp_path):
    """Every run deck is named megatron_run_deck.json: the second run's deck must not replace the first's rows."""
    for run_id in ("20260302-090000-a", "20260303-090000-b"):
        result = suite_result(tmp_path / run_id)
        result.run_id = run_id
        result.card = result.card.model_copy(update={"model": "llama3.1-8b"})
        deck = render_report(result, tmp_path / run_id).run_deck
        answer = cli("history", "import", str(deck), "--cluster", "lab-h100", "--json")
        assert answer.exit_code == 0, answer.stderr
        assert [(row["id"], row["replaced"]) for row in answer.json()["imported"]] == [
            (f"{run_id}/MBS=1,GBS=8,PRECISION=BF16", False)]
    again = cli("history", "import", str(deck), "--cluster", "lab-h100", "--json")
    assert [row["replaced"] for row in again.json()["imported"]] == [True]
    with open_history(str(history), read_only=True) as stored:
        assert sorted(row.id for row in stored.measured("lab-h100")) == [
            "20260302-090000-a/MBS=1,GBS=8,PRECISION=BF16", "20260303-090000-b/MBS=1,GBS=8,PRECISION=BF16"]


def _stored(history: Path, cluster: str) -> list[tuple[int, float | None]]:
    with open_history(str(history), read_only=True) as stored:
        return sorted((row.tp, row.measured_step_time_s) for row in stored.measured(cluster))


def test_records_without_ids_from_files_of_one_name_in_two_folders_are_two_runs(cli, history, tmp_path):
    """A record that names no id was given one made of its file's name and line: importing another folder's
    runs.jsonl replaced the first file's runs ("1 recorded before: replaced"), and both in one import refused one."""
    record = {"model": "llama3.1-8b", "gpu": "h100", "gpus": 8, "gbs": 64, "seq_len": 4096, "cluster": "c1"}
    for folder, tp, step in (("a", 1, 3.1), ("b", 2, 3.3)):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "runs.jsonl").write_text(json.dumps(record | {"tp": tp,
                                                                            "measured": {"step_time_s": step}}) + "\n")
    first = cli("history", "import", str(tmp_path / "a" / "runs.jsonl"), "--json")
    second = cli("history", "import", str(tmp_path / "b" / "runs.jsonl"), "--json")
    assert [row["replaced"] for row in second.json()["imported"]] == [False], second.stdout
    assert first.json()["imported"][0]["id"] != second.json()["imported"][0]["id"]
    both = cli("history", "import", str(tmp_path / "a" / "runs.jsonl"), str(tmp_path / "b" / "runs.jsonl"), "--json")
    assert both.json()["refused"] == [] and [row["replaced"] for row in both.json()["imported"]] == [True, True]
    assert _stored(history, "c1") == [(1, 3.1), (2, 3.3)]


def test_a_run_imported_again_from_a_copy_or_among_new_lines_is_counted_once(cli, history, tmp_path):
    """The same run, from a copy of its file or with a line added before it, kept its id only while its file's
    name and its line did not change: otherwise it was counted twice, and weighed twice in the calibration."""
    record = {"model": "llama3.1-8b", "gpu": "h100", "gpus": 8, "gbs": 64, "seq_len": 4096, "cluster": "c1",
              "measured": {"step_time_s": 3.1}}
    original = tmp_path / "runs.jsonl"
    original.write_text(json.dumps(record) + "\n")
    assert cli("history", "import", str(original)).exit_code == 0
    copy = tmp_path / "runs-copy.jsonl"
    copy.write_text(original.read_text())
    grown = tmp_path / "runs-grown.jsonl"
    grown.write_text(json.dumps(record | {"tp": 2, "measured": {"step_time_s": 3.3}}) + "\n" + original.read_text())
    for path in (copy, grown):
        assert cli("history", "import", str(path)).exit_code == 0
    assert _stored(history, "c1") == [(1, 3.1), (2, 3.3)]
    again = cli("history", "import", str(original), str(copy), "--json")  # the same run twice in one import
    [refused] = again.json()["refused"]
    assert (refused["record"], refused["field"]) == ("runs-copy.jsonl[0]", "record")
    assert refused["problem"].startswith("the same run as runs.jsonl[0]")
    assert _stored(history, "c1") == [(1, 3.1), (2, 3.3)]


def test_cvs_run_decks_of_two_runs_written_at_one_path_are_two_runs(cli, history, tmp_path):
    """A CVS deck names no run: its cells took ids made of the deck's path, so the next run's deck, written at the
    same path, replaced the first run's rows; a copy of one deck counted its runs twice."""
    path = tmp_path / "megatron_run_deck.json"
    for tokens in (9100.0, 9300.0):
        deck = {"run_card_display": [["Nodes", "1", False]],
                "cells": [{"model": "llama3.1-8b", "gpu": "MI300X", "cell_id": "MBS=2,GBS=128,PRECISION=BF16",
                           "mbs": 2, "gbs": 128, "precision": "BF16", "status": "pass",
                           "actuals": {"training.tokens_per_gpu": tokens}}]}
        path.write_text(json.dumps(deck))
        answer = cli("history", "import", str(path), "--cluster", "mi300x-lab", "--seq-len", "8192", "--json")
        assert [row["replaced"] for row in answer.json()["imported"]] == [False], answer.stdout
    copy = tmp_path / "copy" / "megatron_run_deck.json"
    copy.parent.mkdir()
    copy.write_text(path.read_text())
    again = cli("history", "import", str(copy), "--cluster", "mi300x-lab", "--seq-len", "8192", "--json")
    assert [row["replaced"] for row in again.json()["imported"]] == [True]
    with open_history(str(history), read_only=True) as stored:
        assert sorted(row.measured_tokens_per_s_per_gpu for row in stored.measured("mi300x-lab")) == [9100.0, 9300.0]


@pytest.mark.parametrize(("measured", "field", "said"), [
    ({"step_time_s": 2900}, "measured.step_time_s", "2900 s is 985 times the 2.944 s predicted"),
    ({"step_time_s": 1e-300}, "measured.step_time_s", "1e-300 s is 3.4e-301 times"),
    ({"tokens_per_s_per_gpu": 89e6}, "measured.tokens_per_s_per_gpu", "8.9e+07 implies a step of 0.0003682 s, which"),
])
def test_a_measurement_more_than_20x_from_its_prediction_is_refused_naming_its_unit(cli, history, tmp_path, measured,
                                                                                   field, said):
    """A step in milliseconds, 1e-300 s or a job's tokens/s was imported and fitted: the estimate's band read
    +/-84,413 %, or every correction NaN and a held-out error of 10^302 %."""
    record = {"model": "llama3.1-8b", "gpu": "h100", "gpus": 8, "gbs": 64, "seq_len": 4096, "cluster": "c1"}
    path = tmp_path / "runs.jsonl"
    path.write_text(json.dumps(record | {"measured": {"step_time_s": 3.0}}) + "\n"
                    + json.dumps(record | {"tp": 2, "measured": measured}) + "\n")
    answer = cli("history", "import", str(path), "--json")
    assert answer.exit_code == 0, answer.stderr
    assert len(answer.json()["imported"]) == 1
    [refused] = answer.json()["refused"]
    assert (refused["record"], refused["field"]) == ("runs.jsonl:2", field)
    assert refused["problem"].startswith(said) and "more than 20x off is a unit slip" in refused["problem"]


@pytest.mark.parametrize(("record", "field", "said"), [
    ({"cluster": 5, "measured": {"step_time_s": 3.0}}, "cluster", "5 is not a name"),
    ({"cluster": "c1", "measured": "fast"}, "measured", "'fast' is not an object of measured figures"),
])
def test_a_cluster_or_measurement_of_the_wrong_type_is_named_as_such(cli, history, tmp_path, record, field, said):
    """A cluster given as a number read "no cluster", and a measurement given as a string "no measurement"."""
    case = {"model": "llama3.1-8b", "gpu": "h100", "gpus": 8, "gbs": 64, "seq_len": 4096}
    path = tmp_path / "runs.jsonl"
    path.write_text(json.dumps(case | record) + "\n")
    answer = cli("history", "import", str(path), "--json")
    assert answer.exit_code == 2
    [refused] = answer.json()["refused"]
    assert refused["field"] == field and refused["problem"].startswith(said)


def test_a_step_and_tokens_per_s_of_two_different_runs_are_refused_naming_both(cli, history, tmp_path):
    """A record giving a step of 3 s and the whole job's 89,000 tokens/s (0.37 s a step on one GPU's) was kept on
    the step alone, the tokens/s stored beside it unchecked; within 2x (a mean of rates against a median of times)
    the two are one run's."""
    case = {"model": "llama3.1-8b", "gpu": "h100", "gpus": 8, "gbs": 64, "seq_len": 4096, "cluster": "c1"}
    path = tmp_path / "runs.jsonl"
    path.write_text(json.dumps(case | {"measured": {"step_time_s": 3.0, "tokens_per_s_per_gpu": 89000}}) + "\n"
                    + json.dumps(case | {"measured": {"step_time_s": 3.0, "tokens_per_s_per_gpu": 10000}}) + "\n")
    answer = cli("history", "import", str(path), "--json")
    assert answer.exit_code == 0, answer.stderr
    assert [row["measured_step_time_s"] for row in answer.json()["imported"]] == [3.0]
    [refused] = answer.json()["refused"]
    assert (refused["record"], refused["field"]) == ("runs.jsonl:1", "measured.tokens_per_s_per_gpu")
    assert refused["problem"].startswith("89000 implies a step of 0.3682 s, but step_time_s is 3 s")


def test_a_deck_cell_with_a_bad_count_or_actuals_is_refused_alone(cli, history, tmp_path):
    """A cell's nodes of "two" failed the whole import with an internal error (ValueError), 1.5 nodes were read as
    one, actuals of "none" were an AttributeError, and a cell that is not an object was skipped without a word."""
    good = {"model": "llama3.1-8b", "gpu": "MI300X", "mbs": 2, "gbs": 128, "status": "pass",
            "actuals": {"training.tokens_per_gpu": 9100.0}}
    cells = [good | {"cell_id": "a", "nodes": "two"}, good | {"cell_id": "b", "gpus_per_node": "x"},
             good | {"cell_id": "c", "nodes": 1.5}, good | {"cell_id": "d", "actuals": "none"}, ["not", "a", "cell"],
             good | {"cell_id": "f"}]
    path = tmp_path / "megatron_run_deck.json"
    path.write_text(json.dumps({"run_card_display": [["Nodes", "1", False]], "cells": cells}))
    answer = cli("history", "import", str(path), "--cluster", "mi300x-lab", "--seq-len", "8192", "--json")
    assert answer.exit_code == 0, answer.stderr
    assert len(answer.json()["imported"]) == 1
    assert [(r["record"], r["field"]) for r in answer.json()["refused"]] == [
        ("megatron_run_deck.json cell a", "nodes"), ("megatron_run_deck.json cell b", "gpus_per_node"),
        ("megatron_run_deck.json cell c", "nodes"), ("megatron_run_deck.json cell d", "actuals"),
        ("megatron_run_deck.json cell 4", "record")]
    assert answer.json()["refused"][0]["problem"].startswith("'two' is not a whole number of nodes")


def test_a_file_named_twice_is_read_once(cli, history, tmp_path):
    """`import runs.jsonl runs.jsonl` refused each of its records the second time, as a copy with the fix "give each
    record its own id"; the file is read once and the second naming said so."""
    path = tmp_path / "runs.jsonl"
    path.write_text(json.dumps({"id": "r1", "model": "llama3.1-8b", "gpu": "h100", "gpus": 8, "gbs": 64,
                                "seq_len": 4096, "cluster": "c1", "measured": {"step_time_s": 3.0}}) + "\n")
    answer = cli("history", "import", str(path), str(tmp_path / "." / "runs.jsonl"), "--json")
    assert answer.exit_code == 0, answer.stderr
    assert [row["id"] for row in answer.json()["imported"]] == ["r1"]
    assert [(r["field"], r["problem"]) for r in answer.json()["refused"]] == [("FILE", "given twice: read once")]
